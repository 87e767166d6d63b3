"""blobtool fold on nets built here and on a real ResNet: the folded net computes what the net did.

Each net is run before and after folding by tests/helpers/layerforward.py (Caffe's
forward pass in numpy) on random input; the folded net must give the same
blobs to float32 rounding, keep every other layer byte for byte, and list
each BatchNorm it could not fold with the reason. Nets are run as Caffe's
TEST net, the one folded (include/exclude rules); a deploy definition given
apart is run with its own settings, before and after folding.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import layerforward as lf
from blobtool.formats.caffe import wire
from builders import (Layer, h5_net_bytes, len_field, pb, raw_blob_bytes, varint_field, write_h5, write_net)
from runner import assert_error, invoke, ok, run_blobtool

F32_EPS = float(np.finfo(np.float32).eps)
REALWORLD = Path(__file__).resolve().parents[3] / "shared" / "realworld"
RESNET = REALWORLD / "resnet20_cifar10.caffemodel"


# -- building nets ---------------------------------------------------------------------------

def conv_param(num_output, kernel, *, pad=0, stride=1, dilation=1, group=1, bias_term=None, axis=None) -> bytes:
    p = pb.ConvolutionParameter(num_output=num_output, kernel_size=[kernel], pad=[pad], stride=[stride],
                                dilation=[dilation], group=group)
    if bias_term is not None:
        p.bias_term = bias_term
    if axis is not None:
        p.axis = axis
    return len_field(106, p.SerializeToString())


def conv(name, bottom, top, weight, bias=None, *, kind="Convolution", extra=b"", **settings) -> Layer:
    """A Convolution (or Deconvolution) with its weight (and bias); bias_term false where it has none."""
    out = weight.shape[1] * settings.get("group", 1) if kind == "Deconvolution" else weight.shape[0]
    params = conv_param(out, weight.shape[-1], bias_term=None if bias is not None else False, **settings) + extra
    blobs = [weight] + ([bias] if bias is not None else [])
    return Layer(name, kind, blobs, bottom=[bottom], top=[top], params=params)


def inner_product(name, bottom, top, weight, bias=None, *, transpose=False) -> Layer:
    p = pb.InnerProductParameter(num_output=weight.shape[-1] if transpose else weight.shape[-2], transpose=transpose)
    if bias is None:
        p.bias_term = False
    blobs = [weight] + ([bias] if bias is not None else [])
    return Layer(name, "InnerProduct", blobs, bottom=[bottom], top=[top], params=len_field(117, p.SerializeToString()))


def batchnorm(name, bottom, top, rng, channels, *, eps=None, factor=999.98) -> Layer:
    mean = rng.standard_normal(channels) * factor
    var = (rng.random(channels) * 2 + 0.05) * factor
    params = b"" if eps is None else len_field(139, pb.BatchNormParameter(eps=eps).SerializeToString())
    return Layer(name, "BatchNorm", [np.float32(mean), np.float32(var), np.float32([factor])], bottom=[bottom],
                 top=[top], params=params)


def scale(name, bottom, top, rng, channels, *, beta=True, bottoms=None) -> Layer:
    blobs = [np.float32(rng.standard_normal(channels))] + ([np.float32(rng.standard_normal(channels))] if beta else [])
    params = len_field(142, pb.ScaleParameter(bias_term=beta).SerializeToString())
    return Layer(name, "Scale", blobs, bottom=bottoms or [bottom], top=[top], params=params)


def relu(name, bottom, top) -> Layer:
    return Layer(name, "ReLU", bottom=[bottom], top=[top])


def weights(rng, *shape, dtype=np.float32):
    return (rng.standard_normal(shape) * 0.5).astype(dtype)


def layer_bytes(path) -> dict:
    """{layer name: the bytes of its LayerParameter field} of a net file, in file order."""
    data = Path(path).read_bytes()
    buf = memoryview(data)
    out = {}
    for f in wire.iter_fields(buf, 0, len(data)):
        if f.number == 100:
            out[pb.LayerParameter.FromString(bytes(buf[f.start:f.end])).name] = bytes(buf[f.offset:f.end])
    return out


def parsed(path) -> pb.NetParameter:
    return pb.NetParameter.FromString(Path(path).read_bytes())


def assert_same_forward(before, after, feeds: dict, names) -> None:
    """The named blobs of the two nets agree to float32 rounding (relative to each blob's largest value)."""
    a = lf.run_net(before, feeds)
    b = lf.run_net(after, feeds)
    for name in names:
        scale_ = np.abs(a[name]).max()
        assert np.abs(a[name] - b[name]).max() <= 32 * F32_EPS * scale_, name


# -- a chain of every kind ------------------------------------------------------------------

def chain_net(tmp_path, rng) -> Path:
    """conv -> BN -> Scale (separate tops), grouped conv without bias -> BN alone (in place), grouped
    deconvolution -> BN -> Scale without beta (in place), transposed InnerProduct -> BN -> Scale."""
    layers = [
        conv("conv1", "in", "c1", weights(rng, 6, 3, 3, 3), weights(rng, 6), pad=1),
        batchnorm("bn1", "c1", "b1", rng, 6, eps=1e-3),
        scale("sc1", "b1", "s1", rng, 6),
        relu("relu1", "s1", "s1"),
        conv("conv2", "s1", "c2", weights(rng, 4, 3, 3, 3), None, group=2, pad=2, dilation=2),
        batchnorm("bn2", "c2", "c2", rng, 4),
        conv("deconv3", "c2", "d3", weights(rng, 4, 3, 2, 2), weights(rng, 6), kind="Deconvolution", group=2,
             stride=2),
        batchnorm("bn3", "d3", "d3", rng, 6),
        scale("sc3", "d3", "d3", rng, 6, beta=False),
        inner_product("ip4", "d3", "i4", weights(rng, 6 * 10 * 10, 5), weights(rng, 5), transpose=True),
        batchnorm("bn4", "i4", "i4", rng, 5),
        scale("sc4", "i4", "i4", rng, 5),
    ]
    return write_net(tmp_path / "chain.caffemodel", "new", layers)


def test_every_batchnorm_of_a_chain_folds_and_the_net_computes_the_same(tmp_path):
    rng = np.random.default_rng(7)
    net = chain_net(tmp_path, rng)
    before = net.read_bytes()
    out = tmp_path / "folded.caffemodel"
    result = ok("fold", net, "-o", out)
    assert result.stderr == ""
    assert result.stdout.splitlines() == [
        "conv1 <- bn1 + sc1", "conv2 <- bn2 (no Scale), bias created", "deconv3 <- bn3 + sc3", "ip4 <- bn4 + sc4",
        f"{net}: 4 BatchNorm folded, 0 kept; 12 layers -> 5"]
    assert net.read_bytes() == before
    folded = parsed(out)
    assert [(l.name, l.type, list(l.bottom), list(l.top)) for l in folded.layer] == [
        ("conv1", "Convolution", ["in"], ["s1"]), ("relu1", "ReLU", ["s1"], ["s1"]),
        ("conv2", "Convolution", ["s1"], ["c2"]), ("deconv3", "Deconvolution", ["c2"], ["d3"]),
        ("ip4", "InnerProduct", ["d3"], ["i4"])]
    conv2 = folded.layer[2]
    assert conv2.convolution_param.bias_term and [tuple(b.shape.dim) for b in conv2.blobs] == [(4, 3, 3, 3), (4,)]
    assert layer_bytes(out)["relu1"] == layer_bytes(net)["relu1"]
    x = rng.standard_normal((2, 3, 5, 5))
    assert_same_forward(net, out, {"in": x}, ["s1", "c2", "d3", "i4"])


def test_the_json_record_says_what_was_folded(tmp_path):
    net = chain_net(tmp_path, np.random.default_rng(1))
    record = json.loads(ok("fold", net, "--json", "-o", tmp_path / "out.caffemodel").stdout)
    assert record["layers"] == {"before": 12, "after": 5} and record["kept"] == []
    assert record["folded"][1] == {"layer": "conv2", "type": "Convolution", "batchnorm": "bn2", "scale": None,
                                   "top": "c2", "bias_created": True}
    assert record["folded"][0]["top"] == "s1"


def folded_definition_matches(binary, text_path) -> pb.NetParameter:
    """The .prototxt written, parsed as Caffe reads it; it must equal the definition the folded .caffemodel holds."""
    from google.protobuf import text_format

    from blobtool import net_definition

    written = text_format.Parse(Path(text_path).read_text(), pb.NetParameter())
    assert net_definition(str(binary)).net == written
    return written


def test_a_prototxt_output_is_the_folded_nets_definition(tmp_path):
    net = chain_net(tmp_path, np.random.default_rng(13))
    out, text = tmp_path / "out.caffemodel", tmp_path / "deploy.prototxt"
    result = ok("fold", net, "-o", out, "-o", text)
    assert result.stderr == "" and "4 BatchNorm folded" in result.stdout
    written = folded_definition_matches(out, text)
    assert [(l.name, list(l.top)) for l in written.layer] == [
        ("conv1", ["s1"]), ("relu1", ["s1"]), ("conv2", ["c2"]), ("deconv3", ["d3"]), ("ip4", ["i4"])]
    assert written.layer[2].convolution_param.bias_term and written.layer[0].convolution_param.pad == [1]
    assert not any(layer.blobs for layer in written.layer)
    # Only the definition: the same text as from the folded net itself.
    ok("fold", net, "-o", tmp_path / "alone.prototxt")
    assert (tmp_path / "alone.prototxt").read_text() == text.read_text()
    converted = tmp_path / "converted.prototxt"
    ok("definition", out, "-o", converted)
    assert converted.read_text() == text.read_text()


def test_the_net_to_stdout_is_the_net_written_to_a_file(tmp_path):
    net = chain_net(tmp_path, np.random.default_rng(2))
    out = tmp_path / "out.caffemodel"
    ok("fold", net, "-o", out)
    done = run_blobtool("fold", net, "-o", "-")
    assert done.returncode == 0 and done.stderr == b""
    assert done.stdout == out.read_bytes()
    result = invoke("fold", net, "--json", "-o", "-")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("blobtool fold: --json prints to stdout") and result.stderr.count("\n") == 1


def test_the_output_may_be_the_input(tmp_path):
    rng = np.random.default_rng(3)
    net = chain_net(tmp_path, rng)
    copy = tmp_path / "copy.caffemodel"
    copy.write_bytes(net.read_bytes())
    ok("fold", copy, "-o", copy)
    ok("fold", net, "-o", tmp_path / "other.caffemodel")
    assert copy.read_bytes() == (tmp_path / "other.caffemodel").read_bytes()


# -- what stays, and why ------------------------------------------------------------------------

def _kept_cases(rng):
    w, b = weights(rng, 4, 3, 3, 3), weights(rng, 4)
    shared = len_field(6, pb.ParamSpec(name="shared_w").SerializeToString())
    return {
        "its input feeds another layer": (
            [conv("conv", "in", "c", w, b), batchnorm("bn", "c", "b", rng, 4), relu("relu", "c", "r")],
            "its input 'c' (from conv) also feeds relu"),
        "its input comes from another type": (
            [relu("relu", "in", "r"), batchnorm("bn", "r", "b", rng, 3)], "comes from relu (ReLU)"),
        "its input is the net's": ([batchnorm("bn", "in", "b", rng, 3)], "is a net input"),
        "its output feeds more than the Scale": (
            [conv("conv", "in", "c", w, b), batchnorm("bn", "c", "b", rng, 4), scale("sc", "b", "s", rng, 4),
             relu("relu", "b", "r")], "its output feeds relu besides the Scale sc"),
        "the Scale reads a second bottom": (
            [conv("conv", "in", "c", w, b), batchnorm("bn", "c", "b", rng, 4),
             scale("sc", "b", "s", rng, 4, bottoms=["b", "in"])], "takes its scale from a second bottom"),
        "the Scale scales another axis": (
            [conv("conv", "in", "c", w, b), batchnorm("bn", "c", "b", rng, 4),
             Layer("sc", "Scale", [np.float32(rng.standard_normal(4))], bottom=["b"], top=["s"],
                   params=len_field(142, pb.ScaleParameter(axis=2).SerializeToString()))], "axis 2"),
        "a layer between uses the new top": (
            [conv("conv", "in", "c", w, b), relu("relu", "in", "s"), batchnorm("bn", "c", "b", rng, 4),
             scale("sc", "b", "s", rng, 4)], "relu, between conv and sc, uses 's'"),
        "the weights are shared": (
            [conv("conv", "in", "c", w, b, extra=shared), batchnorm("bn", "c", "b", rng, 4),
             conv("conv2", "in", "c2", w, b, extra=shared)], "conv shares its weights with conv2 (param 'shared_w')"),
        "NVIDIA Caffe's BatchNorm": (
            [conv("conv", "in", "c", w, b),
             Layer("bn", "BatchNorm", [np.float32(np.ones(4))] * 2 + [np.float32([1])] + [np.float32(np.ones(4))] * 2,
                   bottom=["c"], top=["b"])], "5 blobs"),
        "another channel count": (
            [conv("conv", "in", "c", w, b), batchnorm("bn", "c", "b", rng, 3)], "computes 4 channels; it has 3"),
        "channels on another axis": (
            [conv("conv", "in", "c", w, b, axis=2), batchnorm("bn", "c", "b", rng, 4)], "axis 2"),
        "a layer of two tops": (
            [Layer("conv", "Convolution", [w, b], bottom=["in", "in2"], top=["c", "c2"],
                   params=conv_param(4, 3)), batchnorm("bn", "c", "b", rng, 4)], "has 2 tops"),
    }


@pytest.mark.parametrize("case", list(_kept_cases(np.random.default_rng(0))))
def test_a_batchnorm_that_cannot_fold_stays_with_why(tmp_path, case):
    layers, why = _kept_cases(np.random.default_rng(0))[case]
    net = write_net(tmp_path / "net.caffemodel", "new", layers)
    out = tmp_path / "out.caffemodel"
    result = ok("fold", net, "-o", out)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"blobtool: warning: {net}: BatchNorm bn stays: "), lines
    assert why in lines[0], (why, lines[0])
    assert result.stdout.splitlines()[-1].endswith("0 BatchNorm folded, 1 kept; "
                                                   f"{len(layers)} layers -> {len(layers)}")
    assert out.read_bytes() == net.read_bytes()


