#!/usr/bin/env python
"""GPU check: mpifc's ranks on one GPU, against all CPU cores of the same machine, in one run.

Usage (from the repository root, with the venv's python)::

    python launch/bench/gpu.py --out DIR [--mnist PATH] [--device cuda] [--budget 450]
    python launch/bench/gpu.py --out DIR --device cpu --quick        # the CPU path, well under a minute

Writes ``DIR/gpu.json`` (every figure, and what was shrunk or skipped to keep to the budget) and
``DIR/gpu.txt`` (a short table). Sections, each with its own time budget; the whole run stops by
``--budget`` seconds (default 450: within 8 minutes on one H100/H200 with 16 cores), shrinking
or skipping what is left and saying so:

* ``facts``: torch, CUDA, the device, the CPU, MPI, the load average.
* ``portability``: a small FedPC (breast cancer, 2 clients: an EiNet in float32 and a RAT-SPN,
  pooled EM) trained with ``--device DEV`` and with ``--device cpu``: the two ledgers must be equal
  message for message and byte for byte, and the DEV-trained model must answer the same in a
  process that sees no GPU (``CUDA_VISIBLE_DEVICES=""``) to 1e-5 relative.
* ``einet_mnist``: the FC paper's Table 5 EiNet for MNIST (Poon-Domingos, 8 pieces per axis,
  K = 10, discretised Gaussian leaves over the 256 levels, online EM: batch 64, 5 batches per
  M-step, step 0.1) on the 60,000 training images: one EM epoch on DEV, and on all CPU cores
  for as many batches as the CPU budget allows (rows/s; the epoch extrapolated), the same model
  from the same seed on both. The test log-likelihood of both after the same batches (1,000
  test images), a forward pass on those 1,000 rows on both, the ratios, and the test bits per
  dimension after DEV's full epoch (10,000 test images).
* ``fedpc_mnist``: ``mpifc train --learner einet`` on the same 60,000 rows split at random over
  1, 2, 4 and 8 clients, every client one such EiNet over its pixels (the label joins at the
  root), all client ranks sharing DEV: wall time, test bits per dimension (pixels, label
  marginalised), bytes and peak GPU memory per rank. Table 5 says 5 epochs; fewer when the
  budget needs it (the JSON says how many, and the time 5 would take).
* ``imagenet32_client``: one client EiNet over 3,072 dimensions (32x32x3, PD 8 pieces, Table 5's
  ImageNet32 schedule: batch 64, 10 batches per M-step, step 0.25) on 50,000 rows of ImageNet32
  (``$MPIFC_DATA/imagenet32``) or synthetic ones: K = 40 first (Table 5; if it does not fit,
  the largest K that does), then one full EM epoch of the largest model the budget allows,
  preferring one of about 150M parameters (Table 6's per-client size): rows/s and peak memory.

MNIST is ``--mnist PATH`` (``mnist.pkl.gz`` or the idx files), else ``$MPIFC_DATA/mnist``, else
``../shared/data/mnist`` beside the repository; without any, synthetic digit-like images in the
same format (the JSON says so). ``mpiexec`` is the one beside this Python (the mpich wheel's,
in the venv's or the user's ``bin``), ``$MPIFC_MPIEXEC``, or the first on ``PATH``.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
import os
import pickle
import platform
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# Table 5 of the FC paper (the repository's presets in mpifc.circuit.einet.training.PRESETS)
MNIST_SCHEDULE = {"batch_size": 64, "online_em_frequency": 5, "online_em_stepsize": 0.1, "epochs": 5}
IMAGENET32_SCHEDULE = {"batch_size": 64, "online_em_frequency": 10, "online_em_stepsize": 0.25}
PD_PIECES, MNIST_K, IMAGENET32_K = 8, 10, 40
TABLE6_PARAMS = 152e6  # Table 6: one ImageNet32 client
CLIENTS = (1, 2, 4, 8)
# Share of the whole budget per section, in run order (what one section leaves unused goes on).
SHARES = {"facts": 0.01, "portability": 0.12, "einet_mnist": 0.22, "fedpc_mnist": 0.33, "imagenet32_client": 0.32}


# ------------------------------------------------------------------------------------ plumbing
class Budget:
    """The run's deadline, and each section's slice of what is left."""

    def __init__(self, seconds: float, sections: list[str]) -> None:
        self.t0 = time.monotonic()
        self.end = self.t0 + seconds
        self.sections = [n for n in SHARES if n in sections]

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def section(self, name: str) -> float:
        """Seconds for section ``name``: its share of what is left among the sections still to run."""
        rest = sum(SHARES[n] for n in self.sections[self.sections.index(name):])
        return self.left() * SHARES[name] / rest


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def peak_bytes(device: str) -> int | None:
    if not device.startswith("cuda"):
        return None
    import torch

    return int(torch.cuda.max_memory_allocated(device))


def reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def find_mpiexec() -> str | None:
    """The mpiexec of this Python's MPI: ``$MPIFC_MPIEXEC``, beside the interpreter (venv/bin),
    the user's scripts folder (``pip install --user mpich``), else the first on PATH."""
    cands = [os.environ.get("MPIFC_MPIEXEC"), str(Path(sys.executable).parent / "mpiexec")]
    for scheme in ("posix_user", "nt_user"):
        try:
            cands.append(str(Path(sysconfig.get_path("scripts", scheme)) / "mpiexec"))
        except KeyError:
            continue
    cands.append(shutil.which("mpiexec"))
    return next((c for c in cands if c and Path(c).exists()), None)


