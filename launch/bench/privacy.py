#!/usr/bin/env python
"""The k-rows rule, measured: values that fewer than 5 rows hold, in every message and model file.

Usage (from the repo root, venv python)::

    OMP_NUM_THREADS=1 python launch/bench/privacy.py [--datasets bc,adult,credit]
        [--settings central,horizontal,vertical,hybrid] [--learners learnspn,factorized,ratspn,einet,dt]
        [--seeds 0] [--max-rows 5000] [--timing] [--dp-epsilons 1,10,100,1000] [--out DIR] [--json FILE]

For every dataset, setting, learner and seed: ``python -m data_prep`` shards with data_prep's
defaults (adult and credit capped at ``--max-rows`` rows), then a real ``mpiexec ... mpifc train``
with default flags but ``--learner`` and ``--audit DIR --audit-findings record`` (findings are
counted, not stopped). Per run:

* **messages**: the clients' messages (count, bytes) and what the audit found in them, per
  message kind (rare values:
  distinct values fewer than 5 of the sending client's rows hold, as float64 bytes at any offset
  or float32 in a float32 array; raw rows and raw columns);
* **model file**: distinct rare values of the whole shard set (model units) in the file's bytes,
  and numbers of the model's codec equal to a rare value of the source table (user units) or of
  the shard set (:func:`mpifc.fedpc.audit.model_findings`);
* ``--timing``: the same training without ``--audit`` beside it: the audit's cost in wall seconds.

``--dp-epsilons``: on breast cancer (horizontal and vertical, 3 clients), what ``--dp-epsilon E``
costs: the distributed evaluation's accuracy, macro F1 and test LL of the factorized learner at
each ``E`` (``--dp-seed`` = the seed) beside the same learner without noise.

A learner that cannot run a setting (RAT-SPN on a one-column client, FC[DT] where a client lacks
the target) is listed as such. The goal: 0 everywhere.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from grouprun import run_group  # noqa: E402  (beside this script)

from mpifc.circuit.privacy import MIN_LEAF_ROWS, rare_values  # noqa: E402
from mpifc.fedpc.audit import model_findings  # noqa: E402

DATASETS = {"bc": "breast-cancer", "adult": "adult", "credit": "credit"}
CLIENTS = {"central": 1, "horizontal": 3, "vertical": 3, "hybrid": 3}
LEARNERS = ("learnspn", "factorized", "ratspn", "einet", "dt")


def env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
                PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def mpiexec() -> str:
    cand = Path(sys.executable).parent / "mpiexec"
    return str(cand) if cand.exists() else "mpiexec"


def run(cmd: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    """``cmd`` in a process group of its own (a timeout, Ctrl-C or SIGTERM ends the whole group:
    mpiexec, its proxies and every rank); (the completed process, wall seconds)."""
    done, wall, _ = run_group(cmd, timeout, env(), REPO)
    return done, wall


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}")  # run() then ends the job it waits for


def prep_args(dataset: str, setting: str, seed: int, max_rows: int | None) -> dict[str, Any]:
    kw: dict[str, Any] = {"dataset": DATASETS[dataset], "setting": setting, "clients": CLIENTS[setting], "seed": seed}
    if max_rows and dataset != "bc":
        kw["max_rows"] = max_rows
    return kw


def shards_for(out: Path, kw: dict[str, Any], timeout: float) -> tuple[Path, np.ndarray]:
    """The shard folder (written once) and the rare values of the prepared table in user units."""
    from data_prep.prepare import prepare

    d = out / "shards" / f"{kw['dataset']}-{kw['setting']}-s{kw['seed']}"
    if not (d / "manifest.json").is_file():
        cmd = [sys.executable, "-m", "data_prep", "--out", str(d)]
        for key, v in kw.items():
            cmd += [f"--{key.replace('_', '-')}", str(v)]
        r, _ = run(cmd, timeout)
        if r.returncode != 0:
            raise SystemExit(f"data_prep failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    table = prepare(**kw).table
    numeric = [j for j, m in enumerate(table.meta_types) if m != "categorical"]
    return d, rare_values(table.x, numeric, MIN_LEAF_ROWS)


def train(shards: Path, learner: str, seed: int, out: Path, audit: bool, timeout: float
          ) -> tuple[subprocess.CompletedProcess, float, Path, Path]:
    manifest = json.loads((shards / "manifest.json").read_text())
    ranks = str(len(manifest["clients"]) + 1)
    tag = f"{shards.name}-{learner}" + ("" if audit else "-noaudit")
    model, aud = out / "models" / f"{tag}.h5", out / "audit" / tag
    model.parent.mkdir(parents=True, exist_ok=True)
    cmd = [mpiexec(), "-n", ranks, sys.executable, "-m", "mpifc", "train", str(shards), "--seed", str(seed),
           "--learner", learner, "--model", str(model), "--json"]
    if audit:
        cmd += ["--audit", str(aud), "--audit-findings", "record"]
    r, wall = run(cmd, timeout)
    return r, wall, model, aud


def cell(dataset: str, setting: str, learner: str, seed: int, a: argparse.Namespace, out: Path) -> dict[str, Any]:
    kw = prep_args(dataset, setting, seed, a.max_rows)
    shards, raw_rare = shards_for(out, kw, a.timeout)
    r, wall, model, aud = train(shards, learner, seed, out, True, a.timeout)
    row: dict[str, Any] = {"dataset": dataset, "setting": setting, "learner": learner, "seed": seed}
    if r.returncode != 0:
        lines = r.stderr.strip().splitlines() or ["?"]
        line = next((ln for ln in reversed(lines) if ln.startswith("mpifc:")), lines[-1])
        row["skipped"] = line[-160:]
        return row
    client_kinds: dict[str, dict[str, int]] = {}
    for path in sorted(aud.glob("audit-rank*.json")):
        doc = json.loads(path.read_text())
        if not doc["raw_shapes"]:
            continue  # a server: it holds no rows
        for k, e in doc["summary"]["kinds"].items():
            c = client_kinds.setdefault(k, {"messages": 0, "bytes": 0, "rare_values": 0, "raw_rows": 0,
                                            "raw_columns": 0})
            for f in c:
                c[f] += int(e[f])
    row.update(messages=client_kinds, model=model_findings(model, shards, raw_rare), wall=wall)
    row["rare_in_messages"] = sum(e["rare_values"] for e in row["messages"].values())
    row["raw_in_messages"] = sum(e["raw_rows"] + e["raw_columns"] for e in row["messages"].values())
    if a.timing:
        r2, wall2, *_ = train(shards, learner, seed, out, False, a.timeout)
        row["wall_no_audit"] = wall2 if r2.returncode == 0 else None
    return row


def dp_rows(epsilons: list[float], seeds: list[int], a: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Accuracy, macro F1 and test LL of factorized FedPCs on breast cancer per ``--dp-epsilon``."""
    rows = []
    for setting in ("horizontal", "vertical"):
        for seed in seeds:
            shards, _ = shards_for(out, prep_args("bc", setting, seed, None), a.timeout)
            ranks = str(CLIENTS[setting] + 1)
            for eps in [None, *epsilons]:
                model = out / "models" / f"{shards.name}-dp{eps}.h5"
                model.parent.mkdir(parents=True, exist_ok=True)
                extra = [] if eps is None else ["--dp-epsilon", str(eps), "--dp-seed", str(seed)]
                r, _ = run([mpiexec(), "-n", ranks, sys.executable, "-m", "mpifc", "train", str(shards), "--seed",
                            str(seed), "--learner", "factorized", "--refine", "none", "--model", str(model),
                            "--json", *extra], a.timeout)
                if r.returncode != 0:
                    raise SystemExit(f"--dp-epsilon {eps}: {r.stderr[-2000:]}")
                r, _ = run([mpiexec(), "-n", ranks, sys.executable, "-m", "mpifc", "evaluate", str(shards), "--model",
                            str(model), "--distributed", "--json"], a.timeout)
                ev = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("{")][-1])
                rows.append({"setting": setting, "seed": seed, "epsilon": eps, "accuracy": ev.get("accuracy"),
                             "f1_macro": ev.get("f1_macro"), "test_ll": ev["test_ll"]})
                print(f"dp  bc {setting:<11} seed {seed}  epsilon {'none' if eps is None else eps:>8}  "
                      f"accuracy {ev.get('accuracy'):.3f}  macro F1 {ev.get('f1_macro'):.3f}  "
                      f"test LL {ev['test_ll']:.2f}", flush=True)
    return rows


