"""The library's entry points: what each command does, in one call.

Everything the command line does, a Python user can do here in one call:
read any kind of file (the kind sniffed from its bytes), write a selection
of blobs in any format blobtool writes, change, fold, run and export nets,
with the same options. The modules split the calls by job: blobs.py (load,
save, write), nets.py (a net's definition, edit, fold), transplant.py,
running.py (run, export) and checks.py (fold's and transplant's check);
every name is reached as blobtool.api.NAME.

The command reaches everything below the library through this package:
kinds.py (what files are and which formats write them), choices.py (what an
argument chooses), session.py (a run's guarded inputs and released pages),
compute.py (threads and the engine's streamed math), devices.py (a GPU),
naming.py (PyTorch's names). The names below are imported on first use, so
that the command can set up the process (BLAS threads) before numpy loads.
"""

import importlib

# name -> the module of this package that defines it
_EXPORTS = {
    "load": "blobs", "load_all": "blobs", "state_dict": "blobs", "save": "blobs", "write": "blobs",
    "resolve_precision": "blobs",
    "open_document": "kinds",
    "net_definition": "nets", "definition_text": "nets", "deploy_definition": "nets", "edit": "nets", "fold": "nets",
    "transplant": "transplant",
    "run": "running", "export": "running",
    "preprocess": "preprocessing", "Preprocessing": "preprocessing", "predict": "predicting",
    "OptionsRefused": "common",
    "PrefixClash": "naming",
}

__all__ = ["load", "load_all", "state_dict", "save", "write", "open_document", "net_definition",
           "resolve_precision", "definition_text", "deploy_definition", "transplant", "edit", "fold", "run", "export",
           "preprocess", "Preprocessing", "predict",
           "OptionsRefused", "PrefixClash"]


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'blobtool.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
