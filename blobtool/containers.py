"""Which blobs a file holds, their names, and writing a container back with only its blobs changed.

A Document is an opened input: its kind, its blobs in file order (each an
Entry that knows its name, shape and dtype without touching the payload),
and the Source whose bytes they view. Kinds are sniffed from the bytes (which
top-level fields appear with which wire types), never from the file name.

Kinds and blob names (stable, in file order):

===========  ==========================================  =======================
kind         message (Caffe field numbers)               blob names
===========  ==========================================  =======================
blob         BlobProto                                   "0"
vector       BlobProtoVector: blobs = 1                  "0", "1", ...
net          NetParameter: name = 1, layers = 2 (V1),    "<layer>/<index>"
             layer = 100; LayerParameter: name = 1,
             type = 2, blobs = 7; V1LayerParameter:
             layer = 1 (V0), name = 4, type = 5 (enum),
             blobs = 6; V0LayerParameter: name = 1,
             type = 2, blobs = 50
solverstate  SolverState: iter = 1, learned_net = 2,      "history/<index>"
             history = 3, current_step = 4
npy / npz    numpy's formats                              "0" / the array names
===========  ==========================================  =======================

An unnamed layer is "layer<k>" (k its position among all layers); a repeated
layer name gets "#2", "#3", ... from its second occurrence on. In .npz files
an array named "<name>/diff" is the diff of "<name>".

Writing a container back (convert, scale, update) re-encodes only the
selected blobs: every other byte of the file (layer parameters, names, solver
fields, unknown fields, their order) is copied as it was, and only the length
prefixes of the messages that enclose a changed blob are recomputed.
"""

from __future__ import annotations

import fnmatch
import io
import itertools
import math
import zipfile
import zlib
from dataclasses import dataclass, field

import numpy as np

from . import wire
from .blob import Blob
from .blobproto import (BlobRecord, Origin, blob_encoded_size, blob_from_record, encode_blob_parts,
                        parse_blob, parse_errors, resolve_form, write_parts)
from .errors import FormatError, UsageError
from .files import NPY_MAGIC, Source, atomic_output, load_npy, open_source
from .kinds import CONTAINER_KINDS, KINDS

__all__ = ["Entry", "Document", "open_document", "select", "sniff", "KINDS", "CONTAINER_KINDS",
           "load", "load_all", "write_container"]


NET_FIELD_NAMES = {1: "name", 2: "layers", 3: "input", 4: "input_dim", 5: "force_backward", 6: "state",
                   7: "debug_info", 8: "input_shape", 100: "layer"}
LAYER_FIELD_NAMES = {1: "name", 2: "type", 7: "blobs"}
V1_FIELD_NAMES = {1: "layer", 2: "bottom", 3: "top", 4: "name", 5: "type", 6: "blobs"}
V0_FIELD_NAMES = {1: "name", 2: "type", 50: "blobs"}
SOLVER_FIELD_NAMES = {1: "iter", 2: "learned_net", 3: "history", 4: "current_step"}
VECTOR_FIELD_NAMES = {1: "blobs"}

# The (field number, wire type) pairs each kind may have at its top level.
_V, _L, _I64, _I32 = wire.VARINT, wire.LEN, wire.I64, wire.I32
_BLOB_PAIRS = {(1, _V), (2, _V), (3, _V), (4, _V), (5, _L), (5, _I32), (6, _L), (6, _I32), (7, _L),
               (8, _L), (8, _I64), (9, _L), (9, _I64), (10, _V), (10, _L), (11, _V), (11, _L),
               (12, _L), (13, _L)}
_SOLVER_PAIRS = {(1, _V), (2, _L), (3, _L), (4, _V)}
# Top-level fields scanned before deciding the kind; enough for any net's
# header, and it bounds the work on a BlobProto written unpacked.
_SNIFF_FIELDS = 4096

# A file's blobs, and a net's layers, are each capped at this many. The
# largest Caffe nets hold a few thousand; each costs about 1.5 KB (a blob) or
# 0.3 KB (a layer) of bookkeeping, so a forged file of millions of empty ones
# would otherwise exhaust memory.
MAX_BLOBS = MAX_LAYERS = 1 << 16
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


