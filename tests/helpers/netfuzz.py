"""Seeds and mutations of deploy definitions, and the check of `run` and `export` on each (fuzz_long --nets).

Seeds are small valid deploy nets built with tests/helpers/caffenets.py: a
classifier (Convolution, in-place ReLU, Pooling, InnerProduct, Softmax), an
SSD head (Normalize, PriorBox, Permute, Flatten, Concat, Reshape,
DetectionOutput), Split/Slice/Eltwise/Concat wiring with Reshape and Crop,
LRN/Tile/Power/MVN/Reduction/ArgMax, Deconvolution/Upsample/Interp,
BatchNorm/Scale/PReLU and the element-wise layers, an Input layer and
legacy `input_dim` fields.

`mutate_net` changes a copy of one the way a hostile or careless definition
does: integers in shapes and parameters pushed to their edges (0, 1, -1,
2^31-1, 2^31, 2^62 ...), floats to NaN, Inf, 1e38 and 1e-45, repeated fields
made long or emptied, layers repeated, deleted or reordered, bottoms rewired
to other blobs, tops made in place, names made to collide (with each other
and with the names export makes), past 256 characters or not UTF-8,
parameters dropped or duplicated, weight shapes and values changed. Each
mutant is written as a binary .caffemodel (with or without its weights)
and/or a deploy .prototxt.

`check_net_case` runs blobtool's `run` and `export` library calls on the
files as the commands do, and raises fuzzcases.FuzzFailure when anything but
a BlobToolError escapes, a warning is raised (numpy's RuntimeWarnings
among them), a call takes over TIME_LIMIT_S, traced allocations peak over
MEMORY_BOUND, a refused export leaves a file behind, or an export that
succeeded wrote a model onnx's checker (full check) refuses. `isolated` runs
a case in a forked child under an address-space limit and a hard timeout,
so that a size bomb or a hang costs one case, not the machine.
"""

from __future__ import annotations

import copy
import math
import os
import pickle
import re
import resource
import select
import signal
import sys
import tempfile
import time
import traceback
import tracemalloc
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from google.protobuf import descriptor as _descriptor
from google.protobuf import text_format

from blobtool._pb import blobtool_caffe_pb2 as pb
from blobtool.errors import BlobToolError
from caffenets import layer, net
from fuzzcases import FuzzFailure

# A call on a net of a few kilobytes that takes longer than this is a time bomb.
TIME_LIMIT_S = 2.0
# Traced allocations one call may peak at. The seeds need under 1 MiB; a mutant
# that legitimately needs more is one whose sizes a definition pushed far from them.
MEMORY_BOUND = 256 << 20
# Address space a forked case may add to what the fuzzer holds: past it, numpy
# raises MemoryError (a failure) instead of the machine swapping.
ADDRESS_SPACE_SLACK = 2 << 30
# A forked case still running after this is killed and counted as a hang.
HARD_TIMEOUT_S = 20.0
# A net whose blobs take more than this, none past Caffe's count bound (INT_MAX), is not run: it is
# legitimately big, and whether it fits is the machine's business.
BIG_NET_BYTES = 256 << 20
CAFFE_COUNT_MAX = 2**31 - 1
# A net that declares big blobs and is accepted may take a second more per this many bytes of them.
DECLARED_BYTES_PER_S = 100 << 20
# Layer types whose outputs onnxruntime and blobtool may rightly disagree on past the check's rule.
UNSTABLE_TYPES = ("ArgMax", "Reduction")
# An .onnx of a net this small that is bigger than this holds constants computed from untrusted sizes.
ONNX_BYTES_BOUND = 64 << 20


# -- seeds ------------------------------------------------------------------------------------------

