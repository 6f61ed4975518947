"""The ``mpifc`` command line: ``info``, ``train``, ``evaluate``, ``query``, ``baseline``, ``bench``, ``experiment``.

Every argparse parser a user reaches lives in this package, one module per subcommand
(``python -m data_prep`` included: :mod:`mpifc.cli.prep`). The handlers turn flags into plain
settings and call the library, which never sees an ``argparse.Namespace``.

Run it under ``mpiexec`` for multi-rank jobs (``mpiexec -n 4 mpifc train ...``). Like
``python -m mpi4py``, an uncaught exception on any rank aborts the whole job, printing the rank
and the error; bad input is one line on stderr and exit code 2.

Plugging in a subcommand: point its entry in :data:`COMMANDS` at the handler and at the function
that adds its flags (see :class:`Command`).
"""
from __future__ import annotations

import sys

from mpifc.runtime import early as _early

# Under a launcher, first of all: the node sentinel watches this rank from here on, and a Ctrl-C
# or SIGTERM waits for the signal thread instead of ending an import (mpifc.runtime.early).
_early.take(sys.argv[1:], _early.DEFAULT_LIMIT_S)

from mpifc.runtime import signals as _signals  # noqa: E402

# Under a launcher, a Ctrl-C or SIGTERM ends the job with one line from here on, even while the
# rest of the command is still being imported (mpifc.runtime.signals).
_signals.install(_signals.env_rank())

import argparse  # noqa: E402
import importlib  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any, Callable, Iterator  # noqa: E402

import mpifc  # noqa: E402
from mpifc.errors import UserError  # noqa: E402


@dataclass(frozen=True)
class Command:
    """A subcommand: its handler and the function that adds its flags, as ``"module:function"``.

    Both are imported only when the CLI is built or run, so heavy modules load on demand. The
    handler takes the parsed ``argparse.Namespace`` and returns an exit code. The CLI itself adds
    ``--config`` to every subcommand but those in :data:`NOT_CONFIGURABLE`; flags added by
    ``arguments`` then work in config files too (``required=True`` flags may come from the file).
    """

    help: str
    handler: str
    arguments: str


COMMANDS: dict[str, Command] = {
    "info": Command("MPI library, ranks, devices and package versions", "mpifc.cli.info:info_main",
                    "mpifc.cli.info:add_info_arguments"),
    "train": Command("train a federated circuit (or FedNGM)", "mpifc.cli.train:train_main",
                     "mpifc.cli.train:add_train_arguments"),
    "evaluate": Command("evaluate a trained federated circuit (or FedNGM)", "mpifc.cli.evaluate:evaluate_main",
                        "mpifc.cli.evaluate:add_evaluate_arguments"),
    "query": Command("answer questions about new rows: ll, predict, mpe, sample, marginal", "mpifc.cli.query:query_main",
                     "mpifc.cli.query:add_query_arguments"),
    "baseline": Command("run a baseline: fedavg, splitnn, central, decentralized", "mpifc.cli.baseline:baseline_main",
                        "mpifc.cli.baseline:add_baseline_arguments"),
    "bench": Command("run a benchmark from launch/bench/", "mpifc.cli.bench:bench_main",
                     "mpifc.cli.bench:add_bench_arguments"),
    "experiment": Command("run a paper experiment", "mpifc.cli.experiment:experiment_main",
                          "mpifc.cli.experiment:add_experiment_arguments"),
}

