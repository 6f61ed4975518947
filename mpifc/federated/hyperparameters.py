"""The hyperparameters each client learner knows, their types and ranges: what ``--hp`` checks.

``mpifc train --hp KEY=VALUE`` reaches the client learners through the plan. Every key is
checked here, on every rank, before any rank starts work: an unknown key gets a did-you-mean,
a value of the wrong type or out of range one line naming the key (exit code 2). The table is
explicit (checking it needs no learner module, so no torch); a test holds it equal to the
learners' own signatures.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

from mpifc.circuit.privacy import MIN_LEAF_ROWS
from mpifc.errors import UserError


@dataclass(frozen=True)
class Param:
    """One hyperparameter: its type (``"int"``, ``"float"``, ``"bool"``, ``"str"`` or ``"shape"``:
    positive integers written ``28x28`` or ``32x32x3``), the
    closed/open range a number must lie in, the choices of a string, and whether ``none`` is
    allowed (the learner then picks)."""

    kind: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()
    nullable: bool = False
    help: str = ""

    def describe(self) -> str:
        if self.kind == "str":
            return "one of " + ", ".join(self.choices)
        if self.kind == "bool":
            return "true or false"
        if self.kind == "shape":
            return "a shape such as 28x28 or 32x32x3" + (" or none" if self.nullable else "")
        rng = ""
        if self.low is not None and self.high is not None:
            rng = f" in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        elif self.low is not None:
            rng = f" {'>' if self.low_open else '>='} {self.low:g}"
        kind = "an integer" if self.kind == "int" else "a number"
        return kind + rng + (" or none" if self.nullable else "")


def _int(low: float | None = None, **kw: Any) -> Param:
    return Param("int", low=low, **kw)


def _float(low: float | None = None, high: float | None = None, **kw: Any) -> Param:
    return Param("float", low=low, high=high, **kw)


def _str(*choices: str, **kw: Any) -> Param:
    return Param("str", choices=tuple(choices), **kw)


_BOOL = Param("bool")

LEARNSPN: dict[str, Param] = {
    "threshold": _float(0.0, 1.0, help="RDC above which two columns count as dependent"),
    "min_instances_slice": _int(1, help="slices with fewer rows are fully factorised"),
    "col_split": _str("rdc", "gtest", help="column split: RDC (any columns) or G-test (discrete only)"),
    "row_split": _str("kmeans", "gmm"),
    "n_clusters": _int(2, help="clusters per row split"),
    "leaf": _str("auto", "gaussian", "histogram", "piecewise", "mixed",
                 help="mixed: histograms for real columns with a point mass, Gaussians otherwise"),
    "class_column": _int(0, nullable=True, help="split the rows by this discrete column's value first"),
    "gtest_pvalue": _float(0.0, 1.0, low_open=True, high_open=True),
    "alpha": _float(0.0, low_open=True, help="Laplace smoothing of discrete leaves"),
    "min_var": _float(0.0, low_open=True, help="variance floor of Gaussian leaves"),
    "rdc_k": _int(1),
    "rdc_ties": _str("max", "ordinal"),
    "rdc_widths": _str("shared", "own", help="RDC features per column: as wide as the widest categorical column "
                                            "(shared) or each column its own (own: set for a target of 16+ classes)"),
    "n_init": _int(1),
    "cluster_first": _BOOL,
}
RATSPN: dict[str, Param] = {
    "depth": _int(1), "repetitions": _int(1), "num_sums": _int(1), "num_leaves": _int(1),
    "em_iters": _int(0), "min_var": _float(0.0, low_open=True, nullable=True),
}
EINET: dict[str, Param] = {
    "num_sums": _int(1), "depth": _int(1), "repetitions": _int(1),
    "leaf": _str("gaussian", "discretized_gaussian", "categorical", "bernoulli", "mixed", nullable=True),
    "num_levels": _int(2), "epochs": _int(0), "batch_size": _int(0, nullable=True),
    "online_em_frequency": _int(1), "online_em_stepsize": _float(0.0, 1.0, low_open=True),
    "dtype": _str("float32", "float64"), "max_params": _int(1, nullable=True),
    "leaf_region_vars": _int(1, nullable=True), "min_var": _float(0.0, low_open=True),
    "max_var": _float(0.0, low_open=True, nullable=True),
    "image_shape": Param("shape", nullable=True,
                         help="HxW or HxWxC: a Poon-Domingos region graph over the first H*W*C columns "
                              "(pixels, row-major, channels last); later columns (a label) join at the root"),
    "pd_num_pieces": _int(1, help="Poon-Domingos: equal pieces per image axis (Table 5 of the FC paper: 8)"),
}
FACTORIZED: dict[str, Param] = {"alpha": _float(0.0, low_open=True)}
DT: dict[str, Param] = {"max_depth": _int(1, nullable=True),
                        "min_samples_leaf": _int(MIN_LEAF_ROWS, help="no tree leaf of fewer rows (the k-rows rule)")}

LEARNER_PARAMS: dict[str, dict[str, Param]] = {
    "learnspn": LEARNSPN, "ratspn": RATSPN, "einet": EINET, "factorized": FACTORIZED, "dt": DT,
}
"""Learner name -> the hyperparameters its fit function takes."""

PLAN_PARAMS: dict[str, Param] = {
    "cluster_without_target": Param("bool", help="the label owner clusters its rows without the target"),
    "target_first": Param("bool", help="a LearnSPN PC holding the target splits its rows by it first "
                                       "(default: chosen on held-out rows)"),
    "dp_epsilon": _float(0.0, low_open=True, help="epsilon-DP statistics of every client (--dp-epsilon)"),
    "dp_clip": _float(0.0, low_open=True, help="real values clipped to [-B, B] under --dp-epsilon"),
    "dp_seed": _int(0, help="seed of the DP noise (reproducible, not private against whoever knows it)"),
}
"""Hyperparameters of the plan itself (Algorithm 1), not of a learner."""


def _coerce(key: str, value: Any, p: Param, flag: str) -> Any:
    def bad(why: str) -> UserError:
        return UserError(f"{flag} {key}={value}: {why}; expected {p.describe()}")

    if p.nullable and (value is None or (isinstance(value, str) and value.lower() in ("none", "null"))):
        return None
    if p.kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise bad("not a boolean")
    if p.kind == "str":
        if not isinstance(value, str) or value not in p.choices:
            raise bad("unknown value")
        return value
    if p.kind == "shape":
        parts = value if isinstance(value, (list, tuple)) else str(value).lower().replace(",", "x").split("x")
        try:
            shape = tuple(int(str(v).strip()) for v in parts)
        except ValueError:
            raise bad("not a shape") from None
        if len(shape) not in (2, 3) or min(shape) < 1:
            raise bad("not a shape")
        return shape
    if isinstance(value, bool):
        raise bad("not a number")
    try:
        num = float(value)
    except (TypeError, ValueError):
        raise bad("not a number") from None
    if not math.isfinite(num):
        raise bad("not a finite number")
    if p.kind == "int":
        if num != int(num):
            raise bad("not an integer")
        num = int(num)
    if p.low is not None and (num < p.low or (p.low_open and num == p.low)):
        raise bad("out of range")
    if p.high is not None and (num > p.high or (p.high_open and num == p.high)):
        raise bad("out of range")
    return num


def known_params(learners: Iterable[str]) -> dict[str, Param]:
    """The hyperparameters any of ``learners`` takes, plus the plan's (a key two learners share
    is checked against the first learner that has it)."""
    out: dict[str, Param] = dict(PLAN_PARAMS)
    for name in learners:
        for k, p in LEARNER_PARAMS.get(name, {}).items():
            out.setdefault(k, p)
    return out


def check_hyperparameters(hp: dict[str, Any], learners: Iterable[str], flag: str = "--hp") -> dict[str, Any]:
    """``hp`` checked against what ``learners`` (the global learner and every per-client one)
    take; values coerced to their types.

    Raises:
        UserError: an unknown key (with the closest known keys) or a bad value, naming the key.
    """
    learners = list(dict.fromkeys(learners))
    known = known_params(learners)
    out: dict[str, Any] = {}
    for key, value in hp.items():
        p = known.get(key)
        if p is None:
            import difflib  # the error path only: every rank of every job imports this module

            close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            raise UserError(f"{flag} {key}: unknown hyperparameter of learner {'/'.join(learners)}{hint} "
                            f"(known: {', '.join(sorted(known))})")
        out[key] = _coerce(key, value, p, flag)
    return out