def _w(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _classifier(rng):
    layers = [
        layer("conv1", "Convolution", "data", blobs=[_w(rng, 4, 3, 3, 3), _w(rng, 4)],
              convolution_param={"num_output": 4, "kernel_size": [3], "pad": [1], "stride": [1]}),
        layer("relu1", "ReLU", "conv1", "conv1"),
        layer("pool1", "Pooling", "conv1", pooling_param={"pool": 0, "kernel_size": 3, "stride": 2}),
        layer("ip1", "InnerProduct", "pool1", blobs=[_w(rng, 5, 36), _w(rng, 5)],
              inner_product_param={"num_output": 5}),
        layer("prob", "Softmax", "ip1"),
    ]
    return net(layers, {"data": (2, 3, 7, 7)}, name="classifier")


def _ssd(rng):
    classes, per_cell = 3, 4   # priors per cell: 1 + aspect ratio 2 and 1/2 + one max size
    prior = {"min_size": [4.0], "max_size": [8.0], "aspect_ratio": [2.0], "flip": True, "clip": False,
             "variance": [0.1, 0.1, 0.2, 0.2], "offset": 0.5}
    layers = [
        layer("conv1", "Convolution", "data", blobs=[_w(rng, 4, 3, 3, 3), _w(rng, 4)],
              convolution_param={"num_output": 4, "kernel_size": [3], "pad": [1]}),
        layer("relu1", "ReLU", "conv1", "conv1"),
        layer("norm1", "Normalize", "conv1", blobs=[np.full(4, 20.0)],
              norm_param={"across_spatial": False, "channel_shared": False}),
        layer("pool1", "Pooling", "conv1", pooling_param={"pool": 0, "kernel_size": 2, "stride": 2}),
    ]
    heads = []
    for k, feat in enumerate(("norm1", "pool1")):
        heads += [
            layer(f"loc{k}", "Convolution", feat, blobs=[_w(rng, per_cell * 4, 4, 1, 1), _w(rng, per_cell * 4)],
                  convolution_param={"num_output": per_cell * 4, "kernel_size": [1]}),
            layer(f"loc{k}_perm", "Permute", f"loc{k}", permute_param={"order": [0, 2, 3, 1]}),
            layer(f"loc{k}_flat", "Flatten", f"loc{k}_perm", flatten_param={"axis": 1}),
            layer(f"conf{k}", "Convolution", feat,
                  blobs=[_w(rng, per_cell * classes, 4, 1, 1), _w(rng, per_cell * classes)],
                  convolution_param={"num_output": per_cell * classes, "kernel_size": [1]}),
            layer(f"conf{k}_perm", "Permute", f"conf{k}", permute_param={"order": [0, 2, 3, 1]}),
            layer(f"conf{k}_flat", "Flatten", f"conf{k}_perm", flatten_param={"axis": 1}),
            layer(f"prior{k}", "PriorBox", [feat, "data"], prior_box_param=prior),
        ]
    tail = [
        layer("loc", "Concat", ["loc0_flat", "loc1_flat"], concat_param={"axis": 1}),
        layer("conf", "Concat", ["conf0_flat", "conf1_flat"], concat_param={"axis": 1}),
        layer("priors", "Concat", ["prior0", "prior1"], concat_param={"axis": 2}),
        layer("conf_reshape", "Reshape", "conf", reshape_param={"shape": {"dim": [0, -1, classes]}}),
        layer("conf_softmax", "Softmax", "conf_reshape", softmax_param={"axis": 2}),
        layer("conf_flat", "Flatten", "conf_softmax"),
        layer("detection_out", "DetectionOutput", ["loc", "conf_flat", "priors"], detection_output_param={
            "num_classes": classes, "share_location": True, "background_label_id": 0,
            "nms_param": {"nms_threshold": 0.45, "top_k": 20}, "code_type": 2, "keep_top_k": 10,
            "confidence_threshold": 0.01}),
    ]
    return net(layers + heads + tail, {"data": (1, 3, 16, 16)}, name="ssd")


def _ssd_head(rng):
    """The SSD net up to its priors and scores: the head before DetectionOutput, exported on its own."""
    message = _ssd(rng)
    del message.layer[-1]
    message.name = "ssd_head"
    return message


def _wiring(rng):
    layers = [
        layer("split", "Split", "data", ["s1", "s2", "s3"]),
        layer("slice", "Slice", "s1", ["a", "b", "c"], slice_param={"axis": 1, "slice_point": [2, 4]}),
        layer("sum", "Eltwise", ["a", "b"], eltwise_param={"operation": 1, "coeff": [0.5, -2.0]}),
        layer("prod", "Eltwise", ["sum", "c"], eltwise_param={"operation": 0}),
        layer("max", "Eltwise", ["prod", "a", "b"], eltwise_param={"operation": 2}),
        layer("cat", "Concat", ["max", "s2"], concat_param={"axis": 1}),
        layer("halves", "Slice", "s3", ["h1", "h2"], slice_param={"axis": 2}),
        layer("crop", "Crop", ["cat", "h1"], crop_param={"axis": 2, "offset": [1, 0]}),
        layer("re", "Reshape", "cat", reshape_param={"shape": {"dim": [0, -1, 5]}}),
        layer("flat", "Flatten", "re", flatten_param={"axis": 1, "end_axis": -1}),
    ]
    return net(layers, {"data": (2, 6, 4, 5)}, name="wiring")


def _lrn_tile(rng):
    layers = [
        layer("lrn_across", "LRN", "data", lrn_param={"local_size": 3, "alpha": 1e-4, "beta": 0.75, "k": 1.0}),
        layer("lrn_within", "LRN", "lrn_across", lrn_param={"local_size": 3, "norm_region": 1}),
        layer("tile", "Tile", "lrn_within", tile_param={"axis": 1, "tiles": 2}),
        layer("power", "Power", "tile", "tile", power_param={"power": 2.0, "scale": 0.5, "shift": 1.0}),
        layer("mvn", "MVN", "tile", mvn_param={"normalize_variance": True, "across_channels": False}),
        layer("sum", "Reduction", "mvn", reduction_param={"operation": 1, "axis": 2}),
        layer("argmax", "ArgMax", "mvn", argmax_param={"top_k": 2, "axis": 1}),
    ]
    return net(layers, {"data": (1, 4, 5, 5)}, name="lrn_tile")


def _resize(rng):
    layers = [
        layer("deconv", "Deconvolution", "data", blobs=[_w(rng, 2, 3, 3, 3), _w(rng, 3)],
              convolution_param={"num_output": 3, "kernel_size": [3], "stride": [2], "pad": [1]}),
        layer("up", "Upsample", "deconv", upsample_param={"scale": 2}),
        layer("zoom", "Interp", "data", interp_param={"zoom_factor": 2}),
        layer("sized", "Interp", "up", interp_param={"height": 5, "width": 6}),
        layer("like", "Interp", ["zoom", "sized"]),
        layer("pool", "Pooling", "like", pooling_param={"pool": 1, "kernel_size": 2, "stride": 2, "pad": 1}),
        layer("gpool", "Pooling", "up", pooling_param={"pool": 0, "global_pooling": True}),
    ]
    return net(layers, {"data": (1, 2, 4, 4)}, name="resize")


def _norm(rng):
    layers = [
        layer("bn", "BatchNorm", "data", "data_bn",
              blobs=[_w(rng, 3), np.abs(_w(rng, 3)) + 1.0, [1.0]], batch_norm_param={"eps": 1e-5}),
        layer("scale", "Scale", "data_bn", "data_bn", blobs=[_w(rng, 3), _w(rng, 3)],
              scale_param={"bias_term": True}),
        layer("prelu", "PReLU", "data_bn", blobs=[np.full(3, 0.25)]),
        layer("shuffle", "ShuffleChannel", "prelu", shuffle_channel_param={"group": 3}),
        layer("clip", "Clip", "shuffle", clip_param={"min": -1.0, "max": 2.0}),
        layer("elu", "ELU", "clip", elu_param={"alpha": 0.5}),
        layer("abs", "AbsVal", "elu"),
        layer("log", "Log", "abs", log_param={"shift": 1.0}),
        layer("sig", "Sigmoid", "log"),
        layer("tanh", "TanH", "sig"),
        layer("ip", "InnerProduct", "tanh", blobs=[_w(rng, 4, 48), _w(rng, 4)],
              inner_product_param={"num_output": 4}),
        layer("bias", "Bias", "ip", blobs=[_w(rng, 4)]),
        layer("exp", "Exp", "bias", exp_param={"scale": 0.1}),
    ]
    return net(layers, {"data": (2, 3, 4, 4)}, name="norm")


def _input_layer(rng):
    """An Input layer (not the net's input fields) feeding a depthwise convolution and a Softmax."""
    layers = [
        layer("input", "Input", [], "data", input_param={"shape": [{"dim": [1, 2, 5, 5]}]}),
        layer("dw", "ConvolutionDepthwise", "data", blobs=[_w(rng, 2, 1, 3, 3)],
              convolution_param={"num_output": 2, "group": 2, "kernel_size": [3], "bias_term": False,
                                 "dilation": [1]}),
        layer("relu6", "ReLU6", "dw", "dw"),
        layer("prob", "Softmax", "dw", softmax_param={"axis": 1}),
    ]
    return net(layers, {}, name="input_layer")


def _legacy_input(rng):
    """The legacy input/input_dim fields, two inputs, a Concat and a Threshold."""
    message = net([
        layer("cat", "Concat", ["x", "y"], concat_param={"axis": 0}),
        layer("thr", "Threshold", "cat", threshold_param={"threshold": 0.1}),
        layer("drop", "Dropout", "thr", "thr", dropout_param={"dropout_ratio": 0.5}),
        layer("swish", "Swish", "thr"),
    ], {}, name="legacy_input")
    for name in ("x", "y"):
        message.input.append(name)
        message.input_dim.extend([1, 3, 2, 2])
    return message


SEED_BUILDERS = {"classifier": _classifier, "ssd": _ssd, "ssd_head": _ssd_head, "wiring": _wiring,
                 "lrn_tile": _lrn_tile, "resize": _resize, "norm": _norm, "input_layer": _input_layer,
                 "legacy_input": _legacy_input}


@dataclass(frozen=True)
class NetSeed:
    """A valid deploy net with its weights."""

    name: str
    message: pb.NetParameter


def seed_nets() -> list:
    """One small valid net per family of layers, each with its weights."""
    return [NetSeed(name, build(np.random.default_rng(k))) for k, (name, build) in enumerate(SEED_BUILDERS.items())]


# -- mutations ----------------------------------------------------------------------------------------

FD = _descriptor.FieldDescriptor
# 2001 and 5,999,999: a kernel or a window that is slow, not big (issue 43's item 13).
INT32_EDGES = (0, 1, -1, 2, 3, -3, 7, 2001, 65535, 5_999_999, 1 << 30, 2**31 - 1, -2**31)
UINT32_EDGES = (0, 1, 2, 3, 7, 2001, 65535, 1 << 20, 5_999_999, 1 << 30, 2**31 - 1, 2**31, 2**32 - 1)
INT64_EDGES = (0, 1, -1, 2, 3, -3, 65535, 2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, -2**63)
UINT64_EDGES = (0, 1, 2, 3, 65535, 2**31 - 1, 2**31, 2**32, 2**62, 2**63, 2**64 - 1)
FLOAT_EDGES = (0.0, -0.0, 1.0, -1.0, 0.5, 2.0, -3.0, 1e-45, 1e-30, 1e6, 1e30, 3.4e38, -3.4e38, 1e300,
               math.inf, -math.inf, math.nan)
_RANGES = {FD.CPPTYPE_INT32: (-2**31, 2**31 - 1), FD.CPPTYPE_UINT32: (0, 2**32 - 1),
           FD.CPPTYPE_INT64: (-2**63, 2**63 - 1), FD.CPPTYPE_UINT64: (0, 2**64 - 1)}
_EDGES = {FD.CPPTYPE_INT32: INT32_EDGES, FD.CPPTYPE_UINT32: UINT32_EDGES, FD.CPPTYPE_INT64: INT64_EDGES,
          FD.CPPTYPE_UINT64: UINT64_EDGES}

# Non-UTF-8 names: the message (whose strings protobuf keeps as text) holds a placeholder of the same
# length as the bytes it stands for; write_mutant swaps them in the serialized bytes and in the text.
NON_UTF8 = {f"nu@@{k:02d}": b"nu\xff\xfe" + f"{k:02d}".encode() for k in range(8)}
NON_UTF8_TEXT = {key: "nu\\377\\376" + key[4:] for key in NON_UTF8}


def _repeated(fd) -> bool:
    """Whether a field is repeated (newer protobuf has is_repeated and no label)."""
    flag = getattr(fd, "is_repeated", None)
    return bool(flag) if flag is not None else fd.label == FD.LABEL_REPEATED


def _number(cpp, current, pick):
    """An edge value for a field of this C++ type, or one near `current`."""
    if cpp == FD.CPPTYPE_BOOL:
        return not current if pick("bool") else pick("bool")
    if cpp in (FD.CPPTYPE_FLOAT, FD.CPPTYPE_DOUBLE):
        if pick("int", 0, 3) == 0 and current is not None and math.isfinite(current):
            return float(current) * pick("choice", (-1.0, 0.5, 2.0, 1000.0)) + pick("choice", (0.0, 1.0))
        return pick("choice", FLOAT_EDGES)
    low, high = _RANGES[cpp]
    if pick("int", 0, 3) == 0 and current is not None:
        if pick("bool"):
            value = int(current) + pick("choice", (-2, -1, 1, 2, 5))
        else:
            value = int(current) * pick("choice", (2, 10, 1000))
    else:
        value = pick("choice", _EDGES[cpp])
    return min(max(value, low), high)


def _numeric_sites(message, out, path=""):
    """Every (message, field, index) of a number, bool or enum below `message`; unset optional fields too."""
    for fd in message.DESCRIPTOR.fields:
        if fd.cpp_type == FD.CPPTYPE_MESSAGE:
            if _repeated(fd):
                for k, sub in enumerate(getattr(message, fd.name)):
                    if fd.name == "blobs":
                        _blob_sites(sub, out, f"{path}{fd.name}[{k}].")
                    else:
                        _numeric_sites(sub, out, f"{path}{fd.name}[{k}].")
            elif message.HasField(fd.name):
                _numeric_sites(getattr(message, fd.name), out, f"{path}{fd.name}.")
        elif fd.cpp_type != FD.CPPTYPE_STRING:
            if _repeated(fd):
                values = getattr(message, fd.name)
                out.extend((message, fd, k, f"{path}{fd.name}[{k}]") for k in range(len(values)))
                out.append((message, fd, len(values), f"{path}{fd.name}[+]"))
            else:
                out.append((message, fd, None, f"{path}{fd.name}"))


def _blob_sites(blob, out, path):
    """A weight blob's shape dims and legacy dims (not its values: set_weight_values does those)."""
    for k in range(len(blob.shape.dim)):
        out.append((blob.shape, blob.shape.DESCRIPTOR.fields_by_name["dim"], k, f"{path}shape.dim[{k}]"))
    for name in ("num", "channels", "height", "width"):
        if blob.HasField(name):
            out.append((blob, blob.DESCRIPTOR.fields_by_name[name], None, f"{path}{name}"))


def _set_number(message, fd, index, pick):
    if fd.cpp_type == FD.CPPTYPE_ENUM:
        numbers = [v.number for v in fd.enum_type.values]
        value = pick("choice", numbers)
    else:
        current = None
        if _repeated(fd):
            values = getattr(message, fd.name)
            current = values[index] if index < len(values) else None
        elif message.HasField(fd.name):
            current = getattr(message, fd.name)
        value = _number(fd.cpp_type, current, pick)
    if _repeated(fd):
        values = getattr(message, fd.name)
        if index < len(values):
            values[index] = value
        else:
            values.append(value)
    else:
        setattr(message, fd.name, value)
    return value


def push_number(m, pick):
    """A number anywhere in the net (input shapes, parameters, weight shapes) set to an edge value."""
    sites = []
    _numeric_sites(m, sites)
    if not sites:
        return "no number"
    message, fd, index, where = pick("choice", sites)
    value = _set_number(message, fd, index, pick)
    return f"{where} = {value!r}"


def push_dim(m, pick):
    """A dimension (an input's, an Input layer's, a Reshape's, a weight's, input_dim) set to an edge value."""
    sites = [site for site in _all_sites(m) if site[1].name in ("dim", "input_dim", "num", "channels", "height",
                                                                 "width")]
    if not sites:
        return push_number(m, pick)
    message, fd, index, where = pick("choice", sites)
    value = _set_number(message, fd, index, pick)
    return f"{where} = {value!r}"


# Parameter messages worth adding to a layer that lacks them (the ones the seeds' layers read).
PARAM_FIELDS = ("convolution_param", "pooling_param", "inner_product_param", "lrn_param", "tile_param",
                "prior_box_param", "interp_param", "upsample_param", "reshape_param", "crop_param",
                "concat_param", "slice_param", "eltwise_param", "softmax_param", "flatten_param",
                "permute_param", "batch_norm_param", "scale_param", "power_param", "mvn_param",
                "reduction_param", "argmax_param", "detection_output_param", "norm_param", "prelu_param",
                "shuffle_channel_param", "clip_param", "elu_param", "log_param", "exp_param", "bias_param",
                "threshold_param", "relu_param", "input_param", "embed_param")


def _param_field_of(each, pick):
    present = [fd.name for fd, _ in each.ListFields() if fd.name.endswith("_param")]
    return pick("choice", present) if present and pick("int", 0, 3) else pick("choice", PARAM_FIELDS)


def push_param_number(m, pick):
    """A number of one layer's parameter message (set or not yet set) pushed to an edge."""
    if not m.layer:
        return push_number(m, pick)
    each = pick("choice", list(m.layer))
    name = _param_field_of(each, pick)
    sub = getattr(each, name)
    sites = []
    _numeric_sites(sub, sites)
    # Unset scalars of the message are sites too (_numeric_sites lists them); a nested message is set here.
    nested = [fd for fd in sub.DESCRIPTOR.fields if fd.cpp_type == FD.CPPTYPE_MESSAGE and not _repeated(fd)]
    if nested and pick("int", 0, 4) == 0:
        fd = pick("choice", nested)
        getattr(sub, fd.name).SetInParent()
        sites = []
        _numeric_sites(getattr(sub, fd.name), sites)
    if not sites:
        sub.SetInParent()
        return f"{each.name}.{name} set empty"
    message, fd, index, where = pick("choice", sites)
    value = _set_number(message, fd, index, pick)
    return f"{each.name}.{name}.{where} = {value!r}"


def resize_repeated(m, pick):
    """A repeated number field (shape dims, kernel sizes, ratios, coefficients) emptied or made long."""
    sites = [(msg, fd, k, w) for msg, fd, k, w in _all_sites(m) if _repeated(fd)]
    if not sites:
        return "no repeated field"
    message, fd, _, where = pick("choice", sites)
    values = getattr(message, fd.name)
    how = pick("choice", ("clear", "long", "append", "drop"))
    if how == "clear":
        del values[:]
    elif how == "drop" and len(values):
        del values[pick("int", 0, len(values) - 1)]
    elif how == "long" and fd.cpp_type != FD.CPPTYPE_ENUM:
        fill = values[0] if len(values) else (1 if fd.cpp_type != FD.CPPTYPE_BOOL else True)
        values.extend([fill] * pick("choice", (2, 5, 33, 70, 300)))
    elif fd.cpp_type != FD.CPPTYPE_ENUM:
        values.append(values[-1] if len(values) and pick("bool") else _number(fd.cpp_type, None, pick))
    return f"{where.rsplit('[', 1)[0]} {how} (now {len(values)})"


def _all_sites(m):
    sites = []
    _numeric_sites(m, sites)
    return sites


def _blob_names(m) -> list:
    names = list(m.input)
    for each in m.layer:
        names.extend(t for t in each.top if t not in names)
    return names


def repeat_layer(m, pick):
    """A layer repeated right after itself or elsewhere, under its own name or another."""
    if not m.layer:
        return "no layer"
    k = pick("int", 0, len(m.layer) - 1)
    twin = copy.deepcopy(m.layer[k])
    if pick("bool"):
        twin.name = twin.name + "_again"
    at = k + 1 if pick("bool") else pick("int", 0, len(m.layer))
    times = pick("choice", (1, 1, 2, 50))
    for _ in range(times):
        m.layer.insert(at, copy.deepcopy(twin))
    return f"layer {m.layer[k].name} repeated x{times} at {at}"


def delete_layer(m, pick):
    if not m.layer:
        return "no layer"
    k = pick("int", 0, len(m.layer) - 1)
    name = m.layer[k].name
    del m.layer[k]
    return f"layer {name} deleted"


def swap_layers(m, pick):
    if len(m.layer) < 2:
        return "one layer"
    a, b = pick("int", 0, len(m.layer) - 1), pick("int", 0, len(m.layer) - 1)
    first, second = copy.deepcopy(m.layer[a]), copy.deepcopy(m.layer[b])
    m.layer[a].CopyFrom(second)
    m.layer[b].CopyFrom(first)
    return f"layers {a} and {b} swapped"


def rewire(m, pick):
    """A bottom replaced, added or removed; a top added or removed (another blob, a later one, an unknown one)."""
    if not m.layer:
        return "no layer"
    each = pick("choice", list(m.layer))
    names = _blob_names(m) + ["nowhere"]
    how = pick("choice", ("bottom", "bottom", "add_bottom", "drop_bottom", "add_top", "drop_top"))
    if how == "bottom" and each.bottom:
        k = pick("int", 0, len(each.bottom) - 1)
        each.bottom[k] = pick("choice", names)
        return f"{each.name}.bottom[{k}] = {each.bottom[k]}"
    if how == "add_bottom" or (how == "bottom" and not each.bottom):
        each.bottom.append(pick("choice", names))
        return f"{each.name} + bottom {each.bottom[-1]}"
    if how == "drop_bottom" and each.bottom:
        del each.bottom[pick("int", 0, len(each.bottom) - 1)]
        return f"{each.name} lost a bottom"
    if how == "add_top":
        each.top.append(pick("choice", names + [each.name + "_extra"]))
        return f"{each.name} + top {each.top[-1]}"
    if each.top:
        del each.top[pick("int", 0, len(each.top) - 1)]
        return f"{each.name} lost a top"
    return "nothing to rewire"


def make_in_place(m, pick):
    """A layer's top made its bottom (every later reader of the old top rewired to it too, or not)."""
    candidates = [each for each in m.layer if each.bottom and each.top]
    if not candidates:
        return "no layer with bottoms and tops"
    each = pick("choice", candidates)
    old, new = each.top[0], pick("choice", list(each.bottom))
    each.top[0] = new
    if pick("bool"):
        for later in m.layer:
            for k, b in enumerate(later.bottom):
                if b == old:
                    later.bottom[k] = new
    return f"{each.name} in place on {new}"


def _hostile_name(m, pick) -> str:
    names = _blob_names(m) or ["data"]
    layers = [each.name for each in m.layer] or ["layer"]
    other, owner = pick("choice", names), pick("choice", layers)
    return pick("choice", (
        other, owner, "", " ", "x" * 300 + "a", "x" * 300 + "b", f"{other}:{owner}", f"{owner}/0", f"{owner}/1",
        f"{owner}/Conv", f"{other}#1", f"{other}:float32", "名前", "a\nb", "a\x00b",
        pick("choice", list(NON_UTF8)), "nu\\xff\\xfe00", "nu\\377\\37600"))


def rename(m, pick):
    """A layer, a blob (every use of it, or one) or an input renamed to a colliding, long or odd name."""
    new = _hostile_name(m, pick)
    how = pick("choice", ("layer", "blob", "one_top", "one_bottom", "input"))
    if how == "layer" and m.layer:
        each = pick("choice", list(m.layer))
        each.name = new
        return f"layer renamed {new!r}"
    if how == "input" and m.input:
        k = pick("int", 0, len(m.input) - 1)
        m.input[k] = new
        return f"input {k} renamed {new!r}"
    names = _blob_names(m)
    if not names:
        return "no blob"
    old = pick("choice", names)
    if how == "blob":
        for k, name in enumerate(m.input):
            if name == old:
                m.input[k] = new
        for each in m.layer:
            for field_ in (each.bottom, each.top):
                for k, name in enumerate(field_):
                    if name == old:
                        field_[k] = new
        return f"blob {old!r} renamed {new!r}"
    holders = [each for each in m.layer if (each.top if how == "one_top" else each.bottom)]
    if not holders:
        return "no holder"
    each = pick("choice", holders)
    field_ = each.top if how == "one_top" else each.bottom
    field_[pick("int", 0, len(field_) - 1)] = new
    return f"{each.name}: a {how[4:]} renamed {new!r}"


def change_type(m, pick):
    """A layer's type replaced by another one blobtool runs (its parameters kept), or an unknown one."""
    from blobtool.layers import known_types

    if not m.layer:
        return "no layer"
    each = pick("choice", list(m.layer))
    each.type = pick("choice", known_types() + ["Input", "Python", "Region", ""])
    return f"{each.name} made {each.type}"


def drop_or_duplicate(m, pick):
    """A parameter message dropped, or merged into itself again, or a weight blob dropped or repeated."""
    if not m.layer:
        return "no layer"
    each = pick("choice", list(m.layer))
    present = [fd.name for fd, _ in each.ListFields() if fd.name.endswith("_param")]
    how = pick("choice", ("drop_param", "dup_param", "drop_blob", "dup_blob", "clear_blobs"))
    if how == "drop_param" and present:
        name = pick("choice", present)
        each.ClearField(name)
        return f"{each.name}.{name} dropped"
    if how == "dup_param" and present:
        name = pick("choice", present)
        sub = getattr(each, name)
        # Caffe reads a message given twice as one, its repeated fields appended twice.
        sub.MergeFrom(copy.deepcopy(sub))
        return f"{each.name}.{name} given twice"
    if how == "drop_blob" and each.blobs:
        del each.blobs[pick("int", 0, len(each.blobs) - 1)]
        return f"{each.name} lost a weight blob"
    if how == "dup_blob" and each.blobs:
        each.blobs.add().CopyFrom(pick("choice", list(each.blobs)))
        return f"{each.name} got a weight blob again"
    del each.blobs[:]
    return f"{each.name} lost its weights"


def set_weight_values(m, pick):
    """A weight blob's values made NaN, Inf, huge or tiny (some or all), or its count changed."""
    holders = [each for each in m.layer if each.blobs]
    if not holders:
        return "no weights"
    each = pick("choice", holders)
    blob = pick("choice", list(each.blobs))
    values = np.asarray(blob.data, np.float32)
    how = pick("choice", ("all", "one", "count"))
    if how == "count":
        del blob.data[:]
        blob.data.extend(np.resize(values, max(0, len(values) + pick("choice", (-1, 1, -len(values))))).tolist())
        return f"{each.name}: a weight blob of {len(blob.data)} values"
    value = pick("choice", (math.nan, math.inf, -math.inf, 3.4e38, -3.4e38, 1e-45, 0.0, -1.0))
    if how == "all" or not len(values):
        values[:] = value
    else:
        values[pick("int", 0, len(values) - 1)] = value
    del blob.data[:]
    blob.data.extend(values.tolist())
    return f"{each.name}: weights {how} {value!r}"


def input_shape(m, pick):
    """The net's inputs as the legacy input_dim fields, an Input layer, none, or with many axes."""
    how = pick("choice", ("axes", "dims_legacy", "input_layer", "no_shape", "extra_input"))
    if how == "axes" and m.input_shape:
        shape = pick("choice", list(m.input_shape))
        n = pick("choice", (0, 1, 5, 33, 70))
        del shape.dim[:]
        shape.dim.extend([1] * n)
        return f"an input of {n} axes"
    if how == "dims_legacy" and m.input_shape:
        dims = [d for s in m.input_shape for d in s.dim]
        m.ClearField("input_shape")
        m.input_dim.extend(dims)
        if pick("bool"):
            m.input_dim.append(pick("choice", INT32_EDGES))
        return f"input_dim {list(m.input_dim)[:12]}"
    if how == "input_layer" and m.input:
        names = list(m.input)
        shapes = [list(s.dim) for s in m.input_shape] or [[1, 1, 1, 1]] * len(names)
        m.ClearField("input")
        m.ClearField("input_shape")
        m.ClearField("input_dim")
        made = layer("input", "Input", [], names, input_param={"shape": [{"dim": s} for s in shapes[:len(names)]]})
        m.layer.insert(0, made)
        return "inputs as an Input layer"
    if how == "no_shape":
        m.ClearField("input_shape")
        m.ClearField("input_dim")
        return "inputs without shapes"
    m.input.append(pick("choice", ("extra", *list(m.input), *_blob_names(m)[:3])))
    if pick("bool") and m.input_shape:
        m.input_shape.add().dim.extend([1, 2, 3])
    return f"an extra input {m.input[-1]!r}"


MUTATIONS = (push_number, push_dim, push_param_number, push_param_number, push_param_number, resize_repeated,
             repeat_layer, delete_layer, swap_layers, rewire, rewire, make_in_place, rename, change_type,
             drop_or_duplicate, set_weight_values, input_shape)
FORMS = ("model", "model", "model", "definition", "definition", "bare", "prototxt")


@dataclass
class Mutant:
    """A mutated net, how its files are written, and what was done to it."""

    seed: str
    net: pb.NetParameter
    form: str            # model: .caffemodel with weights; definition: .prototxt + that .caffemodel;
                         # bare: .caffemodel without weights; prototxt: the .prototxt alone
    steps: list = field(default_factory=list)
    check: bool = False  # export with check=True (onnx's full check, onnxruntime against blobtool's run)


def mutate_net(seed: NetSeed, pick, rounds: int) -> Mutant:
    m = pb.NetParameter()
    m.CopyFrom(seed.message)
    steps = []
    for _ in range(rounds):
        how = pick("choice", MUTATIONS)
        try:
            steps.append(f"{how.__name__}: {how(m, pick)}")
        except (ValueError, TypeError) as exc:  # a value protobuf refuses for that field: the step is void
            steps.append(f"{how.__name__}: void ({exc})")
    return Mutant(seed.name, m, pick("choice", FORMS), steps, check=pick("int", 0, 3) == 0 and _has_onnxruntime())


def _has_onnxruntime() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("onnx", "onnxruntime"))


