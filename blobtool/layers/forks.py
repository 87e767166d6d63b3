"""The forks' layers that are neither BVLC's nor SSD's: SegNet's BN and SENet's Axpy.

- BN is alexgkendall/caffe-segnet's BNLayer (src/caffe/layers/bn_layer.cpp),
  which ENet's deploy nets use too: blobs scale and shift, (1, C, 1, 1)
  each. bn_mode INFERENCE (ENet's deploy nets, and SegNet's after its
  statistics are folded into scale and shift) is scale x + shift, the
  product taken first. bn_mode LEARN, the default, normalizes by the
  batch's own statistics over N, H and W, as Forward_cpu computes them:
  mean = E[x], variance = E[x^2] - mean^2, then (x - mean) / sqrt(variance +
  1e-9) * scale + shift. A SegNet deploy net run before its statistics are
  folded in is in this mode.
- Axpy is hujie-frank/SENet's AxpyLayer (src/caffe/layers/axpy_layer.cpp):
  bottoms a (N, C) or (N, C, 1, 1), x and y of one shape (N, C, ...); top =
  y + a[n, c] x, per (n, c) plane (caffe_axpy).
"""

from __future__ import annotations

import numpy as np

from .base import FLOAT, Layer, count, register

__all__ = ["BN", "Axpy", "BN_LEARN", "BN_INFERENCE", "BN_EPS"]

BN_LEARN, BN_INFERENCE = 0, 1           # BNParameter.BNMode
BN_EPS = FLOAT(1e-9)                    # bn_layer.cpp: var_eps_ = 1e-9


@register("BN")
class BN(Layer):
    """SegNet's BNLayer (caffe-segnet bn_layer.cpp): scale x + shift, after the batch's normalization in LEARN."""

    blob_count = (2, 2)

    def setup(self) -> None:
        self.mode = int(self.param.bn_param.bn_mode)
        if self.mode not in (BN_LEARN, BN_INFERENCE):
            raise self.error(f"bn_mode is {self.mode}; SegNet's BN takes LEARN (0) or INFERENCE (1)")
        # LEARN may write the batch's mean and variance to tops 1 and 2 (bn_layer.cpp's Reshape).
        self.tops = (1, 3) if self.mode == BN_LEARN else (1, 1)

    def reshape(self, shapes: list) -> list:
        shape = tuple(shapes[0])
        # Reshape reads num(), channels(), height(), width(): a 4-D bottom.
        if len(shape) != 4:
            raise self.error(f"bottom {shape} has {len(shape)} axes; BN takes (N, C, H, W)")
        c = shape[1]
        for k in (0, 1):
            if self.blobs[k].size != c:
                raise self.error(f"blob {k} holds {self.blobs[k].size} values; the bottom has {c} channels")
        return [shape] + [(1, c, 1, 1)] * (max(1, len(self.top_names)) - 1)

    def forward(self, xs: list) -> list:
        x = xs[0]
        c = x.shape[1]
        scale = self.blobs[0].reshape(1, c, 1, 1)
        shift = self.blobs[1].reshape(1, c, 1, 1)
        if self.mode == BN_INFERENCE:
            return [np.ascontiguousarray(x * scale + shift, dtype=FLOAT)]
        mean, variance = batch_statistics(x)
        top = (x - mean.reshape(1, c, 1, 1)) / np.sqrt(variance + BN_EPS).reshape(1, c, 1, 1)
        tops = [np.ascontiguousarray(top * scale + shift, dtype=FLOAT)]
        extra = [mean.reshape(1, c, 1, 1), variance.reshape(1, c, 1, 1)]
        return tops + [np.ascontiguousarray(t, dtype=FLOAT) for t in extra[:len(self.top_names) - 1]]


def batch_statistics(x: np.ndarray) -> tuple:
    """(mean, variance) per channel over N, H, W as bn_layer.cpp's LEARN computes them: E[x^2] - E[x]^2, in float.

    Caffe averages each plane first (gemv with 1 / (H W)), then the planes
    over the batch (1 / N); so here, in float32 (the order of the sums within
    a plane is BLAS's, so the last bits may differ).
    """
    n, c, h, w = x.shape
    planes = x.reshape(n, c, h * w)
    plane_mean = planes.mean(axis=2, dtype=FLOAT)
    plane_square = (planes * planes).mean(axis=2, dtype=FLOAT)
    mean = plane_mean.mean(axis=0, dtype=FLOAT)
    square = plane_square.mean(axis=0, dtype=FLOAT)
    return mean, (square - mean * mean).astype(FLOAT)


@register("Axpy")
class Axpy(Layer):
    """SENet's AxpyLayer (axpy_layer.cpp): top = y + a x with a one value per (image, channel)."""

    bottoms = (3, 3)

    def reshape(self, shapes: list) -> list:
        a, x, y = (tuple(s) for s in shapes)
        if len(a) < 2 or len(x) < 2 or a[:2] != x[:2]:
            raise self.error(f"bottom 0 {a} must have the first two axes of bottom 1 {x} (num and channels)")
        if len(a) == 4 and a[2:] != (1, 1):
            raise self.error(f"bottom 0 {a} must be (N, C, 1, 1): one scale per image and channel")
        if count(a) != a[0] * a[1]:
            raise self.error(f"bottom 0 {a} must hold one value per image and channel")
        if x != y:
            raise self.error(f"bottoms 1 {x} and 2 {y} must have the same shape")
        return [x]

    def forward(self, xs: list) -> list:
        a, x, y = xs
        n, c = x.shape[:2]
        scale = a.reshape((n, c) + (1,) * (x.ndim - 2))
        return [np.ascontiguousarray(y + scale * x, dtype=FLOAT)]
