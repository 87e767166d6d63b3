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

Other forks reuse the same numbers for other things (a ternary-quantization
Caffe writes ``repeated float ternary = 10 [packed]`` and fixed32 fields 12
and 13 beside its values in ``data``). BVLC Caffe reads such a file: the
fork's fields are unknown to it. So when Caffe's own payload (double_data or
data) holds the values, a fork field that does not decode as the fork
blobtool knows (half varints that end mid-value, a raw payload whose length
does not fit its type), or that decodes but is not where the values come
from, or a raw type field with no raw payload in use, is read as BVLC Caffe
reads it: an unknown field, kept byte for byte on rewrite and listed in
BlobRecord.kept_fork_fields (``info`` says so). Without Caffe's payload such
a field is the values, and one that does not decode is an error.

Reading: the four payload fields are located in the bytes and viewed in
place (a field split over several occurrences, or written unpacked, is
gathered into one new array: the only case that copies). Every other field
(the shape, the legacy dims, anything unknown) is handed to the protobuf
library, which applies proto2's rules (last scalar wins, messages merge,
unknown fields skipped).

Writing a blob back is blobwrite.py's, from the tables here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field as dc_field

import numpy as np

from . import wire
from ...engine.blob import LEGACY_FIELDS, MAX_BLOB_AXES, Blob, proto_shape
from ..origin import Origin, held_dtype
from .blobheader import (BLOB_FIELD_NAMES, SHAPE_FIELD, SimpleHeader, check_axes, count_dims, parse_errors,
                         parse_header, simple_header)
from ...errors import FormatError

__all__ = [
    "BLOB_FIELD_NAMES", "PAYLOAD_FIELDS", "TYPE_FIELDS", "BLOB_WIRE_PAIRS", "SHAPE_FIELD", "Payload", "BlobRecord",
    "Origin", "parse_blob", "blob_from_record", "PRECISIONS", "PRECISION_FIELDS", "RAW_TYPES", "RAW_TYPE_OF",
    "PAYLOAD_BY_NAME", "DIFF_OF", "parse_errors", "SimpleHeader",
]


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
# line here (and, if it is a new kind of bytes, a case in _Payloads.take).
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
PAYLOAD_BY_NAME = {p.name: p for p in PAYLOAD_FIELDS}
_DATA_ORDER = tuple(p.name for p in PAYLOAD_FIELDS if p.which == "data")
_DIFF_ORDER = tuple(p.name for p in PAYLOAD_FIELDS if p.which == "diff")
# The diff field written beside each data field (the table lists both sides in the same order).
DIFF_OF = dict(zip(_DATA_ORDER, _DIFF_ORDER))
_FLOAT32 = np.dtype(np.float32)
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
PRECISION_FIELDS = {"float": ("data", "diff"), "double": ("double_data", "double_diff"),
                     "half": ("raw_data", "raw_diff")}
PRECISIONS = tuple(PRECISION_FIELDS)
# The raw type each precision writes in raw_data/raw_diff.
RAW_TYPE_OF = {"half": RAW_TYPE_FLOAT16}

# Payload (number, wire type) pairs as numbers * 8 + wire type, for iter_runs' arrays.
_PAYLOAD_KEYS = np.array(sorted(n * 8 + t for n, t in _PAYLOAD_BY_WIRE))
_RAW_NUMBERS = np.array([p.number for p in PAYLOAD_FIELDS if p.encoding == "raw"])
_KNOWN_KEYS = np.array(sorted(n * 8 + t for n, t in BLOB_WIRE_PAIRS))
# After this many small fields in a row (shape, legacy dims, types, unknown
# fields: a BlobProto as written has a handful), the rest of the run is read
# in bulk (wire.iter_runs) rather than a Python call a field.
_BULK_AFTER = 16

