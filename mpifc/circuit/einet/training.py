"""EM training of an EiNet (full-batch and online), Table 5 presets, bits per dimension.

Online EM (Peharz et al. 2020): statistics of ``online_em_frequency`` mini-batches are summed,
then one M-step moves the parameters ``online_em_stepsize`` of the way to their maximiser.
Full-batch EM is the special case ``batch_size=None, online_em_frequency=1, stepsize=1``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np
import torch

from mpifc.circuit.device import memory_guard
from mpifc.circuit.einet.model import ArrayLike, EiNet, EiNetConfig, EiNetStats
from mpifc.circuit.einet.region_graph import poon_domingos, random_binary_trees
from mpifc.errors import UserError


@dataclass(frozen=True)
class EMSchedule:
    """How EM walks over the data.

    Attributes:
        num_epochs: passes over the data.
        batch_size: rows per E-step; ``None`` = the whole data set (full-batch EM).
        online_em_frequency: mini-batches whose statistics are summed before one M-step.
        online_em_stepsize: M-step step size in (0, 1]; 1 = plain EM on the summed statistics.
        shuffle: reshuffle rows every epoch (``seed`` fixes the order).
        seed: seed of the shuffling.
    """

    num_epochs: int = 1
    batch_size: int | None = None
    online_em_frequency: int = 1
    online_em_stepsize: float = 1.0
    shuffle: bool = True
    seed: int = 0

    def validate(self) -> None:
        if self.num_epochs < 0:
            raise UserError(f"num_epochs: must be >= 0, got {self.num_epochs}")
        if self.batch_size is not None and self.batch_size < 1:
            raise UserError(f"batch_size: must be >= 1 or None, got {self.batch_size}")
        if self.online_em_frequency < 1:
            raise UserError(f"online_em_frequency: must be >= 1, got {self.online_em_frequency}")
        if not 0.0 < self.online_em_stepsize <= 1.0:
            raise UserError(f"online_em_stepsize: must be in (0, 1], got {self.online_em_stepsize}")


@dataclass(frozen=True)
class Preset:
    """Table 5 of the FC paper: EM schedule plus PD structure and leaf settings."""

    schedule: EMSchedule
    pd_num_pieces: tuple[int, ...]
    num_sums: int
    min_var: float = 1e-3
    max_var: float = 0.25
    # Table 5 lists Gaussian leaves; appendix E.2 discretises them to score 8-bit pixels.
    leaf: str = "discretized_gaussian"


PRESETS: dict[str, Preset] = {
    "mnist": Preset(EMSchedule(5, 64, 5, 0.1), (8,), 10),
    "imagenet32": Preset(EMSchedule(10, 64, 10, 0.25), (8,), 40),
    "imagenet": Preset(EMSchedule(10, 64, 50, 0.5), (8,), 40),
    "celeba": Preset(EMSchedule(10, 64, 10, 0.25), (8,), 40),
}


def get_preset(name: str) -> Preset:
    """The Table 5 preset ``name`` (``mnist | imagenet32 | imagenet | celeba``)."""
    if name not in PRESETS:
        raise UserError(f"preset: unknown preset {name!r} (known: {sorted(PRESETS)})")
    return PRESETS[name]


def build_from_preset(name: str, image_shape: Sequence[int], **config_overrides: object) -> tuple[EiNet, EMSchedule]:
    """A PD EiNet and its EM schedule from preset ``name``; ``config_overrides`` go to EiNetConfig."""
    p = get_preset(name)
    config = EiNetConfig(num_sums=p.num_sums, leaf=p.leaf, min_var=p.min_var, max_var=p.max_var)
    config = replace(config, **config_overrides)  # type: ignore[arg-type]
    return EiNet.poon_domingos(image_shape, p.pd_num_pieces, config), p.schedule


def train_em(model: EiNet, x: ArrayLike, schedule: EMSchedule,
             on_epoch: Callable[[int, float], None] | None = None) -> list[float]:
    """Run EM on ``x (n, n_vars)``; returns the mean train log-likelihood (nats) of each epoch.

    The epoch's figure is the average over its mini-batches of the likelihood *before* each
    batch's update (free from the E-step), as online EM reports it.
    """
    schedule.validate()
    xt = x if isinstance(x, torch.Tensor) else torch.as_tensor(x, device="cpu")  # rows go to the device per batch
    n = xt.shape[0]
    if n == 0:
        raise UserError("x: no training rows")
    batch = n if schedule.batch_size is None else schedule.batch_size
    rng = np.random.default_rng(schedule.seed)
    history: list[float] = []
    for epoch in range(schedule.num_epochs):
        order = rng.permutation(n) if schedule.shuffle and batch < n else np.arange(n)
        pending: EiNetStats | None = None
        pending_batches = 0
        ll_sum = 0.0
        for start in range(0, n, batch):
            stats = model.em_statistics(xt[order[start:start + batch]])
            ll_sum += float(stats.tensors["ll"])
            pending = stats if pending is None else pending + stats
            pending_batches += 1
            if pending_batches == schedule.online_em_frequency:
                model.apply_em(pending, schedule.online_em_stepsize)
                pending, pending_batches = None, 0
        if pending is not None:
            model.apply_em(pending, schedule.online_em_stepsize)
        history.append(ll_sum / n)
        if on_epoch is not None:
            on_epoch(epoch, history[-1])
    return history


def bits_per_dim(mean_ll: float, num_dims: int) -> float:
    """``-LL / (D ln 2)``: mean log-likelihood in nats per sample -> bits per dimension."""
    return -mean_ll / (num_dims * math.log(2.0))


def evaluate(model: EiNet, x: ArrayLike) -> dict[str, float]:
    """Mean test log-likelihood (nats per sample) and bits per dimension of ``x``."""
    ll = model.log_likelihood(x)
    mean = float(ll.mean())
    return {"mean_ll": mean, "bpd": bits_per_dim(mean, len(model.scope))}


def _levels(column: np.ndarray, j: int, declared: int | None) -> int:
    """Levels of discrete column ``j``: the declared count (> 0) or the largest value + 1."""
    obs = column[~np.isnan(column)]
    if obs.size and (np.any(obs != np.round(obs)) or obs.min() < 0):
        raise UserError(f"x: discrete column {j} needs non-negative integer values (category codes), "
                        f"got {obs[(obs != np.round(obs)) | (obs < 0)][0]!r}")
    top = int(obs.max()) + 1 if obs.size else 2
    declared = int(declared or 0)
    if declared and top > declared:
        raise UserError(f"x: discrete column {j} has value {top - 1} but {declared} declared categories")
    return max(declared or top, 2)


def fit_einet(x: ArrayLike, meta_types: Sequence[str], seed: int = 0, *, num_sums: int = 10,
              depth: int = 3, repetitions: int = 5, leaf: str | None = None, num_levels: int = 256,
              image_shape: Sequence[int] | None = None, pd_num_pieces: int | Sequence[int] = (4,),
              epochs: int = 5, batch_size: int | None = 256, online_em_frequency: int = 1,
              online_em_stepsize: float = 0.5, dtype: str = "float64",
              max_params: int | None = 100_000_000, leaf_region_vars: int | None = None,
              n_categories: Sequence[int] | None = None, min_var: float = 1e-3,
              max_var: float | None = None, var_min_var: Sequence[float] | None = None,
              device: str = "cpu") -> EiNet:
    """Fit an EiNet client PC on ``x (n, d)`` by EM: the learner behind ``--learner einet``.

    ``image_shape`` selects a Poon-Domingos region graph with ``pd_num_pieces`` pieces per axis
    over the first ``prod(image_shape)`` columns (images; any further columns, e.g. a shard's
    label, form one leaf region joined to the image at the root); otherwise random binary trees
    of ``depth`` (clamped to ``log2 d``) and ``repetitions`` (tabular data or any subspace).
    ``leaf_region_vars`` (random trees only) sizes the tree by its scope instead of ``depth``:
    ``depth = round(log2(d / leaf_region_vars))`` (at least 1), so leaf regions hold about
    ``leaf_region_vars`` variables whatever ``d``: EiNets over a client's part of the variables
    are then as much smaller than one over all of them as their scope is (same leaf-region size,
    fewer partitions), not as large.
    ``leaf`` defaults to Gaussian for real features and Bernoulli/Categorical for discrete ones;
    on a mix of the two, to ``mixed``: a Gaussian per real variable and a categorical per discrete
    one, whose levels are ``n_categories[j]`` when given (> 0), else its largest value + 1.
    ``batch_size`` 0 or ``None`` is full-batch EM (one M-step per epoch over all rows).
    ``min_var``/``max_var`` clamp Gaussian variances; on tabular data a real column's floor is
    raised to the one its ties set (:func:`~mpifc.circuit.leaves.tie_variance_floors`) and to
    ``var_min_var`` (per column, e.g. the floors of all of a client's rows).
    ``max_var`` ``None``: 0.25 on images (Table 5 of the FC paper, pixels scaled to [0, 1]); on
    tabular data (no ``image_shape``) the largest
    training variance of a real column, at least 0.25, so that one component can cover a whole
    standardised column (breast cancer, one client of three: test LL -31.9 with 0.25, -29.1 with
    1.0, -31.7 with 4.0 nats).
    ``device`` (``cpu``, ``cuda``, ``cuda:N``): where the model is built and trained; the same
    seed gives the same initial parameters on every device (they are drawn on the CPU). A
    device running out of memory raises :class:`~mpifc.errors.DeviceOutOfMemory` naming the
    model's size.
    """
    xt = np.asarray(x, dtype=np.float64)
    d = xt.shape[1]
    var_levels: tuple[int, ...] = ()
    if leaf is None:
        real = [m == "real" for m in meta_types]
        if len(real) != d:
            raise UserError(f"meta_types: has {len(real)} entries, x has {d} columns")
        declared = list(n_categories) if n_categories is not None else [0] * d
        if any(real) and not all(real):
            leaf = "mixed"
            var_levels = tuple(0 if r else _levels(xt[:, j], j, declared[j]) for j, r in enumerate(real))
        elif all(real):
            leaf = "gaussian"
        else:
            # One level count for every variable: the widest declared or seen.
            levels = max([2] + [_levels(xt[:, j], j, declared[j]) for j in range(d)])
            leaf = "bernoulli" if levels <= 2 else "categorical"
            num_levels = max(levels, 2)
    if max_var is None:
        max_var = 0.25
        real_cols = [j for j, m in enumerate(meta_types) if m == "real"] if leaf in ("gaussian", "mixed") else []
        # Columns with at least two observed values (an all-NaN column has no variance).
        real_cols = [j for j in real_cols if int(np.sum(~np.isnan(xt[:, j]))) > 1]
        if image_shape is None and real_cols:
            max_var = max(0.25, float(np.nanvar(xt[:, real_cols], axis=0).max()))
        max_var = max(max_var, float(min_var))
    floors: tuple[float, ...] = ()
    if image_shape is None and leaf in ("gaussian", "mixed"):
        from mpifc.circuit.leaves import tie_variance_floors

        own = tie_variance_floors(xt, [m == "real" for m in meta_types])
        if var_min_var is not None:
            own = np.maximum(own, np.asarray(var_min_var, dtype=np.float64))
        floors = tuple(float(v) for v in own) if np.any(own > 0) else ()
    config = EiNetConfig(num_sums=num_sums, leaf=leaf, num_levels=num_levels, seed=seed,
                         dtype=dtype, max_params=max_params, var_levels=var_levels,
                         min_var=float(min_var), max_var=float(max_var), var_min_var=floors,
                         device=str(device))
    if image_shape is not None:
        pieces = (int(pd_num_pieces),) if np.isscalar(pd_num_pieces) else tuple(pd_num_pieces)
        graph = poon_domingos(image_shape, pieces, extra_vars=d - int(np.prod(image_shape)))
    else:
        if leaf_region_vars is not None:
            if int(leaf_region_vars) < 1:
                raise UserError(f"leaf_region_vars: must be >= 1, got {leaf_region_vars}")
            depth = int(round(np.log2(max(d, 1) / int(leaf_region_vars))))
        depth = max(1, min(int(depth), int(np.floor(np.log2(max(d, 2))))))
        graph = random_binary_trees(d, depth, repetitions, seed=seed)
    schedule = EMSchedule(num_epochs=epochs, batch_size=batch_size or None,
                          online_em_frequency=online_em_frequency,
                          online_em_stepsize=online_em_stepsize, seed=seed)
    with memory_guard(config.device, "building an EiNet", lambda: None):
        model = EiNet(graph, config, _initialize=False)  # the size is checked before any parameter exists
    with memory_guard(config.device, "initialising an EiNet", model.num_parameters):
        model._initialize(config.seed)
    train_em(model, xt, schedule)  # E- and M-steps name the model's size themselves
    return model
