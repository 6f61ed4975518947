"""Closed forms of the communication cost of training (FC paper, section 3.4 and appendix D), in bytes.

The paper counts "messages" as scalar numbers put on the wire (``O(M |C| K)`` for FedAvg, ...)
and states only the order of growth. Here every closed form is an exact byte count under stated
assumptions, so it can be checked against the ledger of a real run:

* **itemsize**: bytes per scalar: 4 (float32) by default; sample counts are int64 (8 bytes).
* **payload only**: the runtime's per-message header (``wire.header_size(ndim)`` bytes) is added
  by :func:`with_headers`, with the message counts of ``*_messages``, when a total is wanted.
* **directions**: FedAvg sends the global model down *and* the local model up every round, and
  SplitNN sends activations up *and* gradients down; the paper's ``O(.)`` counts one direction.
  ``directions=2`` (default) is what the protocols of :mod:`mpifc.baselines` do; ``directions=1``
  reproduces the paper's count.
* **SplitNN labels**: the paper's ``E |C| F S`` assumes the top-network server holds the labels.
  mpifc keeps them on the label-owner client, which adds ``2 E S k`` scalars (logits down, their
  gradient up): pass ``n_classes=k`` to include them, ``0`` for the paper's form.
* **FedPC**: ``M`` is the number of parameters of ONE client PC (the paper: per client, per
  cluster in vertical FL); structure, declarations and plans are left out, as in the paper.
  To check a real run, :func:`fedpc_sent_bytes` takes ``M`` as what a client PC actually puts
  on the wire: the bytes of every array its ``save`` writes (parameters *and* structure:
  child pointers, scopes, leaf types...), from :func:`model_array_bytes`. The wire format's own
  header (names, dtypes, shapes) and the runtime's per-message header are not in ``M``; the
  experiment reports them in columns of their own.

Symbols (paper's names): ``|C|`` clients, ``M`` parameters, ``K`` FedAvg rounds (horizontal) or
clusters (vertical), ``P`` product nodes, ``E`` epochs, ``F`` cut-layer width, ``S`` samples.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

FLOAT32 = 4
INT64 = 8
MB = 1e6  # the paper's figure is in megabytes; decimal, as network volumes usually are


def _check(**values: float) -> None:
    for name, v in values.items():
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")


# ------------------------------------------------------------------------------ horizontal FL
def fedpc_horizontal_bytes(n_clients: int, n_params: int, itemsize: int = FLOAT32,
                           count_itemsize: int = INT64) -> int:
    """One-pass FedPC, horizontal: every client uploads its PC (M scalars) and its row count.

    The paper's ``O(|C| (M + 1))``; bytes = ``|C| * (M * itemsize + count_itemsize)``.
    """
    _check(n_clients=n_clients, n_params=n_params)
    return n_clients * (n_params * itemsize + count_itemsize)


def clients_per_round(n_clients: int, fraction: float = 1.0) -> int:
    """FedAvg clients sampled per round: ``max(1, round(fraction * |C|))`` (as mpifc samples)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    return min(n_clients, max(1, int(round(fraction * n_clients))))


def fedavg_bytes(n_clients: int, n_params: int, rounds: int, itemsize: int = FLOAT32,
                 fraction: float = 1.0, directions: int = 2) -> int:
    """FedAvg model traffic: ``directions * K * |C_round| * M * itemsize`` (paper: ``O(M |C| K)``).

    The one-off row-count declaration (``|C|`` small messages) is not included.
    """
    _check(n_clients=n_clients, n_params=n_params, rounds=rounds)
    return directions * rounds * clients_per_round(n_clients, fraction) * n_params * itemsize


def fedavg_messages(n_clients: int, rounds: int, fraction: float = 1.0, directions: int = 2) -> int:
    """Model messages of FedAvg: one per direction per sampled client per round."""
    return directions * rounds * clients_per_round(n_clients, fraction)


# -------------------------------------------------------------------------------- vertical FL
def fedpc_vertical_bytes(n_clients: int, n_params: int, n_clusters: int, n_products: int,
                         itemsize: int = FLOAT32) -> int:
    """One-pass FedPC, vertical: each client uploads K cluster PCs of M scalars; P mixture weights.

    The paper's ``O(K M |C| + P)``; bytes = ``(K * M * |C| + P) * itemsize``.
    """
    _check(n_clients=n_clients, n_params=n_params, n_clusters=n_clusters, n_products=n_products)
    return (n_clusters * n_params * n_clients + n_products) * itemsize


