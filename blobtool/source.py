"""Sources and outputs: opening inputs without copying them, releasing their pages, writing atomically.

Inputs are memory-mapped copy-on-write (``mmap.ACCESS_COPY``): the blob's
arrays view the file's pages directly, writes to them (scale, update) touch a
private copy of the touched pages only, and the file itself never changes.
Under guard_inputs() (the command line) each mapped file is also leased, so
that a writer that truncates it cannot kill the reader with SIGBUS, or,
where no lease can be had, watched for writes, with SIGBUS caught (see
"guarding" and "watching" below). Standard input, pipes and files the kernel reports as
empty (/proc) are read into memory once, at most stream_limit() bytes;
devices and folders are refused.

Outputs are written to a temporary file in the target's folder, flushed,
fsynced and renamed over the target, so a failed or interrupted write leaves
any earlier file as it was, and ``-o`` may name the input: the input stays
mapped from its old inode while the new file takes its name. A symbolic
link's target is replaced the same way; FIFOs, character devices, sockets
and open descriptors (/dev/stdout) are written in place.

Pages of a mapped input that a writer has streamed out can be handed back
to the kernel (``release_pages`` inside ``releasing()``), so converting a
file larger than memory keeps memory bounded. Inside the same block the
reading commands' kernels copy a mapped input's values from the file into
small buffers of their own (``file_behind``, ``read_mapped``) instead of
touching the mapping at all.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import mmap
import os
import re
import signal
import stat
import struct
import sys
import weakref

try:
    import fcntl
except ImportError:  # not on Windows: no leases there
    fcntl = None
try:
    import resource  # at start-up: with no descriptor left, the import itself would fail
except ImportError:  # not on Windows
    resource = None
from dataclasses import dataclass

from .errors import ExitCode, FormatError, OutputError, Stopped, UsageError

__all__ = ["Source", "open_source", "atomic_output", "writes_in_place", "display_name", "release_pages", "releasing",
           "file_behind", "read_mapped", "guard_inputs", "guarding", "stream_limit", "STDIO", "STREAM_LIMIT"]

STDIO = "-"

# What is read from a pipe or standard input at most: a stream has no size
# to check lengths against, and `cat /dev/zero |` never ends. Files have no
# such limit (their size is known before anything is read).
STREAM_LIMIT = 4 << 30
STREAM_LIMIT_VARIABLE = "BLOBTOOL_MAX_STREAM_BYTES"
_STREAM_CHUNK = 16 << 20


@dataclass
class Source:
    """An input's bytes: `buf` supports len(), indexing and the buffer protocol."""

    name: str
    buf: object
    size: int

    def close(self) -> None:
        # The mmap closes itself when the last array viewing it is gone.
        self.buf = None

    def will_read_through(self) -> None:
        """Say that the payloads are about to be read front to back (norm, compare, convert).

        Tells the kernel to read ahead in large windows (MADV_SEQUENTIAL):
        measured on a cold 256 MiB blob, norm went from 0.45 s to 0.23 s.
        Not done at open, so that info, which reads only headers, does not
        pull payload pages in.
        """
        if isinstance(self.buf, mmap.mmap) and hasattr(mmap, "MADV_SEQUENTIAL"):
            try:
                self.buf.madvise(mmap.MADV_SEQUENTIAL)
            except OSError:
                pass  # only a hint


def display_name(src) -> str:
    if src == STDIO:
        return "<stdin>"
    if isinstance(src, (str, os.PathLike)):
        return os.fspath(src)
    return getattr(src, "name", None) if isinstance(getattr(src, "name", None), str) else "<stream>"


