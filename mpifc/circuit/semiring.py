"""The two semirings of the compiled evaluator, in log space.

Both share "times" (addition of log-values); they differ in "plus" over a sum node's weighted
children, computed as a segment reduction over a flat edge list (no padding):

* :data:`SUM_PRODUCT`: ``log sum_e exp(v_e)`` -> likelihoods and marginals.
* :data:`MAX_PRODUCT`: ``max_e v_e`` -> MPE (Viterbi) values, with the arg-max edge kept for
  backtracking.

Marginalised leaves are 0 under sum-product (they integrate to 1) but ``max_x log p(x)`` under
max-product; the evaluator asks the semiring which to use.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def segment_max(vals: torch.Tensor, seg: torch.Tensor, n_seg: int) -> torch.Tensor:
    """Per-segment max: ``vals`` ``(batch, E)``, ``seg`` ``(E,)`` in ``[0, n_seg)`` -> ``(batch, n_seg)``."""
    out = torch.full((vals.shape[0], n_seg), -torch.inf, dtype=vals.dtype)
    return out.scatter_reduce(1, seg.expand(vals.shape[0], -1), vals, reduce="amax", include_self=True)


def segment_logsumexp(vals: torch.Tensor, seg: torch.Tensor, n_seg: int) -> torch.Tensor:
    """Per-segment ``logsumexp``, same shapes as :func:`segment_max`; stable (max-shifted)."""
    m = segment_max(vals, seg, n_seg)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    s = torch.zeros_like(m).index_add_(1, seg, torch.exp(vals - m[:, seg]))
    return torch.log(s) + m


def segment_argmax(vals: torch.Tensor, seg: torch.Tensor, n_seg: int, best: torch.Tensor) -> torch.Tensor:
    """Index (into the edge list) of the first edge attaining ``best`` per segment, ``(batch, n_seg)``."""
    E = vals.shape[1]
    pos = torch.arange(E).expand(vals.shape[0], -1)
    cand = torch.where(vals >= best[:, seg], pos, torch.full_like(pos, E))
    out = torch.full((vals.shape[0], n_seg), E, dtype=torch.int64)
    return out.scatter_reduce(1, seg.expand(vals.shape[0], -1), cand, reduce="amin", include_self=True)


def segment_max_rows(vals: torch.Tensor, seg: torch.Tensor, n_seg: int) -> torch.Tensor:
    """:func:`segment_max` with node-major layout: ``vals`` ``(E, batch)`` -> ``(n_seg, batch)``."""
    out = torch.full((n_seg, vals.shape[1]), -torch.inf, dtype=vals.dtype)
    return out.scatter_reduce(0, seg[:, None].expand(-1, vals.shape[1]), vals, reduce="amax", include_self=True)


def segment_logsumexp_rows(vals: torch.Tensor, seg: torch.Tensor, n_seg: int) -> torch.Tensor:
    """:func:`segment_logsumexp` with node-major layout (same operations, so the same values)."""
    m = segment_max_rows(vals, seg, n_seg)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    s = torch.zeros_like(m).index_add_(0, seg, torch.exp(vals - m[seg]))
    return torch.log(s) + m


@dataclass(frozen=True)
class Semiring:
    """A log-space semiring: its name and whether "plus" is a max (MPE) or a logsumexp."""

    name: str
    is_max: bool

    def plus(self, vals: torch.Tensor, seg: torch.Tensor, n_seg: int) -> torch.Tensor:
        """Reduce weighted child log-values ``(batch, E)`` per parent segment -> ``(batch, n_seg)``."""
        if self.is_max:
            return segment_max(vals, seg, n_seg)
        return segment_logsumexp(vals, seg, n_seg)

    def plus_rows(self, vals: torch.Tensor, seg: torch.Tensor, n_seg: int, pairs: bool = False) -> torch.Tensor:
        """:meth:`plus` with node-major layout: ``(E, batch)`` -> ``(n_seg, batch)``.

        ``pairs``: the edges are consecutive pairs, ``seg == [0, 0, 1, 1, ...]`` (sums of two
        children, as LearnSPN's two-cluster splits make). The pair is then reduced in place of
        the scatter, with the same values (a sum of two terms does not depend on their order).
        """
        if pairs:
            v = vals.view(n_seg, 2, vals.shape[1])
            m = torch.maximum(v[:, 0], v[:, 1])
            if self.is_max:
                return m
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            return torch.log(torch.exp(v[:, 0] - m) + torch.exp(v[:, 1] - m)) + m
        if self.is_max:
            return segment_max_rows(vals, seg, n_seg)
        return segment_logsumexp_rows(vals, seg, n_seg)


SUM_PRODUCT = Semiring("sum-product", is_max=False)
MAX_PRODUCT = Semiring("max-product", is_max=True)