def test_only_the_batchnorm_that_can_fold_does(tmp_path):
    rng = np.random.default_rng(4)
    w, b = weights(rng, 4, 3, 3, 3), weights(rng, 4)
    layers = [conv("conv1", "in", "c1", w, b), batchnorm("bn1", "c1", "c1", rng, 4), relu("relu", "c1", "r"),
              conv("conv2", "in", "c2", w, b), batchnorm("bn2", "c2", "b2", rng, 4), relu("tap", "c2", "t")]
    net = write_net(tmp_path / "net.caffemodel", "new", layers)
    out = tmp_path / "out.caffemodel"
    result = ok("fold", net, "-o", out)
    assert "BatchNorm bn2 stays: its input 'c2' (from conv2) also feeds tap" in result.stderr
    assert [l.name for l in parsed(out).layer] == ["conv1", "relu", "conv2", "bn2", "tap"]
    before, after = layer_bytes(net), layer_bytes(out)
    assert all(after[name] == before[name] for name in ("relu", "conv2", "bn2", "tap"))
    assert_same_forward(net, out, {"in": rng.standard_normal((2, 3, 6, 6))}, ["c1", "r", "b2", "t"])


# -- what a folded layer keeps -------------------------------------------------------------------

def test_a_folded_layer_keeps_its_other_fields_byte_for_byte(tmp_path):
    rng = np.random.default_rng(5)
    unknown = varint_field(4243, 7) + len_field(6, pb.ParamSpec(lr_mult=1).SerializeToString())
    layers = [conv("conv", "in", "c", weights(rng, 4, 3, 3, 3), None, extra=unknown),
              batchnorm("bn", "c", "c", rng, 4), scale("sc", "c", "c", rng, 4)]
    net = write_net(tmp_path / "net.caffemodel", "new", layers)
    out = tmp_path / "out.caffemodel"
    ok("fold", net, "-o", out)
    layer = layer_bytes(out)["conv"]
    assert unknown in layer
    # Text cannot carry the unknown field: the .prototxt output says so.
    result = ok("fold", net, "-o", tmp_path / "out.prototxt")
    assert result.stderr.startswith(f"blobtool: warning: {net}: layer conv holds fields text cannot carry: 4243")
    folded = parsed(out).layer[0]
    assert folded.convolution_param.bias_term and len(folded.blobs) == 2
    # Read with Caffe's full LayerParameter: only the blobs and bias_term changed.
    original = parsed(net).layer[0]
    original.convolution_param.bias_term = True
    del original.blobs[:], folded.blobs[:]
    assert folded == original
    assert_same_forward(net, out, {"in": rng.standard_normal((1, 3, 5, 5))}, ["c"])


