#!/usr/bin/env python
"""Old defaults beside new: ``mpifc train`` with nothing but the shard folder and ``--model``.

Usage (from the repo root, venv python)::

    OMP_NUM_THREADS=1 python launch/bench/defaults.py [--seeds 0,1,2,3,4] [--groups bc,adult,credit,debd,heldout]
        [--max-rows 20000] [--settings vertical,hybrid] [--sides old,new] [--out DIR] [--json FILE]

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
(``--max-rows``) central, horizontal 5, vertical 2, hybrid 2; the DEBD sets ``debd_quality.py``
lists (``PUBLISHED``, those present in ``$MPIFC_DATA/debd``) as one central client; ``heldout``: public
tables the defaults were not tuned on, shipped inside installed packages and written to the out
folder as ``--dataset csv`` files (:data:`HELDOUT`: wine from scikit-learn, fair and anes96 from
statsmodels), vertical 2 and hybrid 2 clients. ``--sides new`` runs the new defaults alone (the
first table's old columns and the goals against the old side are then left out). Per cell: accuracy, macro F1 (classification
cells), test LL (nats per row), ``wall``: seconds the ``mpiexec ... mpifc train`` command took
(start-up, imports, reading, learning, writing), ``cpu``: the job's critical path
(``train_seconds_critical_path``: the slowest client's CPU seconds of reading, learning and
serializing plus the server's), each as mean ± std over the seeds, and the goals: ``ok`` where
the new defaults reach them (breast cancer accuracy >= 0.93 and macro F1 >= 0.92, adult
accuracy >= 0.82, credit macro F1 >= 0.60, DEBD test LL within 2 % of the published LearnSPN
figure and wall time at most 2x the old; every cell: test LL at most 1 nat per row below the
old). A shared machine's load moves the times of both sides; compare them within a run.

A second table puts every cell in one place: ours (the new defaults) beside a central
HistGradientBoosting on the same training and test rows (the dataset's central shards for the
seed), the gap, our training bytes (all messages; the EM phase apart) and, for vertical cells,
SplitNN's at the table7 budget (closed form, which its ledger equals); DEBD cells beside the
published LearnSPN. Goals there: vertical and hybrid within 0.03 of HGB in accuracy and macro F1;
vertical bytes at most 1 MB and a tenth of SplitNN's.
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

def published_debd() -> dict[str, float]:
    """LearnSPN test LL (Gens & Domingos 2013) per DEBD file stem, as ``debd_quality.py`` (beside
    this script) lists the sets (audio's files are ``baudio``)."""
    from debd_quality import FILES, PUBLISHED

    return {FILES.get(name, name): ll for name, ll in PUBLISHED.items()}


PUBLISHED_DEBD = published_debd()

SPLITNN_EPOCHS, SPLITNN_CUT = 20, 8
"""The SplitNN budget of ``mpifc experiment table7`` / ``commcost`` (full runs), whose bytes the
table sets beside ours: ``commcost.splitnn_bytes``, which the SplitNN job's ledger equals."""

HGB_GAP = 0.03
"""Goal of the vertical and hybrid cells: accuracy and macro F1 at most this far below central HGB."""

BYTES_GOAL = 1_000_000
"""Goal of default vertical training: at most this many bytes (at 20,000 rows), and at most a
tenth of SplitNN's."""

BC_CELLS = [("horizontal", 2), ("horizontal", 3), ("horizontal", 5), ("vertical", 2), ("vertical", 3),
            ("hybrid", 2), ("hybrid", 3)]
TABLE_CELLS = [("central", 1), ("horizontal", 5), ("vertical", 2), ("hybrid", 2)]
HELDOUT_CELLS = [("vertical", 2), ("hybrid", 2)]


def _wine() -> tuple[Any, list[tuple[str, str]]]:
    from sklearn.datasets import load_wine

    d = load_wine(as_frame=True).frame
    return d, [(c, "real") for c in d.columns if c != "target"] + [("target", "categorical")]


def _fair() -> tuple[Any, list[tuple[str, str]]]:
    from statsmodels.datasets import fair

    d = fair.load_pandas().data.copy()
    d["affairs"] = (d["affairs"] > 0).astype(float)
    types = {"age": "real", "yrs_married": "real", "children": "real", "occupation": "categorical",
             "occupation_husb": "categorical"}
    return d, [(c, types.get(c, "discrete")) for c in d.columns if c != "affairs"] + [("affairs", "categorical")]


def _anes96() -> tuple[Any, list[tuple[str, str]]]:
    from statsmodels.datasets import anes96

    d = anes96.load_pandas().data.drop(columns=["logpopul"])
    types = {"popul": "real", "age": "real", "PID": "categorical"}
    return d, [(c, types.get(c, "discrete")) for c in d.columns if c != "vote"] + [("vote", "categorical")]


HELDOUT = {"wine": _wine, "fair": _fair, "anes96": _anes96}
"""Public tables inside installed packages the defaults were not tuned on: name -> a loader of
``(frame, [(column, type)])``, the target last (wine: 178 rows, 13 real columns, 3 cultivars;
fair: 6,366 rows, any affair; anes96: 944 rows, the 1996 vote)."""


def heldout_file(name: str, out: Path) -> Path:
    """The held-out table ``name`` as an NPY file with its schema under ``out/tables``."""
    path = out / "tables" / f"{name}.npy"
    if not path.is_file():
        frame, cols = HELDOUT[name]()
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, frame[[c for c, _ in cols]].to_numpy(dtype=np.float64))
        schema = {"columns": [{"name": c, "type": t} for c, t in cols], "target": cols[-1][0]}
        path.with_name(f"{name}.schema.json").write_text(json.dumps(schema) + "\n")
    return path


