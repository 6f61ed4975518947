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

Each categorical gets the same treatment: a temperature ``t`` and per-class biases ``c`` with
``p ~ softmax(t * logits + c)``, fitted by (lightly ridge-penalised) maximum likelihood on the
same partial-evidence conditionals. Without it an under-trained client NGM, whose softmax heads
are still nearly flat (but rank correctly), samples categoricals close to uniform and almost
independent of the evidence: a binary target then carries no dependence in the master's samples
and the global NGM fitted to them predicts it with an arbitrary sign (AUC far below 0.5 was seen).
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
    logit_bias = np.zeros(model.schema.n_units)
    targets = [(p, j) for p, j in enumerate(order) if not is_root[j]]
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
            if model.schema.features[j].is_categorical:
                sl = slices[j]
                affine[j, 1], logit_bias[sl] = fit_temperature(out[b * m:(b + 1) * m, sl], rows[:, j])
                continue
            pred = out[b * m:(b + 1) * m, slices[j].start]
            y = (rows[:, j] - model.mean[j]) / model.std[j]
            design = np.stack([np.ones(m), pred], axis=1)
            coef, *_ = np.linalg.lstsq(design, y, rcond=None)
            affine[j] = coef
            resid[j] = float(np.std(y - design @ coef))
    for j, f in enumerate(model.schema.features):
        if is_root[j] and not f.is_categorical:
            resid[j] = 1.0  # unused: roots come from the marginal quantiles
    return SamplerCalibration(order, affine, resid, settings.steps, settings.lr, settings.consistency, logit_bias)


def fit_temperature(logits: np.ndarray, y: np.ndarray, ridge: float = 1.0,
                    iters: int = 50) -> tuple[float, np.ndarray]:
    """``(t, c)`` maximising the likelihood of labels ``y`` under ``softmax(t * logits + c)``.

    Args:
        logits: ``(m, k)`` a categorical's logits for ``m`` rows.
        y: ``(m,)`` its observed codes.
        ridge: a ``N(0, 1 / ridge)`` prior on each bias ``c``; keeps a class absent from the
            rows at a finite (low) probability instead of exactly zero.
        iters: L-BFGS iterations.

    Returns:
        The temperature (any sign: fitted on the client's own data, a negative value would undo
        a head that ranks backwards) and the ``(k,)`` biases.
    """
    z = torch.as_tensor(np.asarray(logits, dtype=np.float64))
    z = z - z.mean(dim=1, keepdim=True)
    lab = torch.as_tensor(np.asarray(y).astype(np.int64))
    m, k = z.shape
    t = torch.ones((), dtype=torch.float64, requires_grad=True)
    c = torch.zeros(k, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([t, c], max_iter=iters, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(t * z + c, lab, reduction="sum") + 0.5 * ridge * (c ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    tv, cv = float(t.detach()), c.detach().numpy().copy()
    if not (np.isfinite(tv) and np.isfinite(cv).all()):
        return 1.0, np.zeros(k)
    # The centring is a per-row constant: softmax(t * (l - mean l) + c) == softmax(t * l + c).
    return tv, cv


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
            logits = cal.affine[j, 1] * out.numpy().astype(np.float64)
            if cal.logit_bias is not None:
                logits = logits + cal.logit_bias[slices[j]]
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            cum = np.cumsum(p, axis=1)
            u = rng.random(n)[:, None] * cum[:, -1:]
            x[:, j] = np.minimum((u > cum).sum(axis=1), f.n_categories - 1)
        else:
            a, b = cal.affine[j]
            z = a + b * out[:, 0].numpy().astype(np.float64) + cal.resid_std[j] * rng.standard_normal(n)
            x[:, j] = model.mean[j] + model.std[j] * z
    return x
