"""Writing a Blob as a BlobProto: the fields each precision (or the encoding it was read in) writes, in chunks.

The small fields go through protobuf; each payload is written as tag, length
and raw little-endian bytes, in field-number order, so the bytes equal what
protobuf's SerializeToString gives for the same message. With no precision
asked for, each side keeps the field it was read from (a raw INT stays a raw
INT, ditcaffe's half_data stays half_data), and the fields blobtool does not
know are written after the known ones, byte for byte (where protobuf writes
unknown fields): a BlobProto that protobuf wrote comes back as it was. The
fields each precision writes are a table in blobproto.py, beside
PAYLOAD_FIELDS.
"""

from __future__ import annotations

import numpy as np

from . import wire
from ...engine.blob import LEGACY_FIELDS, Blob
from .blobproto import DIFF_OF, PAYLOAD_BY_NAME, PRECISION_FIELDS, PRECISIONS, RAW_TYPE_OF, RAW_TYPES, SHAPE_FIELD
from ...errors import UsageError
from ...engine.kernels import cast_written
from ...engine.work import report
from ..writing import WRITE_CHUNK, UnreadValues, check_layout, stored_precisions, write_parts, written_sides

__all__ = ["encode_blob_parts", "resolve_form", "write_blob", "blob_encoded_size"]


def encode_blob_parts(blob: Blob, *, precision: str | None = "float", encoding: tuple | None = None,
                      write_diff: bool = False, layout: str = "shape", transforms: dict | None = None,
                      unknown: bytes = b""):
    """The pieces of a BlobProto for `blob`, in field-number order, then `unknown` (fields kept as they were).

    Returns a list whose items are bytes (headers, small fields) or, for
    payloads, (values, target dtype, transform or None) triples, so callers
    can stream them (write_parts).
    `precision` is "float" (data/diff), "double" (double_data/double_diff)
    or "half" (NVIDIA Caffe's raw_data/raw_diff typed FLOAT16); `encoding`,
    when given, is a stored encoding instead (Origin.encoding: each side's
    field and raw type) to write the blob as it was read.

    `transforms` may map "data"/"diff" to ``fn(chunk, start) -> array``,
    applied chunk by chunk as the payload is written (how the command line
    streams scale and update through files larger than memory).
    """
    transforms = transforms or {}
    if layout not in ("shape", "legacy"):
        raise UsageError(f"layout must be 'shape' or 'legacy', got {layout!r}")
    sides = _side_encodings(precision, encoding)
    from ..._pb.blobtool_caffe_pb2 import BlobProto  # protobuf loads only where a message's small fields are parsed

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
        spec = PAYLOAD_BY_NAME[name]
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
            if isinstance(values, UnreadValues):
                pending, values = values, values.read()
                pending.written()
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


def _side_encodings(precision: str | None, encoding: tuple | None) -> tuple:
    """((field, raw type), (field, raw type)) for data and diff: from a stored encoding, or a precision's name."""
    if encoding is not None:
        data, diff = encoding
        if data[0] not in DIFF_OF or (diff is not None and diff[0] not in DIFF_OF.values()):
            raise UsageError(f"unknown stored encoding {encoding!r}")
        return data, diff if diff is not None else (DIFF_OF[data[0]], data[1])
    if precision not in PRECISIONS:
        raise UsageError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    raw_type = RAW_TYPE_OF.get(precision)
    return tuple((name, raw_type) for name in PRECISION_FIELDS[precision])


def _half_payload(values: np.ndarray, transform) -> bytes:
    """ditcaffe's half_data bytes for `values` (after `transform`): packed varints of float16 bits."""
    values = values.reshape(-1)
    # As the FLOAT16 raw form: past float16's range is Inf (counted by a counting transform).
    halves = [cast_written(values[a:a + WRITE_CHUNK] if transform is None
                           else transform(values[a:a + WRITE_CHUNK], a), np.dtype("<f2"), transform)
              for a in range(0, values.size, WRITE_CHUNK)]
    bits = (np.concatenate(halves) if halves else np.zeros(0, "<f2")).view("<u2")
    report(values.nbytes)
    return wire.encode_packed_uint16(bits)


def resolve_form(blob: Blob, *, precision: str | None = None, write_diff: bool | None = None,
                 layout: str | None = None) -> dict:
    """Fill the Nones in a write request for a BlobProto from what the blob came with.

    A blob made in Python writes as its dtype, in the `shape` layout, without
    diff (Caffe's ToProto defaults). A loaded blob keeps its stored encoding
    (each side's field and raw type), layout, diff and unknown fields; a
    legacy blob grown past 4 axes falls back to `shape`. The dict says either
    a precision or, to keep the stored one, its "encoding" (precision None);
    formats without BlobProto encodings resolve theirs in writing.py.

    With no precision asked for, a diff stored (or held) wider than its data
    keeps its own width: float data beside a double diff writes data and
    double_diff, never a diff narrowed into Inf. A precision asked for
    applies to both sides.
    """
    origin = blob.origin
    encoding = None
    if precision is None:
        data_side, diff_side = stored_precisions(blob)
        if origin is not None and origin.encoding:
            encoding = origin.encoding
        elif diff_side != data_side:
            encoding = ((PRECISION_FIELDS[data_side][0], RAW_TYPE_OF.get(data_side)),
                        (PRECISION_FIELDS[diff_side][1], RAW_TYPE_OF.get(diff_side)))
        else:
            precision = data_side
    return {"precision": precision, **written_sides(blob, write_diff=write_diff, layout=layout),
            "encoding": encoding}


def blob_encoded_size(parts) -> int:
    """Bytes that `parts` (from encode_blob_parts) take when written."""
    return sum(p[0].size * p[1].itemsize if isinstance(p, tuple) else len(p) for p in parts)


def write_blob(out, blob: Blob, *, precision: str | None = "float", encoding: tuple | None = None,
               write_diff: bool = False, layout: str = "shape", transforms: dict | None = None,
               unknown: bytes = b"") -> None:
    """Write `blob` as one BlobProto to the binary file object `out` (see encode_blob_parts)."""
    write_parts(out, encode_blob_parts(blob, precision=precision, encoding=encoding, write_diff=write_diff,
                                       layout=layout, transforms=transforms, unknown=unknown))
