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

One thing belongs to the process, not to a call: the hook told of the
host bytes handed out for writing (SyncedMemory's mutable_cpu_data, a copy
back from a device). The files layer registers it when it loads
(set_written), before it can map any input, so that a mapped input's bytes
written in any thread or call are never read again from its file; a Work
may carry a hook of its own (`written`). The engine imports nothing above it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import threading
from typing import Callable

__all__ = ["Work", "current", "using", "set_device", "set_written", "note_written", "report", "report_locked",
           "in_thread"]


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
    written: called with each host array handed out for writing (note_written), or None: the
    process's hook (set_written; blobtool.files.note_written once the files layer is loaded).
    """

    threads: int = 1
    progress: Callable[[int], None] | None = None
    pages: object = None
    device: object = None
    written: Callable[[object], None] | None = None


_current: contextvars.ContextVar = contextvars.ContextVar("blobtool_work", default=Work())

# Chunk reductions in several threads report through this lock.
_progress_lock = threading.Lock()

# The process's written hook (set_written): the module's one setting that is not a call's.
_written = None


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


def set_written(hook) -> None:
    """Make `hook` the process's written hook: told of host bytes handed out for writing, in every thread and call."""
    global _written
    _written = hook


def note_written(view) -> None:
    """Tell the call's written hook (its Work's, else the process's) that host array `view` may be written."""
    hook = _current.get().written or _written
    if hook is not None:
        hook(view)


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