def preload() -> None:
    """Import here what a case imports (onnx, onnxruntime), so that a forked case does not spend its time on it."""
    if _has_onnxruntime():
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401


# -- writing and checking a mutant ----------------------------------------------------------------------

def _binary(message: pb.NetParameter) -> bytes:
    data = message.SerializePartialToString()
    for key, raw in NON_UTF8.items():
        data = data.replace(key.encode(), raw)
    return data


def _text(message: pb.NetParameter) -> str:
    bare = pb.NetParameter()
    bare.CopyFrom(message)
    for each in bare.layer:
        del each.blobs[:]
    text = text_format.MessageToString(bare)
    for key, escaped in NON_UTF8_TEXT.items():
        text = text.replace(key, escaped)
    return text


def write_mutant(mutant: Mutant, folder: Path) -> tuple:
    """(the file `run`/`export` take, the definition file or None), written in `folder`."""
    folder = Path(folder)
    model, prototxt = folder / "net.caffemodel", folder / "deploy.prototxt"
    if mutant.form == "bare":
        bare = pb.NetParameter()
        bare.CopyFrom(mutant.net)
        for each in bare.layer:
            del each.blobs[:]
        model.write_bytes(_binary(bare))
        return model, None
    if mutant.form == "prototxt":
        prototxt.write_text(_text(mutant.net))
        return prototxt, None
    model.write_bytes(_binary(mutant.net))
    if mutant.form == "definition":
        prototxt.write_text(_text(mutant.net))
        return model, prototxt
    return model, None


