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

Sniffing (protobuf has no signature): the top-level fields (number, wire
type, and a look inside length-delimited ones) are scored as evidence for
each of Caffe's messages, and the best-supported kind wins:

===========  =================================================================
kind         evidence
===========  =================================================================
blob         legacy dims (1-4, varints), payloads (5, 6, 8, 9 of a fitting
             size), a BlobShape (7), the forks' payload fields (10-13)
net          a LayerParameter (100) or V1LayerParameter (2) with a text name
             or type, or blobs; a text name (1) or input (3)
solverstate  iter (1) and current_step (4) as varints, a text learned_net (2),
             BlobProtos in history (3)
vector       BlobProtos in blobs (1)
===========  =================================================================

A known field with a wire type a kind never uses rules that kind out. A file
of unknown fields only is read as a BlobProto, as protobuf would (which then
says what is missing).

Reading: the small fields of each message go through the protobuf library;
the blobs are located (parse_blob) and their payloads viewed, not copied.

Writing a container back (convert, scale, update) re-encodes only the
selected blobs: every other byte of the file (layer parameters, names, solver
fields, unknown fields, their order) is copied as it was, and only the length
prefixes of the messages that enclose a changed blob are recomputed. A blob
written on its own is one BlobProto.
"""

from __future__ import annotations

import itertools

import numpy as np

from .. import wire
from ..blobproto import (BLOB_FIELD_NAMES, BLOB_WIRE_PAIRS, PAYLOAD_FIELDS, SHAPE_FIELD, TYPE_FIELDS, BlobRecord,
                         parse_blob, parse_errors)
from ..blobwrite import blob_encoded_size, encode_blob_parts, precision_for, resolve_form, write_blob, write_parts
from ..errors import BlobToolError, FormatError, OutputError, UsageError
from ..files import atomic_output, display_name
from . import MAX_BLOBS, Document, Entry, NetLayer, unique_names

__all__ = ["sniff", "read", "write", "write_new", "save_blob", "container_parts", "MAX_LAYERS", "V1_TYPE_NAMES",
           "layer_links", "layer_param_varints", "LAYER_PARAMS"]


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


# -- sniffing -----------------------------------------------------------------------

# The (field number, wire type) pairs a SolverState may have at its top level.
_V, _L = wire.VARINT, wire.LEN
_SOLVER_PAIRS = {(1, _V), (2, _L), (3, _L), (4, _V)}
# Top-level fields scanned before deciding the kind; enough for any net's
# header, and it bounds the work on a BlobProto written unpacked.
_SNIFF_FIELDS = 4096
# BlobProto's fields as evidence: legacy dims, Caffe's own payloads (by
# number), and the forks' fields (raw and half payloads and their types).
_LEGACY_NUMBERS = (1, 2, 3, 4)
_PAYLOADS = {p.number: p for p in PAYLOAD_FIELDS if p.encoding == "packed"}
_FORK_NUMBERS = frozenset({p.number for p in PAYLOAD_FIELDS if p.encoding != "packed"} | set(TYPE_FIELDS))

def sniff(source) -> str:
    """The kind of a protobuf input, from its top-level fields: blob, vector, net or solverstate.

    Raises FormatError when the file is empty, looks like text (a
    .prototxt), or its fields match none of Caffe's messages.
    """
    if source.size == 0:
        raise FormatError("empty file: a Caffe file holds at least one field", path=source.name)
    buf = memoryview(source.buf)
    pairs = set()
    first = {}
    try:
        for i, f in enumerate(wire.iter_fields(buf, 0, source.size, path=source.name)):
            pairs.add((f.number, f.wire_type))
            first.setdefault((f.number, f.wire_type), f)
            if i >= _SNIFF_FIELDS:
                break
    except FormatError as exc:
        if not pairs and _looks_like_text(source):
            raise FormatError(f"not a Caffe protobuf file: it looks like text, perhaps a .prototxt; "
                              f"blobtool reads binary files ({exc.reason})",
                              path=source.name, offset=exc.offset) from exc
        # Damaged: decide from the fields read so far (none: a BlobProto, as
        # protobuf would), and let that kind's reader report the damage with
        # its field names.
    kind = _decide(pairs, first, buf)
    if kind is None:
        fields = ", ".join(f"{n}/{wire.WIRE_TYPE_NAMES[t]}" for n, t in sorted(pairs)[:8])
        raise FormatError(f"not a BlobProto, BlobProtoVector, NetParameter or SolverState: top-level fields "
                          f"{fields} match none of them (use --kind to force one)", path=source.name)
    return kind


def _looks_like_text(source) -> bool:
    sample = bytes(source.buf[:512])
    return len(sample) >= 16 and all(32 <= c < 127 or c in b"\t\r\n" for c in sample)


def _is_blob_message(buf, f) -> bool:
    """Whether a LEN field's contents parse as BlobProto fields (unknown ones beside them allowed), or are empty."""
    try:
        pairs = {(g.number, g.wire_type) for g in _first_fields(buf, f)}
    except FormatError:
        return False
    known = {p for p in pairs if p[0] in BLOB_FIELD_NAMES}
    return _fits_blob(known) and (bool(known) or not pairs)


