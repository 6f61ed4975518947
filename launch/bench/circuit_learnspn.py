#!/usr/bin/env python
"""LearnSPN speed and test log-likelihood, ours against SPFlow 1.1.0, side by side in one run.

Same hyperparameters for both: RDC threshold 0.3, k-means with 2 clusters, min_instances_slice
as listed. Cases:

  nltcs          debd nltcs (16 binary vars): train .ts, test .test; Bernoulli leaves
  breast-200     scikit-learn breast cancer, standardised, 450 train / 119 test, Gaussian leaves
  breast-100     the same with min_instances_slice 100
  plants         debd plants (69 binary vars); ours must finish in < 60 s; SPFlow gets a timeout

``seconds`` is the wall time of structure + parameter learning (for ours including compilation
into an evaluable SPN), imports and data loading excluded. Ours: median of ``--repeat`` runs in
this process. SPFlow: one run in a subprocess (so it can be killed at ``--spflow-timeout``).
``test LL`` is the mean test log-likelihood in nats; ``x faster`` is SPFlow's seconds over ours.

SPFlow 1.1.0 is patched *inside its worker process only* (site-packages is never edited):

* ``spflow.learn.learn_spn.rdc`` is wrapped to return 0 for a pair with a constant column, and
  for any pair where it raises; as shipped, its binary search over k ends on an empty eigenvalue
  set and crashes with ``RuntimeError: max(): Expected reduction dim ...`` whenever a slice holds
  a constant column (nltcs), and on some other pairs too (plants, after about 4 minutes);
* after learning, Bernoulli leaf probabilities are clamped to ``[1e-3, 1 - 1e-3]``; unclamped,
  p = 0/1 leaves make the test LL -inf/NaN.

Ours also runs once with its own default for binary data (G-test, p = 0.0015, as Gens & Domingos)
as a reference row; that row has no SPFlow counterpart.

Why SPFlow's nltcs LL is higher at the same threshold: its RDC ranks tied values in row order
("ordinal" copula, k=20). On binary data every column's tie blocks are then ordered by the same
row index, so independent sparse columns score RDC ~0.9 (two independent Bernoulli(0.05) columns,
n=5000: 0.956; the faithful RDC, |Pearson| for two-valued columns, gives 0.003). Inside k-means
clusters of nltcs SPFlow finds 89 of 120 pairs "dependent" where ours finds 4, so it almost never
splits columns and builds a deep mixture of factorised leaves. Ours runs a second nltcs row with
``rdc_ties="ordinal", rdc_k=20`` (the same statistic as SPFlow) to compare like with like.

Usage: python launch/bench/circuit_learnspn.py [--repeat 3] [--no-spflow] [--no-spflow-plants]
       [--spflow-timeout 300] [--data-dir DIR]
"""
from __future__ import annotations

import argparse
import json
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
DEFAULT_DEBD = REPO.parent / "shared" / "data" / "debd"
BERNOULLI_CLAMP = 1e-3

CASES: dict[str, dict[str, Any]] = {
    "nltcs": dict(data="nltcs", min_instances_slice=200),
    "breast-200": dict(data="breast", min_instances_slice=200),
    "breast-100": dict(data="breast", min_instances_slice=100),
    "plants": dict(data="plants", min_instances_slice=200),
}