def splitnn_bytes(n_clients: int, cut: int, n_samples: int, epochs: int, itemsize: int = FLOAT32,
                  n_classes: int = 0, directions: int = 2) -> int:
    """SplitNN training traffic: ``E * S * (directions * |C| * F + 2 * k) * itemsize``.

    The paper's ``O(E |C| F S)`` is ``directions=1, n_classes=0``.
    """
    _check(n_clients=n_clients, cut=cut, n_samples=n_samples, epochs=epochs, n_classes=n_classes)
    return epochs * n_samples * (directions * n_clients * cut + 2 * n_classes) * itemsize


def sampled_em_bytes(rows: int, moving_leaves: int, fixed_leaves: int, iterations: int, stopped: bool,
                     itemsize: int = FLOAT32, flow_itemsize: int = 2) -> int:
    """Per-sample payload of sampled EM (:mod:`mpifc.federated.sampled_em`, the class glue's
    default refinement on vertical data): ``rows`` sampled rows, ``iterations`` E-steps.

    The values of every PC in the first iteration and of the moving PCs (those of clients without
    the target) in each later one, then one flow per row and moving PC for each M-step, of which
    there are ``iterations - 1`` when the likelihood settled (``stopped``; the stop notice is an
    empty bundle) and ``iterations`` otherwise; values of ``itemsize`` bytes (float32), flows of
    ``flow_itemsize`` (float16)::

        rows * (itemsize * (fixed + moving * iterations) + flow_itemsize * moving * (iterations - stopped))

    Independent of the training rows beyond the sample. The default (every PC kept, the server
    alone moving the sum weights) has no moving PC: ``rows * itemsize * PCs``, whatever the
    iterations.
    """
    _check(rows=rows, moving_leaves=moving_leaves, fixed_leaves=fixed_leaves, iterations=iterations)
    m_steps = max(iterations - 1 if stopped else iterations, 0)
    return rows * (itemsize * (fixed_leaves + moving_leaves * iterations) + flow_itemsize * moving_leaves * m_steps)


