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

Reading: HDF5 runs only in child processes (see "HDF5 in a child process"
below: damaged metadata can crash the library itself), and the structure
goes through h5py's low-level API (see "walking the file" below). A file names only itself: a link that is not a hard link
(soft, external, user-defined), a dataset with external storage or a
virtual one is refused, naming its HDF5 path, before anything is read
through it, and so is a name that is not UTF-8 or that a damaged group lists
twice. A blob's values are viewed in the input's bytes without a copy when
its dataset is what Caffe writes (contiguous, unfiltered, native IEEE
float32/float64); any other float dataset (chunked, compressed, big-endian,
float16, compact) is read through HDF5, converted a chunk at a time, with the
walk when small, otherwise when the blob is built (a chunk over
MAX_CHUNK_BYTES is refused). Anything else
where a blob belongs (strings, integers, a scalar or empty dataset, a group,
an object Caffe does not write) is refused naming its HDF5 path, and so are
an `iter` or `current_step` outside Caffe's int32. h5py is imported only
here, the first time an HDF5 file is met; without it, HDF5 input or output
is a usage error naming the extra to install.

Writing (formats/hdf5_write.py, imported when a snapshot is written): Caffe's
layout for the input's kind, each payload streamed into its dataset's space
chunk by chunk, so memory stays bounded whatever the file size.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import io
import marshal
import math
import mmap
import os
import select
import signal
import struct
import threading
import time
import traceback
import warnings
from typing import NamedTuple

import numpy as np

from ..engine.blob import MAX_BLOB_AXES, Blob
from .origin import Origin, held_dtype
from ..errors import BlobToolError, FormatError, UsageError
from ..files import release_pages
from . import MAX_BLOBS, Document, Entry, NetLayer

__all__ = ["sniff", "read", "write", "begin", "h5py_module", "reason", "H5_ERRORS", "EXTRA", "MAX_CHUNK_BYTES"]

# (The signature, "\x89HDF\r\n\x1a\n" at byte 0, 512, 1024, ..., is in the registry: formats.FORMATS.)
# What to install for HDF5 support (pyproject.toml's optional extra).
EXTRA = "pip install 'blobtool[hdf5]'"
# The objects at the top of each kind's snapshot.
_NET_TOP = ("data", "diff")
_SOLVER_TOP = ("iter", "learned_net", "current_step", "history")
# Characters of a layer name or learned_net kept (as formats/caffe/containers.py does for
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
# Caffe's iter and current_step are C++ ints (and SolverState's fields int32).
_INT32 = (-(1 << 31), (1 << 31) - 1)
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


def _error(doc_path, where: str, message: str, offset=None) -> FormatError:
    return FormatError(message, path=doc_path, offset=offset, field=f"HDF5 {where}")


class _BufferFile(io.RawIOBase):
    """A read-only, seekable file over a Source's bytes, for h5py's file-object driver (no copy).

    A large read (a chunk's or a converted dataset's values, never the
    structure) lets the mapped pages it copied go back to the kernel
    (source.release_pages, inside the command line's releasing()): h5py
    copies them into its own buffers, so keeping them would count each such
    dataset twice.
    """

    def __init__(self, buf):
        self._buf = buf
        self._view = memoryview(buf).cast("B") if len(buf) else memoryview(b"")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = max(0, min(len(b), len(self._view) - self._pos))
        b[:n] = self._view[self._pos:self._pos + n]
        if n >= _RELEASE_READ:
            release_pages(np.frombuffer(self._buf, dtype=np.uint8, count=n, offset=self._pos))
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
        self._buf = None
        super().close()


@contextlib.contextmanager
def _opened(source):
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
                stream = _BufferFile(source.buf)
                f = h5py.File(stream, "r")
        except H5_ERRORS as exc:
            raise _error(source.name, "/", f"not a readable HDF5 file: {reason(exc)}") from exc
        try:
            yield f
        finally:
            with contextlib.suppress(*H5_ERRORS):
                f.close()
    finally:
        if stream is not None:
            stream.close()


# -- walking the file: links, never followed out of it ------------------------------------
#
# The structure is read with h5py's low-level API (h5l, h5o, h5d): names come
# as bytes (a name that is not UTF-8 is refused, not guessed at), a link's
# kind is known before anything is opened through it, and a dataset's
# creation property list (its layout, external files) is checked before its
# dataspace, its type or a byte of its values is touched. It also skips the
# work h5py's Group and Dataset objects do per object (numpy dtypes, path
# strings): a net of 8000 one-value layers is read in about 40% of the time
# it took through them (docs/performance.md).

def _join(where: str, name: str) -> str:
    return f"/{name}" if where == "/" else f"{where}/{name}"


def _shown(raw: bytes) -> str:
    return _text(raw.decode("utf-8", "backslashreplace"))


