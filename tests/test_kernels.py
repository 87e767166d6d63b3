"""The host kernels' histograms and finite ranges (blobtool/kernels.py): numpy.histogram is the oracle.

The sums, statistics and comparisons of kernels.py are tested through Blob
(test_blob.py) and compare (test_cli.py); these are the histogram helpers
that info --stats and show use.
"""

from __future__ import annotations

import numpy as np
import pytest

from blobtool import kernels
from blobtool.kernels import CHUNK, histogram


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
