"""net/layertypes.py: one row per layer type, and the run and export registries as views of the rows.

A type runs (blobtool/layers/, REGISTRY) and exports (blobtool/onnxport/,
EXPORTERS) only through its row, which names its class and its exporter;
a deploy net's roles (forward/deploy.py) come from the rows too. The last
test adds a type the way docs/development.md says: one row and its
classes, and run, export and fold pick it up.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from blobtool._pb import blobtool_caffe_pb2 as pb
from blobtool._pb import blobtool_onnx_pb2
from blobtool.layers import REGISTRY, Layer, register
from blobtool.net.layertypes import DEPLOY_ROLES, TYPES, FoldInto, LayerType, deploy_role, name_of
from blobtool.onnxport import ops  # noqa: F401  (the exporters register)
from blobtool.onnxport.emit import EXPORTERS, exporter
from runner import ok


def _resolved(package: str, named: str):
    """The object a row's "module.name" names in `package`, or None where there is none."""
    module, _, name = named.partition(".")
    try:
        found = importlib.import_module(f"{package}.{module}")
    except ImportError:
        return None
    return getattr(found, name, None)


def test_the_run_and_export_registries_are_views_of_the_rows():
    runs = {name: r.run for name, r in TYPES.items() if r.run is not None}
    exports = {name: r.export for name, r in TYPES.items() if r.export is not None}
    assert {name: name_of(cls) for name, cls in REGISTRY.items()} == runs
    assert {name: name_of(function) for name, function in EXPORTERS.items()} == exports
    # Every class and function a row names exists where the row says, and is the one registered.
    for name, named in runs.items():
        assert _resolved("blobtool.layers", named) is REGISTRY[name], name
    for name, named in exports.items():
        assert _resolved("blobtool.onnxport.ops", named) is EXPORTERS[name], name
    # blobtool exports exactly what it runs.
    assert set(runs) == set(exports)


def test_every_deploy_role_is_known_and_a_type_that_goes_does_not_run():
    for name, r in TYPES.items():
        assert r.deploy is None or r.deploy in DEPLOY_ROLES, name
        assert r.deploy is None or r.run is None, name
    # Every type a BatchNorm folds into runs and exports (fold --check runs it; its folded net exports).
    assert all(r.run and r.export for r in TYPES.values() if r.folds is not None)
    data = {name for name, r in TYPES.items() if r.deploy == "data"}
    assert data == {"Data", "ImageData", "HDF5Data", "MemoryData", "WindowData", "AnnotatedData", "DummyData"}
    assert deploy_role("SoftmaxWithLoss") == "softmax" and deploy_role("Accuracy") == "score"
    assert deploy_role("Silence") == "swallow" and deploy_role("Input") == "input"
    # A fork's loss without a row goes as Caffe's losses go; a fork's other type runs (or is refused) as it is.
    assert deploy_role("FocalLoss") == "loss" and deploy_role("ReLU") is None and deploy_role("NoSuchType") is None


def test_a_type_runs_or_exports_only_through_its_row():
    class Stray(Layer):
        def forward(self, xs):
            return xs

    with pytest.raises(TypeError, match="'NoSuchType' has no row in TYPES"):
        register("NoSuchType")(Stray)
    with pytest.raises(TypeError, match="'ReLU''s row names 'neuron.ReLU' as its run, not 'test_layertypes.*Stray'"):
        register("ReLU")(Stray)

    def stray(e):
        pass

    with pytest.raises(TypeError, match="'NoSuchType' has no row in TYPES"):
        exporter("NoSuchType")(stray)
    with pytest.raises(TypeError, match="'ReLU''s row names 'elementwise.relu' as its export"):
        exporter("ReLU")(stray)
    assert "NoSuchType" not in REGISTRY and "NoSuchType" not in EXPORTERS
    assert REGISTRY["ReLU"] is not Stray and EXPORTERS["ReLU"] is not stray


# -- a type added end to end: one row, its class, its exporter ------------------------------------

class ToyConv(Layer):
    """A 1 x 1 convolution of its own type: W (C_out, C_in, 1, 1) times each pixel's channels, plus b."""

    blob_count = (1, 2)

    def setup(self):
        self.bias = len(self.blobs) > 1

    def reshape(self, shapes):
        n, _, h, w = shapes[0]
        return [(n, self.blobs[0].shape[0], h, w)]

    def forward(self, xs):
        y = np.einsum("oi,nihw->nohw", self.blobs[0][:, :, 0, 0], xs[0])
        if self.bias:
            y = y + self.blobs[1][None, :, None, None]
        return [y.astype(np.float32)]


