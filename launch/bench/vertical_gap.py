#!/usr/bin/env python
"""Where vertical classification loses against a central gradient-boosted model: each client's
share of the prediction, measured on the same rows in one run.

Usage (from the repo root, venv python)::

    OMP_NUM_THREADS=1 python launch/bench/vertical_gap.py [--datasets adult,credit] [--seeds 0,1,2]
        [--max-rows 20000] [--out DIR] [--json FILE]

Per dataset and seed: ``python -m data_prep`` shards (central; vertical and hybrid, 2 clients),
then, on the same training and test rows, accuracy and macro F1 of

* ``HGB central``: HistGradientBoosting on every column (the anchor of ``defaults.py``);
  ``HGB label owner`` / ``HGB other client``: the same on one vertical client's columns alone
  (the label owner's are ``x0``, the other client's ``x1``);
* ``ours vertical``: ``mpifc.simulate`` on the vertical shards with default flags (the model the
  MPI job trains: ``tests/federated/test_class_glue.py`` holds them equal), and the same model
  asked with the other client's columns marginalised (``ours, x0 only``) or the label owner's
  (``ours, x1 only``);
* ``ours hybrid`` (every client holds the label) and ``central LearnSPN`` (one client, every
  column: what a generative PC reaches with no federation at all);
* two combinations built on the class glue's factorisation: its root is ``sum_y p(y) P_y(x0)
  S_y(x1)``, so ``p(y | x) ∝ p(y | x0) p(y | x1) / p(y)`` (exact up to the pseudo-count a class PC
  leaves the other classes; ``tests/federated/test_class_glue.py``). Putting a central
  model's ``p(y | x0)`` or ``p(y | x1)`` in place of ours says how much each client's part costs:
  ``x0 ours, x1 HGB`` (our label owner, a discriminative model on the other client's columns,
  which would need that client to see the labels) and ``x0 HGB, x1 HGB`` (both discriminative:
  the ceiling of any model whose clients are independent given the class).

Goal: vertical and hybrid within 0.03 of central HGB, in accuracy and macro F1.

Measured 2026-11-28 on 2 shared cores (1-minute load 13-42 from other jobs; accuracy does not
depend on it), adult 20,000 rows (13,333 training), seeds 0-2 (each seed its own split of the
columns between the clients), mean; gap to HGB central (accuracy / macro F1):

  measure                  accuracy  macro F1     gap
  HGB central                0.871     0.810        -
  HGB label owner (x0)       0.823     0.730   -0.048 / -0.080
  HGB other client (x1)      0.856     0.781   -0.015 / -0.030
  ours vertical              0.827     0.763   -0.044 / -0.047
  ours, x0 only              0.812     0.712   -0.059 / -0.098
  ours, x1 only              0.802     0.670   -0.069 / -0.140
  ours hybrid                0.849     0.791   -0.022 / -0.019
  central LearnSPN           0.839     0.772   -0.032 / -0.038
  x0 ours, x1 HGB            0.855     0.805   -0.016 / -0.005
  x0 HGB, x1 HGB             0.857     0.809   -0.014 / -0.001

The label owner's generative part is close to its discriminative peer (0.812 / 0.712 against
0.823 / 0.730); the other client's is not (0.802 / 0.670 against 0.856 / 0.781): its k-means
clusters are learned without the labels, so the class reaches them only through the sum weights
EM sets. With a discriminative model in that client's place the vertical model would be within
the goal (-0.016 / -0.005); without the labels there (they may not leave the label owner) it is
not. Hybrid, where every client holds the label and splits its rows by class, is within it.
Credit (``--datasets credit``, 20,000 rows, seeds 0-2, load 33-87) is within the goal: ours
vertical 0.932 / 0.664 against HGB 0.938 / 0.648, hybrid 0.928 / 0.676.
On adult's rows (``mpifc.simulate``, seeds 0-2), more clusters for that client (K 32 or 48
instead of 16) raised the vertical cell by at most 0.005 in accuracy and 0.009 in macro F1 on a
seed, and in three of the six runs lowered one of them by up to 0.003; ``--em-leaves`` (seed 0)
raised accuracy by 0.012 and lowered macro F1 by 0.008.

On the three public tables of ``launch/bench/usertables.py`` (``--datasets mpg,helpmiss,exam
--seeds 0``: the shards that benchmark makes), measured 2026-11-28 on 2 shared cores (load
18-32), accuracy / macro F1:

  table (rows, classes)  HGB central  ours vertical  ours x0 only  HGB x0       ours x1 only  HGB x1       x0 ours, x1 HGB
  mpg (187, 7)           0.957/0.960  0.681/0.571    0.553/0.394   0.489/0.561  0.468/0.284   0.936/0.944  0.957/0.966
  HELPmiss (376, 3)      0.585/0.593  0.511/0.508    0.489/0.476   0.553/0.561  0.457/0.434   0.447/0.437  0.532/0.537
  Exam (3,247, 3)        0.754/0.698  0.717/0.652    0.674/0.566   0.649/0.551  0.695/0.484   0.745/0.690  0.751/0.709

(rows: training rows.)

* mpg: the class is in the other client's text columns (make, model, transmission, drive, fuel;
  HGB on them alone 0.936), which reach it through K = 4 clusters on 187 rows, fewer than the 7
  classes: a cluster's PC gives each of its car models the same probability whatever the class.
  With k-means on the standardised codes of those columns (38 models on one axis) the cell is
  0.596 / 0.482; one-hot, as LearnSPN's own row split sees them, 0.681 / 0.571 (the default).
  K = 8 gives 0.681 / 0.567, K = 16 0.681 / 0.576, K = 32 (6 rows a cluster, near the 5-row
  floor) 0.745 / 0.621; ``--em-leaves`` (K 4 to 16, up to 50 iterations) 0.660-0.681.
* Exam: the other client holds the reading test score (``standLRT``). At K = 4 (one cluster per
  800 rows) its part alone predicts the majority class (0.578 / 0.244) and the cell is 0.676 /
  0.593; at K = 16 (one per 200 rows, the default) 0.695 / 0.484 and 0.717 / 0.652.
  ``--em-leaves`` (K = 16) 0.713 / 0.644. A central LearnSPN reaches HGB (0.756 / 0.713).
* HELPmiss: the label owner's part is the weak one (0.489 / 0.476 against HGB's 0.553 / 0.561
  on its columns; HGB's in its place with ours for the other client: 0.585 / 0.598), as is a
  central LearnSPN (0.532 / 0.542); hybrid equals HGB (0.585 / 0.592). Its 94 test rows make one
  row 0.011 of accuracy and the binomial standard error about 0.05: LearnSPN's
  ``min_instances_slice`` at 40, 100 and 1,000 (per-class PCs fully factorised) gave the
  vertical cell 0.553, 0.532 and 0.585, differences within that error. mpg's 47 test rows make
  one row 0.021.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from defaults import prepare, run  # beside this script

MEASURES = ["HGB central", "HGB label owner (x0)", "HGB other client (x1)", "ours vertical", "ours, x0 only",
            "ours, x1 only", "ours hybrid", "central LearnSPN", "x0 ours, x1 HGB", "x0 HGB, x1 HGB"]
"""Rows of the table, in order (module doc)."""


def shard_folder(dataset: str, setting: str, clients: int, seed: int, max_rows: int | None, out: Path,
                 timeout: float) -> Path:
    """``python -m data_prep`` shards of ``dataset``: a data_prep dataset, or one of
    ``usertables.py``'s public tables (exported as the CSV a user holds, then ``--dataset csv
    --target``, as that benchmark does)."""
    from usertables import TABLES, export  # beside this script

    table = {t.name: t for t in TABLES}.get(dataset)
    if table is None:
        cell = dict(dataset=dataset, max_rows=max_rows, goal=dataset, clients=clients, setting=setting)
        return prepare(cell, seed, "keep", out, timeout)
    d = out / "shards" / f"{dataset}-{setting}-{clients}-s{seed}"
    if not (d / "manifest.json").is_file():
        data = out / "tables" / f"{dataset}.csv"
        if not data.is_file():
            data.parent.mkdir(parents=True, exist_ok=True)
            export(table, data)
        run([sys.executable, "-m", "data_prep", "--dataset", "csv", "--path", str(data), "--target", table.target,
             "--setting", setting, "--clients", str(clients), "--seed", str(seed), "--out", str(d)], timeout)
    return d


def model_rows(model: Any, shards: Path) -> tuple[np.ndarray, np.ndarray]:
    """The test rows over ``model``'s columns (the target blanked) and their class codes."""
    from data_prep.shards import load_manifest, read_test

    m, t = load_manifest(shards), read_test(shards)
    rows = np.stack([t.x[:, t.features.index(f)] if f in t.features else np.full(len(t.x), np.nan)
                     for f in model.features], axis=1)
    j = model.features.index(m.target)
    y = rows[:, j].astype(np.int64)
    rows[:, j] = np.nan
    return rows, y


