"""The layer types blobtool knows, one row each: blobs, parameters, fold, PyTorch's side, run, export.

Every fact about a layer type that more than one job reads lives in its row
here: fold (which types a BatchNorm folds into, and where their output
channels lie), the way back into a net (how many blobs a layer of a
definition holds), ``--names torch`` (the PyTorch module and the names of
its tensors), the settings a port needs beyond the tensors, the layer
table of ``info`` (which parameter message to show), the class that runs
it (blobtool/layers/) and the function that exports it (blobtool/onnxport/),
and what it becomes in a deploy net (forward/deploy.py). Field numbers are
never typed in: formats/caffe/schema.py reads them from Caffe's schema.

The run and export registries sit above or beside this table and register
by type name; each registration is checked against the row here
(check_join), so no import runs upward and neither registry holds a type
its row does not name.

Adding a type (docs/development.md, "A layer type") is one row in TYPES,
its class and its exporter, and its tests.

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

__all__ = ["LayerType", "FoldInto", "TYPES", "row", "foldable", "param_of", "blob_count", "blob_range",
           "BATCHNORM_ROLES", "DEPLOY_ROLES", "deploy_role", "check_join", "name_of", "FORKS", "fork_of"]


@dataclass(frozen=True)
class FoldInto:
    """How a BatchNorm after a layer of this type folds into it (module docstring: `channels`)."""

    channels: str                   # "rows", "matrix" or "groups"
    # The settings the fold reads from the type's parameter message, by field name.
    axis: str = "axis"              # the axis its channels are computed on (must be 1)
    group: bool = False             # the weight's channels lie per group (convolution_param.group)
    transpose: bool = False         # the weight may be stored transposed (inner_product_param.transpose)


# What a layer of a type becomes in the deploy net (forward/deploy.py); a type with none runs as it is.
DEPLOY_ROLES = {
    "input": "an Input layer: its tops are the net's inputs, with the shapes it states",
    "data": "a data layer: its tops become inputs (its first the data, the others labels)",
    "loss": "a loss: it goes, as what it read does where only it read it",
    "softmax": "a loss that becomes the Softmax deploy nets end with (SoftmaxWithLoss)",
    "score": "it scores the net against labels, or writes blobs out: it goes",
    "swallow": "it only swallows blobs (Silence): it goes",
}


@dataclass(frozen=True)
class LayerType:
    """What blobtool knows of one Caffe layer type."""

    name: str
    param: str | None = None        # its parameter message, by its field name in LayerParameter
    blobs: tuple = ()               # the roles of its blobs, in order ("weight", "bias", "mean", ...)
    # How many blobs a layer holds, from its parameters: "bias_term" (1, and 1 more with
    # <param>.bias_term), "scale" (Scale's: its scale unless a second bottom gives it,
    # and a bias with bias_term), "bias" (Bias's: one unless a second bottom gives it),
    # "lstm" / "rnn" (3 / 5, and 1 more where a third bottom is the static input), an int, or
    # None (no rule: the values given say).
    count: object = None
    folds: FoldInto | None = None   # a BatchNorm after it folds into it
    torch: str | None = None        # the PyTorch module a port makes of it
    torch_names: tuple = ()         # the names its blobs take under --names torch, by index
    port: str | None = None         # the settings a port needs beyond the tensors (torchport/metadata.py)
    # The class in blobtool/layers/ that runs it and the function in blobtool/onnxport/ops/ that
    # exports it, as "module.name" (name_of); None where blobtool neither runs nor exports it.
    # @register and @exporter refuse a type whose row names another (check_join).
    run: str | None = None
    export: str | None = None
    deploy: str | None = None       # its role in a deploy net (DEPLOY_ROLES), None where it runs there


# Caffe's BatchNorm: the running sums of the mean and variance, and their
# factor s (mean = blob 0 / s, 0 when s is 0); NVIDIA Caffe's scale_bias
# adds its own scale and bias.
BATCHNORM_ROLES = ("mean", "variance", "factor", "weight", "bias")

_WEIGHT_BIAS = ("weight", "bias")

_ROWS = (
    LayerType("Convolution", "convolution_param", _WEIGHT_BIAS, "bias_term", FoldInto("rows"), "Conv2d",
              _WEIGHT_BIAS, "convolution", run="conv.Convolution", export="spatial.convolution"),
    # The forks' depthwise convolution (MobileNet ports): a Convolution with group = channels, its
    # weight and folding a Convolution's.
    LayerType("ConvolutionDepthwise", "convolution_param", _WEIGHT_BIAS, "bias_term", FoldInto("rows"), "Conv2d",
              _WEIGHT_BIAS, "convolution", run="conv.Convolution", export="spatial.convolution"),
    LayerType("Deconvolution", "convolution_param", _WEIGHT_BIAS, "bias_term", FoldInto("groups", group=True),
              "ConvTranspose2d", _WEIGHT_BIAS, "convolution", run="conv.Deconvolution", export="spatial.convolution"),
    LayerType("InnerProduct", "inner_product_param", _WEIGHT_BIAS, "bias_term", FoldInto("matrix", transpose=True),
              "Linear", _WEIGHT_BIAS, "inner_product", run="dense.InnerProduct", export="spatial.inner_product"),
    LayerType("Embed", "embed_param", _WEIGHT_BIAS, "bias_term", None, "Embedding", _WEIGHT_BIAS,
              run="dense.Embed", export="spatial.embed"),
    LayerType("BatchNorm", "batch_norm_param", BATCHNORM_ROLES, 3, None, "BatchNorm2d",
              ("running_mean", "running_var", None, "weight", "bias"), "batch_norm",
              run="normalize.BatchNorm", export="elementwise.batch_norm"),
    LayerType("Scale", "scale_param", ("weight", "bias"), "scale", None, None, _WEIGHT_BIAS,
              run="arith.Scale", export="elementwise.scale_or_bias"),
    LayerType("Bias", "bias_param", ("bias",), "bias", run="arith.Bias", export="elementwise.scale_or_bias"),
    LayerType("PReLU", "prelu_param", ("slope",), 1, None, "PReLU", ("weight",), "prelu",
              run="neuron.PReLU", export="elementwise.prelu"),
    LayerType("Pooling", "pooling_param", count=0, port="pooling", run="pooling.Pooling", export="spatial.pooling"),
    # caffe-ssd's: one scale per channel, or one
    LayerType("Normalize", "norm_param", ("weight",), 1, run="normalize.Normalize", export="elementwise.normalize"),
    LayerType("Input", "input_param", count=0, deploy="input"),
    LayerType("Eltwise", "eltwise_param", count=0, run="arith.Eltwise", export="elementwise.eltwise"),
    # BVLC's recurrent layers: a static input adds a blob in the middle (blobtool/layers/recurrent.py), so
    # no roles by index; the count is 3 (LSTM: W_xc, b_c, W_hc) or 5 (RNN), one more with a static input.
    LayerType("LSTM", "recurrent_param", count="lstm", run="recurrent.LSTM", export="recurrent.lstm"),
    LayerType("RNN", "recurrent_param", count="rnn", run="recurrent.RNN", export="recurrent.rnn"),
    LayerType("LSTMUnit", count=0, run="recurrent.LSTMUnit", export="recurrent.lstm_unit"),
    LayerType("Parameter", "parameter_param", ("value",), 1, run="batch.Parameter", export="batch.parameter"),
    # SegNet's and ENet's BN (alexgkendall/caffe-segnet): scale and shift, (1, C, 1, 1) each.
    LayerType("BN", "bn_param", ("scale", "shift"), 2, run="forks.BN", export="forks.bn"),
)

# Layer types of BVLC Caffe (and SSD's) that hold no blobs: (type, parameter message, the class
# that runs it, its exporter, its role in a deploy net).
_NO_BLOBS = (
    ("Data", "data_param", None, None, "data"),
    ("ImageData", "image_data_param", None, None, "data"),
    ("HDF5Data", "hdf5_data_param", None, None, "data"),
    ("HDF5Output", "hdf5_output_param", None, None, "score"),
    ("MemoryData", "memory_data_param", None, None, "data"),
    ("DummyData", "dummy_data_param", None, None, "data"),
    ("WindowData", "window_data_param", None, None, "data"),
    ("Python", "python_param", None, None, None),
    ("AnnotatedData", None, None, None, "data"),
    ("ReLU", "relu_param", "neuron.ReLU", "elementwise.relu", None),
    ("ELU", "elu_param", "neuron.ELU", "elementwise.elu", None),
    ("Sigmoid", "sigmoid_param", "neuron.Sigmoid", "elementwise.unary", None),
    ("TanH", "tanh_param", "neuron.TanH", "elementwise.unary", None),
    ("AbsVal", None, "neuron.AbsVal", "elementwise.unary", None),
    ("BNLL", None, "neuron.BNLL", "elementwise.unary", None),
    ("Power", "power_param", "neuron.Power", "elementwise.power", None),
    ("Exp", "exp_param", "neuron.Exp", "elementwise.exp", None),
    ("Log", "log_param", "neuron.Log", "elementwise.log", None),
    ("Threshold", "threshold_param", "neuron.Threshold", "elementwise.threshold", None),
    ("Clip", "clip_param", "neuron.Clip", "elementwise.clip", None),
    ("Swish", "swish_param", "neuron.Swish", "elementwise.swish", None),
    ("Dropout", "dropout_param", "neuron.Dropout", "elementwise.dropout", None),
    ("SPP", "spp_param", "windows.SPP", "windows.spp", None),
    ("LRN", "lrn_param", "normalize.LRN", "elementwise.lrn", None),
    ("MVN", "mvn_param", "normalize.MVN", "elementwise.mvn", None),
    ("Softmax", "softmax_param", "normalize.Softmax", "elementwise.softmax", None),
    ("SoftmaxWithLoss", "softmax_param", None, None, "softmax"),
    ("EuclideanLoss", None, None, None, "loss"),
    ("HingeLoss", "hinge_loss_param", None, None, "loss"),
    ("InfogainLoss", "infogain_loss_param", None, None, "loss"),
    ("MultinomialLogisticLoss", None, None, None, "loss"),
    ("SigmoidCrossEntropyLoss", None, None, None, "loss"),
    ("ContrastiveLoss", "contrastive_loss_param", None, None, "loss"),
    ("Accuracy", "accuracy_param", None, None, "score"),
    ("ArgMax", "argmax_param", "arith.ArgMax", "elementwise.argmax", None),
    ("Concat", "concat_param", "shape.Concat", "shape.concat", None),
    ("Slice", "slice_param", "shape.Slice", "shape.slice_", None),
    ("Split", None, "shape.Split", "shape.split", None),
    ("Flatten", "flatten_param", "shape.Flatten", "shape.reshape", None),
    ("Reshape", "reshape_param", "shape.Reshape", "shape.reshape", None),
    ("Crop", "crop_param", "shape.Crop", "shape.crop", None),
    ("Tile", "tile_param", "shape.Tile", "shape.tile", None),
    ("Reduction", "reduction_param", "arith.Reduction", "elementwise.reduction", None),
    ("Silence", None, None, None, "swallow"),
    ("BatchReindex", None, "batch.BatchReindex", "batch.batch_reindex", None),
    ("Filter", None, "batch.Filter", "batch.filter_", None),
    ("Im2col", "convolution_param", "windows.Im2col", "windows.im2col", None),
    ("Permute", "permute_param", "shape.Permute", "shape.permute", None),
    ("PriorBox", "prior_box_param", "ssd.PriorBox", "shape.prior_box", None),
    ("DetectionOutput", "detection_output_param", "ssd.DetectionOutput", "detection.detection_output", None),
    ("DetectionEvaluate", None, None, None, None),
    ("MultiBoxLoss", None, None, None, "loss"),
    # The forks' (proto/blobtool_caffe.proto names the fork of each parameter message).
    ("ReLU6", None, "neuron.ReLU6", "elementwise.clip", None),
    ("Upsample", "upsample_param", "resize.Upsample", "shape.upsample", None),
    ("Interp", "interp_param", "resize.Interp", "shape.interp", None),
    ("ShuffleChannel", "shuffle_channel_param", "shape.ShuffleChannel", "shape.shuffle_channel", None),
    ("Axpy", None, "forks.Axpy", "forks.axpy", None),
    ("ROIPooling", "roi_pooling_param", "forks.ROIPooling", "forks.roi_pooling", None),
    ("PSROIPooling", "psroi_pooling_param", "forks.PSROIPooling", "forks.psroi_pooling", None),
    ("Reorg", "reorg_param", "forks.Reorg", "forks.reorg", None),
)

# Type name -> row. A fork's type is one more row (docs/development.md).
TYPES = {t.name: t for t in _ROWS}
TYPES.update((name, LayerType(name, param, count=0, run=run, export=export, deploy=deploy))
             for name, param, run, export, deploy in _NO_BLOBS if name not in TYPES)


# The fork whose nets carry a type blobtool runs that BVLC Caffe and SSD lack (info --layers names it).
FORKS = {
    "BN": "caffe-segnet",
    "Axpy": "SENet",
    "ROIPooling": "caffe-fast-rcnn",
    "PSROIPooling": "R-FCN",
    "Reorg": "YOLOv2",
}


def fork_of(kind: str | None, bottoms: int = 1) -> str | None:
    """The fork a layer of type `kind` with `bottoms` bottoms comes from (FORKS), or None for BVLC's and SSD's.

    Upsample with two bottoms is SegNet's max-unpooling.
    """
    if kind == "Upsample" and bottoms == 2:
        return "caffe-segnet"
    return FORKS.get(kind or "")


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


def deploy_role(kind: str | None) -> str | None:
    """What a layer of type `kind` becomes in a deploy net (DEPLOY_ROLES), or None where it runs there.

    A type without a row whose name ends in "Loss" (a fork's loss) is a
    loss, as Caffe's naming of its own losses has it.
    """
    found = row(kind)
    if found is not None:
        return found.deploy
    return "loss" if (kind or "").endswith("Loss") else None


def name_of(thing) -> str:
    """How a row names a class or function: "module.name", the module by its last part."""
    return f"{thing.__module__.rpartition('.')[2]}.{thing.__qualname__}"


def check_join(kind: str, field: str, thing) -> None:
    """Refuse (TypeError) to register `thing` for type `kind` unless its row names it in `field` ("run", "export").

    @register (blobtool/layers/) and @exporter (blobtool/onnxport/) call it,
    so that a type runs or exports only through its row in TYPES.
    """
    found = row(kind)
    if found is None:
        raise TypeError(f"layer type {kind!r} has no row in TYPES (blobtool/net/layertypes.py): add one "
                        f"naming {name_of(thing)!r} as its {field}")
    if getattr(found, field) != name_of(thing):
        raise TypeError(f"layer type {kind!r}'s row names {getattr(found, field)!r} as its {field}, "
                        f"not {name_of(thing)!r}")


# The blobs of Caffe's recurrent layers without a static input (recurrent_layer.cpp's unrolled net's params).
_RECURRENT = {"lstm": 3, "rnn": 5}


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
    if found.count in _RECURRENT:
        return _RECURRENT[found.count] + (bottoms > 2)  # a third bottom is the static input
    return int(bottoms < 2)  # "bias"


def blob_range(kind: str | None) -> tuple | None:
    """(fewest, most) blobs a layer of type `kind` may hold, whatever its parameters; None for a type without a row.

    The fewest is what the row's `count` gives at the least (a "bias_term"
    type its weight, a Scale or a Bias given its operand by a second bottom
    none); the most is one per role of `blobs` (NVIDIA Caffe's BatchNorm its
    five). The class that runs the type checks a layer's blobs against it
    (layers/base.py), so that the count is stated here only.
    """
    found = row(kind)
    if found is None:
        return None
    if found.count in _RECURRENT:
        return _RECURRENT[found.count], _RECURRENT[found.count] + 1
    least = found.count if isinstance(found.count, int) else 1 if found.count == "bias_term" else 0
    return least, max(least, len(found.blobs))


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
