"""Output names and help: no output in another format than asked, every extension read back, help and errors.

Every command-line check runs the real command (tests/helpers/runner.py); numpy, the protobuf library,
h5py and the safetensors package read what was written.
"""

from __future__ import annotations


import h5py
import numpy as np
import pytest
from safetensors.numpy import load_file

from blobtool.errors import ExitCode
from blobtool.formats import EXTENSIONS, FORMATS
from builders import Layer, pb, write_net
from runner import error_lines, invoke, listing, run_blobtool


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
