"""What the library's calls share: warnings handed to a caller, nets opened unless given open."""

from __future__ import annotations

import contextlib
import warnings

from ..errors import UsageError
from ..formats import Document, open_document

__all__ = ["say", "opened_net", "opened_document", "OptionsRefused"]


class OptionsRefused(UsageError):
    """Arguments that cannot go together, refused before any work (exit 2): the command says it as its usage error."""


def say(lines, warn) -> None:
    """Each line to `warn(line)`, or to warnings.warn where no `warn` is given."""
    for line in lines:
        if warn is not None:
            warn(line)
        else:
            warnings.warn(line, stacklevel=3)


def opened_net(opened: contextlib.ExitStack, src, definition=None, warn=None) -> tuple:
    """(the net's Document, the definition's or None), each opened in `opened` unless given as a Document.

    The warnings of a document opened here go to `warn` when it is given
    (a Document given was opened, and its warnings said, by the caller).
    """
    return opened_document(opened, src, warn), (None if definition is None else
                                                 opened_document(opened, definition, warn))


def opened_document(opened: contextlib.ExitStack, src, warn=None, **options) -> Document:
    """`src` as a Document: itself when it is one, else opened in `opened` (open_document's `options`).

    Its warnings go to `warn` when it is opened here and `warn` is given.
    """
    if isinstance(src, Document):
        return src
    doc = opened.enter_context(open_document(src, **options))
    if warn is not None:
        for line in doc.warnings:
            warn(line)
    return doc
