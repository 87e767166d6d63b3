"""Caffe's HDF5 snapshots (``snapshot_format: HDF5``): nets (.caffemodel.h5) and solver states (.solverstate.h5).

The layout, as Caffe's Net::ToHDF5 / CopyTrainedLayersFromHDF5 and
SGDSolver::SnapshotSolverStateToHDF5 / RestoreSolverStateFromHDF5 write and
read it (hdf5_save_nd_dataset: one dataset per blob, its shape the blob's,
float32 for a float net and float64 for a double one, contiguous, unfiltered):

===========  =====================================================  =====================
kind         HDF5 objects                                           blob names
===========  =====================================================  =====================
net          group ``data``: one group per layer, named by the      "<layer>/<index>"
             layer, holding datasets ``0``, ``1``, ... (a layer
             without parameters has its empty group); optional
             group ``diff`` mirroring ``data`` with the diffs
solverstate  int32 datasets ``iter`` and ``current_step`` (shape    "history/<index>"
             (1,)), a fixed-length string ``learned_net``
             (scalar, NUL-terminated), group ``history`` with
             datasets ``0``, ``1``, ...
===========  =====================================================  =====================

A parameter shared with an earlier layer has no dataset in ``data`` (Caffe
saves the owner's only) but has one in ``diff``, a copy of its owner's diff.
Such a parameter is not a blob of the document: info lists it under
"shared", and it is not written back. Caffe creates groups without tracking
creation order, so the layers come back ordered by name.

Reading: the structure goes through h5py; a blob's values are viewed in the
input's bytes without a copy when its dataset is what Caffe writes
(contiguous, unfiltered, native float32/float64); any other float dataset
(chunked, compressed, big-endian, float16) is read through h5py, converted,
when the blob is built. Anything else where a blob belongs (strings,
integers, a scalar or empty dataset, a group, an object Caffe does not write)
is refused naming its HDF5 path. h5py is imported only here, the first time
an HDF5 file is met; without it, HDF5 input or output is a usage error
naming the extra to install.

Writing (formats/hdf5_write.py, imported when a snapshot is written): Caffe's
layout for the input's kind, each payload streamed into its dataset's space
chunk by chunk, so memory stays bounded whatever the file size.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

import numpy as np

from ..blob import MAX_BLOB_AXES, Blob, Origin, held_dtype
from ..errors import BlobToolError, FormatError, UsageError
from . import MAX_BLOBS, Document, Entry, NetLayer

__all__ = ["sniff", "read", "write", "h5py_module", "reason", "H5_ERRORS", "EXTRA"]

# (The signature, "\x89HDF\r\n\x1a\n" at byte 0, 512, 1024, ..., is in the registry: formats.FORMATS.)
# What to install for HDF5 support (pyproject.toml's optional extra).
EXTRA = "pip install 'blobtool[hdf5]'"
# The objects at the top of each kind's snapshot.
_NET_TOP = ("data", "diff")
_SOLVER_TOP = ("iter", "learned_net", "current_step", "history")
# Characters of a layer name or learned_net kept (as formats/caffe.py does for
# protobuf names): a longer one is damaged or forged.
_MAX_NAME = 256
# A dataset read through h5py (chunked, compressed ...) may expand its stored
# bytes at most as deflate can (1032:1, as for .npz members), plus this much
# for a dataset never written (its fill value): a forged shape is refused
# before an array is allocated for it.
_MAX_EXPANSION = 1032
_UNSTORED_BYTES = 1 << 20
# The largest learned_net string read (Caffe's is a file name).
_MAX_STRING = 1 << 16
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


def _error(doc_path, where: str, message: str, offset=None) -> FormatError:
    return FormatError(message, path=doc_path, offset=offset, field=f"HDF5 {where}")


class _BufferFile(io.RawIOBase):
    """A read-only, seekable file over a Source's bytes, for h5py's file-object driver (no copy)."""

    def __init__(self, buf):
        self._view = memoryview(buf).cast("B") if len(buf) else memoryview(b"")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = max(0, min(len(b), len(self._view) - self._pos))
        b[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        self._view.release()
        super().close()


@contextlib.contextmanager
def _opened(source):
    """The HDF5 file in a Source's bytes, open read-only; closed (always) on leaving.

    Files are never left open: h5py's file-object driver calls back into
    Python when a file is closed, which must not happen at interpreter exit.
    """
    h5py = h5py_module(source.name)
    stream = _BufferFile(source.buf)
    try:
        try:
            f = h5py.File(stream, "r")
        except H5_ERRORS as exc:
            raise _error(source.name, "/", f"not a readable HDF5 file: {reason(exc)}") from exc
        try:
            yield f
        finally:
            with contextlib.suppress(*H5_ERRORS):
                f.close()
    finally:
        stream.close()


# -- sniffing ------------------------------------------------------------------------

def sniff(source) -> str:
    """"net" or "solverstate", from the objects at the top of an HDF5 file (its signature matched)."""
    with _opened(source) as f:
        try:
            top = _names(f, source.name, "/")
        except H5_ERRORS as exc:
            raise _error(source.name, "/", f"unreadable: {reason(exc)}") from exc
    if "data" in top:
        return "net"
    if set(top) & set(_SOLVER_TOP):
        return "solverstate"
    found = ", ".join(top[:8]) or "nothing"
    raise _error(source.name, "/", f"not a Caffe snapshot: the file holds {found}; expected a group 'data' "
                                   f"(a net) or {', '.join(_SOLVER_TOP)} (a solver state)")


def _names(group, doc_path, where) -> list:
    """The names in a group (at most MAX_BLOBS: a forged file of millions of links is refused)."""
    count = len(group)
    if count > MAX_BLOBS:
        raise _error(doc_path, where, f"holds {count} objects, more than {MAX_BLOBS} (blobtool's limit)")
    return list(group.keys())


# -- reading ------------------------------------------------------------------------

@dataclass(frozen=True)
class _Stored:
    """Where a dataset's values are: at `offset` in the input (viewable), or only through h5py (offset None)."""

    where: str          # its HDF5 path
    shape: tuple
    dtype: np.dtype     # as stored
    offset: int | None


