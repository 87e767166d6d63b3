"""Rewrites with no option lose nothing: every encoding comes back as it was, unknown fields included.

Inputs are made byte by byte with tests/helpers/builders.py in protobuf's field order
(what protobuf's SerializeToString, and so Caffe and its forks, write), so a
rewrite with no option must give the same bytes. The protobuf library is the
oracle for the standard fields, numpy for the values.
"""

from __future__ import annotations

import numpy as np
import pytest

import blobtool
from blobtool.formats.caffe import wire
from blobtool._pb import blobtool_caffe_pb2 as pb
from builders import (RAW_TYPE, blob_bytes, half_blob_bytes, len_field, raw_blob_bytes, tag, varint_field)
from runner import invoke, ok, one_json

RNG = np.random.default_rng(1313)

# Fields no BlobProto schema knows, after the known ones (where protobuf writes
# unknown fields): a varint, a 64-bit, a length-delimited and a 32-bit field.
BLOB_UNKNOWN = (varint_field(14, 300) + tag(15, wire.I64) + bytes(range(8)) + len_field(100, b"fork's own")
                + tag(2000, wire.I32) + b"\x01\x02\x03\x04")
# A known number with a wire type BlobProto never gives it: protobuf keeps it
# as an unknown field (and sniffing takes it for another message: --kind blob).
WRONG_WIRE_TYPE = len_field(1, b"num as bytes") + tag(7, wire.I32) + bytes(4)


def _ints(dtype: str, shape=(3, 4)) -> np.ndarray:
    info = np.iinfo(dtype)
    values = RNG.integers(info.min, info.max, size=shape, dtype=np.int64, endpoint=True).astype(dtype)
    values.flat[0] = 16777217  # the first integer float32 cannot hold
    values.flat[1] = info.max
    return values


def _values(dtype: str, shape=(3, 4)) -> np.ndarray:
    if dtype in ("int32", "uint32"):
        return _ints(dtype, shape)
    return (RNG.standard_normal(shape) * 3).astype(dtype)


# Data and diff types of NVIDIA Caffe's raw payloads, mixed as it mixes them.
RAW_PAIRS = [("float16", "float32"), ("float32", "float32"), ("float64", "float16"), ("int32", "int32"),
             ("uint32", "uint32"), ("int32", "float32"), ("uint32", None)]


def _blob_kinds(blob: bytes) -> dict:
    """The same BlobProto as each kind of file that holds one: its bytes and the blob's name."""
    layer = pb.LayerParameter(name="fc", type="InnerProduct").SerializeToString() + len_field(7, blob)
    state = pb.SolverState(iter=7, learned_net="n.caffemodel").SerializeToString() + len_field(3, blob)
    return {"blob": (blob, "0"), "vector": (len_field(1, blob), "0"),
            "net": (pb.NetParameter(name="n").SerializeToString() + len_field(100, layer), "fc/0"),
            "solverstate": (state + varint_field(4, 1), "history/0")}


@pytest.mark.parametrize("kind", ["blob", "vector", "net", "solverstate"])
@pytest.mark.parametrize("data_type, diff_type", RAW_PAIRS, ids=[f"{a}-{b}" for a, b in RAW_PAIRS])
def test_raw_payloads_of_every_type_rewrite_byte_for_byte(tmp_path, kind, data_type, diff_type):
    data = _values(data_type)
    diff = _values(diff_type) if diff_type else None
    raw, name = _blob_kinds(raw_blob_bytes(data, diff) + BLOB_UNKNOWN)[kind]
    path = tmp_path / "in.bin"
    path.write_bytes(raw)
    out = tmp_path / "out.bin"
    ok("convert", path, "-o", out, "--format", "same")
    assert out.read_bytes() == raw
    ok("convert", path, "-o", out, "--format", "same", "--blob", name)
    assert out.read_bytes() == raw
    # blobtool's own compare agrees (16777217 once came back as 16777216: DIFFERENT).
    assert one_json(ok("compare", "--json", path, out))["equal"] is True
    info = one_json(ok("info", "--json", out))["blobs"][0]
    assert info["dtype"] == data_type


