"""Einsum and mixing layers: structure (index tensors) only; weights are passed in.

Keeping the weights outside lets the same layer run the forward pass, the autograd E-step (on
detached copies that require grad) and the top-down backtracking without copying parameters.

Shapes (batch last, so that gathering regions copies contiguous ``K x batch`` blocks and the
einsum is one ``bmm`` without transposes): ``values`` is ``(N, K, batch)``: log-densities (nats)
of the ``N`` regions computed so far, ``K`` densities each. A layer of ``P`` partitions returns
``(P, K_out, batch)``; its mixing layer combines the partitions of each of its ``R`` regions into
``(R, K_out, batch)``. The backtracking helpers take batch-first views ``(batch, N, K)``.
"""
from __future__ import annotations

import torch


def _shift(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Detached max along ``dim`` (kept), with non-finite maxima replaced by 0.

    Detaching is exact: the shift cancels in ``log(sum(exp(t - m))) + m``, so its gradient is 0.
    """
    m = t.detach().amax(dim, keepdim=True)
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


class EinsumLayer:
    """``out[b,p,k] = log sum_ij W[p,k,i,j] exp(left[b,p,i]) exp(right[b,p,j])``, batched.

    Evaluated as log-einsum-exp: subtract the per-child max, exponentiate, contract the outer
    product with ``W`` in one batched matmul, take the log and add the maxima back.
    """

    def __init__(self, left: torch.Tensor, right: torch.Tensor, k_in: int, k_out: int) -> None:
        self.left, self.right = left, right  # (P,) positions into ``values``
        self.k_in, self.k_out = k_in, k_out

    @property
    def num_partitions(self) -> int:
        return int(self.left.numel())

    def forward(self, values: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``values (N, K_in, batch)``, ``weight (P, K_out, K_in, K_in)`` -> ``(P, K_out, batch)``."""
        left, right = values[self.left], values[self.right]  # (P, K_in, batch)
        ml, mr = _shift(left, 1), _shift(right, 1)
        el, er = torch.exp(left - ml), torch.exp(right - mr)
        parts, k, batch = el.shape
        outer = (el.unsqueeze(2) * er.unsqueeze(1)).reshape(parts, k * k, batch)
        prod = torch.bmm(weight.reshape(parts, self.k_out, k * k), outer)
        # Clamping only matters when every weight of the max entries is exactly 0.
        return torch.log(prod.clamp_min(torch.finfo(prod.dtype).tiny)) + ml + mr

    def choice_logits(self, values: torch.Tensor, weight: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Log posterior (unnormalised) of child pairs given parent component ``k (batch, P)``.

        ``values`` is batch-first ``(batch, N, K_in)``. Returns ``(batch, P, K_in * K_in)``, index ``i * K_in + j``.
        """
        left, right = values[:, self.left], values[:, self.right]  # batch-first (batch, P, K_in)
        batch, parts, kin = left.shape
        w = weight[torch.arange(parts, device=k.device).unsqueeze(0), k]  # (batch, P, K_in, K_in)
        logits = torch.log(w) + left.unsqueeze(-1) + right.unsqueeze(-2)
        return logits.reshape(batch, parts, kin * kin)


class MixingLayer:
    """``out[b,r,k] = log sum_p V[r,k,p] exp(part[b, idx[r,p], k])`` over a region's partitions.

    Regions with fewer partitions than the widest one are padded with their first partition and a
    weight of exactly 0 (``mask`` False), so padding never changes a value.
    """

    def __init__(self, idx: torch.Tensor, mask: torch.Tensor) -> None:
        self.idx, self.mask = idx, mask  # (R, maxP)
        self.trivial = idx.shape[1] == 1 and bool(
            (idx[:, 0] == torch.arange(idx.shape[0], device=idx.device)).all())

    def forward(self, parts: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        """``parts (P, K_out, batch)``, ``weight (R, K_out, maxP)`` -> ``(R, K_out, batch)``."""
        if self.trivial:
            return parts
        g = parts[self.idx]  # (R, maxP, K_out, batch)
        m = _shift(g, 1)
        s = (torch.exp(g - m) * weight.transpose(1, 2).unsqueeze(-1)).sum(1)
        return torch.log(s.clamp_min(torch.finfo(s.dtype).tiny)) + m.squeeze(1)

    def choice_logits(self, parts: torch.Tensor, weight: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Log posterior (unnormalised) of each region's partitions given ``k (batch, R)``.

        ``parts`` is batch-first ``(batch, P, K_out)``. Returns ``(batch, R, maxP)``; padded slots are -inf.
        """
        g = parts[:, self.idx]  # (batch, R, maxP, K_out)
        g = g.gather(3, k[:, :, None, None].expand(-1, -1, g.shape[2], 1)).squeeze(3)
        regions = torch.arange(self.idx.shape[0], device=k.device).unsqueeze(0)
        w = weight[regions, k]  # (batch, R, maxP)
        return torch.log(w) + g
