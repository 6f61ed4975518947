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
leaves a half-written model behind. They carry a checksum: the first 512 bytes are an HDF5 user
block (which HDF5 itself skips) holding ``MPIFC-FC-SHA256`` and the SHA-256 of every byte after
it, so a truncated or altered file is refused when read, naming the file. Files without that
block (written before it existed) are read unchecked.

Leaf models travel between ranks in a compact wire format instead
(:mod:`mpifc.federated.wire_format`); the server writes the received models into the file
verbatim, so the file holds what each client's ``save`` wrote.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from mpifc.atomic import OutputKind, atomic_h5
from mpifc.circuit.io import load_model, save_model
from mpifc.errors import UserError
from mpifc.federated.structure import LEAF, ClientInfo, FederatedCircuit, LeafInfo, Node
from mpifc.federated.wire_format import register_federated_models

FORMAT = "mpifc.federated_circuit"
VERSION = 1
USERBLOCK = 512
SEAL = b"MPIFC-FC-SHA256\n"


def _digest(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of the file's bytes after the user block."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(USERBLOCK)
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _mark(digest: str) -> bytes:
    mark = SEAL + digest.encode() + b"\n"
    return mark + b"\0" * (USERBLOCK - len(mark))


def seal(path: str | os.PathLike) -> None:
    """Write the checksum into the user block of a file created with ``userblock_size=USERBLOCK``
    (also after editing a model file on purpose, e.g. in a test of what a reader does with it)."""
    mark = _mark(_digest(path))
    with open(path, "r+b") as f:
        f.write(mark)


def seal_bytes(data: bytes) -> bytes:
    """:func:`seal` for a whole model file held in memory."""
    return _mark(hashlib.sha256(memoryview(data)[USERBLOCK:]).hexdigest()) + data[USERBLOCK:]


def is_model_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an mpifc model file, judged by its content: a federated circuit (its
    checksum block, or the circuit's format attribute in a file from before the checksum) or a
    FedNGM model (format ``mpifc-ngm/...``). Never raises."""
    try:
        with open(path, "rb") as f:
            head = f.read(USERBLOCK)
        if head.startswith(SEAL):
            return True
        if not head.startswith(b"\x89HDF\r\n\x1a\n"):
            return False
        with h5py.File(path, "r") as f:
            fmt = f["fc"].attrs.get("format") if "fc" in f else f.attrs.get("format")
        return isinstance(fmt, str) and (fmt == FORMAT or fmt.startswith("mpifc-ngm/"))
    except Exception:  # noqa: BLE001 - an unreadable file is simply not a model
        return False


MODEL_OUTPUT = OutputKind("an mpifc model", is_model_file)
"""``--model`` and every other model output: may replace only an earlier model file."""


def check_seal(path: str | os.PathLike) -> None:
    """Refuse a model file whose bytes are not those it was written with (see the module doc).

    Raises:
        UserError: naming the file, if it is shorter than a user block, or its checksum block is
            damaged, or the checksum does not match.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(USERBLOCK)
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise UserError(f"cannot read model file {path}: {e.strerror or e}") from None
    hdf5_at_0 = head[:8] == b"\x89HDF\r\n\x1a\n"
    if hdf5_at_0:
        return  # a file from before the checksum (no user block): read unchecked
    if len(head) < USERBLOCK or size <= USERBLOCK:
        raise UserError(f"model file {path}: truncated ({size} bytes)")
    want = head[len(SEAL): len(SEAL) + 64].decode("ascii", "replace")
    if not head.startswith(SEAL) or head[len(SEAL) + 64:] != b"\n" + b"\0" * (USERBLOCK - len(SEAL) - 65):
        raise UserError(f"model file {path}: not an mpifc model file, or its checksum block is damaged")
    got = _digest(path)
    if want != got:
        raise UserError(f"model file {path}: checksum mismatch (file says {want[:12]}..., content is "
                        f"{got[:12]}...): the file is damaged or was altered")


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
    if len(ranks) != len(ops) or len(ptr) != len(ops) + 1 or int(ptr[-1]) != len(idx) or len(wts) != len(idx):
        raise UserError(f"model file {group.file.filename}: the node arrays do not describe {len(ops)} nodes")
    for i, op in enumerate(ops):
        ch = [int(c) for c in idx[ptr[i]: ptr[i + 1]]]
        if any(not 0 <= c < i for c in ch):
            raise UserError(f"model file {group.file.filename}: node {i} has a child that is not a node before it")
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
    """Write ``fc`` to ``path`` atomically (built in memory, then temp file + rename), with its
    checksum; returns the path. A failed write is a UserError naming ``path``."""
    with atomic_h5(path, finish=seal_bytes, userblock_size=USERBLOCK) as f:
        write_fc(fc, f.create_group("fc"))
        for k, v in (extra_attrs or {}).items():
            f.attrs[k] = v if isinstance(v, (int, float, str)) else json.dumps(v, default=_jsonable)
    return Path(path)


def load_fc(path: str | os.PathLike, load_models: bool | set[int] = True) -> FederatedCircuit:
    """Read a file written by :func:`save_fc`; :class:`UserError` naming the file if it is
    unreadable, damaged (checksum) or malformed, or if a parameter is out of its domain (a sum
    node's weights not a distribution, a variance <= 0, a probability outside [0, 1], ...: each
    model's loader checks its own, naming the parameter)."""
    check_seal(path)
    try:
        with h5py.File(path, "r") as f:
            if "fc" not in f:
                raise UserError(f"{path}: no federated circuit in this file (missing group 'fc')")
            fc = read_fc(f["fc"], load_models)
        fc.validate()  # the structure, ψ and every sum node's weights
        return fc
    except UserError as e:
        text = str(e)
        raise UserError(text if str(path) in text else f"model file {path}: {text}") from None
    except OSError as e:
        raise UserError(f"cannot read model file {path}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a malformed file must not end in a traceback
        raise UserError(f"model file {path}: malformed ({type(e).__name__}: {e})") from None


SOURCES = "sources"
"""Key of ``fc.meta``: ``[[what, absolute path], ...]``, the files the model was trained from
(the shard set and the files it was made from), which no later job may overwrite."""


def model_sources(fc: FederatedCircuit) -> list[tuple[str, Path]]:
    """``(what, path)`` of the files ``fc`` records as its sources (none for older models)."""
    out = []
    for item in fc.meta.get(SOURCES) or []:
        if isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(v, str) for v in item):
            out.append((item[0], Path(item[1])))
    return out


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