def open_source(src) -> Source:
    """Open a path, "-" (standard input) or a binary file object for reading.

    Regular files are memory-mapped copy-on-write (when inputs are guarded,
    leased, or watched where no lease can be had: see guard_inputs);
    pipes, sockets and files the kernel reports as empty (/proc) are read
    once into a bytearray (writable, so adopted arrays can be scaled in
    place), at most stream_limit() bytes. Devices and folders are refused.
    """
    name = display_name(src)
    if src == STDIO:
        if sys.stdin is None:
            raise FormatError("cannot read: standard input is closed", path=name)
        src = sys.stdin.buffer  # `< file.pb` is mapped like the file itself
    if isinstance(src, (str, os.PathLike)):
        try:
            fd = os.open(os.fspath(src), os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except OSError as exc:
            raise FormatError(cannot("open", exc), path=name) from exc
        try:
            return _open_fd(fd, name)
        finally:
            os.close(fd)
    if hasattr(src, "read"):
        try:
            fd = src.fileno()
            st = os.fstat(fd)
        except (AttributeError, OSError, io.UnsupportedOperation):
            fd = None
        if fd is not None:
            _refuse_device(st, name)
            if stat.S_ISREG(st.st_mode) and src.seekable() and src.tell() == 0:
                return _open_fd(fd, name)
        return _read_stream(src, name)
    raise UsageError(f"expected a path, '-' or a binary file object, got {type(src).__name__}")


def cannot(verb: str, exc: OSError) -> str:
    """'cannot VERB: <the OS's reason>', naming the limit that was reached when it is a resource.

    Too many open files and a mapping refused for memory are the process's
    environment, not the file (ulimit -n, ulimit -v); the message says which
    limit, so that the line alone tells what to change.
    """
    import errno

    reason = exc.strerror or str(exc)
    limit = {errno.EMFILE: ("RLIMIT_NOFILE", "open files", "ulimit -n", 1),
             errno.ENOMEM: ("RLIMIT_AS", "address space", "ulimit -v", 1024)}.get(exc.errno)
    try:
        soft = resource.getrlimit(getattr(resource, limit[0]))[0] if limit and resource else None
    except (AttributeError, OSError, ValueError):
        soft = None
    if soft is not None and soft != resource.RLIM_INFINITY:
        _, what, command, unit = limit
        reason += f" (this process's limit on {what}, {command}, is {soft // unit}{' KiB' if unit > 1 else ''})"
    elif exc.errno == errno.ENFILE:
        reason += " (the system's limit on open files)"
    return f"cannot {verb}: {reason}"


def _refuse_device(st: os.stat_result, name: str) -> None:
    # A device has no size to check lengths against, and /dev/zero never
    # ends; /dev/null, the conventional nothing, reads as an empty stream.
    if stat.S_ISDIR(st.st_mode):
        raise FormatError("is a directory", path=name)
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        with contextlib.suppress(OSError):
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.stat(os.devnull).st_rdev:
                return
        what = "character" if stat.S_ISCHR(st.st_mode) else "block"
        raise FormatError(f"is a {what} device, not a file or a pipe", path=name)


def _open_fd(fd: int, name: str) -> Source:
    """Map or read the file open on `fd`; any OS error on the way (EMFILE, ENOMEM, EIO) is exit 3, one line."""
    try:
        return _open_file(fd, name)
    except OSError as exc:
        raise FormatError(cannot("open", exc), path=name) from exc


def _open_file(fd: int, name: str) -> Source:
    st = os.fstat(fd)
    _refuse_device(st, name)
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        # A pipe, a socket, or a file whose size the kernel does not know (/proc/self/status).
        with os.fdopen(os.dup(fd), "rb") as stream:
            return _read_stream(stream, name)
    if not _guarded:
        return _map(fd, name, st.st_size)
    if not _lease(fd):
        if not _faults_caught:  # nothing would turn a truncation under the mapping into exit 3
            return _read_file(fd, name)
        source = _map(fd, name, st.st_size)
        _watch(fd, name, source.buf, st)
        return source
    st = os.fstat(fd)  # as it is now that no writer can come unnoticed
    if st.st_size == 0:
        return _read_file(fd, name)
    source = _map(fd, name, st.st_size)
    watched = os.dup(fd)
    _leases[watched] = name
    weakref.finalize(source.buf, _unwatch, watched)
    return source


def _map(fd: int, name: str, size: int) -> Source:
    try:
        mapped = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    except OSError as exc:
        raise FormatError(cannot("map the file", exc), path=name) from exc
    except ValueError as exc:
        # `size` is what fstat said of this descriptor: mmap's own fstat found fewer bytes since. The
        # file was cut short in between (it cannot be leased), and may have grown back already.
        now = os.fstat(fd).st_size
        raise FormatError(f"changed while it was read: {size} bytes when it was opened, "
                          f"{now if now < size else 'fewer'} when it was mapped", path=name) from exc
    if hasattr(os, "preadv"):
        # A descriptor of its own, so that read_mapped() can read the file's
        # bytes for as long as arrays view the mapping.
        reader = os.dup(fd)
        _mapped[id(mapped)] = (reader, name)
        weakref.finalize(mapped, _forget, id(mapped), reader)
    if _faults_caught:
        _map_span(mapped, name)  # for the SIGBUS handler's line
    return Source(name, mapped, size)


_mapped: dict = {}  # id of a mapping -> (a descriptor of its file, the input's name)


def _forget(key: int, fd: int) -> None:
    if fd in _watched:
        _record_changes()  # before its descriptor goes: a change found now is reported at the command's end
        _watched.pop(fd, None)
    _mapped.pop(key, None)
    _spans.pop(key, None)
    with contextlib.suppress(OSError):
        os.close(fd)


def _read_file(fd: int, name: str) -> Source:
    """A regular file copied into memory, refused if it changed while it was read.

    Only where a file can be neither leased nor watched safely: a leased
    file the kernel reports as empty, or a system where blobtool cannot
    catch SIGBUS (not Linux on x86-64 or ARM64).
    """
    before = os.fstat(fd)
    data = bytearray(before.st_size)
    view = memoryview(data)
    done = 0
    try:
        while done < len(data):
            n = os.preadv(fd, [view[done:]], done)
            if n == 0:
                raise FormatError(f"shrank while it was read: {before.st_size} bytes at first, "
                                  f"{done} by the end", path=name)
            done += n
        after = os.fstat(fd)
    except OSError as exc:
        raise FormatError(f"cannot read: {exc.strerror}", path=name) from exc
    if _identity(after) != _identity(before):
        raise FormatError("changed while it was read", path=name)
    return Source(name, data, len(data))


def _identity(st: os.stat_result) -> tuple:
    # Not the times: `touch` changes them and not the bytes (see "watching" below).
    return st.st_dev, st.st_ino, st.st_size


def stream_limit() -> int:
    """The most bytes read from a pipe or standard input: STREAM_LIMIT, or $BLOBTOOL_MAX_STREAM_BYTES."""
    text = os.environ.get(STREAM_LIMIT_VARIABLE, "").strip()
    if not text:
        return STREAM_LIMIT
    try:
        limit = int(text)
    except ValueError:
        limit = -1
    if limit < 0:
        raise UsageError(f"{STREAM_LIMIT_VARIABLE}={text!r}: expected a number of bytes")
    return limit


def _read_stream(stream, name: str) -> Source:
    limit = stream_limit()
    data = bytearray()
    try:
        while len(data) <= limit:
            chunk = stream.read(min(_STREAM_CHUNK, limit + 1 - len(data)))
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        raise FormatError(f"cannot read: {exc.strerror or exc}", path=name) from exc
    if len(data) > limit:
        raise FormatError(f"more than {limit} bytes from a stream (blobtool's limit, "
                          f"{STREAM_LIMIT_VARIABLE} changes it; a file has no limit)", path=name)
    return Source(name, data, len(data))


# -- guarding mapped inputs against writers -----------------------------------
#
# A mapped file that another process truncates kills the reader with SIGBUS
# when it touches a page past the new end. The command line therefore takes
# a read lease on each file it maps (fcntl F_SETLEASE): the kernel then holds
# back any other open for writing or truncate, for up to
# /proc/sys/fs/lease-break-time seconds, and tells blobtool with SIGIO; the
# handler raises errors.Stopped ("changed while it was read", exit 3: like
# a signal, no reader's try-and-fall-back can swallow it), the command exits
# after removing its temporary output, and the lease goes with the mapping
# at exit. A file that cannot be leased (another user's file without
# CAP_LEASE, a file already open for writing, a file system without leases)
# is mapped all the same and watched instead: see "watching" below.

_guarded = False
_signalled = False  # a watched input's change was reported by SIGIO
_leases: dict = {}  # watched fd -> the input's name


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


def _lease(fd: int) -> bool:
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


def _unwatch(fd: int) -> None:
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
    if changed:
        if _in_finalizer(frame):
            # An exception raised in a finalizer is printed and dropped. The change stays recorded
            # (_changes): the next read of values, the commit of an output or the command's end
            # (pending_change) reports it. Signalling again from here would only come back here.
            return
        _signalled = True  # one stop, however many writes come (read_mapped and commits still check)
        raise Stopped(f"{changed}: {WRITTEN}", ExitCode.INPUT)
    for fd, name in list(_leases.items()):
        try:
            breaking = fcntl.fcntl(fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK
        except OSError:
            continue
        if breaking:
            _leases.clear()  # one stop, however many writers come
            raise Stopped(f"{name}: changed while it was read: another process opened it for writing "
                          "or truncated it", ExitCode.INPUT)


# -- watching mapped inputs that cannot be leased ------------------------------
#
# Without a lease nothing holds a writer back, so the file is mapped as
# usual (no copy: memory stays what it is with a lease) and three things
# stand in for the lease:
#
# - inotify (Linux) reports every write and truncate of the file
#   (IN_MODIFY), by any process, and tells blobtool with SIGIO as a broken
#   lease does: the command stops with exit 3. Timestamps (`touch`,
#   IN_ATTRIB) are not watched: they change no byte. The reads of values
#   from the file (read_mapped) and the commit of an output also look for
#   such events themselves, and compare the file's size and inode with what
#   they were when it was opened.
# - The values are read from the file with preadv (read_mapped), where a
#   file that came to an end early is a short read, never a signal.
# - What still goes through the mapping (headers, small arrays, the values
#   a writer copies out) would die of SIGBUS at a page past a new end. A
#   SIGBUS handler (_catch_faults) turns that into the same one line and
#   exit 3, after removing the temporary outputs; it does not return to the
#   faulting code, which cannot go on.
#
# Limits: a write through another process's shared mapping of the file, or
# by another machine on a network file system, raises no inotify event; a
# write of the same length then goes unseen, as it would by any reader that
# does not lock. Where inotify is missing or its limits are reached, only the
# size and inode are compared. Where the SIGBUS handler cannot be installed
# (other systems or processors), the file is copied into memory as before.

WRITTEN = "changed while it was read: another process wrote to it or truncated it"
_CUT_UNDER_MAP = ("changed while it was read: it ended before a byte read through its memory map (another process "
                  "truncated it, or its storage failed)")
_watched: dict = {}  # a reader descriptor of a mapped input -> (name, identity at open, inotify watch or None)
_watches: dict = {}  # inotify watch -> [name, how many mapped inputs use it]
_inotify = None  # the process's inotify descriptor (None: not made yet; -1: none to be had)
_changes: list = []  # names of watched inputs that changed (found by any thread)
_told: set = set()  # inputs already reported bad, whose changes are not reported again (take_change)
_IN_MODIFY = 0x2


def _watch(fd: int, name: str, mapped, st: os.stat_result) -> None:
    """Watch the unleased input open on `fd` (mapped as `mapped`) for as long as the mapping lives."""
    reader = _mapped.get(id(mapped), (None,))[0]
    _told.discard(name)  # opened again: its changes count again
    wd = _add_watch(fd, name)
    if reader is not None:
        _watched[reader] = (name, _identity(st), wd)
    weakref.finalize(mapped, _stop_watching, reader, wd)


def _libc():
    import ctypes

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
        _watched.pop(reader, None)
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
    for reader, (name, identity, _) in list(_watched.items()):
        with contextlib.suppress(OSError):
            if _identity(os.fstat(reader)) != identity:
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
    for fd, leased in list(_leases.items()):
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
        raise FormatError(WRITTEN, path=changed)


# -- SIGBUS: a page of a mapped input that is no longer there -------------------

_faults_caught = False
_spans: dict = {}  # id of a mapping -> (first address, end address, the line to print)
_temporaries: set = set()  # temporary outputs being written (removed before a SIGBUS exit)
_handler = None  # the C-callable handler, kept alive


def _map_span(mapped, name: str) -> None:
    import ctypes

    if not len(mapped):
        return
    start = ctypes.addressof(ctypes.c_char.from_buffer(mapped))
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)
    line = f"blobtool: {shown}: {_CUT_UNDER_MAP}\n"
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
        import ctypes

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
        for tmp in list(_temporaries):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    finally:
        os._exit(ExitCode.INPUT)  # never back to the faulting instruction


_UNKNOWN_FAULT = (b"blobtool: an input changed while it was read: it ended before a byte read through its memory map "
                  b"(another process truncated it, or its storage failed)\n")
_ctypes = None


@contextlib.contextmanager
def atomic_output(dest):
    """Yield a binary file object whose contents replace `dest` only on success.

    `dest` is a path, "-" (standard output) or a binary file object (written
    directly). A regular file or a new path: a temporary file beside the
    target, fsync, rename, and fsync of the folder; on any failure the
    temporary file is removed and the target is left as it was. A symbolic
    link: the same for the file it points to, and the link stays. A FIFO, a
    character device, a socket, or one of this process's open files
    (/dev/stdout, /proc/self/fd/N): written directly, in order. OS errors
    become OutputError (exit 5).
    """
    if dest == STDIO:
        if sys.stdout is None:
            raise OutputError("cannot write: standard output is closed", path="<stdout>")
        with _direct(sys.stdout.buffer, "<stdout>") as out:
            yield out
        return
    if not isinstance(dest, (str, os.PathLike)):
        yield dest
        return
    name = os.fspath(dest)
    path, direct = _resolve_output(name)
    if direct:
        with _open_direct(path, name) as stream, _direct(stream, name) as out:
            yield out
        return
    import tempfile  # not at start-up: only writers need it

    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=folder)
    except OSError as exc:
        raise OutputError(cannot(f"create a file in {folder}", exc), path=name) from exc
    _temporaries.add(tmp)
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        _copy_mode(path, tmp)
        check_inputs()
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            _input_fault(exc)
            raise OutputError(cannot("write", exc), path=name) from exc
        raise
    finally:
        _temporaries.discard(tmp)
    with contextlib.suppress(OSError):
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def writes_in_place(dest) -> bool:
    """Whether atomic_output(dest) writes straight into what it is given, so that bytes written before a failure stay.

    True for standard output, a binary file object, and a path that is
    written in place (a FIFO, a device, a socket, /dev/stdout); False for a
    regular or new file, which is replaced only on success, and for a path
    that atomic_output will refuse (it says why when it is reached).
    """
    if dest == STDIO or not isinstance(dest, (str, os.PathLike)):
        return True
    try:
        return _resolve_output(os.fspath(dest))[1]
    except (OSError, OutputError, UsageError):
        return False


