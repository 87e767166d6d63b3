"""A blob's values from an HDF5 dataset.

Viewed in the input's bytes where the dataset is what Caffe writes, else
read through HDF5 in a child process, a slab at a time.
"""

from __future__ import annotations

import marshal
import mmap
import os

import numpy as np

from ...engine.blob import Blob
from ..origin import Origin, held_dtype
from ...errors import BlobToolError
from .. import Document, Entry
from .h5 import (SECONDS_VARIABLE, Stored, blob_dtype, error_at, h5py_module, opened_file, plain_error, rebuilt_error,
                 value_count)
from .walk import slabs
from .child import answers, forked, seconds_for


def _values(doc: Document, stored: Stored) -> np.ndarray:
    """The values of a dataset as a flat array of the blob's dtype: a view of the input, or read through HDF5.

    A dataset that is not Caffe's contiguous one (chunked, compressed,
    compact, big-endian, float16) comes with the walk when small; otherwise
    it is read in a child process (see "HDF5 in a child process"), a slab of
    whole chunks at a time (each chunk at most MAX_CHUNK_BYTES, checked in
    _stored), which HDF5 converts into the blob's type in place, in an
    anonymous shared mapping that becomes the blob's array: the blob is held
    once (in both processes' resident figures), beside one chunk in the child.
    """
    target = blob_dtype(stored.dtype)
    count = value_count(stored)
    if count == 0:
        return np.empty(0, dtype=target)
    if stored.offset is not None:
        return np.frombuffer(doc.source.buf, dtype=stored.dtype, count=count, offset=stored.offset)
    if stored.values is not None:
        return np.frombuffer(stored.values, dtype=target, count=count)
    if not hasattr(os, "fork"):
        values = np.empty(count, dtype=target)
        h5py = h5py_module(doc.path)
        with opened_file(doc.source) as f:
            for _ in slabs(h5py, f, stored, doc.path, values.reshape(stored.shape)):
                pass
        return values
    # The child writes the values into memory shared with this process (an
    # anonymous shared mapping, which becomes the blob's array): no copy.
    values = np.frombuffer(mmap.mmap(-1, count * target.itemsize), dtype=target, count=count)

    def work(send) -> None:
        h5py = h5py_module(doc.path)
        try:
            with opened_file(doc.source) as f:
                for _ in slabs(h5py, f, stored, doc.path, values.reshape(stored.shape)):
                    pass
            send(b"D", b"")
        except BlobToolError as exc:
            send(b"E", marshal.dumps(plain_error(exc)))

    seconds = seconds_for(values.nbytes)
    pid, fd = forked(work, seconds)
    frames, died, late = answers(pid, fd, seconds)
    if b"X" in frames:
        raise RuntimeError(f"reading HDF5 values failed in a child process:\n{bytes(frames[b'X']).decode()}")
    if b"E" in frames:
        raise rebuilt_error(marshal.loads(frames[b"E"]))
    if died:
        raise error_at(doc.path, stored.where, f"HDF5's library crashed ({died}) reading its values: damaged metadata")
    if late:
        raise error_at(doc.path, stored.where, f"HDF5's library did not finish reading its values in {late} s: "
                                             f"damaged metadata (a loop), or a slow machine ({SECONDS_VARIABLE} "
                                             "sets the time)")
    finished = b"D" in frames
    if not finished:
        raise error_at(doc.path, stored.where, "HDF5's reading of its values ended early")
    return values


class _Load:
    """Builds an entry's Blob from its data's (and diff's) datasets."""

    def __init__(self, doc: Document, data: Stored, diff: Stored | None):
        self.doc, self.data, self.diff = doc, data, diff

    def __call__(self) -> Blob:
        doc, data, diff = self.doc, self.data, self.diff
        blob = self.shell()
        try:
            # shell() gave the blob its shape: fill_from only checks that it is the data's.
            blob.fill_from(data.shape, _values(doc, data), _values(doc, diff) if diff else None, reshape=False,
                           adopt=True)
        except BlobToolError as exc:
            raise error_at(doc.path, data.where, exc.reason) from exc
        return blob

    def shell(self) -> Blob:
        """The Blob without its values: shape, dtypes and origin, nothing read or allocated (writing.Unread)."""
        data, diff = self.data, self.diff
        held = blob_dtype(data.dtype)
        blob = Blob(dtype=held, diff_dtype=held_dtype(diff.dtype, held) if diff else None)
        try:
            blob.reshape(data.shape)
        except BlobToolError as exc:
            raise error_at(self.doc.path, data.where, f"invalid blob shape: {exc.reason}") from exc
        stored_diff = diff.dtype.newbyteorder("=") if diff else None
        blob.origin = Origin("shape", data.dtype.newbyteorder("="), diff is not None,
                             diff_dtype=stored_diff if stored_diff != data.dtype.newbyteorder("=") else None)
        return blob


def add_entry(doc: Document, name: str, data: Stored, diff: Stored | None, layer=None) -> None:
    """Add an entry built from the walk's description (this process)."""
    doc.check_room(data.offset)
    stored = data.dtype.newbyteorder("=")
    diff_dtype = diff.dtype.newbyteorder("=") if diff is not None else None
    doc.entries.append(Entry(name, data.shape, "shape", stored, diff is not None, layer=layer,
                             build=_Load(doc, data, diff), diff_dtype=diff_dtype if diff_dtype != stored else None))
