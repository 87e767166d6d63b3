"""The spatial and dense layers (blobtool/layers/conv.py, pooling.py, dense.py), against real Caffe.

Each sweep is a small net run by blobtool and by real Caffe (BVLC, through
tests/helpers/caffeoracle.py), compared on every blob within 1e-5 of the largest
magnitude of Caffe's blob, NaN at the same places (an AVE window past the
image is 0 / 0 in both). Caffe is the oracle of every case here but one:
Pooling's round_mode (FLOOR), a field added to BVLC after the oracle's
build, is compared with a loop-by-loop definition written from
pooling_layer.cpp. Where OpenCV 4.x, the oracle before, departs from Caffe
on these layers (measured by these cases): a MAX window past the image
(OpenCV: 0, Caffe: -FLT_MAX), a Deconvolution's dilation left out of its
output size, a Convolution of two bottoms, InnerProduct's `transpose`, and
Embed, which it lacks.

Convolution picks its method by shape (conv.py); the cases reach each one,
and the tests that shrink conv's chunk budgets reach its chunked loops on
small inputs. Winograd's F(4x4, 3x3) agrees with Caffe's GEMM within 1e-5.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from caffenets import layer, max_scaled_difference, net, ours_forward, random_feeds, tops_of
from caffeoracle import against_caffe as caffe_against
from caffeoracle import caffe_refusal

from blobtool.layers import LayerError, conv, convkernels, layer_class

TOLERANCE = 1e-4
# Against real Caffe: both sum in float32, in orders that differ by a few units of rounding.
CAFFE_TOLERANCE = 1e-5
FLT_MAX = float(np.finfo(np.float32).max)
MAX, AVE, STOCHASTIC = 0, 1, 2
CEIL, FLOOR = 0, 1


# -- running a case ---------------------------------------------------------------------------


def _input(shape, seed: int = 0) -> np.ndarray:
    """One input of the sweeps: standard normal times 2 (caffenets.random_feeds)."""
    return random_feeds({"x": shape}, seed, scale=2)["x"]


def _weights(shape, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * 0.5).astype(np.float32)


def against_caffe(tmp_path, layers, feeds: dict) -> dict:
    """caffeoracle.against_caffe within CAFFE_TOLERANCE: NaN must stand where Caffe's do (a window past the image)."""
    return caffe_against(tmp_path, layers, feeds, tolerance=CAFFE_TOLERANCE)


def ours(layers, feeds: dict) -> dict:
    """blobtool's value of every blob of the net (each C-contiguous: caffenets.ours_forward holds it)."""
    message = net(layers, {name: list(x.shape) for name, x in feeds.items()})
    return ours_forward(message, feeds, tops_of(message.layer))


def assert_close(value, wanted, what: str) -> None:
    """Within TOLERANCE of the definition, with NaN (0 / 0: a window past the image) at the same places."""
    assert (np.isnan(value) == np.isnan(wanted)).all(), f"{what}: NaN at other places than the definition's"
    difference = max_scaled_difference(np.nan_to_num(value, nan=0.0), np.nan_to_num(wanted, nan=0.0))
    assert difference <= TOLERANCE, f"{what}: {difference:.3g} from the definition"


# -- loop-by-loop definitions, from Caffe's source -------------------------------------------


