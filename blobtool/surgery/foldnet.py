"""A net with its BatchNorm layers folded (blobtool fold): the plan (foldplan.py) carried out.

The folded .caffemodel is written from the file's bytes. Each folded layer
is written again field by field, in the order the file has them: its top
becomes the top of the last layer folded into it, its weight and bias hold
the folded values (fold.py) in the type they were stored in (a bias it did
not have is created after its weight, in the weight's type and layout, and
its parameter message's bias_term set to true), and every other field is
copied byte for byte. The BatchNorm and Scale layers folded in leave the
net; every other byte of the file, the other layers included, is copied as
it was. A folded blob's diff is not written (a gradient of the values
before folding).

The folded definition (a .prototxt output) is the net's definition, or
another definition of the same net given (a deploy.prototxt), with the same
changes (folddef.py), written as protobuf's text format; fields text cannot
carry (other forks') are named in a warning, as every .prototxt output does.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from ..engine.blob import Blob
from ..errors import UsageError
from ..files import atomic_output
from ..formats import Document
from ..formats.caffe import wire
from ..formats.caffe.blobwrite import blob_encoded_size, encode_blob_parts, resolve_form
from ..formats.writing import write_parts
from ..formats.origin import Origin
from ..formats.caffe.schema import layer_field, layer_field_name, param_field
from ..net.batchnorm import statistics as batchnorm_statistics
from ..net.layertypes import param_of
from .fold import Folded, fold_params
from .folddef import definition_text
from .foldplan import Fold, FoldPlan, check_foldable_net, layer_fields, plan_folds

__all__ = ["FoldResult", "fold_document", "output_form"]


@dataclasses.dataclass
class FoldResult:
    """What fold did: the plan carried out, the layers before and after, and the warnings to print."""

    path: str
    outputs: list
    plan: FoldPlan
    layers_before: int
    layers_after: int
    warnings: list
    check: object = None    # blobtool.fold(check=True)'s verdict (forward/check.py's CheckResult), else None

    def record(self) -> dict:
        """The result as plain data (JSON-ready): each fold, each BatchNorm kept with why, the layer counts."""
        return {
            "path": self.path, "outputs": self.outputs,
            "folded": [{"layer": f.target.name, "type": f.kind, "batchnorm": f.batchnorm.name,
                        "scale": f.scale.name if f.scale is not None else None, "top": f.top,
                        "bias_created": f.bias is None} for f in self.plan.folds],
            "kept": [{"batchnorm": k.batchnorm, "why": k.why} for k in self.plan.kept],
            "kept_scales": [{"scale": k.scale, "why": k.why} for k in self.plan.kept_scales],
            "layers": {"before": self.layers_before, "after": self.layers_after},
        }


def fold_document(doc: Document, *outputs, definition: Document | None = None) -> FoldResult:
    """Fold every foldable BatchNorm (and the Scale after it) of the net `doc`; write the net to `outputs`.

    `doc` is an opened .caffemodel (today's format; blobtool.fold opens
    paths); each output a path, "-" or a binary file object, written atomically:
    the folded net (.caffemodel, or a name without an extension), or its
    definition as text (.prototxt, .pbtxt). Raises UsageError for what is
    not such a net (a V1 net, an HDF5 snapshot, a .prototxt, which holds no
    weights) or an output of another format, FormatError for a damaged net.
    `definition` (a Document: a deploy .prototxt, or any net) is the
    definition a .prototxt output folds instead of the net's own, by layer
    name (folddef.py; UsageError where it wires the layers otherwise), and
    the net that will run: the folds are made with its settings (eps, the
    Scale's axes, the layer's; foldplan.py), a warning line per setting it
    states otherwise than the net.
    """
    check_foldable_net(doc)
    if not outputs:
        raise UsageError("fold: no output given", path=doc.path)
    forms = [output_form(dest, doc) for dest in outputs]
    if definition is not None and "definition" not in forms:
        raise UsageError("a definition to fold is written to a .prototxt output, and none is given",
                         path=definition.path)
    plan = plan_folds(doc, definition)
    warnings: list = list(plan.notes)
    if not plan.folds and not plan.kept:
        warnings.append(f"{doc.path}: the net has no BatchNorm layer: nothing to fold, so each output holds the "
                        "net as it is")
    # Made before anything is written: a definition wired otherwise is refused with no output left behind.
    text = definition_text(doc, plan, warnings, definition) if "definition" in forms else None
    for dest, form in zip(outputs, forms):
        if form == "definition":
            with atomic_output(dest) as out:
                out.write(text)
        else:
            _write_net(doc, plan, dest, warnings)
    return FoldResult(doc.path, [_name(dest) for dest in outputs], plan, len(doc.layers),
                      len(doc.layers) - len(plan.removed), warnings)


def _name(dest) -> str:
    return os.fspath(dest) if isinstance(dest, (str, os.PathLike)) else "<stream>"


def output_form(dest, doc: Document | None = None) -> str:
    """"net" (Caffe's protobuf: .caffemodel, a name without an extension) or "definition" (.prototxt, .pbtxt).

    UsageError for an output name that chooses another format.
    """
    from ..formats.targets import output_target

    fmt, kind = output_target(dest, None, doc)
    if fmt.name == "prototxt":
        return "definition"
    if fmt.name != "caffe" or kind != "net":
        raise UsageError(f"fold writes the folded net as Caffe's protobuf (.caffemodel, or a name without an "
                         f"extension) or its definition as text (.prototxt), not {fmt.name} ({kind})",
                         path=_name(dest))
    return "net"


def _write_net(doc: Document, plan: FoldPlan, dest, warnings: list) -> None:
    """The folded net, as the module docstring says: every byte but the changed layers copied."""
    layers = {f.target.name: (f, *_folded_blobs(doc, f, warnings)) for f in plan.folds}
    removed = plan.removed
    buf = memoryview(doc.source.buf)
    parts, pos = [], 0
    for layer in doc.layers:
        if layer.name not in removed and layer.name not in layers:
            continue
        lf = layer.wire
        parts.append(buf[pos:lf.offset])
        pos = lf.end
        if layer.name in layers:
            parts += _layer_parts(doc, *layers[layer.name])
    parts.append(buf[pos:doc.size])
    doc.source.will_read_through()
    with atomic_output(dest) as out:
        write_parts(out, parts)


def _values(entry) -> np.ndarray:
    return entry.blob().cpu_data().reshape(entry.shape)


def _stored_dtype(blob: Blob) -> np.dtype:
    return blob.origin.dtype if blob.origin is not None else blob.dtype


def _folded_blobs(doc: Document, fold: Fold, warnings: list) -> tuple:
    """(weight Blob, bias Blob) of a folded layer: computed in float64, held as they will be stored."""
    weight = fold.weight.blob()
    bias = fold.bias.blob() if fold.bias is not None else None
    mean, var, eps = batchnorm_statistics([_values(e) for e in fold.stats], fold.eps)
    folded: Folded = fold_params(fold.kind, _values(fold.weight), None if bias is None else _values(fold.bias),
                                 mean, var, eps, None if fold.gamma is None else _values(fold.gamma),
                                 None if fold.beta is None else _values(fold.beta), group=fold.group,
                                 transpose=fold.transpose)
    origin = weight.origin or Origin("shape", weight.dtype, False)
    new_weight = _blob(folded.weight, fold.weight.shape, weight,
                       dataclasses.replace(origin, has_diff=False, diff_dtype=None))
    if bias is not None:
        bias_origin = bias.origin or Origin("shape", bias.dtype, False)
        new_bias = _blob(folded.bias, fold.bias.shape, bias,
                         dataclasses.replace(bias_origin, has_diff=False, diff_dtype=None))
    else:
        # In the weight's stored type, encoding and layout (a legacy weight: a legacy bias, (1, 1, 1, C)).
        encoding = (origin.encoding[0], None) if origin.encoding else ()
        new_bias = _blob(folded.bias, (folded.bias.size,), weight,
                         Origin(origin.layout, origin.dtype, False, encoding=encoding))
    sources = (_values(fold.weight), np.zeros(folded.bias.size) if bias is None else _values(fold.bias))
    for what, made, source in zip(("weight", "bias"), (new_weight, new_bias), sources):
        count = int(np.count_nonzero(~np.isfinite(made.cpu_data()) & np.isfinite(source.reshape(-1))))
        if count:
            warnings.append(f"{doc.path}: layer {fold.target.name}: {count} of {made.count} values of its folded "
                            f"{what} are Inf or NaN (past {_stored_dtype(made).name}'s range, or a variance "
                            "below -eps)")
    return new_weight, new_bias


def _blob(values: np.ndarray, shape: tuple, like: Blob, origin: Origin) -> Blob:
    """A Blob of `shape` holding `values` rounded to the stored type `origin.dtype`, held in `like`'s dtype."""
    with np.errstate(over="ignore", invalid="ignore"):
        stored = values.astype(origin.dtype) if origin.dtype.kind == "f" else values
        held = stored.astype(like.dtype).reshape(-1)
    blob = Blob(tuple(shape), dtype=like.dtype)
    blob.set_cpu_data(held)
    blob.origin = origin
    return blob


def _encoded(blob: Blob) -> list:
    parts = encode_blob_parts(blob, **resolve_form(blob, write_diff=False))
    return [wire.len_field_header(layer_field("blobs"), blob_encoded_size(parts)), *parts]


def _layer_parts(doc: Document, fold: Fold, weight: Blob, bias: Blob) -> list:
    """The folded layer's field (LayerParameter), re-encoded field by field (module docstring)."""
    buf = memoryview(doc.source.buf)
    lf = fold.target.wire
    content = []
    blob_index = 0
    top_done = False
    param = layer_field(param_of(fold.kind))
    top, blobs = layer_field("top"), layer_field("blobs")
    for f in layer_fields(doc, fold.target):
        if f.number == top and f.wire_type == wire.LEN and not top_done:
            content.append(wire.len_field_header(top, len(fold.top_bytes)) + fold.top_bytes)
            top_done = True
        elif f.number == blobs and f.wire_type == wire.LEN:
            if blob_index == 0:
                content += _encoded(weight)
                if fold.bias is None:
                    content += _encoded(bias)
            elif blob_index == 1:
                content += _encoded(bias)
            else:
                content.append(buf[f.offset:f.end])
            blob_index += 1
        elif f.number == param and f.wire_type == wire.LEN and fold.bias is None:
            content.append(_bias_term_on(buf, f, param, doc.path))
        else:
            content.append(buf[f.offset:f.end])
    tag_end = wire.read_varint(buf, lf.offset, lf.start)[1]
    return [bytes(buf[lf.offset:tag_end]), wire.encode_varint(blob_encoded_size(content)), *content]


def _bias_term_on(buf, f, number: int, path) -> bytes:
    """A layer's parameter message with every bias_term set to true (absent, it is true by default)."""
    fields = []
    bias_term = param_field(layer_field_name(number), "bias_term")
    for g in wire.iter_fields(buf, f.start, f.end, path=path):
        if g.number == bias_term and g.wire_type == wire.VARINT:
            fields.append(wire.encode_tag(bias_term, wire.VARINT) + wire.encode_varint(1))
        else:
            fields.append(bytes(buf[g.offset:g.end]))
    body = b"".join(fields)
    return wire.len_field_header(number, len(body)) + body
