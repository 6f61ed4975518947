#!/usr/bin/env python
"""LearnSPN test log-likelihood on the binary debd sets against the published LearnSPN figures.

For each set: learn on ``NAME.ts``, choose hyperparameters on ``NAME.valid`` only, report the
test LL (mean nats per sample, ``NAME.test``) of the chosen model beside Gens & Domingos (2013).

Grid (column split is the G-test, LearnSPN's own independence test; row split k-means, k=2):

  full     gtest_pvalue in {0.0015, 1e-6} x min_instances_slice in {50, 100, 200}
  --quick  gtest_pvalue in {0.0015, 1e-6} x min_instances_slice 50

and for each learned structure the Laplace smoothing alpha in {0.05, 0.1, 0.2, 0.5, 1.0}, applied
exactly with :func:`mpifc.circuit.learnspn.resmooth` (smoothing does not change the structure).
``gap`` is (ours - published) / |published|: positive means ours is better; the target is
``gap >= -2%``.

Usage: python launch/bench/debd_quality.py [--quick] [--sets nltcs,plants] [--data-dir DIR]
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
DEFAULT_DEBD = REPO.parent / "shared" / "data" / "debd"

PUBLISHED = {"nltcs": -6.11, "plants": -12.97, "audio": -40.50, "jester": -53.48, "dna": -82.52}
FILES = {"audio": "baudio"}  # debd's file prefix where it differs from the set's name
ALPHAS = (0.05, 0.1, 0.2, 0.5, 1.0)


def load(name: str, split: str, debd: Path) -> np.ndarray:
    """One split as float64 ``(n, d)``."""
    return np.loadtxt(debd / f"{FILES.get(name, name)}.{split}.data.gz", delimiter=",")


def evaluate(root: Any, x: np.ndarray) -> float:
    """Mean log-likelihood of ``x`` under the circuit ``root`` (nats)."""
    from mpifc.circuit.spn import SPN

    return float(SPN(root).log_likelihood(x).mean())


def tune(name: str, debd: Path, grid: list[dict[str, Any]]) -> dict[str, Any]:
    """Grid search on valid; returns the chosen hyperparameters and valid/test LL."""
    from mpifc.circuit.learnspn import LearnSPNParams, learn_structure, resmooth

    tr, va, te = (load(name, s, debd) for s in ("ts", "valid", "test"))
    meta = ["discrete"] * tr.shape[1]
    best: dict[str, Any] = {"valid": -np.inf}
    learn_seconds = 0.0
    for cfg in grid:
        t0 = time.perf_counter()
        root = learn_structure(tr, meta, LearnSPNParams(alpha=1.0, seed=0, **cfg))
        learn_seconds += time.perf_counter() - t0
        for alpha in ALPHAS:
            resmooth(root, alpha)
            v = evaluate(root, va)
            if v > best["valid"]:
                best = {"valid": v, "cfg": dict(cfg, alpha=alpha), "root": root}
        print(f"  {name} {cfg}: best valid so far {best['valid']:.4f} ({best['cfg']})", flush=True)
    resmooth(best["root"], best["cfg"]["alpha"])
    best["test"] = evaluate(best["root"], te)
    best["learn_seconds"] = learn_seconds
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller grid (see above)")
    p.add_argument("--sets", type=str, default=",".join(PUBLISHED), help="comma-separated set names")
    p.add_argument("--data-dir", type=str, default=str(DEFAULT_DEBD))
    args = p.parse_args()
    debd = Path(args.data_dir)
    if not debd.exists():
        sys.exit(f"debd data not found at {debd} (use --data-dir)")
    import torch

    torch.set_num_threads(1)  # the evaluator's batches are small; threads only contend
    pvals, mis = ((0.0015, 1e-6), (50,)) if args.quick else ((0.0015, 1e-6), (50, 100, 200))
    grid = [dict(col_split="gtest", gtest_pvalue=pv, min_instances_slice=m) for pv, m in itertools.product(pvals, mis)]
    rows = []
    t_all = time.perf_counter()
    for name in args.sets.split(","):
        if name not in PUBLISHED:
            sys.exit(f"--sets: unknown set {name!r} (known: {', '.join(PUBLISHED)})")
        rows.append((name, tune(name, debd, grid)))
    print(f"\nLearnSPN (G-test, k-means k=2) on debd, tuned on valid; {'quick' if args.quick else 'full'} grid, "
          f"{time.perf_counter() - t_all:.0f} s total")
    print(f"{'set':<8}{'p-value':>9}{'min_inst':>9}{'alpha':>7}{'valid LL':>10}{'test LL':>10}"
          f"{'published':>11}{'gap':>8}{'learn s':>9}")
    for name, b in rows:
        c = b["cfg"]
        gap = (b["test"] - PUBLISHED[name]) / abs(PUBLISHED[name])
        print(f"{name:<8}{c['gtest_pvalue']:>9g}{c['min_instances_slice']:>9}{c['alpha']:>7g}{b['valid']:>10.3f}"
              f"{b['test']:>10.3f}{PUBLISHED[name]:>11.2f}{gap:>+8.1%}{b['learn_seconds']:>9.1f}")


if __name__ == "__main__":
    main()
