"""The mapped inputs of the process, and what guards them: leases, watches for writers, and SIGBUS.

Every input blobtool maps is registered here (its reader descriptor, its
name, what of it was handed out for writing), so that the pages of a
mapping, the readers of its file and the command line's guards all know
it. Under guard_inputs() (the command line) each mapped file is leased,
so that a writer that truncates it cannot kill the reader with SIGBUS, and
watched for writes, with SIGBUS caught: a lease that an open for writing
breaks (a touch's too) is given up and the watch alone goes on; where no
lease can be had, the watch is all (see _look_at_leases and watch).
"""

from __future__ import annotations

import atexit
import contextlib
import mmap
import os
import signal
import struct
import sys
import weakref

try:
    import fcntl
except ImportError:  # not on Windows: no leases there
    fcntl = None

from ..errors import ExitCode, FormatError, Stopped

__all__ = ["guard_inputs", "guarding", "settle", "take_change", "pending_change", "check_inputs", "note_written",
           "WRITTEN"]


MAPPINGS: dict = {}  # id of a mapping -> (a descriptor of its file, the input's name)


def forget(key: int, fd: int | None) -> None:
    _written.pop(key, None)
    _spans.pop(key, None)
    if fd is None:
        return
    if fd in WATCHED:
        _record_changes()  # before its descriptor goes: a change found now is reported at the command's end
        WATCHED.pop(fd, None)
    MAPPINGS.pop(key, None)
    with contextlib.suppress(OSError):
        os.close(fd)


def identity_of(st: os.stat_result) -> tuple:
    # Not the times: `touch` changes them and not the bytes (see "watching" below).
    return st.st_dev, st.st_ino, st.st_size


_guarded = False


_signalled = False  # a watched input's change was reported by SIGIO


_leases: dict = {}  # a descriptor holding a lease -> (the input's name, whether a watch takes over when it breaks)


def guard_inputs() -> None:
    """Lease mapped inputs from now on, and watch those that cannot be leased (the command line; main thread)."""
    global _guarded
    if _guarded or not hasattr(fcntl, "F_SETLEASE") or not hasattr(signal, "SIGIO"):
        return
    signal.signal(signal.SIGIO, _lease_broken)
    # Python puts SIGIO's handler back to the default (which kills) as it shuts down, while leases
    # and the inotify descriptor may still send it: a writer then would end blobtool by signal 29.
    atexit.register(signal.signal, signal.SIGIO, signal.SIG_IGN)
    _catch_faults()
    _guarded = True


def guarding() -> bool:
    """Whether mapped inputs are leased (guard_inputs was called)."""
    return _guarded