def _links(h5py, gid, doc_path, where) -> list:
    """[(name, raw name)] of a group's links, in HDF5's name order; only hard links within the file pass.

    A soft link, an external link (another file) or a user-defined one is
    refused without being followed, and so are a name that is not UTF-8 and
    what only a damaged file holds (a name listed twice, an empty one, one
    with '/'). At most MAX_BLOBS names (a forged file of millions of links).
    """
    listed = []
    append = listed.append

    def visit(raw, info):
        append((bytes(raw), info.type))
        return 1 if len(listed) > MAX_BLOBS else None

    try:
        gid.links.iterate(visit, idx_type=h5py.h5.INDEX_NAME, order=h5py.h5.ITER_INC, info=True)
    except H5_ERRORS as exc:
        _mark(exc, where)
        raise
    if len(listed) > MAX_BLOBS:
        raise _error(doc_path, where, f"holds more than {MAX_BLOBS} objects (blobtool's limit)")
    found, seen = [], set()
    hard = h5py.h5l.TYPE_HARD
    for raw, kind in listed:
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _error(doc_path, _join(where, _shown(raw)),
                         "a name that is not UTF-8 (Caffe's layer names are text)") from None
        if kind != hard or name in seen or not raw or b"/" in raw or b"\0" in raw or raw == b".":
            path = _join(where, _shown(raw))
            if not raw or b"/" in raw or b"\0" in raw or raw == b".":
                raise _error(doc_path, path, f"a link named {name!r}, which HDF5 never writes (a damaged file)")
            if name in seen:
                raise _error(doc_path, path, "listed twice in its group (a damaged file)")
            raise _error(doc_path, path, _link_refusal(h5py, gid, raw, kind))
        seen.add(name)
        found.append((name, raw))
    return found


def _link_refusal(h5py, gid, raw: bytes, kind: int) -> str:
    """Why a link that is not a hard link is refused; its value is read (never followed) to say where it leads."""
    target = None
    with contextlib.suppress(*H5_ERRORS):
        value = gid.links.get_val(raw)
        if kind == h5py.h5l.TYPE_EXTERNAL:
            target = b":".join(value)
        elif isinstance(value, bytes):
            target = value
    to = f" to {_shown(target)!r}" if target is not None else ""
    if kind == h5py.h5l.TYPE_EXTERNAL:
        return (f"is an external link{to}; a file names only itself: blobtool never follows a link into "
                "another file")
    what = "a soft link" if kind == h5py.h5l.TYPE_SOFT else f"a user-defined link (type {kind})"
    return f"is {what}{to}; Caffe's snapshots hold plain groups and datasets"


def _open(h5py, gid, raw: bytes, where, doc_path, *, group_expected: bool):
    """The group a hard link names, or (dataset, its creation property list, its layout), its storage checked.

    The object is opened as what it should be (h5g.open, h5d.open: h5py
    then need not ask HDF5 what it is); only when that fails is it opened
    as whatever it is, which says what it is instead, or fails with HDF5's
    own reason.
    """
    try:
        obj = (h5py.h5g.open if group_expected else h5py.h5d.open)(gid, raw)
    except H5_ERRORS:
        obj = None
    if obj is None:
        try:
            obj = h5py.h5o.open(gid, raw)
        except H5_ERRORS as exc:
            _mark(exc, where)
            raise
        if group_expected and not isinstance(obj, h5py.h5g.GroupID):
            raise _error(doc_path, where, f"expected a group, found {_what(obj, h5py)}")
        if not group_expected and not isinstance(obj, h5py.h5d.DatasetID):
            raise _error(doc_path, where, f"expected a dataset, found {_what(obj, h5py)}")
    if group_expected:
        return obj
    return (obj, *_check_storage(h5py, obj, where, doc_path))


def _what(obj, h5py) -> str:
    if isinstance(obj, h5py.h5g.GroupID):
        return "a group"
    if isinstance(obj, h5py.h5d.DatasetID):
        return "a dataset"
    if isinstance(obj, h5py.h5t.TypeID):
        return "a named datatype"
    return f"a {type(obj).__name__}"


def _check_storage(h5py, dsid, where, doc_path):
    """Refuse a dataset whose values are not in this file, from its creation property list alone.

    External storage (values in other files: a crafted snapshot could name
    /etc/shadow, a FIFO or /dev/zero) and virtual datasets (values mapped
    from other datasets, in other files or, crashing HDF5, in this very one)
    are refused before the dataset's dataspace, type or values are read.
    Contiguous (Caffe's), chunked and compact (values in the object header)
    storage are read. Returns (the creation property list, the layout).
    """
    try:
        plist = dsid.get_create_plist()
        layout = plist.get_layout()
        external = plist.get_external_count() if layout == h5py.h5d.CONTIGUOUS else 0
        first = plist.get_external(0)[0] if external else b""
    except H5_ERRORS as exc:
        _mark(exc, where)
        raise
    if layout == h5py.h5d.VIRTUAL:
        raise _error(doc_path, where, "is a virtual dataset (its values are mapped from other datasets, maybe "
                                      "in other files); a file names only itself: blobtool never follows one")
    if layout not in (h5py.h5d.CONTIGUOUS, h5py.h5d.CHUNKED, h5py.h5d.COMPACT):
        raise _error(doc_path, where, f"has a storage layout blobtool does not know (HDF5 layout {layout})")
    if external:
        files = f"another file ({_shown(first)!r})" if external == 1 else f"{external} other files"
        raise _error(doc_path, where, f"keeps its values in {files} (HDF5 external storage); a file names only "
                                      "itself: blobtool never reads another")
    return plist, layout


# -- sniffing ------------------------------------------------------------------------

def sniff(source) -> str:
    """"net" or "solverstate", from the objects at the top of an HDF5 file (its signature matched).

    The file's whole structure is walked here, in a child process (see
    "HDF5 in a child process" below); read() then uses that walk.
    """
    h5py_module(source.name)
    walked = _taken(source, None)
    if walked[0] == "sniff-error":
        raise _rebuilt(walked[1])
    source._hdf5_walk = walked
    return walked[1]


