"""Progress reporting: how many bytes the chunked kernels and writers have worked through.

The library never draws anything. A caller that wants a progress display
(the command line's rich bar) installs a callback with ``reporting()``; the
kernels and writers call ``report()`` (or ``report_locked()`` from worker
threads) once per chunk. With no callback installed a report costs one test.
"""

from __future__ import annotations

import contextlib
import threading

__all__ = ["reporting", "report", "report_locked"]

# Called with the number of bytes each chunk covered, while a progress display
# is active (see reporting()); None otherwise.
_progress = None

# Chunk reductions in several threads report through this lock.
_progress_lock = threading.Lock()


@contextlib.contextmanager
def reporting(callback):
    """Call `callback(nbytes)` as the chunked kernels (and writers) work through data."""
    global _progress
    previous, _progress = _progress, callback
    try:
        yield
    finally:
        _progress = previous


def report(nbytes: int) -> None:
    """Tell the active progress display (if any) that `nbytes` more were processed."""
    if _progress is not None:
        _progress(nbytes)


def report_locked(nbytes: int) -> None:
    """report(), callable from several threads at once."""
    if _progress is not None:
        with _progress_lock:
            _progress(nbytes)
