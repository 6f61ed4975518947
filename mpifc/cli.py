"""The ``mpifc`` command line: ``info``, ``train``, ``evaluate``, ``bench``, ``experiment``.

Run it under ``mpiexec`` for multi-rank jobs (``mpiexec -n 4 mpifc train ...``). Like
``python -m mpi4py``, an uncaught exception on any rank aborts the whole job, printing the rank
and the error; bad input is one line on stderr and exit code 2.

Plugging in a subcommand: point its entry in :data:`COMMANDS` at the handler and at the function
that adds its flags (see :class:`Command`).
"""
from __future__ import annotations

import argparse
import importlib
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import mpifc
from mpifc.errors import UserError



@dataclass(frozen=True)
class Command:
    """A subcommand: its handler and the function that adds its flags, as ``"module:function"``.

    Both are imported only when the CLI is built or run, so heavy modules load on demand. The
    handler takes the parsed ``argparse.Namespace`` and returns an exit code. The CLI itself adds
    ``--config`` to every subcommand but ``bench``; flags added by ``arguments`` then work in
    config files too (``required=True`` flags may come from the file).
    """

    help: str
    handler: str
    arguments: str


# Plugging in a subcommand is one line here, e.g.
#   "train": Command("train a federated circuit", "mpifc.runtime.fc_job:train_main",
#                    "mpifc.runtime.fc_job:add_train_arguments"),
COMMANDS: dict[str, Command] = {
    "info": Command("MPI library, ranks, devices and package versions", "mpifc.runtime.info:info_main",
                    "mpifc.cli:add_job_arguments"),
    "train": Command("train a federated circuit (or FedNGM)", "mpifc.cli:family_train_main",
                     "mpifc.cli:add_family_train_arguments"),
    "evaluate": Command("evaluate a trained federated circuit (or FedNGM)", "mpifc.cli:family_evaluate_main",
                        "mpifc.cli:add_family_evaluate_arguments"),
    "bench": Command("run a benchmark from launch/bench/", "mpifc.cli:bench_main", "mpifc.cli:add_bench_arguments"),
    "experiment": Command("run a paper experiment", "mpifc.experiments.main:experiment_main",
                          "mpifc.experiments.main:add_experiment_arguments"),
}

BENCH_DIR = Path(__file__).resolve().parents[1] / "launch" / "bench"


# --model-family picks FedPC (mpifc.runtime.fc_job) or FedNGM (mpifc.ngm.cli). The switch lives
# here, at the top layer, so that the runtime never imports a model family built above it.
def add_family_train_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``mpifc train``: FedPC's, plus the FedNGM group."""
    from mpifc.ngm.cli import FAMILIES, add_ngm_train_arguments
    from mpifc.runtime import fc_job

    fc_job.add_train_arguments(p)
    p.add_argument("--model-family", default="fc", choices=FAMILIES,
                   help="fc: federated circuits (FedPC); ngm: FedNGM (flags in the FedNGM group)")
    add_ngm_train_arguments(p)


def family_train_main(args: argparse.Namespace) -> int:
    if args.model_family == "ngm":
        from mpifc.ngm.cli import train_main as ngm_train_main

        return ngm_train_main(args)
    from mpifc.runtime.fc_job import train_main as fc_train_main

    return fc_train_main(args)


def add_family_evaluate_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``mpifc evaluate``: FedPC's, plus the FedNGM group."""
    from mpifc.ngm.cli import FAMILIES, add_ngm_evaluate_arguments
    from mpifc.runtime import fc_job

    fc_job.add_evaluate_arguments(p)
    p.add_argument("--model-family", default="fc", choices=FAMILIES, help="fc: federated circuits; ngm: FedNGM")
    add_ngm_evaluate_arguments(p)


def family_evaluate_main(args: argparse.Namespace) -> int:
    if args.model_family == "ngm":
        from mpifc.ngm.cli import evaluate_main as ngm_evaluate_main

        return ngm_evaluate_main(args)
    from mpifc.runtime.fc_job import evaluate_main as fc_evaluate_main

    return fc_evaluate_main(args)


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    """Flags every MPI job has."""
    p.add_argument("--deadline", type=float, default=300.0, metavar="S",
                   help="seconds any single send or receive may wait before the job aborts (default 300)")
    p.add_argument("--device", default="auto", metavar="DEV",
                   help="auto (cuda:(local_rank %% n_gpus) if CUDA, else cpu), cpu, cuda or cuda:N")


