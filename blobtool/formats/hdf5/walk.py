"""Walking an HDF5 snapshot's structure (in a child process): links never followed out of the file, storage checked.

Every object is opened as what it should be, by a hard link; what names
another file (external storage, virtual datasets, soft, external or
user-defined links), a name that is not UTF-8 or one a damaged group lists
twice is refused, naming its HDF5 path, before anything is read through it.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

from ...engine.blob import Blob, MAX_BLOB_AXES
from ...errors import BlobToolError
from .. import Document, MAX_BLOBS
from .h5 import (FLOATS, H5_ERRORS, INT32, MAX_CHUNK_BYTES, MAX_EXPANSION, MAX_STRING, PLAIN_SPAN, SHIP_BYTES,
                 SHIP_TOTAL, SLAB_BYTES, UNSTORED_BYTES, At, Stored, blob_dtype, clipped, error_at, h5py_module,
                 mark_where, opened_file, plain_error, product, reason)


# The objects at the top of each kind's snapshot.
_NET_TOP = ("data", "diff")


_SOLVER_TOP = ("iter", "learned_net", "current_step", "history")


def _join(where: str, name: str) -> str:
    return f"/{name}" if where == "/" else f"{where}/{name}"


def _shown(raw: bytes) -> str:
    return clipped(raw.decode("utf-8", "backslashreplace"))


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
        mark_where(exc, where)
        raise
    if len(listed) > MAX_BLOBS:
        raise error_at(doc_path, where, f"holds more than {MAX_BLOBS} objects (blobtool's limit)")
    found, seen = [], set()
    hard = h5py.h5l.TYPE_HARD
    for raw, kind in listed:
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise error_at(doc_path, _join(where, _shown(raw)),
                         "a name that is not UTF-8 (Caffe's layer names are text)") from None
        if kind != hard or name in seen or not raw or b"/" in raw or b"\0" in raw or raw == b".":
            path = _join(where, _shown(raw))
            if not raw or b"/" in raw or b"\0" in raw or raw == b".":
                raise error_at(doc_path, path, f"a link named {name!r}, which HDF5 never writes (a damaged file)")
            if name in seen:
                raise error_at(doc_path, path, "listed twice in its group (a damaged file)")
            raise error_at(doc_path, path, _link_refusal(h5py, gid, raw, kind))
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


def _open(h5py, gid, raw: bytes, where, doc_path, *, group_expected: bool, dapl=None):
    """The group a hard link names, or (dataset, its creation property list, its layout), its storage checked.

    The object is opened as what it should be (h5g.open, h5d.open: h5py
    then need not ask HDF5 what it is); only when that fails is it opened
    as whatever it is, which says what it is instead, or fails with HDF5's
    own reason. A dataset is opened with `dapl` (_no_cache) where given.
    """
    try:
        obj = h5py.h5g.open(gid, raw) if group_expected else h5py.h5d.open(gid, raw, dapl=dapl)
    except H5_ERRORS:
        obj = None
    if obj is None:
        try:
            obj = h5py.h5o.open(gid, raw)
        except H5_ERRORS as exc:
            mark_where(exc, where)
            raise
        if group_expected and not isinstance(obj, h5py.h5g.GroupID):
            raise error_at(doc_path, where, f"expected a group, found {_what(obj, h5py)}")
        if not group_expected and not isinstance(obj, h5py.h5d.DatasetID):
            raise error_at(doc_path, where, f"expected a dataset, found {_what(obj, h5py)}")
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
        mark_where(exc, where)
        raise
    if layout == h5py.h5d.VIRTUAL:
        raise error_at(doc_path, where, "is a virtual dataset (its values are mapped from other datasets, maybe "
                                      "in other files); a file names only itself: blobtool never follows one")
    if layout not in (h5py.h5d.CONTIGUOUS, h5py.h5d.CHUNKED, h5py.h5d.COMPACT):
        raise error_at(doc_path, where, f"has a storage layout blobtool does not know (HDF5 layout {layout})")
    if external:
        files = f"another file ({_shown(first)!r})" if external == 1 else f"{external} other files"
        raise error_at(doc_path, where, f"keeps its values in {files} (HDF5 external storage); a file names only "
                                      "itself: blobtool never reads another")
    return plist, layout


def _sniffed(source, h5py, f) -> str:
    try:
        root = h5py.h5g.open(f.id, b"/")
        top = dict(_links(h5py, root, source.name, "/"))
        data_is_dataset = "data" in top and isinstance(_open_any(h5py, root, top["data"]), h5py.h5d.DatasetID)
    except H5_ERRORS as exc:
        raise error_at(source.name, getattr(exc, "blobtool_where", "/"), f"unreadable: {reason(exc)}") from exc
    if data_is_dataset:
        found = ", ".join(list(top)[:8])
        raise error_at(source.name, "/", f"an HDF5 dataset file (training data, as Caffe's HDF5Data layer reads: "
                                       f"{found}), not a Caffe snapshot; blobtool reads snapshots "
                                       "(.caffemodel.h5, .solverstate.h5)")
    if "data" in top:
        return "net"
    if set(top) & set(_SOLVER_TOP):
        return "solverstate"
    found = ", ".join(clipped(name) for name in list(top)[:8]) or "nothing"
    raise error_at(source.name, "/", f"not a Caffe snapshot: the file holds {found}; expected a group 'data' "
                                   f"(a net) or {', '.join(_SOLVER_TOP)} (a solver state)")


def _open_any(h5py, gid, raw):
    with At(_join("/", raw.decode("utf-8"))):
        return h5py.h5o.open(gid, raw)


def walked_here(source, kind) -> tuple:
    """The walk itself (in the child): ("sniff-error", error) or ("walked", kind, ("ok", description) or ("error", error))."""
    h5py = h5py_module(source.name)
    sniffing = kind is None
    try:
        with opened_file(source) as f:
            if sniffing:
                kind = _sniffed(source, h5py, f)
                sniffing = False
            # The walk's own document: its entries are (name, layer, data,
            # diff) with Stored sides, its layers the layers' names; the
            # description sent holds the same as plain values.
            doc = Document(source.name, kind, source, format="hdf5")
            try:
                root = h5py.h5g.open(f.id, b"/")
                walker = _Walker(h5py, doc)
                if kind == "net":
                    _read_net(walker, root)
                else:
                    _read_solverstate(walker, root)
            except H5_ERRORS as exc:
                where = getattr(exc, "blobtool_where", "/")
                raise error_at(doc.path, where, f"unreadable: {reason(exc)}") from exc
            entries = [(name, layer, data.plain(), diff.plain() if diff is not None else None)
                       for name, layer, data, diff in doc.entries]
    except BlobToolError as exc:
        return ("sniff-error", plain_error(exc)) if sniffing else ("walked", kind, ("error", plain_error(exc)))
    meta = {key: value for key, value in doc.meta.items() if key != "format"}
    return ("walked", kind, ("ok", {"meta": meta, "layers": doc.layers, "entries": entries}))


def _top(doc, h5py, root, allowed) -> dict:
    top = dict(_links(h5py, root, doc.path, "/"))
    for name in top:
        if name not in allowed:
            raise error_at(doc.path, f"/{clipped(name)}", f"not part of Caffe's {doc.kind} snapshot "
                                                      f"(which holds {', '.join(allowed)})")
    return top


def _member(doc, h5py, gid, top: dict, name: str, *, group_expected: bool):
    if name not in top:
        raise error_at(doc.path, f"/{name}", "missing (Caffe writes it; a damaged snapshot or not Caffe's)")
    return _open(h5py, gid, top[name], f"/{name}", doc.path, group_expected=group_expected)


class _Walker:
    """What one walk holds besides its document: h5py, the datasets' access property list, what is left to send.

    Everything per dataset is done once per walk where it can be: one
    access property list without a chunk cache for every dataset, and the
    values of a small dataset that is not Caffe's contiguous one read from
    the dataset as it is open for the walk (not opened a second time).
    """

    def __init__(self, h5py, doc: Document):
        self.h5py, self.doc = h5py, doc
        self.dapl = _no_cache(h5py)
        self.ship_left = SHIP_TOTAL  # bytes of values still sent with the walk (SHIP_TOTAL)
        self.memory_types = {}  # {blob dtype: its HDF5 type}, for read_all
        # The type IDs of Caffe's own datasets, compared with each dataset's in one call.
        self.standard = ((h5py.h5t.IEEE_F32LE, FLOATS[True, 4]), (h5py.h5t.IEEE_F64LE, FLOATS[True, 8]))

    def indexed(self, gid, where) -> list:
        """[(index, dataset id, its creation property list, its layout, its path)] of a group of blobs (datasets named 0, 1, ...), by index."""
        h5py, doc_path, dapl = self.h5py, self.doc.path, self.dapl
        found = []
        for name, raw in _links(h5py, gid, doc_path, where):
            path = _join(where, clipped(name))
            if not (name.isdigit() and name.isascii() and str(int(name)) == name):
                raise error_at(doc_path, path, "not a blob: a blob's dataset is named by its index (0, 1, ...)")
            found.append((int(name), *_open(h5py, gid, raw, path, doc_path, group_expected=False, dapl=dapl), path))
        if len(found) > 1:
            found.sort(key=_first)
        return found

    def stored(self, dsid, plist, layout, where, raw: bytes, ship: bool = True) -> Stored:
        """Check a dataset that holds a blob (its storage already checked: _open); where its values are.

        The type and dataspace are read through h5py's low-level calls (numpy's
        dtype for an HDF5 type costs more than the rest of a dataset together).
        Only a dataset whose type is exactly IEEE float32 or float64 in this
        machine's byte order, contiguous and unfiltered, is viewed in place.
        Any other one of at most SHIP_BYTES (in the blob's dtype) has its
        values read now, while SHIP_TOTAL allows and `ship` is set, to be
        sent with the walk.
        """
        dtype, standard, shape, extent = self._type_and_space(dsid, where)
        shape = self._blob_shape(dsid, dtype, shape, extent, where)
        offset, chunk = self._storage(dsid, plist, layout, standard, dtype, shape, where)
        if offset is not None:
            return Stored(where, raw, shape, dtype, offset)
        values = None
        held = product(shape) * blob_dtype(dtype).itemsize
        if ship and held <= SHIP_BYTES and held <= self.ship_left:
            values = self.read_all(dsid, shape, blob_dtype(dtype), where)
            self.ship_left -= held
        return Stored(where, raw, shape, dtype, None, values, chunk)

    def _type_and_space(self, dsid, where) -> tuple:
        """(dtype or None, whether the type is a standard float of this machine, dims, the extent's type).

        dtype is None for a type that is no IEEE float of 2, 4 or 8 bytes.
        """
        h5py = self.h5py
        try:
            tid = dsid.get_type()
            for standard_type, dtype in self.standard:
                if tid.equal(standard_type):
                    standard = True
                    break
            else:
                size = tid.get_size()
                dtype, standard = None, False
                if tid.get_class() == h5py.h5t.FLOAT and size in (2, 4, 8):
                    dtype = FLOATS[tid.get_order() == h5py.h5t.ORDER_LE, size]
            space = dsid.get_space()
            # A simple dataspace has at least one axis: only an empty tuple needs the extent's type.
            shape = space.get_simple_extent_dims()
            extent = h5py.h5s.SIMPLE if shape else space.get_simple_extent_type()
        except H5_ERRORS as exc:
            mark_where(exc, where)
            raise
        return dtype, standard, shape, extent

    def _blob_shape(self, dsid, dtype, shape, extent, where) -> tuple:
        """The dataset's shape, refused unless a blob can hold it: float values, 1 to 32 axes, a count Blob takes."""
        h5py, doc = self.h5py, self.doc
        if dtype is None:
            with At(where):
                found = dsid.dtype
            what = "string" if found.kind in "SUO" else str(found) if found.kind in "iub" else f"{found.kind!r}-kind"
            raise error_at(doc.path, where, f"holds {what} values; a blob is a float dataset (float32 or float64)")
        if extent == h5py.h5s.NULL:
            raise error_at(doc.path, where, "is an empty dataset (no dataspace); a blob has 1 to 32 axes")
        if extent != h5py.h5s.SIMPLE:
            raise error_at(doc.path, where, "is a 0-d (scalar) dataset; a blob's dataset has 1 to 32 axes")
        if len(shape) > MAX_BLOB_AXES:
            raise error_at(doc.path, where, f"has {len(shape)} axes; a blob has at most {MAX_BLOB_AXES}")
        shape = tuple(map(int, shape))
        if math.prod(d or 1 for d in shape) > PLAIN_SPAN:
            try:
                Blob(dtype=blob_dtype(dtype)).reshape(shape)
            except BlobToolError as exc:
                raise error_at(doc.path, where, f"invalid blob shape: {exc.reason}") from exc
        return shape

    def _storage(self, dsid, plist, layout, standard: bool, dtype, shape: tuple, where) -> tuple:
        """(offset, chunk): where a plain contiguous dataset's values lie in the file, or else its chunk shape (None
        when not chunked); refused where the values run past the file, or pass what its storage can hold."""
        h5py, doc = self.h5py, self.doc
        offset = chunk = None
        try:
            if layout == h5py.h5d.CONTIGUOUS and standard and dtype.isnative and plist.get_nfilters() == 0:
                offset = dsid.get_offset()
            if offset is None:
                if layout == h5py.h5d.CHUNKED:
                    chunk = plist.get_chunk()
                stored = dsid.get_storage_size()
        except H5_ERRORS as exc:
            mark_where(exc, where)
            raise
        nbytes = product(shape) * dtype.itemsize
        if offset is not None:
            if offset + nbytes > doc.size:
                raise error_at(doc.path, where, f"truncated: its {nbytes} bytes of values at byte {offset} run past "
                                              f"the end of the file ({doc.size} bytes)", offset=offset)
            return offset, None
        if chunk is not None:
            chunk = tuple(map(int, chunk))
            chunk_bytes = product(chunk) * dtype.itemsize
            if chunk_bytes > MAX_CHUNK_BYTES:
                raise error_at(doc.path, where, f"is stored in chunks of {chunk_bytes} bytes, more than blobtool's "
                                              f"bound of {MAX_CHUNK_BYTES >> 20} MiB (HDF5 reads a chunk whole); "
                                              "rechunk it, for example h5repack -l CONTI")
        if nbytes > MAX_EXPANSION * stored + UNSTORED_BYTES:
            raise error_at(doc.path, where, f"declares {nbytes} bytes of values, more than its {stored} stored "
                                          "bytes can hold")
        return None, chunk

    def read_all(self, dsid, shape: tuple, target: np.dtype, where: str) -> bytes:
        """A small dataset's values (its storage checked, opened without a chunk cache), converted by HDF5 to `target`.

        The memory type is made once per dtype (h5py would make it per read).
        """
        values = np.empty(shape, dtype=target)
        if values.size:
            h5py = self.h5py
            mtype = self.memory_types.get(target)
            if mtype is None:
                mtype = self.memory_types[target] = h5py.h5t.py_create(target)
            try:
                with np.errstate(over="ignore", invalid="ignore"):
                    dsid.read(h5py.h5s.ALL, h5py.h5s.ALL, values, mtype=mtype)
            except H5_ERRORS as exc:
                raise error_at(self.doc.path, where, f"unreadable values: {reason(exc)}") from exc
        return values.tobytes()


def _first(item):
    return item[0]


def _no_cache(h5py):
    """A dataset access property list without a chunk cache (a read holds whole chunks, each read once)."""
    dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
    dapl.set_chunk_cache(0, 0, 1.0)
    return dapl


def slabs(h5py, f, stored: Stored, doc_path, into=None):
    """The values of a dataset read through HDF5, in the blob's dtype, a slab of whole rows of chunks at a time.

    Each slab is a new array, or a part of `into` (an array of the dataset's
    shape) read in place. No chunk cache: a slab holds whole chunks along the
    first axis, so each chunk is read and inflated once, converted (through
    HDF5's bounded conversion buffer), and let go.
    """
    target = blob_dtype(stored.dtype)
    shape = stored.shape
    try:
        dsid = h5py.h5d.open(f.id, stored.raw, dapl=_no_cache(h5py))
        _check_storage(h5py, dsid, stored.where, doc_path)
        row_bytes = max(1, product(shape[1:]) * target.itemsize)
        step = stored.chunk[0] if stored.chunk else 1
        per = max(step, SLAB_BYTES // row_bytes // step * step)
        space = dsid.get_space()
        for start in range(0, shape[0], per):
            rows = min(per, shape[0] - start)
            slab = np.empty((rows, *shape[1:]), dtype=target) if into is None else into[start:start + rows]
            space.select_hyperslab((start,) + (0,) * (len(shape) - 1), slab.shape)
            with np.errstate(over="ignore", invalid="ignore"):
                dsid.read(h5py.h5s.create_simple(slab.shape), space, slab)
            yield slab
    except H5_ERRORS as exc:
        raise error_at(doc_path, stored.where, f"unreadable values: {reason(exc)}") from exc


def _read_net(walker: _Walker, root) -> None:
    doc, h5py = walker.doc, walker.h5py
    indexed, stored_at = walker.indexed, walker.stored
    top = _top(doc, h5py, root, _NET_TOP)
    data = _member(doc, h5py, root, top, "data", group_expected=True)
    diff = _member(doc, h5py, root, top, "diff", group_expected=True) if "diff" in top else None
    diff_layers = dict(_links(h5py, diff, doc.path, "/diff")) if diff is not None else {}
    doc.meta["name"] = None
    shared = []
    for layer, raw in _links(h5py, data, doc.path, "/data"):
        name = clipped(layer)
        where = f"/data/{name}"
        group = _open(h5py, data, raw, where, doc.path, group_expected=True)
        blobs = indexed(group, where)
        diffs = {}
        if layer in diff_layers:
            diff_where = f"/diff/{name}"
            diff_group = _open(h5py, diff, diff_layers.pop(layer), diff_where, doc.path, group_expected=True)
            diffs = {index: opened for index, *opened in indexed(diff_group, diff_where)}
        doc.layers.append(name)
        held = set()
        for index, dsid, plist, layout, path in blobs:
            stored = stored_at(dsid, plist, layout, path, _raw_path(b"data", raw, index))
            stored_diff = None
            if index in diffs:
                stored_diff = stored_at(*diffs[index], _raw_path(b"diff", raw, index))
                if stored_diff.shape != stored.shape:
                    raise error_at(doc.path, stored_diff.where, f"shape {stored_diff.shape} differs from its "
                                                              f"data's {stored.shape}")
            _found(doc, f"{name}/{index}", stored, stored_diff, layer=name)
            held.add(index)
        for index in sorted(set(diffs) - held):
            # Caffe saves a shared parameter's data with its owner only.
            stored_at(*diffs[index], _raw_path(b"diff", raw, index), ship=False)
            shared.append(f"{name}/{index}")
    if diff_layers:
        layer = next(iter(diff_layers))
        raise error_at(doc.path, f"/diff/{clipped(layer)}", "a diff for a layer that has no group in /data")
    if shared:
        doc.meta["shared"] = shared


def _found(doc: Document, name: str, data: Stored, diff: Stored | None, layer=None) -> None:
    """Add an entry to the walk's own document (the child): (name, layer, data, diff)."""
    doc.check_room(data.offset)
    doc.entries.append((name, layer, data, diff))


def _raw_path(top: bytes, layer: bytes, index: int) -> bytes:
    return b"/%s/%s/%d" % (top, layer, index)


def _scalar(doc, h5py, root, top: dict, name: str, kinds: str):
    """The one value of a solver field (iter, current_step: an integer; learned_net: a string)."""
    dsid = _member(doc, h5py, root, top, name, group_expected=False)[0]
    where = f"/{name}"
    with At(where):
        dtype, shape = dsid.dtype, dsid.shape
        if shape is None or product(shape) != 1 or dtype.kind not in kinds:
            expected = "one integer" if kinds == "iu" else "one string"
            raise error_at(doc.path, where, f"holds {dtype} values of shape {shape}; Caffe writes {expected}")
        if dtype.kind in "SU" and dtype.itemsize > MAX_STRING:
            raise error_at(doc.path, where, f"a {dtype.itemsize}-byte string; Caffe writes a file name")
        if dtype.kind == "O" and h5py.check_string_dtype(dtype) is None:
            raise error_at(doc.path, where, f"holds {dtype} values; Caffe writes a string")
        value = h5py.Dataset(dsid)[()]
    value = value.reshape(-1)[0] if shape else value
    if kinds == "iu" and not INT32[0] <= int(value) <= INT32[1]:
        raise error_at(doc.path, where, f"{int(value)} does not fit Caffe's {name} (a 32-bit integer)")
    return value


def _read_solverstate(walker: _Walker, root) -> None:
    doc, h5py = walker.doc, walker.h5py
    top = _top(doc, h5py, root, _SOLVER_TOP)
    doc.meta["iter"] = int(_scalar(doc, h5py, root, top, "iter", "iu"))
    learned = _scalar(doc, h5py, root, top, "learned_net", "SO")
    if isinstance(learned, (bytes, np.bytes_)):
        learned = bytes(learned).split(b"\0", 1)[0][:MAX_STRING].decode("utf-8", "backslashreplace")
    if not isinstance(learned, str):
        raise error_at(doc.path, "/learned_net", f"holds {type(learned).__name__}; Caffe writes a string")
    doc.meta["learned_net"] = clipped(learned)
    doc.meta["current_step"] = int(_scalar(doc, h5py, root, top, "current_step", "iu"))
    history = _member(doc, h5py, root, top, "history", group_expected=True)
    for index, dsid, plist, layout, path in walker.indexed(history, "/history"):
        _found(doc, f"history/{index}", walker.stored(dsid, plist, layout, path, b"/history/%d" % index), None)
