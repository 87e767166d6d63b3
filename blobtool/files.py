"""Files: opening inputs without copying them, writing outputs atomically, load and save.

Inputs are memory-mapped copy-on-write (``mmap.ACCESS_COPY``): the blob's
arrays view the file's pages directly, writes to them (scale, update) touch a
private copy of the touched pages only, and the file itself never changes.
Standard input and pipes are read into memory once.

Outputs are written to a temporary file in the target's folder, flushed,
fsynced and renamed over the target, so a failed or interrupted write leaves
any earlier file as it was, and ``-o`` may name the input: the input stays
mapped from its old inode while the new file takes its name.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import stat
import sys
import tempfile
import tokenize
import warnings
from dataclasses import dataclass

import numpy as np

from .blob import Blob
from .blobproto import resolve_form, write_blob
from .errors import BlobToolError, FormatError, OutputError, UsageError

__all__ = ["Source", "open_source", "atomic_output", "load", "save", "save_arrays", "STDIO"]

STDIO = "-"

NPY_MAGIC = b"\x93NUMPY"
# Bytes of an .npy read to parse its header: magic, version, a length of up to
# 4 bytes, and the most header text numpy agrees to parse (10000 bytes).
_NPY_HEADER_READ = 12 + 10000


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


def _display_name(src) -> str:
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
    name = _display_name(src)
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


def load(src) -> Blob:
    """Read the one blob of a BlobProto or .npy file; see blobtool.containers.load."""
    from .containers import load as load_one
    return load_one(src)


def load_npy(source: Source, cast=None) -> Blob:
    """A Blob holding an .npy file's array; pickles never load.

    float32/float64 arrays are adopted without a copy. Other numeric arrays
    (float16, integers) are refused unless `cast` (float32 or float64) says
    what to convert them to.
    """
    from numpy.lib import format as npy_format

    # The header only (numpy refuses headers over 10000 bytes), not a copy of the whole file.
    stream = io.BytesIO(bytes(memoryview(source.buf)[:_NPY_HEADER_READ]))
    try:
        # numpy warns when a mangled header parses only with its Python 2
        # fallback; the header is judged below, and a warning would be a
        # second stderr line.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            version = npy_format.read_magic(stream)
            if version == (1, 0):
                shape, fortran, dtype = npy_format.read_array_header_1_0(stream)
            elif version == (2, 0):
                shape, fortran, dtype = npy_format.read_array_header_2_0(stream)
            else:
                raise ValueError(f"unsupported .npy version {version[0]}.{version[1]}")
    except (ValueError, OSError, SyntaxError, tokenize.TokenError) as exc:
        # numpy's header reader lets tokenize's and ast's errors through on a mangled header.
        raise FormatError(f"invalid .npy header: {exc}", path=source.name) from exc
    if dtype.hasobject:
        raise FormatError(f".npy holds {dtype} values (object arrays are never unpickled)", path=source.name)
    is_blob_dtype = dtype.kind == "f" and dtype.itemsize in (4, 8)
    if not is_blob_dtype and (cast is None or dtype.kind not in "biuf"):
        hint = " (convert it with --float or --double)" if dtype.kind in "biuf" else ""
        raise FormatError(f".npy holds {dtype} values; blobs are float32 or float64{hint}", path=source.name)
    if any(d < 0 for d in shape):
        raise FormatError(f"invalid .npy header: negative dimension in shape {shape}", path=source.name)
    native = np.dtype(cast) if cast is not None else dtype.newbyteorder("=")
    offset = stream.tell()
    # Python ints: a forged shape must not wrap around int64 and pass the size check.
    count = 1
    for d in shape:
        count *= d
    need = count * dtype.itemsize
    if source.size - offset < need:
        raise FormatError(
            f"truncated at byte {offset}: .npy array data needs {need} bytes, {source.size - offset} remain",
            path=source.name)
    blob = Blob(dtype=native)
    try:
        blob.reshape(shape)  # more than 32 axes, or an empty array too large for numpy
    except BlobToolError as exc:
        raise FormatError(f"invalid .npy header: {exc.reason}", path=source.name) from exc
    values = np.frombuffer(source.buf, dtype=dtype, count=count, offset=offset)
    if fortran and len(shape) > 1:
        values = values.reshape(shape[::-1]).transpose().copy().reshape(-1)
    if values.dtype != native:
        values = values.astype(native)
    try:
        blob.fill_from(shape, values, None, adopt=True)
    except BlobToolError as exc:
        raise exc.with_path(source.name) from exc
    from .blobproto import Origin
    blob.origin = Origin("shape", native, False)
    return blob


def save(blob: Blob, dest, *, double: bool | None = None, write_diff: bool | None = None,
         layout: str | None = None, precision: str | None = None, transforms: dict | None = None) -> None:
    """Write `blob` as a BlobProto to a path, "-" or a binary file object.

    Parameters
    ----------
    double : True writes double_data (float64), False data (float32).
    write_diff : whether to write the diff.
    layout : "shape" (Caffe's ToProto) or "legacy" (num/channels/height/width).
    precision : "float", "double" or "half" (NVIDIA Caffe's raw FLOAT16);
        overrides `double`.
    transforms : optional {"data"|"diff": fn(chunk, start) -> array} applied
        chunk by chunk while writing (see encode_blob_parts).

    None keeps what the blob came with (a blob made in Python: its dtype,
    "shape", no diff). Paths are written atomically: a temporary file beside
    the target, then a rename.
    """
    if precision is None and double is not None:
        precision = "double" if double else "float"
    form = resolve_form(blob, precision=precision, write_diff=write_diff, layout=layout)
    try:
        with atomic_output(dest) as out:
            write_blob(out, blob, transforms=transforms, **form)
    except (BlobToolError, BrokenPipeError):
        raise  # a closed pipe: the command line stops quietly
    except OSError as exc:  # a binary file object of the caller's
        raise OutputError(f"cannot write: {exc.strerror or exc}", path=_display_name(dest)) from exc


class _Writes:
    """Only the write() of a file: numpy then writes through it in chunks.

    Given a real file, np.save uses ndarray.tofile, whose short write on a
    full disk says "N requested and M written" and loses the reason (errno).
    """

    def __init__(self, out):
        self.write = out.write


def save_arrays(arrays: dict, dest, *, fmt: str) -> None:
    """Write arrays as .npy (exactly one) or .npz (keyed by name), atomically.

    Arrays are written with numpy's own format writer; pickles are never
    written (allow_pickle=False).
    """
    if fmt == "npy":
        if len(arrays) != 1:
            raise UsageError(f".npy holds one array; {len(arrays)} selected (choose one with --blob, or use .npz)")
        (array,) = arrays.values()
        with atomic_output(dest) as out:
            np.save(_Writes(out), array, allow_pickle=False)
    elif fmt == "npz":
        with atomic_output(dest) as out:
            np.savez(out, **arrays)
    else:
        raise UsageError(f"unknown array format {fmt!r}")
