"""The element-wise, normalizing and arithmetic layers (blobtool/layers/neuron.py, normalize.py, arith.py).

Each case is a small net run by blobtool and by OpenCV 4.x's Caffe importer
(the independent oracle, tests/caffenets.py), compared on every blob. Where
OpenCV departs from Caffe or lacks the layer, the case is checked instead
against a loop-by-loop definition below, written from Caffe's source in
float64. Where OpenCV 4.14 departs (measured by these cases):

- no ArgMax, Bias, Reduction, Threshold or Clip layer;
- LRN ignores `k` (k == 1 is compared with OpenCV, other k with the loops),
  and takes alpha as 1e-4 where the prototxt leaves it out (Caffe: 1);
- MVN adds eps to the variance, Caffe to the standard deviation (a tiny eps is
  compared with OpenCV, a large one with the loops);
- Swish has no `beta`, Log no `base`, `scale` or `shift` (the defaults are
  compared with OpenCV, the rest with the loops);
- BatchNorm refuses use_global_stats false (a batch over 1) and NVIDIA Caffe's
  five blobs; Eltwise refuses coeff with MAX (Caffe leaves them unused);
- a blob of no axes (Caffe's shape of a shared PReLU slope, of a scalar
  Scale) cannot be read: OpenCV gets the value as shape (1,), the loops as ();
- Scale misreads a negative axis and fails on two bottoms with bias_term;
  Normalize refuses across_spatial with one scale per channel.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from caffenets import layer, max_scaled_difference, net, opencv_forward, ours_forward, write_net_files

from blobtool.layers import LayerError

TOLERANCE = 1e-4
SHAPE = (2, 3, 5, 7)


# -- running a case ---------------------------------------------------------------------------


def _tops(message) -> list:
    """Every blob the net's layers write, in order."""
    return list(dict.fromkeys(top for each in message.layer for top in each.top))


def _feeds(inputs: dict, seed: int, feed=None) -> dict:
    rng = np.random.default_rng(seed)
    made = {}
    for name, shape in inputs.items():
        values = (feed(rng, shape) if feed else rng.standard_normal(shape) * 2).astype(np.float32)
        made[name] = values
    return made


def against_opencv(tmp_path, layers, inputs: dict, seed: int = 0, feed=None) -> dict:
    """Run the net both ways; assert every blob agrees within TOLERANCE; blobtool's values back."""
    message = net(layers, inputs)
    feeds = _feeds(inputs, seed, feed)
    tops = _tops(message)
    ours = ours_forward(message, feeds, tops)
    theirs = opencv_forward(*write_net_files(tmp_path, message), feeds, tops, definition=message)
    for top in tops:
        difference = max_scaled_difference(ours[top], theirs[top])
        assert difference <= TOLERANCE, f"{top}: {difference:.3g} from OpenCV"
    return ours


def against_definition(layers, inputs: dict, expected, seed: int = 0, feed=None) -> None:
    """Run the net with blobtool; assert its last top agrees with `expected(feeds)` (the loop definition)."""
    message = net(layers, inputs)
    feeds = _feeds(inputs, seed, feed)
    top = _tops(message)[-1]
    ours = ours_forward(message, feeds, [top])[top]
    wanted = np.asarray(expected(feeds), np.float64)
    assert ours.dtype == np.float32 and ours.flags.c_contiguous
    difference = max_scaled_difference(ours, wanted)
    assert difference <= TOLERANCE, f"{top}: {difference:.3g} from the definition"


def positive(low=0.1, high=3.0):
    return lambda rng, shape: rng.uniform(low, high, shape)


def integers(low=-3, high=4):
    """Small integers: many ties."""
    return lambda rng, shape: rng.integers(low, high, shape).astype(np.float64)


def wide(rng, shape):
    """Values out to +-80: exp overflows float32 past 88, BNLL's stable form must hold."""
    return rng.uniform(-80, 80, shape)


# -- loop definitions from Caffe's source (float64) --------------------------------------------


def _index_loops(shape):
    return np.ndindex(*shape)


def loop_elementwise(x, f):
    """Apply f to each value, one at a time."""
    x = np.asarray(x, np.float64)
    y = np.empty_like(x)
    for index in _index_loops(x.shape):
        y[index] = f(float(x[index]))
    return y


def loop_swish(x, beta):
    # swish_layer.cpp: x * sigmoid(beta * x), sigmoid(v) = 0.5 * tanh(0.5 * v) + 0.5
    return loop_elementwise(x, lambda v: v * (0.5 * math.tanh(0.5 * beta * v) + 0.5))


def loop_threshold(x, threshold):
    # threshold_layer.cpp: x > threshold ? 1 : 0
    return loop_elementwise(x, lambda v: 1.0 if v > threshold else 0.0)


def loop_clip(x, low, high):
    # clip_layer.cpp: std::max(min, std::min(x, max))
    return loop_elementwise(x, lambda v: max(low, min(v, high)))


def loop_log(x, base, scale, shift):
    # log_layer.cpp: log_base(shift + scale * x), base -1 meaning e
    b = math.e if base == -1 else base
    return loop_elementwise(x, lambda v: math.log(shift + scale * v) / math.log(b))


def loop_lrn_across(x, size, alpha, beta, k):
    # lrn_layer.cpp CrossChannelForward_cpu: scale = k + alpha / size * sum over the window of x^2
    num, channels, height, width = x.shape
    pre_pad = (size - 1) // 2
    y = np.empty(x.shape)
    for n, c, h, w in _index_loops(x.shape):
        total = 0.0
        for cc in range(c - pre_pad, c - pre_pad + size):
            if 0 <= cc < channels:
                total += float(x[n, cc, h, w]) ** 2
        scale = k + alpha / size * total
        y[n, c, h, w] = x[n, c, h, w] * scale ** -beta
    return y


def loop_ave_pool(x, kernel, pad):
    # pooling_layer.cpp AVE, stride 1: the window clipped to image + pad sets the divisor,
    # then clipped to the image for the sum.
    num, channels, height, width = x.shape
    out_h = int(math.ceil((height + 2 * pad - kernel) / 1)) + 1
    out_w = int(math.ceil((width + 2 * pad - kernel) / 1)) + 1
    y = np.empty((num, channels, out_h, out_w))
    for n, c, ph, pw in _index_loops(y.shape):
        hstart, wstart = ph - pad, pw - pad
        hend, wend = min(hstart + kernel, height + pad), min(wstart + kernel, width + pad)
        pool_size = (hend - hstart) * (wend - wstart)
        hstart, wstart = max(hstart, 0), max(wstart, 0)
        hend, wend = min(hend, height), min(wend, width)
        total = sum(float(x[n, c, h, w]) for h in range(hstart, hend) for w in range(wstart, wend))
        y[n, c, ph, pw] = total / pool_size
    return y


