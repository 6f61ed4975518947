"""Every ``--help`` explains every flag and shows its default.

Walks :func:`mpifc.cli.build_parser` with every sub- and sub-subparser (``mpifc baseline fedavg``)
and ``python -m data_prep``'s parser.
"""
from __future__ import annotations

import argparse
import re

import pytest

import mpifc.cli
from mpifc.cli import build_parser
from mpifc.cli.prep import build_parser as prep_parser


def _walk(parser: argparse.ArgumentParser, prog: str):
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, f"{prog} {name}")


def all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    parser, _ = build_parser()
    return [*_walk(parser, "mpifc"), ("python -m data_prep", prep_parser())]


def test_every_command_is_walked():
    progs = {prog for prog, _ in all_parsers()}
    assert {f"mpifc {c}" for c in mpifc.cli.COMMANDS} <= progs
    assert {"mpifc baseline fedavg", "mpifc baseline splitnn", "mpifc baseline central"} <= progs


@pytest.mark.parametrize("prog, parser", all_parsers(), ids=[p for p, _ in all_parsers()])
def test_every_flag_has_help_and_defaults_show(prog: str, parser: argparse.ArgumentParser) -> None:
    assert parser.formatter_class is mpifc.cli.HelpFormatter, f"{prog}: help does not show defaults"
    missing = [a.option_strings or [a.dest] for a in parser._actions
               if not isinstance(a, argparse._HelpAction)
               and (a.help is None or a.help == argparse.SUPPRESS or not a.help.strip())]
    assert not missing, f"{prog}: no help for {missing}"
    text = parser.format_help()
    for a in parser._actions:
        shown = a.default not in (None, False, [], argparse.SUPPRESS) and a.option_strings
        if shown and "%(default)" not in (a.help or ""):
            assert f"(default: {a.default})" in " ".join(text.split()), f"{prog} {a.option_strings}: default not shown"


def test_experiment_help_lists_every_experiment():
    from mpifc.experiments import registry

    _, subs = build_parser()
    text = " ".join(subs["experiment"].format_help().split())
    missing = [n for n in registry.names() if n not in text]
    assert not missing, f"mpifc experiment --help does not name {missing}"


def test_data_prep_help_shows_out_as_required():
    text = prep_parser().format_help()
    usage = text.split("\n\n")[0]
    assert "--out DIR" in usage and "[--out" not in usage
    options = " ".join(text.split("\n\n", 1)[1].split())
    assert "--out DIR required" in options


@pytest.mark.parametrize("prog, parser", all_parsers(), ids=[p for p, _ in all_parsers()])
def test_every_default_is_shown_once_and_reads_right(prog: str, parser: argparse.ArgumentParser) -> None:
    """A flag whose default the formatter appends says no default of its own (else ``--clients``
    reads "(default 2) (default: 2)"), and no flag is a bare ``--no-X`` whose default (True) would
    read as the opposite of what it does."""
    for a in parser._actions:
        if not a.option_strings or isinstance(a, argparse._HelpAction):
            continue
        assert not isinstance(a, argparse._StoreFalseAction), \
            f"{prog} {a.option_strings}: a bare --no-X flag shows (default: True); use BooleanOptionalAction"
        shown = a.default not in (None, False, [], argparse.SUPPRESS)
        text = (a.help or "").replace("%(default)s", "")
        if shown and isinstance(a, argparse.BooleanOptionalAction):
            text = text.replace("(default: )", "")
        if shown:
            said = re.search(r"\(default\)|\bdefault:?\s+" + re.escape(str(a.default)) + r"\b", text)
            assert not said, f"{prog} {a.option_strings}: the default is shown twice: {a.help!r}"
