"""Caffe's normalizing layers at test time: BatchNorm, LRN, MVN, Softmax, and caffe-ssd's Normalize.

Each class mirrors Caffe's src/caffe/layers/<name>_layer.cpp (BVLC; Normalize
is weiliu89/caffe's normalize_layer.cpp; BatchNorm's five-blob form is NVIDIA
Caffe's batch_norm_layer.cpp); the formula sits beside its code. All
arithmetic is float32, as Caffe's Dtype float.
"""

from __future__ import annotations

import numpy as np

from ..net.batchnorm import CAFFE_BLOBS, NVCAFFE_BLOBS, statistics
from .base import FLOAT, Layer, as_float, register

__all__ = ["BatchNorm", "LRN", "MVN", "Softmax", "Normalize", "legacy_shape"]

ACROSS_CHANNELS, WITHIN_CHANNEL = 0, 1   # LRNParameter.NormRegion


def legacy_shape(layer: Layer, shape: tuple) -> tuple:
    """Blob's num(), channels(), height(), width(): the shape padded with 1s to 4 axes; more than 4 is refused.

    Caffe's layers written before N-D blobs (MVN, Normalize) read these
    accessors, which CHECK that a blob has at most 4 axes.
    """
    shape = tuple(shape)
    if len(shape) > 4:
        raise layer.error(f"bottom has {len(shape)} axes {shape}; Caffe's {layer.type} reads num, channels, "
                          "height and width, so at most 4")
    return shape + (1,) * (4 - len(shape))


def _per_channel(values: np.ndarray, ndim: int) -> np.ndarray:
    """A (C,) vector shaped [C, 1, 1, ...] to broadcast over axis 1 of an ndim-axis blob."""
    return values.reshape((-1,) + (1,) * (ndim - 2))


@register("BatchNorm")
class BatchNorm(Layer):
    """BatchNormLayer (batch_norm_layer.cpp): normalize each channel (axis 1) by its mean and variance.

    Three blobs (BVLC): the running sums of the mean and the variance and
    their factor s. With use_global_stats (Caffe's default in the TEST phase)
    mean = b0 / s and var = b1 / s (both 0 when s is 0); with
    use_global_stats set false the statistics of the batch itself are used,
    as Caffe does. Five blobs (NVIDIA Caffe): mean b0, variance b1, b2 unused,
    then a scale and a bias per channel applied after the normalization.
    """

    def setup(self) -> None:
        p = self.param.batch_norm_param
        self.eps = FLOAT(p.eps)
        # batch_norm_layer.cpp: use_global_stats_ = phase == TEST unless the parameter says otherwise.
        self.global_stats = bool(p.use_global_stats) if p.HasField("use_global_stats") else True
        if CAFFE_BLOBS < len(self.blobs) < NVCAFFE_BLOBS:
            raise self.error(f"holds {len(self.blobs)} blobs, expected {CAFFE_BLOBS} (mean, variance, factor) or "
                             f"{NVCAFFE_BLOBS} (NVIDIA Caffe's, with a scale and a bias)")

    def reshape(self, shapes: list) -> list:
        shape = tuple(shapes[0])
        if len(shape) < 2:
            raise self.error(f"bottom has {len(shape)} axes, expected 2 or more (the channels are axis 1)")
        channels = shape[1]
        names = ("the mean", "the variance", "the factor", "the scale", "the bias")
        for k, blob in enumerate(self.blobs):
            wanted = 1 if k == 2 else channels
            if blob.size != wanted:
                raise self.error(f"blob {k} ({names[k]}) holds {blob.size} values, expected {wanted} "
                                 f"(bottom has {channels} channels)")
        return [shape]

    def forward(self, xs: list) -> list:
        x = xs[0]
        b = [blob.reshape(-1) for blob in self.blobs]
        if len(self.blobs) == NVCAFFE_BLOBS:
            # NVIDIA Caffe, TEST: y = (x - b0) * (b1 + max(eps, 1e-5))^-0.5 * scale + bias.
            mean, var, eps = statistics(b, self.eps, FLOAT)
            inv_std = np.power(var + eps, FLOAT(-0.5))
            y = (x - _per_channel(mean, x.ndim)) * _per_channel(inv_std, x.ndim)
            y = y * _per_channel(b[3], x.ndim) + _per_channel(b[4], x.ndim)
            return [as_float(y)]
        if self.global_stats:
            # batch_norm_layer.cpp: factor = s == 0 ? 0 : 1 / s; mean = factor * b0, var = factor * b1.
            mean, var, _ = statistics(b, dtype=FLOAT)
        elif x.size == 0:
            return [np.zeros(x.shape, FLOAT)]
        else:
            # The batch's own statistics over every axis but the channels: var = E((x - Ex)^2).
            axes = (0,) + tuple(range(2, x.ndim))
            mean = x.mean(axis=axes, dtype=FLOAT)
            centred = x - _per_channel(mean, x.ndim)
            var = (centred * centred).mean(axis=axes, dtype=FLOAT)
        # y = (x - mean) / sqrt(var + eps)
        std = np.sqrt(var + self.eps)
        y = np.subtract(x, _per_channel(mean, x.ndim), dtype=FLOAT)
        np.divide(y, _per_channel(std, x.ndim), out=y)  # in place: one array, as Caffe's top
        return [as_float(y)]

    def forward_in_place(self, x: np.ndarray) -> np.ndarray:
        """forward() written into x, where the runner may (its top is its bottom, read by nobody after)."""
        b = [blob.reshape(-1) for blob in self.blobs]
        if len(b) == NVCAFFE_BLOBS or not self.global_stats:
            return self.forward([x])[0]
        mean, var, _ = statistics(b, dtype=FLOAT)
        np.subtract(x, _per_channel(mean, x.ndim), out=x)
        np.divide(x, _per_channel(np.sqrt(var + self.eps), x.ndim), out=x)
        return x


