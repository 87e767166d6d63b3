"""File formats: the kinds of file blobtool reads, the registry of format modules, opened documents.

Every input is opened as a Document: its kind, its blobs in file order (each
an Entry that knows its name, shape and dtype without touching the payload),
and the Source whose bytes they view. The kind comes from the bytes (see
sniff() below), never from the file name.

The registry (FORMATS) is the one place that lists the format modules. Each
module reads and writes the kinds it owns and offers the same functions:

``sniff(source)``
    the kind of a file of this format (after its signature matched, or for
    the format without a signature, protobuf); FormatError if none;
``read(doc, cast=None)``
    fill ``doc.entries`` (and ``doc.meta``) for ``doc.kind``; payloads are
    located, not copied.
``write(doc, entries, blobs, dest, *, kind, precision, write_diff, layout, transforms)``
    write the selected blobs to `dest` (atomically) as `kind`.

and may offer ``begin(source, kind)``: start reading in the background what
sniff and read will need (HDF5: the walk of the file's structure, in a child
process), returning a callable that stops it should they never be called;
open_documents uses it so that several inputs are read at once.

A module is imported the first time a file of its format is met, so the
command line's start-up pays only for this file. To add a format: write
``formats/<name>.py`` with those three functions, and add one Format line
below (its kinds, signature, and the --format choices and extensions it
writes). A Document records its format, so two formats may hold the same
kind (a net as protobuf or as another container). A format that only reads
(PyTorch's .pt) writes nothing and names its extensions in `reads`; one
whose signature another shares (a zip) tells its files apart in `claims`.

Kinds and blob names (stable, in file order):

===========  ==========================================  =======================
kind         what                                        blob names
===========  ==========================================  =======================
blob         BlobProto                                   "0"
vector       BlobProtoVector                             "0", "1", ...
net          NetParameter (.caffemodel), three layer     "<layer>/<index>"
             formats; Caffe's HDF5 snapshot (.h5)
solverstate  SolverState (.solverstate); Caffe's HDF5    "history/<index>"
             snapshot (.h5)
npy / npz    numpy's formats                             "0" / the array names
pt           PyTorch's zip checkpoint (torch.save): a    the state dict's keys
             state dict, read without running its pickle
safetensors  safetensors (8-byte header length, JSON     the tensor names
             header, raw little-endian tensors)
===========  ==========================================  =======================

Blob names are unique within a file, whatever the layer names are
(unique_names): a layer keeps its name when it is the first to bear it; an
unnamed layer is "layer<k>" (k its position among all layers); a repeated
name gets "#<n>", n its occurrence (2, 3, ...) or, when a layer of the file
is already called that, the next n free. Since an index holds no "/", distinct
layer names give distinct "<layer>/<index>" names. In .npz and .safetensors
files an array named "<name>/diff" is the diff of "<name>", unless "<name>"
is itself a diff (formats/numpy.py, pair_diffs).

--blob PATTERN (select): a blob's exact name selects that blob only; else a
layer's exact name selects that layer's blobs; only a pattern that is neither
is a glob (fnmatch) over the blob names.

This module imports no format module and nothing heavy (the command line
builds its options from it).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field

from ..errors import BlobToolError, FormatError, UsageError

__all__ = ["Format", "Output", "FORMATS", "EXTENSIONS", "KINDS", "CONTAINER_KINDS", "OUTPUT_FORMATS", "Entry",
           "Document", "NetLayer", "get_format", "format_by_signature", "sniff", "module", "open_document", "document_of",
           "open_documents", "select", "unique_names", "listed_name", "MAX_BLOBS", "MAX_NAME",
           "DEFLATE_MAX_EXPANSION", "PRECISION_TYPES", "NAMING_SCHEMES", "ReadSettings", "read_settings", "reading",
           "use_read_settings"]


@dataclass(frozen=True)
class Output:
    """A choice of --format: its name, the output extensions that choose it, the kind it writes (None: the input's)."""

    name: str
    extensions: tuple
    kind: str | None


@dataclass(frozen=True)
class Format:
    """One file format: the kinds it reads, how its files start, what it writes."""

    name: str              # its module under blobtool.formats
    kinds: tuple           # the kinds it reads
    magic: tuple = ()      # leading bytes that mark its files; () for the format without a signature (protobuf)
    outputs: tuple = ()    # the Output choices it writes
    containers: tuple = ()  # kinds that hold several blobs and are written back as themselves (--format same)
    probe: object = None   # bytes -> bool, for a signature that is not a prefix (light: runs at sniffing); a
                           # name: that function of the format's module (imported at sniffing: keep it light)
    userblock: bool = False  # the signature may also follow a user block: at 512, 1024, 2048, ... (HDF5)
    searched: bool = True  # folders given as input are searched for its extensions (not text: solver files)
    claims: object = None  # buf -> bool: the signature is shared, and this format's files are these (a zip's members)
    reads: tuple = ()      # extensions of files it reads but does not write (folders given as input are searched)


def _safetensors_head(buf) -> bool:
    # An 8-byte little-endian header length (under 2**48: a protobuf file
    # rarely has zero bytes 6 and 7) and the JSON header's opening brace.
    head = bytes(buf[:9])
    return len(head) > 8 and head[6:8] == b"\0\0" and head[8:9] == b"{"


def _torch_zip(buf) -> bool:
    # A zip holding "<archive>/data.pkl" is PyTorch's (torch.save since 1.6);
    # an .npz holds ".npy" members. Entries past MAX_BLOBS and a few records
    # are not looked at: the reader refuses such a file.
    from .zipdir import holds_member

    return holds_member(buf, b"data.pkl", MAX_BLOBS + 64)


FORMATS = (
    Format("caffe", ("blob", "vector", "net", "solverstate"),
           outputs=(Output("blob", (".pb", ".binaryproto", ".blob", ".protobin"), "blob"),
                    Output("protobuf", (".caffemodel", ".solverstate"), None)),
           containers=("vector", "net", "solverstate")),
    Format("hdf5", ("net", "solverstate"), magic=(b"\x89HDF\r\n\x1a\n",), userblock=True,
           outputs=(Output("hdf5", (".h5", ".hdf5"), None),), containers=("net", "solverstate")),
    Format("pytorch", ("pt",), magic=(b"PK\x03\x04",), claims=_torch_zip, reads=(".pt", ".pth")),
    Format("numpy", ("npy", "npz"), magic=(b"\x93NUMPY", b"PK\x03\x04", b"PK\x05\x06"),
           outputs=(Output("npy", (".npy",), "npy"), Output("npz", (".npz",), "npz"))),
    Format("safetensors", ("safetensors",), probe=_safetensors_head,
           outputs=(Output("safetensors", (".safetensors",), "safetensors"),), containers=("safetensors",)),
    Format("prototxt", ("net",), probe="looks_like_text", outputs=(Output("prototxt", (".prototxt", ".pbtxt"), "net"),),
           searched=False),
)

# The file name extensions of the formats blobtool reads (and writes): how a
# folder given as input is searched. A file's kind still comes from its bytes.
# Text definitions are read when named, not found in folders, where Caffe's
# solver and training definitions (solver.prototxt) sit beside the nets.
EXTENSIONS = tuple(dict.fromkeys([ext for fmt in FORMATS if fmt.searched for out in fmt.outputs
                                  for ext in out.extensions] + [ext for fmt in FORMATS for ext in fmt.reads]))

# Every kind --kind accepts, and the ones that hold several named blobs.
KINDS = tuple(dict.fromkeys(kind for fmt in FORMATS for kind in fmt.kinds))
CONTAINER_KINDS = tuple(dict.fromkeys(kind for fmt in FORMATS for kind in fmt.containers))
# What --format accepts: each format's outputs, or "same" (the input's own format and kind).
OUTPUT_FORMATS = tuple(out.name for fmt in FORMATS for out in fmt.outputs) + ("same",)

# A file's blobs, and a net's layers, are each capped at this many. The
# largest Caffe nets hold a few thousand (DenseNet-264, SENet-154: about
# 2,000 blobs). Each costs about 1.5 KB (a blob) or 0.3 KB (a layer) of
# bookkeeping and, per command, 60 to 200 us of Python work (locating,
# building the Blob, listing or comparing it) that no bulk reading removes:
# 16,384 one-value blobs (0.6 MB) took 1.6 s of CPU for `norm` and 3.3 s for
# `compare`, past the 1 s + 0.2 s/MB any input may take; 8,192 take half.
MAX_BLOBS = 1 << 13

# Characters of a layer's (or net's) name, type or learned_net kept, in
# every format: a longer one is damaged or forged.
MAX_NAME = 256

# The most a deflate stream expands (1032:1): a compressed .npz member or
# HDF5 dataset declaring more than that is forged, and refused before it is
# read.
DEFLATE_MAX_EXPANSION = 1032

# The little-endian type each write precision (--float, --double, --half)
# writes values in; numpy dtype strings, so that this registry loads no numpy.
PRECISION_TYPES = {"float": "<f4", "double": "<f8", "half": "<f2"}

# How a document's blobs can be named: blobtool's own names, or a scheme of
# torchport/naming.py (listed here, so that the command's options need not
# import it at start-up).
NAMING_SCHEMES = ("blobtool", "torch", "torch-identifiers")


def get_format(name: str) -> Format:
    """The Format called `name` ("caffe", "numpy", ...)."""
    for fmt in FORMATS:
        if fmt.name == name:
            return fmt
    raise UsageError(f"unknown format {name!r}; expected one of {', '.join(f.name for f in FORMATS)}")


def module(fmt: Format):
    """The module that reads and writes `fmt`, imported on first use."""
    return importlib.import_module(f"{__name__}.{fmt.name}")


def format_by_signature(buf) -> Format | None:
    """The format whose signature a file's bytes `buf` (bytes, mmap, bytearray) hold, or None.

    A format whose own header is at byte 0 (a signature there, or a probe of
    the first bytes) wins. Only when none is does a format with a user block
    (HDF5) get its signature looked for at 512, 1024, 2048, ... bytes, and
    then only a superblock there that gives its own offset as the file's base
    address (as HDF5 writes it after a user block) counts: those eight bytes
    inside an .npy, a safetensors tensor or a Caffe blob's values do not make
    the file HDF5.
    """
    size = len(buf)
    for fmt in FORMATS:
        if any(buf[:len(m)] == m for m in fmt.magic) and (fmt.claims is None or fmt.claims(buf)):
            return fmt
        probe = getattr(module(fmt), fmt.probe) if isinstance(fmt.probe, str) else fmt.probe
        if probe is not None and probe(buf):
            return fmt
    for fmt in FORMATS:
        if not fmt.userblock:
            continue
        offset = _USERBLOCK_START
        while offset < size:
            if any(buf[offset:offset + len(m)] == m for m in fmt.magic) and _based_at(buf, offset):
                return fmt
            offset *= 2
    return None


# The smallest HDF5 user block; larger ones double it.
_USERBLOCK_START = 512
# Where an HDF5 superblock's base address sits, after its signature, by
# superblock version; the size of an address (1 byte) is at the offset given.
_BASE_ADDRESS_AT = {0: (24, 13), 1: (28, 13), 2: (12, 9), 3: (12, 9)}


def _based_at(buf, offset: int) -> bool:
    """Whether the HDF5 superblock at `offset` names `offset` as its base address (the file's first HDF5 byte)."""
    head = bytes(buf[offset:offset + 40])
    if len(head) < 9 or head[8] not in _BASE_ADDRESS_AT:
        return False
    at, size_at = _BASE_ADDRESS_AT[head[8]]
    width = head[size_at] if len(head) > size_at else 0
    if width not in (2, 4, 8, 16) or len(head) < at + width:
        return False
    return int.from_bytes(head[at:at + width], "little") == offset


# -- what a file is, from its bytes ------------------------------------------
#
# A format with a signature (numpy's ".npy" and zip magic, safetensors' header
# length and brace, HDF5's at 0, 512, 1024, ... bytes) is known by it, listed
# in the registry (FORMATS); its module's sniff() then tells the kind. Two
# formats share the zip signature: a zip whose directory names
# "<archive>/data.pkl" is PyTorch's (claims), any other is an .npz.
# A header at byte 0 wins over a signature found deeper: HDF5's signature after
# a user block counts only when no format starts at byte 0 and the superblock
# found there is HDF5's own (format_by_signature). Other well-known
# signatures (gzip, bzip2, xz, a macOS '._' file) are refused with a line
# saying what the file is and what to do. Everything else goes to the format without a signature, Caffe's
# protobuf, whose sniff() reads the kind from the top-level fields (see
# formats/caffe/sniff.py).

# Signatures of files blobtool does not read, and what to say about them.
_MAGICS = (
    (b"\x1f\x8b", "not a Caffe file: this looks like a gzip-compressed file; decompress it first (gunzip -k FILE) "
                  "and read the result"),
    (b"\x00\x05\x16\x07", "not a Caffe file: this looks like a macOS resource-fork file (AppleDouble '._' "
                          "metadata); read the file of the same name without the '._' prefix"),
    (b"BZh", "not a Caffe file: this looks like a bzip2-compressed file; decompress it first (bunzip2 -k FILE)"),
    (b"\xfd7zXZ\x00", "not a Caffe file: this looks like an xz-compressed file; decompress it first (unxz -k FILE)"),
    # torch.save before 1.6: a pickle of the magic number 0x1950a86a20f9469cfc6c first.
    (b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19",
     "a PyTorch file in the legacy format (torch.save before 1.6), a bare pickle that only running it can read; "
     "save it again in PyTorch's zip format, which blobtool reads: "
     "torch.save(torch.load(FILE, weights_only=True), NEW_FILE)"),
)


def sniff(source) -> tuple[Format, str]:
    """(format, kind) of an input (a source.Source), from its bytes.

    Raises FormatError saying what the file looks like when it is none that blobtool reads.
    """
    head = bytes(source.buf[:16])
    fmt = format_by_signature(source.buf)
    if fmt is not None:
        return fmt, module(fmt).sniff(source)
    for magic, what in _MAGICS:
        if head.startswith(magic):
            raise FormatError(what, path=source.name)
    fmt = next(fmt for fmt in FORMATS if not fmt.magic and fmt.probe is None)
    return fmt, module(fmt).sniff(source)


def _format_for_kind(kind: str, head) -> Format:
    """The format to read a file as `kind` (--kind): the one holding that kind whose signature the file has, if any."""
    holders = [fmt for fmt in FORMATS if kind in fmt.kinds]
    if not holders:
        raise UsageError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    marked = format_by_signature(head)
    return marked if marked in holders else next((f for f in holders if not f.magic), holders[0])


@dataclass
class Entry:
    """One blob in a document: what info needs, and a way to get the Blob.

    `record` locates a BlobProto in the bytes (protobuf kinds); `chain` holds
    the fields from the top-level message down to the blob's own field, so a
    writer can replace it in place. Formats that build the Blob at once
    (.npy) set `_blob`; formats without a BlobProto record give `build`, a
    callable that makes the Blob on first use (.npz members inflate their
    values there, HDF5 datasets are viewed or read).
    """

    name: str
    shape: tuple
    layout: str
    dtype: object            # numpy dtype as stored
    has_diff: bool
    record: object = None    # blobproto.BlobRecord
    layer: str | None = None
    type: str | None = None
    chain: tuple = ()
    warning: str | None = None
    _blob: object = None
    build: object = None     # () -> Blob, for an entry without a record
    diff_dtype: object = None  # the diff's stored dtype where it differs from the data's (float data, double diff)

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize

    def blob(self):
        """The Blob, built on first use; float data views the file (no copy)."""
        if self._blob is None:
            if self.build is not None:
                self._blob = self.build()
            else:
                from .caffe.blobproto import blob_from_record  # numpy loads only when values are read (start-up)
                self._blob = blob_from_record(self.record)
        return self._blob

    def blob_unkept(self):
        """The Blob, not kept by the entry when a reader builds it (`build`: an HDF5 dataset, an .npz member).

        Built again on each call, so a command that uses each blob once (norm)
        holds one such blob at a time; a Blob viewing the file is kept as
        blob() keeps it.
        """
        if self._blob is not None or self.build is None:
            return self.blob()
        return self.build()

    def blob_to_write(self):
        """The Blob to hand a writer: values read only as they are written, where the reader can plan without them.

        An entry whose reader builds its Blob (`build`) and can describe it
        without its values (`build.shell()`: shape, dtypes, origin) gives a
        writing.Unread, whose values are read when the writer reaches them
        and let go once written, so an output is written holding one such
        blob at a time. Any other entry gives blob().
        """
        if self._blob is not None or self.build is None or not hasattr(self.build, "shell"):
            return self.blob()
        from .writing import Unread  # numpy loads only when values are read (start-up)

        return Unread(self.build.shell(), self.build)


@dataclass(frozen=True, slots=True)
class NetLayer:
    """One layer of a net, in file order, with or without blobs.

    Its name (as its blobs' names use it), its type (None where the format
    holds none: HDF5), and where the rest of it is: `wire`, in a binary net,
    the layer's field (the layer (100) or V1 layers (2) field, a
    wire.Field) to read more of it from when asked; `message`, in a text
    net, its LayerParameter as parsed (V1 layers upgraded). HDF5 has neither.
    """

    name: str
    type: str | None = None
    wire: object = None
    message: object = None


@dataclass(repr=False)
class Document:
    """An opened input file: its kind, its blobs in order, and its bytes.

    A context manager, as h5py's File: ``with open_document(p) as doc:``
    closes it at the end of the block (close()).
    """

    path: str
    kind: str
    source: object           # source.Source
    entries: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    format: str = "caffe"    # the Format's name: which module reads and writes it
    layers: list = field(default_factory=list)  # a net's layers in file order, blobs or not (NetLayer)
    naming: str = "blobtool"  # how its entries are named: "blobtool", or a scheme of blobtool.naming ("torch")
    # Text a writer that keeps metadata (safetensors' __metadata__) adds for
    # these entries: what --names torch knows beyond the tensors (torchport/metadata.py).
    export_metadata: dict = field(default_factory=dict)
    definition: object = None  # a net's full definition (formats/caffe/netdef.py), parsed when first asked for
    parsed: object = None    # a text input's message as parsed (.prototxt)
    notes: list = field(default_factory=list)  # what the reader chose for the user to know (stderr, one line each)
    # Byte edits a rewrite of its own protobuf container applies (layers renamed or
    # dropped, surgery/rename.py): (enclosing fields, start, end, new bytes).
    edits: list = field(default_factory=list)
    # The models of this net (net/model.py's model(): one per definition given), built when first asked for.
    models: list = field(default_factory=list)

    @property
    def size(self) -> int:
        if self.source is None:
            raise UsageError(f"{self.path}: the document is closed")
        return self.source.size

    @property
    def closed(self) -> bool:
        return self.source is None

    def close(self) -> None:
        """Let go of the file: its entries and layers go, and its bytes with the last blob built from them.

        Blobs already built keep their values (a mapped input stays mapped
        until the last of them is gone). Closing twice does nothing.
        """
        if self.source is not None:
            self.source.close()
        self.source = None
        self.entries = []
        self.layers = []
        self.models = []

    def __enter__(self) -> Document:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return f"<Document {self.path!r}: closed>"
        count = len(self.entries)
        return (f"<Document {self.path!r}: {self.kind} ({self.format}), {count} blob{'s' * (count != 1)}, "
                f"{self.size} bytes>")

    def names(self) -> list:
        return [e.name for e in self.entries]

    @property
    def warnings(self) -> list:
        return ([f"{self.path}: {note}" for note in self.notes]
                + [f"{self.path}: blob {e.name} {e.warning}" for e in self.entries if e.warning])

    def whole(self, entries, blobs) -> list:
        """[(entry, Blob, selected)] for every blob of this container, in order, for writing it whole.

        `entries` (with their `blobs`) are the selected ones, written as asked;
        the others are written as stored. UsageError for an entry not in it.
        """
        chosen = {id(e): b for e, b in zip(entries, blobs)}
        mine = {id(e) for e in self.entries}
        for entry in entries:
            if id(entry) not in mine:
                raise UsageError(f"blob {entry.name!r} is not in {self.path}: a {self.kind} is written whole, "
                                 "so only its own blobs can be written back")
        return [(e, chosen[id(e)], True) if id(e) in chosen else (e, e.blob_to_write(), False) for e in self.entries]

    def check_room(self, offset: int) -> None:
        """Refuse one more blob past MAX_BLOBS (a forged file of millions of empty ones)."""
        if len(self.entries) == MAX_BLOBS:
            raise FormatError(f"holds more than {MAX_BLOBS} blobs (blobtool's limit)", path=self.path, offset=offset)


def open_document(src, kind: str | None = None, *, npy_cast=None) -> Document:
    """Open a path, "-" or binary file object and locate its blobs (payloads are not read).

    `kind` overrides sniffing. `npy_cast` (float32/float64) lets an .npy of
    another numeric dtype load, converted.
    """
    _check_kind(kind)
    from ..files import open_source  # the command's options read this registry at start-up; files load here

    return _document(open_source(src), kind, npy_cast)


def open_documents(srcs, kind: str | None = None, *, npy_cast=None):
    """open_document for several inputs, yielding each Document in turn; their reading overlaps where it can.

    Every input is opened first, and the formats that read in the background
    (begin: HDF5's walk of the structure, in a child process) start on each;
    then the documents are finished and yielded in order. Errors come in the
    same order as opening one input after the other: an input that cannot be
    opened is raised after the documents before it. What was started for a
    document not yielded (an error before it, or the caller stopping early)
    is stopped.
    """
    _check_kind(kind)
    from ..files import open_source  # the command's options read this registry at start-up; files load here

    sources, stops, failed = [], [], None
    try:
        for src in srcs:
            try:
                source = open_source(src)
            except BlobToolError as exc:
                failed = exc
                break
            sources.append(source)
            fmt = format_by_signature(source.buf)
            begin = getattr(module(fmt), "begin", None) if fmt is not None else None
            if begin is not None:
                stops.append(begin(source, kind))
        for source in sources:
            yield _document(source, kind, npy_cast)
        if failed is not None:
            raise failed
    finally:
        for stop in stops:
            if stop is not None:
                stop()


def _check_kind(kind) -> None:
    if kind is not None and kind not in KINDS:
        raise UsageError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")


def document_of(source, kind: str | None = None, *, npy_cast=None) -> Document:
    """open_document for a Source already open (files.open_source): one whose first bytes were looked at."""
    return _document(source, kind, npy_cast)


def _document(source, kind, npy_cast) -> Document:
    if kind is None:
        fmt, kind = sniff(source)
    else:
        fmt = _format_for_kind(kind, source.buf)
    doc = Document(source.name, kind, source, format=fmt.name)
    module(fmt).read(doc, cast=npy_cast)
    return doc


# What reads values that are not float32 or float64 (integers, bfloat16):
# only convert takes a precision, whichever command met them.
CAST_HINT = "blobtool convert --float or --double reads it, into a file every command reads"


from .reading import ReadSettings, read_settings, reading, use_read_settings  # noqa: E402
from .selecting import listed_name, select, unique_names  # noqa: E402
