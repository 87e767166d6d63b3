"""Sources and outputs: opening inputs without copying them, releasing their pages, writing atomically.

Inputs are memory-mapped copy-on-write (``mmap.ACCESS_COPY``): the blob's
arrays view the file's pages directly, writes to them (scale, update) touch a
private copy of the touched pages only, and the file itself never changes.
Standard input and pipes are read into memory once.

Outputs are written to a temporary file in the target's folder, flushed,
fsynced and renamed over the target, so a failed or interrupted write leaves
any earlier file as it was, and ``-o`` may name the input: the input stays
mapped from its old inode while the new file takes its name.

Pages of a mapped input that a writer has streamed out can be handed back
to the kernel (``release_pages`` inside ``releasing()``), so converting a
file larger than memory keeps memory bounded.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import stat
import sys
import tempfile
from dataclasses import dataclass

import numpy as np

from .errors import FormatError, OutputError, UsageError

__all__ = ["Source", "open_source", "atomic_output", "display_name", "release_pages", "releasing", "STDIO"]

STDIO = "-"


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

    Regular files are memory-mapped copy-on-write; anything else is read once
    into a bytearray (writable, so adopted arrays can be scaled in place).
    """
    name = display_name(src)
    if src == STDIO:
        return _read_stream(sys.stdin.buffer, name)
    if isinstance(src, (str, os.PathLike)):
        try:
            fd = os.open(os.fspath(src), os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except OSError as exc:
            raise FormatError(f"cannot open: {exc.strerror}", path=name) from exc
        try:
            return _map_fd(fd, name)
        finally:
            os.close(fd)
    if hasattr(src, "read"):
        try:
            fd = src.fileno()
            st = os.fstat(fd)
        except (AttributeError, OSError, io.UnsupportedOperation):
            fd = None
        if fd is not None and stat.S_ISREG(st.st_mode) and src.seekable() and src.tell() == 0:
            return _map_fd(fd, name)
        return _read_stream(src, name)
    raise UsageError(f"expected a path, '-' or a binary file object, got {type(src).__name__}")


def _map_fd(fd: int, name: str) -> Source:
    try:
        st = os.fstat(fd)
    except OSError as exc:
        raise FormatError(f"cannot read: {exc.strerror}", path=name) from exc
    if stat.S_ISDIR(st.st_mode):
        raise FormatError("is a directory", path=name)
    if not stat.S_ISREG(st.st_mode):
        with os.fdopen(os.dup(fd), "rb") as stream:
            return _read_stream(stream, name)
    if st.st_size == 0:
        return Source(name, bytearray(), 0)
    try:
        mapped = mmap.mmap(fd, st.st_size, access=mmap.ACCESS_COPY)
    except (OSError, ValueError) as exc:
        raise FormatError(f"cannot map the file: {exc}", path=name) from exc
    return Source(name, mapped, st.st_size)


def _read_stream(stream, name: str) -> Source:
    try:
        data = bytearray(stream.read())
    except OSError as exc:
        raise FormatError(f"cannot read: {exc.strerror or exc}", path=name) from exc
    return Source(name, data, len(data))


@contextlib.contextmanager
def atomic_output(dest):
    """Yield a binary file object whose contents replace `dest` only on success.

    `dest` is a path, "-" (standard output) or a binary file object (written
    directly). For paths: a temporary file beside the target, fsync, rename,
    and fsync of the folder; on any failure the temporary file is removed and
    the target is left as it was. OS errors become OutputError (exit 5).
    """
    if dest == STDIO:
        out = sys.stdout.buffer
        try:
            yield out
            out.flush()
        except BrokenPipeError:
            raise  # the reader went away: the command line stops quietly
        except OSError as exc:
            raise OutputError(f"cannot write: {exc.strerror or exc}", path="<stdout>") from exc
        return
    if not isinstance(dest, (str, os.PathLike)):
        yield dest
        return
    path = os.fspath(dest)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise OutputError(f"cannot create a file in {folder}: {exc.strerror}", path=path) from exc
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
            raise OutputError(f"cannot write: {exc.strerror or exc}", path=path) from exc
        raise
    with contextlib.suppress(OSError):
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


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


def release_pages(view: np.ndarray) -> None:
    """Let the kernel drop the memory-mapped pages wholly inside `view` (after they were written out).

    Only inside releasing(), and only for views of a private (copy-on-write)
    file mapping, where dropped pages read back from the file if touched
    again; pages shared with bytes outside the view are kept. Anything else
    (bytes in memory, other arrays) is left alone.
    """
    if not _release:
        return
    base = view
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    if not isinstance(base, mmap.mmap) or view.size == 0 or not hasattr(mmap, "MADV_DONTNEED"):
        return
    origin = np.frombuffer(base, dtype=np.uint8, count=1).ctypes.data
    first = view.ctypes.data - origin
    last = first + view.nbytes
    page = mmap.PAGESIZE
    start = -(-first // page) * page
    stop = last // page * page
    if stop > start:
        base.madvise(mmap.MADV_DONTNEED, start, stop - start)
