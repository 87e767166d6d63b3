"""blobtool.torchport.naming and --names torch: each rule on generated nets (three layer formats) and on a real ResNet.

The expected values are computed here from the arrays the nets were built
from (or, for the real file, from the protobuf library's parse of it); the
exports are read back with the safetensors package.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from blobtool._pb import blobtool_caffe_pb2 as pb
from blobtool.formats import open_document
from blobtool.torchport.naming import torch_names
from builders import (Layer, blob_proto, len_field, varint_field, write_blob, write_net, write_npz, write_solverstate,
                      write_vector)
from runner import run_blobtool

RNG = np.random.default_rng(2024)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def bn_stat(sums, factor):
    """Caffe's BatchNorm statistic in float64, stored as float32 (0 when the factor is 0)."""
    sums = np.asarray(sums, np.float64)
    return (sums * 0.0 if factor == 0 else sums / factor).astype(np.float32)


W = {"conv1": rand(4, 3, 2, 2), "conv1_b": rand(4), "mean": rand(4) * 10, "var": np.abs(rand(4)) * 10,
     "gamma": rand(4), "beta": rand(4), "gamma2": rand(4), "beta2": rand(4), "deconv": rand(4, 2, 3, 3),
     "deconv_b": rand(2), "ip": rand(5, 8), "ip_b": rand(5), "embed": rand(10, 3), "slope": rand(4),
     "bias": rand(4), "mean0": rand(4), "var0": rand(4)}
FACTOR = 2.5


def every_rule_layers():
    return [
        Layer("data", "Input", bottom=[], top=["data"]),
        Layer("conv1", "Convolution", [W["conv1"], W["conv1_b"]], bottom=["data"], top=["conv1"]),
        Layer("bn1", "BatchNorm", [W["mean"], W["var"], np.array([FACTOR])], bottom=["conv1"], top=["conv1"]),
        Layer("scale1", "Scale", [W["gamma"], W["beta"]], bottom=["conv1"], top=["conv1"]),   # folded into bn1
        Layer("relu1", "ReLU", bottom=["conv1"], top=["conv1"]),
        # A Scale not after a BatchNorm: the last layer to write conv1 is the ReLU.
        Layer("scale2", "Scale", [W["gamma2"], W["beta2"]], bottom=["conv1"], top=["conv1"]),
        Layer("bn0", "BatchNorm", [W["mean0"], W["var0"], np.array([0.0])], bottom=["conv1"], top=["bn0"]),
        Layer("deconv", "Deconvolution", [W["deconv"], W["deconv_b"]], bottom=["bn0"], top=["deconv"]),
        # The legacy 4-D layout: weight (1, 1, N, K), bias (1, 1, 1, N).
        Layer("ip", "InnerProduct", [W["ip"], W["ip_b"]], legacy=True, bottom=["deconv"], top=["ip"]),
        Layer("embed", "Embed", [W["embed"]], bottom=["ip"], top=["embed"]),
        Layer("prelu", "PReLU", [W["slope"]], bottom=["embed"], top=["embed"]),
        Layer("bias1", "Bias", [W["bias"]], bottom=["embed"], top=["embed"]),
    ]


EXPECTED = {
    "conv1.weight": W["conv1"], "conv1.bias": W["conv1_b"],
    "bn1.running_mean": bn_stat(W["mean"], FACTOR), "bn1.running_var": bn_stat(W["var"], FACTOR),
    "bn1.weight": W["gamma"], "bn1.bias": W["beta"],
    "scale2.weight": W["gamma2"], "scale2.bias": W["beta2"],
    # Caffe multiplies by a factor of 0: zeros, signed as the sums were.
    "bn0.running_mean": bn_stat(W["mean0"], 0), "bn0.running_var": bn_stat(W["var0"], 0),
    "deconv.weight": W["deconv"], "deconv.bias": W["deconv_b"],
    "ip.weight": W["ip"], "ip.bias": W["ip_b"], "embed.weight": W["embed"], "prelu.weight": W["slope"],
    "bias1.0": W["bias"],
}
WARNING = ("blobtool: warning: {path}: --names torch has no rule for these layers, whose blobs are named "
           "<layer>.<index>: Bias: bias1\n")


