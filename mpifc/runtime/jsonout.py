"""JSON for machines: always valid JSON, so non-finite numbers become ``null`` with a reason.

``json.dumps`` writes ``NaN`` and ``Infinity``, which are not JSON: a strict parser (``jq``,
JavaScript, most languages' standard libraries) rejects the whole line. :func:`finite_json`
writes ``null`` in their place, and beside the key a ``"<key>_null_reason"`` string saying what
the number was and what that usually means, e.g.::

    {"test_ll": null, "test_ll_null_reason": "-inf: at least one test row has probability 0 under the model"}

A list with non-finite entries gets ``null`` entries and one reason for the list.
"""
from __future__ import annotations

import json
import math
from typing import Any

REASONS = {
    "nan": "NaN: the model gave no number (e.g. a parameter is NaN)",
    "-inf": "-inf: at least one test row has probability 0 under the model",
    "inf": "+inf: the value overflowed",
}


def _kind(x: float) -> str:
    return "nan" if math.isnan(x) else ("-inf" if x < 0 else "inf")


def _clean(value: Any) -> tuple[Any, str | None]:
    """``(value with non-finite floats as None, reason or None)``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None, REASONS[_kind(value)]
    if isinstance(value, dict):
        return finite(value), None
    if isinstance(value, (list, tuple)):
        out, reasons = [], []
        for v in value:
            c, r = _clean(v)
            out.append(c)
            if r is not None:
                reasons.append(r)
        if reasons:
            return out, f"{len(reasons)} entr{'y is' if len(reasons) == 1 else 'ies are'} null: {reasons[0]}"
        return out, None
    if hasattr(value, "item") and hasattr(value, "dtype"):  # a NumPy scalar
        return _clean(value.item())
    return value, None


def finite(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` with non-finite floats as None and ``<key>_null_reason`` keys added."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        clean, reason = _clean(value)
        out[key] = clean
        if reason is not None:
            out[f"{key}_null_reason"] = reason
    return out


def finite_json(obj: dict[str, Any]) -> str:
    """``obj`` as one line of strict JSON (see the module docstring)."""
    return json.dumps(finite(obj), allow_nan=False)
