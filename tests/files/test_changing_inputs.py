"""An input truncated or rewritten while it is read: exit 3, one line, never SIGBUS, no partial output.

Leased inputs, and watched ones (an input that cannot be leased is mapped and
watched, not copied, in bounded memory); a touch (GNU touch opens the file for
writing, which breaks a lease) does not stop a read. Real processes throughout.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from blobtool.formats.caffe import wire
from builders import blob_bytes
from runner import blobtool_cmd, peak_rss_run, run_blobtool, subprocess_env

from filecases import EARLIER, EXPECTED_SIZE, digest, temps, wait_for_temp, write_float_blob

# -- an input that changes while it is read ------------------------------------------------------

# An open for writing breaks a lease (a touch's too) and is no change: blobtool gives the lease up and
# watches the input from then on, as one it could not lease. A truncation is then told by whichever of
# the watch's checks meets it first: inotify, a short read, or a byte read through the mapping.
CHANGED = (r"changed while it was read: (another process wrote to it or truncated it|it ends at byte \d+, before "
           r"the \d+ bytes wanted from byte \d+|it ended before a byte read through its memory map \(another "
           r"process truncated it, or its storage failed\))")


def _one_change_line(name, stderr: str) -> bool:
    """Whether `stderr` is exactly one line telling that input `name` changed while it was read."""
    return re.fullmatch(rf"blobtool: {re.escape(str(name))}: {CHANGED}\n", stderr) is not None


def _leased(path: Path) -> bool:
    """Whether a process holds a lease on `path` (/proc/locks: "1: LEASE ACTIVE READ <pid> <dev>:<inode> ...")."""
    inode = str(path.stat().st_ino)
    with open("/proc/locks") as f:
        return any(fields[1] == "LEASE" and fields[5].split(":")[-1] == inode for fields in map(str.split, f)
                   if len(fields) > 5)


def _wait_for_lease(proc, *paths: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(map(_leased, paths)) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    assert all(map(_leased, paths)), "blobtool took no lease on its input"


def _truncate_later(path: Path) -> threading.Thread:
    # The truncate waits until blobtool lets go of the file: in a thread.
    thread = threading.Thread(target=os.truncate, args=(path, 100), daemon=True)
    thread.start()
    return thread


needs_leases = pytest.mark.skipif(not os.path.exists("/proc/locks") or not hasattr(__import__("fcntl"), "F_SETLEASE"),
                                  reason="file leases are Linux's (fcntl F_SETLEASE, /proc/locks)")


@needs_leases
def test_an_input_truncated_while_it_is_written_out_is_exit_3_one_line(tmp_path):
    # Standard output is a pipe nobody reads yet: blobtool is held mid-write, deterministically.
    path = write_float_blob(tmp_path / "in.pb", 10_000_000)
    proc = subprocess.Popen(blobtool_cmd("convert", "--double", path, "-o", "-"), env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for_lease(proc, path)
    assert proc.stdout.read(1000)  # it is writing
    truncating = _truncate_later(path)
    stdout, stderr = proc.communicate(timeout=60)
    truncating.join(timeout=60)
    assert proc.returncode == 3
    assert _one_change_line(path, stderr.decode()), stderr
    assert path.stat().st_size == 100  # the writer went ahead once blobtool had given up its lease


@needs_leases
def test_an_input_truncated_mid_write_leaves_the_earlier_output_and_no_temporary_file(tmp_path, big):
    shutil.copyfile(big, tmp_path / "in.pb")
    (tmp_path / "out.pb").write_bytes(EARLIER)
    proc = subprocess.Popen(blobtool_cmd("convert", "--double", "in.pb", "-o", "out.pb"), cwd=tmp_path,
                            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_for_temp(proc, tmp_path, EXPECTED_SIZE // 4) is not None
    truncating = _truncate_later(tmp_path / "in.pb")
    _, stderr = proc.communicate(timeout=60)
    truncating.join(timeout=60)
    assert proc.returncode == 3
    assert _one_change_line("in.pb", stderr), stderr
    assert (tmp_path / "out.pb").read_bytes() == EARLIER
    assert temps(tmp_path) == []


@needs_leases
@pytest.mark.parametrize("delay", [0.0, 0.2, 0.4])
@pytest.mark.parametrize("command", ["norm in.pb", "info --stats in.pb", "compare in.pb in.pb"])
def test_an_input_truncated_while_it_is_read_is_never_a_signal(tmp_path, command, delay):
    # Whenever the truncate comes, blobtool finishes (exit 0) or says so (exit 3); never SIGBUS.
    write_float_blob(tmp_path / "in.pb", 20_000_000)
    proc = subprocess.Popen(blobtool_cmd(*command.split()), cwd=tmp_path, env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_lease(proc, tmp_path / "in.pb")
    time.sleep(delay)
    truncating = _truncate_later(tmp_path / "in.pb")
    _, stderr = proc.communicate(timeout=60)
    truncating.join(timeout=60)
    assert proc.returncode in (0, 3), stderr
    assert stderr == "" or _one_change_line("in.pb", stderr), stderr


@needs_leases
def test_an_input_truncated_in_a_worker_process_is_exit_3_one_line(tmp_path):
    # Several files at once: each worker process leases its own input.
    for name in ("a.pb", "b.pb"):
        write_float_blob(tmp_path / name, 30_000_000)
    env = subprocess_env(BLOBTOOL_PARALLEL_MIN_BYTES="0")
    proc = subprocess.Popen(blobtool_cmd("norm", "-j", "2", "a.pb", "b.pb"), cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_lease(proc, tmp_path / "b.pb")
    truncating = _truncate_later(tmp_path / "b.pb")
    _, stderr = proc.communicate(timeout=60)
    truncating.join(timeout=60)
    assert proc.returncode in (0, 3), stderr
    assert stderr == "" or _one_change_line("b.pb", stderr), stderr


def test_an_input_open_for_writing_elsewhere_is_read_without_a_lease(tmp_path):
    # The lease is refused while another process may write; the file is mapped and watched instead.
    path = write_float_blob(tmp_path / "in.pb", 1_000_000)
    writer = os.open(path, os.O_WRONLY)
    try:
        result = run_blobtool("norm", "--json", path, text=True)
    finally:
        os.close(writer)
    assert result.returncode == 0, result.stderr
    ramp = np.arange(1 << 20, dtype=np.float64)[:1_000_000]
    np.testing.assert_allclose(json.loads(result.stdout)["blobs"][0]["data"]["sumsq"], np.dot(ramp, ramp),
                               rtol=1e-12)


def test_an_input_changing_while_it_is_copied_is_exit_3_one_line(tmp_path):
    path = write_float_blob(tmp_path / "in.pb", 25_000_000)
    full = path.stat().st_size
    writer = os.open(path, os.O_WRONLY)
    stop = threading.Event()

    def rewrite():  # cut the file and restore its length, until blobtool is done
        while not stop.is_set():
            os.ftruncate(writer, full // 2)
            os.ftruncate(writer, full)

    thread = threading.Thread(target=rewrite, daemon=True)
    thread.start()
    try:
        result = run_blobtool("norm", path, text=True)
    finally:
        stop.set()
        thread.join(timeout=60)
        os.close(writer)
    assert result.returncode == 3
    # A file found cut short when it was opened is a truncated file, when no change was seen after
    # (where inotify cannot be had, the size may be back to the one it was opened with).
    assert re.fullmatch(rf"blobtool: {re.escape(str(path))}: (changed while it was read: "
                        r"(another process wrote to it or truncated it|\d+ bytes when it was opened, (\d+|fewer) when it "
                        r"was mapped|it ends at byte \d+, before the \d+ bytes "
                        r"wanted from byte \d+|it ended before a byte read through its memory map \(another process "
                        r"truncated it, or its storage failed\))|truncated at byte 8: field 5 \(data\) declares "
                        rf"{4 * 25_000_000} bytes, \d+ remain)\n", result.stderr)


SETTLED = """
import os, signal, sys
from blobtool import files as source
from blobtool.cli.group import _settle_inputs
from blobtool.errors import FormatError

