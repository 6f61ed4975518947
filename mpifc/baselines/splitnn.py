"""SplitNN (Vepakomma et al., 2018) with MLPs for vertical FL, on mpifc's runtime.

Every client runs a bottom MLP on its own features that ends in an F-wide cut layer (ReLU). The
server (rank 0) holds the top MLP over the concatenated cut layers of all clients, in client
order. The labels stay on the label owner (the client whose shard holds the target column): the
server sends it the logits of each batch and gets back the gradient of the mean cross-entropy
w.r.t. them, so no raw value, label included, leaves a client.

Per batch of B rows (phase ``train``)::

    client c  -> server       splitnn.activation  (B, F)   cut-layer activations
    server    -> label owner  splitnn.logits      (B, k)
    label own -> server       splitnn.logit_grad  (B, k)   d loss / d logits
    server    -> client c     splitnn.gradient    (B, F)   d loss / d activations of c

so one epoch over S rows moves exactly ``S * (2 * |C| * F + 2 * k) * itemsize`` payload bytes.
Every party shuffles with the same generator, so batches agree without a message. Rows are
aligned by sample id: each client sorts its rows by id and the server checks that every client
declared the same ids digest.

Evaluation (phase ``evaluate``) is one forward pass over the test rows the same way; the label
owner scores the logits and returns accuracy and F1.

Run: ``mpiexec -n R mpifc baseline splitnn DIR --epochs E --cut F --json``.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from mpifc.errors import UserError

DEFAULT_BOTTOM = (32,)
DEFAULT_TOP = (32,)


@dataclass
class SplitNNConfig:
    """Settings of one SplitNN run.

    Attributes:
        dir: shard directory (vertically partitioned).
        epochs: E, passes over the aligned training rows.
        cut: F, width of each client's cut layer.
        batch_size: rows per step, 0 = full batch.
        lr: SGD step size (every party uses it).
        bottom_hidden, top_hidden: hidden widths of the bottom and top MLPs.
        seed: initialisation and shuffling seed.
        dtype: ``"float32"`` or ``"float64"``: activations and gradients travel in it.
        deadline: the job's wall-clock limit in seconds, or None for none.
        save_params: directory where each rank writes its final parameters (``top.npy``,
            ``bottom-<c>.npy``); local files only, nothing extra is sent.
        device: ``--device`` of every rank (auto, cpu, cuda, cuda:N): where its MLP computes;
            activations and gradients travel as CPU arrays of ``dtype`` whatever the device.
            None: the command line's default (auto, or ``$MPIFC_DEVICE``).
    """

    dir: str
    epochs: int = 10
    cut: int = 8
    batch_size: int = 32
    lr: float = 0.1
    bottom_hidden: tuple[int, ...] = field(default_factory=lambda: DEFAULT_BOTTOM)
    top_hidden: tuple[int, ...] = field(default_factory=lambda: DEFAULT_TOP)
    seed: int = 0
    dtype: str = "float32"
    deadline: float | None = None
    save_params: str | None = None
    device: str | None = None

    def check(self) -> None:
        """UserError naming the first bad field."""
        if self.epochs < 1:
            raise UserError(f"--epochs must be >= 1, got {self.epochs}")
        if self.cut < 1:
            raise UserError(f"--cut must be >= 1, got {self.cut}")
        if not self.lr > 0:
            raise UserError(f"--lr must be > 0, got {self.lr}")


    def to_argv(self) -> list[str]:
        """Arguments of ``mpifc baseline splitnn`` for these settings (for launchers)."""
        argv = [self.dir, "--epochs", str(self.epochs), "--cut", str(self.cut), "--batch-size", str(self.batch_size),
                "--lr", repr(self.lr), "--bottom-hidden", ",".join(map(str, self.bottom_hidden)),
                "--top-hidden", ",".join(map(str, self.top_hidden)), "--seed", str(self.seed),
                "--dtype", self.dtype]
        if self.deadline is not None:
            argv += ["--deadline", repr(self.deadline)]
        argv += ["--device", self.device] if self.device else []
        return argv + (["--save-params", self.save_params] if self.save_params else [])


def bottom_seed(seed: int, client: int) -> int:
    """Initialisation seed of client ``client``'s bottom MLP."""
    return seed * 1000 + 1 + client


def top_seed(seed: int) -> int:
    """Initialisation seed of the top MLP."""
    return seed * 1000


def batch_generator(seed: int) -> Any:
    """The shuffling generator every party of a run holds an identical copy of."""
    import torch

    return torch.Generator().manual_seed(seed * 1_000_003 + 7)


def ids_digest(ids: np.ndarray) -> str:
    """SHA-256 of the sorted int64 ids: equal digests mean aligned rows, without sending ids."""
    return hashlib.sha256(np.sort(ids).astype("<i8").tobytes()).hexdigest()


def sgd_step(module: Any, lr: float) -> None:
    """One plain SGD step on every parameter that received a gradient, then clear them."""
    import torch

    with torch.no_grad():
        for p in module.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)
                p.grad = None


