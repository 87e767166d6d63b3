"""The layers that move values, SSD's PriorBox, and the forks' Upsample and Interp as ONNX nodes.

Every shape is static (the Program's Reshape gave each blob's), so each
layer is written with constant shapes and indices, taken from what the
layer's class computed in reshape() (blobtool/layers/shape.py, ssd.py,
resize.py), never from Caffe's rules worked out a second time:

- Concat: Concat on the layer's axis (concat_dim read as Caffe reads it);
  one bottom: Identity.
- Slice: Split with the pieces' sizes as its `split` input (an input from
  opset 13, and still accepted in place of `num_outputs` from 18); one top:
  Identity.
- Split: one Identity per top.
- Flatten, Reshape: Reshape to the top's shape as an int64 constant (ONNX
  Flatten is always 2-D, Caffe's keeps the axes outside axis..end_axis).
- Crop: Slice with constant starts, ends and axes from the layer's offsets;
  the second bottom gives only a size, already in the top's shape.
- Tile: Tile, repeats 1 but `tiles` on the layer's axis.
- Permute: Transpose with the order permute_layer.cpp completes (the given
  axes, then the others in order); an order that keeps every axis: Identity.
- ShuffleChannel: Reshape to (N, group, C / group, H, W), Transpose (0, 2,
  1, 3, 4), Reshape to the top's (N, C, H, W).
- PriorBox: a constant. Its boxes depend on the shapes only, so the layer's
  own forward() computes them at export, and an Identity gives the top.
  A constant computed from the shapes (these priors, Interp's indices)
  holds at most MAX_COMPUTED values: past it the layer is refused before
  anything is computed.
- DetectionOutput: detection.py.
- Upsample (the YOLOv3 ports' nearest neighbour): Resize, mode "nearest",
  coordinate_transformation_mode "asymmetric", nearest_mode "floor",
  scales (1, 1, s, s): output i reads floor(i / s), the layer's i // s.
- Interp (PSPNet's caffe_cpu_interp2): the crop of pad_beg / pad_end (both
  0 or negative) as a Slice; then bilinear: Resize, mode "linear",
  coordinate_transformation_mode "align_corners", `sizes` the output size
  the layer computed from zoom_factor, shrink_factor, height and width or
  the second bottom (align_corners reads input (in - 1) / (out - 1) i, 0
  where out is 1, as caffe_cpu_interp2 does). interp_type nearest_neighbor:
  Gather of the rows, then of the columns, the layer's own indices as
  constants: Resize's nearest_mode "round_prefer_ceil" of (in - 1) / (out
  - 1) i, computed in onnxruntime's float order, reads another row than
  caffe_cpu_nninterp2 at some sizes (14 rows to 23 at row 11, 4 to 75 at
  row 37), where the value lands on a half. Sizes that do not change:
  Identity.
"""

from __future__ import annotations

import numpy as np

from ..emit import exporter
from .forks import max_unpool

# The most values a constant computed at export from the net's shapes may hold (64 MiB as float32): a
# definition of a few bytes states any size, and SSD512's priors are 196,416 values.
MAX_COMPUTED = 2 ** 24


def _bounded(e, what: str, count: int) -> None:
    """Refuse a constant of `count` values computed from the shapes past MAX_COMPUTED, before computing it."""
    if count > MAX_COMPUTED:
        raise e.refuse(f"{what} would be a constant of {count:,} values computed from the net's shapes, past the "
                       f"{MAX_COMPUTED:,} an export computes")


def _settled(e):
    """The layer with the attributes reshape() computes (axis, offsets, order) for this step's bottom shapes.

    reshape() leaves them as the last shapes it was given made them; this
    step's shapes are given again so that what is written is this step's.
    """
    e.layer.reshape([tuple(s) for s in e.bottom_shapes])
    return e.layer


def _identity(e, source: str | None = None) -> None:
    """Every top the same value as `source` (the first bottom where not given)."""
    source = e.inputs[0] if source is None else source
    for out in e.outputs:
        e.node("Identity", [source], [out])


