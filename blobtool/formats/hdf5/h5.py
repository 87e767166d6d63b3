"""What the HDF5 modules share: h5py on first use, its errors, the bounds, the description of a stored dataset.

The reader (walk.py, child.py, values.py) and the writer (writer.py) both
take these from here, below both.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import NamedTuple

import numpy as np

from ...errors import BlobToolError, FormatError, UsageError
from ... import errors as errors_module
from ...files import BufferFile
from .. import DEFLATE_MAX_EXPANSION, MAX_NAME


# (The signature, "\x89HDF\r\n\x1a\n" at byte 0, 512, 1024, ..., is in the registry: formats.FORMATS.)
# What to install for HDF5 support (pyproject.toml's optional extra).
EXTRA = "pip install 'blobtool[hdf5]'"


# Characters of a layer name or learned_net kept: formats.MAX_NAME, as for protobuf names.
_MAX_NAME = MAX_NAME


# A dataset read through h5py (chunked, compressed ...) may expand its stored
# bytes at most as deflate can (as for .npz members), plus this much for a
# dataset never written (its fill value): a forged shape is refused before an
# array is allocated for it.
MAX_EXPANSION = DEFLATE_MAX_EXPANSION


UNSTORED_BYTES = 1 << 20


# The largest learned_net string read (Caffe's is a file name).
MAX_STRING = 1 << 16


# Caffe's iter and current_step are C++ ints (and SolverState's fields int32).
INT32 = (-(1 << 31), (1 << 31) - 1)


# The largest chunk of a chunked dataset read, uncompressed. HDF5 reads and
# inflates a chunk whole, so this bounds what a read holds beside the blob
# itself: one 512 MiB gzip chunk of zeros fits in a 527 KB file. h5py's own
# chunk guess stays under 1 MiB, netCDF-4's default is 4 MiB, and HDF5's
# guide advises chunks well under its default 1 MiB cache; 64 MiB leaves
# room for any writer's choice at a bounded cost.
MAX_CHUNK_BYTES = 64 << 20


# A file at most this large is read from a copy HDF5 holds (a file image):
# its structure then costs no call into Python per read. A net of 8000
# one-value layers (11 MB) is read in half the time so.
_IMAGE_BYTES = 32 << 20


# A read through the file object at least this large is a dataset's values
# (the structure is read in small pieces): its mapped pages are released.
_RELEASE_READ = 1 << 12


# Everything h5py raises on a damaged or unexpected file: HDF5's errors come as
# OSError, KeyError, ValueError, RuntimeError or TypeError subclasses, and a
# datatype or filter h5py does not support as NotImplementedError.
H5_ERRORS = (OSError, KeyError, ValueError, RuntimeError, TypeError, IndexError, OverflowError,
              UnicodeDecodeError, NotImplementedError)


def h5py_module(name):
    """h5py, or UsageError (exit 2) naming the extra to install."""
    try:
        import h5py
    except ImportError as exc:
        raise UsageError(f"Caffe's HDF5 snapshots need h5py: {EXTRA}", path=name) from exc
    return h5py


def reason(exc) -> str:
    """h5py's message without its wrapping: "Unable to open (truncated file ...)" -> "truncated file ..."."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if text.endswith(")") and "(" in text:
        inner = text[text.index("(") + 1:-1]
        return inner or text
    return text


def error_at(doc_path, where: str, message: str, offset=None) -> FormatError:
    return FormatError(message, path=doc_path, offset=offset, field=f"HDF5 {where}")