@contextlib.contextmanager
def _direct(out, name: str):
    try:
        yield out
        out.flush()
    except BrokenPipeError:
        raise  # the reader went away: the command line stops quietly
    except OSError as exc:
        _input_fault(exc)
        raise OutputError(f"cannot write: {exc.strerror or exc}", path=name) from exc


def _input_fault(exc: OSError) -> None:
    """Raise FormatError (exit 3) when a failed write failed for its input: bytes gone from under the mapping.

    A write(2) of bytes from a mapped input whose file was cut short since
    is EFAULT ("Bad address") where touching them would be SIGBUS.
    """
    import errno

    if exc.errno == errno.EFAULT:
        check_inputs()
        name = next((name for _, name in list(_mapped.values())), None)
        if name is not None:
            raise FormatError(_CUT_UNDER_MAP, path=name) from exc


# Temporary names stay within NAME_MAX (255 bytes on most file systems): the
# target's name is cut to leave room for the dots, the random part and ".tmp".
_TEMP_NAME_ROOM = 200
_MAX_LINKS = 40  # the kernel's own limit (ELOOP)
_PROC_FD = re.compile(r"^/proc/(?P<pid>\d+)/fd$")


def _temp_prefix(path: str) -> str:
    base = os.fsencode(os.path.basename(path))[:_TEMP_NAME_ROOM]
    return "." + os.fsdecode(base) + "."


