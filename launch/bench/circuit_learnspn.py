#!/usr/bin/env python
"""LearnSPN speed and test log-likelihood, ours against SPFlow 1.1.0, side by side in one run.

Like for like: the same training rows, test rows and settings on both sides -- RDC threshold
0.3, k-means with 2 clusters, ``min_instances_slice`` as listed -- and SPFlow's RDC convention
on ours (``rdc_ties="ordinal"``: ties ranked in row order; ``rdc_k=20`` random features) and its
one k-means run per row split (``n_init=1``; SPFlow fits one ``fast_pytorch_kmeans`` model per
split). Cases:

  nltcs        DEBD nltcs (16 binary columns), 16,181 training rows; Bernoulli leaves
  breast-200   scikit-learn breast cancer, standardised, 450 training / 119 test rows; Gaussian leaves
  breast-100   the same with min_instances_slice 100
  plants-1000  DEBD plants (69 binary columns), its first 1,000 training rows on both sides
  plants       DEBD plants, all 17,412 training rows; SPFlow stops at ``--plants-timeout``

Test rows: the set's whole test split. Seconds are those of structure and parameter learning
(for ours including compilation into an evaluable SPN), imports and data loading excluded:
``wall`` (``perf_counter``) and ``cpu`` (``process_time`` of the learning process, which a
shared machine's load inflates far less). Ours: median of ``--repeat`` runs in this process;
SPFlow: one run in a subprocess, so that it can be stopped. ``x faster`` is SPFlow's seconds
over ours (``>``: a lower bound, SPFlow stopped at its limit: its seconds so far over ours).
``LL ok``: ours at least SPFlow's test LL. ``load``: the 1-minute load average as the row ends.
``model``: whether ours' model is bit for bit the pinned one (:data:`FINGERPRINTS`).

SPFlow 1.1.0 is patched *inside its worker process only* (site-packages is never edited):

* ``spflow.learn.learn_spn.rdc`` is wrapped to return 0 for a pair with a constant column, and
  for any pair where it raises; as shipped, its binary search over k ends on an empty eigenvalue
  set and crashes with ``RuntimeError: max(): Expected reduction dim ...`` whenever a slice holds
  a constant column (nltcs), and on some other pairs too (plants);
* after learning, Bernoulli leaf probabilities are clamped to ``[1e-3, 1 - 1e-3]``; unclamped,
  p = 0/1 leaves make the test LL -inf/NaN.

Where the two learners still differ: SPFlow tests every slice for a column split before it
checks ``min_instances_slice`` and tests the children of a product again; it clusters on all
columns of the slice's rows, including those of other product children. Ours stops at
``min_instances_slice`` and skips the column test where it cannot succeed (see
:mod:`mpifc.circuit.learnspn`).

Reference rows, ours only: the same sets with our own defaults (the faithful RDC, ``ties="max"``,
under which two-valued columns score ``|Pearson|``, k = 10, three k-means restarts), and with
the G-test column split. SPFlow's ordinal ties make independent sparse binary columns look
dependent (two independent Bernoulli(0.05) columns, n = 5000: RDC 0.956; the faithful RDC
0.003), so it rarely splits columns on binary data and builds a deep mixture of factorised leaves.

Measured 2026-11-28 on 2 shared cores, ``OMP_NUM_THREADS=1`` (ours: median of 3; 1-minute load
at the row's end):

  case         ours wall / cpu   ours LL   SPFlow wall / cpu   SPFlow LL   x wall   x cpu   load
  nltcs          1.68 s / 1.51    -6.078     319.4 s / 215.3      -6.179      190     142    7.9
  breast-200     0.13 s / 0.04   -32.586      41.7 s /  24.2     -32.840      322     551    5.1
  breast-100     0.08 s / 0.08   -29.678      72.3 s /  63.8     -31.498      895     797    3.0

Usage: python launch/bench/circuit_learnspn.py [--repeat 3] [--cases nltcs,breast-200,...]
       [--no-spflow] [--spflow-timeout 1800] [--plants-timeout 600] [--data-dir DIR]
"""
from __future__ import annotations

import argparse
import json
import os
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
DEFAULT_DEBD = REPO.parent / "shared" / "data" / "debd"
BERNOULLI_CLAMP = 1e-3

