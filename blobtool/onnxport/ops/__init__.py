"""The exporters, by family as blobtool/layers/ holds the layers: each Caffe type written as ONNX nodes.

- spatial.py: Convolution (and ConvolutionDepthwise), Deconvolution, Pooling, InnerProduct, Embed;
- elementwise.py: ReLU and the other neurons, BatchNorm, LRN, MVN, Softmax, Scale, Bias,
  Eltwise, Reduction, ArgMax, Normalize;
- shape.py: Concat, Slice, Split, Flatten, Reshape, Crop, Tile, Permute, ShuffleChannel,
  PriorBox (a constant), Upsample, Interp;
- detection.py: DetectionOutput (decode, per-class top_k and NonMaxSuppression, keep_top_k, Caffe's rows).
- recurrent.py: LSTM, RNN (their unrolled net, step by step);
- windows.py: SPP, Im2col; batch.py: BatchReindex, Filter, Parameter.
- forks.py: SegNet's BN and max-unpooling (Upsample with two bottoms), SENet's Axpy, ROIPooling,
  PSROIPooling, Reorg.

Each writes what the layer's class computes, with Caffe's rules (docs/onnx.md has the table).
"""

from __future__ import annotations

from . import batch, detection, elementwise, forks, recurrent, shape, spatial, windows  # noqa: F401  (they register)
