"""Caffe's HDF5 snapshots (formats/hdf5/): reading, writing, converting both ways, every command, bad input.

The inputs are built with h5py in Caffe's exact layout (tests/helpers/builders.py:
h5_net_bytes, h5_solverstate_bytes, as Caffe's net.cpp ToHDF5 and
sgd_solver.cpp SnapshotSolverStateToHDF5 write them); h5py is the oracle for
what an HDF5 file holds, the protobuf library for what a protobuf file holds.
The real snapshot Caffe wrote is read from ../shared/realworld (skipped with
a reason where that folder is absent).
"""

from __future__ import annotations

import io
import os
import json
import subprocess
import sys

import numpy as np
import pytest

import blobtool
from blobtool._pb import blobtool_caffe_pb2 as pb
from blobtool.errors import FormatError, UsageError
from blobtool.formats import get_format, open_document
from builders import (Layer, blob_proto, h5_bytes, h5_net_bytes, h5_solverstate_bytes, h5_string, signed_values,
                      write_h5, write_net, write_solverstate)
from runner import BLOBTOOL, REPO, assert_error, invoke, ok, one_json, run_blobtool, run_pipeline, subprocess_env

h5py = pytest.importorskip("h5py", reason="h5py (the hdf5 extra) is not installed")

REAL = "cifar10_full_iter_70000.caffemodel.h5"
RNG = np.random.default_rng(20240701)


@pytest.fixture(autouse=True)
def _fresh_rng():
    global RNG
    RNG = np.random.default_rng(20240701)


def values(shape, dtype=np.float32) -> np.ndarray:
    return signed_values(RNG, shape, dtype)


def h5_tree(path) -> dict:
    """{HDF5 path: (kind, dtype, shape)} of a file, read with h5py."""
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = ("dataset", obj.dtype.str, obj.shape)
            else:
                out[name] = ("group", None, None)
        f.visititems(visit)
    return out


def h5_array(path, name) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return f[name][()]


def net_layers(double=False):
    """[(layer, [arrays])]: two with parameters, one without, one with a single (double) blob."""
    dt = np.float64 if double else np.float32
    return [("conv1", [values((4, 3, 2, 2), dt), values((4,), dt)]),
            ("relu1", []),
            ("ip1", [values((5, 16), dt), values((5,), dt)]),
            ("scale", [values((7,), dt)])]


# =====================================================================================
# Reading
# =====================================================================================

@pytest.mark.parametrize("double", [False, True])
@pytest.mark.parametrize("with_diff", [False, True])
def test_reads_a_net_in_caffes_layout(tmp_path, double, with_diff):
    layers = net_layers(double)
    diffs = {(name, i): values(a.shape, a.dtype) for name, arrays in layers for i, a in enumerate(arrays)}
    path = write_h5(tmp_path / "net.caffemodel.h5", h5_net_bytes(layers, diffs=diffs if with_diff else None))
    doc = open_document(path)
    assert (doc.kind, doc.format) == ("net", "hdf5")
    # Layers come in name order (Caffe's groups do not track creation order), blobs by index.
    assert [layer.name for layer in doc.layers] == ["conv1", "ip1", "relu1", "scale"]
    assert doc.names() == ["conv1/0", "conv1/1", "ip1/0", "ip1/1", "scale/0"]
    blobs = blobtool.load_all(path)
    for name, arrays in layers:
        for i, array in enumerate(arrays):
            blob = blobs[f"{name}/{i}"]
            assert blob.shape == array.shape and blob.dtype == array.dtype
            assert np.array_equal(blob.cpu_data().reshape(array.shape), h5_array(path, f"data/{name}/{i}"))
            if with_diff:
                assert np.array_equal(blob.cpu_diff().reshape(array.shape), h5_array(path, f"diff/{name}/{i}"))
    record = one_json(ok("info", "--json", path))
    assert record["kind"] == "net" and record["format"] == "hdf5"
    assert [b["has_diff"] for b in record["blobs"]] == [with_diff] * 5
    assert {b["dtype"] for b in record["blobs"]} == {"float64" if double else "float32"}
    assert [b["layer"] for b in record["blobs"]] == ["conv1", "conv1", "ip1", "ip1", "scale"]


def test_a_blob_views_the_file_and_is_read_only_when_built(tmp_path):
    # Caffe's datasets are contiguous: a blob's values view the input's bytes (no copy).
    layers = [("ip", [values((300, 200))])]
    path = write_h5(tmp_path / "n.h5", h5_net_bytes(layers))
    doc = open_document(path)
    data = doc.entries[0].blob().cpu_data()
    assert not data.flags.owndata
    assert np.array_equal(data.reshape(300, 200), layers[0][1][0])
    # Scaling changes a private copy of the pages, never the file.
    before = path.read_bytes()
    doc.entries[0].blob().scale_data(2.0)
    assert path.read_bytes() == before


def test_shared_parameters_are_listed_not_blobs(tmp_path):
    # conv1_p shares both of conv1's parameters; ip2 shares only its bias with ip1.
    layers = [("conv1", [values((2, 2))] * 2), ("conv1_p", [values((2, 2))] * 2),
              ("ip1", [values((3,)), values((3,))]), ("ip2", [values((3,)), values((3,))])]
    shared = {("conv1_p", 0), ("conv1_p", 1), ("ip2", 1)}
    path = write_h5(tmp_path / "siamese.caffemodel.h5", h5_net_bytes(layers, diffs={}, shared=shared))
    record = one_json(ok("info", "--json", path))
    assert [b["name"] for b in record["blobs"]] == ["conv1/0", "conv1/1", "ip1/0", "ip1/1", "ip2/0"]
    assert record["shared"] == ["conv1_p/0", "conv1_p/1", "ip2/1"]
    assert [layer.name for layer in open_document(path).layers] == ["conv1", "conv1_p", "ip1", "ip2"]


def test_reads_a_solverstate(tmp_path):
    history = [values((3, 2)), values((3,)), values((2, 2, 2))]
    path = write_h5(tmp_path / "s.solverstate.h5",
                    h5_solverstate_bytes(history, iter_=5000, learned_net="snap/net_iter_5000.caffemodel.h5",
                                         current_step=3))
    record = one_json(ok("info", "--json", path))
    assert (record["kind"], record["format"]) == ("solverstate", "hdf5")
    assert (record["iter"], record["learned_net"], record["current_step"]) == \
        (5000, "snap/net_iter_5000.caffemodel.h5", 3)
    assert [b["name"] for b in record["blobs"]] == ["history/0", "history/1", "history/2"]
    blobs = blobtool.load_all(path)
    for i, array in enumerate(history):
        assert np.array_equal(blobs[f"history/{i}"].cpu_data().reshape(array.shape), array)


@pytest.mark.parametrize("userblock", [512, 1024, 4096])
def test_signature_after_a_user_block(tmp_path, userblock):
    data = h5_net_bytes([("conv1", [values((2, 3))])], userblock=userblock)
    assert data[userblock:userblock + 8] == b"\x89HDF\r\n\x1a\n" and not data.startswith(b"\x89HDF")
    path = write_h5(tmp_path / "ub.h5", data)
    doc = open_document(path)
    assert (doc.kind, doc.format, doc.names()) == ("net", "hdf5", ["conv1/0"])
    assert doc.entries[0].blob().cpu_data().size == 6


def test_reads_from_standard_input_and_file_objects(tmp_path):
    layers = [("conv1", [values((2, 3))])]
    data = h5_net_bytes(layers)
    blobs = blobtool.load_all(io.BytesIO(data))
    assert np.array_equal(blobs["conv1/0"].cpu_data().reshape(2, 3), layers[0][1][0])
    result = run_blobtool("norm", "--json", "-", input=data)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["blobs"][0]["data"]["asum"] == pytest.approx(
        float(np.abs(layers[0][1][0].astype(np.float64)).sum()))


@pytest.mark.parametrize("how", ["chunked_gzip", "big_endian", "float16", "compact"])
def test_other_float_datasets_are_read_through_h5py(tmp_path, how):
    array = values((6, 5))
    def build(f):
        group = f.create_group("data").create_group("ip")
        if how == "chunked_gzip":
            group.create_dataset("0", data=array, chunks=(2, 5), compression="gzip")
        elif how == "compact":  # values in the object header, inside the file
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_layout(h5py.h5d.COMPACT)
            dsid = h5py.h5d.create(group.id, b"0", h5py.h5t.IEEE_F32LE, h5py.h5s.create_simple((6, 5)), dcpl=dcpl)
            dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, array)
        elif how == "big_endian":
            group.create_dataset("0", data=array.astype(">f4"))
        else:
            group.create_dataset("0", data=array.astype(np.float16))
    path = write_h5(tmp_path / f"{how}.h5", h5_bytes(build))
    doc = open_document(path)
    blob = doc.entries[0].blob()
    expected = array.astype(np.float16).astype(np.float32) if how == "float16" else array
    assert blob.dtype == np.float32 and np.array_equal(blob.cpu_data().reshape(6, 5), expected)
    assert doc.entries[0].dtype == (np.float16 if how == "float16" else array.dtype)


