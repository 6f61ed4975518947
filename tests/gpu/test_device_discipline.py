"""Torch models that do not care where they compute.

* Every tensor an EiNet or a RAT-SPN creates while fitting, running EM or answering lives on the
  model's device: with torch's default device set to ``meta`` (tensors without data), any
  tensor made without naming its device would land there and fail on first use, which is what
  a CPU tensor does on a GPU model. The answers must equal those of a normal run.
* A model moved to another device answers the same; its saved bytes (what a client sends) do not
  depend on the device it was trained on.
* Running out of device memory is one clear error naming the device and the model's size.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from mpifc.errors import DeviceOutOfMemory
from mpifc.federated.learners import fit_leaf
from mpifc.federated.wire_format import model_from_bytes, model_to_bytes

RNG = np.random.default_rng(0)
N = 96
REAL = RNG.normal(size=(N, 6))
CODES = RNG.integers(0, 4, (N, 6)).astype(float)
MIXED = np.concatenate([REAL[:, :3], CODES[:, :3]], 1)
SMALL = {"num_sums": 2, "depth": 2, "repetitions": 2}
IMAGE = np.concatenate([RNG.integers(0, 256, (N, 16)), RNG.integers(0, 10, (N, 1))], 1).astype(float)

# Mixed leaves hold Gaussian and categorical slots; RAT-SPN's all-Gaussian leaves take a path of their own.
CASES = {
    "ratspn-gaussian": ("ratspn", REAL, ["real"] * 6, None, {"em_iters": 2}),
    "ratspn-mixed": ("ratspn", MIXED, ["real"] * 3 + ["categorical"] * 3, [0, 0, 0, 4, 4, 4], {"em_iters": 2}),
    "einet-mixed": ("einet", MIXED, ["real"] * 3 + ["categorical"] * 3, [0, 0, 0, 4, 4, 4],
                    {"epochs": 2, "batch_size": 32, **SMALL}),
    "einet-pd-image-and-label": ("einet", IMAGE, ["discrete"] * 17, [256] * 16 + [10],
                                 {"epochs": 1, "batch_size": 48, "leaf": "discretized_gaussian", "num_sums": 2,
                                  "image_shape": (4, 4), "pd_num_pieces": 2}),
}


def _fit(case: str, device: str = "cpu"):
    learner, x, meta, ks, hp = CASES[case]
    return fit_leaf(learner, x, meta, 0, n_categories=ks, device=device, **hp), x


def _answers(model, x: np.ndarray) -> list[np.ndarray]:
    q = x[:5].copy()
    q[:, 0] = np.nan
    out = [model.log_likelihood(q), model.mpe(q), model.sample(5, np.random.default_rng(1), evidence=q),
           model.sample(3, np.random.default_rng(2))]
    model.apply_em(model.em_statistics(x, sample_weight=np.linspace(0.5, 1.5, len(x))))
    return out + [model.log_likelihood(x[:8])]


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_tensor_is_made_off_the_model_device(case):
    want = _answers(*_fit(case))
    torch.set_default_device("meta")
    try:
        got = _answers(*_fit(case))
    finally:
        torch.set_default_device(None)  # no default-device mode left behind
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", ["ratspn-mixed", "einet-pd-image-and-label"])
def test_a_moved_model_answers_the_same_and_saves_the_same_bytes(case):
    model, x = _fit(case)
    blob = bytes(model_to_bytes(model))
    label = model.to_device("cpu:0")
    moved = model.to_device("cpu:0")  # another device object: the model is rebuilt there
    assert moved is not model and moved.device == torch.device("cpu:0")
    assert moved.to_device("cpu:0") is moved and model.to_device("cpu") is model
    for a, b in zip(_answers(model, x), _answers(moved, x)):
        np.testing.assert_array_equal(a, b)
    # what a client sends is the same whatever device the model was trained on
    if hasattr(label, "config"):
        label.config = replace(label.config, device="cuda:3")
    assert bytes(model_to_bytes(label)) == blob
    back = model_from_bytes(model_to_bytes(label))
    assert str(back.device) == "cpu"
    np.testing.assert_array_equal(back.log_likelihood(x[:8]), label.log_likelihood(x[:8]))


def test_running_out_of_device_memory_names_the_device_and_the_model_size(monkeypatch):
    from mpifc.circuit.einet.model import EiNet

    def oom(self, x, sw):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    sizes = []
    monkeypatch.setattr(EiNet, "_chunk_statistics", oom)
    monkeypatch.setattr(EiNet, "_initialize", lambda self, seed, real=EiNet._initialize: (
        sizes.append(self.num_parameters()), real(self, seed))[1])
    with pytest.raises(DeviceOutOfMemory) as e:
        _fit("einet-pd-image-and-label")
    n = sizes[0]
    assert str(e.value).startswith(f"out of memory on cpu in the E-step of an EiNet of {n:,} parameters; "
                                   f"use a smaller model"), str(e.value)
    assert e.value.__cause__ is None and e.value.exit_code == 2
