"""Chunks: the pieces the kernels work through, the buffers they use, and what happens when one is done.

A chunk is CHUNK elements (512 KiB of float64 once widened): it stays in
cache while it is widened, squared and summed. Chunks walks a thread's
chunks of one array, reading them from the file when the call's Work has
pages (blobtool.engine.work) and the values are still the file's.
"""

from __future__ import annotations

import threading

import numpy as np

from ..work import current, report_locked


# Elements per chunk: 64K float64 values (512 KiB) stay in L2 cache while they
# are widened, squared and summed.
CHUNK = 1 << 16


class Chunks:
    """One thread's way through chunks first..stop-1 of flat array x, in order.

    ``chunks[k]`` is chunk k: a slice of x, or, inside source.releasing()
    when x views a mapped input, the file's bytes read into a buffer of this
    thread's, several chunks at a time, that the next chunk may overwrite
    (so a chunk's results must not keep a view of it). ``done(k)`` says
    that chunk k is worked through: it is counted in the progress and, when
    it was a slice of the mapping, its pages are released (chunk_done).
    """

    def __init__(self, x: np.ndarray, first: int, stop: int, chunk: int | None = None, *, slot: str = "read"):
        self.x = x
        self.chunk = chunk or CHUNK
        self.stop = min(stop, -(-x.size // self.chunk))
        # A small array is read through the mapping: a few pages cost less than a read of their own.
        self.pages = current().pages
        self.file = self.pages.file_behind(x) if self.pages is not None and x.nbytes >= READ_BYTES else None
        self.slot = slot
        self.held = (0, 0)  # the chunks the buffer holds
        self.buffer = None

    def __getitem__(self, k: int) -> np.ndarray:
        c = self.chunk
        if self.file is None:
            return self.x[k * c:(k + 1) * c]
        held_first, held_stop = self.held
        if not held_first <= k < held_stop:
            # About 1 MiB per read: fewer calls, and still in cache when used.
            group = max(1, (READ_BYTES // self.x.itemsize) // c)
            held_first, held_stop = k, min(k + group, self.stop)
            self.buffer = self._read(held_first, held_stop)
            self.held = (held_first, held_stop)
        start = (k - held_first) * c
        return self.buffer[start:start + c]

    def span(self, first: int, stop: int) -> np.ndarray:
        """Chunks first..stop-1 as one array (a slice of x, or read into this thread's buffer)."""
        if self.file is None:
            return self.x[first * self.chunk:stop * self.chunk]
        self.held = (0, 0)
        return self._read(first, stop)

    def _read(self, first: int, stop: int) -> np.ndarray:
        """Chunks first..stop-1 read from the file into this thread's buffer."""
        start, end = first * self.chunk, min(stop * self.chunk, self.x.size)
        out = buffer(self.slot, end - start, self.x.dtype)
        fd, offset = self.file
        self.pages.read(fd, offset + start * self.x.itemsize, out)
        return out

    def done(self, k: int, *, progress: bool) -> None:
        if progress:
            report_locked(min(self.chunk, self.x.size - k * self.chunk) * self.x.itemsize)
        if self.file is None:
            chunk_done(self.x, k, progress=False, chunk=self.chunk)


# Bytes read from a file per call when Chunks reads a mapped input.
READ_BYTES = 1 << 20


# Chunks worked on together by asum_sumsq and stats: each numpy call costs
# the same whatever its size, and with two threads every call also hands the
# interpreter over; the sums are still taken chunk by chunk. 8 was the
# fastest group (docs/performance.md, "Chunk sizes").
GROUP = 8

_local = threading.local()
_PAGE = 4096


def buffer(slot: str, n: int, dtype) -> np.ndarray:
    """n values of `dtype` in a buffer this thread keeps for `slot`, reused from call to call.

    Allocating the chunk-sized temporaries anew for each chunk cost more
    than the work on them with two threads (each large allocation maps and
    faults in fresh pages; docs/performance.md, "Chunk sizes").
    """
    dtype = np.dtype(dtype)
    kept = _local.__dict__.setdefault("buffers", {})
    raw = kept.get(slot)
    nbytes = n * dtype.itemsize
    if raw is None or raw.nbytes < nbytes:
        # Page-aligned: the kernel copies from the page cache into an aligned
        # buffer several times faster (docs/performance.md, "Chunk sizes").
        block = np.empty(max(nbytes, 64) + _PAGE, dtype=np.uint8)
        start = -block.ctypes.data % _PAGE
        raw = kept[slot] = block[start:start + max(nbytes, 64)]
    return raw[:nbytes].view(dtype)


def scratch(n: int) -> np.ndarray:
    """n float64 values of this thread's scratch buffer (for a chunk widened to float64)."""
    return buffer("wide", n, np.float64)


def chunk_done(x: np.ndarray, k: int, *, progress: bool, chunk: int | None = None) -> None:
    """Chunk k of flat x is worked through: report it (with `progress`), and release its input pages.

    Inside source.releasing() (the command line's reading commands) the mapped
    pages behind the chunk go back to the kernel, with the page it shares
    with chunk k-1, so memory stays bounded by the chunks in flight at any
    file size; a page released while another thread still reads it is read
    again from the file (the mapping is copy-on-write and unchanged).
    """
    chunk = chunk or CHUNK
    if progress:
        report_locked(min(chunk, x.size - k * chunk) * x.itemsize)
    pages = current().pages
    if pages is not None:
        pages.release(x[max(k - 1, 0) * chunk:(k + 1) * chunk])