def cells(groups: list[str], max_rows: int) -> list[dict[str, Any]]:
    """The grid: dataset, setting, clients, rows, goal kind."""
    out: list[dict[str, Any]] = []
    if "bc" in groups:
        out += [dict(dataset="breast-cancer", setting=s, clients=c, max_rows=None, goal="bc") for s, c in BC_CELLS]
    for name in ("adult", "credit"):
        if name in groups:
            out += [dict(dataset=name, setting=s, clients=c, max_rows=max_rows, goal=name) for s, c in TABLE_CELLS]
    if "debd" in groups:
        root = Path(os.environ.get("MPIFC_DATA", REPO.parent / "shared" / "data")) / "debd"
        out += [dict(dataset=f"debd:{n}", setting="central", clients=1, max_rows=None, goal="debd")
                for n in PUBLISHED_DEBD if not root.is_dir() or list(root.glob(f"{n}.*"))]
    if "heldout" in groups:
        out += [dict(dataset=n, setting=s, clients=c, max_rows=None, goal="heldout")
                for n in HELDOUT for s, c in HELDOUT_CELLS]
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
        source = (["--dataset", "csv", "--path", str(heldout_file(cell["dataset"], out))]
                  if cell["goal"] == "heldout" else ["--dataset", cell["dataset"]])
        cmd = [sys.executable, "-m", "data_prep", *source, "--setting", cell["setting"],
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
    phases = summary.get("bytes_by_phase") or {}
    return {"accuracy": ev.get("accuracy"), "f1_macro": ev.get("f1_macro"), "test_ll": ev["test_ll"], "wall": wall,
            "cpu": summary["train_seconds_critical_path"], "n_parameters": summary["n_parameters"],
            "bytes": summary["bytes_train"], "em_bytes": phases.get("em") if isinstance(phases, dict) else None,
            "n_train": summary.get("n_train") or n_train(shards)}


def n_train(shards: Path) -> int:
    """Training rows of the first client (every row, for vertical shards)."""
    return int(json.loads((shards / "manifest.json").read_text())["clients"][0]["n_train"])


def hgb_anchor(cell: dict[str, Any], seed: int, out: Path, timeout: float) -> dict[str, Any] | None:
    """Central HistGradientBoosting on the same training and test rows (the dataset's central
    shards for the seed: every feature of every row), or None for a cell without classes."""
    if cell["goal"] == "debd":
        return None
    from mpifc.baselines.central import run_central

    central = prepare(dict(cell, setting="central", clients=1), seed, "keep", out, timeout)
    r = run_central(str(central), "hgb", seed)
    return {"accuracy": r["accuracy"], "f1_macro": r["f1"]}


def splitnn_train_bytes(shards: Path, n_rows: int) -> int | None:
    """SplitNN's training bytes on these vertical shards at the table7 budget (payload and
    headers, the closed forms its ledger equals), or None where SplitNN does not apply."""
    from mpifc.analysis.commcost import splitnn_bytes, splitnn_messages, with_headers

    m = json.loads((shards / "manifest.json").read_text())
    if m["setting"] != "vertical" or not m.get("classes"):
        return None
    c, k = int(m["n_clients"]), len(m["classes"])
    payload = splitnn_bytes(c, SPLITNN_CUT, n_rows, SPLITNN_EPOCHS, n_classes=k)
    return with_headers(payload, splitnn_messages(c, n_rows, SPLITNN_EPOCHS, 32), ndim=2)


def mean_std(values: list[float | None]) -> tuple[float, float] | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return float(np.mean(vals)), float(np.std(vals))


def goals(cell: dict[str, Any], old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The goals this cell's new defaults miss (empty: all met), on the means over seeds."""
    miss = []
    if old["test_ll"] is not None and new["test_ll"][0] < old["test_ll"][0] - 1.0:
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
        if old["wall"] is not None and new["wall"][0] > 2.0 * old["wall"][0]:
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
    p.add_argument("--groups", default="bc,adult,credit,debd",
                   help="bc, adult, credit, debd, heldout (comma-separated; default bc,adult,credit,debd)")
    p.add_argument("--max-rows", type=int, default=20000, help="rows of adult and credit (default 20000)")
    p.add_argument("--settings", default=None,
                   help="only cells of these settings (comma-separated, e.g. vertical,hybrid; default: all)")
    p.add_argument("--sides", default="old,new", help="old, new or both (comma-separated; default old,new)")
    p.add_argument("--out", default=None, help="folder for shards and models (default: a temporary one)")
    p.add_argument("--json", default=None, help="also write every measurement here")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds any one command may take")
    a = p.parse_args()
    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    groups = [g.strip() for g in a.groups.split(",") if g.strip()]
    unknown = sorted(set(groups) - {"bc", "adult", "credit", "debd", "heldout"})
    if unknown:
        raise SystemExit(f"--groups: unknown {unknown}; known: bc, adult, credit, debd, heldout")
    sides = [w.strip() for w in a.sides.split(",") if w.strip()]
    if "new" not in sides or set(sides) - {"old", "new"}:
        raise SystemExit(f"--sides: {a.sides!r}; use new or old,new")
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="mpifc-defaults-"))
    grid = cells(groups, a.max_rows)
    if a.settings:
        grid = [c for c in grid if c["setting"] in {x.strip() for x in a.settings.split(",")}]
    rows = []
    t_all = time.perf_counter()
    for cell in grid:
        runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
        anchors = []
        for seed in seeds:
            order = ("old", "new") if seed % 2 == 0 else ("new", "old")
            for which in (w for w in order if w in sides):
                runs[which].append(side(cell, seed, which, out, a.timeout))
            anchors.append(hgb_anchor(cell, seed, out, a.timeout))
            shards = prepare(cell, seed, "keep", out, a.timeout)
            runs["new"][-1]["splitnn_bytes"] = splitnn_train_bytes(shards, runs["new"][-1]["n_train"])
            print(f"{cell['dataset']} {cell['setting']} {cell['clients']} seed {seed}: "
                  + "  ".join(f"{w} acc {r['accuracy']} f1 {r['f1_macro']} ll {r['test_ll']:.3f} wall {r['wall']:.1f} s "
                              f"cpu {r['cpu']:.2f} s" for w, r in ((w, runs[w][-1]) for w in ("old", "new") if runs[w])),
                  flush=True)
        agg = {w: {k: mean_std([r.get(k) for r in rs]) for k in ("accuracy", "f1_macro", "test_ll", "wall", "cpu",
                                                                   "bytes", "em_bytes", "splitnn_bytes")}
               for w, rs in runs.items()}
        agg["hgb"] = {k: mean_std([h[k] if h else None for h in anchors]) for k in ("accuracy", "f1_macro")}
        rows.append({"cell": cell, "runs": runs, "hgb": anchors, "agg": agg,
                     "missed": goals(cell, agg["old"], agg["new"]) + anchor_goals(cell, agg)})
    lines = []
    for r in rows:
        c, o, n = r["cell"], r["agg"]["old"], r["agg"]["new"]
        pair = lambda k, dg: f"{fmt(o[k], dg)} / {fmt(n[k], dg)}"  # noqa: E731
        lines.append(f"{c['dataset']:<14}{c['setting'] + ' ' + str(c['clients']):<13}{pair('accuracy', 3):>28}"
                     f"{pair('f1_macro', 3):>28}{pair('test_ll', 2):>30}{pair('wall', 1):>26}{pair('cpu', 2):>26}  "
                     f"{verdict(r)}")
    print_table(f"mpifc train defaults, old (--preset learner, validation rows merged) / new (no flags); "
                f"seeds {','.join(map(str, seeds))}; mean±std; {time.perf_counter() - t_all:.0f} s in all",
                f"{'dataset':<14}{'setting':<13}{'accuracy old / new':>28}{'macro F1 old / new':>28}"
                f"{'test LL old / new':>30}{'wall s old / new':>26}{'cpu s old / new':>26}  goals", lines)
    print_one_table(rows, seeds)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1, default=float) + "\n")