def _resolve_output(path: str) -> tuple:
    """(the path to write, whether to write it in place instead of replacing it).

    Every symbolic link on the way (the last component and the folders
    before it) is followed here, one at a time, each only where the kernel's
    protected_symlinks rule would follow it (_check_protected), whatever the
    system's setting: what is then written is the file the links lead to.
    """
    # `resolved` is the path walked so far, with no link left in it.
    resolved, rest, links = os.sep, _parts(os.path.abspath(path)), 0
    while rest:
        part = rest.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            resolved = os.path.dirname(resolved)
            continue
        here = os.path.join(resolved, part)
        try:
            st = os.lstat(here)
        except OSError:  # a new file (a missing folder is reported when the file is made)
            return os.path.join(here, *rest), False
        if not stat.S_ISLNK(st.st_mode):
            resolved = here
            continue
        if _PROC_FD.match(resolved):
            return os.path.join(here, *rest), True  # an open file of a process (/dev/stdout): written through it
        links += 1
        if links > _MAX_LINKS:
            raise OutputError("too many levels of symbolic links", path=path)
        _check_protected(here, st, resolved, path)
        target = os.readlink(here)
        if os.path.isabs(target):
            resolved = os.sep
        rest = _parts(target) + rest
    st = os.lstat(resolved)
    if stat.S_ISREG(st.st_mode):
        return resolved, False
    if stat.S_ISDIR(st.st_mode):
        raise UsageError("is a directory", path=path)
    if stat.S_ISBLK(st.st_mode):
        raise UsageError("is a block device: blobtool writes files, FIFOs, character devices and sockets",
                         path=path)
    return resolved, True  # a FIFO, a character device or a socket


