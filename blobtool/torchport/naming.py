"""Naming schemes: blobtool's own names ("conv1/0") and PyTorch's ("conv1.weight"), by layer type.

``--names torch`` renames a net's blobs as a PyTorch port of the same net
names its parameters, from the layer types in the .caffemodel:

=============================  ===========================================================
Caffe layer type               blobs under PyTorch names
=============================  ===========================================================
Convolution, Deconvolution,    0 -> ``<layer>.weight``, 1 -> ``<layer>.bias`` (1-D); an
InnerProduct, Embed            InnerProduct weight in the legacy 4-D layout (1, 1, N, K)
                               becomes (N, K); one stored (K, N) by
                               ``inner_product_param { transpose: true }`` is transposed
                               to Linear's (out, in) = (N, K)
BatchNorm                      0 -> ``<layer>.running_mean`` = blob 0 / s, 1 ->
                               ``<layer>.running_var`` = blob 1 / s, s = blob 2's value
                               (the moving-average factor; 0 when s is 0, as Caffe's
                               BatchNormLayer does), computed in float64 and stored in the
                               blob's dtype; blob 2 is not written, and neither is
                               ``num_batches_tracked`` (PyTorch fills it in). NVIDIA
                               Caffe's BatchNorm (``scale_bias: true``) holds two more:
                               3 -> ``<layer>.weight``, 4 -> ``<layer>.bias`` (1-D)
Scale                          0 -> ``<layer>.weight``, 1 -> ``<layer>.bias``; a Scale
                               whose bottom is the top of a BatchNorm (the last layer to
                               write that blob) is folded into it: ``<bn>.weight``,
                               ``<bn>.bias``, so the pair loads into one BatchNorm2d
                               (unless fold is off: ``--no-fold``), when the Scale is
                               the only reader of that output, scales per channel
                               (axis 1, one axis) as many channels as the BatchNorm
                               has, and the BatchNorm holds no scale of its own;
                               otherwise it keeps its own name and a warning says why.
                               A Scale with two bottoms (its scale is the second) holds
                               only its bias: 0 -> ``<layer>.bias``
PReLU                          0 -> ``<layer>.weight`` (1-D: a shared slope,
                               ``channel_shared: true``, stored with no axes, is (1,), as
                               PReLU(num_parameters=1) holds it)
any other                      ``<layer>.<index>``, and a warning listing those layers
=============================  ===========================================================

Layer settings that do not change what a blob holds are not read: a
Convolution's or InnerProduct's ``axis`` chooses the input's axes, not the
weight's layout; Embed's weight (input_dim, num_output) is nn.Embedding's.

V1 nets carry enum types (formats/caffe/containers.py turns them into today's type
strings); V0 layers carry the lower-case strings of Caffe's first format
("conv", "innerproduct"), which net/model.py's type_name turns into today's. Files
without layer types (a solverstate, a blob, .npy/.npz, safetensors) cannot be
renamed: UsageError (exit 2). Caffe's HDF5 snapshots of a net hold layer
names and no types: they are renamed with the types (and the bottoms, tops
and settings the rules read) of a net given beside them (``net``: the
matching .caffemodel, or any net whose layers carry types), its layers
matched by name. Every layer of the snapshot that holds blobs must be in
that net, and where the net holds blobs of its own for the layer, each of
the snapshot's must be there with as many values (a .caffemodel may keep
the legacy 4-D shape of the same blob); otherwise UsageError (exit 2): it is
not the snapshot's net.

PyTorch's state_dict holds no gradients, so diffs are not carried over.
Renamed blobs share the Caffe blob's memory (no copy), but for the
BatchNorm statistics, which are computed.

This module imports nothing heavy at import time (the command line builds
its options from SCHEMES).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..engine.blob import Blob
from ..errors import FormatError, UsageError, parameter
from ..formats import NAMING_SCHEMES, Document, Entry, select
from ..formats.caffe import layer_param_varints
from ..formats.caffe.schema import param_field
from ..formats.caffe.wire import signed as _signed
from ..formats.origin import Origin
from ..net.batchnorm import CAFFE_BLOBS, NVCAFFE_BLOBS, caffe_factor, statistic
from ..net.graph import NOT_PER_CHANNEL, OTHER_READERS, OWN_SCALE, SECOND_BOTTOM, scale_merge
from ..net.layertypes import foldable, matrix_shape, row as type_row
from ..net.model import model, type_name

__all__ = ["SCHEMES", "Mapped", "TorchNames", "torch_names", "torch_pair", "renamed_selection", "typed_by",
           "has_layer_types", "TORCH_ONLY_BUFFERS"]

# The --names choices: blobtool's own names, or PyTorch's.
SCHEMES = NAMING_SCHEMES


_PARAMS = ("weight", "bias")
# Buffers a PyTorch BatchNorm module saves that Caffe has no blob for.
TORCH_ONLY_BUFFERS = ("num_batches_tracked",)
# Layers named in the warning about types without a rule, at most.
_WARN_LAYERS = 8


@dataclass
class Mapped:
    """One Caffe blob and what a naming scheme makes of it.

    `name` is None for a blob that is not written under a name of its own
    (BatchNorm's factor, divided into the statistics); `done` says what was
    done ("renamed", "reshaped ...", "divided by ...", "folded into ...").
    """

    entry: Entry
    name: str | None
    shape: tuple | None
    done: str
    module: str | None = None   # the PyTorch module the name belongs to
    # What was done, as one word (the summary's kinds): "renamed" (reshaped
    # too), "transposed", "folded", "divided" (by BatchNorm's factor),
    # "kept" (<layer>.<index>: no rule), "not written".
    kind: str = "renamed"
    type: str | None = None     # the layer's type, where it comes from another file (a --definition) than the blob
    # How the Caffe blob became the named tensor, for the way back (surgery/into.py):
    # "view" (the same values, maybe reshaped), "transposed" (an InnerProduct
    # stored (K, N)), "statistic" (a BatchNorm sum divided by the factor), or
    # "factor" (the BatchNorm factor itself, written under no name).
    made: str = "view"


@dataclass
class TorchNames:
    """The result of torch_names: the renamed document, a row per Caffe blob, the warnings to print."""

    document: Document
    rows: list
    warnings: list = field(default_factory=list)
    batchnorms: tuple = ()      # the BatchNorm modules (for their PyTorch-only buffers)

    @property
    def dropped_diffs(self) -> int:
        """How many of the selected Caffe blobs had a diff, which PyTorch names do not carry."""
        return sum(1 for row in self.rows if row.entry.has_diff)


def has_layer_types(doc: Document) -> bool:
    """Whether `doc` carries the layer types --names torch renames by (a net whose layers have types)."""
    return doc.kind == "net" and any(layer.type for layer in doc.layers)


# How an error names the renaming it comes from: the library's names='torch', the command's --names torch.
_TORCH = parameter('names', given='torch')


def _refuse(doc: Document) -> UsageError:
    if doc.kind == "net" and doc.format == "hdf5":
        return UsageError(f"{doc.path}: {_TORCH} renames a .caffemodel's blobs by layer type, and Caffe's "
                          "HDF5 snapshots carry no layer types (only names); give the net they come from "
                          f"(the matching .caffemodel, the same layer names) with {parameter('net', True)}FILE")
    what = f"a {doc.kind} file" if doc.kind != "net" else "a net without layer types (not a .caffemodel)"
    return UsageError(f"{doc.path}: {_TORCH} renames a .caffemodel's blobs by layer type; {what} has none")


def typed_by(doc: Document, net: Document | None) -> Document:
    """The document whose layers give `doc`'s blobs their types: `doc` itself when it has types, else `net`.

    `net` serves a net without layer types (Caffe's HDF5 snapshot): its
    layers are matched to `doc`'s by name (see the module doc). UsageError
    when neither carries types, or `net` is not `doc`'s net.
    """
    if has_layer_types(doc):
        return doc
    if net is None or doc.kind != "net":
        raise _refuse(doc)
    if not has_layer_types(net):
        what = f"a {net.kind} file" if net.kind != "net" else "a net without layer types"
        raise UsageError(f"{net.path}: {parameter('net')} gives the layer types of {doc.path}'s layers; {what} has "
                         "none: give the matching .caffemodel")
    held: dict = {}
    for e in doc.entries:
        held.setdefault(e.layer, []).append(e)
    theirs: dict = {}
    for e in net.entries:
        theirs.setdefault(e.layer, []).append(e)
    names = {layer.name for layer in net.layers}
    missing = [name for name in held if name not in names]
    if missing:
        raise UsageError(f"{doc.path}: layer{'s' * (len(missing) > 1)} {_some(missing)} of this file "
                         f"{'are' if len(missing) > 1 else 'is'} not in the net {net.path} ({parameter('net')}): "
                         "it is not this file's net")
    for name, entries in held.items():
        other = theirs.get(name, [])
        for e in entries:
            # Blob k of a layer is "<layer>/k" in both (a snapshot leaves out a shared parameter's dataset).
            index = e.name.rpartition("/")[2]
            match = next((o for o in other if o.name.rpartition("/")[2] == index), None)
            if other and (match is None or match.count != e.count):
                found = f"shape {_fmt(match.shape)}" if match is not None else "no such blob"
                raise UsageError(f"{doc.path}: blob {e.name} has shape {_fmt(e.shape)}, the net {net.path} "
                                 f"({parameter('net')}) {found}: it is not this file's net")
    return net


def torch_names(doc: Document, entries: list | None = None, *, fold: bool = True,
                net: Document | None = None) -> TorchNames:
    """PyTorch names for the `entries` of a net (default: all), by the rules in this module's docstring.

    Returns the renamed Document (naming "torch"; its entries in file order,
    each blob made on first use), a Mapped row per selected Caffe blob, and
    the warnings (layer types without a rule, values made infinite).
    `net`: the net whose layers give the types where `doc` has none
    (typed_by). Raises UsageError for a file without layer types (and no
    matching `net`), FormatError for a BatchNorm without its three blobs (or
    NVIDIA Caffe's five).
    """
    types = typed_by(doc, net)
    chosen = {id(e) for e in (doc.entries if entries is None else entries)}
    groups: dict = {}
    for e in doc.entries:
        groups.setdefault(e.layer, []).append(e)
    folded, apart = _fold_targets(types, groups) if fold else ({}, {})
    rows, warnings, unruled, batchnorms = [], [], {}, []
    for layer in types.layers:
        blobs = groups.get(layer.name, [])
        kind = type_name(layer.type)
        if kind == "BatchNorm":
            batchnorms.append(layer.name)
        if not any(id(e) in chosen for e in blobs):
            continue
        for row in _map_layer(doc, types, layer, kind, blobs, folded.get(layer.name), apart.get(layer.name),
                              warnings):
            if id(row.mapped.entry) not in chosen:
                continue
            if types is not doc:  # the snapshot's blobs have no type: the net's layer gives it
                row.mapped.type = layer.type
                if row.out is not None:
                    row.out.type = layer.type
            rows.append(row)
            if row.unruled and layer.name not in unruled.setdefault(kind or "(no type)", []):
                unruled[kind or "(no type)"].append(layer.name)
    if unruled:
        listed = "; ".join(f"{kind}: {_some(names)}" for kind, names in unruled.items())
        warnings.insert(0, f"{doc.path}: --names torch has no rule for these layers, whose blobs are named "
                           f"<layer>.<index>: {listed}")
    shown = [f"{scale} ({why})" for scale, (_, why) in apart.items()
             if any(id(e) in chosen for e in groups.get(scale, []))]
    if shown:
        warnings.append(f"{doc.path}: --names torch did not fold these Scale layers into the BatchNorm before "
                        f"them; each keeps its own name: {_some(shown)}")
    _check_unique(doc, [row.mapped for row in rows])
    out = Document(doc.path, doc.kind, doc.source, entries=[row.out for row in rows if row.out is not None],
                   meta=doc.meta, format=doc.format, layers=types.layers, naming="torch")
    return TorchNames(out, [row.mapped for row in rows], warnings, tuple(batchnorms))


def _some(names: list) -> str:
    shown = ", ".join(names[:_WARN_LAYERS])
    return shown + (f" and {len(names) - _WARN_LAYERS} more" if len(names) > _WARN_LAYERS else "")


def _check_unique(doc: Document, rows: list) -> None:
    seen = {}
    for row in rows:
        if row.name is None:
            continue
        if row.name in seen:
            raise UsageError(f"{doc.path}: {_TORCH} names two blobs {row.name!r} "
                             f"({seen[row.name]} and {row.entry.name})")
        seen[row.name] = row.entry.name


def _fold_targets(doc: Document, groups: dict) -> tuple[dict, dict]:  # doc: the one holding the layers
    """({Scale layer: BatchNorm layer} to fold, {Scale layer: (BatchNorm layer, why not)}).

    A Scale is folded into the BatchNorm that last wrote its bottom when it
    is the only layer to read that output: in an in-place chain
    (Convolution, BatchNorm, Scale, ReLU all writing "conv1") a layer that
    reads "conv1" after the Scale reads the Scale's output, but one that
    reads it between the BatchNorm and the Scale, or reads a BatchNorm top
    the Scale does not overwrite, sees the BatchNorm's output, which must
    stay without gamma and beta. It must also scale per channel (axis 1,
    one axis), as many channels as the BatchNorm's, and the BatchNorm must
    hold no scale of its own (NVIDIA Caffe's five blobs).
    """
    net = model(doc).view(None)  # every layer as stored
    layers = [layer.stored for layer in net.layers]
    candidates = []       # (Scale layer, its bottoms, BatchNorm layer, the version the Scale reads)
    for number, layer in enumerate(net.layers):
        if layer.type == "Scale" and layer.bottoms and groups.get(layer.name):
            held = net.writer(number)
            if held is not None and net.types[held[0]] == "BatchNorm":
                candidates.append((layers[number], layer.bottoms, layers[held[0]], held))
    targets, apart = {}, {}
    for scale, bottoms, bn, version in candidates:
        others = [layers[r].name for r in net.readers.get(version, []) if layers[r].name != scale.name]
        why = _why_not_fold(doc, scale, bottoms, bn, others, groups, layer_param_varints)
        if why is None:
            targets[scale.name] = bn.name
        else:
            apart[scale.name] = (bn.name, why)
    return targets, apart


def _why_not_fold(doc, scale, bottoms, bn, others: list, groups: dict, param_varints) -> str | None:
    """Why a Scale after BatchNorm `bn` cannot become that BatchNorm's weight and bias, or None (net/graph.py's rule)."""
    bn_blobs = groups.get(bn.name, [])
    settings = param_varints(doc, scale, "scale_param")
    axis = _signed(settings.get(param_field("scale_param", "axis"), 1))
    num_axes = _signed(settings.get(param_field("scale_param", "num_axes"), 1))
    counts = [e.count for e in groups[scale.name]]
    channels = bn_blobs[0].count if bn_blobs else None
    why = scale_merge(others=others, bottoms=len(bottoms), batchnorm_blobs=len(bn_blobs), axis=axis,
                      num_axes=num_axes, counts=counts, channels=channels)
    if why is None:
        return None
    reason, detail = why
    if reason == OTHER_READERS:
        return f"{_some(detail)} also read{'s' if len(detail) == 1 else ''} {bn.name}'s output"
    if reason == SECOND_BOTTOM:
        return "its scale is its second bottom, not a blob"
    if reason == OWN_SCALE:
        return f"{bn.name} holds its own scale and bias (NVIDIA Caffe's BatchNorm)"
    if reason == NOT_PER_CHANNEL:
        return f"scale_param axis {axis}, num_axes {num_axes}: not one value per channel"
    return f"it holds {next(c for c in detail if c != channels)} values, {bn.name} {channels} channels"


@dataclass
class _Row:
    mapped: Mapped
    out: Entry | None        # the blob under its new name, or None when it is not written
    unruled: bool = False    # named <layer>.<index>: no rule for it


def _map_layer(doc: Document, types: Document, layer, kind: str, blobs: list, fold_into: str | None, apart,
               warnings: list) -> list:
    """The rows of one layer's blobs (in blob order); `types` is the document holding `layer` (typed_by)."""
    name = layer.name
    if kind == "BatchNorm":
        return _batchnorm(doc, name, blobs, warnings)
    rows = []
    bias_only = kind == "Scale" and _bottom_count(types, layer) > 1
    rule = type_row(kind)
    # A type whose blobs 0 and 1 are a weight and a bias, and a PyTorch module's (Conv2d, Linear, ...).
    weight_bias = rule is not None and rule.torch is not None and rule.blobs == _PARAMS
    # A type of a PyTorch module whose blobs hold one value per channel each (PReLU's slopes).
    per_channel = rule is not None and rule.torch is not None and not weight_bias
    how = rule.folds if rule is not None else None  # where its weight's channels lie (net/layertypes.py)
    for index, entry in enumerate(blobs):
        if weight_bias and index < 2:
            if index == 0 and how is not None and how.transpose and _transposed(types, layer, rule.param):
                rows.append(_transposed_weight(doc, entry, name, kind))
                continue
            shape = _weight_shape(kind, entry.shape) if index == 0 else (entry.count,)
            rows.append(_view(entry, f"{name}.{rule.torch_names[index]}", shape, name))
        elif kind == "Scale" and bias_only and index == 0:
            row = _view(entry, f"{name}.{rule.torch_names[1]}", (entry.count,), name)
            row.mapped.done += "; the Scale's scale is its second bottom: blob 0 is its bias"
            rows.append(row)
        elif kind == "Scale" and index < 2 and not bias_only:
            module = fold_into or name
            shape = (entry.count,) if fold_into or index == 1 else entry.shape
            row = _view(entry, f"{module}.{rule.torch_names[index]}", shape, module)
            if fold_into:
                row.mapped.done = f"folded into {fold_into}" + _reshaped(entry.shape, shape, "; ")
                row.mapped.kind = "folded"
            elif apart is not None:
                row.mapped.done += f"; not folded into {apart[0]}: {apart[1]}"
            rows.append(row)
        elif per_channel and index < len(rule.torch_names):
            row = _view(entry, f"{name}.{rule.torch_names[index]}", (entry.count,), name)
            if entry.shape == () and entry.count == 1:
                row.mapped.done += f" (a {rule.blobs[index]} shared by all channels: {rule.torch}(num_parameters=1))"
            rows.append(row)
        else:
            row = _view(entry, f"{name}.{index}", entry.shape, name,
                        done=f"kept (no rule for {kind or 'no type'})")
            row.unruled = True
            row.mapped.kind = "kept"
            rows.append(row)
    return rows


def _bottom_count(doc: Document, layer) -> int:
    return len(model(doc).by_name[layer.name].bottoms)


def _transposed(doc: Document, layer, param: str) -> bool:
    """Whether a matrix layer (an InnerProduct) stores its weight (K, N): its `param`.transpose is true."""
    return bool(layer_param_varints(doc, layer, param).get(param_field(param, "transpose"), 0))


def _transposed_weight(doc: Document, entry: Entry, layer: str, kind: str) -> _Row:
    """A matrix weight stored (K, N) (transpose: true), as Linear's (N, K): a transposed copy, made on first use."""
    stored = _weight_shape(kind, entry.shape)
    if len(stored) != 2:
        raise FormatError(f"{kind} layer {layer!r} has {type_row(kind).param}.transpose true and a weight of "
                          f"shape {entry.shape}; Caffe's is (K, N), 2 axes", path=doc.path)
    shape = (stored[1], stored[0])

    def make():
        src = entry.blob()
        blob = Blob(shape, dtype=src.dtype)
        blob.set_cpu_data(np.ascontiguousarray(src.cpu_data().reshape(stored).T))
        blob.origin = _origin(src)
        return blob

    name = f"{layer}.weight"
    renamed = Entry(name, shape, "shape", entry.dtype, False, layer=entry.layer, type=entry.type, build=make)
    done = (_reshaped(entry.shape, stored, "", "; ") + f"transposed {_fmt(stored)} -> {_fmt(shape)}: "
            f"{type_row(kind).param}.transpose is true, {type_row(kind).torch}'s weight is (out, in)")
    return _Row(Mapped(entry, name, shape, done, layer, kind="transposed", made="transposed"), renamed)


def _weight_shape(kind: str, shape: tuple) -> tuple:
    """A weight's shape as its module takes it: a matrix layer's legacy (1, 1, N, K), written before the shape field, as (N, K)."""
    how = foldable(kind)
    if how is not None and how.channels == "matrix":
        return matrix_shape(shape) or shape
    return shape


def _fmt(shape: tuple) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _reshaped(before: tuple, after: tuple, lead: str = "", tail: str = "") -> str:
    if tuple(before) == tuple(after):
        return ""
    return f"{lead}reshaped {_fmt(before)} -> {_fmt(after)}{tail}"


def _origin(src):
    stored = src.origin.dtype if src.origin is not None else src.dtype
    return Origin("shape", stored, False)


def _view(entry: Entry, name: str, shape: tuple, module: str, done: str | None = None) -> _Row:
    """A row whose blob shares the Caffe blob's data under a new name and shape."""
    def make():
        src = entry.blob()
        blob = Blob(shape, dtype=src.dtype)
        blob.share_data(src)
        blob.origin = _origin(src)
        return blob

    # Its Blob is made on first use: a view of the Caffe blob, or computed.
    renamed = Entry(name, tuple(shape), "shape", entry.dtype, False, layer=entry.layer, type=entry.type, build=make)
    return _Row(Mapped(entry, name, tuple(shape), done or _reshaped(entry.shape, shape) or "renamed", module),
                renamed)


def _batchnorm(doc: Document, layer: str, blobs: list, warnings: list) -> list:
    """BatchNorm: the running mean and variance from Caffe's sums and factor, in float64."""
    channels = blobs[0].count if blobs else 0
    if len(blobs) not in (CAFFE_BLOBS, NVCAFFE_BLOBS) or blobs[2].count != 1 or \
            any(e.count != channels for e in blobs[3:]):
        raise FormatError(f"BatchNorm layer {layer!r} holds {len(blobs)} blobs "
                          f"({', '.join(str(e.shape) for e in blobs)}); Caffe's BatchNorm holds {CAFFE_BLOBS}: the "
                          f"sums of the mean and variance, and a factor of shape (1,); NVIDIA Caffe's holds "
                          f"{NVCAFFE_BLOBS}: those, then its scale and bias, one value per channel", path=doc.path)
    factor = float(blobs[2].blob().cpu_data().reshape(-1)[0].astype(np.float64))
    caffe = caffe_factor(factor)
    names = type_row("BatchNorm").torch_names
    if factor == 0:
        done = f"set to 0: the factor ({blobs[2].name}) is 0, as Caffe then does"
    else:
        done = f"divided by the factor {factor:.9g} ({blobs[2].name}) in float64"
    rows = []
    for index in (0, 1):
        entry = blobs[index]
        src = entry.blob()
        values = src.cpu_data().astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            stored = statistic(values, caffe).astype(src.dtype)  # Caffe's: the sums times 1 / s
        made = int(np.count_nonzero(np.isfinite(values) & ~np.isfinite(stored)))
        name = f"{layer}.{names[index]}"
        if made:
            warnings.append(f"{doc.path}: {name}: {made} values became Inf or NaN dividing {entry.name} "
                            f"by the BatchNorm factor {factor:.9g}")
        blob = Blob((entry.count,), dtype=src.dtype)
        blob.set_cpu_data(stored)
        blob.origin = _origin(src)
        shape = (entry.count,)
        renamed = Entry(name, shape, "shape", entry.dtype, False, layer=entry.layer, type=entry.type, _blob=blob)
        rows.append(_Row(Mapped(entry, name, shape, done + _reshaped(entry.shape, shape, "; "), layer,
                                kind="divided", made="statistic"), renamed))
    rows.append(_Row(Mapped(blobs[2], None, None, "not written: the factor of running_mean and running_var",
                            layer, kind="not written", made="factor"), None))
    for index, entry in enumerate(blobs[3:5]):
        # NVIDIA Caffe's BatchNorm with scale_bias: its own affine weight and bias.
        row = _view(entry, f"{layer}.{names[3 + index]}", (entry.count,), layer)
        row.mapped.done += f" (NVIDIA Caffe's BatchNorm {'scale' if index == 0 else 'bias'})"
        rows.append(row)
    return rows


def renamed_selection(doc: Document, patterns, rename, **options) -> tuple:
    """(the TorchNames result, its entries that `patterns` select): by Caffe's names first, else by PyTorch's.

    `patterns` name blobs as the file does (conv1/0, bn1) or, where none of
    them does, as PyTorch names them (bn1.running_var, conv1.*): then every
    blob is renamed and the renamed ones are selected. A pattern that selects
    nothing either way is the FormatError of Caffe's names.
    """
    try:
        result = rename(doc, select(doc, patterns), **options)
        return result, list(result.document.entries)
    except FormatError as caffe_miss:
        if not patterns:
            raise
        result = rename(doc, select(doc, ()), **options)
        try:
            return result, select(result.document, patterns)
        except FormatError:
            raise caffe_miss from None


def torch_pair(doc_a: Document, doc_b: Document, patterns, *, fold: bool = True, net: Document | None = None,
               prefixes=None, rename=None) -> tuple:
    """compare --names torch: ((doc, entries) for a, (doc, entries) for b, warnings).

    Each side that is a net is renamed (its selection by `patterns`, in
    Caffe's names; a net without layer types by the types of `net`) by
    `rename(doc, entries, fold=fold, net=net)` (default torch_names; one
    giving a TorchNames as it does: metadata.named); then b's names are
    matched to a's (prefixes.py: `prefixes` as asked, else a prefix found
    that makes them match, said in the warnings); the side that is not a
    net is taken as it is, limited with patterns to the names the net's
    selection maps to, and without the buffers PyTorch adds to a BatchNorm
    module (``num_batches_tracked``), which Caffe has no blob for. Raises
    UsageError when neither side is a net that can be renamed.
    """
    from .prefixes import match_documents

    rename = rename or torch_names

    def renames(doc):
        return has_layer_types(doc) or (net is not None and doc.kind == "net")

    if not (renames(doc_a) or renames(doc_b)):
        raise _refuse(doc_a)
    mapped, chosen = {}, {}
    warnings = []
    for doc in (doc_a, doc_b):
        if renames(doc):
            result, chosen[id(doc)] = renamed_selection(doc, patterns, rename, fold=fold, net=net)
            mapped[id(doc)] = result
            warnings += result.warnings
    sides = [mapped[id(d)].document if id(d) in mapped else d for d in (doc_a, doc_b)]
    sides[1], change, note = match_documents(sides[0], sides[1], prefixes)
    if note:
        warnings.append(note)
    nets = [(i, mapped[id(d)]) for i, d in enumerate((doc_a, doc_b)) if id(d) in mapped]
    # The selected names of each renamed side, as its document now names them (b's after the prefix change).
    picked = {i: {change.apply(e.name) if i == 1 and change is not None else e.name for e in chosen[id(d)]}
              for i, d in enumerate((doc_a, doc_b)) if id(d) in mapped}
    names = set().union(*picked.values())
    extras = set()
    for i, result in nets:
        for bn in result.batchnorms:
            for buf in TORCH_ONLY_BUFFERS:
                name = f"{bn}.{buf}"
                extras.add(change.apply(name) if i == 1 and change is not None else name)
    out = []
    for i, doc in enumerate((doc_a, doc_b)):
        if id(doc) in mapped:
            out.append((sides[i], [e for e in sides[i].entries if e.name in picked[i]]))
            continue
        entries = [e for e in sides[i].entries if e.name not in extras]
        if patterns:
            entries = [e for e in entries if e.name in names]
        out.append((sides[i], entries))
    return out[0], out[1], warnings

