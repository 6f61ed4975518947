#!/usr/bin/env python
"""Circuit-core benchmark against SPFlow 1.1.0, side by side in one run.

Parts (run all by default, or pick with ``--parts``):

  ratspn    RAT-SPN on 784 Gaussian inputs (depth 4, 5 repetitions, K=10 sums and leaves per
            region, elementwise products, one root per repetition: 85,455 parameters in both
            libraries). Batch 1000 of MNIST pixels (``--mnist``; synthetic N(0,1) data if the
            file is absent). Times: median over ``--repeat`` interleaved repetitions of
            (a) one forward pass (log-likelihood of the batch) and (b) one EM step (E-step and
            M-step on the batch). SPFlow's model is float32 (its default); ours is timed in
            float64 (our default) and float32. NaN checks after the EM steps on both.
  learnspn  LearnSPN/MSPN part, from ``circuit_learnspn.py`` in this folder when present
            (``bench_learnspn(args)``).

Usage: python launch/bench/circuit.py [--parts ratspn,learnspn] [--repeat 5] [--threads 1]
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gzip
import importlib.util
import io
import os
import pickle
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from mpifc.circuit.ratspn import RatSPN  # noqa: E402

DEFAULT_MNIST = Path(os.environ.get("MPIFC_DATA", str(REPO.parent / "shared" / "data"))) / "mnist" / "mnist.pkl.gz"
SPFLOW_REF = {"forward": 0.65, "em": 2.8}  # seconds, SPFlow 1.1.0 measured on an idle machine
TARGET_RATIO = 5.0


@contextlib.contextmanager
def _quiet() -> Any:
    """SPFlow prints and warns during EM; keep the benchmark's output readable."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _mnist_batch(path: Path, n: int) -> tuple[np.ndarray, str]:
    if path.exists():
        with gzip.open(path, "rb") as f:
            train, _, _ = pickle.load(f, encoding="latin1")  # the classic float [0, 1] pickle
        x = np.asarray(train[0][:n], dtype=np.float64)
        return x, f"MNIST pixels in [0, 1] ({path.name}, first {n} training images)"
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 784)), "synthetic N(0, 1) (MNIST file not found)"


