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

Reading: the four payload fields are located in the bytes and viewed in
place (a field split over several occurrences, or written unpacked, is
gathered into one new array: the only case that copies). Every other field
(the shape, the legacy dims, anything unknown) is handed to the protobuf
library, which applies proto2's rules (last scalar wins, messages merge,
unknown fields skipped).

Writing: the small fields go through protobuf; each payload is written as
tag, length and raw little-endian bytes, in field-number order, so the bytes
equal what protobuf's SerializeToString gives for the same message.
"""

from __future__ import annotations

from dataclasses import dataclass, field as dc_field

import numpy as np

from . import wire
from .blob import LEGACY_FIELDS, Blob, proto_shape
from .errors import FormatError, UsageError

__all__ = [
    "BLOB_FIELD_NAMES", "Payload", "BlobRecord", "Origin", "parse_blob", "blob_from_record",
    "encode_blob_parts", "write_parts", "write_blob", "blob_encoded_size",
]

BLOB_FIELD_NAMES = {1: "num", 2: "channels", 3: "height", 4: "width", 5: "data", 6: "diff",
                    7: "shape", 8: "double_data", 9: "double_diff"}


@dataclass(frozen=True)
class _PayloadSpec:
    name: str
    dtype: np.dtype
    unpacked_wire_type: int
    unpacked_tag: bytes


_PAYLOADS = {
    5: _PayloadSpec("data", np.dtype("<f4"), wire.I32, wire.encode_tag(5, wire.I32)),
    6: _PayloadSpec("diff", np.dtype("<f4"), wire.I32, wire.encode_tag(6, wire.I32)),
    8: _PayloadSpec("double_data", np.dtype("<f8"), wire.I64, wire.encode_tag(8, wire.I64)),
    9: _PayloadSpec("double_diff", np.dtype("<f8"), wire.I64, wire.encode_tag(9, wire.I64)),
}
_PAYLOAD_FIELD = {spec.name: number for number, spec in _PAYLOADS.items()}

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


@dataclass(frozen=True)
class Origin:
    """How a blob was stored, so that a re-save keeps it unless asked otherwise."""

    layout: str          # "shape" or "legacy"
    dtype: np.dtype      # float32 (data) or float64 (double_data)
    has_diff: bool


@dataclass
class BlobRecord:
    """A BlobProto located in a buffer: its small fields parsed, its payloads viewed."""

    header: object               # a BlobProto message without payload fields
    payloads: dict               # name -> Payload
    start: int
    end: int
    path: object = None
    field_offsets: dict = dc_field(default_factory=dict)  # number -> first offset, for errors

    @property
    def shape_layout(self) -> tuple[tuple[int, ...], str]:
        return proto_shape(self.header)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.shape_layout[0]

    @property
    def layout(self) -> str:
        return self.shape_layout[1]

    def _pick(self, double_name: str, float_name: str) -> Payload | None:
        # Caffe's FromProto: the double field wins when it is non-empty.
        double = self.payloads[double_name]
        if double.count > 0:
            return double
        single = self.payloads[float_name]
        return single if single.count > 0 else None

    @property
    def data_payload(self) -> Payload:
        return self._pick("double_data", "data") or self.payloads["data"]

    @property
    def diff_payload(self) -> Payload | None:
        return self._pick("double_diff", "diff")

    @property
    def dtype(self) -> np.dtype:
        """float64 when the values come from double_data, else float32."""
        return np.dtype(np.float64) if self.payloads["double_data"].count > 0 else np.dtype(np.float32)

    @property
    def has_diff(self) -> bool:
        return self.diff_payload is not None

    @property
    def count(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def origin(self) -> Origin:
        return Origin(self.layout, self.dtype, self.has_diff)


def _new_header():
    from ._pb.blobtool_caffe_pb2 import BlobProto
    return BlobProto()


def parse_blob(buf, start: int = 0, end: int | None = None, *, path=None) -> BlobRecord:
    """Locate the BlobProto in buf[start:end]; no payload is copied or converted.

    Raises FormatError naming the byte offset and field on malformed input.
    """
    end = len(buf) if end is None else end
    payloads = {spec.name: Payload(spec.name, spec.dtype) for spec in _PAYLOADS.values()}
    header_spans = []
    field_offsets = {}
    pos = start
    while pos < end:
        f = wire.read_field(buf, pos, end, path=path, names=BLOB_FIELD_NAMES)
        pos = f.end
        field_offsets.setdefault(f.number, f.offset)
        spec = _PAYLOADS.get(f.number)
        if spec is None:
            header_spans.append((f.offset, f.end))
            continue
        payload = payloads[spec.name]
        if f.wire_type == wire.LEN:
            nbytes = f.end - f.start
            if nbytes % spec.dtype.itemsize:
                raise FormatError(
                    f"packed {wire.field_label(f.number, BLOB_FIELD_NAMES)} holds {nbytes} bytes, "
                    f"not a multiple of {spec.dtype.itemsize}", path=path, offset=f.offset)
            if nbytes:
                payload.chunks.append(wire.view_array(buf, f.start, f.end, spec.dtype))
        elif f.wire_type == spec.unpacked_wire_type:
            # A run of unpacked values: gather it at once rather than field by field.
            n = wire.unpacked_run(buf, f.offset, end, spec.unpacked_tag, spec.dtype.itemsize)
            if n:
                payload.chunks.append(wire.unpacked_values(buf, f.offset, n, spec.dtype.itemsize, spec.dtype))
                pos = f.offset + n * (1 + spec.dtype.itemsize)
            else:
                # A tag written in more bytes than it needs (valid, if odd):
                # the run above only matches the 1-byte tag, so take this value alone.
                payload.chunks.append(wire.view_array(buf, f.start, f.end, spec.dtype))
        else:
            # protobuf keeps a known field with an unexpected wire type as an
            # unknown field; so does blobtool.
            header_spans.append((f.offset, f.end))
            continue
        if payload.offset is None:
            payload.offset = f.offset
    header = _parse_header(buf, header_spans, path)
    return BlobRecord(header, payloads, start, end, path, field_offsets)


def _parse_header(buf, spans, path):
    from google.protobuf.message import DecodeError

    header = _new_header()
    raw = b"".join(bytes(buf[a:b]) for a, b in spans)
    try:
        header.ParseFromString(raw)
    except DecodeError as exc:
        # Find the field protobuf refused, to say where it is.
        for a, b in spans:
            try:
                _new_header().ParseFromString(bytes(buf[a:b]))
            except DecodeError:
                number = wire.read_varint(buf, a, b)[0] >> 3
                raise FormatError(f"{wire.field_label(number, BLOB_FIELD_NAMES)}: invalid contents ({exc})",
                                  path=path, offset=a) from exc
        raise FormatError(f"invalid BlobProto fields ({exc})", path=path, offset=spans[0][0] if spans else 0) from exc
    return header


def blob_from_record(record: BlobRecord) -> Blob:
    """Build a Blob from a located BlobProto with Caffe's FromProto rules, adopting the payload views."""
    blob = Blob(dtype=record.dtype)
    data = record.data_payload
    diff = record.diff_payload
    shape, layout = record.shape_layout
    try:
        blob.fill_from(shape, data.array(), diff.array() if diff else None, adopt=True)
    except FormatError as exc:
        # Name the field at fault: the shape when the reshape failed, else
        # the payload whose count differs from the shape's.
        if blob.shape != shape:
            number = 7
            if layout == "legacy":
                number = 1 + next((axis for axis, d in enumerate(shape) if d < 0), 0)
            label = wire.field_label(number, BLOB_FIELD_NAMES)
            offset = record.field_offsets.get(number, record.start)
        else:
            payload = data if data.count != blob.count else diff
            if payload.count:
                label = wire.field_label(_PAYLOAD_FIELD[payload.name], BLOB_FIELD_NAMES)
                offset = payload.offset
            else:
                label, offset = "no data", record.start
        raise FormatError(f"{label}: {exc.reason}", path=record.path, offset=offset) from exc
    blob.origin = record.origin
    return blob


