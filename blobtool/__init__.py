"""blobtool: inspect, compare and convert Caffe blob files.

The engine mirrors Caffe's SyncedMemory and Blob; load, load_all and
open_document read every kind of file blobtool knows without copying the
payloads, and save and write write them (see blobtool.api).

The names below are imported on first use, so that the blobtool command
can set up the process (BLAS threads) before numpy is loaded.
"""

import importlib

__version__ = "0.1.0"

# name -> submodule that defines it
_EXPORTS = {
    "Blob": "engine.blob",
    "BlobToolError": "errors",
    "ExitCode": "errors",
    "load": "api",
    "load_all": "api",
    "save": "api",
    "state_dict": "api",
    "write": "api",
    "net_definition": "api",
    "definition_text": "api",
    "transplant": "api",
    "edit": "api",
    "fold": "api",
    "run": "api",
    "export": "api",
    "preprocess": "api",
    "predict": "api",
    "deploy_definition": "api",
    "open_document": "formats",
    "select": "formats",
    "SyncedHead": "engine.syncedmem",
    "SyncedMemory": "engine.syncedmem",
}

__all__ = ["Blob", "BlobToolError", "ExitCode", "SyncedHead", "SyncedMemory", "definition_text", "deploy_definition",
           "edit", "export", "fold", "predict", "preprocess", "run",
           "load", "load_all", "net_definition", "open_document", "save", "select", "state_dict", "transplant", "write",
           "__version__"]


# Modules a script reaches as blobtool.NAME (from blobtool import work) without importing them first:
# short names of the engine's modules (`import blobtool.engine.work` imports the same module).
_SUBMODULES = {"work": "engine.work", "files": "files", "kernels": "engine.kernels", "device": "engine.device"}


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f".{_SUBMODULES[name]}", __name__)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'blobtool' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBMODULES))
