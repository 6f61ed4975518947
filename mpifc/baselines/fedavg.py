"""FedAvg (McMahan et al., 2017) with an MLP classifier for horizontal FL, on mpifc's runtime.

Rank 0 is the server, ranks ``1..|C|`` the clients in manifest order (extra ranks idle). Phases
as named in the ledger:

* ``declare``: each client sends its feature names and row count ``n_k`` (once: the averaging
  weights do not change between rounds).
* ``train``: K rounds. Every rank draws the same sampled client set from ``(seed, round)``, so no
  control message is needed. The server sends the global parameters (one flat ``(M,)`` array)
  to each sampled client, which runs E local epochs of plain SGD and sends its parameters back;
  the server averages them weighted by ``n_k``.
* evaluation happens on the server, which holds the held-out test set as the querier: no bytes.

Model bytes on the wire are therefore exactly ``2 * K * |C_sampled| * M * itemsize``.

Run: ``mpiexec -n R mpifc baseline fedavg DIR --rounds K --local-epochs E --json``.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from mpifc.errors import UserError

DEFAULT_HIDDEN = (64, 32)


@dataclass
class FedAvgConfig:
    """Settings of one FedAvg run.

    Attributes:
        dir: shard directory.
        rounds: K, communication rounds.
        local_epochs: E, local passes per round.
        fraction: share of clients sampled per round (at least one is).
        batch_size: rows per local SGD step, 0 = full batch.
        lr: SGD step size.
        hidden: hidden layer widths of the MLP.
        seed: initialisation, shuffling and client-sampling seed.
        dtype: ``"float32"`` or ``"float64"``: parameters travel in it.
        deadline: the job's wall-clock limit in seconds, or None for none.
        save_params: rank 0 writes the final global parameters ``(M,)`` here (``.npy``).
        device: ``--device`` of every rank (auto, cpu, cuda, cuda:N): where its MLP trains;
            parameters travel as CPU arrays of ``dtype`` whatever the device. None: the command
            line's default (auto, or ``$MPIFC_DEVICE``).
    """

    dir: str
    rounds: int = 20
    local_epochs: int = 1
    fraction: float = 1.0
    batch_size: int = 32
    lr: float = 0.1
    hidden: tuple[int, ...] = field(default_factory=lambda: DEFAULT_HIDDEN)
    seed: int = 0
    dtype: str = "float32"
    deadline: float | None = None
    save_params: str | None = None
    device: str | None = None

    def check(self) -> None:
        """UserError naming the first bad field."""
        if self.rounds < 1:
            raise UserError(f"--rounds must be >= 1, got {self.rounds}")
        if self.local_epochs < 1:
            raise UserError(f"--local-epochs must be >= 1, got {self.local_epochs}")
        if not 0.0 < self.fraction <= 1.0:
            raise UserError(f"--fraction must be in (0, 1], got {self.fraction}")
        if not self.lr > 0:
            raise UserError(f"--lr must be > 0, got {self.lr}")


    def to_argv(self) -> list[str]:
        """Arguments of ``mpifc baseline fedavg`` for these settings (for launchers)."""
        argv = [self.dir, "--rounds", str(self.rounds), "--local-epochs", str(self.local_epochs),
                "--fraction", repr(self.fraction), "--batch-size", str(self.batch_size), "--lr", repr(self.lr),
                "--hidden", ",".join(map(str, self.hidden)), "--seed", str(self.seed), "--dtype", self.dtype]
        if self.deadline is not None:
            argv += ["--deadline", repr(self.deadline)]
        argv += ["--device", self.device] if self.device else []
        return argv + (["--save-params", self.save_params] if self.save_params else [])


def sampled_clients(n_clients: int, fraction: float, seed: int, round_index: int) -> list[int]:
    """Client indices taking part in a round: ``max(1, round(fraction * |C|))`` of them, drawn
    from ``(seed, round)`` alone so every rank agrees without a message."""
    m = max(1, int(round(fraction * n_clients)))
    if m >= n_clients:
        return list(range(n_clients))
    rng = np.random.default_rng([seed, round_index])
    return sorted(rng.choice(n_clients, size=m, replace=False).tolist())


def shuffle_generator(seed: int, party: int) -> Any:
    """The torch generator that shuffles party ``party``'s minibatches (one per party per run)."""
    import torch

    return torch.Generator().manual_seed(seed * 1_000_003 + party)


def weighted_average(params: list[np.ndarray], counts: list[int], dtype: np.dtype) -> np.ndarray:
    """``sum_k n_k theta_k / sum_k n_k`` accumulated in float64, returned as ``dtype``.

    Args:
        params: ``|C|`` arrays ``(M,)``; counts: ``n_k`` per array.
    """
    total = float(sum(counts))
    acc = np.zeros(params[0].shape, dtype=np.float64)
    for p, n in zip(params, counts):
        acc += p.astype(np.float64) * n
    return (acc / total).astype(dtype)


def client_ranks(n_clients: int) -> dict[int, int]:
    """Client index -> rank (server at rank 0)."""
    return {c: c + 1 for c in range(n_clients)}