def main() -> None:
    signal.signal(signal.SIGTERM, _stop)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default="bc,adult,credit", help="bc, adult, credit (comma-separated)")
    p.add_argument("--settings", default="central,horizontal,vertical,hybrid")
    p.add_argument("--learners", default=",".join(LEARNERS))
    p.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    p.add_argument("--max-rows", type=int, default=5000, help="rows of adult and credit (default 5000)")
    p.add_argument("--timing", action="store_true", help="also train without --audit: the audit's cost")
    p.add_argument("--dp-epsilons", default="", help="also: breast cancer with --dp-epsilon at each of these "
                                                      "(comma-separated; default: none)")
    p.add_argument("--out", default=None, help="folder for shards, models and audits (default: a temporary one)")
    p.add_argument("--json", default=None, help="also write every row here")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds any one command may take")
    a = p.parse_args()
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="mpifc-privacy-"))
    datasets = [d.strip() for d in a.datasets.split(",") if d.strip()]
    settings = [s.strip() for s in a.settings.split(",") if s.strip()]
    learners = [x.strip() for x in a.learners.split(",") if x.strip()]
    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    bad = sorted(set(datasets) - set(DATASETS)) + sorted(set(settings) - set(CLIENTS)) + sorted(set(learners) - set(LEARNERS))
    if bad:
        raise SystemExit(f"unknown: {bad}")
    rows = []
    t0 = time.perf_counter()
    print(f"k = {MIN_LEAF_ROWS}; load average {os.getloadavg()[0]:.1f}; out {out}", flush=True)
    head = (f"{'dataset':<8}{'setting':<12}{'learner':<12}{'seed':>5}{'msgs':>7}{'kB':>9}{'rare in msgs':>14}"
            f"{'raw rows/cols':>15}{'rare in file':>14}{'codec user/model':>18}{'wall s':>9}{'no audit':>10}")
    print(head)
    print("-" * len(head), flush=True)
    for d in datasets:
        for s in settings:
            for learner in learners:
                for seed in seeds:
                    row = cell(d, s, learner, seed, a, out)
                    rows.append(row)
                    if "skipped" in row:
                        print(f"{d:<8}{s:<12}{learner:<12}{seed:>5}  n/a: {row['skipped']}", flush=True)
                        continue
                    m = row["model"]
                    nomsg = sum(e["messages"] for e in row["messages"].values())
                    kb = sum(e["bytes"] for e in row["messages"].values()) / 1e3
                    noaud = row.get("wall_no_audit")
                    print(f"{d:<8}{s:<12}{learner:<12}{seed:>5}{nomsg:>7}{kb:>9.1f}{row['rare_in_messages']:>14}"
                          f"{row['raw_in_messages']:>15}{m['file']:>14}"
                          f"{str(m['codec_user_units']) + '/' + str(m['codec_model_units']):>18}{row['wall']:>9.1f}"
                          f"{'-' if noaud is None else f'{noaud:.1f}':>10}", flush=True)
    ran = [r for r in rows if "skipped" not in r]
    total = sum(r["rare_in_messages"] + r["raw_in_messages"] + r["model"]["file"] + r["model"]["codec_user_units"]
                + r["model"]["codec_model_units"] for r in ran)
    by_kind: dict[str, int] = {}
    for r in ran:
        for k, e in r["messages"].items():
            by_kind[k] = by_kind.get(k, 0) + e["rare_values"] + e["raw_rows"] + e["raw_columns"]
    audited = sum(e["bytes"] for r in ran for e in r["messages"].values())
    print(f"\n{len(ran)} runs ({len(rows) - len(ran)} n/a), {time.perf_counter() - t0:.0f} s; "
          f"{audited / 1e6:.2f} MB of client messages audited; findings in all: {total} "
          f"(goal 0); per client message kind: {json.dumps(by_kind)}; load average {os.getloadavg()[0]:.1f}")
    if a.timing:
        pairs = [(r["wall"], r["wall_no_audit"]) for r in ran if r.get("wall_no_audit")]
        if pairs:
            ratio = float(np.mean([w / n for w, n in pairs]))
            print(f"audit cost: training wall time with --audit / without, mean over {len(pairs)} runs: {ratio:.3f}")
    if a.dp_epsilons:
        rows += dp_rows([float(e) for e in a.dp_epsilons.split(",") if e.strip()], seeds, a, out)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
