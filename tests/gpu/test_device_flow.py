"""The device travels down as a value, in one process: ``mpifc.simulate(device=)`` hands it to
every torch learner (EiNet, RAT-SPN) and to no other, ``mpifc.load(device=)`` and a query rank
put the torch leaf PCs there, and nothing resolves a device where no leaf computes on torch.

torch is told there are two GPUs (``fake_gpus``); spies record the device string where it
arrives and let the work run on the CPU.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import mpifc
from mpifc.federated import learners as L

HP = {"num_sums": 2, "depth": 1, "repetitions": 1, "epochs": 1, "em_iters": 1}
RAT = {k: v for k, v in HP.items() if k != "epochs"}
EIN = {k: v for k, v in HP.items() if k != "em_iters"}


@pytest.fixture
def fit_spy(monkeypatch):
    """Every EiNet and RAT-SPN fit records ``(learner, device)`` and runs on the CPU."""
    seen: list[tuple[str, str]] = []
    for name in ("einet", "ratspn"):
        real = L.get_learner(name)

        def spy(x, meta_types, seed, n_categories=None, var_min_var=None, device="cpu", _real=real, _name=name,
                **hp):
            seen.append((_name, device))
            return _real(x, meta_types, seed, n_categories=n_categories, var_min_var=var_min_var, device="cpu", **hp)

        monkeypatch.setitem(L._REGISTRY, name, spy)
    return seen


@pytest.fixture
def move_spy(monkeypatch):
    """Every move of a loaded model to a device records ``(model type, device)`` and moves nothing."""
    import mpifc.circuit.device as D

    seen: list[tuple[str, str]] = []
    monkeypatch.setattr(D, "to_device", lambda model, device: (seen.append((model.model_type, device)), model)[1])
    return seen


def test_simulate_hands_the_device_to_each_torch_learner_only(bc_h1, fake_gpus, fit_spy, move_spy):
    fm = mpifc.simulate(bc_h1, learner="einet", hyperparameters=EIN, glue="random", clusters=1, refine="em",
                        em_iters=1, device="cuda:1")
    assert fit_spy == [("einet", "cuda:1")]
    assert np.isfinite(fm.log_likelihood(np.full((2, len(fm.features)), np.nan))).all()
    fit_spy.clear()
    mpifc.simulate(bc_h1, learner="ratspn", hyperparameters=RAT, glue="random", clusters=1)  # auto: local rank 0
    assert fit_spy == [("ratspn", "cuda:0")]


def test_no_device_is_resolved_where_nothing_computes_on_torch(bc_h1, fake_gpus, fit_spy, monkeypatch, tmp_path):
    import mpifc.runtime.device as R

    def refuse(*_a, **_k):
        raise AssertionError("a device was resolved for leaves that compute with numpy")

    monkeypatch.setattr(R, "select_device", refuse)
    fm = mpifc.simulate(bc_h1, learner="factorized", model=tmp_path / "f.h5", device="auto")
    assert fit_spy == []
    mpifc.load(tmp_path / "f.h5", device="auto")
    ctx = SimpleNamespace(rank=1)  # a query rank whose ``device`` is never asked for
    from mpifc.federated.serialize import load_fc
    from mpifc.fedpc.devices import place_for_rank

    place_for_rank(ctx, load_fc(tmp_path / "f.h5", load_models={1}))
    assert fm.fc.nodes  # the model itself is fine


def test_loading_puts_the_torch_leaves_on_the_device(bc_h1, fake_gpus, move_spy, tmp_path):
    path = tmp_path / "e.h5"
    mpifc.simulate(bc_h1, learner="einet", hyperparameters=EIN, glue="random", clusters=1, model=path,
                   device="cpu")
    move_spy.clear()
    mpifc.load(path, device="cuda:1")
    assert move_spy == [("einet", "cuda:1")]
    move_spy.clear()
    mpifc.load(path)  # auto
    assert move_spy == [("einet", "cuda:0")]
    # a query rank moves its own leaves only, to its own device
    from mpifc.federated.serialize import load_fc
    from mpifc.fedpc.devices import place_for_rank

    fc = load_fc(path, load_models=True)
    move_spy.clear()
    import torch

    place_for_rank(SimpleNamespace(rank=2, device=torch.device("cuda:1")), fc)  # holds no leaf
    assert move_spy == []
    place_for_rank(SimpleNamespace(rank=1, device=torch.device("cuda:1")), fc)
    assert move_spy == [("einet", "cuda:1")]
