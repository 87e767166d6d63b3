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

import functools
from typing import Iterator, NamedTuple

import numpy as np

from ...errors import FormatError, truncated

__all__ = [
    "VARINT", "I64", "LEN", "SGROUP", "EGROUP", "I32",
    "MAX_VARINT_BYTES", "MAX_FIELD_NUMBER",
    "Field", "Run", "read_varint", "read_field", "iter_fields", "iter_runs", "unpacked_values", "view_array",
    "unpacked_run", "packed_uint16", "encode_packed_uint16", "encode_varint", "encode_tag", "len_field_header",
    "field_label", "minimal_tags", "protobuf_ready", "add_span", "add_bytes",
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


def signed(value: int) -> int:
    """An int32 or int64 field's value as read from its varint (a negative one is a 10-byte varint)."""
    value = int(value) & ((1 << 64) - 1)
    return value - (1 << 64) if value >> 63 else value


def read_field(buf, pos: int, end: int, *, path=None, names: dict | None = None) -> Field:
    """Read the field whose tag starts at `pos`, checking its length against `end`.

    The returned Field's `end` is where the next field starts. `names` maps
    field numbers to names for error messages.
    """
    offset = pos
    # One-byte tags, values and lengths (most of them) are read inline; the
    # label for errors is made only when one is raised.
    if pos < end and buf[pos] < 0x80:
        tag = buf[pos]
        pos += 1
    else:
        tag, pos = read_varint(buf, pos, end, path=path, what="field tag")
        if pos - offset > MAX_TAG_BYTES:
            raise FormatError(f"field tag takes {pos - offset} bytes; a tag is a 32-bit varint of at most "
                              f"{MAX_TAG_BYTES}", path=path, offset=offset)
    number, wire_type = tag >> 3, tag & 7
    if number == 0 or number > MAX_FIELD_NUMBER:
        raise FormatError(f"invalid field number {number} (tag {tag:#x})", path=path, offset=offset)
    if wire_type == VARINT:
        if pos < end and buf[pos] < 0x80:
            return Field(number, wire_type, offset, offset, pos + 1, buf[pos])
        value, pos = read_varint(buf, pos, end, path=path, what=field_label(number, names))
        return Field(number, wire_type, offset, offset, pos, value)
    if wire_type == LEN:
        if pos < end and buf[pos] < 0x80:
            length, value_start = buf[pos], pos + 1
        else:
            length, value_start = read_varint(buf, pos, end, path=path,
                                              what=f"length of {field_label(number, names)}")
        remain = end - value_start
        if length > remain:
            raise truncated(path, offset, f"{field_label(number, names)} declares", length, remain)
        return Field(number, wire_type, offset, value_start, value_start + length, None)
    if wire_type in _FIXED_SIZE:
        size = _FIXED_SIZE[wire_type]
        if end - pos < size:
            raise truncated(path, offset, f"{field_label(number, names)} declares", size, end - pos)
        return Field(number, wire_type, offset, pos, pos + size, None)
    label = field_label(number, names)
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


class Run(NamedTuple):
    """Consecutive fields indexed in bulk by iter_runs: buf[start:end], and per field its parts (absolute)."""

    start: int
    end: int
    offsets: np.ndarray      # where each tag starts
    numbers: np.ndarray
    wire_types: np.ndarray
    starts: np.ndarray       # where each value starts (after a LEN field's length; a varint's tag), as read_field
    ends: np.ndarray         # where each field ends
    overlong: bool           # whether a tag in the run takes more bytes than it needs


def iter_runs(buf, pos: int, end: int, stop=None) -> Iterator[Run]:
    """Index the fields from `pos` in bulk, a window at a time, until one that bulk indexing leaves to read_field.

    `stop(numbers, wire_types, starts, ends)` (arrays) marks fields the caller
    reads itself. Also left: damaged fields (read_field then says what is
    wrong), groups, 10-byte varints, and fields longer than a window. The
    runs yielded are consecutive from `pos`; the last one's end is where
    read_field takes over.

    How: every byte of a window is decoded at once as if a field started
    there (numpy), giving where that field would end; the chain of fields
    from the window's start is then followed by pointer doubling. No Python
    call is made per field, so millions of tiny fields (unknown ones, empty
    layers) cost what their bytes do.
    """
    while pos < end:
        run = _index_window(buf, pos, min(end, pos + _RUN_WINDOW), stop)
        if run is None:
            return
        yield run
        pos = run.end


# Bytes decoded at a time by iter_runs: its arrays take about 100 bytes per
# byte of window, kept well within the 1 MiB reading may use beyond a file's size.
_RUN_WINDOW = 1 << 13
_PAD = 16
# A varint's 7-bit groups gathered from the little-endian word it starts (at most 5 bytes here).
_GROUPS = tuple((np.uint64(k), np.uint64(0x7F << (7 * k))) for k in range(5))
# _LOW[n]: a mask of the low n bytes of a word.
_LOW = np.array([(1 << (8 * n)) - 1 for n in range(8)] + [(1 << 64) - 1] * (_PAD + 1), dtype=np.uint64)


def _index_window(buf, w0: int, w1: int, stop) -> Run | None:
    """The run of fields from w0 that lie within buf[w0:w1], or None if the first field is not taken."""
    width = w1 - w0
    b = np.zeros(width + _PAD, dtype=np.uint8)
    b[:width] = np.frombuffer(buf, dtype=np.uint8, count=width, offset=w0)
    # The 8 bytes from each position as one little-endian word (a view, one byte apart).
    words = np.ndarray((width + _PAD - 8,), dtype="<u8", buffer=b, strides=(1,))
    index = np.arange(width + _PAD, dtype=np.int32)
    # The first varint-ending byte (high bit clear) at or after each position.
    term = np.minimum.accumulate(np.where(b < 0x80, index, np.int32(width + _PAD))[::-1])[::-1]
    at = index[:width]
    tag_len = term[:width] - at + 1
    tag = _varints(words[:width], tag_len)
    numbers = (tag >> np.uint64(3)).astype(np.int64)
    wire_types = (tag & np.uint64(7)).astype(np.int32)
    value = np.minimum(at + tag_len, width)
    value_len = term[value] - value + 1
    is_len = wire_types == LEN
    is_varint = wire_types == VARINT
    length = np.where(is_len, _varints(words[value], value_len).astype(np.int64) + value_len, 0)
    starts = np.where(is_varint, at, value + np.where(is_len, value_len, 0))  # as read_field
    ends = value + _VALUE_SIZE[wire_types] + np.where(is_varint, value_len, 0) + length
    takes = ((tag_len <= MAX_TAG_BYTES) & (numbers >= 1) & (numbers <= MAX_FIELD_NUMBER) & (ends <= width)
             & (value_len < np.where(is_len, 5, MAX_VARINT_BYTES)))
    if stop is not None:
        takes &= ~stop(numbers, wire_types, starts + w0, ends + w0)
    if not takes[0]:
        return None
    # Follow the chain of fields from the window's start: a list step per
    # _STRIDE fields (strides made by pointer doubling), then the fields
    # between them in bulk. A field not taken points to itself.
    step = np.append(np.where(takes, ends, at), np.int32(width)).astype(np.int32)
    strides = [step]
    for _ in range(_STRIDE_DOUBLINGS):
        strides.append(strides[-1][strides[-1]])
    jump = strides[-1]
    marks = []
    add = marks.append
    pos = 0
    while True:
        add(pos)
        nxt = int(jump[pos])
        if nxt == pos:
            break
        pos = nxt
    # Row i: the mark and the fields after it, so the rows laid end to end are the chain in order.
    chain = np.empty((len(marks), 1 << _STRIDE_DOUBLINGS), dtype=np.int32)
    chain[:, 0] = marks
    for k in range(1, chain.shape[1]):
        chain[:, k] = step[chain[:, k - 1]]
    chain = chain.reshape(-1)
    chain = chain[chain < width]
    chain = chain[takes[chain]]  # the stop at the end repeats; it is not taken
    end = int(step[chain[-1]])
    lengths = tag_len[chain]
    overlong = bool(np.any((lengths > 1) & (b[chain + lengths - 1] == 0)))
    return Run(w0, w0 + end, chain + w0, numbers[chain], wire_types[chain], starts[chain] + w0, ends[chain] + w0,
               overlong)


# Bytes of a value after its tag, by wire type, but for the varints (a value,
# or a LEN field's length); past any window for groups and invalid types.
_VALUE_SIZE = np.array([0, 8, 0, 1 << 30, 1 << 30, 4, 1 << 30, 1 << 30], dtype=np.int64)
# iter_runs steps through a window's chain of fields 2**_STRIDE_DOUBLINGS at a time.
_STRIDE_DOUBLINGS = 4


def _varints(words: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The varints of `lengths` bytes that start `words` (those longer than 5 bytes: garbage, refused by callers)."""
    low = words & _LOW[np.minimum(lengths, 8)]
    out = low & _GROUPS[0][1]
    for shift, mask in _GROUPS[1:]:
        out |= (low >> shift) & mask
    return out


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


def protobuf_ready(buf, start: int, end: int, nested: frozenset = frozenset()) -> bytes:
    """buf[start:end] as protobuf's parser must get it: as it is, or with minimal tags (see minimal_tags).

    Only protobuf's pure-Python runtime misreads a padded tag; the compiled
    ones (upb, cpp) get the bytes untouched, without a pass over each field.
    """
    if _pure_python_protobuf():
        return minimal_tags(buf, start, end, nested)
    return bytes(buf[start:end])


@functools.lru_cache(maxsize=None)
def _pure_python_protobuf() -> bool:
    from google.protobuf.internal import api_implementation  # protobuf loads only where it parses

    return api_implementation.Type() == "python"


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
    add_bytes(spans, f.offset, f.end)


def add_bytes(spans: list, start: int, end: int) -> None:
    """Append buf[start:end] to a list of (start, end) spans, joining it to the last one when adjacent."""
    if spans and spans[-1][1] == start:
        spans[-1] = (spans[-1][0], end)
    else:
        spans.append((start, end))
