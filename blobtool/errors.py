"""The exceptions blobtool raises: one base class, a subclass per exit code.

Every error the library raises on bad input or bad use is a BlobToolError. The
message leads with the location, so one line on stderr says where to look::

    mean.binaryproto: truncated at byte 94720: field 5 (data) declares 786432 bytes, 94706 remain

The exit codes are one enum, ExitCode; each error class names its own.
This module imports nothing else from blobtool.
"""

from __future__ import annotations

import enum
import os
import re
import signal

__all__ = [
    "ExitCode",
    "BlobToolError",
    "FormatError",
    "UsageError",
    "DeviceError",
    "OutputError",
    "FitError",
    "Stopped", "require_bytes", "truncated", "env_count",
    "format_location", "parameter", "render_parameters",
]


class ExitCode(enum.IntEnum):
    """The blobtool command's exit codes (an interface: scripts test them)."""

    OK = 0
    DIFFERENT = 1      # compare found differences, or a --check failed
    USAGE = 2          # bad option, or a request that cannot be met
    INPUT = 3          # input unreadable or invalid
    DEVICE = 4         # a GPU was asked for and is not available
    OUTPUT = 5         # the output cannot be written
    INTERNAL = 70      # a bug (EX_SOFTWARE); --debug shows the traceback
    HANGUP = 129       # SIGHUP (128 + 1)
    INTERRUPTED = 130  # SIGINT (128 + 2), as shells report it
    TERMINATED = 143   # SIGTERM (128 + 15)


# What each code means, shortly: `blobtool --help` is written from this.
_MEANINGS = {
    ExitCode.OK: "ok",
    ExitCode.DIFFERENT: "differences found or a check failed",
    ExitCode.USAGE: "usage error",
    ExitCode.INPUT: "input unreadable or invalid",
    ExitCode.DEVICE: "GPU not available",
    ExitCode.OUTPUT: "output not writable",
    ExitCode.INTERNAL: "internal error (--debug shows the traceback)",
}
_SIGNALS = (ExitCode.HANGUP, ExitCode.INTERRUPTED, ExitCode.TERMINATED)


def exit_codes_help() -> str:
    """The exit codes in one sentence, from ExitCode (the command's --help)."""
    said = ", ".join(f"{int(code)} {meaning}" for code, meaning in _MEANINGS.items())
    codes = "/".join(str(int(code)) for code in _SIGNALS)
    names = "/".join(signal.Signals(code - 128).name for code in _SIGNALS)
    return f"Exit codes: {said}, {codes} stopped by {names} (128+N)."


def format_location(path=None, offset=None, field=None) -> str:
    """Join the parts of a location that are known into an error-message prefix.

    >>> format_location("m.pb", 18, "field 5 (data)")
    'm.pb: at byte 18: field 5 (data): '
    """
    parts = []
    if path is not None:
        parts.append(str(path))
    if offset is not None:
        parts.append(f"at byte {offset}")
    if field is not None:
        parts.append(str(field))
    return "".join(p + ": " for p in parts)


# A parameter named in a message: a marker around its name, and a second one
# when a value follows (or a third and the value's repr, when the message names
# the value too). Control characters no message text holds (values are
# quoted or escaped before they reach a message), so that the library and the
# command can each render the same error in their own words.
_OPEN, _VALUE, _GIVEN, _CLOSE = "\x1e", "\x1d", "\x1c", "\x1f"
_PARAMETER = re.compile(f"{_OPEN}([A-Za-z_][A-Za-z0-9_]*)(?:({_VALUE})|{_GIVEN}([^{_OPEN}{_CLOSE}]*))?{_CLOSE}")
_NOT_GIVEN = object()


def parameter(name: str, value: bool = False, *, given=_NOT_GIVEN) -> str:
    """Where a message names the library's keyword argument `name` (a value follows when `value`).

    The library renders it as ``name`` (``name=`` before a value); the
    command renders the option of that parameter (``--name`` and a blank).
    With `given`, the message names the argument with that value: the
    library renders ``name=repr(given)`` (``layout='legacy'``), the command
    the option of ``"name=repr(given)"`` (a flag of its own: ``--legacy``).

    >>> render_parameters(f"{parameter('blob', True)}'x' selects nothing")
    "blob='x' selects nothing"
    >>> render_parameters(f"{parameter('layout', given='legacy')} is protobuf's only")
    "layout='legacy' is protobuf's only"
    """
    if given is not _NOT_GIVEN:
        return f"{_OPEN}{name}{_GIVEN}{given!r}{_CLOSE}"
    return f"{_OPEN}{name}{_VALUE if value else ''}{_CLOSE}"


def render_parameters(template: str, option=None) -> str:
    """A message with its parameters named: as keyword arguments, or through `option(name)` (the command's).

    A parameter named with its value comes to `option` as "name=repr(value)".
    """
    def one(match):
        name, valued, given = match.groups()
        if given is not None:
            return f"{name}={given}" if option is None else option(f"{name}={given}")
        if option is None:
            return name + ("=" if valued else "")
        return option(name) + (" " if valued else "")

    return _PARAMETER.sub(one, template)