def n_batches(n_samples: int, batch_size: int) -> int:
    """Minibatches per epoch (``batch_size <= 0``: one full batch)."""
    if batch_size <= 0 or batch_size >= n_samples:
        return 1 if n_samples else 0
    return -(-n_samples // batch_size)


def splitnn_messages(n_clients: int, n_samples: int, epochs: int, batch_size: int,
                     label_messages: bool = True) -> int:
    """SplitNN training messages: per batch one activation and one gradient per client (and the
    logits and their gradient with the label owner)."""
    per_batch = 2 * n_clients + (2 if label_messages else 0)
    return epochs * n_batches(n_samples, batch_size) * per_batch


def vertical_condition(n_clusters: int, n_params: int, n_products: int, n_clients: int,
                       epochs: int, cut: int, n_samples: int) -> bool:
    """The paper's sufficient condition for FedPC to beat SplitNN: ``K M + P/|C| < E F S``."""
    return n_clusters * n_params + n_products / n_clients < epochs * cut * n_samples


# ---------------------------------------------------------------------------------- hybrid FL
def fedpc_hybrid_bytes(n_shared: int, cost_horizontal: int, n_disjoint: int, cost_vertical: int) -> int:
    """Hybrid FedPC: ``|R_s| * C_h + |R_d| * C_v`` bytes.

    Args:
        n_shared: subspaces held by several clients (trained as horizontal FL), ``|R_s|``.
        cost_horizontal: bytes of one such subspace, e.g. :func:`fedpc_horizontal_bytes`.
        n_disjoint: subspaces held by one client (the vertical part), ``|R_d|`` (written
            ``|R_v|`` in the paper's formula).
        cost_vertical: bytes of one such subspace, e.g. :func:`fedpc_vertical_bytes`.
    """
    _check(n_shared=n_shared, cost_horizontal=cost_horizontal, n_disjoint=n_disjoint, cost_vertical=cost_vertical)
    return n_shared * cost_horizontal + n_disjoint * cost_vertical


# ------------------------------------------------------------------ FedPC, as actually sent
COUNT_FIELDS = 3  # fc.train.counts: one (subspace, cluster, n_rows) int64 row per client PC


class _ArrayRecorder:
    """Stands in for an ``h5py.Group`` in a model's ``save``: keeps the arrays, writes nothing."""

    def __init__(self) -> None:
        self.attrs: dict[str, Any] = {}
        self.arrays: list[Any] = []
        self.groups: list["_ArrayRecorder"] = []

    def create_dataset(self, name: str, data: Any = None, **_: Any) -> None:
        import numpy as np

        self.arrays.append(np.asarray(data))

    def create_group(self, name: str) -> "_ArrayRecorder":
        g = _ArrayRecorder()
        self.groups.append(g)
        return g

    def walk(self) -> list[Any]:
        return self.arrays + [a for g in self.groups for a in g.walk()]


def model_array_bytes(model: Any) -> int:
    """Bytes of every array ``model.save(group)`` writes: parameters and structure arrays.

    This is the ``M`` (in bytes) a client puts on the wire for one PC, independent of the
    container: attributes (model type, dtype names, config scalars) are metadata, not counted.
    """
    rec = _ArrayRecorder()
    model.save(rec)
    return int(sum(a.nbytes for a in rec.walk()))


def fedpc_sent_bytes(model_bytes: Sequence[int], n_pcs: int | None = None, cluster_id_rows: int = 0,
                     count_itemsize: int = INT64, cluster_id_itemsize: int | None = None) -> int:
    """One-pass FedPC training payload as sent: every client PC once, plus the counts.

    ``sum(M_i) + n_pcs * 3 * count_itemsize + cluster_id_rows * cluster_id_itemsize``: the paper's
    ``|C| (M + 1)`` (horizontal) and ``K M |C| + P`` (vertical, where the P product weights are
    computed by the server from the K cluster counts each client sends) with ``M_i`` in bytes.

    Args:
        model_bytes: :func:`model_array_bytes` of every client PC (one per client, or K per
            client in vertical FL).
        n_pcs: PCs reported in the count messages (default ``len(model_bytes)``).
        cluster_id_rows: training rows whose cluster id is sent (``cooccurrence`` glue only).
        cluster_id_itemsize: bytes per cluster id, required when ``cluster_id_rows > 0``: the
            runtime sends them in the smallest unsigned dtype holding ``K - 1``
            (``mpifc.federated.one_pass.cluster_id_dtype(K).itemsize``: 1 for K <= 256).
    """
    n = len(model_bytes) if n_pcs is None else n_pcs
    if cluster_id_rows and cluster_id_itemsize is None:
        raise ValueError("cluster_id_rows > 0 needs cluster_id_itemsize (cluster_id_dtype(K).itemsize)")
    ids = cluster_id_rows * (cluster_id_itemsize or 0)
    _check(n_pcs=n, cluster_id_rows=cluster_id_rows, cluster_id_itemsize=cluster_id_itemsize or 0,
           **{f"model_bytes[{i}]": b for i, b in enumerate(model_bytes)})
    return int(sum(model_bytes)) + n * COUNT_FIELDS * count_itemsize + ids


def with_headers(payload_bytes: int, messages: int, ndim: int = 1) -> int:
    """Payload plus the runtime's typed header per message (``ndim``-dimensional arrays), bytes."""
    from mpifc.runtime.wire import header_size

    return payload_bytes + messages * header_size(ndim)


# ------------------------------------------------------------------------- appendix D scenario
@dataclass(frozen=True)
class Scenario:
    """The knobs the paper's appendix-D figure leaves unstated, with the values used here.

    Attributes:
        samples: dataset sizes S (the paper: 1M and 100M).
        params: model sizes M (the paper: 0.5M and 50M).
        n_clients: |C|.
        rounds: FedAvg rounds K ("hundreds to even thousands": the low end).
        epochs: SplitNN epochs E.
        cut: SplitNN cut width F ("F > 100").
        clusters: FedPC clusters K ("usually smaller than 100").
        products: FedPC product nodes P.
        itemsize: bytes per scalar.
        directions: 2 = down and up (the protocols as run), 1 = the paper's count.
        m_is_total: read the figure's "model parameters" as the whole vertical FedPC (then one
            client PC has ``M / (K |C|)``), instead of one client PC (the section-3.4 reading).
        fedpc_bytes_per_param: wire bytes per FedPC parameter, structure arrays included
            (``None``: ``itemsize``, the paper's reading). A LearnSPN PC as sent by mpifc costs
            far more (float64 weights plus int64 child/scope arrays); the commcost experiment
            measures it and checks the claims at that value too.
    """

    samples: tuple[int, ...] = (1_000_000, 100_000_000)
    params: tuple[int, ...] = (500_000, 50_000_000)
    n_clients: int = 10
    rounds: int = 100
    epochs: int = 10
    cut: int = 128
    clusters: int = 10
    products: int = 100
    itemsize: int = FLOAT32
    directions: int = 2
    m_is_total: bool = False
    fedpc_bytes_per_param: float | None = None

    def fedpc_model_bytes(self, m: int) -> float:
        """Wire bytes of a FedPC client PC of ``m`` parameters."""
        return m * (self.itemsize if self.fedpc_bytes_per_param is None else self.fedpc_bytes_per_param)

    def vertical_params(self, m: int) -> int:
        """Parameters of one client PC in vertical FL for a figure size ``m``."""
        return max(1, m // (self.clusters * self.n_clients)) if self.m_is_total else m


PAPER = Scenario()


def scenario_costs(sc: Scenario = PAPER) -> list[dict[str, Any]]:
    """Bytes of every method at every (S, M) of the scenario.

    Returns:
        One dict per (samples, params): ``samples``, ``params``, ``fedpc_h``, ``fedavg``,
        ``fedpc_v``, ``splitnn`` (bytes) and the ratios ``fedavg_over_fedpc`` and
        ``splitnn_over_fedpc``.
    """
    out = []
    for s in sc.samples:
        for m in sc.params:
            if sc.fedpc_bytes_per_param is None:
                h = fedpc_horizontal_bytes(sc.n_clients, m, sc.itemsize)
                v = fedpc_vertical_bytes(sc.n_clients, sc.vertical_params(m), sc.clusters, sc.products, sc.itemsize)
            else:  # the PCs as sent: M in bytes, counts as int64 (n, 3) rows
                h = sc.n_clients * (sc.fedpc_model_bytes(m) + COUNT_FIELDS * INT64)
                v = sc.n_clients * sc.clusters * (sc.fedpc_model_bytes(sc.vertical_params(m)) + COUNT_FIELDS * INT64)
            a = fedavg_bytes(sc.n_clients, m, sc.rounds, sc.itemsize, directions=sc.directions)
            n = splitnn_bytes(sc.n_clients, sc.cut, s, sc.epochs, sc.itemsize, directions=sc.directions)
            out.append({"samples": s, "params": m, "fedpc_h": h, "fedavg": a, "fedpc_v": v, "splitnn": n,
                        "fedavg_over_fedpc": a / h, "splitnn_over_fedpc": n / v})
    return out


def claim_rows(sc: Scenario = PAPER, fedavg_factor: float = 100.0, splitnn_factor: float = 1000.0
               ) -> list[dict[str, Any]]:
    """Where "FedPC trains with >= 100x fewer bytes than FedAvg, >= 1000x fewer than SplitNN" holds.

    One row per (S, M) of ``sc``: both ratios, whether each claim holds, and the smallest S at
    which SplitNN reaches ``splitnn_factor`` times FedPC's bytes (SplitNN grows linearly in S;
    FedPC and FedAvg do not depend on S).
    """
    rows = []
    for c in scenario_costs(sc):
        per_sample = splitnn_bytes(sc.n_clients, sc.cut, 1, sc.epochs, sc.itemsize, directions=sc.directions)
        rows.append({**c, "fedavg_claim": c["fedavg_over_fedpc"] >= fedavg_factor,
                     "splitnn_claim": c["splitnn_over_fedpc"] >= splitnn_factor,
                     "splitnn_claim_from_samples": int(-(-splitnn_factor * c["fedpc_v"] // per_sample))})
    return rows


@dataclass(frozen=True)
class MeasuredPoint:
    """A run's measured training bytes, drawn over the formulas.

    Attributes:
        setting: ``"horizontal"`` or ``"vertical"`` (the panel).
        method: ``"fedpc"``, ``"fedavg"`` or ``"splitnn"``.
        label: the x-axis group, e.g. ``"breast-cancer (ours)"``.
        measured_bytes: from the ledger.
        formula_bytes: the closed form for the same configuration, or ``None``.
    """

    setting: str
    method: str
    label: str
    measured_bytes: int
    formula_bytes: int | None = None


_COLORS = {"fedpc": "tab:green", "fedavg": "tab:red", "splitnn": "tab:purple"}
_NAMES = {"fedpc": "FedPC (one-pass)", "fedavg": "FedAvg", "splitnn": "SplitNN"}


def _human(n: float) -> str:
    for unit, f in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= f:
            return f"{n / f:g}{unit}"
    return f"{n:g}"


def plot_appendix_d(path: str | Path, sc: Scenario = PAPER,
                    measured: Sequence[MeasuredPoint] = (), measured_note: str | None = None) -> Path:
    """Redraw appendix D's Fig. 5 from the closed forms (log-scale MB), measured points on top.

    Two panels (horizontal: FedPC vs FedAvg; vertical: FedPC vs SplitNN), one bar group per
    (samples, parameters); a measured point adds a group of its own where a cross marks the
    measured bytes over the bar of its closed form. The title states the closed forms' scenario;
    ``measured_note`` (e.g. the measured runs' rounds and epochs) adds a second title line. The
    legend sits below the panels, clear of the bars. Written atomically as PNG.

    Returns:
        ``path``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mpifc.atomic import atomic_write_bytes

    costs = scenario_costs(sc)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    panels = (("horizontal", ("fedpc", "fedavg"), ("fedpc_h", "fedavg")),
              ("vertical", ("fedpc", "splitnn"), ("fedpc_v", "splitnn")))
    for ax, (setting, methods, keys) in zip(axes, panels):
        labels = [f"S={_human(c['samples'])}\nM={_human(c['params'])}" for c in costs]
        bars = {meth: [c[key] / MB for c in costs] for meth, key in zip(methods, keys)}
        marks: dict[str, list[float | None]] = {meth: [None] * len(costs) for meth in methods}
        for p in (q for q in measured if q.setting == setting):
            if p.label not in labels:
                labels.append(p.label)
                for meth in methods:
                    bars[meth].append(0.0)
                    marks[meth].append(None)
            i = labels.index(p.label)
            if p.method in bars:
                bars[p.method][i] = (p.formula_bytes or 0) / MB
                marks[p.method][i] = p.measured_bytes / MB
        width = 0.38
        marked = False
        for j, meth in enumerate(methods):
            xs = [i + (j - 0.5) * width for i in range(len(labels))]
            ax.bar(xs, [b if b > 0 else float("nan") for b in bars[meth]], width,
                   color=_COLORS[meth], label=f"{_NAMES[meth]} (closed form)")
            pts = [(x, v) for x, v in zip(xs, marks[meth]) if v is not None]
            if pts:
                ax.scatter([x for x, _ in pts], [v for _, v in pts], marker="x", s=70, color="black",
                           zorder=3, label=None if marked else "measured (ledger)")
                marked = True
        ax.set_yscale("log")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylabel("training traffic [MB]")
        ax.set_title(f"{setting} FL")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=3, frameon=False)
        ax.grid(axis="y", which="major", alpha=0.3)
    dirs = "down+up" if sc.directions == 2 else "one direction"
    title = (f"closed forms (paper-sized): |C|={sc.n_clients}, FedAvg K={sc.rounds} rounds, SplitNN E={sc.epochs} "
             f"epochs F={sc.cut}, FedPC K={sc.clusters} clusters P={sc.products}; {sc.itemsize} B/scalar, {dirs}")
    if measured_note:
        title += "\n" + measured_note
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


__all__ = ["COUNT_FIELDS", "FLOAT32", "INT64", "MB", "PAPER", "Scenario", "MeasuredPoint", "claim_rows",
           "clients_per_round", "fedpc_sent_bytes", "model_array_bytes",
           "fedavg_bytes", "fedavg_messages", "fedpc_horizontal_bytes", "fedpc_vertical_bytes",
           "fedpc_hybrid_bytes", "n_batches", "plot_appendix_d", "scenario_costs", "splitnn_bytes",
           "splitnn_messages", "sampled_em_bytes", "vertical_condition", "with_headers"]
