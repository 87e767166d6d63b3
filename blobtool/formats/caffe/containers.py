"""Reading and writing Caffe's protobuf files: BlobProto, BlobProtoVector, NetParameter, SolverState.

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

import numpy as np

from . import wire
from .blobproto import BlobRecord, parse_blob, parse_errors
from ..origin import Precision
from .blobwrite import blob_encoded_size, encode_blob_parts, resolve_form, write_blob
from .schema import layer_field
from ..writing import write_parts
from ...errors import BlobToolError, FormatError, OutputError, UsageError, parameter
from ...files import atomic_output, display_name
from .. import MAX_BLOBS, MAX_NAME, Document, Entry, NetLayer, unique_names

__all__ = ["read", "write", "write_new", "write_container", "save_blob", "container_parts", "MAX_LAYERS", "MAX_NAME",
           "V1_TYPE_NAMES", "V0_TYPE_NAMES", "layer_links", "layer_param_varints", "layer_param_values",
           "split_message", "text", "name_key", "name_bytes"]


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


# Caffe's UpgradeV0LayerType: V0's lower-case type strings, as today's type names.
V0_TYPE_NAMES = {
    "accuracy": "Accuracy", "bnll": "BNLL", "concat": "Concat", "conv": "Convolution", "data": "Data",
    "dropout": "Dropout", "euclidean_loss": "EuclideanLoss", "flatten": "Flatten", "hdf5_data": "HDF5Data",
    "hdf5_output": "HDF5Output", "im2col": "Im2col", "images": "ImageData", "infogain_loss": "InfogainLoss",
    "innerproduct": "InnerProduct", "lrn": "LRN", "multinomial_logistic_loss": "MultinomialLogisticLoss",
    "pool": "Pooling", "relu": "ReLU", "sigmoid": "Sigmoid", "softmax": "Softmax",
    "softmax_loss": "SoftmaxWithLoss", "split": "Split", "tanh": "TanH", "window_data": "WindowData",
}


def read(doc: Document, cast=None) -> None:
    """Locate the blobs of a Caffe protobuf file of kind doc.kind (`cast` applies to numpy's kinds only)."""
    _READERS[doc.kind](doc, memoryview(doc.source.buf))


def _entry(name: str, record: BlobRecord, **extra) -> Entry:
    shape, layout = record.shape_layout
    diff = record.stored_diff_dtype
    if diff == record.stored_dtype:
        diff = None
    return Entry(name, shape, layout, record.stored_dtype, record.has_diff, record=record,
                 warning=record.suspicious, diff_dtype=diff, **extra)


def _read_blob(doc: Document, buf) -> None:
    if doc.size == 0:
        raise FormatError("empty file: a BlobProto holds at least its data", path=doc.path)
    doc.entries.append(_entry("0", parse_blob(buf, 0, doc.size, path=doc.path)))


def _read_vector(doc: Document, buf) -> None:
    def too_many(f):  # as Document.check_room says it
        return f"holds more than {MAX_BLOBS} blobs (blobtool's limit)"

    for f in _locate(buf, 0, doc.size, doc.path, VECTOR_FIELD_NAMES, {1}, too_many, []):
        doc.check_room(f.offset)
        record = parse_blob(buf, f.start, f.end, path=doc.path)
        doc.entries.append(_entry(str(len(doc.entries)), record, chain=(f,)))


# After this many other fields in a row (a message as written has a handful),
# the rest of a run is read in bulk (wire.iter_runs) rather than a Python call a field.
_BULK_AFTER = 16


def _locate(buf, start: int, end: int, path, names: dict, keep: set, too_many, spans: list) -> list:
    """The LEN fields numbered in `keep` (blobs, nested layers) in buf[start:end]; the others' spans go in `spans`.

    At most MAX_BLOBS (= MAX_LAYERS) kept fields (past that, FormatError with
    the message `too_many(field)`). Runs of other fields (unknown ones, a forged flood of tiny
    ones) are skipped in bulk.
    """
    kept = []
    in_a_row = 0
    pos = start
    while pos < end:
        if in_a_row == _BULK_AFTER:
            for run in wire.iter_runs(buf, pos, end, lambda n, t, s, e: (t == wire.LEN) & np.isin(n, list(keep))):
                wire.add_bytes(spans, run.start, run.end)
                pos = run.end
            in_a_row = 0
            if pos >= end:
                break
        f = wire.read_field(buf, pos, end, path=path, names=names)
        pos = f.end
        if f.number in keep and f.wire_type == wire.LEN:
            if len(kept) == MAX_BLOBS:
                raise FormatError(too_many(f), path=path, offset=f.offset)
            kept.append(f)
            in_a_row = 0
        else:
            wire.add_span(spans, f)
            in_a_row += 1
    return kept


def _caffe_name(message_cls) -> str:
    """Caffe's name of a message blobtool parses: a header message (NetHeader) is read as its Caffe message."""
    return message_cls.__name__.replace("Header", "Parameter")


def split_message(buf, start: int, end: int, path, names: dict, keep: set, message_cls):
    """Parse a message's small fields with protobuf, returning (message, [fields numbered in `keep`]).

    The fields in `keep` (blobs, nested layers) are located, not parsed; at
    most MAX_BLOBS (= MAX_LAYERS) of them.
    """
    spans = []
    def too_many(f):
        return f"{_caffe_name(message_cls)} holds more than {MAX_BLOBS} {names.get(f.number, 'nested')} fields " \
               "(blobtool's limit)"

    kept = _locate(buf, start, end, path, names, keep, too_many, spans)
    message = message_cls()
    try:
        message.ParseFromString(b"".join(wire.protobuf_ready(buf, a, b) for a, b in spans))
    except parse_errors() as exc:
        said = str(exc).replace("blobtool.caffe.", "caffe.").replace(message_cls.__name__, _caffe_name(message_cls))
        raise FormatError(f"invalid {_caffe_name(message_cls)} fields ({said})", path=path, offset=start) from exc
    return message, kept


def name_key(value) -> str:
    """A blob, layer or parameter name as blobtool computes with it: every byte kept, never cut.

    Caffe's names are byte strings, and two different ones are two blobs.
    protobuf hands a proto2 string that is not UTF-8 over as bytes; its
    bytes that are not UTF-8 become lone surrogates (Python's
    "surrogateescape", as os.fsdecode makes of a file name), which no UTF-8
    name holds, so the text is as distinct as the bytes and name_bytes gives
    them back. Only where a name is shown is it cut or escaped (text(),
    report/escape.py).
    """
    return value if isinstance(value, str) else bytes(value).decode("utf-8", "surrogateescape")


def name_bytes(key: str) -> bytes:
    """The bytes of a name_key: what the file holds."""
    return key.encode("utf-8", "surrogateescape")


def text(value) -> str:
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
    from ..._pb import blobtool_caffe_pb2 as pb  # protobuf loads only where a message's small fields are parsed

    net, layer_fields = split_message(buf, 0, doc.size, doc.path, NET_FIELD_NAMES, {2, 100}, pb.NetHeader)
    doc.meta["name"] = text(net.name) if net.HasField("name") else None
    layers = []  # (name, type, blob field chains, layer field) per layer, in file order
    for lf in layer_fields:
        if lf.number == 100:
            layer, blob_fields = split_message(buf, lf.start, lf.end, doc.path, LAYER_FIELD_NAMES, {7},
                                        pb.LayerHeader)
            name, type_ = text(layer.name), text(layer.type)
            chains = [(lf, bf) for bf in blob_fields]
        else:
            v1, nested = split_message(buf, lf.start, lf.end, doc.path, V1_FIELD_NAMES, {1, 6}, pb.V1LayerHeader)
            name = text(v1.name)
            type_ = V1_TYPE_NAMES.get(v1.type, str(v1.type)) if v1.HasField("type") else ""
            chains = [(lf, f) for f in nested if f.number == 6]
            for v0f in (f for f in nested if f.number == 1):
                v0, v0_blobs = split_message(buf, v0f.start, v0f.end, doc.path, V0_FIELD_NAMES, {50},
                                      pb.V0LayerHeader)
                name = name or text(v0.name)
                type_ = type_ or text(v0.type)
                chains += [(lf, v0f, bf) for bf in v0_blobs]
        layers.append((name, type_, chains, lf))
    names = unique_names([name for name, _, _, _ in layers])
    for name, (_, type_, chains, lf) in zip(names, layers):
        for index, chain in enumerate(chains):
            doc.check_room(chain[-1].offset)
            record = parse_blob(buf, chain[-1].start, chain[-1].end, path=doc.path)
            doc.entries.append(_entry(f"{name}/{index}", record, layer=name, type=type_, chain=chain))
        doc.layers.append(NetLayer(name, type_, wire=lf))


def layer_links(doc: Document, layer: NetLayer) -> tuple[tuple, tuple]:
    """(bottoms, tops): the blob names a layer of `doc` reads and writes.

    Read from the file when asked rather than kept for every layer at open:
    a forged layer of millions of one-byte names would cost far more as
    Python strings than its bytes.
    """
    from ..._pb import blobtool_caffe_pb2 as pb  # protobuf loads only where a message's small fields are parsed

    if layer.message is not None:  # a text net's layer, parsed
        return tuple(map(name_key, layer.message.bottom)), tuple(map(name_key, layer.message.top))
    f = layer.wire
    buf = memoryview(doc.source.buf)
    if f.number == 100:
        message, _ = split_message(buf, f.start, f.end, doc.path, LAYER_FIELD_NAMES, {7}, pb.LayerHeader)
    else:
        message, _ = split_message(buf, f.start, f.end, doc.path, V1_FIELD_NAMES, {1, 6}, pb.V1LayerHeader)
    return tuple(map(name_key, message.bottom)), tuple(map(name_key, message.top))


# A layer parameter message as Caffe writes it has a handful of fields; one
# holding more is forged, and is refused rather than walked field by field.
_MAX_PARAM_FIELDS = 1024


def layer_param_varints(doc: Document, layer: NetLayer, param: str) -> dict:
    """{field number: value} of the varint fields of a layer's `param` message ("scale_param"), last value winning.

    Only that message is read (its occurrences merge, as protobuf merges
    them); the layer's blobs and other fields are skipped in bulk, not parsed.
    An absent message gives {}: every setting at its default.
    """
    return {number: value for number, value in layer_param_values(doc, layer, param).items()
            if isinstance(value, int)}


def layer_param_values(doc: Document, layer: NetLayer, param: str) -> dict:
    """{field number: value} of the varint, 32-bit and 64-bit fields of a layer's `param` message, last value winning.

    As layer_param_varints (the same bounds: one message read, at most
    _MAX_PARAM_FIELDS fields an occurrence), and also the fixed-width
    fields: in Caffe's layer parameter messages those are `float` (32-bit,
    such as batch_norm_param.eps = 3) and `double` (64-bit), given as Python
    floats (a float32 widened exactly). Varints are ints as stored (an int32
    field's negative value is its 64-bit two's complement). Length-delimited
    fields (nested messages, strings, packed repeats) are not read.
    """
    values: dict = {}
    if layer.message is not None:  # a text net's layer, parsed (V2: upgraded when read)
        raw = getattr(layer.message, param).SerializeToString()
        _param_fields(memoryview(raw), 0, len(raw), doc.path, layer, param, values)
        return values
    f = layer.wire
    number = layer_field(param, v1=f.number != 100)  # None: V1 has no such message
    if number is None:
        return values
    buf = memoryview(doc.source.buf)

    def too_many(g):
        return f"a layer holds more than {MAX_BLOBS} {param} fields (blobtool's limit)"

    for g in _locate(buf, f.start, f.end, doc.path, {number: param}, {number}, too_many, []):
        _param_fields(buf, g.start, g.end, doc.path, layer, param, values)
    return values


def _param_fields(buf, start: int, end: int, path, layer: NetLayer, param: str, values: dict) -> None:
    """Put the varint and fixed-width fields of one occurrence of a parameter message into `values`."""
    for k, h in enumerate(wire.iter_fields(buf, start, end, path=path)):
        if k == _MAX_PARAM_FIELDS:
            raise FormatError(f"{param} of layer {layer.name!r} holds more than {_MAX_PARAM_FIELDS} fields",
                              path=path, offset=h.offset)
        if h.wire_type == wire.VARINT:
            values[h.number] = h.value
        elif h.wire_type in _FIXED_TYPES:
            values[h.number] = float(np.frombuffer(buf, _FIXED_TYPES[h.wire_type], 1, h.start)[0])


# The little-endian types of the fixed-width fields of a layer parameter message (float, double).
_FIXED_TYPES = {wire.I32: np.dtype("<f4"), wire.I64: np.dtype("<f8")}


def _read_solverstate(doc: Document, buf) -> None:
    from ..._pb import blobtool_caffe_pb2 as pb  # protobuf loads only where a message's small fields are parsed

    state, history = split_message(buf, 0, doc.size, doc.path, SOLVER_FIELD_NAMES, {3}, pb.SolverState)
    doc.meta["iter"] = state.iter
    doc.meta["learned_net"] = text(state.learned_net)
    doc.meta["current_step"] = state.current_step
    for index, f in enumerate(history):
        doc.check_room(f.offset)
        record = parse_blob(buf, f.start, f.end, path=doc.path)
        doc.entries.append(_entry(f"history/{index}", record, chain=(f,)))


_READERS = {"blob": _read_blob, "vector": _read_vector, "net": _read_net, "solverstate": _read_solverstate}


class _Splice(tuple):
    """A byte span of the input replaced by other bytes: (end, data); keyed in the tree by where it starts."""


def container_parts(doc: Document, replacements: dict) -> list:
    """The pieces of `doc` with the blobs in `replacements` ({entry name: parts}) re-encoded.

    The document's `edits` ((enclosing fields, start, end, bytes): a layer
    renamed or dropped, surgery/rename.py) replace those spans too.
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
    for chain, start, end, data in doc.edits:
        node = tree
        for f in chain:
            node = node.setdefault(f.offset, (f, {}))[1]
        node[start] = (None, _Splice((end, data)))
    return _emit(buf, 0, doc.size, tree)


def _emit(buf, start: int, end: int, tree: dict) -> list:
    out = []
    pos = start
    for offset in sorted(tree):
        f, sub = tree[offset]
        if offset > pos:
            out.append(buf[pos:offset])
        if isinstance(sub, _Splice):
            if sub[1]:
                out.append(sub[1])
            pos = max(pos, sub[0])
            continue
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
    precision = Precision.of(precision)
    for name, blob in blobs.items():
        form = resolve_form(blob, precision=precision.for_blob(name), write_diff=write_diff, layout=layout)
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
            raise UsageError(f"a blob file holds one blob; {len(blobs)} selected (choose one with "
                             f"{parameter('blobs')}, or write .npz)")
        save_blob(blobs[0], dest, precision=Precision.of(precision).for_blob(entries[0].name),
                  write_diff=write_diff, layout=layout, transforms=transforms.get(entries[0].name))
        return
    if doc is None or doc.kind != kind:
        raise UsageError(f"a {kind} file is written only from a {kind} input (its other fields come from it)")
    if doc.format != "caffe":
        write_new(doc, entries, blobs, dest, precision=precision, write_diff=write_diff, layout=layout,
                  transforms=transforms)
        return
    stored = {id(e) for e in doc.entries}
    for entry in entries:
        if id(entry) not in stored:
            raise UsageError(f"blob {entry.name!r} is not in {doc.path}: a {kind} is rewritten blob by blob, "
                             "so only its own blobs can be written back")
    write_container(doc, {e.name: b for e, b in zip(entries, blobs)}, dest, precision=precision,
                    write_diff=write_diff, layout=layout, transforms=transforms)


def write_new(doc: Document, entries: list, blobs: list, dest, *, precision=None, write_diff=None, layout=None,
              transforms: dict | None = None) -> None:
    """Write a net or solver state read from another format (Caffe's HDF5 snapshot) as Caffe's protobuf.

    The container is written whole: the selected blobs as asked, the others
    as stored. A net becomes a NetParameter whose layers (doc.layers, those
    without blobs too) hold their names and blobs only: the other format holds
    no layer types or parameters. A solver state becomes a SolverState with
    the document's iter, learned_net and current_step. Protobuf numbers blobs
    by position, so a layer whose blobs are not 0, 1, ... (a parameter shared
    with an earlier layer is absent from an HDF5 snapshot) is refused.
    """
    from ..._pb import blobtool_caffe_pb2 as pb  # protobuf loads only where a message's small fields are parsed

    transforms = transforms or {}
    if doc.format == "prototxt":  # a definition without blobs: its binary form, as parsed (V1 stays V1)
        with atomic_output(dest) as out:
            write_parts(out, [doc.parsed.SerializeToString()])
        return

    def field(number: int, parts: list) -> list:
        return [wire.len_field_header(number, blob_encoded_size(parts)), *parts]

    def blob_field(number: int, entry, blob, selected: bool) -> list:
        if not selected:  # as stored
            return field(number, encode_blob_parts(blob, **resolve_form(blob)))
        form = resolve_form(blob, precision=Precision.of(precision).for_blob(entry.name), write_diff=write_diff,
                            layout=layout)
        return field(number, encode_blob_parts(blob, transforms=transforms.get(entry.name), **form))

    parts = []
    whole = doc.whole(entries, blobs)
    if doc.kind == "net":
        by_layer = {layer.name: [] for layer in doc.layers}
        for entry, blob, selected in whole:
            by_layer.setdefault(entry.layer, []).append((entry, blob, selected))
        for layer, held in by_layer.items():
            indices = [entry.name.rpartition("/")[2] for entry, _, _ in held]
            if indices != [str(i) for i in range(len(held))]:
                raise UsageError(f"layer {layer!r} holds blobs {', '.join(indices)}: a NetParameter numbers a "
                                 "layer's blobs 0, 1, ... by position (a parameter shared with an earlier layer "
                                 "is not in an HDF5 snapshot); write HDF5, or blobs with .npz or "
                                 f"{parameter('format', given='blob')}")
            content = [pb.LayerParameter(name=layer).SerializeToString()]
            for entry, blob, selected in held:
                content += blob_field(7, entry, blob, selected)
            parts += field(100, content)
    else:
        indices = [entry.name for entry, _, _ in whole]
        if indices != [f"history/{i}" for i in range(len(whole))]:
            raise UsageError(f"the solver state holds {', '.join(indices)}: a SolverState numbers its history "
                             "0, 1, ... by position; write HDF5, or blobs with .npz or "
                             f"{parameter('format', given='blob')}")
        state = pb.SolverState(iter=doc.meta.get("iter") or 0, learned_net=doc.meta.get("learned_net") or "")
        parts.append(state.SerializeToString())
        for entry, blob, selected in whole:
            parts += blob_field(3, entry, blob, selected)
        parts.append(pb.SolverState(current_step=doc.meta.get("current_step") or 0).SerializeToString())
    with atomic_output(dest) as out:
        write_parts(out, parts)


def save_blob(blob, dest, *, precision=None, write_diff=None, layout=None, transforms=None) -> None:
    """Write `blob` as one BlobProto to a path, "-" or a binary file object (atomically for paths).

    None keeps what the blob came with (see blobwrite.resolve_form).
    """
    form = resolve_form(blob, precision=precision, write_diff=write_diff, layout=layout)
    try:
        with atomic_output(dest) as out:
            write_blob(out, blob, transforms=transforms, **form)
    except (BlobToolError, BrokenPipeError):
        raise  # a closed pipe: the command line stops quietly
    except OSError as exc:  # a binary file object of the caller's
        raise OutputError(f"cannot write: {exc.strerror or exc}", path=display_name(dest)) from exc
