"""The input is never changed (including when -o names it); inputs that are not regular files; the process's limits.

Folders, unreadable files, character devices, pipes and endless streams (read
up to their bound), names that are not UTF-8; too few descriptors or too little
address space are one line naming the limit, never a traceback.
"""

from __future__ import annotations

import base64
import json
import os
import re
import resource
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import blobtool
from blobtool.formats.caffe import wire
from builders import blob_bytes
from runner import BLOBTOOL, blobtool_cmd, run_blobtool, run_pipeline, subprocess_env

from filecases import digest, small_net, temps, write_float_blob

# -- the input never changes ---------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["info", "--stats", "in.pb"],
    ["norm", "in.pb"],
    ["convert", "--double", "in.pb", "-o", "out.pb"],
    ["scale", "in.pb", "3", "-o", "out.pb"],
    ["scale", "in.pb", "3", "--diff-factor", "-1", "-o", "out.npz"],
    ["update", "in.pb", "-o", "out.pb"],
    ["compare", "in.pb", "in.pb"],
])
def test_the_input_never_changes(tmp_path, args):
    write_float_blob(tmp_path / "in.pb", 300_000, diff=True)
    before = digest(tmp_path / "in.pb")
    result = run_blobtool(*args, cwd=tmp_path, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert digest(tmp_path / "in.pb") == before


@pytest.mark.parametrize("args, expect", [
    (["scale", "in.pb", "3", "-o", "in.pb"], lambda v, d: (v * 3, d)),
    (["update", "in.pb", "-o", "in.pb"], lambda v, d: (v - d, d)),
    (["convert", "--double", "in.pb", "-o", "in.pb"], lambda v, d: (v, d)),
])
def test_output_naming_the_input_replaces_it_and_leaves_the_old_file_whole(tmp_path, args, expect):
    write_float_blob(tmp_path / "in.pb", 300_000, diff=True)
    before = digest(tmp_path / "in.pb")
    os.link(tmp_path / "in.pb", tmp_path / "keep.pb")  # the input's inode, under another name
    result = run_blobtool(*args, cwd=tmp_path, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    # The old file (its inode) is unchanged; the name now holds the result,
    # computed from the old values (not from half-written ones).
    assert digest(tmp_path / "keep.pb") == before
    old = blobtool.load(tmp_path / "keep.pb")
    new = blobtool.load(tmp_path / "in.pb")
    want_data, want_diff = expect(old.cpu_data().astype(np.float64), old.cpu_diff().astype(np.float64))
    np.testing.assert_allclose(new.cpu_data(), want_data, rtol=1e-6)
    np.testing.assert_allclose(new.cpu_diff(), want_diff, rtol=1e-6)
    assert temps(tmp_path) == []


def test_scaling_a_loaded_blob_in_memory_never_touches_the_file(tmp_path):
    # The library's copy-on-write mapping: scale_data and update write to
    # private pages; the file keeps its bytes, and -o may name it.
    path = write_float_blob(tmp_path / "in.pb", 300_000, diff=True)
    before = digest(path)
    blob = blobtool.load(path)
    blob.scale_data(-2.0)
    blob.update()
    assert digest(path) == before
    blobtool.save(blob, path)  # -o naming the input, in the library
    assert digest(path) != before
    again = blobtool.load(path)
    ramp = np.arange(300_000, dtype=np.float64)
    np.testing.assert_allclose(again.cpu_data(), -2 * ramp - ramp, rtol=1e-6)
    assert temps(tmp_path) == []


def test_input_opened_read_only_can_still_be_scaled_in_memory(tmp_path):
    # A file object opened "rb" is mapped copy-on-write: scaling the loaded
    # blob works without write access, and the file keeps its bytes.
    path = write_float_blob(tmp_path / "in.pb", 1000)
    before = digest(path)
    with open(path, "rb") as f:
        blob = blobtool.load(f)
        blob.scale_data(2)
    np.testing.assert_array_equal(blob.cpu_data(), 2 * np.arange(1000, dtype=np.float32))
    assert digest(path) == before


# -- inputs that are not regular files, folders, unreadable files --------------------------------

READERS = [
    ["info", "X"], ["norm", "X"], ["compare", "X", "small.pb"], ["compare", "small.pb", "X"],
    ["convert", "X", "-o", "out.pb"], ["scale", "X", "2", "-o", "out.pb"], ["update", "X", "-o", "out.pb"],
    ["show", "X"],
]


def _unreadable(tmp_path: Path) -> Path:
    path = tmp_path / "locked.pb"
    path.write_bytes(small_net())
    path.chmod(0)
    if os.access(path, os.R_OK):  # root reads anything, but not a write-only entry of /proc/sys
        path = Path("/proc/sys/vm/compact_memory")
        if not path.exists() or os.access(path, os.R_OK):
            pytest.skip("running as root, and no unreadable file to read here")
    return path


@pytest.mark.parametrize("args", READERS, ids=[" ".join(a) for a in READERS])
@pytest.mark.parametrize("what", ["folder", "unreadable"])
def test_a_folder_or_an_unreadable_input_is_exit_3_for_every_command(tmp_path, small, args, what):
    if what == "folder":
        (tmp_path / "sub").mkdir()
        target, reason = "sub", "is a directory"
        if args[0] in ("info", "norm"):  # they read folders: this one holds nothing to read
            from blobtool.formats import EXTENSIONS

            reason = f"is a folder holding no file that blobtool reads ({', '.join(EXTENSIONS)})"
    else:
        target, reason = str(_unreadable(tmp_path)), "cannot open: Permission denied"
    result = run_blobtool(*[target if a == "X" else a for a in args], cwd=tmp_path, text=True)
    assert result.returncode == 3
    assert result.stderr == f"blobtool: {target}: {reason}\n"
    assert not (tmp_path / "out.pb").exists()


@pytest.mark.parametrize("how", ["path", "stdin"])
def test_a_character_device_input_is_refused_at_once(tmp_path, how):
    # /dev/zero never ends: refused before anything is read.
    args, kw = (["info", "/dev/zero"], {}) if how == "path" else (["info", "-"], {"stdin": open("/dev/zero", "rb")})
    try:
        result = run_blobtool(*args, cwd=tmp_path, text=True, timeout=30, **kw)
    finally:
        for f in kw.values():
            f.close()
    name = "/dev/zero" if how == "path" else "<stdin>"
    assert result.returncode == 3
    assert result.stderr == f"blobtool: {name}: is a character device, not a file or a pipe\n"


def test_dev_null_on_stdin_is_an_empty_input(tmp_path):
    result = run_blobtool("info", "-", stdin=subprocess.DEVNULL, cwd=tmp_path, text=True)
    assert result.returncode == 3
    assert result.stderr == "blobtool: <stdin>: empty file: a Caffe file holds at least one field\n"


def test_a_stream_is_read_up_to_its_bound(tmp_path, small):
    size = small.stat().st_size
    for limit, code in ((size, 0), (size - 1, 3)):
        result = run_pipeline(f"cat small.pb | BLOBTOOL_MAX_STREAM_BYTES={limit} {BLOBTOOL} norm", tmp_path, text=True)
        assert result.returncode == code, result.stderr
        if code:
            assert result.stderr == (f"blobtool: <stdin>: more than {limit} bytes from a stream (blobtool's limit, "
                                     "BLOBTOOL_MAX_STREAM_BYTES changes it; a file has no limit)\n")


def test_standard_input_from_a_file_is_read_as_the_file_without_the_bound(tmp_path, small):
    result = run_pipeline(f"BLOBTOOL_MAX_STREAM_BYTES=10 {BLOBTOOL} norm --json < small.pb", tmp_path, text=True)
    assert result.returncode == 0, result.stderr
    expected = run_blobtool("norm", "--json", "small.pb", cwd=tmp_path, text=True)
    assert json.loads(result.stdout)["blobs"] == json.loads(expected.stdout)["blobs"]


def test_an_endless_stream_stops_at_the_bound(tmp_path):
    result = run_pipeline(f"cat /dev/zero | BLOBTOOL_MAX_STREAM_BYTES=50000000 {BLOBTOOL} info -", tmp_path,
                          text=True, timeout=60)
    assert result.returncode == 3
    assert result.stderr.startswith("blobtool: <stdin>: more than 50000000 bytes from a stream")


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "", "+5"])
def test_a_bad_stream_bound_is_a_usage_error(tmp_path, small, value):
    result = run_pipeline(f"cat small.pb | BLOBTOOL_MAX_STREAM_BYTES={value} {BLOBTOOL} info", tmp_path, text=True)
    assert result.returncode == 2
    assert result.stderr == (f"blobtool: environment variable BLOBTOOL_MAX_STREAM_BYTES={value!r} is not a byte count: "
                             "expected a whole number >= 0\n")


