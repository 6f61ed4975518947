"""data_prep: datasets into per-client HDF5 shards (``python -m data_prep``).

Modules, in the order data flows through them:

* ``datasets``: the registry of loaders (``tabular``, ``images``, ``usercsv``; they use
  ``files`` and ``textparse``), each giving a :class:`table.RawTable`;
* ``preprocess``: target encoding, imputation, standardization, fitted on train rows only;
* ``partition`` (+ ``segments``): pure functions giving each client its rows and features;
* ``prepare``: the pipeline, ``prepare(...) -> PreparedData``;
* ``shards``: the on-disk format ``mpifc-shards/1``, its writer and its reader;
* the command line (``python -m data_prep``) lives in :mod:`mpifc.cli.prep`.

The names below load on first use: a training rank reads its shard with ``data_prep.shards``
alone and never pays for the loaders and the pipeline.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any

_HOME = {"PrepConfig": "prepare", "PreparedData": "prepare", "prepare_table": "prepare",
         "ClientShard": "shards", "Manifest": "shards", "TestSet": "shards", "load_manifest": "shards",
         "read_client": "shards", "read_test": "shards", "write_shards": "shards"}

__all__ = ["ClientShard", "Manifest", "PrepConfig", "PreparedData", "TestSet", "load_manifest",
           "prepare", "prepare_table", "read_client", "read_test", "write_shards"]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """``data_prep.prepare`` is the pipeline function, also once its submodule of the same name
    is imported (the import system then binds the submodule here, which this ignores)."""

    @property
    def prepare(self) -> Any:
        return importlib.import_module(f"{__name__}.prepare").prepare

    @prepare.setter
    def prepare(self, value: Any) -> None:
        pass


sys.modules[__name__].__class__ = _Package
