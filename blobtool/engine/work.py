"""What one call's chunked work may use: its threads, where its progress goes, whether mapped pages go back.

A Work travels with the call: ``with using(threads=4, progress=bar.advance):``
makes it current for the code inside the block, in this thread and in the
threads the kernels start for it (contextvars); another thread, or another
call outside the block, keeps its own. Nothing here is process-wide, and
none of it changes a result: threads split sums whose chunks are added in
the same order, progress only counts bytes, and a page is released only
where its bytes are still the file's (blobtool.files).

The library's default is one thread, no progress and pages kept; the
command line sets all three for each command.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import threading
from typing import Callable

__all__ = ["Work", "current", "using", "set_device", "report", "report_locked", "in_thread"]


@dataclasses.dataclass(frozen=True)
class Work:
    """threads: how many threads a reduction over a large array may use (1: the calling one).
    progress: called with the bytes each chunk covered, or None.
    pages: for a call that reads the values of mapped inputs once, where they may be copied from
    their file and their pages let go once worked through (blobtool.files.PAGES, which
    source.releasing() sets); None keeps them mapped and resident (values read again cost nothing).
    An object with file_behind(view), read(fd, offset, into) and release(view).
    device: the backend new device memory goes to (blobtool.engine.syncedmem.set_backend,
    device.use), or None: host only.
    """

    threads: int = 1
    progress: Callable[[int], None] | None = None
    pages: object = None
    device: object = None


_current: contextvars.ContextVar = contextvars.ContextVar("blobtool_work", default=Work())

# Chunk reductions in several threads report through this lock.
_progress_lock = threading.Lock()


def current() -> Work:
    """The Work of the running call."""
    return _current.get()


@contextlib.contextmanager
def using(**changes):
    """The current Work with `changes` (threads=, progress=, pages=) for the duration of a with block."""
    if "threads" in changes:
        changes["threads"] = max(1, int(changes["threads"]))
    token = _current.set(dataclasses.replace(_current.get(), **changes))
    try:
        yield _current.get()
    finally:
        _current.reset(token)


def set_device(backend) -> None:
    """This thread's calls use `backend` for device memory from now on (until the with block it is in ends)."""
    _current.set(dataclasses.replace(_current.get(), device=backend))


def report(nbytes: int) -> None:
    """Tell the call's progress display (if any) that `nbytes` more were processed."""
    progress = _current.get().progress
    if progress is not None:
        progress(nbytes)


def report_locked(nbytes: int) -> None:
    """report(), callable from several threads at once."""
    progress = _current.get().progress
    if progress is not None:
        with _progress_lock:
            progress(nbytes)


def in_thread(fn):
    """`fn` run in a copy of the caller's context: a thread started with it works for the same call."""
    context = contextvars.copy_context()

    def run(*args, **kwargs):
        return context.run(fn, *args, **kwargs)

    return run