def loop_lrn_within(x, size, alpha, beta):
    # lrn_layer.cpp WithinChannelForward: x * (1 + alpha * AVE_pool(x^2, size, pad (size-1)/2))^-beta
    pooled = loop_ave_pool(np.asarray(x, np.float64) ** 2, size, (size - 1) // 2)
    return x * (1 + alpha * pooled) ** -beta


def loop_mvn(x, normalize_variance, across_channels, eps):
    # mvn_layer.cpp: rows of N (across_channels) or N * C; y = (x - mean) / (sqrt(var) + eps)
    shape = tuple(x.shape) + (1,) * (4 - x.ndim)
    x = np.asarray(x, np.float64).reshape(shape)
    rows = shape[0] if across_channels else shape[0] * shape[1]
    flat = x.reshape(rows, -1)
    y = np.empty_like(flat)
    for r in range(rows):
        values = [float(v) for v in flat[r]]
        mean = sum(values) / len(values)
        variance = sum((v - mean) ** 2 for v in values) / len(values)
        for i, v in enumerate(values):
            y[r, i] = (v - mean) / (math.sqrt(variance) + eps) if normalize_variance else v - mean
    return y.reshape(shape)


def loop_batch_norm_batch_stats(x, eps):
    # batch_norm_layer.cpp, use_global_stats false: each channel's mean and variance over the batch
    num, channels = x.shape[:2]
    y = np.empty(x.shape)
    for c in range(channels):
        values = [float(v) for v in np.asarray(x[:, c]).reshape(-1)]
        mean = sum(values) / len(values)
        variance = sum((v - mean) ** 2 for v in values) / len(values)
        y[:, c] = (x[:, c] - mean) / math.sqrt(variance + eps)
    return y


def loop_batch_norm_nvcaffe(x, mean, variance, scale, bias, eps):
    # NVIDIA Caffe batch_norm_layer.cpp, TEST: (x - mean) * (var + max(eps, 1e-5))^-0.5 * scale + bias
    eps = max(eps, 1e-5)
    y = np.empty(x.shape)
    for index in _index_loops(x.shape):
        c = index[1]
        y[index] = (x[index] - mean[c]) / math.sqrt(variance[c] + eps) * scale[c] + bias[c]
    return y


def loop_scale_bias(x, scale, bias, axis, length):
    # scale_layer.cpp then bias_layer.cpp: top[n, d, i] = bottom[n, d, i] * scale[d] + bias[d]
    # over outer n, operand d, inner i (either operand None: left out)
    x = np.asarray(x, np.float64)
    operand = np.asarray(scale if scale is not None else bias).reshape(-1)
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    inner = int(np.prod(x.shape[axis + length:], dtype=np.int64))
    flat = x.reshape(-1)
    y = np.empty_like(flat)
    for n in range(outer):
        for d in range(operand.size):
            for i in range(inner):
                position = (n * operand.size + d) * inner + i
                value = flat[position]
                if scale is not None:
                    value *= float(np.asarray(scale).reshape(-1)[d])
                if bias is not None:
                    value += float(np.asarray(bias).reshape(-1)[d])
                y[position] = value
    return y.reshape(x.shape)


def loop_normalize(x, scale, across_spatial, channel_shared, eps):
    # caffe-ssd normalize_layer.cpp: across_spatial: x / sqrt(sum over the image of x^2 + eps);
    # otherwise x / sqrt(eps + sum over channels of x^2) at each position; then * scale (shared or [c])
    num, channels = x.shape[:2]
    flat = np.asarray(x, np.float64).reshape(num, channels, -1)
    scale = np.asarray(scale, np.float64).reshape(-1)
    y = np.empty_like(flat)
    for n in range(num):
        if across_spatial:
            norm = math.sqrt(sum(float(v) ** 2 for v in flat[n].reshape(-1)) + eps)
        for c in range(channels):
            for s in range(flat.shape[2]):
                if not across_spatial:
                    norm = math.sqrt(eps + sum(float(flat[n, cc, s]) ** 2 for cc in range(channels)))
                y[n, c, s] = flat[n, c, s] / norm * (scale[0] if channel_shared else scale[c])
    return y.reshape(x.shape)


def loop_reduction(x, op, axis, coeff):
    # reduction_layer.cpp: num = count(0, axis) rows of dim = count(axis); SUM, ASUM, SUMSQ, MEAN; * coeff
    axis = axis % x.ndim
    rows = np.asarray(x, np.float64).reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)
    y = np.empty(rows.shape[0])
    for i, row in enumerate(rows):
        if op == 2:
            total = sum(abs(float(v)) for v in row)
        elif op == 3:
            total = sum(float(v) * float(v) for v in row)
        else:
            total = sum(float(v) for v in row)
        y[i] = total * (coeff / len(row) if op == 4 else coeff)
    return y.reshape(x.shape[:axis])


