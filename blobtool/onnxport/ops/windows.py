"""SPP and Im2col as ONNX nodes.

- SPP: each pyramid level the Pooling blobtool/layers/windows.py builds
  (kernel, stride and pad from spp_layer.cpp's GetPoolingParam), written by
  the Pooling exporter (spatial.py) as one of its own; then Flatten (N,
  C h w) of each and Concat on axis 1. pyramid_height 1: the one pooling.
- Im2col: Pad with zeros (past the far pad where Caffe's output size,
  its division truncated toward 0, lets a window overhang it), then for each kernel tap (i, j) a Slice of rows
  i dilation, i dilation + stride, ... (and columns alike), Unsqueeze on
  axis 2, Concat of the kh kw taps on axis 2 (N, C, kh kw, Ho, Wo) and
  Reshape to (N, C kh kw, Ho, Wo): every value copied, none computed.
"""

from __future__ import annotations

from types import SimpleNamespace

from ..emit import Emit, exporter
from .spatial import pooling


@exporter("SPP")
def spp(e) -> None:
    layer = e.layer
    shape = tuple(e.bottom_shapes[0])
    layer.reshape([shape])
    flat = []
    for level, made in enumerate(layer.levels):
        pooled = made.reshape([shape])[0]
        if layer.height == 1:
            outputs = e.outputs[:1]
        else:
            outputs = [e.temp(f"level{level}")]
        step = SimpleNamespace(layer=made, bottom_shapes=[shape], top_shapes=[pooled])
        pooling(Emit(e.graph, step, e.inputs[:1], outputs))
        if layer.height > 1:
            flat.append(e.node("Flatten", outputs, [e.temp(f"level{level}_flat")], axis=1)[0])
    if layer.height > 1:
        e.node("Concat", flat, e.outputs[:1], axis=1)


@exporter("Im2col")
def im2col(e) -> None:
    layer = e.layer
    n, c, h, w = e.bottom_shapes[0]
    ho, wo = e.top_shapes[0][2:]
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = layer.kernel, layer.stride, layer.pad, layer.dilation
    source = e.inputs[0]
    # the far side padded to the last tap where a window overhangs the pad (Caffe's truncated output size)
    end_h = max(ph, (ho - 1) * sh + dh * (kh - 1) + 1 - h - ph)
    end_w = max(pw, (wo - 1) * sw + dw * (kw - 1) + 1 - w - pw)
    if ph or pw or end_h or end_w:
        pads = [0, 0, ph, pw, 0, 0, end_h, end_w]
        source = e.node("Pad", [source, e.shape_constant("pads", pads)], [e.temp("padded")], mode="constant")[0]
    axes = e.shape_constant("axes", [2, 3])
    steps = e.shape_constant("steps", [sh, sw])
    taps = []
    for i in range(kh):
        for j in range(kw):
            top, left = i * dh, j * dw
            starts = e.shape_constant(f"starts_{i}_{j}", [top, left])
            ends = e.shape_constant(f"ends_{i}_{j}", [top + (ho - 1) * sh + 1, left + (wo - 1) * sw + 1])
            tap = e.node("Slice", [source, starts, ends, axes, steps], [e.temp(f"tap_{i}_{j}")])[0]
            taps.append(e.node("Unsqueeze", [tap, e.shape_constant(f"at_{i}_{j}", [2])],
                               [e.temp(f"tap_{i}_{j}_5d")])[0])
    joined = taps[0] if len(taps) == 1 else e.node("Concat", taps, [e.temp("taps")], axis=2)[0]
    e.node("Reshape", [joined, e.shape_constant("top_shape", [n, c * kh * kw, ho, wo])], e.outputs[:1])
