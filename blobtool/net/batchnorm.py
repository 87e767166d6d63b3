"""A BatchNorm's statistics as Caffe computes with them: one function for every caller.

Caffe's BatchNormLayer (batch_norm_layer.cpp) stores the running sums of
the mean and of the variance (blobs 0 and 1) and their moving-average
factor s (blob 2, one value). At test time it uses
scale_factor = s == 0 ? 0 : 1 / s, mean = blob 0 * scale_factor and
var = blob 1 * scale_factor. blobtool computes the same in float64 (Caffe
computes in the net's Dtype, float32): fold, ``--names torch`` and the way
back all take the statistics from here.
"""

from __future__ import annotations

import numpy as np

__all__ = ["caffe_factor", "statistics", "statistic", "statistic_factors"]


def caffe_factor(s) -> float:
    """Caffe's scale factor for a stored factor `s` (an array of one value, or a number): 1 / s, 0 when s is 0."""
    s = float(np.asarray(s, dtype=np.float64).reshape(-1)[0])
    return 0.0 if s == 0 else 1.0 / s


def statistic(sums, factor: float) -> np.ndarray:
    """One statistic (mean or variance) in float64: the stored sums times Caffe's factor (caffe_factor)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(sums, dtype=np.float64).reshape(-1) * factor


def statistics(mean_sums, var_sums, stored_factor) -> tuple[np.ndarray, np.ndarray]:
    """(mean, var) in float64 from a BatchNorm's three blobs, as Caffe's BatchNormLayer uses them."""
    factor = caffe_factor(stored_factor)
    return statistic(mean_sums, factor), statistic(var_sums, factor)


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
