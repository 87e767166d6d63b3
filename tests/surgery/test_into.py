"""convert --into TEMPLATE and blobtool.write(into=...): values written back into a net (blobtool.surgery.into).

The proofs are round trips: a net exported (--names torch, or blobtool's
names) and written back --into itself gives the net again, byte for byte
where nothing was computed on the way (a BatchNorm factor of 1), and equal
values where something was (a factor of another value). The expected lists
of the strict mode are named here from what each test changed.
"""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import blobtool
from blobtool._pb import blobtool_caffe_pb2 as pb
from blobtool.errors import FitError, UsageError
from builders import Layer, half_blob_bytes, len_field, varint_field, write_h5, h5_net_bytes, write_net
from runner import assert_error, assert_usage, invoke, ok, run_blobtool

RNG = np.random.default_rng(25)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def inner_product_param(num_output: int, transpose: bool, *, v1: bool = False) -> bytes:
    """LayerParameter.inner_product_param (117; V1: 17) { num_output = 1, transpose = 6 }, as raw fields."""
    return len_field(17 if v1 else 117, varint_field(1, num_output) + varint_field(6, int(transpose)))


def every_rule(factor: float = 1.0) -> list:
    """A V2 net with a layer for each rule of the PyTorch names: the way back must undo each."""
    return [
        Layer("data", "Input", bottom=[], top=["data"]),
        Layer("conv1", "Convolution", [rand(4, 3, 2, 2), rand(4)], bottom=["data"], top=["conv1"]),
        Layer("bn1", "BatchNorm", [rand(4) * 10, np.abs(rand(4)) * 10, np.array([factor], np.float32)],
              bottom=["conv1"], top=["conv1"]),
        Layer("scale1", "Scale", [rand(4), rand(4)], bottom=["conv1"], top=["conv1"],
              params=len_field(142, varint_field(4, 1))),
        Layer("dw", "Convolution", [rand(4, 1, 3, 3)], bottom=["conv1"], top=["dw"],   # depthwise, no bias
              params=len_field(106, varint_field(1, 4) + varint_field(5, 4) + varint_field(2, 0))),
        Layer("prelu", "PReLU", [rand(4)], bottom=["dw"], top=["dw"]),
        # A shared slope: no axes, so Caffe's ToProto writes no shape field at all.
        Layer("shared", "PReLU", [pb.BlobProto(data=[0.25])], bottom=["dw"], top=["dw"],
              params=len_field(131, varint_field(2, 1))),
        Layer("deconv", "Deconvolution", [rand(4, 2, 3, 3), rand(2)], bottom=["dw"], top=["deconv"]),
        Layer("ip", "InnerProduct", [rand(5, 8), rand(5)], legacy=True, bottom=["deconv"], top=["ip"]),
        Layer("ipt", "InnerProduct", [rand(5, 3), rand(3)], bottom=["ip"], top=["ipt"],
              params=inner_product_param(3, True)),
        Layer("bias1", "Bias", [rand(3)], bottom=["ipt"], top=["ipt"]),
    ]


def v1_net() -> list:
    """A V1 net (enum types, legacy 4-D blobs as Caffe of that time wrote them), a transposed InnerProduct in it."""
    return [Layer("conv1", "Convolution", [rand(4, 3, 2, 2), rand(4)], legacy=True),
            Layer("relu1", "ReLU", top=["conv1"]),
            Layer("ip1", "InnerProduct", [rand(6, 4), rand(6)], legacy=True, bottom=["conv1"]),
            Layer("ipt", "InnerProduct", [rand(6, 2), rand(2)], legacy=True, bottom=["ip1"],
                  params=inner_product_param(2, True, v1=True))]


def export_and_back(tmp_path, net, *extra, names="torch"):
    """net -> .safetensors (--names NAMES) -> back --into net: (the export, the net written back)."""
    st = tmp_path / "export.safetensors"
    back = tmp_path / "back.caffemodel"
    ok("convert", "--names", names, net, "-o", st)
    ok("transplant", st, net, "--names", names, "-o", back, *extra)
    return st, back


def net_message(path) -> pb.NetParameter:
    net = pb.NetParameter()
    net.ParseFromString(path.read_bytes())
    return net