with source.guarded():
    path = sys.argv[1]
    writer = os.open(path, os.O_WRONLY)  # held open for writing: no lease, the input is watched
    opened = source.open_source(path)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGIO})  # the writer's news held back until the report
    os.ftruncate(writer, 8)
    error = _settle_inputs(FormatError("truncated at byte 8: field 5 (data)", path=path))
    print(error)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGIO})  # it arrives while the error is reported: no stop
    os.kill(os.getpid(), signal.SIGIO)
    print("reported once")
"""


@needs_leases
def test_a_read_error_in_an_input_changed_meanwhile_is_reported_as_the_change_once(tmp_path):
    # The error the parser found in a cut-short input is told as the change that caused it, and a
    # writer's news that comes while it is reported adds no second line.
    path = write_float_blob(tmp_path / "in.pb", 100_000)
    result = subprocess.run([sys.executable, "-c", SETTLED, str(path)], env=subprocess_env(), capture_output=True,
                            text=True, timeout=60)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == (f"{path}: changed while it was read: another process wrote to it or truncated it\n"
                             "reported once\n")


READ_THEN_SIGNALLED = """
import os, signal, sys
from blobtool.files import mapped, pages
from blobtool import files as source
from blobtool.errors import FormatError

with source.guarded():
    path = sys.argv[1]
    writer = os.open(path, os.O_WRONLY)  # held open for writing: no lease, the input is watched
    opened = source.open_source(path)
    (reader,) = mapped.INPUTS.guard.watched
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGIO})  # the writer's news comes after the read sees it
    os.ftruncate(writer, 8)
    try:
        pages.read_mapped(reader, 0, bytearray(64))
    except FormatError as exc:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGIO})  # while the error is on its way
        os.kill(os.getpid(), signal.SIGIO)
        print(exc)
