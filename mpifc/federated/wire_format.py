"""The compact wire format in which one leaf model travels between ranks.

:func:`model_to_bytes` lets the model's own ``save`` write into a dict-backed :class:`WireGroup`;
the blob is the magic ``FCW`` and a version byte, the header length (a varint), a binary
self-describing header (a few dozen bytes for a LearnSPN SPN: names come from a static table or
back-references) and the raw arrays. :func:`model_from_bytes` reads it back. The server of a
training job keeps the received models as :class:`WireModel` (decoded, not rebuilt) and writes
them into the model file verbatim (:mod:`mpifc.federated.serialize`), so the file holds what
each client's ``save`` wrote.
"""
from __future__ import annotations

from typing import Any

import h5py
import numpy as np

from mpifc.circuit.io import load_model, model_class, save_model
from mpifc.errors import UserError

_MAGIC = b"FCW"  # opens every blob, followed by one byte: the wire version
WIRE_VERSION = 2  # 1 (JSON header behind a uint64 length) was never written to disk: not read
# dtype codes of the header (1 + index; 0 marks a subgroup, 255 a dtype spelled out as a string)
_DTYPES = ("|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8", "<c8", "<c16")
_GROUP, _DTYPE_STR = 0, 255
_STR, _SCALAR, _ARRAY, _STR_ARRAY, _INT64 = range(5)  # attribute tags (_INT64: zigzag varint)
_MAX_NDIM = 32
# Strings every header may refer to by index without spelling them out: the names the library's
# own model writers use most (model types, the SPN layouts, leaf types and their parameters,
# FactorizedModel, the FC-DT tree). Any other string is spelled out on first use, so a writer
# that changes or adds names still round-trips, with a longer header. The table is part of wire
# version 2: changing it makes a new version (bump WIRE_VERSION).
_STATIC_STRINGS = (
    "model_type", "dtype", "float64", "float32", "layout", "scope",
    "spn", "factorized", "fcdt_tree", "ratspn", "einet",
    "kind", "n_children", "child_ptr", "child_idx", "weights", "sum_weights", "leaf_var", "leaf_type",
    "leaf_types", "scope_ptr", "scope_vars", "leaves",
    "gaussian", "bernoulli", "categorical", "histogram", "piecewise_linear", "discretized_gaussian",
    "mean", "var", "min_var", "max_var", "p", "alpha", "probs", "probs.len", "breaks", "breaks.len",
    "densities", "densities.len", "discrete", "tail", "xs", "xs.len", "ys", "ys.len", "levels", "bin_width",
    "meta_types", "n_categories", "log_probs",
    "d", "target_index", "left", "right", "feature", "threshold",
)

_STATIC_INDEX = {t: i for i, t in enumerate(_STATIC_STRINGS)}


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


class _HeaderWriter:
    """Binary header of wire version 2 (see :func:`model_to_bytes`)."""

    def __init__(self) -> None:
        self.out = bytearray()
        self._strings: dict[str, int] = dict(_STATIC_INDEX)

    def uint(self, n: int) -> None:
        """Unsigned LEB128: 7 bits a byte, high bit set on all but the last."""
        if n < 0:
            raise ValueError(f"negative length {n}")
        while n > 0x7F:
            self.out.append((n & 0x7F) | 0x80)
            n >>= 7
        self.out.append(n)

    def string(self, s: str) -> None:
        """A string in the table (the static strings, then those spelled out so far):
        ``2·index + 1``; any other: ``2·len`` and its UTF-8 bytes, and it joins the table."""
        i = self._strings.get(s)
        if i is not None:
            self.uint(2 * i + 1)
            return
        self._strings[s] = len(self._strings)
        raw = s.encode()
        self.uint(2 * len(raw))
        self.out += raw

    def dtype(self, dt: np.dtype) -> None:
        if dt.str in _DTYPES:
            self.out.append(_DTYPES.index(dt.str) + 1)
        else:
            self.out.append(_DTYPE_STR)
            self.string(dt.str)

    def shape(self, shape: tuple[int, ...]) -> None:
        self.uint(len(shape))
        for d in shape:
            self.uint(int(d))

    def attr(self, v: Any) -> None:
        if isinstance(v, str):
            self.out.append(_STR)
            self.string(v)
        elif isinstance(v, np.ndarray) and v.dtype == object:
            self.out.append(_STR_ARRAY)
            self.shape(v.shape)
            for s in v.reshape(-1):
                self.string(str(s))
        elif isinstance(v, np.ndarray):
            self.out.append(_ARRAY)
            self.dtype(v.dtype)
            self.shape(v.shape)
            self.out += np.ascontiguousarray(v).tobytes()
        elif v.dtype == np.int64:  # the common integer attribute: a zigzag varint, not 8 bytes
            self.out.append(_INT64)
            n = int(v)
            self.uint(2 * n if n >= 0 else -2 * n - 1)
        else:
            self.out.append(_SCALAR)
            self.dtype(v.dtype)
            self.out += v.tobytes()

    def group(self, g: WireGroup, arrays: list[np.ndarray]) -> None:
        """Attributes, then members in insertion order (a subgroup recursively, a dataset as
        dtype and shape, its bytes appended to ``arrays``: the blob's data section, in order)."""
        self.uint(len(g.attrs))
        for k, v in g.attrs.items():
            self.string(k)
            self.attr(v)
        self.uint(len(g._members))
        for k, v in g._members.items():
            self.string(k)
            if isinstance(v, WireGroup):
                self.out.append(_GROUP)
                self.group(v, arrays)
            else:
                self.dtype(v.dtype)
                self.shape(v.shape)
                arrays.append(v)


