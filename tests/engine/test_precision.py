"""Each side of a blob keeps the precision it is stored in, and nothing becomes Inf in silence.

- A blob stored as float16 (NVIDIA Caffe's raw FLOAT16, ditcaffe's half_data,
  safetensors F16, HDF5 float16) is computed in float32 and written back in
  float16: `scale` and `update` count the values that overflow against
  float16, the type they are written in, and say so in one line per blob.
- A diff stored wider than its data (float data beside double_diff, an F64
  "<name>/diff" beside an F32 tensor or .npz array, an HDF5 float64 diff
  beside float32 data) is held, summed, compared and written at its own
  width (Blob.diff_dtype).

Every input is built here (the protobuf library, numpy, h5py and the
safetensors package), except the real float16 net that NVIDIA Caffe wrote.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import blobtool
from blobtool import Blob
from blobtool._pb import blobtool_caffe_pb2 as pb
from builders import h5_net_bytes, half_blob_bytes, raw_blob_bytes, write_blob, write_h5, write_npz
from runner import invoke, ok, one_json, run_blobtool

WARNING = re.compile(r"^blobtool: warning: (?P<path>.+): blob (?P<name>\S+): (?P<what>.+) turned "
                     r"(?P<n>[\d,]+) of (?P<count>[\d,]+) (?P<side>data|diff) values into Inf or NaN "
                     r"\(past (?P<dtype>\w+)'s range\)$")
# float16 holds up to 65504: these overflow when scaled by 100, the others do not.
HALF = np.array([1000.0, -700.0, 2.0, 0.5, 655.0, -3.0], np.float16)
HALF_OVERFLOWS = 2


def warnings(stderr: str) -> dict:
    """{blob name: (count, dtype)} from scale/update's warning lines; every stderr line must be one."""
    found = {}
    for line in stderr.splitlines():
        match = WARNING.match(line)
        assert match, f"not a warning line: {line!r}"
        found[match["name"]] = (int(match["n"].replace(",", "")), match["dtype"])
    return found


def infs(values) -> int:
    return int(np.count_nonzero(np.isinf(np.asarray(values, np.float64))))


# -- item: float16 stores count overflow against float16 ---------------------------------------

def test_scaling_the_real_float16_net_warns_about_each_value_that_becomes_inf(realworld, tmp_path):
    """NVIDIA Caffe's own float16 MTCNN net times 1e5: every Inf written is counted and named, blob by blob."""
    source = realworld / "mtcnn_det1_half.caffemodel"
    if not source.exists():
        pytest.skip(f"{source} is not in the real-files folder")
    out = tmp_path / "scaled.caffemodel"
    result = run_blobtool("scale", source, "1e5", "-o", out, text=True)
    assert result.returncode == 0, result.stderr
    said = warnings(result.stderr)
    written = blobtool.load_all(out)
    stored = blobtool.load_all(source)
    # Each blob written as stored: the convolutions in NVIDIA's raw FLOAT16, PReLU's slopes in float32.
    assert {name: blob.origin.encoding for name, blob in written.items()} == \
        {name: blob.origin.encoding for name, blob in stored.items()}
    assert sum(blob.origin.dtype == np.float16 for blob in written.values()) == 10
    for name, blob in written.items():
        new = infs(blob.cpu_data()) - infs(stored[name].cpu_data())
        assert said.get(name, (0, "float16"))[0] == new, name
    assert {dtype for _, dtype in said.values()} == {"float16"}
    assert sum(n for n, _ in said.values()) == 42  # what the issue measured: 42 Inf, none in silence


@pytest.mark.parametrize("encoding", ["raw FLOAT16", "half_data"])
def test_scaling_a_float16_blobproto_warns_against_float16(tmp_path, encoding):
    build = raw_blob_bytes if encoding == "raw FLOAT16" else half_blob_bytes
    path = tmp_path / "half.pb"
    path.write_bytes(build(HALF))
    out = tmp_path / "scaled.pb"
    result = ok("scale", path, "100", "-o", out)
    assert warnings(result.stderr) == {"0": (HALF_OVERFLOWS, "float16")}
    assert f"scaling by 100 turned {HALF_OVERFLOWS} of {HALF.size} data values" in result.stderr
    blob = blobtool.load(out)
    assert blob.origin.encoding == blobtool.load(path).origin.encoding  # written back as stored
    assert infs(blob.cpu_data()) == HALF_OVERFLOWS


