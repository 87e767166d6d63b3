"""The command line never loses its output: a temporary file, fsynced, renamed; failures, signals, closed pipes.

- Output goes to a temporary file beside the target, is fsynced, then renamed
  over it (the order is checked by tracing the calls in a real process).
- After a failure no temporary file remains; after SIGKILL the earlier output
  is byte-identical and the target is never partial (a hidden temporary file
  may remain: nothing runs after SIGKILL to remove it).
- A file-size limit (RLIMIT_FSIZE, as a full disk) during a write: exit 5, one
  line, earlier output intact, no temporary file.
- SIGINT, SIGTERM, SIGHUP mid-write: exit 128 + the signal, one line, no
  traceback, no partial output; a signal ignored at start stays ignored.
- A closed pipe (| head -1) is a quiet exit 0.
"""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from blobtool._pb import blobtool_caffe_pb2 as pb
from builders import vector_bytes
from runner import BLOBTOOL, blobtool_cmd, run_blobtool, run_pipeline, subprocess_env

from filecases import EARLIER, EXPECTED_SIZE, TEMP, digest, small_net, temps, wait_for_temp, write_float_blob

# -- temporary file, fsync, rename ----------------------------------------------------------

TRACE = r"""
import os, sys
log = open(os.environ["TRACE_LOG"], "w")
def traced(name, fn):
    def call(*args, **kw):
        shown = [os.path.basename(a) if isinstance(a, str) else ("fd" if isinstance(a, int) else type(a).__name__)
                 for a in args]
        log.write(name + " " + " ".join(shown) + "\n"); log.flush()
        return fn(*args, **kw)
    return call
os.fsync = traced("fsync", os.fsync)
os.replace = traced("replace", os.replace)
os.unlink = traced("unlink", os.unlink)
import tempfile
tempfile.mkstemp = traced("mkstemp", tempfile.mkstemp)
from blobtool.cli import main
sys.argv[0] = "blobtool"
main()
"""


@pytest.mark.parametrize("args, target", [
    (["convert", "--double", "small.pb", "-o", "out.pb"], "out.pb"),
    (["scale", "small.pb", "2", "-o", "out.pb"], "out.pb"),
    (["convert", "net.caffemodel", "-o", "out.caffemodel"], "out.caffemodel"),
    (["convert", "small.pb", "-o", "out.npz"], "out.npz"),
    (["convert", "small.pb", "-o", "out.npy"], "out.npy"),
])
def test_output_is_a_fsynced_temporary_file_renamed_over_the_target(tmp_path, small, args, target):
    (tmp_path / "net.caffemodel").write_bytes(small_net())
    (tmp_path / target).write_bytes(EARLIER)
    log = tmp_path / "trace.log"
    result = subprocess.run([sys.executable, "-c", TRACE, *args], cwd=tmp_path, capture_output=True, text=True,
                            env=subprocess_env(TRACE_LOG=str(log)), timeout=60)
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    # mkstemp(prefix=".<target>.", suffix=".tmp", dir=the target's folder), then fsync of the file,
    # rename over the target, fsync of the folder.
    assert calls[0].startswith("mkstemp")
    replace = [c for c in calls if c.startswith("replace")]
    assert len(replace) == 1
    _, temp, final = replace[0].split()
    assert final == target and TEMP.match(temp).group("target") == target
    assert calls.index(replace[0]) > calls.index("fsync fd")  # the data is on disk before the rename
    assert calls[-1] == "fsync fd"                            # and the folder's entry after it
    assert not any(c.startswith("unlink") for c in calls)
    assert (tmp_path / target).read_bytes() != EARLIER
    assert temps(tmp_path) == []


# -- failures leave nothing behind ------------------------------------------------------------

def _limit_file_size(limit: int):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG from write() rather than death by signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


