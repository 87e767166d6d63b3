"""File formats: the kinds of file blobtool reads, the registry of format modules, opened documents.

Every input is opened as a Document: its kind, its blobs in file order (each
an Entry that knows its name, shape and dtype without touching the payload),
and the Source whose bytes they view. The kind comes from the bytes (see
sniff.py), never from the file name.

The registry (FORMATS) is the one place that lists the format modules. Each
module reads and writes the kinds it owns and offers the same functions:

``read(doc, cast=None)``
    fill ``doc.entries`` (and ``doc.meta``) for ``doc.kind``; payloads are
    located, not copied.
``write(doc, entries, blobs, dest, *, kind, precision, write_diff, layout, transforms)``
    write the selected blobs to `dest` (atomically) as `kind`.

A module is imported the first time a file of its format is met, so the
command line's start-up pays only for this file. To add a format: write
``formats/<name>.py`` with those two functions, and add one Format line
below (its kinds, magic bytes and output extensions).

Kinds and blob names (stable, in file order):

===========  ==========================================  =======================
kind         what                                        blob names
===========  ==========================================  =======================
blob         BlobProto                                   "0"
vector       BlobProtoVector                             "0", "1", ...
net          NetParameter (.caffemodel), three layer     "<layer>/<index>"
             formats
solverstate  SolverState (.solverstate)                  "history/<index>"
npy / npz    numpy's formats                             "0" / the array names
===========  ==========================================  =======================

An unnamed layer is "layer<k>" (k its position among all layers); a repeated
layer name gets "#2", "#3", ... from its second occurrence on. In .npz files
an array named "<name>/diff" is the diff of "<name>".

This module imports no format module and nothing heavy (the command line
builds its options from it).
"""

from __future__ import annotations

import fnmatch
import importlib
import math
import os
from dataclasses import dataclass, field

from ..errors import FormatError, UsageError

__all__ = ["Format", "FORMATS", "KINDS", "CONTAINER_KINDS", "OUTPUT_FORMATS", "Entry", "Document",
           "format_of", "module_for", "open_document", "select", "output_kind", "MAX_BLOBS"]


@dataclass(frozen=True)
class Format:
    """One file format: the kinds it holds, how its files start, the extensions that ask for it."""

    name: str            # the module under blobtool.formats that reads and writes it
    kinds: tuple         # the kinds it reads (and writes); the first is what a single blob is written as
    magic: tuple = ()    # (leading bytes, kind) pairs; none for protobuf, which sniff.py tells by its fields
    extensions: tuple = ()   # (output extension, kind) pairs that choose this format for writing
    containers: tuple = ()   # kinds that hold several blobs and are written back as themselves


FORMATS = (
    Format("caffe", ("blob", "vector", "net", "solverstate"),
           extensions=((".pb", "blob"), (".binaryproto", "blob"), (".blob", "blob"), (".protobin", "blob")),
           containers=("vector", "net", "solverstate")),
    Format("numpy", ("npy", "npz"),
           magic=((b"\x93NUMPY", "npy"), (b"PK\x03\x04", "npz"), (b"PK\x05\x06", "npz")),
           extensions=((".npy", "npy"), (".npz", "npz"))),
)

# Every kind --kind accepts, and the ones that hold several named blobs.
KINDS = tuple(kind for fmt in FORMATS for kind in fmt.kinds)
CONTAINER_KINDS = tuple(kind for fmt in FORMATS for kind in fmt.containers)
# What --format accepts: one blob file, the array formats, or the input's own kind.
OUTPUT_FORMATS = ("blob", "npy", "npz", "same")

# A file's blobs, and a net's layers, are each capped at this many. The
# largest Caffe nets hold a few thousand; each costs about 1.5 KB (a blob) or
# 0.3 KB (a layer) of bookkeeping, so a forged file of millions of empty ones
# would otherwise exhaust memory.
MAX_BLOBS = 1 << 16


def format_of(kind: str) -> Format:
    """The Format that reads `kind`."""
    for fmt in FORMATS:
        if kind in fmt.kinds:
            return fmt
    raise UsageError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")


