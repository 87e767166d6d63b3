"""The forks' layers as ONNX nodes: BN and max-unpooling Upsample, Axpy, ROIPooling, PSROIPooling, Reorg.

- BN (caffe-segnet), INFERENCE: Mul by the scale, then Add of the shift,
  both (1, C, 1, 1) as stored. LEARN: the batch's statistics as bn_layer.cpp
  computes them: ReduceMean of x and of x * x over N, H, W, variance E[x^2]
  - E[x]^2, then (x - mean) / Sqrt(variance + 1e-9) * scale + shift; the
  mean and variance are tops 1 and 2 where the layer has them.
- Upsample with two bottoms (caffe-segnet's max-unpooling): MaxUnpool of
  the values at indices converted from Caffe's layout (h * W + w within its
  plane, a float) to ONNX's (flat over the whole (N, C, H, W) output): the
  mask cast to int64 plus (n C + c) H W, output_shape the layer's top.
- Axpy (SENet): y + a x, a reshaped to (N, C, 1, ...) for the broadcast.
- ROIPooling (caffe-fast-rcnn): MaxRoiPool, whose definition is Fast
  R-CNN's loop, rounding included (onnxruntime's is its code).
- PSROIPooling (R-FCN): no ONNX operator; a summed-area table of the
  bottom in double, the bins' bounds computed from the ROIs as R-FCN's
  kernel computes them, four Gathers per bin, the mean where not empty.
- Reorg (YOLOv2): darknet's view (Reshape), Transpose, Reshape.
"""

from __future__ import annotations

import numpy as np

from ...layers.forks import BN_EPS, BN_INFERENCE
from ..emit import exporter


@exporter("BN")
def bn(e) -> None:
    layer = e.layer
    c = e.bottom_shapes[0][1]
    scale, shift = e.blob(0, (1, c, 1, 1)), e.blob(1, (1, c, 1, 1))
    x = e.inputs[0]
    if layer.mode != BN_INFERENCE:
        mean = e.reduce("ReduceMean", x, [0, 2, 3], e.temp("mean"))
        square = e.node("Mul", [x, x], [e.temp("square")])[0]
        mean_square = e.reduce("ReduceMean", square, [0, 2, 3], e.temp("mean_square"))
        mean_squared = e.node("Mul", [mean, mean], [e.temp("mean_squared")])[0]
        variance = e.node("Sub", [mean_square, mean_squared], [e.temp("variance")])[0]
        padded = e.node("Add", [variance, e.constant("eps", np.asarray(BN_EPS, np.float32))], [e.temp("padded")])[0]
        deviation = e.node("Sqrt", [padded], [e.temp("deviation")])[0]
        centred = e.node("Sub", [x, mean], [e.temp("centred")])[0]
        x = e.node("Div", [centred, deviation], [e.temp("normalized")])[0]
        # Tops 1 and 2, where given: the batch's mean and variance, (1, C, 1, 1) as ReduceMean keeps them.
        for statistic, top in zip((mean, variance), e.outputs[1:]):
            e.node("Identity", [statistic], [top])
    scaled = e.node("Mul", [x, scale], [e.temp("scaled")])[0]
    e.node("Add", [scaled, shift], e.outputs[:1])


def max_unpool(e) -> None:
    """SegNet's Upsample (two bottoms) as MaxUnpool, the mask's indices moved to ONNX's flat layout."""
    n, c, h, w = e.bottom_shapes[0]
    top = e.top_shapes[0]
    plane = int(top[2]) * int(top[3])
    index = e.node("Cast", [e.inputs[1]], [e.temp("index")], to=7)[0]
    offsets = (np.arange(n * c, dtype=np.int64) * plane).reshape(n, c, 1, 1)
    flat = e.node("Add", [index, e.constant("plane_offsets", offsets)], [e.temp("flat_index")])[0]
    e.node("MaxUnpool", [e.inputs[0], flat, e.shape_constant("output_shape", top)], e.outputs,
           kernel_shape=[1, 1])


@exporter("Axpy")
def axpy(e) -> None:
    shape = e.bottom_shapes[1]
    a = e.node("Reshape", [e.inputs[0], e.shape_constant("scale_shape", list(shape[:2]) + [1] * (len(shape) - 2))],
               [e.temp("scale")])[0]
    product = e.node("Mul", [a, e.inputs[1]], [e.temp("product")])[0]
    e.node("Add", [e.inputs[2], product], e.outputs)


def _rois(e) -> str:
    """The ROIs bottom as (R, 5)."""
    return e.node("Reshape", [e.inputs[1], e.shape_constant("rois_shape", [e.bottom_shapes[1][0], 5])],
                  [e.temp("rois")])[0]