def begin(source, kind=None):
    """Start the walk of a file's structure now, in a child process (sniff and read take it); a callable that stops it.

    The walks of several inputs (compare's two) then run at once. Nothing
    starts (None) where the walk cannot run in a child, h5py is missing
    (sniff says so) or `kind` is not one an HDF5 snapshot holds (read says so).
    """
    if not hasattr(os, "fork") or kind not in (None, "net", "solverstate"):
        return None
    try:
        h5py_module(source.name)
    except UsageError:
        return None
    pending = _Pending(source, kind)
    source._hdf5_walk = pending
    return pending.stop


def _taken(source, kind) -> tuple:
    """The walk of `source` begin() or sniff() left on it, if it is one for `kind` (any, for None); else a new walk."""
    walked = getattr(source, "_hdf5_walk", None)
    if walked is not None:
        del source._hdf5_walk
        if isinstance(walked, _Pending):
            walked = walked.answer()
    if walked is None or (kind is not None and (walked[0] != "walked" or walked[1] != kind)):
        walked = _walk(source, kind)
    return walked


def _sniffed(source, h5py, f) -> str:
    try:
        root = h5py.h5g.open(f.id, b"/")
        top = dict(_links(h5py, root, source.name, "/"))
        data_is_dataset = "data" in top and isinstance(_open_any(h5py, root, top["data"]), h5py.h5d.DatasetID)
    except H5_ERRORS as exc:
        raise _error(source.name, getattr(exc, "blobtool_where", "/"), f"unreadable: {reason(exc)}") from exc
    if data_is_dataset:
        found = ", ".join(list(top)[:8])
        raise _error(source.name, "/", f"an HDF5 dataset file (training data, as Caffe's HDF5Data layer reads: "
                                       f"{found}), not a Caffe snapshot; blobtool reads snapshots "
                                       "(.caffemodel.h5, .solverstate.h5)")
    if "data" in top:
        return "net"
    if set(top) & set(_SOLVER_TOP):
        return "solverstate"
    found = ", ".join(_text(name) for name in list(top)[:8]) or "nothing"
    raise _error(source.name, "/", f"not a Caffe snapshot: the file holds {found}; expected a group 'data' "
                                   f"(a net) or {', '.join(_SOLVER_TOP)} (a solver state)")


def _open_any(h5py, gid, raw):
    with _At(_join("/", raw.decode("utf-8"))):
        return h5py.h5o.open(gid, raw)


# -- reading ------------------------------------------------------------------------

class _Stored(NamedTuple):
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
    def from_plain(cls, plain: tuple) -> "_Stored":
        where, raw, shape, dtype, offset, values, chunk = plain
        return cls(where, raw, shape, _dtype(dtype), offset, values, chunk)


@functools.lru_cache(maxsize=None)
def _dtype(text: str) -> np.dtype:
    return np.dtype(text)


def read(doc: Document, cast=None) -> None:
    """Locate the blobs of a Caffe HDF5 snapshot of kind doc.kind (`cast` applies to numpy's kinds only).

    The structure is walked in a child process (see "HDF5 in a child
    process" below), or taken from the walk sniff() made; this process then
    builds the entries from that description without opening the file
    through HDF5.
    """
    doc.meta["format"] = "hdf5"
    h5py_module(doc.path)
    if doc.kind not in ("net", "solverstate"):
        raise UsageError(f"Caffe's HDF5 snapshots hold a net or a solver state, not a {doc.kind}", path=doc.path)
    walked = _taken(doc.source, doc.kind)
    if walked[0] != "walked":
        raise _rebuilt(walked[1])
    outcome = walked[2]
    if outcome[0] == "error":
        raise _rebuilt(outcome[1])
    described = outcome[1]
    doc.meta.update(described["meta"])
    doc.layers.extend(NetLayer(name) for name in described["layers"])
    plain = _Stored.from_plain
    for name, layer, data, diff in described["entries"]:
        _add(doc, name, plain(data), plain(diff) if diff is not None else None, layer=layer)


def _walked_here(source, kind) -> tuple:
    """The walk itself (in the child): ("sniff-error", error) or ("walked", kind, ("ok", description) or ("error", error))."""
    h5py = h5py_module(source.name)
    sniffing = kind is None
    try:
        with _opened(source) as f:
            if sniffing:
                kind = _sniffed(source, h5py, f)
                sniffing = False
            # The walk's own document: its entries are (name, layer, data,
            # diff) with _Stored sides, its layers the layers' names; the
            # description sent holds the same as plain values.
            doc = Document(source.name, kind, source, format="hdf5")
            where = "/"
            try:
                root = h5py.h5g.open(f.id, b"/")
                if kind == "net":
                    _read_net(doc, h5py, root)
                else:
                    _read_solverstate(doc, h5py, root)
                shipped = 0
                entries = []
                for name, layer, *sides in doc.entries:
                    for i, stored in enumerate(sides):
                        if stored is not None and stored.offset is None and stored.values is None:
                            nbytes = _count(stored) * _blob_dtype(stored.dtype).itemsize
                            if nbytes <= _SHIP_BYTES and shipped + nbytes <= _SHIP_TOTAL:
                                where = stored.where
                                values = b"".join(bytes(slab) for slab in _slabs(h5py, f, stored, doc.path))
                                stored = stored._replace(values=values)
                                shipped += nbytes
                        sides[i] = stored.plain() if stored is not None else None
                    entries.append((name, layer, *sides))
            except H5_ERRORS as exc:
                where = getattr(exc, "blobtool_where", where)
                raise _error(doc.path, where, f"unreadable: {reason(exc)}") from exc
    except BlobToolError as exc:
        return ("sniff-error", _error_plain(exc)) if sniffing else ("walked", kind, ("error", _error_plain(exc)))
    meta = {key: value for key, value in doc.meta.items() if key != "format"}
    return ("walked", kind, ("ok", {"meta": meta, "layers": doc.layers, "entries": entries}))


