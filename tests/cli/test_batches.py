"""Batches and folders: a bad file is one line and the others are reported, worker processes, folders read in order.

Every command-line check runs the real command (tests/helpers/runner.py); numpy, the protobuf library,
h5py and the safetensors package read what was written.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from blobtool.errors import ExitCode
from blobtool.formats import EXTENSIONS
from builders import Layer, write_blob, write_net, write_npy, write_npz
from runner import error_lines, invoke, json_lines, run_blobtool


# -- batches and folders ----------------------------------------------------------------------

@pytest.fixture
def batch(tmp_path):
    good_a = write_blob(tmp_path / "a.pb", [1.0, 2.0])
    bad = tmp_path / "bad.caffemodel"
    bad.write_bytes(b"\x0a\x05ab")  # a name field that declares 5 bytes, 2 remain
    good_c = write_npy(tmp_path / "c.npy", np.array([3.0, 4.0], dtype=np.float32))
    return good_a, bad, good_c


@pytest.mark.parametrize("command", ["info", "norm"])
def test_a_bad_file_in_a_batch_is_one_line_and_the_others_are_still_reported(batch, command):
    good_a, bad, good_c = batch
    alone = run_blobtool(command, bad, text=True)
    assert alone.returncode == ExitCode.INPUT
    result = run_blobtool(command, "--json", good_a, bad, good_c, text=True)
    assert result.returncode == ExitCode.INPUT
    assert [r["path"] for r in map(json.loads, result.stdout.splitlines())] == [str(good_a), str(good_c)]
    assert result.stderr == alone.stderr  # exactly the line the bad file gets on its own
    table = run_blobtool(command, bad, good_a, good_c, text=True)
    assert table.returncode == ExitCode.INPUT
    assert str(good_a) in table.stdout and str(good_c) in table.stdout
    assert table.stderr == alone.stderr


@pytest.mark.parametrize("command", ["info", "norm"])
def test_fail_fast_stops_at_the_first_bad_file(batch, command):
    good_a, bad, good_c = batch
    result = run_blobtool(command, "--json", "--fail-fast", good_a, bad, good_c, text=True)
    assert result.returncode == ExitCode.INPUT
    assert [json.loads(line)["path"] for line in result.stdout.splitlines()] == [str(good_a)]
    assert len(error_lines(result)) == 1


@pytest.mark.parametrize("fail_fast", [False, True])
def test_a_batch_in_worker_processes_reports_the_same(batch, fail_fast):
    good_a, bad, good_c = batch
    flags = ["--fail-fast"] if fail_fast else []
    args = ["info", "--json", *flags, good_a, bad, good_c, good_a]
    one = run_blobtool(*args, "-j", "1", text=True)
    pool = run_blobtool(*args, "-j", "2", env={"BLOBTOOL_PARALLEL_MIN_BYTES": "0"}, text=True)
    assert (pool.returncode, pool.stdout, pool.stderr) == (one.returncode, one.stdout, one.stderr)
    assert one.returncode == ExitCode.INPUT
    assert len(one.stdout.splitlines()) == (1 if fail_fast else 3)


def test_the_worst_code_wins_over_a_failed_check(batch, tmp_path):
    good_a, bad, _ = batch
    nan = write_blob(tmp_path / "nan.pb", [np.nan])
    result = invoke("info", "--check", "finite", nan, bad, good_a)
    assert result.exit_code == ExitCode.INPUT
    assert len(error_lines(result)) == 2  # the check's line and the bad file's
    assert invoke("info", "--check", "finite", nan, good_a).exit_code == ExitCode.DIFFERENT


@pytest.fixture
def zoo(tmp_path):
    root = tmp_path / "zoo.v1"
    (root / "b.models" / "deep").mkdir(parents=True)
    (root / "empty.d").mkdir()
    write_blob(root / "b.models" / "deep" / "z.binaryproto", [5.0])
    write_blob(root / "b.models" / "mean.PB", [4.0])
    write_npy(root / "a.npy", np.array([1.0], dtype=np.float32))
    write_npz(root / "b.npz", {"x": np.array([2.0], dtype=np.float32)})
    write_net(root / "c.caffemodel", "new", [Layer("conv1", "Convolution", [np.array([3.0], np.float32)])])
    (root / "notes.txt").write_text("not a blob")
    (root / "net.prototxt").write_text("layer {}")
    (root / "b.models" / "deep" / "x.caffemodel.bak").write_bytes(b"junk")
    return root


ZOO_ORDER = ["a.npy", "b.models/deep/z.binaryproto", "b.models/mean.PB", "b.npz", "c.caffemodel"]


@pytest.mark.parametrize("command", ["info", "norm"])
def test_a_folder_is_read_recursively_in_sorted_order(zoo, command):
    result = run_blobtool(command, "--json", zoo, text=True)
    assert result.returncode == 0, result.stderr
    # The files without an extension blobtool reads are counted, not read.
    assert result.stderr == (f"blobtool: warning: {zoo}: skipped 3 files without an extension blobtool reads "
                             f"(b.models/deep/x.caffemodel.bak, net.prototxt, notes.txt); name them as arguments, "
                             "or give --all-files, to read them\n")
    paths = [json.loads(line)["path"] for line in result.stdout.splitlines()]
    assert paths == [str(zoo / name) for name in ZOO_ORDER]


def test_a_folder_without_readable_files_is_one_line_and_exit_3(zoo):
    empty = zoo / "empty.d"
    result = run_blobtool("info", empty, text=True)
    assert result.returncode == ExitCode.INPUT
    assert error_lines(result) == [f"blobtool: {empty}: is a folder holding no file that blobtool reads "
                                   f"({', '.join(EXTENSIONS)})"]
    assert result.stdout == ""
    result = invoke("norm", "--json", empty, zoo / "a.npy")
    assert result.exit_code == ExitCode.INPUT
    assert [r["path"] for r in json_lines(result)] == [str(zoo / "a.npy")]


@pytest.mark.parametrize("args", [["convert", "{}", "-o", "{out}"], ["compare", "{}", "{}"], ["show", "{}"],
                                  ["scale", "{}", "2", "-o", "{out}"], ["update", "{}", "-o", "{out}"]])
def test_other_commands_still_refuse_a_folder(zoo, tmp_path, args):
    args = [a.format(zoo, out=tmp_path / "o.pb") for a in args]
    result = invoke(*args)
    assert result.exit_code == ExitCode.INPUT
    assert error_lines(result) == [f"blobtool: {zoo}: is a directory"]
    assert not (tmp_path / "o.pb").exists()