@dataclass
class Entry:
    """One blob in a document: what info needs, and a way to get the Blob.

    `chain` holds the fields from the top-level message down to the blob's
    own field, so a writer can replace it in place.
    """

    name: str
    shape: tuple
    layout: str
    dtype: np.dtype
    has_diff: bool
    record: BlobRecord | None = None
    layer: str | None = None
    type: str | None = None
    chain: tuple = ()
    warning: str | None = None
    _blob: Blob | None = None

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize

    def blob(self) -> Blob:
        """The Blob, built on first use; float data views the file (no copy)."""
        if self._blob is None:
            self._blob = blob_from_record(self.record)
        return self._blob


@dataclass
class Document:
    """An opened input file: its kind, its blobs in order, and its bytes."""

    path: str
    kind: str
    source: Source
    entries: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    @property
    def size(self) -> int:
        return self.source.size

    def names(self) -> list:
        return [e.name for e in self.entries]

    @property
    def warnings(self) -> list:
        return [f"{self.path}: blob {e.name} {e.warning}" for e in self.entries if e.warning]


def _check_room(doc: "Document", offset: int) -> None:
    if len(doc.entries) == MAX_BLOBS:
        raise FormatError(f"holds more than {MAX_BLOBS} blobs (blobtool's limit)", path=doc.path, offset=offset)


def _entry(name: str, record: BlobRecord, **extra) -> Entry:
    shape, layout = record.shape_layout
    return Entry(name, shape, layout, record.stored_dtype, record.has_diff, record=record,
                 warning=record.suspicious, **extra)


# -- sniffing ---------------------------------------------------------------------

