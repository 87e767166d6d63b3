"""blobtool.torchport.metadata: what --names torch exports beyond the tensors, run as the commands run.

The settings are written into the nets here as raw protobuf fields (the
values chosen here); the exports are read back with the safetensors package.
"""

from __future__ import annotations

import json
import struct

import ml_dtypes  # noqa: F401  (numpy's bfloat16: the safetensors package reads BF16 tensors through it)
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from blobtool.errors import FormatError
from blobtool.formats import open_document
from blobtool.formats.caffe import layer_param_values
from builders import Layer, len_field, tag, varint_field, write_net
from runner import run_blobtool

RNG = np.random.default_rng(26)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def eps_param(eps: float) -> bytes:
    """batch_norm_param (139) { eps (3, a 32-bit float) }."""
    return len_field(139, tag(3, 5) + struct.pack("<f", eps))


def bn_layers(name: str, bottom: str, eps: float | None, channels: int = 4) -> list:
    """A BatchNorm (eps given, or Caffe's default when None) and the Scale after it, in place."""
    return [Layer(name, "BatchNorm", [rand(channels), np.abs(rand(channels)), np.array([2.0])], bottom=[bottom],
                  top=[bottom], params=eps_param(eps) if eps is not None else b""),
            Layer(f"{name}_scale", "Scale", [rand(channels), rand(channels)], bottom=[bottom], top=[bottom])]


def settings_net(tmp_path, fmt: str = "new"):
    layers = [Layer("conv1", "Convolution", [rand(4, 3, 2, 2), rand(4)], bottom=["data"], top=["c"]),
              *bn_layers("bn1", "c", 0.001), *bn_layers("bn2", "c", None), *bn_layers("bn3", "c", 0.001),
              Layer("ip", "InnerProduct", [rand(5, 8), rand(5)], bottom=["c"], top=["ip"],
                    params=len_field(117, varint_field(1, 5) + varint_field(5, 2))),
              Layer("prelu", "PReLU", [rand(1)], bottom=["ip"], top=["ip"], params=len_field(131, varint_field(2, 1))),
              Layer("bias1", "Bias", [rand(5)], bottom=["ip"], top=["ip"])]
    return write_net(tmp_path / "settings.caffemodel", fmt, layers)


CONV1_DEFAULTS = {"conv1.kernel_size": "2", "conv1.stride": "1", "conv1.padding": "0", "conv1.dilation": "1",
                  "conv1.groups": "1"}


def summary(path, out, written: str, renamed: int, folded: int, divided: int, kept: int, extra=()) -> list:
    return [f"blobtool: {path}: --names torch: {written.format(out=out)}",
            f"blobtool: {path}: {renamed} renamed (the layer's name, PyTorch's parameter name)",
            f"blobtool: {path}: {folded} folded (a Scale's gamma and beta as its BatchNorm's weight and bias)",
            f"blobtool: {path}: {divided} divided by the factor (BatchNorm's running_mean and running_var, by blob 2)",
            f"blobtool: {path}: {kept} left under Caffe's name (<layer>.<index>: no rule for the layer type)",
            *(f"blobtool: {path}: {line}" for line in extra)]


