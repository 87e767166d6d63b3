"""Caffe's element-wise ("neuron") layers at test time: one value out for each value in, the shape kept.

Each class mirrors Caffe's src/caffe/layers/<name>_layer.cpp (the forks'
ReLU6 has no BVLC file); the formula sits beside its code. All arithmetic is
float32, as Caffe's Dtype float; where Caffe's own formula overflows to inf or
gives NaN (Exp of a large input, Log of a negative one, a negative base to a
fractional Power) the value is kept and numpy's warning is silenced, because
that value is what Caffe computes.
"""

from __future__ import annotations

import abc

import numpy as np

from .base import FLOAT, Layer, as_float, register

__all__ = ["Neuron", "ReLU", "PReLU", "ELU", "Sigmoid", "TanH", "AbsVal", "Power", "Exp", "Log", "BNLL",
           "Threshold", "Clip", "Swish", "Dropout", "ReLU6"]

# Caffe's formulas reach inf and NaN legitimately; numpy would warn on each.
_QUIET = dict(over="ignore", under="ignore", invalid="ignore", divide="ignore")


def _scalar(value) -> np.float32:
    """A parameter as Caffe holds it (a float field read into Dtype)."""
    return FLOAT(value)


class Neuron(Layer):
    """NeuronLayer (neuron_layer.cpp): one bottom, one top of the bottom's shape; subclasses write compute()."""

    def reshape(self, shapes: list) -> list:
        return [tuple(shapes[0])]

    def forward(self, xs: list) -> list:
        with np.errstate(**_QUIET):
            y = self.compute(xs[0])
        return [as_float(y)]

    @abc.abstractmethod
    def compute(self, x: np.ndarray) -> np.ndarray:
        """The layer's function of one bottom, element by element."""


@register("ReLU")
class ReLU(Neuron):
    """ReLULayer (relu_layer.cpp), leaky when negative_slope is set."""

    def setup(self) -> None:
        self.slope = _scalar(self.param.relu_param.negative_slope)

    def compute(self, x):
        # relu_layer.cpp: y = max(x, 0) + negative_slope * min(x, 0)
        y = np.maximum(x, FLOAT(0))
        if self.slope != 0:
            y += self.slope * np.minimum(x, FLOAT(0))
        return y

    def forward_in_place(self, x: np.ndarray) -> np.ndarray:
        """compute() written into x, where the runner may (its top is its bottom, read by nobody after)."""
        if self.slope != 0:
            return self.forward([x])[0]
        with np.errstate(**_QUIET):
            return np.maximum(x, FLOAT(0), out=x)


@register("PReLU")
class PReLU(Neuron):
    """PReLULayer (prelu_layer.cpp): a learned slope for negative inputs, per channel (axis 1) or one shared."""


    def setup(self) -> None:
        self.shared = bool(self.param.prelu_param.channel_shared)

    def reshape(self, shapes: list) -> list:
        shape = tuple(shapes[0])
        # prelu_layer.cpp LayerSetUp: CHECK_GE(num_axes, 2), and the slope count against the setting.
        if len(shape) < 2:
            raise self.error(f"bottom has {len(shape)} axes, expected 2 or more (the channels are axis 1)")
        wanted = 1 if self.shared else shape[1]
        if self.blobs[0].size != wanted:
            what = "channel_shared: 1 slope" if self.shared else f"{shape[1]} channels: one slope each"
            raise self.error(f"blob 0 (the slopes) holds {self.blobs[0].size} values, expected {wanted} ({what})")
        return [shape]

    def compute(self, x):
        # prelu_layer.cpp: y = max(x, 0) + slope[c] * min(x, 0), c = (i / dim) % channels / div_factor;
        # the slope broadcasts as [C, 1, 1, ...] over axis 1, or is one scalar when channel_shared.
        slope = self.blobs[0].reshape(-1)
        slope = slope[0] if self.shared else slope.reshape((-1,) + (1,) * (x.ndim - 2))
        return _prelu(x, slope, np.maximum(x, FLOAT(0)))

    def forward_in_place(self, x: np.ndarray) -> np.ndarray:
        """compute() written into x (the runner's in-place step)."""
        slope = self.blobs[0].reshape(-1)
        slope = slope[0] if self.shared else slope.reshape((-1,) + (1,) * (x.ndim - 2))
        with np.errstate(**_QUIET):
            negative = np.minimum(x, FLOAT(0))
            return _prelu(x, slope, np.maximum(x, FLOAT(0), out=x), negative)