def load_case(name: str, debd: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Train, test and meta-types of a case's data."""
    if name == "breast":
        from sklearn.datasets import load_breast_cancer

        x = load_breast_cancer().data.astype(np.float64)
        perm = np.random.default_rng(0).permutation(len(x))
        tr, te = x[perm[:450]], x[perm[450:]]
        mu, sd = tr.mean(0), tr.std(0)
        return (tr - mu) / sd, (te - mu) / sd, ["real"] * x.shape[1]
    path = debd / f"{name}.ts.data.gz"
    if not path.exists():
        raise FileNotFoundError(f"debd data not found: {path} (use --data-dir)")
    tr = np.loadtxt(path, delimiter=",")
    te = np.loadtxt(debd / f"{name}.test.data.gz", delimiter=",")
    return tr, te, ["discrete"] * tr.shape[1]


def run_ours(case: str, debd: Path, repeat: int, **override: Any) -> dict[str, Any]:
    """Learn with mpifc ``repeat`` times; median seconds, test LL of the last model."""
    from mpifc.circuit.graph import count_nodes
    from mpifc.circuit.learnspn import learn_spn

    spec = CASES[case]
    tr, te, meta = load_case(spec["data"], debd)
    # Warm-up (imports, first-call set-up) outside the timing, as SPFlow's imports are.
    learn_spn(np.random.default_rng(0).integers(0, 2, size=(60, 3)).astype(float), ["discrete"] * 3,
              min_instances_slice=20)
    kw = dict(threshold=0.3, row_split="kmeans", n_clusters=2,
              min_instances_slice=spec["min_instances_slice"], seed=0)
    kw.update(override)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        model = learn_spn(tr, meta, **kw)
        times.append(time.perf_counter() - t0)
    ll = model.log_likelihood(te)
    return dict(seconds=statistics.median(times), test_ll=float(ll.mean()), nan=int(np.isnan(ll).sum()),
                nodes=count_nodes(model.root))


def patch_spflow_rdc(spl: Any) -> None:
    """Make ``spflow.learn.learn_spn``'s RDC (module ``spl``) score a pair with a constant
    column, and any pair where it raises, as independent (0), in this process only (see the
    module doc)."""
    import torch

    original_rdc = spl.rdc

    def rdc_constant_safe(x: torch.Tensor, y: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        if bool((x == x[0]).all()) or bool((y == y[0]).all()):
            return torch.tensor(0.0, dtype=torch.float64)
        try:
            return original_rdc(x, y, *a, **k)
        except RuntimeError:
            # The same empty-eigenvalue crash also hits some non-constant pairs (plants, after
            # ~4 min): score them independent, as for a constant column.
            return torch.tensor(0.0, dtype=torch.float64)

    spl.rdc = rdc_constant_safe


def spflow_worker(case: str, debd: Path) -> dict[str, Any]:
    """One SPFlow learn_spn run (in its own process), patched as described in the module doc."""
    import importlib

    import torch

    # The package re-exports the function under the module's name, so fetch the module itself.
    spl = importlib.import_module("spflow.learn.learn_spn")
    from spflow.meta.data.scope import Scope
    from spflow.modules.leaves import Bernoulli, Normal

    torch.manual_seed(0)
    spec = CASES[case]
    tr, te, meta = load_case(spec["data"], debd)
    patch_spflow_rdc(spl)
    d = tr.shape[1]
    leaf_cls = Normal if meta[0] == "real" else Bernoulli
    leaf = leaf_cls(scope=Scope(list(range(d))), out_channels=1)
    xtr = torch.tensor(tr, dtype=torch.float64)
    t0 = time.perf_counter()
    model = spl.learn_spn(xtr, leaf_modules=leaf, out_channels=1,
                          min_instances_slice=spec["min_instances_slice"],
                          partitioning_args=dict(threshold=0.3), clustering_args=dict(n_clusters=2))
    seconds = time.perf_counter() - t0
    if leaf_cls is Bernoulli:
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, Bernoulli):
                    m.probs = m.probs.clamp(BERNOULLI_CLAMP, 1 - BERNOULLI_CLAMP)
    with torch.no_grad():
        ll = model.log_likelihood(torch.tensor(te, dtype=torch.float64)).reshape(len(te), -1)[:, 0].numpy()
    return dict(seconds=seconds, test_ll=float(np.nanmean(ll)), nan=int(np.isnan(ll).sum()))


def run_spflow(case: str, debd: Path, timeout: float) -> dict[str, Any]:
    """SPFlow in a subprocess; ``{"timeout": s}`` or ``{"error": msg}`` when it does not finish."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", case, "--data-dir", str(debd)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(timeout=timeout)
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
    return dict(error=tail[:200])


def _fmt(r: dict[str, Any] | None) -> tuple[str, str]:
    if r is None:
        return "skipped", "-"
    if "timeout" in r:
        return f"> {r['timeout']:.0f} (timeout)", "-"
    if "error" in r:
        return "error", r["error"]
    nan = f" ({r['nan']} NaN)" if r.get("nan") else ""
    return f"{r['seconds']:.2f}", f"{r['test_ll']:.3f}{nan}"


def bench_learnspn(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run every case for ours and SPFlow, print a table and return its rows.

    ``args`` needs ``repeat``, ``no_spflow``, ``no_spflow_plants``, ``spflow_timeout`` and
    ``data_dir``; missing attributes take the command-line defaults.
    """
    repeat = int(getattr(args, "repeat", 3))
    debd = Path(getattr(args, "data_dir", None) or DEFAULT_DEBD)
    no_spflow = bool(getattr(args, "no_spflow", False))
    no_spflow_plants = bool(getattr(args, "no_spflow_plants", False))
    timeout = float(getattr(args, "spflow_timeout", 300.0))
    rows = []
    print("LearnSPN: RDC threshold 0.3, k-means k=2; seconds = learning wall time; test LL in nats")
    print(f"{'case':<26}{'ours s':>10}{'ours LL':>12}{'SPFlow s':>20}{'SPFlow LL':>14}{'x faster':>10}")
    for case in CASES:
        if case in ("nltcs", "plants") and not (debd / f"{case}.ts.data.gz").exists():
            print(f"{case:<26} skipped: {debd} has no {case} data")
            continue
        ours = run_ours(case, debd, 1 if case == "plants" else repeat)
        skip = no_spflow or (case == "plants" and no_spflow_plants)
        theirs = None if skip else run_spflow(case, debd, timeout)
        ratio = "-"
        if theirs and "seconds" in theirs:
            ratio = f"{theirs['seconds'] / ours['seconds']:.1f}"
        elif theirs and "timeout" in theirs:
            ratio = f"> {theirs['timeout'] / ours['seconds']:.0f}"
        label = f"{case} (mis {CASES[case]['min_instances_slice']})"
        s_t, ll_t = _fmt(theirs)
        print(f"{label:<26}{ours['seconds']:>10.2f}{ours['test_ll']:>12.3f}{s_t:>20}{ll_t:>14}{ratio:>10}",
              flush=True)
        rows.append(dict(case=case, ours=ours, spflow=theirs, ratio=ratio))
    # The same statistic as SPFlow (row-order tie-breaking, k=20) on nltcs.
    if (debd / "nltcs.ts.data.gz").exists():
        ref = run_ours("nltcs", debd, 1, rdc_ties="ordinal", rdc_k=20)
        label = "nltcs ours, SPFlow's RDC"
        print(f"{label:<26}{ref['seconds']:>10.2f}{ref['test_ll']:>12.3f}", flush=True)
        rows.append(dict(case="nltcs-ordinal", ours=ref))
    # Our default independence test for binary data, for reference (no SPFlow counterpart).
    for case in ("nltcs", "plants"):
        if (debd / f"{case}.ts.data.gz").exists():
            ref = run_ours(case, debd, 1, col_split="gtest", gtest_pvalue=0.0015)
            label = f"{case} ours, G-test p=.0015"
            print(f"{label:<26}{ref['seconds']:>10.2f}{ref['test_ll']:>12.3f}", flush=True)
            rows.append(dict(case=f"{case}-gtest", ours=ref))
    return rows


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3, help="runs of ours per case (median reported)")
    p.add_argument("--no-spflow", action="store_true", help="skip every SPFlow run")
    p.add_argument("--no-spflow-plants", action="store_true", help="skip SPFlow on plants only")
    p.add_argument("--spflow-timeout", type=float, default=300.0, help="seconds per SPFlow run")
    p.add_argument("--data-dir", type=str, default=str(DEFAULT_DEBD), help="debd folder")
    p.add_argument("--worker", type=str, default=None, help=argparse.SUPPRESS)
    return p


def main() -> None:
    args = _parser().parse_args()
    if args.worker:
        print(json.dumps(spflow_worker(args.worker, Path(args.data_dir))), flush=True)
        return
    bench_learnspn(args)


if __name__ == "__main__":
    main()
