"""Caffe's layers, forward at test time: one class per type, with Caffe's Reshape and Forward_cpu (base.py).

The families, one module each, mirror Caffe's src/caffe/layers/:

- conv.py: Convolution (and the forks' ConvolutionDepthwise), Deconvolution; convkernels.py: their
  arithmetic (columns, 1 x 1, depthwise, Winograd, col2im);
- pooling.py: Pooling;
- dense.py: InnerProduct, Embed;
- neuron.py: the element-wise layers (ReLU, PReLU, ELU, Sigmoid, TanH, AbsVal,
  Power, Exp, Log, BNLL, Threshold, Clip, Swish, Dropout; the forks' ReLU6);
- normalize.py: BatchNorm, LRN, MVN, Softmax; caffe-ssd's Normalize;
- arith.py: Scale, Bias, Eltwise, Reduction, ArgMax;
- shape.py: Concat, Slice, Split, Flatten, Reshape, Crop, Tile; caffe-ssd's
  Permute; the forks' ShuffleChannel;
- ssd.py: caffe-ssd's PriorBox and DetectionOutput;
- recurrent.py: LSTM and RNN (BVLC's RecurrentLayer, unrolled over time);
- windows.py: SPP, Im2col; batch.py: BatchReindex, Filter, Parameter.
- resize.py: the forks' Upsample (nearest, and SegNet's max-unpooling) and Interp (bilinear);
- forks.py: SegNet's BN, SENet's Axpy, Fast R-CNN's ROIPooling, R-FCN's PSROIPooling, YOLOv2's Reorg.

Each formula is Caffe's, with its source file named beside the code.
Only numpy is imported; the runner (blobtool/forward/) builds layers from a
net's model and feeds them.
"""

from __future__ import annotations

from .base import FLOAT, REGISTRY, Layer, LayerError, register
from . import arith, batch, conv, dense, forks, neuron, normalize, pooling, recurrent, resize, shape, ssd, windows  # noqa: F401  (they register)

__all__ = ["Layer", "LayerError", "register", "layer_class", "known_types", "REGISTRY", "FLOAT"]


def layer_class(kind: str):
    """The class that runs layers of type `kind` (today's type name), or None."""
    return REGISTRY.get(kind)


def known_types() -> list:
    """Every type name a layer class runs, sorted."""
    return sorted(REGISTRY)