# =====================================================================================
# Writing, and converting both ways
# =====================================================================================

def protobuf_net(tmp_path, double=False, with_diff=True):
    """A .caffemodel with two layers without blobs, float or double blobs, with diffs."""
    dt = np.float64 if double else np.float32
    def blob(shape):
        return blob_proto(values(shape, dt), values(shape, dt) if with_diff else None, double=double)
    layers = [Layer("data", "Input"), Layer("conv1", "Convolution", [blob((4, 3, 2, 2)), blob((4,))]),
              Layer("relu1", "ReLU"), Layer("ip1", "InnerProduct", [blob((5, 16)), blob((5,))])]
    return write_net(tmp_path / "net.caffemodel", "new", layers)


def parse_net(path) -> dict:
    """{name: (shape, data, diff)} of a .caffemodel, by the protobuf library, and its layer names."""
    net = pb.NetParameter()
    net.ParseFromString(path.read_bytes())
    out = {}
    for layer in net.layer:
        for i, b in enumerate(layer.blobs):
            data = np.array(b.double_data, np.float64) if len(b.double_data) else np.array(b.data, np.float32)
            diff = np.array(b.double_diff, np.float64) if len(b.double_diff) else np.array(b.diff, np.float32)
            out[f"{layer.name}/{i}"] = (tuple(b.shape.dim), data, diff)
    return out, [layer.name for layer in net.layer]


@pytest.mark.parametrize("double", [False, True])
@pytest.mark.parametrize("with_diff", [False, True])
def test_caffemodel_to_h5_and_back_is_bit_exact(tmp_path, double, with_diff):
    src = protobuf_net(tmp_path, double, with_diff)
    h5 = tmp_path / "net.caffemodel.h5"
    ok("convert", src, "-o", h5)
    # Caffe's layout: data/<layer>/<i> (every layer, empty ones too), diff mirroring it, dtypes kept.
    dtype = "<f8" if double else "<f4"
    expected = {"data": ("group", None, None)}
    for layer in ("conv1", "data", "ip1", "relu1"):
        expected[f"data/{layer}"] = ("group", None, None)
    shapes = {"conv1/0": (4, 3, 2, 2), "conv1/1": (4,), "ip1/0": (5, 16), "ip1/1": (5,)}
    for name, shape in shapes.items():
        expected[f"data/{name}"] = ("dataset", dtype, shape)
    if with_diff:
        expected["diff"] = ("group", None, None)
        for key, value in list(expected.items()):
            if key.startswith("data/"):
                expected["diff/" + key[5:]] = value
    assert h5_tree(h5) == expected
    original, _ = parse_net(src)
    with h5py.File(h5, "r") as f:
        for name, (shape, data, diff) in original.items():
            assert f[f"data/{name}"].id.get_create_plist().get_layout() == h5py.h5d.CONTIGUOUS
            assert np.array_equal(f[f"data/{name}"][()].reshape(-1), data)
            if with_diff:
                assert np.array_equal(f[f"diff/{name}"][()].reshape(-1), diff)
    assert run_blobtool("compare", src, h5).returncode == 0
    back = tmp_path / "back.caffemodel"
    ok("convert", h5, "-o", back)
    again, layer_names = parse_net(back)
    assert layer_names == ["conv1", "data", "ip1", "relu1"]  # names and blobs only, in the snapshot's order
    assert again.keys() == original.keys()
    for name, (shape, data, diff) in original.items():
        assert again[name][0] == shape
        assert again[name][1].dtype == data.dtype and np.array_equal(again[name][1], data)
        assert np.array_equal(again[name][2], diff)
    net = pb.NetParameter()
    net.ParseFromString(back.read_bytes())
    assert all(not layer.type for layer in net.layer)
    for a, b in ((src, back), (h5, back), (back, h5)):
        result = run_blobtool("compare", a, b)
        assert result.returncode == 0, result.stdout


def test_solverstate_to_h5_and_back(tmp_path):
    history = [values((3, 2)), values((3,), np.float64)]
    src = write_solverstate(tmp_path / "s.solverstate", [blob_proto(history[0]), blob_proto(history[1], double=True)],
                            iter_=777, learned_net="x_iter_777.caffemodel", current_step=2)
    h5 = tmp_path / "s.solverstate.h5"
    ok("convert", src, "-o", h5)
    assert h5_tree(h5) == {"iter": ("dataset", "<i4", (1,)), "current_step": ("dataset", "<i4", (1,)),
                           "learned_net": ("dataset", "|S22", ()), "history": ("group", None, None),
                           "history/0": ("dataset", "<f4", (3, 2)), "history/1": ("dataset", "<f8", (3,))}
    with h5py.File(h5, "r") as f:
        # As H5LTmake_dataset_string: a NUL-terminated fixed-length string of len + 1 bytes.
        tid = f["learned_net"].id.get_type()
        assert tid.get_strpad() == h5py.h5t.STR_NULLTERM and tid.get_size() == len("x_iter_777.caffemodel") + 1
        assert f["learned_net"][()] == b"x_iter_777.caffemodel"
        assert (f["iter"][0], f["current_step"][0]) == (777, 2)
    back = tmp_path / "back.solverstate"
    ok("convert", h5, "-o", back)
    assert back.read_bytes() == src.read_bytes()  # the SolverState Caffe would write, byte for byte
    assert run_blobtool("compare", src, h5).returncode == 0


def test_the_real_snapshot_layout_and_round_trip(tmp_path, realworld):
    real = realworld / REAL
    tree = h5_tree(real)
    # What Caffe wrote: only "data", a group per layer, float32 datasets, empty groups for layers without parameters.
    assert {k.split("/")[0] for k in tree} == {"data"}
    assert {v[1] for v in tree.values() if v[0] == "dataset"} == {"<f4"}
    assert tree["data/relu1"] == ("group", None, None) and not any(k.startswith("data/relu1/") for k in tree)
    record = one_json(ok("info", "--json", real))
    assert record["format"] == "hdf5" and len(record["blobs"]) == 10
    pb_path, h5_path = tmp_path / "cifar.caffemodel", tmp_path / "cifar.caffemodel.h5"
    ok("convert", real, "-o", pb_path)
    ok("convert", pb_path, "-o", h5_path)
    assert h5_tree(h5_path) == tree  # the same groups, datasets, dtypes and shapes as Caffe's
    with h5py.File(real, "r") as a, h5py.File(h5_path, "r") as b:
        for name, (kind, _, _) in tree.items():
            if kind == "dataset":
                assert np.array_equal(a[name][()], b[name][()])
                assert b[name].id.get_create_plist().get_layout() == a[name].id.get_create_plist().get_layout()
    for x, y in ((real, pb_path), (pb_path, h5_path), (real, h5_path)):
        result = run_blobtool("compare", x, y)
        assert result.returncode == 0, result.stdout
    parsed, layers = parse_net(pb_path)
    assert layers == [k.split("/")[1] for k, v in tree.items() if v[0] == "group" and k.count("/") == 1]


def test_writing_is_deterministic_and_keeps_hdf5_unless_told(tmp_path):
    src = write_h5(tmp_path / "n.h5", h5_net_bytes(net_layers(), diffs={}))
    ok("convert", src, "-o", tmp_path / "a_copy")      # no extension: the input's own format
    ok("convert", src, "-o", tmp_path / "b_copy")
    assert (tmp_path / "a_copy").read_bytes() == (tmp_path / "b_copy").read_bytes()
    assert open_document(tmp_path / "a_copy").format == "hdf5"
    ok("convert", src, "--format", "protobuf", "-o", tmp_path / "c.bin")
    assert open_document(tmp_path / "c.bin").format == "caffe"
    ok("convert", tmp_path / "c.bin", "--format", "hdf5", "-o", tmp_path / "d.bin")
    assert open_document(tmp_path / "d.bin").format == "hdf5"


