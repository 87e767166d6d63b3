"""--names torch wherever blobs are listed (info --stats/--check, norm, show), and --net for HDF5 snapshots.

Expected values are computed here from the arrays the inputs were built
from (the real CIFAR-10 snapshot: from h5py's reading of it).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from builders import Layer, h5_net_bytes, write_blob, write_h5, write_net
from runner import assert_error, invoke, one_json, run_blobtool

RNG = np.random.default_rng(26)



def _warnings(result) -> str:
    """A run's stderr without convert --names torch's summary lines (those not "blobtool: warning: ")."""
    return "".join(line for line in result.stderr.splitlines(True) if not line.startswith("blobtool: ")
                   or line.startswith("blobtool: warning: "))

def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


FACTOR = 4.0
W = {"conv": rand(4, 3, 2, 2), "conv_b": rand(4), "mean": rand(4) * 8, "var": np.abs(rand(4)) * 8 + 1,
     "gamma": rand(4), "beta": rand(4), "ip": rand(5, 16), "ip_b": rand(5)}
# What PyTorch holds, by name (BatchNorm's statistics divided by the factor in float64).
TORCH = {"conv1.weight": W["conv"], "conv1.bias": W["conv_b"],
         "bn1.running_mean": (W["mean"].astype(np.float64) / FACTOR).astype(np.float32),
         "bn1.running_var": (W["var"].astype(np.float64) / FACTOR).astype(np.float32),
         "bn1.weight": W["gamma"], "bn1.bias": W["beta"], "fc.weight": W["ip"], "fc.bias": W["ip_b"]}
BLOBS = {"conv1": [W["conv"], W["conv_b"]], "bn1": [W["mean"], W["var"], np.array([FACTOR], np.float32)],
         "scale1": [W["gamma"], W["beta"]], "fc": [W["ip"], W["ip_b"]]}


def layers(blobs=BLOBS):
    return [Layer("data", "Input", bottom=[], top=["data"]),
            Layer("conv1", "Convolution", blobs["conv1"], bottom=["data"], top=["conv1"]),
            Layer("bn1", "BatchNorm", blobs["bn1"], bottom=["conv1"], top=["conv1"]),
            Layer("scale1", "Scale", blobs["scale1"], bottom=["conv1"], top=["conv1"]),
            Layer("relu1", "ReLU", bottom=["conv1"], top=["conv1"]),
            Layer("fc", "InnerProduct", blobs["fc"], bottom=["conv1"], top=["fc"])]


@pytest.fixture
def net(tmp_path):
    return write_net(tmp_path / "net.caffemodel", "new", layers())


@pytest.fixture
def snapshot(tmp_path):
    """The same net as Caffe's HDF5 snapshot: layer names and blobs, no types (and the ReLU's empty group)."""
    return write_h5(tmp_path / "net.caffemodel.h5",
                    h5_net_bytes([*BLOBS.items(), ("relu1", []), ("data", [])]))


def stats_of(array) -> dict:
    values = np.asarray(array, np.float64)
    return {"min": values.min(), "max": values.max(), "mean": values.mean()}


# -- --names torch wherever blobs are listed --------------------------------------------------------

def test_info_stats_and_check_under_torch_names(net):
    record = one_json(invoke("info", "--json", "--stats", "--names", "torch", net))
    assert record["names"] == "torch"
    assert [b["name"] for b in record["blobs"]] == list(TORCH)
    for blob in record["blobs"]:
        expected = TORCH[blob["name"]]
        assert blob["shape"] == list(expected.shape) and not blob["has_diff"]
        got = blob["stats"]["data"]
        for key, value in stats_of(expected).items():
            assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-12), (blob["name"], key)
    # The running variance, not Caffe's sum of it: what a port's debugger compares.
    assert record["blobs"][3]["stats"]["data"]["max"] == pytest.approx(float(TORCH["bn1.running_var"].max()))
    checked = one_json(invoke("info", "--json", "--check", "finite", "--names", "torch", "--blob", "bn1", net))
    assert checked["check"] == {"name": "finite", "passed": True, "failures": []}
    assert [b["name"] for b in checked["blobs"]] == ["bn1.running_mean", "bn1.running_var"]
    # Without --stats or --check, --names torch still lists the renaming.
    mapping = one_json(invoke("info", "--json", "--names", "torch", net))
    assert mapping["blobs"][0]["torch"] == "conv1.weight"


def test_info_check_finds_what_the_division_made(tmp_path):
    tiny = dict(BLOBS, bn1=[np.full(4, 3e38, np.float32), W["var"], np.array([1e-3], np.float32)])
    net = write_net(tmp_path / "tiny.caffemodel", "new", layers(tiny))
    result = invoke("info", "--json", "--check", "finite", "--names", "torch", net)
    assert result.exit_code == 1
    record = json.loads(result.stdout.splitlines()[0])
    assert record["check"]["failures"] == [{"name": "bn1.running_mean", "which": "data", "nan": 0, "inf": 4}]
    # As stored, the file holds no Inf.
    assert invoke("info", "--check", "finite", net).exit_code == 0


def test_norm_under_torch_names(net):
    record = one_json(invoke("norm", "--json", "--names", "torch", net))
    assert record["names"] == "torch"
    assert [b["name"] for b in record["blobs"]] == list(TORCH)
    for blob in record["blobs"]:
        values = TORCH[blob["name"]].astype(np.float64)
        assert blob["data"]["asum"] == pytest.approx(np.abs(values).sum(), rel=1e-12)
        assert blob["data"]["sumsq"] == pytest.approx((values * values).sum(), rel=1e-12)
        assert blob["diff"] is None
    # --blob selects by blobtool's names, as convert's does.
    picked = one_json(invoke("norm", "--json", "--names", "torch", "--blob", "bn1/1", net))
    assert [b["name"] for b in picked["blobs"]] == ["bn1.running_var"]
    # The plain table, in a real process.
    result = run_blobtool("norm", "--names", "torch", net, text=True)
    assert result.returncode == 0 and "bn1.running_var" in result.stdout and "bn1/1" not in result.stdout


def test_show_under_torch_names(net, tmp_path):
    pytest.importorskip("PIL", reason="Pillow (the image extra) is not installed")
    from PIL import Image

    by_torch, by_caffe, plain = tmp_path / "a.png", tmp_path / "b.png", tmp_path / "c.png"
    assert invoke("show", "--names", "torch", "--blob", "fc.weight", net, "-o", by_torch).exit_code == 0
    assert invoke("show", "--names", "torch", "--blob", "fc/0", net, "-o", by_caffe).exit_code == 0
    assert invoke("show", "--blob", "fc/0", net, "-o", plain).exit_code == 0
    assert np.array_equal(np.asarray(Image.open(by_torch)), np.asarray(Image.open(by_caffe)))
    assert np.array_equal(np.asarray(Image.open(by_torch)), np.asarray(Image.open(plain)))
    # A name that is neither: the blobtool names are listed.
    assert_error(invoke("show", "--names", "torch", "--blob", "nope", net), 3, "--blob 'nope' selects nothing",
                 "fc/0")


def test_every_listing_command_offers_names():
    for command in ("info", "norm", "compare", "convert", "show"):
        text = invoke(command, "--help").stdout
        assert "--names [blobtool|torch|torch-identifiers]" in text and "--definition PATH" in text, command


def usage_error(result, fragment: str) -> None:
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert fragment in result.stderr and "Traceback" not in result.stderr


def test_net_without_names_torch_is_a_usage_error(net, snapshot):
    for command in ("info", "norm", "show"):
        usage_error(invoke(command, "--definition", net, snapshot), "--definition applies only with --names torch")
    usage_error(invoke("info", "--names", "torch", "--definition", "-", snapshot), "--definition names a file")
    usage_error(invoke("info", "--names", "torch", "--net", net, snapshot), "--net is now --definition PATH")


# -- --net: layer types for an HDF5 snapshot ---------------------------------------------------------

def test_snapshot_is_refused_without_net(snapshot, tmp_path):
    pytest.importorskip("h5py", reason="h5py (the hdf5 extra) is not installed")
    line = assert_error(invoke("convert", "--names", "torch", snapshot, "-o", tmp_path / "x.safetensors"), 2,
                        "carry no layer types", "--definition FILE")
    assert str(snapshot) in line
    assert not (tmp_path / "x.safetensors").exists()


def test_snapshot_renamed_with_the_net_beside_it(net, snapshot, tmp_path):
    pytest.importorskip("h5py", reason="h5py (the hdf5 extra) is not installed")
    out = tmp_path / "port.safetensors"
    result = run_blobtool("convert", "--names", "torch", "--definition", net, snapshot, "-o", out, text=True)
    assert (result.returncode, _warnings(result)) == (0, "")
    got = load_file(out)
    assert sorted(got) == sorted(TORCH)
    for name, expected in TORCH.items():
        assert got[name].dtype == expected.dtype and got[name].tobytes() == expected.tobytes(), name
    # The mapping lists the net's types and order.
    mapping = one_json(invoke("info", "--json", "--names", "torch", "--definition", net, snapshot))
    assert [(b["name"], b["type"], b["torch"]) for b in mapping["blobs"][:3]] == [
        ("conv1/0", "Convolution", "conv1.weight"), ("conv1/1", "Convolution", "conv1.bias"),
        ("bn1/0", "BatchNorm", "bn1.running_mean")]
    # The same blobs as the .caffemodel gives, in every listing command.
    for args in (["info", "--json", "--stats"], ["norm", "--json"]):
        from_h5 = one_json(invoke(*args, "--names", "torch", "--definition", net, snapshot))
        from_net = one_json(invoke(*args, "--names", "torch", net))
        assert from_h5["blobs"] == from_net["blobs"], args
    assert invoke("compare", "--names", "torch", "--definition", net, snapshot, out).exit_code == 0
    assert invoke("compare", "--names", "torch", "--definition", net, snapshot, net).exit_code == 0


def test_a_net_that_is_not_the_snapshots_is_refused(net, snapshot, tmp_path):
    pytest.importorskip("h5py", reason="h5py (the hdf5 extra) is not installed")
    out = tmp_path / "x.safetensors"
    partial = write_net(tmp_path / "partial.caffemodel", "new", layers()[:3])
    line = assert_error(invoke("convert", "--names", "torch", "--definition", partial, snapshot, "-o", out), 2,
                        "layers fc, scale1 of this file are not in the net", "it is not this file's net")
    assert str(partial) in line
    other = dict(BLOBS, fc=[rand(5, 8), W["ip_b"]])
    wrong = write_net(tmp_path / "wrong.caffemodel", "new", layers(other))
    assert_error(invoke("info", "--names", "torch", "--definition", wrong, snapshot), 2,
                 "blob fc/0 has shape (5, 16), the net", "shape (5, 8)")
    # No types in what --net names: a blob file, or another snapshot.
    blob = write_blob(tmp_path / "b.pb", [1.0, 2.0])
    for typeless, what in ((blob, "a blob file has none"), (snapshot, "a net without layer types has none")):
        assert_error(invoke("norm", "--names", "torch", "--definition", typeless, snapshot), 2, what)
    # An unreadable --net is bad input.
    assert_error(invoke("info", "--names", "torch", "--definition", tmp_path / "absent.caffemodel", snapshot), 3,
                 "absent.caffemodel")
    assert not out.exists()


# The real snapshot's layers with blobs, as Caffe's cifar10_full_train_test.prototxt defines them.
CIFAR_LAYERS = [("conv1", "Convolution"), ("pool1", "Pooling"), ("relu1", "ReLU"), ("conv2", "Convolution"),
                ("relu2", "ReLU"), ("pool2", "Pooling"), ("conv3", "Convolution"), ("relu3", "ReLU"),
                ("pool3", "Pooling"), ("ip1", "InnerProduct"), ("ip2", "InnerProduct")]


def test_the_real_cifar10_snapshot_with_a_net_beside_it(realworld, tmp_path):
    h5py = pytest.importorskip("h5py", reason="h5py (the hdf5 extra) is not installed")
    src = realworld / "cifar10_full_iter_70000.caffemodel.h5"
    with h5py.File(src, "r") as f:
        stored = {name: [f["data"][name][str(i)][()] for i in range(len(f["data"][name]))] for name in f["data"]}
    # A net with the same layer names and types; its own blobs are zeros of the snapshot's shapes.
    built = [Layer(name, kind, [np.zeros_like(a) for a in stored.get(name, [])], bottom=[], top=[name])
             for name, kind in CIFAR_LAYERS]
    net = write_net(tmp_path / "cifar10_full.caffemodel", "new", built)
    out = tmp_path / "cifar10.safetensors"
    result = run_blobtool("convert", "--names", "torch", "--definition", net, src, "-o", out, text=True)
    assert (result.returncode, _warnings(result)) == (0, "")
    expected = {f"{name}.{('weight', 'bias')[i]}": a for name, arrays in stored.items() for i, a in enumerate(arrays)
                if arrays}
    got = load_file(out)
    assert sorted(got) == sorted(expected) and len(got) == 10
    for name, array in expected.items():
        assert got[name].shape == array.shape and got[name].tobytes() == array.tobytes(), name
    record = one_json(invoke("info", "--json", "--stats", "--names", "torch", "--definition", net, src))
    assert [b["name"] for b in record["blobs"]] == list(expected)
    ip1 = record["blobs"][6]
    assert ip1["name"] == "ip1.weight" and ip1["type"] == "InnerProduct"
    assert ip1["stats"]["data"]["max"] == pytest.approx(float(stored["ip1"][0].max()))
    assert invoke("compare", "--names", "torch", "--definition", net, src, out).exit_code == 0
    # A net missing one of the snapshot's layers with blobs is not its net.
    short = write_net(tmp_path / "short.caffemodel", "new", built[:-1])
    assert_error(invoke("norm", "--names", "torch", "--definition", short, src), 2, "layer ip2 of this file is not in the net")


def test_the_writing_commands_without_names_say_so():
    for command in ("scale", "update"):
        text = invoke(command, "--help").stdout
        assert "--names" not in text.split("Options:")[1] and "takes no --names" in " ".join(text.split()), command


def test_norm_under_torch_names_on_a_device(net):
    """The renamed blobs (views of the file, and the divided statistics) stream through a (fake) GPU as any blob."""
    import fakecupy
    from blobtool.engine.syncedmem import get_backend, set_backend

    host = one_json(invoke("norm", "--json", "--names", "torch", net))
    previous = get_backend()
    try:
        with fakecupy.installed(count=1) as state:
            result = invoke("norm", "--json", "--device", "0", "--names", "torch", net)
            copied = [c for c in state["copies"] if c[0] == "h2d"]
    finally:
        set_backend(previous)
    assert result.exit_code == 0, result.stderr
    on_device = one_json(result)
    assert on_device["device"]["index"] == 0 and on_device["names"] == "torch" and copied
    assert [b["name"] for b in on_device["blobs"]] == list(TORCH)
    for got, want in zip(on_device["blobs"] + [on_device["total"]], host["blobs"] + [host["total"]]):
        assert got["data"] == pytest.approx(want["data"], rel=1e-12)