def warnings(result) -> str:
    """A run's stderr without convert --names torch's summary lines (those not "blobtool: warning: ")."""
    return "".join(line for line in result.stderr.splitlines(True) if line.startswith("blobtool: warning: "))


def assert_exported(path, expected: dict) -> None:
    got = load_file(path)
    assert sorted(got) == sorted(expected)
    for key, array in expected.items():
        assert got[key].dtype == array.dtype, key
        assert got[key].shape == array.shape, key
        assert got[key].tobytes() == array.tobytes(), key


def test_every_rule_on_a_generated_net(tmp_path):
    net = write_net(tmp_path / "rules.caffemodel", "new", every_rule_layers())
    out = tmp_path / "rules.safetensors"
    result = run_blobtool("convert", "--names", "torch", net, "-o", out, text=True)
    assert result.returncode == 0
    assert warnings(result) == WARNING.format(path=net)
    assert_exported(out, EXPECTED)
    # The header lists the tensors in the net's order; the metadata names the scheme.
    from safetensors import safe_open

    with safe_open(out, "np") as f:
        assert f.metadata()["names"] == "torch" and f.metadata()["source_kind"] == "net"
    # BatchNorm's factor is not written; the InnerProduct was legacy-shaped in the file.
    assert open_document(net).entries[[e.name for e in open_document(net).entries].index("ip/0")].shape == (1, 1, 5, 8)


def test_no_fold_keeps_the_scale_apart(tmp_path):
    net = write_net(tmp_path / "rules.caffemodel", "new", every_rule_layers())
    out = tmp_path / "apart.safetensors"
    assert run_blobtool("convert", "--names", "torch", "--no-fold", net, "-o", out).returncode == 0
    expected = {k: v for k, v in EXPECTED.items() if k not in ("bn1.weight", "bn1.bias")}
    expected.update({"scale1.weight": W["gamma"], "scale1.bias": W["beta"]})
    assert_exported(out, expected)


def test_info_lists_the_mapping(tmp_path):
    net = write_net(tmp_path / "rules.caffemodel", "new", every_rule_layers())
    result = run_blobtool("info", "--json", "--names", "torch", net, text=True)
    assert result.returncode == 0 and result.stderr == WARNING.format(path=net)
    rows = {r["name"]: r for r in json.loads(result.stdout)["blobs"]}
    assert rows["bn1/0"]["torch"] == "bn1.running_mean"
    assert rows["bn1/0"]["done"] == "divided by the factor 2.5 (bn1/2) in float64"
    assert rows["bn1/2"]["torch"] is None and rows["bn1/2"]["torch_shape"] is None
    assert rows["bn0/1"]["done"] == "set to 0: the factor (bn0/2) is 0, as Caffe then does"
    assert rows["scale1/1"]["torch"] == "bn1.bias" and rows["scale1/1"]["done"] == "folded into bn1"
    assert rows["scale2/0"]["torch"] == "scale2.weight" and rows["scale2/0"]["done"] == "renamed"
    assert rows["ip/0"]["shape"] == [1, 1, 5, 8] and rows["ip/0"]["torch_shape"] == [5, 8]
    assert rows["ip/0"]["done"] == "reshaped (1, 1, 5, 8) -> (5, 8)"
    assert rows["ip/1"]["done"] == "reshaped (1, 1, 1, 5) -> (5,)"
    assert rows["bias1/0"]["torch"] == "bias1.0" and rows["bias1/0"]["done"] == "kept (no rule for Bias)"
    assert len(rows) == 19
    # The plain table: one line per Caffe blob.
    table = run_blobtool("info", "--names", "torch", "--blob", "bn1", net, text=True).stdout.splitlines()
    assert table[0] == f"{net}  net, {net.stat().st_size / 1024:.1f} KiB, name testnet"
    assert [line.split()[:3] for line in table[4:7]] == [["bn1/0", "BatchNorm", "bn1.running_mean"],
                                                       ["bn1/1", "BatchNorm", "bn1.running_var"],
                                                       ["bn1/2", "BatchNorm", "-"]]
    assert table[-3:] == ["  3 Caffe blobs, 2 PyTorch tensors",
                          "  settings a port must copy (the export's metadata keys <module>.<setting>):",
                          "    eps = 1e-05: bn1"]
    # With --stats, the blobs under their PyTorch names (tests/torchport/test_names_everywhere.py).
    assert run_blobtool("info", "--names", "torch", "--stats", net).returncode == 0


