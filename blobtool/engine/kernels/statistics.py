"""Statistics of a blob's values (min, max, mean, std, NaN and Inf counts), chunk by chunk, in float64."""

from __future__ import annotations

import functools
import math

import numpy as np

from .blas import row_sums, row_dots
from .chunks import CHUNK, GROUP, scratch
from .threads import map_chunks
from .transforms import widened


def finite_values(part: np.ndarray) -> tuple[np.ndarray, int, int]:
    """(the finite values of `part` as float64, NaN count, Inf count)."""
    part = widened(part)
    finite = np.isfinite(part)
    if finite.all():
        return part, 0, 0
    return part[finite], *nan_inf(part, finite)


def nan_inf(part: np.ndarray, finite: np.ndarray) -> tuple[int, int]:
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
        nans, infs = nan_inf(part, finite)
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
        means = row_sums(values, 0, chunks) / np.array(sizes, dtype=np.float64)
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
    return (0, 0) if finite.all() else nan_inf(part, finite)


def nonfinite(x: np.ndarray) -> tuple[int, int]:
    """The NaN and Inf counts of x, chunk by chunk (no full-size temporary)."""
    counts = map_chunks(_nonfinite_counts, x, progress=True)
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


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