# Occurrences a payload may be split over (a run of unpacked values counts once).
_MAX_PIECES = 1 << 12


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
    payloads: dict               # name -> Payload, for the payload fields present
    start: int
    end: int
    path: object = None
    field_offsets: dict = dc_field(default_factory=dict)  # number -> first offset, for errors
    unknown: bytes = b""         # the fields BlobProto does not hold, as they were
    kept_fork_fields: tuple = ()  # fork fields read as unknown ones (see the module docstring): (number, why)

    def __post_init__(self):
        # Caffe's FromProto order, extended with the forks' fields
        # (PAYLOAD_FIELDS): the first non-empty payload of each side wins.
        # Picked once: a net may hold tens of thousands of records.
        self._data = self._pick(_DATA_ORDER)
        self._diff = self._pick(_DIFF_ORDER)
        self._shape_layout = None

    @property
    def shape_layout(self) -> tuple[tuple[int, ...], str]:
        if self._shape_layout is None:
            dims = len(self.header.shape.dim)
            if dims > MAX_BLOB_AXES and not any(self.header.HasField(name) for name in LEGACY_FIELDS):
                # Refused here, before a tuple of a forged million axes is built.
                raise FormatError(f"field 7 (shape): invalid blob shape: a blob has at most {MAX_BLOB_AXES} "
                                  f"axes, got {dims}", path=self.path,
                                  offset=self.field_offsets.get(SHAPE_FIELD, self.start))
            self._shape_layout = proto_shape(self.header)
        return self._shape_layout

    @property
    def shape(self) -> tuple[int, ...]:
        return self.shape_layout[0]

    @property
    def layout(self) -> str:
        return self.shape_layout[1]

    def _pick(self, names) -> Payload | None:
        for name in names:
            payload = self.payloads.get(name)
            if payload is not None and payload.chunks and payload.count > 0:
                return payload
        return None

    @property
    def data_payload(self) -> Payload:
        """Where the values come from (an empty `data` payload when there are none)."""
        return self._data or Payload("data", PAYLOAD_BY_NAME["data"].dtype)

    @property
    def diff_payload(self) -> Payload | None:
        return self._diff

    @property
    def stored_dtype(self) -> np.dtype:
        """The element type in the file: float32, float64, or a fork's (float16, int32, uint32)."""
        if self._data is None:
            return _FLOAT32
        return self._data.dtype.newbyteorder("=")

    @property
    def stored_diff_dtype(self) -> np.dtype | None:
        """The diff's element type in the file, or None without a diff."""
        return self._diff.dtype.newbyteorder("=") if self._diff is not None else None

    @property
    def dtype(self) -> np.dtype:
        """The Blob's dtype: float64 for double or 32-bit integer values, else float32."""
        return held_dtype(self.stored_dtype)

    @property
    def diff_dtype(self) -> np.dtype:
        """The Blob's diff dtype: the data's, or float64 for a diff stored wider (float data, double_diff)."""
        stored = self.stored_diff_dtype
        return self.dtype if stored is None else held_dtype(stored, self.dtype)

    @property
    def suspicious(self) -> str | None:
        """Why this record looks wrong though it parses, or None."""
        if self._data is None and self._diff is not None:
            return ("has a diff but no data: a fork that renumbered BlobProto's fields "
                    "(such as C3D's) may have written it")
        return None

    @property
    def has_diff(self) -> bool:
        return self._diff is not None

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    @property
    def encoding(self) -> tuple:
        """How the values are stored: ((data field, raw type or None), the same for the diff, or None)."""
        data, diff = self._data, self._diff
        return ((data.name, data.raw_type) if data else ("data", None),
                (diff.name, diff.raw_type) if diff else None)

    @property
    def origin(self) -> Origin:
        diff = self.stored_diff_dtype
        return Origin(self.layout, self.stored_dtype, self.has_diff, self.encoding, self.unknown,
                      diff if diff is not None and diff != self.stored_dtype else None)


def parse_blob(buf, start: int = 0, end: int | None = None, *, path=None) -> BlobRecord:
    """Locate the BlobProto in buf[start:end]; no payload is copied or converted.

    Raises FormatError naming the byte offset and field on malformed input.
    """
    end = len(buf) if end is None else end
    found = _Payloads(path)
    small = _SmallFields()
    pos = start
    in_a_row = 0
    while pos < end:
        if in_a_row == _BULK_AFTER:
            pos = small.take_runs(buf, pos, end)
            in_a_row = 0
            if pos >= end:
                break
        f = wire.read_field(buf, pos, end, path=path, names=BLOB_FIELD_NAMES)
        pos = f.end
        if f.number in BLOB_FIELD_NAMES:
            small.field_offsets.setdefault(f.number, f.offset)
        spec = _PAYLOAD_BY_WIRE.get((f.number, f.wire_type))
        if spec is None:
            small.take(buf, f)
            in_a_row += 1
        elif spec.encoding != "raw" and f.wire_type == wire.LEN and f.end == f.start:
            in_a_row += 1  # an empty packed payload holds nothing: a small field
        else:
            in_a_row = 0
            pos = found.take(buf, f, spec, end)
    return found.record(buf, start, end, small)