@pytest.mark.parametrize("fmt,layers", [("new", every_rule), ("v1", v1_net)], ids=["v2", "v1"])
def test_a_built_net_comes_back_byte_for_byte(tmp_path, fmt, layers):
    net = write_net(tmp_path / "net.caffemodel", fmt, layers())
    st, back = export_and_back(tmp_path, net)
    assert back.read_bytes() == net.read_bytes()
    # The export really was PyTorch's layout: the transposed InnerProduct is (out, in) there.
    got = load_file(st)
    assert got["ipt.weight"].shape == ((3, 5) if fmt == "new" else (2, 6))
    assert ("ip.weight" in got and got["ip.weight"].shape == (5, 8)) or fmt == "v1"


def test_a_batchnorm_factor_comes_back_as_one_with_the_same_statistics(tmp_path):
    net = write_net(tmp_path / "net.caffemodel", "new", every_rule(factor=2.5))
    _, back = export_and_back(tmp_path, net)
    ok("compare", "-q", "--names", "torch", net, back)   # every tensor PyTorch sees, equal
    before, after = net_message(net), net_message(back)
    (bn_before,) = [layer for layer in before.layer if layer.name == "bn1"]
    (bn_after,) = [layer for layer in after.layer if layer.name == "bn1"]
    assert list(bn_after.blobs[2].data) == [1.0]
    for index in (0, 1):
        expected = (np.asarray(bn_before.blobs[index].data, np.float64) / 2.5).astype(np.float32)
        assert np.asarray(bn_after.blobs[index].data, np.float32).tobytes() == expected.tobytes()
    # Nothing else moved: the net without the BatchNorm's blobs is the same message.
    for message in (before, after):
        for layer in message.layer:
            if layer.name == "bn1":
                del layer.blobs[:]
    assert before.SerializeToString() == after.SerializeToString()


def test_the_real_nets_come_back(realworld, tmp_path):
    for name in ("lenet_iter_10000.caffemodel", "mtcnn_det1_half.caffemodel", "resnet20_cifar10.caffemodel"):
        src = realworld / name
        where = tmp_path / name
        where.mkdir()
        st, back = export_and_back(where, src)
        ok("compare", "-q", "--names", "torch", src, back)
        if name != "resnet20_cifar10.caffemodel":   # no BatchNorm: nothing computed on the way
            assert back.read_bytes() == src.read_bytes(), name
            continue
        # ResNet-20's factors are 999.98...: each BatchNorm's three blobs change, nothing else.
        before, after = net_message(src), net_message(back)
        bns = 0
        for a, b in zip(before.layer, after.layer):
            if a.type == "BatchNorm":
                bns += 1
                factor = np.float64(a.blobs[2].data[0])
                assert factor != 1 and list(b.blobs[2].data) == [1.0]
                for index in (0, 1):
                    expected = (np.asarray(a.blobs[index].data, np.float64) / factor).astype(np.float32)
                    assert np.asarray(b.blobs[index].data, np.float32).tobytes() == expected.tobytes()
                del a.blobs[:], b.blobs[:]
        assert bns == sum(1 for layer in before.layer if layer.type == "BatchNorm") > 0
        assert before.SerializeToString() == after.SerializeToString()


def test_the_real_mtcnn_keeps_its_float16(realworld, tmp_path):
    src = realworld / "mtcnn_det1_half.caffemodel"
    st = tmp_path / "m.safetensors"
    ok("convert", "--names", "torch", src, "-o", st)
    values = load_file(st)
    # A port that works in float64: the template's float16 and float32 blobs keep their types.
    save_file({k: v.astype(np.float64) for k, v in values.items()}, tmp_path / "wide.safetensors")
    back = tmp_path / "back.caffemodel"
    ok("transplant", tmp_path / "wide.safetensors", src, "--names", "torch", "-o", back)
    assert back.read_bytes() == src.read_bytes()


def float16_counts(values: np.ndarray) -> tuple:
    """(values float16 changes, values it makes subnormal, non-zero values it makes 0), counted by hand."""
    half = values.astype(np.float16)
    tiny = np.finfo(np.float16).tiny
    return (int(np.sum(half != values)), int(np.sum((np.abs(half) > 0) & (np.abs(half) < tiny))),
            int(np.sum((half == 0) & (values != 0))))


