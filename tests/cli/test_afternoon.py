"""A user's afternoon with real habits: no output in another format than asked, no values lost to Inf
in silence, batches and folders, compare's ranking and tolerance, help and errors, Blob for numpy.

Every command-line check runs the real command (tests/helpers/runner.py); numpy, the protobuf library,
h5py and the safetensors package read what was written.
"""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest
from safetensors.numpy import load_file

import blobtool
from blobtool.errors import ExitCode, UsageError
from blobtool.formats import EXTENSIONS, FORMATS
from builders import Layer, pb, write_blob, write_net, write_npy, write_npz
from runner import invoke, json_lines, one_json, run_blobtool


def listing(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def error_lines(result) -> list:
    return result.stderr.splitlines()


# -- output extensions -------------------------------------------------------------------------

@pytest.fixture
def small_net(tmp_path):
    return write_net(tmp_path / "net.caffemodel", "new",
                     [Layer("conv1", "Convolution", [np.arange(6, dtype=np.float32).reshape(2, 3),
                                                     np.array([0.5, -1.5], dtype=np.float32)])])


@pytest.mark.parametrize("name", ["x.weird", "x.json", "X.JSON", "mean.png", "dir.d/out.txt", "x.caffemodel.bak"])
def test_an_extension_blobtool_does_not_write_is_a_usage_error_naming_what_it_writes(tmp_path, small_net, name):
    (tmp_path / "dir.d").mkdir()
    before = listing(tmp_path)
    result = run_blobtool("convert", small_net, "-o", tmp_path / name, text=True)
    assert result.returncode == ExitCode.USAGE
    (line,) = error_lines(result)
    assert line.startswith(f"blobtool: {tmp_path / name}: blobtool does not write ")
    for fmt in FORMATS:
        for out in fmt.outputs:
            assert f"{out.name} ({', '.join(out.extensions)})" in line
    if name == "mean.png":
        assert "blobtool show -o" in line
    else:
        assert "--format" in line
    assert listing(tmp_path) == before  # nothing written, not even a temporary file


def test_names_without_an_extension_or_with_a_caffe_extension_keep_their_meaning(tmp_path, small_net):
    (tmp_path / "v1.2").mkdir()
    stored = small_net.read_bytes()
    for name in ("plain", "v1.2/plain", "snapshot_iter_100.caffemodel", "NET.CAFFEMODEL", ".hidden"):
        result = invoke("convert", small_net, "-o", tmp_path / name)
        assert result.exit_code == 0, result.stderr
        # The net written as itself: protobuf, the same bytes (nothing asked to change).
        assert (tmp_path / name).read_bytes() == stored
    result = invoke("convert", small_net, "--blob", "conv1/1", "-o", tmp_path / "bias.binaryproto")
    assert result.exit_code == 0, result.stderr
    proto = pb.BlobProto.FromString((tmp_path / "bias.binaryproto").read_bytes())
    assert list(proto.data) == [0.5, -1.5]


def test_the_last_extension_of_a_multi_dot_name_chooses_the_format(tmp_path, small_net):
    result = invoke("convert", small_net, "-o", tmp_path / "snap.caffemodel.h5")
    assert result.exit_code == 0, result.stderr
    with h5py.File(tmp_path / "snap.caffemodel.h5", "r") as f:
        assert f["data/conv1/0"][()].tolist() == [[0, 1, 2], [3, 4, 5]]
    result = invoke("convert", small_net, "-o", tmp_path / "w.v2.safetensors")
    assert result.exit_code == 0, result.stderr
    assert load_file(str(tmp_path / "w.v2.safetensors"))["conv1/1"].tolist() == [0.5, -1.5]


def test_format_overrides_an_unknown_extension(tmp_path, small_net):
    result = invoke("convert", small_net, "--format", "npz", "-o", tmp_path / "x.weird")
    assert result.exit_code == 0, result.stderr
    with np.load(tmp_path / "x.weird") as z:
        assert z["conv1/1"].tolist() == [0.5, -1.5]


def test_every_extension_blobtool_writes_is_one_it_reads_in_folders():
    # Text definitions aside: a folder of Caffe models holds solver.prototxt files, which are no nets.
    written = {ext for fmt in FORMATS for out in fmt.outputs for ext in out.extensions}
    read_only = {ext for fmt in FORMATS for ext in fmt.reads}  # PyTorch's .pt/.pth: read, never written
    assert (written - {".prototxt", ".pbtxt"}) | read_only == set(EXTENSIONS) and not written & read_only
    assert {".caffemodel", ".solverstate", ".binaryproto", ".pb", ".protobin", ".npy", ".npz", ".h5", ".hdf5",
            ".safetensors", ".pt", ".pth"} <= set(EXTENSIONS)


# -- --half: values past float16's range -------------------------------------------------------

SUMS = np.array([1.98e7, 5.0e4, 7.0e4, -1.0e5, 3.0], dtype=np.float32)     # 3 past 65504
WEIGHTS = np.array([0.5, 1e-6, 2e-9, -0.25, 0.0], dtype=np.float32)         # one subnormal, one to 0


def _half_counts(values):
    """(past range, subnormal, zero) as numpy's own float16 cast makes them: the oracle."""
    with np.errstate(over="ignore"):
        half = values.astype(np.float16)
    tiny = np.finfo(np.float16).tiny
    nonzero = values != 0
    return (int(np.count_nonzero(np.isinf(half))), int(np.count_nonzero(nonzero & (half != 0) & (abs(half) < tiny))),
            int(np.count_nonzero(nonzero & (half == 0))))


@pytest.fixture
def bn_net(tmp_path):
    return write_net(tmp_path / "bn.caffemodel", "new",
                     [Layer("conv1", "Convolution", [WEIGHTS]), Layer("bn1", "BatchNorm", [SUMS])])


def _expected_half_lines(path) -> list:
    over, sub, zero = _half_counts(SUMS)
    w_over, w_sub, w_zero = _half_counts(WEIGHTS)
    assert (over, w_over, w_sub, w_zero) == (3, 0, 1, 1)
    return [f"blobtool: warning: {path}: blob bn1/0: {over} of 5 values are past float16's range (largest "
            f"1.98e+07, float16 holds up to 65504): kept in float32 ({sub} values would have become subnormal "
            f"and {zero} zero)",
            f"blobtool: warning: {path}: --half: in the 1 blob(s) written in float16, {w_sub} values became "
            f"subnormal (below 6.1e-05) and {w_zero} became 0"]


@pytest.mark.parametrize("ext", [".caffemodel", ".npz", ".safetensors", ".h5"])
def test_half_keeps_a_blob_float16_cannot_hold_in_float32_with_one_line_saying_why(tmp_path, bn_net, ext):
    out = tmp_path / f"half{ext}"
    result = run_blobtool("convert", "--half", bn_net, "-o", out, text=True)
    assert result.returncode == 0, result.stderr
    assert error_lines(result) == _expected_half_lines(bn_net)
    if ext == ".caffemodel":
        net = pb.NetParameter.FromString(out.read_bytes())
        kept, halved = net.layer[1].blobs[0], net.layer[0].blobs[0]
        assert np.array(kept.data, dtype=np.float32).tolist() == SUMS.tolist()  # float32 `data`, exact
        assert len(halved.data) == 0  # NVIDIA's raw FLOAT16 fields, unknown to Caffe's schema
        loaded = blobtool.load_all(out)
        sums, weights = loaded["bn1/0"].cpu_data(), loaded["conv1/0"].cpu_data()
    elif ext == ".npz":
        with np.load(out) as z:
            sums, weights = z["bn1/0"], z["conv1/0"]
    elif ext == ".safetensors":
        tensors = load_file(str(out))
        sums, weights = tensors["bn1/0"], tensors["conv1/0"]
    else:
        with h5py.File(out, "r") as f:
            sums, weights = f["data/bn1/0"][()], f["data/conv1/0"][()]
    assert sums.dtype == np.float32 and sums.tolist() == SUMS.tolist()
    assert np.isfinite(sums).all()
    assert weights.tolist() == WEIGHTS.astype(np.float16).tolist()
    if ext != ".caffemodel":
        assert weights.dtype == np.float16


def test_half_strict_refuses_before_anything_is_written(tmp_path, bn_net):
    before = listing(tmp_path)
    result = run_blobtool("convert", "--half-strict", bn_net, "-o", tmp_path / "half.npz", text=True)
    assert result.returncode == ExitCode.USAGE
    assert error_lines(result) == [
        f"blobtool: {bn_net}: --strict: blob bn1/0: 3 of 5 values are past float16's range (largest "
        "1.98e+07, float16 holds up to 65504); nothing written"]
    assert listing(tmp_path) == before
    result = invoke("convert", "--half-strict", "--double", bn_net, "-o", tmp_path / "x.npz")
    assert result.exit_code == ExitCode.USAGE
    assert "--precision is asked for twice, as half and as double" in result.stderr


def test_half_strict_writes_float16_when_every_blob_fits(tmp_path, bn_net):
    result = invoke("convert", "--half-strict", bn_net, "--blob", "conv1/0", "-o", tmp_path / "w.npy")
    assert result.exit_code == 0, result.stderr
    assert np.load(tmp_path / "w.npy").dtype == np.float16


def test_half_of_doubles_past_float32s_range_keeps_them_in_float64(tmp_path):
    path = write_npz(tmp_path / "big.npz", {"big": np.array([1e300, 1.0]), "small": np.array([0.5, 2.0])})
    result = invoke("convert", "--half", path, "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.stderr
    assert error_lines(result) == [f"blobtool: warning: {path}: blob big: 1 of 2 values are past float16's "
                                   "range (largest 1e+300, float16 holds up to 65504): kept in float64 (0 values "
                                   "would have become subnormal and 0 zero)"]
    with np.load(tmp_path / "out.npz") as z:
        assert z["big"].dtype == np.float64 and z["big"].tolist() == [1e300, 1.0]
        assert z["small"].dtype == np.float16 and z["small"].tolist() == [0.5, 2.0]


def test_half_counts_the_diff_too(tmp_path):
    path = write_blob(tmp_path / "b.pb", [1.0, 2.0], [1e6, 0.5])
    result = invoke("convert", "--half", path, "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.stderr
    assert "blob 0: 1 of 4 values are past float16's range" in result.stderr
    with np.load(tmp_path / "out.npz") as z:
        assert z["0/diff"].dtype == np.float32 and z["0/diff"].tolist() == [1e6, 0.5]


def test_half_of_the_real_resnet_keeps_its_batchnorm_sums(realworld, tmp_path):
    out = tmp_path / "r.safetensors"
    result = run_blobtool("convert", "--half", realworld / "resnet20_cifar10.caffemodel", "-o", out, text=True)
    assert result.returncode == 0, result.stderr
    tensors = load_file(str(out))
    original = blobtool.load_all(realworld / "resnet20_cifar10.caffemodel")
    for name, array in tensors.items():
        assert np.isfinite(array).all(), name
        with np.errstate(over="ignore"):
            fits = np.isfinite(original[name].cpu_data().astype(np.float16)).all()
        assert array.dtype == (np.float16 if fits else np.float32), name
        kept_line = f"blob {name}: "
        assert (kept_line in result.stderr) == (not fits)
    assert tensors["BatchNorm1/1"].dtype == np.float32


def test_library_write_half_warns_through_the_callback(tmp_path, bn_net):
    doc = blobtool.open_document(bn_net)
    lines = []
    blobtool.write(doc, None, tmp_path / "o.npz", precision="half", warn=lines.append)
    assert ["warning: " + line for line in lines] == [
        line.replace("blobtool: ", "", 1) for line in _expected_half_lines(bn_net)]
    with pytest.raises(UsageError, match="half_strict: blob bn1/0"):
        blobtool.write(doc, None, tmp_path / "p.npz", precision="half", half_strict=True)
    assert not (tmp_path / "p.npz").exists()


# -- scale and update past the dtype's range ---------------------------------------------------

@pytest.mark.parametrize("ext", [".pb", ".npz", ".safetensors"])
def test_scale_past_float32_warns_with_the_count_and_exits_0(tmp_path, ext):
    data = np.array([1.0, -2.0, 0.0, 3e-40, np.nan], dtype=np.float32)
    path = write_npz(tmp_path / "in.npz", {"w": data, "fine": np.array([1.0], np.float64)})
    out = tmp_path / f"out{ext}"
    args = ["--blob", "w"] if ext == ".pb" else []
    result = run_blobtool("scale", path, "1e39", *args, "-o", out, text=True)
    assert result.returncode == 0, result.stderr
    with np.errstate(over="ignore", invalid="ignore"):
        expected = data * np.float32(1e39)
    became = int(np.count_nonzero(np.isfinite(data) & ~np.isfinite(expected)))
    assert became == 4  # 0 * inf is NaN; the NaN already there is not counted
    assert error_lines(result) == [f"blobtool: warning: {path}: blob w: scaling by 1e+39 turned {became} of 5 "
                                   "data values into Inf or NaN (past float32's range)"]
    if ext == ".pb":
        written = np.array(pb.BlobProto.FromString(out.read_bytes()).data, dtype=np.float32)
    elif ext == ".npz":
        with np.load(out) as z:
            written = z["w"]
    else:
        written = load_file(str(out))["w"]
    np.testing.assert_array_equal(written, expected)


def test_scale_of_float64_past_its_range_and_of_the_diff(tmp_path):
    path = write_blob(tmp_path / "d.pb", [1e10, 1.0], [1e10, 5.0], double=True)
    result = invoke("scale", path, "1e300", "--diff-factor", "1e300", "-o", tmp_path / "o.pb")
    assert result.exit_code == 0
    assert error_lines(result) == [f"blobtool: warning: {path}: blob 0: scaling by 1e+300 (diff by 1e+300) turned "
                                   "1 of 2 data values and 1 of 2 diff values into Inf or NaN (past float64's "
                                   "range)"]
    proto = pb.BlobProto.FromString((tmp_path / "o.pb").read_bytes())
    assert list(proto.double_data) == [np.inf, 1e300]


def test_scale_within_range_says_nothing(tmp_path):
    path = write_blob(tmp_path / "d.pb", [1.0, 2.0])
    result = invoke("scale", path, "0.5", "-o", tmp_path / "o.pb")
    assert result.exit_code == 0 and result.stderr == ""


def test_update_past_float32_warns(tmp_path):
    path = write_blob(tmp_path / "u.pb", [3e38, 1.0, -3e38], [-3e38, 0.5, 3e38])
    result = run_blobtool("update", path, "-o", tmp_path / "o.h5.pb", text=True)
    assert result.returncode == 0
    assert error_lines(result) == [f"blobtool: warning: {path}: blob 0: data -= diff turned 2 of 3 data values "
                                   "into Inf or NaN (past float32's range)"]
    proto = pb.BlobProto.FromString((tmp_path / "o.h5.pb").read_bytes())
    assert list(proto.data) == [np.inf, 0.5, -np.inf]


def test_scale_help_documents_the_overflow():
    for command in ("scale", "update"):
        result = invoke(command, "--help")
        assert "Inf" in result.stdout and "exits" in result.stdout


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


# -- compare ------------------------------------------------------------------------------------

@pytest.fixture
def drifted(tmp_path):
    base = {"noise": np.array([1.0, 2.0, 3.0], np.float32), "blown": np.array([1.0, 2.0, 3.0], np.float32),
            "same": np.array([7.0], np.float32)}
    after = {"noise": np.array([1.5, 2.5, 3.5], np.float32), "blown": np.array([1.0, np.inf, 3.0], np.float32),
             "same": np.array([7.0], np.float32)}
    return write_npz(tmp_path / "a.npz", base), write_npz(tmp_path / "b.npz", after)


def test_compare_lists_a_blob_that_became_inf_first(drifted):
    a, b = drifted
    result = run_blobtool("compare", a, b, env={"COLUMNS": "200"}, text=True)
    assert result.returncode == ExitCode.DIFFERENT
    lines = result.stdout.splitlines()
    rule = next(k for k, line in enumerate(lines) if line.strip().startswith("\u2500"))
    rows = [line.split() for line in lines[rule + 1:rule + 3]]
    assert [row[0] for row in rows] == ["blown", "noise"]
    assert rows[0][1:3] == ["values", "(1"]  # "values (1 Inf/NaN)"
    record = one_json(invoke("compare", "--json", a, b))
    by_name = {blob["name"]: blob for blob in record["blobs"]}
    assert by_name["blown"]["nonfinite"] == 1 and by_name["noise"]["nonfinite"] == 0
    # The finite part of the change alone would rank it last: rel_l2 counts finite differences only.
    assert by_name["blown"]["rel_l2"] < by_name["noise"]["rel_l2"]


def test_compare_states_the_tolerance_it_used(drifted, tmp_path):
    a, _ = drifted
    copy = write_npz(tmp_path / "c.npz", {"noise": np.array([1.001, 2.0, 3.0], np.float32),
                                          "blown": np.array([1.0, 2.0, 3.0], np.float32),
                                          "same": np.array([7.0], np.float32)})
    result = invoke("compare", a, copy, "--rtol", "1e-2")
    assert result.exit_code == 0
    assert result.stdout == f"equal  {a} and {copy}: 3 blob(s) match within rtol=0.01, atol=0\n"
    exact = invoke("compare", "-q", a, copy)
    assert exact.stdout == (f"DIFFERENT  {a} vs {copy}: 1 of 3 blob(s) differ beyond rtol=0, atol=0\n")
    record = one_json(invoke("compare", "--json", "--rtol", "1e-2", "--atol", "1e-6", a, copy))
    assert (record["rtol"], record["atol"]) == (0.01, 1e-6)


def test_compare_explains_max_rel_inf_where_b_holds_zero(tmp_path):
    a = write_npz(tmp_path / "a.npz", {"w": np.array([1.0, 2.0], np.float32)})
    b = write_npz(tmp_path / "b.npz", {"w": np.array([0.0, 2.0], np.float32)})
    result = invoke("compare", a, b)
    assert result.exit_code == ExitCode.DIFFERENT
    assert "  max_rel inf: b holds 0 where a does not" in result.stdout.splitlines()
    result = invoke("compare", b, a)  # max_rel 1: no note
    assert "max_rel inf" not in result.stdout


# -- errors and help ---------------------------------------------------------------------------

def test_show_of_a_blob_that_is_no_picture_names_the_file(tmp_path, small_net):
    result = run_blobtool("show", small_net, "--blob", "conv1/1", text=True)
    assert result.returncode == ExitCode.USAGE
    assert error_lines(result) == [f"blobtool: {small_net}: blob conv1/1: a blob of shape (2,) is no picture: "
                                   "show needs (H, W), (C, H, W) or (N, C, H, W)"]
    result = run_blobtool("show", small_net, "--blob", "conv1/1", "-o", tmp_path / "b.png", text=True)
    assert error_lines(result)[0].startswith(f"blobtool: {small_net}: blob conv1/1: ")
    assert not (tmp_path / "b.png").exists()


def test_help_lists_what_blobtool_reads_and_every_exit_code():
    text = " ".join(run_blobtool("--help", text=True).stdout.split())
    for kind in (".caffemodel", ".solverstate", "BlobProto", "BlobProtoVector", ".npy", ".npz", "HDF5",
                 ".safetensors"):
        assert kind in text
    for code in ExitCode:
        assert str(int(code)) in text, code


@pytest.mark.parametrize("command", ["compare", "devices"])
def test_json_help_of_one_object_commands_says_so(command):
    result = invoke(command, "--help")
    assert "per input file" not in result.stdout
    assert "one JSON object" in " ".join(result.stdout.split())


# -- Blob ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("axes", range(0, 33))
def test_shape_string_is_caffes_for_every_axis_count(axes):
    shape = [2 if k % 3 == 0 else 1 for k in range(axes)]
    blob = blobtool.Blob(shape)
    # Caffe's shape_string: each dimension followed by a blank, then "(" count ")".
    expected = "".join(f"{d} " for d in shape) + f"({int(np.prod(shape, dtype=np.int64))})"
    assert blob.shape_string() == expected
    if axes == 0:
        assert blob.shape_string() == "(1)"


def test_shape_string_of_an_empty_blob_and_a_zero_dimension():
    assert blobtool.Blob().shape_string() == "(0)"
    assert blobtool.Blob(2, 0, 3).shape_string() == "2 0 3 (0)"
    assert blobtool.Blob(2, 3, 4, 5).shape_string() == "2 3 4 5 (120)"


def test_a_blob_is_an_array_to_numpy():
    blob = blobtool.Blob(2, 3)
    blob.data[...] = np.arange(6).reshape(2, 3)
    array = np.asarray(blob)
    assert array.shape == (2, 3) and array.dtype == np.float32
    assert array.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert not array.flags.writeable  # a view of the data, as cpu_data
    assert np.shares_memory(array, blob.cpu_data())
    copied = np.array(blob)
    assert copied.flags.writeable and not np.shares_memory(copied, blob.cpu_data())
    assert np.asarray(blob, dtype=np.float64).dtype == np.float64
    with pytest.raises(ValueError):
        np.asarray(blob, dtype=np.float64, copy=False)
    assert np.asarray(blob, copy=False).base is not None
    assert float(np.sum(blob)) == 15.0
    assert np.asarray(blobtool.Blob([])).shape == ()
    assert np.asarray(blobtool.Blob()).shape == (0,)
    loaded = blobtool.Blob(2, dtype=np.float64)
    assert np.asarray(loaded).dtype == np.float64


def test_a_loaded_blob_is_an_array_of_its_file(tmp_path):
    values = np.arange(12, dtype=np.float64).reshape(3, 4) / 7
    path = write_npy(tmp_path / "v.npy", values)
    np.testing.assert_array_equal(np.asarray(blobtool.load(path)), values)
    assert os.path.exists(path)


def test_float16_fit_counts_each_edge_as_numpys_cast_rounds_it():
    from blobtool.engine.float16 import float16_fit

    tiny, smallest = float(np.finfo(np.float16).tiny), float(np.finfo(np.float16).smallest_subnormal)
    edges = np.array([65504.0, 65519.99, 65520.0, -65536.0, 1e38, np.inf, -np.inf, np.nan, 0.0, -0.0, tiny,
                      tiny * 0.999, smallest, smallest / 2, smallest * 0.51, -smallest * 0.49, 1e-30, 1.0],
                     dtype=np.float32)
    over = sub = zero = 0
    for value in edges.tolist():  # one value at a time, through Python floats: the oracle
        with np.errstate(over="ignore"):
            half = float(np.float16(value))
        finite = np.isfinite(value)
        over += finite and np.isinf(half)
        sub += finite and value != 0 and half != 0 and abs(half) < tiny
        zero += finite and value != 0 and half == 0
    fit = float16_fit("edges", [edges])
    assert (fit.overflow, fit.subnormal, fit.zero) == (over, sub, zero) == (3, 3, 3)
    assert fit.max_abs == pytest.approx(1e38) and fit.fallback == "float"


def test_library_save_in_half_keeps_a_blob_float16_cannot_hold(tmp_path):
    blob = blobtool.Blob(5)
    blob.data[...] = SUMS
    with pytest.warns(UserWarning, match="blob 0: 3 of 5 values are past float16's range"):
        blobtool.save(blob, tmp_path / "s.pb", precision="half")
    proto = pb.BlobProto.FromString((tmp_path / "s.pb").read_bytes())
    assert np.array(proto.data, dtype=np.float32).tolist() == SUMS.tolist()
    with pytest.raises(UsageError, match="half_strict: blob 0"):
        blobtool.save(blob, tmp_path / "t.pb", precision="half", half_strict=True)
    assert not (tmp_path / "t.pb").exists()
    small = blobtool.Blob(2)
    small.data[...] = [0.5, 2.0]
    blobtool.save(small, tmp_path / "h.pb", precision="half")
    assert blobtool.load(tmp_path / "h.pb").origin.dtype == np.float16  # NVIDIA Caffe's raw FLOAT16
