"""Name prefixes between two files whose blobs are matched by name: a wrapper's "module." and the like.

A port saved from ``nn.DataParallel`` (or from a model kept inside a
wrapper) names every tensor under ``module.`` (or ``model.``, ...), so
none of its names is a name of the other file. Wherever blobtool matches
names across two files, the second file's names can be changed first:

- ``--strip-prefix P``: a name that starts with P loses it (one P, at the
  start; a name without it is kept as it is);
- ``--add-prefix P``: P is put before every name (after the strip, so the
  two together replace one prefix by another).

Given neither (detect), blobtool looks for one that makes names match: the
longest prefix, ending in "." or "/", that all of one file's names share
(and each shorter one ending so), stripped from the second file's names
when they share it, added to them when the first file's names do, or both.
The change that matches the most names is taken when it matches more than
the names as they are; it is said in one line (note) naming the options
that ask for it. Giving either option (an empty P too) turns detection off.

Two names of the second file that become one name are refused (a
UsageError): the match would be ambiguous.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import UsageError, parameter, render_parameters

__all__ = ["Prefixes", "detect", "renamed_document", "match_documents"]

# What ends a prefix a wrapper puts before names: PyTorch's module paths
# ("module."), and blobtool's own "<layer>/<index>".
_SEPARATORS = "./"


@dataclass(frozen=True)
class Prefixes:
    """What to do to the second file's names: strip one prefix, then add one (None: nothing)."""

    strip: str | None = None
    add: str | None = None

    @property
    def asked(self) -> bool:
        """Whether either was given (detection is then off)."""
        return self.strip is not None or self.add is not None

    @property
    def changes(self) -> bool:
        return bool(self.strip) or bool(self.add)

    def apply(self, name: str) -> str:
        if self.strip and name.startswith(self.strip):
            name = name[len(self.strip):]
        return (self.add or "") + name

    def options(self) -> str:
        """The command-line options that ask for this change (--strip-prefix P --add-prefix Q)."""
        return render_parameters(self.parameters(), lambda name: f"--{name.replace('_', '-')}")

    def how(self) -> str:
        """The change in words: "without the prefix 'module.'", "with the prefix 'x.' added", or both."""
        return " and ".join(filter(None, [f"without the prefix {self.strip!r}" if self.strip else None,
                                          f"with the prefix {self.add!r} added" if self.add else None]))

    def parameters(self) -> str:
        """The change as the parameters that ask for it (strip_prefix=P: the command's --strip-prefix P)."""
        parts = []
        if self.strip:
            parts.append(f"{parameter('strip_prefix', True)}{self.strip}")
        if self.add:
            parts.append(f"{parameter('add_prefix', True)}{self.add}")
        return " ".join(parts)


def _common(names: list) -> str:
    if not names:
        return ""
    low, high = min(names), max(names)
    n = 0
    while n < min(len(low), len(high)) and low[n] == high[n]:
        n += 1
    return low[:n]


def _cuts(names: list) -> list:
    """The prefixes all `names` share that end in a separator, shortest first."""
    common = _common(names)
    return [common[:i + 1] for i, ch in enumerate(common) if ch in _SEPARATORS]


def detect(names_a, names_b) -> tuple:
    """(the Prefixes that make the most of `names_b` match `names_a`, how many then match); (None, matches as they are)."""
    a, b = set(names_a), list(dict.fromkeys(names_b))
    matched = sum(1 for n in b if n in a)
    if not a or not b or matched == len(b):
        return None, matched
    strips = [None] + _cuts(b)
    adds = [None] + _cuts(list(a))
    best, best_count = None, matched
    for add in adds:
        for strip in strips:
            if strip is None and add is None:
                continue
            change = Prefixes(strip, add)
            renamed = {change.apply(n) for n in b}
            if len(renamed) != len(b):
                continue
            count = len(renamed & a)
            if count > best_count:
                best, best_count = change, count
    return best, best_count


def renamed_document(doc, change: Prefixes):
    """A Document like `doc` whose entries bear `change`'s names (the same blobs: nothing is read or copied).

    UsageError when two names become one.
    """
    if not change.changes:
        return doc
    entries, seen = [], {}
    for entry in doc.entries:
        name = change.apply(entry.name)
        if name in seen:
            raise UsageError(f"{doc.path}: {change.parameters()} names two blobs {name!r} ({seen[name]} and "
                             f"{entry.name})")
        seen[name] = entry.name
        entries.append(dataclasses.replace(entry, name=name))
    return dataclasses.replace(doc, entries=entries)


def match_documents(doc_a, doc_b, change: Prefixes | None = None) -> tuple:
    """(doc_b with its names changed, the Prefixes applied or None, the note to print or None).

    `change` as asked, else the one detect finds (then said in the note).
    """
    if change is not None and change.asked:
        return renamed_document(doc_b, change), change, None
    names_b = doc_b.names()
    found, count = detect(doc_a.names(), names_b)
    if found is None:
        return doc_b, None, None
    note = (f"{doc_b.path}: names compared {found.how()} ({count} of {len(names_b)} then match {doc_a.path}'s); "
            f"{found.options()} says so, --strip-prefix '' compares them as they are")
    return renamed_document(doc_b, found), found, note
