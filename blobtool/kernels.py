"""Host (numpy) kernels for Blob's math: Caffe's caffe_cpu_asum, dot, scal, axpy.

The reductions accumulate in float64 even for float32 arrays. Caffe's own
asum/sumsq accumulate in the blob's type; numpy's float32 sum over 64M values
is off by about 1e-3 relative, float64 over 64K-element chunks by about 1e-12,
for about the same time, because the chunk stays in cache while it is widened.

When the call's Work has pages (blobtool.work; source.releasing(), the
command line's reading commands) the values of a mapped input that are
still the file's are copied from its file into small per-thread buffers
(Chunks) rather than read through the mapping, and several chunks are worked
on per numpy call where the figures are the same bits (GROUP). With these,
numpy alone meets blobtool's throughput goals on 2 cores (norm of 1 GiB about
1.5x the time `cat` takes to read it, info --stats about 5x, see
docs/performance.md), so there is no compiled kernel.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import threading

import numpy as np

from .work import current, in_thread, report_locked, using

__all__ = ["CHUNK", "GROUP", "Chunks", "buffer", "scratch", "using_threads",
           "map_chunks", "map_chunk_indices", "asum", "sumsq", "asum_sumsq", "scal", "axpy", "stats", "row_dots",
           "finite_values", "scaled", "minus", "nonfinite", "HIST_BINS", "histogram", "finite_range", "widened",
           "chunk_done", "CountingNonFinite", "count_nonfinite", "available_cores"]

# Elements per chunk: 64K float64 values (512 KiB) stay in L2 cache while they
# are widened, squared and summed.
CHUNK = 1 << 16

# Threads the reductions (asum_sumsq, stats, nonfinite, map_chunks) may use:
# the call's (blobtool.work: 1 in the library unless the caller says, the
# cores the process may run on, or --jobs, in the blobtool command). Arrays
# smaller than PARALLEL_MIN_BYTES are reduced in the calling thread.
# Measured on 2 cores, 256 MiB of float32 with BLAS single-threaded: 56 ms
# in one thread, 31 ms in two.
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


def asum_sumsq(x: np.ndarray) -> tuple[float, float]:
    """Sum of |x| and sum of x*x in one pass, accumulated in float64.

    Each CHUNK-element chunk is reduced on its own and the chunk sums are
    added in order, so the result is the same for any number of threads.
    """
    x = x.reshape(-1)
    n = x.size
    if n == 0:
        return 0.0, 0.0
    if n <= CHUNK:  # one chunk (most blobs of a net): no threads, groups or buffers
        with np.errstate(over="ignore", invalid="ignore"):
            wide = np.absolute(x, out=np.empty(n, dtype=np.float64))
            sq, total = float(np.dot(wide, wide)), float(wide.sum())
        chunk_done(x, 0, progress=True)
        return 0.0 + total, 0.0 + sq
    chunks = -(-n // CHUNK)
    abs_parts = np.empty(chunks, dtype=np.float64)
    sq_parts = np.empty(chunks, dtype=np.float64)
    _run_ranges(_chunk_sums, x, chunks, x.nbytes, abs_parts, sq_parts, unit=GROUP)
    total_abs = 0.0
    total_sq = 0.0
    for a, q in zip(abs_parts.tolist(), sq_parts.tolist()):
        total_abs += a
        total_sq += q
    return total_abs, total_sq


def _chunk_sums(x: np.ndarray, first: int, stop: int, abs_parts: np.ndarray, sq_parts: np.ndarray) -> None:
    """abs_parts[k], sq_parts[k] = sum |chunk k|, sum chunk k ** 2 for chunks first..stop-1."""
    groups = Chunks(x, first // GROUP, -(-stop // GROUP), GROUP * CHUNK)
    # Huge values overflow to inf and NaNs propagate, as in Caffe; numpy's
    # warnings about it would break the one-line stderr. (errstate is per
    # thread, so each worker sets its own.)
    with np.errstate(over="ignore", invalid="ignore"):
        for g in range(first // GROUP, -(-stop // GROUP)):
            part = groups[g]
            # |x| widened in one pass (abs and widening are both exact), then
            # squared and summed chunk by chunk from the float64 copy.
            wide = np.absolute(part, out=scratch(part.size))
            ks = range(max(first, g * GROUP), min(stop, (g + 1) * GROUP))
            sq_parts[ks.start:ks.stop] = row_dots(wide, ks.start - g * GROUP, ks.stop - g * GROUP)
            abs_parts[ks.start:ks.stop] = _row_sums(wide, ks.start - g * GROUP, ks.stop - g * GROUP)
            groups.done(g, progress=True)  # asum_sumsq's thread ranges hold whole groups


def row_dots(wide: np.ndarray, first: int, stop: int) -> np.ndarray:
    """[np.dot(r, r) for each CHUNK-element row r of wide, rows first..stop-1] (the last may be short).

    numpy's matmul of a stack of 1 x n by n x 1 matrices hands each pair to
    the same BLAS dot as np.dot (tests/test_chunked.py checks the bits), in
    one call instead of one per row.
    """
    full = min(stop, wide.size // CHUNK)
    dots = np.empty(stop - first, dtype=np.float64)
    if full > first:
        rows = wide[first * CHUNK:full * CHUNK].reshape(-1, CHUNK)
        dots[:full - first] = np.matmul(rows[:, None, :], rows[:, :, None]).reshape(-1)
    if stop > max(full, first):
        last = wide[full * CHUNK:]
        dots[-1] = np.dot(last, last)
    return dots


def _row_sums(wide: np.ndarray, first: int, stop: int) -> np.ndarray:
    """[wide[k*CHUNK:(k+1)*CHUNK].sum() for k in first..stop-1] (the last may be short), in one call per shape.

    numpy reduces each row of a C-contiguous 2-D array along its last axis
    with the same pairwise summation as the row on its own, so the sums are
    the same bits (tests/test_chunked.py checks it); fewer calls matter when
    two threads share the interpreter.
    """
    full = min(stop, wide.size // CHUNK)
    sums = np.empty(stop - first, dtype=np.float64)
    if full > first:
        sums[:full - first] = np.add.reduce(wide[first * CHUNK:full * CHUNK].reshape(-1, CHUNK), axis=1)
    if stop > max(full, first):
        sums[-1] = wide[full * CHUNK:].sum()
    return sums


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
# interpreter over; the sums are still taken chunk by chunk. Measured on 2
# cores, 1 GiB of float32 from the page cache: stats took 0.72 s with
# groups of 1 chunk, 0.49 s (2), 0.32 s (4), 0.24 s (8) and 0.29 s (16).
GROUP = 8

_local = threading.local()
_PAGE = 4096


def buffer(slot: str, n: int, dtype) -> np.ndarray:
    """n values of `dtype` in a buffer this thread keeps for `slot`, reused from call to call.

    Allocating the chunk-sized temporaries anew for each chunk cost more
    than the work on them with two threads (each large allocation maps and
    faults in fresh pages): stats() on 1 GiB took 0.29 s in one thread and
    0.54 s in two.
    """
    dtype = np.dtype(dtype)
    kept = _local.__dict__.setdefault("buffers", {})
    raw = kept.get(slot)
    nbytes = n * dtype.itemsize
    if raw is None or raw.nbytes < nbytes:
        # Page-aligned: the kernel's copy from the page cache into a buffer
        # that starts 8 or 16 bytes past a 64-byte boundary ran at 0.35-0.40
        # s/GiB here, into a page-aligned one at 0.07 s/GiB.
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


def _run_ranges(fn, x, chunks: int, nbytes: int, *extra, unit: int = 1) -> None:
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

    _run_ranges(work, None, chunks, x.nbytes)
    return results


def map_chunk_indices(fn, chunks: int, nbytes: int) -> list:
    """[fn(k) for k in range(chunks)], in order, split over the threads when the `nbytes` behind them are many.

    For work over several arrays at once (compare); map_chunks is the one-array case.
    """
    results = [None] * chunks

    def work(_, first, stop):
        for k in range(first, stop):
            results[k] = fn(k)

    _run_ranges(work, None, chunks, nbytes)
    return results


def asum(x: np.ndarray) -> float:
    """Sum of absolute values (Caffe's caffe_cpu_asum), accumulated in float64."""
    return asum_sumsq(x)[0]


def sumsq(x: np.ndarray) -> float:
    """Sum of squares (Caffe's caffe_cpu_dot(x, x)), accumulated in float64."""
    return asum_sumsq(x)[1]


def scal(x: np.ndarray, alpha: float) -> None:
    """x *= alpha in place, in x's own dtype (Caffe's caffe_scal)."""
    np.multiply(x, x.dtype.type(alpha), out=x)


def axpy(alpha: float, x: np.ndarray, y: np.ndarray) -> None:
    """y += alpha * x in place, in y's dtype (Caffe's caffe_axpy)."""
    if alpha == -1:
        np.subtract(y, x, out=y)
    else:
        for start in range(0, y.size, CHUNK):
            seg = y[start:start + CHUNK]
            seg += y.dtype.type(alpha) * x[start:start + CHUNK]


def scaled(alpha: float):
    """A chunk transform computing scal(alpha) on a copy: Blob.scale_data, streamed while writing."""
    def transform(chunk: np.ndarray, start: int) -> np.ndarray:
        out = chunk.copy()
        scal(out, alpha)
        return out
    return transform


def minus(other: np.ndarray):
    """A chunk transform computing chunk - other (Blob::Update's axpy(-1)), streamed while writing."""
    def transform(chunk: np.ndarray, start: int) -> np.ndarray:
        return np.subtract(chunk, other[start:start + chunk.size], dtype=chunk.dtype)
    return transform


class CountingNonFinite:
    """A chunk transform that counts the values it turned into Inf or NaN (finite in, not finite out).

    Wraps scaled() or minus() (or None: values unchanged): the count comes
    from the chunks as they are written, so warning about an overflow costs
    no second pass over the data. Overflow is quiet here (no numpy warning
    line): `count` says it. A writer that then stores the values in a
    narrower type (a float16 blob is scaled in float32 and written back in
    float16) narrows them through `narrow`, which counts the values the
    narrowing turns into Inf too; `dtype` is the type the values were
    counted against last (the one they are written in).
    """

    def __init__(self, transform=None):
        self.transform = transform
        self.count = 0
        self.dtype: np.dtype | None = None

    def __call__(self, chunk: np.ndarray, start: int) -> np.ndarray:
        if self.transform is None:
            out = chunk
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                out = self.transform(chunk, start)
            if out.dtype.kind in "fc":
                self.count += int(np.count_nonzero(np.isfinite(chunk) & ~np.isfinite(out)))
        self.dtype = out.dtype
        return out

    def narrow(self, values: np.ndarray, target) -> np.ndarray:
        """`values` cast to `target`, counting the finite ones that become Inf or NaN there."""
        with np.errstate(over="ignore", invalid="ignore"):
            out = values.astype(target)
        if out.dtype.kind in "fc" and values.dtype.kind in "fc":
            self.count += int(np.count_nonzero(np.isfinite(values) & ~np.isfinite(out)))
        self.dtype = np.dtype(target)
        return out


def cast_written(values: np.ndarray, target, transform=None) -> np.ndarray:
    """`values` (a chunk after `transform`) in the type a writer stores them in, quietly.

    Past the target's range a value becomes Inf, as Caffe's cast makes it;
    where `transform` counts such values (CountingNonFinite), the cast is
    counted too, so a value that overflows only when narrowed (a float16
    blob scaled in float32) is never written as Inf in silence.
    """
    target = np.dtype(target)
    if values.dtype == target:
        return values
    narrow = getattr(transform, "narrow", None)
    if narrow is not None and target.kind == "f" and target.itemsize < values.dtype.itemsize:
        return narrow(values, target)
    with np.errstate(over="ignore", invalid="ignore"):
        return values.astype(target)


def count_nonfinite(values, xp=np) -> int:
    """How many of `values` (a numpy or CuPy array) are Inf or NaN."""
    if values.dtype.kind not in "fc":
        return 0
    return int(xp.count_nonzero(~xp.isfinite(values)))


def widened(part, out: np.ndarray | None = None) -> np.ndarray:
    """`part` as float64 (a new array, or `out` filled), quietly: a signalling NaN becomes a quiet NaN.

    numpy reports the cast of a signalling NaN as an invalid operation (a
    RuntimeWarning, a second line on stderr); the NaN itself is kept, and
    counted as NaN wherever NaNs are. errstate is per thread: this is safe
    in map_chunks' workers.
    """
    with np.errstate(invalid="ignore"):
        if out is None:
            return np.array(part, dtype=np.float64)
        np.copyto(out, part, casting="unsafe")
        return out


def finite_values(part: np.ndarray) -> tuple[np.ndarray, int, int]:
    """(the finite values of `part` as float64, NaN count, Inf count)."""
    part = widened(part)
    finite = np.isfinite(part)
    if finite.all():
        return part, 0, 0
    return part[finite], *_nan_inf(part, finite)


def _nan_inf(part: np.ndarray, finite: np.ndarray) -> tuple[int, int]:
    """The NaN and Inf counts of `part`, given its isfinite mask."""
    nans = int(np.count_nonzero(np.isnan(part)))
    return nans, int(part.size - np.count_nonzero(finite)) - nans


def _moments(part: np.ndarray, scale: float = 1.0) -> tuple:
    """(count, mean, sum of squared deviations, min, max, NaNs, Infs) of one chunk's finite values.

    The mean and the sum of squares are of the values times `scale` (a power
    of two, so exact); min and max are of the values themselves. One widened
    copy of the chunk, which stays in cache: the finiteness test runs on the
    chunk as stored, the deviations overwrite the copy.
    """
    finite = np.isfinite(part)
    if finite.all():
        values, nans, infs = widened(part, scratch(part.size)), 0, 0
        # The extremes as stored are the same numbers, found faster; a zero
        # is taken from the widened values, whose choice between -0.0 and
        # 0.0 is the one blobtool has always reported.
        lo, hi = (float(part.min()), float(part.max())) if part.size else (0.0, 0.0)
        if lo == 0 or hi == 0:
            lo, hi = float(values.min()), float(values.max())
    else:
        nans, infs = _nan_inf(part, finite)
        values = widened(part[finite])
        if values.size:
            lo, hi = float(values.min()), float(values.max())
    if values.size == 0:
        return 0, 0.0, 0.0, np.inf, -np.inf, nans, infs
    if scale != 1.0:
        values *= scale
    # Past float64's range the sums are inf or NaN, without a stderr warning;
    # stats() then starts again with a smaller scale.
    with np.errstate(over="ignore", invalid="ignore"):
        mean = float(values.mean())
        np.subtract(values, mean, out=values)
        m2 = float(np.dot(values, values))
    return values.size, mean, m2, lo, hi, nans, infs


def stats(x: np.ndarray) -> dict:
    """min, max, mean, std of the finite values, and the NaN and Inf counts, in float64.

    Computed chunk by chunk (Chan's parallel update for the variance, the
    chunks combined in order), so it needs no full-size temporary and gives
    the same result for any thread count. min/max/mean/std are None when no
    value is finite. Values near float64's largest (about 1e308), whose sum
    or squares overflow, are summed again scaled by a power of two that
    brings the largest magnitude below 1, so mean and std stay finite.
    """
    n, mean, m2, lo, hi, nans, infs = _combined(_grouped_moments(x, progress=True))
    if n == 0:
        return {"min": None, "max": None, "mean": None, "std": None, "nan": nans, "inf": infs}
    if not (math.isfinite(mean) and math.isfinite(m2)):
        scale = 2.0 ** -math.frexp(max(-lo, hi))[1]
        _, mean, m2, *_ = _combined(_grouped_moments(x, scale=scale))
        return {"min": lo, "max": hi, "mean": mean / scale, "std": (m2 / n) ** 0.5 / scale, "nan": nans, "inf": infs}
    return {"min": lo, "max": hi, "mean": mean, "std": (m2 / n) ** 0.5, "nan": nans, "inf": infs}


def _grouped_moments(x: np.ndarray, scale: float = 1.0, progress: bool = False) -> list:
    """[_moments(chunk k of x, scale) for each chunk k], but for GROUP chunks at a time where that is the same.

    A group whose extremes are finite and not zero (the common case) is
    tested, widened and centred with one numpy call each; only the squared
    deviations (BLAS's dot) are taken chunk by chunk. The group's extremes
    stand in its first chunk's figures (the others carry inf and -inf): the
    combined minimum and maximum are the same. Other groups go chunk by
    chunk.
    """
    x = x.reshape(-1)
    per_group = map_chunks(functools.partial(_group_moments, scale=scale), x, progress=progress,
                           chunk=GROUP * CHUNK)
    return [part for group in per_group for part in group]


def _group_moments(group: np.ndarray, scale: float = 1.0) -> list:
    """_moments of each CHUNK-element chunk of `group` (see _grouped_moments)."""
    chunks = -(-group.size // CHUNK)
    if group.size == 0:
        return []
    lo, hi = group.min(), group.max()
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo == 0 or hi == 0:
        return [_moments(group[k * CHUNK:(k + 1) * CHUNK], scale) for k in range(chunks)]
    values = widened(group, scratch(group.size))
    if scale != 1.0:
        values *= scale
    sizes = [min(CHUNK, group.size - k * CHUNK) for k in range(chunks)]
    out = []
    with np.errstate(over="ignore", invalid="ignore"):
        means = _row_sums(values, 0, chunks) / np.array(sizes, dtype=np.float64)
        full = group.size // CHUNK
        np.subtract(values[:full * CHUNK].reshape(-1, CHUNK), means[:full, None],
                    out=values[:full * CHUNK].reshape(-1, CHUNK))
        if full < chunks:
            np.subtract(values[full * CHUNK:], means[full], out=values[full * CHUNK:])
        m2 = row_dots(values, 0, chunks).tolist()
        for k in range(chunks):
            out.append((sizes[k], float(means[k]), m2[k],
                        float(lo) if k == 0 else math.inf, float(hi) if k == 0 else -math.inf, 0, 0))
    return out


def _combined(parts) -> tuple:
    """The chunks' _moments combined in order: (count, mean, m2, min, max, NaNs, Infs)."""
    n = 0
    mean = 0.0
    m2 = 0.0
    lo = math.inf
    hi = -math.inf
    nans = 0
    infs = 0
    for k, part_mean, part_m2, part_lo, part_hi, nan_here, inf_here in parts:
        nans += nan_here
        infs += inf_here
        if k == 0:
            continue
        delta = part_mean - mean
        total = n + k
        mean += delta * k / total
        m2 += part_m2 + delta * delta * n * k / total
        n = total
        lo = min(lo, part_lo)
        hi = max(hi, part_hi)
    return n, mean, m2, lo, hi, nans, infs


def _nonfinite_counts(part: np.ndarray) -> tuple[int, int]:
    finite = np.isfinite(part)
    return (0, 0) if finite.all() else _nan_inf(part, finite)


def nonfinite(x: np.ndarray) -> tuple[int, int]:
    """The NaN and Inf counts of x, chunk by chunk (no full-size temporary)."""
    counts = map_chunks(_nonfinite_counts, x, progress=True)
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


# Bins of the value histogram (info --stats): one terminal cell each, so a
# histogram fits beside a table row; JSON carries the same bins.
HIST_BINS = 16


def histogram(x: np.ndarray, bins: int = HIST_BINS, lo=None, hi=None, *, spans: bool = False,
              finite: bool = False) -> dict:
    """Counts of the finite values in `bins` equal bins from `lo` to `hi`.

    `lo` and `hi` default to the finite minimum and maximum (one extra pass);
    `spans` says that the given ones are (as stats() gives them), which
    spares counting the values outside; `finite` that no value is NaN or
    Inf (stats() counted none), which spares looking for them.
    Bins and counts are numpy.histogram's with ``range=(lo, hi)`` (the last
    bin includes `hi`; equal `lo` and `hi` widen to lo-0.5..hi+0.5), except
    where that range is too narrow for `bins` distinct float64 edges at its
    magnitude (a constant 1e15, where numpy refuses "Too many bins"): then the
    bins are the narrowest ones around the range that have distinct edges
    (bin_edges). Read in chunks. Returns ``{"edges", "counts", "zeros",
    "nan", "inf"}``: bins+1 edges (float) and bins counts (int), or both
    empty when no value is finite; ``zeros`` counts the values equal to 0
    (they are in the counts too), ``nan`` and ``inf`` the values left out.
    """
    x = x.reshape(-1)
    if lo is None or hi is None:
        lo, hi, _ = finite_range(x)
        spans = True
    counts = np.zeros(bins, dtype=np.int64)
    zeros = nans = infs = 0
    edges = None
    if lo is not None and hi is not None:
        lo, hi = float(lo), float(hi)
        if not math.isfinite(hi - lo):
            # numpy's bin arithmetic overflows past ~1.8e308 of range; halving
            # the values halves the edges and keeps every value's bin.
            return _halved(histogram(x / 2.0, bins, lo / 2.0, hi / 2.0, spans=spans, finite=finite), 2.0)
        edges = bin_edges(lo, hi, bins)

    # Counts are integers, the same for any chunking: large chunks keep
    # numpy's per-call cost small against the comparisons.
    thresholds = None if edges is None else _thresholds_for(tuple(edges), x.dtype)
    parts = map_chunks(functools.partial(_bin_counts, edges=edges, thresholds=thresholds, spans=spans,
                                         finite=finite), x, chunk=_HIST_CHUNK)
    for part_counts, zeros_here, nan_here, inf_here in parts:
        nans += nan_here
        infs += inf_here
        zeros += zeros_here
        if part_counts is not None:
            counts += part_counts
    if edges is None:
        return {"edges": [], "counts": [], "zeros": zeros, "nan": nans, "inf": infs}
    return {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts], "zeros": zeros,
            "nan": nans, "inf": infs}


# Elements per chunk of the histogram's counting (2 MiB of float32): on 1 GiB,
# 0.45 s with chunks of 2 CHUNKs, 0.34 s (4), 0.31 s (8), 0.30 s (16).
_HIST_CHUNK = 8 * CHUNK


@functools.lru_cache(maxsize=64)
def _thresholds_for(edges: tuple, dtype) -> list:
    return _thresholds(edges, np.dtype(dtype) if np.dtype(dtype).kind == "f" else np.dtype(np.float64))


def _bin_counts(part: np.ndarray, edges, thresholds=None, spans: bool = False, finite: bool = False) -> tuple:
    """(counts per bin or None, zeros, NaNs, Infs) of one chunk: numpy.histogram's counts over `edges`.

    numpy.histogram puts a value v in bin i when edges[i] <= v < edges[i+1]
    (the last bin closed), after correcting its estimate against the edges.
    Counting the values at or above each inner edge gives the same counts in
    one comparison pass per edge over the chunk as stored, without widening
    it (about 10x faster than numpy.histogram on a 64K-value chunk here).
    """
    if part.dtype.kind != "f":
        part = widened(part)
    nans = infs = above = 0
    size = part.size
    mask = None if finite else np.isfinite(part)
    if mask is not None and not mask.all():
        nans, infs = _nan_inf(part, mask)
        above = int(np.count_nonzero(part == np.inf))  # +Inf is at or above every threshold
    zeros = int(np.count_nonzero(part == 0))
    if edges is None or size == nans + infs:
        return None, zeros, nans, infs
    # Values at or above each edge but the last, and above the last (outside
    # the bins when lo and hi do not span the values).
    if thresholds is None:
        thresholds = _thresholds(edges, part.dtype)
    if spans:  # every finite value is at or above the first edge, none above the last
        inner = [int(np.count_nonzero(part >= c)) - above for c in thresholds[1:-1]]
        beyond = [size - nans - infs, *inner, 0]
    else:
        beyond = [int(np.count_nonzero(part >= c)) - above for c in thresholds]
    return -np.diff(np.array(beyond, dtype=np.int64)), zeros, nans, infs


def _thresholds(edges, dtype) -> list:
    """Thresholds in `dtype` for the float64 edges: for v of that dtype, v >= edges[i] iff v >= out[i], and
    v > edges[-1] iff v >= out[-1]."""
    out = []
    up = dtype.type(np.inf)
    with np.errstate(over="ignore"):  # an edge past the dtype's largest value has the threshold inf
        for i, e in enumerate(edges):
            c = dtype.type(e)
            if float(c) < e or (i == len(edges) - 1 and float(c) == e):
                c = np.nextafter(c, up)
            out.append(c)
    return out


def bin_edges(lo: float, hi: float, bins: int) -> np.ndarray:
    """numpy.histogram's `bins` + 1 edges over lo..hi, or where it has no distinct ones, the narrowest that do.

    numpy spreads equal lo and hi to lo-0.5..hi+0.5, and refuses a range
    whose bins would be narrower than float64's spacing there (beyond about
    5e14, the spacing is over 1/16). The wider range is centred on lo..hi and
    kept inside float64's finite range.
    """
    first, last = (lo - 0.5, hi + 0.5) if lo == hi else (lo, hi)
    edges = np.linspace(first, last, bins + 1)
    # Bins of two float64 steps each at first, doubled until the edges are
    # distinct and hold lo..hi (once or twice in practice).
    half = bins * math.ulp(max(abs(lo), abs(hi)))
    top = sys.float_info.max
    while not (edges[0] <= lo and hi <= edges[-1] and np.all(edges[:-1] < edges[1:])):
        centre = min(max(lo / 2 + hi / 2, half - top), top - half)
        edges = np.linspace(centre - half, centre + half, bins + 1)
        half *= 2
    return edges


def finite_range(x: np.ndarray) -> tuple:
    """(min, max, count of NaN and Inf) of the finite values, read in chunks; (None, None, n) if none is finite."""
    def extremes(part):
        finite = np.isfinite(part)
        bad = 0
        if not finite.all():
            bad = int(part.size - np.count_nonzero(finite))
            part = part[finite]
        if not part.size:
            return math.inf, -math.inf, bad
        return float(part.min()), float(part.max()), bad

    found = map_chunks(extremes, x)
    lo = min((f[0] for f in found), default=math.inf)
    hi = max((f[1] for f in found), default=-math.inf)
    nonfinite = sum(f[2] for f in found)
    if lo > hi:
        return None, None, nonfinite
    return lo, hi, nonfinite


def _halved(hist: dict, factor: float) -> dict:
    return {**hist, "edges": [e * factor for e in hist["edges"]]}
