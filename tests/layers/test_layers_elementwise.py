"""The element-wise, normalizing and arithmetic layers (blobtool/layers/neuron.py, normalize.py, arith.py).

Each case is a small net run by blobtool and by an oracle, compared on every
blob the net's layers write: shapes equal, infinities and NaN at the same
places, the rest within a tolerance of the largest magnitude of the
oracle's blob. The oracles, per layer type:

- real Caffe (BVLC with caffe-ssd's layers, tests/helpers/caffeoracle.py), within
  1e-5 (both compute in float32): ReLU, PReLU, ELU, Sigmoid, TanH, AbsVal,
  BNLL, Power, Exp, Log, Threshold, Dropout, BatchNorm (three blobs, global
  or batch statistics), LRN, MVN, Softmax, Normalize, Scale, Bias, Eltwise,
  Reduction and ArgMax: every parameter, blobs of no axes, ties;
- OpenCV 4.x's Caffe importer (tests/helpers/caffenets.py), within 1e-4, for the
  layers this Caffe lacks and OpenCV has: ReLU6, and Swish with its default
  beta;
- loop-by-loop definitions below, written from the source of the Caffe that
  has the layer, in float64, within 1e-4, where neither has it: Swish's
  `beta` (OpenCV has no beta), Clip (BVLC's, added after this Caffe; OpenCV
  4.x has none), NVIDIA Caffe's five-blob BatchNorm (a fork's form: BVLC's
  BatchNorm takes three blobs and Caffe refuses five, which a test asserts)
  and the forks' Dropout `scale_train`.

The refusals (ERROR_CASES) are Caffe's too: each net blobtool refuses, Caffe
refuses, and the table holds both messages side by side.

Where blobtool and this Caffe part (measured; blobtool's code is unchanged):

- Sigmoid: this Caffe (2017) computes 1 / (1 + exp(-x)), BVLC since 2018
  and blobtool 0.5 * tanh(0.5 * x) + 0.5. They differ by at most 6e-8 (one
  float32 unit at 0.5); below x = -17 blobtool gives 0 where this Caffe gives
  values under 3e-8, so a blob holding only such values differs wholly. The
  cases keep their sigmoids above that tail.
- Caffe copies each parameter blob by shape (net.cpp: "Cannot copy param
  ... shape mismatch"), blobtool by count: a shared PReLU slope or Normalize
  scale, or a num_axes 0 Scale, stored as (1,) where Caffe makes (), and a
  (1, 3) blob where Caffe makes (3,), run in blobtool and are refused by
  Caffe. The cases store Caffe's shapes (legacy 4-D fields, which Caffe
  reads as the blob's shape, included).

Where OpenCV 4.x, the oracle before Caffe, departs from Caffe on these
layers (measured by these cases when OpenCV was their oracle): it has no
ArgMax, Bias, Reduction or Threshold; its LRN ignores `k` and takes a
missing alpha as 1e-4 (Caffe: 1); its MVN adds eps to the variance, Caffe to
the standard deviation; its Log has no `base`, `scale` or `shift`; its
BatchNorm refuses use_global_stats false; its Eltwise refuses coeff with MAX
(Caffe leaves them unused); it reads a blob of no axes (Caffe's shape of a
shared PReLU slope, a shared Normalize scale, a scalar Scale) as shape (1,),
which Caffe refuses; its Scale misreads a negative axis and fails on two
bottoms with bias_term; its Normalize refuses across_spatial with one scale
per channel.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from caffenets import against_opencv as opencv_against
from caffenets import layer, max_scaled_difference, net, ours_forward, random_feeds, tops_of
from caffeoracle import against_caffe as caffe_against
from caffeoracle import caffe_refusal

from blobtool.layers import LayerError

TOLERANCE = 1e-4
# Against real Caffe: both compute in float32, in orders that differ by a few units of rounding.
CAFFE_TOLERANCE = 1e-5
SHAPE = (2, 3, 5, 7)


# -- running a case ---------------------------------------------------------------------------


def _feeds(inputs: dict, seed: int, feed=None) -> dict:
    """The sweeps' inputs: standard normal times 2, or `feed`'s range (caffenets.random_feeds)."""
    return random_feeds(inputs, seed, scale=2, feed=feed)


def against_caffe(tmp_path, layers, inputs: dict, seed: int = 0, feed=None, feeds=None) -> dict:
    """caffeoracle.against_caffe within CAFFE_TOLERANCE on `_feeds(inputs, seed, feed)`, or on `feeds` (arrays)."""
    return caffe_against(tmp_path, layers, _feeds(inputs, seed, feed) if feeds is None else feeds,
                         tolerance=CAFFE_TOLERANCE)


def against_opencv(tmp_path, layers, inputs: dict, seed: int = 0, feed=None) -> dict:
    """caffenets.against_opencv within TOLERANCE on `_feeds(inputs, seed, feed)`."""
    return opencv_against(layers, inputs, _feeds(inputs, seed, feed), tolerance=TOLERANCE)


def against_definition(layers, inputs: dict, expected, seed: int = 0, feed=None) -> None:
    """Run the net with blobtool; assert its last top agrees with `expected(feeds)` (the loop definition)."""
    message = net(layers, inputs)
    feeds = _feeds(inputs, seed, feed)
    top = tops_of(message.layer)[-1]
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


def _legacy_fields(blob) -> None:
    """Store a BlobProto's shape in the legacy num/channels/height/width fields, padded with leading 1s."""
    dims = [1] * (4 - len(blob.shape.dim)) + list(blob.shape.dim)
    blob.ClearField("shape")
    blob.num, blob.channels, blob.height, blob.width = dims


# -- loop definitions, where neither Caffe nor OpenCV has the layer (float64) ----------------------


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
    # BVLC swish_layer.cpp: x * sigmoid(beta * x), sigmoid(v) = 0.5 * tanh(0.5 * v) + 0.5
    return loop_elementwise(x, lambda v: v * (0.5 * math.tanh(0.5 * beta * v) + 0.5))


def loop_clip(x, low, high):
    # BVLC clip_layer.cpp: std::max(min, std::min(x, max))
    return loop_elementwise(x, lambda v: max(low, min(v, high)))


