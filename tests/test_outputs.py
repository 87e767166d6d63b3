"""Where -o writes, and standard streams that are closed or full: real processes.

- A regular file or a new path is replaced atomically (tests/test_safety.py);
  a FIFO, a character device, a socket and an open descriptor (/dev/stdout,
  /proc/self/fd/N) are written in place, in order, and stay what they were.
- A symbolic link's target is replaced atomically in the target's folder; the
  link stays.
- Temporary names stay short: an output name of 255 bytes works.
- A closed or full standard output is exit 5, a closed standard input exit 3,
  with one line; a closed or full stderr loses the line, not the exit code.

Device nodes are made in the test's own folder (with /dev/null's and
/dev/full's numbers) when the test may make them; the system's are never
written.
"""

from __future__ import annotations

import io
import os
import socket
import stat
import threading
from pathlib import Path

import numpy as np
import pytest

from builders import write_blob
from runner import BLOBTOOL, run_blobtool, run_pipeline

EARLIER = b"the earlier output, which must survive\n"
VALUES = np.linspace(-2, 2, 1000, dtype=np.float32)


@pytest.fixture
def small(tmp_path) -> Path:
    return write_blob(tmp_path / "small.pb", VALUES, VALUES / 4)


@pytest.fixture
def expected(tmp_path, small) -> dict:
    """What `convert --double` writes as a blob and as an npz, to a regular file."""
    out = {}
    for fmt in ("blob", "npz"):
        target = tmp_path / f"reference.{fmt}"
        result = run_blobtool("convert", "--double", "--format", fmt, small, "-o", target)
        assert result.returncode == 0, result.stderr
        out[fmt] = target.read_bytes()
        target.unlink()
    return out


def leftovers(folder: Path) -> list:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp"))


def _drain(read) -> tuple[threading.Thread, list]:
    got = []
    thread = threading.Thread(target=lambda: got.append(read()), daemon=True)
    thread.start()
    return thread, got


def _mknod(path: Path, kind: int, major: int, minor: int) -> Path:
    try:
        os.mknod(path, kind | 0o666, os.makedev(major, minor))
    except PermissionError as exc:
        pytest.skip(f"cannot make a device node here ({exc.strerror}): needs root outside a restricted container")
    return path


# -- FIFOs, devices, sockets, open descriptors --------------------------------------------------

@pytest.mark.parametrize("fmt", ["blob", "npz"])
def test_a_fifo_is_written_in_place(tmp_path, small, expected, fmt):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    thread, got = _drain(lambda: fifo.read_bytes())
    result = run_blobtool("convert", "--double", "--format", fmt, small, "-o", fifo, text=True)
    thread.join(timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert leftovers(tmp_path) == []
    if fmt == "blob":
        assert got == [expected[fmt]]
        return
    # zip's layout differs on a stream that cannot seek (sizes after each member); the arrays do not
    with np.load(io.BytesIO(got[0])) as npz, np.load(io.BytesIO(expected[fmt])) as reference:
        assert sorted(npz.files) == sorted(reference.files) == ["0", "0/diff"]
        for key in npz.files:
            np.testing.assert_array_equal(npz[key], reference[key])
        np.testing.assert_array_equal(npz["0"], VALUES.astype(np.float64))


def test_a_character_device_is_written_in_place_and_stays_a_device(tmp_path, small):
    null = _mknod(tmp_path / "null", stat.S_IFCHR, 1, 3)  # /dev/null's numbers
    result = run_blobtool("convert", small, "-o", null, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert stat.S_ISCHR(os.lstat(null).st_mode) and os.lstat(null).st_rdev == os.makedev(1, 3)
    assert leftovers(tmp_path) == []


def test_a_full_character_device_is_exit_5_and_stays_a_device(tmp_path, small):
    full = _mknod(tmp_path / "full", stat.S_IFCHR, 1, 7)  # /dev/full's numbers
    result = run_blobtool("convert", small, "-o", full, text=True)
    assert result.returncode == 5
    assert result.stderr == f"blobtool: {full}: cannot write: No space left on device\n"
    assert stat.S_ISCHR(os.lstat(full).st_mode)
    assert leftovers(tmp_path) == []


def test_a_block_device_is_refused(tmp_path, small):
    block = _mknod(tmp_path / "disk", stat.S_IFBLK, 7, 0)  # a loop device's numbers; never opened
    result = run_blobtool("convert", small, "-o", block, text=True)
    assert result.returncode == 2
    assert result.stderr == (f"blobtool: {block}: is a block device: blobtool writes files, FIFOs, "
                             "character devices and sockets\n")
    assert stat.S_ISBLK(os.lstat(block).st_mode)


def test_a_unix_socket_is_written_in_place(tmp_path, small, expected):
    path = tmp_path / "sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def receive():
        conn, _ = server.accept()
        with conn:
            return b"".join(iter(lambda: conn.recv(1 << 16), b""))

    thread, got = _drain(receive)
    try:
        result = run_blobtool("convert", "--double", small, "-o", path, text=True)
        thread.join(timeout=60)
    finally:
        server.close()
    assert result.returncode == 0, result.stderr
    assert got == [expected["blob"]]
    assert stat.S_ISSOCK(os.lstat(path).st_mode)


@pytest.mark.parametrize("target", ["/dev/stdout", "/proc/self/fd/1", "/dev/fd/1"])
def test_standard_output_by_name_is_the_pipe(tmp_path, small, expected, target):
    if not os.path.exists(target):
        pytest.skip(f"{target} does not exist on this system")
    result = run_pipeline(f"{BLOBTOOL} convert --double small.pb -o {target} | cat > got.pb", tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "got.pb").read_bytes() == expected["blob"]
    assert leftovers(tmp_path) == []


def test_an_open_descriptor_by_name_keeps_its_offset_and_append_mode(tmp_path, small, expected):
    # `>> log`: the blob goes after what the file held, through blobtool's own descriptor.
    (tmp_path / "log").write_bytes(EARLIER)
    result = run_pipeline(f"{BLOBTOOL} convert --double small.pb -o /proc/self/fd/3 3>>log", tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "log").read_bytes() == EARLIER + expected["blob"]
    assert leftovers(tmp_path) == []


# -- symbolic links ------------------------------------------------------------------------------

def test_a_symlink_keeps_its_place_and_its_target_is_replaced_atomically(tmp_path, small, expected):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "w.pb").write_bytes(EARLIER)
    (tmp_path / "link.pb").symlink_to("real/w.pb")
    (tmp_path / "chain.pb").symlink_to("link.pb")
    result = run_blobtool("convert", "--double", small, "-o", tmp_path / "chain.pb", text=True)
    assert result.returncode == 0, result.stderr
    assert os.readlink(tmp_path / "chain.pb") == "link.pb"
    assert os.readlink(tmp_path / "link.pb") == "real/w.pb"
    assert (tmp_path / "real" / "w.pb").read_bytes() == expected["blob"]
    assert leftovers(tmp_path) == [] and leftovers(tmp_path / "real") == []


def test_a_dangling_symlink_makes_its_target(tmp_path, small, expected):
    (tmp_path / "link.pb").symlink_to("made.pb")
    result = run_blobtool("convert", "--double", small, "-o", tmp_path / "link.pb", text=True)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "link.pb").is_symlink()
    assert (tmp_path / "made.pb").read_bytes() == expected["blob"]