def read(doc: Document, cast=None) -> None:
    """Locate the blobs of a Caffe HDF5 snapshot of kind doc.kind (`cast` applies to numpy's kinds only)."""
    doc.meta["format"] = "hdf5"
    with _opened(doc.source) as f:
        where = "/"
        try:
            if doc.kind == "net":
                _read_net(doc, f)
            elif doc.kind == "solverstate":
                _read_solverstate(doc, f)
            else:
                raise UsageError(f"Caffe's HDF5 snapshots hold a net or a solver state, not a {doc.kind}",
                                 path=doc.path)
        except H5_ERRORS as exc:
            where = getattr(exc, "blobtool_where", where)
            raise _error(doc.path, where, f"unreadable: {reason(exc)}") from exc


class _At:
    """Marks h5py errors raised inside with the HDF5 path being read."""

    def __init__(self, where: str):
        self.where = where

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is not None and isinstance(exc, H5_ERRORS) and not hasattr(exc, "blobtool_where"):
            with contextlib.suppress(AttributeError, TypeError):
                exc.blobtool_where = self.where
        return False


def _member(group, name, where, doc_path, h5py, *, group_expected: bool):
    with _At(where):
        link = group.get(name, getlink=True)
        if link is not None and not isinstance(link, h5py.HardLink):
            # A soft or external link: Caffe writes neither, and following an
            # external one would open another file.
            raise _error(doc_path, where, f"is a {type(link).__name__}; Caffe's snapshots hold plain groups "
                                          "and datasets")
        obj = group.get(name) if link is not None else None
        if obj is None:
            raise _error(doc_path, where, "missing (Caffe writes it; a damaged snapshot or not Caffe's)")
        if group_expected and not isinstance(obj, h5py.Group):
            raise _error(doc_path, where, f"expected a group, found {_what(obj, h5py)}")
        if not group_expected and not isinstance(obj, h5py.Dataset):
            raise _error(doc_path, where, f"expected a dataset, found {_what(obj, h5py)}")
        return obj


def _what(obj, h5py) -> str:
    if isinstance(obj, h5py.Group):
        return "a group"
    if isinstance(obj, h5py.Dataset):
        return "a dataset"
    return f"a {type(obj).__name__}"


def _text(name: str) -> str:
    return name if len(name) <= _MAX_NAME else name[:_MAX_NAME] + "..."


def _check_top(doc, f, allowed) -> list:
    top = _names(f, doc.path, "/")
    for name in top:
        if name not in allowed:
            raise _error(doc.path, f"/{name}", f"not part of Caffe's {doc.kind} snapshot "
                                               f"(which holds {', '.join(allowed)})")
    return top


