"""Transforms applied to values as they are written (a scale, a difference), and counting what becomes NaN or Inf."""

from __future__ import annotations

import numpy as np

from .blas import scal


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
