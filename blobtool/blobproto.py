"""BlobProto in bytes: find a blob's shape and payloads, and write one back.

Caffe's BlobProto (field numbers are Caffe's; see proto/blobtool_caffe.proto):

=====  ===========  ================  =====================================
field  name         type              blobtool reads it as
=====  ===========  ================  =====================================
1-4    num, channels, height, width   int32, legacy 4-D shape
5      data         packed float      zero-copy float32 view
6      diff         packed float      zero-copy float32 view
7      shape        BlobShape         BlobShape.dim = 1, packed int64
8      double_data  packed double     zero-copy float64 view
9      double_diff  packed double     zero-copy float64 view
=====  ===========  ================  =====================================

Caffe's forks add fields blobtool reads too (it writes them only when asked):

=====  ===============  =========================================================
10     raw_data_type    NVIDIA Caffe: enum DOUBLE 0, FLOAT 1, FLOAT16 2, INT 3,
                        UINT 4 (varint, wire type 0)
10     half_data        NVDLA's ditcaffe: packed uint32 each holding float16 bits
                        (wire type 2; the wire type tells the two apart)
11     raw_diff_type    NVIDIA Caffe (varint); ditcaffe's half_diff when packed
12     raw_data         NVIDIA Caffe: bytes, little-endian values of raw_data_type
13     raw_diff         NVIDIA Caffe: bytes, typed by raw_diff_type
=====  ===============  =========================================================

Values come from double_data when it is non-empty, else data, else raw_data
(by its type), else half_data: Caffe's precedence, extended.

Reading: the four payload fields are located in the bytes and viewed in
place (a field split over several occurrences, or written unpacked, is
gathered into one new array: the only case that copies). Every other field
(the shape, the legacy dims, anything unknown) is handed to the protobuf
library, which applies proto2's rules (last scalar wins, messages merge,
unknown fields skipped).

Writing: the small fields go through protobuf; each payload is written as
tag, length and raw little-endian bytes, in field-number order, so the bytes
equal what protobuf's SerializeToString gives for the same message. With no
precision asked for, each side keeps the field it was read from (a raw INT
stays a raw INT, ditcaffe's half_data stays half_data), and the fields
blobtool does not know are written after the known ones, byte for byte (as
protobuf writes unknown fields): a BlobProto that protobuf wrote comes back
as it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field as dc_field

import numpy as np

from . import wire
from .blob import LEGACY_FIELDS, MAX_BLOB_AXES, Blob, Origin, exact_values, proto_shape
from .errors import FormatError, UsageError
from .progress import report
from .source import release_pages

__all__ = [
    "BLOB_FIELD_NAMES", "PAYLOAD_FIELDS", "TYPE_FIELDS", "BLOB_WIRE_PAIRS", "Payload", "BlobRecord", "Origin",
    "parse_blob", "blob_from_record", "encode_blob_parts", "check_layout", "resolve_form", "write_parts", "write_blob",
    "blob_encoded_size", "PRECISIONS", "RAW_TYPES", "parse_errors",
]

BLOB_FIELD_NAMES = {1: "num", 2: "channels", 3: "height", 4: "width", 5: "data", 6: "diff",
                    7: "shape", 8: "double_data", 9: "double_diff", 10: "raw_data_type/half_data",
                    11: "raw_diff_type/half_diff", 12: "raw_data", 13: "raw_diff"}
SHAPE_FIELD = 7

# NVIDIA Caffe's BlobProto.Type, the element type of raw_data / raw_diff.
RAW_TYPES = {0: np.dtype("<f8"), 1: np.dtype("<f4"), 2: np.dtype("<f2"), 3: np.dtype("<i4"), 4: np.dtype("<u4")}
RAW_TYPE_FLOAT16 = 2


@dataclass(frozen=True)
class PayloadField:
    """One field that can hold a blob's values.

    `encoding` says how its bytes hold them:

    - "packed": little-endian values of `dtype`, packed in one LEN field or
      unpacked as one `unpacked_wire_type` field per value (Caffe's own);
    - "raw": a bytes field of little-endian values whose type is the enum in
      field `type_field` (NVIDIA Caffe);
    - "half": packed uint32 varints each holding float16 bits (ditcaffe).
    """

    number: int
    name: str
    which: str                  # "data" or "diff"
    encoding: str
    dtype: np.dtype | None = None
    unpacked_wire_type: int | None = None
    type_field: int | None = None

    @property
    def label(self) -> str:
        return f"field {self.number} ({self.name})"


# Every payload field, in the order FromProto takes values from (the first
# non-empty one of a side wins): Caffe's double_data, then data, then the
# forks' raw_data (by its type) and half_data. Adding a fork's encoding is a
# line here (and, if it is a new kind of bytes, a case in parse_blob).
PAYLOAD_FIELDS = (
    PayloadField(8, "double_data", "data", "packed", np.dtype("<f8"), wire.I64),
    PayloadField(5, "data", "data", "packed", np.dtype("<f4"), wire.I32),
    PayloadField(12, "raw_data", "data", "raw", type_field=10),
    PayloadField(10, "half_data", "data", "half", np.dtype("<f2")),
    PayloadField(9, "double_diff", "diff", "packed", np.dtype("<f8"), wire.I64),
    PayloadField(6, "diff", "diff", "packed", np.dtype("<f4"), wire.I32),
    PayloadField(13, "raw_diff", "diff", "raw", type_field=11),
    PayloadField(11, "half_diff", "diff", "half", np.dtype("<f2")),
)
_BY_NAME = {p.name: p for p in PAYLOAD_FIELDS}
_DATA_ORDER = tuple(p.name for p in PAYLOAD_FIELDS if p.which == "data")
_DIFF_ORDER = tuple(p.name for p in PAYLOAD_FIELDS if p.which == "diff")
# The diff field written beside each data field (the table lists both sides in the same order).
_DIFF_OF = dict(zip(_DATA_ORDER, _DIFF_ORDER))
# Payloads by (field number, wire type); fields 10 and 11 are ditcaffe's
# half payloads when length-delimited and NVIDIA's type enums when varints.
_PAYLOAD_BY_WIRE = {(p.number, wire_type): p for p in PAYLOAD_FIELDS
                    for wire_type in (wire.LEN, p.unpacked_wire_type) if wire_type is not None}
# The enum fields typing the raw payloads: number -> the payload they type.
TYPE_FIELDS = {p.type_field: p.name for p in PAYLOAD_FIELDS if p.type_field is not None}

# Every (field number, wire type) a BlobProto's top level may hold (for
# telling a BlobProto from other messages by its fields).
BLOB_WIRE_PAIRS = frozenset({(n, wire.VARINT) for n in range(1, len(LEGACY_FIELDS) + 1)}
                            | {(SHAPE_FIELD, wire.LEN)} | set(_PAYLOAD_BY_WIRE)
                            | {(n, wire.VARINT) for n in TYPE_FIELDS})

# The fields each precision writes, data then diff: Caffe's data or
# double_data, or NVIDIA Caffe's raw FLOAT16 (which only NVIDIA Caffe and
# OpenCV read).
_PRECISION_FIELDS = {"float": ("data", "diff"), "double": ("double_data", "double_diff"),
                     "half": ("raw_data", "raw_diff")}
PRECISIONS = tuple(_PRECISION_FIELDS)
# The raw type each precision writes in raw_data/raw_diff.
_RAW_TYPE_OF = {"half": RAW_TYPE_FLOAT16}

# Occurrences a payload may be split over (a run of unpacked values counts once).
_MAX_PIECES = 1 << 12

# Payloads at least this large are written straight from the array; smaller
# conversions (float32 <-> float64) go through buffers of this many elements
# so that converting never doubles the memory of a large blob.
_WRITE_CHUNK = 1 << 20


@dataclass
class Payload:
    """The values of one payload field, as one or more arrays in file order."""

    name: str
    dtype: np.dtype
    chunks: list = dc_field(default_factory=list)
    offset: int | None = None  # where its first occurrence starts
    raw_type: int | None = None  # a raw payload's BlobProto.Type

    @property
    def count(self) -> int:
        return sum(c.size for c in self.chunks)

    def array(self) -> np.ndarray:
        """All values as one array: a view when stored in one piece, else a concatenated copy."""
        if not self.chunks:
            return np.zeros(0, dtype=self.dtype)
        if len(self.chunks) == 1:
            return self.chunks[0]
        return np.concatenate(self.chunks)


@dataclass
class BlobRecord:
    """A BlobProto located in a buffer: its small fields parsed, its payloads viewed."""

    header: object               # the small fields: a BlobProto message without payloads, or a SimpleHeader
    payloads: dict               # name -> Payload
    start: int
    end: int
    path: object = None
    field_offsets: dict = dc_field(default_factory=dict)  # number -> first offset, for errors
    unknown: bytes = b""         # the fields BlobProto does not hold, as they were

    @property
    def shape_layout(self) -> tuple[tuple[int, ...], str]:
        dims = len(self.header.shape.dim)
        if dims > MAX_BLOB_AXES and not any(self.header.HasField(name) for name in LEGACY_FIELDS):
            # Refused here, before a tuple of a forged million axes is built.
            raise FormatError(f"field 7 (shape): invalid blob shape: a blob has at most {MAX_BLOB_AXES} axes, "
                              f"got {dims}", path=self.path, offset=self.field_offsets.get(SHAPE_FIELD, self.start))
        return proto_shape(self.header)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.shape_layout[0]

    @property
    def layout(self) -> str:
        return self.shape_layout[1]

    def _pick(self, names) -> Payload | None:
        # Caffe's FromProto order, extended with the forks' fields
        # (PAYLOAD_FIELDS): the first non-empty payload wins.
        for name in names:
            payload = self.payloads.get(name)
            if payload is not None and payload.count > 0:
                return payload
        return None

    @property
    def data_payload(self) -> Payload:
        """Where the values come from (an empty `data` payload when there are none)."""
        return self._pick(_DATA_ORDER) or self.payloads["data"]

    @property
    def diff_payload(self) -> Payload | None:
        return self._pick(_DIFF_ORDER)

    @property
    def stored_dtype(self) -> np.dtype:
        """The element type in the file: float32, float64, or a fork's (float16, int32, uint32)."""
        payload = self._pick(_DATA_ORDER)
        if payload is None:
            return np.dtype(np.float32)
        return payload.dtype.newbyteorder("=")

    @property
    def dtype(self) -> np.dtype:
        """The Blob's dtype: float64 for double or 32-bit integer values, else float32."""
        stored = self.stored_dtype
        return np.dtype(np.float64) if stored.itemsize >= 4 and stored != np.float32 else np.dtype(np.float32)

    @property
    def suspicious(self) -> str | None:
        """Why this record looks wrong though it parses, or None."""
        if self._pick(_DATA_ORDER) is None and self.has_diff:
            return ("has a diff but no data: a fork that renumbered BlobProto's fields "
                    "(such as C3D's) may have written it")
        return None

    @property
    def has_diff(self) -> bool:
        return self.diff_payload is not None

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    @property
    def encoding(self) -> tuple:
        """How the values are stored: ((data field, raw type or None), the same for the diff, or None)."""
        data, diff = self._pick(_DATA_ORDER), self.diff_payload
        return ((data.name, data.raw_type) if data else ("data", None),
                (diff.name, diff.raw_type) if diff else None)

    @property
    def origin(self) -> Origin:
        return Origin(self.layout, self.stored_dtype, self.has_diff, self.encoding, self.unknown)


def _new_header():
    from ._pb.blobtool_caffe_pb2 import BlobProto
    return BlobProto()


class _Dims:
    __slots__ = ("dim",)

    def __init__(self, dims: list):
        self.dim = dims


class SimpleHeader:
    """A BlobProto's shape fields decoded without protobuf, for the forms writers use.

    Holds what proto_shape reads: ``shape.dim`` and num/channels/height/width
    with HasField. parse_blob builds one when the small fields are only
    `shape` (dims packed or not) and the legacy four as varints; anything
    else (other fields, other wire types, damage) goes to protobuf. Loading
    protobuf costs about 11 ms here, which a `blobtool norm` of a plain blob
    file then does without (benchmarks/RESULTS.md); tests/test_codec.py
    checks that both read the same shape.
    """

    __slots__ = ("shape", "_legacy")

    def __init__(self, dims: list, legacy: dict):
        self.shape = _Dims(dims)
        self._legacy = legacy

    def HasField(self, name: str) -> bool:  # noqa: N802 (protobuf's name)
        return name in self._legacy

    def __getattr__(self, name: str) -> int:
        if name in LEGACY_FIELDS:
            return self._legacy.get(name, 0)
        raise AttributeError(name)


# Packed dims longer than this are left to protobuf (32 axes of 10-byte varints).
_MAX_SIMPLE_DIMS_BYTES = MAX_BLOB_AXES * wire.MAX_VARINT_BYTES


def _signed(value: int, bits: int) -> int:
    """A varint's value as protobuf reads it into an int32/int64 field (low bits, two's complement)."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _simple_header(buf, spans) -> SimpleHeader | None:
    """The header's shape fields when they take the common forms, else None (protobuf decides)."""
    dims = []
    legacy = {}
    try:
        for f in (f for a, b in spans for f in wire.iter_fields(buf, a, b)):
            if 1 <= f.number <= 4 and f.wire_type == wire.VARINT:
                legacy[LEGACY_FIELDS[f.number - 1]] = _signed(f.value, 32)  # the last one wins
            elif f.number == SHAPE_FIELD and f.wire_type == wire.LEN:
                for g in wire.iter_fields(buf, f.start, f.end):  # occurrences merge: dims append
                    if g.number == 1 and g.wire_type == wire.VARINT:
                        dims.append(_signed(g.value, 64))
                    elif g.number == 1 and g.wire_type == wire.LEN and g.end - g.start <= _MAX_SIMPLE_DIMS_BYTES:
                        pos = g.start
                        while pos < g.end:
                            value, pos = wire.read_varint(buf, pos, g.end)
                            dims.append(_signed(value, 64))
                    else:
                        return None
            else:
                return None
    except FormatError:
        return None
    return SimpleHeader(dims, legacy)


def parse_blob(buf, start: int = 0, end: int | None = None, *, path=None) -> BlobRecord:
    """Locate the BlobProto in buf[start:end]; no payload is copied or converted.

    Raises FormatError naming the byte offset and field on malformed input.
    """
    end = len(buf) if end is None else end
    payloads = {p.name: Payload(p.name, p.dtype) for p in PAYLOAD_FIELDS if p.encoding == "packed"}
    raw = {}          # raw payload name -> Field of its last occurrence (optional bytes: last wins)
    raw_types = {}    # raw payload name -> enum value of its type field
    header_spans = []
    unknown = bytearray()  # the fields BlobProto does not hold, copied (a span each would cost more)
    field_offsets = {}
    pos = start
    while pos < end:
        f = wire.read_field(buf, pos, end, path=path, names=BLOB_FIELD_NAMES)
        pos = f.end
        if f.number in BLOB_FIELD_NAMES:
            field_offsets.setdefault(f.number, f.offset)
        spec = _PAYLOAD_BY_WIRE.get((f.number, f.wire_type))
        if spec is None:
            if f.number in TYPE_FIELDS and f.wire_type == wire.VARINT:
                raw_types[TYPE_FIELDS[f.number]] = f.value
            else:
                # The shape and legacy dims, anything unknown, and known
                # fields with an unexpected wire type (protobuf keeps those
                # as unknown fields; so does blobtool).
                wire.add_span(header_spans, f)
                if (f.number, f.wire_type) not in BLOB_WIRE_PAIRS:
                    unknown += buf[f.offset:f.end]
            continue
        if spec.encoding == "raw":
            raw[spec.name] = f
            continue
        payload = payloads.setdefault(spec.name, Payload(spec.name, spec.dtype))
        if spec.encoding == "half":
            # ditcaffe's half_data: packed uint32 varints, each holding float16 bits.
            label = wire.field_label(f.number, BLOB_FIELD_NAMES)
            payload.chunks.append(wire.packed_uint16(buf, f, path=path, label=label,
                                                     value_name="half_data value").view("<f2"))
        elif f.wire_type == wire.LEN:
            nbytes = f.end - f.start
            if nbytes % spec.dtype.itemsize:
                raise FormatError(f"packed {spec.label} holds {nbytes} bytes, not a multiple of "
                                  f"{spec.dtype.itemsize}", path=path, offset=f.offset)
            if nbytes:
                payload.chunks.append(wire.view_array(buf, f.start, f.end, spec.dtype))
        else:
            # A run of unpacked values: gather it at once rather than field by field.
            # The tag is matched as written (a writer may pad it past one byte).
            tag = bytes(buf[f.offset:f.start])
            n = wire.unpacked_run(buf, f.offset, end, tag, spec.dtype.itemsize)
            payload.chunks.append(wire.unpacked_values(buf, f.offset, n, spec.dtype.itemsize, spec.dtype, len(tag)))
            pos = f.offset + n * (len(tag) + spec.dtype.itemsize)
        _check_pieces(payload, f, path)
        if payload.offset is None:
            payload.offset = f.offset
    for name, f in raw.items():
        payloads[name] = _raw_payload(buf, _BY_NAME[name], f, raw_types.get(name, 0), path)
    if not any(n in field_offsets for n in range(1, len(LEGACY_FIELDS) + 1)):  # the shape comes from `shape`
        _check_axes(buf, header_spans, path)
    header = _simple_header(buf, header_spans)
    if header is None:
        header = _parse_header(buf, header_spans, path)
    return BlobRecord(header, payloads, start, end, path, field_offsets, bytes(unknown))


def _check_axes(buf, spans, path) -> None:
    """Refuse a `shape` of more than MAX_BLOB_AXES dims before protobuf builds their list."""
    axes = 0
    first = None
    for f in (f for a, b in spans for f in wire.iter_fields(buf, a, b)):
        if f.number != SHAPE_FIELD:
            continue
        first = f.offset if first is None else first
        try:
            for g in wire.iter_fields(buf, f.start, f.end):
                if g.number == 1 and g.wire_type == wire.LEN:  # packed: a value ends at each byte < 0x80
                    axes += int(np.count_nonzero(np.frombuffer(buf, np.uint8, g.end - g.start, g.start) < 0x80))
                elif g.number == 1 and g.wire_type == wire.VARINT:
                    axes += 1
        except FormatError:
            return  # protobuf will say what is wrong with it
    if axes > MAX_BLOB_AXES:
        raise FormatError(f"field 7 (shape): invalid blob shape: a blob has at most {MAX_BLOB_AXES} axes, "
                          f"got {axes}", path=path, offset=first)


def _check_pieces(payload: Payload, f, path) -> None:
    # Each piece costs an array object: a payload forged as millions of
    # one-value pieces would cost 20 times its bytes. Writers use one piece.
    if len(payload.chunks) > _MAX_PIECES:
        raise FormatError(f"{wire.field_label(f.number, BLOB_FIELD_NAMES)} is split into more than {_MAX_PIECES} "
                          "pieces (blobtool's limit)", path=path, offset=f.offset)


def _raw_payload(buf, spec: PayloadField, f, type_value: int, path) -> Payload:
    dtype = RAW_TYPES.get(type_value)
    if dtype is None:
        raise FormatError(f"{spec.name}_type is {type_value}; expected 0-4 (DOUBLE, FLOAT, FLOAT16, INT, UINT)",
                          path=path, offset=f.offset)
    nbytes = f.end - f.start
    if nbytes % dtype.itemsize:
        raise FormatError(f"{spec.label} holds {nbytes} bytes, not a multiple of {dtype.itemsize} ({dtype.name})",
                          path=path, offset=f.offset)
    chunks = [wire.view_array(buf, f.start, f.end, dtype)] if nbytes else []
    return Payload(spec.name, dtype, chunks, f.offset, type_value)


def parse_errors() -> tuple:
    """What protobuf's ParseFromString raises on bad bytes.

    DecodeError; and the pure-Python runtime (protobuf 3.20 where no compiled
    one exists) raises UnicodeDecodeError for a string that is not UTF-8 and
    RecursionError for groups nested past Python's recursion limit.
    """
    from google.protobuf.message import DecodeError
    return (DecodeError, UnicodeDecodeError, RecursionError)


# BlobProto.shape: a nested message whose tags minimal_tags rewrites too.
_NESTED_FIELDS = frozenset({SHAPE_FIELD})


def _parse_header(buf, spans, path):
    header = _new_header()
    raw = b"".join(wire.minimal_tags(buf, a, b, _NESTED_FIELDS) for a, b in spans)
    try:
        header.ParseFromString(raw)
    except parse_errors() as exc:
        # Find the field protobuf refused, to say where it is.
        for f in (f for a, b in spans for f in wire.iter_fields(buf, a, b)):
            try:
                _new_header().ParseFromString(bytes(buf[f.offset:f.end]))
            except parse_errors():
                raise FormatError(f"{wire.field_label(f.number, BLOB_FIELD_NAMES)}: invalid contents ({exc})",
                                  path=path, offset=f.offset) from exc
        raise FormatError(f"invalid BlobProto fields ({exc})", path=path, offset=spans[0][0] if spans else 0) from exc
    return header


def blob_from_record(record: BlobRecord) -> Blob:
    """Build a Blob from a located BlobProto with Caffe's FromProto rules, adopting the payload views.

    float32/float64 payloads are adopted without a copy; a fork's float16 or
    integer payloads are converted (float32 or float64) into new memory.
    """
    blob = Blob(dtype=record.dtype)
    data = record.data_payload
    diff = record.diff_payload
    if record.suspicious and record.count:
        raise FormatError(f"blob {record.suspicious}", path=record.path, offset=record.start)
    shape, layout = record.shape_layout
    try:
        blob.fill_from(shape, data.array(), diff.array() if diff else None, adopt=True)
    except FormatError as exc:
        # Name the field at fault: the shape when the reshape failed, else the
        # payload whose count differs from the shape's.
        if blob.shape != shape:
            number = SHAPE_FIELD
            if layout == "legacy":
                number = 1 + next((axis for axis, d in enumerate(shape) if d < 0), 0)
            label = wire.field_label(number, BLOB_FIELD_NAMES)
            offset = record.field_offsets.get(number, record.start)
        else:
            where = data if data.count != blob.count else diff
            if where is not None and where.count:
                label, offset = _BY_NAME[where.name].label, where.offset
            else:
                label, offset = "no data", record.start
        raise FormatError(f"{label}: {exc.reason}", path=record.path, offset=offset) from exc
    blob.origin = record.origin
    return blob


def encode_blob_parts(blob: Blob, *, precision="float", write_diff: bool = False,
                      layout: str = "shape", transforms: dict | None = None, unknown: bytes = b""):
    """The pieces of a BlobProto for `blob`, in field-number order, then `unknown` (fields kept as they were).

    Returns a list whose items are bytes (headers, small fields) or
    (array, target dtype) pairs for payloads, so callers can stream them.
    `precision` is "float" (data/diff), "double" (double_data/double_diff),
    "half" (NVIDIA Caffe's raw_data/raw_diff typed FLOAT16), or a stored
    encoding (Origin.encoding: each side's field and raw type) to write the
    blob as it was read.

    `transforms` may map "data"/"diff" to ``fn(chunk, start) -> array``,
    applied chunk by chunk as the payload is written (how the command line
    streams scale and update through files larger than memory).
    """
    transforms = transforms or {}
    if layout not in ("shape", "legacy"):
        raise UsageError(f"layout must be 'shape' or 'legacy', got {layout!r}")
    sides = _side_encodings(precision)
    from ._pb.blobtool_caffe_pb2 import BlobProto

    # (field number, piece) pairs, sorted by number at the end: protobuf's
    # SerializeToString writes fields in that order, and so does blobtool.
    fields = []
    legacy = BlobProto()
    check_layout(blob, layout)
    if layout == "legacy":
        for index, name in zip((-4, -3, -2, -1), LEGACY_FIELDS):
            setattr(legacy, name, blob.legacy_shape(index))
        fields.append((1, legacy.SerializeToString()))
    elif blob.shape:
        # As Caffe's ToProto: a scalar (0-axis) blob gets no shape field at all
        # (extend() with no dims would still mark `shape` present).
        shape = BlobProto()
        shape.shape.dim.extend(blob.shape)
        fields.append((SHAPE_FIELD, shape.SerializeToString()))
    for which, values in (("data", blob.cpu_data), ("diff", blob.cpu_diff))[:2 if write_diff else 1]:
        name, raw_type = sides[which == "diff"]
        spec = _BY_NAME[name]
        values = values()
        if spec.encoding == "raw":
            target = RAW_TYPES[raw_type]
            fields.append((spec.type_field, wire.encode_tag(spec.type_field, wire.VARINT)
                           + wire.encode_varint(raw_type)))
        elif not values.size:
            continue  # an empty repeated field is not written; NVIDIA Caffe writes raw_data even when empty
        elif spec.encoding == "half":
            # ditcaffe's varints: their length depends on the values, so the
            # payload is made whole (ditcaffe's blobs are small).
            payload = _half_payload(values, transforms.get(which))
            fields.append((spec.number, wire.len_field_header(spec.number, len(payload))))
            fields.append((spec.number, payload))
            continue
        else:
            target = spec.dtype
        fields.append((spec.number, wire.len_field_header(spec.number, values.size * target.itemsize)))
        fields.append((spec.number, (values, target, transforms.get(which))))
    fields.sort(key=lambda item: item[0])  # stable: each payload's header stays before its values
    return [piece for _, piece in fields] + ([bytes(unknown)] if unknown else [])


def _side_encodings(precision) -> tuple:
    """((field, raw type), (field, raw type)) for data and diff: from a precision's name or a stored encoding."""
    if isinstance(precision, tuple):
        data, diff = precision
        if data[0] not in _DIFF_OF or (diff is not None and diff[0] not in _DIFF_OF.values()):
            raise UsageError(f"unknown stored encoding {precision!r}")
        return data, diff if diff is not None else (_DIFF_OF[data[0]], data[1])
    if precision not in PRECISIONS:
        raise UsageError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    raw_type = _RAW_TYPE_OF.get(precision)
    return tuple((name, raw_type) for name in _PRECISION_FIELDS[precision])


def _half_payload(values: np.ndarray, transform) -> bytes:
    """ditcaffe's half_data bytes for `values` (after `transform`): packed varints of float16 bits."""
    values = values.reshape(-1)
    if transform is not None:
        values = np.concatenate([transform(values[a:a + _WRITE_CHUNK], a)
                                 for a in range(0, values.size, _WRITE_CHUNK)])
    with np.errstate(over="ignore", invalid="ignore"):  # as the FLOAT16 raw form: past float16's range is inf
        bits = values.astype("<f2").view("<u2")
    report(values.nbytes)
    return wire.encode_packed_uint16(bits)


def check_layout(blob: Blob, layout: str | None) -> None:
    """Refuse the legacy layout (num/channels/height/width) for a blob of more than 4 axes."""
    if layout == "legacy" and blob.num_axes > 4:
        raise UsageError(f"the legacy layout holds at most 4 axes; this blob has {blob.num_axes}")


def resolve_form(blob: Blob, *, precision: str | None = None, write_diff: bool | None = None,
                 layout: str | None = None) -> dict:
    """Fill the Nones in a write request from what the blob came with.

    A blob made in Python writes as its dtype, in the `shape` layout, without
    diff (Caffe's ToProto defaults). A loaded blob keeps its stored encoding
    (each side's field and raw type), layout, diff and unknown fields; a
    legacy blob grown past 4 axes falls back to `shape`.
    """
    origin = blob.origin
    if precision is None:
        if origin is not None and origin.encoding:
            precision = origin.encoding
        else:
            precision = origin.precision if origin else ("double" if blob.dtype == np.float64 else "float")
    if write_diff is None:
        write_diff = bool(origin.has_diff) if origin else False
    if layout is None:
        layout = origin.layout if origin else "shape"
        if layout == "legacy" and blob.num_axes > 4:
            layout = "shape"
    return {"precision": precision, "write_diff": write_diff, "layout": layout,
            "unknown": origin.unknown if origin else b""}


def blob_encoded_size(parts) -> int:
    """Bytes that `parts` (from encode_blob_parts) take when written."""
    return sum(p[0].size * p[1].itemsize if isinstance(p, tuple) else len(p) for p in parts)


def write_parts(out, parts) -> None:
    """Write encode_blob_parts' pieces to a binary file object, chunk by chunk.

    Payloads are written in chunks of _WRITE_CHUNK elements: converted to the
    target dtype, passed through the part's transform if it has one, and the
    input pages behind each written chunk are released (source.release_pages),
    so memory stays bounded whatever the file size.
    """
    for part in parts:
        if not isinstance(part, tuple):  # bytes, or a memoryview of the input
            out.write(part)
            continue
        values, target = part[0].reshape(-1), part[1]
        transform = part[2] if len(part) > 2 else None
        # Doubles past float32's range become infinities, as Caffe's cast
        # makes them; numpy's warning about it would break the one-line stderr.
        with np.errstate(over="ignore", invalid="ignore"):
            for start in range(0, values.size, _WRITE_CHUNK):
                chunk = values[start:start + _WRITE_CHUNK]
                data = chunk if transform is None else transform(chunk, start)
                if target.kind in "iu":
                    data = exact_values(data, target)
                elif data.dtype != target:
                    data = data.astype(target)
                out.write(memoryview(np.ascontiguousarray(data)).cast("B"))
                report(chunk.nbytes)
                release_pages(chunk)


def write_blob(out, blob: Blob, *, precision="float", write_diff: bool = False,
               layout: str = "shape", transforms: dict | None = None, unknown: bytes = b"") -> None:
    """Write `blob` as one BlobProto to the binary file object `out` (see encode_blob_parts)."""
    write_parts(out, encode_blob_parts(blob, precision=precision, write_diff=write_diff, layout=layout,
                                       transforms=transforms, unknown=unknown))
