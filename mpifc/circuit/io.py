"""HDF5 persistence registry for density models (structure and parameters, never pickle).

Every model class writes ``group.attrs["model_type"]`` in its ``save`` and registers a loader
here with :func:`register_model`; :func:`load_model` dispatches on that attribute.

A model may carry a record of how it was fitted (``model.fit_record``, a JSON-ready dict, e.g.
its hyperparameters): :func:`save_model` writes it as the group's ``fit_record`` attribute (JSON)
and :func:`load_model` puts it back, so it travels with the model (over the wire too).
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable

import h5py

from mpifc.atomic import atomic_h5

_LOADERS: dict[str, Callable[[h5py.Group], Any]] = {}


def register_model(model_type: str, loader: Callable[[h5py.Group], Any]) -> None:
    """Register ``loader(group) -> model`` for ``group.attrs["model_type"] == model_type``."""
    _LOADERS[model_type] = loader


FIT_RECORD = "fit_record"
"""Attribute of a model (dict) and of its saved group (JSON): how it was fitted."""


def fit_record(model: Any) -> dict[str, Any] | None:
    """How ``model`` records having been fitted, or None. Read from the instance's own
    attributes, so a lazily rebuilt model is not rebuilt to answer."""
    return getattr(model, "__dict__", {}).get(FIT_RECORD)


def save_model(model: Any, group: Any) -> None:
    """``model.save(group)``, plus its :func:`fit_record` as a JSON attribute."""
    model.save(group)
    hp = fit_record(model)
    if hp is not None:
        group.attrs[FIT_RECORD] = json.dumps(hp, default=lambda v: v.item(), sort_keys=True, separators=(",", ":"))


def load_model(group: h5py.Group) -> Any:
    """Rebuild the model stored in ``group`` by its ``model_type`` attribute (and its
    :func:`fit_record`, where the group has one)."""
    model = _load(group)
    raw = group.attrs.get(FIT_RECORD)
    if raw is not None:
        try:
            setattr(model, FIT_RECORD, json.loads(raw))
        except AttributeError:
            pass  # a model class without instance attributes keeps the record in the file only
    return model


def model_class(model_type: str) -> type | None:
    """The class whose loader is registered for ``model_type`` (a loader that is a classmethod
    tells it), or None: what a model can do, asked without rebuilding it."""
    if model_type not in _LOADERS:
        _import_builtin_models(model_type)
    owner = getattr(_LOADERS.get(model_type), "__self__", None)
    return owner if isinstance(owner, type) else None


def _load(group: h5py.Group) -> Any:
    kind = group.attrs.get("model_type")
    if isinstance(kind, bytes):
        kind = kind.decode()
    if kind not in _LOADERS:
        _import_builtin_models(kind)
    if kind not in _LOADERS:
        raise ValueError(
            f"{group.file.filename}:{group.name}: unknown model_type {kind!r} "
            f"(known: {sorted(_LOADERS)})"
        )
    return _LOADERS[kind](group)


_BUILTIN_MODULES = {"spn": "mpifc.circuit.spn", "ratspn": "mpifc.circuit.ratspn", "einet": "mpifc.circuit.einet"}
"""The module whose import registers each built-in model type's loader."""


def _import_builtin_models(kind: Any = None) -> None:
    # Importing the model modules registers their loaders; done lazily to keep imports light:
    # only the module of ``kind`` when it is a built-in type (ratspn and einet import torch,
    # which an SPN does not need), else every one of them.
    import importlib

    mods = [_BUILTIN_MODULES[kind]] if kind in _BUILTIN_MODULES else list(_BUILTIN_MODULES.values())
    for mod in mods:
        try:
            importlib.import_module(mod)
        except ImportError:
            pass


def save_model_file(model: Any, path: str | os.PathLike, group: str = "model") -> None:
    """Save ``model`` to a new HDF5 file atomically (built in memory, then a temp file in the
    same folder and a rename; a failed write is a UserError naming ``path``)."""
    with atomic_h5(path) as f:
        save_model(model, f.create_group(group))


def load_model_file(path: str | os.PathLike, group: str = "model") -> Any:
    with h5py.File(path, "r") as f:
        return load_model(f[group])
