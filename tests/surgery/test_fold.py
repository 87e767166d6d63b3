"""BatchNorm folded into the layer before it: the arithmetic (blobtool.surgery.fold), checked by running the layers.

tests/helpers/layerforward.py runs Caffe's forward pass in numpy; it is first checked
against the layers' definitions written as plain loops, then conv -> BatchNorm
-> Scale is run against the folded layer on random input, for each layer kind
and weight layout, to float32 rounding.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from blobtool.net.batchnorm import CAFFE_BLOBS, NVCAFFE_BLOBS, NVCAFFE_MIN_EPS
from blobtool.net.batchnorm import statistics as batchnorm_statistics
from blobtool.net.layertypes import output_channels
from blobtool.surgery.fold import DEFAULT_EPS, fold_params
import layerforward as lf

F32_EPS = float(np.finfo(np.float32).eps)


# -- the test forward against the layers' definitions --------------------------------------

def _loop_convolution(x, w, b, stride, pad, dilation, group):
    """out[n, o, y, x] = b[o] + sum over the inputs c of o's group and the kernel of in[..] * w[o, c, i, j]."""
    n_img, channels, height, width = x.shape
    out_c, in_pg, kh, kw = w.shape
    out_h = (height + 2 * pad - dilation * (kh - 1) - 1) // stride + 1
    out_w = (width + 2 * pad - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n_img, out_c, out_h, out_w))
    out_pg = out_c // group
    for n, o, oy, ox in itertools.product(range(n_img), range(out_c), range(out_h), range(out_w)):
        g = o // out_pg
        total = b[o] if b is not None else 0.0
        for c, i, j in itertools.product(range(in_pg), range(kh), range(kw)):
            iy, ix = oy * stride - pad + i * dilation, ox * stride - pad + j * dilation
            if 0 <= iy < height and 0 <= ix < width:
                total += x[n, g * in_pg + c, iy, ix] * w[o, c, i, j]
        out[n, o, oy, ox] = total
    return out


def _loop_deconvolution(x, w, b, stride, pad, dilation, group):
    """Each input value in[n, c, y, x] adds in * w[c, j, i, k] to output channel g * C_out/g + j at
    (y * stride - pad + i * dilation, x * stride - pad + k * dilation), c in group g."""
    n_img, channels, height, width = x.shape
    in_c, out_pg, kh, kw = w.shape
    in_pg = in_c // group
    out_h = stride * (height - 1) + dilation * (kh - 1) + 1 - 2 * pad
    out_w = stride * (width - 1) + dilation * (kw - 1) + 1 - 2 * pad
    out = np.zeros((n_img, out_pg * group, out_h, out_w))
    for n, c, y, xx in itertools.product(range(n_img), range(in_c), range(height), range(width)):
        g = c // in_pg
        for j, i, k in itertools.product(range(out_pg), range(kh), range(kw)):
            oy, ox = y * stride - pad + i * dilation, xx * stride - pad + k * dilation
            if 0 <= oy < out_h and 0 <= ox < out_w:
                out[n, g * out_pg + j, oy, ox] += x[n, c, y, xx] * w[c, j, i, k]
    if b is not None:
        out += np.asarray(b).reshape(1, -1, 1, 1)
    return out


LOOP_CASES = [  # (in channels, out channels, kernel, stride, pad, dilation, group)
    (3, 4, 3, 1, 1, 1, 1),
    (4, 6, 3, 2, 2, 2, 2),
    (4, 4, 2, 1, 0, 1, 4),
    (2, 4, 3, 3, 1, 1, 2),
]


