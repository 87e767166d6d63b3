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
from ..origin import exact_values
from .blobproto import DIFF_OF, PAYLOAD_BY_NAME, PRECISION_FIELDS, PRECISIONS, RAW_TYPE_OF, RAW_TYPES, SHAPE_FIELD
from ...errors import UsageError
from ...engine.kernels import cast_written
from ...engine.work import report
from ...files import release_pages

__all__ = ["encode_blob_parts", "check_layout", "resolve_form", "write_parts", "write_blob",
           "blob_encoded_size", "Unread", "UnreadValues"]

# Elements of a payload converted (float32 <-> float64, float16, a
# transform) and written at a time, whatever the payload's size: converting
# never doubles the memory of a large blob.
_WRITE_CHUNK = 1 << 20


class Unread:
    """A blob to write whose values are read only when they are written, and let go right after.

    `shell` is a Blob with the shape, dtypes and origin but no values (its
    memory never allocated), `make` builds the Blob with its values. The
    writers plan an output from the shell (sizes, headers, the form each
    side is written in); cpu_data() and cpu_diff() give UnreadValues, which
    write_parts reads when it reaches them: the Blob is built then, kept
    only while the payload written next is its other side, and let go
    otherwise, so an output is written holding one such blob at a time.
    Anything else a Blob offers (its math, its values as an array) is not
    here: it would have to read the values.
    """

    _METADATA = frozenset({"shape", "num_axes", "count", "dtype", "diff_dtype", "origin", "legacy_shape",
                           "shape_string", "data_memory", "diff_memory", "nbytes"})

    def __init__(self, shell: Blob, make):
        self.shell = shell
        self._make = make
        self._blob = None

    def __getattr__(self, name):
        if name in Unread._METADATA:
            return getattr(self.shell, name)
        raise AttributeError(f"an unread blob has no {name!r}: its values are read only as they are written")

    def cpu_data(self) -> "UnreadValues":
        return UnreadValues(self, "data")

    def cpu_diff(self) -> "UnreadValues":
        return UnreadValues(self, "diff")

    def built(self) -> Blob:
        """The Blob with its values, built anew (not kept): for a look at every value before writing."""
        return self._make()


class UnreadValues:
    """One side ("data" or "diff") of an Unread blob: its size now, its values when read()."""

    def __init__(self, unread: Unread, side: str):
        self.unread, self.side = unread, side
        self.size = unread.shell.count

    def read(self) -> np.ndarray:
        """The values, as a flat array of the side's dtype (the blob is built when none of its sides is held)."""
        unread = self.unread
        if unread._blob is None:
            unread._blob = unread._make()
        return unread._blob.cpu_data() if self.side == "data" else unread._blob.cpu_diff()

    def written(self, following=None) -> None:
        """Say these values are written; the blob is let go unless `following` (the payload written next) is its own."""
        if not (isinstance(following, UnreadValues) and following.unread is self.unread):
            self.unread._blob = None


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
    halves = [cast_written(values[a:a + _WRITE_CHUNK] if transform is None
                           else transform(values[a:a + _WRITE_CHUNK], a), np.dtype("<f2"), transform)
              for a in range(0, values.size, _WRITE_CHUNK)]
    bits = (np.concatenate(halves) if halves else np.zeros(0, "<f2")).view("<u2")
    report(values.nbytes)
    return wire.encode_packed_uint16(bits)


# The largest legacy dimension: num, channels, height and width are int32 fields.
INT32_MAX = 2**31 - 1


def check_layout(blob: Blob, layout: str | None) -> None:
    """Refuse the legacy layout (num/channels/height/width) for more than 4 axes, or a dimension past int32."""
    if layout == "legacy" and blob.num_axes > 4:
        raise UsageError(f"the legacy layout holds at most 4 axes; this blob has {blob.num_axes}")
    too_large = [(axis, d) for axis, d in enumerate(blob.shape) if d > INT32_MAX] if layout == "legacy" else []
    if too_large:
        axis, dim = too_large[0]
        raise UsageError(f"the legacy layout holds dimensions up to {INT32_MAX} (int32 fields); dimension {axis} "
                         f"of shape {tuple(blob.shape)} is {dim}")


