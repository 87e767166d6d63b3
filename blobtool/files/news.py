"""What a command is told of its mapped inputs' changes, outside the SIGIO handler (files/mapped.py).

A change the handler could not raise (Guard.deferred, Guard.changes), a
batch's input that went bad, the command reporting its end, and the checks
made before an output is committed.
"""

from __future__ import annotations

from ..errors import ExitCode, FormatError, Stopped
from .mapped import INPUTS, WRITTEN

__all__ = ["take_change", "pending_change", "raise_deferred_stop", "settle", "check_inputs", "raising_change"]


def take_change(name: str) -> bool:
    """Whether the watched input `name` changed since it was opened; from now on its changes are not reported.

    For a batch that reports a bad input and goes on: the caller tells its
    error (as this change, when there was one), and a write that comes
    later, before its mapping is gone, stops nothing.
    """
    guard = INPUTS.guard
    if guard is None:
        return False
    guard.record_changes()
    guard.told.add(name)
    for fd, (leased, _) in list(guard.leases.items()):
        if leased == name:
            del guard.leases[fd]  # its lease may break now: it was read
    if name in guard.changes:
        guard.changes.remove(name)
        return True
    return False


def pending_change() -> str | None:
    """A watched input whose change was found but not yet reported (found where it could not be raised), or None."""
    guard = INPUTS.guard
    if guard is None or guard.signalled:
        return None
    return guard.changes[0] if guard.changes else None


def raise_deferred_stop() -> None:
    """Raise Stopped (exit 3) for a broken lease that SIGIO found where it could not raise (Guard.deferred)."""
    guard = INPUTS.guard
    if guard is not None and guard.deferred is not None and not guard.signalled:
        guard.signalled = True
        raise Stopped(guard.deferred, ExitCode.INPUT)


def settle() -> str | None:
    """Stop raising Stopped for inputs' writers (the command is reporting its end); a watched input that changed, or None.

    Called once an error or a stop is about to be reported: a writer that
    comes along during that report must not add a second line, and a read
    error found in a watched input that was changed meanwhile is better
    told as that change (the caller decides).
    """
    guard = INPUTS.guard
    if guard is None:
        return None
    guard.signalled = True
    guard.leases.clear()
    try:
        return guard.changed_watched()
    except OSError:
        return None


def check_inputs() -> None:
    """Raise FormatError (exit 3) if a watched input changed (before an output is committed)."""
    raise_deferred_stop()
    guard = INPUTS.guard
    changed = guard.changed_watched() if guard is not None else None
    if changed:
        guard.raised.add(changed)
        raise FormatError(WRITTEN, path=changed)


def raising_change(error: FormatError) -> FormatError:
    """`error`, a change found in its input by a read, about to be raised: the writer's SIGIO stops nothing more.

    The SIGIO of the write may come after the read saw its effect, while
    the error is on its way (in a worker process, while the pool formats
    it for the parent): a Stopped raised then would replace it, and there
    the worker would die instead of reporting it.
    """
    if INPUTS.guard is not None:
        INPUTS.guard.raised.add(error.path)
    return error