@register("LRN")
class LRN(Layer):
    """LRNLayer (lrn_layer.cpp): local response normalization across channels or within each channel."""

    def setup(self) -> None:
        p = self.param.lrn_param
        self.size = int(p.local_size)
        # lrn_layer.cpp LayerSetUp: CHECK_EQ(size_ % 2, 1).
        if self.size % 2 != 1:
            raise self.error(f"local_size is {self.size}; Caffe's LRN takes odd sizes only")
        self.pre_pad = (self.size - 1) // 2
        self.alpha, self.beta, self.k = FLOAT(p.alpha), FLOAT(p.beta), FLOAT(p.k)
        self.region = int(p.norm_region)
        if self.region not in (ACROSS_CHANNELS, WITHIN_CHANNEL):
            raise self.error(f"norm_region {self.region} is neither ACROSS_CHANNELS nor WITHIN_CHANNEL")

    def reshape(self, shapes: list) -> list:
        shape = tuple(shapes[0])
        # lrn_layer.cpp Reshape: CHECK_EQ(4, num_axes) "(num, channels, height, width)".
        if len(shape) != 4:
            raise self.error(f"bottom has {len(shape)} axes {shape}, expected 4 (num, channels, height, width)")
        return [shape]

    def forward(self, xs: list) -> list:
        x = xs[0]
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            y = self._across(x) if self.region == ACROSS_CHANNELS else self._within(x)
        return [as_float(y)]

    def _across(self, x: np.ndarray) -> np.ndarray:
        # lrn_layer.cpp CrossChannelForward_cpu: scale = k + alpha / n * sum of x^2 over the n channels
        # centred at c (zero-padded at both ends); y = x * scale^-beta. Only the channels inside the net
        # add anything: the window is clipped to them, so the cost follows the channels, not local_size.
        total = _window_sums(x * x, 1, self.pre_pad)
        scale = self.k + FLOAT(self.alpha / FLOAT(self.size)) * total
        return x * np.power(scale, -self.beta)

    def _within(self, x: np.ndarray) -> np.ndarray:
        # lrn_layer.cpp WithinChannelForward builds y = x * (1 + alpha * AVE_pool(x^2))^-beta from
        # Split, Power(2), Pooling(AVE, kernel n, pad (n-1)/2, stride 1), Power(-beta, alpha, 1), Eltwise(PROD).
        # The pad adds zeros only: the sums over the window clipped to the plane, rows then columns.
        n, pad = self.size, self.pre_pad
        height, width = x.shape[2:]
        sums = _window_sums(_window_sums(x * x, 2, pad), 3, pad)
        # pooling_layer.cpp AVE divides by the window clipped to the image plus its pad: hend =
        # min(hstart + n, H + pad). With stride 1 and pad (n-1)/2 no window passes that edge, so
        # this is n * n everywhere; it is computed as Caffe does all the same.
        area = np.outer(_window_extent(height, n, pad), _window_extent(width, n, pad)).astype(FLOAT)
        average = sums / area
        # power_layer.cpp with power -beta, scale alpha, shift 1; power * scale == 0 gives 1 everywhere.
        if -self.beta * self.alpha == 0:
            return x * FLOAT(1)
        return x * np.power(FLOAT(1) + self.alpha * average, -self.beta)


