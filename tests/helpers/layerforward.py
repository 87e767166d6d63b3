"""Caffe's forward pass of a few layers in numpy, at test time, to check folded weights by running them.

Small inputs only (im2col materializes every patch). Shapes are Caffe's,
N x C x H x W; each function mirrors the Caffe layer it is named after:

- ``convolution``: ConvolutionLayer (conv_layer.cpp via im2col_cpu), 2-D kernels with
  stride, pad, dilation and group; weight (C_out, C_in / group, kh, kw).
- ``deconvolution``: DeconvolutionLayer (deconv_layer.cpp: the convolution's backward,
  col2im); weight (C_in, C_out / group, kh, kw); output size stride * (H - 1) +
  dilation * (kh - 1) + 1 - 2 * pad.
- ``inner_product``: InnerProductLayer with axis 1; weight (N, K), or (K, N) with transpose.
- ``batch_norm``: BatchNormLayer with use_global_stats: the stored sums divided by the
  factor (0 when it is 0), and eps.
- ``scale``: ScaleLayer, axis 1, one axis, with or without its bias.

A whole net (``run_net``) runs as Caffe's TEST net: a layer whose include or
exclude rules leave it out of phase TEST (Net::FilterNet) is passed over;
rules on levels or stages are not run here. Its layers and their settings
come from the .caffemodel, or from a definition given apart (a
deploy.prototxt, which Caffe fills with the .caffemodel's blobs by layer
name).

Computed in float64 so that the only rounding a comparison sees is the one of
the stored weights.

This is not the tests' second runner of nets: caffenets.ours_forward runs
blobtool's own layers (what is under test) and caffeoracle runs real Caffe (in
float32, where it is installed, tests marked caffe); this one is fold's
float64 oracle for the few layers a fold touches, run in every quick suite.
"""

from __future__ import annotations

import numpy as np


def _pair(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value, value)


def _out_size(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    return (size + 2 * pad - (dilation * (kernel - 1) + 1)) // stride + 1


def im2col(x: np.ndarray, kernel, stride, pad, dilation) -> np.ndarray:
    """Caffe's im2col_cpu for one image (C, H, W): (C * kh * kw, out_h * out_w), zeros where padded."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = map(_pair, (kernel, stride, pad, dilation))
    channels, height, width = x.shape
    out_h, out_w = _out_size(height, kh, sh, ph, dh), _out_size(width, kw, sw, pw, dw)
    padded = np.zeros((channels, height + 2 * ph, width + 2 * pw))
    padded[:, ph:ph + height, pw:pw + width] = x
    cols = np.empty((channels, kh, kw, out_h, out_w))
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (out_h - 1) + 1, sh)
            columns = slice(j * dw, j * dw + sw * (out_w - 1) + 1, sw)
            cols[:, i, j] = padded[:, rows, columns]
    return cols.reshape(channels * kh * kw, out_h * out_w)


def col2im(cols: np.ndarray, shape: tuple, kernel, stride, pad, dilation) -> np.ndarray:
    """Caffe's col2im_cpu: the patches of `cols` summed back into an image of `shape` (C, H, W)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = map(_pair, (kernel, stride, pad, dilation))
    channels, height, width = shape
    out_h, out_w = _out_size(height, kh, sh, ph, dh), _out_size(width, kw, sw, pw, dw)
    padded = np.zeros((channels, height + 2 * ph, width + 2 * pw))
    cols = cols.reshape(channels, kh, kw, out_h, out_w)
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (out_h - 1) + 1, sh)
            columns = slice(j * dw, j * dw + sw * (out_w - 1) + 1, sw)
            padded[:, rows, columns] += cols[:, i, j]
    return padded[:, ph:ph + height, pw:pw + width]


def convolution(x, weight, bias=None, *, stride=1, pad=0, dilation=1, group=1) -> np.ndarray:
    """ConvolutionLayer::Forward_cpu: per image and group, weight (C_out/g, C_in/g * kh * kw) @ im2col."""
    x = np.asarray(x, np.float64)
    weight = np.asarray(weight, np.float64)
    out_channels, in_per_group, kh, kw = weight.shape
    images, channels = x.shape[:2]
    assert channels == in_per_group * group and out_channels % group == 0
    out_per_group = out_channels // group
    outputs = []
    for image in x:
        cols = im2col(image, (kh, kw), stride, pad, dilation)
        cols = cols.reshape(group, in_per_group * kh * kw, -1)
        w = weight.reshape(group, out_per_group, in_per_group * kh * kw)
        outputs.append(np.concatenate([w[g] @ cols[g] for g in range(group)]))
    (sh, sw), (ph, pw), (dh, dw) = map(_pair, (stride, pad, dilation))
    out_h = _out_size(x.shape[2], kh, sh, ph, dh)
    out_w = _out_size(x.shape[3], kw, sw, pw, dw)
    y = np.stack(outputs).reshape(images, out_channels, out_h, out_w)
    if bias is not None:
        y = y + np.asarray(bias, np.float64).reshape(1, -1, 1, 1)
    return y


