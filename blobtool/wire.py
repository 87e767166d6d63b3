"""The protobuf wire format at the level of fields and byte spans.

This module knows no message meaning; it finds fields and views payloads.

Format
------
A message is a sequence of fields, each a *tag* followed by a value. The tag
is a varint ``(field_number << 3) | wire_type``. Field numbers are 1 to
2**29 - 1. Wire types:

====  ==========  ====================================================
0     VARINT      base-128 varint, least-significant group first, at
                  most 10 bytes (a reader MUST refuse an 11th byte)
1     I64         8 bytes little-endian (double, fixed64)
2     LEN         varint byte length, then that many bytes (strings,
                  nested messages, packed repeated scalars)
3, 4  SGROUP/EGROUP  deprecated groups; Caffe's schema has none, so
                  blobtool refuses them
5     I32         4 bytes little-endian (float, fixed32)
====  ==========  ====================================================

Repeated scalars (Caffe's ``data``, ``diff``, ``double_data``,
``double_diff``, ``BlobShape.dim``) come *packed* (one LEN field holding the
values back to back) or *unpacked* (one I32/I64/VARINT field per value). A
proto2 reader MUST accept both for the same field, in any mix, and MUST
concatenate the values of every occurrence in file order: one packed field
may be split over several occurrences. Fields may appear in any order; for a
non-repeated scalar the last occurrence wins; occurrences of a non-repeated
message field merge; unknown fields are skipped.

A packed float payload is ``count * 4`` raw little-endian IEEE-754 bytes (a
double payload ``count * 8``), so blobtool views it in place with
``numpy.frombuffer``: no copy and no Python floats. Every length is checked
against the bytes that remain before anything is allocated or viewed.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

import numpy as np

from .errors import FormatError

__all__ = [
    "VARINT", "I64", "LEN", "SGROUP", "EGROUP", "I32",
    "MAX_VARINT_BYTES", "MAX_FIELD_NUMBER",
    "Field", "read_varint", "read_field", "iter_fields", "unpacked_values", "view_array", "unpacked_run",
    "packed_uint16", "encode_packed_uint16", "encode_varint", "encode_tag", "len_field_header", "field_label", "minimal_tags", "add_span",
]

VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5
WIRE_TYPE_NAMES = {VARINT: "varint", I64: "64-bit", LEN: "length-delimited",
                   SGROUP: "start-group", EGROUP: "end-group", I32: "32-bit"}

# A varint encodes at most 64 bits: 10 groups of 7. More is corrupt input.
MAX_VARINT_BYTES = 10
# A tag is a 32-bit varint: at most 5 bytes (protobuf's parsers refuse longer ones).
MAX_TAG_BYTES = 5
# Field numbers are 29 bits wide.
MAX_FIELD_NUMBER = (1 << 29) - 1

_FIXED_SIZE = {I64: 8, I32: 4}
# Bytes of packed varints decoded at a time by packed_uint16: its index
# arrays take about 30 bytes per byte of payload, so they are kept to a block.
_VARINT_BLOCK = 1 << 15


class Field(NamedTuple):
    """One field as found in the bytes.

    `offset` is where its tag starts; `start`/`end` delimit its value (for
    LEN fields the payload after the length). `value` is the integer for
    VARINT fields, else None.
    """

    number: int
    wire_type: int
    offset: int
    start: int
    end: int
    value: int | None


def field_label(number: int, names: dict | None = None) -> str:
    """'field 5 (data)', or 'field 5' when the name is unknown."""
    name = names.get(number) if names else None
    return f"field {number} ({name})" if name else f"field {number}"


def read_varint(buf, pos: int, end: int, *, path=None, what: str = "varint") -> tuple[int, int]:
    """Decode the varint at `pos`; return (value, position after it).

    Raises FormatError when the bytes end first or it runs past 10 bytes.
    """
    result = 0
    shift = 0
    start = pos
    while True:
        if pos >= end:
            raise FormatError(f"truncated {what}: the data ends inside it", path=path, offset=start)
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if pos - start == MAX_VARINT_BYTES and byte > 1:
                raise FormatError(f"{what} overflows 64 bits", path=path, offset=start)
            return result, pos
        shift += 7
        if pos - start >= MAX_VARINT_BYTES:
            raise FormatError(f"{what} longer than {MAX_VARINT_BYTES} bytes", path=path, offset=start)


def read_field(buf, pos: int, end: int, *, path=None, names: dict | None = None) -> Field:
    """Read the field whose tag starts at `pos`, checking its length against `end`.

    The returned Field's `end` is where the next field starts. `names` maps
    field numbers to names for error messages.
    """
    offset = pos
    tag, pos = read_varint(buf, pos, end, path=path, what="field tag")
    if pos - offset > MAX_TAG_BYTES:
        raise FormatError(f"field tag takes {pos - offset} bytes; a tag is a 32-bit varint of at most "
                          f"{MAX_TAG_BYTES}", path=path, offset=offset)
    number, wire_type = tag >> 3, tag & 7
    if number == 0 or number > MAX_FIELD_NUMBER:
        raise FormatError(f"invalid field number {number} (tag {tag:#x})", path=path, offset=offset)
    label = field_label(number, names)
    if wire_type == VARINT:
        value, pos = read_varint(buf, pos, end, path=path, what=label)
        return Field(number, wire_type, offset, offset, pos, value)
    if wire_type == LEN:
        length, value_start = read_varint(buf, pos, end, path=path, what=f"length of {label}")
        remain = end - value_start
        if length > remain:
            raise _truncated(path, offset, label, length, remain)
        return Field(number, wire_type, offset, value_start, value_start + length, None)
    if wire_type in _FIXED_SIZE:
        size = _FIXED_SIZE[wire_type]
        if end - pos < size:
            raise _truncated(path, offset, label, size, end - pos)
        return Field(number, wire_type, offset, pos, pos + size, None)
    if wire_type in (SGROUP, EGROUP):
        raise FormatError(f"{label} uses the group wire type {wire_type}, which Caffe's schema never writes",
                          path=path, offset=offset)
    raise FormatError(f"{label} has invalid wire type {wire_type}", path=path, offset=offset)


def iter_fields(buf, start: int, end: int, *, path=None, names: dict | None = None) -> Iterator[Field]:
    """Yield the fields of the message in buf[start:end], checking every length."""
    pos = start
    while pos < end:
        field = read_field(buf, pos, end, path=path, names=names)
        pos = field.end
        yield field


def _truncated(path, offset: int, label: str, declared: int, remain: int) -> FormatError:
    err = FormatError(f"truncated at byte {offset}: {label} declares {declared} bytes, {remain} remain",
                      path=path)
    err.offset = offset
    return err


def view_array(buf, start: int, end: int, dtype) -> np.ndarray:
    """Zero-copy numpy view of the packed values in buf[start:end] (little-endian `dtype`)."""
    dt = np.dtype(dtype).newbyteorder("<")
    count = (end - start) // dt.itemsize
    return np.frombuffer(buf, dtype=dt, count=count, offset=start)


def minimal_tags(buf, start: int, end: int, nested: frozenset = frozenset()) -> bytes:
    """The fields in buf[start:end] as bytes, each tag re-encoded in its shortest form.

    A tag written in more bytes than it needs is valid, and upb reads it, but
    protobuf 3.x's pure-Python parser keeps such a field as an unknown one;
    handing it minimal tags makes every runtime read the same fields. LEN
    fields numbered in `nested` are messages whose own tags are rewritten too.
    """
    out = bytearray()
    pos = start
    while pos < end:
        field = read_field(buf, pos, end)
        tag_end = read_varint(buf, field.offset, end)[1]
        tag = encode_tag(field.number, field.wire_type)
        if field.wire_type == LEN and field.number in nested:
            try:
                content = minimal_tags(buf, field.start, field.end)
            except FormatError:  # not fields: leave it for the parser to refuse
                content = bytes(buf[field.start:field.end])
            out += tag + encode_varint(len(content)) + content
        elif tag_end - field.offset == len(tag):
            out += buf[field.offset:field.end]
        else:
            out += tag
            out += buf[tag_end:field.end]
        pos = field.end
    return bytes(out)


def unpacked_run(buf, pos: int, end: int, tag: bytes, size: int) -> int:
    """How many unpacked values start at `pos`: consecutive `tag` + `size`-byte records.

    Unpacked repeated floats are a tag (one byte, or more when a writer pads
    it) and 4 bytes each; checking the tag bytes with numpy in growing blocks
    reads a run of millions of values without a Python loop per value.
    """
    width = len(tag)
    record = width + size
    expected = np.frombuffer(tag, dtype=np.uint8)
    total = 0
    block = 256
    while True:
        fit = (end - pos) // record
        if fit == 0:
            return total
        n = min(block, fit)
        tags = np.frombuffer(buf, dtype=np.uint8, count=n * record, offset=pos).reshape(n, record)[:, :width]
        mismatch = np.flatnonzero((tags != expected).any(axis=1))
        if mismatch.size:
            return total + int(mismatch[0])
        total += n
        pos += n * record
        block *= 4


def unpacked_values(buf, pos: int, count: int, size: int, dtype, tag_size: int = 1) -> np.ndarray:
    """Copy `count` unpacked values (a `tag_size`-byte tag + `size` bytes each) starting at `pos`."""
    record = tag_size + size
    raw = np.frombuffer(buf, dtype=np.uint8, count=count * record, offset=pos).reshape(count, record)
    return np.ascontiguousarray(raw[:, tag_size:]).view(np.dtype(dtype).newbyteorder("<")).reshape(-1)


def packed_uint16(buf, f: Field, *, path=None, label: str, value_name: str = "value") -> np.ndarray:
    """The packed varints of LEN field `f` as uint16 values (each at most 3 bytes); FormatError past 16 bits.

    Decoded block by block into one 2-byte array, so the index arrays that
    decoding needs stay small whatever the payload's size. (ditcaffe's
    half_data holds float16 bits this way.)
    """
    raw = np.frombuffer(buf, dtype=np.uint8, count=f.end - f.start, offset=f.start)
    if raw.size == 0:
        return np.zeros(0, dtype="<u2")
    if raw[-1] >= 0x80:
        raise FormatError(f"{label}: packed varints end mid-value", path=path, offset=f.offset)
    count = sum(int(np.count_nonzero(raw[a:a + _VARINT_BLOCK] < 0x80)) for a in range(0, raw.size, _VARINT_BLOCK))
    out = np.empty(count, dtype="<u2")
    pos = filled = 0
    while pos < raw.size:
        block = raw[pos:pos + _VARINT_BLOCK]
        ends = np.flatnonzero(block < 0x80)
        if ends.size == 0:  # a block without a value's last byte: a value far longer than 3 bytes
            raise FormatError(f"{label}: a {value_name} exceeds 16 bits", path=path, offset=f.offset)
        block = block[:ends[-1] + 1]  # up to the last whole value; the next block starts after it
        starts = np.concatenate(([0], ends[:-1] + 1))
        lengths = ends - starts + 1
        if lengths.max() > 3:
            raise FormatError(f"{label}: a {value_name} exceeds 16 bits", path=path, offset=f.offset)
        values = (block[starts] & 0x7F).astype(np.uint32)
        two = lengths >= 2
        values[two] |= (block[starts[two] + 1] & 0x7F).astype(np.uint32) << 7
        three = lengths == 3
        values[three] |= (block[starts[three] + 2] & 0x7F).astype(np.uint32) << 14
        if values.max() > 0xFFFF:
            raise FormatError(f"{label}: a {value_name} exceeds 16 bits", path=path, offset=f.offset)
        out[filled:filled + values.size] = values
        filled += values.size
        pos += block.size
    return out


def encode_packed_uint16(values: np.ndarray) -> bytes:
    """uint16 values as packed varints (1 to 3 bytes each): what packed_uint16 reads back."""
    v = np.asarray(values, dtype=np.uint16).astype(np.uint32).reshape(-1)
    lengths = 1 + (v >= 0x80).astype(np.int64) + (v >= 0x4000)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    out = np.empty(int(ends[-1]) if v.size else 0, dtype=np.uint8)
    out[starts] = (v & 0x7F) | np.where(lengths > 1, 0x80, 0)
    two = lengths >= 2
    out[starts[two] + 1] = ((v[two] >> 7) & 0x7F) | np.where(lengths[two] > 2, 0x80, 0)
    three = lengths == 3
    out[starts[three] + 2] = v[three] >> 14
    return out.tobytes()


def encode_varint(value: int) -> bytes:
    """Base-128 varint of a non-negative integer below 2**64."""
    if value < 0:
        value &= (1 << 64) - 1
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def encode_tag(number: int, wire_type: int) -> bytes:
    return encode_varint((number << 3) | wire_type)


def len_field_header(number: int, length: int) -> bytes:
    """Tag and length of a LEN field whose `length` payload bytes follow."""
    return encode_tag(number, LEN) + encode_varint(length)


def add_span(spans: list, f: Field) -> None:
    """Append field `f`'s bytes to a list of (start, end) spans; adjacent fields share one span.

    A run of small fields then costs one entry, not one each.
    """
    if spans and spans[-1][1] == f.offset:
        spans[-1] = (spans[-1][0], f.end)
    else:
        spans.append((f.offset, f.end))