# Past this many offsets inside a clipped window, sums come from a running total (in float64) instead.
_SHIFTED_SUMS = 64


def _window_sums(values: np.ndarray, axis: int, reach: int) -> np.ndarray:
    """float32 sums along `axis` of `values` over each index's window i - reach .. i + reach, clipped to the axis.

    A window is never wider than the axis allows, so at most 2 size - 1
    offsets add anything. Up to _SHIFTED_SUMS of them: one shifted sum per
    offset, in order, in float32 (Caffe's float running sums round alike).
    More: the difference of two running totals in float64, as exact as
    float32 holds the result, at a cost of the array's size whatever the
    window.
    """
    size = values.shape[axis]
    reach = min(reach, max(size - 1, 0))
    if size == 0:
        return np.zeros(values.shape, FLOAT)
    if 2 * reach + 1 <= _SHIFTED_SUMS:
        total = np.zeros(values.shape, FLOAT)
        for d in range(-reach, reach + 1):
            # total[i] += values[i + d] wherever i + d lies on the axis.
            lo, hi = max(0, -d), min(size, size - d)
            into = [slice(None)] * values.ndim
            into[axis] = slice(lo, hi)
            source = list(into)
            source[axis] = slice(lo + d, hi + d)
            total[tuple(into)] += values[tuple(source)]
        return total
    running = np.cumsum(values, axis=axis, dtype=np.float64)
    zero_shape = list(values.shape)
    zero_shape[axis] = 1
    running = np.concatenate([np.zeros(zero_shape, np.float64), running], axis=axis)
    index = np.arange(size)
    upper = np.take(running, np.minimum(index + reach + 1, size), axis=axis)
    lower = np.take(running, np.maximum(index - reach, 0), axis=axis)
    return (upper - lower).astype(FLOAT)


def _window_extent(size: int, kernel: int, pad: int) -> np.ndarray:
    """pooling_layer.cpp AVE, stride 1: each output's window length along one axis, clipped to size + pad."""
    start = np.arange(size) - pad
    return np.minimum(start + kernel, size + pad) - start