@pytest.mark.parametrize("form", ["half", "double", "legacy"])
def test_folded_values_are_stored_as_the_weights_were(tmp_path, form):
    from blobtool.formats import open_document

    rng = np.random.default_rng(6)
    w = weights(rng, 4, 3, 1, 1)
    if form == "half":
        layer = Layer("conv", "Convolution", [raw_blob_bytes(w.astype(np.float16))], bottom=["in"], top=["c"],
                      params=conv_param(4, 1, bias_term=False))
    else:
        layer = Layer("conv", "Convolution", [w], bottom=["in"], top=["c"], params=conv_param(4, 1, bias_term=False),
                      double=form == "double", legacy=form == "legacy")
    net = write_net(tmp_path / "net.caffemodel", "new", [layer, batchnorm("bn", "c", "c", rng, 4)])
    out = tmp_path / "out.caffemodel"
    ok("fold", net, "-o", out)
    with open_document(out) as doc:
        weight, bias = doc.entries
        dtype = {"half": np.float16, "double": np.float64, "legacy": np.float32}[form]
        assert weight.dtype == dtype and bias.dtype == dtype
        assert bias.layout == weight.layout == ("legacy" if form == "legacy" else "shape")
        assert bias.shape == ((1, 1, 1, 4) if form == "legacy" else (4,))
    if form != "half":
        assert_same_forward(net, out, {"in": rng.standard_normal((2, 3, 3, 3))}, ["c"])
        return
    # Rounded to float16 once, from float64: each stored value is the float16 nearest the exact one.
    mean_sums, var_sums, factor = layer_blobs(net, "bn")
    k = 1 / np.sqrt(var_sums.astype(np.float64) / factor[0] + np.float32(1e-5))
    weight, bias = layer_blobs(out, "conv")
    assert np.array_equal(weight, (w.astype(np.float16) * k[:, None, None, None]).astype(np.float16))
    assert np.array_equal(bias, (-mean_sums.astype(np.float64) / factor[0] * k).astype(np.float16))


