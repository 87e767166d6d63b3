"""What a command's run holds: its inputs guarded (files.guarded), pages released, outputs atomic, per-call work.

Light: the command opens the guard before numpy loads (BLAS threads are set first).
"""

from .. import files
from ..engine.work import using
from ..files import atomic_output, guarding, releasing

__all__ = ["atomic_output", "files", "guarding", "releasing", "using"]
