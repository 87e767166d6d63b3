"""What the commands share between reading and working: opening inputs, selecting blobs, placing them on a GPU."""

from __future__ import annotations

__all__ = ["open_input", "open_inputs", "load_selected", "use_device", "place", "array_module"]


def open_input(path, kind=None, npy_cast=None):
    """Open an input as a Document (formats.open_document) and print its warnings."""
    from ..formats import open_document
    from .output import warn

    doc = open_document(path, kind, npy_cast=npy_cast)
    warn(doc)
    return doc


def open_inputs(paths, kind=None) -> list:
    """open_input for several inputs, read at once where their format allows (formats.open_documents)."""
    from ..formats import open_documents
    from .output import warn

    docs = []
    for doc in open_documents(paths, kind):
        warn(doc)
        docs.append(doc)
    return docs


def load_selected(path, kind, patterns, device_info, npy_cast=None):
    """(document, selected entries, their Blobs placed where the work runs), payloads about to be read through."""
    from ..formats import select

    doc = open_input(path, kind, npy_cast=npy_cast)
    entries = select(doc, patterns)
    doc.source.will_read_through()
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