def layer_blobs(path, name):
    from blobtool.formats import open_document

    with open_document(path) as doc:
        return [np.array(e.blob().cpu_data()).reshape(e.shape) for e in doc.entries if e.layer == name]


def test_values_past_the_stored_range_are_warned_about(tmp_path):
    w = np.float16([60000, np.nan]).reshape(2, 1, 1, 1)  # the NaN was there before: not counted
    layer = Layer("conv", "Convolution", [raw_blob_bytes(w)], bottom=["in"], top=["c"],
                  params=conv_param(2, 1, bias_term=False))
    bn = Layer("bn", "BatchNorm", [np.float32([0, 0]), np.float32([1e-4, 1]), np.float32([1])], bottom=["c"],
               top=["c"])
    sc = Layer("sc", "Scale", [np.float32([1, 1])], bottom=["c"], top=["c"])
    net = write_net(tmp_path / "net.caffemodel", "new", [layer, bn, sc])
    result = ok("fold", net, "-o", tmp_path / "out.caffemodel")
    assert result.stderr.splitlines() == [
        f"blobtool: warning: {net}: layer conv: 1 of 2 values of its folded weight are Inf or NaN (past float16's "
        "range, or a variance below -eps)"]


# -- what fold refuses ---------------------------------------------------------------------------

def test_fold_refuses_what_is_not_a_net_of_todays_format(tmp_path):
    rng = np.random.default_rng(9)
    v1 = write_net(tmp_path / "v1.caffemodel", "v1", [Layer("conv", "Convolution", [weights(rng, 2, 1, 1, 1)])])
    assert_error(invoke("fold", v1, "-o", tmp_path / "o.caffemodel"), 2, "V1 net", "no BatchNorm type")
    h5 = write_h5(tmp_path / "net.caffemodel.h5", h5_net_bytes([("conv", [weights(rng, 2, 1, 1, 1)])]))
    assert_error(invoke("fold", h5, "-o", tmp_path / "o.caffemodel"), 2, "HDF5 snapshots hold none")
    blob = tmp_path / "x.pb"
    blob.write_bytes(pb.BlobProto(data=[1.0]).SerializeToString())
    assert_error(invoke("fold", blob, "-o", tmp_path / "o.caffemodel"), 2, "fold rewrites a net")
    net = chain_net(tmp_path, rng)
    assert_error(invoke("fold", net, "-o", tmp_path / "o.npz"), 2, "Caffe's protobuf", ".prototxt")
    text = tmp_path / "net.prototxt"
    ok("definition", net, "-o", text)
    assert_error(invoke("fold", text, "-o", tmp_path / "o.caffemodel"), 2, "without weights", "fold the .caffemodel")
    result = invoke("fold", net, "-o", "-", "-o", "-")
    assert result.exit_code == 2 and "can be written only once" in result.stderr
    truncated = tmp_path / "cut.caffemodel"
    truncated.write_bytes(net.read_bytes()[:-100])
    assert_error(invoke("fold", truncated, "-o", tmp_path / "o.caffemodel"), 3, str(truncated))
    assert not any(p.name.startswith("o.") for p in tmp_path.iterdir())


def test_fold_in_a_real_process(tmp_path):
    net = chain_net(tmp_path, np.random.default_rng(10))
    done = run_blobtool("fold", net, "-o", tmp_path / "out.caffemodel", text=True)
    assert done.returncode == 0 and done.stderr == "" and "4 BatchNorm folded" in done.stdout


# -- a real net ----------------------------------------------------------------------------------

@pytest.mark.skipif(not RESNET.exists(), reason=f"{RESNET} is absent (a clone without ../shared/realworld)")
def test_resnet20_folded_computes_what_it_did(tmp_path):
    out = tmp_path / "resnet20_folded.caffemodel"
    result = ok("fold", RESNET, "-o", out, "-o", tmp_path / "resnet20_folded.prototxt")
    folded_definition_matches(out, tmp_path / "resnet20_folded.prototxt")
    # Its definition given apart (as a deploy.prototxt would be) folds to the same text.
    ok("definition", RESNET, "-o", tmp_path / "resnet20.prototxt")
    apart = ok("fold", RESNET, "--definition", tmp_path / "resnet20.prototxt", "-o", tmp_path / "apart.prototxt")
    assert (tmp_path / "apart.prototxt").read_text() == (tmp_path / "resnet20_folded.prototxt").read_text()
    # Given apart, it is the net that runs: its BatchNorm layers' own phase: TRAIN is said.
    assert apart.stderr.splitlines() == [
        f"blobtool: warning: {tmp_path / 'resnet20.prototxt'}: BatchNorm "
        f"{', '.join(f'BatchNorm{i}' for i in range(1, 9))} and 13 more set phase: TRAIN of their own, with which "
        "Caffe normalizes by each batch's statistics; folded with the stored ones, as the TEST phase computes"]
    assert result.stderr == ""
    assert result.stdout.splitlines()[-1] == f"{RESNET}: 21 BatchNorm folded, 0 kept; 104 layers -> 62"
    before, after = layer_bytes(RESNET), layer_bytes(out)
    assert not any(l.type in ("BatchNorm", "Scale") for l in parsed(out).layer)
    changed = {name for name in after if after[name] != before[name]}
    assert changed == {f"Convolution{i}" for i in range(1, 22)}
    assert list(after) == [name for name in before if not name.startswith(("BatchNorm", "Scale"))]
    # Read with Caffe's full LayerParameter, a folded layer differs in its blobs' values only.
    for a, b in zip([l for l in parsed(RESNET).layer if l.name in changed], [l for l in parsed(out).layer
                                                                            if l.name in changed]):
        assert [tuple(x.shape.dim) for x in a.blobs] == [tuple(x.shape.dim) for x in b.blobs]
        del a.blobs[:], b.blobs[:]
        assert a == b
    x = np.random.default_rng(11).standard_normal((2, 3, 32, 32))
    names = [name for name in lf.run_net(out, {"Data1": x}) if name != "Data1"]
    assert "InnerProduct1" in names and "Eltwise9" in names
    assert_same_forward(RESNET, out, {"Data1": x}, names)


