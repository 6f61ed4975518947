"""Binned densities: :class:`Histogram` and :class:`PiecewiseLinear` (MSPN leaves), their exponential tails, and
:class:`FixedBins`, the bin geometry LearnSPN's many fits of one column share."""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from mpifc.circuit.lazy import torch  # imported on first use: numpy paths never need it

from mpifc.circuit.leaves.base import (LOG_ZERO, MIN_FLOW, Leaf, Params, _clean_values, _finish, _mix, _np_finish,
                                       _np_row_searchsorted, _np_safe_log, _safe_log, bad_value, unit_problem)
from mpifc.errors import UserError


TAIL_MASS = 1e-6
"""Default probability mass a continuous Histogram / PiecewiseLinear leaf keeps *outside* its
body ``[lo, hi]`` (the bin edges / outer knots): values beyond the training range get a small
finite density instead of "impossible", so test rows there keep valid posteriors."""


def _tail_log_density(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, tail: torch.Tensor) -> torch.Tensor:
    """Log-density of the two exponential tails attached to a body on ``[lo, hi]``.

    Each side carries mass ``tail / 2`` and decays with scale ``hi - lo`` from the edge:
    ``(tail / 2) / (hi - lo) * exp(-dist / (hi - lo))``, which integrates to exactly ``tail`` over
    ``x < lo`` and ``x > hi``. With the body scaled by ``1 - tail`` the leaf is normalised on the
    whole real line and its log-density falls off linearly, never to ``-inf``.
    """
    scale = (hi - lo)[None, :]
    dist = torch.where(x < lo[None, :], lo[None, :] - x, x - hi[None, :]).clamp_min(0.0)
    return torch.log(tail / 2)[None, :] - torch.log(scale) - dist / scale