class SplitNetwork:
    """The centralized twin: every bottom MLP and the top MLP in one process.

    Built from the same seeds as a distributed run, so trained with :meth:`train` on the joined
    columns it must end with the same parameters as SplitNN over MPI (the protocol test).

    Args:
        widths: ``d_c`` input columns per client, in client order.
        n_classes: k; other arguments as in :class:`SplitNNConfig`.
    """

    def __init__(self, widths: list[int], n_classes: int, cut: int, bottom_hidden: tuple[int, ...],
                 top_hidden: tuple[int, ...], seed: int, dtype: Any) -> None:
        from mpifc.baselines.mlp import make_mlp

        self.widths = list(widths)
        self.bottoms = [make_mlp(d, bottom_hidden, cut, bottom_seed(seed, c), dtype, out_activation=True)
                        for c, d in enumerate(widths)]
        self.top = make_mlp(cut * len(widths), top_hidden, n_classes, top_seed(seed), dtype)

    def forward(self, xs: list[Any]) -> Any:
        """Logits ``(n, k)`` from per-client column blocks ``xs[c]`` of shape ``(n, d_c)``."""
        import torch

        return self.top(torch.cat([b(x) for b, x in zip(self.bottoms, xs)], dim=1))

    def train(self, xs: list[Any], y: Any, epochs: int, batch_size: int, lr: float, seed: int) -> None:
        """Plain SGD on mean cross-entropy, batches drawn exactly as a distributed run draws them."""
        from torch import nn

        from mpifc.baselines.mlp import batch_indices

        gen = batch_generator(seed)
        loss_fn = nn.CrossEntropyLoss()
        for _ in range(epochs):
            for idx in batch_indices(len(y), batch_size, gen):
                loss = loss_fn(self.forward([x[idx] for x in xs]), y[idx])
                loss.backward()
                for m in (*self.bottoms, self.top):
                    sgd_step(m, lr)


def _client(ctx: Any, cfg: SplitNNConfig, manifest: Any, c: int) -> None:
    from mpifc.baselines import protocol as P
    from mpifc.baselines.data import client_xy, scores

    t = ctx.transport
    ctx.ledger.set_phase("declare")
    train, test = client_xy(manifest, c, "train"), client_xy(manifest, c, "test")
    t.send_obj({"client": c, "n_features": len(train.features), "n_train": len(train.ids),
                "n_test": len(test.ids), "train_digest": ids_digest(train.ids),
                "test_digest": ids_digest(test.ids), "has_label": train.y is not None}, 0, P.SPLIT_DECLARE)
    plan = t.recv_obj(0, P.SPLIT_PLAN)
    is_owner = plan["label_owner"] == c
    if not train.features:
        raise UserError(f"client {c} (rank {ctx.rank}) holds no feature besides the target")
    # torch is imported only once the server accepted the declarations (refusals stay fast)
    import torch
    from torch import nn

    from mpifc.baselines.mlp import batch_indices, get_flat, limit_threads, make_mlp, on_device, torch_dtype

    limit_threads(ctx.local_size)
    tdtype = torch_dtype(cfg.dtype)
    dev = ctx.device
    bottom = on_device(make_mlp(len(train.features), cfg.bottom_hidden, cfg.cut, bottom_seed(cfg.seed, c), tdtype,
                                out_activation=True), dev)
    x = on_device(torch.from_numpy(np.nan_to_num(train.x)).to(tdtype), dev)
    y = on_device(torch.from_numpy(train.y), dev) if is_owner else None
    loss_fn = nn.CrossEntropyLoss()
    gen = batch_generator(cfg.seed)
    ctx.ledger.set_phase("train")
    for _ in range(cfg.epochs):
        for idx in batch_indices(len(x), cfg.batch_size, gen):
            idx = idx.to(x.device)  # drawn on the CPU: the same batches on every device
            act = bottom(x[idx])
            t.send(act.detach(), 0, P.SPLIT_ACT)  # CPU arrays on the wire, whatever the device
            if is_owner:
                logits = on_device(t.recv_tensor(0, P.SPLIT_LOGITS), dev).requires_grad_(True)
                loss_fn(logits, y[idx]).backward()
                t.send(logits.grad, 0, P.SPLIT_LOGIT_GRAD)
            act.backward(on_device(t.recv_tensor(0, P.SPLIT_GRAD), dev))
            sgd_step(bottom, cfg.lr)
    ctx.ledger.set_phase("evaluate")
    with torch.no_grad():
        t.send(bottom(on_device(torch.from_numpy(np.nan_to_num(test.x)).to(tdtype), dev)), 0, P.SPLIT_ACT)
    if is_owner:
        logits = t.recv(0, P.SPLIT_LOGITS)
        s = scores(test.y, logits.argmax(axis=1))
        t.send(np.array([s["accuracy"], s["f1"]]), 0, P.SPLIT_SCORES)
    if cfg.save_params:
        from mpifc.baselines.report import save_array

        save_array(ctx.stage(f"{cfg.save_params}/bottom-{c}.npy"), get_flat(bottom))