def test_settings_mapping_and_summary_of_an_export(tmp_path):
    net = settings_net(tmp_path)
    out = tmp_path / "s.safetensors"
    result = run_blobtool("convert", "--names", "torch", net, "-o", out, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"blobtool: warning: {net}: --names torch has no rule for these layers, whose blobs are named "
        "<layer>.<index>: Bias: bias1",
        # One line for both BatchNorms with eps 0.001; none for bn2 (Caffe's default is PyTorch's).
        f"blobtool: warning: {net}: BatchNorm eps 0.001 in 2 modules (bn1, bn3), not PyTorch's default 1e-05: "
        "give BatchNorm2d eps=0.001 (the file's metadata has <module>.eps)",
        *summary(net, out, "18 tensors written to {out}, all float32", 5, 6, 6, 1,
                 ["3 not written (BatchNorm's factors)"])]
    with safe_open(out, "np") as f:
        meta = f.metadata()
    assert {k: v for k, v in meta.items() if "." in k} == {
        # No convolution_param: Caffe's defaults, the kernel from the weight's shape.
        **CONV1_DEFAULTS, "bn1.eps": "0.001", "bn2.eps": "1e-05", "bn3.eps": "0.001", "ip.axis": "2", "prelu.channel_shared": "true"}
    assert float(meta["bn1.eps"]) == 0.001 and np.float32(meta["bn2.eps"]) == np.float32(1e-5)
    mapping = json.loads(meta["mapping"])
    assert mapping["format"] == 1 and "modules" not in mapping
    assert sorted(mapping["tensors"]) == sorted(load_file(out))
    assert mapping["tensors"]["conv1.weight"] == ["conv1", 0, "renamed"]
    assert mapping["tensors"]["bn1.running_var"] == ["bn1", 1, "divided"]
    assert mapping["tensors"]["bn3.bias"] == ["bn3_scale", 1, "folded"]
    assert mapping["tensors"]["bias1.0"] == ["bias1", 0, "kept"]
    assert len(mapping["tensors"]) == 18


def test_info_shows_where_each_tensor_came_from(tmp_path):
    net = settings_net(tmp_path)
    out = tmp_path / "s.safetensors"
    assert run_blobtool("convert", "--names", "torch", net, "-o", out).returncode == 0
    result = run_blobtool("info", "--json", out, text=True)
    assert (result.returncode, result.stderr) == (0, "")
    record = json.loads(result.stdout)
    rows = {b["name"]: b for b in record["blobs"]}
    assert rows["bn1.weight"]["from"] == {"layer": "bn1_scale", "blob": 0, "done": "folded"}
    assert rows["ip.bias"]["from"] == {"layer": "ip", "blob": 1, "done": "renamed"}
    assert all("from" in b for b in record["blobs"])
    assert record["settings"]["bn3.eps"] == "0.001" and record["settings"]["ip.axis"] == "2"
    text = run_blobtool("info", out, text=True).stdout.splitlines()
    assert ["tensor", "from", "Caffe", "blob", "done"] in [line.split() for line in text]
    assert ["bn2.running_mean", "bn2/0", "divided"] in [line.split() for line in text]
    assert "  settings a port must copy (the export's metadata keys <module>.<setting>):" in text
    assert "    eps = 0.001: bn1, bn3" in text and "    eps = 1e-05: bn2" in text
    assert "    axis = 2: ip" in text and "    channel_shared = true: prelu" in text
    # A safetensors file without the mapping has neither (the safetensors package's own).
    save_file({"w": np.ones(2, np.float32)}, tmp_path / "plain.safetensors")
    record = json.loads(run_blobtool("info", "--json", tmp_path / "plain.safetensors", text=True).stdout)
    assert "settings" not in record and "from" not in record["blobs"][0]


def test_info_names_torch_shows_the_settings(tmp_path):
    net = settings_net(tmp_path)
    result = run_blobtool("info", "--json", "--names", "torch", net, text=True)
    assert result.returncode == 0
    record = json.loads(result.stdout)
    assert record["settings"] == {**CONV1_DEFAULTS, "bn1.eps": "0.001", "bn2.eps": "1e-05", "bn3.eps": "0.001", "ip.axis": "2",
                                  "prelu.channel_shared": "true"}
    # A selection limits the settings to the modules written.
    record = json.loads(run_blobtool("info", "--json", "--names", "torch", "--blob", "bn2", net, text=True).stdout)
    assert record["settings"] == {"bn2.eps": "1e-05"}
    text = run_blobtool("info", "--names", "torch", net, text=True).stdout
    assert "    eps = 0.001: bn1, bn3\n" in text


