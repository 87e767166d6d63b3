"""Host (numpy) kernels for Blob's math: Caffe's caffe_cpu_asum, dot, scal, axpy.

The reductions accumulate in float64 even for float32 arrays. Caffe's own
asum/sumsq accumulate in the blob's type; numpy's float32 sum over 64M values
is off by about 1e-3 relative, float64 over 64K-element chunks by about 1e-12,
for about the same time, because the chunk stays in cache while it is widened.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

__all__ = ["CHUNK", "set_threads", "get_threads", "asum", "sumsq", "asum_sumsq", "scal", "axpy", "stats",
           "reporting", "report", "scaled", "minus", "nonfinite"]

# Elements per chunk: 64K float64 values (512 KiB) stay in L2 cache while they
# are widened, squared and summed.
CHUNK = 1 << 16

# Threads the reductions may use; 1 in the library unless set_threads() says
# otherwise, the core count (or --jobs) in the blobtool command. Arrays
# smaller than PARALLEL_MIN_BYTES are reduced in the calling thread.
# Measured on 2 cores, 256 MiB of float32 with BLAS single-threaded: 56 ms
# in one thread, 31 ms in two.
_threads = 1
PARALLEL_MIN_BYTES = 16 << 20

# Called with the number of bytes each chunk covered, while a progress display
# is active (see reporting()); None otherwise, which costs one test per chunk.
_progress = None


@contextlib.contextmanager
def reporting(callback):
    """Call `callback(nbytes)` as the chunked kernels (and writers) work through data."""
    global _progress
    previous, _progress = _progress, callback
    try:
        yield
    finally:
        _progress = previous


# Chunk reductions in several threads report through this lock.
_progress_lock = threading.Lock()


def report(nbytes: int) -> None:
    """Tell the active progress display (if any) that `nbytes` more were processed."""
    if _progress is not None:
        _progress(nbytes)


def set_threads(n: int) -> None:
    """Let the reductions (asum_sumsq) split large arrays over `n` threads (1: none)."""
    global _threads
    _threads = max(1, int(n))


def get_threads() -> int:
    return _threads


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
    workers = min(_threads, chunks) if x.nbytes >= PARALLEL_MIN_BYTES else 1
    bounds = [chunks * i // workers for i in range(workers + 1)]
    if workers == 1:
        _chunk_sums(x, 0, chunks, abs_parts, sq_parts)
    else:
        _in_threads(_chunk_sums, [(x, bounds[i], bounds[i + 1], abs_parts, sq_parts) for i in range(workers)])
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
            if _progress is not None:
                with _progress_lock:
                    _progress(part.nbytes)


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


def finite_chunks(x: np.ndarray, *, progress: bool = False):
    """Yield (finite values as float64, NaN count, Inf count) for each chunk of `x`."""
    x = x.reshape(-1)
    for start in range(0, x.size, CHUNK):
        part = x[start:start + CHUNK].astype(np.float64)
        if progress:
            report(part.size * x.itemsize)
        finite = np.isfinite(part)
        if finite.all():
            yield part, 0, 0
            continue
        nans = int(np.count_nonzero(np.isnan(part)))
        yield part[finite], nans, int(part.size - np.count_nonzero(finite)) - nans


def stats(x: np.ndarray) -> dict:
    """min, max, mean, std of the finite values, and the NaN and Inf counts, in float64.

    Computed chunk by chunk (Chan's parallel update for the variance), so it
    needs no full-size temporary. min/max/mean/std are None when no value is
    finite.
    """
    n = 0
    mean = 0.0
    m2 = 0.0
    lo = np.inf
    hi = -np.inf
    nans = 0
    infs = 0
    for part, nan_here, inf_here in finite_chunks(x, progress=True):
        nans += nan_here
        infs += inf_here
        if part.size == 0:
            continue
        k = part.size
        part_mean = float(part.mean())
        with np.errstate(over="ignore", invalid="ignore"):  # past float64's range: inf, without a stderr warning
            part_m2 = float(np.dot(part - part_mean, part - part_mean))
        delta = part_mean - mean
        total = n + k
        mean += delta * k / total
        m2 += part_m2 + delta * delta * n * k / total
        n = total
        lo = min(lo, float(part.min()))
        hi = max(hi, float(part.max()))
    if n == 0:
        return {"min": None, "max": None, "mean": None, "std": None, "nan": nans, "inf": infs}
    return {"min": lo, "max": hi, "mean": mean, "std": (m2 / n) ** 0.5, "nan": nans, "inf": infs}


def nonfinite(x: np.ndarray) -> tuple[int, int]:
    """The NaN and Inf counts of x, chunk by chunk (no full-size temporary)."""
    x = x.reshape(-1)
    nans = 0
    infs = 0
    for start in range(0, x.size, CHUNK):
        part = x[start:start + CHUNK]
        report(part.nbytes)
        finite = np.isfinite(part)
        if finite.all():
            continue
        nan_here = int(np.count_nonzero(np.isnan(part)))
        nans += nan_here
        infs += int(part.size - np.count_nonzero(finite)) - nan_here
    return nans, infs
