"""Caffe's protobuf files: BlobProto, BlobProtoVector, NetParameter (.caffemodel), SolverState (.solverstate).

Field numbers are Caffe's (proto/blobtool_caffe.proto):

===========  ==========================================  =======================
kind         message (Caffe field numbers)               blob names
===========  ==========================================  =======================
blob         BlobProto (see blobproto.py)                "0"
vector       BlobProtoVector: blobs = 1                  "0", "1", ...
net          NetParameter: name = 1, layers = 2 (V1),    "<layer>/<index>"
             layer = 100; LayerParameter: name = 1,
             type = 2, blobs = 7; V1LayerParameter:
             layer = 1 (V0), name = 4, type = 5 (enum),
             blobs = 6; V0LayerParameter: name = 1,
             type = 2, blobs = 50
solverstate  SolverState: iter = 1, learned_net = 2,      "history/<index>"
             history = 3, current_step = 4
===========  ==========================================  =======================

Reading: the small fields of each message go through the protobuf library;
the blobs are located (parse_blob) and their payloads viewed, not copied.

Writing a container back (convert, scale, update) re-encodes only the
selected blobs: every other byte of the file (layer parameters, names, solver
fields, unknown fields, their order) is copied as it was, and only the length
prefixes of the messages that enclose a changed blob are recomputed. A blob
written on its own is one BlobProto.
"""

from __future__ import annotations

from .. import wire
from ..blobproto import (BlobRecord, blob_encoded_size, encode_blob_parts, parse_blob, parse_errors, resolve_form,
                         write_blob, write_parts)
from ..errors import BlobToolError, FormatError, OutputError, UsageError
from ..source import atomic_output, display_name
from . import MAX_BLOBS, Document, Entry

__all__ = ["read", "write", "save_blob", "container_parts", "MAX_LAYERS", "V1_TYPE_NAMES"]

_L = wire.LEN

NET_FIELD_NAMES = {1: "name", 2: "layers", 3: "input", 4: "input_dim", 5: "force_backward", 6: "state",
                   7: "debug_info", 8: "input_shape", 100: "layer"}
LAYER_FIELD_NAMES = {1: "name", 2: "type", 7: "blobs"}
V1_FIELD_NAMES = {1: "layer", 2: "bottom", 3: "top", 4: "name", 5: "type", 6: "blobs"}
V0_FIELD_NAMES = {1: "name", 2: "type", 50: "blobs"}
SOLVER_FIELD_NAMES = {1: "iter", 2: "learned_net", 3: "history", 4: "current_step"}
VECTOR_FIELD_NAMES = {1: "blobs"}

# A net's layers are capped like a file's blobs (formats.MAX_BLOBS): a layer
# costs about 0.3 KB of bookkeeping.
MAX_LAYERS = MAX_BLOBS
# Characters of a layer's (or net's) name and type kept; see _text.
MAX_NAME = 256

# Caffe's UpgradeV1LayerType: V1 enum values to today's type strings.
V1_TYPE_NAMES = {
    0: "", 35: "AbsVal", 1: "Accuracy", 30: "ArgMax", 2: "BNLL", 3: "Concat", 37: "ContrastiveLoss",
    4: "Convolution", 5: "Data", 39: "Deconvolution", 6: "Dropout", 32: "DummyData", 7: "EuclideanLoss",
    25: "Eltwise", 38: "Exp", 8: "Flatten", 9: "HDF5Data", 10: "HDF5Output", 28: "HingeLoss", 11: "Im2col",
    12: "ImageData", 13: "InfogainLoss", 14: "InnerProduct", 15: "LRN", 29: "MemoryData",
    16: "MultinomialLogisticLoss", 34: "MVN", 17: "Pooling", 26: "Power", 18: "ReLU", 19: "Sigmoid",
    27: "SigmoidCrossEntropyLoss", 36: "Silence", 20: "Softmax", 21: "SoftmaxWithLoss", 22: "Split",
    33: "Slice", 23: "TanH", 24: "WindowData", 31: "Threshold",
}


# -- reading ------------------------------------------------------------------------

def read(doc: Document, cast=None) -> None:
    """Locate the blobs of a Caffe protobuf file of kind doc.kind (`cast` applies to numpy's kinds only)."""
    _READERS[doc.kind](doc, memoryview(doc.source.buf))


def _entry(name: str, record: BlobRecord, **extra) -> Entry:
    shape, layout = record.shape_layout
    return Entry(name, shape, layout, record.stored_dtype, record.has_diff, record=record,
                 warning=record.suspicious, **extra)