@exporter("ROIPooling")
def roi_pooling(e) -> None:
    # MaxRoiPool computes Fast R-CNN's own loop: corners round(x scale), sizes end - start + 1 (at least 1),
    # bins floor / ceil of p (size / pooled) in float, clipped; empty bins 0.
    layer = e.layer
    e.node("MaxRoiPool", [e.inputs[0], _rois(e)], e.outputs, pooled_shape=list(layer.pooled),
           spatial_scale=float(layer.spatial_scale))


def _column(e, rois: str, k: int, name: str) -> str:
    """Column k of the (R, 5) ROIs, as (R, 1)."""
    return e.node("Slice", [rois, e.shape_constant(f"{name}_start", [k]), e.shape_constant(f"{name}_end", [k + 1]),
                            e.shape_constant(f"{name}_axis", [1])], [e.temp(name)])[0]


def _double(e, name: str, value: float) -> str:
    """A double constant (initializers are float32 here): a float32 one that holds it exactly, cast."""
    return e.node("Cast", [e.constant(name, np.asarray(value, np.float32))], [e.temp(f"{name}_double")], to=11)[0]


def _c_round(e, x: str, name: str) -> str:
    """C's round (half away from zero) of a float column, in double: sign(x) floor(|x| + 0.5), exact there."""
    wide = e.node("Cast", [x], [e.temp(f"{name}_wide")], to=11)[0]
    size = e.node("Abs", [wide], [e.temp(f"{name}_abs")])[0]
    half = e.node("Add", [size, _double(e, f"{name}_half", 0.5)], [e.temp(f"{name}_up")])[0]
    floor = e.node("Floor", [half], [e.temp(f"{name}_floor")])[0]
    sign = e.node("Sign", [wide], [e.temp(f"{name}_sign")])[0]
    return e.node("Mul", [sign, floor], [e.temp(f"{name}_round")])[0]


def _psroi_bounds(e, rois: str, lo: int, hi: int, size: int, axis: str) -> tuple:
    """(first, last) of every bin along one axis, (R, group) int64, as the R-FCN kernel computes them."""
    layer = e.layer
    g = layer.group
    scale = e.constant(f"{axis}_scale", np.asarray(layer.spatial_scale, np.float32))
    start_round = _c_round(e, _column(e, rois, lo, f"{axis}1"), f"{axis}1")
    start = e.node("Cast", [start_round], [e.temp(f"{axis}_start_f")], to=1)[0]
    start = e.node("Mul", [start, scale], [e.temp(f"{axis}_start")])[0]
    end_round = _c_round(e, _column(e, rois, hi, f"{axis}2"), f"{axis}2")
    end_plus = e.node("Add", [end_round, _double(e, f"{axis}_one", 1.0)],
                      [e.temp(f"{axis}_end_plus")])[0]
    end = e.node("Cast", [end_plus], [e.temp(f"{axis}_end_f")], to=1)[0]
    end = e.node("Mul", [end, scale], [e.temp(f"{axis}_end")])[0]
    extent = e.node("Sub", [end, start], [e.temp(f"{axis}_extent")])[0]
    extent = e.node("Max", [extent, e.constant(f"{axis}_least", np.asarray(0.1, np.float32))],
                    [e.temp(f"{axis}_extent_least")])[0]
    bin_size = e.node("Div", [extent, e.constant(f"{axis}_groups", np.asarray(g, np.float32))],
                      [e.temp(f"{axis}_bin")])[0]
    bounds = []
    for which, steps, op in (("first", np.arange(g), "Floor"), ("last", np.arange(1, g + 1), "Ceil")):
        grid = e.node("Mul", [e.constant(f"{axis}_{which}_steps", steps.astype(np.float32)[None, :]), bin_size],
                      [e.temp(f"{axis}_{which}_grid")])[0]
        moved = e.node("Add", [grid, start], [e.temp(f"{axis}_{which}_moved")])[0]
        rounded = e.node(op, [moved], [e.temp(f"{axis}_{which}_rounded")])[0]
        clipped = e.node("Clip", [rounded, e.constant(f"{axis}_{which}_low", np.asarray(0.0, np.float32)),
                                  e.constant(f"{axis}_{which}_high", np.asarray(float(size), np.float32))],
                         [e.temp(f"{axis}_{which}_clipped")])[0]
        bounds.append(e.node("Cast", [clipped], [e.temp(f"{axis}_{which}_index")], to=7)[0])
    return tuple(bounds)


