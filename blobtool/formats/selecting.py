"""Choosing a document's blobs by name (--blob), the names blobtool lists, and names made unique."""

from __future__ import annotations

import fnmatch

from ..errors import FormatError, parameter

__all__ = ["select", "listed_name", "unique_names"]


def select(doc: Document, patterns) -> list:
    """The entries selected by any of `patterns`, in file order.

    A pattern that is a blob's exact name selects that blob only; else one
    that is a layer's exact name selects that layer's blobs; only a pattern
    that is neither is a glob over the blob names (so `fc[relu]/0` never
    selects `fcr/0` when a blob is called `fc[relu]/0`). No patterns selects
    everything. A pattern that selects nothing raises FormatError listing the
    names available.
    """
    if not patterns:
        return list(doc.entries)
    by_name = {e.name: i for i, e in enumerate(doc.entries)}
    chosen = set()
    for pattern in patterns:
        hits = _selected(doc, by_name, pattern)
        listed = listed_name(pattern)
        if not hits and listed != pattern:   # bytes that are not UTF-8, as a command line gives them
            hits = _selected(doc, by_name, listed)
        if not hits:
            names = ", ".join(doc.names()) or "none"
            shown = repr(pattern) if listed == pattern else f"'{listed}'"
            raise FormatError(f"{parameter('patterns', True)}{shown} selects nothing; blobs: {names}", path=doc.path)
        chosen.update(hits)
    return [e for i, e in enumerate(doc.entries) if i in chosen]


def _selected(doc: Document, by_name: dict, pattern: str) -> list:
    if pattern in by_name:
        return [by_name[pattern]]
    hits = [i for i, e in enumerate(doc.entries) if e.layer is not None and e.layer == pattern]
    return hits or [i for i, e in enumerate(doc.entries) if fnmatch.fnmatchcase(e.name, pattern)]


def listed_name(name: str) -> str:
    """`name` in the form blobtool lists names in: bytes that are not UTF-8 as \\xNN escapes.

    A name read from a file with such bytes is listed with escapes (the
    layer named by the bytes ``b\\xff1`` is listed as ``b\\xff1``, and its
    blobs as ``b\\xff1/0``). Python hands a command line's such bytes over as
    lone surrogates (U+DC80 to U+DCFF, os.fsdecode's surrogateescape); this
    turns them into the same escapes, so that the bytes as typed name what
    they name in the file. A name without such surrogates is returned as it is.
    """
    if name.isascii():
        return name
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:   # a surrogate that stands for no byte
        return name
    return raw.decode("utf-8", "backslashreplace")


def unique_names(names: list, unnamed: str = "layer") -> list:
    """The names to give things named `names` (layers, in file order) so that no two are the same.

    A name is kept by the first thing bearing it. An empty name becomes
    "<unnamed><k>" (k its position); a repeated one gets "#<n>", n its
    occurrence (2, 3, ...). A made-up name never takes one that a later
    thing bears, nor one already given: then the next n that is free is used.
    So `a`, `a`, `a#2` become `a`, `a#3`, `a#2`, and names that do not collide
    stay as they are.
    """
    given = set(names)
    used = set()
    seen: dict = {}
    out = []
    for k, name in enumerate(names):
        if name and name not in used:
            final = name
        else:
            base = name or f"{unnamed}{k}"
            n = seen[base] = seen.get(base, 1 if name else 0) + 1
            final = base if n == 1 else f"{base}#{n}"
            while final in used or final in given:
                n = seen[base] = n + 1
                final = f"{base}#{n}"
        used.add(final)
        out.append(final)
    return out