def _read_blob(doc: Document, buf) -> None:
    if doc.size == 0:
        raise FormatError("empty file: a BlobProto holds at least its data", path=doc.path)
    doc.entries.append(_entry("0", parse_blob(buf, 0, doc.size, path=doc.path)))


def _read_vector(doc: Document, buf) -> None:
    for f in wire.iter_fields(buf, 0, doc.size, path=doc.path, names=VECTOR_FIELD_NAMES):
        if f.number == 1 and f.wire_type == _L:
            doc.check_room(f.offset)
            record = parse_blob(buf, f.start, f.end, path=doc.path)
            doc.entries.append(_entry(str(len(doc.entries)), record, chain=(f,)))


def _split(buf, start: int, end: int, path, names: dict, keep: set, message_cls):
    """Parse a message's small fields with protobuf, returning (message, [fields numbered in `keep`]).

    The fields in `keep` (blobs, nested layers) are located, not parsed; at
    most MAX_BLOBS (= MAX_LAYERS) of them.
    """
    kept, spans = [], []
    for f in wire.iter_fields(buf, start, end, path=path, names=names):
        if f.number in keep and f.wire_type == _L:
            if len(kept) == MAX_BLOBS:
                raise FormatError(f"{message_cls.__name__} holds more than {MAX_BLOBS} "
                                  f"{names.get(f.number, 'nested')} fields (blobtool's limit)",
                                  path=path, offset=f.offset)
            kept.append(f)
        else:
            wire.add_span(spans, f)
    message = message_cls()
    try:
        message.ParseFromString(b"".join(wire.minimal_tags(buf, a, b) for a, b in spans))
    except parse_errors() as exc:
        raise FormatError(f"invalid {message_cls.__name__} fields ({exc})", path=path, offset=start) from exc
    return message, kept


def _text(value) -> str:
    """A name or type as text, cut to MAX_NAME characters (bytes, when not UTF-8).

    protobuf hands proto2 strings that are not UTF-8 over as bytes; they are
    decoded with \\xNN escapes. A longer name (Caffe's are a few dozen
    characters) is damaged or forged: it is cut rather than copied into the
    name of each of its layer's blobs.
    """
    cut = len(value) > MAX_NAME
    value = value[:MAX_NAME]
    if isinstance(value, bytes):
        value = value.decode("utf-8", "backslashreplace")
    return value + "..." if cut else value


def _read_net(doc: Document, buf) -> None:
    from .._pb import blobtool_caffe_pb2 as pb

    net, layer_fields = _split(buf, 0, doc.size, doc.path, NET_FIELD_NAMES, {2, 100}, pb.NetParameter)
    doc.meta["name"] = _text(net.name) if net.HasField("name") else None
    seen = {}
    for k, lf in enumerate(layer_fields):
        if lf.number == 100:
            layer, blob_fields = _split(buf, lf.start, lf.end, doc.path, LAYER_FIELD_NAMES, {7},
                                        pb.LayerParameter)
            name, type_ = _text(layer.name), _text(layer.type)
            chains = [(lf, bf) for bf in blob_fields]
        else:
            v1, nested = _split(buf, lf.start, lf.end, doc.path, V1_FIELD_NAMES, {1, 6}, pb.V1LayerParameter)
            name = _text(v1.name)
            type_ = V1_TYPE_NAMES.get(v1.type, str(v1.type)) if v1.HasField("type") else ""
            chains = [(lf, f) for f in nested if f.number == 6]
            for v0f in (f for f in nested if f.number == 1):
                v0, v0_blobs = _split(buf, v0f.start, v0f.end, doc.path, V0_FIELD_NAMES, {50},
                                      pb.V0LayerParameter)
                name = name or _text(v0.name)
                type_ = type_ or _text(v0.type)
                chains += [(lf, v0f, bf) for bf in v0_blobs]
        name = name or f"layer{k}"
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name = f"{name}#{seen[name]}"
        for index, chain in enumerate(chains):
            doc.check_room(chain[-1].offset)
            record = parse_blob(buf, chain[-1].start, chain[-1].end, path=doc.path)
            doc.entries.append(_entry(f"{name}/{index}", record, layer=name, type=type_, chain=chain))


def _read_solverstate(doc: Document, buf) -> None:
    from .._pb import blobtool_caffe_pb2 as pb

    state, history = _split(buf, 0, doc.size, doc.path, SOLVER_FIELD_NAMES, {3}, pb.SolverState)
    doc.meta["iter"] = state.iter
    doc.meta["learned_net"] = _text(state.learned_net)
    doc.meta["current_step"] = state.current_step
    for index, f in enumerate(history):
        doc.check_room(f.offset)
        record = parse_blob(buf, f.start, f.end, path=doc.path)
        doc.entries.append(_entry(f"history/{index}", record, chain=(f,)))