@contextlib.contextmanager
def opened_file(source):
    """The HDF5 file in a Source's bytes, open read-only; closed (always) on leaving.

    A file of at most _IMAGE_BYTES is handed to HDF5 as a file image (its
    core driver, which copies it), so that reading its structure makes no
    call back into Python; a larger one is read through a file object over
    the Source's bytes (no copy). Files are never left open: h5py's
    file-object driver calls back into Python when a file is closed, which
    must not happen at interpreter exit.
    """
    h5py = h5py_module(source.name)
    stream = None
    try:
        try:
            if 0 < source.size <= _IMAGE_BYTES:
                fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
                fapl.set_fapl_core(backing_store=False)
                fapl.set_file_image(source.buf)
                f = h5py.File(h5py.h5f.open(b"blobtool-input", h5py.h5f.ACC_RDONLY, fapl=fapl))
            else:
                stream = BufferFile(source.buf, release_over=_RELEASE_READ)
                f = h5py.File(stream, "r")
        except H5_ERRORS as exc:
            raise error_at(source.name, "/", f"not a readable HDF5 file: {reason(exc)}") from exc
        try:
            yield f
        finally:
            with contextlib.suppress(*H5_ERRORS):
                f.close()
    finally:
        if stream is not None:
            stream.close()


class Stored(NamedTuple):
    """Where a dataset's values are: at `offset` in the input (viewable), or only through h5py (offset None)."""

    where: str          # its HDF5 path
    raw: bytes          # the same, as HDF5 names it
    shape: tuple
    dtype: np.dtype     # as stored
    offset: int | None
    values: bytes | None = None   # the values in the blob's dtype, read with the walk (a small non-contiguous dataset)
    chunk: tuple | None = None    # a chunked dataset's chunk shape

    def plain(self) -> tuple:
        """The same as marshal sends it (the dtype as its string)."""
        return (self.where, self.raw, self.shape, self.dtype.str, self.offset, self.values, self.chunk)

    @classmethod
    def from_plain(cls, plain: tuple) -> "Stored":
        where, raw, shape, dtype, offset, values, chunk = plain
        return cls(where, raw, shape, _dtype(dtype), offset, values, chunk)


@functools.lru_cache(maxsize=None)
def _dtype(text: str) -> np.dtype:
    return np.dtype(text)


def product(dims) -> int:
    """The product of a shape's dimensions as a Python int (exact at any size; 1 for no axes)."""
    return math.prod(map(int, dims))


def plain_error(exc: BlobToolError) -> tuple:
    return (type(exc).__name__, exc.reason, None if exc.path is None else str(exc.path), exc.offset,
            None if exc.field is None else str(exc.field))


def rebuilt_error(plain: tuple) -> BlobToolError:
    kind, message, path, offset, field = plain
    cls = getattr(errors_module, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, BlobToolError)):
        cls = FormatError
    return cls(message, path=path, offset=offset, field=field)


# The values of a non-contiguous dataset sent with the walk: each at most
# SHIP_BYTES, all of them together at most SHIP_TOTAL (held with the document).
SHIP_BYTES = 1 << 20


SHIP_TOTAL = 16 << 20


# The values one child's read sends per slab (whole rows of chunks: a chunk is read once).
SLAB_BYTES = 4 << 20


SECONDS_VARIABLE = "BLOBTOOL_HDF5_SECONDS"


class At:
    """Marks h5py errors raised inside with the HDF5 path being read."""

    def __init__(self, where: str):
        self.where = where

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is not None and isinstance(exc, H5_ERRORS):
            mark_where(exc, self.where)
        return False


def mark_where(exc, where: str) -> None:
    """Mark an h5py error with the HDF5 path being read (the innermost mark stays)."""
    if not hasattr(exc, "blobtool_where"):
        with contextlib.suppress(AttributeError, TypeError):
            exc.blobtool_where = where


def clipped(name: str) -> str:
    return name if len(name) <= _MAX_NAME else name[:_MAX_NAME] + "..."


# The stored dtypes of a float dataset, by (little-endian, size).
FLOATS = {(little, size): np.dtype(("<" if little else ">") + f"f{size}")
           for little in (True, False) for size in (2, 4, 8)}


# A shape spanning at most this many values (zero dimensions counted as one)
# is one any Blob holds: only a larger one is put to Blob.reshape's own
# check (which is what refuses it, and says why).
PLAIN_SPAN = int(np.iinfo(np.intp).max) // 16


def blob_dtype(stored: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if stored.itemsize == 8 else np.dtype(np.float32)


def value_count(stored: Stored) -> int:
    return product(stored.shape)
