"""The element-wise, normalizing and arithmetic layers as ONNX nodes.

- ReLU: Relu, or LeakyRelu(alpha = negative_slope); PReLU: PRelu with the
  slope as [C, 1, ...] (ONNX broadcasts from the right: a bare [C] would
  meet the last axis), one value when channel_shared; ELU, Sigmoid, TanH,
  AbsVal: Elu, Sigmoid, Tanh, Abs; BNLL: Softplus (log(1 + exp(x))); ReLU6:
  Clip; Clip: Clip (Min then Max, Caffe's order, where min > max), NaN made
  min by Where(IsNaN) as Caffe's comparisons make it; Threshold: Greater, then Cast to float; Swish: x * Sigmoid(beta x);
  Dropout: Identity (the TEST phase; x * (1 - ratio) for the forks'
  scale_train false).
- Power: (shift + scale x) ^ power, each step only where Caffe takes it;
  Exp: outer * exp(inner x) with Caffe's inner = ln(base) scale and outer =
  base ^ shift; Log: ln(shift + scale x) * (1 / ln(base)).
- BatchNorm: BatchNormalization with mean = b0 / s and var = b1 / s in
  float32 (0 when s is 0), scale 1, bias 0 and the layer's eps; NVIDIA
  Caffe's five blobs: mean b0, var b1, eps at least 1e-5, its scale and bias.
  Batch statistics (use_global_stats: false) are refused.
- Scale, Bias: Mul / Add with the operand laid along axis .. axis + num_axes
  ([outer, operand, inner]: trailing ones added), the bias added after.
- Eltwise: SUM with coefficients as Mul by constants then Sum (the sum taken
  in bottom order, as Caffe's), PROD as Mul, MAX as Max.
- LRN ACROSS_CHANNELS: LRN with bias = k, alpha and size as Caffe's (ONNX
  divides alpha by size as Caffe does); WITHIN_CHANNEL decomposed: x * (1 +
  alpha * AveragePool_{n x n, pad (n-1)/2, count_include_pad}(x^2))^-beta.
- MVN: ReduceMean over each image (across_channels) or each channel, and the
  standard deviation plus eps (Caffe's, not the variance's).
- Softmax: Softmax over `axis` (opset 13 and later normalize over one axis).
- Normalize (caffe-ssd): x / sqrt(sum x^2 + eps) over the image or the
  channels, times the scale per channel.
- Reduction: ReduceSum, ReduceL1, ReduceSumSquare or ReduceSum / dim over
  every axis from `axis`, times coeff.
- ArgMax: TopK of the axis reversed (TopK puts the smaller index first among
  equal values, Caffe the larger), the indices read back as dim - 1 - index;
  without `axis` over each image flattened, indices then values with
  out_max_val.
"""

from __future__ import annotations

import numpy as np

from ...net.batchnorm import NVCAFFE_BLOBS, statistics
from ..emit import exporter

FLOAT = np.float32


def _scalar(value) -> np.ndarray:
    return np.asarray(value, dtype=FLOAT)


def _caffe_rectified(e, slope: str, exp: bool = False) -> None:
    """Caffe's own form, max(x, 0) + slope * min(x, 0) (ELU: slope * (exp(min(x, 0)) - 1)), written out.

    ONNX's LeakyRelu, PRelu and Elu take x where x > 0 whatever the slope;
    Caffe's sum makes an infinite or NaN slope times 0 a NaN there. Used only
    for such a slope: with a finite one both forms are equal.
    """
    zero = e.constant("zero", _scalar(0.0))
    positive = e.node("Max", [e.inputs[0], zero], [e.temp("positive")])[0]
    negative = e.node("Min", [e.inputs[0], zero], [e.temp("negative")])[0]
    if exp:
        grown = e.node("Exp", [negative], [e.temp("exp")])[0]
        negative = e.node("Sub", [grown, e.constant("one", _scalar(1.0))], [e.temp("expm1")])[0]
    scaled = e.node("Mul", [slope, negative], [e.temp("scaled")])[0]
    e.node("Add", [positive, scaled], e.outputs)


