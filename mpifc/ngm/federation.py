"""FedNGM's master-side logic, without MPI: global distillation, stitching, the release rule.

* Global model (paper eqs. 2-3): the master draws samples from every client NGM (equal counts,
  or proportional to the clients' data sizes) and trains one NGM on them under the consensus
  graph, optionally with an extra fit term on public data. Its size does not depend on the
  number of clients.
* Stitching (section 2.4): a client extends the global NGM with its own extra features: new
  input/output units and extra hidden units per layer. The global weights stay frozen
  (bit-identical); only the new weights train, on the client's data, and the graph penalty
  counts only paths that use a new weight.
* Release rule (section 2.6): the global graph and model go to clients only when at least
  ``min_clients`` clients contributed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from mpifc.errors import UserError
from mpifc.ngm.graph import DependencyGraph
from mpifc.ngm.model import NGM, BlockLinear, NGMNet, penalty_mask
from mpifc.ngm.sampling import sample
from mpifc.ngm.schema import Schema
from mpifc.ngm.training import TrainConfig, train


# ---- release rule -----------------------------------------------------------------------------
class ReleaseRefused(UserError):
    """The master refuses to release a global graph or model: too few clients contributed."""


@dataclass(frozen=True)
class ReleaseRule:
    """Release only what at least ``min_clients`` distinct clients contributed to."""

    min_clients: int = 1

    def __post_init__(self) -> None:
        if int(self.min_clients) < 1:
            raise UserError(f"--min-clients must be >= 1, got {self.min_clients}")

    def check(self, contributors: Sequence[str], what: str = "global model") -> None:
        """Raise :class:`ReleaseRefused` unless enough distinct clients contributed.

        Args:
            contributors: ids of the clients whose graph/model went into ``what``.
            what: named in the refusal message.
        """
        got = len(set(contributors))
        if got < self.min_clients:
            raise ReleaseRefused(
                f"refusing to release the {what}: only {got} client(s) contributed "
                f"({sorted(map(str, set(contributors)))}), the release rule needs at least "
                f"{self.min_clients} (--min-clients)")


# ---- global model -----------------------------------------------------------------------------
def sample_counts(sizes: Sequence[int], total: int, proportional: bool = False) -> list[int]:
    """How many samples to draw from each client model; the counts add up to ``total``.

    Args:
        sizes: client data sizes (only used when ``proportional``).
        total: total number of samples.
        proportional: counts proportional to ``sizes`` (largest remainder), else equal.
    """
    c = len(sizes)
    if c == 0:
        raise UserError("global NGM: no client models")
    if total < c:
        raise UserError(f"global NGM: need at least one sample per client, got {total} for {c} clients")
    if proportional:
        s = np.asarray(sizes, dtype=np.float64)
        if (s <= 0).any():
            bad = int(np.flatnonzero(s <= 0)[0])
            raise UserError(f"global NGM: client {bad} reports data size {sizes[bad]}; sizes must be > 0")
        share = total * s / s.sum()
    else:
        share = np.full(c, total / c)
    counts = np.floor(share).astype(np.int64)
    rest = total - counts.sum()
    counts[np.argsort(-(share - counts), kind="stable")[:rest]] += 1
    return [int(k) for k in counts]


def distill_global(client_models: Sequence[NGM], graph: DependencyGraph, total_samples: int,
                   proportional: bool = False, public: np.ndarray | None = None,
                   hidden: Sequence[int] = (32, 32), activation: str = "elu",
                   config: TrainConfig = TrainConfig(), rng: np.random.Generator | None = None
                   ) -> tuple[NGM, list[int]]:
    """Train the global NGM on samples of the client NGMs (eq. 2; eq. 3 with ``public``).

    Args:
        client_models: one trained NGM per client, all over the consensus features.
        graph: the consensus graph (the constraint of eq. 2).
        total_samples: samples drawn in all.
        proportional: draw in proportion to each client's ``n_train`` instead of equally.
        public: optional ``(m, d)`` public data in the consensus column order.
        hidden, activation, config: the global NGM's architecture and training.
        rng: randomness of the sampling (default: seeded from ``config.seed``).

    Returns:
        ``(global_model, counts)``, counts = samples drawn per client.
    """
    if not client_models:
        raise UserError("global NGM: no client models")
    schema = client_models[0].schema
    for i, m in enumerate(client_models):
        if m.schema != schema:
            raise UserError(f"global NGM: client {i} models features {list(m.schema.names)}, "
                            f"expected the consensus features {list(schema.names)}")
    rng = rng if rng is not None else np.random.default_rng(config.seed)
    counts = sample_counts([m.n_train for m in client_models], total_samples, proportional)
    xs = np.concatenate([sample(m, k, rng) for m, k in zip(client_models, counts)])
    model = NGM.create(schema, graph, hidden, activation, seed=config.seed)
    train(model, xs, config, public=public)
    return model, counts


# ---- stitching --------------------------------------------------------------------------------
def stitched_graph(global_graph: DependencyGraph, client_graph: DependencyGraph,
                   names: Sequence[str]) -> DependencyGraph:
    """Consensus edges among the global features plus the client's edges touching new ones."""
    old = set(global_graph.names)
    missing = [n for n in names if n not in old and n not in client_graph.names]
    if missing:
        raise UserError(f"stitching: the client graph lacks the features {missing}")
    idx = {n: i for i, n in enumerate(names)}
    a = np.zeros((len(names), len(names)), dtype=bool)
    g_old = global_graph.restrict([n for n in names if n in old])
    for e in g_old.edges():
        u, v = tuple(e)
        a[idx[u], idx[v]] = a[idx[v], idx[u]] = True
    for e in client_graph.edges():
        u, v = tuple(e)
        if (u not in old or v not in old) and u in idx and v in idx:
            a[idx[u], idx[v]] = a[idx[v], idx[u]] = True
    return DependencyGraph(tuple(names), a)


