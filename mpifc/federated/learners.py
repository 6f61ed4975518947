"""Learner registry: the client-side algorithms that fit one leaf PC of a federated circuit.

A learner is ``fit(x, meta_types, seed, n_categories=..., **hp) -> DensityModel`` with ``x`` of
shape ``(n, d)`` float64 (no NaN) over the leaf's features. Circuit modules are imported lazily,
so a learner whose module is missing fails with a :class:`UserError` naming it only when used.
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


def fit_leaf(name: str, x: np.ndarray, meta_types: Sequence[str], seed: int,
             n_categories: Sequence[int] | None = None, **hp: Any) -> Any:
    """Fit one leaf PC with learner ``name`` (see module doc for the contract)."""
    return get_learner(name)(np.asarray(x, dtype=np.float64), list(meta_types), int(seed),
                             n_categories=n_categories, **hp)


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
    from mpifc.federated.factorized import FactorizedModel

    return FactorizedModel.fit(x, meta_types, n_categories, alpha=alpha)


def _fit_learnspn(x: np.ndarray, meta_types: list[str], seed: int,
                  n_categories: Sequence[int] | None = None, **hp: Any) -> Any:
    mod = _import("mpifc.circuit.learnspn", "learnspn")
    meta = [m if m in ("real", "discrete", "categorical") else "discrete" for m in meta_types]
    return mod.learn_spn(x, meta, seed=seed, **_accepted(mod.learn_spn, hp))


def _fit_ratspn(x: np.ndarray, meta_types: list[str], seed: int, n_categories: Sequence[int] | None = None,
                depth: int = 2, repetitions: int = 2, num_sums: int = 4, num_leaves: int = 4,
                em_iters: int = 30, min_var: float | None = None, **_: Any) -> Any:
    """A RAT-SPN fitted by batch EM (``em_iters`` full-batch steps from its seeded init);
    ``min_var``: the Gaussian leaves' variance floor (RatSPN's default when None)."""
    mod = _import("mpifc.circuit.ratspn", "ratspn")
    d = x.shape[1]
    if d < 2:
        raise UserError(f"learner 'ratspn' needs at least 2 features per leaf PC, got {d}; "
                        f"use --client-learner to give this client another learner")
    real = [m == "real" for m in meta_types]
    if any(real) and not all(real):
        raise UserError("learner 'ratspn' needs one leaf type: all real or all binary features, got "
                        f"{sorted(set(meta_types))}")
    if all(real):
        leaf = "gaussian"
    elif all(int(k or 2) <= 2 for k in (n_categories or [2] * d)):
        leaf = "bernoulli"
    else:
        raise UserError("learner 'ratspn' supports real or binary features here, not categorical ones")
    depth = max(1, min(int(depth), int(np.log2(d))))
    kw = {"min_var": float(min_var)} if min_var is not None and leaf == "gaussian" else None
    model = mod.RatSPN(d, depth=depth, repetitions=repetitions, num_sums=num_sums, num_leaves=num_leaves,
                       leaf=leaf, leaf_kwargs=kw, seed=seed)
    for _ in range(int(em_iters)):
        model.apply_em(model.em_statistics(x))
    return model


def _fit_einet(x: np.ndarray, meta_types: list[str], seed: int,
               n_categories: Sequence[int] | None = None, **hp: Any) -> Any:
    """An EiNet fitted by EM; a one-feature subspace (no partition to make) gets a univariate
    factorised leaf instead, since an EiNet needs at least two variables."""
    if x.shape[1] < 2:
        return _fit_factorized(x, meta_types, seed, n_categories)
    mod = _import("mpifc.circuit.einet", "einet")
    return mod.fit_einet(x, meta_types, seed=seed, n_categories=n_categories, **_accepted(mod.fit_einet, hp))


def _fit_dt(x: np.ndarray, meta_types: list[str], seed: int,
            n_categories: Sequence[int] | None = None, **hp: Any) -> Any:
    from mpifc.federated.fcdt import fit_tree_learner

    return fit_tree_learner(x, meta_types, seed, n_categories=n_categories, **hp)


register_learner("factorized", _fit_factorized)
register_learner("learnspn", _fit_learnspn)
register_learner("ratspn", _fit_ratspn)
register_learner("einet", _fit_einet)
register_learner("dt", _fit_dt)