def test_a_named_pipe_is_read_as_a_stream(tmp_path, small):
    os.mkfifo(tmp_path / "fifo")
    feeder = threading.Thread(target=lambda: (tmp_path / "fifo").write_bytes(small.read_bytes()), daemon=True)
    feeder.start()
    result = run_blobtool("norm", "--json", "fifo", cwd=tmp_path, text=True)
    feeder.join(timeout=60)
    assert result.returncode == 0, result.stderr
    expected = run_blobtool("norm", "--json", "small.pb", cwd=tmp_path, text=True)
    assert json.loads(result.stdout)["blobs"] == json.loads(expected.stdout)["blobs"]


def test_a_file_the_kernel_calls_empty_is_read_as_a_stream(tmp_path):
    # /proc/self/status has size 0 in stat() but holds text: it is read, and refused for what it holds.
    result = run_blobtool("info", "/proc/self/status", cwd=tmp_path, text=True)
    assert result.returncode == 3
    assert "empty file" not in result.stderr
    assert result.stderr.startswith("blobtool: /proc/self/status: ") and result.stderr.count("\n") == 1


def test_a_file_name_that_is_not_utf8_is_kept_byte_for_byte_in_json(tmp_path, small):
    raw = b"caf\xff\xfe.pb"
    os.link(small, os.path.join(os.fsencode(tmp_path), raw))
    name = os.fsdecode(raw)
    for args, key in ((["info", "--json", name], "path"), (["norm", "--json", name], "path"),
                      (["compare", "--json", name, "small.pb"], "a"), (["compare", "--json", "small.pb", name], "b")):
        result = run_blobtool(*args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        record = json.loads(result.stdout.decode("utf-8"))  # strict UTF-8: no lone surrogates
        assert record[key] == "caf\ufffd\ufffd.pb"
        assert base64.b64decode(record[key + "_base64"]) == raw
        assert list(record).index(key + "_base64") == list(record).index(key) + 1
        assert "path_base64" not in json.loads(run_blobtool("info", "--json", "small.pb", cwd=tmp_path).stdout)


# -- the process's own limits: one line naming the limit, never a traceback --------------------------

def _limited(which, value):
    def preexec():
        resource.setrlimit(which, (value, resource.getrlimit(which)[1]))
    return preexec


@pytest.mark.slow
@pytest.mark.parametrize("command", ["compare in.pb in.pb", "info in.pb in.pb", "norm in.pb in.pb",
                                     "convert in.pb -o out.npy"])
def test_too_few_descriptors_is_exit_3_naming_the_limit(tmp_path, command):
    write_float_blob(tmp_path / "in.pb", 1000)
    outcomes = set()
    for limit in range(5, 16):  # with 4, Python itself cannot start
        res = subprocess.run(blobtool_cmd(*command.split()), cwd=tmp_path, env=subprocess_env(), capture_output=True,
                             text=True, timeout=60, preexec_fn=_limited(resource.RLIMIT_NOFILE, limit))
        if res.returncode == 0:
            assert res.stderr == ""
            outcomes.add(0)
            continue
        assert res.returncode in (3, 5), (limit, res.stderr)
        # One line (info and norm: one per input they could not open).
        for line in res.stderr.splitlines(keepends=True):
            assert re.fullmatch(r"blobtool: (in|out)\.\w+: cannot [^:]+: Too many open files \(this process's "
                                rf"limit on open files, ulimit -n, is {limit}\)\n", line), (limit, res.stderr)
        assert command.startswith(("info", "norm")) or res.stderr.count("\n") == 1
        outcomes.add(res.returncode)
    assert 0 in outcomes and 3 in outcomes  # the limits tried reach from too few to enough
    assert temps(tmp_path) == []


@pytest.mark.skipif(sys.maxsize < 2 ** 40, reason="needs a 64-bit address space")
def test_a_mapping_refused_for_address_space_is_exit_3_naming_the_limit(tmp_path):
    # A sparse file of 3 GiB of zeros: more than the address space allowed (ulimit -v) can map.
    count = 3 << 28
    path = tmp_path / "in.pb"
    with open(path, "wb") as f:
        f.write(blob_bytes(shape=[count]) + wire.len_field_header(5, 4 * count))
        f.truncate(f.tell() + 4 * count)
    limit = 2 << 30
    res = run_blobtool("norm", path, text=True, preexec_fn=_limited(resource.RLIMIT_AS, limit))
    assert res.returncode == 3, res.stderr
    assert res.stderr == (f"blobtool: {path}: cannot map the file: Cannot allocate memory (this process's limit on "
                          f"address space, ulimit -v, is {limit // 1024} KiB)\n")