_MAGICS = (
    (b"\x1f\x8b", "a gzip-compressed file; decompress it first (gunzip -k FILE) and read the result"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file (Caffe's HDF5 snapshot format); blobtool reads the protobuf "
                           "formats (.caffemodel, .solverstate, .binaryproto)"),
    (b"\x00\x05\x16\x07", "a macOS resource-fork file (AppleDouble '._' metadata), not a Caffe file; "
                          "read the file of the same name without the '._' prefix"),
    (b"BZh", "a bzip2-compressed file; decompress it first (bunzip2 -k FILE)"),
    (b"\xfd7zXZ\x00", "an xz-compressed file; decompress it first (unxz -k FILE)"),
)


def sniff(source: Source) -> str:
    """The kind of an input, from its bytes: blob, vector, net, solverstate, npy or npz.

    Raises FormatError saying what the file looks like when it is none of them.
    """
    head = bytes(source.buf[:8])
    if head.startswith(NPY_MAGIC):
        return "npy"
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "npz"
    for magic, what in _MAGICS:
        if head.startswith(magic):
            raise FormatError(f"not a Caffe file: this looks like {what}", path=source.name)
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


def _looks_like_text(source: Source) -> bool:
    sample = bytes(source.buf[:512])
    return len(sample) >= 16 and all(32 <= c < 127 or c in b"\t\r\n" for c in sample)


def _is_blob_message(buf, f) -> bool:
    """Whether a LEN field's contents parse as BlobProto fields."""
    try:
        pairs = {(g.number, g.wire_type) for g in _first_fields(buf, f)}
    except FormatError:
        return False
    return pairs <= _BLOB_PAIRS


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
        if n in (1, 2, 3, 4) and t == _V:
            score["blob"] += 1
        elif n in (5, 6) and (t == _I32 or (t == _L and size % 4 == 0)):
            score["blob"] += 2
        elif n in (8, 9) and (t == _I64 or (t == _L and size % 8 == 0)):
            score["blob"] += 2
        elif (n, t) == (7, _L) and _is_shape(buf, f):
            score["blob"] += 2
        elif n in (10, 11, 12, 13) and (n, t) in _BLOB_PAIRS:
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
    if {p for p in known if p[0] <= 13} - _BLOB_PAIRS:
        score["blob"] = 0
    if known - {(1, _L)}:
        score["vector"] = 0
    if {p for p in known if p[0] <= 13} - _SOLVER_PAIRS:
        score["solverstate"] = 0
    return score


# Field numbers any kind knows; others are unknown fields, which every kind may carry.
_KNOWN_NUMBERS = set(range(1, 14)) | {100}
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


# -- reading ----------------------------------------------------------------------------

def open_document(src, kind: str | None = None, *, npy_cast=None) -> Document:
    """Open a path, "-" or binary file object and locate its blobs (payloads are not read).

    `kind` overrides sniffing. `npy_cast` (float32/float64) lets an .npy of
    another numeric dtype load, converted.
    """
    if kind is not None and kind not in KINDS:
        raise UsageError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    source = open_source(src)
    kind = kind or sniff(source)
    reader = _READERS[kind]
    doc = Document(source.name, kind, source)
    reader(doc, memoryview(source.buf) if kind not in ("npy", "npz") else None, npy_cast)
    return doc


def _read_blob(doc: Document, buf, _cast) -> None:
    if doc.size == 0:
        raise FormatError("empty file: a BlobProto holds at least its data", path=doc.path)
    doc.entries.append(_entry("0", parse_blob(buf, 0, doc.size, path=doc.path)))


def _read_vector(doc: Document, buf, _cast) -> None:
    for f in wire.iter_fields(buf, 0, doc.size, path=doc.path, names=VECTOR_FIELD_NAMES):
        if f.number == 1 and f.wire_type == _L:
            _check_room(doc, f.offset)
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
            if spans and spans[-1][1] == f.offset:  # adjacent fields: one span
                spans[-1] = (spans[-1][0], f.end)
            else:
                spans.append((f.offset, f.end))
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


def _read_net(doc: Document, buf, _cast) -> None:
    from ._pb import blobtool_caffe_pb2 as pb

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
            _check_room(doc, chain[-1].offset)
            record = parse_blob(buf, chain[-1].start, chain[-1].end, path=doc.path)
            doc.entries.append(_entry(f"{name}/{index}", record, layer=name, type=type_, chain=chain))


def _read_solverstate(doc: Document, buf, _cast) -> None:
    from ._pb import blobtool_caffe_pb2 as pb

    state, history = _split(buf, 0, doc.size, doc.path, SOLVER_FIELD_NAMES, {3}, pb.SolverState)
    doc.meta["iter"] = state.iter
    doc.meta["learned_net"] = _text(state.learned_net)
    doc.meta["current_step"] = state.current_step
    for index, f in enumerate(history):
        _check_room(doc, f.offset)
        record = parse_blob(buf, f.start, f.end, path=doc.path)
        doc.entries.append(_entry(f"history/{index}", record, chain=(f,)))


def _read_npy(doc: Document, _buf, cast) -> None:
    blob = load_npy(doc.source, cast=cast)
    doc.entries.append(Entry("0", blob.shape, "shape", blob.dtype, False, _blob=blob))


def _read_npz(doc: Document, _buf, cast) -> None:
    try:
        archive = zipfile.ZipFile(io.BytesIO(memoryview(doc.source.buf)))
        members = [info for info in archive.infolist() if info.filename.endswith(".npy")]
    except _ZIP_ERRORS as exc:
        raise FormatError(f"not a readable .npz (zip) file: {exc}", path=doc.path) from exc
    if len(members) > MAX_BLOBS:
        raise FormatError(f"holds {len(members)} arrays, more than {MAX_BLOBS} (blobtool's limit)", path=doc.path)
    arrays = {}
    for info in members:
        data = _read_member(archive, info, doc.path)
        sub = Source(f"{doc.path}[{info.filename}]", data, len(data))
        arrays[info.filename[:-4]] = load_npy(sub, cast=cast)
    for key, blob in arrays.items():
        if key.endswith("/diff") and key[:-5] in arrays:
            continue
        diff = arrays.get(key + "/diff")
        if diff is not None:
            if diff.count != blob.count:
                raise FormatError(f"array {key + '/diff'} has {diff.count} values, {key} has {blob.count}",
                                  path=doc.path)
            with np.errstate(over="ignore", invalid="ignore"):  # doubles past float32's range become inf
                np.copyto(blob.mutable_cpu_diff(), diff.cpu_data(), casting="unsafe")
            blob.origin = Origin("shape", blob.dtype, True)
        doc.entries.append(Entry(key, blob.shape, "shape", blob.dtype, diff is not None, _blob=blob))


# Everything zipfile raises on a damaged archive (a bad CRC, a bad local header,
# a broken deflate stream, an unknown compression method or zip version ...).
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError,
               RuntimeError, KeyError, OverflowError, UnicodeDecodeError)
