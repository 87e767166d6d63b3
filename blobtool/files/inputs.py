"""Opening inputs without copying them: a file is memory-mapped, a stream read once within a bound.

Inputs are memory-mapped copy-on-write (``mmap.ACCESS_COPY``): the blob's
arrays view the file's pages directly, writes to them (scale, update) touch a
private copy of the touched pages only, and the file itself never changes.
Standard input, pipes and files the kernel reports as empty (/proc) are read
into memory once, at most stream_limit() bytes; devices and folders are
refused. Each mapping is registered with blobtool.files.mapped, which
leases and watches it (or only watches it, where no lease can be had)
inside the command line's ``with guarded():`` block.
"""

from __future__ import annotations

import contextlib
import errno
import io
import mmap
import os
import stat
import sys
import weakref
from dataclasses import dataclass

try:
    import resource  # at start-up: with no descriptor left, the import itself would fail
except ImportError:  # not on Windows
    resource = None

from ..errors import FormatError, UsageError, env_count
from . import mapped as registry
from .mapped import hold_lease, identity_of, register, take_lease, unwatch, watch

__all__ = ["Source", "BufferFile", "open_source", "display_name", "cannot", "stream_limit", "STDIO", "STREAM_LIMIT",
           "STREAM_LIMIT_VARIABLE"]


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
    leased and watched, or only watched where no lease can be had: see
    guarded);
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
    if not registry.guarding():
        return _map(fd, name, st.st_size)
    if not take_lease(fd):
        if not registry.faults_caught():  # nothing would turn a truncation under the mapping into exit 3
            return _read_file(fd, name)
        source = _map(fd, name, st.st_size)
        watch(fd, name, source.buf, st)
        return source
    st = os.fstat(fd)  # as it is now that no writer can come unnoticed
    if st.st_size == 0:
        return _read_file(fd, name)
    source = _map(fd, name, st.st_size)
    # Watched too, from now on: an open for writing breaks the lease whether or not it writes (GNU
    # touch opens the file for writing, then sets its times), and the watch then tells whether the
    # bytes change. Without inotify, or where SIGBUS cannot be caught (a writer let in could fault
    # the mapping), a broken lease stops the read, as nothing could tell a touch from a write.
    watched = registry.faults_caught() and watch(fd, name, source.buf, st) is not None
    holder = os.dup(fd)
    weakref.finalize(source.buf, unwatch, holder)
    hold_lease(holder, name, watched)
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
    # A descriptor of its own, so that read_mapped() can read the file's
    # bytes for as long as arrays view the mapping.
    reader = os.dup(fd) if hasattr(os, "preadv") else None
    register(mapped, reader, name)
    return Source(name, mapped, size)


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
    if identity_of(after) != identity_of(before):
        raise FormatError("changed while it was read", path=name)
    return Source(name, data, len(data))


def stream_limit() -> int:
    """The most bytes read from a pipe or standard input: STREAM_LIMIT, or $BLOBTOOL_MAX_STREAM_BYTES."""
    return env_count(STREAM_LIMIT_VARIABLE, STREAM_LIMIT)


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


class BufferFile(io.RawIOBase):
    """A read-only, seekable file over a buffer (an mmap, a bytearray), read without a copy (zipfile, h5py).

    With `release_over`, a read of at least that many bytes lets the mapped
    pages it copied go back to the kernel (pages.release_pages, inside the
    call's releasing()): the reader copies them into its own buffers, so
    keeping them would count those bytes twice.
    """

    def __init__(self, buf, release_over: int | None = None):
        super().__init__()
        self._buf = buf
        self._view = memoryview(buf).cast("B") if len(buf) else memoryview(b"")
        self._pos = 0
        self._release_over = release_over

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        if base + offset < 0:
            raise OSError(22, "Invalid argument")  # what a file says, and what zipfile expects
        self._pos = base + offset
        return self._pos

    def readinto(self, out) -> int:
        n = max(0, min(len(out), len(self._view) - self._pos))
        out[:n] = self._view[self._pos:self._pos + n]
        if self._release_over is not None and n >= self._release_over:
            import numpy as np  # numpy loads only when values are read (start-up)

            from .pages import release_pages

            release_pages(np.frombuffer(self._buf, dtype=np.uint8, count=n, offset=self._pos))
        self._pos += n
        return n

    def close(self) -> None:
        self._view.release()
        self._buf = None
        super().close()