@exporter("PSROIPooling")
def psroi_pooling(e) -> None:
    """R-FCN's average per bin from a summed-area table (double) of the bottom: four Gathers per bin."""
    layer = e.layer
    n, c, height, width = (int(d) for d in e.bottom_shapes[0])
    r, d, g = int(e.bottom_shapes[1][0]), layer.output_dim, layer.group
    rois = _rois(e)
    # table[b, ch, y, x] = the sum of bottom[b, ch, :y, :x], in double, flattened for Gather.
    wide = e.node("Cast", [e.inputs[0]], [e.temp("wide")], to=11)[0]
    padded = e.node("Pad", [wide, e.shape_constant("table_pads", [0, 0, 1, 1, 0, 0, 0, 0])], [e.temp("padded")])[0]
    rows = e.node("CumSum", [padded, e.constant("axis_rows", np.asarray(2, np.int64))], [e.temp("rows_summed")])[0]
    table = e.node("CumSum", [rows, e.constant("axis_cols", np.asarray(3, np.int64))], [e.temp("table")])[0]
    flat = e.node("Reshape", [table, e.shape_constant("flat_shape", [-1])], [e.temp("table_flat")])[0]
    image = e.node("Cast", [_column(e, rois, 0, "batch")], [e.temp("image")], to=7)[0]
    h0, h1 = _psroi_bounds(e, rois, 2, 4, height, "h")
    w0, w1 = _psroi_bounds(e, rois, 1, 3, width, "w")
    # flat index of (image, channel, y, x): ((image C + channel) (H + 1) + y) (W + 1) + x, as (R, D, G, G).
    channel = (np.arange(d)[:, None, None] * g * g + np.arange(g)[:, None] * g + np.arange(g)[None, :])
    plane = e.node("Mul", [image, e.constant("image_stride", np.asarray(c, np.int64))], [e.temp("image_c")])[0]
    plane = e.node("Reshape", [plane, e.shape_constant("per_roi", [r, 1, 1, 1])], [e.temp("image_r")])[0]
    plane = e.node("Add", [plane, e.constant("channels", channel[None].astype(np.int64))], [e.temp("plane")])[0]
    row_base = e.node("Mul", [plane, e.constant("plane_rows", np.asarray(height + 1, np.int64))],
                      [e.temp("row_base")])[0]
    corners = {}
    for yname, y in (("h0", h0), ("h1", h1)):
        y4 = e.node("Reshape", [y, e.shape_constant(f"{yname}_shape", [r, 1, g, 1])], [e.temp(f"{yname}_4")])[0]
        row = e.node("Add", [row_base, y4], [e.temp(f"{yname}_row")])[0]
        row = e.node("Mul", [row, e.constant(f"{yname}_cols", np.asarray(width + 1, np.int64))],
                     [e.temp(f"{yname}_at")])[0]
        for xname, x in (("w0", w0), ("w1", w1)):
            x4 = e.node("Reshape", [x, e.shape_constant(f"{yname}{xname}_shape", [r, 1, 1, g])],
                        [e.temp(f"{yname}{xname}_4")])[0]
            index = e.node("Add", [row, x4], [e.temp(f"{yname}{xname}_index")])[0]
            corners[yname + xname] = e.node("Gather", [flat, index], [e.temp(f"{yname}{xname}_sum")], axis=0)[0]
    total = e.node("Sub", [corners["h1w1"], corners["h0w1"]], [e.temp("total_a")])[0]
    total = e.node("Sub", [total, corners["h1w0"]], [e.temp("total_b")])[0]
    total = e.node("Add", [total, corners["h0w0"]], [e.temp("total_wide")])[0]
    total = e.node("Cast", [total], [e.temp("total")], to=1)[0]
    height_of = e.node("Sub", [h1, h0], [e.temp("bin_rows")])[0]
    width_of = e.node("Sub", [w1, w0], [e.temp("bin_cols")])[0]
    height_of = e.node("Reshape", [height_of, e.shape_constant("rows_shape", [r, 1, g, 1])], [e.temp("rows_4")])[0]
    width_of = e.node("Reshape", [width_of, e.shape_constant("cols_shape", [r, 1, 1, g])], [e.temp("cols_4")])[0]
    area = e.node("Mul", [height_of, width_of], [e.temp("area")])[0]
    area = e.node("Cast", [area], [e.temp("area_f")], to=1)[0]
    empty = e.node("Equal", [area, e.constant("zero_area", np.asarray(0.0, np.float32))], [e.temp("empty")])[0]
    safe = e.node("Where", [empty, e.constant("one_area", np.asarray(1.0, np.float32)), area], [e.temp("safe")])[0]
    mean = e.node("Div", [total, safe], [e.temp("mean")])[0]
    e.node("Where", [empty, e.constant("zero", np.asarray(0.0, np.float32)), mean], e.outputs)


@exporter("Reorg")
def reorg(e) -> None:
    layer = e.layer
    n, c, h, w = (int(d) for d in e.bottom_shapes[0])
    s = layer.stride
    inner = c // (s * s)
    if layer.reverse:
        view, perm = [n, s, s, inner, h, w], [0, 3, 4, 1, 5, 2]
    else:
        view, perm = [n, inner, h, s, w, s], [0, 3, 5, 1, 2, 4]
    viewed = e.node("Reshape", [e.inputs[0], e.shape_constant("view", view)], [e.temp("view")])[0]
    moved = e.node("Transpose", [viewed], [e.temp("moved")], perm=perm)[0]
    e.node("Reshape", [moved, e.shape_constant("top_shape", list(e.top_shapes[0]))], e.outputs)