class _HeaderReader:
    """Inverse of :class:`_HeaderWriter` over ``buf[pos:end]``; datasets are cut from the data
    section starting at ``data`` (ValueError/IndexError on anything malformed)."""

    def __init__(self, buf: memoryview, pos: int, end: int) -> None:
        self.buf, self.pos, self.end, self.data = buf, pos, end, end
        self._strings: list[str] = list(_STATIC_STRINGS)

    def take(self, n: int) -> memoryview:
        if self.pos + n > self.end:
            raise ValueError("header ends early")
        out = self.buf[self.pos: self.pos + n]
        self.pos += n
        return out

    def byte(self) -> int:
        if self.pos >= self.end:
            raise ValueError("header ends early")
        self.pos += 1
        return self.buf[self.pos - 1]

    def uint(self) -> int:
        buf, pos, end = self.buf, self.pos, self.end
        n = shift = 0
        while True:
            if pos >= end:
                raise ValueError("header ends early")
            b = buf[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                self.pos = pos
                return n
            shift += 7
            if shift > 63:
                raise ValueError("integer longer than 64 bits in the header")

    def string(self) -> str:
        v = self.uint()
        if v & 1:
            return self._strings[v >> 1]
        s = bytes(self.take(v >> 1)).decode()
        self._strings.append(s)
        return s

    def dtype(self, code: int) -> np.dtype:
        if 1 <= code <= len(_DTYPES):
            return np.dtype(_DTYPES[code - 1])
        if code == _DTYPE_STR:
            dt = np.dtype(self.string())
            if dt.kind in "biufc":
                return dt
        raise ValueError(f"unknown dtype code {code}")

    def shape(self) -> tuple[int, ...]:
        nd = self.uint()
        if nd > _MAX_NDIM:
            raise ValueError(f"{nd} dimensions")
        return tuple(self.uint() for _ in range(nd))

    def attr(self) -> Any:
        tag = self.byte()
        if tag == _STR:
            return self.string()
        if tag == _SCALAR:
            dt = self.dtype(self.byte())
            return np.frombuffer(self.take(dt.itemsize), dtype=dt)[0]
        if tag == _ARRAY:
            dt = self.dtype(self.byte())
            shape = self.shape()
            return np.frombuffer(self.take(dt.itemsize * _size(shape)), dtype=dt).reshape(shape).copy()
        if tag == _INT64:
            z = self.uint()
            return np.int64(z >> 1 if not z & 1 else -(z >> 1) - 1)
        if tag == _STR_ARRAY:
            shape = self.shape()
            n = _size(shape)
            if n > self.end - self.pos:  # every string takes at least one byte
                raise ValueError("string array longer than the header")
            return np.array([self.string() for _ in range(n)], dtype=object).reshape(shape)
        raise ValueError(f"unknown attribute tag {tag}")

    def group(self, g: WireGroup) -> None:
        for _ in range(self.uint()):
            k = self.string()
            dict.__setitem__(g.attrs, k, self.attr())
        for _ in range(self.uint()):
            name, code = self.string(), self.byte()
            if code == _GROUP:
                self.group(g.create_group(name))
                continue
            dt = self.dtype(code)
            shape = self.shape()
            n = dt.itemsize * _size(shape)
            if self.data + n > len(self.buf):
                raise ValueError(f"dataset {g.name}/{name} runs past the end of the blob")
            g._members[name] = np.frombuffer(self.buf[self.data: self.data + n], dtype=dt).reshape(shape).copy()
            self.data += n


def _size(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


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
    client PCs, so it keeps them in this form (decoding a blob is a header parse and one copy per
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

    def model_class(self) -> type | None:
        """The received model's class (None if its loader does not name it), without rebuilding."""
        return model_class(self.model_type)

    def save(self, group: Any) -> None:
        if self._model is not None:  # rebuilt (and maybe changed, e.g. by EM): the model writes
            save_model(self._model, group)
        elif isinstance(group, WireGroup):
            _copy_wire(self.group, group)
        else:
            _to_h5(self.group, group)

    def num_parameters(self) -> int:
        return int(self._model.num_parameters()) if self._model is not None else self.n_parameters

    def materialize(self) -> Any:
        """The rebuilt model (cached)."""
        if self._model is None:
            register_federated_models()
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


_RELEASE_GUARD: list[Any] = []


def set_release_guard(guard: Any | None) -> None:
    """Install (or, with None, remove) this process's release guard: an object whose
    ``apply(group)`` adjusts a model's written arrays before :func:`model_to_bytes` encodes
    them. A client rank installs a :class:`mpifc.circuit.privacy.MomentGuard` of its own rare
    values for as long as it sends models, so every PC it sends, after EM too, goes through it."""
    _RELEASE_GUARD.clear()
    if guard is not None:
        _RELEASE_GUARD.append(guard)


def release_guard() -> Any | None:
    """This process's release guard (:func:`set_release_guard`), None when none is installed."""
    return _RELEASE_GUARD[0] if _RELEASE_GUARD else None


def model_to_bytes(model: Any) -> np.ndarray:
    """A leaf model as compact wire bytes ``(n_bytes,)`` uint8, written by its own ``save``
    into a :class:`WireGroup` (no pickle, no HDF5 file image).

    Layout (wire version 2): ``b"FCW"``, the version byte, ``H`` as an unsigned LEB128 varint,
    ``H`` bytes of binary header, then every dataset's raw bytes in C order, back to back in
    header order (no padding). So, exactly::

        len(blob) = 4 + len(varint H) + H + Σ_datasets nbytes

    and the overhead over the model's raw arrays is the first three terms (:func:`wire_overhead`).
    The header is self-describing: the sender's parameter count (varint, +1 so that "unknown",
    -1, is 0), then the group tree depth first: per group its attributes (name, tag, value:
    string, typed scalar, typed array with its bytes, or string array) and its members in
    insertion order (name, then a subgroup or a dataset's dtype code and shape). Integers are
    varints, dtypes one byte (the common little-endian ones; others spelled out), and a string
    is spelled out only once: a repeat, or one of the names of the library's model writers
    listed in the format (``_STATIC_STRINGS``), is a varint index. ``H`` is a few dozen bytes
    for a LearnSPN SPN, whose names are all listed (the JSON header of version 1 was ~560).

    With a release guard installed (:func:`set_release_guard`) the written arrays go through it
    before they are encoded.
    """
    root = WireGroup()
    save_model(model, root)
    if _RELEASE_GUARD and not isinstance(model, WireModel):
        _RELEASE_GUARD[0].apply(root)
    if isinstance(model, WireModel):
        n_params = model.n_parameters
    else:
        n_params = int(model.num_parameters()) if hasattr(model, "num_parameters") else -1
    w = _HeaderWriter()
    w.uint(max(n_params, -1) + 1)
    arrays: list[np.ndarray] = []
    w.group(root, arrays)
    size = _HeaderWriter()
    size.uint(len(w.out))
    head = _MAGIC + bytes([WIRE_VERSION]) + bytes(size.out) + bytes(w.out)
    out = np.empty(len(head) + sum(a.nbytes for a in arrays), dtype=np.uint8)
    out[: len(head)] = np.frombuffer(head, dtype=np.uint8)
    off = len(head)
    for a in arrays:
        out[off: off + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)  # raw bytes, C order
        off += a.nbytes
    return out


def _open_blob(buf: memoryview) -> _HeaderReader:
    """A reader positioned on the header of ``buf`` (magic, version and length checked)."""
    n = len(_MAGIC)
    if len(buf) < n + 2:
        raise ValueError(f"{len(buf)} bytes, shorter than the magic, version and header length")
    if bytes(buf[:n]) != _MAGIC:
        if len(buf) > 8 and buf[8] == ord("{"):
            raise ValueError("a wire-version-1 blob (JSON header): the sender runs an older mpifc")
        raise ValueError(f"does not start with {_MAGIC!r}")
    if buf[n] != WIRE_VERSION:
        raise ValueError(f"wire version {buf[n]}, this mpifc reads version {WIRE_VERSION}")
    r = _HeaderReader(buf, n + 1, len(buf))
    h = r.uint()
    if r.pos + h > len(buf):
        raise ValueError(f"header length {h} exceeds the blob ({len(buf)} bytes)")
    r.end = r.data = r.pos + h
    return r


def wire_overhead(blob: np.ndarray) -> int:
    """Bytes of ``blob`` that are not model arrays: magic, version, header length and header
    (see :func:`model_to_bytes`)."""
    return _open_blob(memoryview(np.ascontiguousarray(blob, dtype=np.uint8).reshape(-1)).cast("B")).end


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
        r = _open_blob(buf)
        n_params = r.uint() - 1
        root = WireGroup(filename=source)
        r.group(root)
        if r.pos != r.end:
            raise ValueError(f"{r.end - r.pos} unread header bytes")
        if r.data != len(buf):
            raise ValueError(f"{len(buf) - r.data} trailing bytes after the last dataset")
    except (ValueError, TypeError, KeyError, IndexError, UnicodeDecodeError, RecursionError) as e:
        raise UserError(f"{source}: malformed model blob ({e})") from None
    wm = WireModel(root, n_params)
    return wm if lazy else wm.materialize()


def register_federated_models() -> None:
    # The leaf types defined in this package register their loaders on import.
    import mpifc.federated.factorized  # noqa: F401
    import mpifc.federated.fcdt  # noqa: F401