@pytest.mark.parametrize("case", LOOP_CASES, ids=lambda c: "in{}-out{}-k{}-s{}-p{}-d{}-g{}".format(*c))
def test_the_test_forward_is_caffes_convolution_and_deconvolution(case):
    in_c, out_c, k, stride, pad, dilation, group = case
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, in_c, 5, 6))
    bias = rng.standard_normal(out_c)
    w = rng.standard_normal((out_c, in_c // group, k, k))
    np.testing.assert_allclose(lf.convolution(x, w, bias, stride=stride, pad=pad, dilation=dilation, group=group),
                               _loop_convolution(x, w, bias, stride, pad, dilation, group), rtol=1e-12, atol=1e-12)
    w = rng.standard_normal((in_c, out_c // group, k, k))
    np.testing.assert_allclose(lf.deconvolution(x, w, bias, stride=stride, pad=pad, dilation=dilation, group=group),
                               _loop_deconvolution(x, w, bias, stride, pad, dilation, group), rtol=1e-12, atol=1e-12)


def test_the_test_forward_inner_product_batch_norm_and_scale():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 2, 2, 2))
    w = rng.standard_normal((5, 8))
    b = rng.standard_normal(5)
    expected = np.array([[sum(x[m].ravel()[k] * w[n, k] for k in range(8)) + b[n] for n in range(5)]
                         for m in range(3)])
    np.testing.assert_allclose(lf.inner_product(x, w, b), expected, rtol=1e-12)
    np.testing.assert_allclose(lf.inner_product(x, w.T.copy(), b, transpose=True), expected, rtol=1e-12)
    np.testing.assert_allclose(lf.inner_product(x, w.reshape(1, 1, 5, 8), b), expected, rtol=1e-12)
    sums, var_sums = rng.standard_normal(2), rng.random(2) + 0.5
    y = lf.batch_norm(x, sums, var_sums, [4.0], eps=1e-3)
    for c in range(2):
        mean, var = sums[c] / 4, var_sums[c] / 4
        np.testing.assert_allclose(y[:, c], (x[:, c] - mean) / np.sqrt(var + np.float32(1e-3)), rtol=1e-12)
    # Caffe: a factor of 0 makes the statistics 0.
    np.testing.assert_allclose(lf.batch_norm(x, sums, var_sums, [0.0], eps=1e-3), x / np.sqrt(np.float32(1e-3)))
    gamma, beta = rng.standard_normal(2), rng.standard_normal(2)
    z = lf.scale(x, gamma, beta)
    np.testing.assert_allclose(z[:, 1], x[:, 1] * gamma[1] + beta[1])


# -- the folded layer against the three layers ----------------------------------------------

def _batchnorm(rng, channels, factor=999.98):
    """A BatchNorm's three blobs as Caffe stores them: sums scaled by the factor."""
    mean = rng.standard_normal(channels)
    var = rng.random(channels) * 2 + 0.05
    return (mean * factor).astype(np.float32), (var * factor).astype(np.float32), np.float32([factor])


class Case:
    def __init__(self, kind, x_shape, weight_shape, *, group=1, stride=1, pad=0, dilation=1, transpose=False,
                 bias=True, scale=True, beta=True, eps=1e-5, factor=999.98):
        self.kind, self.x_shape, self.weight_shape = kind, x_shape, weight_shape
        self.group, self.stride, self.pad, self.dilation, self.transpose = group, stride, pad, dilation, transpose
        self.bias, self.scale, self.beta, self.eps, self.factor = bias, scale, beta, eps, factor

    def forward(self, x, weight, bias):
        if self.kind == "InnerProduct":
            return lf.inner_product(x, weight, bias, transpose=self.transpose)
        run = lf.convolution if self.kind == "Convolution" else lf.deconvolution
        return run(x, weight, bias, stride=self.stride, pad=self.pad, dilation=self.dilation, group=self.group)


CASES = {
    "conv": Case("Convolution", (2, 3, 6, 5), (4, 3, 3, 3), pad=1),
    "conv-strided-dilated": Case("Convolution", (2, 4, 9, 8), (6, 4, 3, 3), stride=2, pad=2, dilation=2),
    "conv-grouped": Case("Convolution", (2, 6, 5, 5), (4, 3, 3, 3), group=2, pad=1),
    "conv-depthwise": Case("Convolution", (2, 4, 5, 5), (4, 1, 3, 3), group=4, pad=1),
    "conv-depthwise-multiplier": Case("Convolution", (2, 4, 5, 5), (8, 1, 3, 3), group=4),
    "conv-no-bias": Case("Convolution", (2, 3, 5, 5), (5, 3, 1, 1), bias=False),
    "conv-batchnorm-alone": Case("Convolution", (2, 3, 5, 5), (4, 3, 3, 3), scale=False),
    "conv-scale-without-beta": Case("Convolution", (2, 3, 5, 5), (4, 3, 3, 3), beta=False, eps=1e-3),
    "conv-factor-0": Case("Convolution", (1, 3, 4, 4), (4, 3, 3, 3), factor=0.0),
    "deconv": Case("Deconvolution", (2, 3, 4, 5), (3, 4, 3, 3), stride=2, pad=1),
    "deconv-grouped": Case("Deconvolution", (2, 4, 4, 4), (4, 3, 3, 3), group=2, stride=2),
    "deconv-grouped-uneven": Case("Deconvolution", (2, 6, 3, 3), (6, 2, 2, 2), group=3, stride=2),
    "deconv-depthwise": Case("Deconvolution", (2, 4, 4, 4), (4, 1, 4, 4), group=4, stride=2, pad=1),
    "deconv-no-bias-alone": Case("Deconvolution", (2, 3, 4, 4), (3, 5, 3, 3), bias=False, scale=False),
    "ip": Case("InnerProduct", (3, 3, 2, 2), (5, 12)),
    "ip-transposed": Case("InnerProduct", (3, 3, 2, 2), (12, 5), transpose=True),
    "ip-legacy": Case("InnerProduct", (3, 12), (1, 1, 5, 12)),
    "ip-legacy-transposed-no-bias": Case("InnerProduct", (3, 12), (1, 1, 12, 5), transpose=True, bias=False),
}


def _draw(case: Case, seed: int):
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal(case.weight_shape).astype(np.float32)
    channels = output_channels(case.kind, case.weight_shape, group=case.group, transpose=case.transpose)
    bias = rng.standard_normal(channels).astype(np.float32) if case.bias else None
    stats = _batchnorm(rng, channels, case.factor)
    gamma = rng.standard_normal(channels).astype(np.float32) if case.scale else None
    beta = rng.standard_normal(channels).astype(np.float32) if case.scale and case.beta else None
    x = rng.standard_normal(case.x_shape)
    return x, weight, bias, stats, gamma, beta


def reference(case: Case, x, weight, bias, stats, gamma, beta):
    """conv (or deconv, ip) -> BatchNorm -> Scale, as Caffe runs them."""
    y = lf.batch_norm(case.forward(x, weight, bias), *stats, eps=case.eps)
    return lf.scale(y, gamma, beta) if gamma is not None else y


def assert_float32_close(actual, expected, magnitude):
    """|actual - expected| within a few float32 roundings of the terms summed (`magnitude`: the sum of |terms|)."""
    bound = 8 * F32_EPS * magnitude + 1e-30
    excess = np.abs(actual - expected) - bound
    assert excess.max() <= 0, f"off by {np.abs(actual - expected).max():.3g} where float32 rounding allows " \
                              f"{bound.ravel()[np.argmax(excess)]:.3g}"


@pytest.mark.parametrize("name", CASES)
def test_the_folded_layer_computes_what_the_three_layers_compute(name):
    case = CASES[name]
    x, weight, bias, stats, gamma, beta = _draw(case, seed=len(name))
    mean, var, _ = batchnorm_statistics(stats)
    folded = fold_params(case.kind, weight, bias, mean, var, float(np.float32(case.eps)), gamma, beta,
                         group=case.group, transpose=case.transpose)
    assert folded.weight.shape == weight.shape and folded.weight.dtype == np.float64
    # Stored as the template's float32, as the net is written.
    stored_w, stored_b = folded.weight.astype(np.float32), folded.bias.astype(np.float32)
    got = case.forward(x, stored_w, stored_b)
    want = reference(case, x, weight, bias, stats, gamma, beta)
    magnitude = case.forward(np.abs(x), np.abs(folded.weight), np.abs(folded.bias))
    assert_float32_close(got, want, magnitude)
    # The difference from float64's own folding is float32's rounding, not more.
    assert_float32_close(case.forward(x, folded.weight, folded.bias), want, magnitude / 8)


def test_a_deconvolution_folded_on_the_convolutions_axis_is_wrong():
    # The classic bug: scaling a Deconvolution's weight on axis 0 (its inputs). The check above catches it.
    case = CASES["deconv-grouped"]
    x, weight, bias, stats, gamma, beta = _draw(case, seed=5)
    mean, var, _ = batchnorm_statistics(stats)
    k = gamma.astype(np.float64) / np.sqrt(var + DEFAULT_EPS)
    channels = weight.shape[0]  # 4 inputs; 6 outputs, so only a 4-channel BatchNorm fits axis 0
    wrong = weight * k[:channels, None, None, None]
    right = fold_params(case.kind, weight, bias, mean, var, DEFAULT_EPS, gamma, beta, group=2)
    want = reference(case, x, weight, bias, stats, gamma, beta)
    assert np.abs(case.forward(x, wrong, right.bias) - want).max() > 0.1
    with pytest.raises(ValueError, match="does not compute"):
        fold_params("Convolution", weight, bias, mean, var, DEFAULT_EPS, gamma, beta)


def test_output_channels_by_layout():
    assert output_channels("Convolution", (8, 3, 3, 3)) == 8
    assert output_channels("Convolution", (8, 3, 3, 3), group=4) == 8
    assert output_channels("Deconvolution", (8, 3, 3, 3)) == 3
    assert output_channels("Deconvolution", (8, 3, 3, 3), group=4) == 12
    assert output_channels("Deconvolution", (6, 3, 3, 3), group=4) is None
    assert output_channels("InnerProduct", (10, 20)) == 10
    assert output_channels("InnerProduct", (10, 20), transpose=True) == 20
    assert output_channels("InnerProduct", (1, 1, 10, 20)) == 10
    assert output_channels("InnerProduct", (2, 1, 10, 20)) is None
    assert output_channels("Convolution", (8,)) is None


def test_batchnorm_statistics_use_caffes_factor():
    mean, var, eps = batchnorm_statistics([np.float32([2, 4]), np.float32([6, 8]), np.float32([2])], 1e-7)
    assert mean.tolist() == [1, 2] and var.tolist() == [3, 4] and mean.dtype == np.float64 and eps == 1e-7
    mean, var, _ = batchnorm_statistics([np.float32([2, 4]), np.float32([6, 8]), np.float32([0])])
    assert mean.tolist() == [0, 0] and var.tolist() == [0, 0]


def test_batchnorm_statistics_in_float32_are_caffes_float_arithmetic():
    """Running and exporting divide and multiply in float32, as Caffe's Dtype float: 1 / 3 rounded first."""
    sums = np.float32([1, 2, 5])
    mean, var, eps = batchnorm_statistics([sums, sums * 2, np.float32([3])], np.float32(1e-3), np.float32)
    factor = np.float32(1) / np.float32(3)
    assert mean.dtype == var.dtype == np.float32 and eps == np.float32(1e-3)
    assert mean.tobytes() == (factor * sums).tobytes() and var.tobytes() == (factor * sums * 2).tobytes()
    mean, var, _ = batchnorm_statistics([sums, sums, np.float32([0])], dtype=np.float32)
    assert mean.tolist() == var.tolist() == [0, 0, 0]


@pytest.mark.parametrize("eps, used", [(1e-7, NVCAFFE_MIN_EPS), (1e-5, NVCAFFE_MIN_EPS), (1e-3, np.float32(1e-3))])
def test_nvidia_caffes_five_blobs_are_the_statistics_themselves_and_eps_at_least_its_floor(eps, used):
    mean, var, got = batchnorm_statistics([np.float32([1, 2]), np.float32([3, 4]), np.float32([9]),
                                           np.float32([1, 1]), np.float32([0, 0])], np.float32(eps), np.float32)
    assert mean.tolist() == [1, 2] and var.tolist() == [3, 4] and got == used and got.dtype == np.float32


def test_batchnorm_blob_counts_come_from_its_row():
    """The layer that runs BatchNorm takes the counts its type's row gives (3 as Caffe's, 5 as NVIDIA Caffe's)."""
    from blobtool.layers import layer_class
    from blobtool.net.layertypes import BATCHNORM_ROLES, row

    assert (CAFFE_BLOBS, NVCAFFE_BLOBS) == (row("BatchNorm").count, len(BATCHNORM_ROLES)) == (3, 5)
    assert layer_class("BatchNorm").blob_count == (CAFFE_BLOBS, NVCAFFE_BLOBS)
