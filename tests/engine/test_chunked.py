"""The chunked, threaded reductions give, bit for bit, what the straightforward computation gives.

The references below take each CHUNK-element chunk whole, in float64, with
numpy's plain operations (the computation blobtool's figures are defined
by), and combine the chunks in order. The kernels under test skip work where
they can (byte-identical chunks, values that compare equal, a histogram by
thresholds on the stored values) and split the chunks over threads; every
figure must come out the same: compared with repr, so -0.0, NaN and the last
bit count.
"""

from __future__ import annotations

import math
import os
import subprocess

import numpy as np
import pytest

from blobtool import files as source, kernels
from blobtool.engine import compare
from blobtool.errors import ExitCode, FormatError
from blobtool.engine.compare import compare_arrays

from builders import half_blob_bytes, write_blob
from runner import blobtool_cmd, one_json, peak_rss_run, subprocess_env

# Small chunks, so that small arrays cross many chunk boundaries.
SMALL_CHUNK = 1 << 10


@pytest.fixture
def small_chunks(monkeypatch, threaded):
    for module in (kernels, kernels.chunks, kernels.threads, kernels.blas, kernels.statistics, kernels.histograms):
        monkeypatch.setattr(module, "CHUNK", SMALL_CHUNK)
    monkeypatch.setattr(kernels.histograms, "_HIST_CHUNK", 3 * SMALL_CHUNK)
    monkeypatch.setattr(compare, "BLOCK", 2)
    return threaded


def _chunks(x: np.ndarray):
    x = x.reshape(-1)
    return [x[k:k + SMALL_CHUNK] for k in range(0, x.size, SMALL_CHUNK)]


def _wide(x) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.asarray(x, dtype=np.float64)


def reference_norms(x):
    total_abs = total_sq = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        for part in _chunks(x):
            w = np.abs(_wide(part))
            total_abs += float(w.sum())
            total_sq += float(np.dot(w, w))
    return total_abs, total_sq


def reference_stats(x):
    n, mean, m2, lo, hi, nans, infs = 0, 0.0, 0.0, math.inf, -math.inf, 0, 0
    for part in _chunks(x):
        w = _wide(part)
        nans += int(np.isnan(w).sum())
        infs += int(np.isinf(w).sum())
        v = w[np.isfinite(w)]
        if not v.size:
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            pm = float(v.mean())
            pm2 = float(np.dot(v - pm, v - pm))
        delta = pm - mean
        total = n + v.size
        mean += delta * v.size / total
        m2 += pm2 + delta * delta * n * v.size / total
        n = total
        lo, hi = min(lo, float(v.min())), max(hi, float(v.max()))
    if n == 0:
        return {"min": None, "max": None, "mean": None, "std": None, "nan": nans, "inf": infs}
    return {"min": lo, "max": hi, "mean": mean, "std": (m2 / n) ** 0.5, "nan": nans, "inf": infs}


def reference_histogram(x, lo, hi):
    w = _wide(x.reshape(-1))
    finite = w[np.isfinite(w)]
    edges = kernels.bin_edges(lo, hi, kernels.HIST_BINS)
    counts = np.histogram(finite, bins=kernels.HIST_BINS, range=(edges[0], edges[-1]))[0]
    return [int(c) for c in counts], int(finite.size - np.count_nonzero(finite))


def reference_compare(a, b, rtol=0.0, atol=0.0):
    """compare's figures the plain way: every chunk widened whole, every value weighed."""
    mismatches, first, max_abs, max_rel, sq_diff, sq_a, sq_b = 0, None, 0.0, 0.0, 0.0, 0.0, 0.0
    for k, (pa, pb) in enumerate(zip(_chunks(a), _chunks(b))):
        x, y = _wide(pa), _wide(pb)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            delta = np.abs(x - y)
            delta[np.isnan(x) & np.isnan(y)] = 0.0
            delta[x == y] = 0.0
            bad = ~((delta == 0) | (np.isfinite(delta) & (delta <= atol + rtol * np.abs(y))))
            capped = np.where(np.isnan(delta), np.inf, delta)
            rel = np.where(capped == 0, 0.0, capped / np.abs(y))
            ok = np.isfinite(delta)
            fx, fy = x[np.isfinite(x)], y[np.isfinite(y)]
            sq_diff += float(np.dot(delta[ok], delta[ok]))
            sq_a += float(np.dot(fx, fx))
            sq_b += float(np.dot(fy, fy))
        if bad.any():
            mismatches += int(bad.sum())
            if first is None:
                first = k * SMALL_CHUNK + int(np.flatnonzero(bad)[0])
        max_abs = max(max_abs, float(capped.max()))
        max_rel = max(max_rel, float(np.where(np.isnan(rel), np.inf, rel).max()))
    return (mismatches == 0, max_abs, max_rel, mismatches, first, math.sqrt(sq_a), math.sqrt(sq_diff),
            math.sqrt(sq_b))


