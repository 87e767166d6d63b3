"""BVLC's layers made of windows over a plane: SPP (a pyramid of poolings) and Im2col (the windows as channels).

Both read 4-D bottoms (N, C, H, W). SPP builds Caffe's Pooling layers
(blobtool/layers/pooling.py) with the kernels, strides and pads
spp_layer.cpp's GetPoolingParam computes from the bottom's size, so the
pooling is computed once, by the Pooling class; Im2col lays out each
window as im2col_cpu (util/im2col.cpp) does for a convolution.
"""

from __future__ import annotations

import math

import numpy as np

from .base import FLOAT, Layer, LayerError, register
from .pooling import Pooling

__all__ = ["SPP", "Im2col", "spp_level"]

_SPP_MAX, _SPP_AVE, _SPP_STOCHASTIC = 0, 1, 2     # SPPParameter.PoolMethod, Pooling's numbers too


def spp_level(level: int, height: int, width: int) -> tuple:
    """spp_layer.cpp GetPoolingParam: ((kernel_h, kernel_w), (pad_h, pad_w)) of pyramid level `level` (stride = kernel).

    2^level bins per axis: kernel = ceil(size / bins), pad = (kernel bins -
    size + 1) / 2 (integer division), so that the windows cover the plane.
    """
    bins = 2 ** level
    kernel, pad = [], []
    for size in (height, width):
        k = int(math.ceil(size / float(bins)))
        kernel.append(k)
        pad.append((k * bins - size + 1) // 2)
    return tuple(kernel), tuple(pad)


@register("SPP")
class SPP(Layer):
    """Caffe's SPPLayer (spp_layer.cpp): pooling at pyramid_height levels, each flattened, concatenated on axis 1.

    Level i pools into about 2^i x 2^i bins (spp_level); with pyramid_height
    1 the top is the one pooling's (N, C, h, w) itself, not flattened.
    """

    def setup(self) -> None:
        p = self.param.spp_param
        self.height = int(p.pyramid_height)
        self.method = int(p.pool)
        if self.height < 1:
            raise self.error(f"pyramid_height is {self.height}; it must be 1 or more")
        if self.method not in (_SPP_MAX, _SPP_AVE, _SPP_STOCHASTIC):
            raise self.error(f"unknown pooling method {self.method}")
        self.levels: list = []

    def _levels(self, shape: tuple) -> list:
        """The Pooling layer of each level for a bottom of `shape` (GetPoolingParam), built and checked."""
        if len(shape) != 4:
            raise self.error(f"bottom has shape {shape}; SPP takes 4 axes (num, channels, height, width)")
        if shape[2] <= 0 or shape[3] <= 0:
            raise self.error(f"bottom has shape {shape}: input dimensions cannot be zero")
        levels = []
        for level in range(self.height):
            (kh, kw), (ph, pw) = spp_level(level, shape[2], shape[3])
            message = type(self.param)(name=f"{self.name}/level{level}", type="Pooling")
            pool = message.pooling_param
            pool.kernel_h, pool.kernel_w, pool.stride_h, pool.stride_w = kh, kw, kh, kw
            pool.pad_h, pool.pad_w, pool.pool = ph, pw, self.method
            try:
                made = Pooling(message.name, "Pooling", message, [])
                made.reshape([shape])
            except LayerError as exc:
                raise self.error(f"pyramid level {level} (kernel {kh} x {kw}, pad {ph} x {pw}, as Caffe computes "
                                 f"them for a {shape[2]} x {shape[3]} plane): {str(exc).partition('): ')[2]}") from None
            levels.append(made)
        return levels

    def reshape(self, shapes: list) -> list:
        shape = tuple(int(d) for d in shapes[0])
        self.levels = self._levels(shape)
        pooled = [made.reshape([shape])[0] for made in self.levels]
        if self.height == 1:
            return [pooled[0]]
        return [(shape[0], sum(p[1] * p[2] * p[3] for p in pooled))]

    def forward(self, xs: list) -> list:
        x = xs[0]
        levels = self._levels(tuple(x.shape))
        pooled = [made.forward([x])[0] for made in levels]
        if self.height == 1:
            return [pooled[0]]
        # FlattenLayer of each level (N, C h w), then ConcatLayer on axis 1
        return [np.ascontiguousarray(np.concatenate([p.reshape(p.shape[0], -1) for p in pooled], axis=1), FLOAT)]


@register("Im2col")
class Im2col(Layer):
    """Caffe's Im2colLayer (im2col_layer.cpp, util/im2col.cpp): each window of each channel as channels.

    Top (N, C kh kw, Ho, Wo), Ho = (H + 2 pad - (dilation (kh - 1) + 1)) /
    stride + 1; channel (c kh + i) kw + j at (y, x) holds the bottom at row
    y stride - pad + i dilation, column x stride - pad + j dilation of
    channel c, or 0 outside the plane. 2 spatial axes (a 4-D bottom, axis 1).
    """

    def setup(self) -> None:
        conv = self.param.convolution_param
        self.kernel = self._pair(conv, "kernel_size", "kernel_h", "kernel_w", None)
        self.stride = self._pair(conv, "stride", "stride_h", "stride_w", 1)
        self.pad = self._pair(conv, "pad", "pad_h", "pad_w", 0)
        self.dilation = self._pair(conv, "dilation", None, None, 1)
        if min(self.kernel) <= 0:
            raise self.error(f"kernel {self.kernel[0]} x {self.kernel[1]}: filter dimensions must be nonzero")
        if min(self.stride) <= 0:
            raise self.error(f"stride {self.stride[0]} x {self.stride[1]}: stride must be positive")
        if min(self.dilation) <= 0:
            raise self.error(f"dilation {self.dilation[0]} x {self.dilation[1]}: blobtool runs Im2col with a "
                             "positive dilation")

    def _pair(self, conv, repeated: str, name_h, name_w, default) -> tuple:
        """(height, width) from the repeated field (1 or 2 values) or its _h and _w pair (base_conv_layer.cpp)."""
        if name_h and (conv.HasField(name_h) or conv.HasField(name_w)):
            if len(getattr(conv, repeated)) or not (conv.HasField(name_h) and conv.HasField(name_w)):
                raise self.error(f"give {repeated}, or both {name_h} and {name_w} (not both ways)")
            return int(getattr(conv, name_h)), int(getattr(conv, name_w))
        values = [int(v) for v in getattr(conv, repeated)]
        if not values:
            if default is None:
                raise self.error(f"has no kernel: give {repeated}, or both {name_h} and {name_w}")
            return default, default
        if len(values) not in (1, 2):
            raise self.error(f"{repeated} has {len(values)} values; a 2-D Im2col takes 1 or 2")
        return (values[0], values[-1])

    def _out(self, shape: tuple) -> tuple:
        if len(shape) != 4 or self.axis(self.param.convolution_param.axis, len(shape)) != 1:
            raise self.error(f"bottom has shape {shape}; blobtool runs Im2col over the 2 spatial axes of a 4-D "
                             "bottom (channels on axis 1)")
        out = []
        for size, k, s, p, d in zip(shape[2:], self.kernel, self.stride, self.pad, self.dilation):
            span = size + 2 * p - (d * (k - 1) + 1)
            # im2col_layer.cpp Reshape: span / stride + 1 in C++ int, the division truncated toward 0: a span of
            # -stride < span < 0 still gives 1 window, its taps past the plane reading 0
            o = (span // s if span >= 0 else -(-span // s)) + 1
            if o < 0:
                raise self.error(f"bottom {shape} is smaller than the dilated kernel {d * (k - 1) + 1} with pad {p} "
                                 f"(an output size of {o}, which Caffe's Blob refuses)")
            out.append(o)
        return tuple(out)

    def reshape(self, shapes: list) -> list:
        shape = tuple(int(d) for d in shapes[0])
        ho, wo = self._out(shape)
        return [(shape[0], shape[1] * self.kernel[0] * self.kernel[1], ho, wo)]

    def workspace(self, shapes: list) -> tuple:
        """The bottom padded to every window's taps (forward's `padded`)."""
        n, c, h, w = (int(d) for d in shapes[0])
        ho, wo = self._out(tuple(int(d) for d in shapes[0]))
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = self.kernel, self.stride, self.pad, self.dilation
        rows = max(h + 2 * ph, (ho - 1) * sh + dh * (kh - 1) + 1)
        cols = max(w + 2 * pw, (wo - 1) * sw + dw * (kw - 1) + 1)
        return n * c * rows * cols, "padded input"

    def forward(self, xs: list) -> list:
        x = as_contiguous(xs[0])
        n, c, h, w = x.shape
        ho, wo = self._out(x.shape)
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = self.kernel, self.stride, self.pad, self.dilation
        # the plane padded with zeros wide enough for every window's tap, even those past the far pad
        rows = max(h + 2 * ph, (ho - 1) * sh + dh * (kh - 1) + 1)
        cols = max(w + 2 * pw, (wo - 1) * sw + dw * (kw - 1) + 1)
        padded = np.zeros((n, c, rows, cols), FLOAT)
        padded[:, :, ph:ph + h, pw:pw + w] = x
        out = np.empty((n, c, kh, kw, ho, wo), FLOAT)
        for i in range(kh):
            for j in range(kw):
                top, left = i * dh, j * dw
                out[:, :, i, j] = padded[:, :, top:top + (ho - 1) * sh + 1:sh, left:left + (wo - 1) * sw + 1:sw]
        return [out.reshape(n, c * kh * kw, ho, wo)]


def as_contiguous(x) -> np.ndarray:
    """`x` as a C-contiguous float32 array."""
    return np.ascontiguousarray(x, dtype=FLOAT)
