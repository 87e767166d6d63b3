"""The engine's math a command streams through: threads and cores, scaled and subtracted chunks, comparisons."""

from ..engine.compare import compare_documents
from ..engine.kernels import CountingNonFinite, available_cores, count_nonfinite, minus, scaled, using_threads

__all__ = ["CountingNonFinite", "available_cores", "compare_documents", "count_nonfinite", "minus", "scaled",
           "using_threads"]