def add_ledger_arguments(p: argparse.ArgumentParser) -> None:
    """Where rank 0 writes the communication ledger."""
    p.add_argument("--ledger-csv", metavar="FILE", help="per-message CSV (one row per message)")
    p.add_argument("--summary-csv", metavar="FILE", help="per-link / per-phase / per-kind totals CSV")


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    """Minimal job flags for a stand-in ``train`` command (tests plug handlers in with these)."""
    add_job_arguments(p)
    add_ledger_arguments(p)
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same model)")
    p.add_argument("--out", metavar="FILE", help="where to write the trained model (HDF5)")


def add_evaluate_arguments(p: argparse.ArgumentParser) -> None:
    """Minimal job flags for a stand-in ``evaluate`` command."""
    add_job_arguments(p)
    add_ledger_arguments(p)
    p.add_argument("--model", metavar="FILE", help="a trained model (HDF5)")
    p.add_argument("--seed", type=int, default=0, help="random seed")


def add_experiment_arguments(p: argparse.ArgumentParser) -> None:
    """Minimal job flags for a stand-in ``experiment`` command."""
    add_job_arguments(p)
    add_ledger_arguments(p)
    p.add_argument("--out", metavar="DIR", help="where results are written")
    p.add_argument("--seed", type=int, default=0, help="random seed")


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``mpifc bench``: a benchmark name and its own arguments."""
    p.add_argument("name", help="benchmark name: a file launch/bench/<name>.py")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="arguments for the benchmark")


def _load(ref: str) -> Callable[..., Any]:
    module, _, func = ref.partition(":")
    return getattr(importlib.import_module(module), func)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and each subcommand's parser by name."""
    parser = argparse.ArgumentParser(prog="mpifc", description="Federated probabilistic circuits on MPI.")
    parser.add_argument("--version", action="version", version=f"mpifc {mpifc.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    subs = {}
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.help, description=cmd.help)
        if name != "bench":
            p.add_argument("--config", metavar="FILE",
                           help="TOML file whose keys mirror these flags (flags on the command line win)")
        _load(cmd.arguments)(p)
        subs[name] = p
    return parser, subs


def _command_in(argv: list[str], names: dict[str, Any]) -> str | None:
    # Top-level options are only --help/--version, so the first known name is the subcommand.
    return next((a for a in argv if a in names), None)


def _config_path(argv: list[str]) -> str | None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    return known.config


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``; values from ``--config`` fill in flags not given on the command line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, subs = build_parser()
    command = _command_in(argv, subs)
    path = _config_path(argv) if command not in (None, "bench") else None
    if path:
        from mpifc.config import config_defaults

        configurable = {k: v for k, v in subs.items() if k != "bench"}
        values = config_defaults(path, configurable, command)
        subs[command].set_defaults(**values)
        for action in subs[command]._actions:
            if action.dest in values:
                action.required = False  # the file supplies it
    return parser.parse_args(argv)


def resolve_handler(command: str) -> Callable[[argparse.Namespace], int | None]:
    """Import the handler named in :data:`COMMANDS`."""
    return _load(COMMANDS[command].handler)


def not_yet_available(args: argparse.Namespace) -> int:
    """Placeholder for subcommands whose issue has not landed."""
    raise UserError(f"mpifc {args.command}: not yet available in mpifc {mpifc.__version__}")


def bench_main(args: argparse.Namespace) -> int:
    """Run ``launch/bench/<name>.py`` (from a source checkout) with the remaining arguments."""
    script = BENCH_DIR / f"{args.name}.py"
    if not script.is_file():
        have = sorted(p.stem for p in BENCH_DIR.glob("*.py")) if BENCH_DIR.is_dir() else []
        raise UserError(f"mpifc bench: no benchmark {args.name!r} in {BENCH_DIR}"
                        + (f"; available: {', '.join(have)}" if have else " (benchmarks need a source checkout)"))
    saved = sys.argv
    sys.argv = [str(script), *args.bench_args]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved
    return 0


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit code (aborts the MPI job on any rank's failure)."""
    try:
        args = parse_args(argv)
        return int(resolve_handler(args.command)(args) or 0)
    except SystemExit as e:
        # argparse's own errors and --help: every rank parsed the same argv, so all exit alike.
        if e.code in (None, 0) or not _mpi_running_multi():
            raise
        _abort(e)
    except BaseException as e:  # noqa: BLE001 - any failure must end the whole job
        _abort(e)
    return 1


def _mpi_running_multi() -> bool:
    mpi = sys.modules.get("mpi4py.MPI")
    return bool(mpi and mpi.Is_initialized() and not mpi.Is_finalized() and mpi.COMM_WORLD.Get_size() > 1)


def _abort(exc: BaseException) -> Any:
    from mpifc.runtime.failure import abort_job

    abort_job(exc)


if __name__ == "__main__":
    sys.exit(main())