def _product(dims) -> int:
    """The product of a shape's dimensions as a Python int (exact at any size; 1 for no axes)."""
    return math.prod(map(int, dims))


def _error_plain(exc: BlobToolError) -> tuple:
    return (type(exc).__name__, exc.reason, None if exc.path is None else str(exc.path), exc.offset,
            None if exc.field is None else str(exc.field))


def _rebuilt(plain: tuple) -> BlobToolError:
    from .. import errors

    kind, message, path, offset, field = plain
    cls = getattr(errors, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, BlobToolError)):
        cls = FormatError
    return cls(message, path=path, offset=offset, field=field)


# -- HDF5 in a child process ------------------------------------------------------------
#
# HDF5 trusts a file's metadata: damaged metadata (one byte turning a virtual
# dataset's layout into a chunked one) kills the process with SIGSEGV inside
# the library, where no Python code can catch it. So every call that opens
# the file through HDF5 runs in a child process forked for it: the walk of
# the structure (sniff's check and read's walk together, once per file)
# sends back a plain description (marshal: tuples, strings, numbers, bytes:
# never objects) of each blob's HDF5 path, stored type, shape, and where
# its values are: a file offset for Caffe's contiguous layout, which this
# process views in its own mapping of the input, or, for any other layout,
# the values themselves when small (_SHIP_BYTES, _SHIP_TOTAL in all) or
# nothing (read when the blob is built, in another child, a slab at a time
# into memory it shares with this process, which becomes the blob's array:
# no copy through a pipe). A child that dies by a signal is
# exit 3, naming the file. This process never opens the input through
# HDF5, so a damaged file cannot take it down. A walk may start before
# sniff asks for it (begin: compare's two inputs are walked at once, one
# child each, on two cores); a walk nobody asks for is stopped and reaped.
#
# The child is forked (a few milliseconds, its memory shared copy-on-write)
# while holding h5py's global lock and blobtool's own, so that no other
# thread of this process is inside HDF5 or forking at that moment; the child
# runs only the walk (h5py and numpy, already imported), never returns into
# the caller's code and leaves with os._exit. A program that uses blobtool
# from several threads is safe so far as its own threads take no locks the
# walk needs (h5py's is held across the fork; the C library's allocator is
# made fork-safe by the C library itself). Where os.fork does not exist,
# the walk runs in this process.

# The values of a non-contiguous dataset sent with the walk: each at most
# _SHIP_BYTES, all of them together at most _SHIP_TOTAL (held with the document).
_SHIP_BYTES = 1 << 20
_SHIP_TOTAL = 16 << 20
# The values one child's read sends per slab (whole rows of chunks: a chunk is read once).
_SLAB_BYTES = 4 << 20
_FORK_LOCK = threading.Lock()
# How long a child may run (seconds, plus one per 16 MiB it reads): HDF5 loops
# forever on some damaged metadata (a global heap whose object runs past its
# collection). The walk of a net of MAX_BLOBS datasets takes about 1 s of CPU.
_SECONDS = 20
_SECONDS_VARIABLE = "BLOBTOOL_HDF5_SECONDS"
_FRAME = struct.Struct("<cQ")


def _walk(source, kind) -> tuple:
    if not hasattr(os, "fork"):
        return _walked_here(source, kind)
    return _Pending(source, kind).answer()


class _Pending:
    """A walk running in its child process: answer() waits for its description, stop() ends it unheard."""

    def __init__(self, source, kind):
        self.name = source.name
        self.seconds = _seconds(source.size)

        def work(send) -> None:
            answer = marshal.dumps(_walked_here(source, kind))
            signal.alarm(0)  # HDF5 is done with: this process may take its time to read the answer
            send(b"W", answer)

        self.pid, self.fd = _forked(work, self.seconds)

    def answer(self) -> tuple:
        pid, self.pid = self.pid, None
        if pid is None:
            raise RuntimeError("an HDF5 walk's answer was taken twice or after it was stopped")
        return _walk_answer(pid, self.fd, self.seconds, self.name)

    def stop(self) -> None:
        pid, self.pid = self.pid, None
        if pid is not None:
            os.close(self.fd)
            _reaped(pid, stop=True)


def _walk_answer(pid: int, fd: int, seconds: int, source_name) -> tuple:
    """The description a walk's child sends (see _walked_here); FormatError if it crashed, hung or said nothing."""
    frames, died, late = _answers(pid, fd, seconds)
    if b"X" in frames:
        raise RuntimeError(f"the HDF5 walk failed in its child process:\n{bytes(frames[b'X']).decode()}")
    if died:
        raise FormatError(f"HDF5's library crashed ({died}) reading the file's structure: damaged metadata",
                          path=source_name)
    if late:
        raise FormatError(f"HDF5's library did not finish reading the file's structure in {late} s: damaged "
                          f"metadata (a loop), or a slow machine ({_SECONDS_VARIABLE} sets the time)",
                          path=source_name)
    payload = frames.get(b"W")
    if not payload:
        raise FormatError("HDF5's reading of the file's structure ended without an answer", path=source_name)
    return marshal.loads(payload)