def test_a_symlink_loop_is_exit_5_one_line(tmp_path, small):
    (tmp_path / "a.pb").symlink_to("b.pb")
    (tmp_path / "b.pb").symlink_to("a.pb")
    result = run_blobtool("convert", small, "-o", tmp_path / "a.pb", text=True)
    assert result.returncode == 5
    assert result.stderr.endswith(": too many levels of symbolic links\n") and result.stderr.count("\n") == 1
    assert os.readlink(tmp_path / "a.pb") == "b.pb"


# -- long names ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["a" * 240 + ".pb", "b" * 252 + ".pb", "é" * 126 + ".pb"],
                         ids=["243 bytes", "255 bytes", "255 bytes of UTF-8"])
def test_an_output_name_up_to_the_limit_works(tmp_path, small, expected, name):
    assert len(os.fsencode(name)) in (243, 255)
    result = run_blobtool("convert", "--double", small, "-o", tmp_path / name, text=True)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / name).read_bytes() == expected["blob"]
    assert leftovers(tmp_path) == []


# -- closed and full standard streams ------------------------------------------------------------

@pytest.mark.parametrize("args", [
    "info small.pb", "info --json small.pb", "norm small.pb", "compare small.pb small.pb",
    "convert small.pb -o -", "convert small.pb --format npz -o -", "convert small.pb -o /dev/stdout",
    "devices", "--help", "--version", "info --help",
])
@pytest.mark.parametrize("stdout", ["closed", "full"])
def test_closed_or_full_standard_output_is_exit_5_one_line(tmp_path, small, args, stdout):
    redirect = ">&-" if stdout == "closed" else ">/dev/full"
    result = run_pipeline(f"{BLOBTOOL} {args} {redirect}", tmp_path, text=True)
    assert result.returncode == 5, result.stderr
    reason = "Bad file descriptor" if stdout == "closed" else "No space left on device"
    where = "/dev/stdout" if "/dev/stdout" in args else "<stdout>"
    assert result.stderr == f"blobtool: {where}: cannot write: {reason}\n"


def test_a_file_output_works_with_standard_streams_closed(tmp_path, small, expected):
    # No file blobtool opens may take descriptor 0, 1 or 2.
    result = run_pipeline(f"{BLOBTOOL} convert --double small.pb -o out.pb <&- >&- 2>&-", tmp_path)
    assert result.returncode == 0
    assert (tmp_path / "out.pb").read_bytes() == expected["blob"]


@pytest.mark.parametrize("args", ["info -", "norm", "compare - small.pb", "convert - -o out.pb"])
def test_closed_standard_input_is_exit_3_one_line(tmp_path, small, args):
    result = run_pipeline(f"{BLOBTOOL} {args} <&-", tmp_path, text=True)
    assert result.returncode == 3, result.stderr
    assert result.stderr == "blobtool: <stdin>: cannot read: Bad file descriptor\n"
    assert not (tmp_path / "out.pb").exists()


@pytest.mark.parametrize("args, code", [
    ("info missing.pb", 3), ("info small.pb >/dev/full", 5), ("convert small.pb -o - >&-", 5),
    ("info --no-such-option", 2), ("info small.pb", 0),
])
@pytest.mark.parametrize("stderr", ["2>&-", "2>/dev/full"])
def test_closed_or_full_stderr_keeps_the_exit_code(tmp_path, small, args, code, stderr):
    result = run_pipeline(f"{BLOBTOOL} {args} {stderr}; echo \"exit $?\" >&2", tmp_path, text=True)
    assert result.stderr == f"exit {code}\n"
