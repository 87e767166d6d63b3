"""blobtool.device: blobtool.engine.device under the short name the docs use (`import blobtool.device`, `blobtool.device.NAME`).

Its names are the engine's own objects, not copies: what they set is the
engine's, wherever it is reached from.
"""

from .engine.device import *  # noqa: F401,F403 (the names of its __all__)
from .engine.device import __all__  # noqa: F401