def _fits_blob(known: set) -> bool:
    """Whether BlobProto's known (number, wire type) pairs are ones it may hold.

    The forks' numbers (10-13) are exempt: other forks reuse them with other
    wire types (a ternary-quantization Caffe's fixed32 fields 12 and 13), and
    BVLC Caffe reads those as unknown fields.
    """
    return {p for p in known if p[0] not in _FORK_NUMBERS} <= BLOB_WIRE_PAIRS


def _first_fields(buf, f):
    # Sniffing looks at a bounded number of nested fields too: a forged field
    # holding millions of tiny ones must not cost a list of millions.
    return itertools.islice(wire.iter_fields(buf, f.start, f.end), _SNIFF_FIELDS)


def _content(buf, f):
    """The (number, wire type) pairs of a LEN field's first fields, or None if they are not fields."""
    try:
        return [(g.number, g.wire_type, g) for g in _first_fields(buf, f)]
    except FormatError:
        return None


def _is_text(buf, f) -> bool:
    try:
        bytes(buf[f.start:f.end]).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _is_shape(buf, f) -> bool:
    content = _content(buf, f)
    # dim is field 1 (packed or not); other numbers are unknown fields, allowed.
    return content is not None and all((n, t) in ((1, _L), (1, _V)) or n != 1 for n, t, _ in content)


def _is_layer(buf, f, name_numbers) -> bool:
    """A LayerParameter / V1LayerParameter: fields, with a text name or type, or blobs.

    A V1 layer of Caffe's oldest format carries only a nested V0 layer (field
    1) and its bottom/top, so for V1 (name field 4) a V0 layer counts too.
    """
    content = _content(buf, f)
    if not content:
        return False
    return any((t == _L and n in name_numbers and _is_text(buf, g)) or (n, t) in ((7, _L), (6, _L), (5, _V))
               or (4 in name_numbers and (n, t) == (1, _L) and _is_v0_layer(buf, g))
               for n, t, g in content)


def _is_v0_layer(buf, f) -> bool:
    """A V0LayerParameter: fields, with a text name (1) or type (2), or blobs (50)."""
    content = _content(buf, f)
    if not content:
        return False
    return any((t == _L and n in (1, 2) and _is_text(buf, g)) or (n, t) == (50, _L) for n, t, g in content)