def _forked(work, seconds: int):
    """(pid, read end of a pipe) of a child running work(send); send(tag, bytes) frames a message to this process.

    The child ends itself (SIGALRM) a little after `seconds`, should this
    process be gone without stopping it.
    """
    h5py = h5py_module("")
    read_fd, write_fd = os.pipe()
    phil = h5py._objects.phil
    with _FORK_LOCK, phil, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # a multi-threaded caller: see above
        pid = os.fork()
    if pid:
        os.close(write_fd)
        return pid, read_fd
    code = 0
    try:  # the child: never returns
        os.close(read_fd)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it
        faulthandler.disable()  # a crash is reported by this process, in one line
        for number in (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT, signal.SIGPIPE,
                       signal.SIGTERM, signal.SIGHUP, signal.SIGALRM):
            signal.signal(number, signal.SIG_DFL)
        signal.alarm(seconds + 5)

        def send(tag: bytes, body) -> None:
            view = memoryview(body).cast("B")
            _write_all(write_fd, _FRAME.pack(tag, len(view)))
            _write_all(write_fd, view)

        try:
            work(send)
        except Exception:  # noqa: BLE001 - a bug: its traceback goes to the parent, which raises it
            send(b"X", traceback.format_exc().encode("utf-8", "backslashreplace"))
    except BaseException:  # noqa: BLE001
        code = 70
    finally:
        os._exit(code)


def _write_all(fd: int, view) -> None:
    while len(view):
        view = view[os.write(fd, view):]


def _seconds(nbytes: int) -> int:
    """How long a child may take: _SECONDS (or the environment's), and a second more per 16 MiB to read."""
    value = os.environ.get(_SECONDS_VARIABLE)
    if value is None:
        return _SECONDS + nbytes // (16 << 20)
    if not (value.strip().isascii() and value.strip().isdigit() and int(value) > 0):
        raise UsageError(f"environment variable {_SECONDS_VARIABLE}={value!r} is not a number of seconds: "
                         "expected a whole number >= 1")
    return int(value) + nbytes // (16 << 20)


def _answers(pid: int, fd: int, seconds: int) -> tuple:
    """({tag: body} of what a child sent, the signal that killed it or None, `seconds` if it ran past them or 0).

    A child still running when the time is up is killed.
    """
    data = bytearray()
    deadline = time.monotonic() + seconds
    done = late = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                late = True
                break
            chunk = os.read(fd, 1 << 16)  # a pipe's buffer
            if not chunk:
                done = True
                break
            data += chunk
    finally:
        os.close(fd)
        died = _reaped(pid, stop=not done)
    frames, at = {}, 0
    while at + _FRAME.size <= len(data):
        tag, size = _FRAME.unpack_from(data, at)
        at += _FRAME.size
        if at + size > len(data):
            break
        frames[tag] = data[at:at + size]
        at += size
    return frames, died, seconds if late else 0


def _reaped(pid: int, *, stop: bool) -> str | None:
    """Wait for a child (stopped first when this process gives up on it); the signal that killed it, if one did."""
    try:
        if stop:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None  # stopped here, not crashed
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return None
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return signal.Signals(number).name
        except ValueError:
            return f"signal {number}"
    return None


class _At:
    """Marks h5py errors raised inside with the HDF5 path being read."""

    def __init__(self, where: str):
        self.where = where

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is not None and isinstance(exc, H5_ERRORS):
            _mark(exc, self.where)
        return False


def _mark(exc, where: str) -> None:
    """Mark an h5py error with the HDF5 path being read (the innermost mark stays)."""
    if not hasattr(exc, "blobtool_where"):
        with contextlib.suppress(AttributeError, TypeError):
            exc.blobtool_where = where


def _text(name: str) -> str:
    return name if len(name) <= _MAX_NAME else name[:_MAX_NAME] + "..."


def _top(doc, h5py, root, allowed) -> dict:
    top = dict(_links(h5py, root, doc.path, "/"))
    for name in top:
        if name not in allowed:
            raise _error(doc.path, f"/{_text(name)}", f"not part of Caffe's {doc.kind} snapshot "
                                                      f"(which holds {', '.join(allowed)})")
    return top


def _member(doc, h5py, gid, top: dict, name: str, *, group_expected: bool):
    if name not in top:
        raise _error(doc.path, f"/{name}", "missing (Caffe writes it; a damaged snapshot or not Caffe's)")
    return _open(h5py, gid, top[name], f"/{name}", doc.path, group_expected=group_expected)


def _indexed(h5py, gid, where, doc_path) -> list:
    """[(index, dataset id, its creation property list, its layout, its path)] of a group of blobs (datasets named 0, 1, ...), by index."""
    found = []
    for name, raw in _links(h5py, gid, doc_path, where):
        path = _join(where, _text(name))
        if not (name.isdigit() and name.isascii() and str(int(name)) == name):
            raise _error(doc_path, path, "not a blob: a blob's dataset is named by its index (0, 1, ...)")
        found.append((int(name), *_open(h5py, gid, raw, path, doc_path, group_expected=False), path))
    return sorted(found, key=_first)