def deconvolution(x, weight, bias=None, *, stride=1, pad=0, dilation=1, group=1) -> np.ndarray:
    """DeconvolutionLayer::Forward_cpu: per image and group, col2im(weight^T @ input)."""
    x = np.asarray(x, np.float64)
    weight = np.asarray(weight, np.float64)
    in_channels, out_per_group, kh, kw = weight.shape
    images, channels, height, width = x.shape
    assert channels == in_channels and in_channels % group == 0
    in_per_group = in_channels // group
    (sh, sw), (ph, pw), (dh, dw) = map(_pair, (stride, pad, dilation))
    out_h = sh * (height - 1) + dh * (kh - 1) + 1 - 2 * ph
    out_w = sw * (width - 1) + dw * (kw - 1) + 1 - 2 * pw
    w = weight.reshape(group, in_per_group, out_per_group * kh * kw)
    outputs = []
    for image in x:
        flat = image.reshape(group, in_per_group, height * width)
        parts = [col2im(w[g].T @ flat[g], (out_per_group, out_h, out_w), (kh, kw), stride, pad, dilation)
                 for g in range(group)]
        outputs.append(np.concatenate(parts))
    y = np.stack(outputs)
    if bias is not None:
        y = y + np.asarray(bias, np.float64).reshape(1, -1, 1, 1)
    return y


def inner_product(x, weight, bias=None, *, transpose=False) -> np.ndarray:
    """InnerProductLayer::Forward_cpu with axis 1: (M, K) @ weight^T (weight (N, K)), or @ weight when transposed."""
    x = np.asarray(x, np.float64)
    weight = np.asarray(weight, np.float64)
    weight = weight.reshape(weight.shape[-2:])  # the legacy (1, 1, N, K) as (N, K)
    flat = x.reshape(x.shape[0], -1)
    y = flat @ (weight if transpose else weight.T)
    if bias is not None:
        y = y + np.asarray(bias, np.float64).reshape(1, -1)
    return y


def _per_channel(values, ndim: int) -> np.ndarray:
    return np.asarray(values, np.float64).reshape((1, -1) + (1,) * (ndim - 2))


def batch_norm(x, mean_sums, var_sums, factor, eps=1e-5) -> np.ndarray:
    """BatchNormLayer::Forward_cpu with use_global_stats: (x - mean) / sqrt(var + eps) over axis 1."""
    x = np.asarray(x, np.float64)
    s = float(np.asarray(factor, np.float64).reshape(-1)[0])
    f = 0.0 if s == 0 else 1.0 / s
    mean = _per_channel(mean_sums, x.ndim) * f
    var = _per_channel(var_sums, x.ndim) * f
    return (x - mean) / np.sqrt(var + float(np.float32(eps)))


def scale(x, gamma, beta=None) -> np.ndarray:
    """ScaleLayer::Forward_cpu, axis 1 and one axis: gamma per channel, plus beta with bias_term."""
    x = np.asarray(x, np.float64)
    y = x * _per_channel(gamma, x.ndim)
    if beta is not None:
        y = y + _per_channel(beta, x.ndim)
    return y


# -- a whole net ---------------------------------------------------------------------------

def _conv_settings(p) -> dict:
    """ConvolutionParameter's 2-D kernel, stride, pad and dilation, as Caffe's BaseConvolutionLayer reads them."""
    def one(values, h, w, default):
        if h or w:
            return (h, w)
        values = list(values) or [default]
        return (values[0], values[-1])

    return {"kernel": one(p.kernel_size, p.kernel_h, p.kernel_w, 1),
            "stride": one(p.stride, p.stride_h, p.stride_w, 1),
            "pad": one(p.pad, p.pad_h, p.pad_w, 0),
            "dilation": one(p.dilation, 0, 0, 1)}