def test_precision_and_diff_options(tmp_path):
    layers = net_layers()
    src = write_h5(tmp_path / "n.h5", h5_net_bytes(layers, diffs={}))
    ok("convert", "--double", src, "-o", tmp_path / "d.h5")
    tree = h5_tree(tmp_path / "d.h5")
    assert {v[1] for k, v in tree.items() if v[0] == "dataset"} == {"<f8"}
    ok("convert", "--no-diff", src, "-o", tmp_path / "nd.h5")
    assert not any(k.startswith("diff") for k in h5_tree(tmp_path / "nd.h5"))
    ok("convert", "--half", src, "-o", tmp_path / "h.h5")
    assert {v[1] for v in h5_tree(tmp_path / "h.h5").values() if v[0] == "dataset"} == {"<f2"}
    blobs = blobtool.load_all(tmp_path / "h.h5")
    assert np.array_equal(blobs["ip1/0"].cpu_data().reshape(5, 16),
                          layers[2][1][0].astype(np.float16).astype(np.float32))
    # --blob converts only the selected blobs; the container is written whole.
    ok("convert", "--double", "--blob", "conv1/0", src, "-o", tmp_path / "one.h5")
    tree = h5_tree(tmp_path / "one.h5")
    assert tree["data/conv1/0"][1] == "<f8" and tree["data/conv1/1"][1] == "<f4" and "data/ip1/0" in tree


def test_legacy_is_refused_for_hdf5_output_and_allowed_for_protobuf(tmp_path):
    src = write_h5(tmp_path / "n.h5", h5_net_bytes([("conv1", [values((2, 3, 2, 2))])]))
    assert_error(invoke("convert", "--legacy", src, "-o", tmp_path / "o.h5"), 2, "--layout legacy", "HDF5")
    assert not (tmp_path / "o.h5").exists()
    ok("convert", "--legacy", src, "-o", tmp_path / "o.caffemodel")
    net = pb.NetParameter()
    net.ParseFromString((tmp_path / "o.caffemodel").read_bytes())
    assert (net.layer[0].blobs[0].num, net.layer[0].blobs[0].width) == (2, 2)


def test_what_hdf5_cannot_hold_is_refused(tmp_path):
    # A layer name with '/' (GoogLeNet's), a vector input, a shared parameter written as protobuf.
    net = write_net(tmp_path / "g.caffemodel", "new", [Layer("conv1/7x7_s2", "Convolution", [values((2, 2))])])
    assert_error(invoke("convert", net, "-o", tmp_path / "g.h5"), 2, "conv1/7x7_s2", "HDF5 group name")
    from builders import write_vector
    vec = write_vector(tmp_path / "v.binaryproto", [values((2,))])
    assert_error(invoke("convert", vec, "-o", tmp_path / "v.h5"), 2, "holds a net or solverstate", "vector input")
    shared = write_h5(tmp_path / "s.h5", h5_net_bytes([("a", [values((2,))] * 2), ("b", [values((2,))] * 2)],
                                                       shared={("b", 0)}))
    assert_error(invoke("convert", shared, "-o", tmp_path / "s.caffemodel"), 2, "layer 'b'", "by position")
    ok("convert", shared, "-o", tmp_path / "s2.h5")  # HDF5 holds it as Caffe does
    assert "data/b/0" not in h5_tree(tmp_path / "s2.h5") and "data/b/1" in h5_tree(tmp_path / "s2.h5")
    for path in (tmp_path / "g.h5", tmp_path / "v.h5", tmp_path / "s.caffemodel"):
        assert not path.exists()


def test_writing_to_a_pipe_and_onto_the_input(tmp_path):
    layers = net_layers()
    src = write_h5(tmp_path / "n.h5", h5_net_bytes(layers))
    result = run_pipeline(f"{BLOBTOOL} scale n.h5 2 -o - | {BLOBTOOL} norm --json -", tmp_path)
    assert result.returncode == 0, result.stderr
    total = sum(float(np.abs(a.astype(np.float64)).sum()) for _, arrays in layers for a in arrays)
    assert json.loads(result.stdout)["total"]["data"]["asum"] == pytest.approx(2 * total, rel=1e-6)
    ok("scale", src, "0.5", "-o", src)  # -o may name the input
    blobs = blobtool.load_all(src)
    assert np.array_equal(blobs["ip1/0"].cpu_data().reshape(5, 16), layers[2][1][0] * np.float32(0.5))
    assert open_document(src).format == "hdf5"


# =====================================================================================
# Every command
# =====================================================================================

def test_every_command_on_a_net_snapshot(tmp_path):
    layers = net_layers()
    layers[2][1][0][1, 3] = np.nan
    diffs = {(name, i): values(a.shape) for name, arrays in layers for i, a in enumerate(arrays)}
    path = write_h5(tmp_path / "n.caffemodel.h5", h5_net_bytes(layers, diffs=diffs))
    stats = one_json(ok("info", "--json", "--stats", "--blob", "conv1", path))
    assert [b["name"] for b in stats["blobs"]] == ["conv1/0", "conv1/1"]
    assert stats["blobs"][0]["stats"]["data"]["max"] == pytest.approx(float(layers[0][1][0].max()))
    check = invoke("info", "--check", "finite", path)
    assert check.exit_code == 1 and "blob ip1/0 data has 1 NaN" in check.stderr
    assert "n.caffemodel.h5  net (hdf5)" in ok("info", path).stdout
    norm = one_json(ok("norm", "--json", "--blob", "conv*/0", path))
    assert norm["blobs"][0]["data"]["sumsq"] == pytest.approx(float((layers[0][1][0].astype(np.float64) ** 2).sum()))
    assert norm["blobs"][0]["diff"]["asum"] == pytest.approx(float(np.abs(diffs[("conv1", 0)]).sum()), rel=1e-6)
    ok("update", path, "-o", tmp_path / "u.h5")
    updated = blobtool.load_all(tmp_path / "u.h5")
    assert np.array_equal(updated["conv1/0"].cpu_data().reshape(4, 3, 2, 2),
                          layers[0][1][0] - diffs[("conv1", 0)])
    ok("scale", path, "3", "--diff-factor", "0", "-o", tmp_path / "s.h5")
    scaled = blobtool.load_all(tmp_path / "s.h5")
    assert np.array_equal(scaled["scale/0"].cpu_data(), layers[3][1][0] * np.float32(3))
    assert not scaled["scale/0"].cpu_diff().any()
    assert invoke("compare", path, tmp_path / "s.h5").exit_code == 1
    ok("convert", path, "--blob", "ip1/1", "-o", tmp_path / "b.npy")
    assert np.array_equal(np.load(tmp_path / "b.npy"), layers[2][1][1])
    ok("convert", path, "-o", tmp_path / "all.npz")
    assert set(np.load(tmp_path / "all.npz").files) >= {"conv1/0", "conv1/0/diff", "scale/0"}
    shown = ok("show", path, "--blob", "conv1/0")
    assert shown.stdout


def test_every_command_on_a_solverstate_snapshot(tmp_path):
    history = [values((3, 4)), values((4,))]
    path = write_h5(tmp_path / "s.solverstate.h5", h5_solverstate_bytes(history, iter_=9))
    assert "iter 9" in ok("info", path).stdout
    ok("scale", path, "2", "-o", tmp_path / "x.h5")
    with h5py.File(tmp_path / "x.h5", "r") as f:
        assert f["iter"][0] == 9 and np.array_equal(f["history/0"][()], history[0] * np.float32(2))
    assert invoke("compare", path, tmp_path / "x.h5").exit_code == 1
    assert_error(invoke("update", path, "-o", tmp_path / "u.h5"), 3, "no diff")
    ok("show", path, "--blob", "history/0")


# =====================================================================================
# Bad input: exit 3, one line naming the file and the HDF5 path
# =====================================================================================

def _other_groups(f):
    f.create_group("data").create_group("conv1").create_dataset("0", data=np.zeros(2, np.float32))
    f.create_group("model_weights")


def _blob(data):
    def build(f):
        f.create_group("data").create_group("conv1").create_dataset("0", data=data)
    return build


def _nested(f):
    f.create_group("data").create_group("conv1").create_group("7x7")


def _solver_int_history(f):
    f.create_dataset("iter", data=np.array([1], np.int32))
    h5_string(f, "learned_net", "x")
    f.create_dataset("current_step", data=np.array([0], np.int32))
    f.create_group("history").create_dataset("0", data=np.arange(3, dtype=np.int32))


def _solver_no_iter(f):
    h5_string(f, "learned_net", "x")
    f.create_group("history")


