"""Reference evaluator: marginals, conditionals, MPE, sampling, persistence — all against brute force."""
from __future__ import annotations

import os

import numpy as np
import pytest
from scipy.special import logsumexp

from mpifc.federated.assign import assign
from mpifc.federated.evaluate import (
    log_likelihood,
    mpe,
    predict,
    predict_log_proba,
    sample,
)
from mpifc.federated.one_pass import OnePassBuilder, build_single_process
from mpifc.federated.serialize import load_fc, save_fc
from mpifc.federated.wire_format import model_from_bytes, model_to_bytes

from tests.federated.fixtures import FEATURES, all_binary, binary_table, split


@pytest.fixture(scope="module")
def hybrid_fc():
    x = binary_table(400, seed=11)
    shards = split(x, "hybrid")
    b = OnePassBuilder(n_clusters=2, n_products=4, seed=2, learner="factorized")
    fc = build_single_process(b, [(d, xi) for d, xi, _ in shards], FEATURES, "y", "hybrid")
    return assign(fc, "flat")


def test_marginal_equals_sum_over_enumeration(hybrid_fc):
    allx = all_binary(5)
    p = np.exp(log_likelihood(hybrid_fc, allx))
    # p(a=1, c=0) by NaN-marginalisation vs by summing the joint.
    q = np.array([[1, np.nan, 0, np.nan, np.nan]])
    brute = p[(allx[:, 0] == 1) & (allx[:, 2] == 0)].sum()
    assert abs(np.exp(log_likelihood(hybrid_fc, q))[0] - brute) < 1e-12
    # Absent features in a mapping are marginalised too; all-missing gives log 1 = 0.
    assert abs(log_likelihood(hybrid_fc, {"a": np.array([1.0]), "c": np.array([0.0])})[0] - np.log(brute)) < 1e-12
    assert abs(log_likelihood(hybrid_fc, {"a": np.array([np.nan])})[0]) < 1e-12


def test_conditional_matches_bayes_rule(hybrid_fc):
    allx = all_binary(5)
    lp = predict_log_proba(hybrid_fc, allx)
    assert lp.shape == (32, 2)
    np.testing.assert_allclose(np.exp(lp).sum(1), 1.0, atol=1e-12)
    joint = log_likelihood(hybrid_fc, allx)
    for i, row in enumerate(allx):
        other = row.copy()
        other[4] = 1 - row[4]
        pair = np.array([joint[i], log_likelihood(hybrid_fc, other[None])[0]])
        expect = pair[0] - logsumexp(pair)
        assert abs(lp[i, int(row[4])] - expect) < 1e-10
    assert np.array_equal(predict(hybrid_fc, allx), np.argmax(lp, axis=1))


def test_cooccurrence_captures_cross_client_dependence():
    x = binary_table(2000, seed=12)
    shards = split(x, "vertical")
    test = binary_table(500, seed=13)
    acc = {}
    for glue in ("cooccurrence", "combinatorial"):
        b = OnePassBuilder(n_clusters=4, glue=glue, seed=0, learner="factorized")
        fc = assign(build_single_process(b, [(d, xi) for d, xi, _ in shards], FEATURES, "y", "vertical"), "flat")
        acc[glue] = (predict(fc, test) == test[:, 4]).mean()
    # y = a xor c (85%) lives on a third client: only the joint cluster counts can link them.
    assert acc["cooccurrence"] > 0.75
    assert acc["combinatorial"] < 0.65


def test_combinatorial_glue_is_the_product_of_client_mixtures():
    # Independent cluster choices (product-of-fraction weights) factorise over clients:
    # p(x) = Π_c Σ_k π_ck p_ck(x_c). The combinatorial FC must equal that product exactly.
    x = binary_table(600, seed=15)
    shards = split(x, "vertical")
    b = OnePassBuilder(n_clusters=3, glue="combinatorial", seed=0, learner="factorized")
    fc = assign(build_single_process(b, [(d, xi) for d, xi, _ in shards], FEATURES, "y", "vertical"), "flat")
    allx = all_binary(5)
    per_client = np.zeros(len(allx))
    for d, _, _ in shards:
        leaves = [n for n in fc.leaves if n.leaf.client == d.index]
        n = np.array([l.leaf.n_rows for l in leaves], dtype=float)
        cols = [FEATURES.index(f) for f in d.features]
        lls = np.stack([l.leaf.model.log_likelihood(allx[:, cols]) for l in leaves])
        per_client += logsumexp(lls + np.log(n / n.sum())[:, None], axis=0)
    np.testing.assert_allclose(log_likelihood(fc, allx), per_client, atol=1e-10)