CASES: dict[str, dict[str, Any]] = {
    "nltcs": dict(data="nltcs", min_instances_slice=200, goal=100),
    "breast-200": dict(data="breast", min_instances_slice=200, goal=500),
    "breast-100": dict(data="breast", min_instances_slice=100, goal=500),
    "plants-1000": dict(data="plants", rows=1000, min_instances_slice=200, goal=100),
    "plants": dict(data="plants", min_instances_slice=200, goal=100, capped=True),
}

FINGERPRINTS = {"nltcs": "39f6bc12ce3e7f63", "breast-200": "f66b3f780f140285", "breast-100": "db271e351f4ff679",
                "plants-1000": "48df73d27782960f"}
"""Per case, :func:`fingerprint` of ours' like-for-like model (seed 0): a change that only makes
the learner faster keeps it (the ``same`` column); a change of the model shows ``CHANGED``."""

LIKE_FOR_LIKE = dict(rdc_ties="ordinal", rdc_k=20, n_init=1)
"""Ours with SPFlow's RDC convention and its one k-means run per row split."""

REFERENCES: dict[str, tuple[str, dict[str, Any]]] = {
    "nltcs ours, own defaults": ("nltcs", {}),
    "nltcs ours, G-test .0015": ("nltcs", dict(col_split="gtest", gtest_pvalue=0.0015)),
    "plants ours, own defaults": ("plants", {}),
    "plants ours, G-test .0015": ("plants", dict(col_split="gtest", gtest_pvalue=0.0015)),
}
"""Rows measured on ours alone (no SPFlow counterpart): case, settings over the case's own."""