def pooling_definition(x, method, kernel, stride, pad, ceil=True):
    """PoolingLayer::Reshape and Forward_cpu (pooling_layer.cpp), pixel by pixel, in float64."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, pad
    n, c, h, w = x.shape
    rounding = np.ceil if ceil else np.floor
    oh = int(rounding((h + 2 * ph - kh) / sh)) + 1
    ow = int(rounding((w + 2 * pw - kw) / sw)) + 1
    if ph or pw:
        oh -= (oh - 1) * sh >= h + ph
        ow -= (ow - 1) * sw >= w + pw
    top = np.empty((n, c, oh, ow))
    for b, k, y, z in itertools.product(range(n), range(c), range(oh), range(ow)):
        hstart, wstart = y * sh - ph, z * sw - pw
        if method == MAX:
            hend, wend = min(hstart + kh, h), min(wstart + kw, w)
            best = -FLT_MAX
            for i in range(max(hstart, 0), hend):
                for j in range(max(wstart, 0), wend):
                    if x[b, k, i, j] > best:
                        best = float(x[b, k, i, j])
            top[b, k, y, z] = best
        else:
            hend, wend = min(hstart + kh, h + ph), min(wstart + kw, w + pw)
            size = (hend - hstart) * (wend - wstart)
            total = sum(float(x[b, k, i, j]) for i in range(max(hstart, 0), min(hend, h))
                        for j in range(max(wstart, 0), min(wend, w)))
            with np.errstate(invalid="ignore"):
                top[b, k, y, z] = np.float64(total) / size   # 0 / 0 (a window past the image): NaN
    return top


# -- Pooling ----------------------------------------------------------------------------------


def _pooling_sweep(h, w):
    """(name, kernel, stride, pad) of square windows that fit (h, w), windows starting past the image included."""
    for k, s in itertools.product((1, 2, 3, 4), (1, 2, 3)):
        for p in range(k):
            if k > min(h, w) + 2 * p:
                continue
            yield f"k{k}s{s}p{p}", (k, k), (s, s), (p, p)


def _pooling_layer(name, method, kernel, stride, pad, **more):
    params = {"pool": method, "kernel_size": kernel[0], "stride": stride[0], "pad": pad[0], **more}
    if kernel[0] != kernel[1] or stride[0] != stride[1] or pad[0] != pad[1]:
        params = {"pool": method, "kernel_h": kernel[0], "kernel_w": kernel[1], "stride_h": stride[0],
                  "stride_w": stride[1], "pad_h": pad[0], "pad_w": pad[1], **more}
    return layer(name, "Pooling", "data", pooling_param=params)


@pytest.mark.parametrize("method", [MAX, AVE], ids=["MAX", "AVE"])
@pytest.mark.parametrize("shape", [(2, 3, 5, 5), (1, 2, 6, 7), (1, 2, 7, 4), (1, 1, 11, 9)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.caffe
def test_pooling_sweep_against_caffe(tmp_path, method, shape):
    sweep = list(_pooling_sweep(*shape[2:]))
    layers = [_pooling_layer(name, method, kernel, stride, pad) for name, kernel, stride, pad in sweep]
    values = against_caffe(tmp_path, layers, {"data": _input(shape)})
    x = _input(shape)
    for name, kernel, stride, pad in sweep:
        assert_close(values[name], pooling_definition(x, method, kernel, stride, pad), name)


def test_pooling_sweep_meets_the_last_window_rule():
    """The sweep has windows that Caffe's 'last window starts inside the image or its pad' rule trims."""
    trimmed = []
    for h in (5, 6, 7, 4, 11, 9):
        for name, (k, _), (s, _), (p, _) in _pooling_sweep(h, h):
            out = -(-(h + 2 * p - k) // s) + 1
            if p and (out - 1) * s >= h + p:
                trimmed.append((h, name))
    assert len(trimmed) >= 5, trimmed


@pytest.mark.parametrize("method", [MAX, AVE], ids=["MAX", "AVE"])
@pytest.mark.caffe
def test_pooling_h_w_forms_against_caffe(tmp_path, method):
    cases = {"k3x2s2x1p1x0": ((3, 2), (2, 1), (1, 0)), "k2x4s1x3p0x2": ((2, 4), (1, 3), (0, 2)),
             "k5x1s2x2p2x0": ((5, 1), (2, 2), (2, 0)), "k1x3s1x2p0x1": ((1, 3), (1, 2), (0, 1))}
    layers = [_pooling_layer(name, method, *geometry) for name, geometry in cases.items()]
    x = _input((2, 3, 7, 9))
    values = against_caffe(tmp_path, layers, {"data": x})
    for name, geometry in cases.items():
        assert_close(values[name], pooling_definition(x, method, *geometry), name)


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 4, 1, 1), (3, 2, 13, 2)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.caffe
def test_global_pooling_against_caffe(tmp_path, shape):
    layers = [layer("max", "Pooling", "data", pooling_param={"pool": MAX, "global_pooling": True}),
              layer("ave", "Pooling", "data", pooling_param={"pool": AVE, "global_pooling": True})]
    values = against_caffe(tmp_path, layers, {"data": _input(shape)})
    assert values["max"].shape == shape[:2] + (1, 1)


@pytest.mark.caffe
def test_max_pooling_argmax_top_against_caffe(tmp_path):
    layers = [layer("p", "Pooling", "data", tops=["p", "where"],
                    pooling_param={"pool": MAX, "kernel_size": 3, "stride": 2, "pad": 1}),
              layer("q", "Pooling", "data", tops=["q", "where_q"],
                    pooling_param={"pool": MAX, "kernel_size": 2, "stride": 2})]
    x = _input((2, 3, 7, 8))
    x[0, 0, :2, :2] = 5.0    # equal maxima: the first in row-major order is the argmax
    values = against_caffe(tmp_path, layers, {"data": x})
    assert values["where"][0, 0, 0, 0] == 0.0


@pytest.mark.parametrize("method", [MAX, AVE], ids=["MAX", "AVE"])
@pytest.mark.parametrize("shape", [(1, 2, 7, 6), (2, 1, 10, 5)], ids=lambda s: "x".join(map(str, s)))
def test_pooling_floor_against_the_definition(method, shape):
    x = _input(shape)
    cases = [((3, 3), (2, 2), (0, 0)), ((3, 3), (2, 2), (1, 1)), ((2, 3), (3, 2), (1, 2)), ((4, 4), (3, 3), (2, 2)),
             ((1, 1), (2, 2), (0, 0))]
    for number, geometry in enumerate(cases):
        name = f"p{number}"
        values = ours([_pooling_layer(name, method, *geometry, round_mode=FLOOR)], {"data": x})
        assert_close(values[name], pooling_definition(x, method, *geometry, ceil=False), name)


@pytest.mark.caffe
@pytest.mark.parametrize("method", [MAX, AVE], ids=["MAX", "AVE"])
def test_pooling_window_past_the_image_as_caffe(tmp_path, method):
    """k 1, stride 2, no pad on 4 rows: ceil gives a third window starting at row 4, past the image.

    Caffe's MAX leaves it at -FLT_MAX (OpenCV: 0); AVE divides 0 by a window of 0 rows (NaN).
    """
    x = _input((1, 2, 4, 5))
    values = against_caffe(tmp_path, [_pooling_layer("p", method, (1, 1), (2, 2), (0, 0))], {"data": x})["p"]
    assert values.shape == (1, 2, 3, 3)
    if method == MAX:
        assert (values[:, :, 2] == -FLT_MAX).all()
    else:
        assert np.isnan(values[:, :, 2]).all()