def test_fold_help_is_one_sentence_then_the_rules_and_an_example():
    result = ok("fold", "--help")
    assert result.stdout.startswith("Usage: blobtool fold [OPTIONS] NET")
    flat = " ".join(result.stdout.split())
    assert "Fold each BatchNorm, and the Scale after it, into the Convolution, Deconvolution or InnerProduct " \
           "before it." in flat
    assert "W' = W * gamma / sqrt(var + eps)" in flat and "Example:" in result.stdout
    assert "blobtool fold resnet.caffemodel -o resnet_folded.caffemodel" in result.stdout
    assert "\n  fold " in ok("--help").stdout


def test_names_from_the_file_are_escaped_where_they_are_printed(tmp_path):
    rng = np.random.default_rng(12)
    hostile = "conv\x1b]0;title\x07"
    layers = [conv(hostile, "in", "c", weights(rng, 4, 3, 1, 1), weights(rng, 4)),
              batchnorm("bn\u202e", "c", "c", rng, 4), relu("tap\x1b[2J", "in", "t"),
              batchnorm("bn2", "t", "t", rng, 3)]
    net = write_net(tmp_path / "net.caffemodel", "new", layers)
    result = ok("fold", net, "-o", tmp_path / "out.caffemodel")
    assert "\x1b" not in result.stdout + result.stderr and "\u202e" not in result.stdout + result.stderr
    assert "conv\\x1b]0;title\\x07 <- bn\\u202e (no Scale)" in result.stdout
    assert "comes from tap\\x1b[2J (ReLU)" in result.stderr


# -- another definition of the same net (a deploy.prototxt) -------------------------------------

def deploy_of(tmp_path, net, edit) -> Path:
    """The net's own definition as text, changed by `edit(NetParameter)`, as a deploy.prototxt."""
    from google.protobuf import text_format

    text = tmp_path / "net_definition.prototxt"
    ok("definition", net, "-o", text)
    message = text_format.Parse(text.read_text(), pb.NetParameter())
    edit(message)
    deploy = tmp_path / "deploy.prototxt"
    deploy.write_text(text_format.MessageToString(message))
    return deploy


def _as_deploy(message):
    message.name = "deploy"
    message.input.append("in")
    message.input_shape.add(dim=[1, 3, 5, 5])
    next(l for l in message.layer if l.name == "relu1").relu_param.negative_slope = 0.5
    message.layer.add(name="prob", type="Softmax", bottom=["i4"], top=["prob"])


def test_a_deploy_definition_is_folded_as_the_net_was(tmp_path):
    from google.protobuf import text_format

    net = chain_net(tmp_path, np.random.default_rng(14))
    deploy = deploy_of(tmp_path, net, _as_deploy)
    out = tmp_path / "folded_deploy.prototxt"
    result = ok("fold", net, "--definition", deploy, "-o", tmp_path / "folded.caffemodel", "-o", out)
    assert result.stderr == "" and "4 BatchNorm folded" in result.stdout
    written = text_format.Parse(out.read_text(), pb.NetParameter())
    assert written.name == "deploy" and list(written.input) == ["in"]
    assert [(l.name, list(l.top)) for l in written.layer] == [
        ("conv1", ["s1"]), ("relu1", ["s1"]), ("conv2", ["c2"]), ("deconv3", ["d3"]), ("ip4", ["i4"]),
        ("prob", ["prob"])]
    assert written.layer[1].relu_param.negative_slope == 0.5 and written.layer[2].convolution_param.bias_term
    # The folded net's own definition, with the deploy's changes: nothing else differs.
    own = parsed(tmp_path / "folded.caffemodel")
    for layer in own.layer:
        del layer.blobs[:]
    _as_deploy(own)
    assert own == written


@pytest.mark.parametrize("edit, why", [
    (lambda m: m.layer.remove(next(l for l in m.layer if l.name == "sc1")), "it has no layer sc1"),
    (lambda m: next(l for l in m.layer if l.name == "bn1").bottom.__setitem__(0, "in"),
     "its bn1 does not read conv1's output alone"),
    (lambda m: m.layer.add(name="tap", type="ReLU", bottom=["b1"], top=["t"]),
     "its bn1's output does not feed sc1 alone"),
    (lambda m: setattr(next(l for l in m.layer if l.name == "sc3"), "type", "Bias"), "its layer sc3 is a Bias"),
], ids=["a layer missing", "wired from elsewhere", "read by another layer", "another type"])
def test_a_deploy_definition_wired_otherwise_is_refused(tmp_path, edit, why):
    net = chain_net(tmp_path, np.random.default_rng(15))
    deploy = deploy_of(tmp_path, net, edit)
    out, binary = tmp_path / "folded_deploy.prototxt", tmp_path / "folded.caffemodel"
    line = assert_error(invoke("fold", net, "--definition", deploy, "-o", binary, "-o", out), 2, str(deploy), why)
    assert "folded weights would compute something else" in line
    assert not out.exists() and not binary.exists()


def test_a_definition_needs_a_prototxt_output(tmp_path):
    net = chain_net(tmp_path, np.random.default_rng(16))
    deploy = deploy_of(tmp_path, net, lambda m: None)
    assert_error(invoke("fold", net, "--definition", deploy, "-o", tmp_path / "out.caffemodel"), 2,
                 "written to a .prototxt output")
    assert not (tmp_path / "out.caffemodel").exists()


# -- the definition given is the net that runs: its settings ------------------------------------

