"""Text from files, made safe to print: control, bidi and other invisible characters escaped.

Layer names, blob names, types and paths come from files of unknown origin.
Printed raw, ``ESC ] 0 ; title BEL`` retitles the terminal, ``ESC [ 2 J``
clears it, and U+202E (right-to-left override) reverses what follows it on
the line. Every human output (tables, pictures' titles, error and warning
lines) passes such text through ``escape``; JSON Lines need nothing more,
as json.dumps writes ASCII only (``\\u001b``).

Escaped are the Unicode categories Cc (C0 and C1 controls, DEL), Cf (format
characters: the bidi controls, zero-width characters, the BOM), Cs (lone
surrogates, from paths that are not UTF-8), Zl and Zp (line and paragraph
separators), written as Python writes them in a string literal: ``\\t``,
``\\n``, ``\\r``, ``\\x1b``, ``\\u202e``, ``\\U000e0001``. Anything else,
non-ASCII letters included, is printed as it is.
"""

from __future__ import annotations

__all__ = ["escape", "UNSAFE_CATEGORIES"]

UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def escape(text) -> str:
    """`text` (made a str) with every character of UNSAFE_CATEGORIES written as its escape."""
    text = str(text)
    if text.isprintable():  # the common case: no control, format or separator character at all
        return text
    import unicodedata  # only for the rare text that needs a closer look

    return "".join(_escaped(c) if unicodedata.category(c) in UNSAFE_CATEGORIES else c for c in text)


def _escaped(c: str) -> str:
    if c in _NAMED:
        return _NAMED[c]
    n = ord(c)
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"
