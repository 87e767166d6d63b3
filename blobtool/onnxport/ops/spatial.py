"""Convolution, Deconvolution, Pooling, InnerProduct and Embed as ONNX nodes.

- Convolution: Conv with Caffe's weight layout (C_out, C_in / group, kh,
  kw), pads [ph, pw, ph, pw], strides, dilations, group.
- Deconvolution: ConvTranspose, weight (C_in, C_out / group, kh, kw) as
  Caffe stores it; output s (i - 1) + d (k - 1) + 1 - 2p is ConvTranspose's
  with output_padding 0.
- Dilation 0 (Caffe takes it: every tap of that axis reads, or adds to, the
  same place, kernel extent 1), which ONNX refuses: the kernel's taps along
  that axis summed into one, kernel 1 and dilation 1 there, the same sums
  in another order.
- Pooling: MaxPool / AveragePool with Caffe's pads as `pads` and
  ceil_mode=1 (ROUND_MODE CEIL, Caffe's default; FLOOR: 0): the output size,
  the last window starting inside the image or its left pad, is ONNX's own
  rule then, where a separate Pad node or an extra end pad is not. AVE
  divides by the window clipped to image + pad: count_include_pad=1. Global
  pooling: GlobalMaxPool / GlobalAveragePool. MAX pooling with its second
  top (the mask): MaxPool of the input with NaN made -inf, its Indices
  (flat over the whole (N, C, H, W) input) Mod H W, cast to float: Caffe's
  h * W + w within the plane; -FLT_MAX and -1 where nothing in the window
  is above -FLT_MAX, as Caffe (_max_with_mask).
- InnerProduct: Gemm on the bottom flattened from axis 1 (transB=1 for the
  (N, K) weight, 0 for transpose's (K, N)); with another axis, MatMul on the
  bottom reshaped to shape[:axis] + [K], and Add of the bias.
- Embed: Gather of the weight's rows by the bottom's values as int64, and
  Add of the bias.
"""

from __future__ import annotations

import numpy as np

from ..emit import exporter


def _pads(pad) -> list:
    return [int(pad[0]), int(pad[1]), int(pad[0]), int(pad[1])]


@exporter("Convolution", "ConvolutionDepthwise", "Deconvolution")
def convolution(e) -> None:
    layer = e.layer
    if len(e.inputs) != 1:
        raise e.refuse("a convolution of several bottoms (one Conv per bottom is not written)")
    if len(e.bottom_shapes[0]) != 4 or layer.axis(layer.param.convolution_param.axis, 4) != 1:
        raise e.refuse("only 2-D convolutions over axis 1 of a 4-D bottom are written")
    weight = layer.blobs[0]
    dilations = [int(d) for d in layer.dilation]
    if 0 in dilations:
        # im2col / col2im with dilation 0: input row (or column) o s - p + k * 0 for every tap k.
        summed = weight
        for axis, d in zip((2, 3), dilations):
            if d == 0:
                summed = summed.sum(axis=axis, keepdims=True, dtype=np.float32)
        weight_name = e.constant("taps_summed", summed)
        weight, dilations = summed, [max(d, 1) for d in dilations]
    else:
        weight_name = e.blob(0)
    inputs = [e.inputs[0], weight_name]
    if layer.bias_term:
        inputs.append(e.blob(1, (layer.blobs[1].size,)))
    op = "ConvTranspose" if layer.type == "Deconvolution" else "Conv"
    e.node(op, inputs, e.outputs[:1], kernel_shape=[int(weight.shape[2]), int(weight.shape[3])],
           pads=_pads(layer.pad), strides=list(layer.stride), dilations=dilations,
           group=int(getattr(layer, "groups", layer.group)))


@exporter("Pooling")
def pooling(e) -> None:
    layer = e.layer
    if len(e.bottom_shapes[0]) != 4:
        raise e.refuse("pooling of a bottom that is not 4-D")
    is_max = layer.method == 0
    if layer.method not in (0, 1):
        raise e.refuse("STOCHASTIC pooling is not computed at test time by Caffe's CPU code")
    if layer.global_pooling and len(e.outputs) == 1:
        e.node("GlobalMaxPool" if is_max else "GlobalAveragePool", e.inputs, e.outputs)
        return
    # A global MAX pooling with its mask: one window of the whole plane.
    kernel = list(layer.kernel) if layer.kernel is not None else [int(d) for d in e.bottom_shapes[0][2:]]
    attributes = dict(kernel_shape=kernel, strides=list(layer.stride), pads=_pads(layer.pad),
                      ceil_mode=int(layer.ceil))
    if not is_max:
        attributes["count_include_pad"] = 1
    op = "MaxPool" if is_max else "AveragePool"
    # Up to opset 21 ONNX's ceil_mode size (and onnx's shape inference) keeps a last window that
    # starts in the right pad, which Caffe drops; opset 22 drops it too. onnxruntime drops it at
    # every opset. Where the two sizes differ, the pooling is followed by a Slice to Caffe's size,
    # which keeps every window Caffe computes, computed alike, whichever rule the runtime takes.
    spec = [_ceil_size(h, k, s, p) if layer.ceil else (h + 2 * p - k) // s + 1
            for h, k, s, p in zip(e.bottom_shapes[0][2:], kernel, layer.stride, layer.pad)]
    caffe = list(e.top_shapes[0][2:])
    for size, out, stride, pad in zip(e.bottom_shapes[0][2:], caffe, layer.stride, layer.pad):
        if (out - 1) * stride - pad >= size:
            # Without pad Caffe keeps a last window that starts past the image: -FLT_MAX for MAX, 0 / 0 for
            # AVE. ONNX has no such window.
            raise e.refuse(f"its last window starts past the image ({size} values, {out} windows of stride "
                           f"{stride}, pad {pad}), where Caffe writes -FLT_MAX (MAX) or NaN (AVE) and ONNX computes "
                           "no window")
    sliced = not (e.opset >= 22 or spec == caffe)
    if len(e.outputs) > 1:
        _max_with_mask(e, attributes, caffe if sliced else None)
        return
    if not sliced:
        e.node(op, e.inputs, e.outputs, **attributes)
        return
    pooled = e.node(op, e.inputs, [e.temp("pooled")], **attributes)[0]
    e.node("Slice", [pooled, e.shape_constant("starts", [0, 0]), e.shape_constant("ends", caffe),
                     e.shape_constant("axes", [2, 3])], e.outputs)