# numpy writes .npz members stored or deflated; deflate expands at most 1032:1,
# so a member declaring more than that is forged, and is refused before reading.
_NPZ_MAX_EXPANSION = {zipfile.ZIP_STORED: 1, zipfile.ZIP_DEFLATED: 1032}


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path) -> bytearray:
    label = f"member {info.filename!r}"
    expansion = _NPZ_MAX_EXPANSION.get(info.compress_type)
    if expansion is None:
        raise FormatError(f"{label} uses zip compression method {info.compress_type}; "
                          ".npz members are stored or deflated", path=path, offset=info.header_offset)
    if info.file_size > expansion * info.compress_size:
        raise FormatError(f"{label} declares {info.file_size} bytes, more than its {info.compress_size} "
                          "stored bytes can hold", path=path, offset=info.header_offset)
    try:
        return bytearray(archive.read(info))
    except _ZIP_ERRORS as exc:
        raise FormatError(f"{label} is unreadable: {exc}", path=path, offset=info.header_offset) from exc


_READERS = {"blob": _read_blob, "vector": _read_vector, "net": _read_net, "solverstate": _read_solverstate,
            "npy": _read_npy, "npz": _read_npz}


def select(doc: Document, patterns) -> list:
    """The entries matching any of `patterns` (exact name, glob, or bare layer name), in file order.

    No patterns selects everything. A pattern that selects nothing raises
    FormatError listing the names available.
    """
    if not patterns:
        return list(doc.entries)
    chosen = set()
    for pattern in patterns:
        hits = [i for i, e in enumerate(doc.entries) if _matches(e, pattern)]
        if not hits:
            names = ", ".join(doc.names()) or "none"
            raise FormatError(f"--blob {pattern!r} selects nothing; blobs: {names}", path=doc.path)
        chosen.update(hits)
    return [e for i, e in enumerate(doc.entries) if i in chosen]


def _matches(entry: Entry, pattern: str) -> bool:
    if entry.name == pattern or fnmatch.fnmatchcase(entry.name, pattern):
        return True
    return entry.layer is not None and entry.layer == pattern


# -- the library's entry points ------------------------------------------------------

def load(src) -> Blob:
    """Read the one blob of a BlobProto or .npy file (path, "-" or binary file object).

    The payload is not copied: the blob's data views the memory-mapped file
    (copy-on-write, so changing the blob never changes the file). Values come
    from double_data when it is non-empty (a float64 blob), else data.

    Raises
    ------
    BlobToolError
        FormatError naming the file, byte offset and field on bad input; for
        a container (net, solverstate, vector, npz), pointing to load_all.
    """
    doc = open_document(src)
    if doc.kind in ("blob", "npy"):
        return doc.entries[0].blob()
    raise FormatError(f"this is a {doc.kind} file holding {len(doc.entries)} blobs; "
                      "use blobtool.load_all() to read them", path=doc.path)


def load_all(src, kind: str | None = None) -> dict:
    """Every blob of any kind of file, as an ordered {name: Blob} dict (names as in the module doc)."""
    doc = open_document(src, kind)
    return {e.name: e.blob() for e in doc.entries}


# -- writing a container back ----------------------------------------------------------

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
    if doc.kind not in ("blob",) + CONTAINER_KINDS:
        raise UsageError(f"a {doc.kind} input cannot be written back as its own kind; "
                         "choose .npy, .npz or a blob file")
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
