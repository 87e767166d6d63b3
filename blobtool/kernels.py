"""blobtool.kernels: blobtool.engine.kernels under the short name the docs use (`import blobtool.kernels`, `blobtool.kernels.NAME`).

Its names are the engine's own objects, not copies: what they set is the
engine's, wherever it is reached from.
"""

from .engine.kernels import *  # noqa: F401,F403 (the names of its __all__)
from .engine.kernels import __all__  # noqa: F401
from .engine.kernels import blas, chunks, histograms, statistics, threads, transforms  # noqa: F401,E402 (its modules)