def test_a_float16_template_says_what_rounding_to_float16_did(tmp_path):
    # The template stores float16; the port's float32 values are rounded to it, which is said in one line
    # naming --float, the way to keep them (as --half counts what float16 does to values).
    stored = rand(8, 8)
    net = tmp_path / "half.caffemodel"
    net.write_bytes(pb.NetParameter(name="n").SerializeToString() + len_field(100, pb.LayerParameter(
        name="fc", type="InnerProduct").SerializeToString() + len_field(7, half_blob_bytes(stored))))
    port = (stored * 1.001).astype(np.float32)
    port[0, :4] = [3e-5, -1e-6, 1e-8, 0.0]   # subnormal in float16, subnormal, 0, and a 0 given
    save_file({"fc/0": port}, tmp_path / "port.safetensors")
    out = tmp_path / "out.caffemodel"
    result = run_blobtool("transplant", tmp_path / "port.safetensors", net, "-o", out, text=True)
    assert result.returncode == 0, result.stderr
    moved, subnormal, zero = float16_counts(port)
    assert (subnormal, zero) == (2, 1) and moved > 60
    assert result.stderr.splitlines() == [
        f"blobtool: warning: {tmp_path / 'port.safetensors'}: transplant (the template's float16): in the 1 blob(s) "
        f"written in float16, {moved:,} of 64 values were rounded to float16's precision; {subnormal} values "
        f"became subnormal (below 6.1e-05) and {zero} became 0; --precision float writes float32 (the values as given)"]
    written = blobtool.open_document(out).entries[0]
    assert written.dtype == np.float16
    assert written.blob().cpu_data().tobytes() == port.astype(np.float16).astype(np.float32).tobytes()
    # --float keeps the values as given, and says nothing.
    result = run_blobtool("transplant", tmp_path / "port.safetensors", net, "-o", out, "--float",
                          text=True)
    assert (result.returncode, result.stderr) == (0, "")
    assert blobtool.open_document(out).entries[0].blob().cpu_data().tobytes() == port.tobytes()
    # Values float16 holds as they are lose nothing: not a word.
    save_file({"fc/0": stored.astype(np.float16).astype(np.float32)}, tmp_path / "exact.safetensors")
    result = run_blobtool("transplant", tmp_path / "exact.safetensors", net, "-o", out, text=True)
    assert (result.returncode, result.stderr) == (0, "")


def test_the_real_fp16_mtcnn_says_what_a_float32_port_loses(realworld, tmp_path):
    src = realworld / "mtcnn_det1_half.caffemodel"
    st = tmp_path / "m.safetensors"
    ok("convert", "--names", "torch", src, "-o", st)
    rng = np.random.default_rng(3)
    # A port trained on in float32: every value moved a little.
    port = {k: (v * (1 + 1e-3 * rng.standard_normal(v.shape))).astype(np.float32) for k, v in load_file(st).items()}
    save_file(port, tmp_path / "port.safetensors")
    out = tmp_path / "out.caffemodel"
    result = run_blobtool("transplant", tmp_path / "port.safetensors", src, "--names", "torch", "-o", out,
                          text=True)
    assert result.returncode == 0, result.stderr
    halves = [k for k in port if not k.startswith("PReLU")]   # its Convolutions' blobs (the PReLUs': float32)
    moved = sum(float16_counts(port[k])[0] for k in halves)
    (line,) = result.stderr.splitlines()
    assert f"in the {len(halves)} blob(s) written in float16, {moved:,} of " in line and "--precision float writes" in line
    assert len(halves) == 10 and moved > 6000
    ok("transplant", tmp_path / "port.safetensors", src, "--names", "torch", "-o", out, "--float")
    ok("compare", "-q", "--names", "torch", out, tmp_path / "port.safetensors")   # exit 0: equal, nothing rounded


