"""The delimited-text parser: typed columns, shared coding across files, clear errors."""
from __future__ import annotations

import numpy as np
import pytest

from data_prep.textparse import ColumnSpec, DelimitedParser
from mpifc.errors import UserError

SPECS = [ColumnSpec("age", "discrete"), ColumnSpec("job", "categorical"),
         ColumnSpec("id", "skip"), ColumnSpec("income", "target")]


def test_a_discrete_column_holds_integers_only():
    parser = DelimitedParser(SPECS)
    with pytest.raises(UserError, match=r"f.csv line 2, field 'age': '2.7' is not an integer \(the column is "
                                        r"declared discrete\)"):
        parser.feed(["1, a, 0, x", "2.7, a, 0, y"], "f.csv")
    parser = DelimitedParser(SPECS)
    parser.feed(["1, a, 0, x", "2.0, a, 0, y", "-3, b, 0, y"], "f.csv")
    assert parser.finish().column("age").tolist() == [1.0, 2.0, -3.0]


def test_uci_style_files_share_one_category_coding():
    parser = DelimitedParser(SPECS, missing=frozenset({"?"}))
    parser.feed(["39, zeta, 7, <=50K", "50, ?, 8, >50K", ""], "a.data")
    parser.feed(["|1x3 Cross validator", "25, alpha, 9, >50K."], "a.test", skip_prefix="|",
                strip_suffix=".")
    out = parser.finish()
    assert out.n_rows == 3
    assert np.array_equal(out.column("age"), [39.0, 50.0, 25.0])
    assert out.categories["job"] == ["alpha", "zeta"], "codes follow sorted labels"
    assert np.array_equal(out.column("job"), [1.0, np.nan, 0.0], equal_nan=True)
    assert out.classes == ["<=50K", ">50K"] and out.y.tolist() == [0, 1, 1]
    assert out.names == ["age", "job", "income"]


def test_integer_labels_sort_numerically():
    parser = DelimitedParser([ColumnSpec("y", "target")])
    parser.feed(["10", "9", "2"], "f.csv")
    out = parser.finish()
    assert out.classes == [2, 9, 10] and out.y.tolist() == [2, 1, 0]


@pytest.mark.parametrize("lines,message", [
    (["1, a, 0, x", "2, b, x"], "f.csv line 2: expected 4 fields, got 3"),
    (["1, a, 0, x", "old, b, 0, y"], "f.csv line 2, field 'age': 'old' is not a number"),
    (["inf, a, 0, x"], "f.csv line 1, field 'age': 'inf' is not finite"),
    (["1, a, 0, ?"], "f.csv line 1, field 'income': missing target label"),
    ([""], "f.csv: no data rows"),
])
def test_errors_name_file_line_and_field(lines, message):
    parser = DelimitedParser(SPECS, missing=frozenset({"?"}))
    with pytest.raises(UserError) as err:
        parser.feed(lines, "f.csv")
    assert str(err.value) == message


def test_header_line_is_skipped():
    parser = DelimitedParser([ColumnSpec("a", "real"), ColumnSpec("b", "real")])
    parser.feed(["a,b", "1,2", "3,NA"], "h.csv", header=True)
    out = parser.finish()
    assert np.array_equal(out.column("b"), [2.0, np.nan], equal_nan=True)


def test_undecodable_and_truncated_files_are_user_errors(tmp_path):
    bad = tmp_path / "latin.csv"
    bad.write_bytes(b"a,b\n1,caf\xe9\n")
    parser = DelimitedParser([ColumnSpec("a", "real"), ColumnSpec("b", "categorical")])
    with open(bad, encoding="utf-8", newline="") as f, \
            pytest.raises(UserError, match=r"latin\.csv: not UTF-8 text"):
        parser.feed(f, str(bad))


def test_numbers_follow_float_and_late_categories_keep_sorted_codes():
    lines = ["1_000, b, 0, y", "2, a, 0, x", " 3.0 , a, 0, x", "nan, ?, 0, x", "5, c, 0, y",
             "6, b, 0, x", "7, a, 0, y", "x8, a, 0, y"]
    parser = DelimitedParser(SPECS, missing=frozenset({"?"}))
    with pytest.raises(UserError, match="f.csv line 8, field 'age': 'x8' is not a number"):
        parser.feed(lines, "f.csv")
    parser = DelimitedParser(SPECS, missing=frozenset({"?"}))
    parser.feed(lines[:-1], "f.csv")
    out = parser.finish()
    assert np.array_equal(out.column("age"), [1000, 2, 3, np.nan, 5, 6, 7], equal_nan=True)
    assert out.categories["job"] == ["a", "b", "c"]
    assert np.array_equal(out.column("job"), [1, 0, 0, np.nan, 2, 1, 0], equal_nan=True)
    assert out.y.tolist() == [1, 0, 0, 0, 1, 0, 1]
