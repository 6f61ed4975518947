"""The Neural Graphical Model: an MLP from the features to the same features (NGM-generic).

Unit layout (see :class:`~mpifc.ngm.schema.Schema`): a real feature is one unit, standardised
with the training mean and std; a categorical with ``k`` values is ``k`` units, one-hot on the
input side and logits on the output side. Both layers share the layout, so the path matrix
``P = |W_L| ... |W_1|`` is square ``(n_units, n_units)``: ``P[o, i] > 0`` iff some path of nonzero
weights leads from input unit ``i`` to output unit ``o``.

The graph constraint (paper eq. 1) penalises ``||P * S^c||_1`` where ``S^c[o, i] = 1`` when the
features owning ``o`` and ``i`` are not adjacent *or are the same feature* (so no feature can
predict itself). Training lives in :mod:`mpifc.ngm.training`, inference and sampling in
:mod:`mpifc.ngm.inference` and :mod:`mpifc.ngm.sampling`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from torch import nn

from mpifc.errors import UserError
from mpifc.ngm.graph import DependencyGraph
from mpifc.ngm.schema import Schema

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU}
DTYPE = torch.float32
# Interior quantile levels: the exact min and max of a client's data are not released.
QUANTILE_LEVELS = np.linspace(0.01, 0.99, 99)


class BlockLinear(nn.Module):
    """A linear layer ``W = [[F, R], [B]]`` with a frozen block ``F`` and trainable new units.

    ``F`` ``(o_old, i_old)`` and its bias are buffers, never updated (stitching keeps the global
    model's weights bit-identical this way). ``R`` ``(o_old, i_new)`` feeds new inputs to old
    outputs, ``B`` ``(o_new, i_old + i_new)`` computes the new outputs. A plain layer has
    ``o_old = i_old = 0``.
    """

    def __init__(self, frozen_w: torch.Tensor, frozen_b: torch.Tensor, i_new: int, o_new: int,
                 generator: torch.Generator) -> None:
        super().__init__()
        o_old, i_old = frozen_w.shape
        self.register_buffer("frozen_w", frozen_w.detach().clone().to(DTYPE))
        self.register_buffer("frozen_b", frozen_b.detach().clone().to(DTYPE))
        fan_in = i_old + i_new
        bound = 1.0 / math.sqrt(max(fan_in, 1))
        # R starts at zero so a stitched model starts out computing the global model's outputs.
        self.w_right = nn.Parameter(torch.zeros(o_old, i_new, dtype=DTYPE))
        self.w_bottom = nn.Parameter(torch.empty(o_new, fan_in, dtype=DTYPE).uniform_(-bound, bound, generator=generator))
        self.b_bottom = nn.Parameter(torch.empty(o_new, dtype=DTYPE).uniform_(-bound, bound, generator=generator))

    @property
    def weight(self) -> torch.Tensor:
        """Assembled ``(o_old + o_new, i_old + i_new)`` weight."""
        if self.frozen_w.shape[0] == 0 and self.frozen_w.shape[1] == 0:
            return self.w_bottom  # a plain layer: nothing to assemble
        top = torch.cat([self.frozen_w, self.w_right], dim=1)
        return torch.cat([top, self.w_bottom], dim=0)

    @property
    def bias(self) -> torch.Tensor:
        if self.frozen_b.shape[0] == 0:
            return self.b_bottom
        return torch.cat([self.frozen_b, self.b_bottom])

    def frozen_mask(self) -> torch.Tensor:
        """Bool ``weight``-shaped mask of the frozen entries."""
        m = torch.zeros(self.weight.shape, dtype=torch.bool)
        m[: self.frozen_w.shape[0], : self.frozen_w.shape[1]] = True
        return m

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(u, self.weight, self.bias)


class NGMNet(nn.Module):
    """The MLP ``(batch, n_units) -> (batch, n_units)``."""

    def __init__(self, layers: Sequence[BlockLinear], activation: str) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise UserError(f"NGM: activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.layers = nn.ModuleList(layers)
        self.act = ACTIVATIONS[activation]()

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        for k, layer in enumerate(self.layers):
            u = layer(u)
            if k < len(self.layers) - 1:
                u = self.act(u)
        return u

    def path_matrix(self) -> torch.Tensor:
        """``P = |W_L| ... |W_1|``, ``(n_out_units, n_in_units)``, differentiable."""
        p = self.layers[0].weight.abs()
        for layer in self.layers[1:]:
            p = layer.weight.abs() @ p
        return p


def penalty_mask(schema: Schema, graph: DependencyGraph) -> torch.Tensor:
    """``S^c`` at unit level, ``(n_units, n_units)``: 1 where a path is forbidden."""
    owner = schema.unit_owner()
    allowed = graph.adjacency[np.ix_(owner, owner)]
    return torch.as_tensor(~allowed, dtype=DTYPE)  # the diagonal blocks stay forbidden


@dataclass
class SamplerCalibration:
    """Per-feature sampling parameters fitted on the client's own data (see :mod:`.sampling`).

    Attributes:
        order: feature indices in sampling order (BFS over the graph).
        affine: ``(d, 2)`` ``(a, b)``; a real feature's conditional mean in standardised units is
            ``a + b * prediction``; for a categorical ``b`` is the temperature multiplying its
            logits (``a`` unused); ``(0, 1)`` for component roots.
        resid_std: ``(d,)`` residual std in standardised units (reals), 0 for categoricals.
        infer_steps, infer_lr, infer_consistency: the inference settings calibrated for.
        logit_bias: ``(n_units,)`` per-class biases added to the tempered logits of the
            categoricals when sampling (0 on real units); None = none.
    """

    order: list[int]
    affine: np.ndarray
    resid_std: np.ndarray
    infer_steps: int = 30
    infer_lr: float = 0.1
    infer_consistency: float = 1.0
    logit_bias: np.ndarray | None = None


@dataclass
class NGM:
    """A Neural Graphical Model over ``schema`` constrained by ``graph``.

    Attributes:
        schema: the ``d`` features, in column order.
        graph: dependency graph over ``schema.names`` (same order).
        net: the MLP.
        hidden: hidden layer widths.
        activation: name of the nonlinearity.
        mean, std: ``(d,)`` standardisation of the real features (0 / 1 for categoricals).
        marginals: per feature, the category frequencies ``(k,)`` or the interior quantiles
            ``(99,)`` at :data:`QUANTILE_LEVELS`, used to start a sample in each graph component.
        calibration: sampler calibration, set by training.
        n_train: rows the model was trained on (the client size the master may weight by).
    """

    schema: Schema
    graph: DependencyGraph
    net: NGMNet
    hidden: tuple[int, ...]
    activation: str
    mean: np.ndarray
    std: np.ndarray
    marginals: list[np.ndarray] = field(default_factory=list)
    calibration: SamplerCalibration | None = None
    n_train: int = 0
    _layout_cache: tuple | None = field(default=None, init=False, repr=False, compare=False)
    _mask_cache: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)

    @staticmethod
    def create(schema: Schema, graph: DependencyGraph, hidden: Sequence[int] = (32, 32),
               activation: str = "elu", seed: int = 0) -> "NGM":
        """A freshly initialised NGM (deterministic in ``seed``)."""
        if tuple(graph.names) != schema.names:
            if sorted(graph.names) != sorted(schema.names):
                raise UserError(f"NGM: graph features {list(graph.names)} differ from data features {list(schema.names)}")
            graph = graph.reorder(schema.names)
        hidden = tuple(int(h) for h in hidden)
        if not hidden or min(hidden) < 1:
            raise UserError(f"NGM: hidden must list >= 1 positive layer widths, got {hidden}")
        g = torch.Generator().manual_seed(int(seed))
        sizes = (schema.n_units, *hidden, schema.n_units)
        empty = torch.zeros(0, 0)
        layers = [BlockLinear(empty, torch.zeros(0), sizes[k], sizes[k + 1], g) for k in range(len(sizes) - 1)]
        d = schema.n_features
        return NGM(schema, graph, NGMNet(layers, activation), hidden, activation,
                   np.zeros(d), np.ones(d), [np.zeros(0)] * d)

    # ---- encoding -------------------------------------------------------------------------
    def set_statistics(self, x: np.ndarray) -> None:
        """Standardisation and marginals from training data ``x`` ``(n, d)``."""
        self.marginals = []
        for j, f in enumerate(self.schema.features):
            col = x[:, j]
            if f.is_categorical:
                counts = np.bincount(col.astype(np.int64), minlength=f.n_categories).astype(np.float64)
                self.marginals.append(counts / counts.sum())
                self.mean[j], self.std[j] = 0.0, 1.0
            else:
                sd = float(col.std())
                self.mean[j] = float(col.mean())
                self.std[j] = sd if sd > 1e-12 * max(1.0, abs(self.mean[j])) else 1.0
                self.marginals.append(np.quantile(col, QUANTILE_LEVELS))
        self.n_train = int(x.shape[0])

    def encode(self, x: np.ndarray) -> torch.Tensor:
        """Input units ``(n, n_units)``; NaN entries become zeros (mean / no category)."""
        n = x.shape[0]
        u = np.zeros((n, self.schema.n_units))
        for j, (f, sl) in enumerate(zip(self.schema.features, self.schema.unit_slices())):
            col = x[:, j]
            ok = ~np.isnan(col)
            if f.is_categorical:
                u[np.flatnonzero(ok), sl.start + col[ok].astype(np.int64)] = 1.0
            else:
                u[ok, sl.start] = (col[ok] - self.mean[j]) / self.std[j]
        return torch.as_tensor(u, dtype=DTYPE)

    def standardise(self, x: np.ndarray) -> np.ndarray:
        """Reals in standardised units; categorical codes unchanged. ``(n, d)``."""
        return (x - self.mean) / self.std

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """Output units ``(n, n_units)``: standardised reals and categorical logits."""
        return self.net(u)

    def feature_loss(self, out: torch.Tensor, target_std: torch.Tensor) -> torch.Tensor:
        """Per-row, per-feature fit ``(n, d)``: squared error (reals) or cross-entropy (nats).

        Args:
            out: ``(n, n_units)`` network output.
            target_std: ``(n, d)`` standardised targets; NaN targets give 0 loss.
        """
        real_f, real_u, cats = self._layout()
        ok = ~torch.isnan(target_std)
        t = torch.where(ok, target_std, torch.zeros_like(target_std))
        loss = torch.zeros_like(t)
        if len(real_f):
            loss[:, real_f] = (out[:, real_u] - t[:, real_f]) ** 2
        for j, a, b in cats:
            logp = torch.log_softmax(out[:, a:b], dim=1)
            loss[:, j] = -logp.gather(1, t[:, j].long()[:, None])[:, 0]
        return torch.where(ok, loss, torch.zeros_like(loss))

    def _layout(self) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int, int]]]:
        """Cached ``(real feature idx, their unit idx, [(cat feature, unit start, unit stop)])``."""
        if self._layout_cache is None:
            real_f, real_u, cats = [], [], []
            for j, (f, sl) in enumerate(zip(self.schema.features, self.schema.unit_slices())):
                if f.is_categorical:
                    cats.append((j, sl.start, sl.stop))
                else:
                    real_f.append(j)
                    real_u.append(sl.start)
            self._layout_cache = (torch.tensor(real_f, dtype=torch.long), torch.tensor(real_u, dtype=torch.long), cats)
        return self._layout_cache

    # ---- graph constraint -----------------------------------------------------------------
    def penalty_mask(self) -> torch.Tensor:
        """``S^c`` (cached: schema and graph are immutable)."""
        if self._mask_cache is None:
            self._mask_cache = penalty_mask(self.schema, self.graph)
        return self._mask_cache

    def path_norm(self) -> torch.Tensor:
        """``||P * S^c||_1``: total strength of the forbidden paths (eq. 1), differentiable."""
        return (self.net.path_matrix() * self.penalty_mask()).sum()

    def path_norm_split(self) -> tuple[float, float]:
        """``(off_graph, on_graph)`` path norms: forbidden vs allowed paths."""
        with torch.no_grad():
            p = self.net.path_matrix()
            sc = self.penalty_mask()
            return float((p * sc).sum()), float((p * (1 - sc)).sum())

    def feature_dependence(self) -> np.ndarray:
        """``(d, d)`` path strength from input feature ``i`` (column) to output feature ``o`` (row)."""
        with torch.no_grad():
            p = self.net.path_matrix().numpy().astype(np.float64)
        owner = self.schema.unit_owner()
        d = self.schema.n_features
        out = np.zeros((d, d))
        np.add.at(out, (owner[:, None], owner[None, :]), p)
        return out

    # ---- transport ------------------------------------------------------------------------
    def to_payload(self) -> tuple[dict, dict[str, np.ndarray]]:
        """``(meta, arrays)``: JSON-able metadata and float arrays, for the wire and the ledger.

        Frozen and trainable blocks are flattened into one weight per layer: the receiver gets a
        plain NGM.
        """
        arrays: dict[str, np.ndarray] = {}
        with torch.no_grad():
            for k, layer in enumerate(self.net.layers):
                arrays[f"w{k}"] = layer.weight.numpy().copy()
                arrays[f"b{k}"] = layer.bias.numpy().copy()
        arrays["mean"], arrays["std"] = self.mean.copy(), self.std.copy()
        for j, m in enumerate(self.marginals):
            arrays[f"marginal{j}"] = np.asarray(m, dtype=np.float64)
        arrays["adjacency"] = self.graph.adjacency.astype(np.uint8)
        meta = {"schema": self.schema.to_dict(), "hidden": list(self.hidden), "activation": self.activation,
                "n_train": self.n_train}
        if self.calibration is not None:
            c = self.calibration
            meta["order"] = [int(i) for i in c.order]
            meta["infer"] = [int(c.infer_steps), float(c.infer_lr), float(c.infer_consistency)]
            arrays["affine"] = self.calibration.affine.copy()
            arrays["resid_std"] = self.calibration.resid_std.copy()
            if c.logit_bias is not None:
                arrays["logit_bias"] = np.asarray(c.logit_bias, dtype=np.float64).copy()
        return meta, arrays

    @staticmethod
    def from_payload(meta: dict, arrays: dict[str, np.ndarray]) -> "NGM":
        """Inverse of :meth:`to_payload`."""
        try:
            schema = Schema.from_dict(meta["schema"])
            graph = DependencyGraph(schema.names, np.asarray(arrays["adjacency"]).astype(bool))
            model = NGM.create(schema, graph, meta["hidden"], meta["activation"], seed=0)
            with torch.no_grad():
                for k, layer in enumerate(model.net.layers):
                    w = torch.as_tensor(np.asarray(arrays[f"w{k}"]), dtype=DTYPE)
                    b = torch.as_tensor(np.asarray(arrays[f"b{k}"]), dtype=DTYPE)
                    if w.shape != layer.w_bottom.shape:
                        raise UserError(f"NGM payload: layer {k} weight has shape {tuple(w.shape)}, "
                                        f"expected {tuple(layer.w_bottom.shape)}")
                    layer.w_bottom.copy_(w)
                    layer.b_bottom.copy_(b)
            model.mean = np.asarray(arrays["mean"], dtype=np.float64).copy()
            model.std = np.asarray(arrays["std"], dtype=np.float64).copy()
            model.marginals = [np.asarray(arrays[f"marginal{j}"], dtype=np.float64).copy()
                               for j in range(schema.n_features)]
            model.n_train = int(meta.get("n_train", 0))
            if "order" in meta:
                steps, lr, cons = meta.get("infer", [30, 0.1, 1.0])
                model.calibration = SamplerCalibration(list(meta["order"]), np.asarray(arrays["affine"]).copy(),
                                                       np.asarray(arrays["resid_std"]).copy(), int(steps),
                                                       float(lr), float(cons),
                                                       np.asarray(arrays["logit_bias"]).copy()
                                                       if "logit_bias" in arrays else None)
        except KeyError as e:
            raise UserError(f"NGM payload: missing entry {e}") from None
        return model

    def payload_nbytes(self) -> int:
        """Bytes of :meth:`to_payload` (arrays plus the JSON metadata)."""
        meta, arrays = self.to_payload()
        return sum(a.nbytes for a in arrays.values()) + len(json.dumps(meta).encode())

    def n_parameters(self) -> int:
        return sum(layer.weight.numel() + layer.bias.numel() for layer in self.net.layers)
