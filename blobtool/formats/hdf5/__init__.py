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

Reading: HDF5 runs only in child processes (child.py: damaged metadata
can crash the library itself), and the structure goes through h5py's
low-level API (walk.py); values.py reads a blob's values, h5.py holds what
the reader and the writer share. A file names only itself: a link that is not a hard link
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

Writing (writer.py, imported when a snapshot is written): Caffe's
layout for the input's kind, each payload streamed into its dataset's space
chunk by chunk, so memory stays bounded whatever the file size.
"""

from __future__ import annotations

import os

from ...errors import UsageError
from .. import Document, NetLayer
from .child import Pending, walk_file
from .h5 import EXTRA, H5_ERRORS, MAX_CHUNK_BYTES, Stored, rebuilt_error, h5py_module
from .values import add_entry

__all__ = ["sniff", "begin", "read", "write", "EXTRA", "H5_ERRORS", "MAX_CHUNK_BYTES", "h5py_module"]


def sniff(source) -> str:
    """"net" or "solverstate", from the objects at the top of an HDF5 file (its signature matched).

    The file's whole structure is walked here, in a child process
    (child.py); read() then uses that walk.
    """
    h5py_module(source.name)
    walked = _taken(source, None)
    if walked[0] == "sniff-error":
        raise rebuilt_error(walked[1])
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
    pending = Pending(source, kind)
    source._hdf5_walk = pending
    return pending.stop


def _taken(source, kind) -> tuple:
    """The walk of `source` begin() or sniff() left on it, if it is one for `kind` (any, for None); else a new walk."""
    walked = getattr(source, "_hdf5_walk", None)
    if walked is not None:
        del source._hdf5_walk
        if isinstance(walked, Pending):
            walked = walked.answer()
    if walked is None or (kind is not None and (walked[0] != "walked" or walked[1] != kind)):
        walked = walk_file(source, kind)
    return walked


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
        raise rebuilt_error(walked[1])
    outcome = walked[2]
    if outcome[0] == "error":
        raise rebuilt_error(outcome[1])
    described = outcome[1]
    doc.meta.update(described["meta"])
    doc.layers.extend(NetLayer(name) for name in described["layers"])
    plain = Stored.from_plain
    for name, layer, data, diff in described["entries"]:
        add_entry(doc, name, plain(data), plain(diff) if diff is not None else None, layer=layer)


def write(doc: Document | None, entries: list, blobs: list, dest, *, kind: str, precision=None, write_diff=None,
          layout=None, transforms: dict | None = None) -> None:
    """Write a net or solver state as Caffe's HDF5 snapshot, atomically (see writer.write_snapshot)."""
    from .writer import write_snapshot

    write_snapshot(doc, entries, blobs, dest, kind=kind, precision=precision, write_diff=write_diff,
                   layout=layout, transforms=transforms)