def test_the_real_hdf5_snapshot_with_blobtool_names(realworld, tmp_path):
    src = realworld / "cifar10_full_iter_70000.caffemodel.h5"
    npz, back = tmp_path / "c.npz", tmp_path / "back.caffemodel.h5"
    ok("convert", src, "-o", npz)
    ok("transplant", npz, src, "-o", back)
    import h5py

    with h5py.File(src, "r") as a, h5py.File(back, "r") as b:
        names = []
        a["data"].visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
        assert len(names) == 10
        for name in names:
            assert a["data"][name].dtype == b["data"][name].dtype
            assert a["data"][name][()].tobytes() == b["data"][name][()].tobytes(), name
    # --names torch needs layer types, which the snapshot does not hold; --net gives them (a net of the
    # snapshot's layer names and types, as Caffe's cifar10_full_train_test.prototxt defines them).
    assert_error(invoke("transplant", npz, src, "--names", "torch", "-o", tmp_path / "x.h5"), 2, "--definition")
    with h5py.File(src, "r") as f:
        stored = {name: [f["data"][name][str(i)][()] for i in range(len(f["data"][name]))] for name in f["data"]}
    kinds = {"conv1": "Convolution", "conv2": "Convolution", "conv3": "Convolution", "ip1": "InnerProduct",
             "ip2": "InnerProduct"}
    net = write_net(tmp_path / "types.caffemodel", "new", [
        Layer(name, kinds[name], [np.zeros_like(a) for a in arrays], bottom=[], top=[name])
        for name, arrays in stored.items() if arrays])
    st = tmp_path / "c.safetensors"
    ok("convert", "--names", "torch", "--definition", net, src, "-o", st)
    ok("transplant", st, src, "--names", "torch", "--definition", net, "-o", back)
    with h5py.File(src, "r") as a, h5py.File(back, "r") as b:
        for name in names:
            assert a["data"][name][()].tobytes() == b["data"][name][()].tobytes(), name


def strict_case(tmp_path):
    """The ResNet-like net exported, then changed by a port: one blob left out, one added, one reshaped."""
    net = write_net(tmp_path / "net.caffemodel", "new", every_rule())
    st = tmp_path / "export.safetensors"
    ok("convert", "--names", "torch", net, "-o", st)
    values = load_file(st)
    del values["conv1.weight"]                                    # missing
    values["head.weight"] = rand(2, 2)                            # unexpected
    values["deconv.weight"] = values["deconv.weight"].reshape(2, 4, 3, 3)  # mismatched, same count
    values["ip.bias"] = rand(7)                                   # mismatched, another count
    values["bn1.num_batches_tracked"] = np.array(100, np.int64)   # ignored
    save_file(values, tmp_path / "port.safetensors")
    return net, tmp_path / "port.safetensors"


def test_strict_names_the_three_lists_and_writes_nothing(tmp_path):
    net, port = strict_case(tmp_path)
    out = tmp_path / "out.caffemodel"
    line = assert_error(invoke("transplant", port, net, "--names", "torch", "-o", out), 3,
                        f"blobtool: {port}: does not fit {net}: missing 1 (conv1.weight); unexpected 1 (head.weight); "
                        "mismatched 2 (deconv.weight (2, 4, 3, 3), the template takes (4, 2, 3, 3), ip.bias (7,), "
                        "the template takes (5,))", "--partial", "--reshape")
    assert "num_batches_tracked" not in line
    assert not out.exists()
    with pytest.raises(FitError) as caught:
        blobtool.transplant(blobtool.open_document(port), net, out, names="torch")
    assert caught.value.missing == ["conv1.weight"] and caught.value.unexpected == ["head.weight"]
    assert caught.value.mismatched == [("deconv.weight", (2, 4, 3, 3), (4, 2, 3, 3)), ("ip.bias", (7,), (5,))]
    assert not out.exists()


