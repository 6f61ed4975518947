"""``SPN``: a graph-structured circuit as a :class:`~mpifc.circuit.base.DensityModel`.

Wraps a root node and its :class:`~mpifc.circuit.compiled.CompiledCircuit`. LearnSPN/MSPN
results and hand-built circuits are SPNs. HDF5 layout written by :meth:`SPN.save`
(``model_type = "spn"``, ``attrs["layout"] = 2``; nodes in
:func:`~mpifc.circuit.graph.topological_order`, root last). Index arrays use the smallest
unsigned integer type that holds their largest value ("uint*"), since the same layout is what a
client puts on the wire for each PC (:mod:`mpifc.federated.serialize`):

* ``kind`` int8 ``(N,)``: 0 leaf, 1 product, 2 sum;
* ``n_children`` uint* ``(N,)`` and ``child_idx`` uint* ``(E,)``: children (node positions);
* ``sum_weights`` float64: the edge weights of the sum nodes only, in node order;
* ``leaf_var`` uint* ``(L,)``: the variable of each leaf, in node order;
* ``leaf_type`` int8 ``(L,)``: index into ``attrs["leaf_types"]`` (only the types used; the
  array is omitted when a single type is used);
* ``scope_ptr``/``scope_vars`` uint* (CSR over the N nodes): written only when an inner node
  declares a scope other than the union of its children's (else scopes are recomputed);
* group ``leaves/<type_name>/<param>``: float64 parameters of that type's leaves, in node order;
  ragged parameters are stored flat with a ``<param>.len`` uint* array; a non-ragged parameter
  equal on every leaf of the type (e.g. ``min_var``) is stored once, as a length-1 array.

Values round-trip bit-exactly. Files without ``attrs["layout"]`` (layout 1: int64 CSR arrays,
``child_ptr``, per-node scopes, zero weights on product edges) still load.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from mpifc.circuit import graph as G
from mpifc.circuit.io import register_model
from mpifc.circuit.leaves import LEAF_TYPES
from mpifc.circuit.leaves.base import weights_problem
from mpifc.errors import UserError

if TYPE_CHECKING:
    from mpifc.circuit.compiled import CircuitStats, CompiledCircuit
    from mpifc.circuit.numpy_eval import NumpyCircuit

_KIND = {"leaf": 0, "product": 1, "sum": 2}


class SPN:
    """A valid circuit with every query, EM and HDF5 I/O.

    The torch evaluator (:attr:`circuit`, a :class:`~mpifc.circuit.compiled.CompiledCircuit`)
    is compiled on first use only, so that building, fitting, saving, sending and
    :meth:`log_likelihood_numpy` never import torch (seconds and ~250 MB per process).

    Args:
        root: root node; validated here.
        dtype: evaluation dtype of the torch evaluator: ``torch.float64`` (default) or
            ``torch.float32``, or their names.
    """

    model_type = "spn"

    def __init__(self, root: G.Node, dtype: Any = None) -> None:
        name = "float64" if dtype is None else str(dtype).replace("torch.", "")
        if name not in ("float64", "float32"):
            raise UserError(f"SPN: unsupported dtype {dtype!r} (float64 or float32)")
        G.validate(root)
        self._graph = root
        self._dtype = name
        self._circuit: CompiledCircuit | None = None
        self._numpy: NumpyCircuit | None = None
        self.scope: tuple[int, ...] = root.scope

    @property
    def circuit(self) -> "CompiledCircuit":
        """The torch evaluator (EM, MPE, sampling, the torch queries), compiled on first use."""
        if self._circuit is None:
            from mpifc.circuit.compiled import CompiledCircuit
            from mpifc.circuit.lazy import torch

            self._circuit = CompiledCircuit(self._graph, dtype=getattr(torch, self._dtype), check=False)
        return self._circuit

    @property
    def root(self) -> G.Node:
        """The graph, with EM updates written back."""
        if self._circuit is None:
            return self._graph
        return self._circuit.sync_graph()

    # -- queries (DensityModel) ---------------------------------------------------------------

    def log_likelihood(self, x: Any) -> np.ndarray:
        """``log p(x)`` float64 ``(batch,)`` nats; NaN entries marginalised."""
        return self.circuit.log_likelihood(x).numpy()

    def log_likelihood_numpy(self, x: Any) -> np.ndarray:
        """:meth:`log_likelihood` by the numpy evaluator (:mod:`mpifc.circuit.numpy_eval`), without
        torch: equal to rounding (float64). What evaluation and the clients' model choice use."""
        if self._circuit is not None and not self._circuit._graph_synced:
            self._numpy = None  # EM moved the parameters: read them again
            self.root
        if self._numpy is None:
            from mpifc.circuit.numpy_eval import NumpyCircuit

            self._numpy = NumpyCircuit(self.root)
        return self._numpy.log_likelihood(x)

    def mpe(self, x: Any) -> np.ndarray:
        """NaN entries completed by max-product backtracking, ``(batch, n_vars)``."""
        return self.circuit.mpe(x)

    def sample(self, n: int, rng: np.random.Generator | int, evidence: Any | None = None) -> np.ndarray:
        """``n`` samples ``(n, n_vars)``; non-NaN ``evidence`` entries are kept and conditioned on."""
        return self.circuit.sample(n, np.random.default_rng(rng), evidence)

    def conditional(self, x: Any, query_vars: Any) -> np.ndarray:
        """``log p(x_query | x_rest)`` float64 ``(batch,)`` nats."""
        return self.circuit.conditional(x, query_vars).numpy()

    def classes(self, target: int) -> np.ndarray:
        """The values discrete variable ``target`` takes, ``(k,)``: the columns of :meth:`predict_proba`."""
        return self.circuit.support(target)

    def predict_proba(self, x: Any, target: int) -> np.ndarray:
        """``p(target = c | other observed entries)`` ``(batch, k)``, rows summing to 1, columns in
        the order of :meth:`classes`; the target column of ``x`` is ignored."""
        return self.circuit.predict_proba(x, target)[1]

    def predict(self, x: Any, target: int) -> np.ndarray:
        """Most probable value of ``target`` ``(batch,)``."""
        return self.circuit.predict(x, target)

    # -- EM -----------------------------------------------------------------------------------

    def em_statistics(self, x: Any, sample_weight: Any | None = None) -> CircuitStats:
        """E-step statistics (addable across shards)."""
        return self.circuit.em_statistics(x, sample_weight)

    def apply_em(self, stats: CircuitStats, step_size: float = 1.0) -> None:
        """M-step with ``(1 - step_size) * old + step_size * new``."""
        self.circuit.apply_em(stats, step_size)
        self._numpy = None

    def num_parameters(self) -> int:
        """Sum-edge weights plus learnable leaf scalars (as the compiled circuit counts them)."""
        if self._circuit is not None:
            return self._circuit.num_parameters()
        order = G.topological_order(self._graph)
        return sum(len(n.children) if isinstance(n, G.SumNode) else
                   n.dist.num_parameters() if isinstance(n, G.LeafNode) else 0 for n in order)

    # -- persistence --------------------------------------------------------------------------

    def save(self, group: Any) -> None:
        """Write the circuit into an open ``h5py.Group`` (layout in the module docstring)."""
        save_graph(self.root, group)
        group.attrs["model_type"] = self.model_type
        group.attrs["dtype"] = self._dtype

    @classmethod
    def load(cls, group: Any) -> "SPN":
        name = group.attrs.get("dtype", "float64")
        name = name.decode() if isinstance(name, bytes) else str(name)
        if name not in ("float64", "float32"):
            raise UserError(f"{group.file.filename}:{group.name}: unsupported dtype {name!r}")
        return cls(load_graph(group), dtype=name)


