"""The EiNet density model (Peharz et al. 2020): a region graph compiled into einsum layers.

Compilation: every leaf region gets ``K`` factorised densities (a product of univariate leaves
over its variables, one *slot* per (variable, leaf region)); partitions are grouped into layers by
the height of their parent region; each layer is one :class:`EinsumLayer` followed by a
:class:`MixingLayer` for regions with several partitions. The root region has one density.

Region values are ``(N, K, batch)`` log-densities in nats (batch last, see :mod:`.layers`);
leaf regions come first, then the regions of each layer in order. Parameters live in plain tensors (no ``nn.Module``): the E-step
differentiates the summed log-likelihood w.r.t. detached copies (EM statistics = weight x grad).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Sequence

import numpy as np
import torch

from mpifc.circuit.einet.layers import EinsumLayer, MixingLayer
from mpifc.circuit.einet.leaves import LEAF_FAMILIES, LeafFamily
from mpifc.circuit.device import guarded
from mpifc.circuit.einet.region_graph import RegionGraph, poon_domingos, random_binary_trees
from mpifc.circuit.leaves.base import grouped_weights_problem
from mpifc.errors import UserError

ArrayLike = np.ndarray | torch.Tensor

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class EiNetConfig:
    """Size, leaves and numerics of an EiNet.

    Attributes:
        num_sums: ``K``, densities per region (the root has 1).
        leaf: ``gaussian | discretized_gaussian | categorical | bernoulli | mixed``.
        num_levels: levels of discrete leaves (256 for 8-bit pixels).
        var_levels: ``mixed`` leaves only: per variable, 0 for a real (Gaussian) variable or its
            number of levels (>= 2, categorical); one entry per variable of the region graph.
        var_min_var: Gaussian and mixed leaves: per variable, a variance floor raised to
            ``min_var`` (e.g. :func:`~mpifc.circuit.leaves.tie_variance_floors`); empty: none.
        min_var, max_var: Gaussian variance clamp (Table 5: 1e-3, 0.25).
        pseudocount: symmetric Dirichlet pseudo-count of categorical/Bernoulli M-steps.
        max_params: refuse to build a larger model (``None``: no limit).
        dtype: ``float32`` or ``float64`` for parameters and activations.
        device: torch device string (``cpu``, ``cuda``, ``cuda:1``) the model computes on; not
            part of the model: it is saved as ``cpu`` (:meth:`EiNet.to_device` moves a model).
        seed: seed of the parameter initialisation.
        eval_batch_size: rows per chunk in likelihood / E-step passes (bounds activation memory).
    """

    num_sums: int = 10
    leaf: str = "gaussian"
    num_levels: int = 256
    min_var: float = 1e-3
    max_var: float = 0.25
    pseudocount: float = 0.01
    max_params: int | None = 100_000_000
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0
    eval_batch_size: int = 1024
    var_levels: tuple[int, ...] = ()
    var_min_var: tuple[float, ...] = ()

    def __post_init__(self) -> None:  # JSON gives a list back: keep the config hashable
        object.__setattr__(self, "var_levels", tuple(int(v) for v in self.var_levels))
        object.__setattr__(self, "var_min_var", tuple(float(v) for v in self.var_min_var))

    def validate(self) -> None:
        if self.num_sums < 1:
            raise UserError(f"num_sums: must be >= 1, got {self.num_sums}")
        if self.leaf not in LEAF_FAMILIES:
            raise UserError(f"leaf: unknown leaf {self.leaf!r} (known: {sorted(LEAF_FAMILIES)})")
        if self.dtype not in _DTYPES:
            raise UserError(f"dtype: must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.eval_batch_size < 1:
            raise UserError(f"eval_batch_size: must be >= 1, got {self.eval_batch_size}")
        if (self.leaf == "mixed") != bool(self.var_levels):
            raise UserError("var_levels: give one entry per variable exactly when leaf='mixed' "
                            f"(leaf={self.leaf!r}, {len(self.var_levels)} entries)")


def _make_leaf(config: EiNetConfig, slot_mask: torch.Tensor, dtype: torch.dtype, device: torch.device,
               slot_var: torch.Tensor) -> LeafFamily:
    cls = LEAF_FAMILIES[config.leaf]
    k = config.num_sums
    floor = None
    if config.var_min_var:
        ext = torch.tensor(list(config.var_min_var) + [0.0], dtype=torch.float64, device="cpu")
        floor = ext[slot_var.to("cpu")]  # (L, m): padding slots read the extra variable
    if config.leaf == "mixed":
        return cls(slot_mask, k, dtype, device, slot_var=slot_var, var_levels=config.var_levels,
                   min_var=config.min_var, max_var=config.max_var, pseudocount=config.pseudocount,
                   slot_min_var=floor)
    if config.leaf == "gaussian":
        return cls(slot_mask, k, dtype, device, min_var=config.min_var, max_var=config.max_var, slot_min_var=floor)
    if config.leaf == "discretized_gaussian":
        return cls(slot_mask, k, dtype, device, min_var=config.min_var, max_var=config.max_var,
                   num_levels=config.num_levels)
    if config.leaf == "categorical":
        return cls(slot_mask, k, dtype, device, num_levels=config.num_levels, pseudocount=config.pseudocount)
    return cls(slot_mask, k, dtype, device, pseudocount=config.pseudocount)


@dataclass
class EiNetStats:
    """Addable E-step statistics: name -> tensor of expected counts / sufficient statistics.

    ``leaf/*`` are leaf sufficient statistics, ``einsum/i`` and ``mixing/i`` expected edge counts
    (weight x gradient), ``n`` the summed sample weight and ``ll`` the weighted log-likelihood sum
    (nats). All are sums over samples, so ``a + b`` is the statistics of the union.
    """

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    def __add__(self, other: "EiNetStats") -> "EiNetStats":
        if set(self.tensors) != set(other.tensors):
            raise ValueError("EiNetStats: adding statistics of different models")
        return EiNetStats({k: v + other.tensors[k].to(v) for k, v in self.tensors.items()})

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {k: v.detach().to("cpu", torch.float64).numpy().copy() for k, v in self.tensors.items()}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "EiNetStats":
        return cls({k: torch.as_tensor(np.asarray(v, dtype=np.float64), device="cpu") for k, v in arrays.items()})


class EiNet:
    """Einsum network over ``scope``; fulfils :class:`mpifc.circuit.base.DensityModel`."""

    model_type = "einet"

    def __init__(self, graph: RegionGraph, config: EiNetConfig | None = None,
                 scope: Sequence[int] | None = None, _initialize: bool = True) -> None:
        """Compile ``graph`` and draw initial parameters from ``config.seed``.

        Raises:
            UserError: bad config, a graph without partitions, a scope of the wrong length, or a
                model above ``config.max_params`` (raised before any parameter is allocated).
        """
        config = config or EiNetConfig()
        config.validate()
        graph.validate()
        if not graph.partitions:
            raise UserError("region_graph: needs at least one partition (>= 2 variables, depth >= 1)")
        self.graph, self.config = graph, config
        self.scope = tuple(int(v) for v in scope) if scope is not None else tuple(range(graph.num_vars))
        if len(self.scope) != graph.num_vars:
            raise UserError(f"scope: has {len(self.scope)} variables, the region graph {graph.num_vars}")
        if config.var_min_var and len(config.var_min_var) != graph.num_vars:
            raise UserError(f"var_min_var: has {len(config.var_min_var)} entries, the region graph "
                            f"has {graph.num_vars} variables")
        if config.leaf == "mixed" and len(config.var_levels) != graph.num_vars:
            raise UserError(f"var_levels: has {len(config.var_levels)} entries, the region graph "
                            f"{graph.num_vars} variables")
        self.dtype = _DTYPES[config.dtype]
        self.device = torch.device(config.device)
        self._compile()
        n = self.num_parameters()
        if config.max_params is not None and n > config.max_params:
            raise UserError(
                f"max_params: this EiNet needs {n:,} parameters (K={config.num_sums}, "
                f"{len(graph.partitions):,} partitions, {self.num_slots:,} leaf slots) > "
                f"max_params={config.max_params:,}; lower num_sums or pd_num_pieces, or raise max_params")
        if _initialize:
            self._initialize(config.seed)

    # ----------------------------------------------------------------------------- structure
    @classmethod
    def poon_domingos(cls, image_shape: Sequence[int], pd_num_pieces: Sequence[int],
                      config: EiNetConfig | None = None) -> "EiNet":
        """EiNet on a Poon-Domingos region graph of an ``(H, W)`` or ``(H, W, C)`` image."""
        return cls(poon_domingos(image_shape, pd_num_pieces), config)

    @classmethod
    def random_binary_trees(cls, num_vars: int, depth: int, repetitions: int,
                            config: EiNetConfig | None = None) -> "EiNet":
        """EiNet on ``repetitions`` random binary region trees of ``depth`` (tabular data)."""
        config = config or EiNetConfig()
        return cls(random_binary_trees(num_vars, depth, repetitions, seed=config.seed), config)

    def _compile(self) -> None:
        graph, k, dev = self.graph, self.config.num_sums, self.device
        leaf_regions = graph.leaf_regions()
        position = {r: i for i, r in enumerate(leaf_regions)}
        width = max(len(graph.regions[r]) for r in leaf_regions)
        # Slot (l, i) reads variable slot_var[l, i]; padding reads the extra all-NaN column.
        pad = graph.num_vars
        slot_var = [list(graph.regions[r]) + [pad] * (width - len(graph.regions[r])) for r in leaf_regions]
        self.num_leaf_regions = len(leaf_regions)
        self.slot_var = torch.tensor(slot_var, dtype=torch.long, device=dev)  # (L, m)
        self.slot_mask = self.slot_var != pad
        self.num_slots = int(self.slot_mask.sum())
        self.leaf = _make_leaf(self.config, self.slot_mask, self.dtype, dev, self.slot_var)

        self.einsum_layers: list[EinsumLayer] = []
        self.mixing_layers: list[MixingLayer] = []
        layers = graph.partition_layers()
        for depth, part_ids in enumerate(layers):
            top = depth == len(layers) - 1
            parents: list[int] = []
            members: dict[int, list[int]] = {}
            for j, pid in enumerate(part_ids):
                parent = graph.partitions[pid][0]
                if parent not in members:
                    parents.append(parent)
                    members[parent] = []
                members[parent].append(j)
            if top and parents != [graph.root]:
                raise UserError("region_graph: the top layer must contain only the root region")
            left = torch.tensor([position[graph.partitions[p][1]] for p in part_ids], dtype=torch.long, device=dev)
            right = torch.tensor([position[graph.partitions[p][2]] for p in part_ids], dtype=torch.long, device=dev)
            self.einsum_layers.append(EinsumLayer(left, right, k, 1 if top else k))
            width = max(len(m) for m in members.values())
            idx = torch.tensor([m + [m[0]] * (width - len(m)) for m in (members[p] for p in parents)],
                               dtype=torch.long, device=dev)
            mask = torch.tensor([[True] * len(m) + [False] * (width - len(m)) for m in (members[p] for p in parents)],
                                dtype=torch.bool, device=dev)
            self.mixing_layers.append(MixingLayer(idx, mask))
            if not top:
                for parent in parents:
                    position[parent] = len(position)
        self.num_regions = len(position)  # non-root regions carrying K densities

    def _initialize(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(int(seed))
        self.leaf.initialize(gen)
        self.einsum_weights: list[torch.Tensor] = []
        self.mixing_weights: list[torch.Tensor] = []
        for layer, mix in zip(self.einsum_layers, self.mixing_layers):
            shape = (layer.num_partitions, layer.k_out, layer.k_in, layer.k_in)
            w = 0.5 + torch.rand(shape, generator=gen, dtype=torch.float64, device="cpu")
            self.einsum_weights.append(self._to(w / w.sum((2, 3), keepdim=True)))
            v = (0.5 + torch.rand((mix.idx.shape[0], layer.k_out, mix.idx.shape[1]), generator=gen,
                                  dtype=torch.float64, device="cpu")) * mix.mask.cpu().unsqueeze(1)
            self.mixing_weights.append(self._to(v / v.sum(2, keepdim=True)))

    def _to(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype=self.dtype, device=self.device)

    def num_parameters(self) -> int:
        """Stored parameter values: leaf parameters, einsum weights, and mixing weights of
        regions with more than one partition (single-partition mixing weights are fixed at 1)."""
        n = self.leaf.num_parameters()
        for layer, mix in zip(self.einsum_layers, self.mixing_layers):
            n += layer.num_partitions * layer.k_out * layer.k_in ** 2
            widths = mix.mask.sum(1)
            n += int(widths[widths > 1].sum()) * layer.k_out
        return n

    def parameter_bytes(self) -> int:
        """Bytes held by the parameter tensors."""
        return self.num_parameters() * torch.finfo(self.dtype).bits // 8

    # ----------------------------------------------------------------------------- passes
    def _as_tensor(self, x: ArrayLike, field_name: str = "x") -> torch.Tensor:
        t = x if isinstance(x, torch.Tensor) else torch.as_tensor(x, device="cpu")
        if t.ndim != 2 or t.shape[1] != len(self.scope):
            raise UserError(f"{field_name}: expected shape (batch, {len(self.scope)}), got {tuple(t.shape)}")
        if not torch.is_floating_point(t):
            t = t.double()
        if torch.isinf(t).any():
            raise UserError(f"{field_name}: contains +-inf (use NaN for missing values)")
        t = t.to(dtype=self.dtype, device=self.device)
        self.leaf.validate(t)
        return t

    def _slot_values(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, n_vars)`` -> padded slot values ``(L, m, batch)`` (NaN on padding)."""
        pad = torch.full((x.shape[0], 1), float("nan"), dtype=x.dtype, device=x.device)
        return torch.cat([x, pad], 1).t().contiguous()[self.slot_var]

    def _forward(self, leaf_values: torch.Tensor, einsum_w: list[torch.Tensor], mixing_w: list[torch.Tensor],
                 keep: bool = False) -> tuple[torch.Tensor, dict[str, Any]]:
        """Upward pass from leaf-region log-densities ``(L, K, batch)`` to the root, ``(batch,)`` nats.

        With ``keep`` the region values ``(N, K, batch)`` and each layer's partition outputs
        ``(P, K_out, batch)`` are returned for backtracking.
        """
        values = leaf_values
        parts_out = []
        last = len(self.einsum_layers) - 1
        for i, (layer, mix, w, v) in enumerate(zip(self.einsum_layers, self.mixing_layers, einsum_w, mixing_w)):
            parts = layer.forward(values, w)
            region = mix.forward(parts, v)
            if keep:
                parts_out.append(parts)
            if i < last:
                values = torch.cat([values, region], 0)
        return region[0, 0], {"values": values, "parts": parts_out}

    @guarded("the likelihood pass", "an EiNet")
    def log_likelihood(self, x: ArrayLike) -> np.ndarray:
        """``log p(x)`` per row, float64 ``(batch,)`` nats; NaN entries are marginalised."""
        xt = self._as_tensor(x)
        out = []
        with torch.no_grad():
            for chunk in torch.split(xt, self.config.eval_batch_size):
                leaf_values = self.leaf.region_log_prob(self._slot_values(chunk))
                ll, _ = self._forward(leaf_values, self.einsum_weights, self.mixing_weights)
                out.append(ll)
        if not out:
            return np.zeros(0)
        return torch.cat(out).to("cpu", torch.float64).numpy()

    # ----------------------------------------------------------------------------- EM
    @guarded("the E-step", "an EiNet")
    def em_statistics(self, x: ArrayLike, sample_weight: ArrayLike | None = None) -> EiNetStats:
        """E-step on ``x (batch, n_vars)``; ``sample_weight (batch,)`` >= 0 scales each row.

        Expected counts are ``w * d(sum_b s_b log p(x_b))/dw`` for every sum weight; leaf
        statistics are weighted by ``d(...)/d log p_leaf`` (the leaf posteriors).
        """
        xt = self._as_tensor(x)
        if sample_weight is None:
            sw = torch.ones(xt.shape[0], dtype=self.dtype, device=self.device)
        else:
            sw = torch.as_tensor(sample_weight, device=self.device).to(dtype=self.dtype).reshape(-1)
            if sw.shape[0] != xt.shape[0] or bool((sw < 0).any()) or bool(torch.isnan(sw).any()):
                raise UserError(f"sample_weight: need {xt.shape[0]} non-negative weights")
        total: EiNetStats | None = None
        for chunk, wchunk in zip(torch.split(xt, self.config.eval_batch_size),
                                 torch.split(sw, self.config.eval_batch_size)):
            stats = self._chunk_statistics(chunk, wchunk)
            total = stats if total is None else total + stats
        if total is None:
            total = self._chunk_statistics(xt, sw)
        return total

    def _chunk_statistics(self, x: torch.Tensor, sw: torch.Tensor) -> EiNetStats:
        slot_x = self._slot_values(x)
        with torch.enable_grad():
            leaf_values, leaf_inputs = self.leaf.forward_for_em(slot_x)
            ew = [w.detach().requires_grad_(True) for w in self.einsum_weights]
            mw = [v.detach().requires_grad_(True) for v in self.mixing_weights]
            ll, _ = self._forward(leaf_values, ew, mw)
            objective = (ll * sw).sum()
            grads = torch.autograd.grad(objective, [*leaf_inputs, *ew, *mw], allow_unused=True)
        grads = [g if g is not None else torch.zeros_like(t) for g, t in zip(grads, [*leaf_inputs, *ew, *mw])]
        n_leaf, n_layers = len(leaf_inputs), len(ew)
        leaf_stats = self.leaf.stats_from_grads(slot_x, leaf_inputs, grads[:n_leaf])
        tensors = {f"leaf/{k}": v for k, v in leaf_stats.items()}
        for i in range(n_layers):
            tensors[f"einsum/{i}"] = ew[i].detach() * grads[n_leaf + i]
            tensors[f"mixing/{i}"] = mw[i].detach() * grads[n_leaf + n_layers + i]
        tensors["n"] = sw.sum()
        tensors["ll"] = (ll.detach() * sw).sum()
        return EiNetStats(tensors)

    @guarded("the M-step", "an EiNet")
    def apply_em(self, stats: EiNetStats, step_size: float = 1.0) -> None:
        """M-step: parameters -> ``(1 - step_size) * old + step_size * argmax(stats)``.

        Sum weights are renormalised expected counts; a node that received no flow keeps its
        weights. Leaves interpolate their expectation parameters (see the leaf classes).
        """
        if not 0.0 < step_size <= 1.0:
            raise UserError(f"step_size: must be in (0, 1], got {step_size}")
        t = {k: v.to(dtype=self.dtype, device=self.device) for k, v in stats.tensors.items()}
        self.leaf.m_step({k[5:]: v for k, v in t.items() if k.startswith("leaf/")}, step_size)
        for i, old in enumerate(self.einsum_weights):
            n = t[f"einsum/{i}"]
            tot = n.sum((2, 3), keepdim=True)
            new = torch.where(tot > 0, n / tot.clamp_min(torch.finfo(self.dtype).tiny), old)
            self.einsum_weights[i] = (1 - step_size) * old + step_size * new
        for i, old in enumerate(self.mixing_weights):
            n = t[f"mixing/{i}"] * self.mixing_layers[i].mask.unsqueeze(1)
            tot = n.sum(2, keepdim=True)
            new = torch.where(tot > 0, n / tot.clamp_min(torch.finfo(self.dtype).tiny), old)
            self.mixing_weights[i] = (1 - step_size) * old + step_size * new

    # ----------------------------------------------------------------------------- queries
    def _backtrack(self, x: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
        """Top-down pass: sample (``gen``) or arg-max (``gen is None``) the NaN entries of ``x``.

        Choices at sum nodes are conditioned on the evidence through the upward sum-product
        values, so sampling is exact conditional sampling. With ``gen is None`` every choice is
        the arg-max of that posterior: an approximate MPE (Peharz et al. 2020), not exact
        max-product, which is NP-hard for non-deterministic circuits.
        """
        with torch.no_grad():
            leaf_values = self.leaf.region_log_prob(self._slot_values(x))
            _, cache = self._forward(leaf_values, self.einsum_weights, self.mixing_weights, keep=True)
            values = cache["values"].permute(2, 0, 1)  # batch-first for the choices
            batch = x.shape[0]
            sel = torch.full((batch, self.num_regions), -1, dtype=torch.long, device=self.device)
            n_layers = len(self.einsum_layers)
            for i in reversed(range(n_layers)):
                layer, mix = self.einsum_layers[i], self.mixing_layers[i]
                parts = cache["parts"][i].permute(2, 0, 1)
                n_reg = mix.idx.shape[0]
                if i == n_layers - 1:
                    k_reg = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
                else:
                    start = self.region_start[i]
                    k_reg = sel[:, start:start + n_reg]
                active_reg = k_reg >= 0
                k_reg = k_reg.clamp_min(0)
                if mix.idx.shape[1] > 1:
                    logits = mix.choice_logits(parts, self.mixing_weights[i], k_reg)
                    choice = _pick(logits, gen)
                else:
                    choice = torch.zeros_like(k_reg)
                chosen = mix.idx[torch.arange(n_reg, device=self.device).unsqueeze(0), choice]  # (batch, R)
                # Partition p is active when its parent region is active and chose p.
                part_parent = self.partition_parent[i]  # (P,)
                k_part = k_reg[:, part_parent]
                active_part = active_reg[:, part_parent] & (
                    chosen[:, part_parent] == torch.arange(layer.num_partitions, device=self.device))
                pair = _pick(layer.choice_logits(values, self.einsum_weights[i], k_part), gen)
                k_left = torch.where(active_part, pair // layer.k_in, -1)
                k_right = torch.where(active_part, pair % layer.k_in, -1)
                sel.scatter_reduce_(1, layer.left.expand(batch, -1), k_left, reduce="amax")
                sel.scatter_reduce_(1, layer.right.expand(batch, -1), k_right, reduce="amax")
            n_leaf, width = self.slot_var.shape
            k_slot = sel[:, :n_leaf].unsqueeze(-1).expand(-1, -1, width)  # (batch, L, m)
            active = (k_slot >= 0) & self.slot_mask
            slots = torch.arange(n_leaf * width, device=self.device).expand(batch, -1)
            flat_slot, flat_k = slots.reshape(-1), k_slot.clamp_min(0).reshape(-1)
            if gen is None:
                vals = self.leaf.mode(flat_slot, flat_k)
            else:
                vals = self.leaf.sample(flat_slot, flat_k, gen)
            vals = vals.reshape(batch, n_leaf * width).to(self.dtype) * active.reshape(batch, -1)
            # Each variable is in exactly one active leaf region per sample, so adding is writing.
            fill = x.new_zeros(batch, self.graph.num_vars + 1).scatter_add_(
                1, self.slot_var.reshape(1, -1).expand(batch, -1), vals)[:, :-1]
            return torch.where(torch.isnan(x), fill, x)

    @property
    def region_start(self) -> list[int]:
        """Position of each layer's first region in the region-value tensor."""
        starts, pos = [], self.num_leaf_regions
        for mix in self.mixing_layers:
            starts.append(pos)
            pos += mix.idx.shape[0]
        return starts

    @property
    def partition_parent(self) -> list[torch.Tensor]:
        """Per layer, ``(P,)`` index of each partition's parent within the layer's regions."""
        out = []
        for layer, mix in zip(self.einsum_layers, self.mixing_layers):
            parent = torch.empty(layer.num_partitions, dtype=torch.long, device=self.device)
            rows = torch.arange(mix.idx.shape[0], device=self.device).unsqueeze(1).expand_as(mix.idx)
            parent[mix.idx[mix.mask]] = rows[mix.mask]
            out.append(parent)
        return out

    @guarded("the MPE", "an EiNet")
    def mpe(self, x: ArrayLike) -> np.ndarray:
        """Approximate MPE completion of the NaN entries (arg-max backtracking), shape of ``x``."""
        xt = self._as_tensor(x)
        out = [self._backtrack(c, None) for c in torch.split(xt, self.config.eval_batch_size)]
        return torch.cat(out).to("cpu", torch.float64).numpy() if out else np.zeros((0, len(self.scope)))

    @guarded("the sampling", "an EiNet")
    def sample(self, n: int, rng: np.random.Generator, evidence: ArrayLike | None = None) -> np.ndarray:
        """``n`` samples ``(n, n_vars)``; with ``evidence`` (NaN = free) from the conditional."""
        if evidence is None:
            xt = torch.full((n, len(self.scope)), float("nan"), dtype=self.dtype, device=self.device)
        else:
            xt = self._as_tensor(evidence, "evidence")
            if xt.shape[0] != n:
                raise UserError(f"evidence: has {xt.shape[0]} rows, n={n}")
        gen = torch.Generator().manual_seed(int(rng.integers(2 ** 63 - 1)))
        out = [self._backtrack(c, gen) for c in torch.split(xt, self.config.eval_batch_size)]
        return torch.cat(out).to("cpu", torch.float64).numpy() if out else np.zeros((0, len(self.scope)))

    def with_leaf(self, leaf: str, num_levels: int | None = None) -> "EiNet":
        """A copy whose Gaussian leaves are swapped for ``leaf`` with the same mean and variance.

        Used to score a model trained on ``v / (L-1)`` pixel values with continuous Gaussians as a
        true discrete distribution over the ``L`` levels (``discretized_gaussian``), as in
        appendix E.2 of the FC paper.
        """
        gaussians = ("gaussian", "discretized_gaussian")
        if self.config.leaf not in gaussians or leaf not in gaussians:
            raise UserError(f"leaf: can only swap between {gaussians}, not {self.config.leaf!r} -> {leaf!r}")
        config = replace(self.config, leaf=leaf, num_levels=num_levels or self.config.num_levels)
        out = EiNet(self.graph, config, scope=self.scope, _initialize=False)
        out.leaf.params = {k: v.clone() for k, v in self.leaf.params.items()}
        out.einsum_weights = [w.clone() for w in self.einsum_weights]
        out.mixing_weights = [v.clone() for v in self.mixing_weights]
        return out

    @guarded("the move to the device", "an EiNet")
    def to_device(self, device: str) -> "EiNet":
        """This model on ``device`` (``cpu``, ``cuda``, ``cuda:N``): a copy whose tensors live
        there, or the model itself when it is there already. Same parameters, same answers (up
        to the device's rounding)."""
        if torch.device(device) == self.device:
            return self
        out = EiNet(self.graph, replace(self.config, device=str(device)), scope=self.scope, _initialize=False)
        out.leaf.params = {k: v.to(out.device) for k, v in self.leaf.params.items()}
        out.einsum_weights = [w.to(out.device) for w in self.einsum_weights]
        out.mixing_weights = [v.to(out.device) for v in self.mixing_weights]
        if "fit_record" in self.__dict__:
            out.fit_record = self.fit_record
        return out

    # ----------------------------------------------------------------------------- persistence
    def save(self, group: Any) -> None:
        """Write structure, config and parameters (CPU arrays) into an open ``h5py.Group``.

        The config is saved with ``device="cpu"``: where a model was trained is not part of it,
        so the bytes are the same for a model trained on a GPU (and it loads without one)."""
        group.attrs["model_type"] = self.model_type
        group.attrs["config"] = json.dumps(asdict(replace(self.config, device="cpu")))
        group.attrs["scope"] = np.asarray(self.scope, dtype=np.int64)
        g = group.create_group("graph")
        g.attrs["num_vars"] = self.graph.num_vars
        g.attrs["root"] = self.graph.root
        sizes = np.array([len(r) for r in self.graph.regions], dtype=np.int64)
        g.create_dataset("region_sizes", data=sizes)
        g.create_dataset("region_vars", data=np.concatenate([np.asarray(r, dtype=np.int64) for r in self.graph.regions]))
        g.create_dataset("partitions", data=np.asarray(self.graph.partitions, dtype=np.int64).reshape(-1, 3))
        p = group.create_group("params")
        for name, t in self.leaf.params.items():
            p.create_dataset(f"leaf_{name}", data=t.detach().cpu().numpy())
        for i, (w, v) in enumerate(zip(self.einsum_weights, self.mixing_weights)):
            p.create_dataset(f"einsum_{i}", data=w.detach().cpu().numpy())
            p.create_dataset(f"mixing_{i}", data=v.detach().cpu().numpy())

    @classmethod
    def load(cls, group: Any) -> "EiNet":
        """Rebuild a model written by :meth:`save` on the CPU; outputs are bit-identical. A malformed group,
        or parameters that are not a distribution (:func:`parameter_problem`), is a UserError
        naming the file, the group and the parameter."""
        where = f"{group.file.filename}:{group.name}"
        try:
            model = cls._load(group)
        except (KeyError, ValueError, TypeError, IndexError, RuntimeError) as e:
            raise UserError(f"{where}: malformed einet group ({type(e).__name__}: {e})") from None
        problem = parameter_problem(model)
        if problem is not None:
            raise UserError(f"{where}: {problem}")
        return model

    @classmethod
    def _load(cls, group: Any) -> "EiNet":
        config = EiNetConfig(**{**json.loads(group.attrs["config"]), "device": "cpu"})
        g = group["graph"]
        sizes = g["region_sizes"][()]
        flat = g["region_vars"][()]
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        regions = tuple(tuple(int(v) for v in flat[a:b]) for a, b in zip(bounds[:-1], bounds[1:]))
        partitions = tuple(tuple(int(v) for v in row) for row in g["partitions"][()])
        graph = RegionGraph(int(g.attrs["num_vars"]), regions, partitions, int(g.attrs["root"]))
        model = cls(graph, config, scope=[int(s) for s in group.attrs["scope"]], _initialize=False)
        p = group["params"]
        model.leaf.params = {k[5:]: model._to(torch.from_numpy(p[k][()])) for k in p if k.startswith("leaf_")}
        n_layers = len(model.einsum_layers)
        model.einsum_weights = [model._to(torch.from_numpy(p[f"einsum_{i}"][()])) for i in range(n_layers)]
        model.mixing_weights = [model._to(torch.from_numpy(p[f"mixing_{i}"][()])) for i in range(n_layers)]
        return model


def parameter_problem(model: EiNet) -> str | None:
    """What is wrong with an EiNet's parameters, or None: every sum weight finite, >= 0 and
    normalised (einsum weights over their two input axes, mixing weights over the mixed
    regions), every leaf mean finite, variance finite and > 0, probability vector a distribution."""
    tol = 1e-4 if model.dtype == torch.float32 else 1e-6
    groups = [(f"einsum_{i}", w, (2, 3)) for i, w in enumerate(model.einsum_weights)] + \
             [(f"mixing_{i}", v, (2,)) for i, v in enumerate(model.mixing_weights)]
    for name, w, axes in groups:
        problem = grouped_weights_problem(name, w.detach().double().cpu().numpy(), axes, tol)
        if problem is not None:
            return problem
    for name, t in model.leaf.params.items():
        a = t.detach().double().cpu().numpy()
        if not np.all(np.isfinite(a)):
            return f"leaf parameter {name!r} holds a value that is not finite"
        if name.endswith("var") and not np.all(a > 0):
            return f"leaf parameter {name!r} holds a variance <= 0 ({float(a.min())!r})"
        if name.endswith("probs"):
            sums = a.sum(axis=-1)
            if not np.all(a >= 0) or (sums.size and float(np.max(np.abs(sums - 1.0))) > tol):
                return f"leaf parameter {name!r} holds a probability vector that is not a distribution"
    return None


def _pick(logits: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """Arg-max over the last axis, after adding Gumbel noise when sampling."""
    if gen is not None:
        u = torch.rand(logits.shape, generator=gen, dtype=torch.float64, device="cpu").to(logits.device)
        logits = logits.double() - torch.log(-torch.log(u.clamp_min(1e-300)))
    return logits.argmax(-1)