def module_for(kind: str):
    """The module that reads and writes `kind`, imported on first use."""
    return importlib.import_module(f"{__name__}.{format_of(kind).name}")


@dataclass
class Entry:
    """One blob in a document: what info needs, and a way to get the Blob.

    `record` locates a BlobProto in the bytes (protobuf kinds); `chain` holds
    the fields from the top-level message down to the blob's own field, so a
    writer can replace it in place. Formats that build the Blob at once
    (numpy's) set `_blob`.
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

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize

    def blob(self):
        """The Blob, built on first use; float data views the file (no copy)."""
        if self._blob is None:
            from ..blobproto import blob_from_record
            self._blob = blob_from_record(self.record)
        return self._blob


@dataclass
class Document:
    """An opened input file: its kind, its blobs in order, and its bytes."""

    path: str
    kind: str
    source: object           # source.Source
    entries: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    @property
    def size(self) -> int:
        return self.source.size

    def names(self) -> list:
        return [e.name for e in self.entries]

    @property
    def warnings(self) -> list:
        return [f"{self.path}: blob {e.name} {e.warning}" for e in self.entries if e.warning]

    def check_room(self, offset: int) -> None:
        """Refuse one more blob past MAX_BLOBS (a forged file of millions of empty ones)."""
        if len(self.entries) == MAX_BLOBS:
            raise FormatError(f"holds more than {MAX_BLOBS} blobs (blobtool's limit)", path=self.path, offset=offset)


def open_document(src, kind: str | None = None, *, npy_cast=None) -> Document:
    """Open a path, "-" or binary file object and locate its blobs (payloads are not read).

    `kind` overrides sniffing. `npy_cast` (float32/float64) lets an .npy of
    another numeric dtype load, converted.
    """
    if kind is not None and kind not in KINDS:
        raise UsageError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    from ..source import open_source
    from .sniff import sniff

    source = open_source(src)
    kind = kind or sniff(source)
    doc = Document(source.name, kind, source)
    module_for(kind).read(doc, cast=npy_cast)
    return doc


def select(doc: Document, patterns) -> list:
    """The entries matching any of `patterns` (exact name, glob, or bare layer name), in file order.

    No patterns selects everything. A pattern that selects nothing raises
    FormatError listing the names available.
    """
    if not patterns:
        return list(doc.entries)
    chosen = set()
    for pattern in patterns:
        hits = [i for i, e in enumerate(doc.entries) if _matches(e, pattern)]
        if not hits:
            names = ", ".join(doc.names()) or "none"
            raise FormatError(f"--blob {pattern!r} selects nothing; blobs: {names}", path=doc.path)
        chosen.update(hits)
    return [e for i, e in enumerate(doc.entries) if i in chosen]


def _matches(entry: Entry, pattern: str) -> bool:
    if entry.name == pattern or fnmatch.fnmatchcase(entry.name, pattern):
        return True
    return entry.layer is not None and entry.layer == pattern


def output_kind(dest, fmt: str | None, input_kind: str | None) -> str:
    """The kind to write: `fmt` ("blob", "npy", "npz", "same"), else from dest's extension, else the input's own.

    "same" (and an extension that names no format) means the input's own
    kind when that is a container; otherwise one BlobProto ("blob").
    Raises UsageError when the input's kind cannot be written back as itself.
    """
    if fmt is None:
        lower = os.fspath(dest).lower() if isinstance(dest, (str, os.PathLike)) else ""
        fmt = next((kind for f in FORMATS for ext, kind in f.extensions if lower.endswith(ext)), None)
        if fmt is None:
            fmt = "same" if input_kind in CONTAINER_KINDS else "blob"
    elif fmt not in OUTPUT_FORMATS:
        raise UsageError(f"unknown output format {fmt!r}; expected one of {', '.join(OUTPUT_FORMATS)}")
    if fmt == "same":
        if input_kind not in CONTAINER_KINDS + ("blob",):
            raise UsageError(f"a {input_kind} input has no container form to write back; "
                             "choose .npy, .npz or a blob file")
        fmt = input_kind
    return fmt