def test_integer_values_stay_integers_and_exact(tmp_path):
    data = _ints("int32")
    path = tmp_path / "int.pb"
    path.write_bytes(raw_blob_bytes(data))
    blob = blobtool.load(path)
    assert blob.dtype == np.float64  # holds every int32 exactly
    np.testing.assert_array_equal(blob.cpu_data().reshape(3, 4), data)
    norm = one_json(ok("norm", "--json", path))["blobs"][0]["data"]
    assert norm["asum"] == float(np.abs(data.astype(np.float64)).sum())
    # Scaled by 2 (values still integers, in range): written back as INT.
    data = np.clip(data, -2**30, 2**30 - 1)
    path.write_bytes(raw_blob_bytes(data))
    out = tmp_path / "scaled.pb"
    ok("scale", path, "2", "-o", out)
    assert out.read_bytes() == raw_blob_bytes(data * 2)
    # A value that is no longer an integer is not rounded in silence.
    result = invoke("scale", path, "0.5", "-o", out)
    assert result.exit_code == 2
    assert result.stderr.startswith("blobtool: ") and "is not an int32" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1
    assert out.read_bytes() == raw_blob_bytes(data * 2)  # the earlier output, untouched
    # Asked for a precision: written as asked.
    ok("convert", "--double", path, "-o", out)
    proto = pb.BlobProto()
    proto.ParseFromString(out.read_bytes())
    np.testing.assert_array_equal(np.array(proto.double_data).reshape(3, 4), data.astype(np.float64))


@pytest.mark.parametrize("dtype", ["int32", "uint32"])
def test_integer_blobs_convert_to_npy_and_npz_as_integers(tmp_path, dtype):
    data, diff = _ints(dtype), _ints(dtype)
    path = tmp_path / "int.pb"
    path.write_bytes(raw_blob_bytes(data, diff))
    ok("convert", path, "-o", tmp_path / "int.npy")
    got = np.load(tmp_path / "int.npy")
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, data)
    ok("convert", path, "-o", tmp_path / "int.npz")
    with np.load(tmp_path / "int.npz") as arrays:
        assert arrays["0"].dtype == dtype and arrays["0/diff"].dtype == dtype
        np.testing.assert_array_equal(arrays["0"], data)
        np.testing.assert_array_equal(arrays["0/diff"], diff)
    ok("convert", "--double", path, "-o", tmp_path / "f.npy")
    assert np.load(tmp_path / "f.npy").dtype == np.float64


def test_ditcaffe_half_data_rewrites_as_half_data(tmp_path):
    data = (RNG.standard_normal((4, 5)) * 100).astype(np.float16)
    data.flat[:3] = [0.0, -0.0, 65504.0]  # one-, three- and three-byte varints
    diff = (RNG.standard_normal((4, 5))).astype(np.float16)
    raw = half_blob_bytes(data, diff) + BLOB_UNKNOWN
    path = tmp_path / "dit.pb"
    path.write_bytes(raw)
    out = tmp_path / "out.pb"
    ok("convert", path, "-o", out)
    assert out.read_bytes() == raw  # ditcaffe reads it still: not NVIDIA's raw FLOAT16
    ok("scale", path, "0.5", "-o", out)
    assert out.read_bytes() == half_blob_bytes(data * np.float16(0.5), diff) + BLOB_UNKNOWN