def resolve_form(blob: Blob, *, precision: str | None = None, write_diff: bool | None = None,
                 layout: str | None = None, encoded: bool = True) -> dict:
    """Fill the Nones in a write request from what the blob came with.

    A blob made in Python writes as its dtype, in the `shape` layout, without
    diff (Caffe's ToProto defaults). A loaded blob keeps its stored encoding
    (each side's field and raw type), layout, diff and unknown fields; a
    legacy blob grown past 4 axes falls back to `shape`. For a format that
    has no BlobProto encodings (`encoded` False: HDF5, safetensors) the
    precision is "float", "double" or "half" as stored, and "double" for
    integers (which float64 holds exactly); the dict then also says the
    diff's ("diff_precision"). For a BlobProto the dict says either a
    precision or, to keep the stored one, its "encoding" (precision None).

    With no precision asked for, a diff stored (or held) wider than its data
    keeps its own width: float data beside a double diff writes data and
    double_diff, never a diff narrowed into Inf. A precision asked for
    applies to both sides.
    """
    origin = blob.origin
    diff_precision = precision
    encoding = None
    if precision is None:
        data_side, diff_side = _stored_precisions(blob)
        if origin is not None and not encoded:
            precision, diff_precision = data_side, diff_side
        elif origin is not None and origin.encoding:
            encoding = origin.encoding
        elif diff_side != data_side:
            encoding = ((PRECISION_FIELDS[data_side][0], RAW_TYPE_OF.get(data_side)),
                        (PRECISION_FIELDS[diff_side][1], RAW_TYPE_OF.get(diff_side)))
        else:
            precision = data_side
    if write_diff is None:
        write_diff = bool(origin.has_diff) if origin else False
    if layout is None:
        layout = origin.layout if origin else "shape"
        if layout == "legacy" and blob.num_axes > 4:
            layout = "shape"
    form = {"precision": precision, "write_diff": write_diff, "layout": layout,
            "unknown": origin.unknown if origin else b""}
    if encoded:
        form["encoding"] = encoding
    else:
        form["diff_precision"] = diff_precision
    return form


def _stored_precisions(blob: Blob) -> tuple:
    """The precisions ("float", "double", "half") of the data and the diff as stored, or as held for a new blob.

    Integers (NVIDIA Caffe's INT/UINT) count as "double", which holds them exactly.
    """
    origin = blob.origin
    if origin is None:
        return tuple("double" if dtype == np.float64 else "float" for dtype in (blob.dtype, blob.diff_dtype))
    data = "double" if origin.dtype.kind in "iu" else origin.precision
    diff_stored = origin.diff_dtype if origin.diff_dtype is not None else origin.dtype
    diff = "double" if diff_stored.kind in "iu" else origin.diff_precision
    return data, diff


def blob_encoded_size(parts) -> int:
    """Bytes that `parts` (from encode_blob_parts) take when written."""
    return sum(p[0].size * p[1].itemsize if isinstance(p, tuple) else len(p) for p in parts)


def write_parts(out, parts, following=None) -> None:
    """Write encode_blob_parts' pieces to a binary file object, chunk by chunk.

    Payloads are written in chunks of _WRITE_CHUNK elements: converted to the
    target dtype, passed through the part's transform if it has one, and the
    input pages behind each written chunk are released (files.release_pages),
    so memory stays bounded whatever the file size. Values not read yet
    (UnreadValues) are read when their part is reached and let go once it is
    written, unless the next payload is the same blob's other side (for the
    last part: `following`, the payload a later call writes next), so one
    blob's values are held at a time.
    """
    payloads = [part[0] for part in parts if isinstance(part, tuple)] + [following]
    n = 0
    for part in parts:
        if not isinstance(part, tuple):  # bytes, or a memoryview of the input
            out.write(part)
            continue
        n += 1
        transform = part[2] if len(part) > 2 else None
        if not isinstance(part[0], UnreadValues):
            _write_values(out, part[0], part[1], transform)
            continue
        if part[0].size:
            _write_values(out, part[0].read(), part[1], transform)
        part[0].written(payloads[n])


def _write_values(out, values: np.ndarray, target: np.dtype, transform) -> None:
    """Write one payload's values in chunks (see write_parts); nothing of them is held once this returns."""
    values = values.reshape(-1)
    # Doubles past float32's range become infinities, as Caffe's cast
    # makes them; numpy's warning about it would break the one-line stderr.
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, values.size, _WRITE_CHUNK):
            chunk = values[start:start + _WRITE_CHUNK]
            data = chunk if transform is None else transform(chunk, start)
            if target.kind in "iu":
                data = exact_values(data, target)
            else:
                data = cast_written(data, target, transform)
            out.write(memoryview(np.ascontiguousarray(data)).cast("B"))
            report(chunk.nbytes)
            release_pages(chunk)


def write_blob(out, blob: Blob, *, precision: str | None = "float", encoding: tuple | None = None,
               write_diff: bool = False, layout: str = "shape", transforms: dict | None = None,
               unknown: bytes = b"") -> None:
    """Write `blob` as one BlobProto to the binary file object `out` (see encode_blob_parts)."""
    write_parts(out, encode_blob_parts(blob, precision=precision, encoding=encoding, write_diff=write_diff,
                                       layout=layout, transforms=transforms, unknown=unknown))
