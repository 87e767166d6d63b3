"""blobtool export writes valid ONNX by construction, in time linear in the net, onto any output, in its own words.

- Names: a layer working in place on the net's input, Caffe blobs named as
  export names its own values ("x:c", "c/0"), names that are not UTF-8
  (surrogateescape's lone surrogates, a file name's bytes): every model
  passes onnx's full check with each name assigned once (tests/helpers/onnxvalid.py,
  autouse here), computes what `blobtool run` computes, and the names
  that changed are said on stderr and listed by --json.
- Convolution and Deconvolution with dilation 0, which Caffe computes
  (every tap of that axis reads the same place) and ONNX refuses: written
  with the taps summed, equal to Caffe's im2col arithmetic done here by hand
  and to real Caffe's forward (tests/helpers/caffeoracle.py, marked caffe).
- A FIFO as -o: the model goes through in one pass (no tell()).
- Constants that become Inf or NaN (Power of 0 to the power -1, a BatchNorm
  factor of 1e-45): one line in blobtool's words, no numpy warning.
- Size: Eltwise of 20,000 bottoms and a Split of 40,000 tops export, and the
  Split runs with every blob kept, well inside fixed times (marked slow).
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="onnx is not installed (blobtool[onnx]; it needs protobuf >= 4.25)")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (blobtool[onnx])")

from caffenets import layer, net, write_net_files  # noqa: E402
from onnxvalid import check_onnx, every_export_checked, ort_session  # noqa: E402,F401  (autouse: every model written is checked)
from runner import invoke, ok, run_blobtool  # noqa: E402

import blobtool  # noqa: E402
from blobtool.errors import FormatError  # noqa: E402

TOLERANCE = 1e-5


def _onnx_values(path, result, feeds: dict) -> dict:
    """{blob name: onnxruntime's value} of every output of an ExportResult, fed by blob name."""
    session = ort_session(path)
    blobs = list(result.outputs)
    values = session.run([result.names[b] for b in blobs], {result.input_names[n]: x for n, x in feeds.items()})
    return dict(zip(blobs, values))


def _agree(ours: dict, theirs: dict) -> None:
    assert set(ours) == set(theirs)
    for name, value in ours.items():
        other = np.asarray(theirs[name]).reshape(value.shape)
        scale = max(float(np.max(np.abs(value))) if value.size else 0.0, 1.0)
        assert np.max(np.abs(value - other), initial=0.0) <= TOLERANCE * scale, name


def _export_and_run(tmp_path, layers, inputs: dict, *, seed: int = 0):
    """(ExportResult, blobtool run's values, onnxruntime's values, warnings said) of the net, every blob an output."""
    _, model = write_net_files(tmp_path, net(layers, inputs))
    out = tmp_path / "net.onnx"
    said = []
    result, _ = blobtool.export(str(model), str(out), outputs="all", warn=said.append)
    rng = np.random.default_rng(seed)
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in inputs.items()}
    ours = blobtool.run(str(model), inputs=feeds, outputs="all").values
    return result, ours, _onnx_values(out, result, feeds), said


# -- names: unique by construction ----------------------------------------------------------------

def test_a_layer_in_place_on_the_input_gives_a_valid_model_whose_input_keeps_its_name(tmp_path):
    rng = np.random.default_rng(1)
    layers = [layer("r", "ReLU", "data", "data"),
              layer("conv", "Convolution", "data", blobs=[rng.standard_normal((2, 3, 1, 1))],
                    convolution_param={"num_output": 2, "kernel_size": [1], "bias_term": False})]
    result, ours, theirs, said = _export_and_run(tmp_path, layers, {"data": (1, 3, 4, 4)})
    # The graph's input is still fed as "data"; the value the ReLU wrote is another name, and said so.
    assert result.input_names == {"data": "data"}
    assert result.names["data"] == "data#2" and result.names["conv"] == "conv"
    model = onnx.load(str(tmp_path / "net.onnx"))
    assert [i.name for i in model.graph.input] == ["data"]
    assert "data#2" in [o.name for o in model.graph.output]
    _agree(ours, theirs)
    assert np.all(theirs["data"] >= 0)  # after the ReLU, not the input fed
    (line,) = [s for s in said if "name" in s]
    assert "1 name in the ONNX model differs" in line and "blob 'data' written by layer 'r' is 'data#2'" in line


