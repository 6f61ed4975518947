"""TOML config files whose keys mirror the CLI flags; flags given on the command line win.

Layout of a config file (``--config FILE``)::

    deadline = 120          # top level: applies to every subcommand that has the flag
    device = "cpu"

    [train]                 # a section per subcommand: applies to that subcommand only,
    seed = 3                # and overrides the top level
    ledger-csv = "out/ledger.csv"

Keys are flag names without the leading dashes; ``-`` and ``_`` are interchangeable. A key that
no subcommand knows, a section that is not a subcommand, or a value of the wrong type is a
:class:`~mpifc.errors.UserError` naming the file and the key. Positional arguments cannot be set
from a file.
"""
from __future__ import annotations

import argparse
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpifc.errors import UserError

# Flags that make no sense in a file.
_NOT_CONFIGURABLE = {"help", "config", "version", "command"}


@dataclass(frozen=True)
class OptionSpec:
    """What a config value for one flag must look like."""

    dest: str
    flag: str
    action: argparse.Action

    @property
    def is_switch(self) -> bool:
        return isinstance(self.action, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                                        argparse.BooleanOptionalAction))

    @property
    def is_list(self) -> bool:
        n = self.action.nargs
        return n in ("+", "*") or (isinstance(n, int) and n > 1)


def option_specs(parser: argparse.ArgumentParser) -> dict[str, OptionSpec]:
    """The configurable optional flags of ``parser``, keyed by ``dest``."""
    specs = {}
    # argparse keeps its actions in a private list; it has been stable since Python 2.7.
    for action in parser._actions:
        if not action.option_strings or action.dest in _NOT_CONFIGURABLE or action.dest == argparse.SUPPRESS:
            continue
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        long = [s for s in action.option_strings if s.startswith("--")]
        specs[action.dest] = OptionSpec(dest=action.dest, flag=(long or action.option_strings)[0], action=action)
    return specs


def load_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file; a missing or malformed file is a :class:`UserError` naming it."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise UserError(f"config file {p}: not found") from None
    except IsADirectoryError:
        raise UserError(f"config file {p}: is a directory") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"config file {p}: not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise UserError(f"config file {p}: not UTF-8 text: {e}") from None


def _type_name(t: Any) -> str:
    return getattr(t, "__name__", str(t))


def convert_value(spec: OptionSpec, value: Any, where: str) -> Any:
    """Check a TOML value against a flag's type, choices and arity; returns the value to use.

    Args:
        spec: the flag.
        value: the TOML value.
        where: ``"config file F: key K"`` for messages.
    """
    if spec.is_switch:
        if not isinstance(value, bool):
            raise UserError(f"{where}: expected true or false, got {value!r}")
        return value
    if spec.is_list:
        if not isinstance(value, list):
            raise UserError(f"{where}: expected a list, got {value!r}")
        n = spec.action.nargs
        if (n == "+" and not value) or (isinstance(n, int) and len(value) != n):
            raise UserError(f"{where}: expected {'at least 1' if n == '+' else n} values, got {len(value)}")
        return [_convert_scalar(spec, v, where) for v in value]
    return _convert_scalar(spec, value, where)


def _convert_scalar(spec: OptionSpec, value: Any, where: str) -> Any:
    t = spec.action.type
    if isinstance(value, (dict, list)):
        raise UserError(f"{where}: expected a single value, got {value!r}")
    if t is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{where}: expected an integer, got {value!r}")
        out: Any = value
    elif t is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{where}: expected a number, got {value!r}")
        out = float(value)
    elif t is None or t is str:
        if not isinstance(value, str):
            raise UserError(f"{where}: expected a string, got {value!r}")
        out = value
    else:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise UserError(f"{where}: expected a value for {_type_name(t)}, got {value!r}")
        try:
            out = t(value if isinstance(value, str) else str(value))
        except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
            raise UserError(f"{where}: bad value {value!r} ({e})") from None
    if spec.action.choices is not None and out not in spec.action.choices:
        choices = ", ".join(repr(c) for c in spec.action.choices)
        raise UserError(f"{where}: {out!r} is not one of {choices}")
    return out


def config_defaults(path: str | Path, subparsers: dict[str, argparse.ArgumentParser],
                    command: str) -> dict[str, Any]:
    """Validated values from the config file for ``command`` (use as parser defaults).

    Every key in the file is checked, including sections of other subcommands, so a typo is
    caught whatever subcommand runs.

    Args:
        path: the TOML file.
        subparsers: each subcommand's parser, by name.
        command: the subcommand being run.

    Returns:
        ``{dest: value}``: top-level keys this subcommand knows, overridden by its own section.
    """
    data = load_toml(path)
    specs = {name: option_specs(p) for name, p in subparsers.items()}
    top: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            if key not in subparsers:
                raise UserError(f"config file {path}: unknown section [{key}]; sections are "
                                f"{', '.join('[' + s + ']' for s in subparsers)}")
            sections[key] = value
        else:
            top[key] = value

    def resolve(items: dict[str, Any], cmds: list[str], label: str) -> dict[str, dict[str, Any]]:
        # -> {command: {dest: converted}} for the commands that know each key.
        out: dict[str, dict[str, Any]] = {c: {} for c in cmds}
        for key, value in items.items():
            dest = key.replace("-", "_")
            where = f"config file {path}: key {label}{key}"
            known = [c for c in cmds if dest in specs[c]]
            if not known:
                raise UserError(f"{where}: unknown key (not a flag of "
                                f"{'mpifc ' + cmds[0] if len(cmds) == 1 else 'any subcommand'})")
            for c in known:
                out[c][dest] = convert_value(specs[c][dest], value, where)
        return out

    merged = resolve(top, list(subparsers), "").get(command, {})
    for name, items in sections.items():
        vals = resolve(items, [name], f"[{name}].")[name]
        if name == command:
            merged.update(vals)
    return merged
