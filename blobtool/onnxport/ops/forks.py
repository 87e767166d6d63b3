"""The forks' layers as ONNX nodes: SegNet's BN and max-unpooling Upsample, SENet's Axpy.

- BN (caffe-segnet), INFERENCE: Mul by the scale, then Add of the shift,
  both (1, C, 1, 1) as stored. LEARN: the batch's statistics as bn_layer.cpp
  computes them: ReduceMean of x and of x * x over N, H, W, variance E[x^2]
  - E[x]^2, then (x - mean) / Sqrt(variance + 1e-9) * scale + shift.
- Upsample with two bottoms (caffe-segnet's max-unpooling): MaxUnpool of
  the values at indices converted from Caffe's layout (h * W + w within its
  plane, a float) to ONNX's (flat over the whole (N, C, H, W) output): the
  mask cast to int64 plus (n C + c) H W, output_shape the layer's top.
- Axpy (SENet): y + a x, a reshaped to (N, C, 1, ...) for the broadcast.
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
        if len(e.outputs) > 1:
            raise e.refuse("the batch's mean and variance as tops 1 and 2 are not written; give BN one top")
        mean = e.reduce("ReduceMean", x, [0, 2, 3], e.temp("mean"))
        square = e.node("Mul", [x, x], [e.temp("square")])[0]
        mean_square = e.reduce("ReduceMean", square, [0, 2, 3], e.temp("mean_square"))
        mean_squared = e.node("Mul", [mean, mean], [e.temp("mean_squared")])[0]
        variance = e.node("Sub", [mean_square, mean_squared], [e.temp("variance")])[0]
        padded = e.node("Add", [variance, e.constant("eps", np.asarray(BN_EPS, np.float32))], [e.temp("padded")])[0]
        deviation = e.node("Sqrt", [padded], [e.temp("deviation")])[0]
        centred = e.node("Sub", [x, mean], [e.temp("centred")])[0]
        x = e.node("Div", [centred, deviation], [e.temp("normalized")])[0]
    scaled = e.node("Mul", [x, scale], [e.temp("scaled")])[0]
    e.node("Add", [scaled, shift], e.outputs)


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
