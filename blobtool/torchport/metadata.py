"""What a PyTorch state dict cannot carry: layer settings, where each tensor came from, Python identifiers.

``--names torch`` (torchport/naming.py) gives the tensors; a port also needs
settings that live in no blob, and a user wants to see what was done. This
module adds, for the same selection:

Settings (``settings``): ``{"<module>.<setting>": text}``, ``<module>`` being
the prefix of that module's tensor names (what ``named_modules`` calls it;
a Pooling layer, which holds no tensors, by its layer name), in the net's
layer order, for the layers whose tensors are written, and for every
Pooling layer when the whole net is (no selection). A setting is named as
PyTorch's module takes it where it has the argument, else as Caffe names it:

===============  ================================  ============================================
Caffe layer      settings                          value (text)
===============  ================================  ============================================
BatchNorm        ``eps``                           batch_norm_param.eps (field 3, a float;
                                                   Caffe's default 1e-05), always: the shortest
                                                   decimal that reads back as the same float32
                                                   ("0.001", "1e-05"); PyTorch's BatchNorm
                                                   default is 1e-05, and a port must pass any
                                                   other
InnerProduct     ``axis``                          inner_product_param.axis (field 5) where it
                                                   is not 1: the input is flattened from that
                                                   axis, not from axis 1
PReLU            ``channel_shared``                prelu_param.channel_shared: "true" or
                                                   "false", always (Caffe's default is a slope
                                                   per channel, PyTorch's PReLU() one slope)
Convolution,     ``kernel_size``, ``stride``,      convolution_param by Caffe's rules (the
Deconvolution    ``padding``, ``dilation``,        _h/_w pair when given, else one value for
                 ``groups``                        every spatial axis or one per axis; the
                                                   kernel from the weight's shape when none is
                                                   given), always; an int when every axis has
                                                   the same value, else a tuple ("(1, 5)")
Pooling          ``pool`` (max, ave, stochastic),  pooling_param, always; ``ceil_mode`` "true"
                 ``kernel_size`` or                unless round_mode is FLOOR: Caffe rounds a
                 ``global_pooling``, ``stride``,   pooled size up, PyTorch's default down; a
                 ``padding``, ``ceil_mode``        pooling's stride defaults to 1 in Caffe, to
                                                   the kernel in PyTorch
===============  ================================  ============================================

Convolution and Pooling settings come from the net's full definition
(formats/caffe/netdef.py: V1 layers upgraded); a V0 net's are not carried.

The mapping (MAPPING_KEY): one JSON text, ``{"format": 1, "tensors":
{"<tensor>": ["<Caffe layer>", <blob index>, "<done>"], ...}}`` in the
tensors' order, ``<done>`` one of DONE_KINDS: "renamed" (reshaped ones
too), "transposed" (an InnerProduct with transpose: true), "folded" (a
Scale's gamma or beta as its BatchNorm's weight or bias), "divided" (a
BatchNorm statistic divided by the layer's factor, blob 2, which is not
written), "kept" (a layer type without a rule: ``<layer>.<index>``).
With ``--names torch-identifiers`` it also holds ``"modules": {"<identifier>":
"<Caffe name>"}`` for every module name that changed. Its size is bounded
by what is written: at most MAX_BLOBS rows, each name at most MAX_NAME
characters (a ResNet-50 takes about 60 bytes a tensor).

Identifiers (``--names torch-identifiers``): each module name (every layer
holding blobs, in file order, so a selection never changes them) becomes a
Python identifier a user can type: each character other than ASCII letters,
digits and ``_`` becomes ``_`` (an empty name ``_``); a leading digit gets a
``_`` before it; a keyword (``in``, ``lambda``) gets a ``_`` after it. A
name that already is an identifier keeps it; one that was changed and meets
a name already given gets ``_2``, ``_3``, ... (the first free), and a
warning lists those. Tensor names are then ``<identifier>.<parameter>``.
"""

from __future__ import annotations

import json
import keyword
import re
from dataclasses import dataclass, field, replace

import numpy as np

from ..formats.caffe import layer_param_values
from ..formats.caffe.schema import param_field
from ..formats.caffe.wire import signed as _signed
from ..net.layertypes import row as type_row
from ..net.model import type_name
from .naming import TorchNames, torch_names, typed_by

