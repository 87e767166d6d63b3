"""A BlobProto's small fields: its shape, the legacy dims, and what protobuf makes of the rest.

parse_blob (blobproto.py) locates the payloads itself and hands the other
fields here as byte spans. The shape fields, in the forms writers use, are
read without protobuf (SimpleHeader; loading protobuf costs about 11 ms);
anything else goes through protobuf's parser, after check_axes has refused a
forged shape of more axes than a blob has, counting them in bulk whatever the
number of shape fields (wire.iter_runs).
"""

from __future__ import annotations

import numpy as np

from . import wire
from ...engine.blob import LEGACY_FIELDS, MAX_BLOB_AXES
from ...errors import FormatError

__all__ = ["SimpleHeader", "simple_header", "parse_header", "check_axes", "count_dims", "new_header", "parse_errors",
           "BLOB_FIELD_NAMES", "SHAPE_FIELD"]

BLOB_FIELD_NAMES = {1: "num", 2: "channels", 3: "height", 4: "width", 5: "data", 6: "diff",
                    7: "shape", 8: "double_data", 9: "double_diff", 10: "raw_data_type/half_data",
                    11: "raw_diff_type/half_diff", 12: "raw_data", 13: "raw_diff"}
SHAPE_FIELD = 7


def new_header():
    from ..._pb.blobtool_caffe_pb2 import BlobProto  # protobuf loads only where a message's small fields are parsed
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
    file then does without (benchmarks/RESULTS.md); tests/formats/test_codec.py
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
# Headers longer than this (a shape of 32 ten-byte dims and the legacy four,
# with room to spare) are left to protobuf, which reads many fields faster.
_MAX_SIMPLE_BYTES = 4 * _MAX_SIMPLE_DIMS_BYTES


def _signed(value: int, bits: int) -> int:
    """A varint's value as protobuf reads it into an int32/int64 field (low bits, two's complement)."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def simple_header(buf, spans) -> SimpleHeader | None:
    """The header's shape fields when they take the common forms, else None (protobuf decides)."""
    if sum(b - a for a, b in spans) > _MAX_SIMPLE_BYTES:  # many fields: protobuf's parser is the faster
        return None
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


def parse_errors() -> tuple:
    """What protobuf's ParseFromString raises on bad bytes.

    DecodeError; and the pure-Python runtime (protobuf 3.20 where no compiled
    one exists) raises UnicodeDecodeError for a string that is not UTF-8 and
    RecursionError for groups nested past Python's recursion limit.
    """
    from google.protobuf.message import DecodeError  # protobuf loads only where a message's small fields are parsed
    return (DecodeError, UnicodeDecodeError, RecursionError)


# BlobProto.shape: a nested message whose tags minimal_tags rewrites too.
_NESTED_FIELDS = frozenset({SHAPE_FIELD})


def parse_header(buf, spans, path):
    """The small fields in `spans` parsed by protobuf (a BlobProto message without payloads)."""
    header = new_header()
    raw = b"".join(wire.protobuf_ready(buf, a, b, _NESTED_FIELDS) for a, b in spans)
    try:
        header.ParseFromString(raw)
    except parse_errors() as exc:
        # Find the field protobuf refused, to say where it is.
        for f in (f for a, b in spans for f in wire.iter_fields(buf, a, b)):
            try:
                new_header().ParseFromString(bytes(buf[f.offset:f.end]))
            except parse_errors():
                raise FormatError(f"{wire.field_label(f.number, BLOB_FIELD_NAMES)}: invalid contents ({exc})",
                                  path=path, offset=f.offset) from exc
        raise FormatError(f"invalid BlobProto fields ({exc})", path=path, offset=spans[0][0] if spans else 0) from exc
    return header



def check_axes(buf, shape_fields: list, path, *, counted: int = 0, first: int | None = None) -> None:
    """Refuse a `shape` of more than MAX_BLOB_AXES dims before protobuf builds their list.

    `shape_fields` holds the (offset, start, end) of shape fields in file
    order; `counted` dims were counted already (count_dims, in bulk), the
    first of their fields at `first` when it comes before these. Each axis
    ends at a byte below 0x80, so the bytes bound the axes: only past
    MAX_BLOB_AXES are the dims counted.
    """
    if counted + sum(e - s for _, s, e in shape_fields) <= MAX_BLOB_AXES:
        return  # fewer bytes than that: fewer axes too
    axes = counted
    if shape_fields:
        more = count_dims(buf, np.array([s for _, s, _ in shape_fields]), np.array([e for _, _, e in shape_fields]))
        if more is None:
            return  # protobuf will say what is wrong with it
        axes += more
        first = shape_fields[0][0] if first is None else min(first, shape_fields[0][0])
    if axes > MAX_BLOB_AXES:
        raise FormatError(f"field 7 (shape): invalid blob shape: a blob has at most {MAX_BLOB_AXES} axes, "
                          f"got {axes}", path=path, offset=first)


def count_dims(buf, starts: np.ndarray, ends: np.ndarray) -> int | None:
    """The BlobShape.dim values in the shape fields whose contents are buf[starts[i]:ends[i]] (their dims
    append); None when a content is not fields."""
    return _count_dims(memoryview(_contents(buf, starts, ends)))


def _contents(buf, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The bytes of buf[starts[i]:ends[i]] for every i, concatenated (one copy, at most the input's size)."""
    lengths = ends - starts
    if starts.size == 1:
        return np.frombuffer(buf, np.uint8, int(lengths[0]), int(starts[0]))
    flat = np.frombuffer(buf, np.uint8)
    out = np.empty(int(lengths.sum()), np.uint8)
    filled = 0
    # In groups, gathered through an index array when small (many tiny
    # shapes), else copied shape by shape, so the index never outgrows the bytes.
    for a in range(0, starts.size, _GROUP):
        s, n = starts[a:a + _GROUP], lengths[a:a + _GROUP]
        total = int(n.sum())
        if total <= 8 * _GROUP:
            index = np.repeat(s - np.concatenate(([0], np.cumsum(n)[:-1])), n) + np.arange(total)
            out[filled:filled + total] = flat[index]
        else:
            pos = filled
            for start, length in zip(s.tolist(), n.tolist()):
                out[pos:pos + length] = flat[start:start + length]
                pos += length
        filled += total
    return out


# Shape fields gathered at a time by _contents.
_GROUP = 1 << 12


def _count_dims(content) -> int | None:
    """BlobShape.dim values in `content` (shapes merge: their dims append); None when it is not fields."""
    axes = 0
    pos, end = 0, len(content)
    raw = np.frombuffer(content, np.uint8)
    while pos < end:
        for run in wire.iter_runs(content, pos, end):
            dims = run.numbers == 1
            axes += int(np.count_nonzero(dims & (run.wire_types == wire.VARINT)))
            packed = dims & (run.wire_types == wire.LEN)
            if packed.any():  # a packed value ends at each byte < 0x80
                ended = np.concatenate(([0], np.cumsum(raw[run.start:run.end] < 0x80)))  # values ended before i
                axes += int((ended[run.ends[packed] - run.start] - ended[run.starts[packed] - run.start]).sum())
            pos = run.end
        if pos < end:
            try:
                f = wire.read_field(content, pos, end)
            except FormatError:
                return None  # protobuf will say what is wrong with it
            if f.number == 1 and f.wire_type == wire.LEN:
                axes += int(np.count_nonzero(raw[f.start:f.end] < 0x80))
            elif f.number == 1 and f.wire_type == wire.VARINT:
                axes += 1
            pos = f.end
    return axes
