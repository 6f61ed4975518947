"""The pipeline: subsampling, train/test split, segment split, determinism."""
from __future__ import annotations

import numpy as np
import pytest

from data_prep.prepare import PrepConfig, prepare_table, stratified_pick
from data_prep.segments import evaluate, parse_predicate
from mpifc.errors import UserError

from .conftest import make_table


def test_stratified_pick_keeps_class_shares_and_is_deterministic():
    groups = np.repeat([0, 1, 2], [700, 200, 100])
    a = stratified_pick(groups, 100, np.random.default_rng(4))
    b = stratified_pick(groups, 100, np.random.default_rng(4))
    assert np.array_equal(a, b) and a.size == 100 and np.unique(a).size == 100
    assert np.bincount(groups[a]).tolist() == [70, 20, 10]


def test_max_rows_keeps_the_own_split_and_class_proportions():
    table = make_table(n=1000, own_test=True)
    prepared = prepare_table(table, PrepConfig(max_rows=200, clients=2))
    sub = prepared.table
    assert sub.n_rows == 200
    assert sub.own_test.sum() == 60, "30% of the rows are the dataset's own test rows"
    assert abs(sub.y.mean() - table.y.mean()) < 0.02
    assert set(sub.ids) <= set(table.ids)
    again = prepare_table(table, PrepConfig(max_rows=200, clients=2))
    assert np.array_equal(again.table.ids, sub.ids)


def test_test_fraction_overrides_the_own_split():
    prepared = prepare_table(make_table(n=400, own_test=True),
                             PrepConfig(test_fraction=0.5, clients=2))
    assert prepared.test_rows.size == 200
    assert not set(prepared.test_rows) & set(prepared.train_rows)


def test_segment_split_over_represents_each_clients_segment():
    table = make_table(n=3000, seed=1)
    cfg = PrepConfig(split="segment", clients=3, oversample=6.0,
                     segments=("cat_a==a0", "disc >= 5", "cat_b in b1,b2"))
    prepared = prepare_table(table, cfg)
    info = prepared.segment_info
    assert [s["predicate"] for s in info] == list(cfg.segments)
    for s in info:
        assert s["rate_on_client"] > 1.3 * s["rate_in_train"]
    rows = np.concatenate([c.train_rows for c in prepared.partition.clients])
    assert np.array_equal(np.sort(rows), prepared.train_rows), "every train row once"


def test_predicates_parse_and_match():
    table = make_table(n=50)
    cols = table.features + ["label"]
    p = parse_predicate("cat_b not in b0,b3", cols)
    assert (p.column, p.op, p.values) == ("cat_b", "not in", ("b0", "b3"))
    hit = evaluate(p, table)
    codes = table.x[:, 4]
    assert np.array_equal(hit, np.isin(codes, [1, 2]))  # NaN matches nothing
    assert np.array_equal(evaluate(parse_predicate("label==k1", cols), table), table.y == 1)
    assert np.array_equal(evaluate(parse_predicate("real_a<5", cols), table),
                          np.nan_to_num(table.x[:, 0], nan=np.inf) < 5)


@pytest.mark.parametrize("text,message", [
    ("colour==red", "unknown column 'colour'"),
    ("cat_a==a9", "'a9' is not a value of 'cat_a' (values: a0, a1, a2)"),
    ("cat_a<a1", "'cat_a' is categorical"),
    ("real_a>=high", "'real_a' is numeric"),
    ("real_a", "expected COLUMN==VALUE"),
])
def test_bad_predicates_name_the_problem(text, message):
    table = make_table(n=50)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        evaluate(parse_predicate(text, table.features + ["label"]), table)


def test_dirichlet_with_too_few_rows_reports_the_empty_client():
    with pytest.raises(UserError, match="would get no training rows"):
        prepare_table(make_table(n=40), PrepConfig(split="dirichlet", alpha=0.01, clients=8))