def loop_argmax(x, top_k, out_max_val, axis):
    # argmax_layer.cpp Forward_cpu, its index arithmetic as written; pairs sorted by std::greater
    x = np.asarray(x, np.float64)
    flat = x.reshape(-1)
    if axis is not None:
        axis = axis % x.ndim
        dim, axis_dist = x.shape[axis], int(np.prod(x.shape[axis:])) // x.shape[axis]
        top_shape = x.shape[:axis] + (top_k,) + x.shape[axis + 1:]
    else:
        dim, axis_dist = int(np.prod(x.shape[1:])), 1
        top_shape = [1] * max(x.ndim, 3)
        top_shape[0], top_shape[2] = x.shape[0], top_k
        if out_max_val:
            top_shape[1] = 2
    top = np.zeros(int(np.prod(top_shape)))
    num = flat.size // dim
    for i in range(num):
        pairs = [(flat[(i // axis_dist * dim + j) * axis_dist + i % axis_dist], j) for j in range(dim)]
        pairs.sort(reverse=True)
        for j in range(top_k):
            if out_max_val and axis is not None:
                top[(i // axis_dist * top_k + j) * axis_dist + i % axis_dist] = pairs[j][0]
            elif out_max_val:
                top[2 * i * top_k + j] = pairs[j][1]
                top[2 * i * top_k + top_k + j] = pairs[j][0]
            else:
                top[(i // axis_dist * top_k + j) * axis_dist + i % axis_dist] = pairs[j][1]
    return top.reshape(top_shape)


# -- neuron.py --------------------------------------------------------------------------------

# (id, type, params, input shape, feed); every one compared with OpenCV.
NEURONS_WITH_OPENCV = [
    ("relu", "ReLU", {}, SHAPE, None),
    ("relu-2d", "ReLU", {}, (3, 7), None),
    ("relu-leaky-0.1", "ReLU", {"relu_param": {"negative_slope": 0.1}}, SHAPE, None),
    ("relu-leaky-neg0.3", "ReLU", {"relu_param": {"negative_slope": -0.3}}, (1, 5, 3, 9), None),
    ("elu-alpha1", "ELU", {}, SHAPE, None),
    ("elu-alpha0.5", "ELU", {"elu_param": {"alpha": 0.5}}, SHAPE, None),
    ("elu-alpha2", "ELU", {"elu_param": {"alpha": 2.0}}, (3, 7), None),
    ("sigmoid", "Sigmoid", {}, SHAPE, wide),
    ("tanh", "TanH", {}, (3, 7, 5), None),
    ("absval", "AbsVal", {}, SHAPE, None),
    ("bnll", "BNLL", {}, SHAPE, None),
    ("bnll-wide", "BNLL", {}, SHAPE, wide),
    ("relu6", "ReLU6", {}, SHAPE, lambda rng, shape: rng.uniform(-9, 9, shape)),
    ("power-identity", "Power", {}, SHAPE, None),
    ("power-square", "Power", {"power_param": {"power": 2.0}}, SHAPE, None),
    ("power-2-0.5-1", "Power", {"power_param": {"power": 2.0, "scale": 0.5, "shift": 1.0}}, SHAPE, None),
    ("power-0.5-2-3", "Power", {"power_param": {"power": 0.5, "scale": 2.0, "shift": 3.0}}, SHAPE, positive()),
    ("power-3-neg1-0.5", "Power", {"power_param": {"power": 3.0, "scale": -1.0, "shift": 0.5}}, (2, 5, 3), None),
    ("power-neg1-1-4", "Power", {"power_param": {"power": -1.0, "shift": 4.0}}, SHAPE, positive()),
    ("power-scale0", "Power", {"power_param": {"power": 2.0, "scale": 0.0, "shift": 3.0}}, SHAPE, None),
    ("power-power0", "Power", {"power_param": {"power": 0.0, "scale": 2.0, "shift": 3.0}}, SHAPE, None),
    ("exp-e", "Exp", {}, SHAPE, None),
    ("exp-e-0.3-neg0.5", "Exp", {"exp_param": {"scale": 0.3, "shift": -0.5}}, SHAPE, None),
    ("exp-e-shift", "Exp", {"exp_param": {"shift": 0.75}}, SHAPE, None),
    ("exp-base2-0.5-1", "Exp", {"exp_param": {"base": 2.0, "scale": 0.5, "shift": 1.0}}, SHAPE, None),
    ("exp-base10-neg0.2", "Exp", {"exp_param": {"base": 10.0, "scale": -0.2}}, (3, 7), None),
    ("log-e", "Log", {}, SHAPE, positive()),
    ("dropout", "Dropout", {}, SHAPE, None),
    ("dropout-0.3", "Dropout", {"dropout_param": {"dropout_ratio": 0.3}}, (3, 11), None),
    ("swish-beta1", "Swish", {}, SHAPE, None),
]


@pytest.mark.parametrize("kind, params, shape, feed", [case[1:] for case in NEURONS_WITH_OPENCV],
                         ids=[case[0] for case in NEURONS_WITH_OPENCV])
def test_neuron_against_opencv(tmp_path, kind, params, shape, feed):
    against_opencv(tmp_path, [layer("a", kind, "data", "a", **params)], {"data": shape}, feed=feed)


PRELU_CASES = [
    ("per-channel", False, SHAPE),
    ("shared", True, SHAPE),
    ("per-channel-2d", False, (4, 5)),
    ("per-channel-3d", False, (2, 5, 3)),
]


@pytest.mark.parametrize("shared, shape", [case[1:] for case in PRELU_CASES], ids=[case[0] for case in PRELU_CASES])
def test_prelu_against_opencv(tmp_path, shared, shape):
    # A shared slope as (1,): OpenCV cannot read Caffe's shape () (test_prelu_shared_scalar_slope).
    slopes = np.linspace(-0.5, 0.75, 1 if shared else shape[1])
    layers = [layer("p", "PReLU", "data", "p", blobs=[slopes], prelu_param={"channel_shared": shared})]
    against_opencv(tmp_path, layers, {"data": shape})


def test_prelu_shared_scalar_slope():
    """channel_shared: Caffe's slope blob has shape () (prelu_layer.cpp: vector<int>(0))."""
    layers = [layer("p", "PReLU", "data", "p", blobs=[np.array(-0.3)], prelu_param={"channel_shared": True})]
    # prelu_layer.cpp: max(x, 0) + slope * min(x, 0)
    against_definition(layers, {"data": SHAPE},
                       lambda feeds: loop_elementwise(feeds["data"], lambda v: max(v, 0.0) - 0.3 * min(v, 0.0)))


def test_in_place_chain_against_opencv(tmp_path):
    """Layers that write their bottom (Caffe's in-place tops): each later one reads the earlier's output."""
    layers = [layer("conv_like", "Power", "data", "x", power_param={"scale": 1.5, "shift": -0.25}),
              layer("relu", "ReLU", "x", "x", relu_param={"negative_slope": 0.2}),
              layer("drop", "Dropout", "x", "x"),
              layer("tanh", "TanH", "x", "y")]
    against_opencv(tmp_path, layers, {"data": SHAPE})


# (id, type, params, shape, feed, definition(x)); where OpenCV departs or lacks the layer.
NEURONS_WITH_DEFINITION = [
    ("swish-beta0.5", "Swish", {"swish_param": {"beta": 0.5}}, SHAPE, None, lambda x: loop_swish(x, 0.5)),
    ("swish-beta2", "Swish", {"swish_param": {"beta": 2.0}}, (2, 5, 3), None, lambda x: loop_swish(x, 2.0)),
    ("threshold-0", "Threshold", {}, SHAPE, integers(), lambda x: loop_threshold(x, 0.0)),
    ("threshold-0.3", "Threshold", {"threshold_param": {"threshold": 0.3}}, SHAPE, None,
     lambda x: loop_threshold(x, 0.3)),
    ("threshold-neg1", "Threshold", {"threshold_param": {"threshold": -1.0}}, SHAPE, integers(),
     lambda x: loop_threshold(x, -1.0)),
    ("clip-neg1-1", "Clip", {"clip_param": {"min": -1.0, "max": 1.0}}, SHAPE, None, lambda x: loop_clip(x, -1, 1)),
    ("clip-neg0.5-2.5", "Clip", {"clip_param": {"min": -0.5, "max": 2.5}}, (3, 7), None,
     lambda x: loop_clip(x, -0.5, 2.5)),
    ("log-e-0.5-3", "Log", {"log_param": {"scale": 0.5, "shift": 3.0}}, SHAPE, positive(),
     lambda x: loop_log(x, -1, 0.5, 3.0)),
    ("log-base2-0.5-3", "Log", {"log_param": {"base": 2.0, "scale": 0.5, "shift": 3.0}}, SHAPE, positive(),
     lambda x: loop_log(x, 2.0, 0.5, 3.0)),
    ("log-base10-2-1", "Log", {"log_param": {"base": 10.0, "scale": 2.0, "shift": 1.0}}, SHAPE, positive(),
     lambda x: loop_log(x, 10.0, 2.0, 1.0)),
    ("log-base0.5", "Log", {"log_param": {"base": 0.5}}, (3, 7), positive(), lambda x: loop_log(x, 0.5, 1.0, 0.0)),
]


@pytest.mark.parametrize("kind, params, shape, feed, definition", [case[1:] for case in NEURONS_WITH_DEFINITION],
                         ids=[case[0] for case in NEURONS_WITH_DEFINITION])
def test_neuron_against_definition(kind, params, shape, feed, definition):
    against_definition([layer("a", kind, "data", "a", **params)], {"data": shape},
                       lambda feeds: definition(feeds["data"]), feed=feed)


def test_exp_overflows_to_inf_quietly():
    """exp(x) past float32's range is inf in Caffe too; no warning is raised on the way."""
    message = net([layer("e", "Exp", "data", "e")], {"data": (1, 3)})
    with np.errstate(all="raise"):
        out = ours_forward(message, {"data": np.array([[0.0, 100.0, -200.0]], np.float32)})["e"]
    assert out[0, 0] == 1 and np.isinf(out[0, 1]) and out[0, 2] == 0


def test_dropout_copies():
    """At test time Dropout's top is a copy: the bottom is never the same array."""
    message = net([layer("d", "Dropout", "data", "d", dropout_param={"dropout_ratio": 0.7})], {"data": (2, 3)})
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = ours_forward(message, {"data": x})["d"]
    assert np.array_equal(out, x) and not np.shares_memory(out, x)


def test_dropout_scale_train_false():
    """Forks' DropoutParameter.scale_train false: TEST multiplies by 1 / scale = 1 - dropout_ratio.

    blobtool's schema has no scale_train field; a stand-in parameter message
    carries it here as a fork's schema would.
    """
    from types import SimpleNamespace

    from blobtool.layers import layer_class

    param = SimpleNamespace(top=["d"], bottom=["x"],
                            dropout_param=SimpleNamespace(dropout_ratio=0.25, scale_train=False))
    made = layer_class("Dropout")("d", "Dropout", param, [])
    x = np.linspace(-3, 3, 35, dtype=np.float32).reshape(5, 7)
    (out,) = made.forward([x])
    # dropout_layer.cpp (forks), TEST: caffe_scal(count, 1. / scale_, top), scale_ = 1 / (1 - ratio)
    assert max_scaled_difference(out, loop_elementwise(x, lambda v: v * 0.75)) <= 1e-7


# -- normalize.py: BatchNorm --------------------------------------------------------------------


def _batch_norm_blobs(channels, factor, seed=3):
    rng = np.random.default_rng(seed)
    mean = rng.standard_normal(channels) * factor
    variance = rng.uniform(0.2, 2.0, channels) * factor
    return [mean, variance, np.array([factor])]


BATCH_NORM_CASES = [
    ("factor1", SHAPE, 1.0, {}),
    ("factor0.5", SHAPE, 0.5, {}),
    ("factor999.98", (1, 5, 3, 3), 999.98, {}),
    ("factor0", SHAPE, 0.0, {}),
    ("eps1e-3", SHAPE, 1.0, {"eps": 1e-3}),
    ("global-true", SHAPE, 2.0, {"use_global_stats": True}),
    ("2d", (5, 3), 1.0, {}),
    ("3d", (2, 3, 5), 1.0, {}),
]


@pytest.mark.parametrize("shape, factor, params", [case[1:] for case in BATCH_NORM_CASES],
                         ids=[case[0] for case in BATCH_NORM_CASES])
def test_batch_norm_against_opencv(tmp_path, shape, factor, params):
    blobs = _batch_norm_blobs(shape[1], factor)
    layers = [layer("bn", "BatchNorm", "data", "bn", blobs=blobs, batch_norm_param=params)]
    ours = against_opencv(tmp_path, layers, {"data": shape})
    if factor == 0:
        # mean and variance 0: y = x / sqrt(eps)
        x = _feeds({"data": shape}, 0)["data"]
        assert np.allclose(ours["bn"], x / np.sqrt(np.float32(1e-5)), rtol=1e-5)


def test_batch_norm_batch_statistics():
    """use_global_stats: false (a training prototxt run as is): Caffe normalizes by the batch's own statistics."""
    layers = [layer("bn", "BatchNorm", "data", "bn", blobs=_batch_norm_blobs(3, 1.0),
                    batch_norm_param={"use_global_stats": False, "eps": 1e-4})]
    against_definition(layers, {"data": SHAPE}, lambda feeds: loop_batch_norm_batch_stats(feeds["data"], 1e-4))


@pytest.mark.parametrize("eps", [1e-5, 1e-7, 1e-3], ids=["eps1e-5", "eps1e-7-raised", "eps1e-3"])
def test_batch_norm_nvcaffe_five_blobs(eps):
    """NVIDIA Caffe's five blobs: mean, variance, an unused factor, then a scale and a bias per channel."""
    rng = np.random.default_rng(5)
    mean, variance = rng.standard_normal(3), rng.uniform(0.2, 2.0, 3)
    scale, bias = rng.uniform(-2, 2, 3), rng.standard_normal(3)
    layers = [layer("bn", "BatchNorm", "data", "bn", blobs=[mean, variance, [1.0], scale, bias],
                    batch_norm_param={"eps": eps})]
    against_definition(layers, {"data": SHAPE},
                       lambda feeds: loop_batch_norm_nvcaffe(feeds["data"], mean, variance, scale, bias, eps))


# -- normalize.py: LRN --------------------------------------------------------------------------

# alpha written out: OpenCV takes a missing alpha as 1e-4, Caffe as 1.
LRN_WITH_OPENCV = [
    ("across-5", {"alpha": 1.0}),
    ("across-5-alpha1e-4", {"alpha": 1e-4}),
    ("across-3-alpha0.5", {"local_size": 3, "alpha": 0.5, "beta": 0.75}),
    ("across-7-beta0.3", {"local_size": 7, "alpha": 2.0, "beta": 0.3}),
    ("across-1", {"local_size": 1, "alpha": 0.3}),
    ("within-3", {"norm_region": 1, "local_size": 3, "alpha": 0.5}),
    ("within-5-beta0.3", {"norm_region": 1, "local_size": 5, "alpha": 2.0, "beta": 0.3}),
]


@pytest.mark.parametrize("params", [case[1] for case in LRN_WITH_OPENCV], ids=[case[0] for case in LRN_WITH_OPENCV])
def test_lrn_against_opencv(tmp_path, params):
    layers = [layer("lrn", "LRN", "data", "lrn", lrn_param=params)]
    against_opencv(tmp_path, layers, {"data": (2, 7, 5, 9)})


LRN_WITH_DEFINITION = [
    ("defaults", {}, lambda x: loop_lrn_across(x, 5, 1.0, 0.75, 1.0)),
    ("within-defaults", {"norm_region": 1}, lambda x: loop_lrn_within(x, 5, 1.0, 0.75)),
    ("across-5-k2", {"k": 2.0}, lambda x: loop_lrn_across(x, 5, 1.0, 0.75, 2.0)),
    ("across-3-k0.5", {"local_size": 3, "alpha": 0.5, "beta": 0.6, "k": 0.5},
     lambda x: loop_lrn_across(x, 3, 0.5, 0.6, 0.5)),
    ("across-7-k1", {"local_size": 7, "alpha": 2.0, "beta": 0.3}, lambda x: loop_lrn_across(x, 7, 2.0, 0.3, 1.0)),
    ("within-3", {"norm_region": 1, "local_size": 3, "alpha": 0.5},
     lambda x: loop_lrn_within(x, 3, 0.5, 0.75)),
    # Caffe's WITHIN_CHANNEL ignores k.
    ("within-5-k3", {"norm_region": 1, "local_size": 5, "alpha": 2.0, "beta": 0.3, "k": 3.0},
     lambda x: loop_lrn_within(x, 5, 2.0, 0.3)),
    ("within-7-larger-than-image", {"norm_region": 1, "local_size": 7, "alpha": 1.5},
     lambda x: loop_lrn_within(x, 7, 1.5, 0.75)),
]


@pytest.mark.parametrize("params, definition", [case[1:] for case in LRN_WITH_DEFINITION],
                         ids=[case[0] for case in LRN_WITH_DEFINITION])
def test_lrn_against_definition(params, definition):
    layers = [layer("lrn", "LRN", "data", "lrn", lrn_param=params)]
    against_definition(layers, {"data": (2, 5, 3, 5)}, lambda feeds: definition(feeds["data"]))


# -- normalize.py: MVN, Softmax, Normalize --------------------------------------------------------

MVN_CASES = [
    ("default", {}),
    ("across-channels", {"across_channels": True}),
    ("mean-only", {"normalize_variance": False}),
    ("mean-only-across", {"normalize_variance": False, "across_channels": True}),
]


@pytest.mark.parametrize("params", [case[1] for case in MVN_CASES], ids=[case[0] for case in MVN_CASES])
def test_mvn_against_opencv(tmp_path, params):
    # eps left tiny (1e-9): OpenCV adds it to the variance, Caffe to the standard deviation.
    against_opencv(tmp_path, [layer("mvn", "MVN", "data", "mvn", mvn_param=params)], {"data": SHAPE})


@pytest.mark.parametrize("params, shape", [
    ({"eps": 0.5}, SHAPE),
    ({"eps": 0.5, "across_channels": True}, SHAPE),
    ({"eps": 2.0, "normalize_variance": True}, (1, 3, 1, 1)),
    ({"eps": 0.25}, (3, 5, 7)),
], ids=["eps0.5", "eps0.5-across", "eps2-single-values", "eps0.25-3d"])
def test_mvn_against_definition(params, shape):
    p = {"normalize_variance": True, "across_channels": False, **params}
    against_definition([layer("mvn", "MVN", "data", "mvn", mvn_param=p)], {"data": shape},
                       lambda feeds: loop_mvn(feeds["data"], p["normalize_variance"], p["across_channels"],
                                              p["eps"]))


def test_mvn_top_has_four_axes():
    """MVN's Reshape is (num, channels, height, width): a 2-D bottom gives a 4-D top."""
    message = net([layer("mvn", "MVN", "data", "mvn")], {"data": (3, 5)})
    out = ours_forward(message, {"data": np.arange(15, dtype=np.float32).reshape(3, 5)})["mvn"]
    assert out.shape == (3, 5, 1, 1)


SOFTMAX_CASES = [
    ("axis1", {}, SHAPE, None),
    ("axis2", {"axis": 2}, SHAPE, None),
    ("axis-neg1", {"axis": -1}, SHAPE, None),
    ("axis0", {"axis": 0}, (3, 5), None),
    ("2d", {}, (3, 11), None),
    ("large-values", {}, SHAPE, wide),
]


@pytest.mark.parametrize("params, shape, feed", [case[1:] for case in SOFTMAX_CASES],
                         ids=[case[0] for case in SOFTMAX_CASES])
def test_softmax_against_opencv(tmp_path, params, shape, feed):
    against_opencv(tmp_path, [layer("prob", "Softmax", "data", "prob", softmax_param=params)], {"data": shape},
                   feed=feed)


def _normalize_scale(channel_shared, channels):
    return np.array([20.0]) if channel_shared else np.linspace(5.0, 25.0, channels)


NORMALIZE_WITH_OPENCV = [
    ("spatial-shared", {}, SHAPE),
    ("per-position-per-channel", {"across_spatial": False, "channel_shared": False}, SHAPE),
    ("per-position-shared", {"across_spatial": False}, SHAPE),
    ("eps1e-3", {"across_spatial": False, "channel_shared": False, "eps": 1e-3}, (1, 5, 3, 3)),
    ("2d", {"across_spatial": False, "channel_shared": False}, (3, 5)),
]


@pytest.mark.parametrize("params, shape", [case[1:] for case in NORMALIZE_WITH_OPENCV],
                         ids=[case[0] for case in NORMALIZE_WITH_OPENCV])
def test_normalize_against_opencv(tmp_path, params, shape):
    scale = _normalize_scale(params.get("channel_shared", True), shape[1])
    layers = [layer("norm", "Normalize", "data", "norm", blobs=[scale], norm_param=params)]
    against_opencv(tmp_path, layers, {"data": shape})


NORMALIZE_WITH_DEFINITION = [
    ("spatial-per-channel", {"channel_shared": False}, SHAPE),
    ("spatial-per-channel-eps0.5", {"channel_shared": False, "eps": 0.5}, (2, 3, 1, 1)),
    ("per-position-eps2", {"across_spatial": False, "eps": 2.0}, SHAPE),
]


@pytest.mark.parametrize("params, shape", [case[1:] for case in NORMALIZE_WITH_DEFINITION],
                         ids=[case[0] for case in NORMALIZE_WITH_DEFINITION])
def test_normalize_against_definition(params, shape):
    p = {"across_spatial": True, "channel_shared": True, "eps": 1e-10, **params}
    scale = _normalize_scale(p["channel_shared"], shape[1])
    layers = [layer("norm", "Normalize", "data", "norm", blobs=[scale], norm_param=params)]
    against_definition(layers, {"data": shape},
                       lambda feeds: loop_normalize(feeds["data"], scale, p["across_spatial"], p["channel_shared"],
                                                    p["eps"]))


# -- arith.py: Scale, Bias ----------------------------------------------------------------------

# (id, params, blob shapes, data shape)
SCALE_WITH_OPENCV = [
    ("axis1", {}, [(3,)], SHAPE),
    ("axis1-bias", {"bias_term": True}, [(3,), (3,)], SHAPE),
    ("axis1-two-axes", {"num_axes": 2}, [(3, 5)], SHAPE),
    ("axis2-to-end", {"axis": 2, "num_axes": -1, "bias_term": True}, [(5, 7), (5, 7)], SHAPE),
    ("axis3", {"axis": 3}, [(7,)], SHAPE),
    ("axis0", {"axis": 0}, [(2,)], SHAPE),
    ("scalar-stored-as-1", {"num_axes": 0, "bias_term": True}, [(1,), (1,)], SHAPE),
    ("2d", {"bias_term": True}, [(5,), (5,)], (3, 5)),
    ("legacy-4d-blob", {}, [(1, 1, 1, 3)], SHAPE),
]


def _blobs(shapes, seed=7):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-2, 2, shape) for shape in shapes]


@pytest.mark.parametrize("params, blob_shapes, shape", [case[1:] for case in SCALE_WITH_OPENCV],
                         ids=[case[0] for case in SCALE_WITH_OPENCV])
def test_scale_against_opencv(tmp_path, params, blob_shapes, shape):
    layers = [layer("scale", "Scale", "data", "scale", blobs=_blobs(blob_shapes), scale_param=params)]
    against_opencv(tmp_path, layers, {"data": shape})


SCALE_TWO_BOTTOMS = [
    ("axis1", {}, (3,)),
    ("axis1-two-axes", {}, (3, 5)),
    ("axis2", {"axis": 2}, (5, 7)),
    ("axis0-all", {"axis": 0}, SHAPE),
]


@pytest.mark.parametrize("params, scale_shape", [case[1:] for case in SCALE_TWO_BOTTOMS],
                         ids=[case[0] for case in SCALE_TWO_BOTTOMS])
def test_scale_two_bottoms_against_opencv(tmp_path, params, scale_shape):
    layers = [layer("scale", "Scale", ["data", "factor"], "scale", scale_param=params)]
    against_opencv(tmp_path, layers, {"data": SHAPE, "factor": scale_shape})


# (id, type, params, operand shape, operand as bottom 1, with a bias blob)
BROADCAST_WITH_DEFINITION = [
    ("scale-axis-neg1", "Scale", {"axis": -1}, (7,), False, False),
    ("scale-axis-neg3-two-axes-bias", "Scale", {"axis": -3, "num_axes": 2, "bias_term": True}, (3, 5), False, True),
    ("scale-scalar", "Scale", {"num_axes": 0}, (), False, False),
    ("scale-scalar-bias", "Scale", {"num_axes": 0, "bias_term": True}, (), False, True),
    ("scale-bottom-bias", "Scale", {"bias_term": True}, (3,), True, True),
    ("scale-bottom-axis2-bias", "Scale", {"axis": 2, "bias_term": True}, (5, 7), True, True),
    ("bias-axis1", "Bias", {}, (3,), False, False),
    ("bias-axis1-two-axes", "Bias", {"num_axes": 2}, (3, 5), False, False),
    ("bias-axis2-to-end", "Bias", {"axis": 2, "num_axes": -1}, (5, 7), False, False),
    ("bias-axis-neg2", "Bias", {"axis": -2}, (5,), False, False),
    ("bias-axis0", "Bias", {"axis": 0}, (2,), False, False),
    ("bias-scalar", "Bias", {"num_axes": 0}, (), False, False),
    ("bias-bottom-axis1", "Bias", {}, (3,), True, False),
    ("bias-bottom-axis2", "Bias", {"axis": 2}, (5, 7), True, False),
]


@pytest.mark.parametrize("kind, params, shape, as_bottom, with_bias", [case[1:] for case in BROADCAST_WITH_DEFINITION],
                         ids=[case[0] for case in BROADCAST_WITH_DEFINITION])
def test_scale_and_bias_against_definition(kind, params, shape, as_bottom, with_bias):
    operand, bias = (np.asarray(b, np.float32) for b in _blobs([shape, shape]))
    blobs = ([] if as_bottom else [operand]) + ([bias] if with_bias else [])
    bottoms = ["data", "operand"] if as_bottom else "data"
    key = "scale_param" if kind == "Scale" else "bias_param"
    message = net([layer("op", kind, bottoms, "op", blobs=blobs, **{key: params})],
                  {"data": SHAPE, **({"operand": shape} if as_bottom else {})})
    feeds = {**_feeds({"data": SHAPE}, 0), **({"operand": operand} if as_bottom else {})}
    ours = ours_forward(message, feeds, ["op"])["op"]
    axis = params.get("axis", 1) % len(SHAPE) if shape else 0
    if kind == "Scale":
        wanted = loop_scale_bias(feeds["data"], operand, bias if with_bias else None, axis, len(shape))
    else:
        wanted = loop_scale_bias(feeds["data"], None, operand, axis, len(shape))
    assert max_scaled_difference(ours, wanted) <= TOLERANCE


def test_scale_by_a_scalar_bottom():
    """A bottom 1 of no axes is one factor for every value, whatever the axis (scale_layer.cpp: axis_ = 0)."""
    from blobtool.layers import layer_class

    made = layer_class("Scale")("s", "Scale", layer("s", "Scale", ["data", "k"], "s", scale_param={"axis": 2}), [])
    x = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
    assert made.reshape([x.shape, ()]) == [x.shape]
    (out,) = made.forward([x, np.array(-1.5, np.float32)])
    assert out.dtype == np.float32 and np.array_equal(out, x * np.float32(-1.5))


# -- arith.py: Eltwise, Reduction, ArgMax ---------------------------------------------------------

ELTWISE_CASES = [
    ("prod-2", {"operation": 0}, 2),
    ("prod-3", {"operation": 0}, 3),
    ("sum-2", {}, 2),
    ("sum-3-coeff", {"coeff": [0.5, -2.0, 1.5]}, 3),
    ("sum-2-subtract", {"coeff": [1.0, -1.0]}, 2),
    ("max-2", {"operation": 2}, 2),
    ("max-3", {"operation": 2}, 3),
    ("max-4-ties", {"operation": 2}, 4),
    ("sum-stable-prod-grad-ignored", {"stable_prod_grad": False}, 2),
]


@pytest.mark.parametrize("params, n", [case[1:] for case in ELTWISE_CASES], ids=[case[0] for case in ELTWISE_CASES])
def test_eltwise_against_opencv(tmp_path, params, n):
    names = [f"x{i}" for i in range(n)]
    feed = integers() if n == 4 else None
    layers = [layer("elt", "Eltwise", names, "elt", eltwise_param=params)]
    against_opencv(tmp_path, layers, {name: SHAPE for name in names}, feed=feed)


def test_eltwise_max_leaves_coeff_unused():
    """Caffe takes coeff with MAX and does not use it (OpenCV refuses the pair)."""
    layers = [layer("elt", "Eltwise", ["a", "b", "c"], "elt", eltwise_param={"operation": 2,
                                                                         "coeff": [2.0, -1.0, 0.5]})]

    def definition(feeds):
        # eltwise_layer.cpp MAX: top = a > b ? a : b, then top = x > top ? x : top for each later bottom
        out = np.empty(SHAPE)
        for index in _index_loops(SHAPE):
            best = feeds["a"][index] if feeds["a"][index] > feeds["b"][index] else feeds["b"][index]
            out[index] = feeds["c"][index] if feeds["c"][index] > best else best
        return out

    against_definition(layers, {name: SHAPE for name in "abc"}, definition)


REDUCTION_CASES = [(f"{name}-axis{axis}{'-coeff' if coeff != 1 else ''}", op, axis, coeff)
                   for name, op in (("sum", 1), ("asum", 2), ("sumsq", 3), ("mean", 4))
                   for axis, coeff in ((0, 1.0), (1, 1.0), (2, -0.5), (-1, 2.5))]


@pytest.mark.parametrize("op, axis, coeff", [case[1:] for case in REDUCTION_CASES],
                         ids=[case[0] for case in REDUCTION_CASES])
def test_reduction_against_definition(op, axis, coeff):
    params = {"operation": op, "axis": axis, "coeff": coeff}
    against_definition([layer("r", "Reduction", "data", "r", reduction_param=params)], {"data": SHAPE},
                       lambda feeds: loop_reduction(feeds["data"], op, axis, coeff))


def test_blobs_of_no_axes_stay_so():
    """A Reduction to shape () feeding element-wise layers: every top keeps shape (), float32."""
    layers = [layer("r", "Reduction", "data", "r", reduction_param={"operation": 3}),
              layer("neg", "Power", "r", "neg", power_param={"scale": -1.0}),
              layer("relu", "ReLU", "neg", "relu", relu_param={"negative_slope": 0.5}),
              layer("sig", "Sigmoid", "relu", "sig"),
              layer("sum", "Eltwise", ["relu", "sig"], "sum", eltwise_param={"coeff": [2.0, 1.0]})]
    message = net(layers, {"data": (2, 3)})
    out = ours_forward(message, {"data": np.arange(6, dtype=np.float32).reshape(2, 3)})
    assert all(out[name].shape == () and out[name].dtype == np.float32 for name in ("r", "neg", "relu", "sig", "sum"))
    assert out["relu"] == -27.5 and out["sum"] == np.float32(-55.0) + out["sig"]


def test_reduction_to_a_scalar():
    """axis 0 keeps no axis: the top is a blob of shape ()."""
    message = net([layer("r", "Reduction", "data", "r", reduction_param={"operation": 4})], {"data": (2, 3)})
    out = ours_forward(message, {"data": np.arange(6, dtype=np.float32).reshape(2, 3)})["r"]
    assert out.shape == () and out.dtype == np.float32 and out == 2.5


ARGMAX_CASES = [
    ("flat-top1", {}, SHAPE, None),
    ("flat-top3-ties", {"top_k": 3}, SHAPE, integers()),
    ("flat-top4-values", {"top_k": 4, "out_max_val": True}, SHAPE, integers()),
    ("flat-2d", {"top_k": 2, "out_max_val": True}, (3, 7), integers(-1, 2)),
    ("axis1", {"axis": 1}, SHAPE, integers()),
    ("axis1-top2-values", {"axis": 1, "top_k": 2, "out_max_val": True}, SHAPE, integers()),
    ("axis2-top3", {"axis": 2, "top_k": 3}, SHAPE, integers(-1, 2)),
    ("axis-neg1-top5", {"axis": -1, "top_k": 5}, SHAPE, integers(-1, 2)),
    ("axis0", {"axis": 0, "top_k": 2}, SHAPE, None),
    ("all-equal", {"top_k": 3}, (2, 5), lambda rng, shape: np.ones(shape)),
]


@pytest.mark.parametrize("params, shape, feed", [case[1:] for case in ARGMAX_CASES],
                         ids=[case[0] for case in ARGMAX_CASES])
def test_argmax_against_definition(params, shape, feed):
    top_k, out_max_val = params.get("top_k", 1), params.get("out_max_val", False)
    axis = params.get("axis")
    against_definition([layer("am", "ArgMax", "data", "am", argmax_param=params)], {"data": shape},
                       lambda feeds: loop_argmax(feeds["data"], top_k, out_max_val, axis), feed=feed)


def test_argmax_ties_put_the_larger_index_first():
    """std::greater on (value, index) pairs: of equal values the one further along comes first."""
    message = net([layer("am", "ArgMax", "data", "am", argmax_param={"top_k": 3, "out_max_val": True})],
                  {"data": (1, 5)})
    out = ours_forward(message, {"data": np.array([[2, 5, 1, 5, 2]], np.float32)})["am"]
    assert out.shape == (1, 2, 3)
    assert out[0, 0].tolist() == [3, 1, 4] and out[0, 1].tolist() == [5, 5, 2]


# -- errors: each names the layer ----------------------------------------------------------------


def _run(layers, inputs):
    message = net(layers, inputs)
    return ours_forward(message, _feeds(inputs, 0))


ERROR_CASES = [
    ("prelu-no-blob", [layer("act", "PReLU", "data", "act")], {"data": SHAPE},
     "layer 'act' (PReLU): holds 0 blobs, expected 1"),
    ("prelu-slope-count", [layer("act", "PReLU", "data", "act", blobs=[np.ones(4)])], {"data": SHAPE},
     "layer 'act' (PReLU): blob 0 (the slopes) holds 4 values, expected 3 (3 channels: one slope each)"),
    ("prelu-shared-count", [layer("act", "PReLU", "data", "act", blobs=[np.ones(3)],
                                  prelu_param={"channel_shared": True})], {"data": SHAPE},
     "layer 'act' (PReLU): blob 0 (the slopes) holds 3 values, expected 1 (channel_shared: 1 slope)"),
    ("relu-with-blob", [layer("r", "ReLU", "data", "r", blobs=[np.ones(3)])], {"data": SHAPE},
     "layer 'r' (ReLU): holds 1 blobs, expected 0"),
    ("eltwise-coeff-count", [layer("sum", "Eltwise", ["a", "b"], "sum", eltwise_param={"coeff": [1.0, 2.0, 3.0]})],
     {"a": SHAPE, "b": SHAPE},
     "layer 'sum' (Eltwise): has 3 coeff values for 2 bottoms; Caffe takes one coefficient per bottom, or none"),
    ("eltwise-prod-coeff", [layer("p", "Eltwise", ["a", "b"], "p", eltwise_param={"operation": 0,
                                                                             "coeff": [1.0, 2.0]})],
     {"a": SHAPE, "b": SHAPE}, "layer 'p' (Eltwise): has 2 coeff values; Caffe's Eltwise takes none for PROD "
                               "(coefficients are for SUM)"),
    ("eltwise-shapes", [layer("m", "Eltwise", ["a", "b"], "m")], {"a": SHAPE, "b": (2, 3, 5, 6)},
     "layer 'm' (Eltwise): bottom 1 has shape (2, 3, 5, 6), bottom 0 has (2, 3, 5, 7)"),
    ("eltwise-one-bottom", [layer("m", "Eltwise", ["a"], "m")], {"a": SHAPE},
     "layer 'm' (Eltwise): has 1 bottom, expected 2 or more"),
    ("scale-bottom-shape", [layer("s", "Scale", ["a", "b"], "s")], {"a": SHAPE, "b": (4,)},
     "layer 's' (Scale): bottom 1 (the scale) has shape (4,), which does not match bottom 0's shape (2, 3, 5, 7) "
     "from axis 1"),
    ("scale-bottom-past-end", [layer("s", "Scale", ["a", "b"], "s", scale_param={"axis": 3})],
     {"a": SHAPE, "b": (7, 2)},
     "layer 's' (Scale): bottom 1 (the scale) has shape (7, 2), which does not match bottom 0's shape "
     "(2, 3, 5, 7) from axis 3"),
    ("scale-blob-shape", [layer("s", "Scale", "a", "s", blobs=[np.ones(5)])], {"a": SHAPE},
     "layer 's' (Scale): blob 0 (the scale) has shape (5,), expected (3,) (bottom 0's shape (2, 3, 5, 7) from "
     "axis 1)"),
    ("scale-bias-shape", [layer("s", "Scale", "a", "s", blobs=[np.ones(3), np.ones(2)],
                                scale_param={"bias_term": True})], {"a": SHAPE},
     "layer 's' (Scale): blob 1 (the bias) has shape (2,), expected (3,)"),
    ("scale-missing-bias", [layer("s", "Scale", "a", "s", blobs=[np.ones(3)], scale_param={"bias_term": True})],
     {"a": SHAPE}, "layer 's' (Scale): holds 1 blob, expected 2 (the scale, the bias) with 1 bottom"),
    ("scale-no-blob", [layer("s", "Scale", "a", "s")], {"a": SHAPE},
     "layer 's' (Scale): holds 0 blobs, expected 1 (the scale) with 1 bottom"),
    ("scale-num-axes-past-end", [layer("s", "Scale", "a", "s", blobs=[np.ones((5, 7))],
                                       scale_param={"axis": 2, "num_axes": 3})], {"a": SHAPE},
     "layer 's' (Scale): the scale spans axes 2 to 4, past bottom 0's 4 axes (2, 3, 5, 7)"),
    ("scale-axis-out-of-range", [layer("s", "Scale", "a", "s", blobs=[np.ones(3)], scale_param={"axis": 4})],
     {"a": SHAPE}, "layer 's' (Scale): axis 4 is out of range for a 4-axis blob"),
    ("bias-no-blob", [layer("b", "Bias", "a", "b")], {"a": SHAPE},
     "layer 'b' (Bias): holds 0 blobs, expected 1 (the bias) with 1 bottom"),
    ("bias-extra-blob", [layer("b", "Bias", ["a", "c"], "b", blobs=[np.ones(3)])], {"a": SHAPE, "c": (3,)},
     "layer 'b' (Bias): holds 1 blob, expected 0 with 2 bottoms"),
    ("batchnorm-four-blobs", [layer("bn", "BatchNorm", "a", "bn", blobs=[np.ones(3)] * 4)], {"a": SHAPE},
     "layer 'bn' (BatchNorm): holds 4 blobs, expected 3 (mean, variance, factor) or 5"),
    ("batchnorm-two-blobs", [layer("bn", "BatchNorm", "a", "bn", blobs=[np.ones(3)] * 2)], {"a": SHAPE},
     "layer 'bn' (BatchNorm): holds 2 blobs, expected 3 to 5"),
    ("batchnorm-channels", [layer("bn", "BatchNorm", "a", "bn", blobs=[np.ones(4), np.ones(4), [1.0]])],
     {"a": SHAPE}, "layer 'bn' (BatchNorm): blob 0 (the mean) holds 4 values, expected 3 (bottom has 3 channels)"),
    ("lrn-even-size", [layer("n", "LRN", "a", "n", lrn_param={"local_size": 4})], {"a": SHAPE},
     "layer 'n' (LRN): local_size is 4; Caffe's LRN takes odd sizes only"),
    ("lrn-3d", [layer("n", "LRN", "a", "n")], {"a": (2, 3, 5)},
     "layer 'n' (LRN): bottom has 3 axes (2, 3, 5), expected 4 (num, channels, height, width)"),
    ("mvn-5d", [layer("m", "MVN", "a", "m")], {"a": (1, 2, 3, 4, 5)},
     "layer 'm' (MVN): bottom has 5 axes (1, 2, 3, 4, 5); Caffe's MVN reads num, channels, height and width, "
     "so at most 4"),
    ("normalize-scale-count", [layer("n", "Normalize", "a", "n", blobs=[np.ones(2)],
                                     norm_param={"channel_shared": False})], {"a": SHAPE},
     "layer 'n' (Normalize): blob 0 (the scale) holds 2 values, expected 3 (3 channels: one scale each)"),
    ("softmax-axis", [layer("p", "Softmax", "a", "p", softmax_param={"axis": -5})], {"a": SHAPE},
     "layer 'p' (Softmax): axis -5 is out of range for a 4-axis blob"),
    ("exp-negative-base", [layer("e", "Exp", "a", "e", exp_param={"base": -2.0})], {"a": SHAPE},
     "layer 'e' (Exp): base is -2: it must be strictly positive (or -1 for e)"),
    ("log-base-1", [layer("l", "Log", "a", "l", log_param={"base": 1.0})], {"a": SHAPE},
     "layer 'l' (Log): base is 1: 1 / log(base) = inf"),
    ("absval-in-place", [layer("abs", "AbsVal", "a", "a")], {"a": SHAPE},
     "layer 'abs' (AbsVal): runs in place (top 'a' is its bottom); Caffe's AbsVal does not allow in-place "
     "computation"),
    ("argmax-top-k-flat", [layer("am", "ArgMax", "a", "am", argmax_param={"top_k": 11})], {"a": (2, 2, 5)},
     "layer 'am' (ArgMax): top_k is 11, more than the 10 values of each image (bottom (2, 2, 5))"),
    ("argmax-top-k-axis", [layer("am", "ArgMax", "a", "am", argmax_param={"top_k": 4, "axis": 1})], {"a": SHAPE},
     "layer 'am' (ArgMax): top_k is 4, more than the 3 values along axis 1"),
    ("argmax-top-k-0", [layer("am", "ArgMax", "a", "am", argmax_param={"top_k": 0})], {"a": SHAPE},
     "layer 'am' (ArgMax): top_k is 0: it must be at least 1"),
    ("reduction-axis", [layer("r", "Reduction", "a", "r", reduction_param={"axis": 4})], {"a": SHAPE},
     "layer 'r' (Reduction): axis 4 is out of range for a 4-axis blob"),
]


@pytest.mark.parametrize("layers, inputs, text", [case[1:] for case in ERROR_CASES],
                         ids=[case[0] for case in ERROR_CASES])
def test_errors_name_the_layer(layers, inputs, text):
    with pytest.raises(LayerError) as caught:
        _run(layers, inputs)
    assert str(caught.value).startswith(text), str(caught.value)
