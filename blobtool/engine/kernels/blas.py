"""Caffe's BLAS-1 on the host: asum and sumsq (in one pass, accumulated in float64), scal, axpy."""

from __future__ import annotations

import numpy as np

from .chunks import CHUNK, GROUP, Chunks, chunk_done, scratch
from .threads import run_ranges


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
    run_ranges(_chunk_sums, x, chunks, x.nbytes, abs_parts, sq_parts, unit=GROUP)
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
            abs_parts[ks.start:ks.stop] = row_sums(wide, ks.start - g * GROUP, ks.stop - g * GROUP)
            groups.done(g, progress=True)  # asum_sumsq's thread ranges hold whole groups


def row_dots(wide: np.ndarray, first: int, stop: int) -> np.ndarray:
    """[np.dot(r, r) for each CHUNK-element row r of wide, rows first..stop-1] (the last may be short).

    numpy's matmul of a stack of 1 x n by n x 1 matrices hands each pair to
    the same BLAS dot as np.dot (tests/engine/test_chunked.py checks the bits), in
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


def row_sums(wide: np.ndarray, first: int, stop: int) -> np.ndarray:
    """[wide[k*CHUNK:(k+1)*CHUNK].sum() for k in first..stop-1] (the last may be short), in one call per shape.

    numpy reduces each row of a C-contiguous 2-D array along its last axis
    with the same pairwise summation as the row on its own, so the sums are
    the same bits (tests/engine/test_chunked.py checks it); fewer calls matter when
    two threads share the interpreter.
    """
    full = min(stop, wide.size // CHUNK)
    sums = np.empty(stop - first, dtype=np.float64)
    if full > first:
        sums[:full - first] = np.add.reduce(wide[first * CHUNK:full * CHUNK].reshape(-1, CHUNK), axis=1)
    if stop > max(full, first):
        sums[-1] = wide[full * CHUNK:].sum()
    return sums


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