def _soft_link(f):
    data = f.create_group("data")
    data.create_group("conv1").create_dataset("0", data=np.zeros(2, np.float32))
    data["alias"] = h5py.SoftLink("/data/conv1")


def _forged_shape(f):
    # Chunked and never written: 40 GB of fill value declared in a few KB.
    f.create_group("data").create_group("conv1").create_dataset("0", shape=(10**6, 10**4), dtype="f4",
                                                                 chunks=(100, 100))


def _keras_like(f):
    f.create_group("model_weights").create_dataset("dense", data=np.zeros(2, np.float32))


BAD = [
    ("other_groups", _other_groups, "HDF5 /model_weights: not part of Caffe's net snapshot"),
    ("string_blob", _blob(np.array([b"abc", b"def"])), "HDF5 /data/conv1/0: holds string values"),
    ("scalar_blob", _blob(np.float32(1.5)), "HDF5 /data/conv1/0: is a 0-d (scalar) dataset"),
    ("int_blob", _blob(np.arange(4, dtype=np.int64)), "HDF5 /data/conv1/0: holds int64 values"),
    ("empty_blob", _blob(h5py.Empty("f4")), "HDF5 /data/conv1/0: is an empty dataset"),
    ("nested_group", _nested, "HDF5 /data/conv1/7x7: not a blob"),
    ("int_history", _solver_int_history, "HDF5 /history/0: holds int32 values"),
    ("no_iter", _solver_no_iter, "HDF5 /iter: missing"),
    ("soft_link", _soft_link, "HDF5 /data/alias: is a soft link to '/data/conv1'"),
    ("forged_shape", _forged_shape, "HDF5 /data/conv1/0: declares 40000000000 bytes of values, more than its 0 "
                                    "stored bytes can hold"),
    ("keras", _keras_like, "HDF5 /: not a Caffe snapshot: the file holds model_weights"),
]


@pytest.mark.parametrize("name, build, message", BAD, ids=[b[0] for b in BAD])
def test_non_caffe_hdf5_is_exit_3_naming_the_path(tmp_path, name, build, message):
    path = write_h5(tmp_path / f"{name}.h5", h5_bytes(build))
    with pytest.raises(FormatError) as info:
        blobtool.load_all(path)
    assert message in str(info.value) and str(path) in str(info.value)
    for command in (("info",), ("norm",), ("convert", "-o", tmp_path / "out.caffemodel")):
        line = assert_error(invoke(*command, path), 3, str(path), message)
        assert line == f"blobtool: {info.value}"
    assert not (tmp_path / "out.caffemodel").exists()