def _first(item):
    return item[0]


def _stored(h5py, dsid, plist, layout, where, raw: bytes, doc) -> _Stored:
    """Check a dataset that holds a blob (its storage already checked: _open); where its values are.

    The type and dataspace are read through h5py's low-level calls (numpy's
    dtype for an HDF5 type costs more than the rest of a dataset together).
    Only a dataset whose type is exactly IEEE float32 or float64 in this
    machine's byte order, contiguous and unfiltered, is viewed in place.
    """
    try:
        tid = dsid.get_type()
        size = tid.get_size()
        dtype = None
        if tid.get_class() == h5py.h5t.FLOAT and size in (2, 4, 8):
            dtype = _FLOATS[tid.get_order() == h5py.h5t.ORDER_LE, size]
            standard = size != 2 and tid.equal(h5py.h5t.IEEE_F32LE if size == 4 else h5py.h5t.IEEE_F64LE)
        space = dsid.get_space()
        extent = space.get_simple_extent_type()
        shape = space.get_simple_extent_dims() if extent == h5py.h5s.SIMPLE else None
    except H5_ERRORS as exc:
        _mark(exc, where)
        raise
    if dtype is None:
        with _At(where):
            found = dsid.dtype
        what = "string" if found.kind in "SUO" else str(found) if found.kind in "iub" else f"{found.kind!r}-kind"
        raise _error(doc.path, where, f"holds {what} values; a blob is a float dataset (float32 or float64)")
    if extent == h5py.h5s.NULL:
        raise _error(doc.path, where, "is an empty dataset (no dataspace); a blob has 1 to 32 axes")
    if extent == h5py.h5s.SCALAR:
        raise _error(doc.path, where, "is a 0-d (scalar) dataset; a blob's dataset has 1 to 32 axes")
    if len(shape) > MAX_BLOB_AXES:
        raise _error(doc.path, where, f"has {len(shape)} axes; a blob has at most {MAX_BLOB_AXES}")
    shape = tuple(map(int, shape))
    if math.prod(d or 1 for d in shape) > _PLAIN_SPAN:
        try:
            Blob(dtype=_blob_dtype(dtype)).reshape(shape)
        except BlobToolError as exc:
            raise _error(doc.path, where, f"invalid blob shape: {exc.reason}") from exc
    offset = None
    try:
        if layout == h5py.h5d.CONTIGUOUS and standard and dtype.isnative and plist.get_nfilters() == 0:
            offset = dsid.get_offset()
        chunk = plist.get_chunk() if layout == h5py.h5d.CHUNKED else None
        stored = dsid.get_storage_size()
    except H5_ERRORS as exc:
        _mark(exc, where)
        raise
    nbytes = _product(shape) * dtype.itemsize
    if offset is not None and offset + nbytes > doc.size:
        raise _error(doc.path, where, f"truncated: its {nbytes} bytes of values at byte {offset} run past "
                                      f"the end of the file ({doc.size} bytes)", offset=offset)
    if chunk is not None:
        chunk = tuple(map(int, chunk))
        chunk_bytes = _product(chunk) * dtype.itemsize
        if chunk_bytes > MAX_CHUNK_BYTES:
            raise _error(doc.path, where, f"is stored in chunks of {chunk_bytes} bytes, more than blobtool's bound "
                                          f"of {MAX_CHUNK_BYTES >> 20} MiB (HDF5 reads a chunk whole); rechunk it, "
                                          "for example h5repack -l CONTI")
    if offset is None and nbytes > _MAX_EXPANSION * stored + _UNSTORED_BYTES:
        raise _error(doc.path, where, f"declares {nbytes} bytes of values, more than its {stored} stored "
                                      "bytes can hold")
    return _Stored(where, raw, shape, dtype, offset, None, chunk)


# The stored dtypes of a float dataset, by (little-endian, size).
_FLOATS = {(little, size): np.dtype(("<" if little else ">") + f"f{size}")
           for little in (True, False) for size in (2, 4, 8)}
# A shape spanning at most this many values (zero dimensions counted as one)
# is one any Blob holds: only a larger one is put to Blob.reshape's own
# check (which is what refuses it, and says why).
_PLAIN_SPAN = int(np.iinfo(np.intp).max) // 16


