"""A zip file's central directory, read from the bytes without zipfile: how many entries, and their names.

What the registry needs to tell two formats that share the zip signature
apart (an .npz from PyTorch's zip checkpoint), and what a reader needs to
refuse a forged directory of millions of entries before zipfile builds an
object for each.

The end of central directory record (signature PK\\5\\6, 22 bytes plus a
comment of at most 65535 bytes) is the last thing in the file; it gives the
directory's entry count, size and offset. Where one of them does not fit its
field (0xFFFF, 0xFFFFFFFF) a ZIP64 end record (PK\\6\\6) holds it, found
through the ZIP64 locator (PK\\6\\7) in the 20 bytes before. Each directory
entry (PK\\1\\2) is 46 bytes, then its name (length at +28), extra field
(+30) and comment (+32).

This module imports nothing but the standard library's struct: the registry
calls it while sniffing.
"""

from __future__ import annotations

import struct

__all__ = ["Directory", "directory", "entry_names", "holds_member", "count_entries", "check_entry_count"]

_END = b"PK\x05\x06"
_END_SIZE = 22
_MAX_COMMENT = 0xFFFF
_ZIP64_LOCATOR = b"PK\x06\x07"
_ZIP64_LOCATOR_SIZE = 20
_ZIP64_END = b"PK\x06\x06"
_ENTRY = b"PK\x01\x02"
_ENTRY_SIZE = 46


class Directory(tuple):
    """(entries, offset, size) of a zip's central directory."""

    __slots__ = ()

    @property
    def entries(self) -> int:
        return self[0]

    @property
    def offset(self) -> int:
        return self[1]

    @property
    def size(self) -> int:
        return self[2]


def directory(buf) -> Directory | None:
    """The central directory `buf` (bytes, mmap) declares, or None when no end record is found or it lies outside."""
    total = len(buf)
    found = _end_record(buf)
    if found is None:
        return None
    end, entries, size, offset = found
    if entries == 0xFFFF or size == 0xFFFFFFFF or offset == 0xFFFFFFFF:
        locator = end - _ZIP64_LOCATOR_SIZE
        if locator < 0 or bytes(buf[locator:locator + 4]) != _ZIP64_LOCATOR:
            return None
        record = struct.unpack_from("<Q", bytes(buf[locator + 8:locator + 16]))[0]
        head = bytes(buf[record:record + 56]) if record < total else b""
        if len(head) < 56 or head[:4] != _ZIP64_END:
            return None
        entries, size, offset = struct.unpack_from("<QQQ", head, 32)
    if offset + size > total:
        return None
    return Directory((entries, offset, size))


def entry_names(buf, found: Directory, limit: int):
    """The names (bytes) of the directory's entries in order, at most `limit`; stops at the first damaged entry."""
    pos, stop = found.offset, found.offset + found.size
    for _ in range(min(found.entries, limit)):
        if pos + _ENTRY_SIZE > stop:
            return
        head = bytes(buf[pos:pos + _ENTRY_SIZE])
        if head[:4] != _ENTRY:
            return
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", head, 28)
        name_end = pos + _ENTRY_SIZE + name_len
        if name_end > stop:
            return
        yield bytes(buf[pos + _ENTRY_SIZE:name_end])
        pos = name_end + extra_len + comment_len


def holds_member(buf, suffix: bytes, limit: int) -> bool:
    """Whether one of the first `limit` entries of the zip in `buf` is named "<folder>/<suffix>" (one folder deep).

    The directory's bytes are searched for `suffix` first (no copy where
    `buf` can search itself: bytes, mmap), so a zip without it costs no walk
    of its entries.
    """
    found = directory(buf)
    if found is None:
        return False
    search = getattr(buf, "find", None)
    if search is not None and search(suffix, found.offset, found.offset + found.size) < 0:
        return False
    tail = b"/" + suffix
    return any(name.endswith(tail) and name.count(b"/") == 1 for name in entry_names(buf, found, limit))


def _zip64_record(buf, end: int):
    """(entries, size, offset) of the ZIP64 end record before the end record at `end`, or None.

    zipfile reads it wherever a locator sits right before the end record,
    whether or not the end record's fields say so, from the 56 bytes before
    the locator (and newer versions from where the locator points).
    """
    locator = end - _ZIP64_LOCATOR_SIZE
    if locator < 0 or bytes(buf[locator:locator + 4]) != _ZIP64_LOCATOR:
        return None
    pointed = struct.unpack_from("<Q", bytes(buf[locator + 8:locator + 16]))[0]
    for record in (locator - 56, pointed):
        head = bytes(buf[record:record + 56]) if 0 <= record < len(buf) else b""
        if len(head) == 56 and head[:4] == _ZIP64_END:
            return struct.unpack_from("<QQQ", head, 32)
    return None


def _walked(buf, start: int, size: int, limit: int) -> int:
    """How many directory entries follow one another from `start` within `size` bytes, at most limit + 1."""
    pos, stop, count = start, min(start + size, len(buf)), 0
    while 0 <= pos and pos + _ENTRY_SIZE <= stop and count <= limit:
        head = bytes(buf[pos:pos + _ENTRY_SIZE])
        if head[:4] != _ENTRY:
            break
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", head, 28)
        pos += _ENTRY_SIZE + name_len + extra_len + comment_len
        count += 1
    return count


def count_entries(buf, limit: int) -> int:
    """The most entries a zip reader could take from this zip's directory, counting at most limit + 1 of them.

    zipfile reads the directory from the bytes right before the end record
    (ZIP64 records included, whatever the end record's fields say, and
    wherever the ZIP64 locator points) and reads entries until it has read
    the directory's size, whatever its count says; each such reading (and the
    one at the declared offset) is walked, and the largest count taken.
    """
    classic_end = _end_record(buf)
    if classic_end is None:
        return 0
    end, entries, size, offset = classic_end
    counts = [entries, _walked(buf, end - size, size, limit), _walked(buf, offset, size, limit)]
    zip64 = _zip64_record(buf, end)
    if zip64 is not None:
        entries, size, offset = zip64
        before = end - _ZIP64_LOCATOR_SIZE - 56
        counts += [entries, _walked(buf, before - size, size, limit), _walked(buf, offset, size, limit)]
    return max(counts)


def _end_record(buf):
    """(where the end record starts, its entry count, directory size and offset), or None."""
    total = len(buf)
    tail_start = max(0, total - _END_SIZE - _MAX_COMMENT)
    tail = bytes(buf[tail_start:total])
    at = tail.rfind(_END)
    while at >= 0 and at + _END_SIZE > len(tail):
        at = tail.rfind(_END, 0, at)
    if at < 0:
        return None
    entries, size, offset = struct.unpack_from("<10xHII", tail, at)
    return tail_start + at, entries, size, offset


def check_entry_count(buf, limit: int, what: str, path) -> None:
    """Refuse a zip whose directory holds more than `limit` entries (`what`: the reason), before zipfile reads it.

    Both the count the end records declare and the entries zipfile would
    walk are checked (count_entries): zipfile builds an object for each of
    the latter (a forged end record declaring 2 entries over a million real
    ones took 15 s and 587 MB).
    """
    from ..errors import FormatError  # the registry imports this module while sniffing: keep it light

    listed = count_entries(buf, limit)
    if listed > limit:
        declared = _end_record(buf)[1]  # the count it declares where that is what was found, else a walk's bound
        shown = f"{listed}" if listed == declared else f"more than {limit}"
        raise FormatError(f"the zip directory lists {shown} entries, more than {what}", path=path)