@pytest.mark.parametrize("kind", ["blob", "vector", "net", "solverstate"])
def test_unknown_fields_inside_a_blob_survive_every_rewrite(tmp_path, kind):
    data = RNG.standard_normal((2, 3)).astype(np.float32)
    raw, name = _blob_kinds(blob_bytes(data) + BLOB_UNKNOWN)[kind]
    path = tmp_path / "in.bin"
    path.write_bytes(raw)
    out = tmp_path / "out.bin"
    ok("convert", path, "-o", out, "--format", "same")
    assert out.read_bytes() == raw
    ok("scale", path, "3", "-o", out, "--format", "same")
    assert out.read_bytes() == _blob_kinds(blob_bytes(data * np.float32(3)) + BLOB_UNKNOWN)[kind][0]
    ok("convert", "--double", path, "-o", out, "--format", "same")
    assert out.read_bytes() == _blob_kinds(blob_bytes(data, double=True) + BLOB_UNKNOWN)[kind][0]
    # The protobuf library reads the same message, its unknown fields included.
    ok("convert", path, "--blob", name, "-o", tmp_path / "one.pb")
    expected = pb.BlobProto()
    expected.ParseFromString(blob_bytes(data) + BLOB_UNKNOWN)
    got = pb.BlobProto()
    got.ParseFromString((tmp_path / "one.pb").read_bytes())
    assert got.SerializeToString() == expected.SerializeToString()
    assert (tmp_path / "one.pb").read_bytes() == blob_bytes(data) + BLOB_UNKNOWN


def test_known_numbers_with_other_wire_types_are_kept_as_unknown_fields(tmp_path):
    data = RNG.standard_normal(5).astype(np.float32)
    raw = blob_bytes(data) + WRONG_WIRE_TYPE + BLOB_UNKNOWN
    path = tmp_path / "odd.pb"
    path.write_bytes(raw)
    ok("convert", "--kind", "blob", path, "-o", tmp_path / "out.pb")
    assert (tmp_path / "out.pb").read_bytes() == raw
    expected = pb.BlobProto()
    expected.ParseFromString(raw)  # the oracle reads the shape and data and keeps the rest
    assert tuple(expected.shape.dim) == (5,) and len(expected.data) == 5
    assert expected.SerializeToString() == raw


def test_packed_uint16_varints_round_trip():
    values = np.array([0, 1, 127, 128, 16383, 16384, 65535, 300], dtype=np.uint16)
    encoded = wire.encode_packed_uint16(values)
    assert encoded == b"".join(wire.encode_varint(int(v)) for v in values)
    field = wire.Field(10, wire.LEN, 0, 0, len(encoded), None)
    np.testing.assert_array_equal(wire.packed_uint16(memoryview(encoded), field, label="x"), values)
    assert wire.encode_packed_uint16(np.zeros(0, np.uint16)) == b""


def test_raw_type_table_matches_the_builders():
    from blobtool.formats.caffe.blobproto import RAW_TYPES
    assert {v: np.dtype(k) for k, v in RAW_TYPE.items()} == RAW_TYPES


@pytest.mark.parametrize("dtype", ["int32", "uint32"])
def test_integer_blobs_stay_exact_in_safetensors_and_hdf5(tmp_path, dtype):
    # 16777217 is the first integer float32 cannot hold: it must survive both outputs.
    from safetensors.numpy import load_file
    h5py = pytest.importorskip("h5py", reason="Caffe's HDF5 snapshots need h5py (blobtool[hdf5])")

    values = np.array([16777217, 7, 4294967295 if dtype == "uint32" else -5], dtype=dtype)
    src = tmp_path / "int.pb"
    src.write_bytes(raw_blob_bytes(values))
    result = invoke("convert", src, "-o", tmp_path / "int.safetensors")
    assert result.exit_code == 0, result.output
    tensors = load_file(str(tmp_path / "int.safetensors"))
    assert tensors["0"].dtype == np.dtype(dtype) and tensors["0"].tolist() == values.tolist()

    vector = tmp_path / "int.solverstate"
    vector.write_bytes(len_field(3, raw_blob_bytes(values)))  # SolverState.history
    result = invoke("convert", vector, "-o", tmp_path / "int.solverstate.h5")
    assert result.exit_code == 0, result.output
    with h5py.File(tmp_path / "int.solverstate.h5", "r") as f:
        stored = f["history/0"][()]
    assert stored.dtype == np.float64 and stored.tolist() == values.tolist()