def _figures(diff):
    return (diff.equal, diff.max_abs, diff.max_rel, diff.mismatches, diff.first_mismatch, diff.l2_a,
            diff.l2_diff, diff.l2_b)


# -- inputs at the edges --------------------------------------------------------------

SIZE = 5 * SMALL_CHUNK + 37  # not a multiple of the chunk


def _inputs(dtype):
    rng = np.random.default_rng(11)
    plain = rng.standard_normal(SIZE).astype(dtype)
    big = np.finfo(dtype).max
    cases = {"plain": plain}
    last = plain.copy()
    last[-1] = np.nan  # a NaN in the last, short chunk
    cases["NaN in the last chunk"] = last
    inf_last = plain.copy()
    inf_last[-2] = -np.inf
    cases["Inf in the last chunk"] = inf_last
    mixed = plain.copy()
    mixed[::97] = -0.0
    mixed[5::101] = 0.0
    mixed[7::1013] = np.inf
    mixed[9::777] = np.nan
    cases["zeros of both signs, NaN, Inf"] = mixed
    signed = np.abs(plain)
    signed[::89] = -0.0
    signed[3::91] = 0.0
    cases["non-negative, the least a zero of either sign"] = signed
    cases["non-positive, the greatest a zero of either sign"] = -signed
    huge = (plain * (big / 8)).astype(dtype)
    cases["near the largest value"] = huge
    cases["all NaN"] = np.full(SIZE, np.nan, dtype=dtype)
    cases["constant"] = np.full(SIZE, dtype(3.5))
    cases["one value"] = plain[:1].copy()
    return cases


