"""Where -o writes, and standard streams that are closed or full: real processes.

- A regular file or a new path is replaced atomically (tests/files/test_safety.py);
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


# -- links in sticky world-writable folders (the kernel's protected_symlinks rule) -----------------

OTHER_UID = 65534  # nobody
can_chown = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                               reason="giving a link to another user (os.lchown) needs root")


def sticky(folder: Path, owner: int | None = None) -> Path:
    """`folder` made, sticky and writable by everyone (as /tmp), owned by `owner` when given."""
    folder.mkdir()
    folder.chmod(0o1777)
    if owner is not None:
        os.chown(folder, owner, -1)
    return folder


def link(path: Path, target, owner: int | None = None) -> Path:
    path.symlink_to(target)
    if owner is not None:
        os.lchown(path, owner, -1)
    return path


def refusal(name, uid: int, folder: Path, link_path=None) -> str:
    which = "a symbolic link" if link_path is None else f"the symbolic link {link_path}"
    return (f"blobtool: {name}: cannot write: refusing to follow {which} owned by uid {uid} in the sticky "
            f"world-writable folder {folder} (as the kernel's protected_symlinks rule)\n")


@can_chown
@pytest.mark.parametrize("fmt", ["blob", "npz"])
def test_another_users_link_in_a_sticky_world_writable_folder_is_not_followed(tmp_path, small, fmt):
    target = tmp_path / "config"
    target.write_bytes(EARLIER)
    shared = sticky(tmp_path / "shared")
    planted = link(shared / "out.pb", target, OTHER_UID)
    result = run_blobtool("convert", "--format", fmt, small, "-o", planted, text=True)
    assert result.returncode == 5
    assert result.stderr == refusal(planted, OTHER_UID, shared)
    assert target.read_bytes() == EARLIER
    assert planted.is_symlink() and leftovers(tmp_path) == [] and leftovers(shared) == []


@can_chown
@pytest.mark.parametrize("case", ["mine", "the folder owner's", "not sticky", "sticky, not world-writable"])
def test_links_the_rule_allows_are_followed(tmp_path, small, expected, case):
    target = tmp_path / "w.pb"
    target.write_bytes(EARLIER)
    if case == "mine":
        folder, owner = sticky(tmp_path / "shared"), None
    elif case == "the folder owner's":
        folder, owner = sticky(tmp_path / "shared", OTHER_UID), OTHER_UID
    else:
        folder, owner = tmp_path / "shared", OTHER_UID
        folder.mkdir()
        folder.chmod(0o777 if case == "not sticky" else 0o1775)
    planted = link(folder / "out.pb", target, owner)
    result = run_blobtool("convert", "--double", small, "-o", planted, text=True)
    assert result.returncode == 0, result.stderr
    assert target.read_bytes() == expected["blob"]
    assert planted.is_symlink()


@can_chown
def test_every_link_of_a_chain_and_of_the_folders_is_checked_in_its_own_folder(tmp_path, small, expected):
    target = tmp_path / "w.pb"
    target.write_bytes(EARLIER)
    first, second = sticky(tmp_path / "first"), sticky(tmp_path / "second")
    # Mine in the first folder, leading to another user's link in the second: refused at the second.
    link(second / "b.pb", target, OTHER_UID)
    chain = link(first / "a.pb", second / "b.pb")
    result = run_blobtool("convert", small, "-o", chain, text=True)
    assert result.returncode == 5
    assert result.stderr == refusal(chain, OTHER_UID, second, second / "b.pb")
    # A folder reached through another user's link in a sticky folder: refused the same way.
    (tmp_path / "real").mkdir()
    through = link(first / "d", tmp_path / "real", OTHER_UID)
    result = run_blobtool("convert", small, "-o", through / "out.pb", text=True)
    assert result.returncode == 5
    assert result.stderr == refusal(through / "out.pb", OTHER_UID, first, through)
    assert list((tmp_path / "real").iterdir()) == []
    assert target.read_bytes() == EARLIER
    # The same chain made of links the rule allows is followed to its end.
    (second / "b.pb").unlink()
    link(second / "b.pb", target)
    result = run_blobtool("convert", "--double", small, "-o", chain, text=True)
    assert result.returncode == 0, result.stderr
    assert target.read_bytes() == expected["blob"]


# Runs blobtool as another user: the interpreter and blobtool are loaded as root (they may lie
# where that user cannot read; a first run of the command, as root into a folder of its own, loads
# every module it needs), then the process becomes the user and runs the command.
AS_USER = """
import os, shutil, sys, tempfile
import blobtool.cli
uid, args = int(sys.argv[1]), sys.argv[2:]
scratch = tempfile.mkdtemp()
try:
    blobtool.cli.main([*args[:-1], os.path.join(scratch, os.path.basename(args[-1]))])
except SystemExit:
    pass
shutil.rmtree(scratch)
os.setgroups([])
os.setgid(uid)
os.setuid(uid)
blobtool.cli.main(args)
"""


def run_as(uid: int, *args):
    import subprocess
    import sys

    from runner import subprocess_env

    # (the last argument is the output, which the first run replaces with its own)
    return subprocess.run([sys.executable, "-c", AS_USER, str(uid), *map(str, args)], capture_output=True, text=True,
                          env=subprocess_env(), timeout=60, cwd="/")


@pytest.fixture
def open_folder():
    """A folder in the system's temporary folder that every user may reach (pytest's own is root's alone)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="blobtool-test-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


@can_chown
def test_as_another_user_only_its_own_links_and_the_folder_owners_are_followed(open_folder):
    # blobtool runs as nobody; the sticky folder belongs to root; links by nobody, root and a third user.
    shared = sticky(open_folder / "shared")
    source = write_blob(open_folder / "small.pb", VALUES)
    source.chmod(0o644)
    out = open_folder / "mine"
    out.mkdir()
    os.chown(out, OTHER_UID, -1)
    target = out / "w.pb"
    target.write_bytes(EARLIER)
    os.chown(target, OTHER_UID, -1)
    outcomes = {}
    for owner in (OTHER_UID, 0, OTHER_UID - 1):
        planted = link(shared / f"by{owner}.pb", target, owner)
        result = run_as(OTHER_UID, "convert", source, "-o", planted)
        outcomes[owner] = result.returncode
        if result.returncode:
            assert result.stderr == refusal(planted, owner, shared)
            assert target.read_bytes() == EARLIER
        else:
            assert result.stderr == "" and target.read_bytes() != EARLIER
            target.write_bytes(EARLIER)
    assert outcomes == {OTHER_UID: 0, 0: 0, OTHER_UID - 1: 5}


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