def test_truncated_and_damaged_snapshots(tmp_path, realworld):
    data = (realworld / REAL).read_bytes()
    # Cut inside the payloads: HDF5 sees the end of file before the one the superblock records.
    cut = write_h5(tmp_path / "cut.h5", data[:len(data) // 2])
    assert_error(invoke("info", cut), 3, "cut.h5: HDF5 /: not a readable HDF5 file", "truncated file")
    # A forged offset: a dataset's values past the end of the file.
    layers = [("ip", [values((100, 100))])]
    whole = h5_net_bytes(layers)
    with h5py.File(io.BytesIO(whole), "r") as f:
        offset = f["data/ip/0"].id.get_offset()
    short = bytearray(whole[:offset + 100])
    path = write_h5(tmp_path / "short.h5", bytes(short))
    result = invoke("norm", path)
    assert result.exit_code == 3 and "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1


# =====================================================================================
# h5py is optional
# =====================================================================================

WITHOUT_H5PY = ("import sys; sys.modules['h5py'] = None; from blobtool.cli import main; "
                "sys.argv = ['blobtool'] + sys.argv[1:]; main()")


def test_without_h5py_hdf5_input_and_output_are_usage_errors(tmp_path):
    h5 = write_h5(tmp_path / "n.h5", h5_net_bytes([("conv1", [values((2,))])]))
    net = write_net(tmp_path / "n.caffemodel", "new", [Layer("conv1", "Convolution", [values((2,))])])
    for args in (("info", h5), ("convert", net, "-o", tmp_path / "o.h5"), ("info", net)):
        result = subprocess.run([sys.executable, "-c", WITHOUT_H5PY, *map(str, args)], capture_output=True,
                                text=True, env=subprocess_env(), cwd=REPO, timeout=60)
        if args == ("info", net):
            assert result.returncode == 0, result.stderr  # protobuf needs no h5py
            continue
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == [result.stderr.strip()]
        assert "pip install 'blobtool[hdf5]'" in result.stderr and "h5py" in result.stderr
    assert not (tmp_path / "o.h5").exists()


def test_reading_protobuf_never_imports_h5py(tmp_path):
    net = write_net(tmp_path / "n.caffemodel", "new", [Layer("conv1", "Convolution", [values((2,))])])
    code = ("import sys, blobtool; blobtool.load_all(sys.argv[1]); "
            "print('h5py' in sys.modules, 'blobtool.formats.hdf5' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(net)], capture_output=True, text=True,
                         env=subprocess_env(), cwd=REPO, timeout=60, check=True).stdout.split()
    assert out == ["False", "False"]


def test_the_registry_names_the_format_and_its_outputs():
    fmt = get_format("hdf5")
    assert fmt.kinds == ("net", "solverstate") and fmt.userblock
    assert [(o.name, o.extensions, o.kind) for o in fmt.outputs] == [("hdf5", (".h5", ".hdf5"), None)]
    with pytest.raises(UsageError, match="no input file"):
        blobtool.write(None, {"a/0": blobtool.Blob(2)}, io.BytesIO(), format="hdf5")


# =====================================================================================
# A file names only itself: external storage, virtual datasets, external links
# =====================================================================================

SECRET = b"blobtool-secret-7f3a9c" * 64


@pytest.fixture
def elsewhere(tmp_path):
    """{what: path} of the files a crafted snapshot points at: a secret, a FIFO nobody writes, /dev/zero."""
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return {"secret": str(secret), "fifo": str(fifo), "zero": "/dev/zero"}


def _external_net(target):
    def build(f):
        data = f.create_group("data")
        data.create_group("conv1").create_dataset("0", data=values((4,)))
        data.create_group("ip1").create_dataset("0", shape=(len(SECRET) // 4,), dtype="<f4",
                                                external=[(target, 0, len(SECRET))])
    return build, "/data/ip1/0", "ip1/0"


def _external_scalar(f, name, target, tid, space):
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_external(target.encode(), 0, 1 << 16)
    h5py.h5d.create(f.id, name.encode(), tid, space, dcpl=dcpl)


def _external_solverstate(field):
    def make(target):
        def build(f):
            if field == "iter":
                _external_scalar(f, "iter", target, h5py.h5t.STD_I32LE, h5py.h5s.create_simple((1,)))
            else:
                f.create_dataset("iter", data=np.array([10], np.int32))
            if field == "learned_net":
                tid = h5py.h5t.C_S1.copy()
                tid.set_size(64)
                _external_scalar(f, "learned_net", target, tid, h5py.h5s.create(h5py.h5s.SCALAR))
            else:
                h5_string(f, "learned_net", "net.caffemodel.h5")
            if field == "current_step":
                _external_scalar(f, "current_step", target, h5py.h5t.STD_I32LE, h5py.h5s.create_simple((1,)))
            else:
                f.create_dataset("current_step", data=np.array([0], np.int32))
            history = f.create_group("history")
            if field == "history":
                history.create_dataset("0", shape=(16,), dtype="<f4", external=[(target, 0, 64)])
            else:
                history.create_dataset("0", data=values((3,)))
        return build, f"/{field}" if field != "history" else "/history/0", "history/0"
    return make


CRAFTED = {"net": _external_net, **{f"solverstate_{field}": _external_solverstate(field)
                                    for field in ("iter", "learned_net", "current_step", "history")}}


def _refused_everywhere(tmp_path, path, where, blob, *fragments):
    """Every reading command: exit 3, one line naming the file and HDF5 path, no output file, no secret shown."""
    out = tmp_path / "x.npy"
    for args in (("info", path), ("info", "--json", path), ("norm", path),
                 ("convert", path, "--blob", blob, "-o", out)):
        result = run_blobtool(*args, timeout=30, text=True)
        assert result.returncode == 3, (args, result.returncode, result.stdout, result.stderr)
        assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr
        assert f"{path}: HDF5 {where}: " in result.stderr, result.stderr
        for fragment in fragments:
            assert fragment in result.stderr, (fragment, result.stderr)
        assert "blobtool-secret" not in result.stdout + result.stderr
        assert not out.exists()
    from runner import complete
    assert complete("info", path, "--blob", "") == ([], "", 0)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["secret", "fifo", "zero"])
@pytest.mark.parametrize("kind", sorted(CRAFTED))
def test_external_storage_is_refused_before_a_byte_is_read(tmp_path, elsewhere, kind, target):
    build, where, blob = CRAFTED[kind](elsewhere[target])
    name = f"crafted.{'caffemodel' if kind == 'net' else 'solverstate'}.h5"
    path = write_h5(tmp_path / name, h5_bytes(build))
    with h5py.File(path, "r") as f:  # the oracle: the file really names the other file
        assert f[where].id.get_create_plist().get_external_count() == 1
    _refused_everywhere(tmp_path, path, where, blob, "HDF5 external storage", elsewhere[target])


def _virtual(source_of):
    def build(f):
        data = f.create_group("data")
        data.create_group("conv1").create_dataset("0", data=values((4,)))
        layout = h5py.VirtualLayout(shape=(4,), dtype="<f4")
        layout[:] = h5py.VirtualSource(source_of(f), "/data/ip1/0", shape=(4,))
        data.create_group("ip1").create_virtual_dataset("0", layout)
    return build


@pytest.mark.slow
@pytest.mark.parametrize("source", ["itself", "missing", "each_other"])
def test_virtual_datasets_are_refused(tmp_path, source):
    path = tmp_path / "v.caffemodel.h5"
    other = tmp_path / "w.caffemodel.h5"
    if source == "itself":
        h5py_build = _virtual(lambda f: str(path))
    elif source == "missing":
        h5py_build = _virtual(lambda f: str(tmp_path / "nothere.h5"))
    else:
        h5py_build = _virtual(lambda f: str(other))
        with h5py.File(other, "w") as f:
            _virtual(lambda f: str(path))(f)
    with h5py.File(path, "w") as f:
        h5py_build(f)
    with h5py.File(path, "r") as f:
        assert f["/data/ip1/0"].id.get_create_plist().get_layout() == h5py.h5d.VIRTUAL
    _refused_everywhere(tmp_path, path, "/data/ip1/0", "ip1/0", "is a virtual dataset")
    assert_error(invoke("info", "--stats", path), 3, "/data/ip1/0", "virtual dataset")


@pytest.mark.slow
@pytest.mark.parametrize("at", ["/data", "/data/ip1", "/data/ip1/0", "/history"])
def test_external_links_are_never_followed(tmp_path, elsewhere, at):
    target = write_h5(tmp_path / "target.h5", h5_net_bytes([("ip1", [values((4,))])]))
    def build(f):
        if at == "/history":
            f.create_dataset("iter", data=np.array([1], np.int32))
            h5_string(f, "learned_net", "x")
            f.create_dataset("current_step", data=np.array([0], np.int32))
            f["history"] = h5py.ExternalLink(str(target), "/data/ip1")
            return
        if at == "/data":
            f["data"] = h5py.ExternalLink(str(target), "/data")
            return
        data = f.create_group("data")
        if at == "/data/ip1":
            data["ip1"] = h5py.ExternalLink(str(target), "/data/ip1")
        else:
            data.create_group("ip1")["0"] = h5py.ExternalLink(str(target), "/data/ip1/0")
    path = write_h5(tmp_path / "links.h5", h5_bytes(build))
    blob = "history/0" if at == "/history" else "ip1/0"
    _refused_everywhere(tmp_path, path, at, blob, "is an external link to", "never follows a link into another file")


def test_a_soft_link_is_refused_without_being_followed(tmp_path):
    def build(f):
        data = f.create_group("data")
        data.create_group("conv1").create_dataset("0", data=values((2,)))
        data["ip1"] = h5py.SoftLink("/nowhere/at/all")  # dangling: following it would fail differently
    path = write_h5(tmp_path / "soft.h5", h5_bytes(build))
    assert_error(invoke("info", path), 3, "HDF5 /data/ip1: is a soft link to '/nowhere/at/all'")


# =====================================================================================
# Names that are not UTF-8, names listed twice, solver fields out of Caffe's range
# =====================================================================================

def _raw_group(parent, raw: bytes):
    return h5py.h5g.create(parent.id, raw)


@pytest.mark.parametrize("where", ["top", "layer", "blob", "history"])
def test_names_that_are_not_utf8(tmp_path, where):
    def build(f):
        if where == "history":
            f.create_dataset("iter", data=np.array([1], np.int32))
            h5_string(f, "learned_net", "x")
            f.create_dataset("current_step", data=np.array([0], np.int32))
            history = f.create_group("history")
            h5py.h5d.create(history.id, b"0\xff", h5py.h5t.IEEE_F32LE, h5py.h5s.create_simple((2,)))
            return
        if where == "top":
            _raw_group(f, b"\xc3(")
            return
        data = f.create_group("data")
        if where == "layer":
            group = _raw_group(data, b"conv\xff")
            h5py.h5d.create(group, b"0", h5py.h5t.IEEE_F32LE, h5py.h5s.create_simple((2,)))
        else:
            h5py.h5d.create(data.create_group("conv1").id, b"\xfe", h5py.h5t.IEEE_F32LE, h5py.h5s.create_simple((2,)))
    path = write_h5(tmp_path / "names.h5", h5_bytes(build))
    expected = {"top": "HDF5 /\\xc3(: a name that is not UTF-8", "layer": "HDF5 /data/conv\\xff: a name that is not UTF-8",
                "blob": "HDF5 /data/conv1/\\xfe: a name that is not UTF-8",
                "history": "HDF5 /history/0\\xff: a name that is not UTF-8"}[where]
    for command in (("info",), ("info", "--json"), ("norm",), ("convert", "-o", tmp_path / "o.npz")):
        assert_error(invoke(*command, path), 3, str(path), expected)
    result = run_blobtool("info", path, text=True)
    assert result.returncode == 3 and expected in result.stderr and len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "o.npz").exists()


def _listed_twice(data: bytes, name: bytes) -> bytes:
    """A damaged copy of a libver='earliest' file whose group lists `name` twice: a second entry's name
    in the local heap rewritten to the first's (the same length)."""
    twin = name[:-1] + bytes([name[-1] + 1])
    assert data.count(twin + b"\0") == 1
    return data.replace(twin + b"\0", name + b"\0")


def test_a_name_listed_twice_in_a_damaged_file(tmp_path):
    data = h5_solverstate_bytes([values((3,)), values((2,))])
    damaged = _listed_twice(data, b"0")
    path = write_h5(tmp_path / "twice.solverstate.h5", damaged)
    with h5py.File(path, "r") as f:  # the oracle lists it twice too
        assert list(f["history"].keys()) == ["0", "0"]
    for command in (("info",), ("norm",), ("convert", "-o", tmp_path / "o.solverstate")):
        assert_error(invoke(*command, path), 3, str(path), "HDF5 /history/0: listed twice in its group")
    assert not (tmp_path / "o.solverstate").exists()


@pytest.mark.parametrize("field", ["iter", "current_step"])
@pytest.mark.parametrize("value", [2**40, -2**31 - 1, 2**63 + 5])
def test_solver_fields_out_of_caffes_range(tmp_path, field, value):
    dtype = np.uint64 if value >= 2**63 else np.int64
    def build(f):
        f.create_dataset("iter", data=np.array([value if field == "iter" else 1], dtype))
        h5_string(f, "learned_net", "x")
        f.create_dataset("current_step", data=np.array([value if field == "current_step" else 0], dtype))
        f.create_group("history").create_dataset("0", data=values((3,)))
    path = write_h5(tmp_path / "big.solverstate.h5", h5_bytes(build))
    for out in ("o.solverstate", "o.h5", "o.npz"):
        assert_error(invoke("convert", path, "-o", tmp_path / out), 3, str(path),
                     f"HDF5 /{field}: {value} does not fit Caffe's {field} (a 32-bit integer)")
        assert not (tmp_path / out).exists()
    assert_error(invoke("info", "--json", path), 3, f"HDF5 /{field}")


def test_int64_fields_within_range_are_read(tmp_path):
    def build(f):
        f.create_dataset("iter", data=np.array([2**31 - 1], np.int64))
        h5_string(f, "learned_net", "x")
        f.create_dataset("current_step", data=np.array([-2**31], np.int64))
        f.create_group("history").create_dataset("0", data=values((3,)))
    path = write_h5(tmp_path / "edge.solverstate.h5", h5_bytes(build))
    ok("convert", path, "-o", tmp_path / "o.solverstate")
    record = one_json(ok("info", "--json", tmp_path / "o.solverstate"))
    assert (record["iter"], record["current_step"]) == (2**31 - 1, -2**31)


# =====================================================================================
# What the file is, and what --names torch needs
# =====================================================================================

def test_an_hdf5_dataset_file_is_named_as_such(tmp_path):
    def build(f):
        f.create_dataset("data", data=values((4, 3, 2, 2)))
        f.create_dataset("label", data=np.arange(4, dtype=np.float32))
    path = write_h5(tmp_path / "train.h5", h5_bytes(build))
    line = assert_error(invoke("info", path), 3, str(path), "an HDF5 dataset file (training data",
                        "HDF5Data", "data, label", "not a Caffe snapshot")
    assert "expected a group" not in line


def test_names_torch_on_a_snapshot_names_the_caffemodel(tmp_path):
    path = write_h5(tmp_path / "n.caffemodel.h5", h5_net_bytes(net_layers()))
    line = assert_error(invoke("convert", path, "-o", tmp_path / "y.safetensors", "--names", "torch"), 2,
                        "HDF5 snapshots carry no layer types", "matching .caffemodel")
    assert "(not a .caffemodel) has none" not in line
    assert not (tmp_path / "y.safetensors").exists()


@pytest.mark.parametrize("before", [b"", b"HEADER-KEEP-ME\n", b"x" * 5000])
def test_standard_output_opened_read_write_keeps_what_stands_before(tmp_path, before):
    src = write_h5(tmp_path / "n.h5", h5_net_bytes(net_layers()))
    ok("convert", src, "-o", tmp_path / "whole.h5")
    expected = (tmp_path / "whole.h5").read_bytes()
    out = tmp_path / "out.bin"
    out.write_bytes(b"")
    printed = before.decode()
    result = run_pipeline(f"{{ printf '%s' '{printed}'; {BLOBTOOL} convert n.h5 -o - --format hdf5; }} 1<> out.bin",
                          tmp_path)
    assert result.returncode == 0, result.stderr
    data = out.read_bytes()
    assert data[:len(before)] == before
    assert data[len(before):] == expected  # the same snapshot, written where the stream stood
    # npz output does the same
    out.write_bytes(b"")
    result = run_pipeline(f"{{ printf '%s' '{printed}'; {BLOBTOOL} convert n.h5 -o - --format npz; }} 1<> out.bin",
                          tmp_path)
    assert result.returncode == 0 and out.read_bytes()[:len(before)] == before


def test_a_file_object_standing_past_its_start_gets_the_snapshot_there(tmp_path):
    src = write_h5(tmp_path / "n.h5", h5_net_bytes(net_layers()))
    ok("convert", src, "-o", tmp_path / "whole.h5")
    stream = io.BytesIO()
    stream.write(b"prefix")
    doc = open_document(src)
    from blobtool.formats.hdf5 import write
    write(doc, doc.entries, [e.blob() for e in doc.entries], stream, kind="net")
    assert stream.getvalue() == b"prefix" + (tmp_path / "whole.h5").read_bytes()


# =====================================================================================
# Chunked datasets: at most one bounded chunk beside the blob
# =====================================================================================

PEAK_RSS = ("import resource, subprocess, sys; "
            "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE).returncode; "
            "print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def peak_rss_mib(*args) -> tuple:
    """(exit code, peak resident MiB) of `blobtool ARGS` in a process of its own."""
    from runner import blobtool_cmd
    out = subprocess.run([sys.executable, "-c", PEAK_RSS, *blobtool_cmd(*args)], capture_output=True, text=True,
                         env=subprocess_env(), cwd=REPO, timeout=120, check=True).stdout.split()
    return int(out[0]), int(out[1]) / 1024


def test_a_chunk_past_the_bound_is_refused_before_it_is_inflated(tmp_path):
    from blobtool.formats.hdf5 import MAX_CHUNK_BYTES
    count = MAX_CHUNK_BYTES // 4 + (1 << 20)  # one chunk of 68 MiB of zeros: a few hundred KB gzipped
    def build(f):
        ds = f.create_group("data").create_group("ip").create_dataset("0", shape=(count,), dtype="<f4",
                                                                      chunks=(count,), compression="gzip")
        ds[...] = 0
    path = write_h5(tmp_path / "bomb.h5", h5_bytes(build))
    assert path.stat().st_size < 1 << 20
    for command in (("norm",), ("info", "--stats"), ("convert", "-o", tmp_path / "o.npz")):
        assert_error(invoke(*command, path), 3, "HDF5 /data/ip/0: is stored in chunks of", "64 MiB")
    code, peak = peak_rss_mib("norm", path)
    assert code == 3 and peak < 150, peak  # refused from the chunk's declared size: nothing inflated
    # Under the bound the values are read (a chunk at a time).
    n = 1 << 22
    small = write_h5(tmp_path / "ok.h5", h5_bytes(lambda f: f.create_group("data").create_group("ip")
                                                   .create_dataset("0", data=np.arange(n, dtype="<f4"),
                                                                   chunks=(1 << 18,), compression="gzip")))
    norm = one_json(ok("norm", "--json", small))
    assert norm["blobs"][0]["data"]["asum"] == pytest.approx(float(n) * (n - 1) / 2, rel=1e-6)


# HDF5 itself crashing on damaged metadata: every HDF5 call runs in a child process

def _threes_made_twos(tmp_path) -> list:
    """The fuzzers' seed of a virtual dataset whose source is the file itself, built here, with each byte 3 in
    turn made 2 (one of them turns the layout class virtual into chunked): [(path, h5py's return code opening
    /data/ip1/0 in a process of its own)]."""
    from fuzzcases import hdf5_refused_seeds

    data = next(seed for seed in hdf5_refused_seeds() if seed.name == "h5_refused_virtual").data
    found = []
    for at in (at for at, byte in enumerate(data) if byte == 3):
        flipped = bytearray(data)
        flipped[at] = 2
        out = write_h5(tmp_path / f"flip{at}.caffemodel.h5", bytes(flipped))
        oracle = subprocess.run([sys.executable, "-c", "import h5py, sys\nf = h5py.File(sys.argv[1], 'r')\n"
                                 "try:\n    f['/data/ip1/0']\nexcept Exception:\n    pass\n", str(out)],
                                capture_output=True, timeout=60)
        found.append((out, oracle.returncode))
    return found


@pytest.mark.slow
def test_hdf5_crashing_on_damaged_metadata_is_exit_3(tmp_path):
    flipped = _threes_made_twos(tmp_path)
    crashing = [path for path, code in flipped if code == -11]
    assert crashing, flipped  # the oracle: h5py itself dies of SIGSEGV opening the dataset
    out = tmp_path / "x.npy"
    every = (("info", "--stats"), ("norm",), ("convert", "--blob", "ip1/0", "-o", out))
    for path, _ in flipped:
        for args in (("info", path), *((*a[:1], path, *a[1:]) for a in every if path in crashing),
                     *((("compare", path, path),) if path in crashing else ())):
            result = run_blobtool(*args, timeout=60, text=True)
            assert result.returncode in ((3,) if path in crashing else (0, 3)), (args, result)
            if result.returncode == 3:
                assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr
                assert result.stderr.startswith(f"blobtool: {path}: "), result.stderr
            if path in crashing:
                assert "HDF5's library crashed (SIGSEGV)" in result.stderr and "damaged metadata" in result.stderr
            assert not out.exists()
    # the library: an error, and the calling process lives on
    script = ("import sys, blobtool\nfrom blobtool.errors import FormatError\n"
              "try:\n    blobtool.load_all(sys.argv[1])\nexcept FormatError as exc:\n    print('refused:', exc)\n")
    result = subprocess.run([sys.executable, "-c", script, str(crashing[0])], capture_output=True, text=True,
                            timeout=60, env=subprocess_env())
    assert result.returncode == 0 and result.stdout.startswith("refused: ") and "crashed" in result.stdout, result


@pytest.mark.parametrize("dtype", ["<f4", ">f4", "<f2", ">f8"])
def test_values_read_in_a_child_process_are_hdf5s(tmp_path, dtype):
    """Chunked datasets past what the walk sends (read later in a child, a slab at a time), and small ones
    (sent with the walk), give h5py's values exactly."""
    big = values((700, 3, 41)).astype(dtype)      # over 1 MiB as the blob's dtype: read when built
    small = values((5, 7)).astype(dtype)
    def build(f):
        data = f.create_group("data")
        data.create_group("a").create_dataset("0", data=big, chunks=(9, 2, 41), compression="gzip")
        data.create_group("b").create_dataset("0", data=small, chunks=(2, 7))
        data["b"].create_dataset("1", data=small[:1], compression="gzip")
    path = write_h5(tmp_path / "c.caffemodel.h5", h5_bytes(build))
    for blob, expected in (("a/0", big), ("b/0", small), ("b/1", small[:1])):
        out = tmp_path / f"{blob.replace('/', '_')}.npy"
        result = run_blobtool("convert", path, "--blob", blob, "-o", out, timeout=60, text=True)
        assert result.returncode == 0, result.stderr
        got = np.load(out)
        want = expected.astype(np.float64 if expected.dtype.itemsize == 8 else np.float32)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()


def _peak_address_space_mib(tmp_path, *args) -> float:
    """The peak address space (VmPeak) of `blobtool ARGS` run in a process of its own, in MiB.

    Address space, not resident memory: a blob read through HDF5 lives in
    memory shared with the child that read it, whose pages the reading
    commands let go from this process's resident set as they are summed,
    but which stays allocated as long as the blob does.
    """
    report = tmp_path / "peak"
    script = ("import sys, runpy\n"
              "try:\n"
              "    runpy.run_module('blobtool', run_name='__main__')\n"
              "finally:\n"
              "    peak = [l for l in open('/proc/self/status') if l.startswith('VmPeak')][0].split()[1]\n"
              f"    open({str(report)!r}, 'w').write(peak)\n")
    result = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                            env=subprocess_env(), timeout=300)
    assert result.returncode == 0, result.stderr
    return int(report.read_text()) / 1024


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="the peak is read from /proc (Linux)")
def test_norm_holds_one_chunked_blob_at_a_time(tmp_path):
    """norm of a net of chunked, compressed datasets: each blob is read, summed and let go (the net of six
    32 MiB blobs peaks within 2 blobs of the net of one); the figures are those of the same net stored as
    Caffe stores it (contiguous)."""
    count = 8 << 20  # 32 MiB of float32 per blob
    pattern = (np.arange(4096, dtype=np.float32) - 2048) / 7
    arrays = [np.tile(pattern * (i + 1), count // pattern.size) for i in range(6)]
    def build(arrays, chunked):
        def make(f):
            data = f.create_group("data")
            for i, array in enumerate(arrays):
                options = {"chunks": (1 << 18,), "compression": "gzip"} if chunked else {}
                data.create_group(f"l{i}").create_dataset("0", data=array, **options)
        return make
    chunked = write_h5(tmp_path / "chunked.caffemodel.h5", h5_bytes(build(arrays, True)))
    one = write_h5(tmp_path / "one.caffemodel.h5", h5_bytes(build(arrays[:1], True)))
    plain = write_h5(tmp_path / "plain.caffemodel.h5", h5_bytes(build(arrays, False)))
    assert chunked.stat().st_size < 16 << 20
    got, want = one_json(ok("norm", "--json", chunked)), one_json(ok("norm", "--json", plain))
    assert got["blobs"] == want["blobs"] and got["total"] == want["total"]
    six, single = (_peak_address_space_mib(tmp_path, "norm", path) for path in (chunked, one))
    assert six - single < 64, (six, single)  # not 5 more blobs (160 MiB)



@pytest.fixture(scope="module")
def chunked_nets(tmp_path_factory) -> tuple:
    """(a net of six chunked, compressed 32 MiB blobs, the same net's first blob alone): a few MB each."""
    folder = tmp_path_factory.mktemp("chunked")
    count = 8 << 20  # 32 MiB of float32 per blob
    pattern = (np.arange(4096, dtype=np.float32) - 2048) / 7
    arrays = [np.tile(pattern * (i + 1), count // pattern.size) for i in range(6)]
    def build(arrays):
        def make(f):
            data = f.create_group("data")
            for i, array in enumerate(arrays):
                data.create_group(f"l{i}").create_dataset("0", data=array, chunks=(1 << 18,), compression="gzip")
        return make
    six = write_h5(folder / "six.caffemodel.h5", h5_bytes(build(arrays)))
    one = write_h5(folder / "one.caffemodel.h5", h5_bytes(build(arrays[:1])))
    return six, one


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="the peak is read from /proc (Linux)")
@pytest.mark.parametrize("ext, precision", [("caffemodel", None), ("safetensors", None), ("h5", None),
                                             ("npz", None), ("caffemodel", "half")])
def test_convert_writes_one_chunked_blob_at_a_time(tmp_path, chunked_nets, ext, precision):
    """convert of a net of chunked, compressed datasets reads each blob as it is written and lets it go: the net
    of six 32 MiB blobs peaks within 2 blobs of the net of one (not 5 more blobs, 160 MiB), and the output is the
    bytes written from every blob read first (the library's write of built blobs). --half looks at every value
    before writing: one blob at a time too, within 16 MiB of the same convert without it."""
    six, one = chunked_nets
    out = tmp_path / f"six.{ext}"
    asked = (f"--{precision}",) if precision else ()
    peak_six = _peak_address_space_mib(tmp_path, "convert", *asked, six, "-o", out)
    peak_one = _peak_address_space_mib(tmp_path, "convert", *asked, one, "-o", tmp_path / f"one.{ext}")
    assert peak_six - peak_one < 64, (peak_six, peak_one)
    if precision:  # the look before writing holds no more than the writing: not 2 blobs (+32 MiB)
        peak_kept = _peak_address_space_mib(tmp_path, "convert", six, "-o", tmp_path / f"kept.{ext}")
        assert peak_six - peak_kept < 16, (peak_six, peak_kept)
    doc = open_document(six)
    blobtool.write(doc, {e.name: e.blob() for e in doc.entries}, tmp_path / f"built.{ext}", precision=precision)
    assert out.read_bytes() == (tmp_path / f"built.{ext}").read_bytes()



@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="the peak is read from /proc (Linux)")
@pytest.mark.parametrize("ext", ["safetensors", "caffemodel", "npz"])
def test_convert_holds_one_chunked_blob_with_its_diff(tmp_path, ext):
    """Blobs of float32 data and a float64 diff (16 + 32 MiB each), chunked and compressed: a blob's diff follows
    its data (protobuf, .npz), or the float64 tensors come first (safetensors lays tensors out by item size), and
    either way four such blobs peak within one blob (48 MiB) of one."""
    count = 4 << 20
    pattern = (np.arange(1024, dtype=np.float32) - 512) / 7
    def build(n):
        def make(f):
            data, diff = f.create_group("data"), f.create_group("diff")
            for i in range(n):
                values = np.tile(pattern * (i + 1), count // pattern.size)
                data.create_group(f"l{i}").create_dataset("0", data=values, chunks=(1 << 17,), compression="gzip")
                diff.create_group(f"l{i}").create_dataset("0", data=values.astype(np.float64) / 3,
                                                          chunks=(1 << 16,), compression="gzip")
        return make
    four = write_h5(tmp_path / "four.caffemodel.h5", h5_bytes(build(4)))
    one = write_h5(tmp_path / "one.caffemodel.h5", h5_bytes(build(1)))
    assert four.stat().st_size < 8 << 20
    out = tmp_path / f"four.{ext}"
    peak_four = _peak_address_space_mib(tmp_path, "convert", four, "-o", out)
    peak_one = _peak_address_space_mib(tmp_path, "convert", one, "-o", tmp_path / f"one.{ext}")
    assert peak_four - peak_one < 40, (peak_four, peak_one)  # not 3 more blobs (144 MiB)
    doc = open_document(four)
    blobtool.write(doc, {e.name: e.blob() for e in doc.entries}, tmp_path / f"built.{ext}")
    assert out.read_bytes() == (tmp_path / f"built.{ext}").read_bytes()

@pytest.mark.slow
def test_damaged_values_stop_a_convert_to_standard_output_before_its_first_byte(tmp_path):
    """A chunk that does not inflate, in the second blob: file outputs are left unmade, and standard output gets
    no byte (each blob not read yet is read once before writing in place), exit 3 with one line."""
    blobs = [values((1 << 20,)), values((1 << 20,))]
    def build(f):
        data = f.create_group("data")
        for i, array in enumerate(blobs):
            data.create_group(f"l{i}").create_dataset("0", data=array, chunks=(1 << 17,), compression="gzip")
    raw = bytearray(h5_bytes(build))
    with h5py.File(io.BytesIO(bytes(raw)), "r") as f:
        offset = f["/data/l1/0"].id.get_chunk_info(3).byte_offset
    raw[offset + 100:offset + 164] = bytes(64)
    path = write_h5(tmp_path / "damaged.caffemodel.h5", bytes(raw))
    for fmt, ext in (("protobuf", "caffemodel"), ("safetensors", "safetensors"), ("hdf5", "h5"), ("npz", "npz")):
        out = tmp_path / f"o.{ext}"
        assert_error(invoke("convert", path, "-o", out), 3, f"{path}: HDF5 /data/l1/0: unreadable values")
        assert not out.exists()
        result = run_blobtool("convert", path, "-o", "-", "--format", fmt, timeout=120)
        assert result.returncode == 3 and result.stdout == b"", (fmt, result.returncode, len(result.stdout))
        lines = result.stderr.decode().splitlines()
        assert len(lines) == 1 and "HDF5 /data/l1/0: unreadable values" in lines[0], lines

@pytest.mark.slow
def test_hdf5_looping_on_damaged_metadata_is_exit_3_in_bounded_time(tmp_path):
    """A global heap object whose size runs past its collection: HDF5 loops forever opening the dataset
    (h5py too); blobtool stops its child after BLOBTOOL_HDF5_SECONDS and exits 3 with one line."""
    import time
    from fuzzcases import hdf5_refused_seeds

    data = bytearray(next(seed for seed in hdf5_refused_seeds() if seed.name == "h5_refused_virtual").data)
    heap = data.find(b"GCOL")
    assert heap > 0
    data[heap + 25] = 1  # the first object's size (8 bytes at +24) grows by 256
    path = write_h5(tmp_path / "loop.caffemodel.h5", bytes(data))
    with pytest.raises(subprocess.TimeoutExpired):  # the oracle: h5py never returns
        subprocess.run([sys.executable, "-c", "import h5py, sys\nf = h5py.File(sys.argv[1], 'r')\n"
                        "try:\n    f['/data/ip1/0']\nexcept Exception:\n    pass\n", str(path)],
                       capture_output=True, timeout=5)
    for args in (("info", path), ("norm", path), ("compare", path, path)):
        started = time.monotonic()
        result = run_blobtool(*args, timeout=60, text=True, env=subprocess_env(BLOBTOOL_HDF5_SECONDS="2"))
        assert result.returncode == 3 and time.monotonic() - started < 30, (args, result)
        assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr
        assert f"{path}: HDF5's library did not finish reading the file's structure in 2 s" in result.stderr


# compare: the two inputs' walks run at once, each in its own child

def _walks_meeting(monkeypatch, folder, wait: float):
    """Make each walk (in its child) mark that it started, then wait up to `wait` s for every other walk to
    have started too, marking "met-<file>" if it saw them; returns the markers' folder."""
    import time
    from blobtool.formats import hdf5

    real = hdf5.walk.walked_here
    names = {"a.caffemodel.h5", "b.caffemodel.h5"}

    def meeting(source, kind):
        name = os.path.basename(source.name)
        (folder / f"started-{name}").write_text(str(os.getpid()))
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not all((folder / f"started-{n}").exists() for n in names):
            time.sleep(0.01)
        if all((folder / f"started-{n}").exists() for n in names):
            (folder / f"met-{name}").touch()
        return real(source, kind)

    monkeypatch.setattr(hdf5.walk, "walked_here", meeting)
    return folder


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the walks run in forked children")
def test_compare_walks_both_snapshots_at_once(tmp_path, monkeypatch):
    layers = net_layers()
    a = write_h5(tmp_path / "a.caffemodel.h5", h5_net_bytes(layers))
    b = write_h5(tmp_path / "b.caffemodel.h5", h5_net_bytes(layers))
    markers = tmp_path / "markers"
    markers.mkdir()
    _walks_meeting(monkeypatch, markers, wait=20)
    record = one_json(ok("compare", "--json", a, b))
    assert record["equal"] is True
    # each walk saw the other one started before it went on: walked one after the other, the first would
    # have waited its 20 s alone
    assert sorted(p.name for p in markers.glob("met-*")) == ["met-a.caffemodel.h5", "met-b.caffemodel.h5"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the walks run in forked children")
@pytest.mark.parametrize("b_is", ["a snapshot", "missing"])
def test_compare_refusing_its_first_input_stops_the_second_walk(tmp_path, monkeypatch, b_is):
    """The first input's refusal is the error (as when the inputs were read one after the other), and the
    second input's walk, already started, is stopped and reaped rather than waited for."""
    import time

    def build(f):
        data = f.create_group("data")
        data.create_group("conv1").create_dataset("0", data=values((2,)))
        data["ip1"] = h5py.SoftLink("/data/conv1")
    a = write_h5(tmp_path / "a.caffemodel.h5", h5_bytes(build))
    b = tmp_path / "b.caffemodel.h5"
    if b_is == "a snapshot":
        write_h5(b, h5_net_bytes(net_layers()))
    from blobtool.formats import hdf5
    real, real_forked, children = hdf5.walk.walked_here, hdf5.child.forked, []

    def slow_b(source, kind):
        if source.name.endswith("b.caffemodel.h5"):
            time.sleep(120)
        return real(source, kind)

    def forked(work, seconds):
        pid, fd = real_forked(work, seconds)
        children.append(pid)
        return pid, fd

    monkeypatch.setattr(hdf5.walk, "walked_here", slow_b)
    monkeypatch.setattr(hdf5.child, "forked", forked)
    started = time.monotonic()
    assert_error(invoke("compare", a, b), 3, f"{a}: HDF5 /data/ip1: is a soft link")
    assert time.monotonic() - started < 60
    assert len(children) == (2 if b_is == "a snapshot" else 1)
    for pid in children:
        with pytest.raises(ProcessLookupError):  # ended and reaped: not even a zombie is left
            os.kill(pid, 0)


# The walk's cost is per object: each dataset is opened once

@pytest.mark.parametrize("libver", ["earliest", "latest"])
def test_the_walk_opens_each_dataset_once_and_sends_small_values_read_then(tmp_path, monkeypatch, libver):
    """A net of float16 layers (values read through HDF5, small enough to go with the walk) with diffs, and
    float32 ones (viewed in place): every dataset is opened once, as a dataset, and every group once; the
    values sent are h5py's. The walk of a net of 8000 such layers opened each float16 dataset twice (once
    to check it, once more, storage checked again, to read its values) and took half as long again."""
    from blobtool.files import open_source
    from blobtool.formats.hdf5 import walk

    layers = 12
    half = {f"l{i:02d}": values((i % 3 + 1, 2)).astype("<f2") for i in range(layers)}
    full = {f"m{i:02d}": values((3,)) for i in range(layers)}
    stream = io.BytesIO()
    with h5py.File(stream, "w", libver=libver) as f:
        data, diff = f.create_group("data"), f.create_group("diff")
        for name, array in half.items():
            data.create_group(name).create_dataset("0", data=array)
            diff.create_group(name).create_dataset("0", data=array * 2)
        for name, array in full.items():
            data.create_group(name).create_dataset("0", data=array)
    path = write_h5(tmp_path / "n.caffemodel.h5", stream.getvalue())
    calls = {"h5d.open": [], "h5g.open": [], "h5o.open": []}
    for name in calls:
        module = getattr(h5py, name.split(".")[0])
        real = module.open

        def counting(loc, raw, *args, _real=real, _seen=calls[name], **kwargs):
            _seen.append(raw)
            return _real(loc, raw, *args, **kwargs)

        monkeypatch.setattr(module, "open", counting)
    walked = walk.walked_here(open_source(str(path)), "net")  # in this process: the calls are counted here
    assert walked[:2] == ("walked", "net") and walked[2][0] == "ok", walked
    entries = {name: (data, diff) for name, _, data, diff in walked[2][1]["entries"]}
    assert len(entries) == 2 * layers
    # 3 datasets per float16 layer pair and float32 layer: opened once each, never as "whatever it is"
    assert sorted(calls["h5d.open"]) == sorted([b"0"] * 3 * layers)
    assert calls["h5o.open"] == []
    assert sorted(calls["h5g.open"]) == sorted([b"/", b"data", b"diff"] + [n.encode() for n in half] * 2
                                               + [n.encode() for n in full])
    for name, array in half.items():
        data, diff = entries[f"{name}/0"]
        assert data[4] is None and data[5] == array.astype(np.float32).tobytes()
        assert diff[5] == (array * 2).astype(np.float32).tobytes()
    for name, array in full.items():
        data, diff = entries[f"{name}/0"]
        assert data[5] is None and diff is None
        assert path.read_bytes()[data[4]:data[4] + array.nbytes] == array.tobytes()