def _parts(path: str) -> list:
    return path.replace(os.altsep or os.sep, os.sep).split(os.sep)


def _check_protected(link: str, st: os.stat_result, folder: str, name: str) -> None:
    """Refuse to follow `link` (lstat `st`, in `folder`) where the kernel's protected_symlinks rule would.

    In a folder that is sticky and writable by everyone (/tmp, /var/tmp),
    anyone may plant a link, and only its owner or the folder's owner may
    remove it: following another user's link there would let that user
    choose which file blobtool replaces (as root: any file). Linux refuses
    such a follow when fs.protected_symlinks is 1 (most distributions set
    it); blobtool applies the same rule whatever the setting, and on every
    system: the link is followed only when it belongs to the user blobtool
    runs as (the effective uid) or to the folder's owner.
    """
    if not hasattr(os, "geteuid"):
        return
    try:
        where = os.stat(folder)
    except OSError:
        return
    mode = where.st_mode
    if not (mode & stat.S_ISVTX and mode & stat.S_IWOTH) or st.st_uid in (os.geteuid(), where.st_uid):
        return
    which = "a symbolic link" if os.path.abspath(name) == link else f"the symbolic link {link}"
    raise OutputError(f"cannot write: refusing to follow {which} owned by uid {st.st_uid} in the sticky "
                      f"world-writable folder {folder} (as the kernel's protected_symlinks rule)", path=name)


