"""Shell completion of blob names after --blob, from the input files already on the command line.

click completes commands and options itself (`_BLOBTOOL_COMPLETE=bash_source
blobtool`); this adds the names --blob takes: the blobs and layers of the
files given so far. Only the files' headers are read (open_document reads no
payload), and completion never prints anything but the candidates: a file
that cannot be read gives none.
"""

from __future__ import annotations

import os

import click

__all__ = ["complete_blob_names"]


def _given_inputs(ctx: click.Context) -> list:
    """The input paths given so far, standard input left out.

    They are the command's INPUT arguments once parsed; while an option
    still waits for its value (`--blob` itself), click leaves the positional
    words unparsed in ctx.args.
    """
    from .options import INPUT

    words = []
    for param in ctx.command.params:
        if isinstance(param, click.Argument) and param.type is INPUT:
            value = ctx.params.get(param.name)
            words += value if isinstance(value, (list, tuple)) else [value]
    words += [w for w in ctx.args if not w.startswith("-")]
    return list(dict.fromkeys(w for w in words if isinstance(w, str) and w and w != "-"))


def _names(path: str, kind) -> list:
    """The names --blob accepts in this file: its blobs', then its layers' (a layer selects its blobs)."""
    from ..formats import open_document

    doc = open_document(path, kind)
    try:
        names = doc.names()
        names += [layer for layer in dict.fromkeys(e.layer for e in doc.entries if e.layer is not None)]
        return names
    finally:
        doc.source.close()


def complete_blob_names(ctx: click.Context, param, incomplete: str) -> list:
    """click's shell_complete for --blob: the names in the given files that start with `incomplete`, in file order."""
    found = {}
    kind = ctx.params.get("kind")
    for path in _given_inputs(ctx):
        if not os.path.isfile(path):
            continue  # a FIFO or device would block or stream: completion reads regular files only
        try:
            names = _names(path, kind)
        except Exception:  # noqa: BLE001 - a completion never fails: an unreadable file offers nothing
            continue
        for name in names:
            if name.startswith(incomplete):
                found.setdefault(name, None)
    return list(found)