LAYOUT = 2

WEIGHT_TOL = 1e-6
"""How far the weights of a sum node read from a file may sum away from 1 (rounding)."""



def _small_uint(values: Any) -> np.ndarray:
    """``values`` (non-negative integers) in the smallest unsigned dtype that holds them."""
    if isinstance(values, list):  # Python ints (the writer's own lists): no int64 detour
        top = max(values) if values else 0
        for dt in (np.uint8, np.uint16, np.uint32):
            if top <= np.iinfo(dt).max:
                return np.array(values, dtype=dt)
    a = np.asarray(values, dtype=np.int64).reshape(-1)
    top = int(a.max()) if a.size else 0
    for dt in (np.uint8, np.uint16, np.uint32):
        if top <= np.iinfo(dt).max:
            return a.astype(dt)
    return a


def save_graph(root: G.Node, group: Any) -> None:
    """Serialise the graph under ``root`` into ``group`` as flat arrays (layout 2)."""
    order = G.topological_order(root)
    pos = {id(n): i for i, n in enumerate(order)}
    leaves_in_order = [n for n in order if isinstance(n, G.LeafNode)]
    type_names = [n.dist.type_name for n in leaves_in_order]
    names = sorted(set(type_names), key=list(LEAF_TYPES).index)
    code = {name: t for t, name in enumerate(names)}
    kind = np.array([_KIND[n.kind] for n in order], dtype=np.int8)
    sums = [n for n in order if isinstance(n, G.SumNode)]
    w = (np.concatenate([np.asarray(n.weights, dtype=np.float64) for n in sums]) if sums
         else np.zeros(0, dtype=np.float64))
    group.create_dataset("kind", data=kind)
    group.create_dataset("n_children", data=_small_uint([len(n.children) for n in order]))
    group.create_dataset("child_idx", data=_small_uint([pos[id(c)] for n in order for c in n.children]))
    group.create_dataset("sum_weights", data=w)
    group.create_dataset("leaf_var", data=_small_uint([n.var for n in leaves_in_order]))
    ltype = [code[name] for name in type_names]
    if len(names) > 1:
        group.create_dataset("leaf_type", data=np.array(ltype, dtype=np.int8))
    if any(tuple(sorted(set().union(*(c.scope for c in n.children)))) != tuple(sorted(n.scope))
           for n in order if not isinstance(n, G.LeafNode)):
        declared = [tuple(n.scope) for n in order]
        group.create_dataset("scope_ptr", data=_small_uint(np.cumsum([0] + [len(s) for s in declared])))
        group.create_dataset("scope_vars", data=_small_uint([v for s in declared for v in s]))
    group.attrs["leaf_types"] = names
    group.attrs["layout"] = LAYOUT
    lg = group.create_group("leaves")
    for t, name in enumerate(names):
        # The leaves' own parameter arrays, read in place (``params()`` would copy each one):
        # every dataset below is a fresh concatenation, so nothing of the leaves is shared.
        mine = [n.dist._p for n, lt in zip(leaves_in_order, ltype) if lt == t]
        sub = lg.create_group(name)
        cls = LEAF_TYPES[name]
        for p in cls.param_names:
            arrs = [prm[p].reshape(-1) for prm in mine]
            flat = np.concatenate(arrs)
            if p in cls.ragged:
                sub.create_dataset(p, data=flat)
                sub.create_dataset(p + ".len", data=_small_uint([a.size for a in arrs]))
                continue
            # One value shared by every leaf (a configuration such as min_var) is stored once;
            # comparing bit patterns keeps -0.0/0.0 and NaNs exact.
            same = flat.size > 1 and bool(np.all(flat.view(np.uint64) == flat[:1].view(np.uint64)))
            sub.create_dataset(p, data=flat[:1] if same else flat)