@pytest.mark.parametrize("args, target", [
    (["convert", "--double", "in.pb", "-o", "out.pb"], "out.pb"),
    (["scale", "in.pb", "0.5", "-o", "out.pb"], "out.pb"),
    (["update", "in.pb", "-o", "out.pb"], "out.pb"),
    (["convert", "in.pb", "-o", "out.npz"], "out.npz"),
    (["convert", "in.pb", "-o", "out.npy"], "out.npy"),
    (["convert", "--double", "net.caffemodel", "-o", "out.caffemodel"], "out.caffemodel"),
])
def test_file_size_limit_is_exit_5_one_line_and_nothing_changes(tmp_path, args, target):
    write_float_blob(tmp_path / "in.pb", 1_000_000, diff=True)   # 8 MB in, 4 to 16 MB out
    net = pb.NetParameter()
    net.ParseFromString(small_net())
    net.layer[0].blobs[0].data.extend([0.5] * 300_000)
    net.layer[0].blobs[0].shape.dim[0] = 300_006
    (tmp_path / "net.caffemodel").write_bytes(net.SerializeToString())
    (tmp_path / target).write_bytes(EARLIER)
    inputs = {p: digest(p) for p in (tmp_path / "in.pb", tmp_path / "net.caffemodel")}
    result = run_blobtool(*args, cwd=tmp_path, text=True, preexec_fn=_limit_file_size(1 << 20))
    assert result.returncode == 5, result.stderr
    assert result.stderr == f"blobtool: {target}: cannot write: File too large\n"
    assert result.stdout == ""
    assert (tmp_path / target).read_bytes() == EARLIER
    assert temps(tmp_path) == []
    assert {p: digest(p) for p in inputs} == inputs


FAIL = r"""
import errno, os, sys
where = os.environ["FAIL_AT"]
def failing(fn):
    def call(*args, **kw):
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    return call
if where == "fsync":
    os.fsync = failing(os.fsync)
elif where == "replace":
    os.replace = failing(os.replace)
from blobtool.cli import main
sys.argv[0] = "blobtool"
main()
"""


@pytest.mark.parametrize("where", ["fsync", "replace"])
@pytest.mark.parametrize("args, target", [
    (["convert", "--double", "small.pb", "-o", "out.pb"], "out.pb"),
    (["convert", "net.caffemodel", "-o", "out.caffemodel"], "out.caffemodel"),
    (["convert", "small.pb", "-o", "out.npz"], "out.npz"),
])
def test_failure_after_the_data_is_written_is_exit_5_and_leaves_no_temporary_file(tmp_path, small, where, args,
                                                                                   target):
    # An I/O error from fsync or from the rename (injected in a real process).
    (tmp_path / "net.caffemodel").write_bytes(small_net())
    (tmp_path / target).write_bytes(EARLIER)
    result = subprocess.run([sys.executable, "-c", FAIL, *args], cwd=tmp_path, capture_output=True, text=True,
                            env=subprocess_env(FAIL_AT=where), timeout=60)
    assert result.returncode == 5
    assert result.stderr == f"blobtool: {target}: cannot write: Input/output error\n"
    assert (tmp_path / target).read_bytes() == EARLIER
    assert temps(tmp_path) == []


