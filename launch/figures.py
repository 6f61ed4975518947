"""Figures quoted in Markdown, tagged with who checks them and how closely.

A measured figure in README.md (bytes, messages, times, accuracy) carries a tag right after it,
invisible once rendered::

    99 kB<!-- fig test:quickstart.train_kB ±15% --> in 18<!-- fig test:quickstart.train_messages ±0 -->

``test:KEY`` figures are checked by ``tests/test_readme.py`` on every run of the suite (bytes,
messages, rows, accuracy: deterministic for a seed); ``bench:KEY`` figures, times above all, by
``launch/bench/readme.py``, which runs the same commands on a quiet-enough machine and prints
each figure beside its measurement. The tolerance is ``±X%`` (relative to the quoted figure),
``±X`` (absolute, in its unit) or ``±0`` (exact); a figure written as a bound (``≥ 900 s``) holds
when the measurement is on its side, within the tolerance. :func:`untagged` finds a number with a unit of
measure that carries no tag, so a new figure cannot slip in unchecked.

Two markers cover whole lines instead (docs/ holds benchmark tables whose figures come from runs
on a shared machine, and rules whose numbers are settings of the code):

* ``<!-- run DATE | load L | peer P | `COMMAND` -->``: the figures were measured on ``DATE`` at
  a 1-minute load average ``L`` (a number or range; ``not recorded`` where the run did not
  say), beside the peer ``P`` measured in the same run (``none`` where the figure is absolute),
  by ``COMMAND`` (:func:`runs` checks each field);
* ``<!-- fixed -->``: the line's numbers are settings, rules or examples the text defines (a
  default, the k-rows rule's 5 rows), not measurements.

A marker at the end of a line covers that line (a table row); on a line of its own, the block
below it, up to the next blank line (a paragraph or a table).
"""

import re
from dataclasses import dataclass

TAG = re.compile(r"(?P<bound>[≥≤]\s?)?(?P<num>-?\d[\d,]*(?:\.\d+)?)(?P<unit>\s?[A-Za-zµ%]*)<!-- fig (?P<checker>test|bench):"
                 r"(?P<key>[\w.-]+) ±(?P<tol>\d+(?:\.\d+)?)(?P<rel>%?) -->")
MEASURE = re.compile(r"(?<![\w.~-])(?P<num>\d[\d,]*(?:\.\d+)?)(?P<unit>\s?(?:s|ms|min|minutes?|kB|MB|GB|B|%|"
                     r"messages|rows))(?![\w])(?!\x00)|(?<![\w.])(?P<frac>0\.\d+)(?![\d])(?!\s?[A-Za-zµ%]*\x00)")
"""A number with a unit of measure (or a fraction such as an accuracy) in prose."""


@dataclass(frozen=True)
class Figure:
    """One tagged figure: its value as written, who checks it, its key and tolerance."""

    value: float
    unit: str
    checker: str
    key: str
    tol: float
    relative: bool
    line: int
    bound: str = ""

    def allows(self, measured: float) -> bool:
        """Whether ``measured`` is within the tolerance of the quoted value (or of its bound)."""
        slack = self.tol / 100.0 * abs(self.value) if self.relative else self.tol
        if self.bound == "≥":
            return measured >= self.value - slack - 1e-12
        if self.bound == "≤":
            return measured <= self.value + slack + 1e-12
        return abs(measured - self.value) <= slack + 1e-12

    def describe(self, measured: float | None) -> str:
        tol = f"±{self.tol:g}{'%' if self.relative else ''}"
        got = "not measured" if measured is None else f"measured {measured:.6g}"
        verdict = "" if measured is None else (" ok" if self.allows(measured) else " OUT OF TOLERANCE")
        return f"line {self.line}: {self.checker}:{self.key} = {self.value:g}{self.unit} {tol}, {got}{verdict}"


