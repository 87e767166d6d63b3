"""How the files opened in a call are read, beyond their bytes: settings that travel with the call.

As blobtool.engine.work's Work: ``with reading(key="ema"):`` makes the
settings current for the code inside the block (contextvars), in this
thread; another thread or call keeps its own. The command line sets them
for each command, from its options (--key).
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, replace

from ..errors import UsageError

__all__ = ["ReadSettings", "read_settings", "reading", "use_read_settings"]


@dataclass(frozen=True)
class ReadSettings:
    """What a reader is told beyond the bytes, for one call (reading() sets it).

    key: which state dict of a PyTorch checkpoint to read, by its key, keys of
    nested dicts joined by "/" ("ema", "model/state_dict"); None: the one
    state dict the checkpoint holds. Other formats ignore it.
    """

    key: str | None = None

    def __post_init__(self):
        if self.key is not None and (not isinstance(self.key, str) or not self.key):
            raise UsageError(f"key={self.key!r}: a checkpoint's key is a non-empty str (nested keys joined by '/')")


_read_settings: contextvars.ContextVar = contextvars.ContextVar("blobtool_reading", default=ReadSettings())


def read_settings() -> ReadSettings:
    """The ReadSettings of the running call."""
    return _read_settings.get()


def use_read_settings(settings: ReadSettings) -> None:
    """Read with `settings` from now on in this context (a worker process's set-up; a command's options)."""
    _read_settings.set(settings)


@contextlib.contextmanager
def reading(**changes):
    """The current ReadSettings with `changes` (key=) for the files opened inside a with block."""
    token = _read_settings.set(replace(_read_settings.get(), **changes))
    try:
        yield _read_settings.get()
    finally:
        _read_settings.reset(token)