def _reshape(e, x: str, shape, out: str, suffix: str = "shape") -> str:
    """A Reshape of `x` to the static `shape`; a size of 0 in it needs allowzero, which opset 13 lacks."""
    shape = [int(d) for d in shape]
    attributes = {}
    if 0 in shape:
        # Reshape reads a 0 as "the input's size here" unless allowzero (opset 14 on) says it is a 0.
        if e.opset < 14:
            raise e.refuse(f"its top {tuple(shape)} has an axis of size 0, which Reshape says only from opset 14 "
                           "(allowzero); export with --opset 14 or later")
        attributes["allowzero"] = 1
    e.node("Reshape", [x, e.shape_constant(suffix, shape)], [out], **attributes)
    return out


@exporter("Concat")
def concat(e) -> None:
    layer = _settled(e)
    if len(e.inputs) == 1:
        _identity(e)
        return
    e.node("Concat", e.inputs, e.outputs, axis=int(layer.at))


@exporter("Slice")
def slice_(e) -> None:
    layer = _settled(e)
    if len(e.outputs) == 1:
        _identity(e)
        return
    sizes = np.diff(np.asarray(layer.edges, dtype=np.int64))
    # `split` as an input is valid in every opset from 13 (18 added num_outputs as the other way, not the only one).
    e.node("Split", [e.inputs[0], e.constant("split", sizes)], e.outputs, axis=int(layer.at))


@exporter("Split")
def split(e) -> None:
    _identity(e)


@exporter("Flatten", "Reshape")
def reshape(e) -> None:
    if not e.free:
        _reshape(e, e.inputs[0], e.top_shapes[0], e.outputs[0])
        return
    # --dynamic: Flatten from `axis` to the last axis as (0, .., 0, -1); Reshape from axis 0 with its own
    # shape, whose 0 (the bottom's size at that place) and -1 (inferred) are ONNX Reshape's too.
    layer = e.layer
    if layer.type == "Flatten":
        shape = [0] * layer.axis(layer.start, len(e.bottom_shapes[0]), "axis") + [-1]
    else:
        shape = list(layer.dims)
    e.node("Reshape", [e.inputs[0], e.shape_constant("shape", shape)], e.outputs[:1])


@exporter("Crop")
def crop(e) -> None:
    layer = _settled(e)
    data = e.bottom_shapes[0]
    if e.free:
        _crop_as_reference(e, layer)
        return
    axes = [i for i, (begin, size) in enumerate(zip(layer.begin, layer.shape)) if begin or size != data[i]]
    if not axes:
        _identity(e)
        return
    starts = [layer.begin[i] for i in axes]
    ends = [layer.begin[i] + layer.shape[i] for i in axes]
    e.node("Slice", [e.inputs[0], e.shape_constant("starts", starts), e.shape_constant("ends", ends),
                     e.shape_constant("axes", axes)], e.outputs[:1])


def _crop_as_reference(e, layer) -> None:
    """--dynamic: Slice of every axis from the crop axis, its ends the offsets plus the reference blob's Shape."""
    ndim = len(e.bottom_shapes[0])
    start = layer.axis(layer.start_param, ndim, "crop axis")
    size = e.node("Shape", [e.inputs[1]], [e.temp("reference_shape")])[0]
    size = e.node("Slice", [size, e.shape_constant("from", [start]), e.shape_constant("to", [ndim])],
                  [e.temp("reference_size")])[0]
    starts = e.shape_constant("starts", layer.begin[start:])
    ends = e.node("Add", [size, starts], [e.temp("ends")])[0]
    e.node("Slice", [e.inputs[0], starts, ends, e.shape_constant("axes", list(range(start, ndim)))], e.outputs[:1])


@exporter("Tile")
def tile(e) -> None:
    layer = _settled(e)
    repeats = [1] * len(e.bottom_shapes[0])
    repeats[layer.at] = layer.tiles
    e.node("Tile", [e.inputs[0], e.shape_constant("repeats", repeats)], e.outputs)


@exporter("Permute")
def permute(e) -> None:
    layer = _settled(e)
    order = [int(a) for a in layer.order]
    if order == list(range(len(order))):
        _identity(e)
        return
    e.node("Transpose", e.inputs, e.outputs, perm=order)