def test_mpe_single_product_is_exact_argmax():
    x = binary_table(300, seed=14)
    shards = split(x, "vertical")
    b = OnePassBuilder(n_clusters=1, n_products=1, learner="factorized")
    fc = assign(build_single_process(b, [(d, xi) for d, xi, _ in shards], FEATURES), "flat")
    allx = all_binary(5)
    best = allx[np.argmax(log_likelihood(fc, allx))]
    got = mpe(fc, np.full((1, 5), np.nan))[0]
    np.testing.assert_array_equal(got, best)
    ev = np.array([[1.0, np.nan, np.nan, 0.0, np.nan]])
    comp = mpe(fc, ev)[0]
    cand = allx[(allx[:, 0] == 1) & (allx[:, 3] == 0)]
    np.testing.assert_array_equal(comp, cand[np.argmax(log_likelihood(fc, cand))])


def test_sampling_frequencies_match_probabilities(hybrid_fc):
    rng = np.random.default_rng(0)
    s = sample(hybrid_fc, 20000, rng)
    allx = all_binary(5)
    p = np.exp(log_likelihood(hybrid_fc, allx))
    code = (s @ (2 ** np.arange(4, -1, -1))).astype(int)
    freq = np.bincount(code, minlength=32) / len(s)
    assert np.abs(freq - p).max() < 0.015
    ev = np.tile([[1.0, np.nan, np.nan, np.nan, 0.0]], (5000, 1))
    cs = sample(hybrid_fc, 5000, rng, evidence=ev)
    assert np.all(cs[:, 0] == 1) and np.all(cs[:, 4] == 0)
    # Conditional p(c=1 | a=1, y=0) by sampling vs exactly.
    num = np.exp(log_likelihood(hybrid_fc, np.array([[1, np.nan, 1, np.nan, 0]])))[0]
    den = np.exp(log_likelihood(hybrid_fc, np.array([[1, np.nan, np.nan, np.nan, 0]])))[0]
    assert abs(cs[:, 2].mean() - num / den) < 0.03


def test_save_load_roundtrip(tmp_path, hybrid_fc):
    path = save_fc(hybrid_fc, tmp_path / "m.h5")
    back = load_fc(path)
    x = all_binary(5)
    np.testing.assert_array_equal(log_likelihood(back, x), log_likelihood(hybrid_fc, x))
    assert [n.rank for n in back.nodes] == [n.rank for n in hybrid_fc.nodes]
    only = load_fc(path, load_models={1})
    assert all((n.leaf.model is not None) == (n.rank == 1) for n in only.leaves)
    leaf = hybrid_fc.leaves[0].leaf.model
    again = model_from_bytes(model_to_bytes(leaf))
    np.testing.assert_array_equal(again.log_likelihood(x[:, :3]), leaf.log_likelihood(x[:, :3]))


def test_failed_save_leaves_no_file(tmp_path, hybrid_fc):
    class Broken:
        def save(self, group):
            group.attrs["model_type"] = "factorized"
            raise RuntimeError("disk full")

    hybrid_fc.leaves[-1].leaf.model, keep = Broken(), hybrid_fc.leaves[-1].leaf.model
    try:
        with pytest.raises(RuntimeError, match="disk full"):
            save_fc(hybrid_fc, tmp_path / "m.h5")
    finally:
        hybrid_fc.leaves[-1].leaf.model = keep
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("setting", ["horizontal", "hybrid"])
def test_fcdt_averages_client_tree_probabilities(setting):
    x = binary_table(600, seed=16)
    shards = split(x, setting)
    b = OnePassBuilder(seed=0, learner="dt", hyperparameters={"max_depth": 4})
    fc = assign(build_single_process(b, [(d, xi) for d, xi, _ in shards], FEATURES, "y", setting), "flat")
    root = fc.nodes[fc.root]
    assert root.op == "average" and len(root.children) == len(shards)
    test = binary_table(300, seed=17)
    proba = np.exp(predict_log_proba(fc, test))
    # The root is the plain mean of the client trees' class probabilities.
    mean = np.mean([fc.nodes[c].leaf.model.class_probs(
        test[:, [FEATURES.index(f) for f in fc.nodes[c].leaf.features]]) for c in root.children], axis=0)
    np.testing.assert_allclose(proba, mean, atol=1e-12)
    if setting == "horizontal":  # each tree sees a and c together: the xor is learnable
        assert (predict(fc, test) == test[:, 4]).mean() > 0.75