def test_many_batchnorms_are_one_warning_line(tmp_path):
    layers = [Layer("conv", "Convolution", [rand(4, 3, 1, 1), rand(4)], bottom=["data"], top=["c"])]
    for k in range(20):
        layers += bn_layers(f"bn{k}", "c", 0.001 if k % 2 else 1e-3 * 2)
    net = write_net(tmp_path / "many.caffemodel", "new", layers)
    result = run_blobtool("convert", "--names", "torch", net, "-o", tmp_path / "m.safetensors", text=True)
    assert result.returncode == 0
    warned = [line for line in result.stderr.splitlines() if line.startswith("blobtool: warning: ")]
    assert warned == [
        f"blobtool: warning: {net}: BatchNorm eps 0.002 in 10 modules (bn0, bn2, bn4, bn6, bn8, bn10, bn12, bn14 "
        "and 2 more), not PyTorch's default 1e-05: give BatchNorm2d eps=0.002 (the file's metadata has <module>.eps)",
        f"blobtool: warning: {net}: BatchNorm eps 0.001 in 10 modules (bn1, bn3, bn5, bn7, bn9, bn11, bn13, bn15 "
        "and 2 more), not PyTorch's default 1e-05: give BatchNorm2d eps=0.001 (the file's metadata has <module>.eps)"]


def test_v1_inner_product_axis(tmp_path):
    layers = [Layer("ip", "InnerProduct", [rand(5, 8), rand(5)], legacy=True, bottom=["data"], top=["ip"],
                    params=len_field(17, varint_field(1, 5) + varint_field(5, (1 << 64) - 1)))]
    net = write_net(tmp_path / "v1.caffemodel", "v1", layers)
    record = json.loads(run_blobtool("info", "--json", "--names", "torch", net, text=True).stdout)
    assert record["settings"] == {"ip.axis": "-1"}


def test_layer_parameter_values_are_read_bounded(tmp_path):
    fields = varint_field(1, 7) + tag(3, 5) + struct.pack("<f", 0.25) + tag(9, 1) + struct.pack("<d", 1e-300)
    net = write_net(tmp_path / "p.caffemodel", "new",
                    [Layer("bn", "BatchNorm", [rand(2), rand(2), np.array([1.0])], params=len_field(139, fields))])
    doc = open_document(net)
    assert layer_param_values(doc, doc.layers[0], "batch_norm_param") == {1: 7, 3: 0.25, 9: 1e-300}
    # A parameter message of more fields than Caffe writes is refused (bad input), as the varints' reader does.
    forged = len_field(139, (tag(3, 5) + struct.pack("<f", 0.5)) * 1025)
    net = write_net(tmp_path / "f.caffemodel", "new",
                    [Layer("bn", "BatchNorm", [rand(2), rand(2), np.array([1.0])], params=forged)])
    doc = open_document(net)
    with pytest.raises(FormatError, match="batch_norm_param of layer 'bn' holds more than 1024 fields"):
        layer_param_values(doc, doc.layers[0], "batch_norm_param")
    result = run_blobtool("convert", "--names", "torch", net, "-o", tmp_path / "f.safetensors", text=True)
    assert result.returncode == 3 and result.stderr.count("\n") == 1 and "more than 1024 fields" in result.stderr
    assert not (tmp_path / "f.safetensors").exists()


def test_the_summary_says_float16_sources_stay_mixed(realworld, tmp_path):
    src = realworld / "mtcnn_det1_half.caffemodel"
    out = tmp_path / "pnet.safetensors"
    result = run_blobtool("convert", "--names", "torch", src, "-o", out, text=True)
    assert result.returncode == 0
    got = load_file(out)
    halves = sum(1 for a in got.values() if a.dtype == np.float16)
    assert 0 < halves < len(got)
    assert result.stderr.splitlines()[0] == (
        f"blobtool: {src}: --names torch: {len(got)} tensors written to {out}, {halves} float16 and "
        f"{len(got) - halves} float32 (each as stored: float16 blobs stay float16; --float writes float32 only)")
    result = run_blobtool("convert", "--names", "torch", "--float", src, "-o", out, text=True)
    assert result.stderr.splitlines()[0] == (f"blobtool: {src}: --names torch: {len(got)} tensors written to {out}, "
                                             "all float32")
    assert {a.dtype for a in load_file(out).values()} == {np.dtype(np.float32)}
    with safe_open(out, "np") as f:
        meta = f.metadata()
    prelus = [k for k in meta if k.endswith(".channel_shared")]
    assert prelus and all(meta[k] == "false" for k in prelus)