def _leaf_params(sub: Any, cls: Any, n: int, where: str) -> list[Any]:
    """The ``n`` leaves of one type from their parameter group (either layout), each checked
    (:meth:`~mpifc.circuit.leaves.Leaf.param_problem`): UserError naming ``where``, the leaf and
    the parameter at fault."""
    cols: dict[str, list[np.ndarray]] = {}
    for p in cls.param_names:
        if p == "tail" and p not in sub:  # written before leaves had tails: hard support
            cols[p] = [np.array(0.0)] * n
            continue
        flat = sub[p][()]
        if p in cls.ragged:
            lens = np.asarray(sub[p + ".len"][()], dtype=np.int64)
            if len(lens) != n or int(lens.sum()) != flat.size:
                raise ValueError(f"{p}.len does not match {n} leaves of {flat.size} values")
            cols[p] = np.split(flat, np.cumsum(lens)[:-1])
        else:
            if flat.size == 1 and n > 1:
                flat = np.repeat(flat, n)
            if flat.size != n:
                raise ValueError(f"{p} holds {flat.size} values for {n} leaves")
            cols[p] = [np.array(v) for v in flat]
    out = []
    for i in range(n):
        params = {p: cols[p][i] for p in cls.param_names}
        problem = cls.param_problem(params)
        if problem is not None:
            raise UserError(f"{where}: {cls.type_name} leaf {i}: {problem}")
        out.append(cls.from_params(params))
    return out


