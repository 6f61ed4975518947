"""Table 7's FC[PC] glue per setting (paper.T7_GLUE): what the cells run, record and resume."""
from __future__ import annotations

import csv
import json

from data_prep.shards import load_manifest
from mpifc.experiments import paper
from mpifc.experiments.jobs import ShardCache, ShardSpec
from mpifc.experiments.store import OK, Cell
from mpifc.experiments.table7 import QUICK_ROWS, ConfigCheckedStore, cell_config, glue_note
from mpifc.federated.one_pass import GLUE_MODES, cluster_id_dtype

DATASETS = ("breast-cancer", "credit", "adult")


def test_glue_per_setting() -> None:
    for st, per in paper.T7_GLUE.items():
        for ds, (glue, k) in per.items():
            assert glue in GLUE_MODES and k >= 1
            # cooccurrence needs aligned sample ids: hybrid table shards split the rows
            assert glue != "cooccurrence" or st == "vertical", (st, ds)
    for ds in DATASETS:
        for st in ("horizontal", "hybrid"):
            if ds not in paper.T7_GLUE.get(st, {}):
                assert paper.classifier_glue(st, ds) == (paper.TABLE4[st][ds][2], paper.T7_DEFAULT_CLUSTERS)
        # FC[PC] takes T7_GLUE; FC[DT] keeps Table 4's glue and K (its runs do not change)
        assert cell_config(Cell(ds, "vertical", 3, "fc-pc", 2))["glue"] == paper.classifier_glue("vertical", ds)[0]
        assert cell_config(Cell(ds, "vertical", 3, "fc-pc", 2))["clusters"] == paper.classifier_glue("vertical", ds)[1]
        assert cell_config(Cell(ds, "vertical", 2, "fc-dt", 0)) == {
            "glue": paper.TABLE4["vertical"][ds][2], "clusters": paper.T7_DEFAULT_CLUSTERS, "label_owner": "all"}
        assert cell_config(Cell(ds, "vertical", 2, "splitnn", 0)) == {}


def test_a_cell_of_another_glue_is_not_reused(tmp_path) -> None:
    store = ConfigCheckedStore(tmp_path)
    v = Cell("adult", "vertical", 2, "fc-pc", 0)
    h = Cell("adult", "horizontal", 5, "fc-pc", 0)
    glue, k = paper.classifier_glue("vertical", "adult")
    # a record written before the glue was recorded: no glue recorded = Table 4's glue with K = 2
    legacy = {"accuracy": 0.8, "f1": 0.7, "label_owner": "default"}
    store.save(v, OK, legacy)
    store.save(h, OK, legacy)
    assert store.done(h)  # horizontal: unchanged configuration, resumed
    assert store.done(v) == ((glue, k) == (paper.TABLE4["vertical"]["adult"][2], paper.T7_DEFAULT_CLUSTERS))
    store.save(v, OK, {**legacy, "glue": glue, "clusters": k})
    assert store.done(v)
    other = "combinatorial" if glue != "combinatorial" else "cooccurrence"
    store.save(v, OK, {**legacy, "glue": other, "clusters": k})
    assert not store.done(v)
    store.save(v, OK, {**legacy, "glue": glue, "clusters": k + 1})
    assert not store.done(v)
    store.save(v, OK, {**legacy, "glue": glue, "clusters": k, "label_owner": 1})
    assert not store.done(v)
    store.save(Cell("adult", "vertical", 2, "splitnn", 0), OK, legacy)  # baselines: no FC config
    assert store.done(Cell("adult", "vertical", 2, "splitnn", 0))


def test_glue_note_names_every_dataset_and_setting() -> None:
    note = glue_note(list(DATASETS))
    for ds in DATASETS:
        for st in ("vertical", "hybrid"):
            g, k = paper.classifier_glue(st, ds)
            assert f"{paper.PAPER_NAMES[ds]} {g} K={k}" in note
    assert "one K-ary cluster id per aligned sample id" in note and "T7_GLUE" in note


def test_quick_vertical_cell_runs_its_glue(quick_table7, shard_cache) -> None:
    """The quick table7 run (shared fixture, no MPI job of its own): the vertical FC[PC]
    cell records its glue, and its ledger holds exactly what that glue sends."""
    out, summary = quick_table7
    recs = {(r["setting"], r["method"]): r for r in summary["records"]}
    rec = recs[("vertical", "fc-pc")]
    assert rec["status"] == OK
    glue, k = paper.classifier_glue("vertical", "breast-cancer")
    assert (rec["glue"], rec["clusters"]) == (glue, k)
    stored = json.loads((out / Cell("breast-cancer", "vertical", 2, "fc-pc", 0).relpath()).read_text())
    assert (stored["glue"], stored["clusters"]) == (glue, k)
    assert f"FC[PC] glue: vertical: Cancer {glue} K={k}" in (out / "table7.md").read_text()
    with open(rec["ledger"], newline="") as f:
        ids = [r for r in csv.DictReader(f) if r["kind"] == "fc.train.cluster_ids"]
    if glue == "cooccurrence":
        # one cluster id per aligned training row, from every client to the server, once, in the
        # smallest unsigned dtype holding K - 1 (1 B per row for K <= 256)
        d = ShardCache(shard_cache).get(ShardSpec("breast-cancer", "vertical", 2, 0, max_rows=QUICK_ROWS))
        n_train = [int(c["n_train"]) for c in load_manifest(d).clients]
        assert sorted(int(r["src"]) for r in ids) == list(range(1, 1 + len(n_train)))
        assert all(r["dst"] == "0" and r["phase"] == "learn" for r in ids)
        size = cluster_id_dtype(k).itemsize
        assert size == 1  # Table 7's K are small
        got = [int(r["payload_bytes"]) for r in sorted(ids, key=lambda r: int(r["src"]))]
        assert got == [size * n for n in n_train]
    else:
        assert ids == []
    # horizontal FC[PC] never sends cluster ids
    with open(recs[("horizontal", "fc-pc")]["ledger"], newline="") as f:
        assert not [r for r in csv.DictReader(f) if r["kind"] == "fc.train.cluster_ids"]
