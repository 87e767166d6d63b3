"""Host (numpy) kernels for Blob's math: Caffe's caffe_cpu_asum, dot, scal, axpy, and statistics.

By job: chunks.py (the chunks and buffers the kernels work through),
threads.py (splitting over the call's threads), blas.py (asum, sumsq,
scal, axpy), transforms.py (what is applied to values as they are
written), statistics.py and histograms.py (info --stats). The names below are
the ones the rest of blobtool uses.

The reductions accumulate in float64 even for float32 arrays. Caffe's own
asum/sumsq accumulate in the blob's type; numpy's float32 sum over 64M values
is off by about 1e-3 relative, float64 over 64K-element chunks by about 1e-12,
for about the same time, because the chunk stays in cache while it is widened.

When the call's Work has pages (blobtool.work; source.releasing(), the
command line's reading commands) the values of a mapped input that are
still the file's are copied from its file into small per-thread buffers
(Chunks) rather than read through the mapping, and several chunks are worked
on per numpy call where the figures are the same bits (GROUP). With these,
numpy alone meets blobtool's throughput goals on 2 cores (norm of 1 GiB about
1.5x the time `cat` takes to read it, info --stats about 5x, see
docs/performance.md), so there is no compiled kernel.
"""

from __future__ import annotations

from .blas import asum, asum_sumsq, axpy, row_dots, scal, sumsq
from .chunks import CHUNK, GROUP, READ_BYTES, Chunks, buffer, chunk_done, scratch
from .histograms import HIST_BINS, bin_edges, histogram
from .statistics import finite_range, finite_values, nonfinite, stats
from .threads import PARALLEL_MIN_BYTES, available_cores, map_chunk_indices, map_chunks, using_threads
from .transforms import CountingNonFinite, cast_written, count_nonfinite, minus, scaled, widened

__all__ = ["CHUNK", "GROUP", "READ_BYTES", "PARALLEL_MIN_BYTES", "Chunks", "buffer", "scratch", "chunk_done",
           "using_threads", "available_cores", "map_chunks", "map_chunk_indices", "asum", "sumsq", "asum_sumsq",
           "scal", "axpy", "row_dots", "stats", "finite_values", "nonfinite", "finite_range", "HIST_BINS",
           "histogram", "bin_edges", "scaled", "minus", "widened", "cast_written", "CountingNonFinite",
           "count_nonfinite"]
