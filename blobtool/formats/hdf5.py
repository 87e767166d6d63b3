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

Writing: Caffe's layout for the input's kind, groups, datasets and solver
fields made with h5py; each payload is then streamed into the space HDF5
allocated for it, chunk by chunk (see _write_payloads for why), so memory
stays bounded whatever the file size.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass

import numpy as np

from ..blob import MAX_BLOB_AXES, Blob, Origin
from ..blobproto import resolve_form, write_parts
from ..errors import BlobToolError, FormatError, OutputError, UsageError
from ..source import atomic_output, display_name
from . import MAX_BLOBS, Document, Entry

__all__ = ["sniff", "read", "write", "SIGNATURE", "EXTRA"]

SIGNATURE = b"\x89HDF\r\n\x1a\n"
# What to install for HDF5 support (pyproject.toml's optional extra).
EXTRA = "pip install 'blobtool[hdf5]'"
# The objects at the top of each kind's snapshot.
_NET_TOP = ("data", "diff")
_SOLVER_TOP = ("iter", "learned_net", "current_step", "history")
# The dataset dtype each write precision asks for.
_TARGET = {"float": np.dtype("<f4"), "double": np.dtype("<f8"), "half": np.dtype("<f2")}
# Characters of a layer name or learned_net kept (as formats/caffe.py does for
# protobuf names): a longer one is damaged or forged.
_MAX_NAME = 256
# The largest learned_net string read (Caffe's is a file name).
_MAX_STRING = 1 << 16
# Everything h5py raises on a damaged or unexpected file: HDF5's errors come as
# OSError, KeyError, ValueError, RuntimeError or TypeError subclasses.
_H5_ERRORS = (OSError, KeyError, ValueError, RuntimeError, TypeError, IndexError, OverflowError,
              UnicodeDecodeError, AttributeError, NotImplementedError)


def _h5py(name):
    """h5py, or UsageError (exit 2) naming the extra to install."""
    try:
        import h5py
    except ImportError as exc:
        raise UsageError(f"Caffe's HDF5 snapshots need h5py: {EXTRA}", path=name) from exc
    return h5py


def _reason(exc) -> str:
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
    h5py = _h5py(source.name)
    stream = _BufferFile(source.buf)
    try:
        try:
            f = h5py.File(stream, "r")
        except _H5_ERRORS as exc:
            raise _error(source.name, "/", f"not a readable HDF5 file: {_reason(exc)}") from exc
        try:
            yield f
        finally:
            with contextlib.suppress(*_H5_ERRORS):
                f.close()
    finally:
        stream.close()


# -- sniffing ------------------------------------------------------------------------

def sniff(source) -> str:
    """"net" or "solverstate", from the objects at the top of an HDF5 file (its signature matched)."""
    with _opened(source) as f:
        try:
            top = _names(f, source.name, "/")
        except _H5_ERRORS as exc:
            raise _error(source.name, "/", f"unreadable: {_reason(exc)}") from exc
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

@dataclass
class _Entry(Entry):
    """An Entry whose Blob is built on first use by `load` (a view of the input, or a read through h5py)."""

    load: object = None

    def blob(self):
        if self._blob is None:
            self._blob = self.load()
        return self._blob


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
        except _H5_ERRORS as exc:
            where = getattr(exc, "blobtool_where", where)
            raise _error(doc.path, where, f"unreadable: {_reason(exc)}") from exc


class _At:
    """Marks h5py errors raised inside with the HDF5 path being read."""

    def __init__(self, where: str):
        self.where = where

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is not None and isinstance(exc, _H5_ERRORS) and not hasattr(exc, "blobtool_where"):
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
        contiguous = plist.get_layout() == _h5py(doc.path).h5d.CONTIGUOUS and plist.get_nfilters() == 0
        if contiguous and dtype.isnative and dtype.itemsize in (4, 8):
            offset = ds.id.get_offset()
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if offset is not None and offset + nbytes > doc.size:
        raise _error(doc.path, where, f"truncated: its {nbytes} bytes of values at byte {offset} run past "
                                      f"the end of the file ({doc.size} bytes)", offset=offset)
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
        except _H5_ERRORS as exc:
            raise _error(doc.path, stored.where, f"unreadable values: {_reason(exc)}") from exc
    return values.reshape(-1)