def _set_eps(message):
    _as_deploy(message)
    for layer in message.layer:
        if layer.name in ("bn1", "bn2"):
            layer.batch_norm_param.eps = 0.5


def test_a_definitions_eps_is_the_one_folded_with_and_said(tmp_path):
    rng = np.random.default_rng(17)
    net = chain_net(tmp_path, rng)
    deploy = deploy_of(tmp_path, net, _set_eps)
    binary, out = tmp_path / "folded.caffemodel", tmp_path / "folded_deploy.prototxt"
    result = ok("fold", net, "--definition", deploy, "-o", binary, "-o", out)
    assert result.stderr.splitlines() == [
        f"blobtool: warning: {deploy}: folded with this definition's batch_norm_param.eps, not {net}'s: "
        "bn1 0.5 (not 0.001), bn2 0.5 (not 1e-05)"]
    assert "4 BatchNorm folded" in result.stdout
    # The deploy net run with its own eps, and the folded deploy net run with the folded weights, agree.
    x = {"in": rng.standard_normal((2, 3, 5, 5))}
    before = lf.run_net(net, x, definition=deploy)
    after = lf.run_net(binary, x, definition=out)
    for name in ("s1", "c2", "d3", "i4"):
        assert np.abs(before[name] - after[name]).max() <= 32 * F32_EPS * np.abs(before[name]).max(), name
    # With the net's own eps the folded values would differ from what the deploy net computes.
    own = lf.run_net(net, x)
    assert np.abs(own["s1"] - before["s1"]).max() > 0.01 * np.abs(before["s1"]).max()


def test_the_folded_weight_is_the_one_the_definitions_eps_gives(tmp_path):
    conv_ = Layer("conv", "Convolution", [np.float32([[[[1.0]]]])], bottom=["in"], top=["c"],
                  params=conv_param(1, 1, bias_term=False))
    bn = Layer("bn", "BatchNorm", [np.float32([0]), np.float32([1]), np.float32([1])], bottom=["c"], top=["c"])
    net = write_net(tmp_path / "net.caffemodel", "new", [conv_, bn])
    deploy = deploy_of(tmp_path, net, lambda m: setattr(m.layer[1].batch_norm_param, "eps", 0.5))
    binary = tmp_path / "folded.caffemodel"
    ok("fold", net, "--definition", deploy, "-o", binary, "-o", tmp_path / "folded.prototxt")
    weight, bias = layer_blobs(binary, "conv")
    assert weight.reshape(-1)[0] == np.float32(1 / np.sqrt(1.5)) and bias.tolist() == [0.0]  # 0.8165, not 0.999995


def _edit(name, path, value):
    """An edit of a deploy definition: layer `name`'s field at `path` ("scale_param.axis") set to `value`."""
    def edit(message):
        layer = next(l for l in message.layer if l.name == name)
        *holders, field_name = path.split(".")
        for holder in holders:
            layer = getattr(layer, holder)
        setattr(layer, field_name, value)
    return edit


@pytest.mark.parametrize("edit, batchnorm, why", [
    (_edit("sc1", "scale_param.axis", 2), "bn1", "the Scale after it, sc1, has axis 2 and num_axes 1 in {deploy}: "
                                                 "not one value per channel"),
    (_edit("sc3", "scale_param.num_axes", 2), "bn3", "has axis 1 and num_axes 2 in {deploy}"),
    (_edit("sc1", "scale_param.bias_term", False), "bn1",
     "the Scale after it, sc1, has bias_term: false in {deploy} and holds 2 blobs"),
    (_edit("bn2", "batch_norm_param.use_global_stats", False), "bn2",
     "{deploy} sets use_global_stats: false for it"),
    (_edit("ip4", "inner_product_param.transpose", False), "bn4",
     "ip4's weight (600, 5) (transpose false in {deploy}) computes 600 channels; it has 5"),
    (_edit("deconv3", "convolution_param.group", 1), "bn3",
     "deconv3's weight (4, 3, 2, 2) (group 1 in {deploy}) computes 3 channels; it has 6"),
    (_edit("conv1", "convolution_param.axis", 2), "bn1", "conv1 computes its channels on axis 2 in {deploy}"),
    (_edit("conv1", "convolution_param.bias_term", False), "bn1",
     "conv1 has bias_term: false in {deploy} and holds 2 blobs"),
], ids=["Scale axis", "Scale num_axes", "Scale bias_term", "use_global_stats", "transpose", "group", "layer axis",
        "layer bias_term"])
def test_a_definitions_setting_that_leaves_no_fold_keeps_the_batchnorm(tmp_path, edit, batchnorm, why):
    net = chain_net(tmp_path, np.random.default_rng(18))
    deploy = deploy_of(tmp_path, net, edit)
    binary, out = tmp_path / "folded.caffemodel", tmp_path / "folded_deploy.prototxt"
    result = ok("fold", net, "--definition", deploy, "-o", binary, "-o", out)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"blobtool: warning: {net}: BatchNorm {batchnorm} stays: "), lines
    assert why.format(deploy=deploy) in lines[0], (why, lines[0])
    assert "3 BatchNorm folded, 1 kept" in result.stdout
    from google.protobuf import text_format

    written = text_format.Parse(out.read_text(), pb.NetParameter())
    names = [l.name for l in written.layer]
    assert batchnorm in names and batchnorm in [l.name for l in parsed(binary).layer]
    assert layer_bytes(binary)[batchnorm] == layer_bytes(net)[batchnorm]


def test_a_definitions_setting_that_allows_a_fold_the_nets_own_does_not_is_used(tmp_path):
    rng = np.random.default_rng(19)
    sc = Layer("sc", "Scale", [np.float32(rng.standard_normal(4))], bottom=["b"], top=["b"],
               params=len_field(142, pb.ScaleParameter(axis=2).SerializeToString()))
    layers = [conv("conv", "in", "c", weights(rng, 4, 3, 3, 3), weights(rng, 4)), batchnorm("bn", "c", "b", rng, 4),
              sc]
    net = write_net(tmp_path / "net.caffemodel", "new", layers)
    assert "axis 2 and num_axes 1: not one value per channel" in ok("fold", net, "-o", tmp_path / "own").stderr
    deploy = deploy_of(tmp_path, net, _edit("sc", "scale_param.axis", 1))
    binary, out = tmp_path / "folded.caffemodel", tmp_path / "folded_deploy.prototxt"
    result = ok("fold", net, "--definition", deploy, "-o", binary, "-o", out)
    assert result.stderr.splitlines() == [
        f"blobtool: warning: {deploy}: folded with this definition's scale_param.axis, not {net}'s: sc 1 (not 2)"]
    x = {"in": rng.standard_normal((1, 3, 5, 5))}
    before, after = lf.run_net(net, x, definition=deploy)["b"], lf.run_net(binary, x, definition=out)["b"]
    assert np.abs(before - after).max() <= 32 * F32_EPS * np.abs(before).max()


