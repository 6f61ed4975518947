"""What a test log-likelihood measures (:func:`ll_measure`), and bits per dimension of image test
sets (:func:`image_bpd`), from the class log-joints of one upward pass.

A circuit's leaves give a probability *mass* on discrete columns (levels, codes, the label) and
a *density* on real ones, so ``log p(row)`` is the log mass of the discrete columns plus the log
density of the real columns, in the units the real columns were modelled in (standardised, or
normal scores: data_prep's ``preprocessing.columns[name].transform``). A density changes with
the units; a mass does not. :func:`ll_measure` says which it is, so that a density over
discrete-valued columns is never reported as if it were a mass (or the other way round).

Bits per dimension are reported only where every pixel is modelled as a level (a mass): data_prep
keeps image pixels as integer levels ``0..L-1`` (MNIST: 0..255; the source's ``k/256`` floats are
mapped back to ``k``, recorded as ``image.file_scale``), so a circuit over the pixel columns gives
``log p(pixels)`` of the discrete levels directly and

    bpd = -mean_n log p(pixels_n) / (D · ln 2),     D = number of pixel columns,

with no dequantisation offset. The label, if any, is not a dimension: ``log p(pixels)`` is the
log-sum-exp of the class log-joints. Standardised pixels are modelled by densities over reals
(``meta_type`` real): their log-likelihood is a density, and no bpd is reported for them.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

DISCRETE = ("discrete", "categorical")


def _real_units(manifest: dict[str, Any], name: str) -> str:
    col = ((manifest.get("preprocessing") or {}).get("columns") or {}).get(name) or {}
    kind = col.get("transform")
    if kind is None:  # manifests written before the transform was recorded
        kind = "standardize" if col.get("std") is not None else "none"
    return {"normal-score": "normal-score", "standardize": "standardised", "target-encoding": "standardised"}.get(
        kind, "raw")


def ll_measure(manifest: dict[str, Any]) -> dict[str, Any]:
    """What ``log p(row)`` over a shard set's columns measures.

    Args:
        manifest: the shard manifest as a dict (``Manifest.raw``).

    Returns:
        ``{"measure": "mass" | "density" | "density x mass", "mass_columns": n, "density_columns":
        n, "density_units": {units: n}, "text": one line}``; units are ``standardised``,
        ``normal-score`` or ``raw``.
    """
    feats = manifest.get("features") or {}
    order = manifest.get("feature_order") or list(feats)
    mass = [f for f in order if (feats.get(f) or {}).get("meta_type") in DISCRETE]
    dens = [f for f in order if f not in mass]
    units: dict[str, int] = {}
    for f in dens:
        u = _real_units(manifest, f)
        units[u] = units.get(u, 0) + 1
    measure = "density x mass" if mass and dens else "mass" if mass else "density"
    parts = []
    if mass:
        parts.append(f"log probability mass of {len(mass)} discrete column{'s' * (len(mass) != 1)}")
    if dens:
        where = ", ".join(f"{n} in {u} units" for u, n in sorted(units.items()))
        parts.append(f"log density of {len(dens)} real column{'s' * (len(dens) != 1)} ({where})")
    text = "nats per row: " + " + ".join(parts) if parts else "nats per row"
    return {"measure": measure, "mass_columns": len(mass), "density_columns": len(dens), "density_units": units,
            "text": text}


def image_bpd(manifest: dict[str, Any], joint: np.ndarray, target: str | None) -> float | None:
    """Bits per pixel, or ``None`` unless the manifest marks the data set as an image set whose
    pixels are all modelled as levels (``meta_type`` discrete or categorical).

    Args:
        manifest: the shard manifest as a dict (``Manifest.raw``); images carry an ``image`` key.
        joint: ``(n, m)`` log-joints of one upward pass (``m`` classes of ``target``, or 1).
        target: the expanded class feature, or ``None`` (``joint[:, 0]`` is ``log p(x)``).
    """
    if not manifest.get("image"):
        return None
    from scipy.special import logsumexp

    pixels = [f for f in manifest["feature_order"] if f != manifest.get("target")]
    d = len(pixels)
    if d == 0 or joint.shape[0] == 0:
        return None
    feats = manifest.get("features") or {}
    if any((feats.get(f) or {}).get("meta_type", "discrete") not in DISCRETE for f in pixels):
        return None  # a density over real-valued pixels is not a mass over levels
    ll = logsumexp(joint, axis=1) if target is not None else joint[:, 0]
    return float(-np.mean(ll) / (d * math.log(2.0)))