DTYPES = [np.float32, np.float64, np.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_norms_stats_and_histograms_match_the_plain_computation(small_chunks, dtype, threads):
    small_chunks(threads)
    for name, x in _inputs(dtype).items():
        assert repr(kernels.asum_sumsq(x)) == repr(reference_norms(x)), name
        found = kernels.stats(x)
        if name != "near the largest value" or dtype is not np.float64:  # rescaled: see test_kernels
            assert repr(found) == repr(reference_stats(x)), name
        if found["min"] is None:
            continue
        expected = reference_histogram(x, found["min"], found["max"])
        for spans in (True, False):
            hist = kernels.histogram(x, lo=found["min"], hi=found["max"], spans=spans)
            assert (hist["counts"], hist["zeros"]) == expected, (name, spans)
        # A given range narrower than the values: the values outside are left out.
        lo, hi = found["min"] / 2, found["max"] / 3
        if lo < hi:
            narrower = kernels.histogram(x, lo=lo, hi=hi)
            assert narrower["counts"] == reference_histogram(x, lo, hi)[0], name


def test_a_histogram_told_the_values_are_finite_counts_the_same(small_chunks):
    small_chunks(2)
    for dtype in DTYPES:
        for name, x in _inputs(dtype).items():
            found = kernels.stats(x)
            if found["nan"] or found["inf"] or found["min"] is None:
                continue
            hist = kernels.histogram(x, lo=found["min"], hi=found["max"], spans=True, finite=True)
            assert (hist["counts"], hist["zeros"]) == reference_histogram(x, found["min"], found["max"]), name


def test_row_sums_are_the_sums_of_each_chunk_on_its_own():
    # At the real chunk size: numpy's pairwise sum of a row of a 2-D array is
    # the sum of that row alone, bit for bit (what row_sums relies on).
    rng = np.random.default_rng(8)
    for size in (3 * kernels.CHUNK, 3 * kernels.CHUNK + 999, 5):
        wide = (rng.standard_normal(size) * 10.0 ** rng.integers(-30, 30, size)).astype(np.float64)
        chunks = -(-size // kernels.CHUNK)
        expected = [wide[k * kernels.CHUNK:(k + 1) * kernels.CHUNK].sum() for k in range(chunks)]
        assert repr(kernels.blas.row_sums(wide, 0, chunks).tolist()) == repr([float(e) for e in expected])
        assert repr(kernels.blas.row_sums(wide, 1, chunks).tolist()) == repr([float(e) for e in expected[1:]])


def test_row_dots_are_each_chunks_dot_product():
    # At the real chunk size: matmul of stacked 1 x n by n x 1 gives what np.dot gives for each row.
    rng = np.random.default_rng(10)
    for size in (5 * kernels.CHUNK, 2 * kernels.CHUNK + 77, 3):
        wide = (rng.standard_normal(size) * 10.0 ** rng.integers(-30, 30, size)).astype(np.float64)
        chunks = -(-size // kernels.CHUNK)
        expected = [float(np.dot(wide[k:k + kernels.CHUNK], wide[k:k + kernels.CHUNK]))
                    for k in range(0, size, kernels.CHUNK)]
        assert repr(kernels.row_dots(wide, 0, chunks).tolist()) == repr(expected)
        assert repr(kernels.row_dots(wide, 1, chunks).tolist()) == repr(expected[1:])


def test_group_moments_are_each_chunks_moments():
    rng = np.random.default_rng(9)
    size = kernels.GROUP * kernels.CHUNK - 5
    for dtype in DTYPES:
        x = rng.standard_normal(size).astype(dtype)
        per_chunk = [kernels.statistics._moments(x[k:k + kernels.CHUNK]) for k in range(0, size, kernels.CHUNK)]
        assert repr(kernels.statistics._combined(kernels.statistics._group_moments(x))) == repr(kernels.statistics._combined(per_chunk)), dtype


def test_histogram_counts_values_on_and_beside_every_edge(small_chunks):
    small_chunks(2)
    edges = kernels.bin_edges(-1.0, 1.0, kernels.HIST_BINS)
    for dtype in DTYPES:
        on = edges.astype(dtype)
        values = np.concatenate([on, np.nextafter(on, dtype(np.inf)), np.nextafter(on, dtype(-np.inf))])
        x = np.tile(values, 50)
        hist = kernels.histogram(x, lo=-1.0, hi=1.0)
        assert hist["counts"] == reference_histogram(x, -1.0, 1.0)[0], dtype


def _pairs(dtype):
    rng = np.random.default_rng(5)
    a = rng.standard_normal(SIZE).astype(dtype)
    pairs = {"identical": (a, a.copy())}
    later = a.copy()
    later[3 * SMALL_CHUNK + 5] += dtype(1)  # the first mismatch in a later chunk
    later[-1] = np.nan
    pairs["first mismatch in a later chunk, NaN at the end"] = (a, later)
    sparse = a.copy()
    sparse[::1000] *= dtype(1.5)
    pairs["one in a thousand"] = (a, sparse)
    dense = (a * dtype(1.001)).astype(dtype)
    pairs["every value"] = (a, dense)
    mixed = a.copy()
    mixed[SMALL_CHUNK:2 * SMALL_CHUNK] *= dtype(1.5)  # a chunk where every value differs ...
    mixed[500] += dtype(1)  # ... after one with a single difference
    mixed[3 * SMALL_CHUNK + 7] = np.nan
    pairs["chunks where many differ beside chunks where few do"] = (a, mixed)
    dense_first = a.copy()
    dense_first[:SMALL_CHUNK] *= dtype(1.5)
    dense_first[SMALL_CHUNK + 3] += dtype(1)
    pairs["many differ in the first chunk, few in the next"] = (a, dense_first)
    special = a.copy()
    special[::50] = np.nan
    other = special.copy()
    other[::70] = np.inf
    other[1::90] = -0.0
    special[1::90] = 0.0
    other[2::130] = np.finfo(dtype).max
    special[2::130] = -np.finfo(dtype).max
    pairs["NaN, Inf, signed zeros, the largest values"] = (special, other)
    pairs["float64 against float32"] = (a, a.astype(np.float64) + 1e-9 * (np.arange(SIZE) % 3 == 0))
    return pairs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_compare_matches_the_plain_computation(small_chunks, dtype, threads):
    small_chunks(threads)
    for name, (a, b) in _pairs(dtype).items():
        for rtol, atol in ((0.0, 0.0), (1e-3, 1e-6)):
            found = compare_arrays(a, b, rtol=rtol, atol=atol)
            assert repr(_figures(found)) == repr(reference_compare(a, b, rtol, atol)), (name, rtol, atol)


def test_the_first_mismatch_is_the_earliest_whatever_the_threads(small_chunks):
    a = np.zeros(8 * SMALL_CHUNK, dtype=np.float32)
    b = a.copy()
    b[[7 * SMALL_CHUNK + 1, 2 * SMALL_CHUNK + 9, 6 * SMALL_CHUNK]] = 1
    for threads in (1, 2, 4):
        small_chunks(threads)
        found = compare_arrays(a, b)
        assert (found.first_mismatch, found.mismatches) == (2 * SMALL_CHUNK + 9, 3)


# -- mapped inputs read from their file ------------------------------------------------

def _mapped(tmp_path, name, values):
    """`values` as a view of a mapped file, at an odd offset (a blob's values after its header)."""
    path = tmp_path / name
    path.write_bytes(b"\x01\x02\x03" + values.tobytes())
    src = source.open_source(path)
    return path, src, np.frombuffer(src.buf, dtype=values.dtype, count=values.size, offset=3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_values_read_from_the_file_give_the_same_figures(small_chunks, tmp_path, monkeypatch, dtype):
    small_chunks(2)
    monkeypatch.setattr(kernels.chunks, "READ_BYTES", 3 * SMALL_CHUNK * np.dtype(dtype).itemsize)  # reads cross groups
    reads = []
    real_read = source.pages.read_mapped
    monkeypatch.setattr(source.pages, "read_mapped", lambda *args: reads.append(args[1]) or real_read(*args))
    for case, (a, b) in _pairs(dtype).items():
        if a.dtype != b.dtype:
            continue
        _, _, ma = _mapped(tmp_path, "a", a)
        _, _, mb = _mapped(tmp_path, "b", b)
        with source.releasing():
            assert source.file_behind(ma) is not None
            found = kernels.stats(ma)
            figures = (kernels.asum_sumsq(ma), found, kernels.nonfinite(ma))
            if found["min"] is not None:
                figures += (kernels.histogram(ma, lo=found["min"], hi=found["max"], spans=True),)
            diff = compare_arrays(ma, mb, rtol=1e-3, atol=1e-6)
        assert reads, case
        expected = (kernels.asum_sumsq(a), kernels.stats(a), kernels.nonfinite(a))
        if found["min"] is not None:
            expected += (kernels.histogram(a, lo=found["min"], hi=found["max"], spans=True),)
        assert repr(figures) == repr(expected), case
        assert repr(_figures(diff)) == repr(reference_compare(a, b, 1e-3, 1e-6)), case
        reads.clear()


def test_small_arrays_are_read_through_the_mapping(small_chunks, tmp_path, monkeypatch):
    small_chunks(1)
    reads = []
    monkeypatch.setattr(source.pages, "read_mapped", lambda *args: reads.append(args))
    _, _, small = _mapped(tmp_path, "small", np.ones(kernels.READ_BYTES // 4 - 1, dtype=np.float32))
    with source.releasing():
        assert kernels.asum_sumsq(small) == (small.size, small.size)
        assert kernels.stats(small)["mean"] == 1.0
    assert reads == []


def test_values_are_read_from_the_file_only_inside_releasing(tmp_path):
    _, _, mapped = _mapped(tmp_path, "a", np.arange(10, dtype=np.float32))
    assert source.file_behind(mapped) is None
    with source.releasing():
        assert source.file_behind(mapped) is not None
        assert source.file_behind(mapped[::2]) is None  # not contiguous: read through the mapping
        assert source.file_behind(np.arange(10.0)) is None  # not mapped


def test_a_file_cut_short_while_its_values_are_read_stops_with_exit_3(small_chunks, tmp_path, monkeypatch):
    small_chunks(1)
    monkeypatch.setattr(kernels.chunks, "READ_BYTES", SMALL_CHUNK)  # read from the file, not through the mapping
    path, _, mapped = _mapped(tmp_path, "cut", np.ones(8 * SMALL_CHUNK, dtype=np.float32))
    os.truncate(path, 100)
    with source.releasing(), pytest.raises(FormatError, match="changed while it was read") as caught:
        kernels.asum_sumsq(mapped)
    assert caught.value.exit_code == ExitCode.INPUT
    assert str(path) in str(caught.value)


# -- the command line: same figures with pages released, memory bounded ------------------

@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="peak RSS is read from /proc (Linux)")
def test_norm_stats_and_compare_release_the_pages_they_read(tmp_path):
    count = 48 << 20  # 192 MiB of float32: well above what the commands may keep
    rng = np.random.default_rng(1)
    data = rng.standard_normal(count, dtype=np.float32)
    a = write_blob(tmp_path / "a.pb", data)
    data[::1000] += 1
    b = write_blob(tmp_path / "b.pb", data)
    del data
    limit = 160 << 10  # KiB: start-up plus the chunks in flight, far below the file's 192 MiB
    for args in (("norm", "--json", a), ("info", "--stats", "--json", a), ("compare", "--json", a, b)):
        res, peak = peak_rss_run(tmp_path, *args)
        assert res.returncode in (0, 1), res.stderr
        assert res.stderr == ""
        assert peak < limit, (args[0], peak)


def test_command_line_figures_do_not_depend_on_jobs_or_encoding(tmp_path):
    rng = np.random.default_rng(3)
    values = rng.standard_normal(3 * kernels.CHUNK + 11).astype(np.float16)
    values[-1] = np.nan
    half = tmp_path / "half.pb"
    half.write_bytes(half_blob_bytes(values))
    single = write_blob(tmp_path / "single.pb", values.astype(np.float32))
    records = {}
    for path in (half, single):
        for jobs in ("1", "2"):
            outs = []
            for args in (("norm", "--json"), ("info", "--stats", "--json")):
                res = subprocess.run(blobtool_cmd(*args, "--jobs", jobs, path), capture_output=True, text=True,
                                     env=subprocess_env(), timeout=120)
                assert res.returncode == 0, res.stderr
                record = one_json(res)
                record.pop("path")
                for blob in record["blobs"]:
                    blob.pop("dtype", None)
                    blob.pop("bytes", None)
                record.pop("bytes", None)
                record.pop("kind", None)
                outs.append(record)
            records[(path.name, jobs)] = outs
    first = records[("half.pb", "1")]
    assert all(r == first for r in records.values()), records
    stats = first[1]["blobs"][0]["stats"]["data"]
    assert stats["nan"] == 1 and sum(stats["histogram"]["counts"]) == values.size - 1


@pytest.mark.parametrize("spread", [1, 10000])
def test_nonfinite_mismatches_are_counted_in_sparse_and_dense_chunks(spread):
    # A few differing values in a chunk take the sparse path, many the dense one:
    # both count the mismatches whose difference is Inf or NaN.
    n = 3 * kernels.CHUNK + 17
    a = np.linspace(-1, 1, n).astype(np.float32)
    b = a.copy()
    where = np.arange(kernels.CHUNK + 3, kernels.CHUNK + 3 + spread)
    b[where] += 1.0                         # finite differences
    b[2 * kernels.CHUNK + 1] = np.inf       # Inf on one side
    b[2 * kernels.CHUNK + 2] = np.nan       # NaN on one side
    got = compare_arrays(a, b)
    assert got.mismatches == spread + 2
    assert got.nonfinite == 2
    assert got.first_mismatch == kernels.CHUNK + 3
