"""Sources and outputs: opening inputs without copying them, releasing their pages, writing atomically.

Inputs are memory-mapped copy-on-write (``mmap.ACCESS_COPY``): the blob's
arrays view the file's pages directly, writes to them (scale, update) touch a
private copy of the touched pages only, and the file itself never changes.
Under guard_inputs() (the command line) each mapped file is also leased, so
that a writer that truncates it cannot kill the reader with SIGBUS (see
"guarding" below). Standard input, pipes and files the kernel reports as
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

import contextlib
import io
import mmap
import os
import re
import signal
import stat
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

__all__ = ["Source", "open_source", "atomic_output", "display_name", "release_pages", "releasing", "file_behind",
           "read_mapped", "guard_inputs", "guarding", "stream_limit", "STDIO", "STREAM_LIMIT"]

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

    Regular files are memory-mapped copy-on-write (or, when inputs are
    guarded but the file cannot be leased, copied in and checked for changes);
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
        return _read_file(fd, name)
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
        raise FormatError(f"cannot map the file: {exc}", path=name) from exc
    if hasattr(os, "preadv"):
        # A descriptor of its own, so that read_mapped() can read the file's
        # bytes for as long as arrays view the mapping.
        reader = os.dup(fd)
        _mapped[id(mapped)] = (reader, name)
        weakref.finalize(mapped, _forget, id(mapped), reader)
    return Source(name, mapped, size)


_mapped: dict = {}  # id of a mapping -> (a descriptor of its file, the input's name)


def _forget(key: int, fd: int) -> None:
    _mapped.pop(key, None)
    with contextlib.suppress(OSError):
        os.close(fd)


def _read_file(fd: int, name: str) -> Source:
    """A regular file copied into memory, refused if it changed while it was read."""
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
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


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
# is copied into memory instead and refused if it changed meanwhile.

_guarded = False
_leases: dict = {}  # watched fd -> the input's name


def guard_inputs() -> None:
    """Lease mapped inputs from now on (the command line; call from the main thread)."""
    global _guarded
    if _guarded or not hasattr(fcntl, "F_SETLEASE") or not hasattr(signal, "SIGIO"):
        return
    signal.signal(signal.SIGIO, _lease_broken)
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


def _unwatch(fd: int) -> None:
    _leases.pop(fd, None)
    with contextlib.suppress(OSError):
        os.close(fd)


def _lease_broken(signum, frame) -> None:
    for fd, name in list(_leases.items()):
        try:
            breaking = fcntl.fcntl(fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK
        except OSError:
            continue
        if breaking:
            _leases.clear()  # one stop, however many writers come
            raise Stopped(f"{name}: changed while it was read: another process opened it for writing "
                          "or truncated it", ExitCode.INPUT)


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
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        _copy_mode(path, tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise OutputError(cannot("write", exc), path=name) from exc
        raise
    with contextlib.suppress(OSError):
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


@contextlib.contextmanager
def _direct(out, name: str):
    try:
        yield out
        out.flush()
    except BrokenPipeError:
        raise  # the reader went away: the command line stops quietly
    except OSError as exc:
        raise OutputError(f"cannot write: {exc.strerror or exc}", path=name) from exc


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


def _name_of(fd: int) -> str | None:
    return next((name for reader, name in list(_mapped.values()) if reader == fd), None)
