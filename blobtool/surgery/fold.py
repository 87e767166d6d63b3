"""Folding a BatchNorm, and the Scale after it, into the layer before it: the arithmetic.

At test time Caffe's BatchNorm (batch_norm_layer.cpp) normalizes each
channel o of its input with the statistics it stores, and the Scale after
it (scale_layer.cpp) applies an affine map per channel:

=========  ===============================================================
f          1 / s, s = BatchNorm blob 2 (the moving-average factor); 0
           when s is 0
mean[o]    blob 0 [o] * f
var[o]     blob 1 [o] * f
BatchNorm  y = (x - mean[o]) / sqrt(var[o] + eps), eps from
           batch_norm_param (field 3, float, default 1e-5)
Scale      z = gamma[o] * y + beta[o] (blob 0, blob 1; beta 0 without
           scale_param.bias_term); a BatchNorm alone: gamma 1, beta 0
=========  ===============================================================

so a layer computing x = W * input + b per output channel o, followed by
them, computes with k[o] = gamma[o] / sqrt(var[o] + eps):

    W'[o] = W[o] * k[o]
    b'[o] = (b[o] - mean[o]) * k[o] + beta[o]    (b = 0 where it has no bias)

Where output channel o lies in each layer's weight is its type's row
(net/layertypes.py: `channels`).

Everything is computed in float64; the caller stores the results in the
type the layer's blobs were stored in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..net.layertypes import foldable, output_channels

__all__ = ["DEFAULT_EPS", "Folded", "fold_params"]

# batch_norm_param.eps's default, as the float Caffe reads it.
DEFAULT_EPS = float(np.float32(1e-5))


@dataclass
class Folded:
    """A folded layer's weight and bias (float64, the weight in its stored shape, the bias 1-D)."""

    weight: np.ndarray
    bias: np.ndarray


def fold_params(kind: str, weight, bias, mean, var, eps: float, gamma=None, beta=None, *, group: int = 1,
                transpose: bool = False) -> Folded:
    """The weight and bias of a `kind` layer (one a BatchNorm folds into) with the BatchNorm (and Scale) after it folded in.

    `weight` in its stored shape; `bias` 1-D or None (no bias: 0); `mean`
    and `var` from net/batchnorm.statistics; `eps` batch_norm_param's; `gamma`
    and `beta` the Scale's (None: 1 and 0). `group` is a Deconvolution's
    (convolution_param.group), `transpose` an InnerProduct's
    (inner_product_param.transpose). Values past float64's range (a
    variance of -eps) come out Inf or NaN, as Caffe's own arithmetic gives
    them; the caller counts them.
    """
    weight = np.asarray(weight, dtype=np.float64)
    channels = output_channels(kind, weight.shape, group=group, transpose=transpose)
    mean = np.asarray(mean, dtype=np.float64).reshape(-1)
    if channels is None or channels != mean.size:
        raise ValueError(f"a {kind} weight of shape {weight.shape} (group {group}, transpose {transpose}) "
                         f"does not compute {mean.size} channels")
    var = np.asarray(var, dtype=np.float64).reshape(-1)
    gamma = np.ones(channels) if gamma is None else np.asarray(gamma, dtype=np.float64).reshape(-1)
    beta = np.zeros(channels) if beta is None else np.asarray(beta, dtype=np.float64).reshape(-1)
    bias = np.zeros(channels) if bias is None else np.asarray(bias, dtype=np.float64).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        k = gamma / np.sqrt(var + eps)
        folded_bias = (bias - mean) * k + beta
        folded_weight = _scale_channels(kind, weight, k, group, transpose)
    return Folded(folded_weight, folded_bias)


def _scale_channels(kind: str, weight: np.ndarray, k: np.ndarray, group: int, transpose: bool) -> np.ndarray:
    """`weight` with each output channel's values multiplied by k[channel]."""
    channels = k.size
    how = foldable(kind).channels
    if how == "groups":
        inputs = weight.shape[0]
        per_group = channels // group
        view = weight.reshape(group, inputs // group, per_group, -1)
        return (view * k.reshape(group, 1, per_group, 1)).reshape(weight.shape)
    if how == "matrix" and transpose:
        return (weight.reshape(-1, channels) * k).reshape(weight.shape)
    return (weight.reshape(channels, -1) * k[:, None]).reshape(weight.shape)
