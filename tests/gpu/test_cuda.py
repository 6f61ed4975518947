"""On a real GPU (skipped without CUDA): a model trained there answers the same on the CPU, its
saved bytes are those of a CPU model, and the device's facts are read."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() "
                                                                      "is False here; the CPU path is tested elsewhere)")

RNG = np.random.default_rng(0)
IMAGE = np.concatenate([RNG.integers(0, 256, (256, 64)), RNG.integers(0, 10, (256, 1))], 1).astype(float)
REAL = RNG.normal(size=(256, 8))


@pytest.mark.parametrize("learner, x, meta, hp", [
    ("einet", IMAGE, ["discrete"] * 65, {"image_shape": (8, 8), "pd_num_pieces": 4, "num_sums": 4, "epochs": 2,
                                          "leaf": "discretized_gaussian", "dtype": "float32"}),
    ("ratspn", REAL, ["real"] * 8, {"em_iters": 3}),
])
def test_a_gpu_model_answers_the_same_on_the_cpu(learner, x, meta, hp):
    from mpifc.federated.learners import fit_leaf
    from mpifc.federated.wire_format import model_from_bytes, model_to_bytes

    gpu = fit_leaf(learner, x, meta, 0, device="cuda:0", **hp)
    assert str(gpu.device) == "cuda:0"
    cpu = model_from_bytes(model_to_bytes(gpu))
    assert str(cpu.device) == "cpu"
    q = x[:32].copy()
    q[:, 0] = np.nan
    np.testing.assert_allclose(cpu.log_likelihood(q), gpu.log_likelihood(q), rtol=1e-5)
    np.testing.assert_array_equal(cpu.mpe(q)[:, 1:], q[:, 1:])
    assert np.isfinite(gpu.sample(8, np.random.default_rng(0))).all()
    back = cpu.to_device("cuda:0")
    np.testing.assert_allclose(back.log_likelihood(q), gpu.log_likelihood(q), rtol=1e-6)
    assert bytes(model_to_bytes(back)) == bytes(model_to_bytes(cpu))


def test_device_facts_of_a_gpu():
    from mpifc.runtime.device import device_facts, select_device

    dev = select_device(0, "auto")
    assert str(dev) == "cuda:0"
    facts = device_facts(dev)
    assert facts["device"] == "cuda:0" and facts["memory_bytes"] > 2**30 and facts["peak_bytes"] >= 0
