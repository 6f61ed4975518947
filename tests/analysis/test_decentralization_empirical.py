"""The cost of decentralisation on real data: the four settings on real data with FedPCs (single process, tiny data)."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from data_prep.files import default_data_root
from mpifc.analysis import decentralization as dz
from mpifc.analysis import decentralization_empirical as dze
from mpifc.errors import UserError
from mpifc.experiments import decentralization as exp

DATA = default_data_root()
TINY = dze.FedPCConfig(n_clusters=2, n_products=2, learnspn={"min_instances_slice": 200})


def _posterior(fc, schema: dze.Schema, blocks: list, visible: list[int]) -> np.ndarray:
    """``log p(y | x_visible)`` ``(n, C)`` from one upward pass of ``fc``."""
    values = dze.fedpc_class_values(fc, dze.evidence_columns(schema, blocks, visible), schema)
    return dze.log_posterior(values[fc.root])


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


QUICK = exp.EmpiricalCase("breast-cancer", 2, 300)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    # Four real MPI jobs (FedPC train + distributed evaluate, the CL/DI pack, the DL agents).
    out = tmp_path_factory.mktemp("dz") / "results"
    return out, exp.run(out, quick=True, parts=("empirical",))["empirical"]


def _run_dir(out: Path) -> Path:
    return out / "runs" / f"{QUICK.dataset}-K{QUICK.clients}-seed0"


def test_quick_run_writes_tables_and_chart(quick_run: tuple[Path, dict]) -> None:
    out, summary = quick_run
    rows = _read_csv(out / exp.EMPIRICAL_CSV)
    assert [r["setting"] for r in rows] == list(dz.SETTINGS)
    assert {r["dataset"] for r in rows} == {"breast-cancer"} and {r["clients"] for r in rows} == {"2"}
    png = (out / exp.EMPIRICAL_PNG).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / exp.EMPIRICAL_MD).read_text()
    assert "| CL/CI |" in md and "C^{a-b}" in md
    assert not list(out.glob(".*.tmp"))
    # The costs CSV holds Table I's pairs, each the difference of the reported losses.
    ce = {r["setting"]: float(r["cross_entropy_nats"]) for r in rows}
    costs = _read_csv(out / exp.EMPIRICAL_COSTS_CSV)
    assert {(c["a"], c["b"]) for c in costs} == set(dz.TABLE_I)
    for c in costs:
        assert float(c["cost_nats"]) == pytest.approx(ce[c["a"]] - ce[c["b"]], abs=1e-12)
    # A rerun reuses the finished cell (no MPI job) and rewrites the same tables.
    again = exp.run(out, quick=True, parts=("empirical",))["empirical"]
    assert again["results"] == summary["results"]


def test_quick_cross_entropies_finite_positive_and_collaboration_helps(quick_run: tuple[Path, dict]) -> None:
    _, summary = quick_run
    res = summary["results"]["breast-cancer/2"]
    for s in dz.SETTINGS:
        ce = res[s]["cross_entropy"]
        assert np.isfinite(ce) and ce > 0
        assert 0.0 <= res[s]["accuracy"] <= 1.0
    # Full collaboration beats full decentralisation on breast cancer (measured, not assumed:
    # with the label taken from every client, Algorithm 1 as-is would fail this, see below).
    assert res["CL/CI"]["cross_entropy"] <= res["DL/DI"]["cross_entropy"] + 0.02
    # DI settings report the worst agent.
    for s in ("CL/DI", "DL/DI"):
        assert res[s]["cross_entropy"] == max(res[s]["per_agent"])
        assert len(res[s]["per_agent"]) == 2


def test_quick_one_cluster_fedpc_links_the_label_to_the_owner_only(quick_run: tuple[Path, dict]) -> None:
    # K = 1: the FedPC is the product of the clients' PCs, y lives in client 0's PC, so the
    # collaborative posterior is exactly agent 0's decentralised one (and agent 1 learns nothing).
    out, summary = quick_run
    sens = summary["cl_by_clusters"]["breast-cancer/2"]
    assert sorted(sens) == [1, 2]
    ci, di = sens[1]
    assert ci == pytest.approx(di[0], abs=1e-9)
    assert di[1] > di[0]
    main = summary["results"]["breast-cancer/2"]
    assert sens[2][0] == main["CL/CI"]["cross_entropy"]
    rows = _read_csv(out / exp.EMPIRICAL_CLUSTERS_CSV)
    assert [int(r["n_clusters"]) for r in rows] == [1, 2]


def _ledger_rows(path: Path, phase: str | None = None) -> list[dict[str, str]]:
    return [r for r in _read_csv(path) if phase is None or r["phase"] == phase]


def test_quick_ledger_inference_bytes_equal_closed_form(quick_run: tuple[Path, dict]) -> None:
    from data_prep.shards import read_test
    from mpifc.federated.evaluate import Query
    from mpifc.federated.serialize import load_fc
    from mpifc.fedpc.query import query_payload_bytes

    out, summary = quick_run
    res = summary["results"]["breast-cancer/2"]
    run = _run_dir(out)
    n_test = int(_read_csv(out / exp.EMPIRICAL_CSV)[0]["n_test"])
    k, c = QUICK.clients, 2
    # DL/CI: each of the K agents sends one (n_test, C) float64 vector; the ledger's payload (what
    # MPI reported moving) is exactly 8 · n_test · C · K, the typed headers counted apart.
    q = _ledger_rows(run / "dl.csv", "query")
    assert [r["kind"] for r in q] == ["dz.dl.class_loglik"] * k
    assert sorted(int(r["src"]) for r in q) == list(range(1, k + 1)) and {r["dst"] for r in q} == {"0"}
    assert all(int(r["payload_bytes"]) == 8 * n_test * c for r in q)
    payload = sum(int(r["payload_bytes"]) for r in q)
    assert payload == 8 * n_test * c * k == dze.dl_ci_closed_form_bytes(n_test, c, k)
    assert res["DL/CI"]["infer_payload_bytes"] == payload == res["DL/CI"]["infer_payload_closed_form"]
    assert res["DL/CI"]["infer_header_bytes"] == sum(int(r["header_bytes"]) for r in q) > 0
    # DL training sends the combiner one thing: agent 0's class counts (8 · C bytes).
    t = _ledger_rows(run / "dl.csv", "train")
    assert [(r["kind"], int(r["payload_bytes"])) for r in t] == [("dz.dl.prior_counts", 8 * c)]
    assert res["DL/CI"]["train_bytes"] == 8 * c + int(t[0]["header_bytes"])
    # CL/CI: one upward pass; the ledger's payload equals the closed form of the model's ψ.
    fc = load_fc(run / "cl.h5", load_models=False)
    target = fc.target
    closed = query_payload_bytes(fc, n_test, Query(target, c))
    assert closed == dze.fedpc_closed_form_bytes(fc, n_test, dze.Schema(target, c, {}, {}, ()))
    q = _ledger_rows(run / "cl_eval.csv", "query")
    assert {r["kind"] for r in q} == {"fc.query.values"}
    assert sum(int(r["payload_bytes"]) for r in q) == closed == res["CL/CI"]["infer_payload_bytes"]
    assert n_test == len(read_test(_shards(out, 0)).ids)
    # DI settings: nothing at test time; CL/DI pays its pack at training time.
    assert _ledger_rows(run / "di.csv", "query") == []
    assert res["CL/DI"]["infer_payload_bytes"] == res["DL/DI"]["infer_payload_bytes"] == 0
    pack = sum(int(r["total_bytes"]) for r in _ledger_rows(run / "di.csv", "di-pack"))
    cl_train = sum(int(r["total_bytes"]) for r in _ledger_rows(run / "cl_train.csv"))
    assert res["CL/CI"]["train_bytes"] == cl_train > 0
    assert res["CL/DI"]["train_bytes"] == cl_train + pack > cl_train
    assert res["DL/DI"]["train_bytes"] == 0


def _shards(out: Path, owner: int | str) -> Path:
    from mpifc.experiments.jobs import ShardSpec

    return out / "shards" / ShardSpec(QUICK.dataset, "vertical", QUICK.clients, 0, max_rows=QUICK.max_rows,
                                      label_owner=owner).dirname()


def test_quick_mpi_predictions_equal_in_process(quick_run: tuple[Path, dict]) -> None:
    # The four settings computed by the MPI jobs equal the single-process computation on the
    # same rows (same seeds): the transport changes who computes, not what.
    from data_prep.shards import read_test

    out, _ = quick_run
    blocks, schema, y_train = exp.empirical_case_data(QUICK, 0)
    test = read_test(_shards(out, "all"))
    for b in blocks:
        np.testing.assert_array_equal(b.x_test, test.x[:, [test.features.index(f) for f in b.features]])
    _, extras = dze.four_settings(blocks, schema, y_train, dze.FedPCConfig())
    mpi = exp.cell_posteriors(_run_dir(out), QUICK.clients)
    for s in dz.SETTINGS:
        assert len(mpi[s]) == len(extras["log_post"][s])
        for got, want in zip(mpi[s], extras["log_post"][s]):
            np.testing.assert_allclose(got, want, atol=1e-9, rtol=0)


def test_fedpc_link_bytes_follow_scope_of_each_crossing_leaf() -> None:
    blocks, schema, y_train = exp.empirical_case_data(exp.EmpiricalCase("breast-cancer", 2, 120))
    fc = dze.train_fedpc(blocks, schema, TINY).fc
    n = blocks[0].x_test.shape[0]
    values = dze.fedpc_class_values(fc, dze.evidence_columns(schema, blocks, [0, 1]), schema)
    # Flat ψ: every leaf's value crosses once to the server; label leaves carry one column a class.
    expected = sum(8 * n * (2 if schema.target in leaf.scope else 1) for leaf in fc.leaves)
    assert dze.upward_link_bytes(fc, values) == expected == dze.fedpc_closed_form_bytes(fc, n, schema)
    assert any(schema.target in leaf.scope for leaf in fc.leaves)
    assert all(leaf.leaf.client == 0 for leaf in fc.leaves if schema.target in leaf.scope)


def test_product_of_experts_with_one_agent_is_that_agents_posterior() -> None:
    rng = np.random.default_rng(3)
    lj = rng.normal(size=(7, 3))
    local = dze.log_posterior(lj)
    prior = np.log(np.array([0.2, 0.5, 0.3]))
    np.testing.assert_allclose(dze.product_of_experts([local], prior), local, atol=1e-12)
    # With two experts the prior is divided out once: p ∝ p1 p2 / p(y).
    two = dze.product_of_experts([local, local[::-1]], prior)
    ref = np.exp(local + local[::-1] - prior)
    np.testing.assert_allclose(np.exp(two), ref / ref.sum(axis=1, keepdims=True), atol=1e-12)
    with pytest.raises(UserError):
        dze.product_of_experts([], prior)


def test_product_of_experts_is_exact_for_conditionally_independent_agents() -> None:
    # p(y, x1, x2) = p(y) p(x1|y) p(x2|y): the PoE of the exact local posteriors is the exact p(y | x).
    rng = np.random.default_rng(0)
    py = np.array([0.3, 0.7])
    p1 = rng.dirichlet(np.ones(3), size=2)  # (y, x1)
    p2 = rng.dirichlet(np.ones(4), size=2)  # (y, x2)
    x1, x2 = np.meshgrid(np.arange(3), np.arange(4), indexing="ij")
    x1, x2 = x1.ravel(), x2.ravel()
    joint = np.log(py)[None, :] + np.log(p1[:, x1].T) + np.log(p2[:, x2].T)
    l1 = dze.log_posterior(np.log(py)[None, :] + np.log(p1[:, x1].T))
    l2 = dze.log_posterior(np.log(py)[None, :] + np.log(p2[:, x2].T))
    np.testing.assert_allclose(dze.product_of_experts([l1, l2], np.log(py)), dze.log_posterior(joint),
                               atol=1e-12)


def test_algorithm1_with_label_on_every_client_predicts_the_prior() -> None:
    # Why the CL FedPC takes the label from client 0 only: as a shared subspace the label becomes
    # a sum over clients of PCs of y alone, independent of every feature.
    blocks, schema, _ = exp.empirical_case_data(exp.EmpiricalCase("breast-cancer", 2, 120))
    cfg = dze.FedPCConfig(n_clusters=2, n_products=2, label_from="all", learnspn=TINY.learnspn)
    fc = dze.train_fedpc(blocks, schema, cfg).fc
    lp = _posterior(fc, schema, blocks, [0, 1])
    np.testing.assert_allclose(lp, np.broadcast_to(lp[0], lp.shape), atol=1e-9)
    owner = dze.train_fedpc(blocks, schema, TINY).fc
    lp0 = _posterior(owner, schema, blocks, [0, 1])
    assert np.ptp(lp0[:, 1]) > 0.5  # the owner variant's posterior does depend on x


def test_eq14_departures_and_costs_on_constructed_losses() -> None:
    def res(cc: float, cd: tuple, dc: float, dd: tuple) -> dict:
        return {"CL/CI": dze.SettingResult("CL/CI", cc, 1, 0, 0),
                "CL/DI": dze.SettingResult("CL/DI", max(cd), 1, 0, 0, per_agent=cd),
                "DL/CI": dze.SettingResult("DL/CI", dc, 1, 0, 0),
                "DL/DI": dze.SettingResult("DL/DI", max(dd), 1, 0, 0, per_agent=dd)}

    assert dze.eq14_departures(res(0.1, (0.2, 0.3), 0.2, (0.4, 0.35))) == []
    dep = dze.eq14_departures(res(0.3, (0.2, 0.25), 0.1, (0.2, 0.1)))
    assert len(dep) == 3 and dep[0].startswith("R(CL/CI)")
    costs = dze.empirical_costs(res(0.1, (0.2, 0.3), 0.2, (0.4, 0.35)))
    assert costs[("DL/DI", "CL/CI")] == pytest.approx(0.3)
    assert costs[("CL/DI", "CL/CI")] == pytest.approx(0.2)


def test_label_must_be_on_every_client() -> None:
    blocks, schema, _ = exp.empirical_case_data(exp.EmpiricalCase("breast-cancer", 2, 120))
    b = blocks[1]
    keep = [j for j, f in enumerate(b.features) if f != schema.target]
    stripped = dze.ClientBlock(b.index, tuple(b.features[j] for j in keep), b.x_train[:, keep],
                               b.ids_train, b.x_test[:, keep])
    with pytest.raises(UserError, match="target"):
        dze.fedpc_declarations([blocks[0], stripped], schema)
    with pytest.raises(UserError, match="label_from"):
        dze.fedpc_declarations(blocks, schema, label_from="nobody")


def test_unknown_part_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="empirical"):
        exp.run(tmp_path, quick=True, parts=("nope",))


@pytest.mark.skipif(not (DATA / "adult").is_dir(), reason="adult data not in the data folder")
def test_adult_tiny_case_runs_with_three_clients(tmp_path: Path) -> None:
    case = exp.EmpiricalCase("adult", 3, 150)
    blocks, schema, y_train = exp.empirical_case_data(case)
    assert len(blocks) == 3 and all(schema.target in b.features for b in blocks)
    res, extras = dze.four_settings(blocks, schema, y_train, TINY)
    for s in dz.SETTINGS:
        assert np.isfinite(res[s].cross_entropy) and res[s].cross_entropy > 0
    assert res["DL/CI"].infer_bytes == dze.dl_ci_closed_form_bytes(extras["n_test"], 2, 3)
    assert len(res["DL/DI"].per_agent) == 3


class _LabelTable:
    """A stand-in leaf that knows only its label marginal: what the DI pack ships per label leaf."""

    def __init__(self, log_py: np.ndarray | None, target_col: int) -> None:
        self.log_py, self.t = log_py, target_col

    def log_likelihood(self, x: np.ndarray) -> np.ndarray:
        if self.log_py is None:
            return np.zeros(len(x))
        return self.log_py[x[:, self.t].astype(np.int64)]


def test_di_pack_suffices_for_decentralised_inference() -> None:
    # Agent k, holding its own leaves and only the pack (structure, weights, the other clients'
    # label marginals), computes the same p(y | x_k) as the full FedPC with the others marginalised.
    import copy

    blocks, schema, _ = exp.empirical_case_data(exp.EmpiricalCase("breast-cancer", 2, 120))
    fc = dze.train_fedpc(blocks, schema, TINY).fc
    for agent in (0, 1):
        cols = dze.evidence_columns(schema, blocks, [agent])
        full = dze.log_posterior(dze.fedpc_class_values(fc, cols, schema)[fc.root])
        packed = copy.deepcopy(fc)
        n_label_tables = 0
        for leaf in packed.leaves:
            if leaf.leaf.client == agent:
                continue
            feats = leaf.leaf.features
            if schema.target in feats:
                t = feats.index(schema.target)
                q = np.full((2, len(feats)), np.nan)
                q[:, t] = [0, 1]
                log_py = np.asarray(leaf.leaf.model.log_likelihood(q), dtype=np.float64).reshape(-1)
                leaf.leaf.model = _LabelTable(log_py, t)
                n_label_tables += 1
            else:
                leaf.leaf.model = _LabelTable(None, 0)
        got = dze.log_posterior(dze.fedpc_class_values(packed, cols, schema)[packed.root])
        np.testing.assert_allclose(got, full, atol=1e-9)
        inner = [n for n in fc.nodes if n.op != "leaf" and n.id in fc.reachable()]
        expected = 8 * sum(len(n.children) + len(n.weights) for n in inner) + 8 * 2 * n_label_tables
        assert dze.di_pack_bytes(fc, agent, schema) == expected
    assert dze.di_pack_bytes(fc, 1, schema) > dze.di_pack_bytes(fc, 0, schema)  # 1 needs 0's label tables


def test_zero_likelihood_rows_counts_rows_without_evidence() -> None:
    lj = np.array([[-1.0, -2.0], [-1e30, -1e30], [-np.inf, -1e30], [-1e30, -3.0]])
    assert dze.zero_likelihood_rows(lj) == 2


def test_job_message_kinds_are_distinct_and_clients_send_allowed_classes() -> None:
    import mpifc.baselines.protocol  # noqa: F401  (registration raises on an id collision)
    from mpifc.analysis import decentralization_job as job
    from mpifc.fedpc import protocol as P
    from mpifc.runtime.kinds import all_kinds

    kinds = all_kinds()
    assert len({k.kind_id for k in kinds}) == len(kinds)
    # What an agent sends: counts, a test-ids digest, likelihood vectors; never evidence.
    for k in (job.PRIOR_COUNTS, job.TEST_DECLARE, job.CLASS_LOGLIK):
        assert k.payload in P.CLIENT_ALLOWED
    assert job.CLASS_LOGLIK.payload == "likelihood_vector"


def test_job_product_of_experts_matches_the_analysis_rule() -> None:
    from mpifc.analysis import decentralization_job as job

    rng = np.random.default_rng(1)
    joints = [rng.normal(size=(6, 3)) for _ in range(3)]
    counts = np.array([5.0, 1.0, 0.0])
    prior = job.laplace_log_prior(counts)
    np.testing.assert_allclose(np.exp(prior), (counts + 1) / (counts.sum() + 3), atol=1e-15)
    want = dze.product_of_experts([dze.log_posterior(j) for j in joints], prior)
    np.testing.assert_allclose(job.poe(joints, prior), want, atol=1e-12)
