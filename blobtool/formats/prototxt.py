"""Caffe's net definitions in protobuf's text format (.prototxt, .pbtxt): read as a net, and written.

Reading: the text is parsed by protobuf's text_format into a NetParameter
(V1 or V2 layers, `input:`/`input_shape` or Input layers), as Caffe's
ReadProtoFromTextFile reads it; V1 layers are then upgraded as Caffe does
(formats/caffe/netdef.py). The document is a net with its layers and no
blobs: `info`, `info --layers` and `definition x.prototxt -o x.caffemodel` (the binary
form of the same message, V1 staying V1) work on it. Text that is not a
NetParameter is refused naming the line and column of the first error.

Writing: a net's definition (a .caffemodel's, a .prototxt's) without its
blobs, V1 nets as Caffe's upgrade writes them (V2). Only the fields the
input sets are written: protobuf writes no defaults.

A layer's field the schema does not know (a fork's, ENet's `bn_param`) is
read as the binary reader reads one: when protobuf refuses the text for
such a field, one walk of the tokens against the schema blanks every
layer's unknown fields out (_without_unknown_fields), the text is parsed
again, and the layers' definitions name them (netdef.LayerDef.lost). An
unknown field elsewhere is protobuf's error, as before. Such a text costs
up to two parses and the walk (its tokens' positions in arrays: 9 bytes a
token).

Bounds: protobuf's text parser is pure Python, and its time and memory
follow the text's tokens, lines and messages more than its bytes: a
million one-character values (`data: [1,1,...]`, 2 MB) cost as much as a
million names. So before parsing, one scan (_scan) tokenizes the text as
protobuf's tokenizer does (comments, both quotes and their escapes, `{}`
and `<>` messages, `[...]` lists) and refuses, naming the line and column
where a bound is passed: more than MAX_TEXT bytes, MAX_LINES lines,
MAX_TOKENS tokens (a comment counts as one), MAX_MESSAGES messages
opened, MAX_BLOBS (formats.MAX_BLOBS) top-level `layer`/`layers` fields
(list syntax included), a line longer than MAX_LINE characters, or a run
of more than MAX_BACKSLASHES backslashes. Measured on this project's
2-core machine (benchmarks/text_bounds.py), protobuf's parser takes 1 to
3 us a token, 0.2 to 0.6 us a line and up to 1.2 KB a message, on upb
or on its pure-Python runtime (3.20.3), so the worst text within
the bounds takes about 3.5 s and 140 MB (docs/performance.md). Real
definitions are far inside them (a ResNet-152 deploy definition: 670
layers, 15,000 tokens, 1,138 messages, 6,104 lines). The layers the
parser made are counted again after parsing. The lines are handed to the
parser one at a time (not split into a list of millions), and the schema
has no recursive message, so nesting is at most a few levels deep
whatever the text holds. A text starting with a byte-order mark is
refused (protobuf's text format has none), and so is one of comments and
blanks only (no net in it), as an empty binary file is.
"""

from __future__ import annotations

import array
import codecs
import itertools
import re

from ..errors import FormatError, UsageError, parameter
from . import NetLayer, unique_names, MAX_BLOBS

__all__ = ["sniff", "read", "write", "looks_like_text", "definition_text", "MAX_TEXT", "MAX_TOKENS", "MAX_LINES",
           "MAX_MESSAGES", "MAX_LINE", "MAX_BACKSLASHES"]

# The bounds on a definition's text (see the module doc), each checked by
# one scan before parsing. Protobuf's parser takes 1-3 us a token and
# 0.2-0.6 us a line (a blank or comment line too): a million of each, a
# few seconds. Each message ({...} or <...>) it makes costs up to 0.5 KB
# (upb) or 1.2 KB (protobuf's pure-Python runtime): 65,536 of them, 80 MB
# at most; a net at the layer cap with a few parameter messages a layer
# (param, convolution_param, its fillers) holds about 50,000.
MAX_TEXT = 8 << 20
MAX_TOKENS = 1 << 20
MAX_LINES = 1 << 20
MAX_MESSAGES = 1 << 16
# Protobuf's tokenizer matches a line with regular expressions that keep
# about 150 bytes per character of a run of blanks, or of a string's
# escapes, in that line (a 4 MB line of "\377" escapes took 600 MB).
MAX_LINE = 1 << 16
# Protobuf unescapes a string in time growing with the square of each run
# of backslashes (65,536 in a row: 10 s); real text has runs of one or two.
MAX_BACKSLASHES = 64