def test_a_folder_as_the_target_is_a_usage_error_and_writes_nothing(tmp_path, small):
    (tmp_path / "out.pb").mkdir()
    result = run_blobtool("convert", "small.pb", "-o", "out.pb", cwd=tmp_path, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert temps(tmp_path) == [] and list((tmp_path / "out.pb").iterdir()) == []


def test_missing_output_folder_is_exit_5(tmp_path, small):
    result = run_blobtool("convert", "small.pb", "-o", "nowhere/out.pb", cwd=tmp_path, text=True, timeout=120)
    assert result.returncode == 5
    assert result.stderr == (f"blobtool: nowhere/out.pb: cannot create a file in {tmp_path / 'nowhere'}: "
                             "No such file or directory\n")


@pytest.mark.parametrize("args", [
    ["convert", "small.pb", "-o", "-"],
    ["convert", "small.pb", "--format", "npz", "-o", "-"],
    ["convert", "net.caffemodel", "-o", "-"],
    ["info", "small.pb"],
    ["norm", "--json", "small.pb"],
])
def test_full_standard_output_is_exit_5_one_line(tmp_path, small, args):
    (tmp_path / "net.caffemodel").write_bytes(small_net())
    with open("/dev/full", "wb") as full:
        result = run_blobtool(*args, cwd=tmp_path, stdout=full, stderr=subprocess.PIPE, text=True)
    assert result.returncode == 5
    assert result.stderr == "blobtool: <stdout>: cannot write: No space left on device\n"


# -- SIGKILL and SIGINT in the middle of a write ------------------------------------------------

def _default_stop_signals() -> None:
    # A test run started under nohup hands blobtool an ignored SIGHUP, which it keeps ignored (as
    # it should): the signal tests start it as a terminal would.
    for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


def _start_convert(tmp_path: Path, big: Path) -> subprocess.Popen:
    return subprocess.Popen(blobtool_cmd("convert", "--double", big, "-o", "out.pb"), cwd=tmp_path,
                            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_stop_signals)




@pytest.fixture(scope="module")
def converted(big, tmp_path_factory) -> str:
    """The digest of an uninterrupted convert --double of `big`."""
    folder = tmp_path_factory.mktemp("whole")
    result = run_blobtool("convert", "--double", big, "-o", folder / "out.pb", text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (folder / "out.pb").stat().st_size == EXPECTED_SIZE
    found = digest(folder / "out.pb")
    (folder / "out.pb").unlink()
    return found


@pytest.mark.slow
@pytest.mark.parametrize("moment", [0.0, 0.25, 0.6, 1.0], ids=["at start", "a quarter written",
                                                            "most written", "all written"])
def test_sigkill_mid_write_leaves_the_earlier_output_intact(tmp_path, big, converted, moment):
    (tmp_path / "out.pb").write_bytes(EARLIER)
    before = digest(big)
    proc = _start_convert(tmp_path, big)
    try:
        if moment == 0.0:
            time.sleep(0.05)  # still starting up: nothing written yet
            caught = True
        else:
            caught = wait_for_temp(proc, tmp_path, int(moment * EXPECTED_SIZE)) is not None
        proc.kill()
    finally:
        proc.wait(timeout=60)
    target = (tmp_path / "out.pb").read_bytes() if (tmp_path / "out.pb").stat().st_size < 1000 else None
    if moment < 1.0:
        assert caught
        assert target == EARLIER
    else:
        # Killed after the whole file was written: before the rename (the
        # earlier output) or after it (the complete new one); never a mix.
        assert target == EARLIER or digest(tmp_path / "out.pb") == converted
    # A hidden temporary file may remain (nothing runs after SIGKILL); nothing else is there.
    assert {p.name for p in tmp_path.iterdir()} - set(temps(tmp_path)) == {"out.pb"}
    assert all(TEMP.match(t).group("target") == "out.pb" for t in temps(tmp_path))
    assert digest(big) == before
    for name in temps(tmp_path):
        (tmp_path / name).unlink()


@pytest.mark.parametrize("signum, code, line", [
    (signal.SIGINT, 130, "blobtool: interrupted\n"),
    (signal.SIGTERM, 143, "blobtool: interrupted by SIGTERM\n"),
    (signal.SIGHUP, 129, "blobtool: interrupted by SIGHUP\n"),
], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_stop_signal_mid_write_is_exit_128_plus_the_signal_with_no_partial_output(tmp_path, big, signum, code,
                                                                                    line):
    (tmp_path / "out.pb").write_bytes(EARLIER)
    proc = _start_convert(tmp_path, big)
    assert wait_for_temp(proc, tmp_path, EXPECTED_SIZE // 4) is not None
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code
    assert stderr == line
    assert stdout == ""
    assert (tmp_path / "out.pb").read_bytes() == EARLIER
    assert temps(tmp_path) == []


def test_a_hangup_ignored_at_start_stays_ignored(tmp_path, big, converted):
    # nohup: SIGHUP was ignored when blobtool started, so the write completes.
    proc = subprocess.Popen(blobtool_cmd("convert", "--double", big, "-o", "out.pb"), cwd=tmp_path,
                            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    assert wait_for_temp(proc, tmp_path, EXPECTED_SIZE // 4) is not None
    proc.send_signal(signal.SIGHUP)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert digest(tmp_path / "out.pb") == converted


# -- a closed pipe --------------------------------------------------------------------------------

@pytest.mark.parametrize("flags", ["", "--json", "--stats"])
def test_info_into_head_is_quiet(tmp_path, flags):
    # Far more than a pipe holds (64 KiB), so the writes after head exits fail.
    vector = vector_bytes([[float(k)] for k in range(2000)])
    for k in range(3):
        (tmp_path / f"w{k}.pb").write_bytes(vector)
    result = run_pipeline(f"{BLOBTOOL} info {flags} w*.pb | head -1", tmp_path, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert len(result.stdout.splitlines()) == 1


def test_binary_output_into_a_closed_pipe_is_quiet(tmp_path, big):
    result = run_pipeline(f"{BLOBTOOL} convert --double {big} -o - | head -c 100 > /dev/null", tmp_path, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
