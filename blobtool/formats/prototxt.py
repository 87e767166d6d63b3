"""Caffe's net definitions in protobuf's text format (.prototxt, .pbtxt): read as a net, and written.

Reading: the text is parsed by protobuf's text_format into a NetParameter
(V1 or V2 layers, `input:`/`input_shape` or Input layers), as Caffe's
ReadProtoFromTextFile reads it; V1 layers are then upgraded as Caffe does
(formats/caffe/netdef.py). The document is a net with its layers and no
blobs: `info`, `info --layers` and `convert -o x.caffemodel` (the binary
form of the same message, V1 staying V1) work on it. Text that is not a
NetParameter is refused naming the line and column of the first error.

Writing: a net's definition (a .caffemodel's, a .prototxt's) without its
blobs, V1 nets as Caffe's upgrade writes them (V2). Only the fields the
input sets are written: protobuf writes no defaults.

Bounds: protobuf's text parser is pure Python. Measured on this project's
2-core machine it reads 1.5 MB/s (an 8,000-layer ResNet-style definition,
2.7 MB, in 1.8 s; one 16 MB string in 0.34 s), so the text is capped at
MAX_TEXT (about 6 s at worst; the largest published Caffe definitions are
under 1 MB) and its layers are counted with one regular expression before
parsing, to refuse more than MAX_BLOBS (formats.MAX_BLOBS, the layer cap) at once. The schema has no
recursive message, so nesting is at most a few levels deep whatever the
text holds.
"""

from __future__ import annotations

import re

from ..errors import FormatError, UsageError
from . import NetLayer, unique_names, MAX_BLOBS

__all__ = ["sniff", "read", "write", "looks_like_text", "MAX_TEXT"]

# A definition's text is refused past this size (see the module doc).
MAX_TEXT = 8 << 20

# A layer opening in text: `layer {`, `layers {` or `layer: {`, after a non-name character.
_LAYER_OPENING = re.compile(rb"(?<![A-Za-z0-9_])layers?\s*(?::\s*)?\{")  # one way to match blanks: linear

# Blank space and comments, then the first field name and what follows it. Each
# repetition matches one blank or one whole comment, in one way only, so a
# head that fails to match costs a single pass (a `\s+` inside the
# repetition would try every split of a run of blanks: exponential).
_FIRST_FIELD = re.compile(rb"(?:[ \t\r\n\f\v]|#[^\n]*(?:\n|\Z))*([A-Za-z_][A-Za-z0-9_]*)[ \t\r\n]*([:{])")

# NetParameter's field names: text starting with one of them is a net definition.
_NET_FIELDS = frozenset({b"name", b"input", b"input_shape", b"input_dim", b"force_backward", b"state",
                         b"debug_info", b"layer", b"layers"})

# How much of a file the sniffer looks at.
_HEAD = 1 << 16

# Bytes that no protobuf text holds (control characters but tab, newlines, form feed).
_BINARY = re.compile(rb"[\x00-\x08\x0e-\x1f\x7f]")


def looks_like_text(buf) -> bool:
    """Whether a file's first bytes are protobuf's text format.

    Text whose first field is a NetParameter field is; so is any text of
    printable characters that starts with a field (`net: ...`, `base_lr:`),
    to be refused by the parser with its line and column rather than read
    as binary. A binary protobuf's first bytes hold tags and lengths, which
    are control characters or bytes past ASCII.
    """
    head = bytes(buf[:_HEAD])
    m = _FIRST_FIELD.match(head)
    if m is None:
        return False
    if m.group(1) in _NET_FIELDS:
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # a character cut at the end of the head is still text
            return False
    return _BINARY.search(head) is None


def sniff(source) -> str:
    return "net"


def read(doc, cast=None) -> None:
    """Parse the text as a NetParameter: doc.parsed, doc.definition and doc.layers (no blobs)."""
    from google.protobuf import text_format  # protobuf loads only where a definition is read

    from .._pb import blobtool_caffe_pb2 as pb
    from .caffe.containers import text
    from .caffe.netdef import from_message

    if doc.size > MAX_TEXT:
        raise FormatError(f"a net definition in text of {doc.size:,} bytes; blobtool reads at most {MAX_TEXT:,} "
                          "(its text parser reads about 1.5 MB/s)", path=doc.path)
    data = bytes(doc.source.buf)
    count = 0
    for m in _LAYER_OPENING.finditer(data):
        count += 1
        if count > MAX_BLOBS:
            raise FormatError(f"holds more than {MAX_BLOBS} layers (blobtool's limit)", path=doc.path,
                              offset=m.start())
    try:
        content = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise FormatError(f"line {line}: not UTF-8 text (byte {exc.start})", path=doc.path) from exc
    net = pb.NetParameter()
    try:
        text_format.Parse(content, net)
    except text_format.ParseError as exc:
        raise FormatError(_parse_error(exc), path=doc.path) from exc
    doc.parsed = net
    doc.definition = from_message(net, doc.path)
    doc.meta["name"] = text(net.name) if net.HasField("name") else None
    blobs = sum(len(layer.blobs) for layer in net.layer) + sum(len(layer.blobs) for layer in net.layers)
    if blobs:
        doc.meta["text_blobs"] = blobs
    layers = doc.definition.layers
    names = unique_names([text(layer.message.name) for layer in layers])
    doc.layers = [NetLayer(name, text(layer.message.type), layer.message) for name, layer in zip(names, layers)]


def _parse_error(exc) -> str:
    """text_format's message as one line: "line L, column C: what", with Caffe's message names."""
    message = str(exc)
    line, column = exc.GetLine(), exc.GetColumn()
    if line is not None:
        message = re.sub(r"^\d+:\d+ : ", "", message)
    message = message.replace('"blobtool.caffe.', '"caffe.')
    where = f"line {line}, column {column}: " if line is not None else ""
    return f"not a Caffe net definition: {where}{message}"


def write(doc, entries, blobs, dest, *, kind, precision=None, write_diff=None, layout=None, transforms=None) -> None:
    """Write `doc`'s definition (formats/caffe/netdef.py) as text, atomically; its blobs are not written."""
    from google.protobuf import text_format  # protobuf loads only where a definition is written

    from ..files import atomic_output
    from .caffe.netdef import definition

    if doc is None:
        raise UsageError("a .prototxt holds a net's definition, and blobs made in Python have none")
    asked = [flag for flag, given in (("--float/--double/--half", precision is not None and (
        precision.name is not None or precision.per_blob)), ("--shape/--legacy", layout is not None)) if given]
    if asked:
        raise UsageError(f"a .prototxt holds a net's definition, no blob values: {' and '.join(asked)} "
                         "would change nothing", path=doc.path)
    net = definition(doc).net
    content = text_format.MessageToString(net, as_utf8=True)
    with atomic_output(dest) as out:
        out.write(content.encode("utf-8"))