def fedavg_rank(ctx: Any, cfg: FedAvgConfig) -> dict[str, Any] | None:
    """This rank's part of a FedAvg run; returns the result dict on rank 0, else ``None``."""
    from data_prep.shards import load_manifest
    from mpifc.baselines import protocol as P
    from mpifc.baselines.data import client_xy, n_classes, scores, test_xy

    cfg.check()
    m = load_manifest(cfg.dir)
    k = n_classes(m)
    ranks = client_ranks(m.n_clients)
    index_of = {r: c for c, r in ranks.items()}
    t = ctx.transport

    if ctx.rank in index_of:
        c = index_of[ctx.rank]
        ctx.ledger.set_phase("declare")
        data = client_xy(m, c, "train")
        if data.y is None:
            raise UserError(f"{cfg.dir}: client {c} (rank {ctx.rank}) holds no target column; "
                            "FedAvg needs labels on every client (horizontal FL)")
        t.send_obj({"client": c, "features": data.features, "n": int(len(data.y))}, 0, P.FEDAVG_DECLARE)
        # torch is imported only now: a run refused on its declarations fails in a second, not ten
        import torch

        from mpifc.baselines.mlp import get_flat, limit_threads, make_mlp, on_device, set_flat, sgd_epochs, torch_dtype

        limit_threads(ctx.local_size)
        tdtype = torch_dtype(cfg.dtype)
        dev = ctx.device
        x = on_device(torch.from_numpy(np.nan_to_num(data.x)).to(tdtype), dev)
        y = on_device(torch.from_numpy(data.y), dev)
        model = on_device(make_mlp(x.shape[1], cfg.hidden, k, cfg.seed, tdtype), dev)
        gen = shuffle_generator(cfg.seed, c)
        ctx.ledger.set_phase("train")
        for r in range(cfg.rounds):
            if c not in sampled_clients(m.n_clients, cfg.fraction, cfg.seed, r):
                continue
            set_flat(model, t.recv(0, P.FEDAVG_GLOBAL))
            sgd_epochs(model, x, y, cfg.local_epochs, cfg.batch_size, cfg.lr, gen)
            t.send(get_flat(model), 0, P.FEDAVG_LOCAL)
        return None
    if ctx.rank != 0:
        return None

    t0 = time.perf_counter()
    ctx.ledger.set_phase("declare")
    decl = [t.recv_obj(ranks[c], P.FEDAVG_DECLARE) for c in range(m.n_clients)]
    features = decl[0]["features"]
    for c, d in enumerate(decl):
        if d["features"] != features:
            raise UserError(f"client {c} (rank {ranks[c]}) holds features {d['features'][:5]}..., client 0 "
                            f"{features[:5]}...: FedAvg needs every client to hold the same features")
        if d["n"] < 1:
            raise UserError(f"client {c} (rank {ranks[c]}) has no training rows")
    counts = [int(d["n"]) for d in decl]
    import torch

    from mpifc.baselines.mlp import (get_flat, limit_threads, make_mlp, n_parameters, on_device, predict, set_flat,
                                     torch_dtype)

    limit_threads(ctx.local_size)
    tdtype = torch_dtype(cfg.dtype)
    dev = ctx.device
    model = on_device(make_mlp(len(features), cfg.hidden, k, cfg.seed, tdtype), dev)
    theta = get_flat(model)
    ctx.ledger.set_phase("train")
    for r in range(cfg.rounds):
        chosen = sampled_clients(m.n_clients, cfg.fraction, cfg.seed, r)
        for c in chosen:
            t.send(theta, ranks[c], P.FEDAVG_GLOBAL)
        local = [t.recv(ranks[c], P.FEDAVG_LOCAL) for c in chosen]
        theta = weighted_average(local, [counts[c] for c in chosen], theta.dtype)
    train_seconds = time.perf_counter() - t0
    if cfg.save_params:
        from mpifc.baselines.report import save_array

        save_array(ctx.stage(cfg.save_params), theta)  # in place only if the job succeeds
    set_flat(model, theta)
    test = test_xy(m)
    cols = [test.features.index(f) for f in features]
    y_pred = predict(model, on_device(torch.from_numpy(np.nan_to_num(test.x[:, cols])).to(tdtype), dev))
    return {"method": "fedavg", "dataset": m.dataset, "setting": m.setting, "n_clients": m.n_clients,
            **scores(test.y, y_pred), "rounds": cfg.rounds, "local_epochs": cfg.local_epochs,
            "fraction": cfg.fraction, "clients_per_round": len(sampled_clients(m.n_clients, cfg.fraction, cfg.seed, 0)),
            "n_parameters": n_parameters(model), "itemsize": int(theta.dtype.itemsize),
            "n_train": counts, "n_test": int(len(test.y)), "seed": cfg.seed,
            "wall_seconds": train_seconds, "config": {**asdict(cfg), "hidden": list(cfg.hidden)}}


def run(cfg: FedAvgConfig, ledger_csv: str | None = None, as_json: bool = False,
        on_result: Any = None, overwrite: bool = False) -> int:
    """Run FedAvg as the current MPI job (every rank calls this); returns the exit code.

    Rank 0 prints the result (with bytes and messages from the gathered ledger) and passes it to
    ``on_result(result)`` if given.
    """
    from mpifc.baselines.report import PARAMS_FILE, run_baseline_job

    cfg.check()
    return run_baseline_job(fedavg_rank, cfg, ledger_csv, as_json, on_result, PARAMS_FILE, overwrite)
