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

Leaf models travel between ranks in a compact wire format instead (:func:`model_to_bytes`): the
model's own ``save`` writes into a dict-backed :class:`WireGroup`, and the blob is an 8-byte
header length, a JSON header and the raw arrays, exactly ``8 + H + Σ nbytes`` bytes (``H`` = the
header's length, a few hundred bytes for a LearnSPN SPN). The server of a training job keeps the
received models as :class:`WireModel` (decoded, not rebuilt) and writes them into the file
verbatim, so the file holds what each client's ``save`` wrote.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from mpifc.circuit.io import load_model
from mpifc.atomic import atomic_path
from mpifc.errors import UserError
from mpifc.federated.structure import LEAF, ClientInfo, FederatedCircuit, LeafInfo, Node

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
            info.model.save(g.create_group("model"))


def read_fc(group: h5py.Group, load_models: bool | set[int] = True) -> FederatedCircuit:
    """Read a circuit written by :func:`write_fc`.

    Args:
        load_models: ``True`` for every leaf model, ``False`` for none, or a set of ranks: load
            only the models of leaves ψ places on those ranks (a client loads just its own).
    """
    _register_federated_models()
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


# -- compact wire format of one leaf model ---------------------------------------------------
WIRE_VERSION = 1
_LEN = 8  # bytes of the little-endian uint64 header length that opens every blob


class _WireFile:
    """What ``group.file`` offers the model loaders (a name for error messages)."""

    def __init__(self, filename: str) -> None:
        self.filename = filename


class WireGroup:
    """A dict-backed stand-in for the part of the ``h5py.Group`` API the model writers and
    loaders use (:func:`mpifc.circuit.io.register_model`): ``attrs`` (set, get, iterate),
    ``create_dataset(name, data=...)``, ``create_group``, ``group[name]`` (``"a/b"`` paths),
    ``name in group``, iteration over member names (sorted, as h5py does), ``name`` and
    ``file.filename``. Datasets are numpy arrays, so ``group[name][()]`` works as in h5py.

    Attribute values are stored as h5py returns them: Python ints/floats/bools as numpy scalars,
    sequences as numpy arrays (string sequences as object arrays of ``str``), strings as ``str``.
    """

    def __init__(self, name: str = "/", filename: str = "<wire>") -> None:
        self.name = name
        self.file = _WireFile(filename)
        self.attrs: dict[str, Any] = _Attrs()
        self._members: dict[str, Any] = {}

    def create_group(self, name: str) -> "WireGroup":
        head, _, rest = name.partition("/")
        if rest:
            sub = self._members.get(head) or self.create_group(head)
            return sub.create_group(rest)
        if name in self._members:
            raise ValueError(f"{self.name}: member {name!r} already exists")
        g = WireGroup(f"{self.name.rstrip('/')}/{name}", self.file.filename)
        self._members[name] = g
        return g

    def create_dataset(self, name: str, shape: Any = None, dtype: Any = None, data: Any = None,
                       **_: Any) -> np.ndarray:
        if data is None:
            arr = np.zeros(shape, dtype=dtype or np.float64)
        else:
            arr = np.array(data, dtype=dtype, copy=True)
        if arr.dtype.kind not in "biufc":
            raise TypeError(f"{self.name}/{name}: wire datasets must be numeric, got dtype {arr.dtype}")
        head, _, rest = name.partition("/")
        if rest:
            sub = self._members.get(head) or self.create_group(head)
            return sub.create_dataset(rest, data=arr)
        if name in self._members:
            raise ValueError(f"{self.name}: member {name!r} already exists")
        self._members[name] = np.ascontiguousarray(arr)
        return self._members[name]

    def __getitem__(self, name: str) -> Any:
        head, _, rest = name.strip("/").partition("/")
        item = self._members[head]
        return item[rest] if rest else item

    def __contains__(self, name: str) -> bool:
        try:
            self[name]
        except (KeyError, TypeError, IndexError):
            return False
        return True

    def __iter__(self) -> Any:
        return iter(sorted(self._members))

    def __len__(self) -> int:
        return len(self._members)

    def keys(self) -> list[str]:
        return sorted(self._members)

    def items(self) -> list[tuple[str, Any]]:
        return [(k, self._members[k]) for k in sorted(self._members)]

    def values(self) -> list[Any]:
        return [self._members[k] for k in sorted(self._members)]

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default


class _Attrs(dict):
    """``attrs`` of a :class:`WireGroup`: values normalised as h5py reads them back."""

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(str(key), _attr_value(value))


def _attr_value(v: Any) -> Any:
    if isinstance(v, (str, np.str_)):
        return str(v)
    if isinstance(v, (bool, np.bool_)):
        return np.bool_(v)
    if isinstance(v, int):
        return np.int64(v)
    if isinstance(v, float):
        return np.float64(v)
    if isinstance(v, np.generic):
        return v
    if isinstance(v, (list, tuple, np.ndarray)):
        a = np.asarray(v)
        if a.dtype.kind in "USO":
            return np.array([str(s) for s in a.reshape(-1)], dtype=object).reshape(a.shape)
        if a.dtype.kind not in "biufc":
            raise TypeError(f"attribute of dtype {a.dtype} cannot go on the wire")
        return a
    raise TypeError(f"attribute value {v!r} ({type(v).__name__}) cannot go on the wire")


def _attr_json(v: Any) -> list[Any]:
    """Tagged JSON of one attribute: ``["s", str]``, ``[dtype, scalar]``, ``["U", shape, strs]``
    or ``["A" + dtype, shape, values]``."""
    if isinstance(v, str):
        return ["s", v]
    if isinstance(v, np.ndarray):
        if v.dtype == object:
            return ["U", list(v.shape), [str(s) for s in v.reshape(-1)]]
        return ["A" + v.dtype.str, list(v.shape), v.reshape(-1).tolist()]
    return [v.dtype.str, v.item()]


def _attr_from_json(t: list[Any]) -> Any:
    tag = t[0]
    if tag == "s":
        return str(t[1])
    if tag == "U":
        return np.array(t[2], dtype=object).reshape(t[1])
    if tag.startswith("A"):
        return np.array(t[2], dtype=np.dtype(tag[1:])).reshape(t[1])
    return np.dtype(tag).type(t[1])


def _tree(g: WireGroup, arrays: list[np.ndarray]) -> list[Any]:
    """Header of group ``g``: ``[attrs, [[name, dtype, shape], ...], {name: subgroup}]``; the
    datasets' bytes are appended to ``arrays`` in the same (depth-first) order."""
    attrs = {k: _attr_json(v) for k, v in g.attrs.items()}
    dsets, groups = [], {}
    for k, v in g._members.items():
        if isinstance(v, WireGroup):
            continue
        dsets.append([k, v.dtype.str, list(v.shape)])
        arrays.append(v)
    for k, v in g._members.items():
        if isinstance(v, WireGroup):
            groups[k] = _tree(v, arrays)
    return [attrs, dsets, groups]


def _untree(t: list[Any], g: WireGroup, buf: memoryview, off: int) -> int:
    attrs, dsets, groups = t
    for k, v in attrs.items():
        dict.__setitem__(g.attrs, k, _attr_from_json(v))
    for name, dt, shape in dsets:
        dtype = np.dtype(dt)
        n = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        if off + n > len(buf):
            raise ValueError(f"dataset {g.name}/{name} runs past the end of the blob")
        g._members[name] = np.frombuffer(buf[off: off + n], dtype=dtype).reshape(shape).copy()
        off += n
    for name, sub in groups.items():
        off = _untree(sub, g.create_group(name), buf, off)
    return off


def _to_h5(src: WireGroup, dst: h5py.Group) -> None:
    """Write a :class:`WireGroup` tree into an h5py group (what ``model.save`` would write)."""
    for k, v in src.attrs.items():
        dst.attrs[k] = [str(s) for s in v.reshape(-1)] if isinstance(v, np.ndarray) and v.dtype == object else v
    for k, v in src._members.items():
        if isinstance(v, WireGroup):
            _to_h5(v, dst.create_group(k))
        else:
            dst.create_dataset(k, data=v)


class WireModel:
    """A leaf model as received, not yet rebuilt: the server of a training job only stores the
    client PCs, so it keeps them in this form (decoding a blob is a JSON parse and one copy per
    array; rebuilding, e.g. compiling an SPN, is left to whoever evaluates the model).

    ``save(group)`` writes exactly what the model's own ``save`` wrote, ``num_parameters()``
    is the sender's count (from the blob header), and any other attribute is looked up on the
    model, which is rebuilt (:func:`mpifc.circuit.io.load_model`) on first use; from then on
    ``save`` and ``num_parameters`` ask the rebuilt model (it may have been changed in place).
    """

    def __init__(self, group: WireGroup, n_parameters: int) -> None:
        self.group = group
        self.n_parameters = int(n_parameters)
        self._model: Any = None

    @property
    def model_type(self) -> str:
        return str(self.group.attrs.get("model_type"))

    def save(self, group: Any) -> None:
        if self._model is not None:  # rebuilt (and maybe changed, e.g. by EM): the model writes
            self._model.save(group)
        elif isinstance(group, WireGroup):
            _copy_wire(self.group, group)
        else:
            _to_h5(self.group, group)

    def num_parameters(self) -> int:
        return int(self._model.num_parameters()) if self._model is not None else self.n_parameters

    def materialize(self) -> Any:
        """The rebuilt model (cached)."""
        if self._model is None:
            _register_federated_models()
            self._model = load_model(self.group)
        return self._model

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("group", "n_parameters", "_model"):
            raise AttributeError(name)
        return getattr(self.materialize(), name)


def _copy_wire(src: WireGroup, dst: WireGroup) -> None:
    for k, v in src.attrs.items():
        dict.__setitem__(dst.attrs, k, v.copy() if isinstance(v, np.ndarray) else v)
    for k, v in src._members.items():
        if isinstance(v, WireGroup):
            _copy_wire(v, dst.create_group(k))
        else:
            dst._members[k] = v.copy()


def model_to_bytes(model: Any) -> np.ndarray:
    """A leaf model as compact wire bytes ``(n_bytes,)`` uint8, written by its own ``save``
    into a :class:`WireGroup` (no pickle, no HDF5 file image).

    Layout: ``H`` as a little-endian uint64 (8 bytes), then ``H`` bytes of UTF-8 JSON (the header:
    format version, the model's parameter count, and the group tree with every attribute and
    every dataset's name, dtype and shape), then every dataset's raw bytes in C order, back to
    back in header order (no padding). So, exactly::

        len(blob) = 8 + H + Σ_datasets nbytes

    i.e. the overhead over the model's raw arrays is ``8 + H`` bytes
    (:func:`wire_overhead`); ``H`` is a few hundred bytes for a LearnSPN SPN (its ~15 dataset
    names, dtypes and shapes, and the list of leaf types).
    """
    root = WireGroup()
    model.save(root)
    if isinstance(model, WireModel):
        n_params = model.n_parameters
    else:
        n_params = int(model.num_parameters()) if hasattr(model, "num_parameters") else -1
    arrays: list[np.ndarray] = []
    tree = _tree(root, arrays)
    header = json.dumps({"v": WIRE_VERSION, "p": n_params, "t": tree}, separators=(",", ":")).encode()
    out = np.empty(_LEN + len(header) + sum(a.nbytes for a in arrays), dtype=np.uint8)
    out[:_LEN] = np.frombuffer(np.uint64(len(header)).astype("<u8").tobytes(), dtype=np.uint8)
    out[_LEN: _LEN + len(header)] = np.frombuffer(header, dtype=np.uint8)
    off = _LEN + len(header)
    for a in arrays:
        out[off: off + a.nbytes] = np.frombuffer(np.ascontiguousarray(a).tobytes(), dtype=np.uint8)
        off += a.nbytes
    return out


def wire_overhead(blob: np.ndarray) -> int:
    """Bytes of ``blob`` that are not model arrays: ``8 + H`` (see :func:`model_to_bytes`)."""
    return _LEN + int(np.frombuffer(np.asarray(blob, dtype=np.uint8)[:_LEN].tobytes(), dtype="<u8")[0])


def model_from_bytes(data: np.ndarray, lazy: bool = False, source: str = "model blob") -> Any:
    """Inverse of :func:`model_to_bytes`.

    Args:
        lazy: return a :class:`WireModel` (arrays decoded, model not rebuilt) instead of the model.
        source: who sent the blob, for the error message.

    Raises:
        UserError: a malformed blob (naming ``source``).
    """
    buf = memoryview(np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)).cast("B")
    try:
        if len(buf) < _LEN:
            raise ValueError(f"{len(buf)} bytes, shorter than the {_LEN}-byte header length")
        h = int(np.frombuffer(buf[:_LEN], dtype="<u8")[0])
        if _LEN + h > len(buf):
            raise ValueError(f"header length {h} exceeds the blob ({len(buf)} bytes)")
        head = json.loads(bytes(buf[_LEN: _LEN + h]).decode())
        if not isinstance(head, dict) or head.get("v") != WIRE_VERSION:
            raise ValueError(f"not a version-{WIRE_VERSION} model blob")
        root = WireGroup(filename=source)
        end = _untree(head["t"], root, buf, _LEN + h)
        if end != len(buf):
            raise ValueError(f"{len(buf) - end} trailing bytes after the last dataset")
    except (ValueError, TypeError, KeyError, IndexError, UnicodeDecodeError) as e:
        raise UserError(f"{source}: malformed model blob ({e})") from None
    wm = WireModel(root, head.get("p", -1))
    return wm if lazy else wm.materialize()


def _register_federated_models() -> None:
    # The leaf types defined in this package register their loaders on import.
    import mpifc.federated.factorized  # noqa: F401
    import mpifc.federated.fcdt  # noqa: F401


def _jsonable(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
