"""``mpifc experiment NAME``: run a paper experiment (``--list`` names them all)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mpifc.cli.common import DEVICE_ENV, device_value
from mpifc.errors import UserError
from mpifc.experiments.options import (KNOWN_DATASETS, KNOWN_METHODS, KNOWN_SETTINGS, SUFFIXED_DATASETS,
                                       parse_int_list, parse_names)


def add_experiment_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``mpifc experiment`` (``--config`` is added by the CLI itself)."""
    from mpifc.experiments import registry

    p.add_argument("name", nargs="?", help=f"experiment: {', '.join(registry.names())}")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.add_argument("--out", metavar="DIR",
                   help="result folder (default results/NAME); an earlier result folder is resumed, a folder "
                        "holding anything else is refused (see --overwrite)")
    p.add_argument("--overwrite", action="store_true",
                   help="write into --out even when it holds files that are not experiment results (files "
                        "of the same names are replaced, others left alone)")
    p.add_argument("--seeds", default=None, metavar="SPEC",
                   help="seeds as ranges and lists, e.g. 0-4 or 0,2,5 (default 0-4; --quick: 0)")
    p.add_argument("--quick", action="store_true", help="reduced version (small data, few ranks), for tests")
    p.add_argument("--datasets", default=None, metavar="LIST",
                   help=f"comma-separated subset of {','.join(KNOWN_DATASETS)}")
    p.add_argument("--methods", default=None, metavar="LIST",
                   help=f"table7: comma-separated subset of {','.join(KNOWN_METHODS)} (default: all)")
    p.add_argument("--settings", default=None, metavar="LIST",
                   help=f"comma-separated subset of {','.join(KNOWN_SETTINGS)}")
    p.add_argument("--ranks", default=None, metavar="LIST", help="rank counts of the scaling sweep, e.g. 2,4,8,16,32")
    p.add_argument("--max-rows", type=int, default=None, metavar="N", help="subsample each dataset to N rows")
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="seconds before one MPI job is killed")
    p.add_argument("--device", type=device_value, default=None, metavar="DEV",
                   help="--device of every MPI job the experiment starts (train, evaluate, query, FedAvg, SplitNN: "
                        "auto, cpu, cuda or cuda:N), passed on as $MPIFC_DEVICE; evaluations the experiment runs "
                        "in its own process stay on the CPU; default: the jobs' own (auto, or $MPIFC_DEVICE)")
    p.add_argument("--shards", default=None, metavar="DIR", help="shard cache folder (default OUT/shards)")
    p.add_argument("--assign", default=None, choices=("flat", "tree"), help="scaling: ψ strategy")
    p.add_argument("--servers", type=int, default=None, metavar="S",
                   help="scaling: intermediate servers of --assign tree")
    p.add_argument("--parts", default=None, metavar="LIST", help="decentralization: parts to run")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    p.add_argument("--horizontal-split", default=None, choices=("paper", "label", "iid"),
                   help="table1: horizontal sample split (paper: appendix E, random for the binary tabular "
                        "sets and label for MNIST; label: every dataset by label subsets)")
    p.add_argument("--timing-repeats", type=int, default=None, metavar="R",
                   help="table1: rounds of (FedPC job, centralized fit) per tabular cell, each side its "
                        "fastest (default 3; 1 with --quick)")


def options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword options an experiment's ``run`` receives (validated)."""
    opts: dict[str, Any] = {"progress": not getattr(args, "no_progress", False)}
    ds = parse_names(getattr(args, "datasets", None), KNOWN_DATASETS, "--datasets", SUFFIXED_DATASETS)
    if ds:
        opts["datasets"] = ds
    st = parse_names(getattr(args, "settings", None), KNOWN_SETTINGS, "--settings")
    if st:
        opts["settings"] = st
    ms = parse_names(getattr(args, "methods", None), KNOWN_METHODS, "--methods")
    if ms:
        opts["methods"] = ms
    if getattr(args, "ranks", None):
        ranks = parse_int_list(args.ranks, "--ranks")
        if min(ranks) < 2:
            raise UserError(f"--ranks {args.ranks!r}: every rank count must be >= 2 (a server and a client)")
        opts["ranks"] = ranks
    for key in ("max_rows", "timeout", "shards", "assign", "servers"):
        v = getattr(args, key, None)
        if v is not None:
            opts[key] = str(Path(v).absolute()) if key == "shards" else v
    if opts.get("max_rows") is not None and opts["max_rows"] < 10:
        raise UserError(f"--max-rows must be >= 10, got {opts['max_rows']}")
    if getattr(args, "horizontal_split", None) is not None:
        opts["horizontal_split_choice"] = args.horizontal_split
    if getattr(args, "timing_repeats", None) is not None:
        if args.timing_repeats < 1:
            raise UserError(f"--timing-repeats must be >= 1, got {args.timing_repeats}")
        opts["timing_repeats"] = args.timing_repeats
    if getattr(args, "parts", None):
        opts["parts"] = [s.strip() for s in args.parts.split(",") if s.strip()]
    return opts


