"""ε-differential privacy of what a client sends (``mpifc train --dp-epsilon E``, opt-in).

A client then learns factorized PCs (one leaf per column) from noisy sufficient statistics, and
sends nothing else computed from its rows' values. Per PC (one cell of the client's rows):

* the row count ``N``;
* per real column, the sum and the sum of squares of its values clipped to ``[-B, B]``
  (``--dp-clip B``, default :data:`DEFAULT_CLIP`, in model units: standardised or normal
  scores);
* per discrete or categorical column, the count of every level.

Each gets independent Laplace noise of scale ``b = Δ / ε``. ``Δ`` is the L1 sensitivity of
everything the client releases, for neighbouring data sets that differ by one row added or
removed: the row is in one cell of each of the client's tasks, where it moves ``N`` by 1, a real
column's sum by at most ``B`` and its sum of squares by at most ``B²``, and one level count of a
discrete column by 1, so ``Δ = Σ_tasks (1 + Σ_real (B + B²) + n_discrete)``
(:func:`client_sensitivity`). The Laplace mechanism with that scale is ε-differentially
private; the PC's parameters (means, variances, level probabilities), the noisy count the client
reports in ``fc.train.counts`` and the server's weights computed from those counts are
post-processing, so the whole model is ε-DP for the client's rows.

What keeps it so: cells are row-wise (one PC over all of a subspace's rows, or, under the class
glue, one per class of the row's own label: never k-means, whose clusters depend on other
rows), the learner is ``factorized`` (LearnSPN, RAT-SPN and EiNet choose a structure or run
many passes over the rows), and no per-sample message follows (no ``--refine em``, no
``cooccurrence`` glue). Shared by design and not protected: the schema and the number of
training rows each client declares (the plan and the vertical alignment need them).

Noise comes from the client's own entropy unless ``--dp-seed S`` makes the run reproducible;
then whoever knows ``S`` can take the noise off, so a seed gives no privacy against them.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from mpifc.federated.factorized import FactorizedModel, FactorizedStats, is_real

DEFAULT_CLIP = 4.0
"""``B``: real values are clipped to ``[-B, B]`` (model units) before their sums are taken."""

DP_MIN_VAR = 1e-2
"""Variance floor of a noisy Gaussian leaf (model units, where a column's variance is about 1):
a noisy second moment below the squared mean would otherwise give a spike."""

DP_KEYS = ("dp_epsilon", "dp_clip", "dp_seed")
"""Plan hyperparameters of this mode (``--dp-epsilon``, ``--dp-clip``, ``--dp-seed``)."""


def task_sensitivity(meta_types: Sequence[str], clip: float) -> float:
    """L1 sensitivity of one task's statistics (one cell holds the row): count, a real column's
    sum and sum of squares, a discrete column's level counts."""
    real = sum(1 for m in meta_types if is_real(m))
    return 1.0 + real * (clip + clip * clip) + (len(meta_types) - real)


def client_sensitivity(task_meta_types: Sequence[Sequence[str]], clip: float) -> float:
    """``Δ`` of everything a client releases: the sum over its tasks (module doc)."""
    return float(sum(task_sensitivity(m, clip) for m in task_meta_types))


def noisy_statistics(x: np.ndarray, meta_types: Sequence[str], n_categories: Sequence[int], clip: float,
                     scale: float, rng: np.random.Generator) -> tuple[float, FactorizedStats, FactorizedStats]:
    """``(noisy N, noisy statistics, exact statistics)`` of one cell's rows ``x`` ``(n, d)``
    (no NaN): real columns clipped to ``[-clip, clip]``, Laplace noise of ``scale`` on the count,
    every real sum and sum of squares and every level count (the exact ones for tests)."""
    model = FactorizedModel(meta_types, n_categories)
    xc = np.array(x, dtype=np.float64, copy=True)
    real = model.real
    xc[:, real] = np.clip(xc[:, real], -clip, clip)
    exact = model.em_statistics(xc)
    d = len(meta_types)
    n_noisy = float(xc.shape[0] + rng.laplace(0.0, scale))
    counts = exact.counts.copy()
    for j in np.flatnonzero(~real):
        k = int(model.n_categories[j])
        counts[j, :k] += rng.laplace(0.0, scale, k)
    s1 = np.where(real, exact.s1 + rng.laplace(0.0, scale, d), 0.0)
    s2 = np.where(real, exact.s2 + rng.laplace(0.0, scale, d), 0.0)
    noisy = FactorizedStats(np.full(d, n_noisy), s1, s2, counts)
    return n_noisy, noisy, exact


def model_from_statistics(stats: FactorizedStats, n: float, meta_types: Sequence[str], n_categories: Sequence[int],
                          clip: float, alpha: float = 1.0) -> FactorizedModel:
    """The factorized PC of noisy statistics (post-processing): counts below 0 count 0, the
    count at least 1, means within ``[-clip, clip]``, variances within ``[DP_MIN_VAR, clip²]``."""
    model = FactorizedModel(meta_types, n_categories, alpha=alpha)
    n = max(float(n), 1.0)
    real = model.real
    mean = np.clip(stats.s1 / n, -clip, clip)
    var = np.clip(stats.s2 / n - mean ** 2, DP_MIN_VAR, max(clip * clip, DP_MIN_VAR))
    model.mean = np.where(real, mean, model.mean)
    model.var = np.where(real, var, model.var)
    for j in np.flatnonzero(~real):
        k = int(model.n_categories[j])
        c = np.maximum(stats.counts[j, :k], 0.0) + alpha
        model.log_probs[j, :k] = np.log(c / c.sum())
    return model


def fit_noisy(x: np.ndarray, meta_types: Sequence[str], n_categories: Sequence[int], clip: float, scale: float,
              rng: np.random.Generator, alpha: float = 1.0) -> tuple[FactorizedModel, int]:
    """One cell's PC and the count the client reports for it (the noisy ``N``, rounded, at
    least 1)."""
    n_noisy, noisy, _ = noisy_statistics(x, meta_types, n_categories, clip, scale, rng)
    model = model_from_statistics(noisy, n_noisy, meta_types, n_categories, clip, alpha)
    return model, max(int(round(n_noisy)), 1)


def noise_generator(plan_hp: dict[str, Any], client: int) -> np.random.Generator:
    """The client's noise: its own entropy, or, with ``dp_seed``, a generator derived from it
    and the client index (reproducible)."""
    seed = plan_hp.get("dp_seed")
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng([int(seed), int(client), 0x6470])


def accounting(epsilon: float, clip: float, sensitivities: dict[int, float], seeded: bool) -> dict[str, Any]:
    """What the model's ``meta["privacy"]["dp"]`` says (docs/formats.md)."""
    return {
        "epsilon": float(epsilon), "mechanism": "laplace", "neighbours": "one row of one client added or removed",
        "clip": float(clip),
        "released": "per PC: row count; per real column: sum and sum of squares of clipped values; per discrete "
                    "column: level counts",
        "per_client": {str(c): {"sensitivity_l1": s, "scale": s / float(epsilon)}
                       for c, s in sorted(sensitivities.items())},
        "public": "schema and declared training row counts",
        "noise": "seeded by --dp-seed (reproducible; no privacy against whoever knows the seed)" if seeded
        else "each client's own entropy",
    }


def check_epsilon(value: float) -> float:
    """``--dp-epsilon``: a finite number > 0."""
    v = float(value)
    if not (v > 0 and math.isfinite(v)):
        from mpifc.errors import UserError

        raise UserError(f"--dp-epsilon must be a finite number > 0, got {value}")
    return v