@pytest.mark.caffe
def test_max_pooling_skips_nan_and_infinity_as_caffe(tmp_path):
    x = np.zeros((1, 1, 2, 4), np.float32)
    x[0, 0, :, :2] = [[np.nan, 1.0], [-2.0, np.nan]]
    x[0, 0, :, 2:] = -np.inf
    values = against_caffe(tmp_path, [layer("p", "Pooling", "data", tops=["p", "at"],
                                   pooling_param={"pool": MAX, "kernel_size": 2, "stride": 2})], {"data": x})
    assert values["p"].reshape(-1).tolist() == [1.0, -FLT_MAX]
    assert values["at"].reshape(-1).tolist() == [1.0, -1.0]


# -- Convolution ------------------------------------------------------------------------------

# name: (input shape, convolution_param); weights and bias follow from the shapes.
CONVOLUTIONS = {
    "k3p1": ((2, 3, 9, 8), {"num_output": 4, "kernel_size": [3], "pad": [1]}),
    "k3s2p1": ((2, 3, 9, 8), {"num_output": 5, "kernel_size": [3], "stride": [2], "pad": [1]}),
    "k5s3p2": ((1, 4, 13, 11), {"num_output": 3, "kernel_size": [5], "stride": [3], "pad": [2]}),
    "k2s2": ((2, 3, 7, 9), {"num_output": 4, "kernel_size": [2], "stride": [2]}),
    "k4s1": ((1, 2, 7, 6), {"num_output": 3, "kernel_size": [4]}),
    "1x1": ((2, 6, 5, 7), {"num_output": 4, "kernel_size": [1]}),
    "1x1_one_image": ((1, 6, 5, 7), {"num_output": 4, "kernel_size": [1]}),
    "1x1s2": ((2, 6, 5, 7), {"num_output": 4, "kernel_size": [1], "stride": [2]}),
    "1x1p1": ((1, 3, 4, 5), {"num_output": 2, "kernel_size": [1], "pad": [1]}),
    "dilation2": ((1, 3, 11, 10), {"num_output": 4, "kernel_size": [3], "dilation": [2], "pad": [2]}),
    "dilation2x3s2": ((1, 2, 12, 13), {"num_output": 3, "kernel_size": [3], "dilation": [2, 3], "stride": [2]}),
    "kernel_h_w": ((2, 3, 8, 9), {"num_output": 4, "kernel_h": 3, "kernel_w": 2, "stride_h": 2, "stride_w": 1,
                                  "pad_h": 1, "pad_w": 0}),
    "kernel_h_w_pad_w": ((1, 3, 6, 9), {"num_output": 2, "kernel_h": 1, "kernel_w": 5, "pad_h": 0, "pad_w": 2}),
    "repeated": ((1, 3, 9, 8), {"num_output": 4, "kernel_size": [3, 2], "stride": [1, 2], "pad": [0, 1]}),
    "group2": ((2, 4, 7, 7), {"num_output": 6, "kernel_size": [3], "pad": [1], "group": 2}),
    "group3s2": ((1, 6, 9, 8), {"num_output": 3, "kernel_size": [3], "stride": [2], "group": 3}),
    "group2_1x1": ((2, 4, 5, 5), {"num_output": 6, "kernel_size": [1], "group": 2}),
    "group2_1x1_one_image": ((1, 4, 5, 5), {"num_output": 6, "kernel_size": [1], "group": 2}),
    "depthwise": ((2, 4, 7, 8), {"num_output": 4, "kernel_size": [3], "pad": [1], "group": 4}),
    "depthwise_s2": ((1, 5, 9, 9), {"num_output": 5, "kernel_size": [3], "stride": [2], "pad": [1], "group": 5}),
    "depthwise_x2": ((1, 3, 6, 7), {"num_output": 6, "kernel_size": [3], "group": 3, "dilation": [2]}),
    "depthwise_s3_d2_x3": ((2, 2, 13, 11), {"num_output": 6, "kernel_size": [3], "group": 2, "stride": [3],
                                            "dilation": [2], "pad": [2]}),
    "depthwise_h_w": ((1, 3, 9, 10), {"num_output": 3, "kernel_h": 3, "kernel_w": 5, "stride_h": 2, "stride_w": 1,
                                      "pad_h": 1, "pad_w": 2, "group": 3}),
    "depthwise_global_7x7": ((2, 4, 7, 7), {"num_output": 4, "kernel_size": [7], "group": 4, "bias_term": False}),
    "depthwise_5x5_on_4x4": ((1, 3, 4, 4), {"num_output": 3, "kernel_size": [5], "pad": [1], "group": 3}),
    "no_bias": ((2, 3, 6, 6), {"num_output": 4, "kernel_size": [3], "pad": [1], "bias_term": False}),
    "no_bias_group": ((1, 4, 6, 6), {"num_output": 2, "kernel_size": [2], "group": 2, "bias_term": False}),
    "whole_input": ((1, 3, 4, 5), {"num_output": 2, "kernel_h": 4, "kernel_w": 5}),
}


def _pair(values) -> tuple:
    """(height, width) of a repeated convolution_param field given once or per axis."""
    return (values[0], values[0]) if len(values) == 1 else tuple(values)


