#!/usr/bin/env python
"""Batch queries on 100,000 Adult rows: ``mpifc.load(...)`` and ``mpifc query`` beside
HistGradientBoosting (HGB), measured side by side in one run.

Usage (from the repo root, venv python; needs pandas, from the ``test`` extra)::

    OMP_NUM_THREADS=1 python launch/bench/queries.py [--rows 100000] [--repeat 3] [--work DIR]

Set-up (kept in ``--work`` for the next run): Adult on 3 horizontal clients (``python -m
data_prep --dataset adult --setting horizontal --clients 3 --seed 0``), the model of ``mpifc
train`` with default flags (:func:`mpifc.simulate`, the same model without MPI), and the
anchor: one central HGB (``HistGradientBoostingClassifier(random_state=0)``, categorical columns
as categories) fitted on the union of the clients' training rows. The query rows are
``--rows`` rows drawn with replacement (seed 0) from Adult's own test rows, written as a CSV in
the user's units and labels (empty cell: missing).

Python API, in this process (``OMP_NUM_THREADS=1`` on both sides): ours is
``fc.predict_proba(df)``, ``fc.log_likelihood(df)`` and ``fc.marginal(df, keep=...)`` on the
DataFrame ``pandas.read_csv`` gives, encoding included (also shown: the encoding alone and
``predict_proba`` on model rows); HGB is ``predict_proba`` on its own ready input (a float
array of category codes and numbers, its encoding not counted). Rows/s is the median of
``--repeat`` rounds, each round timing HGB and every call of ours one after the other (so a
change of the machine's load meets both sides). The answers of ours are checked against the reference upward pass
(:mod:`mpifc.federated.evaluate`) on the first 2,000 rows.

Command line: ``python -m mpifc query MODEL --data ROWS.csv --what predict --out A.csv`` against
a script that unpickles the HGB, reads the same CSV with pandas, encodes it, predicts and writes
the same answer table; each the median wall time of ``--repeat`` runs, each run's peak RSS from
``wait4``. Every ``--what`` is timed once more on the CSV (``ll``, ``marginal``; ``mpe`` and
``sample`` on the first 2,000 rows).

Goals: API ``predict_proba``, ``log_likelihood`` and ``marginal`` at least HGB's rows/s; the
command at most 1.5x the HGB script's time and at most 300 MB peak RSS.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import pickle
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

GOAL_API_RATIO, GOAL_CLI_RATIO, GOAL_CLI_MB = 1.0, 1.5, 300.0
KEEP = ["age", "education", "hours-per-week"]

HGB_SCRIPT = '''\
import pickle, sys
import numpy as np
import pandas as pd

model, data, out = sys.argv[1:4]
with open(model, "rb") as f:
    saved = pickle.load(f)
df = pd.read_csv(data)
cols = []
for name, labels in zip(saved["features"], saved["categories"]):
    if labels is None:
        cols.append(df[name].to_numpy(dtype=np.float64))
    else:
        codes = pd.Categorical(df[name], categories=labels).codes.astype(np.float64)
        codes[codes < 0] = np.nan
        cols.append(codes)
proba = saved["hgb"].predict_proba(np.column_stack(cols))
classes = saved["classes"]
table = pd.DataFrame({"row": np.arange(1, len(df) + 1), saved["target"]: np.asarray(classes, dtype=object)[proba.argmax(1)]})
for c, label in enumerate(classes):
    table["p_" + label] = proba[:, c]
table.to_csv(out, index=False)
'''


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"


def setup(work: Path, n_rows: int) -> dict[str, Any]:
    """Shards, model, HGB and the query CSV under ``work`` (made once)."""
    import mpifc
    from data_prep.datasets import load_dataset
    from data_prep.shards import read_client, read_test

    work.mkdir(parents=True, exist_ok=True)
    shards, model, hgb_file = work / "shards", work / "fc.h5", work / "hgb.pkl"
    rows_csv = work / f"adult-{n_rows}.csv"
    if not (shards / "manifest.json").exists():
        subprocess.run([sys.executable, "-m", "data_prep", "--dataset", "adult", "--setting", "horizontal",
                        "--clients", "3", "--seed", "0", "--out", str(shards)], check=True, env=_env(),
                       stdout=subprocess.DEVNULL)
    if not model.exists():
        t0 = time.perf_counter()
        mpifc.simulate(shards, model=model)
        print(f"trained the model (mpifc.simulate, default flags) in {time.perf_counter() - t0:.1f} s")
    raw = load_dataset("adult")
    where = {int(i): k for k, i in enumerate(raw.ids)}
    n_clients = 3
    train = np.concatenate([read_client(shards, c).ids_train for c in range(n_clients)])
    test = read_test(shards).ids
    cats = [raw.categories.get(f) if mt == "categorical" else None for f, mt in zip(raw.features, raw.meta_types)]
    if not hgb_file.exists():
        from sklearn.ensemble import HistGradientBoostingClassifier

        rows = [where[int(i)] for i in train]
        hgb = HistGradientBoostingClassifier(categorical_features=np.array([c is not None for c in cats]),
                                             random_state=0).fit(raw.x[rows], raw.y[rows])
        with open(hgb_file, "wb") as f:
            pickle.dump({"hgb": hgb, "features": raw.features, "categories": cats, "classes": list(raw.classes),
                         "target": raw.target}, f)
    pick = np.random.default_rng(0).choice([where[int(i)] for i in test], n_rows)
    if not rows_csv.exists():
        tmp = rows_csv.with_suffix(".tmp")
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(list(raw.features) + [raw.target])
            for r in pick:
                cells = []
                for j, labels in enumerate(cats):
                    v = raw.x[r, j]
                    cells.append("" if np.isnan(v) else labels[int(v)] if labels is not None else
                                 (str(int(v)) if float(v).is_integer() else repr(float(v))))
                w.writerow(cells + [raw.classes[int(raw.y[r])]])
        tmp.replace(rows_csv)
    return {"shards": shards, "model": model, "hgb": hgb_file, "csv": rows_csv, "hgb_x": raw.x[pick],
            "n_clients": n_clients}


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float, Any]:
    """Median wall and CPU seconds of ``repeat`` calls, and the last result."""
    walls, cpus, out = [], [], None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus), out


def api(s: dict[str, Any], repeat: int) -> list[tuple[str, float, float]]:
    """Rows/s of ours and HGB's (wall time); returns ``(name, ours, hgb)`` per goal."""
    import pandas as pd

    import mpifc
    from mpifc.federated import evaluate as E

    with open(s["hgb"], "rb") as f:
        hgb = pickle.load(f)["hgb"]
    fc = mpifc.load(s["model"])
    df = pd.read_csv(s["csv"])
    n = len(df)
    t_load, c_load, _ = timed(lambda: mpifc.load(s["model"]).predict_proba(df.iloc[:1]), 1)
    x = fc.encode(df)
    calls = {"hgb": lambda: hgb.predict_proba(s["hgb_x"]), "enc": lambda: fc.encode(df),
             "pp": lambda: fc.predict_proba(df), "ppx": lambda: fc.predict_proba(x),
             "ll": lambda: fc.log_likelihood(df), "mg": lambda: fc.marginal(df, keep=KEEP)}
    runs: dict[str, list[tuple[float, float, Any]]] = {k: [] for k in calls}
    for _ in range(repeat):  # interleaved, so every call meets the same load as HGB's
        for k, fn in calls.items():
            runs[k].append(timed(fn, 1))
    hgb_t, enc_t, pp_t, ppx_t, ll_t, mg_t = (
        (statistics.median(r[0] for r in runs[k]), statistics.median(r[1] for r in runs[k]), runs[k][-1][2])
        for k in calls)
    print(f"\nPython API, {n:,} rows, OMP_NUM_THREADS=1, median of {repeat} (load {_load()})")
    print(f"  {'':44}{'wall rows/s':>12}{'CPU rows/s':>12}  wall vs HGB")
    print(f"  {'HGB predict_proba (its ready input)':44}{n / hgb_t[0]:>12,.0f}{n / hgb_t[1]:>12,.0f}")
    rows = [("predict_proba(df)", pp_t), ("log_likelihood(df)", ll_t), (f"marginal(df, keep={KEEP})", mg_t)]
    for name, t in rows + [("predict_proba(model rows)", ppx_t), ("encode(df) alone", enc_t)]:
        print(f"  {'ours ' + name:44}{n / t[0]:>12,.0f}{n / t[1]:>12,.0f}  {hgb_t[0] / t[0]:.2f}x")
    print(f"  ours load + first query: {t_load:.3f} s wall, {c_load:.3f} s CPU")
    # The same answers as the reference upward pass.
    head = x[:2000]
    t = fc.features.index(fc.target)
    blank = head.copy()
    blank[:, t] = np.nan
    worst = max(float(np.max(np.abs(fc.log_likelihood(head) - E.log_likelihood(fc.fc, head)))),
                float(np.max(np.abs(np.log(fc.predict_proba(head)) - E.predict_log_proba(fc.fc, blank, fc.target)))),
                float(np.max(np.abs(fc.marginal(head, KEEP) - E.log_likelihood(fc.fc, fc.keep_columns(head, KEEP))))))
    print(f"  largest difference from the reference upward pass (2,000 rows, nats): {worst:.2e}")
    assert worst < 1e-9 and np.isfinite(ll_t[2]).all() and np.isfinite(mg_t[2]).all()
    assert np.allclose(pp_t[2].sum(1), 1)
    return [(name, n / t[0], n / hgb_t[0]) for name, t in rows]