def stitch(global_model: NGM, client_schema: Schema, client_graph: DependencyGraph,
           extra_hidden: int | Sequence[int] = 8, seed: int = 0) -> NGM:
    """Extend ``global_model`` with the client's features that it lacks.

    The stitched model's columns are the global features followed by the client's extra ones
    (in the client's order); :func:`to_stitched_columns` reorders a client data matrix.

    Args:
        global_model: the released global NGM.
        client_schema: every feature of the client (must include the global ones).
        client_graph: the client's own dependency graph (edges touching new features are used).
        extra_hidden: new hidden units per hidden layer (an int for all layers, or one per layer).
        seed: initialisation of the new weights.

    Returns:
        An NGM whose layers hold the global weights as frozen blocks.
    """
    gs = global_model.schema
    for f in gs.features:
        if f.name not in client_schema.names:
            raise UserError(f"stitching: the client lacks the global feature {f.name!r}")
        cf = client_schema[f.name]
        if cf.kind != f.kind or cf.n_categories > f.n_categories:
            raise UserError(f"stitching: feature {f.name!r} is {cf.kind}/{cf.n_categories} at the client "
                            f"but {f.kind}/{f.n_categories} in the global model")
    extra = Schema(tuple(f for f in client_schema.features if f.name not in gs.names))
    schema = gs.concat(extra)
    n_hidden = len(global_model.hidden)
    eh = [int(extra_hidden)] * n_hidden if isinstance(extra_hidden, int) else [int(e) for e in extra_hidden]
    if len(eh) != n_hidden or min(eh) < 0:
        raise UserError(f"stitching: extra_hidden needs {n_hidden} non-negative widths, got {extra_hidden}")
    new_sizes = [extra.n_units, *eh, extra.n_units]
    g = torch.Generator().manual_seed(int(seed))
    layers = []
    with torch.no_grad():
        for k, old in enumerate(global_model.net.layers):
            layers.append(BlockLinear(old.weight, old.bias, new_sizes[k], new_sizes[k + 1], g))
    graph = stitched_graph(global_model.graph, client_graph, schema.names)
    mean = np.concatenate([global_model.mean, np.zeros(extra.n_features)])
    std = np.concatenate([global_model.std, np.ones(extra.n_features)])
    return NGM(schema, graph, NGMNet(layers, global_model.activation),
               tuple(h + e for h, e in zip(global_model.hidden, eh)), global_model.activation,
               mean, std, list(global_model.marginals) + [np.zeros(0)] * extra.n_features,
               None, global_model.n_train)


def to_stitched_columns(x: np.ndarray, client_schema: Schema, stitched: NGM) -> np.ndarray:
    """Reorder a client's ``(n, d_client)`` data into the stitched model's column order."""
    idx = [client_schema.index(n) for n in stitched.schema.names]
    return np.asarray(x, dtype=np.float64)[:, idx]


def _frozen_path_norm(model: NGM) -> float:
    """Path norm of the paths that use only frozen weights (a constant during stitching)."""
    with torch.no_grad():
        p = None
        for layer in model.net.layers:
            w = layer.frozen_w.abs()
            p = w if p is None else w @ p
        n_old = p.shape[0]
        return float((p * penalty_mask(model.schema, model.graph)[:n_old, :n_old]).sum())


def train_stitched(model: NGM, x: np.ndarray, config: TrainConfig = TrainConfig()) -> list[float]:
    """Retrain a stitched NGM on the client's data ``x`` (stitched column order, eq. 1).

    Only the new weights move; the penalty is the path norm minus its frozen-only part, i.e. it
    counts just the paths that use at least one new weight. The global features keep the
    global standardisation, which the frozen weights were trained with.
    """
    old_units = model.net.layers[0].frozen_w.shape[1]
    old_features = int(np.searchsorted(np.cumsum([f.width for f in model.schema.features]), old_units, side="right"))
    x = model.schema.validate(x, what="stitching data")
    mean_old, std_old = model.mean[:old_features].copy(), model.std[:old_features].copy()
    model.set_statistics(x)
    model.mean[:old_features], model.std[:old_features] = mean_old, std_old
    const = _frozen_path_norm(model)
    return train(model, x, config, penalty=lambda: model.path_norm() - const, set_statistics=False)
