#!/usr/bin/env python
"""Wide binary tables: peak memory of LearnSPN's RDC column split, and evaluation time of a large
LearnSPN, on synthetic data made here.

Data: ``n`` rows of ``d`` binary columns from a mixture of 8 latent classes (per-class
Bernoulli probabilities drawn from Beta(0.3, 1.5)), with columns in groups of 20 that share a
second latent bit per row (which halves or doubles their probabilities). ``--seed`` fixes the
probabilities; training and test rows are separate draws from them.

Part ``rdc``: one column split as LearnSPN makes it at the root (``split_columns_rdc``, native
threads limited to one and work arrays reused, as in ``learn_spn``) on 1,600 columns x 2,500
rows, for every copula convention (``rdc_ties``) and ``rdc_k`` in 10 (default) and 20, each in a
fresh child process. ``peak RSS`` is the child's ``ru_maxrss``; ``+RDC`` is that minus the
child's peak before the split (interpreter, imports, data). ``ties=max`` on two-valued columns
is the exact binary shortcut (|Pearson|, no random features). Then the same split on a size the
computation in one piece fits (400 columns): blocked (the default) beside one block (the
moment matrix of all columns at once, as before blocks; run under a 6 GB address-space limit),
with peak RSS, seconds, and whether the RDC matrices (bit for bit) and the partitions agree.

Part ``eval``: a LearnSPN (threshold 0.05, min_instances_slice 50: many leaves under wide
products) on 5,000 x 500; its parameter count; then ``log_likelihood`` on 58,000 test rows.
``first batch`` is the first 1,024 rows on a freshly compiled circuit (so it includes any
set-up on first use); ``total`` is all rows on another fresh circuit. ``root plan`` is the
default (finite-domain leaves folded into one-hot matrix products, ``CompiledCircuit.root_plan``);
``generic`` is the upward pass over every node (``fold_leaves = False``), timed on its first 4
batches and extrapolated to the total unless ``--old-full``. ``matmul floor`` is torch's one-hot
matrix product alone over all rows (the arithmetic the plan cannot avoid). Times are the median
of ``--repeat`` runs (min-max shown); the load average is printed before and after, since the
machine may be shared. ``--profile`` prints cProfile's top entries for one batch of the generic
pass.

Usage: python launch/bench/wide_data.py [--part rdc|eval|all] [--repeat 3] [--threads 1]
       [--profile] [--old-full] [--quick] [--seed 0]
"""
from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import os
import pstats
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ONE_BLOCK_LIMIT = 6 << 30
"""Address-space limit (bytes) of a child computing the RDC in one piece."""


