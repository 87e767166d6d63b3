"""fold folds a BatchNorm (and its Scale) after the forks' ConvolutionDepthwise: the folded net computes the same.

The oracle is the net itself, run unfolded: both nets run through
blobtool.run on one input, and every output of the folded net equals the
unfolded one's to 1e-5. The BatchNorm's statistics are far from 0 and 1
(and its factor not 1), so that a fold that missed them, or folded the
weight along the wrong axis, is off by whole values.
"""

from __future__ import annotations

import numpy as np

import blobtool
from caffenets import layer, net


def _mobilenet_block(rng, channels: int = 6):
    """A depthwise convolution, its BatchNorm, Scale and ReLU, then a pointwise convolution and its BatchNorm."""
    def stats(c):
        factor = 2.5
        return [rng.normal(0, 3, c) * factor, rng.uniform(0.2, 4, c) * factor, [factor]]

    return net([
        layer("dw", "ConvolutionDepthwise", "data",
              blobs=[rng.normal(0, 1, (channels, 1, 3, 3)), rng.normal(0, 1, channels)],
              convolution_param={"num_output": channels, "group": channels, "kernel_size": [3], "pad": [1]}),
        layer("dw_bn", "BatchNorm", "dw", "dw", blobs=stats(channels), batch_norm_param={"eps": 1e-3}),
        layer("dw_scale", "Scale", "dw", "dw", blobs=[rng.uniform(0.5, 2, channels), rng.normal(0, 1, channels)],
              scale_param={"bias_term": True}),
        layer("dw_relu", "ReLU", "dw", "dw"),
        # Without a bias of its own: the fold gives it one.
        layer("pw", "ConvolutionDepthwise", "dw", blobs=[rng.normal(0, 1, (channels, 1, 1, 1))],
              convolution_param={"num_output": channels, "group": channels, "kernel_size": [1],
                                 "bias_term": False}),
        layer("pw_bn", "BatchNorm", "pw", "pw", blobs=stats(channels)),
    ], {"data": (2, channels, 7, 7)}, name="depthwise")


def test_a_batchnorm_after_a_depthwise_convolution_folds_and_computes_the_same(tmp_path):
    rng = np.random.default_rng(5)
    source = tmp_path / "mobile.caffemodel"
    source.write_bytes(_mobilenet_block(rng).SerializeToString())
    folded = tmp_path / "folded.caffemodel"
    result = blobtool.fold(source, folded)
    record = result.record()
    assert [(f["layer"], f["batchnorm"], f["scale"], f["bias_created"]) for f in record["folded"]] == [
        ("dw", "dw_bn", "dw_scale", False), ("pw", "pw_bn", None, True)], record
    # Only the convolutions and the ReLU are left.
    left = blobtool.run(folded, outputs="all").program.steps
    assert [s.layer.type for s in left] == ["ConvolutionDepthwise", "ReLU", "ConvolutionDepthwise"]
    x = rng.normal(0, 2, (2, 6, 7, 7)).astype(np.float32)
    before = blobtool.run(source, inputs={"data": x}).values
    after = blobtool.run(folded, inputs={"data": x}).values
    assert list(before) == list(after) == ["pw"]
    scale = float(np.max(np.abs(before["pw"])))
    assert scale > 1.0  # the statistics matter: a fold that ignored them would be far off
    np.testing.assert_allclose(after["pw"], before["pw"], rtol=1e-5, atol=1e-5 * scale)
