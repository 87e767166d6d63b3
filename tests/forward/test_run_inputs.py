"""blobtool run --input: a file's shape against the net's, integer files, and files read only once checked.

An input file's shape must be the input's: the shape the net states, or the
one --input-shape gives (which reshapes the net); only where the net states
none does the file's shape give it. The shape comes from the file's header,
so a file of another size is refused before its values are read. Files of
any numeric type are converted to float32, as pycaffe converts its inputs.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from blobtool._pb import blobtool_caffe_pb2 as pb
from caffenets import layer, net, write_net_files
from runner import assert_error, blobtool_cmd, invoke, ok, subprocess_env


@pytest.fixture
def relu_net(tmp_path):
    """A net of one ReLU whose input `data` is declared 1x2x2x2 (32 bytes of float32)."""
    _, model = write_net_files(tmp_path, net([layer("relu", "ReLU", "data", "out")], {"data": (1, 2, 2, 2)}))
    return model


def _outputs(result) -> dict:
    return {b["name"]: b for b in json.loads(result.stdout)["blobs"]}


def test_an_input_file_of_another_shape_does_not_reshape_the_net(relu_net, tmp_path):
    # An (8,) array for a (1,2,2,2) input used to run as an (8,) net, exit 0.
    np.save(tmp_path / "flat.npy", np.arange(8, dtype=np.float32))
    result = invoke("run", relu_net, "--input", f"data={tmp_path / 'flat.npy'}", "-o", tmp_path / "out.npz")
    assert_error(result, 2, "input 'data': ", "flat.npy holds shape (8,), the net takes (1, 2, 2, 2)",
                 "--input-shape data=8 reshapes the net to it")
    assert not (tmp_path / "out.npz").exists()


def test_input_shape_reshapes_the_net_to_the_file(relu_net, tmp_path):
    # Caffe's way: the input blob reshaped, then the net (Net::Reshape); the file then fits.
    values = np.array([-1, 2, -3, 4, -5, 6, -7, 8], dtype=np.float32)
    np.save(tmp_path / "flat.npy", values)
    result = ok("run", relu_net, "--input", f"data={tmp_path / 'flat.npy'}", "--input-shape", "data=8",
                "-o", tmp_path / "out.npz")
    assert result.exit_code == 0
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_array_equal(out["out"], np.maximum(values, 0))


def test_a_file_of_the_declared_shape_runs(relu_net, tmp_path):
    values = np.arange(-4, 4, dtype=np.float32).reshape(1, 2, 2, 2)
    np.save(tmp_path / "x.npy", values)
    ok("run", relu_net, "--input", f"data={tmp_path / 'x.npy'}", "-o", tmp_path / "out.npz")
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_array_equal(out["out"], np.maximum(values, 0))


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int32, np.int64, np.uint16, np.float16, np.float64,
                                   np.bool_])
def test_an_input_file_of_any_numeric_type_is_converted_to_float32(relu_net, tmp_path, dtype):
    # Images come as uint8 and indices as int32/int64; pycaffe converts what it is given to float32.
    stored = (np.arange(8) % (2 if dtype == np.bool_ else 8)).astype(dtype).reshape(1, 2, 2, 2)
    np.save(tmp_path / "x.npy", stored)
    ok("run", relu_net, "--input", f"data={tmp_path / 'x.npy'}", "-o", tmp_path / "out.npz")
    with np.load(tmp_path / "out.npz") as out:
        assert out["out"].dtype == np.float32
        np.testing.assert_array_equal(out["out"], stored.astype(np.float32))


def test_a_blobproto_input_file(relu_net, tmp_path):
    values = np.array([1, -2, 3, -4, 5, -6, 7, -8], dtype=np.float32)
    blob = pb.BlobProto(num=1, channels=2, height=2, width=2)
    blob.data.extend(values.tolist())
    (tmp_path / "x.binaryproto").write_bytes(blob.SerializeToString())
    ok("run", relu_net, "--input", f"data={tmp_path / 'x.binaryproto'}", "-o", tmp_path / "out.npz")
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_array_equal(out["out"].reshape(-1), np.maximum(values, 0))
    other = pb.BlobProto(num=1, channels=1, height=2, width=4)
    other.data.extend(values.tolist())
    (tmp_path / "y.binaryproto").write_bytes(other.SerializeToString())
    result = invoke("run", relu_net, "--input", f"data={tmp_path / 'y.binaryproto'}")
    assert_error(result, 2, "y.binaryproto holds shape (1, 1, 2, 4), the net takes (1, 2, 2, 2)")


def test_a_net_file_is_not_an_input(relu_net, tmp_path):
    result = invoke("run", relu_net, "--input", f"data={relu_net}")
    assert_error(result, 3, "an input's values are one blob (.npy or BlobProto); this is a net file")


def test_a_data_layers_input_takes_the_files_shape(tmp_path):
    # A data layer's shape lies in its database: there the file's shape gives the input's.
    layers = [layer("data", "Data", [], ["data"], data_param={"source": "lmdb", "batch_size": 4}),
              layer("relu", "ReLU", "data", "out")]
    _, model = write_net_files(tmp_path, net(layers, {}))
    values = np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6)
    np.save(tmp_path / "x.npy", values)
    ok("run", model, "--input", f"data={tmp_path / 'x.npy'}", "-o", tmp_path / "out.npz")
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_array_equal(out["out"], np.maximum(values, 0))


def test_a_huge_input_file_is_refused_before_its_values_are_read(relu_net, tmp_path):
    # A 1 GiB float64 .npy given for a 32-byte input: its header says its shape, and nothing more is
    # read (it used to be converted whole, and the net reshaped to it). The file is sparse.
    big = tmp_path / "big.npy"
    with open(big, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": (128, 1024, 1024)})
        f.truncate(f.tell() + 128 * 1024 * 1024 * 8)
    # The peak memory of the blobtool process alone: a fresh Python whose only child it is.
    measure = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
               "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
               "print(r.stderr, file=sys.stderr)")
    cmd = blobtool_cmd("run", relu_net, "--input", f"data={big}", "-o", tmp_path / "out.npz")
    done = subprocess.run([sys.executable, "-c", measure, *cmd], capture_output=True, text=True,
                          env=subprocess_env(), timeout=120)
    code, peak_kib = map(int, done.stdout.split())
    assert code == 2, done.stderr
    assert "big.npy holds shape (128, 1024, 1024), the net takes (1, 2, 2, 2)" in done.stderr
    assert peak_kib < 300 * 1024, peak_kib
    assert not (tmp_path / "out.npz").exists()
