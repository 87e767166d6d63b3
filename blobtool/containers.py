"""Which blobs a file holds, and their names.

A Document is an opened input: its kind, its blobs in file order (each an
Entry that knows its name, shape and dtype without touching the payload),
and the Source whose bytes they view. Kinds are sniffed from the bytes,
never from the file name.

Blob names: a BlobProto file holds one blob named "0"; an .npy file one
blob named "0".
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

import numpy as np

from .blob import Blob
from .blobproto import BlobRecord, Origin, blob_from_record, parse_blob
from .errors import FormatError, UsageError
from .files import NPY_MAGIC, Source, load_npy, open_source

__all__ = ["Entry", "Document", "open_document", "select", "KINDS"]

KINDS = ("blob", "npy")


@dataclass
class Entry:
    """One blob in a document: what info needs, and a way to get the Blob."""

    name: str
    shape: tuple
    layout: str
    dtype: np.dtype
    has_diff: bool
    record: BlobRecord | None = None
    layer: str | None = None
    type: str | None = None
    _blob: Blob | None = None

    @property
    def count(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize

    def blob(self) -> Blob:
        """The Blob, built on first use; its data views the file (no copy)."""
        if self._blob is None:
            self._blob = blob_from_record(self.record)
        return self._blob


@dataclass
class Document:
    """An opened input file: its kind, its blobs in order, and its bytes."""

    path: str
    kind: str
    source: Source
    entries: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    @property
    def size(self) -> int:
        return self.source.size

    def names(self) -> list:
        return [e.name for e in self.entries]


def _entry_from_record(name: str, record: BlobRecord) -> Entry:
    shape, layout = record.shape_layout
    return Entry(name, shape, layout, record.dtype, record.has_diff, record=record)


def open_document(src, kind: str | None = None, *, npy_cast=None) -> Document:
    """Open a path, "-" or binary file object and locate its blobs (payloads are not read).

    `kind` overrides sniffing. `npy_cast` (float32/float64) lets an .npy of
    another numeric dtype load, converted.
    """
    source = open_source(src)
    if kind is not None and kind not in KINDS:
        raise UsageError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    detected = kind or sniff(source)
    if detected == "npy":
        blob = load_npy(source, cast=npy_cast)
        origin: Origin = blob.origin
        entry = Entry("0", blob.shape, origin.layout, blob.dtype, False, _blob=blob)
        return Document(source.name, "npy", source, [entry])
    if source.size == 0:
        raise FormatError("empty file: a BlobProto holds at least its data", path=source.name)
    record = parse_blob(memoryview(source.buf), 0, source.size, path=source.name)
    return Document(source.name, "blob", source, [_entry_from_record("0", record)])


def sniff(source: Source) -> str:
    """Guess the kind of an input from its first bytes."""
    if bytes(source.buf[:len(NPY_MAGIC)]) == NPY_MAGIC:
        return "npy"
    return "blob"


def select(doc: Document, patterns) -> list:
    """The entries matching any of `patterns` (exact name, glob, or bare layer name), in file order.

    No patterns selects everything. A pattern that selects nothing raises
    FormatError listing the names available.
    """
    if not patterns:
        return list(doc.entries)
    chosen = []
    for pattern in patterns:
        hits = [e for e in doc.entries if _matches(e, pattern)]
        if not hits:
            names = ", ".join(doc.names()) or "none"
            raise FormatError(f"--blob {pattern!r} selects nothing; blobs: {names}", path=doc.path)
        chosen.extend(hits)
    wanted = {id(e) for e in chosen}
    return [e for e in doc.entries if id(e) in wanted]


def _matches(entry: Entry, pattern: str) -> bool:
    if entry.name == pattern or fnmatch.fnmatchcase(entry.name, pattern):
        return True
    return entry.layer is not None and entry.layer == pattern