def figures(text: str) -> list[Figure]:
    """Every tagged figure of a Markdown text, in order."""
    out = []
    for m in TAG.finditer(text):
        out.append(Figure(value=float(m["num"].replace(",", "")), unit=m["unit"], checker=m["checker"],
                          key=m["key"], tol=float(m["tol"]), relative=bool(m["rel"]),
                          line=text.count("\n", 0, m.start()) + 1, bound=(m["bound"] or "").strip()))
    return out


MARKER = re.compile(r"<!-- (run [^>]*|fixed) -->")
RUN = re.compile(r"<!-- run (?P<date>\S+) \| load (?P<load>[^|]+?) \| peer (?P<peer>[^|]+?) \| `(?P<cmd>[^`]+)` -->")
COMMAND = re.compile(r"^(?:[A-Z_]+=\S+ )*(?:python|mpifc|mpiexec)\b")


@dataclass(frozen=True)
class Run:
    """One ``<!-- run ... -->`` marker: the date, load, peer and command it states."""

    date: str
    load: str
    peer: str
    command: str
    line: int

    def problems(self) -> list[str]:
        """What the marker lacks, as ``"line N: ..."`` (empty when it states all four)."""
        out = []
        if not re.fullmatch(r"20\d\d-\d\d-\d\d", self.date):
            out.append(f"date {self.date!r} is not YYYY-MM-DD")
        if not (re.search(r"\d", self.load) or self.load == "not recorded"):
            out.append(f"load {self.load!r} is neither a number nor 'not recorded'")
        if not self.peer.strip():
            out.append("no peer")
        if not COMMAND.match(self.command):
            out.append(f"command {self.command!r} does not run python, mpifc or mpiexec")
        return [f"line {self.line}: {p}" for p in out]


def runs(text: str) -> list[Run | str]:
    """Every ``<!-- run ... -->`` marker of ``text``; a malformed one as ``"line N: ..."``."""
    out: list[Run | str] = []
    for m in re.finditer(r"<!-- run [^>]*-->", text):
        line = text.count("\n", 0, m.start()) + 1
        r = RUN.fullmatch(m[0])
        out.append(Run(r["date"], r["load"].strip(), r["peer"].strip(), r["cmd"], line) if r
                   else f"line {line}: malformed marker {m[0]!r} (want <!-- run DATE | load L | peer P | `COMMAND` -->)")
    return out


def _covered(text: str) -> str:
    """``text`` with every line a marker covers blanked (lines kept)."""
    lines = text.split("\n")
    blank = set()
    for i, line in enumerate(lines):
        if not MARKER.search(line):
            continue
        blank.add(i)
        if MARKER.sub("", line).strip():
            continue
        j = i + 1
        while j < len(lines) and lines[j].strip():
            blank.add(j)
            j += 1
    return "\n".join("" if i in blank else line for i, line in enumerate(lines))


def _prose(text: str) -> str:
    """``text`` with fenced blocks, inline code, link targets and the lines a marker covers
    blanked, and each tag a NUL (lines kept)."""
    text = _covered(text)
    text = re.sub(r"<!-- fig [^>]*-->", "\x00", text)
    text = re.sub(r"```.*?```", lambda m: "\n" * m[0].count("\n"), text, flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "``", text)
    text = re.sub(r"\]\([^)]*\)", "]()", text)
    return text


def untagged(text: str) -> list[str]:
    """Numbers with a unit of measure in the prose of ``text`` that carry no tag, as
    ``"line N: ..."``; defaults (``default 300``) and tagged figures are not counted."""
    prose = _prose(text)
    out = []
    for m in MEASURE.finditer(prose):
        before = prose[max(0, m.start() - 9):m.start()]
        if "default" in before:
            continue
        line = prose.count("\n", 0, m.start()) + 1
        out.append(f"line {line}: {m[0].strip()!r} in {prose.splitlines()[line - 1].strip()[:100]!r}")
    return out