def encode_blob_parts(blob: Blob, *, double: bool, write_diff: bool, layout: str):
    """The pieces of a BlobProto for `blob`, in field-number order.

    Returns a list whose items are bytes (headers, small fields) or
    (array, target dtype) pairs for payloads, so callers can stream them.
    """
    if layout not in ("shape", "legacy"):
        raise UsageError(f"layout must be 'shape' or 'legacy', got {layout!r}")
    from ._pb.blobtool_caffe_pb2 import BlobProto

    legacy = BlobProto()
    shape = BlobProto()
    if layout == "legacy":
        if blob.num_axes > 4:
            raise UsageError(f"the legacy layout holds at most 4 axes; this blob has {blob.num_axes}")
        for index, name in zip((-4, -3, -2, -1), LEGACY_FIELDS):
            setattr(legacy, name, blob.legacy_shape(index))
    else:
        # As Caffe's ToProto: a scalar (0-axis) blob gets no shape field at all.
        shape.shape.dim.extend(blob.shape)
    target = np.dtype("<f8") if double else np.dtype("<f4")
    parts = [legacy.SerializeToString()]

    def payload(number, values):
        if values.size:
            parts.append(wire.len_field_header(number, values.size * target.itemsize))
            parts.append((values, target))

    if not double:
        payload(5, blob.cpu_data())
        if write_diff:
            payload(6, blob.cpu_diff())
    parts.append(shape.SerializeToString())
    if double:
        payload(8, blob.cpu_data())
        if write_diff:
            payload(9, blob.cpu_diff())
    return [p for p in parts if not isinstance(p, bytes) or p]


def blob_encoded_size(parts) -> int:
    """Bytes that `parts` (from encode_blob_parts) take when written."""
    return sum(len(p) if isinstance(p, bytes) else p[0].size * p[1].itemsize for p in parts)


def write_parts(out, parts) -> None:
    """Write encode_blob_parts' pieces to a binary file object, converting in chunks."""
    for part in parts:
        if isinstance(part, bytes):
            out.write(part)
            continue
        values, target = part
        values = values.reshape(-1)
        if values.dtype == target:
            out.write(memoryview(np.ascontiguousarray(values)).cast("B"))
            continue
        for start in range(0, values.size, _WRITE_CHUNK):
            out.write(values[start:start + _WRITE_CHUNK].astype(target).data)


def write_blob(out, blob: Blob, *, double: bool, write_diff: bool, layout: str) -> None:
    """Write `blob` as one BlobProto to the binary file object `out`."""
    write_parts(out, encode_blob_parts(blob, double=double, write_diff=write_diff, layout=layout))