def _scores(pairs: set, first: dict, buf) -> dict:
    """Evidence for each kind from the top-level fields (each distinct field counted once)."""
    score = {"blob": 0, "net": 0, "solverstate": 0, "vector": 0}
    for (n, t), f in first.items():
        size = f.end - f.start
        # BlobProto
        payload = _PAYLOADS.get(n)
        if n in _LEGACY_NUMBERS and t == _V:
            score["blob"] += 1
        elif payload is not None and (t == payload.unpacked_wire_type
                                      or (t == _L and size % payload.dtype.itemsize == 0)):
            score["blob"] += 2
        elif (n, t) == (SHAPE_FIELD, _L) and _is_shape(buf, f):
            score["blob"] += 2
        elif n in _FORK_NUMBERS and (n, t) in BLOB_WIRE_PAIRS:
            score["blob"] += 1
        # NetParameter
        if (n, t) == (100, _L) and _is_layer(buf, f, (1, 2)):
            score["net"] += 6
        elif (n, t) == (2, _L) and _is_layer(buf, f, (4,)):
            score["net"] += 6
        elif (n, t) in ((1, _L), (3, _L)) and _is_text(buf, f):
            score["net"] += 1
        # SolverState
        if (n, t) in ((1, _V), (4, _V)) or ((n, t) == (2, _L) and _is_text(buf, f)):
            score["solverstate"] += 1
        elif (n, t) == (3, _L) and _is_blob_message(buf, f):
            score["solverstate"] += 4
        # BlobProtoVector
        if (n, t) == (1, _L) and _is_blob_message(buf, f):
            score["vector"] += 3
    known = {p for p in pairs if p[0] in _KNOWN_NUMBERS}
    # A known field with a wire type BlobProto never uses (a net's name or
    # input, its force_backward) rules the blob out, as the rules below do for
    # the vector and the solver state; if nothing else fits, the fallback in
    # _decide still reads it as a blob.
    if not _fits_blob({p for p in known if p[0] in BLOB_FIELD_NAMES}):
        score["blob"] = 0
    if known - {(1, _L)}:
        score["vector"] = 0
    if {p for p in known if p[0] in BLOB_FIELD_NAMES} - _SOLVER_PAIRS:
        score["solverstate"] = 0
    return score


# Field numbers any kind knows (BlobProto's cover the other kinds' top-level
# numbers but NetParameter.layer); others are unknown fields, which every kind may carry.
_KNOWN_NUMBERS = set(BLOB_FIELD_NAMES) | {100}
# On a tie, the earlier kind wins.
_KIND_ORDER = ("blob", "net", "solverstate", "vector")


def _decide(pairs: set, first: dict, buf) -> str | None:
    score = _scores(pairs, first, buf)
    best = max(_KIND_ORDER, key=lambda k: (score[k], -_KIND_ORDER.index(k)))
    if score[best] > 0:
        return best
    # Nothing but unknown fields, or known numbers with unexpected wire types:
    # protobuf reads that as a BlobProto with no data, and so does blobtool
    # (which then says what is missing).
    return "blob"


# -- reading ------------------------------------------------------------------------

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
            for run in wire.iter_runs(buf, pos, end, lambda n, t, s, e: (t == _L) & np.isin(n, list(keep))):
                wire.add_bytes(spans, run.start, run.end)
                pos = run.end
            in_a_row = 0
            if pos >= end:
                break
        f = wire.read_field(buf, pos, end, path=path, names=names)
        pos = f.end
        if f.number in keep and f.wire_type == _L:
            if len(kept) == MAX_BLOBS:
                raise FormatError(too_many(f), path=path, offset=f.offset)
            kept.append(f)
            in_a_row = 0
        else:
            wire.add_span(spans, f)
            in_a_row += 1
    return kept


def _split(buf, start: int, end: int, path, names: dict, keep: set, message_cls):
    """Parse a message's small fields with protobuf, returning (message, [fields numbered in `keep`]).

    The fields in `keep` (blobs, nested layers) are located, not parsed; at
    most MAX_BLOBS (= MAX_LAYERS) of them.
    """
    spans = []
    def too_many(f):
        return f"{message_cls.__name__} holds more than {MAX_BLOBS} {names.get(f.number, 'nested')} fields " \
               "(blobtool's limit)"

    kept = _locate(buf, start, end, path, names, keep, too_many, spans)
    message = message_cls()
    try:
        message.ParseFromString(b"".join(wire.protobuf_ready(buf, a, b) for a, b in spans))
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
    layers = []  # (name, type, blob field chains, layer field) per layer, in file order
    for lf in layer_fields:
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
        layers.append((name, type_, chains, lf))
    names = unique_names([name for name, _, _, _ in layers])
    for name, (_, type_, chains, lf) in zip(names, layers):
        for index, chain in enumerate(chains):
            doc.check_room(chain[-1].offset)
            record = parse_blob(buf, chain[-1].start, chain[-1].end, path=doc.path)
            doc.entries.append(_entry(f"{name}/{index}", record, layer=name, type=type_, chain=chain))
        doc.layers.append(NetLayer(name, type_, lf))