@exporter("ReLU")
def relu(e) -> None:
    if e.layer.slope == 0:
        e.node("Relu", e.inputs, e.outputs)
    elif not np.isfinite(np.float32(e.layer.slope)):
        _caffe_rectified(e, e.constant("slope", _scalar(e.layer.slope)))
    else:
        e.node("LeakyRelu", e.inputs, e.outputs, alpha=float(e.layer.slope))


@exporter("PReLU")
def prelu(e) -> None:
    ndim = len(e.bottom_shapes[0])
    if e.layer.shared:
        slope = e.blob(0, (1,))
    else:
        slope = e.blob(0, (e.layer.blobs[0].size,) + (1,) * (ndim - 2))
    if not np.isfinite(e.layer.blobs[0]).all():
        _caffe_rectified(e, slope)
        return
    e.node("PRelu", [e.inputs[0], slope], e.outputs)


@exporter("ELU")
def elu(e) -> None:
    if not np.isfinite(np.float32(e.layer.alpha)):
        _caffe_rectified(e, e.constant("alpha", _scalar(e.layer.alpha)), exp=True)
        return
    e.node("Elu", e.inputs, e.outputs, alpha=float(e.layer.alpha))


@exporter("Sigmoid", "TanH", "AbsVal", "BNLL")
def unary(e) -> None:
    op = {"Sigmoid": "Sigmoid", "TanH": "Tanh", "AbsVal": "Abs", "BNLL": "Softplus"}[e.layer.type]
    e.node(op, e.inputs, e.outputs)


@exporter("Clip", "ReLU6")
def clip(e) -> None:
    if e.layer.type == "ReLU6":
        # The forks' min(max(x, 0), 6), NaN kept: ONNX's Clip.
        e.node("Clip", [e.inputs[0], e.constant("min", _scalar(0.0)), e.constant("max", _scalar(6.0))], e.outputs)
        return
    low, high = float(e.layer.low), float(e.layer.high)
    minimum = e.constant("min", _scalar(low))
    if np.isnan(low):
        # std::max(NaN, y) is its first argument: NaN everywhere (x * 0 + NaN keeps x's shape).
        zeroed = e.node("Mul", [e.inputs[0], e.constant("zero", _scalar(0.0))], [e.temp("zeroed")])[0]
        e.node("Add", [zeroed, minimum], e.outputs)
        return
    if np.isnan(high):
        # std::min(x, NaN) is x: max(min, x), NaN made min as below.
        clipped = e.node("Max", [e.inputs[0], minimum], [e.temp("clipped")])[0]
    elif low > high:
        # Caffe's max(min, min(x, max)) is min everywhere; ONNX's Clip gives max there: Caffe's order, written out.
        below = e.node("Min", [e.inputs[0], e.constant("max", _scalar(high))], [e.temp("below")])[0]
        clipped = e.node("Max", [below, minimum], [e.temp("clipped")])[0]
    else:
        clipped = e.node("Clip", [e.inputs[0], minimum, e.constant("max", _scalar(high))], [e.temp("clipped")])[0]
    # clip_layer.cpp's std::max(min, std::min(x, max)) turns NaN into min (both comparisons are false);
    # ONNX's Clip, Min and Max keep it.
    nan = e.node("IsNaN", [e.inputs[0]], [e.temp("nan")])[0]
    e.node("Where", [nan, minimum, clipped], e.outputs)


@exporter("Threshold")
def threshold(e) -> None:
    above = e.node("Greater", [e.inputs[0], e.constant("threshold", _scalar(e.layer.threshold))],
                   [e.temp("above")])[0]
    e.node("Cast", [above], e.outputs, to=1)


@exporter("Swish")
def swish(e) -> None:
    x = e.inputs[0]
    scaled = x if e.layer.beta == 1 else e.node("Mul", [x, e.constant("beta", _scalar(e.layer.beta))],
                                                [e.temp("scaled")])[0]
    gate = e.node("Sigmoid", [scaled], [e.temp("gate")])[0]
    e.node("Mul", [x, gate], e.outputs)


@exporter("Dropout")
def dropout(e) -> None:
    if e.layer.scale_train:
        e.node("Identity", e.inputs, e.outputs)
        return
    scale = FLOAT(1) / (FLOAT(1) / (FLOAT(1) - e.layer.ratio))
    e.node("Mul", [e.inputs[0], e.constant("keep", _scalar(scale))], e.outputs)