MEASURE = """import json, resource, subprocess, sys, time
t0 = time.perf_counter()
r = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
wall = time.perf_counter() - t0
u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": r.returncode, "wall": wall, "cpu": u.ru_utime + u.ru_stime, "mb": u.ru_maxrss / 1024.0,
                  "out": r.stdout, "err": r.stderr[-2000:]}))
"""
"""Runs a command from a small process of its own, so that its peak RSS (``ru_maxrss`` of the
children) is the command's, not that of the benchmark it was forked from."""


def _env() -> dict[str, str]:
    """The children's environment: one thread each, this checkout first, bytecode cached as in
    a user's install (a set ``PYTHONDONTWRITEBYTECODE`` would recompile mpifc on every start)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _run_rss(cmd: list[str]) -> tuple[float, float, float, str]:
    """Wall seconds, CPU seconds, peak RSS (MB) and stdout of ``cmd``."""
    r = subprocess.run([sys.executable, "-c", MEASURE, *map(str, cmd)], capture_output=True, text=True, env=_env(),
                       cwd=REPO)
    res = json.loads(r.stdout)
    if r.returncode != 0 or res["rc"] != 0:
        raise SystemExit(f"failed ({res['rc']}): {' '.join(map(str, cmd))}\n{res['err']}")
    return res["wall"], res["cpu"], res["mb"], res["out"]


def cli(s: dict[str, Any], work: Path, repeat: int) -> tuple[float, float, float, float]:
    """``mpifc query --what predict`` against the HGB script: (ours s, ours MB, HGB s, HGB MB)."""
    script = work / "hgb_predict.py"
    script.write_text(HGB_SCRIPT)
    ours_cmd = [sys.executable, "-m", "mpifc", "query", str(s["model"]), "--data", str(s["csv"]), "--what",
                "predict", "--out", str(work / "ours.csv")]
    hgb_cmd = [sys.executable, str(script), str(s["hgb"]), str(s["csv"]), str(work / "hgb.csv")]
    ours, theirs = [], []
    for _ in range(repeat):  # interleaved, so both meet the same load
        ours.append(_run_rss(ours_cmd))
        theirs.append(_run_rss(hgb_cmd))
    t_o, t_h = statistics.median(r[0] for r in ours), statistics.median(r[0] for r in theirs)
    c_o, c_h = statistics.median(r[1] for r in ours), statistics.median(r[1] for r in theirs)
    mb_o, mb_h = max(r[2] for r in ours), max(r[2] for r in theirs)
    print(f"\nmpifc query --what predict on {s['csv'].name}, median of {repeat} (load {_load()})")
    print(f"  HGB script (unpickle, pandas read_csv, encode, predict_proba, to_csv)  {t_h:6.2f} s wall "
          f"{c_h:6.2f} s CPU  peak {mb_h:5.0f} MB")
    print(f"  mpifc query                                                          {t_o:6.2f} s wall "
          f"{c_o:6.2f} s CPU  peak {mb_o:5.0f} MB   {t_o / t_h:.2f}x HGB's wall time, {c_o / c_h:.2f}x its CPU")
    print("  its summary: " + ours[-1][3].strip().replace("\n", "\n  "))
    agree = _agreement(work / "ours.csv", work / "hgb.csv")
    print(f"  labels agreeing with HGB's: {agree:.1%}")
    return t_o, mb_o, t_h, mb_h


def _agreement(a: Path, b: Path) -> float:
    with open(a, newline="") as fa, open(b, newline="") as fb:
        ra, rb = csv.reader(fa), csv.reader(fb)
        next(ra), next(rb)
        same = total = 0
        for x, y in zip(ra, rb):
            same += x[1] == y[1]
            total += 1
    return same / max(total, 1)


def other_questions(s: dict[str, Any], work: Path) -> None:
    """Every ``--what`` once more (``mpe``/``sample`` on the first 2,000 rows)."""
    small = work / "adult-2000.csv"
    with open(s["csv"]) as f, open(small, "w") as g:
        for i, line in enumerate(f):
            if i > 2000:
                break
            g.write(line)
    print(f"\nevery question (load {_load()})")
    for what, data, extra in (("ll", s["csv"], []), ("marginal", s["csv"], ["--keep", ",".join(KEEP)]),
                              ("mpe", small, []), ("sample", small, ["--n-samples", "2"])):
        wall, cpu, mb, _ = _run_rss([sys.executable, "-m", "mpifc", "query", str(s["model"]), "--data", str(data),
                                     "--what", what, "--out", str(work / f"ours-{what}.csv"), *extra])
        print(f"  --what {what:<9} {data.name:<18} {wall:6.2f} s wall {cpu:6.2f} s CPU  peak {mb:5.0f} MB")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000, help="query rows")
    p.add_argument("--repeat", type=int, default=3, help="runs per timing (median)")
    p.add_argument("--work", default=str(REPO / "results" / "bench-queries"), help="folder for the set-up and answers")
    a = p.parse_args(argv)
    work = Path(a.work)
    print(f"machine: {os.cpu_count()} cores; load {_load()}; OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    s = setup(work, a.rows)
    goals = api(s, a.repeat)
    t_o, mb_o, t_h, _ = cli(s, work, a.repeat)
    other_questions(s, work)
    print(f"\ngoals (load {_load()})")
    for name, ours, hgb in goals:
        ratio = ours / hgb
        print(f"  API {name}: {ratio:.2f}x HGB's rows/s (goal >= {GOAL_API_RATIO}): "
              f"{'met' if ratio >= GOAL_API_RATIO else 'NOT met'}")
    print(f"  CLI predict time: {t_o / t_h:.2f}x the HGB script (goal <= {GOAL_CLI_RATIO}): "
          f"{'met' if t_o / t_h <= GOAL_CLI_RATIO else 'NOT met'}")
    print(f"  CLI predict peak RSS: {mb_o:.0f} MB (goal <= {GOAL_CLI_MB:.0f}): "
          f"{'met' if mb_o <= GOAL_CLI_MB else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
