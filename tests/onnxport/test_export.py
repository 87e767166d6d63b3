"""blobtool export: every real net exported, checked, run in onnxruntime, compared; the command's options.

The layer sweeps (tests/layers/) export every net they run as well, and
tests/layers/test_sweep_export.py holds them to every exporter.

onnx and onnxruntime are the `onnx` extra (they need protobuf 4.25 or newer):
where they are missing, as on the oldest protobuf CI runs, these tests skip
with that reason. The oracles: onnx.checker (full_check) for the model,
onnxruntime (every graph optimization on) for what it computes, OpenCV 4.x's
Caffe importer for what the Caffe net computes, and blobtool's own forward.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import blobtool
from caffenets import (SMALL_LAYERS, layer, max_scaled_difference, opencv_forward, random_feeds, small_net,
                      write_net_files)
from runner import assert_error, assert_usage, invoke, ok
from caffenets import CIFAR10_DEPLOY
from onnxvalid import every_export_checked, ort_session  # noqa: F401  (autouse: every model written is checked)

onnx = pytest.importorskip("onnx", reason="onnx is not installed (blobtool[onnx]; it needs protobuf >= 4.25)")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (blobtool[onnx])")

OPSETS = (13, 17)
TOLERANCE = 1e-4

# -- the real nets --------------------------------------------------------------------------------

REAL_NETS = [
    ("lenet_iter_10000.caffemodel", {"data": (2, 1, 28, 28)}),
    ("resnet20_cifar10.caffemodel", {"Data1": (3, 3, 32, 32)}),
    ("mtcnn_det1_half.caffemodel", {"data": (1, 3, 12, 12)}),
    ("mtcnn_det1_half.caffemodel", {"data": (2, 3, 31, 47)}),
]


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("name, shapes", REAL_NETS, ids=[f"{n}-{'x'.join(map(str, next(iter(s.values()))))}"
                                                          for n, s in REAL_NETS])
def test_a_real_net_exported_computes_what_opencv_and_run_compute(tmp_path, realworld, name, shapes, opset):
    caffemodel = realworld / name
    out = tmp_path / "net.onnx"
    deploy = tmp_path / "deploy.prototxt"
    made = blobtool.deploy_definition(str(caffemodel), str(deploy), shapes=shapes, warn=lambda line: None)
    result, _ = blobtool.export(str(caffemodel), str(out), shapes=shapes, opset=opset, outputs="all",
                                warn=lambda line: None)
    onnx.checker.check_model(str(out), full_check=True)
    blobs = [n for n in result.outputs if n not in made.inputs]
    feeds = random_feeds(shapes, 3)
    theirs = dict(zip(blobs, ort_session(out).run(blobs, feeds)))
    opencv = opencv_forward(deploy, caffemodel, feeds, blobs)
    ours = blobtool.run(str(caffemodel), inputs=feeds, outputs=blobs).values
    for n in blobs:
        assert max_scaled_difference(theirs[n], opencv[n]) <= TOLERANCE, (n, "onnxruntime against OpenCV")
        assert max_scaled_difference(theirs[n], ours[n]) <= TOLERANCE, (n, "onnxruntime against blobtool run")


@pytest.mark.parametrize("opset", OPSETS)
def test_the_hdf5_snapshot_exports_with_its_definition(tmp_path, realworld, opset):
    snapshot = realworld / "cifar10_full_iter_70000.caffemodel.h5"
    deploy = tmp_path / "deploy.prototxt"
    deploy.write_text(CIFAR10_DEPLOY)
    out = tmp_path / "cifar10.onnx"
    ok("export", snapshot, "--definition", deploy, "-o", out, "--opset", opset, "--check")
    feeds = random_feeds({"data": (2, 3, 32, 32)}, 3)
    ours = blobtool.run(str(snapshot), definition=str(deploy), inputs=feeds).values
    (prob,) = ort_session(out).run(["prob"], feeds)
    assert max_scaled_difference(prob, ours["prob"]) <= TOLERANCE


@pytest.mark.parametrize("name, shapes", [("resnet20_cifar10.caffemodel", "Data1=2,3,32,32"),
                                          ("mtcnn_det1_half.caffemodel", "data=1,3,12,12")])
def test_export_check_passes_on_real_nets(tmp_path, realworld, name, shapes):
    result = ok("export", realworld / name, "--input-shape", shapes, "-o", tmp_path / "net.onnx", "--check",
                "--json")
    record = json.loads(result.stdout)
    assert record["check"]["passed"] is True
    assert "computes what" in result.stderr
    if name.startswith("mtcnn"):
        # NVIDIA Caffe's FP16 blobs stay float16, each cast to float32 where it is used, and said.
        assert "float16 blobs" in result.stderr and "kept as float16, each cast to float32" in result.stderr
        loaded = onnx.load(str(tmp_path / "net.onnx"))
        kinds = {t.name: t.data_type for t in loaded.graph.initializer}
        assert kinds["conv1/0"] == onnx.TensorProto.FLOAT16 and kinds["PReLU1/0"] == onnx.TensorProto.FLOAT
        casts = [n for n in loaded.graph.node if n.op_type == "Cast" and n.input[0] == "conv1/0"]
        assert [list(n.output) for n in casts] == [["conv1/0:float32"]]


# -- the command ----------------------------------------------------------------------------------

def _small(tmp_path, *, extra=()):
    return write_net_files(tmp_path, small_net([*SMALL_LAYERS, *extra]))


def test_the_model_names_its_values_after_caffe_and_says_where_it_came_from(tmp_path):
    _, model = _small(tmp_path)
    out = tmp_path / "small.onnx"
    text = ok("export", model, "-o", out).stdout
    assert text.startswith(f"{out}: opset 17, ")
    loaded = onnx.load(str(out))
    assert [i.name for i in loaded.graph.initializer][:4] == ["conv1/0", "conv1/1", "ip1/0", "ip1/1"]
    assert [i.name for i in loaded.graph.input] == ["data"] and [o.name for o in loaded.graph.output] == ["prob"]
    # The in-place ReLU: the convolution's output is "conv1:conv1", the ReLU's the blob's own name.
    assert [list(n.output) for n in loaded.graph.node[:2]] == [["conv1:conv1"], ["conv1"]]
    props = {p.key: p.value for p in loaded.metadata_props}
    assert props["caffe_net"] == "small" and props["blobtool_version"] == blobtool.__version__
    assert loaded.opset_import[0].version == 17


def test_outputs_end_the_graph_where_they_are_computed(tmp_path):
    _, model = _small(tmp_path)
    out = tmp_path / "part.onnx"
    record = json.loads(ok("export", model, "-o", out, "--outputs", "pool1", "--json").stdout)
    assert record["outputs"] == {"pool1": [2, 4, 4, 4]}
    feeds = random_feeds({"data": (2, 3, 7, 7)}, 3)
    (pool,) = ort_session(out).run(["pool1"], feeds)
    ours = blobtool.run(str(model), inputs=feeds, outputs=["pool1"]).values["pool1"]
    assert max_scaled_difference(pool, ours) <= TOLERANCE


def test_a_layer_that_cannot_be_exported_is_exit_3_and_nothing_is_written(tmp_path):
    extra = [layer("conv2", "Convolution", ["pool1", "pool1"], ["conv2a", "conv2b"],
                   blobs=[np.ones((2, 4, 1, 1)), np.zeros(2)], convolution_param={"num_output": 2, "kernel_size": [1]})]
    _, model = _small(tmp_path, extra=extra)
    out = tmp_path / "x.onnx"
    line = assert_error(invoke("export", model, "-o", out), 3, "layer 'conv2' (Convolution) cannot be exported to ONNX")
    assert "a convolution of several bottoms" in line and str(model) in line
    assert not out.exists()


@pytest.mark.parametrize("args, fragment", [
    (["--opset", "12"], "--opset 12: blobtool writes opsets 13 to 28"),
    (["--outputs", "nope"], "the net has no blob 'nope'"),
])
def test_usage_errors_of_export_are_exit_2(tmp_path, args, fragment):
    _, model = _small(tmp_path)
    assert_error(invoke("export", model, "-o", tmp_path / "x.onnx", *args), 2, fragment)
    assert not (tmp_path / "x.onnx").exists()


def test_export_writes_only_onnx(tmp_path):
    _, model = _small(tmp_path)
    assert_usage(invoke("export", model, "-o", tmp_path / "x.pb"), "export", "export writes an ONNX model")
    assert_usage(invoke("export", model, "--seed", "3", "-o", tmp_path / "x.onnx"), "export",
                 "--seed applies only with --check")


def test_without_onnx_the_check_names_the_extra(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnx" else real(name, *a))
    _, model = _small(tmp_path)
    assert_error(invoke("export", model, "-o", tmp_path / "x.onnx", "--check"), 2,
                 "--check needs onnx: pip install 'blobtool[onnx]'")
    ok("export", model, "-o", tmp_path / "x.onnx")  # writing the model needs neither


def test_a_check_that_fails_is_exit_1_naming_the_blob(tmp_path, monkeypatch):
    # An exporter that gets a layer wrong (a ReLU written as its negation) is what --check is for.
    from blobtool.onnxport.emit import EXPORTERS

    def wrong(e):
        e.node("Neg", e.inputs, e.outputs)

    monkeypatch.setitem(EXPORTERS, "ReLU", wrong)
    _, model = _small(tmp_path)
    result = invoke("export", model, "-o", tmp_path / "x.onnx", "--check", "--outputs", "all")
    assert result.exit_code == 1, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith("blobtool: check FAILED:")
    assert any(line.startswith("blobtool:   conv1: max |difference|") for line in lines)


def test_weights_past_the_threshold_go_to_external_data(tmp_path, monkeypatch):
    from blobtool.onnxport import graph

    monkeypatch.setattr(graph, "EXTERNAL_THRESHOLD", 64)
    _, model = _small(tmp_path)
    out = tmp_path / "ext.onnx"
    record = json.loads(ok("export", model, "-o", out, "--json", "--check").stdout)
    assert record["external_data"] == f"{out}.data" and os.path.getsize(f"{out}.data") >= record["weight_bytes"]
    assert os.path.getsize(out) < record["weight_bytes"]
    onnx.checker.check_model(str(out), full_check=True)
    loaded = onnx.load(str(out))  # reads the external data beside it
    weight = onnx.numpy_helper.to_array(loaded.graph.initializer[0])
    np.testing.assert_array_equal(weight, blobtool.load_all(str(model))["conv1/0"].cpu_data().reshape(4, 3, 3, 3))
