"""The mapped inputs of the process, and what guards them: leases, watches for writers, and SIGBUS.

Every input blobtool maps is registered in INPUTS (its reader descriptor,
its name, what of it was handed out for writing), so that the pages of a
mapping, the readers of its file and the command line's guard all know
it. Inside ``with guarded() as guard:`` (the command line, for each
command's run and in each worker process's) each mapped file is leased,
so that a writer that truncates it cannot kill the reader with SIGBUS, and
watched for writes, with SIGBUS caught: a lease that an open for writing
breaks (a touch's too) is given up and the watch alone goes on; where no
lease can be had, the watch is all (see Guard.look_at_leases and watch).
A library user who opens no guard maps inputs unleased and unwatched.

State: the module's one mutable global is INPUTS, an Inputs object that
is never rebound. Its `guard` is the Guard of the open with block, or
None; guarded() sets it and puts back None when the block ends. The
signal handlers (SIGIO, and SIGBUS, called by the C library through
ctypes) run in the main thread and find the state there: they cannot be
handed it.
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

from ..engine import work
from ..errors import ExitCode, Stopped

__all__ = ["Inputs", "Guard", "INPUTS", "guarded", "guarding", "note_written", "WRITTEN"]


WRITTEN = "changed while it was read: another process wrote to it or truncated it"


CUT_UNDER_MAP = ("changed while it was read: it ended before a byte read through its memory map (another process "
                  "truncated it, or its storage failed)")


_UNKNOWN_FAULT = (b"blobtool: an input changed while it was read: it ended before a byte read through its memory map "
                  b"(another process truncated it, or its storage failed)\n")


_IN_MODIFY = 0x2


class Inputs:
    """The mapped inputs of the process (guarded or not).

    mappings: id of a mapping -> (a descriptor of its file of its own, the input's name).
    written: id of a mapping -> {(first byte, end byte), ...} handed out for writing (note_written).
    temporaries: the temporary outputs being written (removed before a SIGBUS exit).
    guard: the Guard of the open ``with guarded():`` block, or None (inputs unguarded).
    """

    def __init__(self):
        self.mappings: dict = {}
        self.written: dict = {}
        self.temporaries: set = set()
        self.guard: Guard | None = None


INPUTS = Inputs()


class Guard:
    """What guards the mapped inputs while a command runs: leases, inotify watches, the SIGIO and SIGBUS handlers.

    signalled: a watched input's change was reported by SIGIO, or the command reports its end: no more Stopped.
    leases: a descriptor holding a lease -> (the input's name, whether a watch takes over when it breaks).
    handling: lease_broken is running; again: SIGIO came while it ran.
    watched: a reader descriptor of a mapped input -> (name, identity at open, inotify watch or None).
    watches: inotify watch -> [name, how many mapped inputs use it].
    inotify: the guard's inotify descriptor (None: not made yet; -1: none to be had).
    changes: names of watched inputs that changed (found by any thread).
    told: inputs already reported bad, whose changes are not reported again (take_change).
    raised: inputs whose change check_inputs or a read raised: SIGIO stops nothing more for them.
    deferred: the line of a stop SIGIO found where it could not be raised (see _cannot_raise_here), or
        None: check_inputs (before an output is committed) and the command's end raise it.
    faults_caught: the SIGBUS handler is installed (a truncation under a mapping ends the command with exit 3).
    spans: id of a mapping -> (first address, end address, the line the SIGBUS handler prints).
    handler: the C-callable SIGBUS handler, kept alive while installed; ctypes: the module, for it.
    What guarded() puts back when the block ends: previous_sigio, previous_sigbus (a struct sigaction).
    """

    def __init__(self):
        self.signalled = False
        self.leases: dict = {}
        self.handling = False
        self.again = False
        self.watched: dict = {}
        self.watches: dict = {}
        self.inotify = None
        self.changes: list = []
        self.told: set = set()
        self.raised: set = set()
        self.deferred: str | None = None
        self.faults_caught = False
        self.spans: dict = {}
        self.handler = None
        self.ctypes = None
        self.previous_sigio = None
        self.previous_sigbus = None

    # -- SIGIO: a broken lease, an inotify event ---------------------------

    def lease_broken(self, signum, frame) -> None:
        if self.handling:
            # Python runs a handler between any two bytecodes, this one's own too: a writer that
            # keeps writing would nest handlers until RecursionError. The running one looks again.
            self.again = True
            return
        self.handling = True
        try:
            self.again = True
            while self.again:
                self.again = False
                self.look_at_inputs(frame)
        finally:
            self.handling = False

    def look_at_inputs(self, frame) -> None:
        if self.signalled or frame is not None and frame.f_code is _on_fault.__code__:
            return  # stopping already (or inside the SIGBUS handler, which stops the command with this news)
        changed = self.changed_watched()
        if changed and changed in self.raised:
            return  # check_inputs raised this change already: that error is on its way (a second would break it)
        if changed:
            if _cannot_raise_here(frame):
                # The change stays recorded (changes): the next read of values, the commit of an output
                # or the command's end (pending_change) reports it. Signalling again from here would
                # only come back here.
                return
            self.signalled = True  # one stop, however many writes come (read_mapped and commits still check)
            raise Stopped(f"{changed}: {WRITTEN}", ExitCode.INPUT)
        self.look_at_leases(frame)

    def hold_lease(self, fd: int, name: str, watched: bool) -> None:
        self.leases[fd] = (name, watched)
        if not self.signalled:
            self.look_at_leases()

    def look_at_leases(self, frame=None) -> None:
        """Give up each broken lease that a watch takes over from; raise Stopped for one that none does.

        A lease breaks when another process opens the file for writing or
        truncates it, whether or not it then writes: GNU touch opens the file
        for writing and only sets its times. The kernel holds the breaker back
        until the lease is given up (at most /proc/sys/fs/lease-break-time).
        Given up at once, the breaker goes ahead, and a real change (a write,
        a truncation) is told by the watch (IN_MODIFY, the size, the inode).
        Without a watch, or where SIGBUS cannot be caught, the read stops:
        at once, or, where SIGIO came in code that cannot take an exception
        (`frame`, see _cannot_raise_here), at the next check (deferred).
        """
        for fd, (name, watched) in list(self.leases.items()):
            try:
                breaking = fcntl.fcntl(fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK
            except OSError:
                continue
            if not breaking:
                continue
            if watched:
                self.leases.pop(fd, None)  # the descriptor stays open until the mapping goes (unwatch closes it)
                with contextlib.suppress(OSError):
                    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
                continue
            line = f"{name}: changed while it was read: another process opened it for writing or truncated it"
            if frame is not None and _cannot_raise_here(frame):
                for held in self.leases:  # the writer goes ahead; the stop is told at the next check
                    with contextlib.suppress(OSError):
                        fcntl.fcntl(held, fcntl.F_SETLEASE, fcntl.F_UNLCK)
                self.leases.clear()
                self.deferred = self.deferred or line
                return
            self.leases.clear()  # one stop, however many writers come
            raise Stopped(line, ExitCode.INPUT)

    # -- watches ------------------------------------------------------------

    def watch(self, fd: int, name: str, mapped, st: os.stat_result):
        reader = INPUTS.mappings.get(id(mapped), (None,))[0]
        self.told.discard(name)  # opened again: its changes count again
        wd = self.add_watch(fd, name)
        if reader is not None:
            self.watched[reader] = (name, identity_of(st), wd)
        weakref.finalize(mapped, self.stop_watching, reader, wd)
        return wd

    def add_watch(self, fd: int, name: str):
        if self.inotify is None:
            self.inotify = -1
            with contextlib.suppress(Exception):
                libc = _libc()
                made = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
                if made >= 0:
                    # SIGIO when an event arrives, as for a broken lease.
                    fcntl.fcntl(made, fcntl.F_SETOWN, os.getpid())
                    fcntl.fcntl(made, fcntl.F_SETFL, fcntl.fcntl(made, fcntl.F_GETFL) | os.O_ASYNC | os.O_NONBLOCK)
                    self.inotify = made
        if self.inotify < 0:
            return None
        try:
            wd = _libc().inotify_add_watch(self.inotify, f"/proc/self/fd/{fd}".encode(), _IN_MODIFY)
        except Exception:  # noqa: BLE001 - a missing inotify leaves the size and inode checks
            return None
        if wd < 0:
            return None
        self.watches.setdefault(wd, [name, 0])[1] += 1
        return wd

    def record_changes(self) -> None:
        with contextlib.suppress(OSError):
            self.changed_watched()

    def stop_watching(self, reader, wd) -> None:
        self.record_changes()  # the events of this input that are still queued
        if reader is not None:
            self.watched.pop(reader, None)
        if wd is not None and wd in self.watches:
            self.watches[wd][1] -= 1
            if self.watches[wd][1] == 0:
                del self.watches[wd]
                with contextlib.suppress(Exception):
                    _libc().inotify_rm_watch(self.inotify, wd)

    def changed_watched(self) -> str | None:
        """The name of a watched input that another process wrote to or truncated since it was opened, or None."""
        if self.inotify is not None and self.inotify >= 0 and self.watches:
            while True:
                try:
                    events = os.read(self.inotify, 65536)
                except OSError:  # EAGAIN: none pending
                    break
                pos = 0
                while pos + 16 <= len(events):
                    wd, mask, _, length = struct.unpack_from("iIII", events, pos)
                    pos += 16 + length
                    if mask & _IN_MODIFY and wd in self.watches:
                        self.note_change(self.watches[wd][0])
        for reader, (name, identity, _) in list(self.watched.items()):
            with contextlib.suppress(OSError):
                if identity_of(os.fstat(reader)) != identity:
                    self.note_change(name)
        return self.changes[0] if self.changes else None

    def note_change(self, name: str) -> None:
        if name not in self.changes and name not in self.told:
            self.changes.append(name)

    # -- SIGBUS -------------------------------------------------------------

    def catch_faults(self) -> None:
        """Install the SIGBUS handler that ends the command with exit 3 and one line (Linux, x86-64 and ARM64).

        Python's own signal handlers run between bytecodes, and a fault inside
        numpy's or the parser's C code would be retried forever; this handler
        is called by the C library directly (ctypes), prints the line, removes
        the temporary outputs and leaves with os._exit(3). The action it
        replaces is kept, to be put back when the guard ends.
        """
        if not sys.platform.startswith("linux") or os.uname().machine not in ("x86_64", "aarch64"):
            return
        try:
            import ctypes  # ctypes loads only when a guard or a fault handler is set up (start-up)

            self.ctypes = ctypes

            class SigAction(ctypes.Structure):  # glibc's and musl's struct sigaction on these processors
                _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ubyte * 128), ("flags", ctypes.c_int),
                            ("restorer", ctypes.c_void_p)]

            handler_type = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
            self.handler = handler_type(_on_fault)
            action, previous = SigAction(), SigAction()
            action.handler = ctypes.cast(self.handler, ctypes.c_void_p)
            action.flags = 4  # SA_SIGINFO
            if _libc().sigaction(signal.SIGBUS, ctypes.byref(action), ctypes.byref(previous)) != 0:
                return
        except Exception:  # noqa: BLE001 - no handler: unleased inputs are copied instead
            return
        self.previous_sigbus = previous
        self.faults_caught = True

    def map_span(self, mapped, name: str) -> None:
        if not len(mapped):
            return
        start = self.ctypes.addressof(self.ctypes.c_char.from_buffer(mapped))
        shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)
        line = f"blobtool: {shown}: {CUT_UNDER_MAP}\n"
        self.spans[id(mapped)] = (start, start + len(mapped), line.encode("utf-8", "backslashreplace"))

    # -- the with block -----------------------------------------------------

    def start(self) -> None:
        """Take SIGIO and SIGBUS (main thread)."""
        self.previous_sigio = signal.signal(signal.SIGIO, self.lease_broken)
        # Python puts SIGIO's handler back to the default (which kills) as it shuts down, while leases
        # and the inotify descriptor may still send it: a writer then would end blobtool by signal 29.
        atexit.register(_ignore_sigio)
        self.catch_faults()

    def stop(self) -> None:
        """Give up the leases and the watches, and put the signal handlers back as far as it is safe.

        SIGIO's previous handler comes back, except the default (which
        kills): a lease broken or an event queued as the block ends may still
        be on its way, so SIGIO stays ignored then. SIGBUS's previous action
        comes back: a mapping that outlives the block is unguarded, as a
        library user's is.
        """
        self.signalled = True  # no stop from a writer from here on
        for fd in list(self.leases):
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        self.leases.clear()
        if self.inotify is not None and self.inotify >= 0:
            _close_aside(self.inotify)
        self.inotify = -1
        self.watches.clear()
        self.watched.clear()
        if self.faults_caught:
            with contextlib.suppress(Exception):
                _libc().sigaction(signal.SIGBUS, self.ctypes.byref(self.previous_sigbus), None)
            self.faults_caught = False
        self.spans.clear()
        previous = self.previous_sigio
        if previous in (None, signal.SIG_DFL):
            previous = signal.SIG_IGN
        signal.signal(signal.SIGIO, previous)
        atexit.unregister(_ignore_sigio)


@contextlib.contextmanager
def guarded():
    """Within this with block mapped inputs are leased and watched, and SIGBUS caught (the command line; main thread).

    Yields the Guard (None where leases or SIGIO are not to be had: the
    inputs are then unguarded, as outside the block). A block inside an
    open one yields that one and changes nothing. Leaving it gives the
    leases and watches up and puts the signal handlers back (Guard.stop
    says what stays).
    """
    if INPUTS.guard is not None:
        yield INPUTS.guard
        return
    if not hasattr(fcntl, "F_SETLEASE") or not hasattr(signal, "SIGIO"):
        yield None
        return
    guard = Guard()
    guard.start()
    INPUTS.guard = guard
    try:
        yield guard
    finally:
        INPUTS.guard = None
        guard.stop()


def _close_aside(fd: int) -> None:
    """Close an inotify descriptor aside: its release waits for a kernel grace period (14 ms of info's 157)."""
    import threading
    threading.Thread(target=_close_quietly, args=(fd,), name="blobtool-inotify-close", daemon=True).start()


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _ignore_sigio() -> None:
    signal.signal(signal.SIGIO, signal.SIG_IGN)


def guarding() -> bool:
    """Whether mapped inputs are leased (inside guarded())."""
    return INPUTS.guard is not None


def faults_caught() -> bool:
    """Whether the SIGBUS handler is installed (a truncation under a mapping then ends the command with exit 3)."""
    return INPUTS.guard is not None and INPUTS.guard.faults_caught


def register(mapped, reader: int | None, name: str) -> None:
    """Register a new mapping of the input `name` (`reader`: a descriptor of its own, or None)."""
    if reader is not None:
        INPUTS.mappings[id(mapped)] = (reader, name)
    weakref.finalize(mapped, forget, id(mapped), reader)
    guard = INPUTS.guard
    if guard is not None and guard.faults_caught:
        guard.map_span(mapped, name)  # for the SIGBUS handler's line


def forget(key: int, fd: int | None) -> None:
    INPUTS.written.pop(key, None)
    guard = INPUTS.guard
    if guard is not None:
        guard.spans.pop(key, None)
    if fd is None:
        return
    if guard is not None and fd in guard.watched:
        guard.record_changes()  # before its descriptor goes: a change found now is reported at the command's end
        guard.watched.pop(fd, None)
    INPUTS.mappings.pop(key, None)
    _close_quietly(fd)


def identity_of(st: os.stat_result) -> tuple:
    # Not the times: `touch` changes them and not the bytes (see "watching" below).
    return st.st_dev, st.st_ino, st.st_size


def take_lease(fd: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError:
        return False
    return True


def hold_lease(fd: int, name: str, watched: bool) -> None:
    """Keep the read lease taken on `fd` (a descriptor of the input `name` of its own) while its mapping lives.

    `watched`: the input is also watched for writes (inotify, since its
    open) and SIGBUS is caught, so that a broken lease is given up and the
    read goes on (see Guard.look_at_leases). A lease broken before this call,
    whose SIGIO found nothing to look at, is looked at here.
    """
    INPUTS.guard.hold_lease(fd, name, watched)


def unwatch(fd: int) -> None:
    guard = INPUTS.guard
    if guard is not None:
        guard.leases.pop(fd, None)
    _close_quietly(fd)


def watch(fd: int, name: str, mapped, st: os.stat_result):
    """Watch the input open on `fd` (mapped as `mapped`) for as long as the mapping lives; its inotify watch, or None.

    An input that could not be leased, and a leased one, whose lease an
    open for writing may break: the watch then takes over from the lease.
    """
    return INPUTS.guard.watch(fd, name, mapped, st)


def watching(fd: int) -> bool:
    """Whether the reader descriptor `fd` of a mapped input is watched (its lease given up, or none had)."""
    guard = INPUTS.guard
    return guard is not None and fd in guard.watched


def _cannot_raise_here(frame) -> bool:
    """Whether a signal handler called in `frame` must not raise: the exception would be lost or do harm.

    Inside a weakref finalizer (at exit too) or a __del__ method, an
    exception is printed and dropped, and the command would go on; inside
    Python's import machinery (its module locks, and their weakref callback)
    an exception between two of its steps leaves a lock half taken
    ("release unlocked lock" when the import unwinds). The stop waits for
    the next check (check_inputs, pending_change) instead.
    """
    codes = (weakref.finalize.__call__.__code__, weakref.finalize._exitfunc.__code__)
    while frame is not None:
        code = frame.f_code
        if code in codes or code.co_name == "__del__" or code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _libc():
    import ctypes  # ctypes loads only when a guard or a fault handler is set up (start-up)

    return ctypes.CDLL(None, use_errno=True)


def _on_fault(signum, info, context) -> None:
    # Called by the C library (async-signal): reads the state, writes, unlinks, and never returns.
    try:
        guard = INPUTS.guard
        spans = list(guard.spans.values()) if guard is not None else []
        address = guard.ctypes.cast(info, guard.ctypes.POINTER(guard.ctypes.c_void_p))[2] or 0 if spans else 0
        line = next((text for start, end, text in spans if start <= address < end), _UNKNOWN_FAULT)
        with contextlib.suppress(OSError):
            os.write(2, line)
        for tmp in list(INPUTS.temporaries):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    finally:
        os._exit(ExitCode.INPUT)  # never back to the faulting instruction


# What was handed out for writing of each mapping (SyncedMemory's
# mutable_cpu_data and a copy back from the GPU call the Work's `written`
# hook, which is note_written): those bytes may no longer be the file's, so
# they are never read from the file (file_behind) and their pages never
# dropped (release_pages), inside releasing() or not. The mapping is
# private (copy-on-write): a dropped page that was written would come back
# as the file's bytes.


def note_written(view) -> None:
    """Record that numpy array `view` may be written: if it views a mapped input, those bytes stop being the file's."""
    found = mapping_of(view) if view.size else None
    if found is not None:
        base, first = found
        INPUTS.written.setdefault(id(base), set()).add((first, first + view.nbytes))


# Every call's Work tells note_written of the bytes it hands out for writing
# (blobtool.engine.work.set_written): registered with the first mapping's
# module, before any input can be mapped.
work.set_written(note_written)


def unwritten(base, first: int, last: int) -> bool:
    return not any(start < last and first < end for start, end in INPUTS.written.get(id(base), ()))


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
    return next((name for reader, name in list(INPUTS.mappings.values()) if reader == fd), None)
