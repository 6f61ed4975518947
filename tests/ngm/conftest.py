"""Shared small data and models for the NGM tests (single-threaded, seconds each)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mpifc.ngm.graph import DependencyGraph
from mpifc.ngm.inference import InferenceSettings
from mpifc.ngm.schema import Schema, categorical, real
from mpifc.ngm.training import TrainConfig, fit_ngm

torch.set_num_threads(1)

# A chain a - b - c - d: three Gaussians with correlation 0.8 per link, and a 3-valued d that is a
# noisy discretisation of c.
CHAIN_SCHEMA = Schema((real("a"), real("b"), real("c"), categorical("d", 3)))
CHAIN_GRAPH = DependencyGraph.from_edges(CHAIN_SCHEMA.names, [("a", "b"), ("b", "c"), ("c", "d")])
# About 240 Adam steps: enough for the path norm to close the forbidden paths on these toys.
SMALL = TrainConfig(epochs=20, batch_size=128, lam=1.0, seed=0, calib_rows=300,
                    inference=InferenceSettings(steps=10))


def chain_data(n: int, seed: int) -> np.ndarray:
    """``(n, 4)`` rows of the chain."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(n)
    b = 0.8 * a + 0.6 * rng.standard_normal(n)
    c = 0.8 * b + 0.6 * rng.standard_normal(n)
    d = (c + 0.5 * rng.standard_normal(n) > 0).astype(float) + (c > 1.0)
    return np.stack([a, b, c, d], axis=1)


@pytest.fixture(scope="session")
def chain_train() -> np.ndarray:
    return chain_data(1500, seed=0)


@pytest.fixture(scope="session")
def chain_test() -> np.ndarray:
    return chain_data(800, seed=1)


@pytest.fixture(scope="session")
def chain_model(chain_train):
    """One trained chain NGM shared by the read-only tests."""
    return fit_ngm(chain_train, CHAIN_SCHEMA, CHAIN_GRAPH, hidden=(16, 16), config=SMALL)