def test_the_real_resnet_carries_every_eps(realworld, tmp_path):
    from blobtool._pb import blobtool_caffe_pb2 as pb

    src = realworld / "resnet20_cifar10.caffemodel"
    net = pb.NetParameter()
    net.ParseFromString(src.read_bytes())
    types = [layer.type for layer in net.layer if layer.blobs]
    out = tmp_path / "r.safetensors"
    result = run_blobtool("convert", "--names", "torch", src, "-o", out, text=True)
    assert result.returncode == 0
    bns, scales = types.count("BatchNorm"), types.count("Scale")
    assert result.stderr.splitlines() == summary(
        src, out, "128 tensors written to {out}, all float32",
        2 * (types.count("Convolution") + types.count("InnerProduct")), 2 * scales, 2 * bns, 0,
        [f"{bns} not written (BatchNorm's factors)"])
    with safe_open(out, "np") as f:
        meta = f.metadata()
    eps = {k: v for k, v in meta.items() if k.endswith(".eps")}
    assert len(eps) == bns == 21 and set(eps.values()) == {"1e-05"}
    assert len(json.loads(meta["mapping"])["tensors"]) == 128


# -- --names torch-identifiers -------------------------------------------------------------------

IDENTIFIER_LAYERS = [("conv6-1", "conv6_1_2"), ("conv6_1", "conv6_1"), ("in", "in_"), ("1p", "_1p"),
                     ("a.b/c", "a_b_c"), ("lambda", "lambda_"), ("x-y", "x_y"), ("x+y", "x_y_2")]


def identifier_net(tmp_path):
    layers = []
    for k, (name, _) in enumerate(IDENTIFIER_LAYERS):
        layers.append(Layer(name, "Convolution", [rand(2, 1, 1, 1), rand(2)], bottom=[f"t{k}"], top=[f"t{k + 1}"]))
    layers += bn_layers("bn-1", f"t{len(IDENTIFIER_LAYERS)}", 0.001, channels=2)
    return write_net(tmp_path / "ids.caffemodel", "new", layers)


def test_identifiers_are_typed_names_and_carried_in_the_metadata(tmp_path):
    net = identifier_net(tmp_path)
    out = tmp_path / "ids.safetensors"
    result = run_blobtool("convert", "--names", "torch-identifiers", net, "-o", out, text=True)
    assert result.returncode == 0
    warned = [line for line in result.stderr.splitlines() if line.startswith("blobtool: warning: ")]
    assert warned == [f"blobtool: warning: {net}: --names torch-identifiers: these module names became an "
                      "identifier already given, and were numbered: conv6-1 -> conv6_1_2, x+y -> x_y_2",
                      f"blobtool: warning: {net}: BatchNorm eps 0.001 in 1 module (bn_1), not PyTorch's default "
                      "1e-05: give BatchNorm2d eps=0.001 (the file's metadata has <module>.eps)"]
    got = load_file(out)
    modules = {name.rsplit(".", 1)[0] for name in got}
    assert modules == {ident for _, ident in IDENTIFIER_LAYERS} | {"bn_1"}
    assert all(m.isidentifier() and m not in ("in", "lambda") for m in modules)
    with safe_open(out, "np") as f:
        meta = f.metadata()
    assert meta["names"] == "torch-identifiers" and meta["bn_1.eps"] == "0.001"
    mapping = json.loads(meta["mapping"])
    assert mapping["modules"] == {**{ident: name for name, ident in IDENTIFIER_LAYERS if ident != name},
                                  "bn_1": "bn-1"}
    assert mapping["tensors"]["conv6_1_2.weight"] == ["conv6-1", 0, "renamed"]
    assert mapping["tensors"]["bn_1.weight"] == ["bn-1_scale", 0, "folded"]
    # info on the export names the Caffe layers; the same scheme twice gives the same names.
    record = json.loads(run_blobtool("info", "--json", out, text=True).stdout)
    assert record["modules"]["x_y_2"] == "x+y"
    again = run_blobtool("info", "--json", "--names", "torch-identifiers", net, text=True)
    rows = {b["name"]: b["torch"] for b in json.loads(again.stdout)["blobs"]}
    assert rows["x+y/1"] == "x_y_2.bias" and rows["in/0"] == "in_.weight"