def test_selection_is_by_caffe_names(tmp_path):
    net = write_net(tmp_path / "rules.caffemodel", "new", every_rule_layers())
    out = tmp_path / "sel.safetensors"
    # One statistic alone still divides by its layer's factor (not selected).
    assert run_blobtool("convert", "--names", "torch", "--blob", "bn1/1", "--blob", "scale1", net,
                        "-o", out).returncode == 0
    assert_exported(out, {k: EXPECTED[k] for k in ("bn1.running_var", "bn1.weight", "bn1.bias")})


@pytest.mark.parametrize("fmt", ["v1", "v0"])
def test_old_layer_formats_map_the_same(tmp_path, fmt):
    conv_type = "Convolution" if fmt == "v1" else "Conv"   # V0's type string is "conv"
    layers = [Layer("conv1", conv_type, [W["conv1"], W["conv1_b"]], legacy=True, bottom=["data"], top=["conv1"]),
              Layer("relu1", "ReLU", bottom=["conv1"], top=["conv1"]),
              Layer("ip", "InnerProduct", [W["ip"], W["ip_b"]], legacy=True, bottom=["conv1"], top=["ip"])]
    net = write_net(tmp_path / f"{fmt}.caffemodel", fmt, layers)
    out = tmp_path / f"{fmt}.safetensors"
    result = run_blobtool("convert", "--names", "torch", net, "-o", out, text=True)
    assert (result.returncode, warnings(result)) == (0, "")
    assert_exported(out, {k: EXPECTED[k] for k in ("conv1.weight", "conv1.bias", "ip.weight", "ip.bias")})


def test_files_without_layer_types_refuse(tmp_path):
    files = [write_solverstate(tmp_path / "s.solverstate", [np.ones(2)]),
             write_blob(tmp_path / "b.pb", [1.0, 2.0]),
             write_vector(tmp_path / "v.pb", [np.ones(2)]),
             write_npz(tmp_path / "z.npz", {"w": np.ones(2)})]
    save_file({"w": np.ones(2, np.float32)}, tmp_path / "t.safetensors")
    files.append(tmp_path / "t.safetensors")
    for path in files:
        for args in (["convert", "--names", "torch", path, "-o", tmp_path / "out.safetensors"],
                     ["info", "--names", "torch", path]):
            result = run_blobtool(*args, text=True)
            assert result.returncode == 2, (path, result.stderr)
            assert result.stderr.count("\n") == 1
            assert "--names torch renames a .caffemodel's blobs by layer type" in result.stderr
    result = run_blobtool("compare", "--names", "torch", files[3], files[4], text=True)
    assert result.returncode == 2
    assert not (tmp_path / "out.safetensors").exists()


def test_renamed_blobs_are_not_written_back_into_the_net(tmp_path):
    net = write_net(tmp_path / "rules.caffemodel", "new", every_rule_layers())
    result = run_blobtool("convert", "--names", "torch", net, "-o", tmp_path / "x.caffemodel", text=True)
    assert result.returncode == 2 and "cannot be written back into the net" in result.stderr
    assert not (tmp_path / "x.caffemodel").exists()
    # .npz takes PyTorch names too.
    assert run_blobtool("convert", "--names", "torch", net, "-o", tmp_path / "x.npz").returncode == 0
    assert sorted(np.load(tmp_path / "x.npz")) == sorted(EXPECTED)


def test_diffs_are_left_out_with_a_warning(tmp_path):
    net = write_net(tmp_path / "d.caffemodel", "new", [Layer("ip", "InnerProduct", [W["ip"], W["ip_b"]],
                                                             diffs=[W["ip"] * 0, None])])
    out = tmp_path / "d.safetensors"
    result = run_blobtool("convert", "--names", "torch", net, "-o", out, text=True)
    assert result.returncode == 0
    assert warnings(result) == (f"blobtool: warning: {net}: --names torch writes no diffs (a PyTorch state_dict "
                             "holds none): 1 blobs' diffs left out\n")
    assert sorted(load_file(out)) == ["ip.bias", "ip.weight"]


