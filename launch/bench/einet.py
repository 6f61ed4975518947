#!/usr/bin/env python
"""EiNet benchmark: speed and peak memory against SPFlow 1.1.0's Einet, and MNIST bits/dim.

Every measurement runs in its own subprocess so that its peak resident memory (ru_maxrss, minus
the RSS after imports and data loading) belongs to that model alone.

Sections:
  speed   MNIST (784 inputs), batch 1000: SPFlow's Einet (random binary trees: depth 4,
          5 repetitions, K=10, Normal leaves) vs. our EiNet on the same structure and size, and
          our EiNet on the PD structure (pieces [7], K=10). Forward and EM-step times are medians;
          one full EM epoch is measured for ours, SPFlow's epoch is steps x median step time.
  digits  scikit-learn digits (8x8, 1500 train rows, dequantised): one full-batch EM epoch
          for both libraries on random binary trees (depth 3, 5 repetitions, K=10). Full batch
          because SPFlow's Normal leaves collapse (std -> 1e-8, then NaN) after one EM step on
          a 100-row mini-batch.
  quality MNIST with the Table 5 online-EM schedule on a PD EiNet with Gaussian leaves trained
          on v/255, scored as a discretised Gaussian over 256 levels: test bits/dim beside the
          parameter count. This single centralised EiNet is the baseline of the federated trend.

Usage: python launch/bench/einet.py [--quick] [--threads 1] [--mnist PATH]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MNIST = REPO.parent / "shared" / "data" / "mnist" / "mnist.pkl.gz"


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load_mnist(path: Path, train_rows: int | None) -> tuple:
    """MNIST as 8-bit levels ``v = round(255 x)`` (float32): train, test."""
    import numpy as np

    with gzip.open(path, "rb") as f:
        (xtr, _), _, (xte, _) = pickle.load(f, encoding="latin1")
    xtr = np.round(np.asarray(xtr, dtype=np.float64) * 255).astype(np.float32)
    xte = np.round(np.asarray(xte, dtype=np.float64) * 255).astype(np.float32)
    return (xtr[:train_rows] if train_rows else xtr), xte


def _median_time(fn, repeats: int) -> tuple[float, float]:
    """Median (wall seconds, CPU seconds of this process) over ``repeats`` calls.

    CPU time is reported beside wall time because on a shared machine the wall clock mostly
    measures waiting for a core; with one thread, idle wall time ~= CPU time.
    """
    walls, cpus = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return sorted(walls)[len(walls) // 2], sorted(cpus)[len(cpus) // 2]


class _Clock:
    """Wall and CPU seconds of a ``with`` block."""

    def __enter__(self) -> "_Clock":
        self.t, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.t, time.process_time() - self.c


# --------------------------------------------------------------------------------- workers
def worker_spflow(args: argparse.Namespace, x, depth: int, batch: int) -> dict:
    import torch
    from spflow.learn.expectation_maximization import expectation_maximization
    from spflow.meta.data.scope import Scope
    from spflow.modules.leaves import Normal
    from spflow.zoo.einet import Einet

    base = _rss_mb()
    torch.manual_seed(0)
    d = x.shape[1]
    leaf = Normal(scope=Scope(list(range(d))), out_channels=10, num_repetitions=5)
    model = Einet(leaf_modules=[leaf], num_classes=1, num_sums=10, num_leaves=10, depth=depth,
                  num_repetitions=5, layer_type="einsum", structure="top-down")
    xb = torch.as_tensor(x[:batch])
    with torch.no_grad():
        model.log_likelihood(xb[:10])
        fwd, fwd_cpu = _median_time(lambda: model.log_likelihood(xb), args.repeats)
    out = {"params": sum(p.numel() for p in model.parameters()), "fwd_s": fwd, "fwd_cpu": fwd_cpu}
    if args.full_epoch_spflow:
        with _Clock() as clock:
            for s in range(0, len(x), batch):
                expectation_maximization(model, torch.as_tensor(x[s:s + batch]), max_steps=1)
        out["epoch_s"], out["epoch_cpu"] = clock.wall, clock.cpu
        out["epoch_kind"] = "measured"
    else:
        step, step_cpu = _median_time(lambda: expectation_maximization(model, xb, max_steps=1), args.em_steps)
        out["epoch_s"], out["epoch_cpu"] = step * -(-len(x) // batch), step_cpu * -(-len(x) // batch)
        out["epoch_kind"] = f"{-(-len(x) // batch)} steps x median of {args.em_steps}"
    out["peak_mb"] = _peak_mb() - base
    return out


def worker_ours(args: argparse.Namespace, x, structure: str, batch: int, full_epoch: bool) -> dict:
    import torch

    from mpifc.circuit.einet import EiNet, EiNetConfig, EMSchedule, train_em

    base = _rss_mb()
    d = x.shape[1]
    side = int(round(d ** 0.5))
    cfg = EiNetConfig(num_sums=10, leaf="gaussian", seed=0, eval_batch_size=batch)
    if structure == "rbt":
        model = EiNet.random_binary_trees(d, 4 if d > 100 else 3, 5, cfg)
    else:
        model = EiNet.poon_domingos((side, side), [int(structure[2:])], cfg)
    xb = torch.as_tensor(x[:batch])
    model.log_likelihood(xb[:10])
    fwd, fwd_cpu = _median_time(lambda: model.log_likelihood(xb), args.repeats)

    def em_step() -> None:
        model.apply_em(model.em_statistics(xb))

    out = {"params": model.num_parameters(), "fwd_s": fwd, "fwd_cpu": fwd_cpu}
    steps = -(-len(x) // batch)
    if full_epoch:
        with _Clock() as clock:
            train_em(model, x, EMSchedule(num_epochs=1, batch_size=batch, shuffle=False))
        out["epoch_s"], out["epoch_cpu"] = clock.wall, clock.cpu
        out["epoch_kind"] = "measured"
    else:
        step, step_cpu = _median_time(em_step, args.em_steps)
        out["epoch_s"], out["epoch_cpu"] = step * steps, step_cpu * steps
        out["epoch_kind"] = f"{steps} steps x median of {args.em_steps}"
    out["peak_mb"] = _peak_mb() - base
    return out


def worker_quality(args: argparse.Namespace, xtr, xte, shape: tuple, levels: int, pieces: list[int],
                   epochs: int, leaf: str = "gaussian") -> dict:
    """Table 5 online EM, then test bits/dim of the discretised model.

    ``leaf="gaussian"`` trains continuous Gaussians on ``v / (L-1)`` and scores them discretised
    (the FC paper's route); ``"discretized_gaussian"`` runs exact EM on the levels directly.
    """
    from dataclasses import replace

    from mpifc.circuit.einet import EiNet, EiNetConfig, evaluate, train_em
    from mpifc.circuit.einet.training import get_preset

    base = _rss_mb()
    preset = get_preset("mnist")
    cfg = EiNetConfig(num_sums=preset.num_sums, leaf=leaf, num_levels=levels, min_var=preset.min_var,
                      max_var=preset.max_var, seed=0)
    model = EiNet.poon_domingos(shape, pieces, cfg)
    schedule = replace(preset.schedule, num_epochs=epochs)
    scale = levels - 1
    with _Clock() as clock:
        hist = train_em(model, xtr / scale if leaf == "gaussian" else xtr, schedule)
    train_s = clock.cpu
    disc = model.with_leaf("discretized_gaussian", num_levels=levels) if leaf == "gaussian" else model
    res = evaluate(disc, xte)
    return {"params": model.num_parameters(), "epochs": epochs, "train_rows": len(xtr),
            "train_s": train_s, "train_ll_per_epoch": hist, "test_ll": res["mean_ll"],
            "test_bpd": res["bpd"], "schedule": str(schedule), "peak_mb": _peak_mb() - base}


def run_worker(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    if args.worker.startswith("digits"):
        from sklearn.datasets import load_digits

        data = load_digits().data.astype(np.float32)
        perm = np.random.default_rng(0).permutation(len(data))
        xtr, xte = data[perm[:1500]], data[perm[1500:]]
        # Speed runs use dequantised values (v + U[0,1)) / 17: SPFlow's Normal MLE returns NaN
        # on the always-zero border pixels of the raw digits.
        xdeq = ((xtr + np.random.default_rng(1).random(xtr.shape)) / 17).astype(np.float32)
    else:
        xtr, xte = load_mnist(args.mnist, args.train_rows)
    kind = args.worker
    if kind == "spflow":
        res = worker_spflow(args, xtr / 255.0, 4, 1000)
    elif kind == "ours-rbt":
        res = worker_ours(args, xtr / 255.0, "rbt", 1000, full_epoch=True)
    elif kind == "ours-pd7":
        res = worker_ours(args, xtr / 255.0, "pd7", 1000, full_epoch=False)
    elif kind == "digits-spflow":
        args.full_epoch_spflow = True
        res = worker_spflow(args, xdeq, 3, len(xdeq))
    elif kind == "digits-ours":
        res = worker_ours(args, xdeq, "rbt", len(xdeq), full_epoch=True)
    elif kind == "digits-quality":
        res = worker_quality(args, xtr, xte, (8, 8), 17, [4], args.digits_epochs)
    elif kind == "digits-quality-exact":
        res = worker_quality(args, xtr, xte, (8, 8), 17, [4], args.digits_epochs, leaf="discretized_gaussian")
    elif kind == "quality":
        res = worker_quality(args, xtr, xte, (28, 28), 256, args.pd_pieces, args.epochs)
    else:
        raise SystemExit(f"--worker: unknown {kind!r}")
    print("RESULT " + json.dumps(res))


# --------------------------------------------------------------------------------- driver
def spawn(args: argparse.Namespace, kind: str) -> dict | None:
    cmd = [sys.executable, __file__, "--worker", kind, "--threads", str(args.threads),
           "--mnist", str(args.mnist), "--repeats", str(args.repeats), "--em-steps", str(args.em_steps),
           "--epochs", str(args.epochs), "--digits-epochs", str(args.digits_epochs),
           "--pd-pieces", *map(str, args.pd_pieces)]
    if args.train_rows:
        cmd += ["--train-rows", str(args.train_rows)]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": str(args.threads)}
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
            res["wall_s"] = time.perf_counter() - t
            return res
    print(f"  [{kind}] failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10k MNIST train rows, 1 EM step timed")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for every model (default 1)")
    ap.add_argument("--mnist", type=Path, default=DEFAULT_MNIST)
    ap.add_argument("--train-rows", type=int, default=None, help="MNIST train rows (default: all 50k)")
    ap.add_argument("--epochs", type=int, default=1, help="MNIST quality epochs (Table 5 says 5)")
    ap.add_argument("--digits-epochs", type=int, default=5, help="digits quality epochs (Table 5: 5)")
    ap.add_argument("--pd-pieces", type=int, nargs="+", default=[4], help="PD pieces of the quality run")
    ap.add_argument("--repeats", type=int, default=3, help="timed forward passes (median)")
    ap.add_argument("--em-steps", type=int, default=2, help="timed EM steps where an epoch is extrapolated")
    ap.add_argument("--skip-spflow", action="store_true")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.full_epoch_spflow = False
    if args.quick:
        args.train_rows = args.train_rows or 10_000
        args.em_steps, args.repeats = 1, 1
    if args.worker:
        run_worker(args)
        return

    import numpy as np
    import torch

    print(f"EiNet benchmark  torch {torch.__version__}  threads={args.threads}  cores={os.cpu_count()}  "
          f"load avg {os.getloadavg()[0]:.1f}")
    has_mnist = args.mnist.exists()
    if not has_mnist:
        print(f"MNIST not found at {args.mnist}: MNIST sections skipped")
    rows = []
    if has_mnist:
        n = args.train_rows or 50_000
        print(f"\n== speed: MNIST 28x28, {n} train rows, batch 1000, Gaussian leaves on v/255 ==")
        hdr = (f"{'model':38s} {'params':>9s} {'fwd@1000 wall/cpu':>18s} {'EM epoch wall/cpu':>18s} "
               f"{'peak MB':>8s}  epoch")
        print(hdr)
        for kind, label in [("spflow", "SPFlow 1.1.0 Einet RBT d4 r5 K10"),
                            ("ours-rbt", "mpifc EiNet        RBT d4 r5 K10"),
                            ("ours-pd7", "mpifc EiNet        PD pieces [7] K10")]:
            if kind == "spflow" and args.skip_spflow:
                continue
            r = spawn(args, kind)
            if r:
                rows.append((kind, r))
                print(f"{label:38s} {r['params']:>9,d} {r['fwd_s']:>8.3f}/{r['fwd_cpu']:<8.3f}s "
                      f"{r['epoch_s']:>8.1f}/{r['epoch_cpu']:<8.1f}s {r['peak_mb']:>8.0f}  {r['epoch_kind']}")
        res = dict(rows)
        if "spflow" in res and "ours-rbt" in res:
            s, o = res["spflow"], res["ours-rbt"]
            print(f"speed-up per EM epoch (equal structure, equal params), wall {s['epoch_s'] / o['epoch_s']:.1f}x, "
                  f"CPU {s['epoch_cpu'] / o['epoch_cpu']:.1f}x; forward: wall {s['fwd_s'] / o['fwd_s']:.1f}x, "
                  f"CPU {s['fwd_cpu'] / o['fwd_cpu']:.1f}x; peak memory ours/SPFlow: "
                  f"{o['peak_mb'] / max(s['peak_mb'], 1e-9):.2f}")

    print("\n== speed: sklearn digits 8x8, 1500 train rows, one measured full-batch EM epoch ==")
    drows = {}
    for kind, label in [("digits-spflow", "SPFlow 1.1.0 Einet RBT d3 r5 K10"),
                        ("digits-ours", "mpifc EiNet        RBT d3 r5 K10")]:
        if kind == "digits-spflow" and args.skip_spflow:
            continue
        r = spawn(args, kind)
        if r:
            drows[kind] = r
            print(f"{label:38s} {r['params']:>9,d} {r['fwd_s']:>8.3f}/{r['fwd_cpu']:<8.3f}s "
                  f"{r['epoch_s']:>8.2f}/{r['epoch_cpu']:<8.2f}s {r['peak_mb']:>8.0f}")
    if len(drows) == 2:
        a, b = drows["digits-spflow"], drows["digits-ours"]
        print(f"speed-up per EM epoch: wall {a['epoch_s'] / b['epoch_s']:.1f}x, CPU {a['epoch_cpu'] / b['epoch_cpu']:.1f}x")

    print("\n== quality: Table 5 online EM (batch 64, freq 5, step 0.1), Gaussian leaves trained on v/(L-1),"
          " scored as discretised Gaussians ==")
    for kind, how in [("digits-quality", "Gaussian EM, scored discretised"),
                      ("digits-quality-exact", "exact discretised-Gaussian EM")]:
        r = spawn(args, kind)
        if r:
            print(f"digits 8x8  PD [4] K10  params {r['params']:,}  epochs {r['epochs']}  {how:32s} "
                  f"train {r['train_s']:.1f}s CPU  test LL {r['test_ll']:.2f} nats  test bpd {r['test_bpd']:.3f} "
                  f"(17 levels, 297 test images)")
    if has_mnist:
        r = spawn(args, "quality")
        if r:
            print(f"MNIST 28x28 PD {args.pd_pieces} K10  params {r['params']:,}  epochs {r['epochs']} on "
                  f"{r['train_rows']} rows  train {r['train_s']:.1f}s CPU  peak {r['peak_mb']:.0f} MB")
            print(f"  train LL/epoch {[round(v, 1) for v in r['train_ll_per_epoch']]} (continuous, nats)")
            print(f"  centralised single-EiNet baseline: test LL {r['test_ll']:.1f} nats  "
                  f"test bpd {r['test_bpd']:.3f} (256 levels, 10k test images)")


if __name__ == "__main__":
    main()