def test_partial_keeps_the_template_and_says_what(tmp_path):
    net, port = strict_case(tmp_path)
    out = tmp_path / "out.caffemodel"
    result = ok("transplant", port, net, "--names", "torch", "-o", out, "--partial")
    lines = result.stderr.splitlines()
    assert lines == [
        f"blobtool: warning: {net}: --names torch has no rule for these layers, whose blobs are named "
        "<layer>.<index>: Bias: bias1",
        f"blobtool: warning: {port}: ignored 1 num_batches_tracked buffer (Caffe's BatchNorm has no blob for them): "
        "bn1.num_batches_tracked",
        f"blobtool: warning: {net}: --partial kept the template's values of 3 blobs: conv1/0, deconv/0, ip/1 "
        "(missing 1 (conv1.weight); mismatched 2 (deconv.weight (2, 4, 3, 3), the template takes (4, 2, 3, 3), "
        "ip.bias (7,), the template takes (5,)))",
        f"blobtool: warning: {port}: --partial left 1 value unused: head.weight"]
    # The port's values were unchanged, so the net written is the template, byte for byte.
    assert out.read_bytes() == net.read_bytes()
    # Written as another kind (.npz), the template's blobs kept are there too.
    ok("transplant", port, net, "--names", "torch", "-o", tmp_path / "out.npz", "--partial")
    assert sorted(np.load(tmp_path / "out.npz")) == sorted(e.name for e in blobtool.open_document(net).entries)
    # --reshape takes the value of equal count, in the template's shape.
    result = ok("transplant", port, net, "--names", "torch", "-o", out, "--partial", "--reshape")
    assert ("--reshape wrote 1 value in the template's shape: deconv.weight (2, 4, 3, 3) -> (4, 2, 3, 3)"
            in result.stderr)
    written = {e.name: e.blob().cpu_data() for e in blobtool.open_document(out).entries}
    assert written["deconv/0"].tobytes() == load_file(port)["deconv.weight"].tobytes()


def test_partial_with_nothing_that_fits_is_refused(tmp_path):
    net = write_net(tmp_path / "net.caffemodel", "new", every_rule())
    st = tmp_path / "export.safetensors"
    ok("convert", "--names", "torch", net, "-o", st)
    # PyTorch names read as blobtool's: no value fits, and the template would come out unchanged.
    line = assert_error(invoke("transplant", st, net, "-o", tmp_path / "o.caffemodel", "--partial"), 3,
                        "missing 17 (conv1/0, conv1/1, bn1/0 and 14 more)",
                        "unexpected 16 (conv1.weight, conv1.bias, bn1.running_mean and 13 more)",
                        "the values are named as PyTorch names them: --names torch matches them by PyTorch's names")
    # The lists are cut short: the line stays short whatever the temporary folder's path.
    assert len(line.replace(str(tmp_path), "")) < 300
    result = invoke("convert", st, "--partial", "-o", tmp_path / "o.npz")
    assert result.exit_code == 2 and result.stderr.startswith("blobtool convert: --partial is transplant's now")


def test_one_statistic_given_keeps_the_other_as_caffe_reads_it(tmp_path):
    net = write_net(tmp_path / "net.caffemodel", "new", every_rule(factor=4.0))
    st = tmp_path / "export.safetensors"
    ok("convert", "--names", "torch", net, "-o", st)
    values = load_file(st)
    values["bn1.running_mean"] = rand(4)
    del values["bn1.running_var"]
    save_file(values, tmp_path / "port.safetensors")
    out = tmp_path / "out.caffemodel"
    ok("transplant", tmp_path / "port.safetensors", net, "--names", "torch", "-o", out, "--partial")
    back = blobtool.state_dict(out)
    assert back["bn1.running_mean"].tobytes() == values["bn1.running_mean"].tobytes()
    assert back["bn1.running_var"].tobytes() == load_file(st)["bn1.running_var"].tobytes()
    assert blobtool.load_all(out)["bn1/2"].cpu_data().tolist() == [1.0]


def test_precision_follows_the_template_unless_asked(tmp_path):
    weights = rand(3, 2)
    half = tmp_path / "half.caffemodel"
    half.write_bytes(pb.NetParameter(name="n").SerializeToString() + len_field(100, pb.LayerParameter(
        name="fc", type="InnerProduct").SerializeToString() + len_field(7, half_blob_bytes(weights))))
    big = weights.astype(np.float64)
    big[0, 0] = 1e5      # past float16's range
    save_file({"fc/0": big}, tmp_path / "big.safetensors")
    out = tmp_path / "out.caffemodel"
    result = ok("transplant", tmp_path / "big.safetensors", half, "-o", out)
    assert ("blob fc/0: 1 of 6 values are past float16's range (largest 100000, float16 holds up to 65504): "
            "written in float32, not the template's float16") in result.stderr
    doc = blobtool.open_document(out)
    assert doc.entries[0].dtype == np.float32 and doc.entries[0].blob().cpu_data()[0] == 1e5
    # --double writes double_data whatever the template held.
    ok("transplant", tmp_path / "big.safetensors", half, "-o", out, "--double")
    assert blobtool.open_document(out).entries[0].dtype == np.float64
    # Into float32, a double past float32's range becomes Inf, and that is said.
    plain = write_net(tmp_path / "plain.caffemodel", "new", [Layer("fc", "InnerProduct", [weights])])
    big[0, 1] = 1e300
    save_file({"fc/0": big}, tmp_path / "huge.safetensors")
    result = ok("transplant", tmp_path / "huge.safetensors", plain, "-o", out)
    assert "fc/0: 1 of 6 values became Inf written as float32 (past its range) into fc/0" in result.stderr