def _np_tail_log_density(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """:func:`_tail_log_density` in numpy."""
    scale = (hi - lo)[None, :]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        dist = np.maximum(np.where(x < lo[None, :], lo[None, :] - x, x - hi[None, :]), 0.0)
        return np.log(tail / 2)[None, :] - np.log(scale) - dist / scale


def _np_body_and_tail_bound(top: np.ndarray, tail: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The largest log-density of a body whose highest density is ``top`` (scaled by ``1 - tail``)
    and of its tails (highest at the edges), at least 0, per leaf."""
    with np.errstate(divide="ignore"):
        body = np.log(top) + np.log1p(-tail)
        edge = np.log(tail / 2) - np.log(hi - lo)
    return np.maximum(np.maximum(body, edge), 0.0)


def _sample_tails(out: np.ndarray, lo: np.ndarray, hi: np.ndarray, tail: np.ndarray,
                  rng: np.random.Generator) -> np.ndarray:
    """Replace each draw by a tail draw with probability ``tail`` (side and distance as in
    :func:`_tail_log_density`). All arrays ``(m,)``; draws always consume the same randoms."""
    u, side, e = rng.random(len(out)), rng.random(len(out)) < 0.5, rng.exponential(size=len(out))
    scale = hi - lo
    t = np.where(side, lo - e * scale, hi + e * scale)
    return np.where(u < tail, t, out)


def _knots_problem(p: dict[str, np.ndarray], name: str) -> str | None:
    """Finite, strictly increasing edges or knots ``p[name]``."""
    a = p[name]
    return (bad_value(p, name, np.isfinite(a), "edges must be finite")
            or bad_value(p, name, np.concatenate([[True], np.diff(a) > 0]), "edges must be strictly increasing"))


def _tail_problem(p: dict[str, np.ndarray]) -> str | None:
    return bad_value(p, "tail", (p["tail"] >= 0) & (p["tail"] < 1), "the tail mass must be in [0, 1)")


def _check_tail(tail: float, who: str) -> float:
    if not (0.0 <= float(tail) < 1.0):
        raise UserError(f"{who}: tail mass must be in [0, 1), got {tail}")
    return float(tail)


class Histogram(Leaf):
    """Piecewise-constant density on bins ``[breaks[i], breaks[i+1])`` (MSPN leaf).

    With integer ``breaks`` one unit apart and ``discrete=True`` the density equals the mass of
    each integer, so it doubles as a discrete leaf (mode and samples are then the integers; values
    outside the bins are impossible, as for :class:`Categorical`).

    A continuous histogram keeps mass ``tail`` outside ``[breaks[0], breaks[-1])``: the bins
    carry ``1 - tail`` and two exponential tails (see :func:`_tail_log_density`) the rest, so the
    density is positive and normalised on the whole line. EM re-estimates the bins from the
    points inside them (exact EM: the tails have no free parameter).

    Args:
        breaks: ``(b+1,)`` strictly increasing bin edges.
        densities: ``(b,)`` non-negative densities with ``sum(densities * widths) == 1`` (the
            body's shape; the evaluated density inside is ``(1 - tail) * densities``).
        discrete: values are the integers ``breaks[i]`` (mode/sampling return left edges).
        alpha: Laplace pseudo-count per bin used by ``fit`` and EM.
        tail: mass outside the bins (continuous only; ignored when ``discrete``); 0 makes values
            outside impossible.
    """

    type_name = "histogram"
    param_names = ("breaks", "densities", "discrete", "alpha", "tail")
    learnable = ("densities",)
    ragged = ("breaks", "densities")
    pad = {"breaks": math.inf, "densities": 0.0}

    def __init__(self, breaks: Sequence[float] | np.ndarray, densities: Sequence[float] | np.ndarray,
                 discrete: bool = False, alpha: float = 1.0, tail: float = TAIL_MASS) -> None:
        b = np.asarray(breaks, dtype=np.float64).reshape(-1)
        d = np.asarray(densities, dtype=np.float64).reshape(-1)
        if b.size != d.size + 1 or d.size == 0 or np.any(~np.isfinite(b)) or np.any(np.diff(b) <= 0):
            raise UserError(f"Histogram: need b+1 strictly increasing finite breaks for b densities, "
                            f"got {b.size} breaks, {d.size} densities")
        mass = float((d * np.diff(b)).sum())
        if np.any(~np.isfinite(d)) or np.any(d < 0) or abs(mass - 1) > 1e-6:
            raise UserError(f"Histogram: densities must be >= 0 and integrate to 1 (got {mass:.6g})")
        self._p = {"breaks": b, "densities": d / mass, "discrete": np.array(float(discrete)),
                   "alpha": np.array(float(alpha)),
                   "tail": np.array(0.0 if discrete else _check_tail(tail, "Histogram"))}

    @classmethod
    def _value_problem(cls, p: dict[str, np.ndarray], tol: float) -> str | None:
        b, d = p["breaks"], p["densities"]
        if b.size != d.size + 1:
            return f"'breaks' has {b.size} edges for {d.size} bins (needs one more edge than bins)"
        return (_knots_problem(p, "breaks")
                or bad_value(p, "densities", np.isfinite(d) & (d >= 0), "a density must be finite and >= 0")
                or unit_problem("densities", float((d * np.diff(b)).sum()), tol, "integrate")
                or bad_value(p, "discrete", (p["discrete"] == 0) | (p["discrete"] == 1), "must be 0 or 1")
                or bad_value(p, "alpha", np.isfinite(p["alpha"]) & (p["alpha"] >= 0),
                             "a pseudo-count must be finite and >= 0")
                or _tail_problem(p))

    @classmethod
    def _bin(cls, P: Params, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Bin index ``(batch, n)`` and a validity mask."""
        br = P["breaks"]
        xs = torch.nan_to_num(x, nan=0.0).T.contiguous()
        j = (torch.searchsorted(br.contiguous(), xs, right=True) - 1).T
        ok = (j >= 0) & (j < (P["len_breaks"] - 1)[None, :]) & ~torch.isnan(x)
        # A discrete histogram puts its mass on the integers only.
        ok &= (P["discrete"] == 0)[None, :] | (x == torch.floor(x))
        return torch.where(ok, j, torch.zeros_like(j)), ok

    @classmethod
    def _edges(cls, P: Params) -> tuple[torch.Tensor, torch.Tensor]:
        """First and last bin edge ``(n,)`` each."""
        return P["breaks"][:, 0], P["breaks"].gather(1, (P["len_breaks"] - 1)[:, None])[:, 0]

    @classmethod
    def batch_log_prob(cls, P: Params, x: torch.Tensor) -> torch.Tensor:
        j, ok = cls._bin(P, x)
        tail = P["tail"]
        lp = _safe_log(P["densities"])[torch.arange(j.shape[1])[None, :], j] + torch.log1p(-tail)[None, :]
        lo, hi = cls._edges(P)
        xc = torch.nan_to_num(x, nan=0.0)
        outside = ((xc < lo[None, :]) | (xc >= hi[None, :])) & (P["discrete"] == 0)[None, :]
        lt = torch.where(outside, _tail_log_density(xc, lo, hi, tail), torch.full_like(lp, LOG_ZERO))
        return _finish(torch.where(ok, lp, lt), x)

    @classmethod
    def np_log_prob(cls, P: Params, x: np.ndarray) -> np.ndarray:
        br, n = P["breaks"], P["breaks"].shape[0]
        xc = np.nan_to_num(x, nan=0.0)
        j = _np_row_searchsorted(br, xc) - 1
        ok = (j >= 0) & (j < (P["len_breaks"] - 1)[None, :]) & ~np.isnan(x)
        ok &= (P["discrete"] == 0)[None, :] | (x == np.floor(x))
        j = np.where(ok, j, 0)
        tail = P["tail"]
        col = np.arange(n)[None, :]
        lp = _np_safe_log(P["densities"])[col, j] + np.log1p(-tail)[None, :]
        lo, hi = br[:, 0], br[np.arange(n), P["len_breaks"] - 1]
        outside = ((xc < lo[None, :]) | (xc >= hi[None, :])) & (P["discrete"] == 0)[None, :]
        lt = np.where(outside, _np_tail_log_density(xc, lo, hi, tail), LOG_ZERO)
        return _np_finish(np.where(ok, lp, lt), x)

    @classmethod
    def np_log_bound(cls, P: Params) -> np.ndarray:
        n = P["breaks"].shape[0]
        lo, hi = P["breaks"][:, 0], P["breaks"][np.arange(n), P["len_breaks"] - 1]
        return _np_body_and_tail_bound(P["densities"].max(axis=1), P["tail"], lo, hi)

    @classmethod
    def batch_mode(cls, P: Params) -> torch.Tensor:
        j = P["densities"].argmax(1, keepdim=True)
        lo = P["breaks"].gather(1, j)[:, 0]
        hi = P["breaks"].gather(1, j + 1)[:, 0]
        return torch.where(P["discrete"] > 0, lo, 0.5 * (lo + hi))

    @classmethod
    def batch_sample(cls, P: Params, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        br = P["breaks"].double().numpy()[idx]
        d = P["densities"].double().numpy()[idx]
        L = P["len_densities"].numpy()[idx]
        with np.errstate(invalid="ignore"):  # padding edges are inf; their widths become 0
            wid = np.nan_to_num(br[:, 1:] - br[:, :-1], nan=0.0, posinf=0.0)
        cdf = np.cumsum(d * wid, axis=1)
        u = rng.random(len(idx)) * cdf[:, -1]
        j = np.minimum((cdf <= u[:, None]).sum(1), L - 1)
        rows = np.arange(len(idx))
        lo = br[rows, j]
        disc = P["discrete"].double().numpy()[idx] > 0
        out = np.where(disc, lo, lo + rng.random(len(idx)) * wid[rows, j])
        first, last = (e.double().numpy()[idx] for e in cls._edges(P))
        return _sample_tails(out, first, last, P["tail"].double().numpy()[idx], rng)

    @classmethod
    def batch_em_stats(cls, P: Params, x: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
        n, B = P["densities"].shape
        j, ok = cls._bin(P, x)
        w = torch.where(ok, w, torch.zeros_like(w))
        counts = torch.zeros(n * B, dtype=w.dtype).index_add_(
            0, (j + B * torch.arange(n)[None, :]).reshape(-1), w.reshape(-1))
        return {"counts": counts.view(n, B)}

    @classmethod
    def batch_m_step(cls, P: Params, stats: dict[str, torch.Tensor], step_size: float) -> Params:
        n, B = P["densities"].shape
        valid = torch.arange(B)[None, :] < P["len_densities"][:, None]
        c = torch.where(valid, stats["counts"] + P["alpha"][:, None], torch.zeros_like(stats["counts"]))
        tot = c.sum(1)
        ok = tot > MIN_FLOW
        wid = torch.where(valid, P["breaks"][:, 1:] - P["breaks"][:, :-1], torch.ones_like(c))
        wid = torch.nan_to_num(wid, nan=1.0, posinf=1.0)
        d = c / torch.where(ok, tot, torch.ones_like(tot))[:, None] / wid
        out = dict(P)
        out["densities"] = _mix(P["densities"], d, ok, step_size)
        return out

    @classmethod
    def fit(cls, values: Any, weights: Any | None = None, discrete: bool = False,
            bins: int | str = "auto", alpha: float = 1.0, breaks: Any | None = None,
            tail: float = TAIL_MASS, **_: Any) -> "Histogram":
        """Weighted histogram. ``discrete``: one unit bin per integer from min to max (or pass
        ``breaks``); otherwise numpy's ``bins`` rule on the (unweighted) values. Values outside
        ``breaks`` are left to the tails (``tail``)."""
        v, w = _clean_values(values, weights)
        if breaks is not None:
            br = np.asarray(breaks, dtype=np.float64)
        elif v.size == 0:
            br = np.array([0.0, 1.0])
        elif discrete:
            br = np.arange(np.floor(v.min()), np.floor(v.max()) + 2.0)
        else:
            lo, hi = float(v.min()), float(v.max())
            br = np.histogram_bin_edges(v, bins=bins) if hi > lo else np.array([lo - 0.5, hi + 0.5])
            br[-1] = np.nextafter(br[-1], np.inf)  # half-open bins: keep the maximum inside
        c, _ = np.histogram(v, bins=br, weights=w)
        c = c + alpha
        if c.sum() <= 0:
            c = np.ones_like(c)
        return cls(br, c / c.sum() / np.diff(br), discrete, alpha, tail)

    @classmethod
    def fit_fixed(cls, values: Any, bins: "FixedBins", discrete: bool = False, alpha: float = 1.0,
                  tail: float = TAIL_MASS) -> "Histogram":
        """Unweighted :meth:`fit` on the fixed edges ``bins.edges`` (``breaks=``), without
        re-deriving them: bit-identical parameters, a fraction of the time."""
        return _histogram_fit_fixed(cls, values, bins, discrete, alpha, tail)


class PiecewiseLinear(Leaf):
    """Density linear between knots ``(xs[i], ys[i])`` (MSPN), with exponential tails outside.

    With the knots fixed, linear interpolation is a mixture of normalised "hat" densities: hat
    ``i`` rises from ``xs[i-1]`` to 1 at ``xs[i]`` and falls to ``xs[i+1]``, has area
    ``a_i = (xs[i+1] - xs[i-1]) / 2`` (half of that at the two ends) and weight
    ``pi_i = ys[i] * a_i`` (the trapezoid rule makes ``sum(pi) == 1``). EM therefore updates the
    heights exactly as mixture weights: ``pi_i`` becomes the expected share of the points
    attributed to hat ``i``; its statistic (the per-knot responsibilities) adds up over shards.
    The knots stay where ``fit`` put them, like a histogram's bin edges.

    The body on ``[xs[0], xs[-1]]`` carries mass ``1 - tail``; two exponential tails carry
    ``tail`` (see :func:`_tail_log_density`), so values outside the training range keep a small
    finite, normalised density.

    Args:
        xs: ``(m,)`` strictly increasing knots, ``m >= 2``.
        ys: ``(m,)`` non-negative densities at the knots; trapezoid integral must be 1.
        tail: mass outside ``[xs[0], xs[-1]]``; 0 makes values there impossible.
    """

    type_name = "piecewise_linear"
    param_names = ("xs", "ys", "tail")
    learnable = ("ys",)
    ragged = ("xs", "ys")
    pad = {"xs": math.inf, "ys": 0.0}

    def __init__(self, xs: Sequence[float] | np.ndarray, ys: Sequence[float] | np.ndarray,
                 tail: float = TAIL_MASS) -> None:
        a = np.asarray(xs, dtype=np.float64).reshape(-1)
        b = np.asarray(ys, dtype=np.float64).reshape(-1)
        if a.size < 2 or a.size != b.size or np.any(~np.isfinite(a)) or np.any(np.diff(a) <= 0):
            raise UserError("PiecewiseLinear: need >= 2 strictly increasing finite xs and as many ys")
        area = float(np.trapezoid(b, a)) if np.all(np.isfinite(b)) else math.nan
        if np.any(b < 0) or not abs(area - 1) <= 1e-6:
            raise UserError(f"PiecewiseLinear: ys must be >= 0 with integral 1 (got {area:.6g})")
        self._p = {"xs": a, "ys": b / area, "tail": np.array(_check_tail(tail, "PiecewiseLinear"))}

    @classmethod
    def _value_problem(cls, p: dict[str, np.ndarray], tol: float) -> str | None:
        xs, ys = p["xs"], p["ys"]
        if xs.size < 2 or xs.size != ys.size:
            return f"'xs' and 'ys' must hold as many knots, at least 2 (got {xs.size} and {ys.size})"
        return (_knots_problem(p, "xs")
                or bad_value(p, "ys", np.isfinite(ys) & (ys >= 0), "a density must be finite and >= 0")
                or unit_problem("ys", float(np.trapezoid(ys, xs)), tol, "integrate")
                or _tail_problem(p))

    @classmethod
    def _segment(cls, P: Params, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Segment index ``j`` ``(batch, n)``, position ``t`` in it (0..1) and an inside mask."""
        xs = P["xs"]
        xc = torch.nan_to_num(x, nan=0.0)
        j = (torch.searchsorted(xs.contiguous(), xc.T.contiguous(), right=True) - 1).T
        last = P["len_xs"] - 1
        # The support is closed: the last knot belongs to the last segment.
        j = torch.where(xc == xs.gather(1, last[:, None])[:, 0][None, :], (last - 1)[None, :], j)
        ok = (j >= 0) & (j < last[None, :]) & ~torch.isnan(x)
        j = torch.where(ok, j, torch.zeros_like(j))
        col = torch.arange(xs.shape[0])[None, :]
        x0, x1 = xs[col, j], xs[col, j + 1]
        t = ((xc - x0) / torch.where(ok, x1 - x0, torch.ones_like(x0))).clamp(0, 1)
        return j, t, ok

    @classmethod
    def _ends(cls, P: Params) -> tuple[torch.Tensor, torch.Tensor]:
        return P["xs"][:, 0], P["xs"].gather(1, (P["len_xs"] - 1)[:, None])[:, 0]

    @classmethod
    def batch_log_prob(cls, P: Params, x: torch.Tensor) -> torch.Tensor:
        ys = P["ys"]
        j, t, ok = cls._segment(P, x)
        col = torch.arange(ys.shape[0])[None, :]
        y = (ys[col, j] + t * (ys[col, j + 1] - ys[col, j])).clamp_min(0)
        body = _safe_log(y) + torch.log1p(-P["tail"])[None, :]
        lo, hi = cls._ends(P)
        xc = torch.nan_to_num(x, nan=0.0)
        lt = _tail_log_density(xc, lo, hi, P["tail"])
        return _finish(torch.where(ok, body, lt), x)

    @classmethod
    def np_log_prob(cls, P: Params, x: np.ndarray) -> np.ndarray:
        xs, ys, n = P["xs"], P["ys"], P["xs"].shape[0]
        xc = np.nan_to_num(x, nan=0.0)
        j = _np_row_searchsorted(xs, xc) - 1
        last = P["len_xs"] - 1
        col = np.arange(n)[None, :]
        hi = xs[np.arange(n), last]
        j = np.where(xc == hi[None, :], (last - 1)[None, :], j)
        ok = (j >= 0) & (j < last[None, :]) & ~np.isnan(x)
        j = np.where(ok, j, 0)
        x0, x1 = xs[col, j], xs[col, j + 1]
        with np.errstate(invalid="ignore"):
            t = np.clip((xc - x0) / np.where(ok, x1 - x0, 1.0), 0, 1)
            y = np.maximum(ys[col, j] + t * (ys[col, j + 1] - ys[col, j]), 0)
        body = _np_safe_log(y) + np.log1p(-P["tail"])[None, :]
        lt = _np_tail_log_density(xc, xs[:, 0], hi, P["tail"])
        return _np_finish(np.where(ok, body, lt), x)

    @classmethod
    def _hat_areas(cls, P: Params) -> torch.Tensor:
        """Area of each knot's hat ``(n, m)`` (1 on padding, which has no mass)."""
        xs, L = P["xs"], P["len_xs"]
        m = xs.shape[1]
        valid = torch.arange(m)[None, :] < L[:, None]
        xv = torch.where(valid, xs, torch.zeros_like(xs))
        idx = torch.arange(m)[None, :].expand_as(xs)
        left = xv.gather(1, (idx - 1).clamp_min(0))
        right = xv.gather(1, torch.minimum(idx + 1, (L - 1)[:, None]))
        a = 0.5 * (right - left)
        return torch.where(valid & (a > 0), a, torch.ones_like(a))

    @classmethod
    def batch_em_stats(cls, P: Params, x: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
        ys = P["ys"]
        n, m = ys.shape
        j, t, ok = cls._segment(P, x)
        col = torch.arange(n)[None, :]
        left, right = ys[col, j] * (1 - t), ys[col, j + 1] * t
        y = left + right
        use = ok & (y > 0)
        w = torch.where(use, w, torch.zeros_like(w))
        ys_ = torch.where(use, y, torch.ones_like(y))
        base = (col * m).expand_as(j)
        counts = torch.zeros(n * m, dtype=w.dtype)
        counts.index_add_(0, (base + j).reshape(-1), (w * left / ys_).reshape(-1))
        counts.index_add_(0, (base + j + 1).reshape(-1), (w * right / ys_).reshape(-1))
        return {"counts": counts.view(n, m)}

    @classmethod
    def batch_m_step(cls, P: Params, stats: dict[str, torch.Tensor], step_size: float) -> Params:
        c = stats["counts"]
        valid = torch.arange(c.shape[1])[None, :] < P["len_ys"][:, None]
        c = torch.where(valid, c, torch.zeros_like(c))
        tot = c.sum(1)
        ok = tot > MIN_FLOW
        pi = c / torch.where(ok, tot, torch.ones_like(tot))[:, None]
        ys = torch.where(valid, pi / cls._hat_areas(P), torch.zeros_like(pi))
        out = dict(P)
        out["ys"] = _mix(P["ys"], ys, ok, step_size)
        return out

    @classmethod
    def np_log_bound(cls, P: Params) -> np.ndarray:
        n = P["xs"].shape[0]
        lo, hi = P["xs"][:, 0], P["xs"][np.arange(n), P["len_xs"] - 1]
        return _np_body_and_tail_bound(P["ys"].max(axis=1), P["tail"], lo, hi)

    @classmethod
    def batch_mode(cls, P: Params) -> torch.Tensor:
        j = P["ys"].argmax(1, keepdim=True)
        return P["xs"].gather(1, j)[:, 0]

    @classmethod
    def batch_sample(cls, P: Params, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = np.empty(len(idx))
        xs_all, ys_all = P["xs"].double().numpy(), P["ys"].double().numpy()
        lens = P["len_xs"].numpy()
        for leaf in np.unique(idx):  # one vectorised inverse-CDF per distinct leaf
            sel = np.nonzero(idx == leaf)[0]
            xs, ys = xs_all[leaf, : lens[leaf]], ys_all[leaf, : lens[leaf]]
            h = np.diff(xs)
            area = 0.5 * (ys[:-1] + ys[1:]) * h
            cdf = np.cumsum(area)
            u = rng.random(len(sel)) * cdf[-1]
            j = np.minimum(np.searchsorted(cdf, u, side="right"), len(h) - 1)
            r = u - np.concatenate([[0.0], cdf])[j]  # area still to cover inside segment j
            y0, s = ys[j], (ys[j + 1] - ys[j]) / h[j]
            # Stable root of y0*t + s*t^2/2 = r (also fine for s = 0 or y0 = 0).
            t = 2 * r / np.maximum(y0 + np.sqrt(np.maximum(y0 * y0 + 2 * s * r, 0.0)), 1e-300)
            out[sel] = xs[j] + np.clip(t, 0.0, h[j])
        lo, hi = (e.double().numpy()[idx] for e in cls._ends(P))
        return _sample_tails(out, lo, hi, P["tail"].double().numpy()[idx], rng)

    @classmethod
    def fit(cls, values: Any, weights: Any | None = None, bins: int | str = "auto",
            alpha: float = 1.0, tail: float = TAIL_MASS, **_: Any) -> "PiecewiseLinear":
        """Knots at the (weighted, Laplace-smoothed) histogram's bin centres, with zero-density
        knots half a bin beyond each end; normalised by the trapezoid rule."""
        h = Histogram.fit(values, weights, bins=bins, alpha=alpha)
        br, d = h._p["breaks"], h._p["densities"]
        c = 0.5 * (br[:-1] + br[1:])
        w0, w1 = br[1] - br[0], br[-1] - br[-2]
        xs = np.concatenate([[br[0] - 0.5 * w0], c, [br[-1] + 0.5 * w1]])
        ys = np.concatenate([[0.0], d, [0.0]])
        return cls(xs, ys / np.trapezoid(ys, xs), tail)

    @classmethod
    def fit_fixed(cls, values: Any, bins: "FixedBins", alpha: float = 1.0,
                  tail: float = TAIL_MASS) -> "PiecewiseLinear":
        """Unweighted :meth:`fit` with ``bins=bins.edges``, reusing the knots computed once:
        bit-identical parameters, a fraction of the time."""
        return _piecewise_fit_fixed(cls, values, bins, alpha, tail)


class FixedBins:
    """Histogram edges shared by many fits, with their derived geometry computed once.

    LearnSPN fits thousands of histogram / piecewise-linear leaves of one column on the same
    global edges; each generic ``fit`` re-validates the edges and recomputes widths and knots
    (about 0.5 ms per leaf, a fixed cost per leaf). :meth:`Histogram.fit_fixed` and
    :meth:`PiecewiseLinear.fit_fixed` reuse this geometry and give bit-for-bit the parameters of
    ``Histogram.fit(values, breaks=edges, ...)`` and ``PiecewiseLinear.fit(values, bins=edges,
    ...)`` (same floating-point operations in the same order; tested).

    Args:
        edges: ``(b+1,)`` strictly increasing finite edges, ``b >= 1``.
    """

    def __init__(self, edges: Sequence[float] | np.ndarray) -> None:
        br = np.array(edges, dtype=np.float64).reshape(-1)
        if br.size < 2 or np.any(~np.isfinite(br)) or np.any(np.diff(br) <= 0):
            raise UserError(f"FixedBins: need >= 2 strictly increasing finite edges, got {br}")
        self.edges = br
        self.widths = np.diff(br)
        # PiecewiseLinear.fit passes the edges as ``bins``: Histogram.fit then moves the last edge
        # up by one ulp (half-open bins keep the maximum inside), and knots sit at bin centres.
        pw = br.copy()
        pw[-1] = np.nextafter(pw[-1], np.inf)
        self.pw_edges = pw
        self.pw_widths = np.diff(pw)
        c = 0.5 * (pw[:-1] + pw[1:])
        w0, w1 = pw[1] - pw[0], pw[-1] - pw[-2]
        self.knots = np.concatenate([[pw[0] - 0.5 * w0], c, [pw[-1] + 0.5 * w1]])
        self.knot_steps = np.diff(self.knots)
        self._constant: dict[float, FixedBins] = {}

    @classmethod
    def many(cls, edges: Sequence[np.ndarray]) -> list["FixedBins"]:
        """``[FixedBins(e) for e in edges]``, bit for bit, with the geometry of all edge arrays
        computed by one pass of element-wise operations over their concatenation (the per-array
        cost of a few dozen small numpy calls is what a small LearnSPN fit pays per column).
        Any edge array that ``FixedBins`` would reject goes through the constructor (its error)."""
        arrs = [np.array(e, dtype=np.float64).reshape(-1) for e in edges]
        if not arrs:
            return []
        lens = np.array([a.size for a in arrs], dtype=np.int64)
        flat = np.concatenate(arrs)
        ends = np.cumsum(lens)
        starts = ends - lens
        step = flat[1:] - flat[:-1]  # np.diff, across array boundaries too (those are ignored)
        inside = np.ones(step.size, dtype=bool)
        inside[ends[:-1] - 1] = False
        if lens.min() < 2 or not np.isfinite(flat).all() or np.any(step[inside] <= 0):
            return [cls(a) for a in arrs]
        pw = flat.copy()
        pw[ends - 1] = np.nextafter(pw[ends - 1], np.inf)
        pw_step = pw[1:] - pw[:-1]
        centre = 0.5 * (pw[:-1] + pw[1:])
        first = pw[starts] - 0.5 * pw_step[starts]
        last = pw[ends - 1] + 0.5 * pw_step[ends - 2]
        # Knots of array j: first[j], its centres, last[j]; laid out back to back (j extra slots each).
        knots = np.empty(flat.size + len(arrs))
        at = np.arange(len(arrs))
        knots[starts + at] = first
        knots[ends + at] = last
        knots[np.flatnonzero(inside) + np.repeat(at, lens - 1) + 1] = centre[inside]
        knot_step = knots[1:] - knots[:-1]
        out = []
        for j, a in enumerate(arrs):
            s, e = int(starts[j]), int(ends[j])
            b = cls.__new__(cls)
            b.edges = a
            b.widths = step[s: e - 1].copy()
            b.pw_edges = pw[s: e].copy()
            b.pw_widths = pw_step[s: e - 1].copy()
            b.knots = knots[s + j: e + j + 1].copy()
            b.knot_steps = knot_step[s + j: e + j].copy()
            b._constant = {}
            out.append(b)
        return out

    def constant(self, value: float) -> "FixedBins":
        """The one bin ``[value - 0.5, value + 0.5]`` that the generic piecewise fit uses for a
        slice whose values all equal ``value`` (cached: constant slices repeat a few values)."""
        out = self._constant.get(value)
        if out is None:
            out = self._constant[value] = FixedBins(np.array([value - 0.5, value + 0.5]))
        return out


def _fixed_counts(v: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """``np.histogram(v, bins=edges)[0]`` as float64 (unit weights; last bin closed), by one
    searchsorted + bincount instead of a sort; exact integer counts either way."""
    nb = edges.size - 1
    idx = np.searchsorted(edges, v, side="right") - 1
    idx[v == edges[-1]] = nb - 1
    if idx.size and (idx.min() < 0 or idx.max() >= nb):
        idx = idx[(idx >= 0) & (idx < nb)]
    return np.bincount(idx, minlength=nb).astype(np.float64)


def _fixed_values(values: Any) -> np.ndarray | None:
    """Values as a float64 1-D array if all are finite (the fast fits' precondition), else None."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size == 0 or not np.isfinite(v).all():
        return None
    return v


def _trapezoid(y: np.ndarray, steps: np.ndarray) -> float:
    """``np.trapezoid(y, x)`` given ``steps = np.diff(x)`` (the same expression, so same bits)."""
    return (steps * (y[1:] + y[:-1]) / 2.0).sum()


def _fixed_densities(v: np.ndarray, edges: np.ndarray, widths: np.ndarray,
                     alpha: float) -> tuple[np.ndarray, float, bool]:
    """Smoothed bin densities of ``v`` on fixed edges, as the generic histogram fit computes them:
    ``(densities, their mass, whether they are valid)`` (finite, non-negative, mass 1 +- 1e-6)."""
    c = _fixed_counts(v, edges) + alpha
    if c.sum() <= 0:
        c = np.ones_like(c)
    d = c / c.sum() / widths
    mass = float((d * widths).sum())
    return d, mass, bool(np.all(np.isfinite(d)) and not np.any(d < 0) and abs(mass - 1) <= 1e-6)


def _histogram_fit_fixed(cls: type, values: Any, bins: FixedBins, discrete: bool = False, alpha: float = 1.0,
                         tail: float = TAIL_MASS) -> Any:
    v = _fixed_values(values)
    if v is None:
        return cls.fit(values, discrete=discrete, alpha=alpha, breaks=bins.edges.copy(), tail=tail)
    d, mass, ok = _fixed_densities(v, bins.edges, bins.widths, alpha)
    if not ok:
        return cls(bins.edges.copy(), d, discrete, alpha, tail)  # raises as the generic fit would
    obj = cls.__new__(cls)
    obj._p = {"breaks": bins.edges.copy(), "densities": d / mass, "discrete": np.array(float(discrete)),
              "alpha": np.array(float(alpha)),
              "tail": np.array(0.0 if discrete else _check_tail(tail, "Histogram"))}
    return obj


def _piecewise_fit_fixed(cls: type, values: Any, bins: FixedBins, alpha: float = 1.0,
                         tail: float = TAIL_MASS) -> Any:
    v = _fixed_values(values)
    if v is None:
        return cls.fit(values, bins=bins.edges.copy(), alpha=alpha, tail=tail)
    lo, hi = float(v.min()), float(v.max())
    if not hi > lo:  # constant values: the generic fit ignores the edges (one bin around the value)
        try:
            bins = bins.constant(lo)
        except UserError:  # value +- 0.5 not representable: let the generic fit decide
            return cls.fit(values, bins=bins.edges.copy(), alpha=alpha, tail=tail)
    d, mass, ok = _fixed_densities(v, bins.pw_edges, bins.pw_widths, alpha)
    if not ok:
        return cls.fit(values, bins=bins.edges.copy(), alpha=alpha, tail=tail)
    ys = np.concatenate([[0.0], d / mass, [0.0]])
    ys = ys / _trapezoid(ys, bins.knot_steps)
    area = float(_trapezoid(ys, bins.knot_steps))
    if np.any(ys < 0) or not abs(area - 1) <= 1e-6:
        return cls.fit(values, bins=bins.edges.copy(), alpha=alpha, tail=tail)
    obj = cls.__new__(cls)
    obj._p = {"xs": bins.knots.copy(), "ys": ys / area, "tail": np.array(_check_tail(tail, "PiecewiseLinear"))}
    return obj


def piecewise_fit_fixed_columns(block: np.ndarray, bins: Sequence[FixedBins], alpha: float = 1.0,
                                tail: float = TAIL_MASS) -> list[Any]:
    """``[PiecewiseLinear.fit_fixed(block[:, j], bins[j], alpha, tail) for j ...]`` for the
    columns of one slice, bit for bit: the element-wise steps run once over all columns'
    concatenated bins, and only the reductions (each a sum over one column's own contiguous
    values, as in the single fit) run per column. ``None`` marks a column that this path leaves
    to :meth:`PiecewiseLinear.fit_fixed` (a constant column, or any fit that would fall back to
    the generic one).

    Args:
        block: ``(n, m)`` float64 values, ``n >= 1``.
        bins: ``m`` column geometries.
    """
    n, m = block.shape
    out: list[Any] = [None] * m
    if m == 0 or n == 0 or block.dtype != np.float64 or not np.isfinite(block).all():
        return out
    if not 0.0 <= float(tail) < 1.0:
        return out  # the single fit raises the error
    tail_v = float(tail)
    cols = np.ascontiguousarray(block.T)  # row j: column j's values, contiguous as x[rows, v]
    lo, hi = cols.min(1), cols.max(1)
    use = [j for j in range(m) if hi[j] > lo[j]]
    if not use:
        return out
    nb = np.array([bins[j].pw_widths.size for j in use], dtype=np.int64)
    bin_end = np.cumsum(nb)
    bin_start = bin_end - nb
    total = int(bin_end[-1])
    idx = np.empty((len(use), n), dtype=np.int64)
    for r, j in enumerate(use):  # _fixed_counts per column, shifted to the column's bins
        e = bins[j].pw_edges
        k = np.searchsorted(e, cols[j], side="right") - 1
        k[cols[j] == e[-1]] = nb[r] - 1
        k[(k < 0) | (k >= nb[r])] = total - bin_start[r]  # outside the bins: a spare slot, dropped
        idx[r] = k + bin_start[r]
    with np.errstate(all="ignore"):  # a column that would fail is left to the single fit
        return _piecewise_columns_rest(idx, total, nb, bin_start, bin_end, use, bins, out, alpha, tail_v)


def _piecewise_columns_rest(idx: np.ndarray, total: int, nb: np.ndarray, bin_start: np.ndarray,
                            bin_end: np.ndarray, use: list[int], bins: Sequence[FixedBins], out: list[Any],
                            alpha: float, tail_v: float) -> list[Any]:
    """The arithmetic of :func:`piecewise_fit_fixed_columns` once the bin indices are known."""
    c = np.bincount(idx.reshape(-1), minlength=total + 1)[:total].astype(np.float64) + alpha
    widths = np.concatenate([bins[j].pw_widths for j in use])
    add = np.add.reduce  # ndarray.sum() of a 1-D array, without the method's wrapper
    csum = np.array([add(c[bin_start[r]: bin_end[r]]) for r in range(len(use))])
    d = c / np.repeat(csum, nb) / widths
    dw = d * widths
    mass = np.array([float(add(dw[bin_start[r]: bin_end[r]])) for r in range(len(use))])
    bad_d = np.add.reduceat((~np.isfinite(d) | (d < 0)).astype(np.int64), bin_start)
    # ys per column: 0, d / mass, 0 (knot layout: nb + 2 values each), then twice normalised
    nk = nb + 2
    k_end = np.cumsum(nk)
    k_start = k_end - nk
    ys = np.zeros(int(k_end[-1]))
    at = np.repeat(np.arange(len(use)), nb)
    ys[np.arange(total) + 2 * at + 1] = d / np.repeat(mass, nb)
    steps = np.concatenate([bins[j].knot_steps for j in use])
    # each column's knot steps (nk - 1 of them) aligned with its ys; 0 between two columns
    st = np.zeros(ys.size - 1)
    inside = np.ones(ys.size - 1, dtype=bool)
    inside[k_end[:-1] - 1] = False  # between two columns
    st[inside] = steps

    def trapezoids(y: np.ndarray) -> np.ndarray:
        prod = st * (y[1:] + y[:-1]) / 2.0
        return np.array([add(prod[k_start[r]: k_end[r] - 1]) for r in range(len(use))])

    ys = ys / np.repeat(trapezoids(ys), nk)
    area = trapezoids(ys)
    bad_y = np.add.reduceat((ys < 0).astype(np.int64), k_start)
    for r, j in enumerate(use):
        if bad_d[r] or csum[r] <= 0 or not abs(mass[r] - 1) <= 1e-6 or bad_y[r] or not abs(float(area[r]) - 1) <= 1e-6:
            continue  # the single fit decides (it falls back to the generic fit)
        obj = PiecewiseLinear.__new__(PiecewiseLinear)
        obj._p = {"xs": bins[j].knots.copy(), "ys": ys[k_start[r]: k_end[r]] / float(area[r]),
                  "tail": np.array(tail_v)}
        out[j] = obj
    return out