def _indexed(group, where, doc_path, h5py) -> list:
    """[(index, dataset)] of a group of blobs (datasets named 0, 1, ...), by index."""
    found = []
    for name in _names(group, doc_path, where):
        path = f"{where}/{name}"
        if not (name.isdigit() and name.isascii() and str(int(name)) == name):
            raise _error(doc_path, path, "not a blob: a blob's dataset is named by its index (0, 1, ...)")
        found.append((int(name), _member(group, name, path, doc_path, h5py, group_expected=False)))
    return sorted(found, key=lambda pair: pair[0])


def _stored(ds, where, doc) -> _Stored:
    """Check a dataset that holds a blob; where its values are."""
    with _At(where):
        dtype = ds.dtype
        shape = ds.shape
    if dtype.kind != "f" or dtype.itemsize not in (2, 4, 8):
        what = "string" if dtype.kind in "SUO" else str(dtype) if dtype.kind in "iub" else f"{dtype.kind!r}-kind"
        raise _error(doc.path, where, f"holds {what} values; a blob is a float dataset (float32 or float64)")
    if shape is None:
        raise _error(doc.path, where, "is an empty dataset (no dataspace); a blob has 1 to 32 axes")
    if len(shape) == 0:
        raise _error(doc.path, where, "is a 0-d (scalar) dataset; a blob's dataset has 1 to 32 axes")
    if len(shape) > MAX_BLOB_AXES:
        raise _error(doc.path, where, f"has {len(shape)} axes; a blob has at most {MAX_BLOB_AXES}")
    try:
        Blob(dtype=_blob_dtype(dtype)).reshape(shape)
    except BlobToolError as exc:
        raise _error(doc.path, where, f"invalid blob shape: {exc.reason}") from exc
    offset = None
    with _At(where):
        plist = ds.id.get_create_plist()
        contiguous = plist.get_layout() == h5py_module(doc.path).h5d.CONTIGUOUS and plist.get_nfilters() == 0
        if contiguous and dtype.isnative and dtype.itemsize in (4, 8):
            offset = ds.id.get_offset()
        stored = ds.id.get_storage_size()
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if offset is not None and offset + nbytes > doc.size:
        raise _error(doc.path, where, f"truncated: its {nbytes} bytes of values at byte {offset} run past "
                                      f"the end of the file ({doc.size} bytes)", offset=offset)
    if offset is None and nbytes > _MAX_EXPANSION * stored + _UNSTORED_BYTES:
        raise _error(doc.path, where, f"declares {nbytes} bytes of values, more than its {stored} stored "
                                      "bytes can hold")
    return _Stored(where, tuple(int(d) for d in shape), dtype, offset)