def take_lease(fd: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError:
        return False
    return True


def _in_finalizer(frame) -> bool:
    """Whether `frame` runs inside a weakref finalizer (at exit too), where an exception would be dropped."""
    codes = (weakref.finalize.__call__.__code__, weakref.finalize._exitfunc.__code__)
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


def unwatch(fd: int) -> None:
    _leases.pop(fd, None)
    with contextlib.suppress(OSError):
        os.close(fd)


def _lease_broken(signum, frame) -> None:
    global _handling, _again
    if _handling:
        # Python runs a handler between any two bytecodes, this one's own too: a writer that
        # keeps writing would nest handlers until RecursionError. The running one looks again.
        _again = True
        return
    _handling = True
    try:
        _again = True
        while _again:
            _again = False
            _look_at_inputs(frame)
    finally:
        _handling = False


_handling = False  # _lease_broken is running


_again = False  # SIGIO came while it ran


def _look_at_inputs(frame) -> None:
    global _signalled
    if _signalled or frame is not None and frame.f_code is _on_fault.__code__:
        return  # stopping already (or inside the SIGBUS handler, which stops the command with this news)
    changed = _changed_watched()
    if changed and changed in _raised:
        return  # check_inputs raised this change already: that error is on its way (a second would break it)
    if changed:
        if _in_finalizer(frame):
            # An exception raised in a finalizer is printed and dropped. The change stays recorded
            # (_changes): the next read of values, the commit of an output or the command's end
            # (pending_change) reports it. Signalling again from here would only come back here.
            return
        _signalled = True  # one stop, however many writes come (read_mapped and commits still check)
        raise Stopped(f"{changed}: {WRITTEN}", ExitCode.INPUT)
    _look_at_leases()


def hold_lease(fd: int, name: str, watched: bool) -> None:
    """Keep the read lease taken on `fd` (a descriptor of the input `name` of its own) while its mapping lives.

    `watched`: the input is also watched for writes (inotify, since its
    open) and SIGBUS is caught, so that a broken lease is given up and the
    read goes on (see _look_at_leases). A lease broken before this call,
    whose SIGIO found nothing to look at, is looked at here.
    """
    _leases[fd] = (name, watched)
    if not _signalled:
        _look_at_leases()


def _look_at_leases() -> None:
    """Give up each broken lease that a watch takes over from; raise Stopped for one that none does.

    A lease breaks when another process opens the file for writing or
    truncates it, whether or not it then writes: GNU touch opens the file
    for writing and only sets its times. The kernel holds the breaker back
    until the lease is given up (at most /proc/sys/fs/lease-break-time).
    Given up at once, the breaker goes ahead, and a real change (a write,
    a truncation) is told by the watch (IN_MODIFY, the size, the inode).
    Without a watch, or where SIGBUS cannot be caught, the read stops.
    """
    for fd, (name, watched) in list(_leases.items()):
        try:
            breaking = fcntl.fcntl(fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK
        except OSError:
            continue
        if not breaking:
            continue
        if watched:
            _leases.pop(fd, None)  # the descriptor stays open until the mapping goes (unwatch closes it)
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
            continue
        _leases.clear()  # one stop, however many writers come
        raise Stopped(f"{name}: changed while it was read: another process opened it for writing "
                      "or truncated it", ExitCode.INPUT)


WRITTEN = "changed while it was read: another process wrote to it or truncated it"


CUT_UNDER_MAP = ("changed while it was read: it ended before a byte read through its memory map (another process "
                  "truncated it, or its storage failed)")


WATCHED: dict = {}  # a reader descriptor of a mapped input -> (name, identity at open, inotify watch or None)


_watches: dict = {}  # inotify watch -> [name, how many mapped inputs use it]


_inotify = None  # the process's inotify descriptor (None: not made yet; -1: none to be had)


_changes: list = []  # names of watched inputs that changed (found by any thread)


_told: set = set()  # inputs already reported bad, whose changes are not reported again (take_change)


_IN_MODIFY = 0x2


def watch(fd: int, name: str, mapped, st: os.stat_result):
    """Watch the input open on `fd` (mapped as `mapped`) for as long as the mapping lives; its inotify watch, or None.

    An input that could not be leased, and a leased one, whose lease an
    open for writing may break: the watch then takes over from the lease.
    """
    reader = MAPPINGS.get(id(mapped), (None,))[0]
    _told.discard(name)  # opened again: its changes count again
    wd = _add_watch(fd, name)
    if reader is not None:
        WATCHED[reader] = (name, identity_of(st), wd)
    weakref.finalize(mapped, _stop_watching, reader, wd)
    return wd


def _libc():
    import ctypes  # ctypes loads only when a guard or a fault handler is set up (start-up)

    return ctypes.CDLL(None, use_errno=True)


def _add_watch(fd: int, name: str):
    global _inotify
    if _inotify is None:
        _inotify = -1
        with contextlib.suppress(Exception):
            libc = _libc()
            made = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if made >= 0:
                # SIGIO when an event arrives, as for a broken lease.
                fcntl.fcntl(made, fcntl.F_SETOWN, os.getpid())
                fcntl.fcntl(made, fcntl.F_SETFL, fcntl.fcntl(made, fcntl.F_GETFL) | os.O_ASYNC | os.O_NONBLOCK)
                _inotify = made
    if _inotify < 0:
        return None
    try:
        wd = _libc().inotify_add_watch(_inotify, f"/proc/self/fd/{fd}".encode(), _IN_MODIFY)
    except Exception:  # noqa: BLE001 - a missing inotify leaves the size and inode checks
        return None
    if wd < 0:
        return None
    _watches.setdefault(wd, [name, 0])[1] += 1
    return wd


def _record_changes() -> None:
    with contextlib.suppress(OSError):
        _changed_watched()


def _stop_watching(reader, wd) -> None:
    _record_changes()  # the events of this input that are still queued
    if reader is not None:
        WATCHED.pop(reader, None)
    if wd is not None and wd in _watches:
        _watches[wd][1] -= 1
        if _watches[wd][1] == 0:
            del _watches[wd]
            with contextlib.suppress(Exception):
                _libc().inotify_rm_watch(_inotify, wd)


def _changed_watched() -> str | None:
    """The name of a watched input that another process wrote to or truncated since it was opened, or None."""
    if _inotify is not None and _inotify >= 0 and _watches:
        while True:
            try:
                events = os.read(_inotify, 65536)
            except OSError:  # EAGAIN: none pending
                break
            pos = 0
            while pos + 16 <= len(events):
                wd, mask, _, length = struct.unpack_from("iIII", events, pos)
                pos += 16 + length
                if mask & _IN_MODIFY and wd in _watches:
                    _note_change(_watches[wd][0])
    for reader, (name, identity, _) in list(WATCHED.items()):
        with contextlib.suppress(OSError):
            if identity_of(os.fstat(reader)) != identity:
                _note_change(name)
    return _changes[0] if _changes else None


def _note_change(name: str) -> None:
    if name not in _changes and name not in _told:
        _changes.append(name)


def take_change(name: str) -> bool:
    """Whether the watched input `name` changed since it was opened; from now on its changes are not reported.

    For a batch that reports a bad input and goes on: the caller tells its
    error (as this change, when there was one), and a write that comes
    later, before its mapping is gone, stops nothing.
    """
    _record_changes()
    _told.add(name)
    for fd, (leased, _) in list(_leases.items()):
        if leased == name:
            del _leases[fd]  # its lease may break now: it was read
    if name in _changes:
        _changes.remove(name)
        return True
    return False


def pending_change() -> str | None:
    """A watched input whose change was found but not yet reported (found inside a finalizer), or None."""
    return None if _signalled else (_changes[0] if _changes else None)


def settle() -> str | None:
    """Stop raising Stopped for inputs' writers (the command is reporting its end); a watched input that changed, or None.

    Called once an error or a stop is about to be reported: a writer that
    comes along during that report must not add a second line, and a read
    error found in a watched input that was changed meanwhile is better
    told as that change (the caller decides).
    """
    global _signalled
    _signalled = True
    _leases.clear()
    try:
        return _changed_watched()
    except OSError:
        return None


def check_inputs() -> None:
    """Raise FormatError (exit 3) if a watched input changed (before an output is committed)."""
    changed = _changed_watched()
    if changed:
        _raised.add(changed)
        raise FormatError(WRITTEN, path=changed)


def raising_change(error: FormatError) -> FormatError:
    """`error`, a change found in its input by a read, about to be raised: the writer's SIGIO stops nothing more.

    The SIGIO of the write may come after the read saw its effect, while
    the error is on its way (in a worker process, while the pool formats
    it for the parent): a Stopped raised then would replace it, and there
    the worker would die instead of reporting it.
    """
    _raised.add(error.path)
    return error


_raised: set = set()  # inputs whose change check_inputs or a read raised: SIGIO stops nothing more for them


_faults_caught = False


def faults_caught() -> bool:
    """Whether the SIGBUS handler is installed (a truncation under a mapping then ends the command with exit 3)."""
    return _faults_caught


_spans: dict = {}  # id of a mapping -> (first address, end address, the line to print)


TEMPORARIES: set = set()  # temporary outputs being written (removed before a SIGBUS exit)


_handler = None  # the C-callable handler, kept alive


def map_span(mapped, name: str) -> None:
    import ctypes  # ctypes loads only when a guard or a fault handler is set up (start-up)

    if not len(mapped):
        return
    start = ctypes.addressof(ctypes.c_char.from_buffer(mapped))
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)
    line = f"blobtool: {shown}: {CUT_UNDER_MAP}\n"
    _spans[id(mapped)] = (start, start + len(mapped), line.encode("utf-8", "backslashreplace"))


def _catch_faults() -> None:
    """Install the SIGBUS handler that ends the command with exit 3 and one line (Linux, x86-64 and ARM64).

    Python's own signal handlers run between bytecodes, and a fault inside
    numpy's or the parser's C code would be retried forever; this handler
    is called by the C library directly (ctypes), prints the line, removes
    the temporary outputs and leaves with os._exit(3).
    """
    global _faults_caught, _handler, _ctypes
    if _faults_caught or not sys.platform.startswith("linux") or os.uname().machine not in ("x86_64", "aarch64"):
        return
    try:
        import ctypes  # ctypes loads only when a guard or a fault handler is set up (start-up)

        _ctypes = ctypes

        class SigAction(ctypes.Structure):  # glibc's and musl's struct sigaction on these processors
            _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ubyte * 128), ("flags", ctypes.c_int),
                        ("restorer", ctypes.c_void_p)]

        handler_type = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
        _handler = handler_type(_on_fault)
        action = SigAction()
        action.handler = ctypes.cast(_handler, ctypes.c_void_p)
        action.flags = 4  # SA_SIGINFO
        if _libc().sigaction(signal.SIGBUS, ctypes.byref(action), None) != 0:
            return
    except Exception:  # noqa: BLE001 - no handler: unleased inputs are copied instead
        return
    _faults_caught = True


