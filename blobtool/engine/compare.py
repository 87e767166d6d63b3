"""Comparing blobs: results as data, for the renderer and for scripts.

Values compare in float64, so a float file equals its double conversion.
Exact by default: equal when the shapes match and every value is equal, NaN
equal to NaN at the same position. With tolerances a value matches when
``|a - b| <= atol + rtol * |b|`` (numpy.isclose's rule, B the reference).
Shapes compare with Caffe's ShapeEquals rule: a legacy 4-D shape equals any
shape of at most 4 axes that pads to it with leading 1s ((3, 2) equals legacy
1 x 1 x 3 x 2).
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass, field

import numpy as np

from .blob import legacy_shapes_equal
from ..errors import UsageError
from . import kernels
from .kernels import Chunks, map_chunk_indices, scratch, widened
from .work import current, report_locked

# Elements per chunk on a GPU: enough work per kernel launch to fill the device.
DEVICE_CHUNK = 1 << 24

# Chunks per block on the host: the values that differ in a block are
# weighed at once, so that numpy's per-call cost is paid once per block.
BLOCK = 8

__all__ = ["ValueDiff", "BlobComparison", "FileComparison", "compare_arrays", "shapes_equal",
           "compare_documents"]


def shapes_equal(shape_a, layout_a: str, shape_b, layout_b: str) -> bool:
    """Caffe's ShapeEquals, applied in whichever direction a legacy shape is involved."""
    if tuple(shape_a) == tuple(shape_b):
        return True
    return "legacy" in (layout_a, layout_b) and legacy_shapes_equal(shape_a, shape_b)


@dataclass
class ValueDiff:
    """How two arrays of the same count differ."""

    equal: bool
    max_abs: float
    max_rel: float
    mismatches: int
    first_mismatch: int | None   # flat index
    l2_a: float
    l2_diff: float
    l2_b: float
    nonfinite: int = 0           # mismatches where a or b is Inf or NaN: the largest change there is

    @property
    def rel_l2(self) -> float:
        """||a - b|| / ||b||: the relative L2 change (inf when b is zero and a is not)."""
        if self.l2_diff == 0:
            return 0.0
        return self.l2_diff / self.l2_b if self.l2_b else math.inf


