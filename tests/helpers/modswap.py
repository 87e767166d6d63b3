"""Stand-in modules for tests (a fake CuPy, PyTorch's names): sys.modules put back as it was afterwards.

Standard library only, so that it can be imported anywhere (a child process's start-up too).
"""

from __future__ import annotations

import contextlib
import sys


@contextlib.contextmanager
def modules_restored(*names):
    """Put sys.modules' entries for `names` back as they were (absent ones removed) when the block ends."""
    saved = {name: sys.modules.get(name) for name in names}
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