def _chain(e, x: str, steps: list) -> None:
    """Apply (op, constant name, value) steps in order, the last writing the layer's top (Identity if none)."""
    if not steps:
        e.node("Identity", [x], e.outputs)
        return
    for k, (op, what, value) in enumerate(steps):
        out = e.outputs[0] if k == len(steps) - 1 else e.temp(what)
        if value is None:
            e.node(op, [x], [out])
        else:
            e.node(op, [x, e.constant(what, _scalar(value))], [out])
        x = out


def _affine(layer) -> list:
    """The steps of shift + scale * x that Power and Log take, each only where it changes something."""
    steps = []
    if layer.scale != 1:
        steps.append(("Mul", "scale", layer.scale))
    if layer.shift != 0:
        steps.append(("Add", "shift", layer.shift))
    return steps


@exporter("Power")
def power(e) -> None:
    layer = e.layer
    if layer.power * layer.scale == 0:
        # power_layer.cpp: the input is ignored; every value is 1 (power 0) or shift ^ power.
        value = FLOAT(1) if layer.power == 0 else np.power(layer.shift, layer.power)
        # Not x * 0 + value: that is NaN where x is infinite, and Caffe never reads x here.
        e.node("Expand", [e.constant("value", _scalar(value)), e.shape_constant("shape", e.top_shapes[0])],
               e.outputs)
        return
    steps = _affine(layer)
    if layer.power != 1:
        steps.append(("Pow", "power", layer.power))
    _chain(e, e.inputs[0], steps)


@exporter("Exp")
def exp(e) -> None:
    layer = e.layer
    steps = [] if layer.inner == 1 else [("Mul", "inner", layer.inner)]
    steps.append(("Exp", "exp", None))
    if layer.outer != 1:
        steps.append(("Mul", "outer", layer.outer))
    _chain(e, e.inputs[0], steps)


@exporter("Log")
def log(e) -> None:
    layer = e.layer
    steps = _affine(layer)
    steps.append(("Log", "log", None))
    if layer.base_scale != 1:
        steps.append(("Mul", "base_scale", layer.base_scale))
    _chain(e, e.inputs[0], steps)


@exporter("BatchNorm")
def batch_norm(e) -> None:
    layer = e.layer
    b = [blob.reshape(-1) for blob in layer.blobs]
    channels = e.bottom_shapes[0][1]
    if len(b) == NVCAFFE_BLOBS:
        scale, bias = b[3], b[4]
    else:
        if not layer.global_stats:
            raise e.refuse("use_global_stats: false normalizes with each batch's own statistics, which an "
                           "exported net does not compute")
        scale, bias = np.ones(channels, FLOAT), np.zeros(channels, FLOAT)
    mean, var, eps = statistics(b, layer.eps, FLOAT)
    e.node("BatchNormalization", [e.inputs[0], e.constant("scale", scale), e.constant("bias", bias),
                                  e.constant("mean", mean), e.constant("var", var)], e.outputs, epsilon=float(eps))


def _laid(e, k_or_name, axis: int, length: int, ndim: int, suffix: str, *, blob: bool = True) -> str:
    """An operand of Scale or Bias shaped [its axes] + [1] * inner, as an initializer (blob k) or a Reshape."""
    shape = tuple(e.bottom_shapes[0][axis:axis + length]) + (1,) * (ndim - axis - length)
    if blob:
        return e.blob(k_or_name, shape)
    return e.node("Reshape", [k_or_name, e.shape_constant(f"{suffix}_shape", shape)], [e.temp(suffix)])[0]


@exporter("Scale", "Bias")
def scale_or_bias(e) -> None:
    layer = e.layer
    start, length = layer.span
    ndim = len(e.bottom_shapes[0])
    two = len(e.inputs) > 1
    x = e.inputs[0]
    if layer.type == "Bias":
        operand = _laid(e, e.inputs[1], start, length, ndim, "bias", blob=False) if two else \
            _laid(e, 0, start, length, ndim, "bias")
        e.node("Add", [x, operand], e.outputs)
        return
    factor = _laid(e, e.inputs[1], start, length, ndim, "scale", blob=False) if two else \
        _laid(e, 0, start, length, ndim, "scale")
    if not layer.param.scale_param.bias_term:
        e.node("Mul", [x, factor], e.outputs)
        return
    product = e.node("Mul", [x, factor], [e.temp("scaled")])[0]
    e.node("Add", [product, _laid(e, len(layer.blobs) - 1, start, length, ndim, "bias")], e.outputs)