__all__ = ["TorchExport", "named", "python_identifiers", "eps_warnings", "kind_counts", "read_export",
           "MAPPING_KEY", "DONE_KINDS", "TORCH_EPS", "settings_groups"]

# The __metadata__ key of the mapping (blobtool's own keys hold no ".";
# settings keys always do).
MAPPING_KEY = "mapping"
MAPPING_FORMAT = 1
# What the mapping says was done to a tensor, in the order the summary lists them.
DONE_KINDS = ("renamed", "transposed", "folded", "divided", "kept")
# PyTorch's BatchNorm eps when none is given (and Caffe's batch_norm_param default).
TORCH_EPS = 1e-5
# Modules named in a warning line, at most (the rest counted).
_SHOWN = 8
# Characters a Python identifier may hold, as blobtool makes them (ASCII).
_NOT_IDENTIFIER = re.compile(r"[^A-Za-z0-9_]")


@dataclass
class TorchExport(TorchNames):
    """TorchNames and what the tensors cannot carry: the settings, the identifier renames, the scheme."""

    settings: dict = field(default_factory=dict)   # {"<module>.<setting>": text}
    modules: dict = field(default_factory=dict)    # {identifier: Caffe name}, changed ones only
    scheme: str = "torch"


def named(doc, entries=None, *, fold: bool = True, scheme: str = "torch", net=None) -> TorchExport:
    """--names torch or torch-identifiers for the `entries` of a net (default: all), with settings and mapping.

    The renamed Document carries the metadata a safetensors export writes
    (Document.export_metadata: the settings and MAPPING_KEY). `net` gives
    the layers of a net without types (naming.typed_by). Raises as
    torch_names does.
    """
    result = torch_names(doc, entries, fold=fold, net=net)
    types = typed_by(doc, net)
    whole = entries is None or len(entries) == len(doc.entries)
    final, modules, warnings = {}, {}, list(result.warnings)
    if scheme == "torch-identifiers":
        held = {e.layer for e in doc.entries}
        final, numbered = python_identifiers([layer.name for layer in types.layers
                                              if layer.name in held or type_name(layer.type) in _NO_TENSORS])
        if numbered:
            listed = ", ".join(f"{name} -> {ident}" for name, ident in numbered[:_SHOWN])
            more = f" and {len(numbered) - _SHOWN} more" if len(numbered) > _SHOWN else ""
            warnings.append(f"{doc.path}: --names torch-identifiers: these module names became an identifier "
                            f"already given, and were numbered: {listed}{more}")
    rows, entries_out, out = [], [], iter(result.document.entries)
    for row in result.rows:
        if row.name is None:
            rows.append(row)
            continue
        entry = next(out)
        module = final.get(row.module, row.module)
        if module != row.module:
            name = module + row.name[len(row.module):]
            row = replace(row, name=name, module=module)
            entry = replace(entry, name=name)
        rows.append(row)
        entries_out.append(entry)
    settings = _settings(types, doc, rows, final, whole)
    used = {row.module for row in rows if row.name is not None} | {k.rsplit(".", 1)[0] for k in settings}
    modules = {ident: name for name, ident in final.items() if ident != name and ident in used}
    mapping = {"format": MAPPING_FORMAT, "tensors": {row.name: [row.entry.layer, _blob_index(row.entry.name),
                                                                row.kind]
                                                     for row in rows if row.name is not None}}
    if modules:
        mapping["modules"] = modules
    document = replace(result.document, entries=entries_out, naming=scheme,
                       export_metadata={**settings, MAPPING_KEY: json.dumps(mapping, separators=(",", ":"),
                                                                            ensure_ascii=False)})
    return TorchExport(document, rows, warnings, tuple(final.get(bn, bn) for bn in result.batchnorms),
                       settings=settings, modules=modules, scheme=scheme)


def _blob_index(name: str) -> int:
    """A net blob's index in its layer, from its blobtool name "<layer>/<index>"."""
    return int(name.rsplit("/", 1)[1])


