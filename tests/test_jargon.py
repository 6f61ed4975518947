"""Words that belong to how the project was made, not to what it does, stay out of it.

Scans every tracked text file and every ``--help`` text a user can print (``mpifc --help``, each
subcommand's and sub-subcommand's, ``python -m data_prep --help``, ``mpifc experiment --list``)
for: the word for a work period, issue numbers, review notes, the paper's questions by number
(name the question instead), first-person prose and absolute paths of a machine. A failure names
``file:line`` and the words found.

The patterns are built from pieces, so this file does not match itself. In Python files the
first-person pattern reads only comments and strings: a variable named after the possessive is code.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

_S = "sess" + "ion"
PATTERNS: dict[str, re.Pattern[str]] = {
    "work period": re.compile(r"\b" + _S + r"s?\b", re.IGNORECASE),
    "issue number": re.compile(r"\b" + "iss" + r"ues?\s*#?\d+", re.IGNORECASE),
    "review note": re.compile(r"\b" + "rev" + r"iew\s+mend", re.IGNORECASE),
    "question number": re.compile(r"\b" + "Q" + r"[0-9]+\b"),
    "absolute path": re.compile(r"(?<![\w.~-])/(?:" + "wo" + "rk|ro" + "ot|ho" + r"me)/"),
}
FIRST_PERSON = re.compile(
    r"(?<![Tt]able )(?<![`'\"(\[-])\b" + "I" + r"(?=\s+[a-z])"        # "I measured", not "Table I costs"
    r"|\b" + "I" + r"'(?:m|ve|d|ll)\b"
    r"|\b[Mm]" + r"y\b"
    r"|\b[Mm]" + r"ine\b")

# Code that must spell the word: the subprocess keyword and pytest's fixture scope.
ALLOWED = [re.compile(r"start_new_" + _S), re.compile(r"scope=[\"']" + _S + r"[\"']")]

TEXT_SUFFIXES = {".py", ".md", ".txt", ".toml", ".cfg", ".ini", ".sh", ".sbatch", ".json", ".yaml", ".yml",
                 ".csv", ".rst", ""}


def _strip_allowed(line: str) -> str:
    for a in ALLOWED:
        line = a.sub(" ", line)
    return line


def line_hits(line: str, first_person: bool = True) -> list[str]:
    """The names of the patterns ``line`` matches, with the words."""
    line = _strip_allowed(line)
    found = [f"{name} {m.group(0)!r}" for name, pat in PATTERNS.items() for m in pat.finditer(line)]
    if first_person:
        found += [f"first person {m.group(0)!r}" for m in FIRST_PERSON.finditer(line)]
    return found


def _prose_lines(text: str) -> dict[int, str]:
    """Line number -> the comment and string text on that line of a Python source."""
    out: dict[int, list[str]] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.COMMENT, tokenize.STRING) or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
                for k, part in enumerate(tok.string.splitlines() or [""]):
                    out.setdefault(tok.start[0] + k, []).append(part)
    except (tokenize.TokenError, SyntaxError):
        return dict(enumerate(text.splitlines(), 1))
    return {n: " ".join(parts) for n, parts in out.items()}


def scan_text(name: str, text: str, python: bool = False) -> list[str]:
    """``name:line: hits`` for every line of ``text`` that matches."""
    problems = []
    prose = _prose_lines(text) if python else {}
    for n, line in enumerate(text.splitlines(), 1):
        hits = line_hits(line, first_person=not python)
        if python and n in prose:
            hits += [h for h in line_hits(prose[n]) if h.startswith("first person")]
        if hits:
            problems.append(f"{name}:{n}: {', '.join(hits)}")
    return problems


def tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = []
    for rel in out.decode().split("\0"):
        p = REPO / rel
        if rel and p.is_file() and (p.suffix in TEXT_SUFFIXES or p.name.endswith(".sbatch")):
            files.append(p)
    return files


def test_tracked_files_speak_of_the_project_alone():
    problems = []
    for p in tracked_text_files():
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        problems += scan_text(str(p.relative_to(REPO)), text, python=p.suffix == ".py")
    assert not problems, "\n".join(problems)


def _walk(parser: argparse.ArgumentParser, prog: str):
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, f"{prog} {name}")


def help_texts() -> dict[str, str]:
    """``{command line: its output}`` for every ``--help`` and ``mpifc experiment --list``."""
    from mpifc.cli import build_parser
    from mpifc.cli.experiment import experiment_main
    from mpifc.cli.prep import build_parser as prep_parser

    parser, _ = build_parser()
    texts = {f"{prog} --help": p.format_help() for prog, p in _walk(parser, "mpifc")}
    texts["python -m data_prep --help"] = prep_parser().format_help()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        experiment_main(argparse.Namespace(list=True, name=None))
    texts["mpifc experiment --list"] = buf.getvalue()
    return texts


def test_help_texts_speak_of_the_project_alone():
    texts = help_texts()
    assert "mpifc baseline fedavg --help" in texts and "mpifc experiment --help" in texts
    problems = []
    for cmd, text in texts.items():
        problems += scan_text(f"`{cmd}`", text)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("line, bad", [
    ("measured in " + _S + " 9", True), ("see " + "iss" + "ue 8, part 2", True),
    ("(" + "iss" + "ue 8)", True), ("rev" + "iew mend", True), ("as " + "Q" + "1's text says", True),
    ("I" + " measured it", True), ("a profile of " + "mi" + "ne", True), ("data in /" + "wo" + "rk/shared", True),
    ("Table I costs", False), ("``I(X1; X2)``", False), ("python -I -S sentinel.py", False),
    ("start_new_" + _S + "=True", False), ("https://example.org/" + "ho" + "me/x", False),
])
def test_patterns(line, bad):
    assert bool(line_hits(line)) is bad


def main() -> None:  # pragma: no cover - a listing for people fixing hits
    problems = []
    for p in tracked_text_files():
        try:
            problems += scan_text(str(p.relative_to(REPO)), p.read_text(encoding="utf-8"), python=p.suffix == ".py")
        except UnicodeDecodeError:
            pass
    for cmd, text in help_texts().items():
        problems += scan_text(f"`{cmd}`", text)
    print("\n".join(problems))


if __name__ == "__main__":  # pragma: no cover
    main()
