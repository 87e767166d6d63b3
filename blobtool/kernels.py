"""Host (numpy) kernels for Blob's math: Caffe's caffe_cpu_asum, dot, scal, axpy.

The reductions accumulate in float64 even for float32 arrays. Caffe's own
asum/sumsq accumulate in the blob's type; numpy's float32 sum over 64M values
is off by about 1e-3 relative, float64 over 64K-element chunks by about 1e-12,
for about the same time, because the chunk stays in cache while it is widened.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import threading

import numpy as np

from .progress import report_locked

__all__ = ["CHUNK", "set_threads", "get_threads", "using_threads", "map_chunks", "map_chunk_indices", "asum",
           "sumsq", "asum_sumsq", "scal", "axpy", "stats", "finite_values", "scaled", "minus", "nonfinite",
           "HIST_BINS", "histogram", "finite_range", "widened", "CountingNonFinite", "count_nonfinite"]

# Elements per chunk: 64K float64 values (512 KiB) stay in L2 cache while they
# are widened, squared and summed.
CHUNK = 1 << 16

# Threads the reductions (asum_sumsq, stats, nonfinite, map_chunks) may use:
# 1 in the library unless set_threads() says otherwise, the core count (or
# --jobs) in the blobtool command. Arrays smaller than PARALLEL_MIN_BYTES are
# reduced in the calling thread.
# Measured on 2 cores, 256 MiB of float32 with BLAS single-threaded: 56 ms
# in one thread, 31 ms in two.
_threads = 1
PARALLEL_MIN_BYTES = 16 << 20

def set_threads(n: int) -> None:
    """Let the reductions split arrays over PARALLEL_MIN_BYTES across `n` threads (1: none)."""
    global _threads
    _threads = max(1, int(n))


def get_threads() -> int:
    return _threads


@contextlib.contextmanager
def using_threads(n: int | None):
    """set_threads(n) for the duration of a with block (None: the CPU count)."""
    previous = _threads
    set_threads(n or os.cpu_count() or 1)
    try:
        yield
    finally:
        set_threads(previous)


def asum_sumsq(x: np.ndarray) -> tuple[float, float]:
    """Sum of |x| and sum of x*x in one pass, accumulated in float64.

    Each CHUNK-element chunk is reduced on its own and the chunk sums are
    added in order, so the result is the same for any number of threads.
    """
    x = x.reshape(-1)
    n = x.size
    if n == 0:
        return 0.0, 0.0
    chunks = -(-n // CHUNK)
    abs_parts = np.empty(chunks, dtype=np.float64)
    sq_parts = np.empty(chunks, dtype=np.float64)
    _run_ranges(_chunk_sums, x, chunks, x.nbytes, abs_parts, sq_parts)
    total_abs = 0.0
    total_sq = 0.0
    for a, q in zip(abs_parts.tolist(), sq_parts.tolist()):
        total_abs += a
        total_sq += q
    return total_abs, total_sq


def _chunk_sums(x: np.ndarray, first: int, stop: int, abs_parts: np.ndarray, sq_parts: np.ndarray) -> None:
    """abs_parts[k], sq_parts[k] = sum |chunk k|, sum chunk k ** 2 for chunks first..stop-1."""
    buf = np.empty(min(CHUNK, x.size), dtype=np.float64)
    # Huge values overflow to inf and NaNs propagate, as in Caffe; numpy's
    # warnings about it would break the one-line stderr. (errstate is per
    # thread, so each worker sets its own.)
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(first, stop):
            part = x[k * CHUNK:(k + 1) * CHUNK]
            wide = buf[:part.size]
            # |x| widened in one pass (abs and widening are both exact), then
            # squared and summed from the cached float64 copy.
            np.absolute(part, out=wide)
            sq_parts[k] = np.dot(wide, wide)
            abs_parts[k] = wide.sum()
            report_locked(part.nbytes)


def _in_threads(fn, arg_lists) -> None:
    """fn(*args) for each args, the first in this thread and the rest in new ones; re-raises the first error."""
    errors = []

    def run(args):
        try:
            fn(*args)
        except BaseException as exc:  # handed to the calling thread below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(args,), daemon=True) for args in arg_lists[1:]]
    for t in threads:
        t.start()
    run(arg_lists[0])
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _ranges(chunks: int, nbytes: int) -> list:
    """The chunk ranges (first, stop) the threads take: one range unless the data is large and threads are allowed."""
    workers = max(1, min(_threads, chunks)) if nbytes >= PARALLEL_MIN_BYTES else 1
    return [(chunks * i // workers, chunks * (i + 1) // workers) for i in range(workers)]


def _run_ranges(fn, x, chunks: int, nbytes: int, *extra) -> None:
    """fn(x, first, stop, *extra) over the chunk ranges, in threads when there are several."""
    ranges = _ranges(chunks, nbytes)
    if len(ranges) == 1:
        fn(x, *ranges[0], *extra)
    else:
        _in_threads(fn, [(x, first, stop, *extra) for first, stop in ranges])


def map_chunks(fn, x: np.ndarray, *, progress: bool = False) -> list:
    """[fn(chunk) for each CHUNK-element chunk of x], in order; a large x is split over the threads.

    fn runs in worker threads: it must not depend on the caller's numpy
    errstate (errstate is per thread) and must not write shared state.
    Combining the results in order gives the same answer for any thread count.
    """
    x = x.reshape(-1)

    def one(k):
        part = x[k * CHUNK:(k + 1) * CHUNK]
        result = fn(part)
        if progress:
            report_locked(part.nbytes)
        return result

    return map_chunk_indices(one, -(-x.size // CHUNK), x.nbytes)


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

    Wraps scaled() or minus(): the count comes from the chunks as they are
    written, so warning about an overflow costs no second pass over the
    data. Overflow is quiet here (no numpy warning line): `count` says it.
    """

    def __init__(self, transform):
        self.transform = transform
        self.count = 0

    def __call__(self, chunk: np.ndarray, start: int) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            out = self.transform(chunk, start)
        if out.dtype.kind in "fc":
            self.count += int(np.count_nonzero(np.isfinite(chunk) & ~np.isfinite(out)))
        return out


