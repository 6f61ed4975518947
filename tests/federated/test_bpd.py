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
    levels = {f"p{i}": {"meta_type": "discrete"} for i in range(4)}
    assert abs(image_bpd({**m, "features": levels}, joint, "y") - want) < 1e-12
    # Standardised pixels are modelled by densities over reals: no bits per level for them.
    real = {f"p{i}": {"meta_type": "real"} for i in range(4)}
    assert image_bpd({**m, "features": real}, joint, "y") is None
    assert image_bpd({**m, "image": None}, joint, "y") is None


def test_the_measure_names_mass_and_density_columns_and_their_units():
    from mpifc.federated.bpd import ll_measure

    feats = {"a": {"meta_type": "real"}, "b": {"meta_type": "real"}, "c": {"meta_type": "discrete"},
             "y": {"meta_type": "discrete"}}
    pre = {"columns": {"a": {"transform": "normal-score"}, "b": {"mean": 0.0, "std": 2.0}}}
    m = ll_measure({"features": feats, "feature_order": ["a", "b", "c", "y"], "preprocessing": pre})
    assert m["measure"] == "density x mass" and m["mass_columns"] == 2 and m["density_columns"] == 2
    assert m["density_units"] == {"normal-score": 1, "standardised": 1}
    assert m["text"] == ("nats per row: log probability mass of 2 discrete columns + log density of 2 real "
                         "columns (1 in normal-score units, 1 in standardised units)")
    assert ll_measure({"features": {"c": {"meta_type": "categorical"}}, "feature_order": ["c"]})["measure"] == "mass"
    assert ll_measure({"features": {"a": {"meta_type": "real"}}, "feature_order": ["a"]})["measure"] == "density"


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
    table = evaluate_gathered(cfg)
    assert table["bpd"] is None and table["ll_measure"] == "mass"  # binary columns: masses
    man = json.loads((shards / "manifest.json").read_text())
    man["image"] = {"shape": [2, 2], "levels": 2, "range": [0, 1], "file_scale": 1.0}
    (shards / "manifest.json").write_text(json.dumps(man))
    out = evaluate_gathered(cfg)
    joint = np.load(tmp_path / "j.npz")["joint"]
    assert abs(out["bpd"] + logsumexp(joint, axis=1).mean() / (4 * math.log(2))) < 1e-12