# The NetParameter fields that are layers (V2, V1).
_LAYER_FIELDS = frozenset({"layer", "layers"})

# One token as protobuf's tokenizer (text_format.Tokenizer) splits the text,
# once every escaped backslash or quote has been replaced by two letters: a
# message's opening or closing bracket, a name, a string (to its closing
# quote or the end of its line, as protobuf's), a comment, a number, any
# other character. Blanks are skipped by the search.
# Every repetition is of one character class, which the regular expression
# engine matches keeping no state per character.
_TOKEN = re.compile(r"""
    ([{<]) | ([}>]) | ([A-Za-z_][0-9A-Za-z_+-]*)
    | "[^"\n]*"? | '[^'\n]*'? | \#[^\n]*
    | (?:[0-9+-]|\.[0-9])[0-9A-Za-z_.+-]* | \S
""", re.VERBOSE)
_OPEN, _CLOSE, _NAME = 1, 2, 3
_LONG_LINE = re.compile(r"^[^\n]{%d}" % (MAX_LINE + 1), re.MULTILINE)  # tried at line starts only: linear
_BACKSLASH_RUN = re.compile(r"(?<!\\)\\{%d}" % (MAX_BACKSLASHES + 1))  # tried at run starts only: linear

# Blank space and comments, then the first field name, blanks and comments,
# and what follows it (`:`, `{` or `<`). Each repetition matches one blank
# or one whole comment, in one way only, so a head that fails to match
# costs a single pass (a `\s+` inside the repetition would try every split
# of a run of blanks: exponential).
_SKIP = rb"(?:[ \t\r\n\f\v]|#[^\n]*(?:\n|\Z))*"
_FIRST_FIELD = re.compile(_SKIP + rb"([A-Za-z_][A-Za-z0-9_]*)" + _SKIP + rb"([:{<])")
_BLANKS_AND_COMMENTS = re.compile(_SKIP)

# NetParameter's field names: text starting with one of them is a net definition.
_NET_FIELDS = frozenset({b"name", b"input", b"input_shape", b"input_dim", b"force_backward", b"state",
                         b"debug_info", b"layer", b"layers"})

# How much of a file the sniffer looks at.
_HEAD = 1 << 16

# Bytes that no protobuf text holds (control characters but tab, newlines, form feed).
_BINARY = re.compile(rb"[\x00-\x08\x0e-\x1f\x7f]")


def looks_like_text(buf) -> bool:
    """Whether a file's first bytes are protobuf's text format.

    Text whose first field is a NetParameter field is, after a byte-order
    mark, blanks and comments, and with blanks or comments between the
    name and its `:`, `{` or `<`; so is any text of printable characters
    that starts with a field (`net: ...`, `base_lr:`), holds only comments
    so far, or starts with a byte-order mark, to be refused by the text
    reader with its line and column rather than read as binary. A binary
    protobuf's first bytes hold tags and lengths, which are control
    characters or bytes past ASCII (and no Caffe message starts with `#`,
    field 4 as a group, or with U+FEFF's bytes, a field number in the
    millions).
    """
    head = bytes(buf[:_HEAD])
    bom = head.startswith(codecs.BOM_UTF8)
    if bom:
        head = head[len(codecs.BOM_UTF8):]
    m = _FIRST_FIELD.match(head)
    if m is not None and m.group(1) in _NET_FIELDS:
        return True
    if m is None and not bom and not _comments_only(head):
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # a character cut at the end of the head is still text
            return False
    return _BINARY.search(head) is None