@exporter("Eltwise")
def eltwise(e) -> None:
    layer = e.layer
    if layer.op == 0:  # PROD
        x = e.inputs[0]
        for k, other in enumerate(e.inputs[1:], 1):
            out = e.outputs[0] if k == len(e.inputs) - 1 else e.temp(f"product{k}")
            e.node("Mul", [x, other], [out])
            x = out
    elif layer.op == 1:  # SUM
        coeffs = layer.coeffs or [FLOAT(1)] * len(e.inputs)
        terms = [x if c == 1 else e.node("Mul", [x, e.constant(f"coeff{k}", _scalar(c))], [e.temp(f"term{k}")])[0]
                 for k, (x, c) in enumerate(zip(e.inputs, coeffs))]
        # Added one after the other in bottom order, as Caffe's axpy loop.
        x = terms[0]
        for k, term in enumerate(terms[1:], 1):
            out = e.outputs[0] if k == len(terms) - 1 else e.temp(f"sum{k}")
            e.node("Add", [x, term], [out])
            x = out
    else:
        e.node("Max", e.inputs, e.outputs)


@exporter("LRN")
def lrn(e) -> None:
    layer = e.layer
    x = e.inputs[0]
    if layer.region == 0:  # ACROSS_CHANNELS
        e.node("LRN", [x], e.outputs, size=int(layer.size), alpha=float(layer.alpha), beta=float(layer.beta),
               bias=float(layer.k))
        return
    pad = layer.pre_pad
    squares = e.node("Mul", [x, x], [e.temp("squares")])[0]
    average = e.node("AveragePool", [squares], [e.temp("average")], kernel_shape=[layer.size, layer.size],
                     strides=[1, 1], pads=[pad, pad, pad, pad], count_include_pad=1)[0]
    scaled = e.node("Mul", [average, e.constant("alpha", _scalar(layer.alpha))], [e.temp("scaled")])[0]
    shifted = e.node("Add", [scaled, e.constant("one", _scalar(1))], [e.temp("shifted")])[0]
    factor = e.node("Pow", [shifted, e.constant("minus_beta", _scalar(-layer.beta))], [e.temp("factor")])[0]
    e.node("Mul", [x, factor], e.outputs)


@exporter("MVN")
def mvn(e) -> None:
    layer = e.layer
    shape = e.bottom_shapes[0]
    top = e.top_shapes[0]
    x = e.inputs[0]
    if tuple(shape) != tuple(top):
        x = e.node("Reshape", [x, e.shape_constant("legacy", top)], [e.temp("legacy")])[0]
    axes = list(range(1, len(top))) if layer.across_channels else list(range(2, len(top)))
    mean = e.reduce("ReduceMean", x, axes, e.temp("mean"))
    centred_out = e.outputs[0] if not layer.normalize_variance else e.temp("centred")
    centred = e.node("Sub", [x, mean], [centred_out])[0]
    if not layer.normalize_variance:
        return
    squares = e.node("Mul", [centred, centred], [e.temp("squares")])[0]
    variance = e.reduce("ReduceMean", squares, axes, e.temp("variance"))
    std = e.node("Sqrt", [variance], [e.temp("std")])[0]
    denominator = e.node("Add", [std, e.constant("eps", _scalar(layer.eps))], [e.temp("denominator")])[0]
    e.node("Div", [centred, denominator], e.outputs)


@exporter("Softmax")
def softmax(e) -> None:
    axis = e.layer.axis(e.layer.param.softmax_param.axis, len(e.bottom_shapes[0]))
    e.node("Softmax", e.inputs, e.outputs, axis=axis)