def test_fcdt_needs_the_target_on_every_client():
    x = binary_table(100)
    shards = split(x, "vertical")
    with pytest.raises(Exception, match="client 0 does not hold the target 'y'"):
        build_single_process(OnePassBuilder(learner="dt"), [(d, xi) for d, xi, _ in shards], FEATURES, "y")


def _h5_tree(g) -> dict:
    """Every attribute and dataset under an h5py group, as comparable Python values."""
    import h5py

    out = {}
    for k, v in g.attrs.items():
        out["@" + k] = [str(s) for s in v] if isinstance(v, np.ndarray) and v.dtype == object else \
            (v.tolist() if isinstance(v, np.ndarray) else v)
    for k, v in g.items():
        if isinstance(v, h5py.Group):
            out[k] = _h5_tree(v)
        else:
            out[k] = (v.dtype.str, v.shape, v[()].tobytes())
    return out


def _learned_models():
    from mpifc.federated.factorized import FactorizedModel
    from mpifc.federated.learners import fit_leaf

    x = np.column_stack([binary_table(300, seed=3)[:, :3], np.random.default_rng(4).normal(size=300)])
    meta = ["discrete", "discrete", "discrete", "real"]
    spn = fit_leaf("learnspn", x, meta, 0, n_categories=[2, 2, 2, 0], threshold=0.3, min_instances_slice=40)
    fac = FactorizedModel.fit(x, meta, [2, 2, 2, 0])
    dt = fit_leaf("dt", x, meta, 0, n_categories=[2, 2, 2, 0], target_index=0, max_depth=3)
    return x, [spn, fac, dt]


def test_wire_format_exact_roundtrip_and_overhead(tmp_path):
    import h5py

    from mpifc.federated.wire_format import WireModel, wire_overhead

    x, models = _learned_models()
    for m in models:
        blob = model_to_bytes(m)
        # Size is exactly the overhead (magic, version, header length, binary header) + the raw
        # arrays; the library's own models name nothing the format's string table lacks but a
        # few values, so the header stays under 128 bytes.
        with h5py.File(tmp_path / f"{type(m).__name__}.h5", "w") as f:
            m.save(f.create_group("model"))
            ref = _h5_tree(f["model"])
            raw = sum(d.nbytes for d in _datasets(f["model"]))
        assert blob.nbytes == wire_overhead(blob) + raw
        assert wire_overhead(blob) < 128, (type(m).__name__, wire_overhead(blob))
        back = model_from_bytes(blob)
        assert type(back) is type(m)
        np.testing.assert_array_equal(np.asarray(back.log_likelihood(x)), np.asarray(m.log_likelihood(x)))
        # The server's lazy form writes exactly what the model's own save wrote.
        lazy = model_from_bytes(blob, lazy=True)
        assert isinstance(lazy, WireModel) and lazy.num_parameters() == m.num_parameters()
        with h5py.File(tmp_path / f"{type(m).__name__}-lazy.h5", "w") as f:
            lazy.save(f.create_group("model"))
            assert _h5_tree(f["model"]) == ref
        np.testing.assert_array_equal(np.asarray(lazy.log_likelihood(x)), np.asarray(m.log_likelihood(x)))
        assert model_to_bytes(lazy).tobytes() == blob.tobytes()


def _datasets(g):
    import h5py

    for v in g.values():
        if isinstance(v, h5py.Group):
            yield from _datasets(v)
        else:
            yield v[()]


