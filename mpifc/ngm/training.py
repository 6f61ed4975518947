"""Training an NGM: graph-constrained fit (eq. 1), optional public-data term (eq. 3).

Loss per mini-batch (mean over rows, sum over features)::

    fit(batch) + public_weight * fit(public batch) + lam * ||(prod_i |W_i|) * S^c||_1

where ``fit`` is the squared error on standardised reals plus the cross-entropy (nats) of the
categoricals. After the last epoch the sampler is calibrated on the training data.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from mpifc.errors import UserError
from mpifc.ngm.graph import DependencyGraph
from mpifc.ngm.inference import InferenceSettings
from mpifc.ngm.model import DTYPE, NGM
from mpifc.ngm.sampling import calibrate_sampler
from mpifc.ngm.schema import Schema


@dataclass(frozen=True)
class TrainConfig:
    """Training settings.

    Attributes:
        epochs: passes over the (primary) training data.
        batch_size: rows per Adam step.
        lr: Adam step size.
        lam: weight of the graph-constrained path norm.
        seed: initialisation and shuffling seed (same seed, same data -> same model).
        public_weight: weight of the public-data fit term (eq. 3), when public data is given.
        inference: input-optimisation settings the sampler is calibrated for (and samples with).
        calib_rows: rows used to calibrate the sampler; 0 skips calibration.
    """

    epochs: int = 50
    batch_size: int = 256
    lr: float = 2e-2
    lam: float = 1.0
    seed: int = 0
    public_weight: float = 1.0
    inference: InferenceSettings = InferenceSettings()
    calib_rows: int = 1000

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise UserError(f"NGM training: {name} must be >= 1, got {getattr(self, name)}")
        for name in ("lr",):
            if not getattr(self, name) > 0:
                raise UserError(f"NGM training: {name} must be > 0, got {getattr(self, name)}")
        for name in ("lam", "public_weight", "calib_rows"):
            if getattr(self, name) < 0:
                raise UserError(f"NGM training: {name} must be >= 0, got {getattr(self, name)}")


def _targets(model: NGM, x: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return model.encode(x), torch.as_tensor(model.standardise(x), dtype=DTYPE)


def train(model: NGM, x: np.ndarray, config: TrainConfig, public: np.ndarray | None = None,
          penalty: Callable[[], torch.Tensor] | None = None, set_statistics: bool = True,
          init_output_bias: bool = True) -> list[float]:
    """Train ``model`` in place on ``x`` ``(n, d)``.

    Args:
        model: an NGM (fresh from :meth:`NGM.create`, or stitched).
        x: training rows in the model's column order, no NaN.
        config: settings.
        public: optional ``(m, d)`` public rows for the extra fit term of eq. 3.
        penalty: the graph penalty; default ``model.path_norm``.
        set_statistics: recompute standardisation and marginals from ``x`` and start the
            categorical output biases at the (centred) log marginals, so that even a model
            trained for a few steps predicts each categorical's frequencies rather than a flat
            softmax (a stitched model keeps the global statistics and weights, so it passes False).
        init_output_bias: with ``set_statistics``, do start the output biases at the log
            marginals (NGR passes False: its revealed-graph threshold was tuned without it).

    Returns:
        Mean training loss per epoch.
    """
    schema = model.schema
    x = schema.validate(x, what="NGM training data")
    if x.shape[0] == 0:
        raise UserError("NGM training data: no rows")
    if public is not None:
        public = schema.validate(public, what="NGM public data")
        if public.shape[0] == 0:
            public = None
    if set_statistics:
        model.set_statistics(x)
        if init_output_bias:
            _init_output_bias(model)
    penalty = penalty or model.path_norm
    u, t = _targets(model, x)
    pub = _targets(model, public) if public is not None else None
    gen = torch.Generator().manual_seed(int(config.seed))
    params = [p for p in model.net.parameters() if p.requires_grad and p.numel() > 0]
    opt = torch.optim.Adam(params, lr=config.lr, foreach=True)
    n, bs = x.shape[0], min(config.batch_size, x.shape[0])
    # Cosine decay to zero: with a constant step, Adam keeps l1-penalised weights jittering
    # around zero instead of settling there, which leaves forbidden paths open.
    total_steps = config.epochs * ((n + bs - 1) // bs)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 0.5 * (1.0 + np.cos(np.pi * min(k, total_steps) / total_steps)))
    history = []
    for _ in range(config.epochs):
        perm = torch.randperm(n, generator=gen)
        pub_perm = torch.randperm(pub[0].shape[0], generator=gen) if pub is not None else None
        total, steps = 0.0, 0
        for s in range(0, n, bs):
            idx = perm[s:s + bs]
            opt.zero_grad()
            loss = model.feature_loss(model.forward(u[idx]), t[idx]).sum(1).mean()
            if pub is not None and config.public_weight > 0:
                m = pub[0].shape[0]
                pidx = pub_perm[torch.arange(s, s + len(idx)) % m]
                loss = loss + config.public_weight * model.feature_loss(model.forward(pub[0][pidx]),
                                                                        pub[1][pidx]).sum(1).mean()
            if config.lam > 0:
                # Ramp lam up over the first half: a full-strength penalty on a random network
                # shuts most units down before the fit has found which paths it needs.
                ramp = min(1.0, (2.0 * sched.last_epoch + 1) / total_steps)
                loss = loss + config.lam * ramp * penalty()
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach())
            steps += 1
        history.append(total / steps)
        if not np.isfinite(history[-1]):
            raise UserError(f"NGM training diverged (loss {history[-1]}); lower lr (now {config.lr}) or lam")
    if config.calib_rows > 0:
        model.calibration = calibrate_sampler(model, x, config.calib_rows, config.inference, seed=config.seed)
    return history


def _init_output_bias(model: NGM) -> None:
    """Categorical output biases := centred log marginals (a plain last layer only)."""
    last = model.net.layers[-1]
    if last.frozen_b.shape[0] != 0:
        return
    with torch.no_grad():
        for j, (f, sl) in enumerate(zip(model.schema.features, model.schema.unit_slices())):
            if f.is_categorical and len(model.marginals[j]) == f.n_categories:
                lp = np.log(np.maximum(model.marginals[j], 1e-3))
                last.b_bottom[sl] = torch.as_tensor(lp - lp.mean(), dtype=DTYPE)


def fit_ngm(x: np.ndarray, schema: Schema, graph: DependencyGraph, hidden: Sequence[int] = (32, 32),
            activation: str = "elu", config: TrainConfig = TrainConfig(),
            public: np.ndarray | None = None) -> NGM:
    """Create and train an NGM on ``x`` ``(n, d)`` under ``graph`` (a client's local model, eq. 1)."""
    model = NGM.create(schema, graph, hidden, activation, seed=config.seed)
    train(model, x, config, public=public)
    return model