class _Payloads:
    """What parse_blob gathers from a BlobProto's payload fields, by the kind of bytes each holds (its encoding)."""

    def __init__(self, path):
        self.path = path
        self.payloads = {}  # name -> Payload
        self.raw = {}       # raw payload name -> Field of its last occurrence (optional bytes: last wins)
        self.forks = []     # the forks' half payload fields, as found
        self.failed = []    # (Field, FormatError) for the forks' payload fields that do not decode
        self.halves = {}    # field number -> occurrences of a half payload met so far

    def take(self, buf, f, spec: PayloadField, end: int) -> int:
        """Take payload field `f` of `spec`; where reading goes on (past a run of unpacked values taken at once)."""
        pos = f.end
        if spec.encoding == "raw":
            self.raw[spec.name] = f  # typed once every field is read: its type field may come after it
        elif spec.encoding == "half":
            # ditcaffe's half_data: packed uint32 varints, each holding float16 bits.
            self.forks.append(f)
            label = wire.field_label(f.number, BLOB_FIELD_NAMES)
            self.halves[f.number] = self.halves.get(f.number, 0) + 1
            if self.halves[f.number] > _MAX_PIECES:
                # Counted whether or not they decode: each costs a record kept until the end.
                raise FormatError(f"{label} is split into more than {_MAX_PIECES} pieces (blobtool's limit)",
                                  path=self.path, offset=f.offset)
            try:
                values = wire.packed_uint16(buf, f, path=self.path, label=label, value_name="half_data value")
            except FormatError as exc:
                self.failed.append((f, exc))
                return pos
            self._add(spec, f, values.view("<f2"))
        elif f.wire_type == wire.LEN:
            nbytes = f.end - f.start
            if nbytes % spec.dtype.itemsize:
                raise FormatError(f"packed {spec.label} holds {nbytes} bytes, not a multiple of "
                                  f"{spec.dtype.itemsize}", path=self.path, offset=f.offset)
            self._add(spec, f, wire.view_array(buf, f.start, f.end, spec.dtype) if nbytes else None)
        else:
            # A run of unpacked values, gathered at once; its tag matched as written (a writer may pad it).
            tag = bytes(buf[f.offset:f.start])
            n = wire.unpacked_run(buf, f.offset, end, tag, spec.dtype.itemsize)
            self._add(spec, f, wire.unpacked_values(buf, f.offset, n, spec.dtype.itemsize, spec.dtype, len(tag)))
            pos = f.offset + n * (len(tag) + spec.dtype.itemsize)
        return pos

    def _add(self, spec: PayloadField, f, chunk) -> None:
        """One more piece of a payload (None: an empty packed field, which still makes the payload present)."""
        payload = self.payloads.setdefault(spec.name, Payload(spec.name, spec.dtype))
        if chunk is not None:
            payload.chunks.append(chunk)
        # Each piece costs an array object: a payload forged as millions of
        # one-value pieces would cost 20 times its bytes. Writers use one piece.
        if len(payload.chunks) > _MAX_PIECES:
            raise FormatError(f"{wire.field_label(f.number, BLOB_FIELD_NAMES)} is split into more than {_MAX_PIECES} "
                              "pieces (blobtool's limit)", path=self.path, offset=f.offset)
        if payload.offset is None:
            payload.offset = f.offset

    def record(self, buf, start: int, end: int, small) -> BlobRecord:
        """The BlobRecord: raw payloads typed, the shape's axes checked, the header parsed, forks' fields kept."""
        payloads, failed, path = self.payloads, self.failed, self.path
        field_offsets = small.field_offsets
        for name, f in self.raw.items():
            try:
                payloads[name] = _raw_payload(buf, PAYLOAD_BY_NAME[name], f, small.raw_types.get(name, 0), path)
            except FormatError as exc:
                failed.append((f, exc))
        if not any(n in field_offsets for n in range(1, len(LEGACY_FIELDS) + 1)):  # the shape comes from `shape`
            check_axes(buf, small.shapes, path, counted=small.counted_dims, first=small.first_counted)
        header = simple_header(buf, small.spans)
        if header is None:
            header = parse_header(buf, small.spans, path)
        kept, unknown = (), bytes(small.unknown)
        if failed or self.forks or self.raw or small.raw_types:
            kept, pairs = _keep_fork_fields(payloads, failed, self.forks + list(self.raw.values()), small.raw_types,
                                            header)
            if pairs:
                unknown = _unknown_bytes(buf, start, end, pairs)
        return BlobRecord(header, payloads, start, end, path, field_offsets, unknown, kept)


