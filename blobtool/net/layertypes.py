"""The layer types blobtool knows, one row each: blobs and their roles, parameter message, fold, PyTorch's side.

Every fact about a layer type that more than one job reads lives in its row
here: fold (which types a BatchNorm folds into, and where their output
channels lie), the way back into a net (how many blobs a layer of a
definition holds), ``--names torch`` (the PyTorch module and the names of
its tensors), the settings a port needs beyond the tensors, and the layer
table of ``info`` (which parameter message to show). Field numbers are
never typed in: formats/caffe/schema.py reads them from Caffe's schema.

Adding a type (docs/development.md, "A layer type") is one row in TYPES,
and its tests.

A BatchNorm folds into a layer computing W * input + b per output channel.
Where the output channel lies in the weight (``channels``):

===============  ==========================================  ==============
channels         weight                                      output channel
===============  ==========================================  ==============
"rows"           (C_out, C_in / group, kernel...)            axis 0
"matrix"         (N, K), legacy (1, 1, N, K); with           axis 0 of (N, K)
                 inner_product_param.transpose (K, N)        (1 transposed)
"groups"         (C_in, C_out / group, kernel...)            axis 1, within
                                                             its group
===============  ==========================================  ==============
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LayerType", "FoldInto", "TYPES", "row", "foldable", "param_of", "blob_count", "BATCHNORM_ROLES"]


@dataclass(frozen=True)
class FoldInto:
    """How a BatchNorm after a layer of this type folds into it (module docstring: `channels`)."""

    channels: str                   # "rows", "matrix" or "groups"
    # The settings the fold reads from the type's parameter message, by field name.
    axis: str = "axis"              # the axis its channels are computed on (must be 1)
    group: bool = False             # the weight's channels lie per group (convolution_param.group)
    transpose: bool = False         # the weight may be stored transposed (inner_product_param.transpose)


@dataclass(frozen=True)
class LayerType:
    """What blobtool knows of one Caffe layer type."""

    name: str
    param: str | None = None        # its parameter message, by its field name in LayerParameter
    blobs: tuple = ()               # the roles of its blobs, in order ("weight", "bias", "mean", ...)
    # How many blobs a layer holds, from its parameters: "bias_term" (1, and 1 more with
    # <param>.bias_term), "scale" (Scale's: its scale unless a second bottom gives it,
    # and a bias with bias_term), "bias" (Bias's: one unless a second bottom gives it),
    # an int, or None (no rule: the values given say).
    count: object = None
    folds: FoldInto | None = None   # a BatchNorm after it folds into it
    torch: str | None = None        # the PyTorch module a port makes of it
    torch_names: tuple = ()         # the names its blobs take under --names torch, by index
    port: str | None = None         # the settings a port needs beyond the tensors (torchport/metadata.py)


# Caffe's BatchNorm: the running sums of the mean and variance, and their
# factor s (mean = blob 0 / s, 0 when s is 0); NVIDIA Caffe's scale_bias
# adds its own scale and bias.
BATCHNORM_ROLES = ("mean", "variance", "factor", "weight", "bias")

_WEIGHT_BIAS = ("weight", "bias")

_ROWS = (
    LayerType("Convolution", "convolution_param", _WEIGHT_BIAS, "bias_term", FoldInto("rows"), "Conv2d",
              _WEIGHT_BIAS, "convolution"),
    # The forks' depthwise convolution (MobileNet ports): a Convolution with group = channels, its
    # weight and folding a Convolution's.
    LayerType("ConvolutionDepthwise", "convolution_param", _WEIGHT_BIAS, "bias_term", FoldInto("rows"), "Conv2d",
              _WEIGHT_BIAS, "convolution"),
    LayerType("Deconvolution", "convolution_param", _WEIGHT_BIAS, "bias_term", FoldInto("groups", group=True),
              "ConvTranspose2d", _WEIGHT_BIAS, "convolution"),
    LayerType("InnerProduct", "inner_product_param", _WEIGHT_BIAS, "bias_term", FoldInto("matrix", transpose=True),
              "Linear", _WEIGHT_BIAS, "inner_product"),
    LayerType("Embed", "embed_param", _WEIGHT_BIAS, "bias_term", None, "Embedding", _WEIGHT_BIAS),
    LayerType("BatchNorm", "batch_norm_param", BATCHNORM_ROLES, 3, None, "BatchNorm2d",
              ("running_mean", "running_var", None, "weight", "bias"), "batch_norm"),
    LayerType("Scale", "scale_param", ("weight", "bias"), "scale", None, None, _WEIGHT_BIAS),
    LayerType("Bias", "bias_param", ("bias",), "bias"),
    LayerType("PReLU", "prelu_param", ("slope",), 1, None, "PReLU", ("weight",), "prelu"),
    LayerType("Pooling", "pooling_param", count=0, port="pooling"),
    LayerType("Normalize", "norm_param", ("weight",), 1),  # caffe-ssd's: one scale per channel, or one
    LayerType("Input", "input_param", count=0),
    LayerType("Eltwise", "eltwise_param", count=0),
)

# Layer types of BVLC Caffe (and SSD's) that hold no blobs, and the parameter message of each.
_NO_BLOBS = {
    "Data": "data_param", "ImageData": "image_data_param", "HDF5Data": "hdf5_data_param",
    "HDF5Output": "hdf5_output_param", "MemoryData": "memory_data_param", "DummyData": "dummy_data_param",
    "WindowData": "window_data_param", "Python": "python_param", "AnnotatedData": None, "ReLU": "relu_param",
    "ELU": "elu_param", "Sigmoid": "sigmoid_param", "TanH": "tanh_param", "AbsVal": None, "BNLL": None,
    "Power": "power_param", "Exp": "exp_param", "Log": "log_param", "Threshold": "threshold_param",
    "Clip": "clip_param", "Swish": "swish_param", "Dropout": "dropout_param", "SPP": "spp_param",
    "LRN": "lrn_param", "MVN": "mvn_param", "Softmax": "softmax_param", "SoftmaxWithLoss": "softmax_param",
    "EuclideanLoss": None, "HingeLoss": "hinge_loss_param", "InfogainLoss": "infogain_loss_param",
    "MultinomialLogisticLoss": None, "SigmoidCrossEntropyLoss": None,
    "ContrastiveLoss": "contrastive_loss_param", "Accuracy": "accuracy_param", "ArgMax": "argmax_param",
    "Concat": "concat_param", "Slice": "slice_param", "Split": None, "Flatten": "flatten_param",
    "Reshape": "reshape_param", "Crop": "crop_param", "Tile": "tile_param", "Reduction": "reduction_param",
    "Silence": None, "BatchReindex": None, "Filter": None, "Im2col": "convolution_param",
    "Permute": "permute_param", "PriorBox": "prior_box_param", "DetectionOutput": "detection_output_param",
    "DetectionEvaluate": None, "MultiBoxLoss": None,
    # The forks' (proto/blobtool_caffe.proto names the fork of each parameter message).
    "ReLU6": None, "Upsample": "upsample_param", "Interp": "interp_param", "ShuffleChannel": "shuffle_channel_param",
}

# Type name -> row. A fork's type is one more row (docs/development.md).
TYPES = {t.name: t for t in _ROWS}
TYPES.update((name, LayerType(name, param, count=0)) for name, param in _NO_BLOBS.items() if name not in TYPES)


def row(kind: str | None) -> LayerType | None:
    """The row of layer type `kind` (today's type name), or None for a type blobtool has no row for."""
    return TYPES.get(kind or "")


def foldable(kind: str | None) -> FoldInto | None:
    """How a BatchNorm folds into a layer of type `kind`, or None when it does not."""
    found = row(kind)
    return found.folds if found is not None else None


def param_of(kind: str | None) -> str | None:
    """The parameter message of layer type `kind` (its field name in LayerParameter), or None."""
    found = row(kind)
    return found.param if found is not None else None


def blob_count(kind: str | None, message) -> int | None:
    """How many blobs a layer of type `kind` holds, from its LayerParameter `message`; None: no rule for it."""
    found = row(kind)
    if found is None or found.count is None:
        return None
    if isinstance(found.count, int):
        return found.count
    bottoms = len(message.bottom)
    if found.count == "bias_term":
        return 1 + bool(getattr(message, found.param).bias_term)
    if found.count == "scale":
        return (bottoms < 2) + bool(message.scale_param.bias_term)
    return int(bottoms < 2)  # "bias"


def output_channels(kind: str | None, shape: tuple, *, group: int = 1, transpose: bool = False) -> int | None:
    """The output channels a weight of `shape` computes in a layer of type `kind` (module docstring).

    None when `kind` takes no fold or the shape cannot be such a weight (too
    few axes, a grouped weight's inputs not a multiple of its groups).
    """
    how = foldable(kind)
    if how is None:
        return None
    shape = tuple(shape)
    if how.channels == "matrix":
        matrix = matrix_shape(shape)
        if matrix is None:
            return None
        return matrix[1] if transpose else matrix[0]
    if len(shape) < 2 or group < 1:
        return None
    if how.channels == "groups":
        return shape[1] * group if shape[0] % group == 0 else None
    return shape[0]


def matrix_shape(shape: tuple) -> tuple | None:
    """An InnerProduct weight's 2-D shape: (N, K) as stored, or the last two axes of the legacy (1, 1, N, K)."""
    if len(shape) == 2:
        return shape
    if len(shape) == 4 and shape[:2] == (1, 1):
        return shape[2:]
    return None