def _blob_dtype(stored: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if stored.itemsize == 8 else np.dtype(np.float32)


def _values(doc: Document, stored: _Stored) -> np.ndarray:
    """The values of a dataset as a flat array of the blob's dtype: a view of the input, or read through h5py."""
    target = _blob_dtype(stored.dtype)
    count = int(np.prod(stored.shape, dtype=object))
    if count == 0:
        return np.empty(0, dtype=target)
    if stored.offset is not None:
        return np.frombuffer(doc.source.buf, dtype=stored.dtype, count=count, offset=stored.offset)
    values = np.empty(stored.shape, dtype=target)
    with _opened(doc.source) as f:
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                f[stored.where].read_direct(values)
        except H5_ERRORS as exc:
            raise _error(doc.path, stored.where, f"unreadable values: {reason(exc)}") from exc
    return values.reshape(-1)


def _loader(doc: Document, data: _Stored, diff: _Stored | None):
    def load() -> Blob:
        held = _blob_dtype(data.dtype)
        blob = Blob(dtype=held, diff_dtype=held_dtype(diff.dtype, held) if diff else None)
        try:
            blob.fill_from(data.shape, _values(doc, data), _values(doc, diff) if diff else None, adopt=True)
        except BlobToolError as exc:
            raise _error(doc.path, data.where, exc.reason) from exc
        stored_diff = diff.dtype.newbyteorder("=") if diff else None
        blob.origin = Origin("shape", data.dtype.newbyteorder("="), diff is not None,
                             diff_dtype=stored_diff if stored_diff != data.dtype.newbyteorder("=") else None)
        return blob
    return load


def _add(doc: Document, name: str, data: _Stored, diff: _Stored | None, layer=None) -> None:
    doc.check_room(data.offset)
    stored = data.dtype.newbyteorder("=")
    diff_dtype = diff.dtype.newbyteorder("=") if diff is not None else None
    doc.entries.append(Entry(name, data.shape, "shape", stored, diff is not None, layer=layer,
                             build=_loader(doc, data, diff), diff_dtype=diff_dtype if diff_dtype != stored else None))


def _read_net(doc: Document, f) -> None:
    h5py = h5py_module(doc.path)
    top = _check_top(doc, f, _NET_TOP)
    data = _member(f, "data", "/data", doc.path, h5py, group_expected=True)
    diff = _member(f, "diff", "/diff", doc.path, h5py, group_expected=True) if "diff" in top else None
    diff_layers = set(_names(diff, doc.path, "/diff")) if diff is not None else set()
    doc.meta["name"] = None
    shared = []
    for layer in _names(data, doc.path, "/data"):
        group = _member(data, layer, f"/data/{layer}", doc.path, h5py, group_expected=True)
        blobs = _indexed(group, f"/data/{layer}", doc.path, h5py)
        diffs = {}
        if layer in diff_layers:
            diff_group = _member(diff, layer, f"/diff/{layer}", doc.path, h5py, group_expected=True)
            diffs = dict(_indexed(diff_group, f"/diff/{layer}", doc.path, h5py))
            diff_layers.discard(layer)
        name = _text(layer)
        doc.layers.append(NetLayer(name))
        held = set()
        for index, ds in blobs:
            stored = _stored(ds, f"/data/{layer}/{index}", doc)
            stored_diff = None
            if index in diffs:
                stored_diff = _stored(diffs[index], f"/diff/{layer}/{index}", doc)
                if stored_diff.shape != stored.shape:
                    raise _error(doc.path, stored_diff.where, f"shape {stored_diff.shape} differs from its "
                                                              f"data's {stored.shape}")
            _add(doc, f"{name}/{index}", stored, stored_diff, layer=name)
            held.add(index)
        for index in sorted(set(diffs) - held):
            # Caffe saves a shared parameter's data with its owner only.
            _stored(diffs[index], f"/diff/{layer}/{index}", doc)
            shared.append(f"{name}/{index}")
    if diff_layers:
        layer = sorted(diff_layers)[0]
        raise _error(doc.path, f"/diff/{layer}", "a diff for a layer that has no group in /data")
    if shared:
        doc.meta["shared"] = shared


def _scalar(f, name, doc, h5py, kinds: str):
    ds = _member(f, name, f"/{name}", doc.path, h5py, group_expected=False)
    where = f"/{name}"
    with _At(where):
        dtype, shape = ds.dtype, ds.shape
        if shape is None or int(np.prod(shape, dtype=object)) != 1 or dtype.kind not in kinds:
            expected = "one integer" if kinds == "iu" else "one string"
            raise _error(doc.path, where, f"holds {dtype} values of shape {shape}; Caffe writes {expected}")
        if dtype.kind in "SU" and dtype.itemsize > _MAX_STRING:
            raise _error(doc.path, where, f"a {dtype.itemsize}-byte string; Caffe writes a file name")
        return ds[()].reshape(-1)[0] if shape else ds[()]


def _read_solverstate(doc: Document, f) -> None:
    h5py = h5py_module(doc.path)
    _check_top(doc, f, _SOLVER_TOP)
    doc.meta["iter"] = int(_scalar(f, "iter", doc, h5py, "iu"))
    learned = _scalar(f, "learned_net", doc, h5py, "SO")
    if isinstance(learned, bytes):
        learned = learned.split(b"\0", 1)[0][:_MAX_STRING].decode("utf-8", "backslashreplace")
    if not isinstance(learned, str):
        raise _error(doc.path, "/learned_net", f"holds {type(learned).__name__}; Caffe writes a string")
    doc.meta["learned_net"] = _text(learned)
    doc.meta["current_step"] = int(_scalar(f, "current_step", doc, h5py, "iu"))
    history = _member(f, "history", "/history", doc.path, h5py, group_expected=True)
    for index, ds in _indexed(history, "/history", doc.path, h5py):
        _add(doc, f"history/{index}", _stored(ds, f"/history/{index}", doc), None)


# -- writing (formats/hdf5_write.py) ------------------------------------------------------

def write(doc: Document | None, entries: list, blobs: list, dest, *, kind: str, precision=None, write_diff=None,
          layout=None, transforms: dict | None = None) -> None:
    """Write a net or solver state as Caffe's HDF5 snapshot, atomically (see hdf5_write.write_snapshot)."""
    from .hdf5_write import write_snapshot

    write_snapshot(doc, entries, blobs, dest, kind=kind, precision=precision, write_diff=write_diff,
                   layout=layout, transforms=transforms)