def conv_layer(name, kind, shape, params, bottom="data", seed=1):
    """A Convolution or Deconvolution layer with random weights for a bottom of `shape`."""
    channels = shape[1]
    group = params.get("group", 1)
    kernel = (params["kernel_h"], params["kernel_w"]) if "kernel_h" in params else _pair(params["kernel_size"])
    outputs = params["num_output"]
    weight_shape = ((channels, outputs // group) if kind == "Deconvolution" else (outputs, channels // group)) + kernel
    blobs = [_weights(weight_shape, seed)]
    if params.get("bias_term", True):
        blobs.append(_weights((outputs,), seed + 1))
    return layer(name, kind, bottom, blobs=blobs, convolution_param=params)


@pytest.mark.parametrize("name", list(CONVOLUTIONS))
@pytest.mark.caffe
def test_convolution_against_caffe(tmp_path, name):
    shape, params = CONVOLUTIONS[name]
    against_caffe(tmp_path, [conv_layer(name, "Convolution", shape, params)], {"data": _input(shape)})


@pytest.mark.parametrize("name", ["k3p1", "k3s2p1", "dilation2", "group2", "1x1"])
@pytest.mark.parametrize("chunk", [64, 30000], ids=["rows", "images"])
@pytest.mark.caffe
def test_convolution_in_chunks_against_caffe(tmp_path, monkeypatch, name, chunk):
    """Column chunks smaller than an image (bands of rows) or holding a few images give the same tops."""
    monkeypatch.setattr(convkernels, "COLUMN_BYTES", chunk)
    shape, params = CONVOLUTIONS[name]
    shape = (5,) + shape[1:]
    against_caffe(tmp_path, [conv_layer(name, "Convolution", shape, params)], {"data": _input(shape)})


# 3 x 3, stride 1: Winograd's F(4x4, 3x3) where the channels and tiles reach conv's thresholds.
WINOGRAD = {
    "pad1": ((2, 3, 9, 8), {"num_output": 4, "kernel_size": [3], "pad": [1]}),
    "pad0_partial_tiles": ((1, 4, 7, 10), {"num_output": 5, "kernel_size": [3]}),
    "pad2_one_pixel": ((2, 3, 1, 1), {"num_output": 2, "kernel_size": [3], "pad": [2]}),
    "pad_h_w": ((1, 2, 6, 13), {"num_output": 3, "kernel_size": [3], "pad_h": 1, "pad_w": 0}),
    "group2": ((2, 4, 7, 7), {"num_output": 6, "kernel_size": [3], "pad": [1], "group": 2}),
    "no_bias": ((1, 3, 5, 9), {"num_output": 4, "kernel_size": [3], "pad": [1], "bias_term": False}),
}


@pytest.mark.parametrize("name", list(WINOGRAD))
@pytest.mark.parametrize("chunk", ["rows", "images", "default"])
@pytest.mark.caffe
def test_convolution_winograd_against_caffe(tmp_path, monkeypatch, name, chunk):
    """Chunks of one tile row with one output channel at a time, of two images, or of all of them."""
    monkeypatch.setattr(convkernels, "WINOGRAD_MIN_CHANNELS", 1)
    monkeypatch.setattr(convkernels, "WINOGRAD_MIN_TILES", 1)
    shape, params = WINOGRAD[name]
    shape = (3,) + shape[1:]
    if chunk == "rows":
        monkeypatch.setattr(convkernels, "WINOGRAD_CHUNK_TILES", 1)
        monkeypatch.setattr(convkernels, "COLUMN_BYTES", 64)
    elif chunk == "images":
        pad = (params["pad_h"], params["pad_w"]) if "pad_h" in params else _pair(params.get("pad", [0]))
        tiles = [-(-conv.conv_output_size(size, 3, 1, p, 1) // 4) for size, p in zip(shape[2:], pad)]
        monkeypatch.setattr(convkernels, "WINOGRAD_CHUNK_TILES", 2 * tiles[0] * tiles[1])
    against_caffe(tmp_path, [conv_layer(name, "Convolution", shape, params)], {"data": _input(shape)})


@pytest.mark.parametrize("channels", [32, 31], ids=["winograd", "columns"])
@pytest.mark.caffe
def test_convolution_of_many_channels_against_caffe(tmp_path, channels):
    """Channels at the default Winograd thresholds and just under them (40 tiles of 4 x 4 outputs)."""
    shape = (2, channels, 17, 15)
    params = {"num_output": 33, "kernel_size": [3], "pad": [1]}
    against_caffe(tmp_path, [conv_layer("c", "Convolution", shape, params)], {"data": _input(shape)})


@pytest.mark.parametrize("name", ["depthwise", "depthwise_s2", "depthwise_x2", "depthwise_s3_d2_x3"])
@pytest.mark.parametrize("budget", [64, 2000], ids=["plane", "planes"])
@pytest.mark.caffe
def test_depthwise_in_blocks_against_caffe(tmp_path, monkeypatch, name, budget):
    """Blocks of one plane, or of a few (across images), give the same tops."""
    monkeypatch.setattr(convkernels, "DEPTHWISE_BYTES", budget)
    shape, params = CONVOLUTIONS[name]
    shape = (3,) + shape[1:]
    against_caffe(tmp_path, [conv_layer(name, "Convolution", shape, params)], {"data": _input(shape)})


def test_convolution_depthwise_type_is_convolution():
    """The forks' ConvolutionDepthwise runs as a Convolution of the same parameters."""
    shape, params = CONVOLUTIONS["depthwise_s2"]
    x = {"data": _input(shape)}
    plain = ours([conv_layer("c", "Convolution", shape, params)], x)["c"]
    forked = ours([conv_layer("c", "ConvolutionDepthwise", shape, params)], x)["c"]
    np.testing.assert_array_equal(forked, plain)


@pytest.mark.caffe
def test_convolution_of_two_bottoms_is_one_per_bottom(tmp_path):
    """Caffe convolves each bottom with the same weights into the top of its position (OpenCV cannot run it)."""
    shape, params = CONVOLUTIONS["k3s2p1"]
    two = conv_layer("c", "Convolution", shape, params, bottom=["a", "b"])
    two.top[:] = ["ca", "cb"]
    values = against_caffe(tmp_path, [two], {"a": _input(shape, 1), "b": _input(shape, 2)})
    for top, seed in (("ca", 1), ("cb", 2)):
        alone = ours([conv_layer("c", "Convolution", shape, params)], {"data": _input(shape, seed)})["c"]
        np.testing.assert_array_equal(values[top], alone)


@pytest.mark.caffe
def test_convolution_axis_2_is_the_4d_one_per_leading_index(tmp_path):
    """axis 2 on (2, 3, C, H, W): each of the 6 leading indices is an image of the 4-D convolution."""
    shape, params = CONVOLUTIONS["group2"]
    x = _input((2, 3) + shape[1:])
    made = conv_layer("c", "Convolution", (6,) + shape[1:], dict(params, axis=2))
    five = against_caffe(tmp_path, [made], {"data": x})["c"]
    four = ours([conv_layer("c", "Convolution", (6,) + shape[1:], params)], {"data": x.reshape((6,) + shape[1:])})["c"]
    assert five.shape == (2, 3) + four.shape[1:]
    np.testing.assert_array_equal(five.reshape(four.shape), four)


@pytest.mark.caffe
def test_convolution_legacy_blob_shapes_against_caffe(tmp_path):
    """Weights from an old model: the bias stored (1, 1, 1, N), as Caffe's ShapeEquals takes it."""
    shape, params = CONVOLUTIONS["k3s2p1"]
    made = conv_layer("c", "Convolution", shape, params)
    _legacy_fields(made.blobs[1])
    _legacy_fields(made.blobs[0])
    against_caffe(tmp_path, [made], {"data": _input(shape)})


# -- Deconvolution ----------------------------------------------------------------------------

DECONVOLUTIONS = {
    "k3": ((2, 3, 5, 6), {"num_output": 4, "kernel_size": [3]}),
    "k4s2p1": ((2, 3, 5, 4), {"num_output": 2, "kernel_size": [4], "stride": [2], "pad": [1]}),
    "k2s2": ((1, 4, 3, 5), {"num_output": 3, "kernel_size": [2], "stride": [2]}),
    "k3s3p2": ((1, 2, 4, 4), {"num_output": 3, "kernel_size": [3], "stride": [3], "pad": [2]}),
    "k5s2p2": ((1, 3, 4, 3), {"num_output": 2, "kernel_size": [5], "stride": [2], "pad": [2]}),
    "1x1": ((2, 5, 3, 4), {"num_output": 3, "kernel_size": [1]}),
    "1x1s2": ((1, 3, 3, 4), {"num_output": 2, "kernel_size": [1], "stride": [2]}),
    "group2": ((2, 4, 5, 5), {"num_output": 6, "kernel_size": [3], "stride": [2], "pad": [1], "group": 2}),
    "group4": ((1, 4, 4, 5), {"num_output": 4, "kernel_size": [4], "stride": [2], "pad": [1], "group": 4}),
    "kernel_h_w": ((1, 3, 4, 5), {"num_output": 2, "kernel_h": 3, "kernel_w": 2, "stride_h": 2, "stride_w": 3,
                                  "pad_h": 1, "pad_w": 0}),
    "no_bias": ((2, 3, 4, 4), {"num_output": 2, "kernel_size": [3], "stride": [2], "bias_term": False}),
    "k16s8p4_depthwise": ((1, 3, 3, 4), {"num_output": 3, "kernel_size": [16], "stride": [8], "pad": [4], "group": 3,
                                         "bias_term": False}),
    "k10s8": ((2, 2, 3, 2), {"num_output": 3, "kernel_size": [10], "stride": [8], "pad": [1]}),
    "k3s5": ((1, 2, 3, 3), {"num_output": 2, "kernel_size": [3], "stride": [5]}),
}

# OpenCV leaves a deconvolution's dilation out of its output size; Caffe is the oracle of all of them.
DILATED_DECONVOLUTIONS = {
    "dilation2": ((1, 2, 5, 4), {"num_output": 3, "kernel_size": [3], "dilation": [2], "pad": [1]}),
    "dilation2x3s2g2": ((2, 4, 3, 4), {"num_output": 2, "kernel_size": [2, 3], "dilation": [2, 3], "stride": [2],
                                       "group": 2}),
}


@pytest.mark.parametrize("name", list(DECONVOLUTIONS))
@pytest.mark.caffe
def test_deconvolution_against_caffe(tmp_path, name):
    shape, params = DECONVOLUTIONS[name]
    against_caffe(tmp_path, [conv_layer(name, "Deconvolution", shape, params)], {"data": _input(shape)})


@pytest.mark.caffe
@pytest.mark.parametrize("name", list(DILATED_DECONVOLUTIONS))
def test_dilated_deconvolution_against_caffe(tmp_path, name):
    shape, params = DILATED_DECONVOLUTIONS[name]
    against_caffe(tmp_path, [conv_layer(name, "Deconvolution", shape, params)], {"data": _input(shape)})


@pytest.mark.parametrize("name", ["group2", "k10s8", "k4s2p1"])
@pytest.mark.caffe
def test_deconvolution_in_one_image_chunks_against_caffe(tmp_path, monkeypatch, name):
    """One image and one kernel row multiplied at a time give the same tops."""
    monkeypatch.setattr(convkernels, "COLUMN_BYTES", 64)
    shape, params = DECONVOLUTIONS[name]
    against_caffe(tmp_path, [conv_layer("d", "Deconvolution", (3,) + shape[1:], params)],
                   {"data": _input((3,) + shape[1:])})


def test_deconvolution_output_size():
    """out = s (i - 1) + d (k - 1) + 1 - 2p (deconv_layer.cpp)."""
    for size, kernel, stride, pad, dilation in itertools.product((1, 4, 7), (1, 2, 3, 4), (1, 2, 3), (0, 1),
                                                                 (1, 2)):
        wanted = stride * (size - 1) + dilation * (kernel - 1) + 1 - 2 * pad
        assert conv.deconv_output_size(size, kernel, stride, pad, dilation) == wanted


# -- InnerProduct and Embed -------------------------------------------------------------------


def ip_layer(name, k, params, legacy=False, seed=3):
    outputs = params["num_output"]
    weight = _weights((k, outputs) if params.get("transpose") else (outputs, k), seed)
    blobs = [weight]
    if params.get("bias_term", True):
        blobs.append(_weights((outputs,), seed + 1))
    made = layer(name, "InnerProduct", "data", blobs=blobs, inner_product_param=params)
    if legacy:  # as an old Caffe stored them: num, channels, height, width (1, 1, N, K), and (1, 1, 1, N)
        for blob in made.blobs:
            _legacy_fields(blob)
    return made


def _legacy_fields(blob) -> None:
    """Store a BlobProto's shape in the legacy num/channels/height/width fields, padded with leading 1s."""
    dims = [1] * (4 - len(blob.shape.dim)) + list(blob.shape.dim)
    blob.ClearField("shape")
    blob.num, blob.channels, blob.height, blob.width = dims


INNER_PRODUCTS = {
    "axis1": ((3, 4, 2, 3), {"num_output": 5}, 24),
    "axis1_2d": ((4, 7), {"num_output": 3}, 7),
    "axis2": ((2, 3, 4, 5), {"num_output": 6, "axis": 2}, 20),
    "axis2_3d": ((2, 3, 7), {"num_output": 4, "axis": 2}, 7),
    "no_bias": ((3, 5, 2, 2), {"num_output": 4, "bias_term": False}, 20),
}


@pytest.mark.parametrize("name", list(INNER_PRODUCTS))
@pytest.mark.parametrize("legacy", [False, True], ids=["shape", "legacy_shape"])
@pytest.mark.caffe
def test_inner_product_against_caffe(tmp_path, name, legacy):
    shape, params, k = INNER_PRODUCTS[name]
    values = against_caffe(tmp_path, [ip_layer("ip", k, params, legacy)], {"data": _input(shape)})
    axis = params.get("axis", 1)
    assert values["ip"].shape == shape[:axis] + (params["num_output"],)


@pytest.mark.caffe
@pytest.mark.parametrize("name", list(INNER_PRODUCTS))
def test_inner_product_transpose_against_caffe(tmp_path, name):
    shape, params, k = INNER_PRODUCTS[name]
    against_caffe(tmp_path, [ip_layer("ip", k, dict(params, transpose=True))], {"data": _input(shape)})


@pytest.mark.caffe
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("shape", [(4,), (2, 3), (2, 1, 5)], ids=lambda s: "x".join(map(str, s)))
def test_embed_against_caffe(tmp_path, bias, shape):
    weight, offsets = _weights((7, 3), 5), _weights((3,), 6)
    made = layer("e", "Embed", "data", blobs=[weight, offsets] if bias else [weight],
                 embed_param={"num_output": 3, "input_dim": 7, "bias_term": bias})
    x = np.random.default_rng(0).integers(0, 7, shape).astype(np.float32)
    against_caffe(tmp_path, [made], {"data": x})


# -- refusals ---------------------------------------------------------------------------------


def run_one(made, shapes, values=None):
    """Build the layer, check its wiring and reshape it for `shapes`; forward `values` (random of those shapes)."""
    blobs = [np.asarray(b.data, np.float32).reshape(tuple(b.shape.dim)) for b in made.blobs]
    built = layer_class(made.type)(made.name, made.type, made, blobs)
    built.check_counts(len(made.bottom), len(made.top))
    built.reshape([tuple(s) for s in shapes])
    return built.forward(values if values is not None else [_input(s) for s in shapes])


def _conv(params, shape=(1, 3, 5, 5), kind="Convolution"):
    return conv_layer("bad", kind, shape, params)


def _pool(params, tops=None):
    return layer("bad", "Pooling", "data", tops=tops, pooling_param=params)


ERRORS = {
    "conv_kernel_past_pad": (lambda: _conv({"num_output": 2, "kernel_size": [4], "pad": [1]}, (1, 3, 1, 5)),
                             [(1, 3, 1, 5)], "kernel extent 4 (kernel 4, dilation 1) is larger than the padded "
                                             "height 3 (height 1 + 2 x pad 1)"),
    "conv_dilated_kernel_past_input": (lambda: _conv({"num_output": 2, "kernel_size": [3], "dilation": [3]}),
                                       [(1, 3, 5, 5)], "kernel extent 7 (kernel 3, dilation 3) is larger than the "
                                                       "padded height 5"),
    "conv_weight_shape": (lambda: layer("bad", "Convolution", "data", blobs=[np.zeros((2, 3, 3, 2)), np.zeros(2)],
                                        convolution_param={"num_output": 2, "kernel_size": [3]}),
                          [(1, 3, 5, 5)], "weight blob has shape (2, 3, 3, 2), expected (2, 3, 3, 3) (num_output, "
                                          "channels / group, kernel_h, kernel_w) for a bottom of 3 channels"),
    "conv_weight_channels": (lambda: _conv({"num_output": 2, "kernel_size": [3]}), [(1, 4, 5, 5)],
                             "weight blob has shape (2, 3, 3, 3), expected (2, 4, 3, 3)"),
    "conv_bias_shape": (lambda: layer("bad", "Convolution", "data", blobs=[np.zeros((2, 3, 3, 3)), np.zeros((1, 2))],
                                      convolution_param={"num_output": 2, "kernel_size": [3]}), [(1, 3, 5, 5)],
                        "bias blob has shape (1, 2), expected (2,)"),
    "conv_group_channels": (lambda: _conv({"num_output": 4, "kernel_size": [1], "group": 2}, (1, 4, 3, 3)),
                            [(1, 3, 3, 3)], "bottom has 3 channels, not a multiple of group 2"),
    "conv_group_outputs": (lambda: _conv({"num_output": 3, "kernel_size": [1], "group": 2}, (1, 4, 3, 3)),
                           [(1, 4, 3, 3)], "num_output 3 is not a multiple of group 2"),
    "conv_both_spellings": (lambda: _conv({"num_output": 2, "kernel_size": [3], "kernel_h": 3, "kernel_w": 3}),
                            [(1, 3, 5, 5)], "gives both kernel_size and kernel_h/kernel_w"),
    "conv_no_kernel": (lambda: layer("bad", "Convolution", "data", blobs=[np.zeros((2, 3, 1, 1))],
                                     convolution_param={"num_output": 2, "bias_term": False}),
                       [(1, 3, 5, 5)], "has no kernel_size (nor kernel_h and kernel_w)"),
    "conv_stride_0": (lambda: _conv({"num_output": 2, "kernel_size": [3], "stride_h": 2}), [(1, 3, 5, 5)],
                      "stride 2 x 0: stride dimensions must be nonzero"),
    "conv_kernel_3_times": (lambda: _conv({"num_output": 2, "kernel_size": [3, 3, 3]}), [(1, 3, 5, 5)],
                            "kernel_size is given 3 times"),
    "conv_3d": (lambda: _conv({"num_output": 2, "kernel_size": [3]}), [(1, 3, 5, 5, 5)],
                "has 3 spatial axes after axis 1: blobtool runs 2-D convolution only"),
    "conv_blob_count": (lambda: layer("bad", "Convolution", "data", blobs=[np.zeros((2, 3, 3, 3))],
                                      convolution_param={"num_output": 2, "kernel_size": [3]}),
                        [(1, 3, 5, 5)], "holds 1 blobs, expected 2 (weights and bias; bias_term is true)"),
    "conv_num_output_0": (lambda: layer("bad", "Convolution", "data", blobs=[np.zeros((1, 3, 3, 3))],
                                        convolution_param={"kernel_size": [3], "bias_term": False}),
                          [(1, 3, 5, 5)], "num_output must be positive"),
    "deconv_weight_shape": (lambda: layer("bad", "Deconvolution", "data", blobs=[np.zeros((4, 3, 2, 2)), np.zeros(4)],
                                          convolution_param={"num_output": 4, "kernel_size": [2]}), [(1, 3, 5, 5)],
                            "weight blob has shape (4, 3, 2, 2), expected (3, 4, 2, 2) (channels, num_output / "
                            "group, kernel_h, kernel_w)"),
    "deconv_pad_past_output": (lambda: _conv({"num_output": 2, "kernel_size": [2], "pad": [2]}, (1, 3, 1, 1),
                                             kind="Deconvolution"), [(1, 3, 1, 1)],
                               "output height would be -2"),
    "pool_kernel_past_pad": (lambda: _pool({"pool": MAX, "kernel_size": 4, "pad": 1}), [(1, 2, 1, 6)],
                             "kernel 4 is larger than the padded height 3 (height 1 + 2 x pad 1)"),
    "pool_stochastic": (lambda: _pool({"pool": STOCHASTIC, "kernel_size": 2}), [(1, 2, 4, 4)],
                        "STOCHASTIC pooling has no CPU forward in Caffe"),
    "pool_pad_not_below_kernel": (lambda: _pool({"pool": AVE, "kernel_size": 2, "pad": 2}), [(1, 2, 4, 4)],
                                  "pad 2 x 2 must be smaller than the kernel 2 x 2"),
    "pool_global_with_kernel": (lambda: _pool({"pool": MAX, "global_pooling": True, "kernel_size": 2}),
                                [(1, 2, 4, 4)], "global_pooling takes its kernel from the bottom"),
    "pool_global_with_stride": (lambda: _pool({"pool": AVE, "global_pooling": True, "stride": 2}),
                                [(1, 2, 4, 4)], "global_pooling takes only pad 0 and stride 1"),
    "pool_no_kernel": (lambda: _pool({"pool": MAX, "kernel_h": 2}), [(1, 2, 4, 4)],
                       "has no kernel: give kernel_size, or both kernel_h and kernel_w"),
    "pool_both_kernels": (lambda: _pool({"pool": MAX, "kernel_size": 2, "kernel_h": 2, "kernel_w": 2}),
                          [(1, 2, 4, 4)], "the kernel is kernel_size, or both kernel_h and kernel_w; not both"),
    "pool_half_pad": (lambda: _pool({"pool": MAX, "kernel_size": 3, "pad_h": 1}), [(1, 2, 4, 4)],
                      "give pad, or both pad_h and pad_w"),
    "pool_3_axes": (lambda: _pool({"pool": MAX, "kernel_size": 2}), [(2, 4, 4)],
                    "bottom has shape (2, 4, 4); pooling takes 4 axes (num, channels, height, width)"),
    "pool_ave_mask": (lambda: _pool({"pool": AVE, "kernel_size": 2}, tops=["a", "b"]), [(1, 2, 4, 4)],
                      "has 2 tops, expected 1"),
    "ip_weight_shape": (lambda: ip_layer("bad", 12, {"num_output": 3}), [(2, 3, 5)],
                        "weight blob has shape (3, 12), expected (3, 15) (num_output, K with K = 15 values "
                        "from axis 1)"),
    "ip_transposed_weight_shape": (lambda: ip_layer("bad", 12, {"num_output": 3, "transpose": True}),
                                   [(2, 4)], "weight blob has shape (12, 3), expected (4, 3) (K, num_output "
                                                "with transpose, K = 4 values from axis 1)"),
    "ip_axis": (lambda: ip_layer("bad", 4, {"num_output": 3, "axis": 3}), [(2, 3, 4)],
                "axis 3 is out of range for a 3-axis blob"),
    "ip_bias": (lambda: layer("bad", "InnerProduct", "data", blobs=[np.zeros((3, 4)), np.zeros(4)],
                              inner_product_param={"num_output": 3}), [(2, 4)],
                "bias blob has shape (4,), expected (3,)"),
    "embed_index_past_input_dim": (lambda: layer("bad", "Embed", "data", blobs=[np.zeros((5, 2))],
                                                 embed_param={"num_output": 2, "input_dim": 5, "bias_term": False}),
                                   [(3,)], "index 5 at flat position 1 is out of range [0, 5) (input_dim 5)"),
    "embed_negative_index": (lambda: layer("bad", "Embed", "data", blobs=[np.zeros((5, 2))],
                                           embed_param={"num_output": 2, "input_dim": 5, "bias_term": False}),
                             [(3,)], "index -1 at flat position 2 is out of range [0, 5)"),
    "embed_fraction": (lambda: layer("bad", "Embed", "data", blobs=[np.zeros((5, 2))],
                                     embed_param={"num_output": 2, "input_dim": 5, "bias_term": False}),
                       [(3,)], "bottom value 2.5 at flat position 0 is not an integer index"),
    "embed_weight_shape": (lambda: layer("bad", "Embed", "data", blobs=[np.zeros((2, 5))],
                                         embed_param={"num_output": 2, "input_dim": 5, "bias_term": False}),
                           [(3,)], "weight blob has shape (2, 5), expected (5, 2) (input_dim, num_output)"),
    "embed_no_input_dim": (lambda: layer("bad", "Embed", "data", blobs=[np.zeros((5, 2))],
                                         embed_param={"num_output": 2, "bias_term": False}),
                           [(3,)], "input_dim must be positive"),
}

# The bottom values an error case runs with, where random ones would not show it.
ERROR_VALUES = {
    "embed_index_past_input_dim": [np.array([0, 5, 1], np.float32)],
    "embed_negative_index": [np.array([0, 4, -1], np.float32)],
    "embed_fraction": [np.array([2.5, 1, 1], np.float32)],
    "embed_weight_shape": [np.array([1, 1, 1], np.float32)],
    "embed_no_input_dim": [np.array([1, 1, 1], np.float32)],
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_refusals_name_the_layer(case):
    make, shapes, text = ERRORS[case]
    with pytest.raises(LayerError) as caught:
        run_one(make(), shapes, ERROR_VALUES.get(case))
    message = str(caught.value)
    assert message.startswith("layer 'bad' ("), message
    assert text in message, message


# Caffe's verdict on each refusal above, side by side: Caffe refuses them too (a glog CHECK ends
# its process) except these, where blobtool refuses what this Caffe runs, and why.
# Caffe's Embed checks its indices with DCHECK (embed_layer.cpp), which a release build leaves out:
# it truncates a fraction to an integer and reads outside its weight for an index out of range.
CAFFE_RUNS = {
    "embed_index_past_input_dim": "DCHECK_LT(index, K_) is compiled out: Caffe reads past its weight",
    "embed_negative_index": "DCHECK_GE(index, 0) is compiled out: Caffe reads before its weight",
    "embed_fraction": "DCHECK_EQ(static_cast<Dtype>(index), bottom_data[n]) is compiled out: Caffe truncates",
}


@pytest.mark.caffe
@pytest.mark.parametrize("case", list(ERRORS))
def test_caffe_refuses_what_blobtool_refuses(tmp_path, case):
    make, shapes, _ = ERRORS[case]
    made = make()
    inputs = {f"in{k}": s for k, s in enumerate(shapes)}
    made.bottom[:] = list(inputs)
    values = ERROR_VALUES.get(case) or [_input(s) for s in shapes]
    refusal = caffe_refusal(net([made], inputs), dict(zip(inputs, values)), tmp_path)
    if case in CAFFE_RUNS:
        assert refusal is None, f"Caffe refuses it now: {refusal.line}"
    else:
        assert refusal is not None, "Caffe runs what blobtool refuses"