def _server(ctx: Any, cfg: SplitNNConfig, manifest: Any, ranks: dict[int, int]) -> dict[str, Any]:
    from mpifc.baselines import protocol as P
    from mpifc.baselines.data import n_classes

    t = ctx.transport
    k = n_classes(manifest)
    t0 = time.perf_counter()
    ctx.ledger.set_phase("declare")
    decl = [t.recv_obj(ranks[c], P.SPLIT_DECLARE) for c in range(manifest.n_clients)]
    for c, d in enumerate(decl):
        for part in ("train", "test"):
            if d[f"{part}_digest"] != decl[0][f"{part}_digest"]:
                raise UserError(f"client {c} (rank {ranks[c]}) holds other {part} sample ids than client 0: "
                                "SplitNN needs vertically partitioned data (every client the same rows)")
    owners = [c for c, d in enumerate(decl) if d["has_label"]]
    if not owners:
        raise UserError(f"{cfg.dir}: no client holds the target column {manifest.target!r}")
    owner = owners[0]  # with label_owner "all", one owner suffices; the others' labels stay unused
    for c in range(manifest.n_clients):
        t.send_obj({"label_owner": owner}, ranks[c], P.SPLIT_PLAN)
    n, n_test = int(decl[0]["n_train"]), int(decl[0]["n_test"])
    import torch

    from mpifc.baselines.mlp import batch_indices, get_flat, limit_threads, make_mlp, n_parameters, on_device, \
        torch_dtype

    limit_threads(ctx.local_size)
    tdtype = torch_dtype(cfg.dtype)
    dev = ctx.device
    top = on_device(make_mlp(cfg.cut * manifest.n_clients, cfg.top_hidden, k, top_seed(cfg.seed), tdtype), dev)
    gen = batch_generator(cfg.seed)
    n_batches = 0
    ctx.ledger.set_phase("train")
    for _ in range(cfg.epochs):
        for idx in batch_indices(n, cfg.batch_size, gen):
            acts = [on_device(t.recv_tensor(ranks[c], P.SPLIT_ACT), dev).requires_grad_(True)
                    for c in range(manifest.n_clients)]
            logits = top(torch.cat(acts, dim=1))
            t.send(logits.detach(), ranks[owner], P.SPLIT_LOGITS)
            logits.backward(on_device(t.recv_tensor(ranks[owner], P.SPLIT_LOGIT_GRAD), dev))
            for c, a in enumerate(acts):
                t.send(a.grad, ranks[c], P.SPLIT_GRAD)
            sgd_step(top, cfg.lr)
            n_batches += 1
    train_seconds = time.perf_counter() - t0
    ctx.ledger.set_phase("evaluate")
    with torch.no_grad():
        acts = [on_device(t.recv_tensor(ranks[c], P.SPLIT_ACT), dev) for c in range(manifest.n_clients)]
        t.send(top(torch.cat(acts, dim=1)), ranks[owner], P.SPLIT_LOGITS)
    acc, f1 = t.recv(ranks[owner], P.SPLIT_SCORES).tolist()
    if cfg.save_params:
        from mpifc.baselines.report import save_array

        save_array(ctx.stage(f"{cfg.save_params}/top.npy"), get_flat(top))
    return {"method": "splitnn", "dataset": manifest.dataset, "setting": manifest.setting,
            "n_clients": manifest.n_clients, "accuracy": acc, "f1": f1, "epochs": cfg.epochs,
            "cut": cfg.cut, "n_classes": k, "n_train": n, "n_test": n_test, "n_batches": n_batches,
            "label_owner": owner, "itemsize": int(torch.empty(0, dtype=tdtype).element_size()),
            "n_parameters_top": n_parameters(top), "seed": cfg.seed, "wall_seconds": train_seconds,
            "config": {**asdict(cfg), "bottom_hidden": list(cfg.bottom_hidden), "top_hidden": list(cfg.top_hidden)}}


def splitnn_rank(ctx: Any, cfg: SplitNNConfig) -> dict[str, Any] | None:
    """This rank's part of a SplitNN run; returns the result dict on rank 0, else ``None``."""
    from data_prep.shards import load_manifest
    from mpifc.baselines.fedavg import client_ranks

    cfg.check()
    m = load_manifest(cfg.dir)
    ranks = client_ranks(m.n_clients)
    index_of = {r: c for c, r in ranks.items()}
    if ctx.rank in index_of:
        _client(ctx, cfg, m, index_of[ctx.rank])
        return None
    if ctx.rank == 0:
        return _server(ctx, cfg, m, ranks)
    return None


def run(cfg: SplitNNConfig, ledger_csv: str | None = None, as_json: bool = False, on_result: Any = None,
        overwrite: bool = False) -> int:
    """Run SplitNN as the current MPI job (every rank calls this); returns the exit code.

    Rank 0 prints the result with bytes and messages from the gathered ledger and passes it to
    ``on_result(result)`` if given.
    """
    from mpifc.baselines.report import PARAMS_FOLDER, run_baseline_job

    cfg.check()
    return run_baseline_job(splitnn_rank, cfg, ledger_csv, as_json, on_result, PARAMS_FOLDER, overwrite)
