"""The pages of mapped inputs, for a call that reads their values once (the call's Work, blobtool.engine.work).

Pages of a mapped input that a writer has streamed out can be handed back
to the kernel (``release_pages`` inside ``releasing()``), so converting a
file larger than memory keeps memory bounded. Inside the same block the
reading commands' kernels copy a mapped input's values from the file into
small buffers of their own (``file_behind``, ``read_mapped``) instead of
touching the mapping at all. Bytes handed out for writing are never read
from the file nor released (blobtool.files.mapped records them).
"""

from __future__ import annotations

import mmap
import os

from ..engine.work import current, using
from ..errors import FormatError
from .mapped import INPUTS, mapping_of, name_of, unwritten, watching
from .news import check_inputs, raising_change

__all__ = ["MappedPages", "PAGES", "releasing", "release_pages", "file_behind", "read_mapped"]


class MappedPages:
    """The pages of mapped inputs, for a call that reads their values once (its Work's `pages`, see releasing()).

    What the kernels and writers use through blobtool.work, without
    importing this module: file_behind() and read() to copy values from
    the file instead of the mapping, release() to drop pages worked through.
    """

    def file_behind(self, view):
        return _file_behind(view)

    def read(self, fd: int, offset: int, into) -> None:
        read_mapped(fd, offset, into)

    def release(self, view) -> None:
        _release(view)


PAGES = MappedPages()


def releasing():
    """Within this with block the call reads mapped values from their file and lets their pages go (Work.pages)."""
    return using(pages=PAGES)


def release_pages(view) -> None:
    """Let the kernel drop the memory-mapped pages wholly inside `view` (after they were written out).

    Only inside releasing(), and only for views of a private (copy-on-write)
    file mapping, where dropped pages read back from the file if touched
    again; pages shared with bytes outside the view, or handed out for
    writing, are kept. Anything else (bytes in memory, other arrays) is
    left alone.
    """
    pages = current().pages
    if pages is not None:
        pages.release(view)


def _release(view) -> None:
    if view.nbytes < mmap.PAGESIZE:  # holds no whole page: nothing to drop (most blobs of a net)
        return
    found = mapping_of(view) if hasattr(mmap, "MADV_DONTNEED") else None
    if found is None or view.size == 0:
        return
    base, first = found
    last = first + view.nbytes
    if not unwritten(base, first, last):
        return
    page = mmap.PAGESIZE
    start = -(-first // page) * page
    stop = last // page * page
    if stop > start:
        base.madvise(mmap.MADV_DONTNEED, start, stop - start)


def file_behind(view):
    """(descriptor, offset) where the file holds the bytes of `view`, or None.

    Only inside releasing(), for a C-contiguous numpy array viewing a mapped
    input whose bytes were not handed out for writing; read them with
    read_mapped().
    """
    pages = current().pages
    return pages.file_behind(view) if pages is not None else None


def _file_behind(view):
    if not view.flags.c_contiguous:
        return None
    found = mapping_of(view)
    mappings = INPUTS.mappings
    if found is None or id(found[0]) not in mappings or not unwritten(found[0], found[1], found[1] + view.nbytes):
        return None
    return mappings[id(found[0])][0], found[1]


def read_mapped(fd: int, offset: int, into) -> None:
    """Fill writable buffer `into` with the file's bytes from `offset` (a file_behind() pair).

    A file that came to an end before them changed while it was read (its
    lease keeps writers out, so only a file read without one): exit 3.
    """
    view = memoryview(into).cast("B")
    done = 0
    while done < len(view):
        try:
            n = os.preadv(fd, [view[done:]], offset + done)
        except OSError as exc:
            raise FormatError(f"cannot read: {exc.strerror or exc}", path=name_of(fd)) from exc
        if n == 0:
            err = FormatError(f"changed while it was read: it ends at byte {offset + done}, before the "
                              f"{len(view)} bytes wanted from byte {offset}", path=name_of(fd))
            err.offset = offset + done  # where the message says it ends
            raise raising_change(err)
        done += n
    if watching(fd):  # a lease given up, or none had: look for writers here too (about 2 us a read)
        check_inputs()
