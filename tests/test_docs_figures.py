"""Every figure docs/ quotes is checked or dated: tagged for a test or a benchmark as the
README's are (``launch/figures.py``), or on a line a ``<!-- run ... -->`` marker covers (date,
load, peer and the command that measures it again), or on a line marked ``<!-- fixed -->`` (a
setting or rule of the code, not a measurement). docs/benchmarks.md holds one run marker per
row, so each figure there is one row to update."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.script_util import load_script

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md"))
figures = load_script("launch/figures.py", "docs_figures")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_figure_of_the_docs_is_tagged_dated_or_fixed(doc):
    assert figures.untagged(doc.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_run_marker_states_date_load_peer_and_command(doc):
    text = doc.read_text(encoding="utf-8")
    bad = [r if isinstance(r, str) else "; ".join(r.problems()) for r in figures.runs(text)]
    assert [b for b in bad if b] == []
    # a command named in a marker is one of the project's: its script exists
    for r in figures.runs(text):
        for script in re.findall(r"(launch/\S+\.py)", r.command):
            assert (REPO / script).exists(), f"{doc.name} line {r.line}: {script} does not exist"


def test_every_benchmark_row_is_one_dated_run():
    text = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    rows = [ln for ln in text.splitlines() if ln.startswith("| `")]
    assert len(rows) >= 15
    for row in rows:
        [run] = [r for r in figures.runs(row)]
        assert not isinstance(run, str) and not run.problems(), row[:120]
        assert f"`{run.command}`" in row.split("|")[1] or run.command in row, row[:120]


def _sampled_em_kB() -> float:
    """The vertical class glue's default sampled EM with two clients and two classes on a table
    large enough for the most clusters: the label owner's 2 class PCs and the other client's
    cluster PCs of all its column groups, each sending its values on the sampled rows once (every
    PC kept)."""
    from mpifc.analysis.commcost import sampled_em_bytes
    from mpifc.federated.defaults import CLASS_GLUE_EM_ITERS, CLASS_GLUE_EM_ROWS, default_group_clusters

    k = sum(default_group_clusters([10**6] * 8, [0] * 8))
    return sampled_em_bytes(CLASS_GLUE_EM_ROWS, 0, 2 + k, CLASS_GLUE_EM_ITERS, stopped=False) / 1e3


MEASURED = {"guide.sampled_em_kB": _sampled_em_kB}
"""How this test computes each ``test:KEY`` figure of docs/ (``bench:KEY`` ones belong to
``launch/bench/readme.py``, as the README's)."""


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_tagged_figure_of_the_docs_has_its_checker_and_holds(doc):
    bench = load_script("launch/bench/readme.py", "docs_readme_bench")
    for fig in figures.figures(doc.read_text(encoding="utf-8")):
        if fig.checker == "bench":
            assert fig.key in bench.MEASURED, f"{doc.name}: bench:{fig.key} is measured by nobody"
            continue
        assert fig.key in MEASURED, f"{doc.name}: test:{fig.key} (line {fig.line}) is measured by nobody"
        measured = MEASURED[fig.key]()
        assert fig.allows(measured), f"{doc.name}: " + fig.describe(measured)


def test_the_marker_checker_finds_missing_fields():
    text = ("| `python launch/bench/x.py` | 3 s |<!-- run 2026-11-28 | load 4 | peer raw mpi4py | `python launch/bench/x.py` -->\n"
            "| y | 4 s |<!-- run yesterday | load high | peer x | `ls` -->\n")
    good, bad = figures.runs(text)
    assert not good.problems() and len(bad.problems()) == 3
    assert figures.untagged(text) == [] and figures.untagged("5 s") != []