def _blob_dtype(stored: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if stored.itemsize == 8 else np.dtype(np.float32)


def _count(stored: _Stored) -> int:
    return _product(stored.shape)


def _values(doc: Document, stored: _Stored) -> np.ndarray:
    """The values of a dataset as a flat array of the blob's dtype: a view of the input, or read through HDF5.

    A dataset that is not Caffe's contiguous one (chunked, compressed,
    compact, big-endian, float16) comes with the walk when small; otherwise
    it is read in a child process (see "HDF5 in a child process"), a slab of
    whole chunks at a time (each chunk at most MAX_CHUNK_BYTES, checked in
    _stored), which HDF5 converts into the blob's type in place, in an
    anonymous shared mapping that becomes the blob's array: the blob is held
    once (in both processes' resident figures), beside one chunk in the child.
    """
    target = _blob_dtype(stored.dtype)
    count = _count(stored)
    if count == 0:
        return np.empty(0, dtype=target)
    if stored.offset is not None:
        return np.frombuffer(doc.source.buf, dtype=stored.dtype, count=count, offset=stored.offset)
    if stored.values is not None:
        return np.frombuffer(stored.values, dtype=target, count=count)
    if not hasattr(os, "fork"):
        values = np.empty(count, dtype=target)
        h5py = h5py_module(doc.path)
        with _opened(doc.source) as f:
            for _ in _slabs(h5py, f, stored, doc.path, values.reshape(stored.shape)):
                pass
        return values
    # The child writes the values into memory shared with this process (an
    # anonymous shared mapping, which becomes the blob's array): no copy.
    values = np.frombuffer(mmap.mmap(-1, count * target.itemsize), dtype=target, count=count)

    def work(send) -> None:
        h5py = h5py_module(doc.path)
        try:
            with _opened(doc.source) as f:
                for _ in _slabs(h5py, f, stored, doc.path, values.reshape(stored.shape)):
                    pass
            send(b"D", b"")
        except BlobToolError as exc:
            send(b"E", marshal.dumps(_error_plain(exc)))

    seconds = _seconds(values.nbytes)
    pid, fd = _forked(work, seconds)
    frames, died, late = _answers(pid, fd, seconds)
    if b"X" in frames:
        raise RuntimeError(f"reading HDF5 values failed in a child process:\n{bytes(frames[b'X']).decode()}")
    if b"E" in frames:
        raise _rebuilt(marshal.loads(frames[b"E"]))
    if died:
        raise _error(doc.path, stored.where, f"HDF5's library crashed ({died}) reading its values: damaged metadata")
    if late:
        raise _error(doc.path, stored.where, f"HDF5's library did not finish reading its values in {late} s: "
                                             f"damaged metadata (a loop), or a slow machine ({_SECONDS_VARIABLE} "
                                             "sets the time)")
    finished = b"D" in frames
    if not finished:
        raise _error(doc.path, stored.where, "HDF5's reading of its values ended early")
    return values


def _slabs(h5py, f, stored: _Stored, doc_path, into=None):
    """The values of a dataset read through HDF5, in the blob's dtype, a slab of whole rows of chunks at a time.

    Each slab is a new array, or a part of `into` (an array of the dataset's
    shape) read in place. No chunk cache: a slab holds whole chunks along the
    first axis, so each chunk is read and inflated once, converted (through
    HDF5's bounded conversion buffer), and let go.
    """
    target = _blob_dtype(stored.dtype)
    shape = stored.shape
    try:
        dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
        dapl.set_chunk_cache(0, 0, 1.0)
        dsid = h5py.h5d.open(f.id, stored.raw, dapl=dapl)
        _check_storage(h5py, dsid, stored.where, doc_path)
        row_bytes = max(1, _product(shape[1:]) * target.itemsize)
        step = stored.chunk[0] if stored.chunk else 1
        per = max(step, _SLAB_BYTES // row_bytes // step * step)
        space = dsid.get_space()
        for start in range(0, shape[0], per):
            rows = min(per, shape[0] - start)
            slab = np.empty((rows, *shape[1:]), dtype=target) if into is None else into[start:start + rows]
            space.select_hyperslab((start,) + (0,) * (len(shape) - 1), slab.shape)
            with np.errstate(over="ignore", invalid="ignore"):
                dsid.read(h5py.h5s.create_simple(slab.shape), space, slab)
            yield slab
    except H5_ERRORS as exc:
        raise _error(doc_path, stored.where, f"unreadable values: {reason(exc)}") from exc


class _Load:
    """Builds an entry's Blob from its data's (and diff's) datasets."""

    def __init__(self, doc: Document, data: _Stored, diff: _Stored | None):
        self.doc, self.data, self.diff = doc, data, diff

    def __call__(self) -> Blob:
        doc, data, diff = self.doc, self.data, self.diff
        blob = self.shell()
        try:
            blob.fill_from(data.shape, _values(doc, data), _values(doc, diff) if diff else None, adopt=True)
        except BlobToolError as exc:
            raise _error(doc.path, data.where, exc.reason) from exc
        return blob

    def shell(self) -> Blob:
        """The Blob without its values: shape, dtypes and origin, nothing read or allocated (blobwrite.Unread)."""
        data, diff = self.data, self.diff
        held = _blob_dtype(data.dtype)
        blob = Blob(dtype=held, diff_dtype=held_dtype(diff.dtype, held) if diff else None)
        try:
            blob.reshape(data.shape)
        except BlobToolError as exc:
            raise _error(self.doc.path, data.where, f"invalid blob shape: {exc.reason}") from exc
        stored_diff = diff.dtype.newbyteorder("=") if diff else None
        blob.origin = Origin("shape", data.dtype.newbyteorder("="), diff is not None,
                             diff_dtype=stored_diff if stored_diff != data.dtype.newbyteorder("=") else None)
        return blob


def _add(doc: Document, name: str, data: _Stored, diff: _Stored | None, layer=None) -> None:
    """Add an entry built from the walk's description (this process)."""
    doc.check_room(data.offset)
    stored = data.dtype.newbyteorder("=")
    diff_dtype = diff.dtype.newbyteorder("=") if diff is not None else None
    doc.entries.append(Entry(name, data.shape, "shape", stored, diff is not None, layer=layer,
                             build=_Load(doc, data, diff), diff_dtype=diff_dtype if diff_dtype != stored else None))


def _read_net(doc: Document, h5py, root) -> None:
    top = _top(doc, h5py, root, _NET_TOP)
    data = _member(doc, h5py, root, top, "data", group_expected=True)
    diff = _member(doc, h5py, root, top, "diff", group_expected=True) if "diff" in top else None
    diff_layers = dict(_links(h5py, diff, doc.path, "/diff")) if diff is not None else {}
    doc.meta["name"] = None
    shared = []
    for layer, raw in _links(h5py, data, doc.path, "/data"):
        name = _text(layer)
        where = f"/data/{name}"
        group = _open(h5py, data, raw, where, doc.path, group_expected=True)
        blobs = _indexed(h5py, group, where, doc.path)
        diffs = {}
        if layer in diff_layers:
            diff_where = f"/diff/{name}"
            diff_group = _open(h5py, diff, diff_layers.pop(layer), diff_where, doc.path, group_expected=True)
            diffs = {index: opened for index, *opened in _indexed(h5py, diff_group, diff_where, doc.path)}
        doc.layers.append(name)
        held = set()
        for index, dsid, plist, layout, path in blobs:
            stored = _stored(h5py, dsid, plist, layout, path, _raw_path(b"data", raw, index), doc)
            stored_diff = None
            if index in diffs:
                stored_diff = _stored(h5py, *diffs[index], _raw_path(b"diff", raw, index), doc)
                if stored_diff.shape != stored.shape:
                    raise _error(doc.path, stored_diff.where, f"shape {stored_diff.shape} differs from its "
                                                              f"data's {stored.shape}")
            _found(doc, f"{name}/{index}", stored, stored_diff, layer=name)
            held.add(index)
        for index in sorted(set(diffs) - held):
            # Caffe saves a shared parameter's data with its owner only.
            _stored(h5py, *diffs[index], _raw_path(b"diff", raw, index), doc)
            shared.append(f"{name}/{index}")
    if diff_layers:
        layer = next(iter(diff_layers))
        raise _error(doc.path, f"/diff/{_text(layer)}", "a diff for a layer that has no group in /data")
    if shared:
        doc.meta["shared"] = shared


def _found(doc: Document, name: str, data: _Stored, diff: _Stored | None, layer=None) -> None:
    """Add an entry to the walk's own document (the child): (name, layer, data, diff)."""
    doc.check_room(data.offset)
    doc.entries.append((name, layer, data, diff))


def _raw_path(top: bytes, layer: bytes, index: int) -> bytes:
    return b"/%s/%s/%d" % (top, layer, index)


def _scalar(doc, h5py, root, top: dict, name: str, kinds: str):
    """The one value of a solver field (iter, current_step: an integer; learned_net: a string)."""
    dsid = _member(doc, h5py, root, top, name, group_expected=False)[0]
    where = f"/{name}"
    with _At(where):
        dtype, shape = dsid.dtype, dsid.shape
        if shape is None or _product(shape) != 1 or dtype.kind not in kinds:
            expected = "one integer" if kinds == "iu" else "one string"
            raise _error(doc.path, where, f"holds {dtype} values of shape {shape}; Caffe writes {expected}")
        if dtype.kind in "SU" and dtype.itemsize > _MAX_STRING:
            raise _error(doc.path, where, f"a {dtype.itemsize}-byte string; Caffe writes a file name")
        if dtype.kind == "O" and h5py.check_string_dtype(dtype) is None:
            raise _error(doc.path, where, f"holds {dtype} values; Caffe writes a string")
        value = h5py.Dataset(dsid)[()]
    value = value.reshape(-1)[0] if shape else value
    if kinds == "iu" and not _INT32[0] <= int(value) <= _INT32[1]:
        raise _error(doc.path, where, f"{int(value)} does not fit Caffe's {name} (a 32-bit integer)")
    return value


def _read_solverstate(doc: Document, h5py, root) -> None:
    top = _top(doc, h5py, root, _SOLVER_TOP)
    doc.meta["iter"] = int(_scalar(doc, h5py, root, top, "iter", "iu"))
    learned = _scalar(doc, h5py, root, top, "learned_net", "SO")
    if isinstance(learned, (bytes, np.bytes_)):
        learned = bytes(learned).split(b"\0", 1)[0][:_MAX_STRING].decode("utf-8", "backslashreplace")
    if not isinstance(learned, str):
        raise _error(doc.path, "/learned_net", f"holds {type(learned).__name__}; Caffe writes a string")
    doc.meta["learned_net"] = _text(learned)
    doc.meta["current_step"] = int(_scalar(doc, h5py, root, top, "current_step", "iu"))
    history = _member(doc, h5py, root, top, "history", group_expected=True)
    for index, dsid, plist, layout, path in _indexed(h5py, history, "/history", doc.path):
        _found(doc, f"history/{index}", _stored(h5py, dsid, plist, layout, path, b"/history/%d" % index, doc), None)


# -- writing (formats/hdf5_write.py) ------------------------------------------------------

def write(doc: Document | None, entries: list, blobs: list, dest, *, kind: str, precision=None, write_diff=None,
          layout=None, transforms: dict | None = None) -> None:
    """Write a net or solver state as Caffe's HDF5 snapshot, atomically (see hdf5_write.write_snapshot)."""
    from .hdf5_write import write_snapshot

    write_snapshot(doc, entries, blobs, dest, kind=kind, precision=precision, write_diff=write_diff,
                   layout=layout, transforms=transforms)