def _pooling(x, p) -> np.ndarray:
    """PoolingLayer for global pooling and square windows without padding (MAX = 0, AVE = 1)."""
    if p.global_pooling:
        return (x.max(axis=(2, 3)) if p.pool == 0 else x.mean(axis=(2, 3)))[:, :, None, None]
    k, s = p.kernel_size or p.kernel_h, p.stride or 1
    assert not (p.pad or p.pad_h), "padded pooling is not run here"
    out_h, out_w = -(-(x.shape[2] - k) // s) + 1, -(-(x.shape[3] - k) // s) + 1
    y = np.empty(x.shape[:2] + (out_h, out_w))
    for i in range(out_h):
        for j in range(out_w):
            window = x[:, :, i * s:i * s + k, j * s:j * s + k]
            y[:, :, i, j] = window.max(axis=(2, 3)) if p.pool == 0 else window.mean(axis=(2, 3))
    return y


_TEST = 1  # Caffe's Phase enum: TRAIN = 0, TEST = 1


def in_test_net(layer) -> bool:
    """Whether Caffe's TEST net holds `layer` (Net::FilterNet and StateMeetsRule, for rules on the phase only)."""
    rules = list(layer.include) + list(layer.exclude)
    assert not any(r.HasField("min_level") or r.HasField("max_level") or r.stage or r.not_stage for r in rules), \
        f"layer {layer.name}: rules on levels or stages are not run here"
    assert not (layer.include and layer.exclude), f"layer {layer.name}: Caffe refuses include and exclude both"

    def met(rule):
        return not rule.HasField("phase") or rule.phase == _TEST

    if layer.include:
        return any(met(rule) for rule in layer.include)
    return not any(met(rule) for rule in layer.exclude)


def run_net(path, feeds: dict, *, definition=None, stop_types=("SoftmaxWithLoss", "Accuracy", "Softmax")) -> dict:
    """Run a .caffemodel's TEST net in layer order on `feeds` ({blob name: array}); {blob name: its last value}.

    Data layers are passed over (the feeds stand for them); a type in
    `stop_types` ends the run. Blob values are read with blobtool (any
    stored encoding), by layer name; the layers and their settings with the
    protobuf schema, from the .caffemodel or from `definition` (a .prototxt
    path) where one is given.
    """
    from google.protobuf import text_format

    from blobtool._pb import blobtool_caffe_pb2 as pb
    from blobtool.formats import open_document

    if definition is None:
        with open(path, "rb") as f:
            net = pb.NetParameter.FromString(f.read())
    else:
        with open(definition, encoding="utf-8") as f:
            net = text_format.Parse(f.read(), pb.NetParameter())
    with open_document(path) as doc:
        values: dict = {}
        for e in doc.entries:
            values.setdefault(e.layer, []).append(np.array(e.blob().cpu_data(), np.float64).reshape(e.shape))
    blobs = {name: np.asarray(x, np.float64) for name, x in feeds.items()}
    for layer in net.layer:
        kind = layer.type
        if not in_test_net(layer):
            continue
        if kind in stop_types:
            break
        if kind in ("Data", "Input", "ImageData", "HDF5Data", "DummyData", "MemoryData"):
            continue
        held = values.get(layer.name, [])
        ins = [blobs[b] for b in layer.bottom]
        if kind in ("Convolution", "Deconvolution"):
            p = layer.convolution_param
            run = convolution if kind == "Convolution" else deconvolution
            out = [run(ins[0], held[0], held[1] if len(held) > 1 else None, group=p.group,
                       **{k: v for k, v in _conv_settings(p).items() if k != "kernel"})]
        elif kind == "InnerProduct":
            p = layer.inner_product_param
            out = [inner_product(ins[0], held[0], held[1] if len(held) > 1 else None, transpose=p.transpose)]
        elif kind == "BatchNorm":
            out = [batch_norm(ins[0], *held[:3], eps=layer.batch_norm_param.eps)]
        elif kind == "Scale":
            out = [scale(ins[0], held[0], held[1] if len(held) > 1 else None)]
        elif kind == "ReLU":
            slope = layer.relu_param.negative_slope
            out = [np.where(ins[0] > 0, ins[0], ins[0] * slope)]
        elif kind == "Split":
            out = [ins[0]] * len(layer.top)
        elif kind == "Eltwise":
            p = layer.eltwise_param
            assert p.operation == 1, "only SUM is run here"
            coeffs = list(p.coeff) or [1.0] * len(ins)
            out = [sum(c * x for c, x in zip(coeffs, ins))]
        elif kind == "Pooling":
            out = [_pooling(ins[0], layer.pooling_param)]
        else:
            raise AssertionError(f"layer {layer.name}: no forward here for type {kind!r}")
        for top, value in zip(layer.top, out):
            blobs[top] = value
    return blobs
