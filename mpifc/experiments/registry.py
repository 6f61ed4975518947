"""The registry of experiments: ``name -> run(out_dir, seeds, quick, **opts)``.

An experiment module registers itself when imported; :data:`MODULES` lists the modules the
registry imports on first use, so the CLI needs to know nothing but a name. To add one, write
``mpifc/experiments/<name>.py`` with a ``run`` function and add it to :data:`MODULES`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from mpifc.errors import UserError

RunFn = Callable[..., dict[str, Any]]


@dataclass(frozen=True)
class Experiment:
    """A registered experiment.

    Attributes:
        name: what the user types after ``mpifc experiment``.
        help: one line for ``--list``.
        run: ``run(out_dir, seeds, quick, **opts) -> summary``; options an experiment does not
            use are ignored by it.
    """

    name: str
    help: str
    run: RunFn


_REGISTRY: dict[str, Experiment] = {}

# name -> module that registers it (imported lazily: experiments pull in torch, h5py, ...).
MODULES: dict[str, str] = {
    "table1": "mpifc.experiments.table1",
    "table2": "mpifc.experiments.table2",
    "table3": "mpifc.experiments.table3",
    "table7": "mpifc.experiments.table7",
    "commcost": "mpifc.experiments.communication",
    "scaling": "mpifc.experiments.scaling",
    "decentralization": "mpifc.experiments.registry",
    "fedngm": "mpifc.experiments.fedngm",
}


def register(name: str, help: str, run: RunFn) -> None:
    """Add (or replace) experiment ``name``."""
    _REGISTRY[name] = Experiment(name, help, run)


def names() -> list[str]:
    return sorted(MODULES)


def get(name: str) -> Experiment:
    """The experiment called ``name``.

    Raises:
        UserError: no such experiment (the message lists the known ones).
    """
    if name not in MODULES:
        raise UserError(f"unknown experiment {name!r}; known: {', '.join(names())}")
    if name not in _REGISTRY:
        importlib.import_module(MODULES[name])
    return _REGISTRY[name]


def _run_decentralization(out_dir: str | Path, seeds: Sequence[int], quick: bool = False,
                          parts: Sequence[str] | None = None, **opts: Any) -> dict[str, Any]:
    # Part 1 is exact (seeds do not apply); part 2 measures the four settings on real data.
    from mpifc.experiments import decentralization

    keep = {k: opts[k] for k in ("datasets", "max_rows", "timeout", "shards") if k in opts}
    return decentralization.run(out_dir, quick=quick, parts=tuple(parts or ("exact", "empirical")),
                                seeds=list(seeds), **keep)


register("decentralization", "cost of decentralisation in vertical FL", _run_decentralization)