# -- the TEST net is the one folded: include and exclude rules -------------------------------------

def ruled(layer: Layer, *, include=(), exclude=()) -> Layer:
    """`layer` with include/exclude rules (NetStateRule messages) added."""
    for number, rules in ((8, include), (9, exclude)):
        for rule in rules:
            layer.params += len_field(number, rule.SerializeToString())
    return layer


TRAIN_ONLY, TEST_ONLY = pb.NetStateRule(phase=0), pb.NetStateRule(phase=1)


def test_a_train_only_batchnorm_stays_and_its_test_twin_folds(tmp_path):
    rng = np.random.default_rng(20)
    layers = [conv("conv1", "in", "c1", weights(rng, 4, 3, 3, 3), weights(rng, 4)),
              ruled(batchnorm("bn_train", "c1", "c1", rng, 4), include=[TRAIN_ONLY]),
              ruled(batchnorm("bn_test", "c1", "c1", rng, 4), include=[TEST_ONLY]),
              scale("sc", "c1", "c1", rng, 4), relu("relu", "c1", "c1")]
    net = write_net(tmp_path / "net.caffemodel", "new", layers)
    out = tmp_path / "out.caffemodel"
    result = ok("fold", net, "-o", out)
    assert result.stderr.splitlines() == [
        f"blobtool: warning: {net}: BatchNorm bn_train stays: it is not in the TEST net (the one deployed), by its "
        "include { phase: TRAIN }"]
    assert result.stdout.splitlines() == ["conv1 <- bn_test + sc", f"{net}: 1 BatchNorm folded, 1 kept; 5 layers -> 3"]
    assert [l.name for l in parsed(out).layer] == ["conv1", "bn_train", "relu"]
    assert layer_bytes(out)["bn_train"] == layer_bytes(net)["bn_train"]
    # The TEST net normalizes once, as it did.
    assert_same_forward(net, out, {"in": rng.standard_normal((2, 3, 6, 6))}, ["c1"])


def test_a_train_only_reader_neither_blocks_nor_takes_a_fold(tmp_path):
    rng = np.random.default_rng(21)
    w, b = weights(rng, 4, 3, 3, 3), weights(rng, 4)
    shared = len_field(6, pb.ParamSpec(name="shared_w").SerializeToString())
    layers = [conv("conv", "in", "c", w, b, extra=shared),
              ruled(relu("tap", "c", "t"), exclude=[TEST_ONLY]),
              batchnorm("bn", "c", "b", rng, 4), scale("sc", "b", "s", rng, 4),
              ruled(relu("tap2", "b", "t2"), include=[TRAIN_ONLY]),
              ruled(conv("conv_train", "in", "ct", w, b, extra=shared), include=[TRAIN_ONLY])]
    net = write_net(tmp_path / "net.caffemodel", "new", layers)
    out = tmp_path / "out.caffemodel"
    result = ok("fold", net, "-o", out, "-o", tmp_path / "out.prototxt")
    assert result.stderr == "" and result.stdout.splitlines()[0] == "conv <- bn + sc"
    assert [l.name for l in parsed(out).layer] == ["conv", "tap", "tap2", "conv_train"]
    assert all(layer_bytes(out)[name] == layer_bytes(net)[name] for name in ("tap", "tap2", "conv_train"))
    assert_same_forward(net, out, {"in": rng.standard_normal((2, 3, 6, 6))}, ["s"])


def test_a_train_only_scale_stays_and_its_batchnorm_folds_alone(tmp_path):
    rng = np.random.default_rng(22)
    layers = [conv("conv", "in", "c", weights(rng, 4, 3, 3, 3), weights(rng, 4)), batchnorm("bn", "c", "b", rng, 4),
              ruled(scale("sc_train", "b", "s", rng, 4), include=[TRAIN_ONLY])]
    net = write_net(tmp_path / "net.caffemodel", "new", layers)
    out = tmp_path / "out.caffemodel"
    result = ok("fold", net, "-o", out, "--json")
    assert result.stderr.splitlines() == [
        f"blobtool: warning: {net}: Scale sc_train stays: it is not in the TEST net (the one deployed), by its "
        "include { phase: TRAIN }"]
    record = json.loads(result.stdout)
    assert [(f["batchnorm"], f["scale"], f["top"]) for f in record["folded"]] == [("bn", None, "b")]
    assert record["kept_scales"] == [{"scale": "sc_train", "why": "it is not in the TEST net (the one deployed), by "
                                                                  "its include { phase: TRAIN }"}]
    assert [l.name for l in parsed(out).layer] == ["conv", "sc_train"]
    assert_same_forward(net, out, {"in": rng.standard_normal((2, 3, 6, 6))}, ["b"])


def test_a_snapshots_phase_field_on_every_layer_is_no_rule(tmp_path):
    rng = np.random.default_rng(23)
    layers = [conv("conv", "in", "c", weights(rng, 4, 3, 3, 3), weights(rng, 4)), batchnorm("bn", "c", "c", rng, 4),
              scale("sc", "c", "c", rng, 4)]
    for layer in layers:
        layer.params += varint_field(10, 0)  # LayerParameter.phase: TRAIN, as Caffe's snapshot writes it
    net = write_net(tmp_path / "net.caffemodel", "new", layers)
    result = ok("fold", net, "-o", tmp_path / "out.caffemodel")
    assert result.stderr == "" and "1 BatchNorm folded, 0 kept" in result.stdout