def toy_conv(e):
    """ONNX's Conv of a 1 x 1 kernel computes what ToyConv does."""
    inputs = [e.inputs[0], e.blob(0)] + ([e.blob(1)] if len(e.layer.blobs) > 1 else [])
    e.node("Conv", inputs, e.outputs, kernel_shape=[1, 1])


TOY_ROW = LayerType("ToyConv", "convolution_param", ("weight", "bias"), "bias_term", FoldInto("rows"),
                    run="test_layertypes.ToyConv", export="test_layertypes.toy_conv")


@pytest.fixture
def toy_type(monkeypatch):
    """The toy type's row in TYPES and its class and exporter registered; all gone afterwards."""
    monkeypatch.setitem(TYPES, "ToyConv", TOY_ROW)
    register("ToyConv")(ToyConv)
    exporter("ToyConv")(toy_conv)
    yield
    REGISTRY.pop("ToyConv", None)
    EXPORTERS.pop("ToyConv", None)


def _toy_net(path, rng):
    """Input (1, 3, 4, 4) -> ToyConv (2 outputs, no bias) -> BatchNorm -> Scale, in place."""
    net = pb.NetParameter(name="toy")
    data = net.layer.add(name="data", type="Input", top=["data"])
    data.input_param.shape.add().dim.extend([1, 3, 4, 4])
    toy = net.layer.add(name="toy", type="ToyConv", bottom=["data"], top=["t"])
    toy.convolution_param.num_output = 2
    toy.convolution_param.kernel_size.append(1)
    toy.convolution_param.bias_term = False
    bn = net.layer.add(name="bn", type="BatchNorm", bottom=["t"], top=["t"])
    sc = net.layer.add(name="sc", type="Scale", bottom=["t"], top=["t"])
    sc.scale_param.bias_term = True
    blobs = [(toy, rng.standard_normal((2, 3, 1, 1))), (bn, rng.standard_normal(2)), (bn, rng.random(2) + 0.5),
             (bn, np.array([2.0])), (sc, rng.standard_normal(2)), (sc, rng.standard_normal(2))]
    for layer, values in blobs:
        blob = layer.blobs.add()
        blob.shape.dim.extend(values.shape)
        blob.data.extend(np.float32(values).ravel().tolist())
    path.write_bytes(net.SerializeToString())
    return path


def test_a_type_added_in_one_row_runs_exports_and_folds(toy_type, tmp_path):
    net = _toy_net(tmp_path / "toy.caffemodel", np.random.default_rng(5))
    # run: the runner finds the class through the registry the row joins.
    ok("run", net, "--outputs", "all", "-o", tmp_path / "out.npz")
    with np.load(tmp_path / "out.npz") as out:
        ran = dict(out)
    assert ran["t"].shape == (1, 2, 4, 4)
    # export: the writer finds the exporter the same way, with no onnx package needed to write.
    ok("export", net, "-o", tmp_path / "toy.onnx")
    model = blobtool_onnx_pb2.ModelProto.FromString((tmp_path / "toy.onnx").read_bytes())
    assert "toy/Conv" in [node.name for node in model.graph.node]
    try:
        import onnxruntime
    except ImportError:
        onnxruntime = None  # what the model computes is the export tests' to prove; here, that it was written
    if onnxruntime is not None:
        session = onnxruntime.InferenceSession(str(tmp_path / "toy.onnx"), providers=["CPUExecutionProvider"])
        computed = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"data": ran["data"]})))
        np.testing.assert_allclose(computed["t"], ran["t"], rtol=1e-5, atol=1e-6)
    # fold: the row's FoldInto makes the BatchNorm and Scale fold into it, and --check runs both nets.
    folds = ok("fold", net, "-o", tmp_path / "folded.caffemodel", "--check")
    assert folds.stdout.splitlines()[0] == "toy <- bn + sc, bias created" and "check: " in folds.stderr
    folded = pb.NetParameter.FromString((tmp_path / "folded.caffemodel").read_bytes())
    assert [(layer.name, layer.type, len(layer.blobs)) for layer in folded.layer] == \
        [("data", "Input", 0), ("toy", "ToyConv", 2)]
    assert folded.layer[1].convolution_param.bias_term