def _open_direct(path: str, name: str):
    """A binary stream onto a FIFO, device, socket or open file, written in place."""
    try:
        match = _PROC_FD.match(os.path.realpath(os.path.dirname(os.path.abspath(path))))
        if match and int(match["pid"]) == os.getpid():
            # This process's own descriptor: its offset and O_APPEND (`> f`, `>> f`) hold.
            fd = os.dup(int(os.path.basename(path)))
        elif stat.S_ISSOCK(os.stat(path).st_mode):
            return _connect(path)
        else:
            fd = os.open(path, os.O_WRONLY | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        raise OutputError(f"cannot open: {exc.strerror or exc}", path=name) from exc
    return os.fdopen(fd, "wb")


def _connect(path: str):
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        return sock.makefile("wb")
    finally:
        sock.close()  # the file object keeps the connection open


def _copy_mode(target: str, tmp: str) -> None:
    # mkstemp makes 0600 files; give the new file the old one's mode, or the
    # mode a plain open() would have given it.
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    os.chmod(tmp, mode)


# -- releasing the pages of a mapped input ------------------------------------

# Off unless a caller that will not use its blobs again turns it on (see
# releasing()): dropping a copy-on-write page that was changed in memory
# would bring back the file's bytes.
_release = False


@contextlib.contextmanager
def releasing():
    """Within this block, release_pages() really drops pages (the command line's writers use it)."""
    global _release
    previous, _release = _release, True
    try:
        yield
    finally:
        _release = previous


def release_pages(view) -> None:
    """Let the kernel drop the memory-mapped pages wholly inside `view` (after they were written out).

    Only inside releasing(), and only for views of a private (copy-on-write)
    file mapping, where dropped pages read back from the file if touched
    again; pages shared with bytes outside the view are kept. Anything else
    (bytes in memory, other arrays) is left alone.
    """
    found = _mapping_of(view) if _release and hasattr(mmap, "MADV_DONTNEED") else None
    if found is None or view.size == 0:
        return
    base, first = found
    last = first + view.nbytes
    page = mmap.PAGESIZE
    start = -(-first // page) * page
    stop = last // page * page
    if stop > start:
        base.madvise(mmap.MADV_DONTNEED, start, stop - start)


def _mapping_of(view):
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


# -- reading a mapped input's bytes from its file ------------------------------
#
# Inside releasing() the values of a mapped input are the file's bytes (what
# was changed in memory would be lost with its pages anyway), so a reader
# that goes through them once can copy them from the file into a small
# buffer of its own instead of touching the mapping: measured on 2 cores,
# 1 GiB of float32 summed from the mapping took 0.27-0.30 s, read with
# preadv into a 1 MiB buffer and summed there 0.13 s (4 KiB pages cost a
# fault and a TLB entry each; the buffer stays in cache), and there are no
# pages to release afterwards.

def file_behind(view):
    """(descriptor, offset) where the file holds the bytes of `view`, or None.

    Only inside releasing(), for a C-contiguous numpy array viewing a mapped
    input; read them with read_mapped().
    """
    if not _release or not view.flags.c_contiguous:
        return None
    found = _mapping_of(view)
    if found is None or id(found[0]) not in _mapped:
        return None
    return _mapped[id(found[0])][0], found[1]


def read_mapped(fd: int, offset: int, into) -> None:
    """Fill writable buffer `into` with the file's bytes from `offset` (a file_behind() pair).

    A file that came to an end before them changed while it was read (its
    lease keeps writers out, so only a file read without one): exit 3.
    """
    view = memoryview(into).cast("B")
    done = 0
    while done < len(view):
        try:
            n = os.preadv(fd, [view[done:]], offset + done)
        except OSError as exc:
            raise FormatError(f"cannot read: {exc.strerror or exc}", path=_name_of(fd)) from exc
        if n == 0:
            raise FormatError(f"changed while it was read: it ends at byte {offset + done}, before the "
                              f"{len(view)} bytes wanted from byte {offset}", path=_name_of(fd))
        done += n
    if fd in _watched:  # not leased: look for writers here too (about 2 us a read)
        check_inputs()


def _name_of(fd: int) -> str | None:
    return next((name for reader, name in list(_mapped.values()) if reader == fd), None)