"""


@needs_leases
def test_a_change_a_read_found_is_not_stopped_again_by_the_writers_signal(tmp_path):
    # A worker process's read found its input cut short; the writer's SIGIO came while the pool
    # formatted that error for the parent, and a second error (Stopped) killed the worker (exit 70).
    path = write_float_blob(tmp_path / "in.pb", 100_000)
    result = subprocess.run([sys.executable, "-c", READ_THEN_SIGNALLED, str(path)], env=subprocess_env(),
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"{path}: changed while it was read: it ends at byte 8, before the 64 bytes wanted from byte 0\n"


BATCH_SETTLED = """
import os, signal, sys
from blobtool import files as source
from blobtool.cli.group import batch_error
from blobtool.errors import FormatError

with source.guarded():
    path = sys.argv[1]
    writer = os.open(path, os.O_WRONLY)  # held open for writing: no lease, the input is watched
    opened = source.open_source(path)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGIO})
    os.ftruncate(writer, 8)
    try:
        raise FormatError("truncated at byte 8: field 5 (data)", path=path)
    except FormatError as exc:
        error = exc
    print(batch_error(error))
    os.ftruncate(writer, 4)  # a later write to the input the batch reported: no stop, no second line
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGIO})
    os.kill(os.getpid(), signal.SIGIO)
    print(source.pending_change())
"""


@needs_leases
def test_a_batch_reports_an_input_changed_meanwhile_as_the_change_once_and_goes_on(tmp_path):
    path = write_float_blob(tmp_path / "in.pb", 100_000)
    result = subprocess.run([sys.executable, "-c", BATCH_SETTLED, str(path)], env=subprocess_env(),
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"{path}: changed while it was read: another process wrote to it or truncated it\nNone\n"


NESTED = """
import sys
from blobtool.files import mapped