def test_stages_and_levels_decide_as_in_caffes_test_net(tmp_path):
    rng = np.random.default_rng(24)
    layers = [conv("conv", "in", "c", weights(rng, 4, 3, 3, 3), weights(rng, 4)),
              ruled(batchnorm("bn_deep", "c", "c", rng, 4), include=[pb.NetStateRule(min_level=1)]),
              ruled(batchnorm("bn_staged", "c", "c", rng, 4), include=[pb.NetStateRule(stage=["deploy"])]),
              ruled(batchnorm("bn", "c", "c", rng, 4), exclude=[pb.NetStateRule(stage=["deploy"])])]
    net = write_net(tmp_path / "net.caffemodel", "new", layers)
    result = ok("fold", net, "-o", tmp_path / "out.caffemodel")
    assert result.stdout.splitlines()[0] == "conv <- bn (no Scale)"
    assert "BatchNorm bn_deep stays: it is not in the TEST net (the one deployed), by its include { min_level: 1 }" \
        in result.stderr
    assert 'BatchNorm bn_staged stays: it is not in the TEST net (the one deployed), by its include { stage: ' \
           '"deploy" }' in result.stderr
    # The net's own state names the stage "deploy": Caffe's TEST net keeps it.
    staged = tmp_path / "staged.caffemodel"
    staged.write_bytes(net.read_bytes() + len_field(6, pb.NetState(stage=["deploy"]).SerializeToString()))
    result = ok("fold", staged, "-o", tmp_path / "out2.caffemodel")
    assert result.stdout.splitlines()[0] == "conv <- bn_staged (no Scale)"
    assert "BatchNorm bn stays: it is not in the TEST net (the one deployed), by its exclude { stage: " \
           '"deploy" }' in result.stderr


def test_a_layer_with_include_and_exclude_rules_or_a_rule_that_is_no_rule_is_refused(tmp_path):
    rng = np.random.default_rng(25)
    layers = [conv("conv", "in", "c", weights(rng, 4, 3, 3, 3), weights(rng, 4)),
              ruled(batchnorm("bn", "c", "c", rng, 4), include=[TEST_ONLY], exclude=[TRAIN_ONLY])]
    net = write_net(tmp_path / "net.caffemodel", "new", layers)
    out = tmp_path / "out.caffemodel"
    assert_error(invoke("fold", net, "-o", out), 3, str(net), "layer 'bn' has both include and exclude rules")
    bn = batchnorm("bn", "c", "c", rng, 4)
    bn.params += len_field(8, b"\x0a\x05ab")  # a stage string of 5 bytes where 2 remain
    forged = write_net(tmp_path / "forged.caffemodel", "new", [layers[0], bn])
    assert_error(invoke("fold", forged, "-o", out), 3, str(forged), "an include rule of layer 'bn' (field 8) is not a NetStateRule")
    assert not out.exists()


def test_a_definition_folds_in_its_test_net(tmp_path):
    net = chain_net(tmp_path, np.random.default_rng(26))

    def train_only_tap(message):
        _as_deploy(message)
        tap = message.layer.add(name="tap", type="ReLU", bottom=["c1"], top=["t"])
        tap.include.add(phase=0)

    deploy = deploy_of(tmp_path, net, train_only_tap)
    out = tmp_path / "folded_deploy.prototxt"
    result = ok("fold", net, "--definition", deploy, "-o", tmp_path / "folded.caffemodel", "-o", out)
    assert result.stderr == "" and "4 BatchNorm folded" in result.stdout
    from google.protobuf import text_format

    written = text_format.Parse(out.read_text(), pb.NetParameter())
    assert [l.name for l in written.layer][-1] == "tap" and written.layer[-1].include[0].phase == 0

    def train_only_batchnorm(message):
        next(l for l in message.layer if l.name == "bn1").include.add(phase=0)

    deploy = deploy_of(tmp_path, net, train_only_batchnorm)
    binary = tmp_path / "refused.caffemodel"
    line = assert_error(invoke("fold", net, "--definition", deploy, "-o", binary, "-o", out), 2, str(deploy),
                        "its layer bn1: it is not in the TEST net (the one deployed), by its include { phase: TRAIN }")
    assert "folded weights would compute something else" in line and not binary.exists()


# -- a layer type of a fork: one row of the table -----------------------------------------------

def test_the_forks_depthwise_convolution_folds_as_a_convolution(tmp_path):
    # The forks' depthwise convolution computes as a Convolution with group = channels: its row
    # folds as Convolution does, so a MobileNet's BatchNorm after it folds (it used to stay), with
    # the settings and folded values a Convolution of the same parameters gets.
    def net(kind, path):
        rng = np.random.default_rng(11)
        layers = [conv("dw1", "in", "c1", weights(rng, 4, 1, 3, 3), weights(rng, 4), kind=kind, group=4, pad=1),
                  batchnorm("bn1", "c1", "c1", rng, 4), scale("sc1", "c1", "c1", rng, 4)]
        return write_net(tmp_path / path, "new", layers)

    depthwise, plain = net("ConvolutionDepthwise", "dw.caffemodel"), net("Convolution", "conv.caffemodel")
    folds = ok("fold", depthwise, "-o", tmp_path / "dw_folded.caffemodel", "--check", "--input-shape", "in=1,4,5,5")
    assert folds.stdout.splitlines()[0] == "dw1 <- bn1 + sc1" and "check: " in folds.stderr
    ok("fold", plain, "-o", tmp_path / "conv_folded.caffemodel")
    folded, expected = parsed(tmp_path / "dw_folded.caffemodel"), parsed(tmp_path / "conv_folded.caffemodel")
    assert [layer.name for layer in folded.layer] == [layer.name for layer in expected.layer] == ["dw1"]
    assert folded.layer[0].type == "ConvolutionDepthwise"
    folded.layer[0].type = "Convolution"
    assert folded.layer[0] == expected.layer[0]  # settings, top, bias_term and folded blobs alike
    # ... and the message names the types from the table.
    kept = json.loads(ok("fold", net("Pooling", "pool.caffemodel"), "--json", "-o", tmp_path / "p.caffemodel").stdout)
    assert kept["kept"][0]["why"].endswith("not a Convolution, ConvolutionDepthwise, Deconvolution or InnerProduct")
