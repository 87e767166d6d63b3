"""HDF5 in a child process: every call into the library runs in a forked child, with a time limit.

Damaged metadata can crash libhdf5 itself or make it loop: a child killed
by a signal, or past its time, is one line and exit 3, never the command.
"""

from __future__ import annotations

import contextlib
import faulthandler
import marshal
import os
import select
import signal
import struct
import threading
import time
import traceback
import warnings

from ...errors import FormatError, env_count
from .h5 import SECONDS_VARIABLE, h5py_module
from . import walk


_FORK_LOCK = threading.Lock()


# How long a child may run (seconds, plus one per 16 MiB it reads): HDF5 loops
# forever on some damaged metadata (a global heap whose object runs past its
# collection). The walk of a net of MAX_BLOBS datasets takes about 1 s of CPU.
_SECONDS = 20


_FRAME = struct.Struct("<cQ")


def walk_file(source, kind) -> tuple:
    if not hasattr(os, "fork"):
        return walk.walked_here(source, kind)
    return Pending(source, kind).answer()


class Pending:
    """A walk running in its child process: answer() waits for its description, stop() ends it unheard."""

    def __init__(self, source, kind):
        self.name = source.name
        self.seconds = seconds_for(source.size)

        def work(send) -> None:
            answer = marshal.dumps(walk.walked_here(source, kind))
            signal.alarm(0)  # HDF5 is done with: this process may take its time to read the answer
            send(b"W", answer)

        self.pid, self.fd = forked(work, self.seconds)

    def answer(self) -> tuple:
        pid, self.pid = self.pid, None
        if pid is None:
            raise RuntimeError("an HDF5 walk's answer was taken twice or after it was stopped")
        return _walk_answer(pid, self.fd, self.seconds, self.name)

    def stop(self) -> None:
        pid, self.pid = self.pid, None
        if pid is not None:
            os.close(self.fd)
            _reaped(pid, stop=True)


def _walk_answer(pid: int, fd: int, seconds: int, source_name) -> tuple:
    """The description a walk's child sends (see walked_here); FormatError if it crashed, hung or said nothing."""
    frames, died, late = answers(pid, fd, seconds)
    if b"X" in frames:
        raise RuntimeError(f"the HDF5 walk failed in its child process:\n{bytes(frames[b'X']).decode()}")
    if died:
        raise FormatError(f"HDF5's library crashed ({died}) reading the file's structure: damaged metadata",
                          path=source_name)
    if late:
        raise FormatError(f"HDF5's library did not finish reading the file's structure in {late} s: damaged "
                          f"metadata (a loop), or a slow machine ({SECONDS_VARIABLE} sets the time)",
                          path=source_name)
    payload = frames.get(b"W")
    if not payload:
        raise FormatError("HDF5's reading of the file's structure ended without an answer", path=source_name)
    return marshal.loads(payload)


def forked(work, seconds: int):
    """(pid, read end of a pipe) of a child running work(send); send(tag, bytes) frames a message to this process.

    The child ends itself (SIGALRM) a little after `seconds`, should this
    process be gone without stopping it.
    """
    h5py = h5py_module("")
    read_fd, write_fd = os.pipe()
    phil = h5py._objects.phil
    with _FORK_LOCK, phil, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # a multi-threaded caller: see above
        pid = os.fork()
    if pid:
        os.close(write_fd)
        return pid, read_fd
    code = 0
    try:  # the child: never returns
        os.close(read_fd)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it
        faulthandler.disable()  # a crash is reported by this process, in one line
        for number in (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT, signal.SIGPIPE,
                       signal.SIGTERM, signal.SIGHUP, signal.SIGALRM):
            signal.signal(number, signal.SIG_DFL)
        signal.alarm(seconds + 5)

        def send(tag: bytes, body) -> None:
            view = memoryview(body).cast("B")
            _write_all(write_fd, _FRAME.pack(tag, len(view)))
            _write_all(write_fd, view)

        try:
            work(send)
        except Exception:  # noqa: BLE001 - a bug: its traceback goes to the parent, which raises it
            send(b"X", traceback.format_exc().encode("utf-8", "backslashreplace"))
    except BaseException:  # noqa: BLE001
        code = 70
    finally:
        os._exit(code)


def _write_all(fd: int, view) -> None:
    while len(view):
        view = view[os.write(fd, view):]


def seconds_for(nbytes: int) -> int:
    """How long a child may take: _SECONDS (or the environment's), and a second more per 16 MiB to read."""
    return env_count(SECONDS_VARIABLE, _SECONDS, "a number of seconds", minimum=1) + nbytes // (16 << 20)


def answers(pid: int, fd: int, seconds: int) -> tuple:
    """({tag: body} of what a child sent, the signal that killed it or None, `seconds` if it ran past them or 0).

    A child still running when the time is up is killed.
    """
    data = bytearray()
    deadline = time.monotonic() + seconds
    done = late = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                late = True
                break
            chunk = os.read(fd, 1 << 16)  # a pipe's buffer
            if not chunk:
                done = True
                break
            data += chunk
    finally:
        os.close(fd)
        died = _reaped(pid, stop=not done)
    frames, at = {}, 0
    while at + _FRAME.size <= len(data):
        tag, size = _FRAME.unpack_from(data, at)
        at += _FRAME.size
        if at + size > len(data):
            break
        frames[tag] = data[at:at + size]
        at += size
    return frames, died, seconds if late else 0


def _reaped(pid: int, *, stop: bool) -> str | None:
    """Wait for a child (stopped first when this process gives up on it); the signal that killed it, if one did."""
    try:
        if stop:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None  # stopped here, not crashed
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return None
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return signal.Signals(number).name
        except ValueError:
            return f"signal {number}"
    return None