def _time_once(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench_ratspn(args: argparse.Namespace) -> None:
    """RAT-SPN forward and EM-step times, ours vs SPFlow 1.1.0, and NaN checks."""
    from spflow.learn import expectation_maximization
    from spflow.modules.leaves import Normal
    from spflow.zoo.rat import RatSPN as SpflowRat

    D, R, K, V, B = 4, 5, 10, 784, args.batch
    x64, source = _mnist_batch(Path(args.mnist), B)
    print(f"\n== RAT-SPN: {V} Gaussian inputs, depth {D}, {R} repetitions, K={K}, batch {B}")
    print(f"data: {source}; torch threads: {torch.get_num_threads()}")

    torch.manual_seed(0)
    with _quiet():
        sp = SpflowRat([Normal(scope=list(range(V)), out_channels=K, num_repetitions=R)],
                       n_root_nodes=1, n_region_nodes=K, num_repetitions=R, depth=D)
    sp_params = sum(p.numel() for p in sp.parameters())
    ours = {"f64": RatSPN(V, depth=D, repetitions=R, num_sums=K, num_leaves=K, num_roots=1,
                          product="elementwise", seed=0, leaf_kwargs={"min_var": 1e-3}),
            "f32": RatSPN(V, depth=D, repetitions=R, num_sums=K, num_leaves=K, num_roots=1,
                          product="elementwise", seed=0, leaf_kwargs={"min_var": 1e-3},
                          dtype=torch.float32)}
    print(f"parameters: SPFlow {sp_params:,}, ours {ours['f64'].num_parameters():,}")
    xs = {"f64": torch.as_tensor(x64), "f32": torch.as_tensor(x64, dtype=torch.float32)}
    x_sp = xs["f32"]

    def sp_fwd() -> None:
        with _quiet(), torch.no_grad():
            sp.log_likelihood(x_sp)

    sp_init = copy.deepcopy(sp.state_dict())
    ours_init = {k: copy.deepcopy(m) for k, m in ours.items()}

    def sp_em() -> None:
        with _quiet():
            expectation_maximization(sp, x_sp, max_steps=1)

    def reset() -> None:
        # SPFlow's EM step leaves NaN parameters on MNIST (constant border pixels), after which
        # its next step raises; so every timed EM step starts from the initial parameters.
        sp.load_state_dict(sp_init)
        for k in ours:
            ours[k] = copy.deepcopy(ours_init[k])

    times: dict[str, dict[str, list[float]]] = {k: {"forward": [], "em": []} for k in ("spflow", "f64", "f32")}
    # Warm-up, then interleave so that every contender sees the same machine load.
    sp_fwd()
    for k, m in ours.items():
        m.log_likelihood(xs[k])
    for _ in range(args.repeat):
        reset()
        times["spflow"]["forward"].append(_time_once(sp_fwd))
        for k, m in ours.items():
            times[k]["forward"].append(_time_once(lambda m=m, k=k: m.log_likelihood(xs[k])))
        reset()
        times["spflow"]["em"].append(_time_once(sp_em))
        for k, m in ours.items():
            times[k]["em"].append(_time_once(lambda m=m, k=k: m.apply_em(m.em_statistics(xs[k]))))
    med = {k: {q: statistics.median(v) for q, v in d.items()} for k, d in times.items()}

    print(f"{'measurement':<22}{'SPFlow f32 [s]':>16}{'ours f64 [s]':>14}{'ratio':>8}{'ours f32 [s]':>14}{'ratio':>8}")
    for q, label in (("forward", "forward, batch 1000"), ("em", "one EM step")):
        s = med["spflow"][q]
        print(f"{label:<22}{s:>16.3f}{med['f64'][q]:>14.3f}{s / med['f64'][q]:>7.1f}x"
              f"{med['f32'][q]:>14.3f}{s / med['f32'][q]:>7.1f}x")
    print(f"(reference for SPFlow on an idle machine: forward {SPFLOW_REF['forward']} s, "
          f"EM step {SPFLOW_REF['em']} s; target ratio >= {TARGET_RATIO:.0f}x; medians of {args.repeat})")

    # float32 is an option only where measured safe: compare with float64 on the same parameters.
    probe = RatSPN(V, depth=D, repetitions=R, num_sums=K, num_leaves=K, num_roots=1,
                   product="elementwise", seed=0, leaf_kwargs={"min_var": 1e-3})
    probe32 = RatSPN(V, depth=D, repetitions=R, num_sums=K, num_leaves=K, num_roots=1,
                     product="elementwise", seed=0, leaf_kwargs={"min_var": 1e-3}, dtype=torch.float32)
    probe.apply_em(probe.em_statistics(xs["f64"]))
    probe32.weights = [W.float() for W in probe.weights]
    probe32.root_weights = probe.root_weights.float()
    probe32.P = {k: v.float() if v.is_floating_point() else v for k, v in probe.P.items()}
    d = (probe32.log_likelihood(xs["f32"]) - probe.log_likelihood(xs["f64"])).abs()
    ref = np.abs(probe.log_likelihood(xs["f64"]))
    print(f"float32 vs float64 log-likelihood after one EM step: max |diff| {float(d.max()):.3g} nats "
          f"(max relative {float((d / ref).max()):.2g})")

    sp_nan = any(bool(torch.isnan(p).any()) for p in sp.parameters())
    with _quiet(), torch.no_grad():
        sp_ll_nan = bool(np.isnan(sp.log_likelihood(x_sp)).any())
    print(f"NaN after one EM step: SPFlow parameters {sp_nan}, SPFlow log-likelihood {sp_ll_nan}")
    for k, m in ours.items():
        ll = m.log_likelihood(xs[k])
        bad = (not bool(torch.isfinite(ll).all())) or any(bool(torch.isnan(W).any()) for W in m.weights) \
            or any(bool(torch.isnan(v).any()) for v in m.P.values() if v.is_floating_point())
        print(f"ours {k}: NaN/inf anywhere {bad} after one EM step; mean train LL "
              f"{float(ll.double().mean()):.2f} nats")
    if not np.isfinite(med["f32"]["forward"]):
        raise SystemExit(1)


PARTS: dict[str, Callable[[argparse.Namespace], None]] = {"ratspn": bench_ratspn}


def _register_optional_parts() -> None:
    # The LearnSPN part lives in its own module (another owner); use it when it exists.
    path = Path(__file__).with_name("circuit_learnspn.py")
    if not path.exists():
        return
    spec = importlib.util.spec_from_file_location("circuit_learnspn", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    if hasattr(mod, "bench_learnspn"):
        PARTS["learnspn"] = mod.bench_learnspn
    if hasattr(mod, "add_arguments"):
        mod.add_arguments(_PARSER)


_PARSER = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
_PARSER.add_argument("--parts", default="all", help="comma-separated parts (default: all registered)")
_PARSER.add_argument("--repeat", type=int, default=5, help="interleaved repetitions per measurement")
_PARSER.add_argument("--threads", type=int, default=1, help="torch threads for every contender")
_PARSER.add_argument("--batch", type=int, default=1000)
_PARSER.add_argument("--mnist", default=str(DEFAULT_MNIST))


def main(argv: list[str] | None = None) -> None:
    _register_optional_parts()
    args = _PARSER.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = list(PARTS) if args.parts == "all" else [p.strip() for p in args.parts.split(",")]
    for name in names:
        if name not in PARTS:
            raise SystemExit(f"unknown part {name!r}; registered: {sorted(PARTS)}")
        PARTS[name](args)


if __name__ == "__main__":
    main()