def anchor_goals(cell: dict[str, Any], agg: dict[str, Any]) -> list[str]:
    """Vertical and hybrid cells: accuracy and macro F1 within :data:`HGB_GAP` of central HGB;
    vertical: bytes within :data:`BYTES_GOAL` and a tenth of SplitNN's (means over seeds)."""
    miss = []
    new, hgb = agg["new"], agg["hgb"]
    if cell["setting"] in ("vertical", "hybrid") and hgb["accuracy"] is not None and new["accuracy"] is not None:
        if new["accuracy"][0] < hgb["accuracy"][0] - HGB_GAP or new["f1_macro"][0] < hgb["f1_macro"][0] - HGB_GAP:
            miss.append("vs HGB")
    if cell["setting"] == "vertical" and new["bytes"] is not None:
        if new["bytes"][0] > BYTES_GOAL or (new["splitnn_bytes"] and new["bytes"][0] > new["splitnn_bytes"][0] / 10):
            miss.append("bytes")
    return miss


def print_one_table(rows: list[dict[str, Any]], seeds: list[int]) -> None:
    """Every cell in one table: ours on default flags beside central HGB (classification) or the
    published LearnSPN (DEBD), and our training bytes beside SplitNN's (vertical)."""
    lines = []
    for r in rows:
        c, n, h = r["cell"], r["agg"]["new"], r["agg"]["hgb"]
        pair = lambda d: ("-" if d["accuracy"] is None else f"{d['accuracy'][0]:.3f} / {d['f1_macro'][0]:.3f}")  # noqa: E731
        gap = ("-" if h["accuracy"] is None or n["accuracy"] is None else
               f"{n['accuracy'][0] - h['accuracy'][0]:+.3f} / {n['f1_macro'][0] - h['f1_macro'][0]:+.3f}")
        kb = lambda v: "-" if v is None else f"{v[0] / 1e3:.1f} kB"  # noqa: E731
        pub = PUBLISHED_DEBD.get(c["dataset"].partition(":")[2]) if c["goal"] == "debd" else None
        lines.append(f"{c['dataset']:<14}{c['setting'] + ' ' + str(c['clients']):<13}{pair(n):>16}{pair(h):>16}"
                     f"{gap:>16}{kb(n['bytes']):>12}{kb(n['em_bytes']):>11}{kb(n['splitnn_bytes']):>15}"
                     f"{n['test_ll'][0]:>10.2f}{'-' if pub is None else f'{pub:.2f}':>11}  {verdict(r)}")
    print_table(f"mpifc train on default flags, one table; seeds {','.join(map(str, seeds))}; mean over seeds "
                f"(gap: ours - HGB, accuracy / macro F1; SplitNN: {SPLITNN_EPOCHS} epochs, cut {SPLITNN_CUT})",
                f"{'dataset':<14}{'setting':<13}{'ours acc / F1':>16}{'HGB acc / F1':>16}{'gap':>16}"
                f"{'ours bytes':>12}{'of it EM':>11}{'SplitNN bytes':>15}{'test LL':>10}{'published':>11}  goals",
                lines)


def verdict(row: dict[str, Any]) -> str:
    return "ok" if not row["missed"] else "missed: " + ", ".join(row["missed"])


def print_table(title: str, head: str, lines: list[str]) -> None:
    print(f"\n{title}")
    print(head)
    print("-" * len(head))
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
