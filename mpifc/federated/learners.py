"""Learner registry: the client-side algorithms that fit one leaf PC of a federated circuit.

A learner is ``fit(x, meta_types, seed, n_categories=..., var_min_var=..., **hp) -> DensityModel``
with ``x`` of shape ``(n, d)`` float64 (no NaN) over the leaf's features; ``var_min_var`` ``(d,)``
(optional) raises the variance floor of the Gaussian leaves per column (the floors its repeated
values set on all of the client's rows; the learner raises them further to its own rows'). Circuit modules are imported lazily,
so a learner whose module is missing fails with a :class:`UserError` naming it only when used.

A learner that computes on torch takes ``device`` (``"cpu"``, ``"cuda:N"``: the rank's device,
:func:`takes_device`); :func:`fit_leaf` hands it on only to those. LearnSPN, FC[DT]'s trees
(CART) and the factorised leaves compute on the CPU with numpy and never see it.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, Sequence

import numpy as np

from mpifc.errors import UserError

Learner = Callable[..., Any]
_REGISTRY: dict[str, Learner] = {}


def register_learner(name: str, fit: Learner) -> None:
    """Register ``fit`` under ``name`` (re-registering replaces it)."""
    _REGISTRY[name] = fit


def learner_names() -> list[str]:
    return sorted(_REGISTRY)


def get_learner(name: str) -> Learner:
    """The learner called ``name``; :class:`UserError` listing the known ones otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UserError(f"unknown learner {name!r}; known: {', '.join(learner_names())}") from None


def takes_device(name: str) -> bool:
    """Whether learner ``name`` computes on torch: its fit takes a ``device`` argument."""
    fn = _REGISTRY.get(name)
    return fn is not None and "device" in inspect.signature(fn).parameters


def fit_leaf(name: str, x: np.ndarray, meta_types: Sequence[str], seed: int,
             n_categories: Sequence[int] | None = None, var_min_var: Sequence[float] | None = None,
             device: str | None = None, **hp: Any) -> Any:
    """Fit one leaf PC with learner ``name`` (see module doc for the contract); ``device`` goes
    to learners that compute on torch (:func:`takes_device`), None leaving them on the CPU."""
    extra = {"device": device} if device is not None and takes_device(name) else {}
    return get_learner(name)(np.asarray(x, dtype=np.float64), list(meta_types), int(seed),
                             n_categories=n_categories, var_min_var=var_min_var, **extra, **hp)