def test_scaling_that_float16_holds_says_nothing(tmp_path):
    path = tmp_path / "half.pb"
    path.write_bytes(raw_blob_bytes(HALF))
    result = ok("scale", path, "10", "-o", tmp_path / "x.pb")
    assert result.stderr == ""


def test_scaling_safetensors_f16_warns_and_f16_is_kept(tmp_path):
    from safetensors.numpy import load_file, save_file

    path = tmp_path / "half.safetensors"
    save_file({"w": HALF, "b": np.array([1.0, 2.0], np.float16)}, str(path))
    out = tmp_path / "scaled.safetensors"
    result = ok("scale", path, "100", "-o", out)
    assert warnings(result.stderr) == {"w": (HALF_OVERFLOWS, "float16")}
    back = load_file(str(out))
    assert back["w"].dtype == np.float16 and infs(back["w"]) == HALF_OVERFLOWS
    # Written as float32 (.npz keeps no float16 unless --half), nothing overflows.
    npz = ok("scale", path, "100", "-o", tmp_path / "scaled.npz")
    assert npz.stderr == ""
    assert infs(np.load(tmp_path / "scaled.npz")["w"]) == 0


def test_scaling_an_hdf5_float16_net_warns_against_float16(tmp_path):
    h5py = pytest.importorskip("h5py")
    path = write_h5(tmp_path / "half.caffemodel.h5", h5_net_bytes([("conv", [HALF.reshape(2, 3)])]))
    out = tmp_path / "scaled.caffemodel.h5"
    result = ok("scale", path, "100", "-o", out)
    assert warnings(result.stderr) == {"conv/0": (HALF_OVERFLOWS, "float16")}
    with h5py.File(out, "r") as f:
        written = f["data/conv/0"][()]
    assert written.dtype == np.float16 and infs(written) == HALF_OVERFLOWS


def test_update_of_float16_blobs_warns_against_float16(tmp_path):
    data = np.array([65000.0, 1.0, -65000.0], np.float16)
    diff = np.array([-1000.0, 0.5, 1000.0], np.float16)
    path = tmp_path / "half.pb"
    path.write_bytes(raw_blob_bytes(data, diff))
    out = tmp_path / "stepped.pb"
    result = ok("update", path, "-o", out)
    assert warnings(result.stderr) == {"0": (2, "float16")}
    assert "data -= diff turned 2 of 3 data values" in result.stderr
    assert infs(blobtool.load(out).cpu_data()) == 2


def test_scaling_a_float16_diff_warns_about_the_diff(tmp_path):
    path = tmp_path / "half.pb"
    path.write_bytes(raw_blob_bytes(np.ones(6, np.float16), HALF))
    result = ok("scale", path, "2", "--diff-factor", "100", "-o", tmp_path / "x.pb")
    assert f"turned {HALF_OVERFLOWS} of 6 diff values into Inf or NaN (past float16's range)" in result.stderr
    assert result.stderr.count("\n") == 1


def test_convert_half_still_keeps_what_float16_cannot_hold(tmp_path):
    """--half never narrows into Inf: a blob past float16's range stays float32, with its warning."""
    from safetensors.numpy import load_file, save_file

    path = tmp_path / "wide.safetensors"
    save_file({"w": HALF.astype(np.float32) * 100, "b": HALF.astype(np.float32)}, str(path))
    out = tmp_path / "half.safetensors"
    result = ok("convert", "--half", path, "-o", out)
    assert "blob w: 2 of 6 values are past float16's range" in result.stderr
    back = load_file(str(out))
    assert back["w"].dtype == np.float32 and back["b"].dtype == np.float16 and infs(back["w"]) == 0