def layer_links(doc: Document, layer: NetLayer) -> tuple[tuple, tuple]:
    """(bottoms, tops): the blob names a layer of `doc` reads and writes.

    Read from the file when asked rather than kept for every layer at open:
    a forged layer of millions of one-byte names would cost far more as
    Python strings than its bytes.
    """
    from .._pb import blobtool_caffe_pb2 as pb

    f = layer.field
    buf = memoryview(doc.source.buf)
    if f.number == 100:
        message, _ = _split(buf, f.start, f.end, doc.path, LAYER_FIELD_NAMES, {7}, pb.LayerParameter)
    else:
        message, _ = _split(buf, f.start, f.end, doc.path, V1_FIELD_NAMES, {1, 6}, pb.V1LayerParameter)
    return tuple(_text(b) for b in message.bottom), tuple(_text(t) for t in message.top)


# Layer parameter messages --names torch reads a setting of: their field number in
# LayerParameter (100) and in V1LayerParameter (2; None where V1 has none).
LAYER_PARAMS = {"inner_product_param": (117, 17), "scale_param": (142, None), "prelu_param": (131, None),
                "batch_norm_param": (139, None)}
# A layer parameter message as Caffe writes it has a handful of fields; one
# holding more is forged, and is refused rather than walked field by field.
_MAX_PARAM_FIELDS = 1024


def layer_param_varints(doc: Document, layer: NetLayer, param: str) -> dict:
    """{field number: value} of the varint fields of a layer's `param` message (LAYER_PARAMS), last value winning.

    Only that message is read (its occurrences merge, as protobuf merges
    them); the layer's blobs and other fields are skipped in bulk, not parsed.
    An absent message gives {}: every setting at its default.
    """
    f = layer.field
    number = LAYER_PARAMS[param][0 if f.number == 100 else 1]
    if number is None:
        return {}
    buf = memoryview(doc.source.buf)

    def too_many(g):
        return f"a layer holds more than {MAX_BLOBS} {param} fields (blobtool's limit)"

    values = {}
    for g in _locate(buf, f.start, f.end, doc.path, {number: param}, {number}, too_many, []):
        for k, h in enumerate(wire.iter_fields(buf, g.start, g.end, path=doc.path)):
            if k == _MAX_PARAM_FIELDS:
                raise FormatError(f"{param} of layer {layer.name!r} holds more than {_MAX_PARAM_FIELDS} fields",
                                  path=doc.path, offset=h.offset)
            if h.wire_type == _V:
                values[h.number] = h.value
    return values


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
        form = resolve_form(blob, precision=precision_for(precision, name), write_diff=write_diff, layout=layout)
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
        save_blob(blobs[0], dest, precision=precision_for(precision, entries[0].name), write_diff=write_diff,
                  layout=layout,
                  transforms=transforms.get(entries[0].name))
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
    from .._pb import blobtool_caffe_pb2 as pb

    transforms = transforms or {}

    def field(number: int, parts: list) -> list:
        return [wire.len_field_header(number, blob_encoded_size(parts)), *parts]

    def blob_field(number: int, entry, blob, selected: bool) -> list:
        if not selected:  # as stored
            return field(number, encode_blob_parts(blob, **resolve_form(blob)))
        form = resolve_form(blob, precision=precision_for(precision, entry.name), write_diff=write_diff,
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
                                 "is not in an HDF5 snapshot); write HDF5, or blobs with .npz or --format blob")
            content = [pb.LayerParameter(name=layer).SerializeToString()]
            for entry, blob, selected in held:
                content += blob_field(7, entry, blob, selected)
            parts += field(100, content)
    else:
        indices = [entry.name for entry, _, _ in whole]
        if indices != [f"history/{i}" for i in range(len(whole))]:
            raise UsageError(f"the solver state holds {', '.join(indices)}: a SolverState numbers its history "
                             "0, 1, ... by position; write HDF5, or blobs with .npz or --format blob")
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
