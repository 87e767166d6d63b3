"""The host kernels' histograms and finite ranges (blobtool/engine/kernels/): numpy.histogram is the oracle.

The sums, statistics and comparisons of kernels.py are tested through Blob
(test_blob.py) and compare (test_cli.py); these are the histogram helpers
that info --stats and show use.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from blobtool import kernels
from blobtool.engine.kernels import CHUNK, histogram


def test_histogram_counts_match_numpy_over_many_chunks():
    rng = np.random.default_rng(3)
    x = rng.normal(0.0, 1.0, 3 * CHUNK + 123).astype(np.float32)
    x[::97] = 0.0
    x[5], x[70000], x[-1] = np.nan, np.inf, -np.inf
    hist = histogram(x)
    finite = x[np.isfinite(x)].astype(np.float64)
    counts, edges = np.histogram(finite, bins=kernels.HIST_BINS)
    assert hist["counts"] == counts.tolist()
    assert hist["edges"] == edges.tolist()
    assert hist["edges"][0] == finite.min() and hist["edges"][-1] == finite.max()
    assert sum(hist["counts"]) == finite.size
    assert hist["zeros"] == int(np.count_nonzero(finite == 0)) == len(range(0, x.size, 97))
    assert hist["nan"] == 1 and hist["inf"] == 2


@pytest.mark.parametrize("bins", [1, 5, 16, 64])
def test_histogram_bins_and_given_range_match_numpy(bins):
    x = np.linspace(-3.0, 5.0, 1001)
    hist = histogram(x, bins=bins, lo=-2.0, hi=4.0)
    counts, edges = np.histogram(x, bins=bins, range=(-2.0, 4.0))
    assert hist["counts"] == counts.tolist() and hist["edges"] == edges.tolist()


HISTOGRAM_CASES = {
    # name: (values, counts, edges (None: not checked), zeros, nan, inf)
    "constant": ([2.0, 2.0, 2.0], [0, 0, 3, 0], [1.5, 1.75, 2.0, 2.25, 2.5], 0, 0, 0),
    "all zero": ([0.0, 0.0], [0, 0, 2, 0], [-0.5, -0.25, 0.0, 0.25, 0.5], 2, 0, 0),
    "empty": ([], [], [], 0, 0, 0),
    "only nan and inf": ([np.nan, np.inf, -np.inf], [], [], 0, 1, 2),
    "max in last bin": ([0.0, 1.0, 2.0, 3.0, 4.0], [1, 1, 1, 2], [0.0, 1.0, 2.0, 3.0, 4.0], 1, 0, 0),
    "huge double range": ([-1e308, 1e308], [1, 0, 0, 1], None, 0, 0, 0),
}


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("name", HISTOGRAM_CASES)
def test_histogram_edge_cases(name):
    values, counts, edges, zeros, nans, infs = HISTOGRAM_CASES[name]
    hist = histogram(np.array(values, dtype=np.float64), bins=4)
    assert hist["counts"] == counts
    if edges is not None:
        assert hist["edges"] == edges
    else:
        assert len(hist["edges"]) == 5 and hist["edges"][0] == values[0] and hist["edges"][-1] == values[-1]
    assert (hist["zeros"], hist["nan"], hist["inf"]) == (zeros, nans, infs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_histogram_and_finite_range_are_the_same_for_any_thread_count(threaded, dtype):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(6 * CHUNK + 3).astype(dtype)
    x[::5000] = 0
    x[3::77777] = np.nan
    x[4::99999] = np.inf
    threaded(1)
    serial = (kernels.histogram(x), kernels.finite_range(x))
    finite = x[np.isfinite(x)]
    assert serial[0]["counts"] == np.histogram(finite, bins=kernels.HIST_BINS)[0].tolist()
    assert serial[1] == (float(finite.min()), float(finite.max()), int((~np.isfinite(x)).sum()))
    for threads in (2, 4):
        threaded(threads)
        assert (kernels.histogram(x), kernels.finite_range(x)) == serial, threads


# -- values at float64's edges ---------------------------------------------------------

F64_MAX = np.finfo(np.float64).max
NARROW_RANGES = {
    # name: values whose range is too narrow for numpy's 16 bins at their magnitude
    "constant 6e14": np.full(4, 6e14),
    "constant 1e15 float32": np.full(5, 1e15, dtype=np.float32),
    "two neighbours at 6e14": np.array([6e14, 6e14 + 0.125, 6e14]),
    "constant largest double": np.full(3, F64_MAX),
    "constant most negative double": np.full(3, -F64_MAX),
    "two subnormals": np.array([5e-324, 1e-323, 1e-323]),
}


@pytest.mark.parametrize("name", NARROW_RANGES)
def test_histogram_of_a_range_too_narrow_for_numpy_gets_the_narrowest_distinct_bins(name):
    x = NARROW_RANGES[name]
    lo, hi = float(x.min()), float(x.max())
    with pytest.raises(ValueError, match="Too many bins"):  # what numpy.histogram itself does
        np.histogram(x.astype(np.float64), bins=kernels.HIST_BINS)
    hist = histogram(x)
    edges = np.array(hist["edges"])
    assert edges.size == kernels.HIST_BINS + 1 and np.all(np.isfinite(edges))
    assert np.all(edges[:-1] < edges[1:])
    assert edges[0] <= lo and hi <= edges[-1]
    # numpy.histogram over the range chosen is the oracle for the counts
    assert hist["counts"] == np.histogram(x.astype(np.float64), bins=kernels.HIST_BINS,
                                          range=(edges[0], edges[-1]))[0].tolist()
    assert sum(hist["counts"]) == x.size
    # narrow: each bin at most 4 float64 steps at that magnitude (doubling from 2)
    assert (edges[-1] - edges[0]) / kernels.HIST_BINS <= 4 * math.ulp(max(abs(lo), abs(hi)))


@pytest.mark.parametrize("value", [2.0, -3.5, 1e14, 0.0])
def test_histogram_of_an_ordinary_constant_is_numpys(value):
    x = np.full(7, value)
    counts, edges = np.histogram(x, bins=kernels.HIST_BINS)
    assert histogram(x) == {"edges": edges.tolist(), "counts": counts.tolist(), "zeros": 7 if value == 0 else 0,
                            "nan": 0, "inf": 0}


def _exact_moments(x: np.ndarray) -> tuple[float, float]:
    """mean and population std of doubles, summed exactly (math.fsum), scaled exactly so that squares stay finite."""
    k = max(0, math.frexp(float(np.abs(x).max()))[1] - 500)
    scaled = [math.ldexp(float(v), -k) for v in x]
    mean = math.fsum(scaled) / len(scaled)
    var = math.fsum((v - mean) ** 2 for v in scaled) / len(scaled)
    return math.ldexp(mean, k), math.ldexp(math.sqrt(var), k)


@pytest.mark.parametrize("case", ["four", "many chunks"])
def test_stats_of_doubles_near_the_largest_are_finite_and_right(case):
    import warnings

    if case == "four":
        x = np.array([1.7e308, 1.7e308, -1.6e308, 1.79e308])
    else:
        x = np.random.default_rng(11).uniform(-1.0, 1.0, 3 * CHUNK + 17) * 1.7e308
        x[5] = F64_MAX
        x[9] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy RuntimeWarning either
        found = kernels.stats(x)
    finite = x[np.isfinite(x)]
    mean, std = _exact_moments(finite)
    assert found["min"] == finite.min() and found["max"] == finite.max()
    assert found["mean"] == pytest.approx(mean, rel=1e-12)
    assert found["std"] == pytest.approx(std, rel=1e-12)
    assert found["nan"] == (1 if case != "four" else 0) and found["inf"] == 0


def test_stats_of_ordinary_values_take_the_one_pass():
    # the rescaled second pass runs only where the first overflowed: a progress
    # count of exactly one pass shows it, and the result is the first pass's
    from blobtool.engine.work import using

    x = np.random.default_rng(5).standard_normal(2 * CHUNK + 5)
    seen = []
    with using(progress=seen.append):
        found = kernels.stats(x)
    assert sum(seen) == x.nbytes
    mean, std = _exact_moments(x)
    assert found["mean"] == pytest.approx(mean, rel=1e-12) and found["std"] == pytest.approx(std, rel=1e-12)


def _signalling_nans(dtype) -> np.ndarray:
    x = np.arange(1.0, 3 * CHUNK + 1.0).astype(dtype)
    bits = {np.float32: (np.uint32, 0x7FA00000), np.float64: (np.uint64, 0x7FF4000000000000)}[dtype]
    x.view(bits[0])[[3, CHUNK + 1]] = bits[1]
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_signalling_nans_are_counted_without_a_numpy_warning(threaded, dtype):
    import warnings

    from blobtool.engine.compare import compare_arrays

    x = _signalling_nans(dtype)
    for threads in (1, 2):
        threaded(threads)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            found = kernels.stats(x)
            hist = histogram(x)
            lo, hi, bad = kernels.finite_range(x)
            diff = compare_arrays(x, x.copy(), rtol=1e-3)
            widened = kernels.widened(x)
        assert found["nan"] == hist["nan"] == bad == 2 and kernels.nonfinite(x) == (2, 0)
        assert (found["min"], found["max"], lo, hi) == (1.0, float(x.size), 1.0, float(x.size))
        assert diff.equal and diff.mismatches == 0  # NaN equals NaN at the same place
        assert np.isnan(widened[[3, CHUNK + 1]]).all() and widened.dtype == np.float64