def test_scaling_float16_on_a_device_warns_as_on_the_host(tmp_path):
    import fakecupy
    from blobtool.engine.syncedmem import get_backend, set_backend

    path = tmp_path / "half.pb"
    path.write_bytes(raw_blob_bytes(HALF, HALF))
    host = ok("scale", path, "100", "--diff-factor", "100", "-o", tmp_path / "host.pb")
    previous = get_backend()
    with fakecupy.installed(count=1):
        device = invoke("scale", path, "100", "--diff-factor", "100", "--device", "0", "-o", tmp_path / "gpu.pb")
        set_backend(None)
    set_backend(previous)
    assert device.exit_code == 0, device.output
    assert device.stderr == host.stderr
    assert f"{HALF_OVERFLOWS} of 6 data values and {HALF_OVERFLOWS} of 6 diff values" in host.stderr
    assert (tmp_path / "gpu.pb").read_bytes() == (tmp_path / "host.pb").read_bytes()


# -- item: a diff stored wider than its data keeps its width ----------------------------------

WIDE = np.array([1e100, -2.0, 3.0, 1e300, -1e-300, 0.1])   # past float32's range, and below it
DATA = np.array([1.0, 2.0, -3.0, 4.0, 5.0, 6.0], np.float32)


def wide_blob_bytes() -> bytes:
    proto = pb.BlobProto()
    proto.shape.dim.extend([2, 3])
    proto.data.extend(DATA.tolist())
    proto.double_diff.extend(WIDE.tolist())
    return proto.SerializeToString()


def wide_inputs(tmp_path) -> dict:
    """The same blob in every format that can hold float data beside a double diff: {format: (path, name)}."""
    from safetensors.numpy import save_file

    blob = tmp_path / "wide.pb"
    blob.write_bytes(wide_blob_bytes())
    npz = write_npz(tmp_path / "wide.npz", {"w": DATA.reshape(2, 3), "w/diff": WIDE.reshape(2, 3)})
    st = tmp_path / "wide.safetensors"
    save_file({"w": DATA.reshape(2, 3), "w/diff": WIDE.reshape(2, 3)}, str(st))
    out = {"blob": (blob, "0"), "npz": (npz, "w"), "safetensors": (st, "w")}
    try:
        import h5py  # noqa: F401
    except ImportError:
        return out
    h5 = write_h5(tmp_path / "wide.caffemodel.h5", h5_net_bytes([("fc", [DATA.reshape(2, 3)])],
                                                                 diffs={("fc", 0): WIDE.reshape(2, 3)}))
    out["hdf5"] = (h5, "fc/0")
    return out


def test_every_reader_holds_the_wider_diff_at_its_width(tmp_path):
    for fmt, (path, name) in wide_inputs(tmp_path).items():
        blob = blobtool.load_all(path)[name]
        assert blob.dtype == np.float32 and blob.diff_dtype == np.float64, fmt
        assert np.array_equal(blob.cpu_diff(), WIDE), fmt
        assert np.array_equal(blob.cpu_data(), DATA), fmt


def test_norm_sums_the_diff_at_its_own_width(tmp_path):
    exact = np.array([1e100, -2.0, 3.0, 1e-300, 0.1])  # sumsq stays finite in double
    path = tmp_path / "wide.pb"
    proto = pb.BlobProto()
    proto.shape.dim.append(5)
    proto.data.extend([1, 2, 3, 4, 5])
    proto.double_diff.extend(exact.tolist())
    path.write_bytes(proto.SerializeToString())
    record = one_json(ok("norm", "--json", path))
    diff = record["blobs"][0]["diff"]
    assert diff["asum"] == pytest.approx(float(np.abs(exact).sum()), rel=1e-15)
    assert diff["sumsq"] == pytest.approx(float((exact * exact).sum()), rel=1e-15)
    for fmt, (src, _) in wide_inputs(tmp_path).items():
        text = ok("norm", src).stdout
        assert "1e+300" in text, (fmt, text)  # the diff's asum: 1e300 + 1e100 + ..., not inf


def test_info_shows_the_diff_dtype_where_it_differs(tmp_path):
    for fmt, (path, name) in wide_inputs(tmp_path).items():
        record = one_json(ok("info", "--json", path))
        (entry,) = [b for b in record["blobs"] if b["name"] == name]
        assert entry["dtype"] == "float32" and entry["diff_dtype"] == "float64", fmt
        assert "float32, diff float64" in ok("info", path).stdout, fmt
    same = write_blob(tmp_path / "same.pb", [1.0, 2.0], [3.0, 4.0])
    assert "diff_dtype" not in one_json(ok("info", "--json", same))["blobs"][0]


