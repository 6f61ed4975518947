"""The option values experiments share: known names and the parsing of seed and name lists."""
from __future__ import annotations

from typing import Sequence

from mpifc.errors import UserError

KNOWN_DATASETS = ("breast-cancer", "adult", "credit", "mnist", "imagenet32")
"""``--datasets`` names. ``imagenet32:K`` (the first K training batches, see
:mod:`data_prep.image_sets`) is accepted as well; table2 runs image sets, the tables of tabular
sets skip them. ``image-folder`` needs a folder (``--path``), which experiments do not take."""
# Datasets that take a ``:SUFFIX`` (data_prep reads part of them).
SUFFIXED_DATASETS = ("imagenet32",)
KNOWN_METHODS = ("fc-pc", "fc-dt", "fedavg", "splitnn", "hgb")
KNOWN_SETTINGS = ("horizontal", "vertical", "hybrid")


def parse_int_list(spec: str, what: str) -> list[int]:
    """``"0-4"``, ``"0,2,5"`` or ``"0-2,7"`` -> sorted distinct ints >= 0.

    Raises:
        UserError: naming ``what`` and the bad part.
    """
    out: set[int] = set()
    text = str(spec).strip()
    if not text:
        raise UserError(f"{what}: empty list")
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise UserError(f"{what} {spec!r}: {part!r} is not N or N-M") from None
        if a < 0 or b < a:
            raise UserError(f"{what} {spec!r}: {part!r} is not a range of non-negative integers (N-M, N <= M)")
        out.update(range(a, b + 1))
    return sorted(out)


def parse_names(spec: str | None, known: Sequence[str], what: str,
                suffixed: Sequence[str] = ()) -> list[str] | None:
    """Comma-separated names, each one of ``known`` or ``NAME:SUFFIX`` for a NAME in ``suffixed``
    (``None`` when not given)."""
    if spec is None:
        return None
    items = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [s for s in items if s not in known and not (s.partition(":")[0] in suffixed and s.partition(":")[2])]
    if bad or not items:
        raise UserError(f"{what}: unknown {', '.join(map(repr, bad)) or 'empty list'}; known: {', '.join(known)}")
    return items
