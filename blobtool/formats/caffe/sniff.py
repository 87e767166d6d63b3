"""Which of Caffe's protobuf messages a file holds (blob, vector, net, solver state), from its top-level fields.

A protobuf message has no signature: the top-level fields (number, wire
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
"""

from __future__ import annotations

import itertools

from . import wire
from .blobproto import BLOB_FIELD_NAMES, BLOB_WIRE_PAIRS, PAYLOAD_FIELDS, SHAPE_FIELD, TYPE_FIELDS
from ...errors import FormatError, parameter

__all__ = ["sniff"]


# The first bytes of a file that, all printable, make it text.
_TEXT_SAMPLE = 512


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
        # Fields read from printable bytes are text's letters, not a damaged message's.
        if (not pairs or (exc.offset is not None and exc.offset < _TEXT_SAMPLE)) and _looks_like_text(source):
            raise FormatError("not a Caffe file: text, but not protobuf's text format (a net definition, "
                              ".prototxt, starts with a field: `name: \"...\"`, `layer {`)",
                              path=source.name) from exc
        # Damaged: decide from the fields read so far (none: a BlobProto, as
        # protobuf would), and let that kind's reader report the damage with
        # its field names.
    kind = _decide(pairs, first, buf)
    if kind is None:
        fields = ", ".join(f"{n}/{wire.WIRE_TYPE_NAMES[t]}" for n, t in sorted(pairs)[:8])
        raise FormatError(f"not a BlobProto, BlobProtoVector, NetParameter or SolverState: top-level fields "
                          f"{fields} match none of them (use {parameter('kind')} to force one)", path=source.name)
    return kind


def _looks_like_text(source) -> bool:
    sample = bytes(source.buf[:_TEXT_SAMPLE])
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