def test_the_library_takes_a_template_and_a_dict_of_arrays(tmp_path):
    net = write_net(tmp_path / "net.caffemodel", "new", every_rule(factor=2.0))
    state = blobtool.state_dict(net)
    assert set(state) >= {"conv1.weight", "bn1.running_mean", "bn1.weight", "ipt.weight", "bias1.0"}
    assert all(v.flags.writeable for v in state.values())
    np.testing.assert_array_equal(state["bn1.running_mean"] * 2.0,
                                  blobtool.load_all(net)["bn1/0"].cpu_data().astype(np.float64))
    # A training step in another framework, then back into the net.
    state["conv1.weight"] = state["conv1.weight"] * 0.5
    out = tmp_path / "out.caffemodel"
    lines = []
    assert blobtool.transplant(state, net, out, names="torch", warn=lines.append) == "net"
    assert blobtool.load_all(out)["conv1/0"].cpu_data().tobytes() == state["conv1.weight"].tobytes()
    assert blobtool.state_dict(out, names="blobtool")["bn1/2"].tolist() == [1.0]
    # Every other blob as PyTorch sees it is unchanged.
    again = blobtool.state_dict(out)
    assert all(np.array_equal(again[k], v) for k, v in state.items())


def test_an_hdf5_template_and_a_caffemodel_source(tmp_path):
    layers = {"conv1": [rand(2, 1, 3, 3), rand(2)], "ip1": [rand(3, 8)]}
    h5 = write_h5(tmp_path / "t.caffemodel.h5", h5_net_bytes(list(layers.items())))
    net = write_net(tmp_path / "src.caffemodel", "new", [Layer(name, "Convolution" if name == "conv1" else
                                                               "InnerProduct", [b * 2 for b in blobs])
                                                         for name, blobs in layers.items()])
    out = tmp_path / "out.caffemodel.h5"
    ok("transplant", net, h5, "-o", out)
    got = blobtool.load_all(out)
    assert got["ip1/0"].cpu_data().tobytes() == (layers["ip1"][0] * 2).tobytes()


def test_the_command_in_a_real_process(tmp_path):
    net = write_net(tmp_path / "net.caffemodel", "new", every_rule())
    st = tmp_path / "export.safetensors"
    assert run_blobtool("convert", "--names", "torch", net, "-o", st).returncode == 0
    result = run_blobtool("transplant", st, net, "--names", "torch", "-o", "-")
    assert result.returncode == 0 and result.stdout == net.read_bytes()
    result = run_blobtool("transplant", net, net, "-o", tmp_path / "x.caffemodel", "--names", "torch",
                          text=True)
    assert result.returncode == 0, result.stderr
    save_file({"conv1.weight": rand(4, 3, 2, 2)}, tmp_path / "one.safetensors")
    result = run_blobtool("transplant", tmp_path / "one.safetensors", net, "--names", "torch", "-o", tmp_path / "y.caffemodel", text=True)
    assert result.returncode == 3 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "missing 15 (conv1.bias, bn1.running_mean," in result.stderr
    assert not (tmp_path / "y.caffemodel").exists()


# -- a .prototxt as the template: the blobs made from the definition -------------------------------