def test_caffe_blobs_named_like_exports_own_names_keep_their_names(tmp_path):
    rng = np.random.default_rng(2)
    layers = [
        layer("c", "Convolution", "data", blobs=[rng.standard_normal((3, 3, 1, 1))],
              convolution_param={"num_output": 3, "kernel_size": [1], "bias_term": False}),
        layer("r", "ReLU", "c", "c"),                 # c's first version would be "c:c"
        layer("x", "Power", "data", "c:c", power_param={"scale": 2.0}),   # a Caffe blob named so
        layer("y", "Power", "data", "c/0", power_param={"shift": 1.0}),   # named as c's weight initializer
        layer("s", "Eltwise", ["c", "c:c", "c/0"], "sum"),
    ]
    result, ours, theirs, said = _export_and_run(tmp_path, layers, {"data": (1, 3, 2, 2)})
    # Caffe's blobs keep their names; the names export made up are numbered.
    assert {b: result.names[b] for b in ("c", "c:c", "c/0", "sum")} == {"c": "c", "c:c": "c:c", "c/0": "c/0",
                                                                         "sum": "sum"}
    renamed = {name: given for _, name, given in result.renamed}
    assert renamed == {"c:c": "c:c#2", "c/0": "c/0#2"}
    model = onnx.load(str(tmp_path / "net.onnx"))
    assert "c/0#2" in [t.name for t in model.graph.initializer]
    assert model.graph.node[0].output == ["c:c#2"]
    _agree(ours, theirs)
    (line,) = [s for s in said if "name" in s]
    assert "2 names in the ONNX model differ" in line and "initializer 'c/0' is 'c/0#2'" in line


def test_export_check_feeds_and_reads_the_model_by_its_own_names(tmp_path):
    # --check ran onnxruntime with the blobs' names: a renamed output ("data#2") was "Invalid output name".
    _, model = write_net_files(tmp_path, net([layer("r", "ReLU", "data", "data"),
                                              layer("p", "Power", "data", "c/0", power_param={"scale": 3.0})],
                                             {"data": (1, 2, 3, 3)}))
    out = tmp_path / "net.onnx"
    done = ok("export", model, "-o", out, "--check", "--outputs", "all")
    assert "check: " in done.stderr and "computes what" in done.stderr
    onnx.checker.check_model(str(out), full_check=True)


def test_the_json_record_lists_every_name_that_changed(tmp_path):
    _, model = write_net_files(tmp_path, net([layer("r", "ReLU", "data", "data")], {"data": (1, 2)}))
    result = ok("export", model, "-o", tmp_path / "m.onnx", "--outputs", "all", "--json")
    record = json.loads(result.stdout)
    assert record["inputs"] == {"data": [1, 2]} and record["outputs"] == {"data#2": [1, 2]}
    assert record["renamed"] == [{"what": "blob 'data' written by layer 'r'", "name": "data", "onnx": "data#2"}]
    assert result.stderr.count("blobtool: warning: ") == 1 and "'data#2'" in result.stderr


def _program(names: dict):
    """A Program of ReLUs, {top: bottom} in order, fed by the one bottom no layer writes (shape (1, 2))."""
    from blobtool._pb import blobtool_caffe_pb2 as pb
    from blobtool.forward.runner import Program, Step
    from blobtool.layers import layer_class

    steps, written = [], set()
    for k, (top, bottom) in enumerate(names.items()):
        made = layer_class("ReLU")(f"relu{k}", "ReLU", pb.LayerParameter(name=f"relu{k}", type="ReLU"), [])
        made.check_counts(1, 1)
        made.reshape([(1, 2)])
        steps.append(Step(made, (bottom,), (top,), [(1, 2)], [(1, 2)]))
        written.add(top)
    inputs = {b: (1, 2) for b in names.values() if b not in written}
    return Program(inputs, steps, "names.caffemodel")


def test_names_that_are_not_utf8_become_distinct_valid_onnx_names(tmp_path):
    from blobtool.onnxport.graph import export_program

    # A blob whose name holds the byte 0xff (decoded with surrogateescape), one named by the text
    # that byte is written as, a stray surrogate and an empty name: four blobs, four ONNX names.
    program = _program({"a\udcff": "in\udcfe", "a\\xff": "a\udcff", "b\ud800": "a\\xff", "": "b\ud800"})
    out = tmp_path / "names.onnx"
    result = export_program(program, out, outputs=["a\udcff", "a\\xff", "b\ud800", ""])
    onnx_names = [result.names[n] for n in ("a\udcff", "a\\xff", "b\ud800", "")]
    assert len(set(onnx_names)) == 4 and result.input_names == {"in\udcfe": "in\\xfe"}
    for name in onnx_names:
        name.encode("utf-8")  # valid text
    assert onnx_names[0] == "a\\xff" and onnx_names[1] == "a\\xff#2" and onnx_names[2] == "b\\ud800"
    assert onnx_names[3] == "#2"
    x = np.array([[-1.0, 2.0]], np.float32)
    values = ort_session(out).run(onnx_names, {"in\\xfe": x})
    for value in values:
        np.testing.assert_array_equal(value, [[0.0, 2.0]])


