"""A BatchNorm's statistics as Caffe computes with them: one function for every caller.

Caffe's BatchNormLayer (batch_norm_layer.cpp) stores the running sums of
the mean and of the variance (blobs 0 and 1) and their moving-average
factor s (blob 2, one value). At test time it uses
scale_factor = s == 0 ? 0 : 1 / s, mean = blob 0 * scale_factor and
var = blob 1 * scale_factor. NVIDIA Caffe's BatchNorm holds five blobs:
the mean and the variance themselves, an unused third, then a scale and a
bias per channel, and it never normalizes with an eps below 1e-5.

Running a net (layers/normalize.py) and exporting it compute in float32, as
Caffe's Dtype float; fold, ``--names torch`` and the way back compute in
float64. Every one of them takes the statistics from here.
"""

from __future__ import annotations

import numpy as np

from .layertypes import BATCHNORM_ROLES, TYPES

__all__ = ["CAFFE_BLOBS", "NVCAFFE_BLOBS", "NVCAFFE_MIN_EPS", "caffe_factor", "statistics", "statistic",
           "statistic_factors"]

# How many blobs a BatchNorm holds: BVLC Caffe's three (what a definition makes), NVIDIA Caffe's five (a role
# each). The type's row states both; the layer that runs it and the exporter read them here.
CAFFE_BLOBS = TYPES["BatchNorm"].count
NVCAFFE_BLOBS = len(BATCHNORM_ROLES)

# NVIDIA Caffe's BatchNorm never uses an eps below this (batch_norm_layer.cpp: max(eps, 1e-5)).
NVCAFFE_MIN_EPS = np.float32(1e-5)


def caffe_factor(s, dtype=np.float64):
    """Caffe's scale factor for a stored factor `s` (an array of one value, or a number): 1 / s, 0 when s is 0.

    In `dtype`: float64 gives a Python float; float32 divides in float32,
    as Caffe's Dtype float does.
    """
    s = np.asarray(s, dtype=dtype).reshape(-1)[0]
    if dtype == np.float64:
        s = float(s)
        return 0.0 if s == 0 else 1.0 / s
    return dtype(0) if s == 0 else dtype(1) / s


def statistic(sums, factor, dtype=np.float64) -> np.ndarray:
    """One statistic (mean or variance) in `dtype`: the stored sums times Caffe's factor (caffe_factor)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(sums, dtype=dtype).reshape(-1) * factor


def statistics(blobs, eps=None, dtype=np.float64) -> tuple:
    """(mean, var, eps) a BatchNorm normalizes with at test time, from its stored `blobs`, as Caffe computes them.

    Three blobs (BVLC): mean = b0 * f, var = b1 * f with Caffe's factor
    f = 1 / b2, 0 when b2 is 0; eps as given. Five (NVIDIA Caffe): mean b0,
    var b1, and eps at least NVCAFFE_MIN_EPS. In `dtype` (float32 for the
    forward pass and the export, float64 for fold and the PyTorch names);
    `eps` is None where the caller reads no eps (it comes back None).
    """
    if len(blobs) == NVCAFFE_BLOBS:
        mean, var = (np.asarray(b, dtype=dtype).reshape(-1) for b in blobs[:2])
        return mean, var, (None if eps is None else max(eps, NVCAFFE_MIN_EPS))
    factor = caffe_factor(blobs[2], dtype)
    return statistic(blobs[0], factor, dtype), statistic(blobs[1], factor, dtype), eps


def statistic_factors(doc) -> tuple[dict, set]:
    """({a statistic's entry name: Caffe's factor}, {the factors' entry names}) of a net's BatchNorm layers.

    Every layer whose type's row holds a "factor" blob (net/layertypes.py),
    in the net as stored; a layer without its factor blob is left out.
    """
    from .model import model

    factors: dict = {}
    names: set = set()
    for layer in model(doc).layers:
        roles = layer.roles()
        if "factor" not in roles:
            continue
        factor = caffe_factor(roles["factor"].blob().cpu_data())
        names.add(roles["factor"].name)
        for role in ("mean", "variance"):
            if role in roles:
                factors[roles[role].name] = factor
    return factors, names
