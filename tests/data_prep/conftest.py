"""Small synthetic tables shared by the data_prep tests."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from data_prep.files import default_data_root
from data_prep.table import RawTable, pixel_names

REPO = Path(__file__).resolve().parents[2]
DATA = default_data_root()  # $MPIFC_DATA, else <repo>/../shared/data, as the loaders see it


def make_table(n: int = 240, n_classes: int = 2, seed: int = 0, own_test: bool = False,
               missing: bool = True) -> RawTable:
    """A mixed table: 2 real, 1 discrete, 2 categorical features (with NaN), a target.

    The target depends on ``cat_a`` so that target encoding has something to find.
    """
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, n)
    cat_a = (y + rng.integers(0, 2, n)) % 3
    x = np.column_stack([
        rng.normal(5.0, 2.0, n),                # real_a
        rng.integers(0, 7, n).astype(float),    # disc
        cat_a.astype(float),                    # cat_a (3 categories)
        rng.exponential(1e5, n),                # real_b, large values
        rng.integers(0, 4, n).astype(float),    # cat_b (4 categories)
    ])
    if missing:
        x[rng.random(n) < 0.1, 0] = np.nan
        x[rng.random(n) < 0.1, 4] = np.nan
    mask = None
    if own_test:
        mask = np.zeros(n, dtype=bool)
        mask[int(0.7 * n):] = True
    return RawTable(name="synthetic", x=x, features=["real_a", "disc", "cat_a", "real_b", "cat_b"],
                    meta_types=["real", "discrete", "categorical", "real", "categorical"],
                    categories={"cat_a": ["a0", "a1", "a2"], "cat_b": ["b0", "b1", "b2", "b3"]},
                    y=y.astype(np.int64), target="label",
                    classes=[f"k{c}" for c in range(n_classes)], own_test=mask,
                    source_splits={"all": [0, n]})


def make_images(n: int = 200, side: int = 6, seed: int = 0) -> RawTable:
    """``n`` random ``side x side`` images with pixel levels 0..15 and 4 classes."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 16, (n, side * side)).astype(np.uint8)
    return RawTable(name="images", x=x, features=pixel_names(side, side),
                    meta_types=["discrete"] * side * side, y=rng.integers(0, 4, n),
                    target="label", classes=[0, 1, 2, 3], image_shape=(side, side),
                    pixel={"levels": 16, "file_scale": 1.0}, standardize_default=False)


@pytest.fixture
def table() -> RawTable:
    return make_table()


def needs_data(*parts: str):
    """Decorator: mark a test ``data`` and skip it when ``DATA/<parts>`` is absent."""
    path = DATA.joinpath(*parts)

    def mark(fn):
        return pytest.mark.data(pytest.mark.skipif(not path.exists(),
                                                   reason=f"{path} not available")(fn))
    return mark