class _SmallFields:
    """What parse_blob gathers from a BlobProto's fields other than its payloads, one by one or in runs."""

    def __init__(self):
        self.spans = []             # (start, end) of the fields protobuf parses: all but the payloads
        self.unknown = bytearray()  # the fields BlobProto does not hold, copied (a span each would cost more)
        self.field_offsets = {}     # number -> where it first occurs, for errors
        self.raw_types = {}         # raw payload name -> the value of its type field (the last one)
        self.shapes = []            # (offset, start, end) of the shape fields read one by one, for check_axes
        self.counted_dims = 0       # the dims of those read in bulk, counted there
        self.first_counted = None   # where the first of those is

    def take(self, buf, f) -> None:
        """One field: the shape and legacy dims, a raw type, anything unknown, and known fields with an
        unexpected wire type (protobuf keeps those as unknown fields; so does blobtool)."""
        if f.number in TYPE_FIELDS and f.wire_type == wire.VARINT:
            self.raw_types[TYPE_FIELDS[f.number]] = f.value
            return
        wire.add_span(self.spans, f)
        if (f.number, f.wire_type) not in BLOB_WIRE_PAIRS:
            self.unknown += buf[f.offset:f.end]
        elif f.number == SHAPE_FIELD:
            self.shapes.append((f.offset, f.start, f.end))

    def take_runs(self, buf, pos: int, end: int) -> int:
        """Take the fields from `pos` in bulk up to the next payload (or a field left to read_field); its position."""
        for run in wire.iter_runs(buf, pos, end, _payload_stops):
            keys = run.numbers * 8 + run.wire_types
            wire.add_bytes(self.spans, run.start, run.end)
            known = np.isin(keys, _KNOWN_KEYS)
            if not known.all():
                self.unknown += _fields_bytes(buf, run, ~known)
            named = run.numbers <= max(BLOB_FIELD_NAMES)
            numbers, first = np.unique(run.numbers[named], return_index=True)
            for number, at in zip(numbers.tolist(), run.offsets[named][first].tolist()):
                self.field_offsets.setdefault(number, at)
            for number, name in TYPE_FIELDS.items():
                typed = np.flatnonzero((run.numbers == number) & (run.wire_types == wire.VARINT))
                if typed.size:  # the last one wins
                    self.raw_types[name] = wire.read_field(buf, int(run.offsets[typed[-1]]), end).value
            shapes = (run.numbers == SHAPE_FIELD) & (run.wire_types == wire.LEN)
            if shapes.any():
                dims = count_dims(buf, run.starts[shapes], run.ends[shapes])
                self.counted_dims += dims or 0  # None: not fields, which protobuf will say
                if self.first_counted is None:
                    self.first_counted = int(run.offsets[shapes][0])
            pos = run.end
        return pos


def _payload_stops(numbers, wire_types, starts, ends):
    """The fields parse_blob reads itself: payloads, but for empty packed ones (which hold nothing)."""
    payload = np.isin(numbers * 8 + wire_types, _PAYLOAD_KEYS)
    empty = (wire_types == wire.LEN) & (ends == starts) & ~np.isin(numbers, _RAW_NUMBERS)
    return payload & ~empty


def _fields_bytes(buf, run, chosen) -> bytes:
    """The bytes of the run's fields marked in `chosen`, in order."""
    data = np.frombuffer(buf, np.uint8, run.end - run.start, run.start)
    edges = np.zeros(data.size + 1, np.int32)
    edges[run.offsets[chosen] - run.start] += 1
    edges[run.ends[chosen] - run.start] -= 1
    return data[np.cumsum(edges[:-1]) > 0].tobytes()


