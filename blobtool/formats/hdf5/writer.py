"""Writing Caffe's HDF5 snapshots (the layout: see formats/hdf5/__init__.py), atomically and in bounded memory.

The groups, the solver fields and the datasets (contiguous, as Caffe's
hdf5_save_nd_dataset makes them, their space allocated at creation) are made
with h5py; each blob's values are then streamed into the space HDF5
allocated for its dataset, chunk by chunk (see _write_payloads for why).
The file is built in atomic_output's temporary file, or, for an output that
cannot seek (a pipe) or that already holds bytes before where it stands (a
standard output opened read-write), in an anonymous temporary file copied
out at the end, where the output stands.
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

from ..origin import Precision
from ..writing import resolve_form, write_parts
from ...errors import OutputError, UsageError, parameter
from ...files import atomic_output, display_name
from .. import PRECISION_TYPES, Document
from .h5 import H5_ERRORS, h5py_module, reason

__all__ = ["write_snapshot"]

# The dataset dtype each write precision asks for.
_TARGET = {name: np.dtype(text) for name, text in PRECISION_TYPES.items()}


@dataclass
class _Planned:
    """A dataset to write: its HDF5 path, shape, dtype, and the payload (values, dtype, transform)."""

    where: str
    shape: tuple
    part: tuple
    offset: int | None = None


def write_snapshot(doc: Document | None, entries: list, blobs: list, dest, *, kind: str, precision=None,
                   write_diff=None, layout=None, transforms: dict | None = None) -> None:
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
                         f"cannot be one (write .npz, or one blob with {parameter('format', given='blob')})")
    if layout == "legacy":
        raise UsageError(f"{parameter('layout', given='legacy')}: Caffe's HDF5 snapshots store each blob as an N-D "
                         "dataset; the legacy num/channels/height/width layout exists only in the protobuf form")
    h5py = h5py_module(display_name(dest))
    transforms = transforms or {}
    planned = []
    for entry, blob, selected in doc.whole(entries, blobs):
        group, index = _place(entry.name, kind)
        if blob.num_axes == 0:
            raise UsageError(f"blob {entry.name!r} has no axes (a scalar); Caffe's HDF5 datasets have 1 to 32")
        form = resolve_form(blob, precision=Precision.of(precision).for_blob(entry.name), write_diff=write_diff,
                            layout="shape") \
            if selected else resolve_form(blob, layout="shape")
        target = _TARGET[form["precision"]]
        fns = transforms.get(entry.name, {}) if selected else {}
        planned.append(_Planned(f"{group}/{index}", blob.shape, (blob.cpu_data(), target, fns.get("data"))))
        if form["write_diff"] and kind == "solverstate":
            raise UsageError(f"blob {entry.name!r} has a diff, and a solver state's HDF5 snapshot holds none "
                             f"(use {parameter('write_diff', given=False)} to drop it)")
        if form["write_diff"]:
            planned.append(_Planned(f"/diff{group[len('/data'):]}/{index}", blob.shape,
                                    (blob.cpu_diff(), _TARGET[form["diff_precision"]], fns.get("diff"))))
    layers = [layer.name for layer in doc.layers] if kind == "net" else []
    for layer in layers:
        _check_layer_name(layer)
    diff_layers = layers if any(p.where.startswith("/diff/") for p in planned) else []
    with atomic_output(dest) as out, _random_access(out) as target_file:
        try:
            _write_structure(h5py, target_file, kind, planned, layers, diff_layers, doc.meta)
        except H5_ERRORS as exc:
            raise OutputError(f"cannot write the HDF5 snapshot: {reason(exc)}", path=display_name(dest)) from exc
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
    if not layer or "/" in layer or "\0" in layer or layer in (".", ".."):
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
    """Stream each blob's values into its dataset's space, chunk by chunk (writing.write_parts).

    h5py writes a dataset by N-D hyperslabs only, so a blob whose last axis
    is large (an InnerProduct weight of shape (1, N)) would have to be
    converted and transformed whole in memory; writing the contiguous
    dataset's bytes at the offset HDF5 allocated lets scale and update stream
    as they do for protobuf, and pages of the input are released behind.
    """
    written = [p for p in planned if p.offset is not None]  # an empty dataset: no space allocated, nothing to write
    for k, p in enumerate(written):
        target_file.seek(p.offset)
        # The next dataset's values: a blob's diff follows its data, which stays read for it.
        write_parts(target_file, [p.part], following=written[k + 1].part[0] if k + 1 < len(written) else None)
    target_file.flush()


@contextlib.contextmanager
def _random_access(out):
    """A readable, writable, seekable file for h5py over atomic_output's `out`.

    atomic_output's temporary file is opened read-write (mkstemp) but
    wrapped write-only: a second file object over the same descriptor
    reads too. h5py writes at offsets from the start of the file, so that
    is done only for an empty file standing at its start (the temporary
    file, `1<> new_file`). Everything else gets the snapshot built in an
    anonymous temporary file first, then copied where the output stands, as
    every other format writes: a pipe, and a file opened read-write that
    already holds bytes (`1<> file` after a header), whose bytes before the
    write position are kept as .npz output keeps them.
    """
    fd = _read_write_fd(out)
    if fd is not None:
        out.flush()
        if os.lseek(fd, 0, os.SEEK_CUR) == 0 and os.fstat(fd).st_size == 0:
            with os.fdopen(os.dup(fd), "r+b") as both:
                yield both
            return
    elif _random_access_object(out) and _empty_at_start(out):
        yield out
        return
    with tempfile.TemporaryFile() as spool:
        yield spool
        spool.seek(0)
        shutil.copyfileobj(spool, out, 1 << 20)


def _empty_at_start(out) -> bool:
    """Whether a seekable file object stands at its start and holds nothing."""
    try:
        if out.tell() != 0:
            return False
        end = out.seek(0, io.SEEK_END)
        out.seek(0)
        return end == 0
    except (AttributeError, ValueError, OSError):
        return False


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