def _on_fault(signum, info, context) -> None:
    try:
        address = _ctypes.cast(info, _ctypes.POINTER(_ctypes.c_void_p))[2] or 0  # siginfo_t's si_addr (64-bit)
        line = next((text for start, end, text in list(_spans.values()) if start <= address < end), _UNKNOWN_FAULT)
        with contextlib.suppress(OSError):
            os.write(2, line)
        for tmp in list(TEMPORARIES):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    finally:
        os._exit(ExitCode.INPUT)  # never back to the faulting instruction


_UNKNOWN_FAULT = (b"blobtool: an input changed while it was read: it ended before a byte read through its memory map "
                  b"(another process truncated it, or its storage failed)\n")


_ctypes = None


# What was handed out for writing of each mapping (SyncedMemory's
# mutable_cpu_data and a copy back from the GPU call note_written): those
# bytes may no longer be the file's, so they are never read from the file
# (file_behind) and their pages never dropped (release_pages), inside
# releasing() or not. The mapping is private (copy-on-write): a dropped page
# that was written would come back as the file's bytes.
_written: dict = {}  # id of a mapping -> {(first byte, end byte), ...} handed out for writing


def note_written(view) -> None:
    """Record that numpy array `view` may be written: if it views a mapped input, those bytes stop being the file's."""
    found = mapping_of(view) if view.size else None
    if found is not None:
        base, first = found
        _written.setdefault(id(base), set()).add((first, first + view.nbytes))


def unwritten(base, first: int, last: int) -> bool:
    return not any(start < last and first < end for start, end in _written.get(id(base), ()))


def mapping_of(view):
    """(the mmap that numpy array `view` looks into, the view's offset in it), or None."""
    import numpy as np  # not at start-up: the command line imports this module before numpy's settings

    base = view
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    if not isinstance(base, mmap.mmap):
        return None
    origin = np.frombuffer(base, dtype=np.uint8, count=1).ctypes.data if len(base) else view.ctypes.data
    return base, view.ctypes.data - origin


def name_of(fd: int) -> str | None:
    return next((name for reader, name in list(MAPPINGS.values()) if reader == fd), None)
