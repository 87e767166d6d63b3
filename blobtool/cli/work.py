"""What the commands share between reading and working: opening inputs, selecting blobs, a GPU's selection and release."""

from __future__ import annotations

__all__ = ["open_input", "open_inputs", "load_selected", "use_device", "release_device", "array_module"]


def open_input(path, kind=None, npy_cast=None):
    """Open an input as a Document (formats.open_document) and print its warnings."""
    from ..api import open_document
    from .output import warn

    doc = open_document(path, kind, npy_cast=npy_cast)
    warn(doc)
    return doc


def open_inputs(paths, kind=None) -> list:
    """open_input for several inputs, read at once where their format allows (formats.open_documents)."""
    from ..api.kinds import open_documents
    from .output import warn

    docs = []
    for doc in open_documents(paths, kind):
        warn(doc)
        docs.append(doc)
    return docs


def load_selected(path, kind, patterns, npy_cast=None, *, to_write=False):
    """(document, selected entries, their Blobs on the host), payloads about to be read through.

    A command that works on a GPU moves each blob there when it uses it, and
    only the sides it uses. `to_write`: the Blobs are only written out: each
    entry's Entry.blob_to_write(), whose values (an HDF5 dataset read through
    HDF5) are read as they are written and let go, one blob at a time.
    """
    from ..api.kinds import select

    doc = open_input(path, kind, npy_cast=npy_cast)
    entries = select(doc, patterns)
    doc.source.will_read_through()
    if to_write:
        return doc, entries, [e.blob_to_write() for e in entries]
    return doc, entries, [e.blob() for e in entries]


def use_device(index):
    """Select GPU `index` (None: stay on the host); returns the JSON "device" object or None."""
    if index is None:
        return None
    from ..api.devices import device
    return device.use(index).describe()


def release_device(blob) -> None:
    """Bring a blob's results back to the host and free its device memory, once the device is done with it."""
    for memory in (blob.data_memory, blob.diff_memory):
        if memory is not None:
            memory.release_gpu()


def array_module(device_info):
    """numpy, or CuPy when the work runs on a GPU."""
    if device_info is None:
        import numpy
        return numpy
    from ..api.devices import device
    return device.current().cp