_READERS = {"blob": _read_blob, "vector": _read_vector, "net": _read_net, "solverstate": _read_solverstate}


# -- writing ----------------------------------------------------------------------------

def container_parts(doc: Document, replacements: dict) -> list:
    """The pieces of `doc` with the blobs in `replacements` ({entry name: parts}) re-encoded.

    Everything else is memoryview slices of the input; enclosing messages get
    new length prefixes.
    """
    buf = memoryview(doc.source.buf)
    tree: dict = {}
    by_name = {e.name: e for e in doc.entries}
    for name, parts in replacements.items():
        chain = by_name[name].chain
        node = tree
        for f in chain[:-1]:
            node = node.setdefault(f.offset, (f, {}))[1]
        node[chain[-1].offset] = (chain[-1], parts)
    return _emit(buf, 0, doc.size, tree)


def _emit(buf, start: int, end: int, tree: dict) -> list:
    out = []
    pos = start
    for offset in sorted(tree):
        f, sub = tree[offset]
        if offset > pos:
            out.append(buf[pos:offset])
        tag_end = wire.read_varint(buf, f.offset, f.start)[1]
        content = sub if isinstance(sub, list) else _emit(buf, f.start, f.end, sub)
        out.append(bytes(buf[f.offset:tag_end]))
        out.append(wire.encode_varint(blob_encoded_size(content)))
        out.extend(content)
        pos = f.end
    if end > pos:
        out.append(buf[pos:end])
    return out


def write_container(doc: Document, blobs: dict, dest, *, precision=None, write_diff=None, layout=None,
                    transforms: dict | None = None) -> None:
    """Write `doc` to `dest` (atomically) with the blobs in `blobs` ({name: Blob}) re-encoded.

    Each blob keeps its stored precision, layout and diff unless told
    otherwise; all other bytes are copied as they were. `transforms` maps
    blob names to {"data"|"diff": fn(chunk, start)} applied while writing.
    """
    replacements = {}
    for name, blob in blobs.items():
        form = resolve_form(blob, precision=precision, write_diff=write_diff, layout=layout)
        replacements[name] = encode_blob_parts(blob, transforms=(transforms or {}).get(name), **form)
    if doc.kind == "blob":
        parts = next(iter(replacements.values()))
    else:
        parts = container_parts(doc, replacements)
    with atomic_output(dest) as out:
        write_parts(out, parts)


def write(doc: Document | None, entries: list, blobs: list, dest, *, kind: str, precision=None, write_diff=None,
          layout=None, transforms: dict | None = None) -> None:
    """Write the selected blobs as `kind`: one BlobProto ("blob"), or `doc` itself with them re-encoded.

    Each blob keeps its stored precision, layout and diff unless told
    otherwise. `transforms` maps blob names to {"data"|"diff": fn(chunk, start)}
    applied while writing.
    """
    transforms = transforms or {}
    if kind == "blob":
        if len(blobs) != 1:
            raise UsageError(f"a blob file holds one blob; {len(blobs)} selected (choose one with --blob, "
                             "or write .npz)")
        save_blob(blobs[0], dest, precision=precision, write_diff=write_diff, layout=layout,
                  transforms=transforms.get(entries[0].name))
        return
    if doc is None or doc.kind != kind:
        raise UsageError(f"a {kind} file is written only from a {kind} input (its other fields come from it)")
    write_container(doc, {e.name: b for e, b in zip(entries, blobs)}, dest, precision=precision,
                    write_diff=write_diff, layout=layout, transforms=transforms)


def save_blob(blob, dest, *, precision=None, write_diff=None, layout=None, transforms=None) -> None:
    """Write `blob` as one BlobProto to a path, "-" or a binary file object (atomically for paths).

    None keeps what the blob came with (see blobproto.resolve_form).
    """
    form = resolve_form(blob, precision=precision, write_diff=write_diff, layout=layout)
    try:
        with atomic_output(dest) as out:
            write_blob(out, blob, transforms=transforms, **form)
    except (BlobToolError, BrokenPipeError):
        raise  # a closed pipe: the command line stops quietly
    except OSError as exc:  # a binary file object of the caller's
        raise OutputError(f"cannot write: {exc.strerror or exc}", path=display_name(dest)) from exc