def load_graph(group: Any) -> G.Node:
    """Inverse of :func:`save_graph`; raises UserError naming the file on a malformed group."""
    where = f"{group.file.filename}:{group.name}"
    layout = int(group.attrs.get("layout", 1))
    if layout not in (1, LAYOUT):
        raise UserError(f"{where}: unknown spn layout {layout} (this mpifc reads layouts 1 and {LAYOUT})")
    try:
        kind = group["kind"][()]
        names = [s.decode() if isinstance(s, bytes) else str(s) for s in group.attrs["leaf_types"]]
        if layout == 1:
            ptr = np.asarray(group["child_ptr"][()], dtype=np.int64)
            idx = np.asarray(group["child_idx"][()], dtype=np.int64)
            w_all = group["weights"][()]
            sptr, svars = group["scope_ptr"][()], group["scope_vars"][()]
            ltype_all = group["leaf_type"][()]
            is_leaf = kind == 0
            ltype = ltype_all[is_leaf]
            leaf_var = np.array([svars[sptr[i]] for i in np.flatnonzero(is_leaf)], dtype=np.int64)
            w = np.concatenate([w_all[ptr[i]:ptr[i + 1]] for i in np.flatnonzero(kind == 2)]) \
                if np.any(kind == 2) else np.zeros(0)
        else:
            nch = np.asarray(group["n_children"][()], dtype=np.int64)
            ptr = np.concatenate([[0], np.cumsum(nch)])
            idx = np.asarray(group["child_idx"][()], dtype=np.int64)
            w = group["sum_weights"][()]
            leaf_var = np.asarray(group["leaf_var"][()], dtype=np.int64)
            n_leaves = int((kind == 0).sum())
            ltype = group["leaf_type"][()] if "leaf_type" in group else np.zeros(n_leaves, dtype=np.int8)
            if "scope_ptr" in group:
                sptr = np.asarray(group["scope_ptr"][()], dtype=np.int64)
                svars = np.asarray(group["scope_vars"][()], dtype=np.int64)
            else:
                sptr = svars = None
            if len(leaf_var) != n_leaves or len(ltype) != n_leaves:
                raise ValueError(f"{n_leaves} leaves but {len(leaf_var)} leaf_var / {len(ltype)} leaf_type entries")
        if len(ptr) != len(kind) + 1 or int(ptr[-1]) != len(idx):
            raise ValueError("children arrays do not match the node count")
        if len(ltype) and not (0 <= int(np.min(ltype)) and int(np.max(ltype)) < len(names)):
            raise ValueError(f"leaf_type holds codes outside 0..{len(names) - 1}")
        leaves: dict[int, list[Any]] = {}
        for t, name in enumerate(names):
            n = int((ltype == t).sum())
            if n == 0:
                continue
            if name not in LEAF_TYPES:
                raise UserError(f"{where}: unknown leaf type {name!r}")
            leaves[t] = _leaf_params(group["leaves"][name], LEAF_TYPES[name], n, where)
    except (KeyError, ValueError, IndexError) as e:
        raise UserError(f"{where}: malformed spn group ({e})") from None
    nodes: list[G.Node] = []
    used = {t: 0 for t in leaves}
    n_leaf = 0
    w_at = 0
    for i, k in enumerate(kind):
        kids_idx = idx[ptr[i]:ptr[i + 1]]
        if np.any(kids_idx >= i):
            raise UserError(f"{where}: node {i} has a child that is not before it (not a topological order)")
        kids = [nodes[j] for j in kids_idx]
        scope = None if layout == 2 and sptr is None else svars[sptr[i]:sptr[i + 1]]
        if k == 0:
            t = int(ltype[n_leaf])
            nodes.append(G.LeafNode(int(leaf_var[n_leaf]), leaves[t][used[t]]))
            used[t] += 1
            n_leaf += 1
        elif k == 1:
            nodes.append(G.ProductNode(kids, scope=scope))
        elif k == 2:
            wi = np.array(w[w_at: w_at + len(kids)], dtype=np.float64)
            if len(wi) != len(kids):
                raise UserError(f"{where}: sum_weights too short for the sum node at position {i}")
            problem = weights_problem(wi, WEIGHT_TOL)
            if problem is not None:
                raise UserError(f"{where}: sum_weights of the sum node at position {i}: {problem}")
            w_at += len(kids)
            sn = G.SumNode(kids, wi, scope=scope)
            sn.weights = wi
            nodes.append(sn)
        else:
            raise UserError(f"{where}: unknown node kind {k} at position {i}")
    if not nodes:
        raise UserError(f"{where}: empty circuit")
    return nodes[-1]


register_model(SPN.model_type, SPN.load)
