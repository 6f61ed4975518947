"""Sampling from an NGM in an order that follows its graph.

Features are visited in breadth-first order over the dependency graph (component by component).
The first feature of each component has no sampled neighbour; the graph says it is independent of
everything sampled so far, so it is drawn from its stored marginal. Every later feature is drawn
from the NGM's conditional given the features sampled so far (the rest unknown, inferred by input
optimisation): categoricals from the softmax, reals as the predicted mean plus Gaussian noise.

Calibration (our addition to the paper's recipe, fitted on the client's own data at the end of
training): conditioning on a *subset* of the features, the input-optimisation mean is a biased
regressor and the full-conditional residual understates the spread. For each real feature we fit,
in the sampling order, ``x ~ a + b * prediction`` and the residual std, which makes the sampled
marginal variances match the data's instead of shrinking along the order.
"""
from __future__ import annotations

import numpy as np
import torch

from mpifc.errors import UserError
from mpifc.ngm.inference import InferenceSettings, infer_outputs
from mpifc.ngm.model import NGM, QUANTILE_LEVELS, SamplerCalibration


def _roots(model: NGM, order: list[int]) -> np.ndarray:
    """``(d,)`` bool: features with no graph neighbour earlier in ``order``."""
    adj = model.graph.adjacency
    is_root = np.zeros(len(order), dtype=bool)
    for p, j in enumerate(order):
        is_root[j] = not adj[j, order[:p]].any()
    return is_root


def calibrate_sampler(model: NGM, x: np.ndarray, max_rows: int = 1000,
                      settings: InferenceSettings = InferenceSettings(), seed: int = 0,
                      start: int | None = None) -> SamplerCalibration:
    """Fit the sampling order, the per-feature affine correction and residual stds on ``x``.

    One batched inference: row block ``p`` holds the calibration rows with every feature from
    position ``p`` of the order on set unknown.

    Args:
        model: a trained NGM.
        x: ``(n, d)`` the client's training data.
        max_rows: rows used (a seeded random subset when ``n`` is larger).
        settings: inference settings; stored with the calibration and used by :func:`sample`.
        seed: subset choice.
        start: first node of the BFS order (default: the node of largest degree).
    """
    d = model.schema.n_features
    order = model.graph.bfs_order(start)
    rng = np.random.default_rng(seed)
    rows = x if x.shape[0] <= max_rows else x[rng.choice(x.shape[0], max_rows, replace=False)]
    is_root = _roots(model, order)
    affine = np.tile([0.0, 1.0], (d, 1))
    resid = np.zeros(d)
    targets = [(p, j) for p, j in enumerate(order) if not is_root[j] and not model.schema.features[j].is_categorical]
    if targets:
        blocks = []
        for p, _ in targets:
            ev = rows.copy()
            ev[:, order[p:]] = np.nan
            blocks.append(ev)
        out = infer_outputs(model, np.concatenate(blocks), settings).numpy().astype(np.float64)
        slices = model.schema.unit_slices()
        m = rows.shape[0]
        for b, (_, j) in enumerate(targets):
            pred = out[b * m:(b + 1) * m, slices[j].start]
            y = (rows[:, j] - model.mean[j]) / model.std[j]
            design = np.stack([np.ones(m), pred], axis=1)
            coef, *_ = np.linalg.lstsq(design, y, rcond=None)
            affine[j] = coef
            resid[j] = float(np.std(y - design @ coef))
    for j, f in enumerate(model.schema.features):
        if is_root[j] and not f.is_categorical:
            resid[j] = 1.0  # unused: roots come from the marginal quantiles
    return SamplerCalibration(order, affine, resid, settings.steps, settings.lr, settings.consistency)


def _from_quantiles(q: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draw from interior quantiles ``q`` at :data:`QUANTILE_LEVELS` for uniforms ``u``."""
    levels = QUANTILE_LEVELS
    # Stretch the interior levels to [0, 1] so the ends of the range are reached.
    return np.interp(levels[0] + u * (levels[-1] - levels[0]), levels, q)


def sample(model: NGM, n: int, rng: np.random.Generator, settings: InferenceSettings | None = None) -> np.ndarray:
    """Draw ``n`` rows ``(n, d)`` from the NGM in graph order (see the module docstring).

    Args:
        model: a trained NGM (its calibration is used when present).
        n: number of samples.
        rng: the only source of randomness.
        settings: inference settings for each conditional; default: those of the calibration.
    """
    if n < 0:
        raise UserError(f"sampling: n must be >= 0, got {n}")
    schema = model.schema
    d = schema.n_features
    cal = model.calibration
    if cal is None:
        cal = SamplerCalibration(model.graph.bfs_order(), np.tile([0.0, 1.0], (d, 1)), np.ones(d))
    if settings is None:
        settings = InferenceSettings(cal.infer_steps, cal.infer_lr, cal.infer_consistency)
    order = cal.order
    is_root = _roots(model, order)
    x = np.full((n, d), np.nan)
    slices = schema.unit_slices()
    for j in order:
        f = schema.features[j]
        if is_root[j]:
            if f.is_categorical:
                x[:, j] = rng.choice(f.n_categories, size=n, p=model.marginals[j])
            else:
                x[:, j] = _from_quantiles(model.marginals[j], rng.random(n))
            continue
        out = infer_outputs(model, x, settings)[:, slices[j]]
        if f.is_categorical:
            p = torch.softmax(out, dim=1).numpy().astype(np.float64)
            cum = np.cumsum(p, axis=1)
            u = rng.random(n)[:, None] * cum[:, -1:]
            x[:, j] = np.minimum((u > cum).sum(axis=1), f.n_categories - 1)
        else:
            a, b = cal.affine[j]
            z = a + b * out[:, 0].numpy().astype(np.float64) + cal.resid_std[j] * rng.standard_normal(n)
            x[:, j] = model.mean[j] + model.std[j] * z
    return x