def _settings(types, doc, rows: list, final: dict, whole: bool) -> dict:
    """{"<module>.<setting>": text} for the layers whose tensors are written (and Pooling's, for a whole net).

    `types` holds the layers and their parameters (`doc` itself, or the
    --definition of a net without types); `doc` the blobs.
    """
    written = {row.entry.layer for row in rows if row.name is not None}
    weights = {}
    for e in doc.entries:
        weights.setdefault(e.layer, e.shape)
    out, definitions = {}, None
    for index, layer in enumerate(types.layers):
        kind = type_name(layer.type)
        if layer.name not in written and not (whole and kind in _NO_TENSORS):
            continue
        module = final.get(layer.name, layer.name)
        port = getattr(type_row(kind), "port", None)  # the settings a port of its type needs (net/layertypes.py)
        if port == "batch_norm":
            eps = layer_param_values(types, layer, "batch_norm_param").get(param_field("batch_norm_param", "eps"),
                                                                           TORCH_EPS)
            found = {"eps": _float32_text(eps if isinstance(eps, float) else TORCH_EPS)}
        elif port == "inner_product":
            axis = _signed(layer_param_values(types, layer, "inner_product_param").get(
                param_field("inner_product_param", "axis"), 1))
            found = {"axis": str(axis)} if axis != 1 else {}
        elif port == "prelu":
            shared = layer_param_values(types, layer, "prelu_param").get(param_field("prelu_param", "channel_shared"),
                                                                         0)
            found = {"channel_shared": "true" if shared else "false"}
        elif port in ("convolution", "pooling"):
            if definitions is None:
                definitions = _definitions(types)
            message = definitions[index] if definitions else None
            if message is None:
                continue
            if port == "pooling":
                found = _pooling(message.pooling_param)
            else:
                found = _convolution(message.convolution_param, weights.get(layer.name))
        else:
            continue
        out.update((f"{module}.{setting}", value) for setting, value in found.items())
    return out


# Layers without tensors whose settings a whole net's export carries.
_NO_TENSORS = ("Pooling",)


def _definitions(doc) -> list:
    """Each layer's full LayerParameter (formats/caffe/netdef.py), None for a V0 layer (its parameters are not upgraded)."""
    from ..formats.caffe.netdef import definition

    return [layer.message if layer.format != "V0" else None for layer in definition(doc).layers]


def _per_axis(values, h, w, has_hw: bool, default: int, axes: int) -> list:
    """Caffe's rule for kernel, stride and pad: the _h/_w pair when given, else one value for every axis or one per axis."""
    if has_hw:
        return [h, w]
    values = list(values)
    if not values:
        return [default] * axes
    return values * axes if len(values) == 1 else values


def _literal(values: list) -> str:
    """Values per spatial axis as Python text: one int when they are all the same, else a tuple."""
    if len(set(values)) == 1:
        return str(values[0])
    return "(" + ", ".join(map(str, values)) + ("," if len(values) == 1 else "") + ")"


def _convolution(p, weight_shape) -> dict:
    """A Convolution's or Deconvolution's settings under PyTorch's names (kernel_size, stride, padding, dilation, groups)."""
    axes = max(len(weight_shape) - 2, 1) if weight_shape else 2
    kernel = _per_axis(p.kernel_size, p.kernel_h, p.kernel_w, p.HasField("kernel_h") or p.HasField("kernel_w"), 0,
                       axes)
    if weight_shape and len(weight_shape) > 2 and not any(kernel):
        kernel = list(weight_shape[2:])
    stride = _per_axis(p.stride, p.stride_h, p.stride_w, p.HasField("stride_h") or p.HasField("stride_w"), 1, axes)
    pad = _per_axis(p.pad, p.pad_h, p.pad_w, p.HasField("pad_h") or p.HasField("pad_w"), 0, axes)
    dilation = _per_axis(p.dilation, 1, 1, False, 1, axes)
    return {"kernel_size": _literal(kernel), "stride": _literal(stride), "padding": _literal(pad),
            "dilation": _literal(dilation), "groups": str(p.group)}


_POOL_METHODS = {0: "max", 1: "ave", 2: "stochastic"}


def _pooling(p) -> dict:
    """A Pooling layer's settings: its method, kernel_size (or global_pooling), stride, padding, ceil_mode."""
    out = {"pool": _POOL_METHODS.get(p.pool, str(p.pool))}
    if p.global_pooling:
        out["global_pooling"] = "true"
    else:
        out["kernel_size"] = _literal(_per_axis([p.kernel_size] if p.HasField("kernel_size") else [], p.kernel_h,
                                                p.kernel_w, p.HasField("kernel_h") or p.HasField("kernel_w"), 0, 2))
    out["stride"] = _literal(_per_axis([p.stride], p.stride_h, p.stride_w,
                                       p.HasField("stride_h") or p.HasField("stride_w"), 1, 2))
    out["padding"] = _literal(_per_axis([p.pad], p.pad_h, p.pad_w, p.HasField("pad_h") or p.HasField("pad_w"), 0, 2))
    # Caffe rounds a pooled size up (round_mode CEIL = 0, its default); FLOOR = 1 as PyTorch's default.
    out["ceil_mode"] = "false" if p.round_mode == 1 else "true"
    return out


