"""What the commands share between reading and working: opening inputs, selecting blobs, placing them on a GPU."""

from __future__ import annotations

__all__ = ["open_input", "load_selected", "use_device", "place", "array_module"]


def open_input(path, kind=None, npy_cast=None):
    """Open an input as a Document (formats.open_document) and print its warnings."""
    from ..formats import open_document
    from .output import warn

    doc = open_document(path, kind, npy_cast=npy_cast)
    warn(doc)
    return doc


def load_selected(path, kind, patterns, device_info, npy_cast=None, *, to_write=False):
    """(document, selected entries, their Blobs placed where the work runs), payloads about to be read through.

    `to_write`: the Blobs are only written out, on the host: each entry's
    Entry.blob_to_write(), whose values (an HDF5 dataset read through HDF5)
    are read as they are written and let go, one blob at a time.
    """
    from ..formats import select

    doc = open_input(path, kind, npy_cast=npy_cast)
    entries = select(doc, patterns)
    doc.source.will_read_through()
    if to_write and device_info is None:
        return doc, entries, [e.blob_to_write() for e in entries]
    return doc, entries, [place(e.blob(), device_info) for e in entries]


def use_device(index):
    """Select GPU `index` (None: stay on the host); returns the JSON "device" object or None."""
    if index is None:
        return None
    from .. import device
    return device.use(index).describe()


def place(blob, device_info):
    """Put a blob's data (and diff) where the work runs: on the GPU when one was selected."""
    if device_info is not None and blob.count:
        blob.gpu_data()
        if blob.diff_memory is not None and blob.diff_memory.head.name != "UNINITIALIZED":
            blob.gpu_diff()
    return blob


def array_module(device_info):
    """numpy, or CuPy when the work runs on a GPU."""
    if device_info is None:
        import numpy
        return numpy
    from .. import device
    return device.current().cp
