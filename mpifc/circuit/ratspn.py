"""RAT-SPN (Peharz et al. 2020) as a tensorised layer model implementing ``DensityModel``.

Structure, for ``R`` repetitions: each repetition draws a random permutation of the variables and
splits it into ``G = 2**depth`` balanced leaf regions (the random binary region graph, cut
depth times). A leaf region has ``I`` factorised input distributions (channel ``i`` = product of
leaf ``i`` of every variable in the region). Each of the ``depth`` levels merges sibling regions
with a product layer (``"outer"``: all ``K*K`` channel pairs, the original RAT-SPN; or
``"elementwise"``: channel ``k`` with channel ``k``, as SPFlow's default) and a sum layer with
``S`` sums per region (``C`` in the last level). The root mixes the ``R * C`` top sums.

Tensor convention: level values are log-values ``(batch, R, regions, channels)`` in nats.

Speed: Gaussian leaves are evaluated per region with matrix products, by expanding
``(x - m)^2 / v`` (three einsums instead of a ``(batch, R, n_vars, I)`` tensor); sum layers are
max-shifted einsums. EM flows are the gradients of the weighted log-likelihood w.r.t. the
factorised leaf log-values and the (linear) sum weights, so the E-step is one forward and one
backward pass. Other leaf types use the generic batched leaf code of :mod:`mpifc.circuit.leaves`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mpifc.circuit import graph as G
from mpifc.circuit.device import guarded
from mpifc.circuit.io import register_model
from mpifc.circuit.leaves import LEAF_TYPES, LOG_ZERO, MIN_FLOW, Categorical, Gaussian, Leaf, Params
from mpifc.circuit.leaves.base import bad_value, grouped_weights_problem
from mpifc.errors import UserError

_TINY = 1e-300


@dataclass
class RatStats:
    """RAT-SPN EM statistics; ``a + b`` equals the statistics of both shards together.

    Attributes:
        root: ``(R, C)`` expected counts of the root edges.
        levels: per level ``(R, F, J, K)`` expected counts of the sum edges.
        leaf: leaf-type sufficient statistics, leading dim ``R * G * S * I`` (see module doc).
        log_likelihood: weighted sum of ``log p(x)`` (nats); ``n``: sum of sample weights.
    """

    root: np.ndarray
    levels: list[np.ndarray]
    leaf: dict[str, np.ndarray]
    log_likelihood: float = 0.0
    n: float = 0.0

    def __add__(self, other: "RatStats") -> "RatStats":
        if self.root.shape != other.root.shape or len(self.levels) != len(other.levels):
            raise UserError("RAT-SPN EM statistics: cannot add statistics of different models")
        return RatStats(self.root + other.root, [a + b for a, b in zip(self.levels, other.levels)],
                        {k: self.leaf[k] + other.leaf[k] for k in self.leaf},
                        self.log_likelihood + other.log_likelihood, self.n + other.n)

    def to_arrays(self) -> dict[str, np.ndarray]:
        out = {"root": self.root, "ll": np.array([self.log_likelihood]), "n": np.array([self.n])}
        out.update({f"level{i}": a for i, a in enumerate(self.levels)})
        out.update({f"leaf/{k}": v for k, v in self.leaf.items()})
        return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> "RatStats":
        nl = sum(1 for k in a if k.startswith("level"))
        return cls(np.asarray(a["root"]), [np.asarray(a[f"level{i}"]) for i in range(nl)],
                   {k[5:]: np.asarray(v) for k, v in a.items() if k.startswith("leaf/")},
                   float(np.asarray(a["ll"])[0]), float(np.asarray(a["n"])[0]))


def _part(P: Params, prefix: str) -> Params:
    return {k[len(prefix):]: v for k, v in P.items() if k.startswith(prefix)}


def _joined(g: Params, c: Params, disc: torch.Tensor) -> Params:
    return {**{"g_" + k: v for k, v in g.items()}, **{"c_" + k: v for k, v in c.items()}, "disc": disc}


class MixedLeaves:
    """The leaves of a RAT-SPN over real and discrete variables, batched like a :class:`Leaf` type.

    Every leaf slot holds a Gaussian (``g_`` parameters) and a categorical (``c_`` parameters,
    ``c_len_probs`` = the levels of the slot's variable); ``disc`` ``(n,)`` says which one the
    slot's variable uses. Each part sees NaN (marginalised, log 1 = 0) on the other part's slots,
    so a slot's log-value, statistics and M-step are exactly its own family's.
    """

    type_name = "mixed"
    em_trainable = True

    @staticmethod
    def _split(P: Params, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        disc = P["disc"] > 0
        nan = torch.full_like(x, float("nan"))
        return torch.where(disc, nan, x), torch.where(disc, x, nan)

    @classmethod
    def batch_log_prob(cls, P: Params, x: torch.Tensor) -> torch.Tensor:
        xr, xd = cls._split(P, x)
        return Gaussian.batch_log_prob(_part(P, "g_"), xr) + Categorical.batch_log_prob(_part(P, "c_"), xd)

    @classmethod
    def batch_mode(cls, P: Params) -> torch.Tensor:
        return torch.where(P["disc"] > 0, Categorical.batch_mode(_part(P, "c_")).to(P["g_mean"].dtype),
                           Gaussian.batch_mode(_part(P, "g_")))

    @classmethod
    def batch_sample(cls, P: Params, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        disc = P["disc"].cpu().numpy()[idx] > 0
        out = np.empty(len(idx))
        if (~disc).any():
            out[~disc] = Gaussian.batch_sample(_part(P, "g_"), idx[~disc], rng)
        if disc.any():
            out[disc] = Categorical.batch_sample(_part(P, "c_"), idx[disc], rng)
        return out

    @classmethod
    def batch_em_stats(cls, P: Params, x: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
        xr, xd = cls._split(P, x)
        g = Gaussian.batch_em_stats(_part(P, "g_"), xr, w)
        c = Categorical.batch_em_stats(_part(P, "c_"), xd, w)
        return {**{"g_" + k: v for k, v in g.items()}, **{"c_" + k: v for k, v in c.items()}}

    @classmethod
    def batch_m_step(cls, P: Params, stats: dict[str, torch.Tensor], step_size: float) -> Params:
        g = Gaussian.batch_m_step(_part(P, "g_"), _part(stats, "g_"), step_size)
        c = Categorical.batch_m_step(_part(P, "c_"), _part(stats, "c_"), step_size)
        return _joined(g, c, P["disc"])

    @classmethod
    def unstack(cls, P: Params) -> list[Leaf]:
        """One :class:`Gaussian` or :class:`Categorical` (its variable's levels) per slot."""
        g, c = Gaussian.unstack(_part(P, "g_")), Categorical.unstack(_part(P, "c_"))
        return [c[i] if bool(P["disc"][i] > 0) else g[i] for i in range(len(g))]

    @classmethod
    def learnable_per_slot(cls, P: Params) -> torch.Tensor:
        """Free parameters of each slot's own family ``(n,)``: 2 for a Gaussian, levels for a
        categorical."""
        return torch.where(P["disc"] > 0, P["c_len_probs"].to(torch.float64), torch.full_like(P["disc"], 2.0))


class RatSPN:
    """Random and tensorised SPN over ``n_vars`` variables (columns ``0..n_vars-1`` of ``x``).

    Args:
        n_vars: number of variables; needs ``n_vars >= 2**depth``.
        depth: number of split levels ``D >= 1`` (``2**D`` leaf regions per repetition).
        repetitions: ``R``, independent random region graphs mixed at the root.
        num_sums: ``S``, sum nodes per inner region.
        num_leaves: ``I``, input distributions per leaf region (``== S`` for elementwise products).
        num_roots: ``C``, sums of the top region per repetition (the root mixes ``R * C``).
        leaf: leaf type name (``"gaussian"``, ``"bernoulli"``, ``"categorical"``,
            ``"discretized_gaussian"``, ...), or ``"mixed"``: a Gaussian per real variable and a
            categorical per discrete one (:class:`MixedLeaves`; ``leaf_kwargs["var_levels"]``,
            one entry per variable: 0 for real, else its number of levels >= 2).
        leaf_kwargs: fixed leaf hyper-parameters (e.g. ``min_var``, ``max_var``, ``alpha``,
            ``n_categories``, ``levels``, ``bin_width``, ``var_levels``).
        product: ``"outer"`` (original RAT-SPN) or ``"elementwise"`` (SPFlow-style).
        seed: seeds the structure and the initial parameters (same seed, same model).
        dtype: evaluation dtype (float64 default).
        scope: variable ids of the columns (default ``range(n_vars)``).
        var_min_var: Gaussian and mixed leaves: ``(n_vars,)`` per-variable variance floors, raised
            to ``leaf_kwargs["min_var"]`` (e.g. :func:`~mpifc.circuit.leaves.tie_variance_floors`);
            they live in the leaves' ``min_var`` parameters, so a saved model keeps them.
        device: where the model computes (``cpu``, ``cuda``, ``cuda:N``); the structure and the
            initial parameters are drawn on the CPU, so the same seed gives the same model on
            every device (:meth:`to_device` moves a model; it is saved as CPU arrays).
    """

    model_type = "ratspn"

    def __init__(self, n_vars: int, depth: int = 2, repetitions: int = 2, num_sums: int = 4,
                 num_leaves: int = 4, num_roots: int = 1, leaf: str = "gaussian",
                 leaf_kwargs: dict[str, float] | None = None, product: str = "outer", seed: int = 0,
                 dtype: torch.dtype = torch.float64, scope: tuple[int, ...] | None = None,
                 var_min_var: Any | None = None, device: Any = "cpu") -> None:
        if depth < 1 or n_vars < 2 ** depth:
            raise UserError(f"RatSPN: need depth >= 1 and n_vars >= 2**depth, got n_vars={n_vars}, depth={depth}")
        if min(repetitions, num_sums, num_leaves, num_roots) < 1:
            raise UserError("RatSPN: repetitions, num_sums, num_leaves and num_roots must be >= 1")
        if product not in ("outer", "elementwise"):
            raise UserError(f"RatSPN: product must be 'outer' or 'elementwise', got {product!r}")
        if product == "elementwise" and num_leaves != num_sums:
            raise UserError("RatSPN: elementwise products need num_leaves == num_sums")
        if leaf not in LEAF_TYPES and leaf != "mixed":
            raise UserError(f"RatSPN: unknown leaf {leaf!r} (known: {sorted(LEAF_TYPES) + ['mixed']})")
        if leaf == "mixed":
            levels = [int(v) for v in (leaf_kwargs or {}).get("var_levels", ())]
            if len(levels) != n_vars or any(v != 0 and v < 2 for v in levels):
                raise UserError(f"RatSPN: leaf 'mixed' needs var_levels with one entry per variable ({n_vars}), "
                                f"0 for real and >= 2 for discrete, got {levels}")
        self.cfg = dict(n_vars=int(n_vars), depth=int(depth), repetitions=int(repetitions),
                        num_sums=int(num_sums), num_leaves=int(num_leaves), num_roots=int(num_roots),
                        leaf=leaf, product=product, seed=int(seed))
        self.leaf_kwargs = dict(leaf_kwargs or {})
        self.dtype = dtype
        self.device = torch.device("cpu")
        self.scope: tuple[int, ...] = tuple(range(n_vars)) if scope is None else tuple(int(v) for v in scope)
        if len(self.scope) != n_vars:
            raise UserError(f"RatSPN: scope has {len(self.scope)} entries for n_vars={n_vars}")
        rng = np.random.default_rng(seed)
        R, D, Gn = repetitions, depth, 2 ** depth
        # Random balanced region graph per repetition; pad regions to equal size with the
        # dummy column n_vars (always NaN, so it is marginalised).
        S = math.ceil(n_vars / Gn)
        gidx = np.full((R, Gn, S), n_vars, dtype=np.int64)
        for r in range(R):
            for g, part in enumerate(np.array_split(rng.permutation(n_vars), Gn)):
                gidx[r, g, : len(part)] = part
        self.gidx = torch.as_tensor(gidx, device="cpu")
        self.real = self.gidx < n_vars
        # Sum weights per level (R, F, J, K), Dirichlet(1) initialised.
        self.weights: list[torch.Tensor] = []
        k_in = num_leaves
        for lev in range(1, D + 1):
            F = Gn >> lev
            K = k_in * k_in if product == "outer" else k_in
            J = num_roots if lev == D else num_sums
            self.weights.append(torch.as_tensor(rng.dirichlet(np.ones(K), size=(R, F, J)), dtype=dtype, device="cpu"))
            k_in = J
        self.root_weights = torch.as_tensor(rng.dirichlet(np.ones(R * num_roots)).reshape(R, num_roots), dtype=dtype,
                                            device="cpu")
        self.leaf_cls: Any = _leaf_class(leaf)
        self.P: Params = self._init_leaves(rng)
        if var_min_var is not None and leaf in ("gaussian", "mixed"):
            self._raise_floors(np.asarray(var_min_var, dtype=np.float64))
        self._place(torch.device(device))

    def _place(self, device: torch.device) -> None:
        """Move every tensor of the model to ``device`` in place."""
        self.device = device
        self.gidx, self.real = self.gidx.to(device), self.real.to(device)
        self.weights = [W.to(device) for W in self.weights]
        self.root_weights = self.root_weights.to(device)
        self.P = {k: v.to(device) for k, v in self.P.items()}

    @guarded("the move to the device", "a RAT-SPN")
    def to_device(self, device: Any) -> "RatSPN":
        """This model on ``device``: a copy whose tensors live there, or the model itself when it
        is there already."""
        dev = torch.device(device)
        if dev == self.device:
            return self
        out = RatSPN.__new__(RatSPN)
        out.__dict__.update(self.__dict__)
        out._place(dev)
        return out

    # ------------------------------------------------------------------ construction helpers

    @property
    def _shape(self) -> tuple[int, int, int, int]:
        """``(R, G, S, I)``: repetitions, leaf regions, region size (padded), leaves per region."""
        R, Gn, S = self.gidx.shape
        return R, Gn, S, self.cfg["num_leaves"]

    def _init_leaves(self, rng: np.random.Generator) -> Params:
        R, Gn, S, I = self._shape
        n = R * Gn * S * I
        kw = self.leaf_kwargs
        name = self.cfg["leaf"]
        if name == "gaussian":
            # Built directly: one Python object per leaf is slow for image-sized models.
            lo, hi = float(kw.get("min_var", 1e-6)), kw.get("max_var")
            hi = math.inf if hi is None else float(hi)
            LEAF_TYPES[name](0.0, 1.0, lo, hi)  # validates the hyper-parameters
            f = lambda v: torch.full((n,), v, dtype=self.dtype, device="cpu")  # noqa: E731
            return {"mean": torch.as_tensor(rng.standard_normal(n), dtype=self.dtype, device="cpu"),
                    "var": f(min(max(1.0, lo), hi)), "min_var": f(lo), "max_var": f(hi)}
        if name == "mixed":
            return self._init_mixed(rng, n)
        if name == "bernoulli":
            leaves = [LEAF_TYPES[name](p, kw.get("alpha", 1e-3)) for p in rng.uniform(0.25, 0.75, n)]
        elif name == "categorical":
            k = int(kw.get("n_categories", 2))
            leaves = [LEAF_TYPES[name](p, kw.get("alpha", 1e-3)) for p in rng.dirichlet(np.ones(k) * 5, n)]
        elif name == "discretized_gaussian":
            L, w = int(kw.get("levels", 256)), float(kw.get("bin_width", 1 / 255))
            leaves = [LEAF_TYPES[name](m, (0.25 * L * w) ** 2, L, w, kw.get("min_var", 1e-6), kw.get("max_var"))
                      for m in rng.uniform(0.2, 0.8, n) * L * w]
        else:
            raise UserError(f"RatSPN: leaf {name!r} is not supported (use gaussian, bernoulli, "
                            f"categorical or discretized_gaussian)")
        return self.leaf_cls.stack(leaves, self.dtype)

    def _raise_floors(self, var_min_var: np.ndarray) -> None:
        """Per-slot variance floors ``max(min_var, var_min_var[variable])`` (variances raised to them)."""
        if var_min_var.shape != (self.cfg["n_vars"],):
            raise UserError(f"RatSPN: var_min_var needs {self.cfg['n_vars']} entries, got {var_min_var.shape}")
        I = self._shape[3]
        per_slot = np.repeat(np.concatenate([var_min_var, [0.0]])[self.gidx.cpu().numpy().reshape(-1)], I)
        pre = "g_" if self.cfg["leaf"] == "mixed" else ""
        lo = torch.maximum(self.P[pre + "min_var"], torch.as_tensor(per_slot, dtype=self.dtype, device=self.device))
        lo = torch.minimum(lo, self.P[pre + "max_var"])
        self.P[pre + "min_var"] = lo
        self.P[pre + "var"] = self.P[pre + "var"].clamp_min(lo)

    def _init_mixed(self, rng: np.random.Generator, n: int) -> Params:
        """Gaussian and categorical parameters for every slot (see :class:`MixedLeaves`)."""
        kw = self.leaf_kwargs
        R, Gn, S, I = self._shape
        levels = np.array([int(v) for v in kw["var_levels"]] + [0])  # the padding column: real (always NaN)
        slot_levels = np.repeat(levels[self.gidx.cpu().numpy().reshape(-1)], I)  # slot order (r, g, s, i)
        k_max = max(2, int(levels.max()))
        lo, hi = float(kw.get("min_var", 1e-6)), kw.get("max_var")
        hi = math.inf if hi is None else float(hi)
        LEAF_TYPES["gaussian"](0.0, 1.0, lo, hi)  # validates the hyper-parameters
        f = lambda v: torch.full((n,), v, dtype=self.dtype, device="cpu")  # noqa: E731
        g = {"mean": torch.as_tensor(rng.standard_normal(n), dtype=self.dtype, device="cpu"),
             "var": f(min(max(1.0, lo), hi)), "min_var": f(lo), "max_var": f(hi)}
        probs = np.zeros((n, k_max))
        lens = np.where(slot_levels > 0, slot_levels, k_max)
        for k in np.unique(lens):
            rows = np.flatnonzero(lens == k)
            probs[rows, :k] = rng.dirichlet(np.ones(k) * 5, rows.size)
        c = {"probs": torch.as_tensor(probs, dtype=self.dtype, device="cpu"),
             "len_probs": torch.as_tensor(lens, dtype=torch.int64, device="cpu"),
             "alpha": f(float(kw.get("alpha", 1e-3)))}
        return _joined(g, c, torch.as_tensor((slot_levels > 0).astype(np.float64), dtype=self.dtype, device="cpu"))

    def _p4(self, name: str) -> torch.Tensor:
        """Scalar leaf parameter as ``(R, G, S, I)``."""
        return self.P[name].view(*self._shape)

    def _as_input(self, x: Any) -> torch.Tensor:
        t = x.to(dtype=self.dtype, device=self.device) if isinstance(x, torch.Tensor) else \
            torch.as_tensor(np.asarray(x, dtype=np.float64), dtype=self.dtype, device=self.device)
        if t.dim() != 2 or t.shape[1] != self.cfg["n_vars"]:
            raise UserError(f"RatSPN input: expected shape (batch, {self.cfg['n_vars']}), got {tuple(t.shape)}")
        return t

    def _grouped(self, x: torch.Tensor) -> torch.Tensor:
        """Data per region slot ``(batch, R, G, S)`` (dummy slots NaN)."""
        xe = torch.cat([x, torch.full((x.shape[0], 1), float("nan"), dtype=self.dtype, device=x.device)], 1)
        return xe[:, self.gidx]

    # ------------------------------------------------------------------ leaf layer

    def _gauss_feats(self, x: torch.Tensor, max_mode: bool) -> tuple[torch.Tensor, bool]:
        """Per-region data features for the Gaussian matmul path, ``(R*G, nb*S, batch)``.

        Blocks of ``S`` rows per region: ``x^2``, ``x`` and, only if ``x`` has NaNs, the observed
        indicator (plus, in max mode, the missing-but-real indicator). NaN and padding slots are
        0 in the first two. Built transposed so one ``index_select`` of contiguous rows yields
        the ``bmm`` operand. Returns ``(features, has_nan)``.
        """
        R, Gn, S, I = self._shape
        B = x.shape[0]
        miss = torch.isnan(x)
        has_nan = bool(miss.any())
        x0 = torch.where(miss, torch.zeros_like(x), x) if has_nan else x
        # Values beyond ~sqrt(max float) are "infinitely far" already; clamping keeps x^2 and the
        # statistics finite (1e151 in float64, 2e16 in float32).
        big = float(torch.finfo(self.dtype).max) ** 0.5 * 1e-3
        x0 = x0.clamp(-big, big)
        zero = torch.zeros(1, B, dtype=self.dtype, device=x.device)
        idx = self.gidx.reshape(-1)
        gx = torch.cat([x0.T, zero]).index_select(0, idx).view(R * Gn, S, B)
        nb = 2 + (2 if has_nan and max_mode else 1 if has_nan else 0)
        feats = torch.empty(R * Gn, nb, S, B, dtype=self.dtype, device=x.device)
        torch.mul(gx, gx, out=feats[:, 0])
        feats[:, 1] = gx
        if has_nan:
            obs = torch.cat([(~miss).to(self.dtype).T, zero]).index_select(0, idx).view(R * Gn, S, B)
            feats[:, 2] = obs
            if max_mode:
                feats[:, 3] = self.real.reshape(R * Gn, S, 1).to(self.dtype) - obs
        return feats.view(R * Gn, nb * S, B), has_nan

    def _gauss_coef(self, max_mode: bool, has_nan: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Coefficients ``(R*G, I, nb*S)`` matching :meth:`_gauss_feats`, and a bias ``(R*G, I, 1)``."""
        R, Gn, S, I = self._shape
        m, v = self._p4("mean"), self._p4("var")
        a = 1.0 / v
        logv = torch.log(2 * math.pi * v)
        # -0.5 * [(x-m)^2/v + log(2 pi v)] = -0.5 a x^2 + m a x - 0.5 (m^2 a + log 2 pi v)
        const = -0.5 * (m * m * a + logv)
        blocks = [-0.5 * a, m * a]
        if has_nan:
            blocks.append(const)
            if max_mode:
                blocks.append(-0.5 * logv)
            bias = torch.zeros(R * Gn, I, 1, dtype=self.dtype, device=self.device)
        else:
            # Every real slot is observed: its constant folds into one bias per region channel.
            bias = (const * self.real[..., None]).sum(2).reshape(R * Gn, I, 1)
        C = torch.stack(blocks, 2)  # (R, G, nb, S, I)
        return C.permute(0, 1, 4, 2, 3).reshape(R * Gn, I, -1), bias

    def _leaf_layer(self, x: torch.Tensor, max_mode: bool, feats: tuple[torch.Tensor, bool] | None = None) -> torch.Tensor:
        """Factorised leaf-region log-values ``(batch, R, G, I)``.

        Missing entries contribute 0 (sum-product) or the leaf's max log-value (max-product).
        """
        R, Gn, S, I = self._shape
        B = x.shape[0]
        if self.cfg["leaf"] == "gaussian":
            feats, has_nan = self._gauss_feats(x, max_mode) if feats is None else feats
            coef, bias = self._gauss_coef(max_mode, has_nan)
            out = torch.baddbmm(bias, coef, feats)  # (R*G, I, B)
            out = out.permute(2, 0, 1).reshape(B, R, Gn, I)
            return torch.nan_to_num(out, nan=LOG_ZERO, neginf=LOG_ZERO).clamp_min(LOG_ZERO)
        xg = self._grouped(x)
        xs = xg[..., None].expand(B, R, Gn, S, I).reshape(B, R * Gn * S * I)
        if max_mode:
            mode = self.leaf_cls.batch_mode(self.P).to(self.dtype)
            real = self.real[..., None].expand(R, Gn, S, I).reshape(-1)
            xs = torch.where(torch.isnan(xs) & real[None], mode[None], xs)
        lp = self.leaf_cls.batch_log_prob(self.P, xs).view(B, R, Gn, S, I)
        return lp.sum(3).clamp_min(LOG_ZERO)

    # ------------------------------------------------------------------ inner layers

    def _product(self, t: torch.Tensor) -> torch.Tensor:
        left, right = t[:, :, 0::2], t[:, :, 1::2]
        if self.cfg["product"] == "elementwise":
            return left + right
        B, R, F, K = left.shape
        return (left[..., :, None] + right[..., None, :]).reshape(B, R, F, K * K)

    @staticmethod
    def _sum(t: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        """``log sum_k W[r,f,j,k] exp(t[b,r,f,k])`` -> ``(B, R, F, J)`` via a max-shifted einsum."""
        m = t.detach().amax(-1, keepdim=True)
        s = torch.einsum("brfk,rfjk->brfj", torch.exp(t - m), W)
        return torch.log(s.clamp_min(_TINY)) + m

    def _upward(self, x: torch.Tensor, max_mode: bool = False, track: bool = False,
                feats: tuple[torch.Tensor, bool] | None = None) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """Root log-values ``(B,)``, the product-layer outputs per level and the leaf layer
        (returned in ``ins[0]``); with ``track`` the leaf layer and weights carry gradients."""
        leaf = self._leaf_layer(x, max_mode, feats)
        if track:
            leaf.requires_grad_(True)
        ins: list[torch.Tensor] = [leaf]
        t = leaf
        prods: list[torch.Tensor] = []
        for W in self.weights:
            p = self._product(t)
            prods.append(p)
            if max_mode:
                t = (p[:, :, :, None, :] + torch.log(W).clamp_min(LOG_ZERO)[None]).amax(-1)
            else:
                t = self._sum(p, W)
        top = t[:, :, 0, :] + torch.log(self.root_weights).clamp_min(LOG_ZERO)[None]  # (B, R, C)
        flat = top.reshape(top.shape[0], top.shape[1] * top.shape[2])
        root = flat.amax(1) if max_mode else torch.logsumexp(flat, 1)
        return root, prods, ins

    @guarded("the likelihood pass", "a RAT-SPN")
    @torch.no_grad()
    def log_likelihood(self, x: Any) -> np.ndarray:
        """``log p(x)`` float64 ``(batch,)`` nats; NaN entries marginalised."""
        t = self._as_input(x)
        return self._upward(t)[0].to("cpu", torch.float64).numpy()

    # ------------------------------------------------------------------ top-down passes

    def _descend(self, x: torch.Tensor, max_mode: bool, rng: np.random.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Chosen repetition ``(B,)`` and leaf-region channel ``(B, G)`` of the induced tree.

        ``max_mode``: arg-max choices (MPE); else sampled from the posterior given ``x``.
        """
        B = x.shape[0]
        root, prods, ins = self._upward(x, max_mode)

        def pick(logits: torch.Tensor) -> torch.Tensor:
            if max_mode:
                return logits.argmax(-1)
            u = torch.as_tensor(rng.random(tuple(logits.shape)), dtype=self.dtype, device=logits.device)
            u = u.clamp(1e-300, 1.0)
            return (logits - torch.log(-torch.log(u))).argmax(-1)

        D = len(self.weights)
        Kn = self.cfg["num_roots"]
        # Top sums of each repetition: recompute their values from the last product layer.
        lastW = self.weights[-1]
        p = prods[-1][:, :, 0, :]  # (B, R, K)
        if max_mode:
            top = (p[:, :, None, :] + torch.log(lastW[:, 0]).clamp_min(LOG_ZERO)[None]).amax(-1)
        else:
            top = self._sum(prods[-1], lastW)[:, :, 0, :]
        rc = pick((top + torch.log(self.root_weights).clamp_min(LOG_ZERO)[None]).reshape(B, top.shape[1] * Kn))
        rep, ch = rc // Kn, rc % Kn
        bidx = torch.arange(B, device=x.device)
        chan = ch[:, None]  # chosen sum channel per region of the current level, (B, F)
        for lev in range(D - 1, -1, -1):
            W = self.weights[lev][rep]  # (B, F, J, K)
            pv = prods[lev][bidx, rep]  # (B, F, K)
            Wj = torch.gather(W, 2, chan[:, :, None, None].expand(-1, -1, 1, W.shape[3]))[:, :, 0, :]
            k = pick(pv + torch.log(Wj).clamp_min(LOG_ZERO))  # (B, F)
            if self.cfg["product"] == "outer":
                Kc = int(math.isqrt(W.shape[3]))
                l, r = k // Kc, k % Kc
            else:
                l, r = k, k
            chan = torch.stack([l, r], 2).reshape(B, 2 * k.shape[1])  # children 2f, 2f+1
        return rep, chan

    def _fill(self, x: torch.Tensor, rep: torch.Tensor, chan: torch.Tensor, values: torch.Tensor | None,
              rng: np.random.Generator | None = None) -> np.ndarray:
        """Write leaf values of the induced tree into NaN entries of ``x``.

        ``values``: ``(R*G*S*I,)`` per-leaf values (modes), or None to draw from the leaves with ``rng``.
        """
        R, Gn, S, I = self._shape
        B = x.shape[0]
        dev = x.device
        b = torch.arange(B, device=dev)[:, None, None].expand(B, Gn, S)
        g = torch.arange(Gn, device=dev)[None, :, None].expand(B, Gn, S)
        s = torch.arange(S, device=dev)[None, None, :].expand(B, Gn, S)
        r = rep[:, None, None].expand(B, Gn, S)
        i = chan[:, :, None].expand(B, Gn, S)
        col = self.gidx[r, g, s]
        keep = col < self.cfg["n_vars"]
        b, col = b[keep], col[keep]
        leaf_id = (((r * Gn + g) * S + s) * I + i)[keep]
        out = x.clone()
        cur = out[b, col]
        if values is None:
            draw = torch.as_tensor(self.leaf_cls.batch_sample(self.P, leaf_id.cpu().numpy(), rng),
                                   dtype=self.dtype, device=dev)
        else:
            draw = values[leaf_id]
        out[b, col] = torch.where(torch.isnan(cur), draw, cur)
        return out.cpu().numpy().astype(np.float64)

    @guarded("the MPE", "a RAT-SPN")
    @torch.no_grad()
    def mpe(self, x: Any) -> np.ndarray:
        """NaN entries completed by max-product backtracking ``(batch, n_vars)``."""
        t = self._as_input(x)
        rep, chan = self._descend(t, True, None)
        return self._fill(t, rep, chan, self.leaf_cls.batch_mode(self.P).to(self.dtype))

    @guarded("the sampling", "a RAT-SPN")
    @torch.no_grad()
    def sample(self, n: int, rng: np.random.Generator | int, evidence: Any | None = None) -> np.ndarray:
        """``n`` samples; non-NaN ``evidence`` entries are kept and conditioned on exactly."""
        rng = np.random.default_rng(rng)
        if evidence is None:
            ev = torch.full((n, self.cfg["n_vars"]), float("nan"), dtype=self.dtype, device=self.device)
        else:
            ev = self._as_input(evidence)
            if ev.shape[0] != n:
                raise UserError(f"sample: evidence has {ev.shape[0]} rows, n={n}")
        rep, chan = self._descend(ev, False, rng)
        return self._fill(ev, rep, chan, None, rng)

    # ------------------------------------------------------------------ EM

    @guarded("the E-step", "a RAT-SPN")
    def em_statistics(self, x: Any, sample_weight: Any | None = None) -> RatStats:
        """Expected counts from one forward and one backward pass; ``sample_weight`` ``(batch,)``."""
        t = self._as_input(x)
        B = t.shape[0]
        sw = torch.ones(B, dtype=self.dtype, device=self.device) if sample_weight is None else torch.as_tensor(
            np.asarray(sample_weight, dtype=np.float64), dtype=self.dtype, device=self.device).reshape(-1)
        if sw.shape[0] != B or not bool(torch.all(torch.isfinite(sw) & (sw >= 0))):
            raise UserError(f"em_statistics: sample_weight must be ({B},), finite and >= 0")
        Ws = [W.clone().requires_grad_(True) for W in self.weights]
        Wr = self.root_weights.clone().requires_grad_(True)
        saved = self.weights, self.root_weights
        self.weights, self.root_weights = Ws, Wr
        feats = self._gauss_feats(t, False) if self.cfg["leaf"] == "gaussian" else None
        try:
            with torch.enable_grad():
                root, _, ins = self._upward(t, track=True, feats=feats)
                total = (sw * root).sum()
                grads = torch.autograd.grad(total, [ins[0], Wr, *Ws])
        finally:
            self.weights, self.root_weights = saved
        flow = grads[0].detach()  # (B, R, G, I): expected count of each factorised leaf region
        # d total / d W * W = expected count of the edge (weights enter linearly).
        root_c = (grads[1] * self.root_weights).detach()
        lev_c = [(g * W).detach() for g, W in zip(grads[2:], self.weights)]
        with torch.no_grad():
            leaf = self._leaf_stats(t, flow, feats)
        f64 = lambda a: a.to("cpu", torch.float64).numpy().copy()  # noqa: E731
        return RatStats(f64(root_c), [f64(c) for c in lev_c], {k: f64(v) for k, v in leaf.items()},
                        float((sw * root.detach()).sum()), float(sw.sum()))

    def _leaf_stats(self, x: torch.Tensor, flow: torch.Tensor,
                    feats: tuple[torch.Tensor, bool] | None) -> dict[str, torch.Tensor]:
        """Leaf sufficient statistics from the factorised-region flows ``(B, R, G, I)``."""
        R, Gn, S, I = self._shape
        B = x.shape[0]
        if feats is not None:
            f, has_nan = feats
            fl = flow.permute(1, 2, 0, 3).reshape(R * Gn, B, I)
            # One bmm gives sum_b flow * [x^2, x, (observed)] per leaf.
            st = torch.bmm(f, fl).view(R * Gn, -1, S, I)
            S2, S1 = st[:, 0].reshape(R, Gn, S, I), st[:, 1].reshape(R, Gn, S, I)
            if has_nan:
                N = st[:, 2].reshape(R, Gn, S, I)
            else:
                N = self.real[..., None].to(self.dtype) * fl.sum(1).view(R, Gn, 1, I)
            m = self._p4("mean")
            # Same centring as Gaussian.batch_em_stats, so Gaussian.batch_m_step applies.
            c1 = S1 - m * N
            c2 = S2 - 2 * m * S1 + m * m * N
            return {"N": N.reshape(-1), "S1": c1.reshape(-1), "S2": c2.clamp_min(0).reshape(-1)}
        xg = self._grouped(x)
        xs = xg[..., None].expand(B, R, Gn, S, I).reshape(B, R * Gn * S * I)
        w = flow[:, :, :, None, :].expand(B, R, Gn, S, I).reshape(B, R * Gn * S * I)
        return self.leaf_cls.batch_em_stats(self.P, xs, w)

    @guarded("the M-step", "a RAT-SPN")
    @torch.no_grad()
    def apply_em(self, stats: RatStats, step_size: float = 1.0, sum_alpha: float = 0.0) -> None:
        """M-step, ``(1 - step_size) * old + step_size * new``; empty sums/leaves keep old values."""
        if not 0.0 < step_size <= 1.0:
            raise UserError(f"apply_em: step_size must be in (0, 1], got {step_size}")
        if stats.root.shape != tuple(self.root_weights.shape) or len(stats.levels) != len(self.weights):
            raise UserError("apply_em: statistics do not match this RAT-SPN")

        def upd(old: torch.Tensor, cnt: np.ndarray, axes: tuple[int, ...]) -> torch.Tensor:
            c = torch.as_tensor(cnt, dtype=torch.float64, device=self.device) + sum_alpha
            tot = c.sum(axes, keepdim=True)
            ok = tot > MIN_FLOW
            new = c / torch.where(ok, tot, torch.ones_like(tot))
            o = old.double()
            w = torch.where(ok, o + step_size * (new - o), o)
            return (w / w.sum(axes, keepdim=True)).to(self.dtype)

        self.root_weights = upd(self.root_weights, stats.root, (0, 1))
        self.weights = [upd(W, c, (3,)) for W, c in zip(self.weights, stats.levels)]
        st = {k: torch.as_tensor(v, dtype=self.dtype, device=self.device) for k, v in stats.leaf.items()}
        if self.leaf_cls.em_trainable:
            self.P = self.leaf_cls.batch_m_step(self.P, st, step_size)

    def num_parameters(self) -> int:
        """Sum weights plus learnable leaf scalars of real (non-padding) variable slots."""
        n = self.root_weights.numel() + sum(W.numel() for W in self.weights)
        R, Gn, S, I = self._shape
        if self.cfg["leaf"] == "mixed":
            used = self.real[..., None].expand(R, Gn, S, I).reshape(-1)
            return int(n + int(MixedLeaves.learnable_per_slot(self.P)[used].sum()))
        per_leaf = sum(int(self.P[k][0].numel()) for k in self.leaf_cls.learnable)
        return int(n + int(self.real.sum()) * I * per_leaf)

    # ------------------------------------------------------------------ graph export

    def to_graph(self) -> G.Node:
        """The same circuit as explicit nodes (for small models: tests, the compiled evaluator)."""
        R, Gn, S, I = self._shape
        leaves = self.leaf_cls.unstack({k: v.cpu() for k, v in self.P.items()})
        D = len(self.weights)
        top: list[tuple[G.Node, float]] = []
        for r in range(R):
            # Level 0: factorised leaf regions, ``I`` channels each.
            level: list[list[G.Node]] = []
            for g in range(Gn):
                chans = []
                for i in range(I):
                    kids = [G.LeafNode(int(self.gidx[r, g, s]), leaves[((r * Gn + g) * S + s) * I + i])
                            for s in range(S) if bool(self.real[r, g, s])]
                    chans.append(kids[0] if len(kids) == 1 else G.ProductNode(kids))
                level.append(chans)
            for lev in range(D):
                W = self.weights[lev][r].to("cpu", torch.float64).numpy()
                nxt = []
                for f in range(len(level) // 2):
                    a, b = level[2 * f], level[2 * f + 1]
                    if self.cfg["product"] == "outer":
                        prods = [G.ProductNode([p, q]) for p in a for q in b]
                    else:
                        prods = [G.ProductNode([p, q]) for p, q in zip(a, b)]
                    nxt.append([G.SumNode(prods, W[f, j]) for j in range(W.shape[1])])
                level = nxt
            rw = self.root_weights[r].to("cpu", torch.float64).numpy()
            top.extend((node, float(rw[c])) for c, node in enumerate(level[0]))
        return G.SumNode([n for n, _ in top], [w for _, w in top])

    # ------------------------------------------------------------------ persistence

    def save(self, group: Any) -> None:
        """Write config and every tensor (float64/int64) into an open ``h5py.Group``."""
        group.attrs["model_type"] = self.model_type
        for k, v in self.cfg.items():
            group.attrs["cfg_" + k] = v
        for k, v in self.leaf_kwargs.items():
            if k == "var_levels":
                group.create_dataset("var_levels", data=np.asarray(v, dtype=np.int64))
            else:
                group.attrs["leafkw_" + k] = v
        group.attrs["dtype"] = str(self.dtype).replace("torch.", "")
        group.create_dataset("scope", data=np.asarray(self.scope, dtype=np.int64))
        group.create_dataset("gidx", data=self.gidx.cpu().numpy())
        group.create_dataset("root_weights", data=self.root_weights.to("cpu", torch.float64).numpy())
        for i, W in enumerate(self.weights):
            group.create_dataset(f"weights{i}", data=W.to("cpu", torch.float64).numpy())
        lg = group.create_group("leaves")
        for k, v in self.P.items():
            lg.create_dataset(k, data=v.cpu().numpy())

    @classmethod
    def load(cls, group: Any) -> "RatSPN":
        where = f"{group.file.filename}:{group.name}"
        try:
            cfg = {k[4:]: group.attrs[k] for k in group.attrs if k.startswith("cfg_")}
            cfg = {k: (v.decode() if isinstance(v, bytes) else v.item() if hasattr(v, "item") else v)
                   for k, v in cfg.items()}
            kw = {k[7:]: group.attrs[k].item() for k in group.attrs if k.startswith("leafkw_")}
            if "var_levels" in group:
                kw["var_levels"] = tuple(int(v) for v in group["var_levels"][()])
            dtype = getattr(torch, str(group.attrs["dtype"]))
            # Build a skeleton cheaply (tiny init is overwritten below) then load the tensors.
            obj = cls.__new__(cls)
            obj.cfg, obj.leaf_kwargs, obj.dtype, obj.device = cfg, kw, dtype, torch.device("cpu")
            obj.scope = tuple(int(v) for v in group["scope"][()])
            obj.gidx = torch.as_tensor(group["gidx"][()], device="cpu")
            obj.real = obj.gidx < cfg["n_vars"]
            obj.root_weights = torch.as_tensor(group["root_weights"][()], dtype=dtype, device="cpu")
            obj.weights = [torch.as_tensor(group[f"weights{i}"][()], dtype=dtype, device="cpu")
                           for i in range(cfg["depth"])]
            obj.leaf_cls = _leaf_class(cfg["leaf"])
            obj.P = {k: torch.as_tensor(group["leaves"][k][()], device="cpu") for k in group["leaves"]}
        except (KeyError, ValueError, TypeError) as e:
            raise UserError(f"{where}: malformed ratspn group ({e})") from None
        problem = _parameter_problem(obj)
        if problem is not None:
            raise UserError(f"{where}: {problem}")
        return obj


def _slots_problem(leaf_cls: Any, P: dict[str, np.ndarray], tol: float) -> str | None:
    """What is wrong with stacked leaf parameters ``P`` (numpy, one row per leaf slot)."""
    if leaf_cls is MixedLeaves:
        disc = P["disc"] > 0
        return (_slots_problem(Gaussian, {k: v[~disc] for k, v in _part(P, "g_").items()}, tol)
                or _slots_problem(Categorical, {k: v[disc] for k, v in _part(P, "c_").items()}, tol))
    if leaf_cls is Categorical:
        probs, lens = P["probs"], P["len_probs"]
        inside = np.arange(probs.shape[1])[None, :] < lens[:, None]
        if not np.all(np.isfinite(probs[inside]) & (probs[inside] >= 0)):
            return "a categorical leaf has a probability that is negative or not finite"
        sums = np.where(inside, probs, 0.0).sum(axis=1)
        if sums.size and float(np.max(np.abs(sums - 1.0))) > tol:
            return f"a categorical leaf's probabilities sum to {float(sums[np.argmax(np.abs(sums - 1.0))])!r}, not 1"
        return bad_value(P, "alpha", np.isfinite(P["alpha"]) & (P["alpha"] >= 0), "a pseudo-count must be >= 0")
    # the scalar leaf types: their checks are elementwise, so they run on every slot at once
    problem = leaf_cls._value_problem(P, tol)
    return None if problem is None else f"{leaf_cls.type_name} leaf: {problem}"


def _parameter_problem(model: "RatSPN") -> str | None:
    """What is wrong with a loaded RAT-SPN's weights and leaf parameters, or None."""
    tol = 1e-4 if model.dtype == torch.float32 else 1e-6
    problem = grouped_weights_problem("root_weights", model.root_weights.double().numpy(), (0, 1), tol)
    for i, W in enumerate(model.weights):
        problem = problem or grouped_weights_problem(f"weights{i}", W.double().numpy(), (3,), tol)
    P = {k: v.numpy().astype(np.int64 if k.startswith("len_") else np.float64) for k, v in model.P.items()}
    return problem or _slots_problem(model.leaf_cls, P, tol)


def _leaf_class(name: str) -> Any:
    """The batched leaf type of a RAT-SPN's ``leaf`` setting."""
    return MixedLeaves if name == "mixed" else LEAF_TYPES[name]


register_model(RatSPN.model_type, RatSPN.load)
