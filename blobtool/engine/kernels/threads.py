"""Splitting a reduction over the threads the call may use (its Work), and the cores the process may run on."""

from __future__ import annotations

import os
import threading

import numpy as np

from ..work import current, in_thread, using
from .chunks import CHUNK, Chunks


# Threads the reductions (asum_sumsq, stats, nonfinite, map_chunks) may use:
# the call's (blobtool.work: 1 in the library unless the caller says, the
# cores the process may run on, or --jobs, in the blobtool command). Arrays
# smaller than PARALLEL_MIN_BYTES are reduced in the calling thread, where a
# thread's start costs more than it saves.
PARALLEL_MIN_BYTES = 16 << 20


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity (taskset, cgroup cpusets), else the CPU count.

    os.cpu_count() counts the machine's cores; a process started with
    `taskset -c 0` runs on one of them, and threads beyond that only take
    turns on it.
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on macOS and Windows
        return os.cpu_count() or 1


def using_threads(n: int | None):
    """The call's reductions may use `n` threads within a with block (None: the cores this process may run on)."""
    return using(threads=n or available_cores())


def _in_threads(fn, arg_lists) -> None:
    """fn(*args) for each args, the first in this thread and the rest in new ones; re-raises the first error."""
    errors = []

    def run(args):
        try:
            fn(*args)
        except BaseException as exc:  # handed to the calling thread below
            errors.append(exc)

    # Each thread works for the same call (its Work: progress, pages) as the caller.
    threads = [threading.Thread(target=in_thread(run), args=(args,), daemon=True) for args in arg_lists[1:]]
    for t in threads:
        t.start()
    run(arg_lists[0])
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _ranges(chunks: int, nbytes: int, unit: int = 1) -> list:
    """The chunk ranges (first, stop) the threads take: one range unless the data is large and threads are allowed.

    Each range but the last starts and ends at a multiple of `unit` chunks.
    """
    units = -(-chunks // unit)
    workers = max(1, min(current().threads, units)) if nbytes >= PARALLEL_MIN_BYTES else 1
    return [(units * i // workers * unit, min(units * (i + 1) // workers * unit, chunks)) for i in range(workers)]


def run_ranges(fn, x, chunks: int, nbytes: int, *extra, unit: int = 1) -> None:
    """fn(x, first, stop, *extra) over the chunk ranges, in threads when there are several."""
    ranges = _ranges(chunks, nbytes, unit)
    if len(ranges) == 1:
        fn(x, *ranges[0], *extra)
    else:
        _in_threads(fn, [(x, first, stop, *extra) for first, stop in ranges])


def map_chunks(fn, x: np.ndarray, *, progress: bool = False, chunk: int | None = None) -> list:
    """[fn(part) for each `chunk`-element part of x (CHUNK by default)], in order; a large x is split over the
    threads.

    fn runs in worker threads: it must not depend on the caller's numpy
    errstate (errstate is per thread), must not write shared state, and must
    not keep a view of its part (Chunks may reuse its memory). Combining the
    results in order gives the same answer for any thread count.
    """
    x = x.reshape(-1)
    chunk = chunk or CHUNK
    chunks = -(-x.size // chunk)
    results = [None] * chunks

    def work(_, first, stop):
        parts = Chunks(x, first, stop, chunk)
        for k in range(first, stop):
            results[k] = fn(parts[k])
            parts.done(k, progress=progress)

    run_ranges(work, None, chunks, x.nbytes)
    return results


def map_chunk_indices(fn, chunks: int, nbytes: int) -> list:
    """[fn(k) for k in range(chunks)], in order, split over the threads when the `nbytes` behind them are many.

    For work over several arrays at once (compare); map_chunks is the one-array case.
    """
    results = [None] * chunks

    def work(_, first, stop):
        for k in range(first, stop):
            results[k] = fn(k)

    run_ranges(work, None, chunks, nbytes)
    return results