def test_blobs_named_by_bytes_that_are_not_utf8_export_as_two_values(tmp_path):
    # b"x\xff" and the text "x\\xff" are two blobs in Caffe; their ONNX names are two as well.
    from builders import len_field

    def raw_layer(name, kind, bottoms, tops, **settings):
        body = layer(name, kind, [], [], **settings).SerializeToString()
        return len_field(100, body + b"".join(len_field(3, b) for b in bottoms)
                         + b"".join(len_field(4, t) for t in tops))

    raw = net([], {"data": (1, 2)}).SerializeToString()
    raw += raw_layer("p1", "Power", [b"data"], [b"x\xff"], power_param={"shift": 2.0})
    raw += raw_layer("p2", "Power", [b"data"], [b"x\\xff"], power_param={"shift": 1.0})
    raw += raw_layer("sum", "Eltwise", [b"x\xff", b"x\\xff"], [b"sum"])
    model = tmp_path / "clash.caffemodel"
    model.write_bytes(raw)
    out = tmp_path / "clash.onnx"
    said = []
    try:
        result, _ = blobtool.export(str(model), str(out), outputs="all", warn=said.append)
    except FormatError:  # protobuf's pure-Python runtime refuses strings that are not UTF-8 (exit 3)
        pytest.skip("this protobuf runtime refuses names that are not UTF-8, and blobtool says so")
    assert result.names["x\udcff"] == "x\\xff" and result.names["x\\xff"] == "x\\xff#2"
    theirs = _onnx_values(out, result, {"data": np.ones((1, 2), np.float32)})
    assert theirs["x\udcff"].tolist() == [[3.0, 3.0]] and theirs["x\\xff"].tolist() == [[2.0, 2.0]]
    assert theirs["sum"].tolist() == [[5.0, 5.0]]  # one value would give 4 or 6
    assert any("blob 'x\\\\xff' written by layer 'p2' is 'x\\\\xff#2'" in line for line in said), said


def test_a_net_file_whose_name_is_not_utf8_exports(tmp_path):
    _, model = write_net_files(tmp_path, net([layer("r", "ReLU", "data", "y")], {"data": (1, 2)}))
    odd = tmp_path / os.fsdecode(b"n\xffet.caffemodel")
    os.rename(model, odd)
    out = tmp_path / "m.onnx"
    ok("export", odd, "-o", out)
    props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert props["source"] == "n\\xffet.caffemodel"


# -- dilation 0 ---------------------------------------------------------------------------------------