def _keep_fork_fields(payloads: dict, failed: list, forks: list, raw_types: dict, header) -> tuple:
    """Read the forks' fields as BVLC Caffe does when its own payload holds the values.

    Returns (((number, why), ...), {(number, wire type)} to keep as unknown
    fields). Without double_data or data, the first fork field that did not
    decode is the error. With them, each fork payload that did not decode or
    is not the one its side takes values from, and each raw type field whose
    raw payload is not in use, becomes an unknown field kept as it was; the
    payloads they were read as are dropped.
    """
    standard = any(p.count > 0 for name, p in payloads.items() if PAYLOAD_BY_NAME[name].encoding == "packed"
                   and PAYLOAD_BY_NAME[name].which == "data")
    if not standard:
        if failed:
            raise min(failed, key=lambda item: item[0].offset)[1]
        return (), set()
    why = {f.offset: exc.reason.split(": ", 1)[-1] for f, exc in failed}
    for f, _ in failed:  # a payload with an occurrence that did not decode is not in use
        payloads.pop(_PAYLOAD_BY_WIRE[(f.number, f.wire_type)].name, None)
    diff = _pick_from(payloads, _DIFF_ORDER)
    count = _shape_count(header)
    if diff is not None and PAYLOAD_BY_NAME[diff].encoding != "packed" and count is not None \
            and payloads[diff].count != count:
        # A fork's diff beside Caffe's data that does not fit the shape is another fork's field.
        reason = f"holds {payloads[diff].count} values as {diff}, the shape {count}"
        why.update({f.offset: reason for f in forks if _PAYLOAD_BY_WIRE[(f.number, f.wire_type)].name == diff})
        payloads.pop(diff)
        diff = _pick_from(payloads, _DIFF_ORDER)
    used = {_pick_from(payloads, _DATA_ORDER), diff}
    kept, pairs = [], set()
    for f in sorted(forks + [f for f, _ in failed if f not in forks], key=lambda f: f.offset):
        spec = _PAYLOAD_BY_WIRE[(f.number, f.wire_type)]
        if spec.name in used:
            continue
        pairs.add((f.number, f.wire_type))
        payloads.pop(spec.name, None)
        kept.append((f.number, why.get(f.offset, f"not read as {spec.name}: the values are in Caffe's own fields")))
    for name in raw_types:
        if name not in used:
            number = PAYLOAD_BY_NAME[name].type_field
            pairs.add((number, wire.VARINT))
            kept.append((number, f"{name}_type without {name} in use"))
    # One entry per field number (its first reason), in number order.
    return tuple(sorted(dict(reversed(kept)).items())), pairs


def _unknown_bytes(buf, start: int, end: int, kept: set) -> bytes:
    """The fields of the BlobProto in buf[start:end] that BlobProto does not hold, or whose (number, wire type)
    is in `kept`, in file order (parse_blob has read it once: nothing here is damaged)."""
    keys = np.array(sorted(n * 8 + t for n, t in BLOB_WIRE_PAIRS - kept))
    out = bytearray()
    pos = start
    while pos < end:
        for run in wire.iter_runs(buf, pos, end):
            other = ~np.isin(run.numbers * 8 + run.wire_types, keys)
            if other.any():
                out += _fields_bytes(buf, run, other)
            pos = run.end
        if pos < end:  # a field bulk indexing leaves (one longer than its window: a payload)
            f = wire.read_field(buf, pos, end)
            if (f.number, f.wire_type) not in BLOB_WIRE_PAIRS - kept:
                out += buf[f.offset:f.end]
            pos = f.end
    return bytes(out)


def _shape_count(header) -> int | None:
    """The count of the shape a header gives, or None when it gives none that is valid (reported later)."""
    try:
        return math.prod(proto_shape(header)[0])
    except FormatError:
        return None


def _pick_from(payloads: dict, names) -> str | None:
    for name in names:
        payload = payloads.get(name)
        if payload is not None and payload.count > 0:
            return name
    return None


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


def blob_from_record(record: BlobRecord) -> Blob:
    """Build a Blob from a located BlobProto with Caffe's FromProto rules, adopting the payload views.

    float32/float64 payloads are adopted without a copy; a fork's float16 or
    integer payloads are converted (float32 or float64) into new memory. Each
    side is held in the type that holds its stored values exactly, so a
    double_diff beside float data stays float64 (Blob.diff_dtype).
    """
    blob = Blob(dtype=record.dtype, diff_dtype=record.diff_dtype)
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
                label, offset = PAYLOAD_BY_NAME[where.name].label, where.offset
            else:
                label, offset = "no data", record.start
        raise FormatError(f"{label}: {exc.reason}", path=record.path, offset=offset) from exc
    blob.origin = record.origin
    return blob