@exporter("ShuffleChannel")
def shuffle_channel(e) -> None:
    layer = _settled(e)
    n, c, h, w = layer.shape
    g = layer.group
    grouped = _reshape(e, e.inputs[0], (n, g, c // g, h, w), e.temp("grouped"), "grouped_shape")
    swapped = e.node("Transpose", [grouped], [e.temp("swapped")], perm=[0, 2, 1, 3, 4])[0]
    _reshape(e, swapped, e.top_shapes[0], e.outputs[0])


@exporter("PriorBox")
def prior_box(e) -> None:
    layer = _settled(e)
    count = 1
    for d in e.top_shapes[0]:
        count *= int(d)
    _bounded(e, "its priors", count)
    # forward() reads only the shapes reshape() recorded; zeros that take no memory stand for the bottoms.
    bottoms = [np.broadcast_to(np.float32(0), s) for s in e.bottom_shapes]
    priors = layer.forward(bottoms)[0]
    e.node("Identity", [e.constant("priors", np.ascontiguousarray(priors, dtype=np.float32))], e.outputs)


@exporter("Upsample")
def upsample(e) -> None:
    layer = _settled(e)
    if layer.unpool:
        max_unpool(e)
        return
    if layer.scale == 1:
        _identity(e)
        return
    # x_original = x_resized / s, floored: for an index below 2^24 the float quotient floors to i // s exactly.
    scales = np.asarray([1, 1, layer.scale, layer.scale], dtype=np.float32)
    e.node("Resize", [e.inputs[0], "", e.constant("scales", scales)], e.outputs, mode="nearest",
           coordinate_transformation_mode="asymmetric", nearest_mode="floor")


@exporter("Interp")
def interp(e) -> None:
    layer = _settled(e)
    x = e.inputs[0]
    n, c = e.bottom_shapes[0][:2]
    # --dynamic: a zoom above 1 changes any size but 1, which the exported one may be
    same = layer.zoom == 1 if e.free else (layer.h_in, layer.w_in) == (layer.h_out, layer.w_out)
    if layer.pad_beg or layer.pad_end:
        # pad_beg, pad_end <= 0 (the layer refuses others): rows and columns -pad_beg .. -pad_beg + size.
        first = -layer.pad_beg
        out = e.outputs[0] if same else e.temp("cropped")
        e.node("Slice", [x, e.shape_constant("starts", [first, first]),
                         e.shape_constant("ends", [first + layer.h_in, first + layer.w_in]),
                         e.shape_constant("axes", [2, 3])], [out])
        if same:
            return
        x = out
    if same:
        _identity(e, x)
        return
    if layer.kind == "bilinear" and e.free:
        # --dynamic, zoom_factor z (no pads: dynamic.py ties the others): each side (i - 1) z + 1, from Shape.
        sizes = e.node("Shape", [x], [e.temp("input_shape")])[0]
        ends = [e.shape_constant(k, v) for k, v in (("at0", [0]), ("at2", [2]), ("at4", [4]))]
        lead = e.node("Slice", [sizes, ends[0], ends[1]], [e.temp("lead")])[0]
        side = e.node("Slice", [sizes, ends[1], ends[2]], [e.temp("side")])[0]
        one = e.constant("one", np.asarray([1], np.int64))
        side = e.node("Sub", [side, one], [e.temp("side_less")])[0]
        side = e.node("Mul", [side, e.constant("zoom", np.asarray([layer.zoom], np.int64))], [e.temp("zoomed")])[0]
        side = e.node("Add", [side, one], [e.temp("side_out")])[0]
        sizes = e.node("Concat", [lead, side], [e.temp("sizes")], axis=0)[0]
        e.node("Resize", [x, "", "", sizes], e.outputs, mode="linear", coordinate_transformation_mode="align_corners")
        return
    if layer.kind == "bilinear":
        sizes = e.shape_constant("sizes", [n, c, layer.h_out, layer.w_out])
        e.node("Resize", [x, "", "", sizes], e.outputs, mode="linear",
               coordinate_transformation_mode="align_corners")
        return
    # nearest_neighbor: the rows and columns the layer reads (its _taps, caffe_cpu_nninterp2's floor(r i + 0.5)).
    _bounded(e, "its row and column indices", int(layer.h_out) + int(layer.w_out))
    rows = layer._taps(layer.h_in, layer.h_out)[0]
    cols = layer._taps(layer.w_in, layer.w_out)[0]
    picked = e.node("Gather", [x, e.constant("rows", np.asarray(rows, dtype=np.int64))], [e.temp("rows")],
                    axis=2)[0]
    e.node("Gather", [picked, e.constant("cols", np.asarray(cols, dtype=np.int64))], e.outputs, axis=3)