def loop_batch_norm_nvcaffe(x, mean, variance, scale, bias, eps):
    # NVIDIA Caffe batch_norm_layer.cpp, TEST: (x - mean) * (var + max(eps, 1e-5))^-0.5 * scale + bias
    eps = max(eps, 1e-5)
    y = np.empty(x.shape)
    for index in _index_loops(x.shape):
        c = index[1]
        y[index] = (x[index] - mean[c]) / math.sqrt(variance[c] + eps) * scale[c] + bias[c]
    return y


# -- neuron.py --------------------------------------------------------------------------------

# (id, type, params, input shape, feed); every one compared with Caffe.
NEURONS = [
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
    ("log-e-0.5-3", "Log", {"log_param": {"scale": 0.5, "shift": 3.0}}, SHAPE, positive()),
    ("log-base2-0.5-3", "Log", {"log_param": {"base": 2.0, "scale": 0.5, "shift": 3.0}}, SHAPE, positive()),
    ("log-base10-2-1", "Log", {"log_param": {"base": 10.0, "scale": 2.0, "shift": 1.0}}, SHAPE, positive()),
    ("log-base0.5", "Log", {"log_param": {"base": 0.5}}, (3, 7), positive()),
    # log(0) = -inf and log of a negative NaN, at the same places as Caffe's; likewise a negative's square root.
    ("log-of-nonpositive", "Log", {"log_param": {"base": 2.0}}, SHAPE, integers(-2, 3)),
    ("power-0.5-of-negatives", "Power", {"power_param": {"power": 0.5, "shift": -1.0}}, SHAPE, integers(-2, 4)),
    ("threshold-0", "Threshold", {}, SHAPE, integers()),
    ("threshold-0.3", "Threshold", {"threshold_param": {"threshold": 0.3}}, SHAPE, None),
    ("threshold-neg1", "Threshold", {"threshold_param": {"threshold": -1.0}}, SHAPE, integers()),
    ("dropout", "Dropout", {}, SHAPE, None),
    ("dropout-0.3", "Dropout", {"dropout_param": {"dropout_ratio": 0.3}}, (3, 11), None),
]


@pytest.mark.caffe
@pytest.mark.parametrize("kind, params, shape, feed", [case[1:] for case in NEURONS], ids=[case[0] for case in NEURONS])
def test_neuron_against_caffe(tmp_path, kind, params, shape, feed):
    against_caffe(tmp_path, [layer("a", kind, "data", "a", **params)], {"data": shape}, feed=feed)


# Layers this Caffe lacks (added to BVLC after it, or a fork's): OpenCV 4.x has them.
NEURONS_WITH_OPENCV = [
    ("relu6", "ReLU6", {}, SHAPE, lambda rng, shape: rng.uniform(-9, 9, shape)),
    ("swish-beta1", "Swish", {}, SHAPE, None),
]


@pytest.mark.parametrize("kind, params, shape, feed", [case[1:] for case in NEURONS_WITH_OPENCV],
                         ids=[case[0] for case in NEURONS_WITH_OPENCV])
def test_neuron_against_opencv(tmp_path, kind, params, shape, feed):
    against_opencv(tmp_path, [layer("a", kind, "data", "a", **params)], {"data": shape}, feed=feed)


# (id, type, params, shape, feed, definition(x)): neither Caffe nor OpenCV has the layer or the parameter.
NEURONS_WITH_DEFINITION = [
    ("swish-beta0.5", "Swish", {"swish_param": {"beta": 0.5}}, SHAPE, None, lambda x: loop_swish(x, 0.5)),
    ("swish-beta2", "Swish", {"swish_param": {"beta": 2.0}}, (2, 5, 3), None, lambda x: loop_swish(x, 2.0)),
    ("clip-neg1-1", "Clip", {"clip_param": {"min": -1.0, "max": 1.0}}, SHAPE, None, lambda x: loop_clip(x, -1, 1)),
    ("clip-neg0.5-2.5", "Clip", {"clip_param": {"min": -0.5, "max": 2.5}}, (3, 7), None,
     lambda x: loop_clip(x, -0.5, 2.5)),
]


@pytest.mark.parametrize("kind, params, shape, feed, definition", [case[1:] for case in NEURONS_WITH_DEFINITION],
                         ids=[case[0] for case in NEURONS_WITH_DEFINITION])
def test_neuron_against_definition(kind, params, shape, feed, definition):
    against_definition([layer("a", kind, "data", "a", **params)], {"data": shape},
                       lambda feeds: definition(feeds["data"]), feed=feed)


PRELU_CASES = [
    ("per-channel", False, SHAPE),
    ("shared", True, SHAPE),
    ("per-channel-2d", False, (4, 5)),
    ("per-channel-3d", False, (2, 5, 3)),
    ("shared-2d", True, (4, 5)),
]


@pytest.mark.caffe
@pytest.mark.parametrize("shared, shape", [case[1:] for case in PRELU_CASES], ids=[case[0] for case in PRELU_CASES])
def test_prelu_against_caffe(tmp_path, shared, shape):
    # A shared slope is a blob of no axes, as prelu_layer.cpp makes it (vector<int>(0)).
    slopes = np.array(-0.3) if shared else np.linspace(-0.5, 0.75, shape[1])
    layers = [layer("p", "PReLU", "data", "p", blobs=[slopes], prelu_param={"channel_shared": shared})]
    against_caffe(tmp_path, layers, {"data": shape})


@pytest.mark.caffe
def test_in_place_chain_against_caffe(tmp_path):
    """Layers that write their bottom (Caffe's in-place tops): each later one reads the earlier's output."""
    layers = [layer("conv_like", "Power", "data", "x", power_param={"scale": 1.5, "shift": -0.25}),
              layer("relu", "ReLU", "x", "x", relu_param={"negative_slope": 0.2}),
              layer("drop", "Dropout", "x", "x"),
              layer("tanh", "TanH", "x", "y"),
              layer("prelu", "PReLU", "y", "y", blobs=[np.array([0.5, -1.0, 2.0])])]
    against_caffe(tmp_path, layers, {"data": SHAPE})


@pytest.mark.caffe
def test_exp_overflows_to_inf_quietly(tmp_path):
    """exp(x) past float32's range is inf in Caffe too; no warning is raised on the way."""
    x = np.array([[0.0, 100.0, -200.0, 88.0, 89.0]], np.float32)
    with np.errstate(all="raise"):
        out = against_caffe(tmp_path, [layer("e", "Exp", "data", "e")], {}, feeds={"data": x})["e"]
    assert out[0, 0] == 1 and np.isinf(out[0, 1]) and out[0, 2] == 0 and np.isinf(out[0, 4])


