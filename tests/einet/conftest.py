"""Shared tiny models and data for the EiNet tests."""
from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from mpifc.circuit.einet import EiNet, EiNetConfig


def tiny(leaf: str, levels: int = 3, k: int = 2, shape=(2, 2), pieces=(2,), **kw) -> EiNet:
    """A float64 PD EiNet on a tiny image."""
    cfg = EiNetConfig(num_sums=k, leaf=leaf, num_levels=levels, dtype="float64", **kw)
    return EiNet.poon_domingos(shape, list(pieces), cfg)


def all_images(levels: int, n_vars: int) -> np.ndarray:
    """Every discrete image, ``(levels ** n_vars, n_vars)``."""
    return np.array(list(itertools.product(range(levels), repeat=n_vars)), dtype=np.float64)


@pytest.fixture(scope="session")
def digits() -> np.ndarray:
    """scikit-learn's 8x8 digits (bundled with the package, no download), values 0..16, (1797, 64).

    Read straight from the package's CSV: importing sklearn costs more than all the EiNet tests.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("scikit-learn not installed")
    csv = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"
    if not csv.exists():
        from sklearn.datasets import load_digits

        return load_digits().data.astype(np.float64)
    return np.loadtxt(csv, delimiter=",")[:, :64]


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny tensors: one thread avoids OpenMP oversubscription on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
