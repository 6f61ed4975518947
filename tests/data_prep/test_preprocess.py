"""Preprocessing is fitted on the training rows only, and does what the paper says."""
from __future__ import annotations

import json

import numpy as np
import pytest

from data_prep.preprocess import Preprocessor
from mpifc.errors import UserError

from .conftest import make_images, make_table

TRAIN = np.arange(0, 180)
TEST = np.arange(180, 240)


def _params(pre: Preprocessor) -> str:
    return json.dumps(pre.to_json(), sort_keys=True)


def test_fit_ignores_test_rows_even_when_they_change_drastically(table):
    before = _params(Preprocessor.fit(table, TRAIN))
    table.x[TEST, 0] = 1e9          # outlying real values
    table.x[TEST, 2] = 2            # every test row in one category
    table.x[TEST, 4] = np.nan       # missing everywhere
    table.y[TEST] = 1 - table.y[TEST]
    assert _params(Preprocessor.fit(table, TRAIN)) == before


def test_fit_equals_a_fit_on_the_train_rows_alone(table):
    on_rows = Preprocessor.fit(table, TRAIN)
    alone = Preprocessor.fit(table.take(TRAIN), np.arange(TRAIN.size))
    assert _params(on_rows) == _params(alone)
    assert np.array_equal(on_rows.transform(table.x[TEST]), alone.transform(table.x[TEST]))


def test_but_fitting_on_other_rows_changes_the_parameters(table):
    # guards the two tests above against parameters that never depend on the data
    assert _params(Preprocessor.fit(table, TRAIN)) != _params(Preprocessor.fit(table, TEST))


def test_standardized_train_columns_have_zero_mean_unit_std_and_no_nan(table):
    pre = Preprocessor.fit(table, TRAIN)
    out = pre.transform(table.x[TRAIN])
    assert not np.isnan(out).any()
    assert np.allclose(out.mean(axis=0), 0.0, atol=1e-9)
    assert np.allclose(out.std(axis=0), 1.0, atol=1e-9)
    assert pre.meta_types == ["real"] * 5


def test_imputation_uses_the_train_median(table):
    pre = Preprocessor.fit(table, TRAIN, encode="none", standardize=False)
    seen = np.sort(table.x[TRAIN, 0][~np.isnan(table.x[TRAIN, 0])])
    # a median: between the two middle values (on neither: fewer than k rows hold each)
    assert seen[(seen.size - 1) // 2] < pre.columns[0].impute < seen[seen.size // 2]
    out = pre.transform(table.x[TEST])
    nan_rows = np.isnan(table.x[TEST, 0])
    assert nan_rows.any()
    assert np.all(out[nan_rows, 0] == pre.columns[0].impute)


def test_encode_none_keeps_codes_and_categorical_meta_types(table):
    pre = Preprocessor.fit(table, TRAIN, encode="none", standardize=True)
    assert pre.meta_types == ["real", "real", "categorical", "real", "categorical"]
    assert [c.n_categories for c in pre.columns] == [None, None, 3, None, 4]
    out = pre.transform(table.x)
    seen = ~np.isnan(table.x[:, 2])
    assert np.array_equal(out[seen, 2], table.x[seen, 2]), "codes untouched"
    assert set(np.unique(out[:, 4])) <= {0.0, 1.0, 2.0, 3.0}, "missing code imputed by mode"


def test_no_impute_no_standardize_is_the_identity_and_keeps_nan(table):
    pre = Preprocessor.fit(table, TRAIN, encode="none", impute=False, standardize=False)
    out = pre.transform(table.x)
    assert np.array_equal(out, table.x, equal_nan=True)
    assert pre.meta_types == table.meta_types


def test_target_encoding_maps_a_category_to_one_value_matching_the_class_rate():
    table = make_table(n=3000, seed=2, missing=False)
    train = np.arange(2400)
    pre = Preprocessor.fit(table, train, standardize=False)
    out = pre.transform(table.x)
    for code in range(3):
        rows = table.x[:, 2] == code
        values = np.unique(out[rows, 2])
        assert values.size == 1, "one category, one value, in train and test alike"
        rate = table.y[train][table.x[train, 2] == code].mean()
        assert values[0] == pytest.approx(rate, abs=0.02)


def test_target_encoding_needs_a_binary_target():
    with pytest.raises(UserError, match="--categoricals target needs a binary target"):
        Preprocessor.fit(make_table(n_classes=3), TRAIN)
    one_class = make_table()
    one_class.y[:] = 0
    with pytest.raises(UserError, match="needs both classes among the training rows"):
        Preprocessor.fit(one_class, TRAIN)
    # without categoricals there is nothing to encode, so any target is fine
    Preprocessor.fit(make_images(), np.arange(150))


def test_moments_are_accurate_for_large_values_across_chunks():
    rng = np.random.default_rng(0)
    table = make_table(n=10000, missing=False)
    table.x[:, 3] = 1e8 + rng.normal(0, 1.0, 10000)  # cancels badly with sum of squares
    pre = Preprocessor.fit(table, np.arange(10000), encode="none")
    assert pre.columns[3].mean == pytest.approx(table.x[:, 3].mean(), rel=1e-12)
    assert pre.columns[3].std == pytest.approx(table.x[:, 3].std(), rel=1e-6)


def test_constant_column_gets_unit_std():
    table = make_table(missing=False)
    table.x[:, 1] = 3.0
    pre = Preprocessor.fit(table, TRAIN)
    assert pre.columns[1].std == 1.0
    assert np.all(pre.transform(table.x)[:, 1] == 0.0)


def test_images_standardize_per_pixel_when_asked():
    images = make_images()
    pre = Preprocessor.fit(images, np.arange(150), standardize=True)
    out = pre.transform(images.x[:150])
    assert np.allclose(out.mean(axis=0), 0.0, atol=1e-9)
    back = out * np.array([c.std for c in pre.columns]) + np.array([c.mean for c in pre.columns])
    assert np.allclose(back, images.x[:150]), "raw levels recoverable from the manifest params"
