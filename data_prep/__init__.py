"""data_prep: datasets into per-client HDF5 shards (``python -m data_prep``).

Modules, in the order data flows through them:

* ``datasets``: the registry of loaders (``tabular``, ``images``, ``usercsv``; they use
  ``files`` and ``textparse``), each giving a :class:`table.RawTable`;
* ``preprocess``: target encoding, imputation, standardization, fitted on train rows only;
* ``partition`` (+ ``segments``): pure functions giving each client its rows and features;
* ``prepare``: the pipeline, ``prepare(...) -> PreparedData``;
* ``shards``: the on-disk format ``mpifc-shards/1``, its writer and its reader;
* the command line (``python -m data_prep``) lives in :mod:`mpifc.cli.prep`.
"""
from .prepare import PrepConfig, PreparedData, prepare, prepare_table
from .shards import (ClientShard, Manifest, TestSet, load_manifest, read_client, read_test,
                     write_shards)

__all__ = ["ClientShard", "Manifest", "PrepConfig", "PreparedData", "TestSet", "load_manifest",
           "prepare", "prepare_table", "read_client", "read_test", "write_shards"]
