#!/usr/bin/env python
"""Old defaults beside new: ``mpifc train`` with nothing but the shard folder and ``--model``.

Usage (from the repo root, venv python)::

    OMP_NUM_THREADS=1 python launch/bench/defaults.py [--seeds 0,1,2,3,4] [--groups bc,adult,credit,debd]
        [--max-rows 20000] [--sides old,new] [--out DIR] [--json FILE]

For every cell and seed, one ``python -m data_prep`` shard folder, then two real ``mpiexec`` jobs
per side and the distributed evaluation (``mpifc evaluate --distributed --json``):

* **new**: ``mpifc train DIR --seed S --model M`` (the adaptive defaults,
  :mod:`mpifc.federated.defaults`), shards prepared with data_prep's defaults (a DEBD set keeps
  its own validation split out of the training rows);
* **old**: the defaults before the adaptive rule, i.e. ``--preset learner`` (LearnSPN's own
  threshold 0.3 and min_instances_slice 200, K = 2, random glue) on shards prepared as before
  (``--valid merge``: DEBD's validation rows among the training rows).

The two sides of a seed run back to back, old first on even seeds and new first on odd ones.
``--sides new`` runs the new side alone (no goals then): how the same script compares two
versions of the code, each run from its own checkout.

Cells: breast cancer horizontal 2/3/5, vertical 2/3, hybrid 2/3 clients; adult and credit
(``--max-rows``) central, horizontal 5, vertical 2, hybrid 2; the five DEBD sets
(``$MPIFC_DATA/debd``) as one central client. Per cell: accuracy, macro F1 (classification
cells), test LL (nats per row), ``wall``: seconds the ``mpiexec ... mpifc train`` command took
(start-up, imports, reading, learning, writing), ``cpu``: the job's critical path
(``train_seconds_critical_path``: the slowest client's CPU seconds of reading, learning and
serializing plus the server's), each as mean ± std over the seeds, and the goals: ``ok`` where
the new defaults reach them (breast cancer accuracy >= 0.93 and macro F1 >= 0.92, adult
accuracy >= 0.82, credit macro F1 >= 0.60, DEBD test LL within 2 % of the published LearnSPN
figure and wall time at most 2x the old; every cell: test LL at most 1 nat per row below the
old). A shared machine's load moves the times of both sides; compare them within a run.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from grouprun import run_checked  # beside this script

REPO = Path(__file__).resolve().parents[2]

PUBLISHED_DEBD = {"nltcs": -6.11, "plants": -12.97, "baudio": -40.50, "jester": -53.48, "dna": -82.52}
"""LearnSPN test LL (Gens & Domingos 2013) per DEBD file stem (audio's files are ``baudio``)."""

BC_CELLS = [("horizontal", 2), ("horizontal", 3), ("horizontal", 5), ("vertical", 2), ("vertical", 3),
            ("hybrid", 2), ("hybrid", 3)]
TABLE_CELLS = [("central", 1), ("horizontal", 5), ("vertical", 2), ("hybrid", 2)]


def cells(groups: list[str], max_rows: int) -> list[dict[str, Any]]:
    """The grid: dataset, setting, clients, rows, goal kind."""
    out: list[dict[str, Any]] = []
    if "bc" in groups:
        out += [dict(dataset="breast-cancer", setting=s, clients=c, max_rows=None, goal="bc") for s, c in BC_CELLS]
    for name in ("adult", "credit"):
        if name in groups:
            out += [dict(dataset=name, setting=s, clients=c, max_rows=max_rows, goal=name) for s, c in TABLE_CELLS]
    if "debd" in groups:
        out += [dict(dataset=f"debd:{n}", setting="central", clients=1, max_rows=None, goal="debd")
                for n in PUBLISHED_DEBD]
    return out


def run(cmd: list[str], timeout: float) -> tuple[str, float]:
    """Run ``cmd`` in a process group of its own; (stdout, wall seconds). A timeout ends the whole group."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return run_checked(cmd, timeout, env, REPO)


def last_json(text: str) -> dict[str, Any]:
    lines = [ln for ln in text.splitlines() if ln.startswith("{")]
    if not lines:
        raise SystemExit(f"no JSON summary in the output:\n{text[-2000:]}")
    return json.loads(lines[-1])


def mpiexec() -> str:
    cand = Path(sys.executable).parent / "mpiexec"
    return str(cand) if cand.exists() else "mpiexec"


def prepare(cell: dict[str, Any], seed: int, valid: str, out: Path, timeout: float) -> Path:
    d = out / "shards" / f"{cell['dataset'].replace(':', '-')}-{cell['setting']}-{cell['clients']}-s{seed}-{valid}"
    if not (d / "manifest.json").is_file():
        cmd = [sys.executable, "-m", "data_prep", "--dataset", cell["dataset"], "--setting", cell["setting"],
               "--clients", str(cell["clients"]), "--seed", str(seed), "--valid", valid, "--out", str(d)]
        if cell["max_rows"]:
            cmd += ["--max-rows", str(cell["max_rows"])]
        run(cmd, timeout)
    return d


def side(cell: dict[str, Any], seed: int, which: str, out: Path, timeout: float) -> dict[str, Any]:
    """Train (timed) and evaluate one side of one seed; the evaluation's metrics and the times."""
    shards = prepare(cell, seed, "merge" if which == "old" else "keep", out, timeout)
    model = out / "models" / f"{shards.name}-{which}.h5"
    model.parent.mkdir(parents=True, exist_ok=True)
    ranks = str(cell["clients"] + 1)
    extra = ["--preset", "learner"] if which == "old" else []
    text, wall = run([mpiexec(), "-n", ranks, sys.executable, "-m", "mpifc", "train", str(shards), "--seed", str(seed),
                      "--model", str(model), "--json", *extra], timeout)
    summary = last_json(text)
    text, _ = run([mpiexec(), "-n", ranks, sys.executable, "-m", "mpifc", "evaluate", str(shards), "--model",
                   str(model), "--distributed", "--json"], timeout)
    ev = last_json(text)
    return {"accuracy": ev.get("accuracy"), "f1_macro": ev.get("f1_macro"), "test_ll": ev["test_ll"], "wall": wall,
            "cpu": summary["train_seconds_critical_path"], "n_parameters": summary["n_parameters"]}


def mean_std(values: list[float | None]) -> tuple[float, float] | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return float(np.mean(vals)), float(np.std(vals))


def goals(cell: dict[str, Any], old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The goals this cell's new defaults miss (empty: all met), on the means over seeds."""
    miss = []
    if new["test_ll"][0] < old["test_ll"][0] - 1.0:
        miss.append("LL")
    g = cell["goal"]
    if g == "bc" and (new["accuracy"][0] < 0.93 or new["f1_macro"][0] < 0.92):
        miss.append("acc/F1")
    if g == "adult" and new["accuracy"][0] < 0.82:
        miss.append("acc")
    if g == "credit" and new["f1_macro"][0] < 0.60:
        miss.append("F1")
    if g == "debd":
        pub = PUBLISHED_DEBD[cell["dataset"].partition(":")[2]]
        if new["test_ll"][0] < pub - 0.02 * abs(pub):
            miss.append("LL vs published")
        if new["wall"][0] > 2.0 * old["wall"][0]:
            miss.append("time")
    return miss


def fmt(ms: tuple[float, float] | None, digits: int) -> str:
    return "-" if ms is None else f"{ms[0]:.{digits}f}±{ms[1]:.{digits}f}"


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}")  # run() then ends the job it waits for


def main() -> None:
    signal.signal(signal.SIGTERM, _stop)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds (default 0-4)")
    p.add_argument("--groups", default="bc,adult,credit,debd", help="bc, adult, credit, debd (comma-separated)")
    p.add_argument("--max-rows", type=int, default=20000, help="rows of adult and credit (default 20000)")
    p.add_argument("--out", default=None, help="folder for shards and models (default: a temporary one)")
    p.add_argument("--json", default=None, help="also write every measurement here")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds any one command may take")
    p.add_argument("--sides", default="old,new",
                   help="which sides to run: old, new or both (default old,new; goals need both)")
    a = p.parse_args()
    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    groups = [g.strip() for g in a.groups.split(",") if g.strip()]
    unknown = sorted(set(groups) - {"bc", "adult", "credit", "debd"})
    if unknown:
        raise SystemExit(f"--groups: unknown {unknown}; known: bc, adult, credit, debd")
    sides = [w.strip() for w in a.sides.split(",") if w.strip()]
    if not sides or set(sides) - {"old", "new"}:
        raise SystemExit(f"--sides: expected old, new or old,new, got {a.sides!r}")
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="mpifc-defaults-"))
    grid = cells(groups, a.max_rows)
    rows = []
    t_all = time.perf_counter()
    for cell in grid:
        runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
        for seed in seeds:
            order = ("old", "new") if seed % 2 == 0 else ("new", "old")
            for which in (w for w in order if w in sides):
                runs[which].append(side(cell, seed, which, out, a.timeout))
            print(f"{cell['dataset']} {cell['setting']} {cell['clients']} seed {seed}: "
                  + "  ".join(f"{w} acc {r['accuracy']} f1 {r['f1_macro']} ll {r['test_ll']:.3f} wall {r['wall']:.1f} s "
                              f"cpu {r['cpu']:.2f} s" for w, r in ((w, runs[w][-1]) for w in ("old", "new")
                                                                  if runs[w])),
                  flush=True)
        agg = {w: {k: mean_std([r[k] for r in rs]) for k in ("accuracy", "f1_macro", "test_ll", "wall", "cpu")}
               for w, rs in runs.items()}
        both = all(runs[w] for w in ("old", "new"))
        rows.append({"cell": cell, "runs": runs, "agg": agg,
                     "missed": goals(cell, agg["old"], agg["new"]) if both else None})
    print(f"\nmpifc train defaults, old (--preset learner, validation rows merged) / new (no flags); "
          f"seeds {','.join(map(str, seeds))}; mean±std; {time.perf_counter() - t_all:.0f} s in all")
    head = (f"{'dataset':<14}{'setting':<13}{'accuracy old / new':>28}{'macro F1 old / new':>28}"
            f"{'test LL old / new':>30}{'wall s old / new':>26}{'cpu s old / new':>26}  goals")
    print(head)
    print("-" * len(head))
    for r in rows:
        c, o, n = r["cell"], r["agg"]["old"], r["agg"]["new"]
        pair = lambda k, dg: f"{fmt(o[k], dg)} / {fmt(n[k], dg)}"  # noqa: E731
        print(f"{c['dataset']:<14}{c['setting'] + ' ' + str(c['clients']):<13}{pair('accuracy', 3):>28}"
              f"{pair('f1_macro', 3):>28}{pair('test_ll', 2):>30}{pair('wall', 1):>26}{pair('cpu', 2):>26}  "
              f"{'-' if r['missed'] is None else 'ok' if not r['missed'] else 'missed: ' + ', '.join(r['missed'])}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