def load_case(case: str, debd: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Training rows, test rows and meta-types of ``case``."""
    spec = CASES[case]
    if spec["data"] == "breast":
        from sklearn.datasets import load_breast_cancer

        x = load_breast_cancer().data.astype(np.float64)
        perm = np.random.default_rng(0).permutation(len(x))
        tr, te = x[perm[:450]], x[perm[450:]]
        mu, sd = tr.mean(0), tr.std(0)
        return (tr - mu) / sd, (te - mu) / sd, ["real"] * x.shape[1]
    name = spec["data"]
    path = debd / f"{name}.ts.data.gz"
    if not path.exists():
        raise FileNotFoundError(f"debd data not found: {path} (use --data-dir)")
    tr = np.loadtxt(path, delimiter=",")
    te = np.loadtxt(debd / f"{name}.test.data.gz", delimiter=",")
    if spec.get("rows"):
        tr = tr[: spec["rows"]]
    return tr, te, ["discrete"] * tr.shape[1]


def fingerprint(root: Any) -> str:
    """First 16 hex digits of a SHA-256 over the structure and every parameter of the circuit
    ``root``, node by node in topological order (bit for bit: weights and leaf parameters as bytes)."""
    import hashlib

    from mpifc.circuit.graph import LeafNode, SumNode, topological_order

    h = hashlib.sha256()
    for node in topological_order(root):
        if isinstance(node, LeafNode):
            params = tuple((k, np.asarray(v).tobytes()) for k, v in sorted(node.dist.params().items()))
            h.update(repr(("leaf", node.var, type(node.dist).__name__, params)).encode())
        elif isinstance(node, SumNode):
            h.update(repr(("sum", list(node.scope), len(node.children), np.asarray(node.weights).tobytes())).encode())
        else:
            h.update(repr(("product", list(node.scope), len(node.children))).encode())
    return h.hexdigest()[:16]


def run_ours(case: str, debd: Path, repeat: int, **settings: Any) -> dict[str, Any]:
    """Learn with mpifc ``repeat`` times (``settings`` over the shared ones); median wall and
    CPU seconds, test LL of the last model."""
    from mpifc.circuit.graph import count_nodes
    from mpifc.circuit.learnspn import learn_spn

    spec = CASES[case]
    tr, te, meta = load_case(case, debd)
    # Warm-up (imports, first-call set-up) outside the timing, as SPFlow's imports are.
    learn_spn(np.random.default_rng(0).integers(0, 2, size=(60, 3)).astype(float), ["discrete"] * 3,
              min_instances_slice=20)
    kw = dict(threshold=0.3, row_split="kmeans", n_clusters=2, min_instances_slice=spec["min_instances_slice"],
              seed=0)
    kw.update(settings)
    walls, cpus = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        model = learn_spn(tr, meta, **kw)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    ll = model.log_likelihood(te)
    return dict(wall=statistics.median(walls), cpu=statistics.median(cpus), test_ll=float(ll.mean()),
                nan=int(np.isnan(ll).sum()), nodes=count_nodes(model.root), rows=len(tr),
                fingerprint=fingerprint(model.root))


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
            # The same empty-eigenvalue crash also hits some non-constant pairs (plants):
            # score them independent, as for a constant column.
            return torch.tensor(0.0, dtype=torch.float64)

    spl.rdc = rdc_constant_safe


def spflow_worker(case: str, debd: Path) -> dict[str, Any]:
    """One SPFlow learn_spn run (in its own process), patched as described in the module doc.
    Prints a ``{"started": ...}`` line (flushed) before learning, so that a run stopped at its
    time limit still tells how long it had been learning."""
    import importlib

    import torch

    torch.set_num_threads(1)
    # The package re-exports the function under the module's name, so fetch the module itself.
    spl = importlib.import_module("spflow.learn.learn_spn")
    from spflow.meta.data.scope import Scope
    from spflow.modules.leaves import Bernoulli, Normal

    torch.manual_seed(0)
    spec = CASES[case]
    tr, te, meta = load_case(case, debd)
    patch_spflow_rdc(spl)
    d = tr.shape[1]
    leaf_cls = Normal if meta[0] == "real" else Bernoulli
    leaf = leaf_cls(scope=Scope(list(range(d))), out_channels=1)
    xtr = torch.tensor(tr, dtype=torch.float64)
    print(json.dumps({"started": {"cpu": time.process_time(), "wall": time.time()}}), flush=True)
    t0, c0 = time.perf_counter(), time.process_time()
    model = spl.learn_spn(xtr, leaf_modules=leaf, out_channels=1,
                          min_instances_slice=spec["min_instances_slice"],
                          partitioning_args=dict(threshold=0.3), clustering_args=dict(n_clusters=2))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if leaf_cls is Bernoulli:
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, Bernoulli):
                    m.probs = m.probs.clamp(BERNOULLI_CLAMP, 1 - BERNOULLI_CLAMP)
    with torch.no_grad():
        ll = model.log_likelihood(torch.tensor(te, dtype=torch.float64)).reshape(len(te), -1)[:, 0].numpy()
    return dict(wall=wall, cpu=cpu, test_ll=float(np.nanmean(ll)), nan=int(np.isnan(ll).sum()), rows=len(tr))


def _children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def run_spflow(case: str, debd: Path, timeout: float) -> dict[str, Any]:
    """SPFlow in a subprocess. Stopped at ``timeout`` wall seconds: ``{"stopped": True, "wall",
    "cpu"}`` with the seconds it had spent learning so far (lower bounds), or ``{"error": msg}``."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", case, "--data-dir", str(debd)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cpu_before = _children_cpu()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        child_cpu = _children_cpu() - cpu_before
        started = next((json.loads(ln)["started"] for ln in out.splitlines() if ln.startswith('{"started"')), None)
        if started is None:
            return dict(error=f"stopped at {timeout:.0f} s before learning began")
        return dict(stopped=True, wall=time.time() - started["wall"], cpu=child_cpu - started["cpu"])
    for line in reversed(out.splitlines()):
        if line.startswith("{") and not line.startswith('{"started"'):
            return json.loads(line)
    tail = (err.strip().splitlines() or ["no output"])[-1]
    return dict(error=tail[:200])


def _model_check(case: str, ours: dict[str, Any]) -> str:
    """``same`` when ours' model has the case's :data:`FINGERPRINTS` entry, else ``CHANGED``."""
    want = FINGERPRINTS.get(case)
    return "-" if want is None else ("same" if ours["fingerprint"] == want else "CHANGED")


def _ratio(theirs: dict[str, Any] | None, ours: dict[str, Any], key: str) -> tuple[str, float | None]:
    if not theirs or key not in theirs:
        return "-", None
    r = theirs[key] / ours[key]
    return (f"> {r:.0f}" if theirs.get("stopped") else f"{r:.0f}"), r


def _seconds(r: dict[str, Any] | None) -> tuple[str, str, str]:
    """wall, cpu and LL cells of one side."""
    if r is None:
        return "skipped", "-", "-"
    if "error" in r:
        return "error", "-", r["error"][:40]
    if r.get("stopped"):
        return f"> {r['wall']:.0f}", f"> {r['cpu']:.0f}", "stopped"
    nan = f" ({r['nan']} NaN)" if r.get("nan") else ""
    return f"{r['wall']:.2f}", f"{r['cpu']:.2f}", f"{r['test_ll']:.3f}{nan}"


HEADER = (f"{'case':<27}{'rows':>6}{'ours wall':>10}{'cpu':>8}{'ours LL':>9}{'SPFlow wall':>13}{'cpu':>9}"
          f"{'SPFlow LL':>11}{'x faster wall':>14}{'cpu':>7}{'LL ok':>7}{'goal':>6}{'load':>6}{'model':>9}")


def bench_learnspn(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run the cases for ours and SPFlow, print a table and return its rows.

    ``args`` may carry ``repeat``, ``cases``, ``no_spflow``, ``spflow_timeout``,
    ``plants_timeout`` and ``data_dir`` (missing: the command-line defaults).
    """
    repeat = int(getattr(args, "repeat", 3))
    debd = Path(getattr(args, "data_dir", None) or DEFAULT_DEBD)
    no_spflow = bool(getattr(args, "no_spflow", False))
    timeout = float(getattr(args, "spflow_timeout", 1800.0))
    plants_timeout = float(getattr(args, "plants_timeout", 600.0))
    cases = [c for c in str(getattr(args, "cases", None) or ",".join(CASES)).split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise SystemExit(f"--cases: unknown {unknown}; known: {', '.join(CASES)}")
    rows = []
    print("LearnSPN, like for like: RDC threshold 0.3 with SPFlow's convention (ordinal ties, k = 20), "
          "k-means k = 2, one k-means run per split; seconds of learning; test LL in nats per row")
    print(HEADER, flush=True)
    for case in cases:
        spec = CASES[case]
        if spec["data"] != "breast" and not (debd / f"{spec['data']}.ts.data.gz").exists():
            print(f"{case:<27} skipped: {debd} has no {spec['data']} data")
            continue
        ours = run_ours(case, debd, 1 if case == "plants" else repeat, **LIKE_FOR_LIKE)
        theirs = None if no_spflow else run_spflow(case, debd, plants_timeout if spec.get("capped") else timeout)
        wall_txt, wall_r = _ratio(theirs, ours, "wall")
        cpu_txt, _ = _ratio(theirs, ours, "cpu")
        ll_ok = "-" if not theirs or "test_ll" not in theirs else ("yes" if ours["test_ll"] >= theirs["test_ll"] else "no")
        s_wall, s_cpu, s_ll = _seconds(theirs)
        print(f"{case:<27}{ours['rows']:>6}{ours['wall']:>10.2f}{ours['cpu']:>8.2f}{ours['test_ll']:>9.3f}"
              f"{s_wall:>13}{s_cpu:>9}{s_ll:>11}{wall_txt:>14}{cpu_txt:>7}{ll_ok:>7}{spec['goal']:>6}"
              f"{os.getloadavg()[0]:>6.1f}{_model_check(case, ours):>9}", flush=True)
        rows.append(dict(case=case, ours=ours, spflow=theirs, ratio_wall=wall_r, ll_ok=ll_ok, goal=spec["goal"]))
    for label, (case, settings) in REFERENCES.items():
        if case not in cases:
            continue
        ref = run_ours(case, debd, 1, **settings)
        print(f"{label:<27}{ref['rows']:>6}{ref['wall']:>10.2f}{ref['cpu']:>8.2f}{ref['test_ll']:>9.3f}"
              f"{'':>83}{os.getloadavg()[0]:>6.1f}", flush=True)
        rows.append(dict(case=label, ours=ref))
    return rows


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3, help="runs of ours per case (median reported)")
    p.add_argument("--cases", type=str, default=",".join(CASES), help="comma-separated cases")
    p.add_argument("--no-spflow", action="store_true", help="skip every SPFlow run")
    p.add_argument("--spflow-timeout", type=float, default=1800.0,
                   help="wall seconds per SPFlow run (plants: --plants-timeout)")
    p.add_argument("--plants-timeout", type=float, default=600.0,
                   help="wall seconds SPFlow gets on all of plants; stopped there, the ratio is a lower bound")
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
