"""``bpd`` in ``mpifc evaluate --json``: bits per pixel for image shard sets, null otherwise."""
from __future__ import annotations

import json
import math

import numpy as np
from scipy.special import logsumexp

from mpifc.federated.bpd import image_bpd
from mpifc.fedpc.evaluate import evaluate_gathered
from mpifc.cli.evaluate import add_evaluate_arguments  # noqa: F401  (the flags exist)
from tests.federated.fixtures import binary_table, write_shards


def test_bpd_formula_and_null_for_tables():
    joint = np.log(np.array([[0.1, 0.3], [0.2, 0.2]]))
    m = {"image": {"shape": [2, 2], "levels": 2}, "feature_order": ["p0", "p1", "p2", "p3", "y"], "target": "y"}
    want = -np.mean(np.log([0.4, 0.4])) / (4 * math.log(2))
    assert abs(image_bpd(m, joint, "y") - want) < 1e-12
    assert abs(image_bpd({**m, "target": None, "feature_order": ["p0", "p1"]}, joint[:, :1], None)
               + np.mean(np.log([0.1, 0.2])) / (2 * math.log(2))) < 1e-12
    # Standardised pixels: the density moves back to the level scale by -sum log std.
    pre = {"columns": {f"p{i}": {"std": 2.0, "mean": 0.0} for i in range(4)}}
    assert abs(image_bpd({**m, "preprocessing": pre}, joint, "y") - (want + 4 * math.log(2.0) / (4 * math.log(2)))) < 1e-12
    assert image_bpd({**m, "image": None}, joint, "y") is None


def _train_gathered(shards, tmp_path):
    from mpifc.federated.assign import assign
    from mpifc.federated.one_pass import OnePassBuilder, build_single_process
    from mpifc.federated.serialize import save_fc
    from data_prep.shards import load_manifest, read_client
    from mpifc.fedpc.data import read_client_data

    m = load_manifest(shards)
    parts = [(read_client_data(shards, i).declaration, read_client(shards, i).x_train) for i in range(m.n_clients)]
    fc = build_single_process(OnePassBuilder(n_clusters=1, n_products=1, seed=0, learner="factorized"), parts,
                              m.feature_order, m.target, m.setting, {i: 1 + i for i in range(m.n_clients)})
    return save_fc(assign(fc, "flat"), tmp_path / "m.h5")


def test_evaluate_reports_bpd_only_for_images(tmp_path):
    shards = write_shards(tmp_path / "tab", "horizontal", binary_table(90, 1), binary_table(20, 2))
    model = _train_gathered(shards, tmp_path)
    cfg = {"dir": str(shards), "model": str(model), "batch": 7, "output_npz": str(tmp_path / "j.npz")}
    assert evaluate_gathered(cfg)["bpd"] is None
    man = json.loads((shards / "manifest.json").read_text())
    man["image"] = {"shape": [2, 2], "levels": 2, "range": [0, 1], "file_scale": 1.0}
    (shards / "manifest.json").write_text(json.dumps(man))
    out = evaluate_gathered(cfg)
    joint = np.load(tmp_path / "j.npz")["joint"]
    assert abs(out["bpd"] + logsumexp(joint, axis=1).mean() / (4 * math.log(2))) < 1e-12
