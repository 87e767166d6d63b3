"""What the library's calls share: warnings handed to a caller, nets opened unless given open."""

from __future__ import annotations

import contextlib
import warnings

from ..formats import Document, open_document

__all__ = ["say", "opened_net"]


def say(lines, warn) -> None:
    """Each line to `warn(line)`, or to warnings.warn where no `warn` is given."""
    for line in lines:
        if warn is not None:
            warn(line)
        else:
            warnings.warn(line, stacklevel=3)


def opened_net(opened: contextlib.ExitStack, src, definition) -> tuple:
    """(the net's Document, the definition's or None), each opened in `opened` unless given as a Document."""
    doc = src if isinstance(src, Document) else opened.enter_context(open_document(src))
    if definition is None or isinstance(definition, Document):
        return doc, definition
    return doc, opened.enter_context(open_document(definition))