def test_batchnorm_without_its_three_blobs_is_bad_input(tmp_path):
    net = write_net(tmp_path / "bn.caffemodel", "new", [Layer("bn", "BatchNorm", [W["mean"], W["var"]])])
    result = run_blobtool("convert", "--names", "torch", net, "-o", tmp_path / "o.safetensors", text=True)
    assert result.returncode == 3
    assert result.stderr == (f"blobtool: {net}: BatchNorm layer 'bn' holds 2 blobs ((4,), (4,)); Caffe's BatchNorm "
                             "holds 3: the sums of the mean and variance, and a factor of shape (1,); NVIDIA Caffe's "
                             "holds 5: those, then its scale and bias, one value per channel\n")


def test_a_tiny_factor_that_overflows_is_said(tmp_path):
    net = write_net(tmp_path / "bn.caffemodel", "new",
                    [Layer("bn", "BatchNorm", [np.array([1e30, 1.0]), np.array([1.0, 1.0]), np.array([1e-30])])])
    result = run_blobtool("convert", "--names", "torch", net, "-o", tmp_path / "o.safetensors", text=True)
    assert result.returncode == 0
    assert warnings(result) == (f"blobtool: warning: {net}: bn.running_mean: 1 values became Inf or NaN dividing "
                             "bn/0 by the BatchNorm factor 1e-30\n")


# -- comparing a port -------------------------------------------------------------------------