def test_into_a_definition_of_the_real_nets(realworld, tmp_path):
    for name in ("lenet_iter_10000.caffemodel", "mtcnn_det1_half.caffemodel", "resnet20_cifar10.caffemodel"):
        src = realworld / name
        where = tmp_path / name
        where.mkdir()
        text, st, npz = where / "net.prototxt", where / "net.safetensors", where / "net.npz"
        ok("definition", src, "-o", text)
        ok("convert", "--names", "torch", src, "-o", st)
        ok("convert", src, "-o", npz)
        out = where / "out.caffemodel"
        ok("transplant", st, text, "--names", "torch", "-o", out)
        ok("compare", "-q", "--names", "torch", src, out)
        ok("transplant", npz, text, "-o", out)
        ok("compare", "-q", src, out)          # every blob, BatchNorm's factor too, in Caffe's shapes
        before, after = blobtool.open_document(src), blobtool.open_document(out)
        assert [(e.name, e.shape) for e in after.entries] == [(e.name, e.shape) for e in before.entries]
        # The layers are the definition's: the same names, types and wiring.
        assert [(layer.name, layer.type, list(layer.bottom), list(layer.top)) for layer in net_message(out).layer] \
            == [(layer.name, layer.type, list(layer.bottom), list(layer.top)) for layer in net_message(src).layer]


def test_into_a_definition_makes_each_layers_blobs(tmp_path):
    net = write_net(tmp_path / "net.caffemodel", "new", every_rule(factor=2.0))
    text, st = tmp_path / "net.prototxt", tmp_path / "net.safetensors"
    ok("definition", net, "-o", text)
    ok("convert", "--names", "torch", net, "-o", st)
    out = tmp_path / "out.caffemodel"
    ok("transplant", st, text, "--names", "torch", "-o", out)
    ok("compare", "-q", "--names", "torch", net, out)
    got = {e.name: e.shape for e in blobtool.open_document(out).entries}
    # bias_term false: no bias; Scale's bias_term: two blobs; the shared slope: no axes; the transposed
    # InnerProduct stored (K, N); the legacy (1, 1, N, K) weight as today's Caffe makes it, (N, K).
    assert "dw/1" not in got and got["scale1/1"] == (4,) and got["shared/0"] == ()
    assert got["ipt/0"] == (5, 3) and got["ip/0"] == (5, 8) and got["bn1/2"] == (1,)
    assert blobtool.load_all(out)["bn1/2"].cpu_data().tolist() == [1.0]
    # Every blob needs a value: nothing to keep.
    values = load_file(st)
    del values["ipt.bias"]
    save_file(values, tmp_path / "less.safetensors")
    assert_error(invoke("transplant", tmp_path / "less.safetensors", text, "--names", "torch", "-o", out), 3,
                 "missing 1 (ipt.bias)", warnings=True)
    assert_error(invoke("transplant", st, text, "--names", "torch", "-o", out, "--partial"), 2,
                 "a .prototxt holds none")
    assert_usage(invoke("transplant", st, text, "--names", "torch", "-o", tmp_path / "x.prototxt"), "transplant",
                 "a .prototxt output is a net's definition, without blobs")


def test_into_a_v1_definition(tmp_path):
    net = write_net(tmp_path / "net.caffemodel", "v1", v1_net())
    text, npz = tmp_path / "net.prototxt", tmp_path / "net.npz"
    ok("definition", net, "-o", text)
    ok("convert", net, "-o", npz)
    out = tmp_path / "out.caffemodel"
    ok("transplant", npz, text, "-o", out)
    before, after = blobtool.load_all(net), blobtool.load_all(out)
    assert list(after) == list(before)
    assert all(after[k].cpu_data().tobytes() == before[k].cpu_data().tobytes() for k in before)
    # A V1 definition written by hand: its layers stay V1 (`layers`, blobs = 6), bias_term false honoured.
    text.write_text('name: "v1net"\n'
                    'layers { name: "conv1" type: CONVOLUTION bottom: "data" top: "conv1" '
                    'convolution_param { num_output: 2 kernel_size: 1 } }\n'
                    'layers { name: "ip1" type: INNER_PRODUCT bottom: "conv1" top: "ip1" '
                    'inner_product_param { num_output: 3 bias_term: false } }\n')
    values = {"conv1/0": rand(2, 1, 1, 1), "conv1/1": rand(2), "ip1/0": rand(3, 2)}
    np.savez(tmp_path / "v.npz", **values)
    ok("transplant", tmp_path / "v.npz", text, "-o", out)
    written = net_message(out)
    assert [len(layer.blobs) for layer in written.layers] == [2, 1] and not written.layer
    assert all(blobtool.load_all(out)[k].cpu_data().tobytes() == v.tobytes() for k, v in values.items())