def compare_arrays(a, b, *, rtol: float = 0.0, atol: float = 0.0, xp=np) -> ValueDiff:
    """Compare two flat arrays of equal size chunk by chunk in float64.

    `xp` is the array module the arrays live in: numpy, or CuPy for device
    arrays (then the comparison runs on the GPU, in larger chunks). On the
    host, large arrays are split over kernels' threads; the chunk results are
    combined in order, so the answer does not depend on the thread count.
    Raises UsageError for a tolerance that is negative, NaN or infinite.
    """
    for name, tol in (("rtol", rtol), ("atol", atol)):
        if not (math.isfinite(tol) and tol >= 0):
            raise UsageError(f"{name} must be a finite number >= 0, got {tol!r}")
    a = a.reshape(-1)
    b = b.reshape(-1)
    chunk = kernels.CHUNK if xp is np else DEVICE_CHUNK
    chunks = -(-a.size // chunk)

    def one(k):
        return _compare_chunk(a[k * chunk:(k + 1) * chunk], b[k * chunk:(k + 1) * chunk], rtol, atol, xp)

    # Blocks small enough that every thread gets some.
    block = max(1, min(BLOCK, chunks // current().threads))

    def on_host(j):
        first, stop = j * block, min((j + 1) * block, chunks)
        # The block's values of each side: slices, or (from mapped files)
        # read into buffers of this thread's.
        sides = Chunks(a, first, stop, chunk, slot="a"), Chunks(b, first, stop, chunk, slot="b")
        found = _compare_host_block(sides[0].span(first, stop), sides[1].span(first, stop), 0, stop - first,
                                    chunk, rtol, atol)
        for k in range(first, stop):
            for side in sides:
                side.done(k, progress=True)
        return found

    if xp is np:
        blocks = map_chunk_indices(on_host, -(-chunks // block), a.nbytes + b.nbytes)
        parts = [part for block in blocks for part in block]
    else:
        parts = [one(k) for k in range(chunks)]  # one device, one stream: in order
    max_abs = 0.0
    max_rel = 0.0
    mismatches = 0
    first = None
    sq_diff = sq_a = sq_b = 0.0
    nonfinite = 0
    for k, (count, first_here, abs_here, rel_here, sq_diff_here, sq_a_here, sq_b_here, nonfinite_here) \
            in enumerate(parts):
        nonfinite += nonfinite_here
        if count:
            mismatches += count
            if first is None:
                first = k * chunk + first_here
        max_abs = max(max_abs, abs_here)
        max_rel = max(max_rel, rel_here)
        sq_diff += sq_diff_here
        sq_a += sq_a_here
        sq_b += sq_b_here
    return ValueDiff(mismatches == 0, max_abs, max_rel, mismatches, first,
                     math.sqrt(sq_a), math.sqrt(sq_diff), math.sqrt(sq_b), nonfinite)


def _compare_host_block(a: np.ndarray, b: np.ndarray, first: int, stop: int, chunk: int, rtol: float,
                        atol: float) -> list:
    """_compare_chunk's figures for chunks first..stop-1 of flat host arrays, bit for bit, working only where
    the values differ (`a` and `b` may be the block itself: first 0).

    Chunks whose values compare equal as stored (the common case of equal
    files) cost one comparison and the sums of squares of one side. In the
    others, the values that differ as stored (NaN differs from itself) are
    the only ones with a non-zero delta: those of the whole block are widened
    and weighed at once, and each chunk's sum of squared deltas is taken over
    its deltas laid out as the dense computation lays them out (zeros
    elsewhere), so BLAS adds them in the same order. Chunks where many values
    differ take the dense path. The block's mismatch count, first mismatch
    and maxima are reported in one of its chunks (the sums stay per chunk):
    combined in order, they give the same figures.
    """
    results = []
    sparse = []  # (chunk index, positions within it)
    block_a, block_b = a[first * chunk:stop * chunk], b[first * chunk:stop * chunk]
    with np.errstate(invalid="ignore"):  # a signalling NaN against a wider type; numpy would warn
        differ = block_a != block_b
    counts = _row_counts(differ, chunk)
    # The sums of squares of each side, for the whole block at once (the
    # dense chunks' are taken again below, with the rest of their figures).
    sq_a = _finite_sumsqs(block_a, chunk)
    sq_b = sq_a if not counts.any() else _finite_sumsqs(block_b, chunk)
    for k in range(first, stop):
        n = int(counts[k - first])
        at = (k - first) * chunk
        if not n:
            # Equal values (byte-identical, or zeros of either sign): equal
            # squares, no delta.
            sq = sq_a[k - first]
            results.append([0, None, 0.0, 0.0, 0.0, sq, sq, 0])
        elif n * 8 > min(chunk, block_a.size - at):
            results.append(list(_compare_chunk(block_a[at:at + chunk], block_b[at:at + chunk], rtol, atol, np,
                                               report=False)))
        else:
            sparse.append((k, np.flatnonzero(differ[at:at + chunk])))
            results.append([0, None, 0.0, 0.0, 0.0, sq_a[k - first], sq_b[k - first], 0])
    if not sparse:
        return results
    where = np.concatenate([k * chunk + w for k, w in sparse])
    count, first_here, max_abs, max_rel, delta, ok, nonfinite = _weigh(widened(a[where]), widened(b[where]), rtol,
                                                                       atol, np, np.errstate)
    start = 0
    for k, w in sparse:
        d, o = delta[start:start + w.size], ok[start:start + w.size]
        start += w.size
        # The dense computation's delta[ok]: zeros, with the finite deltas
        # where they fall once the non-finite ones are taken out.
        dense = _zeros(min(chunk, a.size - k * chunk) - int(w.size - np.count_nonzero(o)))
        places = w[o] - (np.cumsum(~o) - ~o)[o]
        try:
            dense[places] = d[o]
            with np.errstate(over="ignore"):  # sums past float64's range are inf; a warning would be a stderr line
                results[k - first][4] = float(np.dot(dense, dense))
        finally:
            dense[places] = 0.0
    at = int(where[first_here]) // chunk if count else sparse[0][0]
    row = results[at - first]
    row[0] = count
    row[1] = int(where[first_here]) - at * chunk if count else None
    row[2], row[3] = max_abs, max_rel
    row[7] = nonfinite
    return results


_zeroed = threading.local()


def _zeros(n: int) -> np.ndarray:
    """n zeros in a buffer this thread keeps, to be left all zeros after use.

    A new zeroed array for each chunk faulted in fresh pages, and filling a
    kept one with zeros cost more than the dot product over it.
    """
    kept = getattr(_zeroed, "values", None)
    if kept is None or kept.size < n:
        kept = _zeroed.values = np.zeros(n, dtype=np.float64)
    return kept[:n]


def _row_counts(flags: np.ndarray, chunk: int) -> np.ndarray:
    """The count of true `flags` in each `chunk`-element chunk (the last may be short)."""
    full = flags.size // chunk
    counts = np.count_nonzero(flags[:full * chunk].reshape(full, chunk), axis=1) if full else np.zeros(0, np.intp)
    if flags.size > full * chunk:
        counts = np.append(counts, np.count_nonzero(flags[full * chunk:]))
    return counts


def _finite_sumsqs(values: np.ndarray, chunk: int) -> list:
    """[_finite_sumsq(each `chunk`-element chunk of values)]: tested and widened at once when all are finite."""
    chunks = range(0, values.size, chunk)
    lo, hi = (values.min(), values.max()) if values.size else (0, 0)
    if not (np.isfinite(lo) and np.isfinite(hi)):  # a NaN makes both NaN
        return [_finite_sumsq(values[k:k + chunk]) for k in chunks]
    wide = widened(values, scratch(values.size))
    with np.errstate(over="ignore"):
        return kernels.row_dots(wide, 0, len(chunks)).tolist()  # chunk is kernels.CHUNK


def _finite_sumsq(part: np.ndarray) -> float:
    """Sum of squares of the chunk's finite values in float64, as the dense computation takes it."""
    finite = np.isfinite(part)
    values = widened(part, scratch(part.size)) if finite.all() else widened(part[finite])
    with np.errstate(over="ignore"):
        return float(np.dot(values, values))


def _weigh(x, y, rtol: float, atol: float, xp, errstate) -> tuple:
    """(mismatches, first mismatch's position, max |x-y|, max relative, |x-y|, isfinite(|x-y|), mismatches whose
    |x-y| is not finite) of float64 x, y."""
    both_nan = xp.isnan(x) & xp.isnan(y)
    with errstate(invalid="ignore", over="ignore"):
        delta = xp.abs(x - y)
        delta[both_nan] = 0.0
        # Equal infinities give NaN above; they are equal.
        delta[(x == y)] = 0.0
        # A zero delta always matches (rtol * |inf| would be nan); a non-finite
        # delta never does, whatever the tolerance.
        bad = ~((delta == 0) | (xp.isfinite(delta) & (delta <= atol + rtol * xp.abs(y))))
    count = int(xp.count_nonzero(bad))
    first = int(xp.flatnonzero(bad)[0]) if count else None
    max_abs = max_rel = 0.0
    finite_delta = xp.where(xp.isnan(delta), xp.inf, delta)
    if finite_delta.size:
        max_abs = float(finite_delta.max())
        with errstate(divide="ignore", invalid="ignore"):
            rel = xp.where(finite_delta == 0, 0.0, finite_delta / xp.abs(y))
        rel = xp.where(xp.isnan(rel), xp.inf, rel)
        max_rel = float(rel.max())
    ok = xp.isfinite(delta)
    return count, first, max_abs, max_rel, delta, ok, int(xp.count_nonzero(bad & ~ok))


def _compare_chunk(a, b, rtol: float, atol: float, xp, report: bool = True) -> tuple:
    """(mismatches, first mismatch in the chunk, max |a-b|, max relative, sum (a-b)^2, sum a^2, sum b^2,
    mismatches whose difference is not finite)."""
    errstate = np.errstate if xp is np else (lambda **_: contextlib.nullcontext())
    with errstate(invalid="ignore"):  # a signalling NaN widens to a quiet one; numpy would warn
        x = a.astype(xp.float64)
        y = b.astype(xp.float64)
    if report:
        report_locked(x.size * (a.itemsize + b.itemsize))
    count, first, max_abs, max_rel, delta, ok, nonfinite = _weigh(x, y, rtol, atol, xp, errstate)
    fx = x[xp.isfinite(x)]
    fy = y[xp.isfinite(y)]
    with errstate(over="ignore"):  # sums past float64's range are inf; a warning would be a stderr line
        return (count, first, max_abs, max_rel, float(xp.dot(delta[ok], delta[ok])), float(xp.dot(fx, fx)),
                float(xp.dot(fy, fy)), nonfinite)


@dataclass
class BlobComparison:
    """One name's comparison. `data`/`diff` are None when not compared."""

    name: str
    shape_a: tuple | None
    shape_b: tuple | None
    shape_equal: bool
    data: ValueDiff | None = None
    diff: ValueDiff | None = None
    diff_only_in: str | None = None   # "a" or "b": only that file has a diff (then the blobs differ)
    layer: str | None = None
    # How the values were compared, where not as stored: "divided by the factor" (a BatchNorm statistic,
    # each side times its own net's Caffe factor), "not compared" (the factor, divided into the statistics).
    compared: str | None = None

    @property
    def only_in(self) -> str | None:
        if self.shape_a is None:
            return "b"
        if self.shape_b is None:
            return "a"
        return None

    @property
    def equal(self) -> bool:
        if self.only_in or not self.shape_equal or self.diff_only_in:
            return False
        return all(v is None or v.equal for v in (self.data, self.diff))

    def first_mismatch_index(self, shape) -> tuple | None:
        """The first differing data value as an index tuple into `shape`."""
        if self.data is None or self.data.first_mismatch is None:
            return None
        return tuple(int(i) for i in np.unravel_index(self.data.first_mismatch, tuple(shape) or (1,)))


@dataclass
class FileComparison:
    a: str
    b: str
    blobs: list = field(default_factory=list)
    rtol: float = 0.0
    atol: float = 0.0

    @property
    def equal(self) -> bool:
        return all(c.equal for c in self.blobs)

    @property
    def differing(self) -> list:
        return [c for c in self.blobs if not c.equal]


def compare_documents(doc_a, doc_b, entries_a, entries_b, *, rtol: float = 0.0, atol: float = 0.0,
                      fetch=None, xp=np, done=None, statistics=None) -> FileComparison:
    """Compare the selected entries of two documents, matched by name.

    `statistics`: (a's, b's) as net.batchnorm.statistic_factors gives them,
    for two nets whose BatchNorm statistics are compared as Caffe uses them:
    each side's data times its own factor (in float64), and the factors
    themselves not compared (they are in the statistics).

    `fetch(entry)` returns the entry's Blob (placed where the work runs);
    by default ``entry.blob()``. With `xp` CuPy, values are compared on the
    GPU (the blobs' gpu_data / gpu_diff, moved there as they are read).
    `done(blob)`, when given, is called on both blobs of a pair once they are
    compared (to free their device memory).
    """
    fetch = fetch or (lambda e: e.blob())
    (scale_a, factors_a), (scale_b, factors_b) = statistics or (({}, set()), ({}, set()))
    result = FileComparison(doc_a.path, doc_b.path, rtol=rtol, atol=atol)
    by_name_b = {e.name: e for e in entries_b}
    seen = set()
    for ea in entries_a:
        eb = by_name_b.get(ea.name)
        seen.add(ea.name)
        if eb is None:
            result.blobs.append(BlobComparison(ea.name, ea.shape, None, False, layer=ea.layer))
            continue
        same_shape = shapes_equal(ea.shape, ea.layout, eb.shape, eb.layout)
        comp = BlobComparison(ea.name, ea.shape, eb.shape, same_shape, layer=ea.layer)
        if same_shape and ea.name in factors_a and eb.name in factors_b:
            comp.compared = "not compared"
        elif same_shape:
            blob_a, blob_b = fetch(ea), fetch(eb)
            on_host = xp is np or blob_a.count == 0
            data = (lambda blob: blob.cpu_data()) if on_host else (lambda blob: blob.gpu_data())
            diff = (lambda blob: blob.cpu_diff()) if on_host else (lambda blob: blob.gpu_diff())
            module = np if on_host else xp
            if ea.name in scale_a and eb.name in scale_b:
                # A statistic holds a value per channel: scaled on the host, in float64, as fold and the
                # export compute it (net/batchnorm.py), whatever device the comparison runs on.
                comp.compared = "divided by the factor"
                values_a = np.asarray(blob_a.cpu_data(), np.float64) * scale_a[ea.name]
                values_b = np.asarray(blob_b.cpu_data(), np.float64) * scale_b[eb.name]
                comp.data = compare_arrays(values_a, values_b, rtol=rtol, atol=atol, xp=np)
            else:
                comp.data = compare_arrays(data(blob_a), data(blob_b), rtol=rtol, atol=atol, xp=module)
            if ea.has_diff and eb.has_diff:
                comp.diff = compare_arrays(diff(blob_a), diff(blob_b), rtol=rtol, atol=atol, xp=module)
            elif ea.has_diff != eb.has_diff:
                comp.diff_only_in = "a" if ea.has_diff else "b"
            if done is not None:
                done(blob_a)
                done(blob_b)
        result.blobs.append(comp)
    for eb in entries_b:
        if eb.name not in seen:
            result.blobs.append(BlobComparison(eb.name, None, eb.shape, False, layer=eb.layer))
    return result