def _import(module: str, learner: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise UserError(f"learner {learner!r} needs {module}, which cannot be imported: {e}") from None


def _accepted(fn: Callable[..., Any], hp: dict[str, Any]) -> dict[str, Any]:
    # Per-client configs may carry hyperparameters of other learners; pass on only what fits.
    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return dict(hp)
    return {k: v for k, v in hp.items() if k in params}


def _fit_factorized(x: np.ndarray, meta_types: list[str], seed: int,
                    n_categories: Sequence[int] | None = None, alpha: float = 1.0, **_: Any) -> Any:
    # one Gaussian per column over all the PC's rows: its variance is the column's own, no floor
    from mpifc.federated.factorized import FactorizedModel

    return FactorizedModel.fit(x, meta_types, n_categories, alpha=alpha)


def _fit_learnspn(x: np.ndarray, meta_types: list[str], seed: int,
                  n_categories: Sequence[int] | None = None, var_min_var: Sequence[float] | None = None,
                  **hp: Any) -> Any:
    mod = _import("mpifc.circuit.learnspn", "learnspn")
    meta = [m if m in ("real", "discrete", "categorical") else "discrete" for m in meta_types]
    return mod.learn_spn(x, meta, seed=seed, n_categories=n_categories, var_min_var=var_min_var,
                         **_accepted(mod.learn_spn, hp))


def _fit_ratspn(x: np.ndarray, meta_types: list[str], seed: int, n_categories: Sequence[int] | None = None,
                depth: int = 2, repetitions: int = 2, num_sums: int = 4, num_leaves: int = 4,
                em_iters: int = 30, min_var: float | None = None, var_min_var: Sequence[float] | None = None,
                device: str = "cpu", **_: Any) -> Any:
    """A RAT-SPN fitted by batch EM (``em_iters`` full-batch steps from its seeded init);
    ``min_var``: the Gaussian leaves' variance floor (RatSPN's default when None).

    Leaves follow the columns' meta-types, as LearnSPN's and EiNet's do: Gaussians for real
    columns, Bernoulli leaves for binary ones, and on any other mix (discrete levels, categorical
    codes, real columns beside them) a categorical per discrete column with its declared number
    of levels (else its largest value + 1) and a Gaussian per real one. A Gaussian's variance
    floor is raised to its column's tie floor (:func:`~mpifc.circuit.leaves.tie_variance_floors`)."""
    mod = _import("mpifc.circuit.ratspn", "ratspn")
    d = x.shape[1]
    if d < 2:
        raise UserError(f"learner 'ratspn' needs at least 2 features per leaf PC, got {d}; "
                        f"use --client-learner to give this client another learner")
    real = [m == "real" for m in meta_types]
    declared = [int(k or 0) for k in (n_categories or [0] * d)]
    levels = [0 if r else max(declared[j], int(np.nanmax(x[:, j])) + 1 if np.isfinite(x[:, j]).any() else 0, 2)
              for j, r in enumerate(real)]
    if all(real):
        leaf = "gaussian"
    elif all(k <= 2 for k, r in zip(levels, real) if not r) and not any(real):
        leaf = "bernoulli"
    else:
        leaf = "mixed"
    bad = [j for j, r in enumerate(real) if not r and np.any((x[:, j] < 0) | (x[:, j] != np.round(x[:, j])))]
    if bad:
        raise UserError(f"learner 'ratspn': column {bad[0]} is {meta_types[bad[0]]} but holds values that are "
                        "not integers >= 0")
    depth = max(1, min(int(depth), int(np.log2(d))))
    kw: dict[str, Any] = {}
    if min_var is not None and leaf in ("gaussian", "mixed"):
        kw["min_var"] = float(min_var)
    if leaf == "mixed":
        kw["var_levels"] = tuple(levels)
    from mpifc.circuit.leaves import tie_variance_floors

    floors = None
    if leaf in ("gaussian", "mixed"):
        floors = tie_variance_floors(x, real)
        if var_min_var is not None:
            floors = np.maximum(floors, np.asarray(var_min_var, dtype=np.float64))
    model = mod.RatSPN(d, depth=depth, repetitions=repetitions, num_sums=num_sums, num_leaves=num_leaves,
                       leaf=leaf, leaf_kwargs=kw or None, seed=seed, var_min_var=floors, device=device)
    for _ in range(int(em_iters)):
        model.apply_em(model.em_statistics(x))
    return model


def _fit_einet(x: np.ndarray, meta_types: list[str], seed: int,
               n_categories: Sequence[int] | None = None, var_min_var: Sequence[float] | None = None,
               device: str = "cpu", **hp: Any) -> Any:
    """An EiNet fitted by EM on ``device``; a one-feature subspace (no partition to make) gets a
    univariate factorised leaf instead, since an EiNet needs at least two variables."""
    if x.shape[1] < 2:
        return _fit_factorized(x, meta_types, seed, n_categories)
    mod = _import("mpifc.circuit.einet", "einet")
    return mod.fit_einet(x, meta_types, seed=seed, n_categories=n_categories, var_min_var=var_min_var,
                         device=device, **_accepted(mod.fit_einet, hp))


def _fit_dt(x: np.ndarray, meta_types: list[str], seed: int,
            n_categories: Sequence[int] | None = None, **hp: Any) -> Any:
    from mpifc.federated.fcdt import fit_tree_learner

    return fit_tree_learner(x, meta_types, seed, n_categories=n_categories, **hp)


register_learner("factorized", _fit_factorized)
register_learner("learnspn", _fit_learnspn)
register_learner("ratspn", _fit_ratspn)
register_learner("einet", _fit_einet)
register_learner("dt", _fit_dt)
