"""Class queries of many classes over the ranks: nodes' class values carried as terms.

A class query (``log p(target = c, x)`` for every class ``c``) gives every node whose scope
holds the target one value per class. With many classes that is costly twice over: a client
evaluates each of its PCs holding the target once per class, and every such node crossing a
link sends ``n_classes`` values per row. From :data:`~mpifc.federated.flat.SEPARABLE_CLASSES`
classes on, a node whose class values have the form of :class:`~mpifc.federated.flat._Terms`
(``logsumexp_i (a_i(x) + t_i(c))``: the target in one child of every product and in every
child of every sum below it) is carried as its *row terms* ``a_i(x)`` instead, ``(batch,
n_terms)``, beside its *class terms* ``t_i(c)``, ``(n_terms, n_classes)``, which depend on the
model only:

* a client computes its PCs' row terms with one flat program
  (:meth:`~mpifc.federated.flat.FlatCircuit.row_terms`), never once per class;
* a product over one such child and children without the target adds their values to the
  child's row terms; a sum (or average) over such children joins their row terms, each shifted
  by its log-weight, and stacks their class terms;
* a node of any other form takes its children's class values (:meth:`ClassTerms.dense`, the
  exact joint of :class:`~mpifc.federated.flat._Terms`) and combines them as the reference does;
  the root's class values on the querier likewise.

Before the first batch each rank sends every parent rank, once, the class terms of the nodes it
sends it that hold the target (``fc.query.class_terms``: model parameters, the target leaves'
log-probabilities of each class; an empty block for a node sent as class values), so both ends
of a link know each node's width. Every answer equals the per-class reference pass up to
floating-point rounding.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from mpifc.federated.evaluate import Query
from mpifc.federated.structure import AVERAGE, LEAF, PRODUCT, SUM, FederatedCircuit
from mpifc.fedpc import protocol as P

MAX_NODE_TERMS = 1 << 16
"""Most terms of one node carried as terms; a sum with more is carried as class values."""


def uses_class_terms(query: Query) -> bool:
    """Whether a pass of ``query`` carries nodes as terms (:data:`SEPARABLE_CLASSES` classes on)."""
    from mpifc.federated.flat import SEPARABLE_CLASSES

    return query.expand_target is not None and query.n_classes >= SEPARABLE_CLASSES


class ClassTerms:
    """One rank's class terms of a class query: :attr:`logt` per node carried as terms (this
    rank's and those it receives), and the program of this rank's leaves' row terms.

    Args:
        fc: the circuit, this rank's leaves holding their models.
        rank: this rank.
        query: a class query (:func:`uses_class_terms`).
    """

    def __init__(self, fc: FederatedCircuit, rank: int, query: Query) -> None:
        from mpifc.federated.flat import FlatCircuit

        self.fc, self.rank, self.query = fc, rank, query
        self.target = query.expand_target
        self.logt: dict[int, np.ndarray] = {}
        self._dense: dict[int, Any] = {}
        self.mine = [nid for nid in fc.reachable() if fc.nodes[nid].rank == rank]
        leaves = [nid for nid in self.mine if fc.nodes[nid].op == LEAF and self.holds(nid)]
        self.program = FlatCircuit(fc, self.target, terms_of=leaves) if leaves else None
        if self.program is not None:
            self.logt.update({nid: t.logt for nid, t in self.program.node_terms.items()})
        self.col = {f: j for j, f in enumerate(fc.features)}

    def holds(self, nid: int) -> bool:
        return self.target in self.fc.nodes[nid].scope

    def width(self, nid: int) -> int:
        """Columns of node ``nid``'s value in a pass: its terms, its classes, or 1."""
        if nid in self.logt:
            return int(self.logt[nid].shape[0])
        return self.query.n_classes if self.holds(nid) else 1

    def links(self, edges: dict[tuple[int, int], list[int]]) -> dict[tuple[int, int], list[int]]:
        """The links with nodes holding the target, and those nodes (ascending id)."""
        out = {}
        for link, ids in edges.items():
            held = [nid for nid in ids if self.holds(nid)]
            if held:
                out[link] = held
        return out

    def plan(self, transport: Any) -> None:
        """The set-up pass: class terms from each child rank, this rank's inner nodes', then
        this rank's to each parent rank (one ``fc.query.class_terms`` message per link with
        nodes holding the target: per node its number of terms, 0 for class values, then every
        node's ``logt`` row by row)."""
        from mpifc.fedpc.query import await_messages

        k = self.query.n_classes
        links = self.links(self.fc.rank_edges())
        incoming = {src: ids for (src, dst), ids in links.items() if dst == self.rank}
        for src, flat in await_messages(transport, sorted(incoming), P.CLASS_TERMS) if incoming else []:
            ids = incoming[src]
            counts = flat[:len(ids)].astype(np.int64)
            if len(flat) != len(ids) + int(counts.sum()) * k or (counts < 0).any():
                from mpifc.errors import UserError

                raise UserError(f"rank {self.rank}: class terms from rank {src} hold {len(flat)} values, "
                                f"not {len(ids)} counts and their rows of {k} classes")
            off = len(ids)
            for nid, n in zip(ids, counts):
                if n:
                    self.logt[nid] = flat[off:off + n * k].reshape(n, k)
                    off += n * k
        for nid in self.mine:
            node = self.fc.nodes[nid]
            if node.op == LEAF or not self.holds(nid):
                continue
            holds = [ch for ch in node.children if self.holds(ch)]
            if node.op == PRODUCT and len(holds) == 1 and holds[0] in self.logt:
                self.logt[nid] = self.logt[holds[0]]
            elif (node.op in (SUM, AVERAGE) and len(holds) == len(node.children)
                  and all(ch in self.logt for ch in holds)
                  and sum(self.logt[ch].shape[0] for ch in holds) <= MAX_NODE_TERMS):
                self.logt[nid] = np.concatenate([self.logt[ch] for ch in holds])
        for (src, dst), ids in sorted(links.items()):
            if src != self.rank:
                continue
            counts = [float(self.logt[nid].shape[0]) if nid in self.logt else 0.0 for nid in ids]
            rows = [self.logt[nid].reshape(-1) for nid in ids if nid in self.logt]
            transport.send(np.concatenate([np.array(counts)] + rows), dst, P.CLASS_TERMS)

    def leaf_rows(self, cols: dict[str, np.ndarray], batch: int) -> dict[int, np.ndarray]:
        """This rank's leaves' row terms for one batch of evidence columns."""
        if self.program is None:
            return {}
        x = np.full((batch, len(self.col)), np.nan)
        for f, v in cols.items():
            if f in self.col and f != self.target:
                x[:, self.col[f]] = v
        return self.program.row_terms(x)

    def combine(self, nid: int, child_values: list[np.ndarray]) -> np.ndarray:
        """A node carried as terms: its row terms from its children's values."""
        node = self.fc.nodes[nid]
        if node.op == PRODUCT:
            out = None
            for ch, v in zip(node.children, child_values):
                if self.holds(ch):
                    out = v.copy() if out is None else out + v
            for ch, v in zip(node.children, child_values):
                if not self.holds(ch):
                    out += v  # (batch, 1) broadcast over the terms
            return out
        with np.errstate(divide="ignore"):
            logw = np.log(node.weights) if node.op == SUM else np.full(len(node.children), -np.log(len(node.children)))
        return np.concatenate([v + w for v, w in zip(child_values, logw)], axis=1)

    def dense(self, nid: int, value: np.ndarray) -> np.ndarray:
        """Node ``nid``'s class values ``(batch, n_classes)`` from its row terms (exact in log
        space where linear space underflows, :meth:`~mpifc.federated.flat._Terms.joint`)."""
        from mpifc.federated.flat import _Terms

        if nid not in self._dense:
            self._dense[nid] = _Terms.given(self.logt[nid])
        return self._dense[nid].joint(value)


def class_terms_payload_bytes(fc: FederatedCircuit, terms: dict[int, int], batch: int, query: Query) -> int:
    """Closed form: payload bytes of one class-query pass over ``batch`` rows when the nodes of
    ``terms`` (node id -> number of terms) are carried as terms."""
    n = 0
    for ids in fc.rank_edges().values():
        for nid in ids:
            if nid in terms:
                n += terms[nid]
            else:
                n += query.n_classes if query.expand_target in fc.nodes[nid].scope else 1
    return 8 * batch * n