def test_a_wrapped_ports_prefix_is_found_or_stripped(tmp_path):
    # A state dict saved from nn.DataParallel: every key under module., and PyTorch's buffers beside them.
    import collections

    from ptfiles import Tensor, write_pt

    net = write_net(tmp_path / "net.caffemodel", "new", every_rule())
    st = tmp_path / "export.safetensors"
    ok("convert", "--names", "torch", net, "-o", st)
    state = collections.OrderedDict()
    for name, value in load_file(st).items():
        state["module." + name] = Tensor(value)
    state["module.bn1.num_batches_tracked"] = Tensor(np.array(7, np.int64))
    port = write_pt(tmp_path / "port.pth", state)
    found = tmp_path / "found.caffemodel"
    result = invoke("transplant", port, net, "--names", "torch", "-o", found)
    assert result.exit_code == 0, result.stderr
    assert "without the prefix 'module.'" in result.stderr and "--strip-prefix module." in result.stderr
    assert found.read_bytes() == net.read_bytes()
    asked = tmp_path / "asked.caffemodel"
    result = invoke("transplant", port, net, "--names", "torch", "-o", asked, "--strip-prefix", "module.")
    assert result.exit_code == 0 and "names matched" not in result.stderr
    assert asked.read_bytes() == net.read_bytes()
    # Detection off: the names as they are fit nothing, and say so.
    assert_error(invoke("transplant", port, net, "--names", "torch", "-o", tmp_path / "x.caffemodel", "--strip-prefix", ""), 3, "module.conv1.weight", warnings=True)
    result = invoke("convert", port, "-o", tmp_path / "y.npz", "--strip-prefix", "module.")
    assert result.exit_code == 2 and "--strip-prefix is transplant's now" in result.stderr


def wrapped_port(tmp_path, prefix="module."):
    """A net, and its PyTorch port with every name under `prefix` (as nn.DataParallel saves it)."""
    net = write_net(tmp_path / "net.caffemodel", "new", every_rule())
    st = tmp_path / "export.safetensors"
    ok("convert", "--names", "torch", net, "-o", st)
    port = tmp_path / "port.safetensors"
    save_file({prefix + name: value for name, value in load_file(st).items()}, port)
    return net, port


def test_the_library_finds_a_wrapped_ports_prefix_as_the_command_does(tmp_path):
    net, port = wrapped_port(tmp_path)
    command = tmp_path / "command.caffemodel"
    result = run_blobtool("transplant", port, net, "--names", "torch", "-o", command, text=True)
    assert result.returncode == 0, result.stderr
    said = []
    out = tmp_path / "library.caffemodel"
    blobtool.transplant(blobtool.open_document(port), net, out, names="torch", warn=said.append)
    assert out.read_bytes() == command.read_bytes() == net.read_bytes()
    prefix_lines = [line for line in said if "names matched" in line]
    assert len(prefix_lines) == 1
    assert "blobtool: warning: " + prefix_lines[0] in result.stderr.splitlines()
    # Asked for: no detection, the same net; strip_prefix="" turns detection off.
    said.clear()
    blobtool.transplant(blobtool.open_document(port), net, out, names="torch", strip_prefix="module.", warn=said.append)
    assert out.read_bytes() == net.read_bytes() and not any("names matched" in line for line in said)
    with pytest.raises(FitError):
        blobtool.transplant(blobtool.open_document(port), net, out, names="torch", strip_prefix="", warn=said.append)


def test_two_names_made_one_by_a_prefix_are_refused(tmp_path):
    net, _ = wrapped_port(tmp_path)
    port = tmp_path / "two.safetensors"
    save_file({"a.conv1.weight": np.zeros(1, np.float32), "conv1.weight": np.zeros(1, np.float32)}, port)
    out = tmp_path / "o.caffemodel"
    with pytest.raises(UsageError) as caught:
        blobtool.transplant(blobtool.open_document(port), net, out, names="torch", strip_prefix="a.")
    assert str(caught.value) == f"strip_prefix=a. makes two of {port}'s names 'conv1.weight'"
    result = run_blobtool("transplant", port, net, "--names", "torch", "-o", out, "--strip-prefix", "a.",
                          text=True)
    assert result.returncode == 2 and not out.exists()
    assert result.stderr.splitlines() == [f"blobtool transplant: --strip-prefix a. makes two of {port}'s names "
                                          "'conv1.weight' (see 'blobtool transplant --help')"]
