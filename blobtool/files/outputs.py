"""Writing outputs atomically: a temporary file in the target's folder, flushed, fsynced and renamed.

A failed or interrupted write leaves any earlier file as it was, and ``-o``
may name the input: the input stays mapped from its old inode while the
new file takes its name. A symbolic link's target is replaced the same
way (followed only where the kernel's protected_symlinks rule would);
FIFOs, character devices, sockets and open descriptors (/dev/stdout) are
written in place.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import sys

from ..errors import FormatError, OutputError, UsageError
from .inputs import STDIO, cannot
from .mapped import CUT_UNDER_MAP, INPUTS
from .news import check_inputs

__all__ = ["atomic_output", "writes_in_place", "Staged"]


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
    INPUTS.temporaries.add(tmp)
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
        INPUTS.temporaries.discard(tmp)
    _fsync_folder(folder)


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


class Staged:
    """Outputs written first where nothing reads them, and put in place only when place() is called.

    For a check that proves an output before anyone sees it (--check): the
    writers write `path(dest)`, a file of the same name in a new hidden
    folder beside `dest` (in the system's temporary folder for standard
    output and what is written in place), the check reads it there, and
    place() moves each file the folder holds (a model's external data
    too) beside `dest`, as atomic_output would write it. Leaving the block
    removes whatever was not placed: a failed check, an error or a signal
    leaves no output, and any earlier file as it was.
    """

    def __init__(self, dests):
        import tempfile  # only writers need it

        self._folders = {}   # dest -> (staging folder, the name its files are written under)
        try:
            for dest in dests:
                name = os.fspath(dest)
                in_place = name == STDIO or _resolve_output(name)[1]
                folder = None if in_place else os.path.dirname(os.path.abspath(name))
                try:
                    staging = tempfile.mkdtemp(prefix=".blobtool-check.", dir=folder)
                except OSError as exc:
                    raise OutputError(cannot(f"create a folder in {folder}", exc), path=name) from exc
                self._folders[dest] = (staging, "stdout" if name == STDIO else os.path.basename(name))
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "Staged":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def path(self, dest) -> str:
        """Where `dest` is written for now (`dest` itself when it is not staged)."""
        if dest not in self._folders:
            return dest
        staging, name = self._folders[dest]
        path = os.path.join(staging, name)
        INPUTS.temporaries.add(path)  # removed, as a temporary output is, if a mapped input faults
        return path

    def place(self) -> None:
        """Put every staged file where its output goes: renamed onto it where it can be, copied in otherwise."""
        import shutil

        for dest, (staging, name) in list(self._folders.items()):
            given = os.fspath(dest)
            # The file named last, so that a model is never in place before its external data.
            for entry in sorted(os.listdir(staging), key=lambda entry: (entry == name, entry)):
                staged = os.path.join(staging, entry)
                target = given if entry == name else os.path.join(os.path.dirname(os.path.abspath(given)), entry)
                path, direct = (STDIO, True) if target == STDIO else _resolve_output(target)
                if not direct:
                    _copy_mode(path, staged)
                    check_inputs()
                    try:
                        os.replace(staged, path)
                        continue
                    except OSError as exc:
                        if exc.errno != errno.EXDEV:
                            raise OutputError(cannot("write", exc), path=target) from exc
                with open(staged, "rb") as source, atomic_output(target) as out:
                    shutil.copyfileobj(source, out, 1 << 20)
            _fsync_folder(os.path.dirname(os.path.abspath(given)))

    def close(self) -> None:
        """Remove the staging folders and whatever is left in them."""
        import shutil

        for staging, name in self._folders.values():
            INPUTS.temporaries.discard(os.path.join(staging, name))
            shutil.rmtree(staging, ignore_errors=True)
        self._folders = {}


def _fsync_folder(folder: str) -> None:
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
        _input_fault(exc)
        raise OutputError(f"cannot write: {exc.strerror or exc}", path=name) from exc


def _input_fault(exc: OSError) -> None:
    """Raise FormatError (exit 3) when a failed write failed for its input: bytes gone from under the mapping.

    A write(2) of bytes from a mapped input whose file was cut short since
    is EFAULT ("Bad address") where touching them would be SIGBUS.
    """
    if exc.errno == errno.EFAULT:
        check_inputs()
        name = next((name for _, name in list(INPUTS.mappings.values())), None)
        if name is not None:
            raise FormatError(CUT_UNDER_MAP, path=name) from exc


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
    import socket  # only for an output that is a socket

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
