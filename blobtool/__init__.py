"""blobtool: inspect, compare and convert Caffe blob files.

The engine mirrors Caffe's SyncedMemory and Blob; load and save read and
write BlobProto files without copying their payloads.

The names below are imported on first use, so that the blobtool command
can set up the process (BLAS threads) before numpy is loaded.
"""

import importlib

__version__ = "0.1.0"

# name -> submodule that defines it
_EXPORTS = {
    "Blob": "blob",
    "BlobToolError": "errors",
    "load": "containers",
    "load_all": "containers",
    "save": "files",
    "SyncedHead": "syncedmem",
    "SyncedMemory": "syncedmem",
}

__all__ = ["Blob", "BlobToolError", "SyncedHead", "SyncedMemory", "load", "load_all", "save", "__version__"]


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'blobtool' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
