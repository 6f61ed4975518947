"""HDF5 file format of a federated circuit (structure, ψ, ω, weights and every leaf model).

Layout (no pickle)::

    /            attrs: format="mpifc.federated_circuit", version=1, root, and JSON strings
                        features, meta_types, n_categories, clients, target, setting, meta
    /nodes/op        (n_nodes,) str      ω per node
    /nodes/rank      (n_nodes,) int64    ψ per node
    /nodes/child_ptr (n_nodes+1,) int64  CSR offsets into child_idx / weights
    /nodes/child_idx (n_edges,) int64
    /nodes/weights   (n_edges,) float64  sum weights (0 for other edges)
    /leaves/<id>     attrs client, cluster, n_rows, learner, subspace, features (JSON); the leaf
                     model written by its own ``save`` under ``model`` (absent if not known here)

Files are written atomically (temp file in the target folder, then rename), so a failed job never
leaves a half-written model behind.

Leaf models travel between ranks in a compact wire format instead
(:mod:`mpifc.federated.wire_format`); the server writes the received models into the file
verbatim, so the file holds what each client's ``save`` wrote.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from mpifc.atomic import atomic_path
from mpifc.circuit.io import load_model, save_model
from mpifc.errors import UserError
from mpifc.federated.structure import LEAF, ClientInfo, FederatedCircuit, LeafInfo, Node
from mpifc.federated.wire_format import register_federated_models

FORMAT = "mpifc.federated_circuit"
VERSION = 1


def write_fc(fc: FederatedCircuit, group: h5py.Group, with_models: bool = True) -> None:
    """Write ``fc`` into an open HDF5 group."""
    group.attrs["format"] = FORMAT
    group.attrs["version"] = VERSION
    group.attrs["root"] = fc.root
    group.attrs["features"] = json.dumps(list(fc.features))
    group.attrs["meta_types"] = json.dumps(fc.meta_types)
    group.attrs["n_categories"] = json.dumps(fc.n_categories)
    group.attrs["clients"] = json.dumps([[c.index, c.rank, list(c.features)] for c in fc.clients.values()])
    group.attrs["target"] = json.dumps(fc.target)
    group.attrs["setting"] = fc.setting
    group.attrs["meta"] = json.dumps(fc.meta, default=_jsonable)
    nodes = group.create_group("nodes")
    nodes.create_dataset("op", data=np.array([n.op for n in fc.nodes], dtype=h5py.string_dtype()))
    nodes.create_dataset("rank", data=np.array([n.rank for n in fc.nodes], dtype=np.int64))
    ptr = np.cumsum([0] + [len(n.children) for n in fc.nodes]).astype(np.int64)
    nodes.create_dataset("child_ptr", data=ptr)
    nodes.create_dataset("child_idx", data=np.array([c for n in fc.nodes for c in n.children], dtype=np.int64))
    w = [float(n.weights[i]) if len(n.weights) else 0.0 for n in fc.nodes for i in range(len(n.children))]
    nodes.create_dataset("weights", data=np.array(w, dtype=np.float64))
    leaves = group.create_group("leaves")
    for n in fc.leaves:
        g = leaves.create_group(str(n.id))
        info = n.leaf
        g.attrs["client"] = info.client
        g.attrs["cluster"] = info.cluster
        g.attrs["n_rows"] = info.n_rows
        g.attrs["learner"] = info.learner
        g.attrs["subspace"] = info.subspace
        g.attrs["features"] = json.dumps(list(info.features))
        if with_models and info.model is not None:
            save_model(info.model, g.create_group("model"))


def read_fc(group: h5py.Group, load_models: bool | set[int] = True) -> FederatedCircuit:
    """Read a circuit written by :func:`write_fc`.

    Args:
        load_models: ``True`` for every leaf model, ``False`` for none, or a set of ranks: load
            only the models of leaves ψ places on those ranks (a client loads just its own).
    """
    register_federated_models()
    if group.attrs.get("format") != FORMAT:
        raise UserError(f"{group.file.filename}: not a federated circuit file (format "
                        f"{group.attrs.get('format')!r})")
    clients = [ClientInfo(int(i), int(r), tuple(f)) for i, r, f in json.loads(group.attrs["clients"])]
    fc = FederatedCircuit(json.loads(group.attrs["features"]), json.loads(group.attrs["meta_types"]),
                          {k: int(v) for k, v in json.loads(group.attrs["n_categories"]).items()},
                          clients, target=json.loads(group.attrs["target"]), setting=str(group.attrs["setting"]))
    fc.meta = json.loads(group.attrs["meta"])
    nodes = group["nodes"]
    ops = [o.decode() if isinstance(o, bytes) else str(o) for o in nodes["op"][()]]
    ranks = nodes["rank"][()]
    ptr = nodes["child_ptr"][()]
    idx = nodes["child_idx"][()]
    wts = nodes["weights"][()]
    for i, op in enumerate(ops):
        ch = [int(c) for c in idx[ptr[i]: ptr[i + 1]]]
        if op == LEAF:
            g = group["leaves"][str(i)]
            feats = tuple(json.loads(g.attrs["features"]))
            model = None
            want = load_models if isinstance(load_models, bool) else int(ranks[i]) in load_models
            if want and "model" in g:
                model = load_model(g["model"])
            info = LeafInfo(int(g.attrs["client"]), feats, int(g.attrs["cluster"]), int(g.attrs["n_rows"]),
                            str(g.attrs["learner"]), int(g.attrs["subspace"]), model)
            fc.nodes.append(Node(i, LEAF, frozenset(feats), rank=int(ranks[i]), leaf=info))
        else:
            scope = frozenset().union(*(fc.nodes[c].scope for c in ch))
            w = wts[ptr[i]: ptr[i + 1]].astype(np.float64) if op == "sum" else np.zeros(0)
            fc.nodes.append(Node(i, op, scope, ch, w, rank=int(ranks[i])))
    fc.root = int(group.attrs["root"])
    return fc


def save_fc(fc: FederatedCircuit, path: str | os.PathLike, extra_attrs: dict[str, Any] | None = None) -> Path:
    """Write ``fc`` to ``path`` atomically (temp file + rename); returns the path."""
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        write_fc(fc, f.create_group("fc"))
        for k, v in (extra_attrs or {}).items():
            f.attrs[k] = v if isinstance(v, (int, float, str)) else json.dumps(v, default=_jsonable)
    return Path(path)


def load_fc(path: str | os.PathLike, load_models: bool | set[int] = True) -> FederatedCircuit:
    """Read a file written by :func:`save_fc`; :class:`UserError` naming the file if unreadable."""
    try:
        with h5py.File(path, "r") as f:
            if "fc" not in f:
                raise UserError(f"{path}: no federated circuit in this file (missing group 'fc')")
            return read_fc(f["fc"], load_models)
    except OSError as e:
        raise UserError(f"cannot read model file {path}: {e}") from None


def fc_to_bytes(fc: FederatedCircuit, with_models: bool = False) -> np.ndarray:
    """The circuit's structure, ψ and weights (and the leaf models with ``with_models``) as HDF5
    bytes ``(n_bytes,)`` uint8."""
    import io

    buf = io.BytesIO()
    with h5py.File(buf, "w") as f:
        write_fc(fc, f.create_group("fc"), with_models=with_models)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8).copy()


def fc_from_bytes(data: np.ndarray, load_models: bool = False) -> FederatedCircuit:
    """Inverse of :func:`fc_to_bytes` (leaves come back without models unless ``load_models``)."""
    import io

    with h5py.File(io.BytesIO(np.asarray(data, dtype=np.uint8).tobytes()), "r") as f:
        return read_fc(f["fc"], load_models=load_models)


def _jsonable(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