calls = []
guard = mapped.Guard()

def changed_watched():  # as if SIGIO came again inside the handler, 5000 deep
    calls.append(1)
    if len(calls) < 5000:
        guard.lease_broken(29, None)
    return None

guard.changed_watched = changed_watched
guard.lease_broken(29, None)
print(len(calls), guard.handling)
"""


def test_sigio_arriving_inside_its_own_handler_is_looked_at_again_not_nested():
    # A writer that keeps writing sends SIGIO while the handler runs: each used to nest a new
    # handler (RecursionError, exit 70, under load). The running handler now looks once more.
    result = subprocess.run([sys.executable, "-c", NESTED], env=subprocess_env(), capture_output=True, text=True,
                            timeout=60)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == "5000 False\n"


AT_EXIT = """
import atexit, os, signal
from blobtool import files as source

with source.guarded():
    atexit._run_exitfuncs()  # what Python runs as it shuts down, before it puts the handlers back
    print(signal.getsignal(signal.SIGIO) is signal.SIG_IGN)
    os.kill(os.getpid(), signal.SIGIO)  # a lease broken or an inotify event now
    print("alive")
"""


@needs_leases
def test_sigio_while_python_shuts_down_does_not_kill_blobtool():
    # Python puts SIGIO's handler back to the default (terminate) as it shuts down; a lease or
    # inotify event then ended blobtool with signal 29 instead of its exit code.
    result = subprocess.run([sys.executable, "-c", AT_EXIT], env=subprocess_env(), capture_output=True, text=True,
                            timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (0, "True\nalive\n", "")


# -- an input that cannot be leased: mapped and watched, not copied ---------------------------------

@pytest.fixture
def unleased():
    """Hold `path` open for writing, as a writer elsewhere would: no read lease can be had on it then."""
    opened = []

    def hold(path: Path) -> Path:
        opened.append(os.open(path, os.O_WRONLY))
        return path

    yield hold
    for fd in opened:
        os.close(fd)


# A blobtool process whose inputs are not watched with inotify (size and inode are still compared):
# so that a truncation reaches the mapping, and the SIGBUS handler is what stops the command.
UNWATCHED = """
import sys
from blobtool.files import mapped
mapped.Guard.add_watch = lambda guard, fd, name: None
from blobtool.cli import main
main(sys.argv[1:])
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="peak RSS is read from /proc (Linux)")
def test_an_input_that_cannot_be_leased_is_read_in_bounded_memory_with_the_same_figures(tmp_path, unleased):

    count = 48 << 20  # 192 MiB of float32: far more than the commands may keep
    rng = np.random.default_rng(5)
    data = rng.standard_normal(count, dtype=np.float32)
    a = tmp_path / "a.pb"
    a.write_bytes(blob_bytes(shape=[count]) + wire.len_field_header(5, 4 * count) + data.tobytes())
    data[::1000] += 1
    b = tmp_path / "b.pb"
    b.write_bytes(blob_bytes(shape=[count]) + wire.len_field_header(5, 4 * count) + data.tobytes())
    del data
    commands = (("norm", "--json", a), ("info", "--stats", "--json", a), ("compare", "--json", a, b))
    leased = {args[0]: peak_rss_run(tmp_path, *args)[0].stdout for args in commands}
    unleased(a)
    unleased(b)
    limit = 160 << 10  # KiB: start-up plus the chunks in flight; a copy would be 192 MiB a file
    for args in commands:
        res, peak = peak_rss_run(tmp_path, *args)
        assert res.returncode in (0, 1), res.stderr
        assert res.stderr == ""
        assert peak < limit, (args[0], peak)
        assert res.stdout == leased[args[0]]  # the same figures, bit for bit


