"""Values past a dtype's range are never lost to Inf in silence: --half, scale and update, the library's save.

Every command-line check runs the real command (tests/helpers/runner.py); numpy, the protobuf library,
h5py and the safetensors package read what was written.
"""

from __future__ import annotations


import h5py
import numpy as np
import pytest
from safetensors.numpy import load_file

import blobtool
from blobtool.errors import ExitCode, UsageError
from builders import Layer, pb, write_blob, write_net, write_npz
from runner import error_lines, invoke, listing, run_blobtool


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


# -- float16's edges, and the library's save in half -------------------------------------------

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