@exporter("Normalize")
def normalize(e) -> None:
    layer = e.layer
    shape = e.bottom_shapes[0]
    ndim = len(shape)
    x = e.inputs[0]
    squares = e.node("Mul", [x, x], [e.temp("squares")])[0]
    axes = list(range(1, ndim)) if layer.across_spatial else [1]
    total = e.reduce("ReduceSum", squares, axes, e.temp("sum"))
    norm = e.node("Sqrt", [e.node("Add", [total, e.constant("eps", _scalar(layer.eps))], [e.temp("sum_eps")])[0]],
                  [e.temp("norm")])[0]
    if layer.across_spatial:
        # normalize_layer.cpp across_spatial: x * (1 / norm)
        inverse = e.node("Reciprocal", [norm], [e.temp("inverse")])[0]
        unit = e.node("Mul", [x, inverse], [e.temp("unit")])[0]
    else:
        unit = e.node("Div", [x, norm], [e.temp("unit")])[0]
    scale = e.blob(0, (1,)) if layer.channel_shared else e.blob(0, (shape[1],) + (1,) * (ndim - 2))
    e.node("Mul", [unit, scale], e.outputs)


@exporter("Reduction")
def reduction(e) -> None:
    layer = e.layer
    shape = e.bottom_shapes[0]
    axis = layer.axis(layer.param.reduction_param.axis, len(shape))
    axes = list(range(axis, len(shape)))
    op = {1: "ReduceSum", 2: "ReduceL1", 3: "ReduceSumSquare", 4: "ReduceSum"}[layer.op]
    dim = int(np.prod(shape[axis:], dtype=np.int64))
    coeff = layer.coeff / FLOAT(dim) if layer.op == 4 else layer.coeff
    if not axes:  # nothing to reduce: each value times coeff
        reduced = e.inputs[0]
    else:
        reduced = e.reduce(op, e.inputs[0], axes, e.temp("reduced") if coeff != 1 else e.outputs[0], keepdims=0)
    if coeff != 1:
        e.node("Mul", [reduced, e.constant("coeff", _scalar(coeff))], e.outputs)
    elif not axes:
        e.node("Identity", [reduced], e.outputs)


@exporter("ArgMax")
def argmax(e) -> None:
    layer = e.layer
    shape = e.bottom_shapes[0]
    x = e.inputs[0]
    if layer.has_axis:
        axis = layer.axis(layer.param.argmax_param.axis, len(shape))
    else:
        # Over each image's values flattened: (N, count(1)).
        axis = 1
        x = e.node("Reshape", [x, e.shape_constant("rows", [shape[0], -1])], [e.temp("rows")])[0]
    dim = shape[axis] if layer.has_axis else int(np.prod(shape[1:], dtype=np.int64))
    # TopK puts the smaller index first among equal values, Caffe's std::greater on (value, index)
    # the larger: TopK of the axis reversed, its indices read back as dim - 1 - index.
    reversed_x = e.node("Slice", [x, e.shape_constant("rev_starts", [dim - 1]), e.shape_constant("rev_ends",
                                                                                              [-(dim + 1)]),
                                  e.shape_constant("rev_axes", [axis]), e.shape_constant("rev_steps", [-1])],
                        [e.temp("reversed")])[0]
    values, order = e.node("TopK", [reversed_x, e.shape_constant("k", [layer.top_k])],
                           [e.temp("values"), e.temp("order")], axis=axis, largest=1, sorted=1)
    order_float = e.node("Cast", [order], [e.temp("order_float")], to=1)[0]
    top = list(e.top_shapes[0])
    if layer.has_axis:
        if layer.out_max_val:
            e.node("Identity", [values], e.outputs)
        else:
            e.node("Sub", [e.constant("last", _scalar(dim - 1)), order_float], e.outputs)
        return
    if not layer.out_max_val:
        index = e.node("Sub", [e.constant("last", _scalar(dim - 1)), order_float], [e.temp("index")])[0]
        e.node("Reshape", [index, e.shape_constant("top", top)], e.outputs)
        return
    index = e.node("Sub", [e.constant("last", _scalar(dim - 1)), order_float], [e.temp("index")])[0]
    # top[n] = [the k indices, the k values]
    both = e.node("Concat", [index, values], [e.temp("both")], axis=1)[0]
    e.node("Reshape", [both, e.shape_constant("top", top)], e.outputs)