def test_dropout_copies():
    """At test time Dropout's top is a copy: the bottom is never the same array."""
    message = net([layer("d", "Dropout", "data", "d", dropout_param={"dropout_ratio": 0.7})], {"data": (2, 3)})
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = ours_forward(message, {"data": x})["d"]
    assert np.array_equal(out, x) and not np.shares_memory(out, x)


def test_dropout_scale_train_false():
    """Forks' DropoutParameter.scale_train false: TEST multiplies by 1 / scale = 1 - dropout_ratio.

    blobtool's schema has no scale_train field; a stand-in parameter message
    carries it here as a fork's schema would. Neither Caffe nor OpenCV has the
    field: the oracle is the fork's source.
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
    # use_global_stats false (a training prototxt run as is): each channel's mean and variance over the batch
    ("batch-stats", SHAPE, 1.0, {"use_global_stats": False, "eps": 1e-4}),
    ("batch-stats-2d", (5, 3), 2.0, {"use_global_stats": False}),
    ("batch-stats-3d", (2, 3, 5), 1.0, {"use_global_stats": False, "eps": 0.5}),
    ("batch-stats-one-image", (1, 4, 3, 3), 0.0, {"use_global_stats": False}),
]


@pytest.mark.caffe
@pytest.mark.parametrize("shape, factor, params", [case[1:] for case in BATCH_NORM_CASES],
                         ids=[case[0] for case in BATCH_NORM_CASES])
def test_batch_norm_against_caffe(tmp_path, shape, factor, params):
    blobs = _batch_norm_blobs(shape[1], factor)
    layers = [layer("bn", "BatchNorm", "data", "bn", blobs=blobs, batch_norm_param=params)]
    ours = against_caffe(tmp_path, layers, {"data": shape})
    if factor == 0 and params.get("use_global_stats", True):
        # mean and variance 0: y = x / sqrt(eps)
        x = _feeds({"data": shape}, 0)["data"]
        assert np.allclose(ours["bn"], x / np.sqrt(np.float32(1e-5)), rtol=1e-5)


def _nvcaffe_batch_norm(eps, seed=5):
    rng = np.random.default_rng(seed)
    mean, variance = rng.standard_normal(3), rng.uniform(0.2, 2.0, 3)
    scale, bias = rng.uniform(-2, 2, 3), rng.standard_normal(3)
    made = layer("bn", "BatchNorm", "data", "bn", blobs=[mean, variance, [1.0], scale, bias],
                 batch_norm_param={"eps": eps})
    return made, (mean, variance, scale, bias)


@pytest.mark.parametrize("eps", [1e-5, 1e-7, 1e-3], ids=["eps1e-5", "eps1e-7-raised", "eps1e-3"])
def test_batch_norm_nvcaffe_five_blobs(eps):
    """NVIDIA Caffe's five blobs: mean, variance, an unused factor, then a scale and a bias per channel.

    A fork's form, against its source: BVLC's Caffe refuses it
    (test_batch_norm_five_blobs_is_not_bvlc_caffes) and OpenCV 4.x too.
    """
    made, (mean, variance, scale, bias) = _nvcaffe_batch_norm(eps)
    against_definition([made], {"data": SHAPE},
                       lambda feeds: loop_batch_norm_nvcaffe(feeds["data"], mean, variance, scale, bias, eps))


@pytest.mark.caffe
def test_batch_norm_five_blobs_is_not_bvlc_caffes(tmp_path):
    """BVLC's BatchNorm makes three blobs, and Caffe will not copy five into them: the form is NVIDIA Caffe's."""
    made, _ = _nvcaffe_batch_norm(1e-5)
    refusal = caffe_refusal(net([made], {"data": SHAPE}), _feeds({"data": SHAPE}, 0), tmp_path)
    assert refusal is not None and "Incompatible number of blobs for layer bn" in refusal.line, refusal


# -- normalize.py: LRN --------------------------------------------------------------------------

# (id, params, shape); Caffe's defaults: local_size 5, alpha 1, beta 0.75, k 1, ACROSS_CHANNELS.
LRN_CASES = [
    ("defaults", {}, (2, 5, 3, 5)),
    ("across-5", {"alpha": 1.0}, (2, 7, 5, 9)),
    ("across-5-alpha1e-4", {"alpha": 1e-4}, (2, 7, 5, 9)),
    ("across-3-alpha0.5", {"local_size": 3, "alpha": 0.5, "beta": 0.75}, (2, 7, 5, 9)),
    ("across-7-beta0.3", {"local_size": 7, "alpha": 2.0, "beta": 0.3}, (2, 7, 5, 9)),
    ("across-7-wider-than-channels", {"local_size": 7, "alpha": 2.0, "beta": 0.3}, (2, 5, 3, 5)),
    ("across-1", {"local_size": 1, "alpha": 0.3}, (2, 7, 5, 9)),
    ("across-5-k2", {"k": 2.0}, (2, 5, 3, 5)),
    ("across-3-k0.5", {"local_size": 3, "alpha": 0.5, "beta": 0.6, "k": 0.5}, (2, 5, 3, 5)),
    ("within-defaults", {"norm_region": 1}, (2, 5, 3, 5)),
    ("within-3", {"norm_region": 1, "local_size": 3, "alpha": 0.5}, (2, 7, 5, 9)),
    ("within-5-beta0.3", {"norm_region": 1, "local_size": 5, "alpha": 2.0, "beta": 0.3}, (2, 7, 5, 9)),
    # Caffe's WITHIN_CHANNEL ignores k.
    ("within-5-k3", {"norm_region": 1, "local_size": 5, "alpha": 2.0, "beta": 0.3, "k": 3.0}, (2, 5, 3, 5)),
    ("within-7-larger-than-image", {"norm_region": 1, "local_size": 7, "alpha": 1.5}, (2, 5, 3, 5)),
]


@pytest.mark.caffe
@pytest.mark.parametrize("params, shape", [case[1:] for case in LRN_CASES], ids=[case[0] for case in LRN_CASES])
def test_lrn_against_caffe(tmp_path, params, shape):
    against_caffe(tmp_path, [layer("lrn", "LRN", "data", "lrn", lrn_param=params)], {"data": shape})


# -- normalize.py: MVN, Softmax, Normalize --------------------------------------------------------

# (id, params, shape); Caffe's eps (1e-9 by default) is added to the standard deviation.
MVN_CASES = [
    ("default", {}, SHAPE),
    ("across-channels", {"across_channels": True}, SHAPE),
    ("mean-only", {"normalize_variance": False}, SHAPE),
    ("mean-only-across", {"normalize_variance": False, "across_channels": True}, SHAPE),
    ("eps0.5", {"eps": 0.5}, SHAPE),
    ("eps0.5-across", {"eps": 0.5, "across_channels": True}, SHAPE),
    ("eps2-single-values", {"eps": 2.0, "normalize_variance": True}, (1, 3, 1, 1)),
    ("eps0.25-3d", {"eps": 0.25}, (3, 5, 7)),
    # MVN's Reshape is (num, channels, height, width): a 2-D bottom gives a 4-D top.
    ("2d", {}, (3, 5)),
    ("1d", {"eps": 0.5}, (6,)),
]


@pytest.mark.caffe
@pytest.mark.parametrize("params, shape", [case[1:] for case in MVN_CASES], ids=[case[0] for case in MVN_CASES])
def test_mvn_against_caffe(tmp_path, params, shape):
    ours = against_caffe(tmp_path, [layer("mvn", "MVN", "data", "mvn", mvn_param=params)], {"data": shape})
    assert ours["mvn"].ndim == 4


SOFTMAX_CASES = [
    ("axis1", {}, SHAPE, None),
    ("axis2", {"axis": 2}, SHAPE, None),
    ("axis-neg1", {"axis": -1}, SHAPE, None),
    ("axis0", {"axis": 0}, (3, 5), None),
    ("2d", {}, (3, 11), None),
    ("large-values", {}, SHAPE, wide),
]


@pytest.mark.caffe
@pytest.mark.parametrize("params, shape, feed", [case[1:] for case in SOFTMAX_CASES],
                         ids=[case[0] for case in SOFTMAX_CASES])
def test_softmax_against_caffe(tmp_path, params, shape, feed):
    against_caffe(tmp_path, [layer("prob", "Softmax", "data", "prob", softmax_param=params)], {"data": shape},
                  feed=feed)


def _normalize_scale(channel_shared, channels):
    # A shared scale is a blob of no axes, as caffe-ssd's normalize_layer.cpp makes it.
    return np.array(20.0) if channel_shared else np.linspace(5.0, 25.0, channels)


# (id, params, shape); caffe-ssd's defaults: across_spatial and channel_shared true, eps 1e-10.
NORMALIZE_CASES = [
    ("spatial-shared", {}, SHAPE),
    ("spatial-per-channel", {"channel_shared": False}, SHAPE),
    ("spatial-per-channel-eps0.5", {"channel_shared": False, "eps": 0.5}, (2, 3, 1, 1)),
    ("per-position-per-channel", {"across_spatial": False, "channel_shared": False}, SHAPE),
    ("per-position-shared", {"across_spatial": False}, SHAPE),
    ("per-position-eps2", {"across_spatial": False, "eps": 2.0}, SHAPE),
    ("eps1e-3", {"across_spatial": False, "channel_shared": False, "eps": 1e-3}, (1, 5, 3, 3)),
    ("2d", {"across_spatial": False, "channel_shared": False}, (3, 5)),
    ("2d-spatial", {"channel_shared": False}, (3, 5)),
    ("3d", {"across_spatial": False}, (2, 3, 5)),
]


@pytest.mark.caffe
@pytest.mark.parametrize("params, shape", [case[1:] for case in NORMALIZE_CASES],
                         ids=[case[0] for case in NORMALIZE_CASES])
def test_normalize_against_caffe(tmp_path, params, shape):
    scale = _normalize_scale(params.get("channel_shared", True), shape[1])
    layers = [layer("norm", "Normalize", "data", "norm", blobs=[scale], norm_param=params)]
    against_caffe(tmp_path, layers, {"data": shape})


# -- arith.py: Scale, Bias ----------------------------------------------------------------------


def _blobs(shapes, seed=7):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-2, 2, shape) for shape in shapes]


# (id, type, params, operand shape, operand as bottom 1, with a bias blob); a scalar operand has
# no axes, as scale_layer.cpp and bias_layer.cpp make it for num_axes 0.
BROADCASTS = [
    ("scale-axis1", "Scale", {}, (3,), False, False),
    ("scale-axis1-bias", "Scale", {"bias_term": True}, (3,), False, True),
    ("scale-axis1-two-axes", "Scale", {"num_axes": 2}, (3, 5), False, False),
    ("scale-axis2-to-end-bias", "Scale", {"axis": 2, "num_axes": -1, "bias_term": True}, (5, 7), False, True),
    ("scale-axis3", "Scale", {"axis": 3}, (7,), False, False),
    ("scale-axis0", "Scale", {"axis": 0}, (2,), False, False),
    ("scale-axis-neg1", "Scale", {"axis": -1}, (7,), False, False),
    ("scale-axis-neg3-two-axes-bias", "Scale", {"axis": -3, "num_axes": 2, "bias_term": True}, (3, 5), False, True),
    ("scale-scalar", "Scale", {"num_axes": 0}, (), False, False),
    ("scale-scalar-bias", "Scale", {"num_axes": 0, "bias_term": True}, (), False, True),
    ("scale-bottom-axis1", "Scale", {}, (3,), True, False),
    ("scale-bottom-two-axes", "Scale", {}, (3, 5), True, False),
    ("scale-bottom-axis2", "Scale", {"axis": 2}, (5, 7), True, False),
    ("scale-bottom-axis0-all", "Scale", {"axis": 0}, SHAPE, True, False),
    ("scale-bottom-bias", "Scale", {"bias_term": True}, (3,), True, True),
    ("scale-bottom-axis2-bias", "Scale", {"axis": 2, "bias_term": True}, (5, 7), True, True),
    ("scale-bottom-axis-neg2", "Scale", {"axis": -2}, (5,), True, False),
    ("bias-axis1", "Bias", {}, (3,), False, False),
    ("bias-axis1-two-axes", "Bias", {"num_axes": 2}, (3, 5), False, False),
    ("bias-axis2-to-end", "Bias", {"axis": 2, "num_axes": -1}, (5, 7), False, False),
    ("bias-axis-neg2", "Bias", {"axis": -2}, (5,), False, False),
    ("bias-axis0", "Bias", {"axis": 0}, (2,), False, False),
    ("bias-scalar", "Bias", {"num_axes": 0}, (), False, False),
    ("bias-bottom-axis1", "Bias", {}, (3,), True, False),
    ("bias-bottom-axis2", "Bias", {"axis": 2}, (5, 7), True, False),
    ("bias-bottom-axis-neg1", "Bias", {"axis": -1}, (7,), True, False),
]


@pytest.mark.caffe
@pytest.mark.parametrize("kind, params, shape, as_bottom, with_bias", [case[1:] for case in BROADCASTS],
                         ids=[case[0] for case in BROADCASTS])
def test_scale_and_bias_against_caffe(tmp_path, kind, params, shape, as_bottom, with_bias):
    operand, bias = (np.asarray(b, np.float32) for b in _blobs([shape, shape]))
    blobs = ([] if as_bottom else [operand]) + ([bias] if with_bias else [])
    bottoms = ["data", "operand"] if as_bottom else "data"
    key = "scale_param" if kind == "Scale" else "bias_param"
    feeds = {**_feeds({"data": SHAPE}, 0), **({"operand": operand} if as_bottom else {})}
    against_caffe(tmp_path, [layer("op", kind, bottoms, "op", blobs=blobs, **{key: params})], {}, feeds=feeds)


@pytest.mark.caffe
@pytest.mark.parametrize("bias", [False, True], ids=["scale", "scale-bias"])
def test_scale_legacy_blob_fields_against_caffe(tmp_path, bias):
    """Blobs an old Caffe stored in num/channels/height/width (1, 1, 1, 3), which Caffe reads as shape (3,)."""
    made = layer("scale", "Scale", "data", "scale", blobs=_blobs([(3,), (3,)][:1 + bias]),
                 scale_param={"bias_term": bias})
    for blob in made.blobs:
        _legacy_fields(blob)
    against_caffe(tmp_path, [made], {"data": SHAPE})


@pytest.mark.caffe
@pytest.mark.parametrize("kind", ["Scale", "Bias"])
def test_broadcast_by_a_scalar_bottom_against_caffe(tmp_path, kind):
    """A bottom 1 of no axes is one operand for every value, whatever the axis (scale_layer.cpp: axis_ = 0)."""
    key = "scale_param" if kind == "Scale" else "bias_param"
    feeds = {"data": np.arange(12, dtype=np.float32).reshape(1, 3, 4), "k": np.array(-1.5, np.float32)}
    out = against_caffe(tmp_path, [layer("s", kind, ["data", "k"], "s", **{key: {"axis": 2}})], {}, feeds=feeds)["s"]
    wanted = feeds["data"] * feeds["k"] if kind == "Scale" else feeds["data"] + feeds["k"]
    assert out.dtype == np.float32 and np.array_equal(out, wanted)


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
    # Caffe takes coeff with MAX and does not use them.
    ("max-3-coeff-unused", {"operation": 2, "coeff": [2.0, -1.0, 0.5]}, 3),
    ("sum-stable-prod-grad-ignored", {"stable_prod_grad": False}, 2),
    ("prod-stable-prod-grad-false", {"operation": 0, "stable_prod_grad": False}, 2),
]


@pytest.mark.caffe
@pytest.mark.parametrize("params, n", [case[1:] for case in ELTWISE_CASES], ids=[case[0] for case in ELTWISE_CASES])
def test_eltwise_against_caffe(tmp_path, params, n):
    names = [f"x{i}" for i in range(n)]
    feed = integers() if n == 4 else None
    layers = [layer("elt", "Eltwise", names, "elt", eltwise_param=params)]
    against_caffe(tmp_path, layers, {name: SHAPE for name in names}, feed=feed)


REDUCTION_CASES = [(f"{name}-axis{axis}{'-coeff' if coeff != 1 else ''}", op, axis, coeff)
                   for name, op in (("sum", 1), ("asum", 2), ("sumsq", 3), ("mean", 4))
                   for axis, coeff in ((0, 1.0), (1, 1.0), (2, -0.5), (-1, 2.5))]


@pytest.mark.caffe
@pytest.mark.parametrize("op, axis, coeff", [case[1:] for case in REDUCTION_CASES],
                         ids=[case[0] for case in REDUCTION_CASES])
def test_reduction_against_caffe(tmp_path, op, axis, coeff):
    params = {"operation": op, "axis": axis, "coeff": coeff}
    against_caffe(tmp_path, [layer("r", "Reduction", "data", "r", reduction_param=params)], {"data": SHAPE})


@pytest.mark.caffe
def test_blobs_of_no_axes_against_caffe(tmp_path):
    """A Reduction to shape () feeding element-wise layers: every top keeps shape (), float32, as in Caffe."""
    layers = [layer("r", "Reduction", "data", "r", reduction_param={"operation": 3}),
              layer("neg", "Power", "r", "neg", power_param={"scale": -1.0}),
              layer("relu", "ReLU", "neg", "relu", relu_param={"negative_slope": 0.5}),
              layer("sig", "Sigmoid", "relu", "sig"),
              layer("sum", "Eltwise", ["relu", "sig"], "sum", eltwise_param={"coeff": [2.0, 1.0]}),
              layer("mean", "Reduction", "data", "mean", reduction_param={"operation": 4}),
              layer("scaled", "Scale", ["sum", "mean"], "scaled")]
    # Quarters: every sum below is exact in float32. A sigmoid far below 0 (x < -17) is left out: this
    # Caffe's 1 / (1 + exp(-x)) and blobtool's 0.5 * tanh(0.5 * x) + 0.5 part there (the module docstring).
    x = np.arange(6, dtype=np.float32).reshape(2, 3) * np.float32(0.25)
    out = against_caffe(tmp_path, layers, {}, feeds={"data": x})
    assert all(out[name].shape == () for name in ("r", "neg", "relu", "sig", "sum", "mean", "scaled"))
    assert out["relu"] == -1.71875 and out["mean"] == 0.625


ARGMAX_CASES = [
    ("flat-top1", {}, SHAPE, None),
    ("flat-top3-ties", {"top_k": 3}, SHAPE, integers()),
    ("flat-top4-values", {"top_k": 4, "out_max_val": True}, SHAPE, integers()),
    ("flat-2d", {"top_k": 2, "out_max_val": True}, (3, 7), integers(-1, 2)),
    ("flat-1d", {}, (7,), None),
    ("axis1", {"axis": 1}, SHAPE, integers()),
    ("axis1-top2-values", {"axis": 1, "top_k": 2, "out_max_val": True}, SHAPE, integers()),
    ("axis2-top3", {"axis": 2, "top_k": 3}, SHAPE, integers(-1, 2)),
    ("axis-neg1-top5", {"axis": -1, "top_k": 5}, SHAPE, integers(-1, 2)),
    ("axis0", {"axis": 0, "top_k": 2}, SHAPE, None),
    ("all-equal", {"top_k": 3}, (2, 5), lambda rng, shape: np.ones(shape)),
    ("all-equal-values", {"top_k": 5, "out_max_val": True}, (2, 5), lambda rng, shape: np.ones(shape)),
]


@pytest.mark.caffe
@pytest.mark.parametrize("params, shape, feed", [case[1:] for case in ARGMAX_CASES],
                         ids=[case[0] for case in ARGMAX_CASES])
def test_argmax_against_caffe(tmp_path, params, shape, feed):
    against_caffe(tmp_path, [layer("am", "ArgMax", "data", "am", argmax_param=params)], {"data": shape}, feed=feed)


@pytest.mark.caffe
def test_argmax_ties_put_the_larger_index_first(tmp_path):
    """std::greater on (value, index) pairs: of equal values the one further along comes first, in Caffe too."""
    out = against_caffe(tmp_path, [layer("am", "ArgMax", "data", "am", argmax_param={"top_k": 3, "out_max_val": True})],
                        {}, feeds={"data": np.array([[2, 5, 1, 5, 2]], np.float32)})["am"]
    assert out.shape == (1, 2, 3)
    assert out[0, 0].tolist() == [3, 1, 4] and out[0, 1].tolist() == [5, 5, 2]


# -- errors: each names the layer, and Caffe refuses the net too ------------------------------------


def _run(layers, inputs):
    message = net(layers, inputs)
    return ours_forward(message, _feeds(inputs, 0))


# (id, layers, inputs, blobtool's message (its start), a part of the line Caffe's CHECK dies with)
ERROR_CASES = [
    ("argmax-no-axes", [layer("am", "ArgMax", "data", "am")], {"data": ()},
     "layer 'am' (ArgMax): bottom has no axes; ArgMax without axis takes each image's values from axis 1",
     "Check failed: start_axis <= end_axis"),
    ("prelu-no-blob", [layer("act", "PReLU", "data", "act")], {"data": SHAPE},
     "layer 'act' (PReLU): holds 0 blobs, expected 1",
     "Incompatible number of blobs for layer act"),
    ("prelu-slope-count", [layer("act", "PReLU", "data", "act", blobs=[np.ones(4)])], {"data": SHAPE},
     "layer 'act' (PReLU): blob 0 (the slopes) holds 4 values, expected 3 (3 channels: one slope each)",
     "Cannot copy param 0 weights from layer 'act'; shape mismatch"),
    ("prelu-shared-count", [layer("act", "PReLU", "data", "act", blobs=[np.ones(3)],
                                  prelu_param={"channel_shared": True})], {"data": SHAPE},
     "layer 'act' (PReLU): blob 0 (the slopes) holds 3 values, expected 1 (channel_shared: 1 slope)",
     "Cannot copy param 0 weights from layer 'act'; shape mismatch"),
    ("relu-with-blob", [layer("r", "ReLU", "data", "r", blobs=[np.ones(3)])], {"data": SHAPE},
     "layer 'r' (ReLU): holds 1 blobs, expected 0",
     "Incompatible number of blobs for layer r"),
    ("eltwise-coeff-count", [layer("sum", "Eltwise", ["a", "b"], "sum", eltwise_param={"coeff": [1.0, 2.0, 3.0]})],
     {"a": SHAPE, "b": SHAPE},
     "layer 'sum' (Eltwise): has 3 coeff values for 2 bottoms; Caffe takes one coefficient per bottom, or none",
     "Eltwise Layer takes one coefficient per bottom blob"),
    ("eltwise-prod-coeff", [layer("p", "Eltwise", ["a", "b"], "p", eltwise_param={"operation": 0,
                                                                             "coeff": [1.0, 2.0]})],
     {"a": SHAPE, "b": SHAPE}, "layer 'p' (Eltwise): has 2 coeff values; Caffe's Eltwise takes none for PROD "
                               "(coefficients are for SUM)",
     "Eltwise layer only takes coefficients for summation"),
    ("eltwise-shapes", [layer("m", "Eltwise", ["a", "b"], "m")], {"a": SHAPE, "b": (2, 3, 5, 6)},
     "layer 'm' (Eltwise): bottom 1 has shape (2, 3, 5, 6), bottom 0 has (2, 3, 5, 7)",
     "bottom[i]->shape() == bottom[0]->shape()"),
    ("eltwise-one-bottom", [layer("m", "Eltwise", ["a"], "m")], {"a": SHAPE},
     "layer 'm' (Eltwise): has 1 bottom, expected 2 or more",
     "Eltwise Layer takes at least 2 bottom blob(s)"),
    ("scale-bottom-shape", [layer("s", "Scale", ["a", "b"], "s")], {"a": SHAPE, "b": (4,)},
     "layer 's' (Scale): bottom 1 (the scale) has shape (4,), which does not match bottom 0's shape (2, 3, 5, 7) "
     "from axis 1",
     "dimension mismatch between bottom[0]->shape(1) and scale->shape(0)"),
    ("scale-bottom-past-end", [layer("s", "Scale", ["a", "b"], "s", scale_param={"axis": 3})],
     {"a": SHAPE, "b": (7, 2)},
     "layer 's' (Scale): bottom 1 (the scale) has shape (7, 2), which does not match bottom 0's shape "
     "(2, 3, 5, 7) from axis 3",
     "scale blob's shape extends past bottom[0]'s shape"),
    ("scale-blob-shape", [layer("s", "Scale", "a", "s", blobs=[np.ones(5)])], {"a": SHAPE},
     "layer 's' (Scale): blob 0 (the scale) has shape (5,), expected (3,) (bottom 0's shape (2, 3, 5, 7) from "
     "axis 1)",
     "Cannot copy param 0 weights from layer 's'; shape mismatch"),
    ("scale-bias-shape", [layer("s", "Scale", "a", "s", blobs=[np.ones(3), np.ones(2)],
                                scale_param={"bias_term": True})], {"a": SHAPE},
     "layer 's' (Scale): blob 1 (the bias) has shape (2,), expected (3,)",
     "Cannot copy param 1 weights from layer 's'; shape mismatch"),
    ("scale-missing-bias", [layer("s", "Scale", "a", "s", blobs=[np.ones(3)], scale_param={"bias_term": True})],
     {"a": SHAPE}, "layer 's' (Scale): holds 1 blob, expected 2 (the scale, the bias) with 1 bottom",
     "Incompatible number of blobs for layer s"),
    ("scale-no-blob", [layer("s", "Scale", "a", "s")], {"a": SHAPE},
     "layer 's' (Scale): holds 0 blobs, expected 1 (the scale) with 1 bottom",
     "Incompatible number of blobs for layer s"),
    ("scale-num-axes-past-end", [layer("s", "Scale", "a", "s", blobs=[np.ones((5, 7))],
                                       scale_param={"axis": 2, "num_axes": 3})], {"a": SHAPE},
     "layer 's' (Scale): the scale spans axes 2 to 4, past bottom 0's 4 axes (2, 3, 5, 7)",
     "scale blob's shape extends past bottom[0]'s shape"),
    ("scale-axis-out-of-range", [layer("s", "Scale", "a", "s", blobs=[np.ones(3)], scale_param={"axis": 4})],
     {"a": SHAPE}, "layer 's' (Scale): axis 4 is out of range for a 4-axis blob",
     "axis 4 out of range for 4-D Blob"),
    ("bias-no-blob", [layer("b", "Bias", "a", "b")], {"a": SHAPE},
     "layer 'b' (Bias): holds 0 blobs, expected 1 (the bias) with 1 bottom",
     "Incompatible number of blobs for layer b"),
    ("bias-extra-blob", [layer("b", "Bias", ["a", "c"], "b", blobs=[np.ones(3)])], {"a": SHAPE, "c": (3,)},
     "layer 'b' (Bias): holds 1 blob, expected 0 with 2 bottoms",
     "Incompatible number of blobs for layer b"),
    ("batchnorm-four-blobs", [layer("bn", "BatchNorm", "a", "bn", blobs=[np.ones(3)] * 4)], {"a": SHAPE},
     "layer 'bn' (BatchNorm): holds 4 blobs, expected 3 (mean, variance, factor) or 5",
     "Incompatible number of blobs for layer bn"),
    ("batchnorm-two-blobs", [layer("bn", "BatchNorm", "a", "bn", blobs=[np.ones(3)] * 2)], {"a": SHAPE},
     "layer 'bn' (BatchNorm): holds 2 blobs, expected 3 to 5",
     "Incompatible number of blobs for layer bn"),
    ("batchnorm-channels", [layer("bn", "BatchNorm", "a", "bn", blobs=[np.ones(4), np.ones(4), [1.0]])],
     {"a": SHAPE}, "layer 'bn' (BatchNorm): blob 0 (the mean) holds 4 values, expected 3 (bottom has 3 channels)",
     "Cannot copy param 0 weights from layer 'bn'; shape mismatch"),
    ("lrn-even-size", [layer("n", "LRN", "a", "n", lrn_param={"local_size": 4})], {"a": SHAPE},
     "layer 'n' (LRN): local_size is 4; Caffe's LRN takes odd sizes only",
     "LRN only supports odd values for local_size"),
    ("lrn-3d", [layer("n", "LRN", "a", "n")], {"a": (2, 3, 5)},
     "layer 'n' (LRN): bottom has 3 axes (2, 3, 5), expected 4 (num, channels, height, width)",
     "Input must have 4 axes"),
    ("mvn-5d", [layer("m", "MVN", "a", "m")], {"a": (1, 2, 3, 4, 5)},
     "layer 'm' (MVN): bottom has 5 axes (1, 2, 3, 4, 5); Caffe's MVN reads num, channels, height and width, "
     "so at most 4",
     "Cannot use legacy accessors on Blobs with > 4 axes"),
    ("normalize-scale-count", [layer("n", "Normalize", "a", "n", blobs=[np.ones(2)],
                                     norm_param={"channel_shared": False})], {"a": SHAPE},
     "layer 'n' (Normalize): blob 0 (the scale) holds 2 values, expected 3 (3 channels: one scale each)",
     "Cannot copy param 0 weights from layer 'n'; shape mismatch"),
    ("softmax-axis", [layer("p", "Softmax", "a", "p", softmax_param={"axis": -5})], {"a": SHAPE},
     "layer 'p' (Softmax): axis -5 is out of range for a 4-axis blob",
     "axis -5 out of range for 4-D Blob"),
    ("exp-negative-base", [layer("e", "Exp", "a", "e", exp_param={"base": -2.0})], {"a": SHAPE},
     "layer 'e' (Exp): base is -2: it must be strictly positive (or -1 for e)",
     "base must be strictly positive"),
    ("log-base-1", [layer("l", "Log", "a", "l", log_param={"base": 1.0})], {"a": SHAPE},
     "layer 'l' (Log): base is 1: 1 / log(base) = inf",
     "Inf result: 1/log(base) = 1/log(1) = inf"),
    ("absval-in-place", [layer("abs", "AbsVal", "a", "a")], {"a": SHAPE},
     "layer 'abs' (AbsVal): runs in place (top 'a' is its bottom); Caffe's AbsVal does not allow in-place "
     "computation",
     "AbsVal Layer does not allow in-place computation"),
    ("argmax-top-k-flat", [layer("am", "ArgMax", "a", "am", argmax_param={"top_k": 11})], {"a": (2, 2, 5)},
     "layer 'am' (ArgMax): top_k is 11, more than the 10 values of each image (bottom (2, 2, 5))",
     "top_k must be less than or equal to the dimension of the flattened bottom blob"),
    ("argmax-top-k-axis", [layer("am", "ArgMax", "a", "am", argmax_param={"top_k": 4, "axis": 1})], {"a": SHAPE},
     "layer 'am' (ArgMax): top_k is 4, more than the 3 values along axis 1",
     "top_k must be less than or equal to the dimension of the axis"),
    ("argmax-top-k-0", [layer("am", "ArgMax", "a", "am", argmax_param={"top_k": 0})], {"a": SHAPE},
     "layer 'am' (ArgMax): top_k is 0: it must be at least 1",
     "top k must not be less than 1"),
    ("reduction-axis", [layer("r", "Reduction", "a", "r", reduction_param={"axis": 4})], {"a": SHAPE},
     "layer 'r' (Reduction): axis 4 is out of range for a 4-axis blob",
     "axis 4 out of range for 4-D Blob"),
    ("prelu-1d", [layer("p", "PReLU", "a", "p", blobs=[np.array(0.5)], prelu_param={"channel_shared": True})],
     {"a": (4,)}, "layer 'p' (PReLU): bottom has 1 axes, expected 2 or more (the channels are axis 1)",
     "Number of axes of bottom blob must be >=2"),
    ("prelu-0d", [layer("p", "PReLU", "a", "p", blobs=[np.array(0.5)], prelu_param={"channel_shared": True})],
     {"a": ()}, "layer 'p' (PReLU): bottom has 0 axes, expected 2 or more",
     "Number of axes of bottom blob must be >=2"),
    ("relu-two-tops", [layer("r", "ReLU", "a", ["r", "s"])], {"a": SHAPE},
     "layer 'r' (ReLU): has 2 tops, expected 1",
     "ReLU Layer produces 1 top blob(s) as output"),
    ("scale-num-axes-neg2", [layer("s", "Scale", "a", "s", blobs=[np.ones(3)], scale_param={"num_axes": -2})],
     {"a": SHAPE}, "layer 's' (Scale): num_axes is -2: it must be non-negative, or -1 for every axis from axis on",
     "num_axes must be non-negative, or -1 to extend to the end of bottom[0]"),
    ("scale-bottom-and-blob", [layer("s", "Scale", ["a", "b"], "s", blobs=[np.ones(3)])], {"a": SHAPE, "b": (3,)},
     "layer 's' (Scale): holds 1 blob, expected 0 with 2 bottoms",
     "Incompatible number of blobs for layer s"),
    ("scale-bottom-no-bias", [layer("s", "Scale", ["a", "b"], "s", scale_param={"bias_term": True})],
     {"a": SHAPE, "b": (3,)}, "layer 's' (Scale): holds 0 blobs, expected 1 (the bias) with 2 bottoms",
     "Incompatible number of blobs for layer s"),
    ("batchnorm-1d", [layer("bn", "BatchNorm", "a", "bn", blobs=[np.ones(1), np.ones(1), [1.0]])], {"a": (4,)},
     "layer 'bn' (BatchNorm): bottom has 1 axes, expected 2 or more (the channels are axis 1)",
     "axis 1 out of range for 1-D Blob"),
    ("lrn-size-0", [layer("n", "LRN", "a", "n", lrn_param={"local_size": 0})], {"a": SHAPE},
     "layer 'n' (LRN): local_size is 0; Caffe's LRN takes odd sizes only",
     "LRN only supports odd values for local_size"),
    ("normalize-1d", [layer("n", "Normalize", "a", "n", blobs=[np.array(1.0)])], {"a": (4,)},
     "layer 'n' (Normalize): bottom has 1 axes, expected 2 or more (the channels are axis 1)",
     "Number of axes of bottom blob must be >=2"),
    ("softmax-0d", [layer("p", "Softmax", "a", "p", softmax_param={"axis": 0})], {"a": ()},
     "layer 'p' (Softmax): axis 0 is out of range for a 0-axis blob",
     "axis 0 out of range for 0-D Blob"),
    ("exp-base-0", [layer("e", "Exp", "a", "e", exp_param={"base": 0.0})], {"a": SHAPE},
     "layer 'e' (Exp): base is 0: it must be strictly positive (or -1 for e)",
     "base must be strictly positive"),
    ("log-negative-base", [layer("l", "Log", "a", "l", log_param={"base": -2.0})], {"a": SHAPE},
     "layer 'l' (Log): base is -2: it must be strictly positive (or -1 for e)",
     "base must be strictly positive"),
    ("argmax-axis-neg5", [layer("am", "ArgMax", "a", "am", argmax_param={"axis": -5})], {"a": SHAPE},
     "layer 'am' (ArgMax): axis -5 is out of range for a 4-axis blob",
     "axis -5 out of range for 4-D Blob"),
    ("reduction-axis-neg5", [layer("r", "Reduction", "a", "r", reduction_param={"axis": -5})], {"a": SHAPE},
     "layer 'r' (Reduction): axis -5 is out of range for a 4-axis blob",
     "axis -5 out of range for 4-D Blob"),
    ("reduction-of-0d", [layer("r", "Reduction", "a", "r")], {"a": ()},
     "layer 'r' (Reduction): axis 0 is out of range for a 0-axis blob",
     "axis 0 out of range for 0-D Blob"),
]


@pytest.mark.parametrize("layers, inputs, text", [case[1:4] for case in ERROR_CASES],
                         ids=[case[0] for case in ERROR_CASES])
def test_errors_name_the_layer(layers, inputs, text):
    with pytest.raises(LayerError) as caught:
        _run(layers, inputs)
    assert str(caught.value).startswith(text), str(caught.value)


@pytest.mark.caffe
@pytest.mark.parametrize("layers, inputs, caffes", [case[1:3] + case[4:] for case in ERROR_CASES],
                         ids=[case[0] for case in ERROR_CASES])
def test_caffe_refuses_them_too(tmp_path, layers, inputs, caffes):
    """Each net blobtool refuses (test_errors_name_the_layer), Caffe refuses, for the reason beside blobtool's."""
    refusal = caffe_refusal(net(layers, inputs), _feeds(inputs, 0), tmp_path)
    assert refusal is not None, "Caffe runs the net"
    assert caffes in refusal.line, refusal.line