@dataclass
class NetOutcome:
    """What one call did: refused (the message) or not, how long, the traced peak."""

    call: str
    error: str | None
    seconds: float
    peak: int


def _where(exc: BaseException) -> str:
    """The innermost blobtool frame of a traceback: file:line in function."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "blobtool" in f.filename.replace("\\", "/")
              and "/tests/" not in f.filename.replace("\\", "/")]
    if not frames:
        frames = traceback.extract_tb(exc.__traceback__)[-1:]
    if not frames:
        return "?"
    f = frames[-1]
    path = f.filename.replace("\\", "/")
    path = path[path.rfind("blobtool/"):] if "blobtool/" in path else os.path.basename(path)
    return f"{path}:{f.lineno} in {f.name}"


def _traced(call: str, fn, declared=None) -> NetOutcome:
    """Run fn under tracemalloc with warnings recorded; FuzzFailure for anything but a BlobToolError.

    `declared()`, called once fn succeeded, gives the bytes of the blobs the
    net it ran declares: a net that asks for much and was accepted may take
    that much memory (4 times over) and time (DECLARED_BYTES_PER_S) on top
    of the bounds.
    """
    own = not tracemalloc.is_tracing()
    if own:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        start = time.perf_counter()
        error = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:  # numpy's own error state (underflow ignored), as on the command line
                fn()
            except BlobToolError as exc:
                error = str(exc)
                if "\n" in error or not error.strip():
                    raise FuzzFailure(f"{call}: error message is not one non-empty line: {error[:300]!r}") from exc
            except FuzzFailure:
                raise
            except MemoryError as exc:
                raise FuzzFailure(f"{call}: MemoryError at {_where(exc)} (address space bound)") from exc
            except RecursionError as exc:
                raise FuzzFailure(f"{call}: RecursionError at {_where(exc)}") from exc
            except Exception as exc:  # noqa: BLE001 - what the fuzzer looks for
                raise FuzzFailure(f"{call}: {type(exc).__name__} at {_where(exc)}: {str(exc)[:300]}") from exc
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if own:
            tracemalloc.stop()
    extra = declared() if declared is not None and error is None else 0
    time_limit, memory_bound = TIME_LIMIT_S + extra / DECLARED_BYTES_PER_S, MEMORY_BOUND + 4 * extra
    for w in caught:
        if not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning)):
            path = w.filename.replace("\\", "/")
            path = path[path.rfind("blobtool/"):] if "blobtool/" in path else os.path.basename(path)
            raise FuzzFailure(f"{call}: {w.category.__name__} at {path}:{w.lineno}: {str(w.message)[:200]}")
    if seconds > time_limit:
        raise FuzzFailure(f"{call}: took {seconds:.2f} s (limit {time_limit:.3g} s)")
    if peak > memory_bound:
        raise FuzzFailure(f"{call}: allocated {peak / 2**20:.0f} MiB at peak (bound {memory_bound >> 20} MiB)")
    return NetOutcome(call, error, seconds, peak)


def _onnx_checked(path: Path) -> None:
    try:
        import onnx
    except ImportError:
        return
    size = path.stat().st_size
    if size > ONNX_BYTES_BOUND:
        raise FuzzFailure(f"export: wrote a {size >> 20} MiB model for a net of a few kilobytes")
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:  # noqa: BLE001 - onnx's checker raises its own classes
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FuzzFailure(f"export: exit 0 but onnx.checker refuses the model: {first[:300]}") from exc


def check_net_case(mutant: Mutant, folder: Path) -> list:
    """Write the mutant in `folder`, run and export it; the NetOutcomes, or FuzzFailure.

    Export is tried whether or not run failed (export computes constants
    and writes files of its own); a FuzzFailure names every call that
    failed, joined by " | ".
    """
    from blobtool import api

    src, definition = write_mutant(mutant, folder)
    definition = None if definition is None else str(definition)
    planned = _planned(str(src), definition)
    if planned is not None and planned[0] > BIG_NET_BYTES and planned[1] <= CAFFE_COUNT_MAX:
        # Legitimately big (every blob within Caffe's count bound): too slow for a fuzz case, and whether
        # it fits is the machine's business; a blob past the bound must be refused, so those still run.
        return [NetOutcome("skipped", f"declares {planned[0] >> 20} MiB of blobs", 0.0, 0)]
    outcomes, failures, ran = [], [], []
    try:
        outcomes.append(_traced("run", lambda: ran.append(api.run(str(src), definition=definition)),
                                lambda: declared_bytes(ran[0].program)))
    except FuzzFailure as exc:
        failures.append(str(exc))
    try:
        outcomes.append(_export(mutant, str(src), definition, Path(folder) / "net.onnx",
                                declared_bytes(ran[0].program) if ran else 0))
    except FuzzFailure as exc:
        failures.append(str(exc))
    if failures:
        raise FuzzFailure(" | ".join(failures))
    return outcomes


def _planned(src: str, definition):
    """(bytes of every blob, the largest blob's count) of the net as blobtool builds it, or None where it does not."""
    from blobtool.formats import open_document
    from blobtool.forward.deploy import deploy_net
    from blobtool.forward.runner import build

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with open_document(src) as doc:
                other = open_document(definition) if definition is not None else None
                try:
                    program = build(deploy_net(doc, other, {}), doc if doc.kind == "net" and doc.format != "prototxt"
                                    else None)
                finally:
                    if other is not None:
                        other.close()
    except Exception:  # noqa: BLE001 - refused or broken: the traced calls will say which
        return None
    shapes = list(program.inputs.values()) + [s for step in program.steps for s in step.top_shapes]
    counts = [math.prod(int(d) for d in shape) for shape in shapes]
    return 4 * sum(counts), max(counts, default=0)


def declared_bytes(program) -> int:
    """The float32 bytes of every blob a built net declares (each version of a blob written in place once)."""
    shapes = list(program.inputs.values()) + [s for step in program.steps for s in step.top_shapes]
    return 4 * sum(math.prod(int(d) for d in shape) for shape in shapes)


def _weights_not_finite(net) -> bool:
    """Whether any blob stored in the net holds a NaN or an infinity."""
    import math

    return any(not math.isfinite(v) for each in net.layer for blob in each.blobs
               for v in list(blob.data) + list(blob.double_data))


def _export(mutant: Mutant, src: str, definition, dest: Path, declared: int = 0) -> NetOutcome:
    from blobtool import api

    notes, verdicts = [], []

    def export():
        verdicts.append(api.export(src, str(dest), definition=definition, check=mutant.check, warn=notes.append)[1])

    call = "export --check" if mutant.check else "export"
    # Only a check runs the net (the declared blobs); an export alone writes the weights and constants.
    exported = _traced(call, export, (lambda: declared) if mutant.check else None)
    verdict = verdicts[0] if verdicts else None
    from blobtool.formats.caffe.containers import name_key

    # By the names the check reports: blobtool's keys (a name that is not UTF-8 as lone surrogates).
    writers = {name_key(NON_UTF8.get(top, top)): each.type for each in mutant.net.layer for top in each.top}
    # An ArgMax's index turns on the last bit of near-equal values, and a Reduction's sum of centred
    # values is rounding noise: the check's rule (1e-4 of the blob's largest value) cannot hold there.
    differing = [r for r in verdict.differing if writers.get(r["name"]) not in UNSTABLE_TYPES] \
        if verdict is not None else []
    if differing and _weights_not_finite(mutant.net):
        # ONNX leaves how Conv, Gemm or PRelu carry a NaN or Inf weight to the runtime (onnxruntime's
        # PRelu takes x where Caffe's max(x, 0) + a min(x, 0) makes inf * 0 a NaN): such a net may differ,
        # and then the check must say so and write nothing (checked below), which is all blobtool owes.
        differing = []
    if differing:
        rows = "; ".join(f"{r['name']!r} ({writers.get(r['name'], 'input')}) max difference {r['max_abs']:.3g} "
                         f"(largest value {r['scale']:.3g})" for r in differing[:3])
        raise FuzzFailure(f"{call}: onnxruntime differs from the blobtool run: {rows}")
    if exported.error is not None and dest.exists():
        raise FuzzFailure(f"{call}: refused ({exported.error[:200]}) but left {dest.name} behind")
    if verdict is not None and not verdict.passed:
        # A failed check (here only on an unstable blob) leaves no model: blobtool writes only what it proved.
        if dest.exists():
            raise FuzzFailure(f"{call}: the check failed but {dest.name} was written")
    elif exported.error is None:
        _onnx_checked(dest)
    return exported


# -- running a case apart -----------------------------------------------------------------------------------

def _address_space() -> int:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def isolated(fn, *, timeout: float = HARD_TIMEOUT_S, slack: int = ADDRESS_SPACE_SLACK):
    """fn() in a forked child under an address-space limit: its result, or FuzzFailure (its own, a hang, a death).

    Where fork is missing (not Linux or macOS) fn runs here, unbounded.
    """
    if not hasattr(os, "fork"):
        return fn()
    sys.stdout.flush()
    sys.stderr.flush()
    limit = _address_space() + slack
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 0
        try:
            os.close(reader)
            if limit > slack:
                resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            try:
                answer = ("ok", fn())
            except FuzzFailure as exc:
                answer = ("failure", str(exc))
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                answer = ("failure", f"{type(exc).__name__} at {_where(exc)}: {str(exc)[:300]}")
            try:
                data = pickle.dumps(answer)
            except Exception as exc:  # noqa: BLE001
                data = pickle.dumps(("failure", f"result not picklable: {exc}"))
            view = memoryview(data)
            while view:
                view = view[os.write(writer, view):]
        except BaseException:  # noqa: BLE001
            status = 1
        finally:
            os._exit(status)
    os.close(writer)
    chunks = []
    deadline = time.monotonic() + timeout
    killed = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                killed = True
                break
            ready, _, _ = select.select([reader], [], [], left)
            if ready:
                chunk = os.read(reader, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:
        os.close(reader)
        _, status = os.waitpid(pid, 0)
    if killed:
        raise FuzzFailure(f"still running after {timeout:.0f} s (killed)")
    if os.WIFSIGNALED(status):
        raise FuzzFailure(f"the case died of signal {signal.Signals(os.WTERMSIG(status)).name}")
    if not chunks:
        raise FuzzFailure(f"the case exited {os.WEXITSTATUS(status)} without an answer")
    kind, value = pickle.loads(b"".join(chunks))
    if kind == "failure":
        raise FuzzFailure(value)
    return value


def check_isolated(mutant: Mutant, *, timeout: float = HARD_TIMEOUT_S) -> list:
    """check_net_case in a forked child, in a temporary folder of its own."""
    with tempfile.TemporaryDirectory(prefix="netfuzz-") as folder:
        return isolated(lambda: check_net_case(mutant, Path(folder)), timeout=timeout)


# -- failures: their kind, a smaller reproducer, and its text ---------------------------------------------------

_NUMBERS = re.compile(r"-?\d+(\.\d+)?(e[-+]?\d+)?")


def failure_kind(message: str) -> str:
    """A failure's kind: the call, what broke and where, and the start of the message, numbers and names blurred."""
    message = re.sub(r"\S*netfuzz-[^/\s]*/", "", message)  # the case's temporary folder
    parts = message.split(": ", 3)
    kind = ": ".join(parts[:2] + [part[:60] for part in parts[2:3]])
    kind = re.sub(r"'[^']*'", "'…'", kind)
    kind = re.sub(r'"[^"]*"', '"…"', kind)
    return _NUMBERS.sub("N", kind)[:200]


def failure_kinds(message: str) -> list:
    """The kind of each failure a case reported (check_net_case joins them with " | ")."""
    return [failure_kind(part) for part in message.split(" | ")]


def minimize(mutant: Mutant, fails, *, budget_s: float = 60.0) -> Mutant:
    """A smaller mutant for which fails(mutant) still holds: layers, then parameters and weights taken away."""
    deadline = time.monotonic() + budget_s
    best = Mutant(mutant.seed, copy.deepcopy(mutant.net), mutant.form, list(mutant.steps), mutant.check)

    def attempt(change) -> bool:
        if time.monotonic() > deadline:
            return False
        trial = Mutant(best.seed, copy.deepcopy(best.net), best.form, best.steps, best.check)
        if change(trial.net) is False:
            return False
        if fails(trial):
            best.net = trial.net
            return True
        return False

    progress = True
    while progress and time.monotonic() < deadline:
        progress = False
        k = len(best.net.layer) - 1
        while k >= 0:
            def drop(m, k=k):
                del m.layer[k]
            progress |= attempt(drop)
            k = min(k - 1, len(best.net.layer) - 1)
        for k in range(len(best.net.layer)):
            for fd, _ in list(best.net.layer[k].ListFields()):
                if fd.name in ("name", "type", "bottom", "top"):
                    continue
                def clear(m, k=k, name=fd.name):
                    m.layer[k].ClearField(name)
                progress |= attempt(clear)
    if best.form in ("model", "definition") and not any(each.blobs for each in best.net.layer):
        trial = Mutant(best.seed, best.net, "prototxt", best.steps, best.check)
        if fails(trial):
            best.form = "prototxt"
    return best


def reproducer(mutant: Mutant, failure: str) -> str:
    """A Python snippet that writes the mutant's files as the fuzzer did and runs and exports them."""
    bare = pb.NetParameter()
    bare.CopyFrom(mutant.net)
    weights = {}
    for each in bare.layer:
        if each.blobs and mutant.form in ("model", "definition"):
            weights[each.name] = [(list(b.shape.dim), np.asarray(b.data, np.float32)) for b in each.blobs]
        del each.blobs[:]
    text = text_format.MessageToString(bare)
    used = {key: raw for key, raw in NON_UTF8.items() if key in text}
    how = f"form {mutant.form}{', export --check' if mutant.check else ''}"
    lines = [f"# {failure}", f"# seed {mutant.seed}, {how}; steps: {'; '.join(mutant.steps)}",
             "from pathlib import Path", "from google.protobuf import text_format",
             "from blobtool._pb import blobtool_caffe_pb2 as pb", "import blobtool",
             "nan, inf = float('nan'), float('inf')",
             f"TEXT = r\'\'\'{text}\'\'\'", "net = text_format.Parse(TEXT, pb.NetParameter())"]
    if weights:
        # float32's shortest text of each value reads back as the same float32 (nan and inf defined above).
        shown = ", ".join(f"{name!r}: [" + ", ".join(f"({dims!r}, [{', '.join(str(v) for v in values)}])"
                                                   for dims, values in blobs) + "]"
                          for name, blobs in weights.items())
        lines += [f"WEIGHTS = {{{shown}}}  # {{layer: [(shape, values)]}}",
                  "for each in net.layer:",
                  "    for dims, values in WEIGHTS.get(each.name, []):",
                  "        b = each.blobs.add(); b.shape.dim.extend(dims); b.data.extend(values)"]
    binary = "net.SerializeToString()" + "".join(f".replace({k.encode()!r}, {v!r})" for k, v in used.items())
    prototxt = "TEXT" + "".join(f".replace({k!r}, {NON_UTF8_TEXT[k]!r})" for k in used)
    if mutant.form == "prototxt":
        lines += [f"Path('deploy.prototxt').write_text({prototxt})", "src, definition = 'deploy.prototxt', None"]
    else:
        lines += [f"Path('net.caffemodel').write_bytes({binary})", "src, definition = 'net.caffemodel', None"]
        if mutant.form == "definition":
            lines += [f"Path('deploy.prototxt').write_text({prototxt})", "definition = 'deploy.prototxt'"]
    lines += ["blobtool.run(src, definition=definition)",
              f"blobtool.export(src, 'net.onnx', definition=definition{', check=True' if mutant.check else ''})"]
    return "\n".join(lines) + "\n"


def mutants(seed: int, count: int, *, pool=None) -> list:
    """`count` mutants drawn from random.Random(seed): the same ones on every machine and run."""
    import random

    from fuzzcases import random_picker

    rng = random.Random(seed)
    pick = random_picker(rng)
    pool = pool if pool is not None else seed_nets()
    return [mutate_net(rng.choice(pool), pick, rng.randint(1, 3)) for _ in range(count)]