def test_compare_a_port_saved_by_pytorch(tmp_path):
    net = write_net(tmp_path / "rules.caffemodel", "new", every_rule_layers())
    # What a PyTorch user's state_dict holds: the same tensors, and BatchNorm's counters.
    port = dict(EXPECTED)
    port.update({"bn1.num_batches_tracked": np.array(0, np.int64), "bn0.num_batches_tracked": np.array(0, np.int64)})
    save_file(port, tmp_path / "port.safetensors")
    for a, b in ((net, tmp_path / "port.safetensors"), (tmp_path / "port.safetensors", net)):
        result = run_blobtool("compare", "--names", "torch", a, b, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.startswith("equal") and "17 blob(s) match" in result.stdout
    # Without --names torch the names do not meet.
    assert run_blobtool("compare", "-q", net, tmp_path / "port.safetensors").returncode == 1
    # A port that got BatchNorm wrong (the sums, not divided) and lost a layer.
    port["bn1.running_mean"] = W["mean"]
    del port["prelu.weight"]
    save_file(port, tmp_path / "wrong.safetensors")
    result = run_blobtool("compare", "--json", "--names", "torch", net, tmp_path / "wrong.safetensors", text=True)
    assert result.returncode == 1
    record = json.loads(result.stdout)
    differing = {b["name"]: b for b in record["blobs"] if not b["equal"]}
    assert set(differing) == {"bn1.running_mean", "prelu.weight"}
    assert differing["prelu.weight"]["only_in"] == "a"
    # A selection in Caffe's names limits both sides.
    result = run_blobtool("compare", "--names", "torch", "--blob", "conv1", net, tmp_path / "wrong.safetensors",
                          text=True)
    assert result.returncode == 0 and "2 blob(s) match" in result.stdout


# -- the real ResNet ----------------------------------------------------------------------------

def real_layers(path) -> list:
    """(name, type, [arrays]) per layer with blobs, from the protobuf library's parse (the oracle)."""
    net = pb.NetParameter()
    net.ParseFromString(path.read_bytes())
    return [(layer.name, layer.type, [np.array(b.data, np.float32).reshape(tuple(b.shape.dim)) for b in layer.blobs])
            for layer in net.layer if layer.blobs]


def test_the_real_resnet(realworld, tmp_path):
    src = realworld / "resnet20_cifar10.caffemodel"
    out = tmp_path / "resnet.safetensors"
    result = run_blobtool("convert", "--names", "torch", src, "-o", out, text=True)
    assert (result.returncode, warnings(result)) == (0, "")
    layers = real_layers(src)
    expected = {}
    previous_bn = None
    for name, type_, arrays in layers:
        if type_ == "BatchNorm":
            factor = float(arrays[2][0])
            expected[f"{name}.running_mean"] = bn_stat(arrays[0], factor)
            expected[f"{name}.running_var"] = bn_stat(arrays[1], factor)
            previous_bn = name
        elif type_ == "Scale":   # in this net every Scale follows its BatchNorm in place
            expected[f"{previous_bn}.weight"], expected[f"{previous_bn}.bias"] = arrays
        else:
            assert type_ in ("Convolution", "InnerProduct")
            expected[f"{name}.weight"], expected[f"{name}.bias"] = arrays
    assert {t for _, t, _ in layers} == {"Convolution", "BatchNorm", "Scale", "InnerProduct"}
    assert len(expected) == 128
    assert_exported(out, expected)
    assert run_blobtool("compare", "--names", "torch", src, out).returncode == 0
    # The library gives the same rows the command lists.
    rows = torch_names(open_document(src)).rows
    assert len(rows) == 149 and sum(r.name is None for r in rows) == 21


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


@pytest.mark.skipif(_torch() is None, reason="PyTorch is not installed (optional: the BatchNorm2d check)")
def test_resnet_batchnorm_pairs_load_into_pytorch(realworld, tmp_path):
    torch = _torch()
    src = realworld / "resnet20_cifar10.caffemodel"
    out = tmp_path / "resnet.safetensors"
    assert run_blobtool("convert", "--names", "torch", src, "-o", out).returncode == 0
    tensors = load_file(out)
    layers = real_layers(src)
    pairs = [(bn, scale) for bn, scale in zip(layers, layers[1:]) if (bn[1], scale[1]) == ("BatchNorm", "Scale")]
    assert len(pairs) == 21
    rng = np.random.default_rng(3)
    for (bn, _, (sums_mean, sums_var, factor)), (_, _, (gamma, beta)) in pairs:
        module = torch.nn.BatchNorm2d(gamma.size, eps=1e-5)
        state = {k[len(bn) + 1:]: torch.from_numpy(v) for k, v in tensors.items() if k.startswith(bn + ".")}
        assert sorted(state) == ["bias", "running_mean", "running_var", "weight"]
        # strict: every key the module has (PyTorch fills in num_batches_tracked), none it lacks.
        module.load_state_dict(state, strict=True)
        module.eval()
        x = rng.standard_normal((2, gamma.size, 3, 3)).astype(np.float32)
        with torch.no_grad():
            got = module(torch.from_numpy(x)).numpy()
        # Caffe's BatchNorm (global stats, eps 1e-5) then Scale, in numpy.
        mean = (sums_mean.astype(np.float64) / factor[0])[:, None, None]
        var = (sums_var.astype(np.float64) / factor[0])[:, None, None]
        want = (x - mean) / np.sqrt(var + 1e-5) * gamma[:, None, None] + beta[:, None, None]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_the_plain_mapping_table_is_what_rich_prints(tmp_path):
    from runner import rich_text

    from blobtool.report.mapping import mapping_record, plain_mapping, render_mapping

    net = write_net(tmp_path / "rules.caffemodel", "new", every_rule_layers())
    doc = open_document(net)
    record = mapping_record(doc, torch_names(doc), fold=True)
    for width in (160, 200):
        assert plain_mapping(record, width) == rich_text(render_mapping, record, width)
    # Too narrow for every column: some are left out (and said so), as rich leaves them out.
    assert plain_mapping(record, 60) == rich_text(render_mapping, record, 60)
    assert "not shown at 60 columns" in plain_mapping(record, 60)


def test_the_real_mtcnn_keeps_float16_and_names_prelu(realworld, tmp_path):
    src = realworld / "mtcnn_det1_half.caffemodel"
    out = tmp_path / "pnet.safetensors"
    result = run_blobtool("convert", "--names", "torch", src, "-o", out, text=True)
    assert (result.returncode, warnings(result)) == (0, "")
    got = load_file(out)
    doc = open_document(src)
    stored = {e.name: e for e in doc.entries}
    assert sorted(got) == sorted(f"{e.layer}.{'weight' if e.name.endswith('/0') else 'bias'}" for e in doc.entries)
    for name, array in got.items():
        layer, param = name.rsplit(".", 1)
        entry = stored[f"{layer}/{0 if param == 'weight' else 1}"]
        assert array.dtype == entry.dtype   # float16 convolutions stay float16, PReLU float32
        assert array.tobytes() == entry.blob().cpu_data().astype(entry.dtype).tobytes()
    assert {a.dtype for a in got.values()} == {np.dtype(np.float16), np.dtype(np.float32)}
    assert run_blobtool("compare", "--names", "torch", src, out).returncode == 0


# -- layer settings that change what a blob holds -------------------------------------------------

def inner_product_param(num_output: int, transpose: bool, *, v1: bool = False) -> bytes:
    """LayerParameter.inner_product_param (117; V1: 17) { num_output = 1, transpose = 6 }, as raw fields."""
    return len_field(17 if v1 else 117, varint_field(1, num_output) + varint_field(6, int(transpose)))


def linear(x, weight, bias):
    """PyTorch's Linear: x @ weight.T + bias."""
    return x @ weight.T + bias


@pytest.mark.parametrize("fmt", ["new", "v1"])
def test_a_transposed_inner_product_is_transposed_for_linear(tmp_path, fmt):
    k, n = 6, 4
    stored, bias = rand(k, n) * 3, rand(n)   # transpose: true stores the weight (K, N)
    x = rand(5, k).astype(np.float64)
    caffe = x @ stored.astype(np.float64) + bias   # Caffe's forward with transpose: bottom * W, (M, K) x (K, N)
    square = rand(6, 6)
    layers = [Layer("ip", "InnerProduct", [stored, bias], legacy=fmt == "v1", bottom=["data"], top=["ip"],
                    params=inner_product_param(n, True, v1=fmt == "v1")),
              Layer("sq", "InnerProduct", [square, bias[:1].repeat(6)], bottom=["ip"], top=["sq"],
                    params=inner_product_param(6, True, v1=fmt == "v1")),
              Layer("plain", "InnerProduct", [W["ip"], W["ip_b"]], bottom=["sq"], top=["plain"],
                    params=inner_product_param(5, False, v1=fmt == "v1"))]
    net = write_net(tmp_path / "t.caffemodel", fmt, layers)
    out = tmp_path / "t.safetensors"
    result = run_blobtool("convert", "--names", "torch", net, "-o", out, text=True)
    assert (result.returncode, warnings(result)) == (0, "")
    got = load_file(out)
    assert got["ip.weight"].shape == (n, k) and got["ip.weight"].tobytes() == np.ascontiguousarray(stored.T).tobytes()
    np.testing.assert_allclose(linear(x, got["ip.weight"].astype(np.float64), got["ip.bias"]), caffe, rtol=1e-12)
    y = rand(3, 6).astype(np.float64)
    np.testing.assert_allclose(linear(y, got["sq.weight"].astype(np.float64), 0), y @ square, rtol=1e-12)
    assert got["plain.weight"].tobytes() == W["ip"].tobytes()   # transpose: false is Caffe's usual (N, K)
    rows = {r["name"]: r for r in json.loads(run_blobtool("info", "--json", "--names", "torch", net,
                                                          text=True).stdout)["blobs"]}
    lead = "reshaped (1, 1, 6, 4) -> (6, 4); " if fmt == "v1" else ""
    assert rows["ip/0"]["done"] == (f"{lead}transposed (6, 4) -> (4, 6): inner_product_param.transpose is true, "
                                    "Linear's weight is (out, in)")
    assert rows["ip/0"]["torch_shape"] == [4, 6]
    assert rows["plain/0"]["done"] == "renamed"
    # compare --names torch transposes the same way: a port holding (N, K) is equal, one holding (K, N) is not.
    save_file(got, tmp_path / "port.safetensors")
    assert run_blobtool("compare", "-q", "--names", "torch", net, tmp_path / "port.safetensors").returncode == 0
    got["sq.weight"] = np.ascontiguousarray(got["sq.weight"].T)
    save_file(got, tmp_path / "wrong.safetensors")
    result = run_blobtool("compare", "--json", "--names", "torch", net, tmp_path / "wrong.safetensors", text=True)
    assert result.returncode == 1
    assert [b["name"] for b in json.loads(result.stdout)["blobs"] if not b["equal"]] == ["sq.weight"]


def test_a_shared_prelu_slope_and_a_two_bottom_scale(tmp_path):
    layers = [Layer("prelu", "PReLU", [blob_proto(np.float32(0.25), shape=())], bottom=["data"], top=["data"],
                    params=len_field(131, varint_field(2, 1))),
              Layer("scale", "Scale", [W["beta"]], bottom=["data", "gamma"], top=["out"],
                    params=len_field(142, varint_field(4, 1)))]
    net = write_net(tmp_path / "p.caffemodel", "new", layers)
    out = tmp_path / "p.safetensors"
    result = run_blobtool("convert", "--names", "torch", net, "-o", out, text=True)
    assert (result.returncode, warnings(result)) == (0, "")
    assert_exported(out, {"prelu.weight": np.array([0.25], np.float32), "scale.bias": W["beta"]})
    rows = {r["name"]: r for r in json.loads(run_blobtool("info", "--json", "--names", "torch", net,
                                                          text=True).stdout)["blobs"]}
    assert rows["prelu/0"]["done"] == ("reshaped () -> (1,) (a slope shared by all channels: "
                                       "PReLU(num_parameters=1))")
    assert rows["scale/0"]["done"] == "renamed; the Scale's scale is its second bottom: blob 0 is its bias"


# -- folding a Scale only into a BatchNorm it alone reads -----------------------------------------

def branch_layers(kind: str) -> list:
    """conv1 -> bn1, whose output a ReLU also reads: beside a separate Scale, or before an in-place one."""
    bn = Layer("bn1", "BatchNorm", [W["mean"], W["var"], np.array([FACTOR])], bottom=["conv1"],
               top=["bn1" if kind == "branch" else "conv1"])
    conv = Layer("conv1", "Convolution", [W["conv1"], W["conv1_b"]], bottom=["data"], top=["conv1"])
    if kind == "branch":
        return [conv, bn, Layer("relu1", "ReLU", bottom=["bn1"], top=["relu1"]),
                Layer("scale1", "Scale", [W["gamma"], W["beta"]], bottom=["bn1"], top=["scale1"])]
    return [conv, bn, Layer("relu1", "ReLU", bottom=["conv1"], top=["relu1"]),
            Layer("scale1", "Scale", [W["gamma"], W["beta"]], bottom=["conv1"], top=["conv1"]),
            Layer("pool", "Pooling", bottom=["conv1"], top=["pool"])]


@pytest.mark.parametrize("kind", ["branch", "in-place"])
def test_a_scale_is_folded_only_when_it_alone_reads_the_batchnorm(tmp_path, kind):
    net = write_net(tmp_path / "b.caffemodel", "new", branch_layers(kind))
    out = tmp_path / "b.safetensors"
    result = run_blobtool("convert", "--names", "torch", net, "-o", out, text=True)
    warning = (f"blobtool: warning: {net}: --names torch did not fold these Scale layers into the BatchNorm "
               "before them; each keeps its own name: scale1 (relu1 also reads bn1's output)\n")
    assert (result.returncode, warnings(result)) == (0, warning)
    expected = {k: EXPECTED[k] for k in ("conv1.weight", "conv1.bias", "bn1.running_mean", "bn1.running_var")}
    expected.update({"scale1.weight": W["gamma"], "scale1.bias": W["beta"]})
    assert_exported(out, expected)
    result = run_blobtool("info", "--json", "--names", "torch", net, text=True)
    assert result.stderr == warning
    rows = {r["name"]: r for r in json.loads(result.stdout)["blobs"]}
    assert rows["scale1/0"]["torch"] == "scale1.weight"
    assert rows["scale1/1"]["done"] == "renamed; not folded into bn1: relu1 also reads bn1's output"
    # The same chain with the ReLU after the in-place Scale folds (it reads the Scale's output).
    layers = branch_layers("in-place")
    layers[2], layers[3] = layers[3], layers[2]
    net = write_net(tmp_path / "c.caffemodel", "new", layers)
    result = run_blobtool("convert", "--names", "torch", net, "-o", out, text=True)
    assert (result.returncode, warnings(result)) == (0, "")
    assert load_file(out)["bn1.weight"].tobytes() == W["gamma"].tobytes()


def test_the_real_resnet_still_folds_every_scale(realworld):
    src = realworld / "resnet20_cifar10.caffemodel"
    result = run_blobtool("info", "--json", "--names", "torch", src, text=True)
    assert (result.returncode, warnings(result)) == (0, "")
    scales = [r for r in json.loads(result.stdout)["blobs"] if r["type"] == "Scale"]
    assert len(scales) == 42 and all(r["done"].startswith("folded into ") for r in scales)


# -- NVIDIA Caffe's BatchNorm with its own scale and bias -----------------------------------------

def test_nvidia_batchnorm_of_five_blobs(tmp_path):
    c = 4
    four_d = (1, c, 1, 1)
    layers = [Layer("conv1", "Convolution", [W["conv1"], W["conv1_b"]], bottom=["data"], top=["conv1"]),
              Layer("bn1", "BatchNorm", [W["mean"].reshape(four_d), W["var"].reshape(four_d), np.array([FACTOR]),
                                         W["gamma"].reshape(four_d), W["beta"]], bottom=["conv1"], top=["conv1"],
                    params=len_field(139, varint_field(1, 1))),
              Layer("scale1", "Scale", [W["gamma2"], W["beta2"]], bottom=["conv1"], top=["conv1"])]
    net = write_net(tmp_path / "nv.caffemodel", "new", layers)
    out = tmp_path / "nv.safetensors"
    result = run_blobtool("convert", "--names", "torch", net, "-o", out, text=True)
    warning = (f"blobtool: warning: {net}: --names torch did not fold these Scale layers into the BatchNorm "
               "before them; each keeps its own name: scale1 (bn1 holds its own scale and bias (NVIDIA Caffe's "
               "BatchNorm))\n")
    assert (result.returncode, warnings(result)) == (0, warning)
    expected = {k: EXPECTED[k] for k in ("conv1.weight", "conv1.bias", "bn1.running_mean", "bn1.running_var")}
    expected.update({"bn1.weight": W["gamma"], "bn1.bias": W["beta"], "scale1.weight": W["gamma2"],
                     "scale1.bias": W["beta2"]})
    assert_exported(out, expected)
    result = run_blobtool("info", "--json", "--names", "torch", net, text=True)
    assert result.stderr == warning
    rows = {r["name"]: r for r in json.loads(result.stdout)["blobs"]}
    assert rows["bn1/3"]["torch"] == "bn1.weight" and rows["bn1/4"]["torch"] == "bn1.bias"
    assert rows["bn1/3"]["done"] == "reshaped (1, 4, 1, 1) -> (4,) (NVIDIA Caffe's BatchNorm scale)"
    assert rows["bn1/4"]["done"] == "renamed (NVIDIA Caffe's BatchNorm bias)"
    assert rows["bn1/0"]["done"] == "divided by the factor 2.5 (bn1/2) in float64; reshaped (1, 4, 1, 1) -> (4,)"
    table = run_blobtool("info", "--names", "torch", "--blob", "bn1", net, text=True).stdout
    assert table.splitlines()[-3] == "  5 Caffe blobs, 4 PyTorch tensors"
    # A PyTorch port of it compares equal; one with the Scale's values in the BatchNorm does not.
    port = dict(expected, **{"bn1.num_batches_tracked": np.array(0, np.int64)})
    save_file(port, tmp_path / "port.safetensors")
    assert run_blobtool("compare", "-q", "--names", "torch", net, tmp_path / "port.safetensors").returncode == 0
    port["bn1.weight"] = W["gamma2"]
    save_file(port, tmp_path / "wrong.safetensors")
    result = run_blobtool("compare", "--json", "--names", "torch", tmp_path / "wrong.safetensors", net, text=True)
    assert result.returncode == 1
    assert [b["name"] for b in json.loads(result.stdout)["blobs"] if not b["equal"]] == ["bn1.weight"]
    # Five blobs whose scale does not hold one value per channel are bad input.
    layers[1] = Layer("bn1", "BatchNorm", [W["mean"], W["var"], np.array([FACTOR]), np.ones(3), W["beta"]])
    net = write_net(tmp_path / "bad.caffemodel", "new", layers)
    result = run_blobtool("info", "--names", "torch", net, text=True)
    assert result.returncode == 3 and result.stderr.count("\n") == 1 and "NVIDIA Caffe's holds 5" in result.stderr
