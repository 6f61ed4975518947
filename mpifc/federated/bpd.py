"""Bits per dimension of image test sets, from the class log-joints of one upward pass.

Convention (stated in ``mpifc evaluate --json``): data_prep keeps image pixels as integer levels
``0..L-1`` (MNIST: 0..255; the source's ``k/256`` floats are mapped back to ``k``, recorded as
``image.file_scale``), so a circuit over the pixel columns gives ``log p(pixels)`` of the
discrete levels directly and

    bpd = -mean_n log p(pixels_n) / (D · ln 2),     D = number of pixel columns,

with no dequantisation offset. The label, if any, is not a dimension: ``log p(pixels)`` is the
log-sum-exp of the class log-joints. If pixel columns were standardised (``raw = x·std + mean``),
a density on the standardised scale is moved back to the level scale by ``-Σ_j log std_j``
(the Jacobian), which is the usual offset (e.g. ``+D·log 256`` for data scaled by ``1/256``).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np


def image_bpd(manifest: dict[str, Any], joint: np.ndarray, target: str | None) -> float | None:
    """Bits per pixel, or ``None`` unless the manifest marks the data set as an image set.

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
    ll = logsumexp(joint, axis=1) if target is not None else joint[:, 0]
    cols = (manifest.get("preprocessing") or {}).get("columns") or {}
    log_jac = sum(math.log(float(cols[f]["std"])) for f in pixels
                  if isinstance(cols.get(f), dict) and cols[f].get("std"))
    return float(-(np.mean(ll) - log_jac) / (d * math.log(2.0)))