def ours_proba(model: Any, rows: np.ndarray, keep: list[str] | None = None) -> np.ndarray:
    """``p(y | x)`` of a trained model, with only the columns ``keep`` observed (None: all)."""
    from mpifc.api import proba_from_joint

    return proba_from_joint(model.class_log_joint(rows if keep is None else model.keep_columns(rows, keep)))


def product_of_parts(p0: np.ndarray, p1: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """Class scores ``log p(y | x0) + log p(y | x1) - log p(y)`` (clients independent given the class)."""
    with np.errstate(divide="ignore"):
        return np.log(p0) + np.log(p1) - np.log(prior)


def one_seed(dataset: str, seed: int, max_rows: int | None, out: Path,
             timeout: float) -> dict[str, tuple[float, float]]:
    """Accuracy and macro F1 of every measure (:data:`MEASURES`) on one seed's test rows."""
    import mpifc
    from data_prep.shards import load_manifest
    from sklearn.ensemble import HistGradientBoostingClassifier

    from mpifc.baselines.data import central_train_xy, scores, test_xy

    central = shard_folder(dataset, "central", 1, seed, max_rows, out, timeout)
    vertical = shard_folder(dataset, "vertical", 2, seed, max_rows, out, timeout)
    hybrid = shard_folder(dataset, "hybrid", 2, seed, max_rows, out, timeout)
    mv = load_manifest(vertical)
    x0 = [f for f in mv.clients[int(mv.label_owner)]["features"] if f != mv.target]
    m, tr = central_train_xy(central)
    te = test_xy(m)
    x1 = [f for f in tr.features if f not in x0]
    prior = np.bincount(tr.y, minlength=len(m.classes)) / len(tr.y)
    res: dict[str, tuple[float, float]] = {}

    def score(name: str, y: np.ndarray, s: np.ndarray) -> None:
        r = scores(y, np.argmax(s, axis=1))
        res[name] = (r["accuracy"], r["f1"])

    hgb: dict[str, np.ndarray] = {}
    for name, cols in (("HGB central", tr.features), ("HGB label owner (x0)", x0), ("HGB other client (x1)", x1)):
        idx = [tr.features.index(f) for f in cols]
        clf = HistGradientBoostingClassifier(random_state=seed).fit(tr.x[:, idx], tr.y)
        hgb[name] = clf.predict_proba(te.x[:, idx])
        score(name, te.y, hgb[name])
    ours = mpifc.simulate(vertical, seed=seed)
    rows, y = model_rows(ours, vertical)
    if not np.array_equal(y, te.y):
        raise SystemExit(f"{vertical}: the vertical and central test rows differ")
    p0, p1 = ours_proba(ours, rows, x0), ours_proba(ours, rows, x1)
    score("ours vertical", y, ours_proba(ours, rows))
    score("ours, x0 only", y, p0)
    score("ours, x1 only", y, p1)
    for name, shards in (("ours hybrid", hybrid), ("central LearnSPN", central)):
        model = mpifc.simulate(shards, seed=seed)
        r, yy = model_rows(model, shards)
        score(name, yy, ours_proba(model, r))
    score("x0 ours, x1 HGB", y, product_of_parts(p0, hgb["HGB other client (x1)"], prior))
    score("x0 HGB, x1 HGB", y, product_of_parts(hgb["HGB label owner (x0)"], hgb["HGB other client (x1)"], prior))
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default="adult",
                   help="comma-separated data_prep datasets or usertables.py tables (helpmiss, exam, mpg; "
                        "default adult)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--max-rows", type=int, default=20000, help="rows per dataset (default 20000; 0: all)")
    p.add_argument("--out", default=None, help="folder for the shards (default: a temporary one)")
    p.add_argument("--json", default=None, help="also write every measurement here")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds any one data_prep command may take")
    a = p.parse_args()
    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="mpifc-vertical-gap-"))
    allres: dict[str, dict[int, dict[str, tuple[float, float]]]] = {}
    loads = []
    for ds in [d.strip() for d in a.datasets.split(",") if d.strip()]:
        allres[ds] = {}
        for seed in seeds:
            allres[ds][seed] = one_seed(ds, seed, a.max_rows or None, out, a.timeout)
            loads.append(os.getloadavg()[0])
            print(f"{ds} seed {seed}: " + "; ".join(f"{k} {v[0]:.4f}/{v[1]:.4f}" for k, v in allres[ds][seed].items()),
                  flush=True)
        print(f"\n{ds}, seeds {','.join(map(str, seeds))}, mean (1-minute load {min(loads):.1f}-{max(loads):.1f})")
        head = f"{'measure':<24}{'accuracy':>10}{'macro F1':>10}{'gap to HGB central':>22}"
        print(head + "\n" + "-" * len(head))
        mean = {k: np.mean([allres[ds][s][k] for s in seeds], axis=0) for k in MEASURES}
        for k in MEASURES:
            gap = mean[k] - mean["HGB central"]
            print(f"{k:<24}{mean[k][0]:>10.3f}{mean[k][1]:>10.3f}"
                  + ("" if k == "HGB central" else f"{gap[0]:>+13.3f} / {gap[1]:+.3f}"))
    if a.json:
        Path(a.json).write_text(json.dumps(allres, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