# Runs a command as root (which loads every module it needs, where another user may not read them),
# then as another user, on a file of root's: that user cannot lease it. Prints the second run's
# output, then a JSON line: the inputs watched without a lease, and the process's peak RSS in KiB.
AS_ANOTHER_USER = """
import json, os, sys
import blobtool.cli
from blobtool.files import inputs as source
uid, args = int(sys.argv[1]), sys.argv[2:]
try:
    blobtool.cli.main(args)
except SystemExit:
    pass
os.setgroups([])
os.setgid(uid)
os.setuid(uid)
watched, real = [], source.watch
source.watch = lambda fd, name, mapped, st: (watched.append(name), real(fd, name, mapped, st))[1]
sys.stdout.write("--\\n")
try:
    blobtool.cli.main(args)
except SystemExit as exc:
    code = exc.code
peak = int([l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1])
print(json.dumps({"code": code, "watched": watched, "peak": peak}))
"""


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0 or not os.path.exists("/proc/self/status"),
                    reason="runs as root, then as another user (uid 65534); peak RSS from /proc")
def test_another_users_file_is_read_without_a_lease_in_bounded_memory():
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="blobtool-test-"))  # pytest's own folder is root's alone
    try:
        folder.chmod(0o755)
        path = write_float_blob(folder / "in.pb", 48 << 20)  # 192 MiB
        path.chmod(0o644)
        for command in (["norm", "--json"], ["info", "--stats", "--json"]):
            res = subprocess.run([sys.executable, "-c", AS_ANOTHER_USER, "65534", *command, str(path)], cwd="/",
                                 capture_output=True, text=True, env=subprocess_env(), timeout=300)
            assert res.returncode == 0, res.stderr
            as_root, rest = res.stdout.split("--\n")
            as_nobody, report = rest.rsplit("\n", 2)[:2]
            report = json.loads(report)
            assert report["code"] in (0, None) and res.stderr == ""
            assert report["watched"] == [str(path)]  # no lease for this user: mapped and watched
            assert as_nobody.strip() == as_root.strip()  # the same figures, bit for bit
            assert report["peak"] < 160 << 10  # KiB, both runs: a copy would be 192 MiB
    finally:
        shutil.rmtree(folder)


@pytest.mark.parametrize("command", ["norm in.pb", "info --stats in.pb", "compare in.pb in.pb",
                                     "convert --double in.pb -o out.pb"])