def _max_with_mask(e, attributes: dict, caffe) -> None:
    """MAX pooling and its mask top as Caffe computes them, from MaxPool's values and Indices.

    Caffe starts each window at -FLT_MAX and keeps a value only where it is
    strictly greater: NaN never wins, and a window with nothing above
    -FLT_MAX gives -FLT_MAX and the index -1. So NaN becomes -inf before the
    MaxPool (whose first greatest value in row-major order is Caffe's), and
    where its maximum is not above -FLT_MAX the tops are -FLT_MAX and -1.
    The Indices count over the whole (N, C, H, W) input: Mod H W gives
    Caffe's h W + w within the plane. `caffe`: the top's size to Slice to,
    where ONNX's ceil rule keeps one more window (None: no Slice).
    """
    lowest = e.constant("lowest", np.asarray(np.finfo(np.float32).min, np.float32))
    x = e.inputs[0]
    nan = e.node("IsNaN", [x], [e.temp("nan")])[0]
    x = e.node("Where", [nan, e.constant("neg_inf", np.asarray(-np.inf, np.float32)), x], [e.temp("no_nan")])[0]
    pooled, indices = e.node("MaxPool", [x], [e.temp("pooled"), e.temp("indices")], **attributes)
    if caffe is not None:
        ends = e.shape_constant("ends", caffe)
        starts, axes = e.shape_constant("starts", [0, 0]), e.shape_constant("axes", [2, 3])
        pooled = e.node("Slice", [pooled, starts, ends, axes], [e.temp("pooled_sliced")])[0]
        indices = e.node("Slice", [indices, starts, ends, axes], [e.temp("indices_sliced")])[0]
    found = e.node("Greater", [pooled, lowest], [e.temp("found")])[0]
    e.node("Where", [found, pooled, lowest], e.outputs[:1])
    h, w = e.bottom_shapes[0][2:]
    within = e.node("Mod", [indices, e.constant("plane", np.asarray(int(h) * int(w), np.int64))],
                    [e.temp("within")])[0]
    index = e.node("Cast", [within], [e.temp("index")], to=1)[0]
    e.node("Where", [found, index, e.constant("none", np.asarray(-1.0, np.float32))], e.outputs[1:2])


def _ceil_size(size: int, kernel: int, stride: int, pad: int) -> int:
    """ONNX's pooled size with ceil_mode before opset 22: ceil((size + 2 pad - kernel) / stride) + 1."""
    return -(-(size + 2 * pad - kernel) // stride) + 1


@exporter("InnerProduct")
def inner_product(e) -> None:
    layer = e.layer
    shape = e.bottom_shapes[0]
    axis = layer.axis(layer.param.inner_product_param.axis, len(shape))
    n = layer.num_output
    k = int(np.prod(shape[axis:], dtype=np.int64))
    weight_shape = (k, n) if layer.transpose else (n, k)
    weight = e.blob(0, weight_shape)
    bias = e.blob(1, (n,)) if layer.bias_term else None
    if axis == 1:
        x = e.inputs[0]
        if len(shape) != 2:
            x = e.node("Flatten", [x], [e.temp("flat")], axis=1)[0]
        inputs = [x, weight] + ([bias] if bias is not None else [])
        e.node("Gemm", inputs, e.outputs, transB=0 if layer.transpose else 1)
        return
    # axis > 1: MatMul broadcasts over the leading axes; the weight as (K, N).
    rows = [0] * axis if e.free else list(shape[:axis])  # --dynamic: the leading axes as the bottom has them
    x = e.node("Reshape", [e.inputs[0], e.shape_constant("rows", rows + [k])], [e.temp("rows")])[0]
    if not layer.transpose:
        weight = e.node("Transpose", [weight], [e.temp("weight_t")], perm=[1, 0])[0]
    if bias is None:
        e.node("MatMul", [x, weight], e.outputs)
        return
    product = e.node("MatMul", [x, weight], [e.temp("product")])[0]
    e.node("Add", [product, bias], e.outputs)


@exporter("Embed")
def embed(e) -> None:
    layer = e.layer
    # Caffe reads each bottom value as an index (static_cast<int>); ONNX's Cast to int64 truncates the same way.
    index = e.node("Cast", e.inputs, [e.temp("index")], to=7)[0]
    weight = e.blob(0, (layer.input_dim, layer.num_output))
    if not layer.bias_term:
        e.node("Gather", [weight, index], e.outputs, axis=0)
        return
    rows = e.node("Gather", [weight, index], [e.temp("rows")], axis=0)[0]
    e.node("Add", [rows, e.blob(1, (layer.num_output,))], e.outputs)