def _comments_only(head: bytes) -> bool:
    return b"#" in head and _BLANKS_AND_COMMENTS.match(head).end() == len(head)


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
    if data.startswith(codecs.BOM_UTF8):
        raise FormatError("line 1, column 1: text that starts with a byte-order mark (U+FEFF), which protobuf's "
                          "text format does not take; save it without one", path=doc.path)
    try:
        content = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise FormatError(f"line {line}: not UTF-8 text (byte {exc.start})", path=doc.path) from exc
    del data
    _scan(content, doc.path)
    net = pb.NetParameter()
    unknown: dict = {}
    try:
        text_format.ParseLines(_lines(content), net)
    except text_format.ParseError as exc:
        if _UNKNOWN_FIELD.search(str(exc)) is None:
            raise FormatError(_parse_error(exc), path=doc.path) from exc
        # A fork's field (ENet's bn_param): read as the binary reader reads one, passed over and
        # named, so that the layer and its type can be named where they matter.
        content, unknown = _without_unknown_fields(content, pb.NetParameter.DESCRIPTOR)
        net = pb.NetParameter()
        try:
            text_format.ParseLines(_lines(content), net)
        except text_format.ParseError as later:  # an error past the fields passed over, where the text has it
            raise FormatError(_parse_error(later), path=doc.path) from later
    if len(net.layer) + len(net.layers) > MAX_BLOBS:  # the scan counted them: this holds whatever it missed
        raise FormatError(f"holds more than {MAX_BLOBS:,} layers (blobtool's limit): "
                          f"{len(net.layer) + len(net.layers):,}", path=doc.path)
    doc.parsed = net
    doc.definition = from_message(net, doc.path, unknown)
    doc.meta["name"] = text(net.name) if net.HasField("name") else None
    blobs = sum(len(layer.blobs) for layer in net.layer) + sum(len(layer.blobs) for layer in net.layers)
    if blobs:
        doc.meta["text_blobs"] = blobs
    layers = doc.definition.layers
    names = unique_names([text(layer.message.name) for layer in layers])
    doc.layers = [NetLayer(name, text(layer.message.type), message=layer.message) for name, layer in zip(names, layers)]


def _scan(content: str, path) -> int:
    """The layers of a text; FormatError for text past a bound of the module doc, naming the line and column.

    The tokens are protobuf's (_TOKEN); the layers are the messages opened
    at the top level whose field, the last name there, is `layer` or
    `layers` (`layer {`, `layer <`, `layer: [{...}, {...}]`, a comment
    between). Text protobuf would refuse is counted as it comes: the parser
    stops at its first error, before anything the count got wrong after it.
    """
    def refuse(pos: int, what: str):
        line = content.count("\n", 0, pos) + 1
        column = pos - content.rfind("\n", 0, pos)
        raise FormatError(f"line {line:,}, column {column:,}: {what} (blobtool's limit for a net definition in text)",
                          path=path)

    if content.count("\n") + (not content.endswith("\n")) > MAX_LINES:
        at = 0
        for _ in range(MAX_LINES):
            at = content.index("\n", at) + 1
        refuse(at, f"more than {MAX_LINES:,} lines")
    m = _LONG_LINE.search(content)
    if m:
        refuse(m.start() + MAX_LINE, f"a line longer than {MAX_LINE:,} characters")
    if "\\" in content:
        m = _BACKSLASH_RUN.search(content)
        if m:
            refuse(m.start(), f"more than {MAX_BACKSLASHES} backslashes in a row")
    clean = _unescaped(content)
    tokens = _TOKEN.finditer(clean)
    depth = messages = layers = 0
    field = None
    for m in itertools.islice(tokens, MAX_TOKENS):
        kind = m.lastindex
        if kind == _OPEN:
            messages += 1
            if messages > MAX_MESSAGES:
                refuse(m.start(), f"more than {MAX_MESSAGES:,} messages ({{...}} or <...>)")
            if depth == 0 and field in _LAYER_FIELDS:
                layers += 1
                if layers > MAX_BLOBS:
                    refuse(m.start(), f"more than {MAX_BLOBS:,} layers")
            depth += 1
        elif kind == _CLOSE:
            depth = max(depth - 1, 0)
        elif kind == _NAME and depth == 0:
            field = m.group(_NAME)
    extra = next(tokens, None)
    if extra is not None:
        refuse(extra.start(), f"more than {MAX_TOKENS:,} tokens")
    if field is None and not messages and all(clean[t.start()] == "#" for t in _TOKEN.finditer(clean)):
        raise FormatError("text of comments and blanks only, no field: no net definition in it", path=path)
    return layers


def _unescaped(content: str) -> str:
    """`content` with each escape made two letters, so that a string ends where protobuf's tokenizer ends it.

    Backslashes pair from the left as protobuf pairs them; of what a lone
    backslash escapes, only a quote changes where a string ends. Same length,
    so positions stay; str.replace makes no object a match (re.sub did: 2
    million escapes, 190 MB).
    """
    if "\\" not in content:
        return content
    return content.replace("\\\\", "__").replace('\\"', "__").replace("\\'", "__")