def _caffe_conv(x, w, stride, pad, dilation, group):
    """Caffe's convolution (im2col's addressing), one product at a time: input row o s - p + k d for tap k."""
    n, c, h, wd = x.shape
    o, per_group, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dilation
    ho = (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    wo = (wd + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    y = np.zeros((n, o, ho, wo))
    for out in range(o):
        g = out // (o // group)
        for ci in range(per_group):
            for i in range(kh):
                for j in range(kw):
                    for r in range(ho):
                        for s in range(wo):
                            row, col = r * sh - ph + i * dh, s * sw - pw + j * dw
                            if 0 <= row < h and 0 <= col < wd:
                                y[:, out, r, s] += w[out, ci, i, j] * x[:, g * per_group + ci, row, col]
    return y


def _caffe_deconv(x, w, stride, pad, dilation, group):
    """Caffe's deconvolution (col2im's addressing): input (r, s) adds w's tap (i, j) at r s - p + i d."""
    n, c, h, wd = x.shape
    _, per_group, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dilation
    ho = sh * (h - 1) + dh * (kh - 1) + 1 - 2 * ph
    wo = sw * (wd - 1) + dw * (kw - 1) + 1 - 2 * pw
    y = np.zeros((n, per_group * group, ho, wo))
    for ci in range(c):
        g = ci // (c // group)
        for out in range(per_group):
            for i in range(kh):
                for j in range(kw):
                    for r in range(h):
                        for s in range(wd):
                            row, col = r * sh - ph + i * dh, s * sw - pw + j * dw
                            if 0 <= row < ho and 0 <= col < wo:
                                y[:, g * per_group + out, row, col] += w[ci, out, i, j] * x[:, ci, r, s]
    return y


@pytest.mark.parametrize("kind", ["Convolution", "Deconvolution"])
@pytest.mark.parametrize("dilation, stride, pad, group", [
    ([0], [1], [0], 1), ([0], [2], [1], 1), ([0, 1], [1], [1], 1), ([1, 0], [2], [0], 3), ([0], [1], [1], 3),
])
def test_dilation_0_is_exported_as_caffe_computes_it(tmp_path, kind, dilation, stride, pad, group):
    rng = np.random.default_rng(3)
    shape = (6, 3 // group, 3, 2) if kind == "Convolution" else (3, 6 // group, 3, 2)
    weight = rng.standard_normal(shape).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    conv = layer("c", kind, "data", blobs=[weight, bias],
                 convolution_param={"num_output": 6, "kernel_h": 3, "kernel_w": 2, "dilation": dilation,
                                    "stride": stride, "pad": pad, "group": group})
    result, ours, theirs, said = _export_and_run(tmp_path, [conv], {"data": (2, 3, 5, 6)}, seed=4)
    assert said == []
    _agree(ours, theirs)
    x = np.random.default_rng(4).standard_normal((2, 3, 5, 6)).astype(np.float32)
    by_hand = (_caffe_conv if kind == "Convolution" else _caffe_deconv)(
        x.astype(np.float64), weight.astype(np.float64), (stride * 2)[:2], (pad * 2)[:2], (dilation * 2)[:2], group)
    by_hand += bias.reshape(1, -1, 1, 1)
    assert np.max(np.abs(theirs["c"] - by_hand)) <= TOLERANCE * np.max(np.abs(by_hand))
    model = onnx.load(str(tmp_path / "net.onnx"))
    (node,) = [n for n in model.graph.node if n.op_type in ("Conv", "ConvTranspose")]
    dilations = [a for a in node.attribute if a.name == "dilations"][0].ints
    assert 0 not in dilations


@pytest.mark.caffe
@pytest.mark.parametrize("kind", ["Convolution", "Deconvolution"])
def test_dilation_0_exported_computes_what_real_caffe_computes(tmp_path, kind):
    from caffeoracle import caffe_values

    rng = np.random.default_rng(6)
    shape = (6, 1, 3, 2) if kind == "Convolution" else (3, 2, 3, 2)
    conv = layer("c", kind, "data", blobs=[rng.standard_normal(shape), rng.standard_normal(6)],
                 convolution_param={"num_output": 6, "kernel_h": 3, "kernel_w": 2, "dilation": [0, 1], "stride": [2],
                                    "pad": [1], "group": 3})
    message = net([conv], {"data": (2, 3, 5, 6)})
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    caffes = caffe_values(message, {"data": x}, tmp_path, tops=["c"])["c"]
    _, model = write_net_files(tmp_path, message)
    result, _ = blobtool.export(str(model), str(tmp_path / "net.onnx"))
    theirs = _onnx_values(tmp_path / "net.onnx", result, {"data": x})["c"]
    assert np.max(np.abs(theirs - caffes)) <= TOLERANCE * np.max(np.abs(caffes))


# -- a FIFO as the output --------------------------------------------------------------------------

def _small(tmp_path):
    rng = np.random.default_rng(0)
    layers = [layer("conv1", "Convolution", "data", blobs=[rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)],
                    convolution_param={"num_output": 4, "kernel_size": [3], "pad": [1]}),
              layer("relu1", "ReLU", "conv1", "conv1")]
    return write_net_files(tmp_path, net(layers, {"data": (1, 3, 5, 5)}))[1]


def test_export_writes_a_fifo_in_one_pass(tmp_path):
    model = _small(tmp_path)
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    done = run_blobtool("export", model, "-o", fifo, text=True)
    reader.join(timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    written = tmp_path / "copy.onnx"
    written.write_bytes(got[0])
    check_onnx(written)
    ok("export", model, "-o", tmp_path / "file.onnx")
    assert got[0] == (tmp_path / "file.onnx").read_bytes()


# -- constants that become Inf or NaN -----------------------------------------------------------------

@pytest.mark.parametrize("case, made, expected", [
    ("power", layer("p", "Power", "data", power_param={"power": -1.0, "scale": 0.0, "shift": 0.0}),
     "layer 'p' (Power): its constant value (1 of 1 value inf)"),
    ("batchnorm", layer("bn", "BatchNorm", "data", blobs=[np.zeros(3), np.ones(3), np.array([1e-45])]),
     "layer 'bn' (BatchNorm): its constants mean (3 of 3 values NaN), var (3 of 3 values inf)"),
])
def test_a_constant_that_becomes_inf_or_nan_is_one_line_and_no_numpy_warning(tmp_path, case, made, expected):
    _, model = write_net_files(tmp_path, net([made], {"data": (1, 3, 2, 2)}))
    out = tmp_path / "m.onnx"
    done = run_blobtool("export", model, "-o", out, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("blobtool: warning: ") and expected in lines[0], done.stderr
    assert "Warning" not in done.stderr and "numpy" not in done.stderr
    check_onnx(out)
    # The model computes what Caffe (and blobtool's run) computes: the same Inf and NaN in the same places.
    x = np.random.default_rng(5).standard_normal((1, 3, 2, 2)).astype(np.float32)
    ours = blobtool.run(str(model), inputs={"data": x}, outputs=[made.name]).values[made.name]
    (theirs,) = ort_session(out).run([made.name], {"data": x})
    assert not np.isfinite(ours).any()
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    np.testing.assert_array_equal(ours[~np.isnan(ours)], theirs[~np.isnan(theirs)])


def test_a_net_of_many_outputs_prints_a_short_line(tmp_path):
    tops = [f"t{k}" for k in range(30)]
    _, model = write_net_files(tmp_path, net([layer("s", "Split", "data", tops)], {"data": (1, 2)}))
    line = ok("export", model, "-o", tmp_path / "m.onnx").stdout
    assert line.rstrip().endswith("outputs t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11 and 18 more (--json lists "
                                  "them)")


# -- time linear in the net's size ---------------------------------------------------------------------
#
# Measured on the 2-core reference machine: Eltwise of 20,000 bottoms 2.2 s (past 120 s before), a Split
# of 40,000 tops 3.5 s to export (past 120 s) and `run --outputs all` 6.5 s with its .npz (21 s before).

def _timed(*args) -> float:
    start = time.perf_counter()
    result = invoke(*args)
    assert result.exit_code == 0, result.stderr
    return time.perf_counter() - start


@pytest.mark.slow
def test_an_eltwise_of_20000_bottoms_exports_in_under_10_s(tmp_path):
    message = net([layer("e", "Eltwise", ["data"] * 20000, "y")], {"data": (1, 1)})
    _, model = write_net_files(tmp_path, message)
    assert _timed("export", model, "-o", tmp_path / "e.onnx") < 10


@pytest.mark.slow
def test_a_split_of_40000_tops_exports_and_runs_in_under_20_s(tmp_path):
    message = net([layer("s", "Split", "data", [f"t{k}" for k in range(40000)])], {"data": (1, 1)})
    _, model = write_net_files(tmp_path, message)
    assert _timed("export", model, "-o", tmp_path / "s.onnx", "--outputs", "all") < 20
    start = time.perf_counter()
    result = blobtool.run(str(model), outputs="all")
    assert time.perf_counter() - start < 20
    assert len(result.values) == 40001


def test_external_data_beside_a_model_whose_name_is_not_utf8_is_refused_before_writing(tmp_path, monkeypatch):
    from blobtool.onnxport import graph

    monkeypatch.setattr(graph, "EXTERNAL_THRESHOLD", 64)
    model = _small(tmp_path)
    out = tmp_path / os.fsdecode(b"m\xff.onnx")
    result = invoke("export", model, "-o", out)
    assert result.exit_code == 2, result.stderr
    assert "the model names that file in UTF-8 text" in result.stderr and "'m\\\\xff.onnx.data'" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.caffemodel", "net.prototxt"]


def test_a_net_of_thousands_of_data_layers_is_said_in_a_short_line(tmp_path):
    layers = [layer(f"d{k}", "DummyData", [], f"x{k}", dummy_data_param={"shape": [{"dim": [1, 1]}]})
              for k in range(40)]
    layers.append(layer("c", "Concat", [f"x{k}" for k in range(40)], "y"))
    _, model = write_net_files(tmp_path, net(layers, {}))
    result = ok("export", model, "-o", tmp_path / "m.onnx")
    (line,) = [ln for ln in result.stderr.splitlines() if "left out of the deploy net" in ln]
    assert line.endswith("d10 (DummyData), d11 (DummyData) and 28 more")


def test_clip_with_min_above_max_exports_caffes_values(tmp_path):
    # Caffe's max(min, min(x, max)) gives min everywhere; ONNX's Clip gives max: it was exit 0, wrong values.
    layers = [layer("c", "Clip", "data", clip_param={"min": 2.0, "max": -1.0})]
    result, ours, theirs, _ = _export_and_run(tmp_path, layers, {"data": (1, 2, 3, 3)})
    assert np.all(ours["c"] == 2.0)
    _agree(ours, theirs)
    check_onnx(tmp_path / "net.onnx")


def test_clip_of_nan_exports_caffes_min(tmp_path):
    # clip_layer.cpp's comparisons turn NaN into min; ONNX's Clip keeps NaN (found by fuzz_long --nets).
    layers = [layer("log", "Log", "data"), layer("c", "Clip", "log", clip_param={"min": -1.0, "max": 2.0})]
    result, ours, theirs, _ = _export_and_run(tmp_path, layers, {"data": (1, 2, 3, 3)})
    assert np.isnan(ours["log"]).any() and np.all(ours["c"][np.isnan(ours["log"])] == -1.0)
    np.testing.assert_allclose(theirs["log"], ours["log"], rtol=1e-6, atol=1e-6, equal_nan=True)
    assert not np.isnan(theirs["c"]).any()
    np.testing.assert_allclose(theirs["c"], ours["c"], rtol=1e-6, atol=1e-6)


@pytest.mark.caffe
@pytest.mark.parametrize("kind", ["ReLU", "ELU", "PReLU"])
def test_an_infinite_slope_exports_caffes_nan(tmp_path, kind):
    # Caffe's max(x, 0) + slope * min(x, 0) makes inf * 0 a NaN where x >= 0; ONNX's LeakyRelu, Elu and
    # PRelu give x there (found by fuzz_long --nets). Caffe, blobtool and onnxruntime agree now.
    from caffeoracle import caffe_values

    made = {"ReLU": layer("r", "ReLU", "data", relu_param={"negative_slope": float("inf")}),
            "ELU": layer("r", "ELU", "data", elu_param={"alpha": float("inf")}),
            "PReLU": layer("r", "PReLU", "data", blobs=[np.array([0.25, np.inf], np.float32)])}[kind]
    message = net([made], {"data": (1, 2, 2, 2)})
    x = np.array([-1, 0, 1, 2, -2, 0, 3, -4], np.float32).reshape(1, 2, 2, 2)
    caffes = caffe_values(message, {"data": x}, tmp_path)["r"]
    _, model = write_net_files(tmp_path, message)
    ours = blobtool.run(str(model), inputs={"data": x}).values["r"]
    result, verdict = blobtool.export(str(model), str(tmp_path / "net.onnx"), check=True, warn=lambda line: None)
    theirs = ort.InferenceSession(str(tmp_path / "net.onnx"), providers=["CPUExecutionProvider"]).run(None, {"data": x})[0]
    assert np.isnan(caffes).any()
    np.testing.assert_array_equal(ours, caffes)
    np.testing.assert_array_equal(theirs, caffes)
    assert verdict.passed


@pytest.mark.parametrize("low, high", [(float("nan"), 2.0), (-1.0, float("nan")), (float("nan"), float("nan"))],
                         ids=["min-nan", "max-nan", "both-nan"])
def test_clip_of_a_nan_bound_exports_caffes_values(tmp_path, low, high):
    # clip_layer.cpp: std::max(min, std::min(x, max)); std::max(NaN, y) is NaN and std::min(x, NaN) is x
    # (found by fuzz_long --nets: ONNX's Clip gave other values).
    layers = [layer("log", "Log", "data"), layer("c", "Clip", "log", clip_param={"min": low, "max": high})]
    result, ours, theirs, _ = _export_and_run(tmp_path, layers, {"data": (1, 2, 3, 3)})
    x = ours["log"]
    with np.errstate(invalid="ignore"):
        wanted = np.full_like(x, np.nan) if np.isnan(low) else np.where(np.isnan(x), np.float32(low),
                                                                           np.maximum(x, np.float32(low)))
    np.testing.assert_array_equal(ours["c"], wanted)
    # onnxruntime's Log rounds on its own: the same places, within float32 rounding.
    np.testing.assert_allclose(theirs["c"], wanted, rtol=1e-6, atol=1e-7, equal_nan=True)