NOT_CONFIGURABLE = ("bench", "baseline")
"""Subcommands without ``--config``: their flags belong to a script or a nested sub-command."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every flag's help ends with its default (``--help`` shows them all)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        if action.default is None or action.default is False or action.default == []:
            return text  # nothing set unless given: the help says what happens then
        return f"{text} (default: %(default)s)"


def _load(ref: str) -> Callable[..., Any]:
    module, _, func = ref.partition(":")
    return getattr(importlib.import_module(module), func)


def build_parser(only: str | None = None) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and each subcommand's parser by name.

    ``only``: the subcommand being run; the others are listed with their help line but get no
    flags, so their modules are not imported (every rank of a job parses its command line)."""
    parser = argparse.ArgumentParser(
        prog="mpifc", formatter_class=HelpFormatter,
        description="Federated probabilistic circuits on MPI. Prepare shards with `python -m data_prep`, "
                    "then `mpiexec -n R mpifc train DIR --model fc.h5` (rank 0 is the server, one rank per client). "
                    "`mpifc COMMAND --help` lists a command's flags.")
    parser.add_argument("--version", action="version", version=f"mpifc {mpifc.__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                help="what to run (each takes --help)")
    subs = {}
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.help, description=cmd.help, formatter_class=HelpFormatter)
        if only is not None and name != only:
            continue
        if name not in NOT_CONFIGURABLE:
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
    command = _command_in(argv, COMMANDS)
    path = _config_path(argv) if command is not None and command not in NOT_CONFIGURABLE else None
    # A config file is checked against every subcommand's flags, so it needs them all.
    parser, subs = build_parser(None if path or command is None else command)
    if path:
        from mpifc.cli.config import config_defaults

        configurable = {k: v for k, v in subs.items() if k not in NOT_CONFIGURABLE}
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
    """Placeholder handler for a subcommand that is declared but not built yet."""
    raise UserError(f"mpifc {args.command}: not yet available in mpifc {mpifc.__version__}")


PROGRESS_COMMANDS = ("train", "evaluate", "query")
"""Commands that print progress lines (:mod:`mpifc.progress`) for human output, from start-up on."""


def _start_ticker(argv: list[str]) -> Any:
    """The progress ticker of a train/evaluate/query command with human output, started before
    its heavy imports, on the process a person reads (rank 0, or the only process); else None."""
    import mpifc.progress as progress
    from mpifc.runtime.failure import env_rank

    command = next((a for a in argv if a in COMMANDS), None)
    if command not in PROGRESS_COMMANDS or {"--json", "--quiet", "-h", "--help"} & set(argv) or env_rank() not in (None, 0):
        return None
    tick = progress.Ticker(f"mpifc {command}")
    tick.__enter__()
    tick.phase("starting (loading modules)")
    return tick


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit code (aborts the MPI job on any rank's failure)."""
    _take_signals()
    tick = _start_ticker(list(sys.argv[1:] if argv is None else argv))
    try:
        with _no_collection_while_loading():
            args = parse_args(argv)
            handler = resolve_handler(args.command)
        if tick is not None and (getattr(args, "json", False) or getattr(args, "quiet", False)):
            tick.stop()  # a config file asked for it
        code = int(handler(args) or 0)
    except SystemExit as e:
        # argparse's own errors and --help: every rank parsed the same argv, so all exit alike.
        if e.code in (None, 0) or not _mpi_running_multi():
            raise
        _abort(e)
        return 1
    except BaseException as e:  # noqa: BLE001 - any failure must end the whole job
        _abort(e)
        return 1
    finally:
        if tick is not None:
            tick.stop()
    _signals.leave(code)  # under a launcher: MPI_Finalize, the end mark, and the exit at once
    return code


@contextmanager
def _no_collection_while_loading() -> Iterator[None]:
    """No garbage collection while the command's modules load: they are long-lived objects
    (modules, classes, functions), and a collection pass over them frees nothing (measured:
    a collection-free start of a training rank saves about 0.03 CPU-s, which on a node of many
    ranks sharing few cores adds up). In a rank of a job, a fresh process, what has loaded is
    then frozen (:func:`gc.freeze`), so the job's collections no longer walk it."""
    import gc

    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            if _signals.env_rank() is not None:
                gc.freeze()
            gc.enable()


def _take_signals() -> None:
    """Under a launcher, from the command's start: the rank meets its node, whose sentinel then
    watches it and the launcher (:mod:`mpifc.runtime.node`); SIGINT and SIGTERM end the job with
    one line (:mod:`mpifc.runtime.signals`, taken as this module is imported)."""
    if _signals.env_rank() is not None:
        from mpifc.runtime import node
        from mpifc.runtime.liveness import DEFAULT_LIMIT_S

        node.join_early(sys.argv[1:], DEFAULT_LIMIT_S)


def _mpi_running_multi() -> bool:
    mpi = sys.modules.get("mpi4py.MPI")
    return bool(mpi and mpi.Is_initialized() and not mpi.Is_finalized() and mpi.COMM_WORLD.Get_size() > 1)


def _abort(exc: BaseException) -> Any:
    from mpifc.runtime.failure import abort_job

    abort_job(exc)