# A diff stored wider than its data: values past float32's range and below its
# smallest subnormal, which float32 would turn into Inf and 0.
WIDE_DIFF = np.array([1e300, -1e-300, 0.1, -3.5e38, 2.0, 1e-46])
NARROW_DATA = np.array([1.0, -2.5, 3.0, 0.1, 7.0, -8.0], np.float32)


@pytest.mark.parametrize("kind", ["blob", "vector", "net", "solverstate"])
def test_float_data_with_double_diff_rewrites_byte_for_byte(tmp_path, kind):
    proto = pb.BlobProto()
    proto.shape.dim.extend([2, 3])
    proto.data.extend(NARROW_DATA.tolist())
    proto.double_diff.extend(WIDE_DIFF.tolist())
    raw, name = _blob_kinds(proto.SerializeToString())[kind]
    path = tmp_path / "in.bin"
    path.write_bytes(raw)
    out = tmp_path / "out.bin"
    for selection in ([], ["--blob", name]):
        ok("convert", path, "-o", out, "--format", "same", *selection)
        assert out.read_bytes() == raw
    # Scaled by 1: every blob re-encoded, the double diff still as it was.
    ok("scale", path, "1", "-o", out, "--format", "same")
    assert out.read_bytes() == raw
    assert one_json(ok("compare", "--json", path, out))["equal"] is True


def test_f32_data_with_f64_diff_rewrites_in_npz_and_safetensors(tmp_path):
    from safetensors.numpy import load_file, save_file

    arrays = {"w": NARROW_DATA.reshape(2, 3), "w/diff": WIDE_DIFF.reshape(2, 3)}
    src = tmp_path / "w.safetensors"
    save_file(arrays, str(src))
    (tmp_path / "out").mkdir()
    first = tmp_path / "out" / "w.safetensors"  # the same name: __metadata__ records the source's
    ok("convert", src, "-o", first)
    back = load_file(str(first))
    assert back["w"].dtype == np.float32 and back["w/diff"].dtype == np.float64
    assert back["w/diff"].tobytes() == arrays["w/diff"].tobytes()
    written = first.read_bytes()
    ok("convert", first, "-o", first)
    assert first.read_bytes() == written  # blobtool's own output rewrites byte for byte

    npz = tmp_path / "in.npz"
    np.savez(npz, **arrays)
    ok("convert", npz, "-o", tmp_path / "out.npz")
    with np.load(tmp_path / "out.npz") as got:
        assert got["w/diff"].dtype == np.float64 and got["w/diff"].tobytes() == arrays["w/diff"].tobytes()
        assert got["w"].dtype == np.float32 and got["w"].tobytes() == arrays["w"].tobytes()


def test_hdf5_double_diff_beside_float_data_is_kept(tmp_path):
    h5py = pytest.importorskip("h5py", reason="Caffe's HDF5 snapshots need h5py (blobtool[hdf5])")
    from builders import h5_net_bytes

    src = tmp_path / "in.caffemodel.h5"
    src.write_bytes(h5_net_bytes([("fc", [NARROW_DATA.reshape(2, 3)])], diffs={("fc", 0): WIDE_DIFF.reshape(2, 3)}))
    out = tmp_path / "out.caffemodel.h5"
    ok("convert", src, "-o", out)
    with h5py.File(out, "r") as f:
        data, diff = f["data/fc/0"][()], f["diff/fc/0"][()]
    assert data.dtype == np.float32 and data.tobytes() == NARROW_DATA.tobytes()
    assert diff.dtype == np.float64 and diff.reshape(-1).tobytes() == WIDE_DIFF.tobytes()
    again = tmp_path / "again.caffemodel.h5"
    ok("convert", out, "-o", again)
    assert again.read_bytes() == out.read_bytes()
    # To protobuf: data beside double_diff.
    ok("convert", src, "-o", tmp_path / "out.caffemodel")
    blob = blobtool.load_all(tmp_path / "out.caffemodel")["fc/0"]
    assert blob.origin.encoding == (("data", None), ("double_diff", None))
    assert blob.cpu_diff().tobytes() == WIDE_DIFF.tobytes()
