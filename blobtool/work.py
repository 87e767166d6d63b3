"""blobtool.work: blobtool.engine.work under the short name the docs use (`import blobtool.work`, `blobtool.work.NAME`).

Its names are the engine's own objects, not copies: what they set is the
engine's, wherever it is reached from.
"""

from .engine.work import *  # noqa: F401,F403 (the names of its __all__)
from .engine.work import __all__  # noqa: F401