def _loader(doc: Document, data: _Stored, diff: _Stored | None):
    def load() -> Blob:
        blob = Blob(dtype=_blob_dtype(data.dtype))
        try:
            blob.fill_from(data.shape, _values(doc, data), _values(doc, diff) if diff else None, adopt=True)
        except BlobToolError as exc:
            raise _error(doc.path, data.where, exc.reason) from exc
        blob.origin = Origin("shape", data.dtype.newbyteorder("="), diff is not None)
        return blob
    return load


def _add(doc: Document, name: str, data: _Stored, diff: _Stored | None, layer=None) -> None:
    doc.check_room(data.offset)
    doc.entries.append(_Entry(name, data.shape, "shape", data.dtype.newbyteorder("="), diff is not None, layer=layer,
                              load=_loader(doc, data, diff)))


def _read_net(doc: Document, f) -> None:
    h5py = _h5py(doc.path)
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
        doc.layers.append(name)
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
    h5py = _h5py(doc.path)
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


# -- writing ----------------------------------------------------------------------------

@dataclass
class _Planned:
    """A dataset to write: its HDF5 path, shape, dtype, and the payload (values, dtype, transform)."""

    where: str
    shape: tuple
    part: tuple
    offset: int | None = None


def write(doc: Document | None, entries: list, blobs: list, dest, *, kind: str, precision=None, write_diff=None,
          layout=None, transforms: dict | None = None) -> None:
    """Write a net or solver state as Caffe's HDF5 snapshot, atomically.

    The container is written whole, as for protobuf: the selected blobs
    (`entries`, `blobs`) as asked (`precision`, `write_diff`, `transforms`),
    the document's other blobs as stored. Its net's layers without blobs
    get their empty groups; a solver state keeps iter, learned_net and
    current_step.
    """
    if doc is None or kind not in ("net", "solverstate") or doc.kind != kind:
        raise UsageError(f"Caffe's HDF5 snapshots hold a net or a solver state, written from a net or solver "
                         f"state input; {'blobs made in Python' if doc is None else f'a {doc.kind} input'} "
                         "cannot be one (write .npz, or one blob with --format blob)")
    if layout == "legacy":
        raise UsageError("--legacy: Caffe's HDF5 snapshots store each blob as an N-D dataset; the legacy "
                         "num/channels/height/width layout exists only in the protobuf form")
    h5py = _h5py(display_name(dest))
    transforms = transforms or {}
    planned = []
    for entry, blob, selected in doc.whole(entries, blobs):
        group, index = _place(entry.name, kind)
        if blob.num_axes == 0:
            raise UsageError(f"blob {entry.name!r} has no axes (a scalar); Caffe's HDF5 datasets have 1 to 32")
        form = resolve_form(blob, precision=precision, write_diff=write_diff, layout="shape") if selected \
            else resolve_form(blob, layout="shape")
        target = _TARGET[form["precision"]]
        fns = transforms.get(entry.name, {}) if selected else {}
        planned.append(_Planned(f"{group}/{index}", blob.shape, (blob.cpu_data(), target, fns.get("data"))))
        if form["write_diff"] and kind == "solverstate":
            raise UsageError(f"blob {entry.name!r} has a diff, and a solver state's HDF5 snapshot holds none "
                             "(use --no-diff to drop it)")
        if form["write_diff"]:
            planned.append(_Planned(f"/diff{group[len('/data'):]}/{index}", blob.shape,
                                    (blob.cpu_diff(), target, fns.get("diff"))))
    layers = list(doc.layers) if kind == "net" else []
    for layer in layers:
        _check_layer_name(layer)
    diff_layers = layers if any(p.where.startswith("/diff/") for p in planned) else []
    with atomic_output(dest) as out, _random_access(out) as target_file:
        try:
            _write_structure(h5py, target_file, kind, planned, layers, diff_layers, doc.meta)
        except _H5_ERRORS as exc:
            raise OutputError(f"cannot write the HDF5 snapshot: {_reason(exc)}", path=display_name(dest)) from exc
        _write_payloads(target_file, planned)


def _place(name: str, kind: str) -> tuple:
    """(group path, index) of a blob name in the HDF5 layout; UsageError when the name has no place there."""
    group, _, index = name.rpartition("/")
    if not (index.isdigit() and index.isascii() and str(int(index)) == index):
        raise UsageError(f"blob {name!r} has no place in Caffe's HDF5 {kind} snapshot: its names are "
                         + ("'<layer>/<index>'" if kind == "net" else "'history/<index>'"))
    if kind == "solverstate":
        if group != "history":
            raise UsageError(f"blob {name!r} has no place in Caffe's HDF5 solver state: its names are "
                             "'history/<index>'")
        return "/history", index
    _check_layer_name(group)
    return f"/data/{group}", index


