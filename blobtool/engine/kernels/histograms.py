"""Value histograms (info --stats): HIST_BINS bins from min to max, zeros and NaN/Inf counted apart."""

from __future__ import annotations

import functools
import math
import sys

import numpy as np

from .chunks import CHUNK
from .statistics import nan_inf, finite_range
from .threads import map_chunks
from .transforms import widened


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


# Elements per chunk of the histogram's counting (2 MiB of float32): past 8
# CHUNKs larger chunks gained nothing (docs/performance.md, "Chunk sizes").
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
        nans, infs = nan_inf(part, mask)
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


def _halved(hist: dict, factor: float) -> dict:
    return {**hist, "edges": [e * factor for e in hist["edges"]]}
