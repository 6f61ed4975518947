"""Leaf families of an EiNet: ``K`` univariate densities per leaf slot, fully vectorised.

Leaf regions are padded to a common width ``m``: slot ``(l, i)`` holds the ``i``-th variable of
leaf region ``l`` (padding slots read NaN). A family maps slot values ``x`` of shape
``(L, m, batch)`` (batch last, like the layers) to region log-densities ``(L, K, batch)``
(nats): the sum over the region's slots of each component's univariate log-density, with NaN (missing or padding) giving
``log 1 = 0`` so that it is marginalised. Parameters are stored flat as ``(L * m, K, ...)``.

EM statistics come from autograd: :meth:`LeafFamily.forward_for_em` returns the region values
together with the tensors to differentiate, and :meth:`LeafFamily.stats_from_grads` turns their
gradients into responsibility-weighted sufficient statistics (sums over the batch, so they add
across data shards).
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch

from mpifc.circuit.privacy import MIN_LEAF_ROWS
from mpifc.errors import UserError

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)


class LeafFamily(ABC):
    """``K`` densities for each of ``S`` slots; parameters are tensors of shape ``(S, K, ...)``."""

    kind: str = ""

    def __init__(self, slot_mask: torch.Tensor, num_components: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.slot_mask = slot_mask.to(device)  # (L, m), False = padding
        self.num_regions, self.width = slot_mask.shape
        self.num_slots = self.num_regions * self.width  # stored slots, padding included
        self.num_real_slots = int(slot_mask.sum())
        self.num_components = num_components
        self.dtype = dtype
        self.device = device
        self.params: dict[str, torch.Tensor] = {}

    @abstractmethod
    def hyper(self) -> dict[str, float | int]:
        """Hyper-parameters needed to rebuild the family (saved as HDF5 attributes)."""

    @abstractmethod
    def initialize(self, gen: torch.Generator) -> None:
        """Random data-free initial parameters."""

    @abstractmethod
    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """``(L, m, batch)`` values -> ``(L, m, K, batch)`` log-densities (nats); NaN -> 0."""

    @abstractmethod
    def expected_stats(self, x: torch.Tensor, resp: torch.Tensor) -> dict[str, torch.Tensor]:
        """Responsibility-weighted sufficient statistics summed over the batch.

        Args:
            x: ``(L, m, batch)`` values, NaN = missing (contributes nothing).
            resp: ``(L, m, K, batch)`` posterior weights of each component (the flows).
        Returns:
            Tensors of shape ``(L * m, K, ...)``.
        """

    def region_log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """``(L, m, batch)`` -> ``(L, K, batch)``: log-density of each region's components."""
        return self.log_prob(x).sum(1)

    def forward_for_em(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Region log-densities ``(L, K, batch)`` plus the tensors (requiring grad) they come from."""
        with torch.no_grad():
            lp = self.log_prob(x)
        lp.requires_grad_(True)
        return lp.sum(1), [lp]

    def stats_from_grads(self, x: torch.Tensor, inputs: list[torch.Tensor],
                         grads: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Sufficient statistics from the gradients of the objective w.r.t. ``inputs``."""
        return self.expected_stats(x, grads[0])

    @abstractmethod
    def m_step(self, stats: dict[str, torch.Tensor], step_size: float) -> None:
        """Move the parameters a ``step_size`` towards the maximiser of ``stats``."""

    @abstractmethod
    def sample(self, slot: torch.Tensor, comp: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """One value per ``(slot[i], comp[i])``, shape ``(n,)``."""

    @abstractmethod
    def mode(self, slot: torch.Tensor, comp: torch.Tensor) -> torch.Tensor:
        """Most probable value per ``(slot[i], comp[i])``, shape ``(n,)``."""

    def validate(self, x: torch.Tensor) -> None:
        """Raise ``UserError`` if observed values are outside the support."""

    def num_parameters(self) -> int:
        """Parameter values of real (non-padding) slots, known before allocation."""
        return 2 * self.num_real_slots * self.num_components


class GaussianLeaf(LeafFamily):
    """Normal densities with variance clamped to ``[min_var, max_var]`` (Table 5 of the FC paper)."""

    kind = "gaussian"

    def __init__(self, slot_mask: torch.Tensor, num_components: int, dtype: torch.dtype, device: torch.device,
                 min_var: float = 1e-3, max_var: float = 0.25, slot_min_var: torch.Tensor | None = None) -> None:
        super().__init__(slot_mask, num_components, dtype, device)
        if not 0 < min_var <= max_var:
            raise UserError(f"min_var/max_var: need 0 < min_var <= max_var, got {min_var}, {max_var}")
        self.min_var, self.max_var = float(min_var), float(max_var)
        # per-slot floors (L * m, 1), within [min_var, max_var]; None: min_var everywhere
        self.floor = None if slot_min_var is None else slot_min_var.reshape(-1, 1).clamp(
            self.min_var, self.max_var).to(dtype).to(device)

    def hyper(self) -> dict[str, float | int]:
        return {"min_var": self.min_var, "max_var": self.max_var}

    def initialize(self, gen: torch.Generator) -> None:
        shape = (self.num_slots, self.num_components)
        # Pixels live in [0, 1] after scaling, so spread the initial means over that range.
        mean = torch.rand(shape, generator=gen, dtype=torch.float64, device="cpu")
        self.params = {
            "mean": mean.to(self.dtype).to(self.device),
            "var": torch.full(shape, self.max_var, dtype=self.dtype, device=self.device),
        }

    def _view(self, name: str) -> torch.Tensor:
        """Parameter ``name`` as ``(L, m, K, 1)``, broadcasting against ``(L, m, 1, batch)``."""
        return self.params[name].view(self.num_regions, self.width, self.num_components, 1)

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        mean, var = self._view("mean"), self._view("var")
        missing = torch.isnan(x).unsqueeze(2)
        xs = torch.nan_to_num(x, nan=0.0).unsqueeze(2)
        lp = -0.5 * (xs - mean) ** 2 / var - 0.5 * torch.log(var) - _LOG_SQRT_2PI
        return lp.masked_fill(missing, 0.0)

    def _natural_params(self) -> list[torch.Tensor]:
        """Coefficients ``(L, m, K)`` of ``x^2``, ``x`` and 1 in each slot's log-density."""
        mean, var = self._view("mean")[..., 0], self._view("var")[..., 0]
        a = -0.5 / var
        b = mean / var
        c = -0.5 * mean * mean / var - 0.5 * torch.log(var) - _LOG_SQRT_2PI
        return [a, b, c]

    @staticmethod
    def _exp_family_sum(x: torch.Tensor, theta: list[torch.Tensor]) -> torch.Tensor:
        """``sum_i a x_i^2 + b x_i + c [x_i observed]`` per region: ``(L, m, batch)`` -> ``(L, K, batch)``.

        The log-density is linear in the sufficient statistics, so the sum over a region's
        slots is a batched matmul and no ``(L, m, K, batch)`` tensor is formed.
        """
        a, b, c = theta
        observed = ~torch.isnan(x)
        xs = torch.nan_to_num(x, nan=0.0)
        out = torch.baddbmm(torch.bmm(b.transpose(1, 2), xs), a.transpose(1, 2), xs * xs)
        if bool(observed.all()):
            return out + c.sum(1).unsqueeze(-1)
        return torch.baddbmm(out, c.transpose(1, 2), observed.to(x.dtype))

    def region_log_prob(self, x: torch.Tensor) -> torch.Tensor:
        return self._exp_family_sum(x, self._natural_params())

    def forward_for_em(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        theta = [t.detach().requires_grad_(True) for t in self._natural_params()]
        return self._exp_family_sum(x, theta), theta

    def stats_from_grads(self, x: torch.Tensor, inputs: list[torch.Tensor],
                         grads: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        # d objective / d natural parameter = responsibility-weighted sufficient statistic.
        s2, s1, n = grads
        flat = (self.num_slots, self.num_components)
        return {"n": n.reshape(flat), "s1": s1.reshape(flat), "s2": s2.reshape(flat)}

    def expected_stats(self, x: torch.Tensor, resp: torch.Tensor) -> dict[str, torch.Tensor]:
        observed = ~torch.isnan(x)
        r = resp * observed.unsqueeze(2)
        m1, m2 = self._moments_per_component(torch.nan_to_num(x, nan=0.0))
        flat = (self.num_slots, self.num_components)
        return {"n": r.sum(-1).reshape(flat), "s1": (r * m1).sum(-1).reshape(flat),
                "s2": (r * m2).sum(-1).reshape(flat)}

    def _moments_per_component(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``E[z]`` and ``E[z^2]`` of the latent value behind each observation, ``(L, m, K|1, batch)``."""
        xs = x.unsqueeze(2)
        return xs, xs * xs

    def m_step(self, stats: dict[str, torch.Tensor], step_size: float) -> None:
        n = stats["n"]
        # Fewer than k rows' worth of responsibility: the component keeps its mean and variance
        # (fitted to those rows it would be nearly their values; mpifc.circuit.privacy).
        ok = n >= MIN_LEAF_ROWS
        safe_n = torch.where(ok, n, torch.ones_like(n))
        mean_old, var_old = self.params["mean"], self.params["var"]
        mean_new = torch.where(ok, stats["s1"] / safe_n, mean_old)
        second_new = torch.where(ok, stats["s2"] / safe_n, var_old + mean_old ** 2)
        # Online EM interpolates expectation parameters (E[x], E[x^2]), which keeps it a convex
        # combination of sufficient statistics; step 1 is plain EM.
        m1 = (1 - step_size) * mean_old + step_size * mean_new
        m2 = (1 - step_size) * (var_old + mean_old ** 2) + step_size * second_new
        var = m2 - m1 * m1
        var = (var.clamp(self.min_var, self.max_var) if self.floor is None
               else torch.maximum(var, self.floor).clamp_max(self.max_var))
        self.params = {"mean": m1, "var": var}

    def sample(self, slot: torch.Tensor, comp: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        mean = self.params["mean"][slot, comp]
        std = self.params["var"][slot, comp].sqrt()
        noise = torch.randn(mean.shape, generator=gen, dtype=torch.float64, device="cpu").to(mean)
        return mean + std * noise

    def mode(self, slot: torch.Tensor, comp: torch.Tensor) -> torch.Tensor:
        return self.params["mean"][slot, comp]


def _log_normal_interval(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """``log(Phi(hi) - Phi(lo))`` for standardised bounds ``lo < hi`` (may be +-inf), in float64.

    The interval is reflected so that its midpoint is <= 0; then both CDFs are
    ``erfc(-u / sqrt 2) / 2`` of non-positive-ish ``u`` and their difference keeps full relative
    precision in float64 until both underflow (about 37 standard deviations out), where the
    density-times-width approximation takes over. (``torch.special.log_ndtr`` is exact too but
    about 100x slower on CPU.)
    """
    lo, hi = lo.double(), hi.double()
    flip = (lo + hi) > 0
    a = torch.where(flip, -hi, lo)
    b = torch.where(flip, -lo, hi)
    mass = 0.5 * (torch.erfc(-b * _INV_SQRT2) - torch.erfc(-a * _INV_SQRT2))
    out = torch.log(mass)
    mid = 0.5 * (a + b)
    approx = -0.5 * mid * mid - _LOG_SQRT_2PI + torch.log(b - a)
    # A far left tail (-inf, b]: Mills-ratio asymptote of log Phi(b).
    tail = -0.5 * b * b - torch.log(-b) - _LOG_SQRT_2PI
    approx = torch.where(torch.isinf(a), tail, approx)
    return torch.where(mass > 1e-290, out, approx)


class DiscretizedGaussianLeaf(GaussianLeaf):
    """Gaussian integrated over the bins of ``num_levels`` integer levels (appendix E.2).

    Level ``v`` in ``0..L-1`` sits at ``z = v / (L-1)`` in [0, 1] with bin
    ``[(v - 1/2) / (L-1), (v + 1/2) / (L-1)]``; the first and last bins extend to -inf and +inf,
    so the masses of all levels sum to exactly 1. Mean and variance are on the [0, 1] scale.
    EM is exact: the E-step uses the moments of the Gaussian truncated to each observed bin.

    Every value is one of ``L`` levels, so the bin log-masses and truncated moments are tables
    ``(slot, K, level)``, computed once per parameter version (after each M-step) and then
    gathered per observation: the same numbers as evaluating each observation, at the cost of
    ``L`` evaluations per slot and component per parameter version instead of one per observation
    (on MNIST, 256 levels: E-step about 10-30x and likelihood about 10-20x faster per row; a
    table costs about as much as evaluating ``L`` rows the old way).
    """

    # Above this many levels the tables are not built (each observation is evaluated directly).
    TABLE_MAX_LEVELS = 1024
    # Slots per chunk while building the tables (bounds the float64 temporaries).
    TABLE_CHUNK_ELEMENTS = 1 << 16

    kind = "discretized_gaussian"

    def __init__(self, slot_mask: torch.Tensor, num_components: int, dtype: torch.dtype, device: torch.device,
                 min_var: float = 1e-3, max_var: float = 0.25, num_levels: int = 256) -> None:
        super().__init__(slot_mask, num_components, dtype, device, min_var, max_var)
        if int(num_levels) < 2:
            raise UserError(f"num_levels: need >= 2 levels, got {num_levels}")
        self.num_levels = int(num_levels)

    def hyper(self) -> dict[str, float | int]:
        return {**super().hyper(), "num_levels": self.num_levels}

    def validate(self, x: torch.Tensor) -> None:
        _check_levels(x, self.num_levels)

    # Not an exponential family in x. With the level tables a region's log-density is a sum of
    # table rows (one ``embedding_bag``); the E-step differentiates the region values (a slot's
    # responsibility is its region's gradient) and gathers the truncated moments of each
    # observation from the moment tables. Without tables: the generic per-slot route.
    def region_log_prob(self, x: torch.Tensor) -> torch.Tensor:
        if not self._tabled(x):
            return LeafFamily.region_log_prob(self, x)
        return self._bag(self._tables()[0], x)

    def forward_for_em(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        if not self._tabled(x):
            return LeafFamily.forward_for_em(self, x)
        with torch.no_grad():
            values = self._bag(self._tables()[0], x)
        values.requires_grad_(True)
        return values, [values]

    def stats_from_grads(self, x: torch.Tensor, inputs: list[torch.Tensor],
                         grads: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        if not self._tabled(x):
            return LeafFamily.stats_from_grads(self, x, inputs, grads)
        _, m1, m2 = self._tables()
        # gradient w.r.t. the region values (L, K, batch): every observed slot of a region shares it
        g = grads[0].transpose(1, 2).unsqueeze(1)  # (L, 1, batch, K)
        rows = self._rows(x).reshape(-1)
        flat = (self.num_slots, self.num_components)
        observed = (~torch.isnan(x)).to(g.dtype)
        n = torch.bmm(observed, grads[0].transpose(1, 2))  # (L, m, K)
        stats = {"n": n.reshape(flat)}
        for name, table in (("s1", m1), ("s2", m2)):
            stats[name] = (table[rows].view(*x.shape, self.num_components) * g).sum(2).reshape(flat)
        return stats

    def _tabled(self, x: torch.Tensor) -> bool:
        """Use the level tables for slot values ``x``: few enough levels, the model's slot layout."""
        return self.num_levels <= self.TABLE_MAX_LEVELS and tuple(x.shape[:2]) == (self.num_regions, self.width)

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """Table row ``slot * levels + x`` of each value ``(L, m, batch)``; missing -> the zero row."""
        missing = torch.isnan(x)
        slot = torch.arange(self.num_slots, device=x.device).view(self.num_regions, self.width, 1)
        rows = slot * self.num_levels + torch.nan_to_num(x, nan=0.0).long()
        return rows.masked_fill(missing, self.num_slots * self.num_levels)

    def _bag(self, table: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``sum_i table[slot_i * levels + x_i]`` over each region's slots: ``(L, m, batch)`` -> ``(L, K, batch)``.

        Missing values (NaN, padding) read the table's last row, which is zero.
        """
        rows = self._rows(x)
        batch = x.shape[-1]
        out = torch.nn.functional.embedding_bag(rows.transpose(1, 2).reshape(-1, self.width), table, mode="sum")
        return out.view(self.num_regions, batch, self.num_components).transpose(1, 2)

    def _bounds(self, x: torch.Tensor, regions: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
        """Standardised bin bounds ``(L, m, K, batch)`` of the levels ``x (L, m, batch)``
        (``x`` covers the leaf regions ``regions`` only, if given)."""
        scale = self.num_levels - 1
        lo = (x - 0.5) / scale
        hi = (x + 0.5) / scale
        lo = torch.where(x <= 0, torch.full_like(lo, -math.inf), lo)
        hi = torch.where(x >= scale, torch.full_like(hi, math.inf), hi)
        mean, std = self._view("mean")[regions], self._view("var")[regions].sqrt()
        return (lo.unsqueeze(2) - mean) / std, (hi.unsqueeze(2) - mean) / std

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        missing = torch.isnan(x)
        xs = torch.nan_to_num(x, nan=0.0)
        if self._tabled(x):
            lp = self._gather(self._tables()[0], xs)
        else:
            lo, hi = self._bounds(xs)
            lp = _log_normal_interval(lo, hi)
        return lp.to(x.dtype).masked_fill(missing.unsqueeze(2), 0.0)

    def _moments_per_component(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._tabled(x):
            _, m1, m2 = self._tables()
            return self._gather(m1, x), self._gather(m2, x)
        return self._direct_moments(x, *self._bounds(x))

    def _tables(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-mass, ``E[z]`` and ``E[z^2]`` of every level: flat ``(S * levels, K)`` tables
        (each has one more row, of zeros, read by missing values).

        Cached until the parameters change (new tensors or an in-place update).
        """
        mean, var = self.params["mean"], self.params["var"]
        key = (id(mean), mean._version, id(var), var._version)
        cache = getattr(self, "_table_cache", None)
        if cache is not None and cache[0] == key and cache[1][0] is mean and cache[1][1] is var:
            return cache[2]
        levels = torch.arange(self.num_levels, dtype=self.dtype, device=self.device)
        chunk = max(1, self.TABLE_CHUNK_ELEMENTS // max(1, self.width * self.num_components * self.num_levels))
        parts: list[list[torch.Tensor]] = [[], [], []]
        for r0 in range(0, self.num_regions, chunk):
            r1 = min(self.num_regions, r0 + chunk)
            x = levels.expand(r1 - r0, self.width, -1)
            lo, hi = self._bounds(x, slice(r0, r1))
            log_z = _log_normal_interval(lo.double(), hi.double())
            m1, m2 = self._direct_moments(x, lo, hi, slice(r0, r1), log_z)
            for out, t in zip(parts, (log_z.to(self.dtype), m1, m2)):
                # (l, m, K, levels) -> rows slot * levels + level, columns K
                out.append(t.permute(0, 1, 3, 2).reshape(-1, self.num_components))
        zero = torch.zeros(1, self.num_components, dtype=self.dtype, device=self.device)
        tables = (torch.cat([*parts[0], zero]), torch.cat([*parts[1], zero]), torch.cat([*parts[2], zero]))
        self._table_cache = (key, (mean, var), tables)
        return tables

    def _gather(self, table: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Entries ``table[slot * levels + x]`` for levels ``x (L, m, batch)`` -> ``(L, m, K, batch)``."""
        slot = torch.arange(self.num_slots, device=x.device).view(self.num_regions, self.width, 1)
        rows = (slot * self.num_levels + x.long()).reshape(-1)
        return table[rows].reshape(*x.shape, self.num_components).transpose(2, 3)

    def _direct_moments(self, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                        regions: slice = slice(None), log_z: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        # Truncated-normal moments in float64: the difference of two pdf/mass ratios cancels.
        lo, hi = lo.double(), hi.double()
        if log_z is None:
            log_z = _log_normal_interval(lo, hi)

        def pdf_ratio(u: torch.Tensor) -> torch.Tensor:
            r = torch.exp(-0.5 * u * u - _LOG_SQRT_2PI - log_z)
            return torch.where(torch.isfinite(u), r, torch.zeros_like(r))

        def u_pdf_ratio(u: torch.Tensor) -> torch.Tensor:
            return torch.where(torch.isfinite(u), u * pdf_ratio(u), torch.zeros_like(u))

        e1 = pdf_ratio(lo) - pdf_ratio(hi)
        e2 = 1.0 + u_pdf_ratio(lo) - u_pdf_ratio(hi)
        e1 = torch.minimum(torch.maximum(e1, lo), hi)
        e2 = torch.maximum(e2, e1 * e1)
        mean, std = self._view("mean")[regions].double(), self._view("var")[regions].double().sqrt()
        m1 = mean + std * e1
        m2 = mean * mean + 2 * mean * std * e1 + std * std * e2
        return m1.to(self.dtype), m2.to(self.dtype)

    def sample(self, slot: torch.Tensor, comp: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        # Rounding a Gaussian draw to the nearest level (clamped) samples the binned mass exactly.
        z = super().sample(slot, comp, gen)
        return torch.round(z * (self.num_levels - 1)).clamp(0, self.num_levels - 1)

    def mode(self, slot: torch.Tensor, comp: torch.Tensor) -> torch.Tensor:
        z = super().mode(slot, comp)
        return torch.round(z * (self.num_levels - 1)).clamp(0, self.num_levels - 1)


def _check_levels(x: torch.Tensor, num_levels: int) -> None:
    obs = x[~torch.isnan(x)]
    if obs.numel() and (bool((obs != torch.round(obs)).any()) or float(obs.min()) < 0
                        or float(obs.max()) > num_levels - 1):
        raise UserError(f"x: discrete leaves need integer values in 0..{num_levels - 1}")


class CategoricalLeaf(LeafFamily):
    """Categorical over ``num_levels`` values ``0..L-1``; probabilities ``(S, K, L)``.

    ``pseudocount`` > 0 makes the M-step a MAP estimate under a symmetric Dirichlet, so a level
    never seen in training keeps non-zero mass; 0 gives plain maximum likelihood.
    """

    kind = "categorical"

    def __init__(self, slot_mask: torch.Tensor, num_components: int, dtype: torch.dtype, device: torch.device,
                 num_levels: int = 256, pseudocount: float = 0.01,
                 slot_levels: torch.Tensor | None = None) -> None:
        """``slot_levels`` (optional, ``(L, m)`` ints in ``2..num_levels``): a slot's own number of
        levels; the levels above it get probability 0 (initialisation and M-step alike), so a
        binary variable beside a many-level one is a true two-level categorical."""
        super().__init__(slot_mask, num_components, dtype, device)
        if int(num_levels) < 2:
            raise UserError(f"num_levels: need >= 2 levels, got {num_levels}")
        if pseudocount < 0:
            raise UserError(f"pseudocount: must be >= 0, got {pseudocount}")
        self.num_levels, self.pseudocount = int(num_levels), float(pseudocount)
        self.level_mask: torch.Tensor | None = None  # (S, 1, levels): which levels exist per slot
        self.slot_levels: torch.Tensor | None = None  # (S,)
        if slot_levels is not None:
            lv = slot_levels.to(device=device, dtype=torch.long).reshape(-1)
            if lv.numel() != self.num_slots or bool((lv < 2).any()) or bool((lv > self.num_levels).any()):
                raise UserError(f"slot_levels: need {self.num_slots} values in 2..{self.num_levels}")
            self.slot_levels = lv
            self.level_mask = (torch.arange(self.num_levels, device=device) < lv[:, None]).unsqueeze(1)

    def hyper(self) -> dict[str, float | int]:
        return {"num_levels": self.num_levels, "pseudocount": self.pseudocount}

    def validate(self, x: torch.Tensor) -> None:
        _check_levels(x, self.num_levels)

    def num_parameters(self) -> int:
        if self.slot_levels is None:
            return self.num_real_slots * self.num_components * self.num_levels
        return int(self.slot_levels[self.slot_mask.reshape(-1)].sum()) * self.num_components

    def initialize(self, gen: torch.Generator) -> None:
        shape = (self.num_slots, self.num_components, self.num_levels)
        raw = 1.0 + torch.rand(shape, generator=gen, dtype=torch.float64, device="cpu")
        if self.level_mask is not None:
            raw = raw * self.level_mask.cpu()
        self.params = {"probs": (raw / raw.sum(-1, keepdim=True)).to(self.dtype).to(self.device)}

    def _index(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        missing = torch.isnan(x)
        return missing, torch.where(missing, torch.zeros_like(x), x).long()

    def _rows(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Missing mask and flat row ``slot * L_levels + level`` per entry, both ``(L, m, batch)``."""
        missing, idx = self._index(x)
        slot = torch.arange(self.num_slots, device=x.device).view(self.num_regions, self.width, 1)
        return missing, slot * self.num_levels + idx

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        missing, rows = self._rows(x)
        # Gather logp[s, k, x] through one flat index per entry: no (L, m, K, levels, batch) tensor.
        flat = torch.log(self.params["probs"]).permute(0, 2, 1).reshape(-1, self.num_components)
        lp = flat[rows.reshape(-1)].reshape(*x.shape, self.num_components).transpose(2, 3)
        return lp.masked_fill(missing.unsqueeze(2), 0.0)

    def expected_stats(self, x: torch.Tensor, resp: torch.Tensor) -> dict[str, torch.Tensor]:
        missing, rows = self._rows(x)
        r = resp.masked_fill(missing.unsqueeze(2), 0.0).transpose(2, 3)  # (L, m, batch, K)
        counts = torch.zeros(self.num_slots * self.num_levels, self.num_components, dtype=resp.dtype,
                             device=resp.device)
        counts.index_add_(0, rows.reshape(-1), r.reshape(-1, self.num_components))
        counts = counts.reshape(self.num_slots, self.num_levels, self.num_components).permute(0, 2, 1)
        return {"counts": counts.contiguous()}

    def m_step(self, stats: dict[str, torch.Tensor], step_size: float) -> None:
        counts = stats["counts"] + self.pseudocount
        if self.level_mask is not None:
            counts = counts * self.level_mask
        total = counts.sum(-1, keepdim=True)
        old = self.params["probs"]
        new = torch.where(total > 0, counts / total.clamp_min(1e-300), old)
        self.params = {"probs": (1 - step_size) * old + step_size * new}

    def sample(self, slot: torch.Tensor, comp: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        probs = self.params["probs"][slot, comp].double().cpu()
        if probs.numel() == 0:
            return torch.zeros(0, dtype=self.dtype, device=self.device)
        return torch.multinomial(probs, 1, generator=gen).squeeze(-1).to(self.dtype).to(self.device)

    def mode(self, slot: torch.Tensor, comp: torch.Tensor) -> torch.Tensor:
        return self.params["probs"][slot, comp].argmax(-1).to(self.dtype)


class BernoulliLeaf(CategoricalLeaf):
    """Binary pixels: a categorical with two levels (one free parameter per component)."""

    kind = "bernoulli"

    def __init__(self, slot_mask: torch.Tensor, num_components: int, dtype: torch.dtype, device: torch.device,
                 pseudocount: float = 0.01) -> None:
        super().__init__(slot_mask, num_components, dtype, device, num_levels=2, pseudocount=pseudocount)

    def hyper(self) -> dict[str, float | int]:
        return {"pseudocount": self.pseudocount}

    def num_parameters(self) -> int:
        return self.num_real_slots * self.num_components


def _joined(gauss: dict[str, torch.Tensor], cat: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A :class:`MixedLeaf`'s flat dict: the Gaussian family's entries as ``g_*``, the categorical's as ``c_*``."""
    return {**{f"g_{k}": v for k, v in gauss.items()}, **{f"c_{k}": v for k, v in cat.items()}}


def _part(flat: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries of one family (``prefix`` ``g_`` or ``c_``) of a :func:`_joined` dict, unprefixed."""
    return {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}


class MixedLeaf(LeafFamily):
    """One leaf family per variable: Gaussian slots for real variables, categorical slots for
    discrete ones (each with its own number of levels), for tabular data that mixes the two.

    ``var_levels[v]`` is 0 for a real variable and its number of levels (>= 2) for a discrete
    one. The family holds a :class:`GaussianLeaf` over the real slots and a
    :class:`CategoricalLeaf` over the discrete slots; each sees NaN (marginalised, log 1 = 0) on
    the other's slots, so a slot's log-density is exactly its own family's. Parameters are the
    two families' under the prefixes ``g_`` and ``c_`` (``g_mean``, ``g_var``, ``c_probs``).
    """

    kind = "mixed"

    def __init__(self, slot_mask: torch.Tensor, num_components: int, dtype: torch.dtype, device: torch.device,
                 slot_var: torch.Tensor, var_levels: "list[int] | tuple[int, ...]", min_var: float = 1e-3,
                 max_var: float = 0.25, pseudocount: float = 0.01, slot_min_var: torch.Tensor | None = None) -> None:
        super().__init__(slot_mask, num_components, dtype, device)
        levels = [int(v) for v in var_levels]
        bad = [(j, v) for j, v in enumerate(levels) if v != 0 and v < 2]
        if bad:
            raise UserError(f"var_levels: variable {bad[0][0]} has {bad[0][1]} levels; use 0 for a real "
                            f"variable and >= 2 for a discrete one")
        self.var_levels = torch.tensor(levels, dtype=torch.long, device=device)
        # Slot -> its variable's levels; padding slots read the extra variable (index num_vars).
        ext = torch.cat([self.var_levels, torch.zeros(1, dtype=torch.long, device=device)])
        slot_lv = ext[slot_var.to(device)]  # (L, m)
        self.real_slot = self.slot_mask & (slot_lv == 0)
        self.disc_slot = self.slot_mask & (slot_lv > 0)
        self.min_var, self.max_var, self.pseudocount = float(min_var), float(max_var), float(pseudocount)
        self.num_levels = max([2] + levels)
        self.gauss = GaussianLeaf(self.real_slot, num_components, dtype, device, min_var=min_var, max_var=max_var,
                                  slot_min_var=slot_min_var)
        # Non-discrete slots keep all levels (never observed there: the values are NaN).
        self.cat = CategoricalLeaf(self.disc_slot, num_components, dtype, device, num_levels=self.num_levels,
                                   pseudocount=pseudocount,
                                   slot_levels=torch.where(self.disc_slot, slot_lv,
                                                           torch.full_like(slot_lv, self.num_levels)))
        self._real_flat = self.real_slot.reshape(-1)
        self._n_gauss_inputs = 3  # GaussianLeaf.forward_for_em: the three natural parameters

    # The two families' parameters under one flat dict (save/load and copies go through it).
    @property  # type: ignore[override]
    def params(self) -> dict[str, torch.Tensor]:
        return _joined(self.gauss.params, self.cat.params)

    @params.setter
    def params(self, value: dict[str, torch.Tensor]) -> None:
        if not value:  # LeafFamily.__init__
            return
        missing = {"g_mean", "g_var", "c_probs"} - set(value)
        if missing:
            raise UserError(f"mixed leaf: parameters {sorted(missing)} missing")
        self.gauss.params, self.cat.params = _part(value, "g_"), _part(value, "c_")

    def hyper(self) -> dict[str, float | int]:
        return {"min_var": self.min_var, "max_var": self.max_var, "pseudocount": self.pseudocount}

    def num_parameters(self) -> int:
        return self.gauss.num_parameters() + self.cat.num_parameters()

    def validate(self, x: torch.Tensor) -> None:
        disc = torch.nonzero(self.var_levels > 0).reshape(-1)
        if not len(disc):
            return
        v = x[:, disc]
        top = (self.var_levels[disc] - 1).to(v.dtype)
        bad = ~torch.isnan(v) & ((v != torch.round(v)) | (v < 0) | (v > top))
        if bool(bad.any()):
            row, col = (int(i) for i in torch.nonzero(bad)[0])
            j = int(disc[col])
            raise UserError(f"x: column {j} is discrete with {int(self.var_levels[j])} levels and needs integer "
                            f"values in 0..{int(self.var_levels[j]) - 1}, got {float(v[row, col])!r} (row {row})")

    def initialize(self, gen: torch.Generator) -> None:
        self.gauss.initialize(gen)
        self.cat.initialize(gen)

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Slot values ``(L, m, batch)`` -> (real slots only, discrete slots only), NaN elsewhere."""
        nan = torch.tensor(float("nan"), dtype=x.dtype, device=x.device)
        return (torch.where(self.real_slot.unsqueeze(-1), x, nan),
                torch.where(self.disc_slot.unsqueeze(-1), x, nan))

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        xr, xd = self._split(x)
        return self.gauss.log_prob(xr) + self.cat.log_prob(xd)

    def region_log_prob(self, x: torch.Tensor) -> torch.Tensor:
        xr, xd = self._split(x)
        return self.gauss.region_log_prob(xr) + self.cat.region_log_prob(xd)

    def forward_for_em(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        xr, xd = self._split(x)
        vg, ig = self.gauss.forward_for_em(xr)
        vc, ic = self.cat.forward_for_em(xd)
        return vg + vc, [*ig, *ic]

    def stats_from_grads(self, x: torch.Tensor, inputs: list[torch.Tensor],
                         grads: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        xr, xd = self._split(x)
        n = self._n_gauss_inputs
        sg = self.gauss.stats_from_grads(xr, inputs[:n], grads[:n])
        sc = self.cat.stats_from_grads(xd, inputs[n:], grads[n:])
        return _joined(sg, sc)

    def expected_stats(self, x: torch.Tensor, resp: torch.Tensor) -> dict[str, torch.Tensor]:
        xr, xd = self._split(x)
        return _joined(self.gauss.expected_stats(xr, resp), self.cat.expected_stats(xd, resp))

    def m_step(self, stats: dict[str, torch.Tensor], step_size: float) -> None:
        self.gauss.m_step(_part(stats, "g_"), step_size)
        self.cat.m_step(_part(stats, "c_"), step_size)

    def _per_kind(self, slot: torch.Tensor, comp: torch.Tensor, real_fn, disc_fn) -> torch.Tensor:
        real = self._real_flat[slot]
        out = torch.empty(slot.shape, dtype=self.dtype, device=self.device)
        out[real] = real_fn(slot[real], comp[real]).to(out)
        out[~real] = disc_fn(slot[~real], comp[~real]).to(out)
        return out

    def sample(self, slot: torch.Tensor, comp: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        return self._per_kind(slot, comp, lambda s, c: self.gauss.sample(s, c, gen),
                              lambda s, c: self.cat.sample(s, c, gen))

    def mode(self, slot: torch.Tensor, comp: torch.Tensor) -> torch.Tensor:
        return self._per_kind(slot, comp, self.gauss.mode, self.cat.mode)


LEAF_FAMILIES: dict[str, type[LeafFamily]] = {
    cls.kind: cls for cls in (GaussianLeaf, DiscretizedGaussianLeaf, CategoricalLeaf, BernoulliLeaf, MixedLeaf)
}