def parameters_in(template: str) -> tuple:
    return tuple(m.group(1) for m in _PARAMETER.finditer(template))


class BlobToolError(Exception):
    """Base class of everything blobtool raises on bad input or bad use.

    Attributes
    ----------
    path, offset, field : the location, when known (file name, byte offset,
        protobuf field description); all None for errors of use.
    parameters : the library's keyword arguments the message names (built
        with parameter()); str() names them as such, rendered() as a caller's
        own words for them (the command's options).
    exit_code : the command-line exit code this error maps to.
    """

    exit_code = ExitCode.INPUT

    def __init__(self, message: str, *, path=None, offset=None, field=None):
        self.path = path
        self.offset = offset
        self.field = field
        self.reason = message
        self.parameters = parameters_in(message)
        self._template = format_location(path, offset, field) + message
        super().__init__(render_parameters(self._template))

    def rendered(self, option) -> str:
        """The message with each parameter named as `option(name)` says (the command's option names).

        A parameter named with its value comes to `option` as "name=repr(value)".
        """
        return render_parameters(self._template, option)

    def with_path(self, path) -> "BlobToolError":
        """Return a copy of this error that names `path` (when it named none)."""
        if self.path is not None or path is None:
            return self
        err = type(self)(self.reason, path=path, offset=self.offset, field=self.field)
        err.__cause__ = self.__cause__
        return err


class FormatError(BlobToolError):
    """The input is unreadable or is not what it claims to be (exit 3)."""

    exit_code = ExitCode.INPUT


class FitError(FormatError):
    """Values that do not fit a net (transplant): exit 3, with the three lists.

    Attributes
    ----------
    missing : the template's blobs no value was given for (names as matched).
    unexpected : the values given that no blob of the template takes.
    mismatched : (name, shape given, shape the template takes) per value of another shape.
    """

    def __init__(self, message: str, *, path=None, missing=(), unexpected=(), mismatched=()):
        super().__init__(message, path=path)
        self.missing = list(missing)
        self.unexpected = list(unexpected)
        self.mismatched = list(mismatched)

    def with_path(self, path) -> "FitError":
        if self.path is not None or path is None:
            return self
        return FitError(self.reason, path=path, missing=self.missing, unexpected=self.unexpected,
                        mismatched=self.mismatched)


class UsageError(BlobToolError):
    """The library or the command was asked for something it cannot do (exit 2)."""

    exit_code = ExitCode.USAGE


class DeviceError(BlobToolError):
    """A GPU was asked for and is not available or failed (exit 4)."""

    exit_code = ExitCode.DEVICE


class OutputError(BlobToolError):
    """The output cannot be written (exit 5)."""

    exit_code = ExitCode.OUTPUT


def env_count(name: str, default: int, what: str = "a byte count", minimum: int = 0) -> int:
    """A whole number from the environment variable `name`, or `default` when it is unset.

    Every blobtool setting read from the environment goes through here:
    anything but ASCII digits (after blanks), or a number below `minimum`,
    is a UsageError (exit 2) naming the variable.
    """
    value = os.environ.get(name)
    if value is None:
        return default
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or int(text) < minimum:
        raise UsageError(f"environment variable {name}={value!r} is not {what}: expected a whole number >= {minimum}")
    return int(text)


def require_bytes(size: int, offset: int, nbytes: int, what: str, *, path, prefix: str = "") -> None:
    """Refuse `nbytes` bytes wanted at `offset` of an input of `size` bytes that ends before them.

    The one bounded-read check of the readers: FormatError "truncated at
    byte OFFSET: WHAT NBYTES bytes, R remain" (`what` says who wants them:
    "field 5 (data) declares"), with its `offset` attribute set.
    """
    remain = size - offset
    if remain < nbytes:
        raise truncated(path, offset, what, nbytes, remain, prefix=prefix)


def truncated(path, offset: int, what: str, nbytes: int, remain: int, *, prefix: str = "") -> FormatError:
    """FormatError "truncated at byte OFFSET: WHAT NBYTES bytes, REMAIN remain", its `offset` attribute set."""
    err = FormatError(f"{prefix}truncated at byte {offset}: {what} {nbytes} bytes, {remain} remain", path=path)
    err.offset = offset
    return err


class Stopped(KeyboardInterrupt):
    """Something outside blobtool stopped it: a signal (exit 128 + its number), or a writer of an input (exit 3).

    A KeyboardInterrupt, not an Exception: it arrives at any point (from a
    signal handler), no code that tries one reading and then another can
    take it for a failed try, and whatever cleans up after Ctrl-C (removing
    a temporary output) cleans up after it too.
    """

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code

    def __reduce__(self):  # from a worker process to the command
        return type(self), (self.message, self.exit_code)

    @classmethod
    def by_signal(cls, signum: int, name: str) -> "Stopped":
        return cls("interrupted" if name == "SIGINT" else f"interrupted by {name}", 128 + signum)