def _prelu(x, slope, y, negative=None):
    """y (max(x, 0), given) += slope * min(x, 0), in place: Caffe's sum, one temporary.

    Masked multiplications (np.multiply(..., where=x > 0)) gave the same values
    5 times slower: 32 ms against 6.4 ms for 16 x 128 x 56 x 56.
    """
    if negative is None:
        negative = np.minimum(x, FLOAT(0))
    negative *= slope
    y += negative
    return y


@register("ELU")
class ELU(Neuron):
    """ELULayer (elu_layer.cpp)."""

    def setup(self) -> None:
        self.alpha = _scalar(self.param.elu_param.alpha)

    def compute(self, x):
        # elu_layer.cpp: y = max(x, 0) + alpha * (exp(min(x, 0)) - 1); exp of min(x, 0) never overflows.
        return np.maximum(x, FLOAT(0)) + self.alpha * (np.exp(np.minimum(x, FLOAT(0))) - FLOAT(1))


@register("Sigmoid")
class Sigmoid(Neuron):
    """SigmoidLayer (sigmoid_layer.cpp)."""

    def compute(self, x):
        return sigmoid(x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """sigmoid_layer.cpp's sigmoid: 0.5 * tanh(0.5 * x) + 0.5 (the same as 1 / (1 + exp(-x)), and never overflows)."""
    return FLOAT(0.5) * np.tanh(FLOAT(0.5) * x) + FLOAT(0.5)


@register("TanH")
class TanH(Neuron):
    """TanHLayer (tanh_layer.cpp): y = tanh(x)."""

    def compute(self, x):
        return np.tanh(x)


@register("AbsVal")
class AbsVal(Neuron):
    """AbsValLayer (absval_layer.cpp): y = |x|; Caffe refuses to run it in place."""

    def setup(self) -> None:
        # absval_layer.cpp LayerSetUp: CHECK_NE(top[0], bottom[0]) (its backward needs the input).
        top, bottom = list(self.param.top[:1]), list(self.param.bottom[:1])
        if top and top == bottom:
            raise self.error(f"runs in place (top {self.param.top[0]!r} is its bottom); Caffe's AbsVal does not "
                             "allow in-place computation")

    def compute(self, x):
        return np.abs(x)


@register("Power")
class Power(Neuron):
    """PowerLayer (power_layer.cpp): y = (shift + scale * x) ^ power."""

    def setup(self) -> None:
        p = self.param.power_param
        self.power, self.scale, self.shift = _scalar(p.power), _scalar(p.scale), _scalar(p.shift)

    def compute(self, x):
        # power_layer.cpp: where power * scale == 0 the input is ignored: every value is 1 when
        # power == 0, else shift ^ power.
        if self.power * self.scale == 0:
            value = FLOAT(1) if self.power == 0 else np.power(self.shift, self.power)
            return np.full(x.shape, value, dtype=FLOAT)
        # y = (shift + scale * x) ^ power, each step taken only where it changes something, as Caffe does.
        y = x * self.scale if self.scale != 1 else x
        if self.shift != 0:
            y = y + self.shift
        if self.power != 1:
            y = np.power(y, self.power)
        return y.copy() if y is x else y


def _log_base(layer: Layer, base: np.float32) -> np.float32:
    """exp_layer.cpp / log_layer.cpp: ln(base), 1 exactly for base -1 (e); base must be positive."""
    if base == -1:
        return FLOAT(1)
    if not base > 0:
        raise layer.error(f"base is {base:g}: it must be strictly positive (or -1 for e)")
    with np.errstate(**_QUIET):
        log_base = np.log(base)
    if not np.isfinite(log_base):
        raise layer.error(f"base is {base:g}: log(base) = {log_base:g}")
    return log_base


@register("Exp")
class Exp(Neuron):
    """ExpLayer (exp_layer.cpp): y = base ^ (shift + scale * x), base -1 meaning e."""

    def setup(self) -> None:
        p = self.param.exp_param
        base, scale, shift = _scalar(p.base), _scalar(p.scale), _scalar(p.shift)
        # exp_layer.cpp LayerSetUp: y = outer * exp(inner * x) with inner = ln(base) * scale and
        # outer = base ^ shift (exp(shift) for base e; 1 when shift is 0).
        self.inner = _log_base(self, base) * scale
        with np.errstate(**_QUIET):
            if shift == 0:
                self.outer = FLOAT(1)
            else:
                self.outer = np.exp(shift) if base == -1 else np.power(base, shift)

    def compute(self, x):
        y = np.exp(x) if self.inner == 1 else np.exp(x * self.inner)
        if self.outer != 1:
            y *= self.outer
        return y


@register("Log")
class Log(Neuron):
    """LogLayer (log_layer.cpp): y = log_base(shift + scale * x), base -1 meaning e."""

    def setup(self) -> None:
        p = self.param.log_param
        self.scale, self.shift = _scalar(p.scale), _scalar(p.shift)
        log_base = _log_base(self, _scalar(p.base))
        # log_layer.cpp LayerSetUp: base_scale = 1 / ln(base), which must be finite (base 1 is refused).
        with np.errstate(**_QUIET):
            self.base_scale = FLOAT(1) / log_base
        if not np.isfinite(self.base_scale):
            raise self.error(f"base is {p.base:g}: 1 / log(base) = {self.base_scale:g}")

    def compute(self, x):
        # log_layer.cpp: y = ln(shift + scale * x) * (1 / ln(base))
        y = x * self.scale if self.scale != 1 else x
        if self.shift != 0:
            y = y + self.shift
        y = np.log(y)
        if self.base_scale != 1:
            y *= self.base_scale
        return y


@register("BNLL")
class BNLL(Neuron):
    """BNLLLayer (bnll_layer.cpp): the binomial normal log likelihood, log(1 + exp(x))."""

    def compute(self, x):
        # bnll_layer.cpp: y = x > 0 ? x + log(1 + exp(-x)) : log(1 + exp(x)), which never overflows;
        # both branches are max(x, 0) + log(1 + exp(-|x|)).
        return np.maximum(x, FLOAT(0)) + np.log1p(np.exp(-np.abs(x)))


@register("Threshold")
class Threshold(Neuron):
    """ThresholdLayer (threshold_layer.cpp): y = x > threshold ? 1 : 0."""

    def setup(self) -> None:
        self.threshold = _scalar(self.param.threshold_param.threshold)

    def compute(self, x):
        return (x > self.threshold).astype(FLOAT)


@register("Clip")
class Clip(Neuron):
    """ClipLayer (clip_layer.cpp): y = max(min, min(x, max))."""

    def setup(self) -> None:
        p = self.param.clip_param
        self.low, self.high = _scalar(p.min), _scalar(p.max)

    def compute(self, x):
        # clip_layer.cpp: std::max(min, std::min(x, max)); written with Caffe's comparisons so that a
        # NaN input comes out as std::min/std::max give it (min), not as np.clip's NaN.
        y = np.where(self.high < x, self.high, x)
        return np.where(self.low < y, y, self.low)


@register("Swish")
class Swish(Neuron):
    """SwishLayer (swish_layer.cpp): y = x * sigmoid(beta * x)."""

    def setup(self) -> None:
        self.beta = _scalar(self.param.swish_param.beta)

    def compute(self, x):
        return x * sigmoid(x * self.beta)


@register("Dropout")
class Dropout(Neuron):
    """DropoutLayer (dropout_layer.cpp) in the TEST phase: a copy of the input.

    Forks with DropoutParameter.scale_train (false: training left the kept
    values unscaled) multiply by 1 - dropout_ratio at test time instead; that
    field is read where the schema has it.
    """

    def setup(self) -> None:
        p = self.param.dropout_param
        self.ratio = _scalar(p.dropout_ratio)
        self.scale_train = bool(getattr(p, "scale_train", True))

    def compute(self, x):
        # dropout_layer.cpp, TEST: y = x; with scale_train false: y = x * (1 / scale), scale = 1 / (1 - ratio).
        if self.scale_train:
            return x.copy()
        scale = FLOAT(1) / (FLOAT(1) - self.ratio)
        return x * (FLOAT(1) / scale)

    def forward_in_place(self, x: np.ndarray) -> np.ndarray:
        """compute() as Caffe's in-place Dropout: the bottom itself (or scaled in place)."""
        if self.scale_train:
            return x
        return np.multiply(x, FLOAT(1) / (FLOAT(1) / (FLOAT(1) - self.ratio)), out=x)


@register("ReLU6")
class ReLU6(Neuron):
    """The forks' ReLU6 (MobileNet ports; no BVLC file): y = min(max(x, 0), 6)."""

    def compute(self, x):
        return np.minimum(np.maximum(x, FLOAT(0)), FLOAT(6))