# protobuf's words for a field name the schema does not have (every runtime since 3.20).
_UNKNOWN_FIELD = re.compile(r'has no field named "?[A-Za-z_]')


def _without_unknown_fields(content: str, descriptor) -> tuple[str, dict]:
    """(`content` with the layers' fields the schema does not know blanked out, {layer index: their names}).

    Walks the tokens (_TOKEN, as _scan splits them) with the schema's
    descriptors. A field name a layer (`layer` or V1 `layers`) has no field
    for is a fork's (ENet's `bn_param`): its value (a scalar, a run of
    strings, a `{...}`/`<...>` message or a `[...]` list) is replaced by
    blanks, newlines kept, so that protobuf's parser reads the rest and its
    errors keep their lines and columns. An unknown field anywhere else (the
    net's own, as a solver's text has; one inside a parameter message Caffe
    knows, most often a misspelt setting that would change what the layer
    computes) stops the walk: the text from there is left as it is, for
    protobuf to refuse with that field's line and column. The keys are the
    layers' indices (V2 layers first, then V1, as netdef.from_message
    orders them); the values, the names of their unknown fields.
    """
    clean = _unescaped(content)
    walk = _Walk(clean)
    layers = {"layer": [], "layers": []}  # per layer field, the unknown fields of each layer in order
    try:
        walk.message(0, len(walk), descriptor, [], layers)
    except _Unexpected:
        pass  # the fields passed over so far are cut; protobuf names what is wrong after them
    if not walk.cut:
        return content, {}
    parts, at = [], 0
    for a, b in walk.cut:
        parts.append(content[at:a])
        parts.append(re.sub(r"[^\n]", " ", content[a:b]))
        at = b
    parts.append(content[at:])
    return "".join(parts), {k: names for k, names in enumerate(layers["layer"] + layers["layers"]) if names}


class _Unexpected(Exception):
    """Text that is not a message as _Walk expects it: left for protobuf's parser to refuse."""


class _Walk:
    """The walk of _without_unknown_fields: each message's fields against its descriptor, unknown ones cut.

    Tokens are kept as their starts and ends in arrays, 9 bytes a token (a
    million match objects took over 100 MB), comments left out.
    """

    def __init__(self, clean: str):
        self.clean = clean
        self.starts, self.ends, self.named = array.array("i"), array.array("i"), bytearray()
        for m in _TOKEN.finditer(clean):
            if clean[m.start()] != "#":
                self.starts.append(m.start())
                self.ends.append(m.end())
                self.named.append(m.lastindex == _NAME)
        self.cut: list = []   # (start, end) in the text of each unknown field

    def __len__(self) -> int:
        return len(self.starts)

    def token(self, k: int) -> str:
        return self.clean[self.starts[k]:self.ends[k]]

    def value_end(self, k: int, end: int) -> int:
        """The index past the value starting at token k (a message's or a list's closing bracket included)."""
        if k >= end:
            raise _Unexpected
        first = self.token(k)
        if first in ("{", "<", "["):
            depth = 0
            for j in range(k, end):
                t = self.clean[self.starts[j]]
                if t in "{<[" and self.ends[j] - self.starts[j] == 1:
                    depth += 1
                elif t in "}>]" and self.ends[j] - self.starts[j] == 1:
                    depth -= 1
                    if depth == 0:
                        return j + 1
            raise _Unexpected
        k += 2 if first == "-" else 1
        if first[:1] in "\"'":
            while k < end and self.clean[self.starts[k]] in "\"'":
                k += 1  # adjacent strings are one value
        return k

    def message(self, i: int, end: int, descriptor, paths: list, layers: dict | None, *, layer: bool = False) -> None:
        """Walk the fields in tokens [i, end) of a message of `descriptor`; `layers` only at the net's level.

        Only a layer's own fields (`layer`) may be unknown: elsewhere the walk
        stops there, and protobuf refuses the text with that field's line.
        """
        while i < end:
            token = self.token(i)
            if token in (",", ";"):
                i += 1
                continue
            if not self.named[i]:
                raise _Unexpected
            start = self.starts[i]
            fd = descriptor.fields_by_name.get(token)
            i += 1
            if i < end and self.token(i) == ":":
                i += 1
            stop = self.value_end(i, end)
            if fd is None:
                if not layer:
                    raise _Unexpected  # the net's own field, or one in a known message: protobuf refuses it
                self.cut.append((start, self.ends[stop - 1]))
                paths.append(token)
            elif fd.message_type is not None and layers is not None and token in layers:
                for a, b in self.messages(i, stop):
                    layers[token].append([])
                    self.message(a, b, fd.message_type, layers[token][-1], None, layer=True)
            elif fd.message_type is not None:
                for a, b in self.messages(i, stop):
                    self.message(a, b, fd.message_type, paths, None)
            i = stop

    def messages(self, i: int, stop: int) -> list:
        """[start, end) of the fields of each message in tokens [i, stop): one `{...}`, or each of a `[...]` list."""
        first = self.token(i)
        if first in ("{", "<"):
            return [(i + 1, stop - 1)]
        if first != "[":
            raise _Unexpected
        out, k = [], i + 1
        while k < stop - 1:
            if self.token(k) == ",":
                k += 1
                continue
            after = self.value_end(k, stop - 1)
            if self.token(k) not in ("{", "<"):
                raise _Unexpected
            out.append((k + 1, after - 1))
            k = after
        return out