def test_wire_format_rejects_malformed_blobs():
    from mpifc.errors import UserError

    blob = model_to_bytes(_learned_models()[1][1])
    version_1 = np.concatenate([np.frombuffer(np.uint64(2).astype("<u8").tobytes(), np.uint8),
                                np.frombuffer(b"{}", np.uint8)])
    wrong_version = blob.copy()
    wrong_version[3] = 1
    for bad, why in ((blob[:5], "header"), (blob[:-3], "past the end"),
                     (np.concatenate([blob, np.zeros(2, np.uint8)]), "trailing"),
                     (np.concatenate([np.full(8, 255, np.uint8), blob[8:]]), "start with"),
                     (version_1, "version-1"), (wrong_version, "wire version 1"),
                     (np.concatenate([blob[:6], np.full(3, 255, np.uint8), blob[9:]]), "")):
        with pytest.raises(UserError, match=f"client 3 .*malformed model blob .*{why}"):
            model_from_bytes(bad, source="client 3 (rank 4)")


def test_wire_format_round_trips_every_attribute_and_dataset_kind():
    """Anything a model writer may put in a group comes back with its dtype, shape and bits:
    strings in and out of the format's table, typed scalars, numeric and string arrays,
    non-native byte order, empty and 0-d datasets, nested groups, member order."""
    from mpifc.federated.wire_format import WireGroup, WireModel, wire_overhead

    g = WireGroup()
    g.attrs["model_type"] = "spn"
    g.attrs["note"] = "Grüße, not in the table"
    g.attrs["again"] = "Grüße, not in the table"
    for k, v in {"i": -(2 ** 63), "j": 2 ** 63 - 1, "b": True, "f": float("nan"), "neg0": -0.0,
                 "f32": np.float32(1.5), "u8": np.uint8(7), "c": np.complex128(1 - 2j)}.items():
        g.attrs[k] = v
    g.attrs["names"] = ["gaussian", "x", "gaussian"]
    g.attrs["grid"] = np.arange(6, dtype=np.int16).reshape(2, 3)
    g.create_dataset("zeta", data=np.array([1.0, -0.0, np.inf], dtype=">f8"))
    g.create_dataset("alpha", data=np.zeros((0, 4), dtype=np.float32))
    g.create_dataset("scalar", data=np.float64(3.25))
    sub = g.create_group("leaves/gaussian")
    sub.create_dataset("mean", data=np.random.default_rng(0).normal(size=(3, 2)))
    g.create_dataset("after", data=np.array([255, 0], dtype=np.uint8))

    class Saved:
        def save(self, group):
            from mpifc.federated.wire_format import _copy_wire

            _copy_wire(g, group)

    blob = model_to_bytes(Saved())
    back = model_from_bytes(blob, lazy=True)
    assert isinstance(back, WireModel) and back.num_parameters() == -1
    h = back.group
    assert list(h._members) == list(g._members) and list(h.attrs) == list(g.attrs)
    for k, v in g.attrs.items():
        w = h.attrs[k]
        assert type(w) is type(v), k
        if isinstance(v, np.ndarray):
            assert w.dtype == v.dtype and w.shape == v.shape and list(w.reshape(-1)) == list(v.reshape(-1)), k
        elif isinstance(v, np.generic):
            assert v.dtype == w.dtype and v.tobytes() == w.tobytes(), k
        else:
            assert v == w, k
    for name in ("zeta", "alpha", "scalar", "after", "leaves/gaussian/mean"):
        a, b = g[name], h[name]
        assert (a.dtype.str, a.shape, a.tobytes()) == (b.dtype.str, b.shape, b.tobytes()), name
    assert blob.nbytes == wire_overhead(blob) + sum(g[n].nbytes for n in ("zeta", "alpha", "scalar", "after",
                                                                           "leaves/gaussian/mean"))
    assert model_to_bytes(back).tobytes() == blob.tobytes()


def test_macro_f1_matches_sklearn():
    from sklearn.metrics import f1_score

    from mpifc.fedpc.evaluate import _f1_macro

    rng = np.random.default_rng(0)
    for k in (2, 3):
        y, p = rng.integers(0, k, 400), rng.integers(0, k, 400)
        assert _f1_macro(y, p, k) == pytest.approx(f1_score(y, p, average="macro"), abs=1e-12)
    y = rng.integers(0, 2, 400)
    assert _f1_macro(y, np.zeros(400, int), 2) == pytest.approx(f1_score(y, np.zeros(400, int), average="macro"))