def test_compare_sees_diffs_that_differ_past_float32s_range(tmp_path):
    path = tmp_path / "a.pb"
    path.write_bytes(wide_blob_bytes())
    other = pb.BlobProto.FromString(wide_blob_bytes())
    other.double_diff[3] = 2e300  # both would be Inf in float32
    (tmp_path / "b.pb").write_bytes(other.SerializeToString())
    assert invoke("compare", path, tmp_path / "b.pb").exit_code == 1
    assert invoke("compare", path, path).exit_code == 0
    changed = WIDE.copy()
    changed[3] = 2e300
    a = write_npz(tmp_path / "a.npz", {"w": DATA, "w/diff": WIDE})
    b = write_npz(tmp_path / "b.npz", {"w": DATA, "w/diff": changed})
    assert invoke("compare", a, b).exit_code == 1
    assert invoke("compare", a, a).exit_code == 0


@pytest.mark.parametrize("ext", ["pb", "npz", "safetensors", "caffemodel.h5"])
def test_conversions_keep_the_double_diff(tmp_path, ext):
    inputs = wide_inputs(tmp_path)
    if ext == "caffemodel.h5":
        if "hdf5" not in inputs:
            pytest.skip("h5py is not installed")
        sources = [inputs["hdf5"]]
    else:
        sources = [inputs[fmt] for fmt in ("blob", "npz", "safetensors")]
    for src, name in sources:
        out = tmp_path / f"out.{ext}"
        ok("convert", src, "-o", out)
        blob = blobtool.load_all(out)[name if ext in ("npz", "safetensors", "caffemodel.h5") else "0"]
        assert blob.diff_dtype == np.float64 and np.array_equal(blob.cpu_diff(), WIDE), (src, ext)
        assert blob.dtype == np.float32 and np.array_equal(blob.cpu_data(), DATA), (src, ext)


def test_float_and_double_convert_both_sides(tmp_path):
    path = tmp_path / "wide.pb"
    proto = pb.BlobProto()
    proto.shape.dim.append(2)
    proto.data.extend([1.5, 2.5])
    proto.double_diff.extend([0.25, -0.5])
    path.write_bytes(proto.SerializeToString())
    ok("convert", "--double", path, "-o", tmp_path / "d.pb")
    doubled = pb.BlobProto.FromString((tmp_path / "d.pb").read_bytes())
    assert list(doubled.double_data) == [1.5, 2.5] and list(doubled.double_diff) == [0.25, -0.5]
    assert not doubled.data and not doubled.diff
    ok("convert", "--float", path, "-o", tmp_path / "f.pb")
    floated = pb.BlobProto.FromString((tmp_path / "f.pb").read_bytes())
    assert list(floated.data) == [1.5, 2.5] and list(floated.diff) == [0.25, -0.5]
    assert not floated.double_data and not floated.double_diff


def test_float_says_how_many_doubles_became_inf(tmp_path):
    """--float narrows as asked, as Caffe's cast does, but never in silence."""
    path = tmp_path / "wide.pb"
    path.write_bytes(wide_blob_bytes())
    result = ok("convert", "--float", path, "-o", tmp_path / "f.pb")
    # 1e100 and 1e300 are past float32's range; -3.5e38 too.
    assert warnings(result.stderr) == {"0": (2, "float32")}
    assert "converting to float32 turned 2 of 6 diff values" in result.stderr
    floated = pb.BlobProto.FromString((tmp_path / "f.pb").read_bytes())
    assert int(np.count_nonzero(np.isinf(np.array(floated.diff, np.float32)))) == 2
    fits = write_blob(tmp_path / "fits.pb", [1.0, 2.0], [3.0, 4.0], double=True)
    assert ok("convert", "--float", fits, "-o", tmp_path / "g.pb").stderr == ""