def test_compare_torch_identifiers_both_ways(tmp_path):
    net = identifier_net(tmp_path)
    out = tmp_path / "ids.safetensors"
    assert run_blobtool("convert", "--names", "torch-identifiers", net, "-o", out).returncode == 0
    port = load_file(out)
    port["bn_1.num_batches_tracked"] = np.array(0, np.int64)
    save_file(port, tmp_path / "port.safetensors")
    for a, b in ((net, tmp_path / "port.safetensors"), (tmp_path / "port.safetensors", net)):
        result = run_blobtool("compare", "--names", "torch-identifiers", a, b, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "20 blob(s) match" in result.stdout
    # Under --names torch the Caffe names do not meet the identifiers.
    assert run_blobtool("compare", "-q", "--names", "torch", net, tmp_path / "port.safetensors").returncode == 1
    port["x_y_2.bias"] = port["x_y_2.bias"] + 1
    save_file(port, tmp_path / "wrong.safetensors")
    result = run_blobtool("compare", "--json", "--names", "torch-identifiers", tmp_path / "wrong.safetensors", net,
                          text=True)
    assert result.returncode == 1
    assert [b["name"] for b in json.loads(result.stdout)["blobs"] if not b["equal"]] == ["x_y_2.bias"]


def test_python_identifiers_rules():
    from blobtool.torchport.metadata import python_identifiers

    given, numbered = python_identifiers(["a-b", "a_b", "a b", "", "9", "class", "ok", "_9"])
    assert given == {"a-b": "a_b_2", "a_b": "a_b", "a b": "a_b_3", "": "_", "9": "_9_2", "class": "class_",
                     "ok": "ok", "_9": "_9"}
    assert numbered == [("a-b", "a_b_2"), ("a b", "a_b_3"), ("9", "_9_2")]


# -- --bf16 ----------------------------------------------------------------------------------------

def bf16_bits(values) -> np.ndarray:
    """The oracle: ml_dtypes' float32 -> bfloat16 cast (nearest, ties to even), as bits."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(values, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def stored_bits(path, name: str) -> np.ndarray:
    return load_file(path)[name].view(np.uint16)


def test_bf16_export_rounds_as_pytorch_does(tmp_path):
    # Ties, values that round up into the next exponent, subnormals, NaN, Inf and signed zeros.
    edge = np.array([1.0, 1.00390625, 1.01171875, 1.0 + 2 ** -8 + 2 ** -20, 3.3895e38, -0.0, 0.0, np.nan, -np.inf,
                     1e-39, -1e-45, 65504.0, 1e-8], np.float32)
    weight = np.concatenate([edge, rand(1000) * 100]).reshape(1013, 1)
    layers = [Layer("ip", "InnerProduct", [weight, rand(1013)], bottom=["data"], top=["ip"]),
              *bn_layers("bn", "ip", None, channels=1013)]
    net = write_net(tmp_path / "b.caffemodel", "new", layers)
    out = tmp_path / "b.safetensors"
    result = run_blobtool("convert", "--names", "torch", "--bf16", net, "-o", out, text=True)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == (f"blobtool: warning: {net}: --bf16: in the 6 blob(s) written in bfloat16, 1 values became "
                        "subnormal (below 1.18e-38) and 1 became 0")
    assert lines[1] == f"blobtool: {net}: --names torch: 6 tensors written to {out}, all bfloat16"
    with open(out, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    assert {header[k]["dtype"] for k in header if k != "__metadata__"} == {"BF16"}
    np.testing.assert_array_equal(stored_bits(out, "ip.weight"), bf16_bits(weight).reshape(1013, 1))
    np.testing.assert_array_equal(stored_bits(out, "ip.bias"), bf16_bits(layers[0].blobs[1]))
    # BatchNorm's statistics are divided in float64, stored float32, then rounded.
    mean = (layers[1].blobs[0].astype(np.float64) / 2.0).astype(np.float32)
    np.testing.assert_array_equal(stored_bits(out, "bn.running_mean"), bf16_bits(mean))
    # blobtool reads the file back (info; compare within bfloat16's precision).
    assert run_blobtool("info", out).returncode == 0
    result = run_blobtool("compare", "--names", "torch", "--rtol", "0.004", "--blob", "bn", net, out, text=True)
    assert result.returncode == 3 and "bfloat16" in result.stderr   # its values load only with a cast


def test_bf16_keeps_a_blob_it_would_make_infinite(tmp_path):
    big = np.array([3.3999e38, 1.0, 2.0], np.float32)   # past bfloat16's largest finite value once rounded
    layers = [Layer("a", "Convolution", [big.reshape(3, 1, 1, 1), rand(3)], bottom=["data"], top=["a"])]
    net = write_net(tmp_path / "big.caffemodel", "new", layers)
    out = tmp_path / "big.safetensors"
    result = run_blobtool("convert", "--names", "torch", "--bf16", net, "-o", out, text=True)
    assert result.returncode == 0
    lines = result.stderr.splitlines()
    assert lines[0] == (f"blobtool: warning: {net}: blob a.weight: 1 of 3 values are past bfloat16's range (largest "
                        "3.3999e+38, bfloat16 holds up to 3.38953e+38): kept in float32 (0 values would have become "
                        "subnormal and 0 zero)")
    assert lines[1] == (f"blobtool: {net}: --names torch: 2 tensors written to {out}, 1 float32 and 1 bfloat16 "
                        "(--bf16: the blobs it cannot hold without an Inf stay wider, as warned)")
    got = load_file(out)
    assert got["a.weight"].dtype == np.float32 and got["a.weight"].tobytes() == big.reshape(3, 1, 1, 1).tobytes()
    assert str(got["a.bias"].dtype) == "bfloat16"


def test_bf16_is_refused_where_no_bfloat16_type_exists(tmp_path):
    net = write_net(tmp_path / "n.caffemodel", "new",
                    [Layer("a", "Convolution", [rand(2, 1, 1, 1), rand(2)], bottom=["data"], top=["a"])])
    for out in ("n.npz", "n.npy", "n.h5", "n.pb"):
        args = ["--blob", "a/0"] if out.endswith((".npy", ".pb")) else []
        result = run_blobtool("convert", "--bf16", *args, net, "-o", tmp_path / out, text=True)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, (out, result.stderr)
        assert "bfloat16 (--precision bf16) is written to .safetensors only" in result.stderr
        assert not (tmp_path / out).exists()
    result = run_blobtool("convert", "--bf16", "--half-strict", net, "-o", tmp_path / "x.safetensors", text=True)
    assert result.returncode == 2 and "--precision is asked for twice, as bf16 and as half" in result.stderr
    # Without --names torch too: Caffe's names, BF16 tensors.
    assert run_blobtool("convert", "--bf16", net, "-o", tmp_path / "c.safetensors").returncode == 0
    np.testing.assert_array_equal(stored_bits(tmp_path / "c.safetensors", "a/1"),
                                  bf16_bits(open_document(net).entries[1].blob().cpu_data()))


def test_the_origin_table_is_what_rich_prints(tmp_path):
    from runner import rich_text

    from blobtool.cli.inspect import _draw_info, _plain_info
    from blobtool.records import info_record

    net = settings_net(tmp_path)
    out = tmp_path / "s.safetensors"
    assert run_blobtool("convert", "--names", "torch", net, "-o", out).returncode == 0
    doc = open_document(out)
    record = info_record(doc, doc.entries)
    for width in (100, 200):
        assert _plain_info(record, width) == rich_text(_draw_info, record, width)


@pytest.mark.slow
def test_an_export_of_the_most_tensors_reads_back(tmp_path):
    from blobtool.formats import MAX_BLOBS

    # MAX_BLOBS tensors, each with its row of the mapping: the header's bounds still hold it.
    layers = [Layer(f"layer-with-a-long-name-{k:05d}", "InnerProduct", [np.ones((1, 1), np.float32),
                                                                         np.ones(1, np.float32)],
                    bottom=["d"], top=["d"]) for k in range(MAX_BLOBS // 2)]
    net = write_net(tmp_path / "many.caffemodel", "new", layers)
    out = tmp_path / "many.safetensors"
    assert run_blobtool("convert", "--names", "torch-identifiers", net, "-o", out).returncode == 0
    result = run_blobtool("info", "--json", out, text=True)
    assert (result.returncode, result.stderr) == (0, "")
    record = json.loads(result.stdout)
    assert len(record["blobs"]) == MAX_BLOBS and len(record["modules"]) == MAX_BLOBS // 2
    assert record["blobs"][-1]["from"] == {"layer": layers[-1].name, "blob": 1, "done": "renamed"}


# -- Convolution and Pooling settings (from the net's full definition) ---------------------------

def conv_param(*fields, v1: bool = False) -> bytes:
    """convolution_param (LayerParameter 106; V1 10) holding these raw fields."""
    return len_field(10 if v1 else 106, b"".join(fields))


def pool_param(*fields, v1: bool = False) -> bytes:
    """pooling_param (LayerParameter 121; V1 19) holding these raw fields."""
    return len_field(19 if v1 else 121, b"".join(fields))


@pytest.mark.parametrize("fmt", ["new", "v1"])
def test_convolution_and_pooling_settings(tmp_path, fmt):
    v1 = fmt == "v1"
    layers = [
        # kernel 3 for both axes, stride 2, pad 1, dilation 2, group 2.
        Layer("conv1", "Convolution", [rand(4, 1, 3, 3), rand(4)], legacy=v1, bottom=["data"], top=["c1"],
              params=conv_param(varint_field(1, 4), varint_field(4, 3), varint_field(6, 2), varint_field(3, 1),
                                varint_field(18, 2), varint_field(5, 2), v1=v1)),
        # kernel_h/kernel_w, stride_h/stride_w, pad_h/pad_w; the defaults otherwise.
        Layer("conv2", "Convolution", [rand(4, 4, 1, 5), rand(4)], legacy=v1, bottom=["c1"], top=["c2"],
              params=conv_param(varint_field(1, 4), varint_field(11, 1), varint_field(12, 5), varint_field(13, 1),
                                varint_field(14, 2), varint_field(9, 0), varint_field(10, 2), v1=v1)),
        Layer("pool1", "Pooling", bottom=["c2"], top=["p1"],
              params=pool_param(varint_field(1, 0), varint_field(2, 3), varint_field(3, 2), v1=v1)),
        Layer("pool2", "Pooling", bottom=["p1"], top=["p2"],
              params=pool_param(varint_field(1, 1), varint_field(12, 1), v1=v1)),
    ]
    net = write_net(tmp_path / "c.caffemodel", fmt, layers)
    out = tmp_path / "c.safetensors"
    assert run_blobtool("convert", "--names", "torch", net, "-o", out).returncode == 0
    with safe_open(out, "np") as f:
        meta = f.metadata()
    settings = {k: v for k, v in meta.items() if "." in k}
    assert settings == {
        "conv1.kernel_size": "3", "conv1.stride": "2", "conv1.padding": "1", "conv1.dilation": "2", "conv1.groups": "2",
        "conv2.kernel_size": "(1, 5)", "conv2.stride": "(1, 2)", "conv2.padding": "(0, 2)", "conv2.dilation": "1",
        "conv2.groups": "1",
        "pool1.pool": "max", "pool1.kernel_size": "3", "pool1.stride": "2", "pool1.padding": "0",
        "pool1.ceil_mode": "true",
        "pool2.pool": "ave", "pool2.global_pooling": "true", "pool2.stride": "1", "pool2.padding": "0",
        "pool2.ceil_mode": "true"}
    # A selection carries the settings of the layers it writes, and no Pooling's.
    record = json.loads(run_blobtool("info", "--json", "--names", "torch", "--blob", "conv2", net, text=True).stdout)
    assert sorted(record["settings"]) == ["conv2.dilation", "conv2.groups", "conv2.kernel_size", "conv2.padding",
                                          "conv2.stride"]


def test_the_real_nets_carry_their_convolutions(realworld):
    record = json.loads(run_blobtool("info", "--json", "--names", "torch", realworld / "lenet_iter_10000.caffemodel",
                                     text=True).stdout)
    assert record["settings"] == {
        "conv1.kernel_size": "5", "conv1.stride": "1", "conv1.padding": "0", "conv1.dilation": "1",
        "conv1.groups": "1",
        "pool1.pool": "max", "pool1.kernel_size": "2", "pool1.stride": "2", "pool1.padding": "0",
        "pool1.ceil_mode": "true",
        "conv2.kernel_size": "5", "conv2.stride": "1", "conv2.padding": "0", "conv2.dilation": "1",
        "conv2.groups": "1",
        "pool2.pool": "max", "pool2.kernel_size": "2", "pool2.stride": "2", "pool2.padding": "0",
        "pool2.ceil_mode": "true"}


def test_an_output_without_metadata_says_the_settings_are_not_in_it(tmp_path):
    net = settings_net(tmp_path)
    for extra in ([], ["--float"]):
        result = run_blobtool("convert", "--names", "torch", *extra, net, "-o", tmp_path / "s.npz", text=True)
        assert result.returncode == 0
        assert (f"blobtool: warning: {net}: --names torch: a numpy output holds no metadata: the settings (BatchNorm "
                "eps, strides, ...) and where each tensor came from are not in it (info --names torch lists them; "
                ".safetensors keeps them)\n") in result.stderr
        assert len(np.load(tmp_path / "s.npz").files) == 18
    result = run_blobtool("convert", "--names", "torch", net, "-o", tmp_path / "s.safetensors", text=True)
    assert "holds no metadata" not in result.stderr


def test_a_snapshot_takes_its_settings_from_the_net_beside_it(tmp_path):
    pytest.importorskip("h5py", reason="h5py (the hdf5 extra) is not installed")
    from builders import h5_net_bytes, write_h5

    layers = [Layer("conv-1", "Convolution", [rand(4, 3, 3, 3), rand(4)], bottom=["data"], top=["c"],
                    params=conv_param(varint_field(1, 4), varint_field(4, 3), varint_field(6, 2))),
              *bn_layers("bn1", "c", 0.001)]
    net = write_net(tmp_path / "net.caffemodel", "new", layers)
    snapshot = write_h5(tmp_path / "net.caffemodel.h5",
                        h5_net_bytes([(layer.name, list(layer.blobs)) for layer in layers]))
    out = tmp_path / "s.safetensors"
    result = run_blobtool("convert", "--names", "torch-identifiers", "--definition", net, snapshot, "-o", out, text=True)
    assert result.returncode == 0, result.stderr
    assert (f"blobtool: warning: {snapshot}: BatchNorm eps 0.001 in 1 module (bn1), not PyTorch's default 1e-05: "
            "give BatchNorm2d eps=0.001 (the file's metadata has <module>.eps)") in result.stderr.splitlines()
    with safe_open(out, "np") as f:
        meta = f.metadata()
    assert {k: v for k, v in meta.items() if "." in k} == {
        "conv_1.kernel_size": "3", "conv_1.stride": "2", "conv_1.padding": "0", "conv_1.dilation": "1",
        "conv_1.groups": "1", "bn1.eps": "0.001"}
    assert json.loads(meta["mapping"])["tensors"]["bn1.running_var"] == ["bn1", 1, "divided"]
