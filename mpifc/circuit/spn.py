"""``SPN``: a graph-structured circuit as a :class:`~mpifc.circuit.base.DensityModel`.

Wraps a root node and its :class:`~mpifc.circuit.compiled.CompiledCircuit`. LearnSPN/MSPN
results and hand-built circuits are SPNs. HDF5 layout written by :meth:`SPN.save`
(``model_type = "spn"``; nodes in :func:`~mpifc.circuit.graph.topological_order`, root last):

* ``kind`` int8 ``(N,)``: 0 leaf, 1 product, 2 sum;
* ``child_ptr`` int64 ``(N+1,)`` and ``child_idx`` int64 ``(E,)``: CSR children (node positions);
* ``scope_ptr``/``scope_vars`` int64: CSR declared scopes of every node;
* ``weights`` float64 ``(E,)``: edge weights (entries of non-sum edges are 0);
* ``leaf_type`` int8 ``(N,)``: index into ``attrs["leaf_types"]`` (-1 for inner nodes);
* group ``leaves/<type_name>/<param>``: float64 parameters of that type's leaves, in node order;
  ragged parameters are stored flat with a ``<param>.len`` int64 array.

Everything is float64/int64, so a round trip is bit-exact.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mpifc.circuit import graph as G
from mpifc.circuit.compiled import CircuitStats, CompiledCircuit
from mpifc.circuit.io import register_model
from mpifc.circuit.leaves import LEAF_TYPES
from mpifc.errors import UserError

_KIND = {"leaf": 0, "product": 1, "sum": 2}


class SPN:
    """A valid circuit with every query, EM and HDF5 I/O.

    Args:
        root: root node; validated and compiled.
        dtype: evaluation dtype (float64 by default).
    """

    model_type = "spn"

    def __init__(self, root: G.Node, dtype: torch.dtype = torch.float64) -> None:
        self.circuit = CompiledCircuit(root, dtype=dtype)
        self.scope: tuple[int, ...] = self.circuit.scope

    @property
    def root(self) -> G.Node:
        """The graph, with EM updates written back."""
        return self.circuit.sync_graph()

    # -- queries (DensityModel) ---------------------------------------------------------------

    def log_likelihood(self, x: Any) -> torch.Tensor:
        """``log p(x)`` ``(batch,)`` nats; NaN entries marginalised."""
        return self.circuit.log_likelihood(x)

    def mpe(self, x: Any) -> np.ndarray:
        """NaN entries completed by max-product backtracking, ``(batch, n_vars)``."""
        return self.circuit.mpe(x)

    def sample(self, n: int, rng: np.random.Generator | int, evidence: Any | None = None) -> np.ndarray:
        """``n`` samples ``(n, n_vars)``; non-NaN ``evidence`` entries are kept and conditioned on."""
        return self.circuit.sample(n, np.random.default_rng(rng), evidence)

    def conditional(self, x: Any, query_vars: Any) -> torch.Tensor:
        """``log p(x_query | x_rest)`` ``(batch,)`` nats."""
        return self.circuit.conditional(x, query_vars)

    def predict_proba(self, x: Any, target: int) -> tuple[np.ndarray, np.ndarray]:
        """``(classes (k,), probs (batch, k))`` of discrete variable ``target``."""
        return self.circuit.predict_proba(x, target)

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

    def num_parameters(self) -> int:
        return self.circuit.num_parameters()

    # -- persistence --------------------------------------------------------------------------

    def save(self, group: Any) -> None:
        """Write the circuit into an open ``h5py.Group`` (layout in the module docstring)."""
        save_graph(self.root, group)
        group.attrs["model_type"] = self.model_type
        group.attrs["dtype"] = str(self.circuit.dtype).replace("torch.", "")

    @classmethod
    def load(cls, group: Any) -> "SPN":
        name = group.attrs.get("dtype", "float64")
        name = name.decode() if isinstance(name, bytes) else str(name)
        if name not in ("float64", "float32"):
            raise UserError(f"{group.file.filename}:{group.name}: unsupported dtype {name!r}")
        return cls(load_graph(group), dtype=getattr(torch, name))


def save_graph(root: G.Node, group: Any) -> None:
    """Serialise the graph under ``root`` into ``group`` as flat arrays."""
    order = G.topological_order(root)
    pos = {id(n): i for i, n in enumerate(order)}
    names = list(LEAF_TYPES)
    kind = np.array([_KIND[n.kind] for n in order], dtype=np.int8)
    ptr = np.cumsum([0] + [len(n.children) for n in order]).astype(np.int64)
    idx = np.array([pos[id(c)] for n in order for c in n.children], dtype=np.int64)
    w = np.concatenate([n.weights if isinstance(n, G.SumNode) else np.zeros(len(n.children))
                        for n in order]).astype(np.float64) if len(idx) else np.zeros(0)
    sptr = np.cumsum([0] + [len(n.scope) for n in order]).astype(np.int64)
    svars = np.array([v for n in order for v in n.scope], dtype=np.int64)
    ltype = np.array([names.index(n.dist.type_name) if isinstance(n, G.LeafNode) else -1
                      for n in order], dtype=np.int8)
    for k, v in (("kind", kind), ("child_ptr", ptr), ("child_idx", idx), ("weights", w),
                 ("scope_ptr", sptr), ("scope_vars", svars), ("leaf_type", ltype)):
        group.create_dataset(k, data=v)
    group.attrs["leaf_types"] = names
    lg = group.create_group("leaves")
    for t, name in enumerate(names):
        mine = [n.dist for n in order if isinstance(n, G.LeafNode) and ltype[pos[id(n)]] == t]
        if not mine:
            continue
        sub = lg.create_group(name)
        cls = LEAF_TYPES[name]
        for p in cls.param_names:
            arrs = [lf.params()[p] for lf in mine]
            sub.create_dataset(p, data=np.concatenate([a.reshape(-1) for a in arrs]))
            if p in cls.ragged:
                sub.create_dataset(p + ".len", data=np.array([a.size for a in arrs], dtype=np.int64))


def load_graph(group: Any) -> G.Node:
    """Inverse of :func:`save_graph`; raises UserError naming the file on a malformed group."""
    where = f"{group.file.filename}:{group.name}"
    try:
        kind = group["kind"][()]
        ptr, idx, w = group["child_ptr"][()], group["child_idx"][()], group["weights"][()]
        sptr, svars = group["scope_ptr"][()], group["scope_vars"][()]
        ltype = group["leaf_type"][()]
        names = [s.decode() if isinstance(s, bytes) else str(s) for s in group.attrs["leaf_types"]]
        leaves: dict[int, list[Any]] = {}
        for t, name in enumerate(names):
            if name not in group["leaves"]:
                continue
            cls = LEAF_TYPES[name]
            sub = group["leaves"][name]
            n = int((ltype == t).sum())
            cols: dict[str, list[np.ndarray]] = {}
            for p in cls.param_names:
                if p == "tail" and p not in sub:  # written before leaves had tails: hard support
                    cols[p] = [np.array(0.0)] * n
                    continue
                flat = sub[p][()]
                if p in cls.ragged:
                    cuts = np.cumsum(sub[p + ".len"][()])[:-1]
                    cols[p] = np.split(flat, cuts)
                else:
                    cols[p] = [np.array(v) for v in flat]
            leaves[t] = [cls.from_params({p: cols[p][i] for p in cls.param_names}) for i in range(n)]
    except (KeyError, ValueError, IndexError) as e:
        raise UserError(f"{where}: malformed spn group ({e})") from None
    nodes: list[G.Node] = []
    used = {t: 0 for t in leaves}
    for i, k in enumerate(kind):
        scope = svars[sptr[i]:sptr[i + 1]]
        kids = [nodes[j] for j in idx[ptr[i]:ptr[i + 1]]]
        if k == 0:
            t = int(ltype[i])
            nodes.append(G.LeafNode(int(scope[0]), leaves[t][used[t]]))
            used[t] += 1
        elif k == 1:
            nodes.append(G.ProductNode(kids, scope=scope))
        elif k == 2:
            sn = G.SumNode(kids, w[ptr[i]:ptr[i + 1]], scope=scope)
            sn.weights = np.array(w[ptr[i]:ptr[i + 1]], dtype=np.float64)
            nodes.append(sn)
        else:
            raise UserError(f"{where}: unknown node kind {k} at position {i}")
    if not nodes:
        raise UserError(f"{where}: empty circuit")
    return nodes[-1]


register_model(SPN.model_type, SPN.load)