def test_half_keeps_a_diff_float16_cannot_hold(tmp_path):
    path = tmp_path / "wide.pb"
    path.write_bytes(wide_blob_bytes())
    result = ok("convert", "--half", path, "-o", tmp_path / "h.pb")
    assert "values are past float16's range" in result.stderr
    assert "kept as stored (float32, diff float64)" in result.stderr
    blob = blobtool.load(tmp_path / "h.pb")
    assert np.array_equal(blob.cpu_diff(), WIDE) and np.array_equal(blob.cpu_data(), DATA)
    assert blob.diff_dtype == np.float64 and blob.dtype == np.float32
    # A diff that float32 would hold only as 0 (1e-300) is not flushed either.
    tiny = pb.BlobProto()
    tiny.shape.dim.append(2)
    tiny.data.extend([1e5, 1.0])  # past float16's range: the blob is not written in float16
    tiny.double_diff.extend([1e-300, 0.5])
    (tmp_path / "tiny.pb").write_bytes(tiny.SerializeToString())
    ok("convert", "--half", tmp_path / "tiny.pb", "-o", tmp_path / "t.pb")
    assert list(pb.BlobProto.FromString((tmp_path / "t.pb").read_bytes()).double_diff) == [1e-300, 0.5]
    assert invoke("convert", "--half-strict", path, "-o", tmp_path / "s.pb").exit_code == 2
    assert not (tmp_path / "s.pb").exists()


def test_update_with_a_wider_diff_computes_in_the_datas_type_and_warns(tmp_path):
    path = tmp_path / "wide.pb"
    path.write_bytes(wide_blob_bytes())
    out = tmp_path / "stepped.pb"
    result = ok("update", path, "-o", out)
    # 1e100 and 1e300 are Inf once rounded to float32, as Caffe's cast makes them.
    assert warnings(result.stderr) == {"0": (2, "float32")}
    written = pb.BlobProto.FromString(out.read_bytes())
    with np.errstate(over="ignore"):
        expected = DATA - WIDE.astype(np.float32)
    assert np.array_equal(np.array(written.data, np.float32), expected)
    assert list(written.double_diff) == WIDE.tolist()  # the diff is written back at its width


def test_scaling_the_wider_diff_counts_against_float64(tmp_path):
    path = tmp_path / "wide.pb"
    path.write_bytes(wide_blob_bytes())
    result = ok("scale", path, "1", "--diff-factor", "1e10", "-o", tmp_path / "x.pb")
    assert warnings(result.stderr) == {"0": (1, "float64")}  # 1e300 * 1e10; 1e110 still fits a double
    written = pb.BlobProto.FromString((tmp_path / "x.pb").read_bytes())
    assert written.double_diff[0] == 1e110


# -- the Blob API ---------------------------------------------------------------------------

def test_a_blob_has_one_dtype_unless_asked_as_in_caffe():
    blob = Blob(2, 3)
    assert blob.diff_dtype == blob.dtype == np.float32
    assert Blob(2, dtype=np.float64).diff_dtype == np.float64


def test_a_blob_with_a_wider_diff_writes_each_side_in_its_field():
    blob = Blob(3, dtype=np.float32, diff_dtype=np.float64)
    blob.data[:] = [1, 2, 3]
    blob.diff[:] = [1e300, 0.5, 0.25]
    assert blob.cpu_diff().dtype == np.float64
    proto = blob.to_proto(write_diff=True)
    assert list(proto.data) == [1, 2, 3] and list(proto.double_diff) == [1e300, 0.5, 0.25]
    assert "diff_dtype=float64" in repr(blob)
    assert blob.asum_diff() == pytest.approx(1e300)
    with np.errstate(over="ignore"):
        blob.update()
    assert blob.cpu_data().dtype == np.float32
    assert np.isneginf(blob.cpu_data()[0]) and blob.cpu_data()[1] == 1.5


def test_a_python_blob_with_a_wider_diff_saves_it_without_loss(tmp_path):
    blob = Blob(2, dtype=np.float32, diff_dtype=np.float64)
    blob.data[:] = [1, 2]
    blob.diff[:] = [1e300, -1e-300]
    blobtool.save(blob, tmp_path / "x.pb", write_diff=True)
    back = blobtool.load(tmp_path / "x.pb")
    assert back.diff_dtype == np.float64 and back.cpu_diff().tolist() == [1e300, -1e-300]
    blobtool.write(None, {"x": blob}, tmp_path / "x.npz", write_diff=True)
    assert np.load(tmp_path / "x.npz")["x/diff"].tolist() == [1e300, -1e-300]