def run(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``cmd`` in a process group of its own (a timeout ends mpiexec and every rank): its exit
    code, output, wall seconds, and whether it timed out."""
    from grouprun import run_group  # beside this script

    full = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    done, wall, timed_out = run_group(cmd, max(1.0, timeout), full, REPO, keep_going=True)
    return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr, "wall_s": wall,
            "timed_out": timed_out}


def last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def tail(text: str, n: int = 600) -> str:
    return text.strip()[-n:]


# ------------------------------------------------------------------------------------ data
def synthetic_mnist(path: Path, n_train: int, n_test: int, seed: int = 0) -> Path:
    """A file in ``mnist.pkl.gz``'s format (train, valid, test; levels k/256 as float32) holding
    digit-like images: per class a few bright strokes at class-dependent places, plus noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:28, 0:28]
    centres = rng.uniform(7, 21, size=(10, 3, 2))

    def images(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, 10, n)
        img = np.zeros((n, 28, 28))
        for k in range(3):
            c = centres[y, k] + rng.normal(0, 1.5, (n, 2))
            img += np.exp(-((yy[None] - c[:, 0, None, None]) ** 2 + (xx[None] - c[:, 1, None, None]) ** 2) / 8.0)
        img = np.clip(img * 200 + rng.normal(0, 20, img.shape), 0, 255)
        return (np.rint(img).reshape(n, 784) / 256.0).astype(np.float32), y.astype(np.int64)

    tr = images(n_train)
    parts = ((tr[0][: n_train * 5 // 6], tr[1][: n_train * 5 // 6]), (tr[0][n_train * 5 // 6:], tr[1][n_train * 5 // 6:]),
             images(n_test))
    with gzip.open(path, "wb") as f:
        pickle.dump(parts, f)
    return path


def find_mnist(arg: str | None) -> Path | None:
    roots = [Path(arg)] if arg else []
    if os.environ.get("MPIFC_DATA"):
        roots.append(Path(os.environ["MPIFC_DATA"]) / "mnist")
    roots.append(REPO.parent / "shared" / "data" / "mnist")
    for r in roots:
        if r.is_file() or (r.is_dir() and any(r.iterdir())):
            return r
    return None


def mnist_table(path: Path) -> Any:
    """MNIST as data_prep reads it: ``x`` uint8 levels ``(70000, 784)``, ``own_test`` the last 10,000."""
    from data_prep.datasets import load_dataset

    return load_dataset("mnist", path, path.parent)


def imagenet32_rows(n: int, seed: int = 0) -> tuple[np.ndarray, str]:
    """``n`` ImageNet32 training images as uint8 ``(n, 3072)`` in (row, column, channel) order,
    from ``$MPIFC_DATA/imagenet32`` or ``../shared/data/imagenet32``; else synthetic ones."""
    roots = ([Path(os.environ["MPIFC_DATA"])] if os.environ.get("MPIFC_DATA") else []) + [REPO.parent / "shared" / "data"]
    for root in roots:
        if (root / "imagenet32").is_dir():
            try:
                from data_prep.datasets import load_dataset

                t = load_dataset("imagenet32:1", None, root)
                x = t.x[~t.own_test][:n] if t.own_test is not None else t.x[:n]
                x = x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).reshape(-1, 3072)  # channels last for PD
                if len(x) >= n:
                    return np.ascontiguousarray(x, dtype=np.uint8), f"ImageNet32 ({root / 'imagenet32'})"
            except Exception as e:  # noqa: BLE001 - fall back to synthetic rows, saying why
                return _synthetic_rgb(n, seed), f"synthetic (ImageNet32 unreadable: {type(e).__name__}: {e})"
    return _synthetic_rgb(n, seed), "synthetic (no ImageNet32 under $MPIFC_DATA or ../shared/data)"


def _synthetic_rgb(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (n, 1, 1, 3)).astype(np.int16)
    noise = rng.integers(-40, 41, (n, 32, 32, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8).reshape(n, 3072)


# ------------------------------------------------------------------------------------ EM
class OnlineEM:
    """Online EM over ``x`` (a tensor on the model's device) in the order ``train_em`` uses:
    statistics of ``frequency`` batches summed, then one M-step of ``stepsize``."""

    def __init__(self, model: Any, x: Any, batch: int, frequency: int, stepsize: float, seed: int = 0) -> None:
        import torch

        self.model, self.x = model, x
        self.batch, self.frequency, self.stepsize = batch, frequency, stepsize
        n = x.shape[0]
        order = np.random.default_rng(seed).permutation(n) if batch < n else np.arange(n)
        self.order = torch.as_tensor(order, device=x.device)
        self.n_batches = math.ceil(n / batch)
        self.done = 0
        self.pending, self.count = None, 0

    def step(self) -> None:
        lo = self.done * self.batch
        stats = self.model.em_statistics(self.x[self.order[lo: lo + self.batch]].float())
        self.pending = stats if self.pending is None else self.pending + stats
        self.count += 1
        self.done += 1
        if self.count == self.frequency or self.done == self.n_batches:
            self.model.apply_em(self.pending, self.stepsize)
            self.pending, self.count = None, 0


def mean_ll(model: Any, x: np.ndarray, chunk: int = 2000) -> float:
    return float(np.concatenate([model.log_likelihood(x[i:i + chunk]) for i in range(0, len(x), chunk)]).mean())


# ------------------------------------------------------------------------------------ sections
def facts(device: str) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__,
                           "cuda_runtime": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
                           "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
                           "cpu_cores": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
                           "host": platform.node(), "load_average_1min": load_average(),
                           "mpiexec": find_mpiexec(), "device": device}
    try:
        from mpifc.runtime.device import cpu_facts

        out["cpu"] = cpu_facts()["name"]
        out["ram_bytes"] = cpu_facts()["memory_bytes"]
    except Exception:  # noqa: BLE001
        pass
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(device)
        out["gpu"] = {"name": p.name, "memory_bytes": int(p.total_memory), "capability": f"{p.major}.{p.minor}",
                      "multiprocessors": p.multi_processor_count, "cudnn": torch.backends.cudnn.version(),
                      "tf32_matmul": torch.backends.cuda.matmul.allow_tf32}
    try:
        import mpi4py

        out["mpi4py"] = mpi4py.__version__
        from mpi4py import MPI

        out["mpi_library"] = " ".join(MPI.Get_library_version().split("\n")[0].split())
    except Exception as e:  # noqa: BLE001
        out["mpi4py"] = f"unavailable ({e})"
    return out


def _links(path: Path) -> dict[str, list[list[str]]]:
    with open(path) as f:
        rows = sorted(csv.DictReader(f), key=lambda r: float(r["t_recv"]))
    out: dict[str, list[list[str]]] = {}
    for r in rows:
        out.setdefault(f"{r['src']}->{r['dst']}", []).append(
            [r["kind"], r["phase"], r["payload_bytes"], r["header_bytes"], r["n_mpi_messages"]])
    return out


def portability(device: str, work: Path, seconds: float, quick: bool) -> dict[str, Any]:
    """Same ledger on DEV and on the CPU; a DEV-trained model answers alike without a GPU."""
    from data_prep.prepare import prepare
    from data_prep.shards import write_shards

    t0 = time.monotonic()
    mpiexec = find_mpiexec()
    if mpiexec is None:
        return {"status": "skipped", "why": "no mpiexec found"}
    if quick:
        return {"status": "skipped", "why": "--quick: two MPI trainings and a CPU-only process take too long"}
    shards = work / "bc2"
    write_shards(prepare(dataset="breast-cancer", setting="horizontal", clients=2, seed=0), shards)
    args = ["-m", "mpifc", "train", str(shards), "--learner", "einet", "--client-learner", "1=ratspn",
            "--hp", "num_sums=4", "--hp", "dtype=float32", "--hp", "epochs=2", "--hp", "em_iters=5",
            "--glue", "random", "--clusters", "1", "--refine", "em", "--em-iters", "2", "--json", "--liveness", "60"]
    out: dict[str, Any] = {"status": "ok", "shards": "breast cancer, 2 horizontal clients (EiNet float32, RAT-SPN)"}
    runs = {}
    for dev in dict.fromkeys([device, "cpu"]):
        left = seconds - (time.monotonic() - t0)
        r = run([mpiexec, "-n", "3", sys.executable, *args, "--model", str(work / f"bc-{dev}.h5"),
                 "--ledger", str(work / f"bc-{dev}.csv"), "--device", dev], left)
        if r["rc"] != 0:
            return {"status": "failed", "device": dev, "timed_out": r["timed_out"], "stderr": tail(r["stderr"])}
        runs[dev] = {"wall_s": round(r["wall_s"], 2), "summary": last_json(r["stdout"])}
    out["train_wall_s"] = {d: v["wall_s"] for d, v in runs.items()}
    out["devices"] = {r: f["device"] for r, f in (runs[device]["summary"] or {}).get("devices", {}).items()}
    if device != "cpu":
        a, b = _links(work / f"bc-{device}.csv"), _links(work / "bc-cpu.csv")
        out["ledger_equal"] = a == b
        out["messages"] = sum(len(v) for v in a.values())
        out["bytes"] = sum(int(m[2]) + int(m[3]) for v in a.values() for m in v)
        if a != b:
            out["ledger_difference"] = {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
    else:
        out["ledger_equal"] = None
        out["ledger_note"] = "--device cpu: nothing to compare against"
    # the DEV-trained model, answered here on DEV and in a process that sees no GPU
    import mpifc
    from data_prep.shards import read_test

    test = read_test(shards)
    fm = mpifc.load(work / f"bc-{device}.h5", device=device)
    rows = test.x[:, [test.features.index(f) for f in fm.features]]
    here = fm.log_likelihood(rows)
    np.save(work / "rows.npy", rows)
    code = ("import sys, numpy as np, torch, mpifc; assert not torch.cuda.is_available(); "
            f"m = mpifc.load({str(work / f'bc-{device}.h5')!r}, device='auto'); "
            f"np.save({str(work / 'cpu-ll.npy')!r}, m.log_likelihood(np.load({str(work / 'rows.npy')!r})))")
    r = run([sys.executable, "-c", code], seconds - (time.monotonic() - t0), env={"CUDA_VISIBLE_DEVICES": ""})
    if r["rc"] != 0:
        out.update(status="failed", cpu_only_timed_out=r["timed_out"], cpu_only_stderr=tail(r["stderr"]))
        return out
    there = np.load(work / "cpu-ll.npy")
    rel = float(np.max(np.abs(here - there) / np.maximum(np.abs(there), 1e-30)))
    out.update(cpu_only_max_relative_difference=rel, cpu_only_within_1e_5=rel <= 1e-5, test_rows=int(len(rows)),
               seconds=round(time.monotonic() - t0, 1))
    return out


def einet_mnist(device: str, x_train: np.ndarray, x_test: np.ndarray, seconds: float, quick: bool) -> dict[str, Any]:
    """Table 5's MNIST EiNet: one EM epoch on DEV; on all CPU cores as many batches as fit."""
    import torch

    from mpifc.circuit.einet.training import bits_per_dim, build_from_preset

    t0 = time.monotonic()
    pieces, k = ((4,), 2) if quick else ((PD_PIECES,), MNIST_K)
    sched = MNIST_SCHEDULE
    n_fwd = min(1000, len(x_test))
    fwd_rows = x_test[:n_fwd].astype(np.float32)

    def build(dev: str) -> Any:
        return build_from_preset("mnist", (28, 28), num_sums=k, device=dev, dtype="float32", max_params=None)[0] \
            if pieces == (PD_PIECES,) else _pd((28, 28), pieces, k, dev)

    out: dict[str, Any] = {"structure": f"Poon-Domingos, {pieces[0]} pieces per axis", "K": k,
                           "leaf": "discretized_gaussian (256 levels)", "dtype": "float32",
                           "schedule": {k2: v for k2, v in sched.items() if k2 != "epochs"},
                           "train_rows": int(len(x_train)), "cpu_threads": os.cpu_count(), "forward_rows": n_fwd}
    # ---- all CPU cores, time-boxed (whole M-step groups, so both devices stop at the same state)
    torch.set_num_threads(os.cpu_count() or 1)
    cpu_model = build("cpu")
    out["n_parameters"] = int(cpu_model.num_parameters())
    cpu_budget = seconds * 0.35
    em = OnlineEM(cpu_model, torch.as_tensor(x_train), sched["batch_size"], sched["online_em_frequency"],
                  sched["online_em_stepsize"])
    tc = time.perf_counter()
    while em.done < em.n_batches and (em.done == 0 or time.perf_counter() - tc < cpu_budget):
        for _ in range(sched["online_em_frequency"]):
            if em.done < em.n_batches:
                em.step()
    cpu_s = time.perf_counter() - tc
    b_cmp = em.done
    rows_cmp = min(b_cmp * sched["batch_size"], len(x_train))
    cpu_ll = mean_ll(cpu_model, fwd_rows)
    cpu_fwd = _timed(lambda: cpu_model.log_likelihood(fwd_rows), 1 if quick else 2, "cpu")
    out["cpu"] = {"batches": b_cmp, "rows": rows_cmp, "seconds": round(cpu_s, 3), "rows_per_s": rows_cmp / cpu_s,
                  "epoch_seconds_extrapolated": cpu_s * em.n_batches / b_cmp,
                  "epoch_extrapolated": b_cmp < em.n_batches, "forward_s": cpu_fwd,
                  "test_ll_after_same_batches": cpu_ll}
    del cpu_model, em
    # ---- DEV: a warm-up model first (kernels, allocator), then the timed epoch
    if device == "cpu":
        out["device"] = {"note": "--device cpu: the CPU figures above are the only ones"}
        out["seconds"] = round(time.monotonic() - t0, 1)
        return out
    x_dev = torch.as_tensor(x_train, device=device)
    warm = build(device)
    w = OnlineEM(warm, x_dev, sched["batch_size"], sched["online_em_frequency"], sched["online_em_stepsize"])
    for _ in range(min(10, w.n_batches)):
        w.step()
    del warm, w
    reset_peak(device)
    model = build(device)
    em = OnlineEM(model, x_dev, sched["batch_size"], sched["online_em_frequency"], sched["online_em_stepsize"])
    sync(device)
    busy, snap = 0.0, None
    dev_budget = seconds - (time.monotonic() - t0) - 5
    while em.done < em.n_batches:
        ts = time.perf_counter()
        em.step()
        sync(device)
        busy += time.perf_counter() - ts
        if em.done == b_cmp:
            snap = mean_ll(model, fwd_rows)
        if busy > dev_budget and em.done >= b_cmp:  # past the CPU's batches, so both are compared
            break
    full = em.done == em.n_batches
    dev_fwd = _timed(lambda: model.log_likelihood(fwd_rows), 5, device)
    test_ll = mean_ll(model, x_test.astype(np.float32))
    rows_done = min(em.done * sched["batch_size"], len(x_train))
    out["device"] = {"name": device, "batches": em.done, "full_epoch": full, "seconds": round(busy, 3),
                     "rows_per_s": rows_done / busy, "epoch_seconds": busy * em.n_batches / em.done,
                     "forward_s": dev_fwd, "test_ll_after_same_batches": snap,
                     "test_ll_full_test_set": test_ll, "test_bpd": bits_per_dim(test_ll, 784),
                     "test_rows": int(len(x_test)), "peak_bytes": peak_bytes(device)}
    out["ratio_em_rows_per_s"] = out["device"]["rows_per_s"] / out["cpu"]["rows_per_s"]
    out["ratio_forward"] = cpu_fwd / dev_fwd
    if snap is not None:
        out["test_ll_relative_difference"] = abs(snap - cpu_ll) / abs(cpu_ll)
    out["goal_30x_em_epoch"] = out["ratio_em_rows_per_s"] >= 30.0
    out["seconds"] = round(time.monotonic() - t0, 1)
    return out


def _pd(shape: tuple[int, ...], pieces: tuple[int, ...], k: int, device: str) -> Any:
    from mpifc.circuit.einet import EiNet, EiNetConfig

    cfg = EiNetConfig(num_sums=k, leaf="discretized_gaussian", num_levels=256, min_var=1e-3, max_var=0.25,
                      dtype="float32", device=device, max_params=None)
    return EiNet.poon_domingos(shape, list(pieces), cfg)


def _timed(fn: Callable[[], Any], repeats: int, device: str) -> float:
    """Median wall seconds of ``fn`` (after one untimed call)."""
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return float(sorted(times)[len(times) // 2])


def fedpc_mnist(device: str, table: Any, work: Path, seconds: float, quick: bool,
                epoch_estimate: float | None) -> dict[str, Any]:
    """``mpifc train --learner einet`` on MNIST over 1/2/4/8 clients sharing DEV."""
    import mpifc
    from data_prep.prepare import PrepConfig, prepare_table
    from data_prep.shards import read_test, write_shards

    t0 = time.monotonic()
    mpiexec = find_mpiexec()
    if mpiexec is None:
        return {"status": "skipped", "why": "no mpiexec found"}
    clients = (1,) if quick else CLIENTS
    pieces, k = (4, 2) if quick else (PD_PIECES, MNIST_K)
    table5_epochs = 1 if quick else MNIST_SCHEDULE["epochs"]
    out: dict[str, Any] = {"status": "ok", "client_einet": {"structure": f"Poon-Domingos {pieces} pieces over the "
                                                                          "28x28 pixels, the label joined at the root",
                                                            "K": k, "leaf": "discretized_gaussian (256 levels)",
                                                            **{kk: v for kk, v in MNIST_SCHEDULE.items() if kk != "epochs"}},
                           "table5_epochs": table5_epochs, "runs": []}
    overhead = 30.0  # start-up, shards, evaluation per run (estimate)
    for i, c in enumerate(clients):
        left = seconds - (time.monotonic() - t0)
        per_run = left / (len(clients) - i)
        epochs = table5_epochs
        if epoch_estimate and not quick:
            # the clients share the device: their epochs together cost about one epoch of all the
            # rows, plus what running several processes on it costs (taken as half as much again)
            epochs = int(max(1, min(table5_epochs, (per_run - overhead) // max(1.5 * epoch_estimate, 1e-9))))
        if left < 20:
            out["runs"].append({"clients": c, "status": "skipped", "why": f"budget: {left:.0f} s left"})
            continue
        shards = work / f"mnist-{c}"
        write_shards(prepare_table(table, PrepConfig(dataset="mnist", setting="horizontal", clients=c, seed=0,
                                                     split="iid")), shards)
        model = work / f"mnist-{c}.h5"
        hp = {"image_shape": "28x28", "pd_num_pieces": pieces, "num_sums": k, "leaf": "discretized_gaussian",
              "num_levels": 256, "epochs": epochs, "batch_size": MNIST_SCHEDULE["batch_size"],
              "online_em_frequency": MNIST_SCHEDULE["online_em_frequency"],
              "online_em_stepsize": MNIST_SCHEDULE["online_em_stepsize"], "min_var": 0.001, "max_var": 0.25,
              "dtype": "float32", "max_params": "none"}
        cmd = [mpiexec, "-n", str(c + 1), sys.executable, "-m", "mpifc", "train", str(shards), "--learner", "einet",
               "--glue", "random", "--clusters", "1", "--preset", "learner", "--refine", "none", "--seed", "0",
               "--device", device, "--deadline", "3600", "--liveness", "120", "--json", "--model", str(model),
               *[a for kk, v in hp.items() for a in ("--hp", f"{kk}={v}")]]
        threads = str(max(1, (os.cpu_count() or 1) // (c + 1)))
        # a run may take half as long again as its share (the estimate is rough), never the rest of the section
        r = run(cmd, min(seconds - (time.monotonic() - t0) - 10, max(1.5 * per_run, 60.0)),
                env={"OMP_NUM_THREADS": threads})
        rec: dict[str, Any] = {"clients": c, "ranks": c + 1, "epochs": epochs, "wall_s": round(r["wall_s"], 2)}
        if r["rc"] != 0:
            rec.update(status="timed out" if r["timed_out"] else "failed", stderr=tail(r["stderr"]))
            out["runs"].append(rec)
            continue
        s = last_json(r["stdout"]) or {}
        fm = mpifc.load(model, device=device)
        test = read_test(shards)
        rows = test.x[:, [test.features.index(f) for f in fm.features]].copy()
        rows[:, fm.features.index("label")] = np.nan
        ll = float(np.concatenate([fm.log_likelihood(rows[j:j + 2000]) for j in range(0, len(rows), 2000)]).mean())
        devices = s.get("devices") or {}
        learn = max((v.get("learn", 0.0) for v in (s.get("client_seconds_wall") or {}).values()), default=0.0)
        rec.update(status="ok", bpd=-ll / (784 * math.log(2.0)), test_ll_pixels=ll,
                   n_parameters=s.get("n_parameters"), bytes_train=s.get("bytes_train"),
                   messages_train=s.get("messages_train"),
                   train_wall_critical_path_s=s.get("train_wall_seconds_critical_path"),
                   peak_gpu_bytes_per_rank={r_: f.get("peak_bytes") for r_, f in devices.items()
                                            if f.get("peak_bytes") is not None},
                   devices={r_: f.get("device") for r_, f in devices.items()}, learn_wall_s=learn,
                   # each further epoch costs what one did in the slowest client's learn phase
                   wall_s_at_table5_epochs=round(r["wall_s"] + (table5_epochs - epochs) * learn / max(epochs, 1), 1)
                   if epochs < table5_epochs else None)
        out["runs"].append(rec)
        del fm
        shutil.rmtree(shards, ignore_errors=True)
    ok = [r for r in out["runs"] if r.get("status") == "ok"]
    out["shrunk_epochs"] = any(r["epochs"] < table5_epochs for r in ok)
    out["bpd_falls_with_clients"] = all(a["bpd"] > b["bpd"] for a, b in zip(ok, ok[1:])) if len(ok) > 1 else None
    out["goal_each_run_within_5_min"] = all((r.get("wall_s_at_table5_epochs") or r["wall_s"]) <= 300 for r in ok) \
        if ok else None
    out["seconds"] = round(time.monotonic() - t0, 1)
    return out


def imagenet32_client(device: str, seconds: float, quick: bool) -> dict[str, Any]:
    """One ImageNet32-sized client EiNet: K = 40 (or the largest K that fits), then a full EM epoch."""
    import torch

    from mpifc.circuit.device import is_out_of_memory
    from mpifc.errors import DeviceOutOfMemory

    t0 = time.monotonic()
    shape, n_rows = ((8, 8, 3), 128) if quick else ((32, 32, 3), 50_000)
    pieces = (2,) if quick else (PD_PIECES,)
    ks = [4, 2] if quick else [IMAGENET32_K, 36, 32, 29, 24, 20, 16]
    x, source = (_synthetic_rgb(n_rows, 0)[:, : int(np.prod(shape))], "synthetic (--quick)") if quick else \
        imagenet32_rows(n_rows)
    out: dict[str, Any] = {"data": source, "rows": n_rows, "dims": int(np.prod(shape)), "pd_pieces": pieces[0],
                           "leaf": "discretized_gaussian (256 levels)", "dtype": "float32", **IMAGENET32_SCHEDULE,
                           "probes": []}
    xt = torch.as_tensor(x, device=device)  # uint8 on the device; each batch becomes float32 there
    sched = IMAGENET32_SCHEDULE

    def probe(k: int, batches: int) -> dict[str, Any]:
        rec: dict[str, Any] = {"K": k}
        model = None
        try:
            reset_peak(device)
            tb = time.perf_counter()
            model = _pd(shape, pieces, k, device)
            rec["n_parameters"] = int(model.num_parameters())
            rec["build_s"] = round(time.perf_counter() - tb, 2)
            em = OnlineEM(model, xt, sched["batch_size"], sched["online_em_frequency"], sched["online_em_stepsize"])
            em.step()  # first batch: allocator and kernels
            sync(device)
            tb = time.perf_counter()
            for _ in range(batches):
                em.step()
            sync(device)
            rec.update(fits=True, batch_s=(time.perf_counter() - tb) / batches, peak_bytes=peak_bytes(device))
        except Exception as e:  # noqa: BLE001 - out of memory here is an answer, anything else is not
            if not (isinstance(e, DeviceOutOfMemory) or is_out_of_memory(e)):
                raise
            rec.update(fits=False, error=str(e)[:300])
        finally:
            del model
            reset_peak(device)
        return rec

    n_batches = math.ceil(n_rows / sched["batch_size"])
    largest = None
    for k in ks:
        if time.monotonic() - t0 > seconds * 0.45:
            out["probes"].append({"K": k, "status": "skipped", "why": "budget"})
            break
        rec = probe(k, 2 if quick else 4)
        out["probes"].append(rec)
        if rec.get("fits"):
            largest = rec
            break
    if largest is None:
        out["status"] = "no K fits"
        return out
    out["largest_fitting_K"] = largest["K"]
    out["table5_K40_fits"] = None if quick else largest["K"] == IMAGENET32_K
    # the epoch: the K = 40 model if its epoch fits the time left, else one of about Table 6's size
    left = seconds - (time.monotonic() - t0)
    epoch_k = largest["K"]
    if not quick and largest["batch_s"] * n_batches + largest["build_s"] > left * 0.9:
        epoch_k = min(largest["K"], round((TABLE6_PARAMS / (largest["n_parameters"] / largest["K"] ** 3)) ** (1 / 3)))
        out["epoch_model_note"] = (f"K = {largest['K']}'s epoch (~{largest['batch_s'] * n_batches:.0f} s) does not fit "
                                   f"the {left:.0f} s left: K = {epoch_k}, about Table 6's 152M parameters")
    left = seconds - (time.monotonic() - t0)
    if left < 2 * largest["build_s"] + 10:
        out.update(status="ok", epoch_skipped=f"budget: {left:.0f} s left, building the model takes ~{largest['build_s']:.0f} s")
        return out
    reset_peak(device)
    model = _pd(shape, pieces, epoch_k, device)
    em = OnlineEM(model, xt, sched["batch_size"], sched["online_em_frequency"], sched["online_em_stepsize"])
    sync(device)
    tb = time.perf_counter()
    stop = t0 + seconds - 3
    while em.done < em.n_batches and time.monotonic() < stop:
        em.step()
    sync(device)
    busy = time.perf_counter() - tb
    rows_done = min(em.done * sched["batch_size"], n_rows)
    out["epoch"] = {"K": epoch_k, "n_parameters": int(model.num_parameters()), "batches": em.done,
                    "full_epoch": em.done == em.n_batches, "seconds": round(busy, 2), "rows_per_s": rows_done / busy,
                    "epoch_seconds": busy * em.n_batches / max(em.done, 1), "peak_bytes": peak_bytes(device)}
    out["goal_150M_epoch_completed"] = em.done == em.n_batches and model.num_parameters() >= 0.9 * TABLE6_PARAMS
    del model
    out["status"] = "ok"
    out["seconds"] = round(time.monotonic() - t0, 1)
    return out


# ------------------------------------------------------------------------------------ report
def _num(v: Any, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


def text_table(res: dict[str, Any]) -> str:
    f = res.get("facts", {})
    gpu = f.get("gpu") or {}
    lines = [f"gpu.py {res['date']} on {f.get('host')}: {gpu.get('name', res['device'])}"
             + (f" ({gpu['memory_bytes'] / 2**30:.1f} GiB)" if gpu.get("memory_bytes") else "")
             + f", {f.get('cpu_cores')} cores ({f.get('cpu')}), torch {f.get('torch')}, CUDA {f.get('cuda_runtime')},"
             f" load {f.get('load_average_1min')}; {res['seconds']:.0f} s of {res['budget_s']:.0f} s"]
    p = res.get("portability", {})
    if p.get("status") == "ok":
        lines.append(f"portability: ledger {res['device']} == cpu: {p.get('ledger_equal')}; {res['device']}-trained "
                     f"model without GPU: max rel. diff {p.get('cpu_only_max_relative_difference', float('nan')):.2e}")
    else:
        lines.append(f"portability: {p.get('status')} {p.get('why', '')}{p.get('stderr', '')[:200]}")
    e = res.get("einet_mnist", {})
    if "cpu" in e:
        c, d = e["cpu"], e.get("device") or {}
        lines.append(f"EiNet MNIST (PD {e['structure'].split(',')[1].strip()}, K={e['K']}, {e['n_parameters']:,} params),"
                     f" one EM epoch of {e['train_rows']:,} rows:")
        lines.append(f"  cpu x{e['cpu_threads']}: {c['rows_per_s']:.0f} rows/s ({c['batches']} batches; epoch "
                     f"{c['epoch_seconds_extrapolated']:.0f} s{' extrapolated' if c['epoch_extrapolated'] else ''}), "
                     f"forward pass on {e['forward_rows']:,} rows {c['forward_s']:.3f} s")
        if "rows_per_s" in d:
            lines.append(f"  {d['name']}: {d['rows_per_s']:.0f} rows/s (epoch {d['epoch_seconds']:.1f} s), forward "
                         f"{d['forward_s']:.4f} s -> EM {e['ratio_em_rows_per_s']:.1f}x, forward "
                         f"{e['ratio_forward']:.1f}x (goal >= 30x: {e['goal_30x_em_epoch']})")
            lines.append(f"  test LL after {c['batches']} batches: cpu {_num(c['test_ll_after_same_batches'])}, "
                         f"{d['name']} {_num(d['test_ll_after_same_batches'])}; after "
                         f"{'the epoch' if d['full_epoch'] else str(d['batches']) + ' batches'}: bpd {d['test_bpd']:.3f}")
    fp = res.get("fedpc_mnist", {})
    if fp.get("runs"):
        lines.append(f"FedPC MNIST, EiNet clients sharing {res['device']} (Table 5 epochs {fp['table5_epochs']}):")
        lines.append("  clients epochs  wall s    bpd   bytes   peak/rank")
        for r in fp["runs"]:
            if r.get("status") != "ok":
                lines.append(f"  {r['clients']:>7} {r.get('epochs', '-'):>6}  {r.get('status')}: {r.get('why', '')}")
                continue
            peak = max(r["peak_gpu_bytes_per_rank"].values(), default=None)
            lines.append(f"  {r['clients']:>7} {r['epochs']:>6} {r['wall_s']:>7.1f} {r['bpd']:>6.3f} "
                         f"{(r['bytes_train'] or 0) / 1e6:>6.1f}MB " + (f"{peak / 2**30:.2f} GiB" if peak else "-"))
    im = res.get("imagenet32_client", {})
    if im.get("epoch"):
        ep = im["epoch"]
        lines.append(f"ImageNet32 client ({im['data'].split(' (')[0]}, {im['rows']:,} rows): K=40 fits: "
                     f"{im.get('table5_K40_fits')}; epoch K={ep['K']} ({ep['n_parameters'] / 1e6:.0f}M params): "
                     f"{ep['rows_per_s']:.0f} rows/s, {ep['epoch_seconds']:.0f} s"
                     f"{'' if ep['full_epoch'] else ' extrapolated'}, peak "
                     + (f"{ep['peak_bytes'] / 2**30:.1f} GiB" if ep.get("peak_bytes") else "-"))
    elif im:
        lines.append(f"ImageNet32 client: {im.get('status')}")
    if res.get("skipped"):
        lines.append("shrunk or skipped: " + "; ".join(res["skipped"]))
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for gpu.json and gpu.txt")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    ap.add_argument("--mnist", default=None, help="mnist.pkl.gz or the idx files' folder (default: $MPIFC_DATA/mnist, "
                                                  "../shared/data/mnist; else synthetic)")
    ap.add_argument("--budget", type=float, default=None, help="seconds for the whole run (default 450; --quick 120)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks the script's every path in seconds")
    ap.add_argument("--sections", default=",".join(SHARES), help="comma-separated sections to run (default: all)")
    args = ap.parse_args()
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(wanted) - set(SHARES))
    if unknown:
        print(f"gpu.py: --sections: unknown {', '.join(unknown)} (known: {', '.join(SHARES)})", file=sys.stderr)
        return 2
    budget = Budget(args.budget if args.budget else (120.0 if args.quick else 450.0), wanted)
    import torch

    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        print(f"gpu.py: --device {device}: CUDA is not available on {platform.node()} (use --device cpu)",
              file=sys.stderr)
        return 2
    if device == "cuda":
        device = "cuda:0"
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": device, "quick": args.quick,
                           "budget_s": budget.end - budget.t0, "skipped": [], "notes": []}
    work = Path(tempfile.mkdtemp(prefix="mpifc-gpu-"))
    try:
        res["facts"] = facts(device)
        mnist = find_mnist(args.mnist)
        if mnist is None or args.quick:
            n_tr, n_te = (256, 64) if args.quick else (60_000, 10_000)
            mnist = synthetic_mnist(work / "mnist.pkl.gz", n_tr, n_te)
            res["mnist"] = f"synthetic digit-like images ({n_tr} train, {n_te} test)" + \
                           ("" if args.quick else ": no MNIST found (--mnist, $MPIFC_DATA/mnist, ../shared/data/mnist)")
            if not args.quick:
                res["notes"].append(res["mnist"])
        else:
            res["mnist"] = str(mnist)
        table = mnist_table(mnist)
        x_train, x_test = table.x[~table.own_test], table.x[table.own_test]
        for name in SHARES:
            if name == "facts":
                continue
            if name not in wanted:
                res[name] = {"status": "skipped", "why": "not in --sections"}
                continue
            secs = budget.section(name)
            if secs < 5:
                res[name] = {"status": "skipped", "why": f"budget: {budget.left():.0f} s left"}
                res["skipped"].append(f"{name} (no time left)")
                continue
            try:
                if name == "portability":
                    res[name] = portability(device, work, secs, args.quick)
                elif name == "einet_mnist":
                    res[name] = einet_mnist(device, x_train, x_test, secs, args.quick)
                elif name == "fedpc_mnist":
                    e = res.get("einet_mnist", {})
                    est = (e.get("device") or {}).get("epoch_seconds") or (e.get("cpu") or {}).get(
                        "epoch_seconds_extrapolated")
                    res[name] = fedpc_mnist(device, table, work, secs, args.quick, est)
                    if res[name].get("shrunk_epochs"):
                        res["skipped"].append(f"fedpc_mnist: fewer than Table 5's {res[name]['table5_epochs']} epochs")
                    res["skipped"] += [f"fedpc_mnist {r['clients']} clients: {r['why']}" for r in res[name]["runs"]
                                       if r.get("status") == "skipped"]
                elif name == "imagenet32_client":
                    res[name] = imagenet32_client(device, secs, args.quick)
                    if res[name].get("epoch") and not res[name]["epoch"]["full_epoch"]:
                        res["skipped"].append("imagenet32_client: epoch cut short (extrapolated)")
            except Exception as e:  # noqa: BLE001 - one section's failure must not lose the others
                import traceback

                res[name] = {"status": "failed", "error": f"{type(e).__name__}: {e}",
                             "traceback": traceback.format_exc()[-1500:]}
            finally:
                reset_peak(device)  # give the cached device memory back before the next section
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res["seconds"] = time.monotonic() - budget.t0
    res["facts"]["load_average_1min_end"] = load_average()
    (out_dir / "gpu.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    text = text_table(res)
    (out_dir / "gpu.txt").write_text(text)
    print(text, end="")
    failed = [n for n in SHARES if isinstance(res.get(n), dict) and res[n].get("status") == "failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