def _lines(content: str):
    """The lines of `content` without their newlines, one at a time (as text_format.Parse splits them, all at once)."""
    start = 0
    while True:
        end = content.find("\n", start)
        if end < 0:
            yield content[start:]
            return
        yield content[start:end]
        start = end + 1


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
    from ..files import atomic_output
    from .caffe.netdef import definition

    if doc is None:
        raise UsageError("a .prototxt holds a net's definition, and blobs made in Python have none")
    asked = [parameter(name) for name, given in (("precision", precision is not None and (
        precision.name is not None or precision.per_blob)), ("layout", layout is not None)) if given]
    if asked:
        raise UsageError(f"a .prototxt holds a net's definition, no blob values: {' and '.join(asked)} "
                         "would change nothing", path=doc.path)
    content = definition_text(definition(doc).net)
    with atomic_output(dest) as out:
        out.write(content.encode("utf-8"))


def definition_text(net) -> str:
    """A NetParameter in protobuf's text format (UTF-8 strings as they are, other bytes in octal escapes).

    protobuf's printer escapes a string that is not UTF-8 in time that
    grows with the square of its length (a 40 KB name took 0.4 s, 2 MB
    would take about 15 minutes): each such string is printed as a short
    stand-in and its escapes (_escape) are put in its place in one pass.
    """
    from google.protobuf import text_format  # protobuf loads only where a definition is written

    from .._pb import blobtool_caffe_pb2 as pb

    copy = pb.NetParameter()
    copy.CopyFrom(net)
    escaped: list = []
    mark = f"blobtool-escaped-{id(escaped):x}-"
    _stand_ins(copy, escaped, mark)
    content = text_format.MessageToString(copy, as_utf8=True)
    if not escaped:
        return content
    return re.sub(f'"{mark}(\\d+)"', lambda m: '"' + _escape(escaped[int(m.group(1))]) + '"', content)


def _escape(value: bytes) -> str:
    """Bytes as a text format string's contents: printable ASCII as it is, \\, \\', \\", \\t, \\n, \\r, others \\xNN.

    codecs.escape_encode makes Python's bytes-literal escapes in one C pass
    (the text format takes the same escapes; protobuf's own printer writes
    octal ones, in quadratic time); only the double quote is left to escape.
    """
    return codecs.escape_encode(value)[0].replace(b'"', b'\\"').decode("ascii")


def _stand_ins(message, escaped: list, mark: str) -> None:
    """Replace each string field of `message` (nested too) that protobuf holds as bytes by a unique ASCII token."""
    for fd, value in message.ListFields():
        repeated = getattr(fd, "is_repeated", None)
        repeated = repeated if repeated is not None else fd.label == fd.LABEL_REPEATED
        if fd.type == fd.TYPE_STRING:
            values = list(value) if repeated else [value]
            if not any(isinstance(v, bytes) for v in values):
                continue
            tokens = []
            for v in values:
                if isinstance(v, bytes):
                    escaped.append(v)
                    v = f"{mark}{len(escaped) - 1}"
                tokens.append(v)
            if repeated:
                del value[:]
                value.extend(tokens)
            else:
                setattr(message, fd.name, tokens[0])
        elif fd.type == fd.TYPE_MESSAGE:
            for v in (value if repeated else [value]):
                _stand_ins(v, escaped, mark)