@pytest.mark.parametrize("lease", [True, False], ids=["leased", "unleased"])
def test_touching_an_input_while_it_is_read_does_not_stop_the_command(tmp_path, unleased, command, lease):
    path = write_float_blob(tmp_path / "in.pb", 20_000_000)
    expected = run_blobtool(*command.split(), cwd=tmp_path, text=True, timeout=120)
    assert expected.returncode == 0, expected.stderr
    if "convert" in command:
        expected_out = digest(tmp_path / "out.pb")
        (tmp_path / "out.pb").unlink()
    if not lease:
        unleased(path)
    proc = subprocess.Popen(blobtool_cmd(*command.split()), cwd=tmp_path, env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    touches = 0
    while proc.poll() is None:
        os.utime(path)  # new access and modification times; ctime changes too
        touches += 1
        time.sleep(0.002)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert stderr == "" and touches > 1
    assert stdout == expected.stdout
    if "convert" in command:
        assert digest(tmp_path / "out.pb") == expected_out


TOUCH = shutil.which("touch")
needs_touch = pytest.mark.skipif(TOUCH is None, reason="needs a touch program (GNU coreutils' opens the file "
                                                       "for writing)")
TOUCH_EVERY = 0.03  # seconds between two touches


def _touch_while_running(proc, path: Path, *, write_after: int | None = None) -> tuple:
    """Run `touch path` every TOUCH_EVERY s while `proc` runs (and overwrite 4096 bytes after `write_after` touches).

    GNU touch opens the file for writing (O_WRONLY | O_CREAT | O_NONBLOCK),
    then sets its times, writing nothing: the open alone breaks a read lease.
    Returns (touches made while `proc` still ran, whether the write came
    while `proc` still ran).
    """
    touches, wrote = 0, None
    while proc.poll() is None:
        subprocess.run([TOUCH, path], check=True, timeout=60)
        touches += proc.poll() is None
        if write_after is not None and wrote is None and touches >= write_after:
            writer = os.open(path, os.O_WRONLY)
            try:
                os.pwrite(writer, b"\x7f" * 4096, path.stat().st_size // 2)  # other bytes, the same size
            finally:
                os.close(writer)
            wrote = proc.poll() is None
        time.sleep(TOUCH_EVERY)
    return touches, wrote


# A read of 128 MiB takes about 0.5 s here (over 1 s under load): many touches.
TOUCHED_COUNT = 32 << 20
# The tests that need several touches within one read race a real process's start against the read:
# on a machine busy with other tests a touch can take as long as the read. They run with the slow
# tests, one at a time.
several_touches = pytest.mark.slow


@several_touches
@needs_leases
@needs_touch
@pytest.mark.parametrize("command, lease", [("info --stats in.pb", True), ("compare in.pb in.pb", True),
                                            ("info --stats in.pb", False)],
                         ids=["info-leased", "compare-leased", "info-unleased"])
def test_a_real_touch_while_an_input_is_read_does_not_stop_the_command(tmp_path, unleased, command, lease):
    # A leased input's lease is broken by the first touch, which opens the file for writing; the
    # read goes on, watched, and the touches after it (opens, new times, no bytes) change nothing.
    path = write_float_blob(tmp_path / "in.pb", TOUCHED_COUNT)
    expected = run_blobtool(*command.split(), cwd=tmp_path, text=True, timeout=120)
    assert expected.returncode == 0, expected.stderr
    if not lease:
        unleased(path)
    proc = subprocess.Popen(blobtool_cmd(*command.split()), cwd=tmp_path, env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if lease:
        _wait_for_lease(proc, path)  # the first touch finds the lease held
    else:
        _wait_for_map(proc, path)
    touches, _ = _touch_while_running(proc, path)
    stdout, stderr = proc.communicate(timeout=120)
    assert (proc.returncode, stderr) == (0, "")
    assert touches >= 2, "the read ended before a second touch: the file is too small for this machine"
    assert stdout == expected.stdout


@several_touches
@needs_leases
@needs_touch
@pytest.mark.parametrize("lease", [True, False], ids=["leased", "unleased"])
def test_a_real_touch_then_a_write_while_an_input_is_read_is_exit_3_one_line(tmp_path, unleased, lease):
    # The same touches, and then bytes really written (the same size): the watch that took over
    # from the broken lease stops the read.
    path = write_float_blob(tmp_path / "in.pb", TOUCHED_COUNT)
    if not lease:
        unleased(path)
    proc = subprocess.Popen(blobtool_cmd("info", "--stats", "in.pb"), cwd=tmp_path, env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if lease:
        _wait_for_lease(proc, path)
    else:
        _wait_for_map(proc, path)
    _, wrote = _touch_while_running(proc, path, write_after=2)
    _, stderr = proc.communicate(timeout=120)
    # `wrote` False or None: the read ended before the write came (the file is too small for this machine).
    assert (proc.returncode, stderr, wrote) == (3, UNLEASED_CHANGED.format("in.pb"), True)


@needs_leases
@needs_touch
def test_a_lease_broken_where_no_watch_can_be_had_still_stops_the_read(tmp_path):
    # Without inotify nothing could tell the touch from a write of the same length: the read stops.
    path = write_float_blob(tmp_path / "in.pb", TOUCHED_COUNT)
    proc = subprocess.Popen([sys.executable, "-c", UNWATCHED, "info", "--stats", "in.pb"], cwd=tmp_path,
                            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_lease(proc, path)
    _touch_while_running(proc, path)
    _, stderr = proc.communicate(timeout=120)
    assert (proc.returncode, stderr) == (3, "blobtool: in.pb: changed while it was read: another process opened it "
                                            "for writing or truncated it\n")


# The lease breaks while the command runs code that cannot take an exception: a __del__ method (whose
# exception Python prints and drops, so the command would go on) or the import machinery (whose module
# locks an exception leaves half taken: "release unlocked lock"). The writer runs from there.
BROKEN_WHERE_NOTHING_CAN_BE_RAISED = """
import subprocess, sys
from blobtool.files import mapped
mapped.Guard.add_watch = lambda guard, fd, name: None
held = mapped.Guard.hold_lease

class Writer:
    def __del__(self):
        subprocess.run([sys.argv[1], "in.pb"], check=True)  # blocks until blobtool gives the lease up

def hold_lease(guard, fd, name, watched):
    held(guard, fd, name, watched)
    Writer()  # its __del__ runs here, the lease held

mapped.Guard.hold_lease = hold_lease
from blobtool.cli import main
main(sys.argv[2:])
"""


@needs_leases
@needs_touch
def test_a_lease_broken_where_nothing_can_be_raised_stops_the_command_at_its_end(tmp_path):
    write_float_blob(tmp_path / "in.pb", 1 << 16)
    done = subprocess.run([sys.executable, "-c", BROKEN_WHERE_NOTHING_CAN_BE_RAISED, TOUCH, "info", "--stats",
                           "in.pb"], cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (3, "blobtool: in.pb: changed while it was read: another process "
                                                 "opened it for writing or truncated it\n")


BROKEN_BEFORE_HELD = """
import os, subprocess, sys
from blobtool import files as source
from blobtool.files import inputs

with source.guarded():
    path, touch = sys.argv[1:]
    real_map = inputs._map

    def map_then_touch(fd, name, size):  # the lease is taken, not yet held: its SIGIO finds nothing to look at
        mapped = real_map(fd, name, size)
        subprocess.run([touch, path], check=True)
        return mapped

    inputs._map = map_then_touch
    opened = source.open_source(path)
    inode = str(os.stat(path).st_ino)
    with open("/proc/locks") as locks:  # "1: LEASE BREAKING READ <pid> <dev>:<inode> ..." while it is kept
        print(any(f[1] == "LEASE" and f[5].split(":")[-1] == inode for f in map(str.split, locks) if len(f) > 5),
              bytes(opened.buf[:4]) == open(path, "rb").read(4))
"""


@needs_leases
@needs_touch
def test_a_lease_broken_before_blobtool_holds_it_is_given_up(tmp_path):
    # Kept, it would hold every later writer back for /proc/sys/fs/lease-break-time (45 s).
    path = write_float_blob(tmp_path / "in.pb", 1000)
    result = subprocess.run([sys.executable, "-c", BROKEN_BEFORE_HELD, str(path), TOUCH], env=subprocess_env(),
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr, result.stdout) == (0, "", "False True\n")


def _wait_for_map(proc, path: Path, timeout: float = 60.0) -> None:
    """Until process `proc` maps `path` (/proc/PID/maps)."""
    deadline = time.monotonic() + timeout
    inode = str(path.stat().st_ino)
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError), open(f"/proc/{proc.pid}/maps") as maps:
            if any(len(fields) > 5 and fields[4] == inode for fields in map(str.split, maps)):
                return
        time.sleep(0.002)
    raise AssertionError("blobtool did not map its input")


def _change(writer: int, path: Path, change: str) -> None:
    if change == "truncate":
        os.ftruncate(writer, 1000)
    elif change == "rewrite":  # cut and grown back to its length: the same size, other bytes
        size = path.stat().st_size
        os.ftruncate(writer, size // 2)
        os.ftruncate(writer, size)
    else:  # bytes overwritten in place: no size, no inode changes
        os.pwrite(writer, b"\x7f" * 4096, path.stat().st_size // 2)


CHANGES = ["truncate", "rewrite", "same size"]
UNLEASED_CHANGED = "blobtool: {}: changed while it was read: another process wrote to it or truncated it\n"


@needs_leases
@pytest.mark.parametrize("change", CHANGES)
def test_an_unleased_input_written_to_while_it_is_written_out_is_exit_3_one_line(tmp_path, unleased, change):
    # Standard output is a pipe nobody reads yet: blobtool is held mid-write, deterministically.
    path = write_float_blob(tmp_path / "in.pb", 10_000_000)
    writer = os.open(path, os.O_WRONLY)
    unleased(path)
    proc = subprocess.Popen(blobtool_cmd("convert", "--double", path, "-o", "-"), env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for_map(proc, path)
        assert proc.stdout.read(1000)  # it is writing
        assert not _leased(path)
        _change(writer, path, change)
        _, stderr = proc.communicate(timeout=60)
    finally:
        os.close(writer)
    assert proc.returncode == 3, stderr
    assert stderr.decode() == UNLEASED_CHANGED.format(path)


@pytest.mark.parametrize("delay", [0.0, 0.05])
@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize("command", ["norm in.pb", "info --stats in.pb", "compare in.pb in.pb"])
def test_an_unleased_input_written_to_while_it_is_read_is_never_a_signal(tmp_path, unleased, command, change, delay):
    # Whenever the change comes, blobtool finishes (exit 0) or says so (exit 3); never SIGBUS.
    path = write_float_blob(tmp_path / "in.pb", 40_000_000)
    writer = os.open(path, os.O_WRONLY)
    unleased(path)
    proc = subprocess.Popen(blobtool_cmd(*command.split()), cwd=tmp_path, env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_map(proc, path)
        time.sleep(delay)
        _change(writer, path, change)
        _, stderr = proc.communicate(timeout=120)
    finally:
        os.close(writer)
    assert proc.returncode in (0, 3), stderr
    # compare opens the file twice: the second open may find it cut short already (a bad input then).
    assert stderr == "" or re.fullmatch(r"blobtool: in\.pb: (changed while it was read: |truncated at )[^\n]+\n",
                                        stderr), stderr


@pytest.mark.parametrize("how", ["--double", "--float"], ids=["numpy (SIGBUS)", "write(2) (EFAULT)"])
def test_a_truncation_under_the_mapping_is_exit_3_one_line_never_sigbus(tmp_path, unleased, how):
    # Without inotify, convert copies the values out through the mapping: the truncated pages fault
    # in numpy (--double widens them: SIGBUS, caught by blobtool's handler) or in the kernel's write
    # from them (--float writes them as they are: EFAULT). Either is exit 3, one line, the temporary
    # output removed.
    path = write_float_blob(tmp_path / "in.pb", 50_000_000)
    (tmp_path / "out.pb").write_bytes(EARLIER)
    writer = os.open(path, os.O_WRONLY)
    unleased(path)
    proc = subprocess.Popen([sys.executable, "-c", UNWATCHED, "convert", how, "in.pb", "-o", "out.pb"], cwd=tmp_path,
                            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for_temp(proc, tmp_path, 1 << 20) is not None
        os.ftruncate(writer, 1000)
        _, stderr = proc.communicate(timeout=120)
    finally:
        os.close(writer)
    assert proc.returncode == 3, stderr
    # The fault's own line, or the size check's when it runs first (before the failed write is reported).
    assert stderr in ("blobtool: in.pb: changed while it was read: it ended before a byte read through its memory "
                      "map (another process truncated it, or its storage failed)\n",
                      "blobtool: in.pb: changed while it was read: another process wrote to it or truncated it\n")
    assert (tmp_path / "out.pb").read_bytes() == EARLIER
    assert temps(tmp_path) == []