def wide_binary(n: int, d: int, seed: int, sample_seed: int) -> np.ndarray:
    """``(n, d)`` float64 0/1 table (see the module doc); ``seed`` fixes the distribution,
    ``sample_seed`` the rows."""
    law = np.random.default_rng(seed)
    n_latent, group = 8, 20
    probs = law.beta(0.3, 1.5, size=(n_latent, d))
    rng = np.random.default_rng([seed, sample_seed])
    z = rng.integers(0, n_latent, n)
    flips = rng.integers(0, 2, size=(n, (d + group - 1) // group))
    p = probs[z]
    p = np.where(np.repeat(flips, group, axis=1)[:, :d] == 1, np.minimum(1.0, 2.0 * p), 0.5 * p)
    return (rng.random((n, d)) < p).astype(np.float64)


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


# ------------------------------------------------------------------------------------ RDC part


def rdc_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One root column split in this (child) process; returns its measurements."""
    from mpifc.circuit import rdc
    from mpifc.circuit.splitting import dependency_components, single_native_thread

    x = wide_binary(spec["n"], spec["d"], spec["seed"], 0)
    d = x.shape[1]
    if spec["one_block"]:  # the whole moment matrix at once, as before blocks
        rdc._GRAM_BYTES = rdc._FEATURE_BYTES = 1 << 62
    before = _maxrss_mb()
    t0 = time.perf_counter()
    with single_native_thread(), rdc.reuse_work_arrays():
        r = rdc.rdc_matrix(x, [False] * d, [2] * d, k=spec["k"], rng=np.random.default_rng(spec["seed"]),
                           ties=spec["ties"])
        groups = dependency_components(r >= spec["threshold"])
        blocks = 1 if (spec["ties"] == "max" or spec["one_block"]) else len(
            rdc._column_blocks(d, spec["k"], min(x.shape[0], rdc._ROW_CHUNK)))
    seconds = time.perf_counter() - t0
    part = json.dumps([g.tolist() for g in groups])
    return dict(before_mb=before, peak_mb=_maxrss_mb(), seconds=seconds, blocks=blocks, n_groups=len(groups),
                largest=max(len(g) for g in groups),
                rdc_sha=hashlib.sha256(np.ascontiguousarray(r).tobytes()).hexdigest()[:16],
                part_sha=hashlib.sha256(part.encode()).hexdigest()[:16])


def run_rdc_child(spec: dict[str, Any]) -> dict[str, Any]:
    """:func:`rdc_child` in a fresh interpreter (a one-block run under an address-space limit)."""
    def limit() -> None:
        if spec["one_block"]:
            resource.setrlimit(resource.RLIMIT_AS, (ONE_BLOCK_LIMIT, ONE_BLOCK_LIMIT))

    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                          preexec_fn=limit, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return dict(error=f"exit {proc.returncode}: {tail[:80]}")
    return json.loads(lines[-1])


def bench_rdc(args: argparse.Namespace) -> None:
    from mpifc.circuit.rdc import TIES

    n, wide, fits = (2500, 1600, 400) if not args.quick else (600, 300, 120)
    options = [(ties, k) for ties in TIES for k in (10, 20)]
    base = dict(n=n, seed=args.seed, threshold=0.3)
    print(f"\nRDC column split at the root, {wide} binary columns x {n} rows (threshold 0.3), "
          f"one child process per option")
    print(f"{'option':<20}{'path':<26}{'peak RSS':>10}{'+RDC':>9}{'seconds':>9}{'groups':>8}{'largest':>9}")
    for ties, k in options:
        got = run_rdc_child(dict(base, d=wide, ties=ties, k=k, one_block=False))
        path = "binary |Pearson|" if ties == "max" else f"blocked ({got.get('blocks', '?')} blocks)"
        if "error" in got:
            print(f"{f'ties={ties} k={k}':<20}{path:<26}{got['error']}")
            continue
        print(f"{f'ties={ties} k={k}':<20}{path:<26}{got['peak_mb']:>8.0f}MB{got['peak_mb'] - got['before_mb']:>7.0f}MB"
              f"{got['seconds']:>9.1f}{got['n_groups']:>8}{got['largest']:>9}")

    print(f"\nThe same split at {fits} columns x {n} rows: blocked (default) beside one block "
          f"(under a {ONE_BLOCK_LIMIT >> 30} GB address-space limit); ratio = one block / blocked")
    print(f"{'option':<20}{'RSS blocked':>12}{'one block':>11}{'ratio':>7}{'s blocked':>11}{'one block':>11}"
          f"{'ratio':>7}  {'same RDC bits':<15}{'same partition'}")
    for ties, k in options:
        a = run_rdc_child(dict(base, d=fits, ties=ties, k=k, one_block=False))
        b = run_rdc_child(dict(base, d=fits, ties=ties, k=k, one_block=True))
        if "error" in a or "error" in b:
            print(f"{f'ties={ties} k={k}':<20}{a.get('error', '')} {b.get('error', '')}")
            continue
        ra, rb = a["peak_mb"] - a["before_mb"], b["peak_mb"] - b["before_mb"]
        print(f"{f'ties={ties} k={k}':<20}{a['peak_mb']:>10.0f}MB{b['peak_mb']:>9.0f}MB{rb / max(ra, 1.0):>7.1f}"
              f"{a['seconds']:>11.2f}{b['seconds']:>11.2f}{b['seconds'] / a['seconds']:>7.2f}  "
              f"{str(a['rdc_sha'] == b['rdc_sha']):<15}{a['part_sha'] == b['part_sha']}")
    print("(ratio of RSS: of the +RDC parts, the peak over the child's baseline)")


# ----------------------------------------------------------------------------------- eval part


def _timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _spread(ts: list[float]) -> str:
    return f"{statistics.median(ts):7.2f} s ({min(ts):.2f}-{max(ts):.2f})"


def bench_eval(args: argparse.Namespace) -> None:
    import torch

    from mpifc.circuit.compiled import MIN_CHUNK_ROWS
    from mpifc.circuit.learnspn import learn_spn
    from mpifc.circuit.spn import SPN

    torch.set_num_threads(args.threads)
    n_train, d, n_test = (5000, 500, 58000) if not args.quick else (2000, 200, 10000)
    x = wide_binary(n_train, d, args.seed, 1)
    test = wide_binary(n_test, d, args.seed, 2)
    t_learn, model = _timed(lambda: learn_spn(x, ["discrete"] * d, threshold=0.05, min_instances_slice=50,
                                              seed=args.seed))
    root = model.root
    c = model.circuit
    print(f"\nEvaluation: LearnSPN on {n_train} x {d} binary (threshold 0.05, min_instances_slice 50), "
          f"learnt in {t_learn:.1f} s: {c.num_parameters()} parameters, {c.n_nodes} nodes "
          f"({c.groups[0].stop} leaves), {c.n_edges} sum edges, {len(c.layers)} layers; "
          f"log_likelihood on {n_test} rows, torch threads {torch.get_num_threads()}")
    batch = MIN_CHUNK_ROWS

    def fresh(fold: bool) -> Any:
        spn = SPN(root)
        spn.circuit.fold_leaves = fold
        return spn.circuit

    first_new, total_new, plan_rows = [], [], []
    for _ in range(args.repeat):
        cc = fresh(True)
        first_new.append(_timed(lambda: cc.log_likelihood(test[:batch]))[0])
        cc = fresh(True)
        t, ll_new = _timed(lambda: cc.log_likelihood(test))
        total_new.append(t)
    plan = cc.root_plan()
    plan_rows.append(plan.n_nodes if plan is not None else c.n_nodes)

    first_old, next_old = [], []
    n_batches = -(-n_test // batch)
    for _ in range(args.repeat if args.old_full else 1):
        cc = fresh(False)
        first_old.append(_timed(lambda: cc.log_likelihood(test[:batch]))[0])
    if args.old_full:
        total_old = []
        for _ in range(args.repeat):
            cc = fresh(False)
            t, ll_old = _timed(lambda: cc.log_likelihood(test))
            total_old.append(t)
        old_total = _spread(total_old)
        old_med = statistics.median(total_old)
        check_rows = n_test
    else:
        for b in range(1, 4):
            t, part = _timed(lambda: cc.log_likelihood(test[b * batch:(b + 1) * batch]))
            next_old.append(t)
        ll_old = torch.cat([cc.log_likelihood(test[:batch])] + [cc.log_likelihood(test[b * batch:(b + 1) * batch])
                                                                  for b in range(1, 4)])
        old_med = statistics.median(first_old) + (n_batches - 1) * statistics.median(next_old)
        old_total = f"{old_med:7.1f} s (est.: first + {n_batches - 1} x median of next 3)"
        check_rows = 4 * batch
    err = float(((ll_new[:check_rows] - ll_old[:check_rows]).abs() / ll_old[:check_rows].abs().clamp_min(1.0)).max())

    # The one-hot matrix product alone over all rows, in the plan's chunks: the arithmetic floor.
    floor = []
    if plan is not None:
        enc = plan.fold.compact
        step = max(batch, (1 << 21) // max(plan.n_nodes, plan.fold.plain.table.shape[0]))
        features = []
        for lo in range(0, n_test, step):
            xs = torch.as_tensor(test[lo:lo + step])[:, plan.fold.cols]
            if enc.binary:  # the values are the features
                features.append(xs)
            else:
                feature = torch.where(xs.long() < enc.shift, enc.table.shape[0] - 1, xs.long() + enc.first)
                features.append(torch.zeros(len(xs), enc.table.shape[0], dtype=torch.float64).scatter_(1, feature, 1.0))
        table = enc.table[:-1] if enc.binary else enc.table
        for _ in range(args.repeat):
            floor.append(_timed(lambda: [torch.matmul(table.T, f.T) for f in features])[0])

    print(f"{'path':<14}{'first batch (' + str(batch) + ' rows)':>30}{'total (' + str(n_test) + ' rows)':>34}"
          f"{'buffer cols':>13}")
    print(f"{'generic':<14}{_spread(first_old):>30}{old_total:>34}{c.n_nodes:>13}")
    print(f"{'root plan':<14}{_spread(first_new):>30}{_spread(total_new):>34}{plan_rows[0]:>13}")
    print(f"{'ratio':<14}{statistics.median(first_old) / statistics.median(first_new):>28.0f}x"
          f"{old_med / statistics.median(total_new):>32.0f}x")
    if floor:
        print(f"matmul floor: {_spread(floor)} for the feature product ({n_test}, {table.shape[0]}) @ "
              f"{tuple(table.shape)} alone; root plan / floor = "
              f"{statistics.median(total_new) / statistics.median(floor):.1f}")
    print(f"max |plan - generic| / max(1, |generic|) over {check_rows} rows: {err:.1e}")

    if args.profile:
        cc = fresh(False)
        cc.log_likelihood(test[:batch])
        prof = cProfile.Profile()
        prof.enable()
        cc.log_likelihood(test[batch:2 * batch])
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(10)
        print(f"\ncProfile of the generic pass, one batch of {batch} rows (top entries by own time):")
        print("\n".join(ln for ln in out.getvalue().splitlines() if ln.strip())[:4000])


# ----------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("rdc", "eval", "all"), default="all")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads for the evaluation (default 1)")
    p.add_argument("--profile", action="store_true", help="cProfile one batch of the generic pass")
    p.add_argument("--old-full", action="store_true", help="run the generic pass on every row (slow)")
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run of this script)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(rdc_child(json.loads(args.child))))
        return
    print(f"load average before: {' '.join(f'{v:.1f}' for v in os.getloadavg())} ({os.cpu_count()} CPUs)")
    if args.part in ("rdc", "all"):
        bench_rdc(args)
    if args.part in ("eval", "all"):
        bench_eval(args)
    print(f"\nload average after: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