@register("MVN")
class MVN(Layer):
    """MVNLayer (mvn_layer.cpp): subtract the mean, and divide by the standard deviation plus eps.

    The mean is over each channel's values (each image's, across_channels);
    Caffe adds eps to the standard deviation, not to the variance. The top is
    Reshape(num, channels, height, width): an input of fewer than 4 axes
    comes out with 4.
    """

    def setup(self) -> None:
        p = self.param.mvn_param
        self.normalize_variance = bool(p.normalize_variance)
        self.across_channels = bool(p.across_channels)
        self.eps = FLOAT(p.eps)

    def reshape(self, shapes: list) -> list:
        return [legacy_shape(self, shapes[0])]

    def forward(self, xs: list) -> list:
        shape = legacy_shape(self, xs[0].shape)
        if xs[0].size == 0:
            # Caffe's loops run over no value: an empty top of the bottom's shape.
            return [np.zeros(shape, FLOAT)]
        # mvn_layer.cpp: num = across_channels ? N : N * C rows of dim = count / num values each.
        rows = shape[0] if self.across_channels else shape[0] * shape[1]
        x = xs[0].reshape(rows, -1)
        # y = x - E(x)
        y = x - x.mean(axis=1, dtype=FLOAT, keepdims=True)
        if self.normalize_variance:
            # y = (x - E(x)) / (sqrt(E((x - E(x))^2)) + eps)
            variance = (y * y).mean(axis=1, dtype=FLOAT, keepdims=True)
            y = y / (np.sqrt(variance) + self.eps)
        return [as_float(y.reshape(shape))]


@register("Softmax")
class Softmax(Layer):
    """SoftmaxLayer (softmax_layer.cpp): exp(x - max) / sum(exp(x - max)) along `axis` (default 1)."""

    def reshape(self, shapes: list) -> list:
        shape = tuple(shapes[0])
        self.axis(self.param.softmax_param.axis, len(shape))
        return [shape]

    def forward(self, xs: list) -> list:
        x = xs[0]
        axis = self.axis(self.param.softmax_param.axis, x.ndim)
        if x.size == 0:
            # Caffe's loops run over no value (an axis of 0 has no max to take): an empty top.
            return [np.zeros(x.shape, FLOAT)]
        # softmax_layer.cpp: subtract the max along the axis (no overflow), exponentiate, divide by the sum.
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        e /= e.sum(axis=axis, dtype=FLOAT, keepdims=True)
        return [as_float(e)]


@register("Normalize")
class Normalize(Layer):
    """caffe-ssd's NormalizeLayer (weiliu89/caffe normalize_layer.cpp): L2 normalization, then a learned scale.

    across_spatial: each image divided by sqrt(sum of its x^2 + eps);
    otherwise each position by sqrt(eps + sum over channels of x^2). The
    scale (blob 0) is one value (channel_shared) or one per channel.
    """


    def setup(self) -> None:
        p = self.param.norm_param
        self.across_spatial = bool(p.across_spatial)
        self.channel_shared = bool(p.channel_shared)
        self.eps = FLOAT(p.eps)

    def reshape(self, shapes: list) -> list:
        shape = tuple(shapes[0])
        # normalize_layer.cpp: CHECK_GE(num_axes, 2); the scale's count against channel_shared.
        if len(shape) < 2:
            raise self.error(f"bottom has {len(shape)} axes, expected 2 or more (the channels are axis 1)")
        legacy_shape(self, shape)
        wanted = 1 if self.channel_shared else shape[1]
        if self.blobs[0].size != wanted:
            what = "channel_shared: 1 scale" if self.channel_shared else f"{shape[1]} channels: one scale each"
            raise self.error(f"blob 0 (the scale) holds {self.blobs[0].size} values, expected {wanted} ({what})")
        return [shape]

    def forward(self, xs: list) -> list:
        num, channels = xs[0].shape[:2]
        x = xs[0].reshape(num, channels, -1)   # (num, channels, height * width)
        squares = x * x
        if self.across_spatial:
            # norm = (sum of x^2 over the image + eps)^0.5; y = x * (1 / norm)
            norm = np.sqrt(squares.sum(axis=(1, 2), dtype=FLOAT, keepdims=True) + self.eps)
            y = x * (FLOAT(1) / norm)
        else:
            # norm starts at eps, then adds the sum over channels at each position: sqrt(eps + sum c x^2); y = x / norm
            norm = np.sqrt(self.eps + squares.sum(axis=1, dtype=FLOAT, keepdims=True))
            y = x / norm
        scale = self.blobs[0].reshape(-1)
        y = y * (scale[0] if self.channel_shared else scale.reshape(-1, 1))
        return [as_float(y.reshape(xs[0].shape))]