def _check_layer_name(layer: str) -> None:
    if not layer or "/" in layer or layer in (".", ".."):
        raise UsageError(f"layer name {layer!r} cannot be an HDF5 group name ('/' separates groups in HDF5, "
                         "so Caffe cannot snapshot such a layer in HDF5 either); write a .caffemodel")


def _write_structure(h5py, target_file, kind, planned, layers, diff_layers, meta) -> None:
    """Groups, solver fields and datasets (space allocated at once, so its offset is known); records the offsets."""
    with h5py.File(target_file, "w") as f:
        if kind == "net":
            data = f.create_group("data")
            for layer in layers:
                data.create_group(layer)
            if diff_layers:
                diff = f.create_group("diff")
                for layer in diff_layers:
                    diff.create_group(layer)
        else:
            f.create_dataset("iter", data=np.array([meta.get("iter") or 0], dtype="<i4"), track_times=False)
            _string_dataset(h5py, f, "learned_net", str(meta.get("learned_net") or ""))
            f.create_dataset("current_step", data=np.array([meta.get("current_step") or 0], dtype="<i4"),
                             track_times=False)
            f.create_group("history")
        # Contiguous (Caffe's layout), its space allocated now so that its
        # offset is known, no timestamps (the same input gives the same bytes).
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
        dcpl.set_obj_track_times(False)
        for p in planned:
            group, _, name = p.where.rpartition("/")
            dsid = h5py.h5d.create(f[group].id, name.encode(), h5py.h5t.py_create(p.part[1]),
                                   h5py.h5s.create_simple(p.shape), dcpl=dcpl)
            p.offset = dsid.get_offset()
            dsid.close()


def _string_dataset(h5py, f, name: str, text: str) -> None:
    """A scalar, NUL-terminated, fixed-length ASCII string, as Caffe's hdf5_save_string (H5LTmake_dataset_string)."""
    raw = text.encode("utf-8")
    tid = h5py.h5t.C_S1.copy()
    tid.set_size(len(raw) + 1)
    tid.set_strpad(h5py.h5t.STR_NULLTERM)
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_obj_track_times(False)  # no timestamp: the same input gives the same bytes
    dsid = h5py.h5d.create(f.id, name.encode(), tid, h5py.h5s.create(h5py.h5s.SCALAR), dcpl=dcpl)
    dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, np.array(raw + b"\0", dtype=f"S{len(raw) + 1}"), mtype=tid)


def _write_payloads(target_file, planned) -> None:
    """Stream each blob's values into its dataset's space, chunk by chunk (blobproto.write_parts).

    h5py writes a dataset by N-D hyperslabs only, so a blob whose last axis
    is large (an InnerProduct weight of shape (1, N)) would have to be
    converted and transformed whole in memory; writing the contiguous
    dataset's bytes at the offset HDF5 allocated lets scale and update stream
    as they do for protobuf, and pages of the input are released behind.
    """
    for p in planned:
        if p.offset is None:  # an empty dataset: no space allocated, nothing to write
            continue
        target_file.seek(p.offset)
        write_parts(target_file, [p.part])
    target_file.flush()


@contextlib.contextmanager
def _random_access(out):
    """A readable, writable, seekable file for h5py over atomic_output's `out`.

    atomic_output's temporary file is opened read-write (mkstemp) but
    wrapped write-only: a second file object over the same descriptor
    reads too. Outputs that cannot seek (standard output, a pipe) get the
    snapshot built in an anonymous temporary file first, then copied.
    """
    fd = _read_write_fd(out)
    if fd is not None:
        out.flush()
        with os.fdopen(os.dup(fd), "r+b") as both:
            both.seek(0)
            both.truncate()
            yield both
    elif _random_access_object(out):
        yield out
    else:
        with tempfile.TemporaryFile() as spool:
            yield spool
            spool.seek(0)
            shutil.copyfileobj(spool, out, 1 << 20)


def _read_write_fd(out) -> int | None:
    """The descriptor of `out` when it is a regular file opened for reading and writing, else None."""
    try:
        import fcntl

        fd = out.fileno()
        if stat.S_ISREG(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDWR:
            return fd
    except (ImportError, AttributeError, OSError, io.UnsupportedOperation, ValueError):
        pass
    return None


def _random_access_object(out) -> bool:
    try:
        return out.seekable() and out.readable() and out.writable()
    except (AttributeError, ValueError, OSError):
        return False