def experiment_main(args: argparse.Namespace) -> int:
    """Handler of ``mpifc experiment``; returns the exit code (2 on bad input, via UserError)."""
    from mpifc.experiments import registry

    if getattr(args, "list", False) or not getattr(args, "name", None):
        if not getattr(args, "list", False):
            raise UserError(f"experiment name missing; known: {', '.join(registry.names())}")
        for name in registry.names():
            print(f"{name:>18}  {registry.get(name).help}")
        return 0
    exp = registry.get(args.name)
    quick = bool(getattr(args, "quick", False))
    seeds_spec = getattr(args, "seeds", None) or ("0" if quick else "0-4")
    seeds = parse_int_list(seeds_spec, "--seeds")
    # absolute: the experiments launch their MPI jobs from the repository root
    out = Path(getattr(args, "out", None) or Path("results") / args.name).absolute()
    opts = options_from_args(args)
    only_table1 = [f for f, k in (("--horizontal-split", "horizontal_split_choice"), ("--timing-repeats", "timing_repeats"))
                   if k in opts]
    if only_table1 and args.name != "table1":
        raise UserError(f"{', '.join(only_table1)}: an option of table1 only, not of {args.name!r}")
    if getattr(args, "device", None):
        import os

        os.environ[DEVICE_ENV] = args.device  # the jobs' --device default (mpifc.cli.common)
    fresh = not out.exists()
    check_result_folder(out, bool(getattr(args, "overwrite", False)))
    try:
        mark_result_folder(out, args.name)
        summary = exp.run(out, seeds, quick, **opts)
    except BaseException:
        if fresh:
            _remove_if_only_marker(out)
        raise
    for path in summary.get("files", []):
        print(f"{args.name}: wrote {path}")
    if summary.get("markdown"):
        print(summary["markdown"])
    counts = summary.get("counts")
    if counts:
        print(f"{args.name}: cells ran {counts['ran']}, skipped (done) {counts['skipped']}, "
              f"failed {counts['failed']}", file=sys.stderr)
    return 0


MARKER = ".mpifc-experiment"
"""A file in every result folder: marks it as one (``{"experiment": NAME}``), so a later run may
resume in it and a folder of other files is never taken for one."""


def is_result_folder(folder: Path) -> bool:
    """Whether ``folder`` holds experiment results: its marker, or the ``cells`` folder of results
    written before the marker existed."""
    return (folder / MARKER).is_file() or (folder / "cells").is_dir()


def check_result_folder(out: Path, overwrite: bool) -> None:
    """Refuse a result folder that cannot be written, or (unless ``overwrite``) an existing folder
    that holds files but no experiment results: one line naming ``--out``."""
    from mpifc.atomic import name_output, write_problem

    problem = write_problem(out, folder=True)
    if problem is not None:
        raise UserError(f"--out {out}: cannot be written: {problem}")
    if out.is_dir() and not overwrite and any(out.iterdir()) and not is_result_folder(out):
        first = sorted(p.name for p in out.iterdir())[0]
        raise UserError(f"--out {out}: holds files that are not experiment results, e.g. {out / first}; "
                        f"refusing to write into it (choose a new folder, or give --overwrite)")
    name_output(out, f"--out {out}")  # a failed write of a result names the flag


def mark_result_folder(out: Path, name: str) -> None:
    from mpifc.atomic import atomic_write_text

    if not (out / MARKER).is_file():
        atomic_write_text(out / MARKER, '{"experiment": "%s"}\n' % name)


def _remove_if_only_marker(out: Path) -> None:
    """A fresh result folder a failed run left with nothing but its marker goes again."""
    try:
        if [p.name for p in out.iterdir()] == [MARKER]:
            (out / MARKER).unlink()
            out.rmdir()
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mpifc experiment", description="Run a paper experiment.")
    add_experiment_arguments(p)
    args = p.parse_args(argv)
    try:
        return experiment_main(args)
    except UserError as e:
        print(f"mpifc experiment: {e}", file=sys.stderr)
        return 2


__all__ = ["add_experiment_arguments", "experiment_main", "options_from_args", "main"]