def count_nonfinite(values, xp=np) -> int:
    """How many of `values` (a numpy or CuPy array) are Inf or NaN."""
    if values.dtype.kind not in "fc":
        return 0
    return int(xp.count_nonzero(~xp.isfinite(values)))


def widened(part) -> np.ndarray:
    """`part` as a new float64 array, quietly: a signalling NaN becomes a quiet NaN.

    numpy reports the cast of a signalling NaN as an invalid operation (a
    RuntimeWarning, a second line on stderr); the NaN itself is kept, and
    counted as NaN wherever NaNs are. errstate is per thread: this is safe
    in map_chunks' workers.
    """
    with np.errstate(invalid="ignore"):
        return np.array(part, dtype=np.float64)


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
    of two, so exact); min and max are of the values themselves.
    """
    values, nans, infs = finite_values(part)
    if values.size == 0:
        return 0, 0.0, 0.0, np.inf, -np.inf, nans, infs
    lo, hi = float(values.min()), float(values.max())
    if scale != 1.0:
        values *= scale
    # Past float64's range the sums are inf or NaN, without a stderr warning;
    # stats() then starts again with a smaller scale.
    with np.errstate(over="ignore", invalid="ignore"):
        mean = float(values.mean())
        m2 = float(np.dot(values - mean, values - mean))
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
    n, mean, m2, lo, hi, nans, infs = _combined(map_chunks(_moments, x, progress=True))
    if n == 0:
        return {"min": None, "max": None, "mean": None, "std": None, "nan": nans, "inf": infs}
    if not (math.isfinite(mean) and math.isfinite(m2)):
        scale = 2.0 ** -math.frexp(max(-lo, hi))[1]
        _, mean, m2, *_ = _combined(map_chunks(functools.partial(_moments, scale=scale), x))
        return {"min": lo, "max": hi, "mean": mean / scale, "std": (m2 / n) ** 0.5 / scale, "nan": nans, "inf": infs}
    return {"min": lo, "max": hi, "mean": mean, "std": (m2 / n) ** 0.5, "nan": nans, "inf": infs}


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


def histogram(x: np.ndarray, bins: int = HIST_BINS, lo=None, hi=None) -> dict:
    """Counts of the finite values in `bins` equal bins from `lo` to `hi`.

    `lo` and `hi` default to the finite minimum and maximum (one extra pass).
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
    counts = np.zeros(bins, dtype=np.int64)
    zeros = nans = infs = 0
    edges = None
    if lo is not None and hi is not None:
        lo, hi = float(lo), float(hi)
        if not math.isfinite(hi - lo):
            # numpy's bin arithmetic overflows past ~1.8e308 of range; halving
            # the values halves the edges and keeps every value's bin.
            return _halved(histogram(x / 2.0, bins, lo / 2.0, hi / 2.0), 2.0)
        edges = bin_edges(lo, hi, bins)

    def count(part):
        values, nan_here, inf_here = finite_values(part)
        zeros = int(values.size - np.count_nonzero(values))
        if edges is None or not values.size:
            return None, zeros, nan_here, inf_here
        return np.histogram(values, bins=bins, range=(edges[0], edges[-1]))[0], zeros, nan_here, inf_here

    for part_counts, zeros_here, nan_here, inf_here in map_chunks(count, x):
        nans += nan_here
        infs += inf_here
        zeros += zeros_here
        if part_counts is not None:
            counts += part_counts
    if edges is None:
        return {"edges": [], "counts": [], "zeros": zeros, "nan": nans, "inf": infs}
    return {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts], "zeros": zeros,
            "nan": nans, "inf": infs}


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