def _float32_text(value: float) -> str:
    """The shortest decimal text that reads back as the same float32 (numpy's repr: "0.001", "1e-05")."""
    return str(np.float32(value))


def python_identifiers(names: list) -> tuple[dict, list]:
    """({name: identifier}, [(name, identifier) numbered to avoid a name already given]) by the module docstring's rules."""
    made = {name: _identifier(name) for name in names}
    taken = {name for name, ident in made.items() if ident == name}
    given, numbered, next_number = {}, [], {}
    for name in names:
        base = made[name]
        if base == name:
            given[name] = name
            continue
        ident, k = base, next_number.get(base, 2)
        while ident in taken:
            ident, k = f"{base}_{k}", k + 1
        next_number[base] = k
        if ident != base:
            numbered.append((name, ident))
        taken.add(ident)
        given[name] = ident
    return given, numbered


def _identifier(name: str) -> str:
    ident = _NOT_IDENTIFIER.sub("_", name) or "_"
    if ident[0].isdigit():
        ident = "_" + ident
    if keyword.iskeyword(ident):
        ident += "_"
    return ident


def settings_groups(settings: dict) -> list:
    """[(setting, value, [modules])]: the modules sharing each setting's value, in first-met order."""
    groups: dict = {}
    for key, value in settings.items():
        module, setting = key.rsplit(".", 1)
        groups.setdefault((setting, value), []).append(module)
    return [(setting, value, modules) for (setting, value), modules in groups.items()]


def eps_warnings(path, settings: dict) -> list:
    """One line per BatchNorm eps other than PyTorch's default, naming the modules that have it."""
    lines = []
    for setting, value, modules in settings_groups(settings):
        if setting != "eps" or np.float32(value) == np.float32(TORCH_EPS):
            continue
        shown = ", ".join(modules[:_SHOWN]) + (f" and {len(modules) - _SHOWN} more" if len(modules) > _SHOWN else "")
        lines.append(f"{path}: BatchNorm eps {value} in {len(modules)} module{'s' if len(modules) != 1 else ''} "
                     f"({shown}), not PyTorch's default {_float32_text(TORCH_EPS)}: give BatchNorm2d eps={value} "
                     f"(the file's metadata has <module>.eps)")
    return lines


def kind_counts(rows: list) -> dict:
    """{kind: how many of `rows` (Mapped)} for every kind of DONE_KINDS and "not written"."""
    counts = dict.fromkeys((*DONE_KINDS, "not written"), 0)
    for row in rows:
        counts[row.kind] = counts.get(row.kind, 0) + 1
    return counts


def read_export(meta: dict | None) -> dict | None:
    """What a --names torch export's __metadata__ says, or None where it holds no mapping blobtool wrote.

    Returns {"tensors": {name: {"layer", "blob", "done"}}, "settings": {key:
    text}, "modules": {identifier: Caffe name}}; a mapping that is not the
    documented JSON gives None (the file is still read: metadata is text
    any tool may write).
    """
    if not meta or meta.get("names") not in ("torch", "torch-identifiers") or MAPPING_KEY not in meta:
        return None
    try:
        mapping = json.loads(meta[MAPPING_KEY])
    except (ValueError, RecursionError):
        return None
    if not (isinstance(mapping, dict) and mapping.get("format") == MAPPING_FORMAT
            and isinstance(mapping.get("tensors"), dict)):
        return None
    tensors = {}
    for name, row in mapping["tensors"].items():
        if not (isinstance(row, list) and len(row) == 3 and isinstance(row[0], str) and type(row[1]) is int
                and isinstance(row[2], str)):
            return None
        tensors[name] = {"layer": row[0], "blob": row[1], "done": row[2]}
    modules = mapping.get("modules", {})
    if not (isinstance(modules, dict) and all(isinstance(v, str) for v in modules.values())):
        return None
    settings = {k: v for k, v in meta.items() if "." in k}
    return {"tensors": tensors, "settings": settings, "modules": modules}
