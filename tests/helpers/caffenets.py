"""Small Caffe nets for the forward tests, and OpenCV 4.x's forward of them (the independent oracle).

- ``layer(name, type, bottoms, tops, blobs=(), **params)``: a LayerParameter,
  params given as dicts by their field names (``convolution_param={"num_output": 4}``);
- ``net(layers, inputs)``: a NetParameter with `input`/`input_shape` for each input;
- ``write_net_files(folder, net)``: the definition as text (deploy.prototxt, no
  blobs) and the binary net with its blobs (net.caffemodel);
- ``random_feeds(inputs, seed)``: standard normal float32 inputs of the given shapes;
- ``tops_of(layers)``: every blob the layers write, in order;
- ``ours_forward(net, feeds)``: blobtool's layers run in order (each output
  float32 and C-contiguous), the value every comparison holds to its oracle;
- ``against_opencv(layers, inputs, feeds, tolerance=...)``: that run against
  OpenCV's on every top (real Caffe's is caffeoracle.against_caffe);
- ``opencv_forward(prototxt, caffemodel, feeds, tops)``: OpenCV's value of each
  requested blob, each taken from the last layer writing it (OpenCV names
  outputs by layer), with fusion off so that every layer's output is its own
  and its memory reuse off (it can corrupt a Split's output otherwise).

These are nets to run: valid messages built with the protobuf library. Files
made byte by byte (the three layer formats, unknown or damaged fields) are
builders.py's; the two build different things, and each kind is built only there.

OpenCV is a test dependency (``opencv-python-headless<5``; 5.0 removed the
Caffe importer): ``cv2 = opencv()`` skips a test with the reason where it is
missing or too new.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from blobtool._pb import blobtool_caffe_pb2 as pb

# OpenCV's dnn module reuses blob memory between layers; a Split's output can come back
# overwritten unless this is set before the net is made.
os.environ.setdefault("OPENCV_DNN_DISABLE_MEMORY_OPTIMIZATIONS", "1")


def opencv():
    """cv2, or skip: OpenCV 4.x is the oracle of Caffe's layers (5.0 has no Caffe importer)."""
    cv2 = pytest.importorskip("cv2", reason="opencv-python-headless<5 (the oracle of Caffe's layers) is not "
                                            "installed")
    if not hasattr(cv2, "dnn") or not hasattr(cv2.dnn, "readNetFromCaffe"):
        pytest.skip(f"OpenCV {cv2.__version__} has no Caffe importer (removed in 5.0): install "
                    "opencv-python-headless<5")
    return cv2


def _fill(message, values: dict) -> None:
    for key, value in values.items():
        field = getattr(message, key)
        if isinstance(value, dict):
            _fill(field, value)
        elif isinstance(value, (list, tuple)):
            del field[:]
            for item in value:
                if isinstance(item, dict):
                    _fill(field.add(), item)
                else:
                    field.append(item)
        else:
            setattr(message, key, value)


def layer(name: str, kind: str, bottoms=(), tops=None, blobs=(), **params) -> pb.LayerParameter:
    """A LayerParameter; tops default to [name]; blobs are arrays (stored with `shape`, float32)."""
    message = pb.LayerParameter(name=name, type=kind)
    message.bottom.extend([bottoms] if isinstance(bottoms, str) else bottoms)
    message.top.extend([name] if tops is None else ([tops] if isinstance(tops, str) else tops))
    for array in blobs:
        array = np.asarray(array, np.float32)
        blob = message.blobs.add()
        blob.shape.dim.extend(array.shape)
        blob.data.extend(array.reshape(-1).tolist())
    _fill(message, params)
    return message


def net(layers, inputs: dict, name: str = "sweep") -> pb.NetParameter:
    """A NetParameter: `inputs` ({name: shape}) as input/input_shape fields, then `layers`."""
    message = pb.NetParameter(name=name)
    for input_name, shape in inputs.items():
        message.input.append(input_name)
        message.input_shape.add().dim.extend(shape)
    message.layer.extend(layers)
    return message


def _small_layers() -> list:
    rng = np.random.default_rng(0)
    return [
        layer("conv1", "Convolution", "data", blobs=[rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)],
              convolution_param={"num_output": 4, "kernel_size": [3], "pad": [1]}),
        layer("relu1", "ReLU", "conv1", "conv1"),
        layer("pool1", "Pooling", "conv1", pooling_param={"pool": 1, "kernel_size": 3, "stride": 2, "pad": 1}),
        layer("ip1", "InnerProduct", "pool1", blobs=[rng.standard_normal((5, 4 * 4 * 4)), rng.standard_normal(5)],
              inner_product_param={"num_output": 5}),
        layer("prob", "Softmax", "ip1"),
    ]


# The export tests' small net: a convolution (in place ReLU after it), an average pooling, an inner
# product and a softmax, on a 2 x 3 x 7 x 7 input "data".
SMALL_LAYERS = tuple(_small_layers())


def small_net(layers=SMALL_LAYERS) -> pb.NetParameter:
    """The net "small" of `layers` (SMALL_LAYERS unless given) on a 2 x 3 x 7 x 7 input "data"."""
    return net(layers, {"data": (2, 3, 7, 7)}, name="small")


def definition_of(message: pb.NetParameter) -> pb.NetParameter:
    """The net without its blobs (what a deploy.prototxt holds)."""
    bare = pb.NetParameter()
    bare.CopyFrom(message)
    for each in bare.layer:
        del each.blobs[:]
    return bare


def write_net_files(folder: Path, message: pb.NetParameter, stem: str = "net") -> tuple[Path, Path]:
    """(deploy.prototxt, .caffemodel) of `message` in `folder`."""
    prototxt = Path(folder) / f"{stem}.prototxt"
    prototxt.write_text(text_format.MessageToString(definition_of(message)))
    model = Path(folder) / f"{stem}.caffemodel"
    model.write_bytes(message.SerializeToString())
    return prototxt, model


def last_writers(message: pb.NetParameter) -> dict:
    """{blob name: (layer name, which of its tops)} of the last layer writing each blob."""
    found: dict = {}
    for each in message.layer:
        for k, top in enumerate(each.top):
            found[top] = (each.name, k)
    return found


def opencv_forward(prototxt, caffemodel, feeds: dict, tops, *, definition: pb.NetParameter | None = None) -> dict:
    """{blob name: OpenCV's value} for each blob in `tops`, from OpenCV 4.x's run of the Caffe net.

    `definition` (the parsed prototxt, read from the file when not given)
    tells which layer last writes each blob.
    """
    cv2 = opencv()
    if definition is None:
        definition = text_format.Parse(Path(prototxt).read_text(), pb.NetParameter())
    writers = last_writers(definition)
    model = cv2.dnn.readNetFromCaffe(str(prototxt), str(caffemodel))
    model.enableFusion(False)
    model.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    model.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU)
    for input_name, value in feeds.items():
        model.setInput(np.ascontiguousarray(value, np.float32), input_name)
    layers = list(dict.fromkeys(writers[top][0] for top in tops))
    # forwardAndRetrieve gives every output of each layer (forward() only each layer's first);
    # OpenCV's Split keeps one output, which all of Caffe's tops of a Split are.
    outputs = dict(zip(layers, model.forwardAndRetrieve(layers)))
    kinds = {each.name: each.type for each in definition.layer}
    found = {}
    for top in tops:
        layer_name, k = writers[top]
        values = outputs[layer_name]
        if k >= len(values) and kinds.get(layer_name) == "Split":
            k = 0
        found[top] = np.asarray(values[k])
    return found


def random_feeds(inputs: dict, seed: int = 0, *, scale: float = 1.0, feed=None) -> dict:
    """{name: float32 array} for each {name: shape} of `inputs`, drawn in order from one generator seeded `seed`.

    The values are standard normal times `scale`, or `feed(rng, shape)` where
    a test needs another range (positive values for a logarithm).
    """
    rng = np.random.default_rng(seed)
    return {name: np.asarray(feed(rng, shape) if feed else rng.standard_normal(shape) * scale).astype(np.float32)
            for name, shape in inputs.items()}


def tops_of(layers) -> list:
    """Every blob the layers write (a net's `layer` field, or a list of LayerParameters), in order, once each."""
    return list(dict.fromkeys(top for each in layers for top in each.top))


def max_scaled_difference(ours, theirs) -> float:
    """max |ours - theirs| divided by max |theirs| (1 where that is 0): the tests' measure of agreement."""
    ours = np.asarray(ours, np.float64)
    theirs = np.asarray(theirs, np.float64)
    assert ours.shape == theirs.shape, f"shape {ours.shape} != OpenCV's {theirs.shape}"
    scale = max(float(np.max(np.abs(theirs))) if theirs.size else 0.0, 1.0e-30)
    scale = scale if scale > 0 else 1.0
    return float(np.max(np.abs(ours - theirs))) / scale if ours.size else 0.0


def blob_shape(blob) -> tuple:
    """A BlobProto's shape as Caffe's FromProto reads it: the legacy 4-D fields when any is set, else `shape`."""
    if any(blob.HasField(f) for f in ("num", "channels", "height", "width")):
        return (blob.num, blob.channels, blob.height, blob.width)
    return tuple(blob.shape.dim)


def ours_forward(message: pb.NetParameter, feeds: dict, tops=None) -> dict:
    """{blob name: blobtool's value} of every blob (or those in `tops`) after running `message`'s layers in order.

    Every output must be C-contiguous float32, as blobtool's run hands it on.

    Each layer's class comes from blobtool.layers' registry; its reshape()
    must give the shapes its forward() returns. Input layers are passed over
    (`feeds` stand for them).
    """
    from blobtool.layers import layer_class

    values = {name: np.asarray(x, np.float32, order="C") for name, x in feeds.items()}
    steps = []
    for each in message.layer:
        if each.type == "Input":
            continue
        cls = layer_class(each.type)
        assert cls is not None, f"no layer class for type {each.type}"
        blobs = [np.asarray(b.data, np.float32).reshape(blob_shape(b)) for b in each.blobs]
        made = cls(each.name, each.type, each, blobs)
        bottoms = [values[b] for b in each.bottom]
        made.check_counts(len(bottoms), len(each.top))
        shapes = made.reshape([x.shape for x in bottoms])
        outputs = made.forward(bottoms)
        if getattr(made, "variable_tops", False):  # DetectionOutput: its rows are known once it has run
            assert [o.ndim for o in outputs] == [len(s) for s in shapes], (each.name, shapes)
        else:
            assert [tuple(o.shape) for o in outputs] == [tuple(s) for s in shapes], (each.name, shapes)
        assert all(o.dtype == np.float32 and o.flags.c_contiguous for o in outputs), each.name
        steps.append((made, tuple(each.bottom), tuple(each.top), [x.shape for x in bottoms], shapes))
        values.update(zip(each.top, outputs))
    if SWEEP.opsets:
        onnx_sweep(steps, {name: values[name].shape for name in feeds}, values)
    return values if tops is None else {top: values[top] for top in tops}


def against_opencv(layers, inputs: dict, feeds: dict, *, tolerance: float) -> dict:
    """Run the net by blobtool and by OpenCV 4.x; assert every top agrees within `tolerance`; blobtool's values back."""
    import tempfile

    opencv()
    message = net(layers, inputs)
    tops = tops_of(message.layer)
    ours = ours_forward(message, feeds, tops)
    with tempfile.TemporaryDirectory() as folder:
        prototxt, model = write_net_files(Path(folder), message)
        theirs = opencv_forward(prototxt, model, feeds, tops, definition=message)
    for top in tops:
        assert ours[top].shape == theirs[top].shape, f"{top}: shape {ours[top].shape}, OpenCV's {theirs[top].shape}"
        difference = max_scaled_difference(ours[top], theirs[top])
        assert difference <= tolerance, f"{top}: {difference:.3g} from OpenCV"
    return ours


# -- every sweep exported too ------------------------------------------------------------------
#
# With SWEEP.opsets set (tests/layers/conftest.py sets them for the layer sweeps where onnx and
# onnxruntime are installed), ours_forward also exports each net it ran to ONNX at each opset
# (blobtool's export_program), checks it with onnx.checker (full_check, and each name assigned once:
# tests/helpers/onnxvalid.py's check_onnx), runs it in onnxruntime with every graph optimization,
# and holds every blob to its own values within 1e-4; a refusal must be one docs/onnx.md gives.
# SWEEP.lines gets one record per export: the layer types, and the worst difference or the refusal.


@dataclass
class SweepExport:
    """The opsets the sweeps export at (none: no export), and what each export gave."""

    opsets: tuple = ()
    lines: list = field(default_factory=list)
    passed: set = field(default_factory=set)  # the sweep tests that passed with their exports (node ids)


SWEEP = SweepExport()
SWEEP_OPSETS = (13, 17)
# The sweeps of tests/layers/ that export: every test of them must have run (and passed) in the
# process before SWEEP.lines say anything of the exporters as a whole (tests/layers/test_sweep_export.py).
SWEEP_FILES = ("test_layers_spatial.py", "test_layers_elementwise.py", "test_layers_shape.py")


def export_available() -> bool:
    """Whether onnx and onnxruntime (the `onnx` extra) are installed: the sweeps' exports need both to be checked."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("onnx", "onnxruntime"))

# What export refuses in the layer sweeps, and why (docs/onnx.md): nothing else may be refused.
DOCUMENTED_REFUSALS = (
    "its last window starts past the image",
    "a convolution of several bottoms",
    "only 2-D convolutions over axis 1 of a 4-D bottom",
    "use_global_stats: false normalizes with each batch's own statistics",
    "which NonMaxSuppression's one threshold cannot say",
)


def onnx_sweep(steps: list, input_shapes: dict, values: dict) -> None:
    """Export the net of `steps` at each opset of SWEEP and hold onnxruntime to `values`; one line each in SWEEP."""
    import tempfile

    from onnxvalid import check_onnx, ort_session

    from blobtool.onnxport.emit import ExportError
    from blobtool.onnxport.graph import export_program
    from blobtool.forward.runner import Program, Step

    program = Program(dict(input_shapes), [Step(layer, b, t, list(bs), list(ts)) for layer, b, t, bs, ts in steps],
                      "sweep")
    names = [n for n in program.blob_names() if n not in input_shapes]
    types = sorted({layer.type for layer, *_ in steps})
    for opset in SWEEP.opsets:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "sweep.onnx")
            try:
                result = export_program(program, path, opset=opset, outputs=names)
            except ExportError as exc:
                assert any(reason in str(exc) for reason in DOCUMENTED_REFUSALS), f"an undocumented refusal: {exc}"
                line = {"types": types, "opset": opset, "refused": str(exc)}
            else:
                check_onnx(path)
                session = ort_session(path)
                feeds = {result.input_names[name]: values[name] for name in input_shapes}
                found = dict(zip(names, session.run([result.names[n] for n in names], feeds)))
                worst = {}
                for name in names:
                    ours = values[name]
                    theirs = np.asarray(found[name]).reshape(ours.shape)
                    # Equal values (infinities included) and NaN on both sides agree.
                    with np.errstate(all="ignore"):
                        same = (ours == theirs) | (np.isnan(ours) & np.isnan(theirs))
                        finite = np.isfinite(theirs) & np.isfinite(ours)
                        worst[name] = max_scaled_difference(np.where(same, 0, ours), np.where(same, 0, theirs)) \
                            if (same | finite).all() else float("inf")
                bad = {n: d for n, d in worst.items() if not d <= 1e-4}
                assert not bad, f"onnxruntime (opset {opset}) differs from blobtool's forward: {bad}"
                line = {"types": types, "opset": opset, "worst": max(worst.values(), default=0.0)}
        SWEEP.lines.append(line)


# BVLC's CIFAR-10 "full" net (examples/cifar10) as this snapshot has it: an InnerProduct of 500
# and a ReLU before the 10 scores. Written from the blobs' shapes and the example's layers.
CIFAR10_DEPLOY = """
name: "CIFAR10_full_deploy"
layer { name: "cifar" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 32 dim: 32 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 32 pad: 2 kernel_size: 5 stride: 1 } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "relu1" type: "ReLU" bottom: "pool1" top: "pool1" }
layer { name: "norm1" type: "LRN" bottom: "pool1" top: "norm1"
  lrn_param { local_size: 3 alpha: 5e-05 beta: 0.75 norm_region: WITHIN_CHANNEL } }
layer { name: "conv2" type: "Convolution" bottom: "norm1" top: "conv2"
  convolution_param { num_output: 32 pad: 2 kernel_size: 5 stride: 1 } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "norm2" type: "LRN" bottom: "pool2" top: "norm2"
  lrn_param { local_size: 3 alpha: 5e-05 beta: 0.75 norm_region: WITHIN_CHANNEL } }
layer { name: "conv3" type: "Convolution" bottom: "norm2" top: "conv3"
  convolution_param { num_output: 64 pad: 2 kernel_size: 5 stride: 1 } }
layer { name: "relu3" type: "ReLU" bottom: "conv3" top: "conv3" }
layer { name: "pool3" type: "Pooling" bottom: "conv3" top: "pool3" pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool3" top: "ip1" inner_product_param { num_output: 500 } }
layer { name: "relu4" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" inner_product_param { num_output: 10 } }
layer { name: "prob" type: "Softmax" bottom: "ip2" top: "prob" }
"""


def run_and_export(tmp_path, message, feeds: dict, tolerance: float = 1e-5) -> dict:
    """blobtool run's value of every blob; the export of the net, run in onnxruntime, asserted equal blob by blob.

    The model is written everywhere (writing needs no onnx); it is run where the
    onnx extra is installed, as the layer sweeps' exports are (export_available).
    """
    from runner import ok

    _, model = write_net_files(tmp_path, message)
    args = []
    for name, value in feeds.items():
        np.save(tmp_path / f"{name}.npy", value)
        args += ["--input", f"{name}={tmp_path / f'{name}.npy'}"]
    ok("run", model, *args, "--outputs", "all", "-o", tmp_path / "run.npz")
    ran = dict(np.load(tmp_path / "run.npz"))
    ok("export", model, "--outputs", "all", "-o", tmp_path / "net.onnx")
    if not export_available():
        return ran
    import onnxruntime as ort

    session = ort.InferenceSession(str(tmp_path / "net.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    got = dict(zip(names, session.run(names, feeds)))
    assert set(ran) <= set(got), sorted(set(ran) - set(got))
    for name, value in ran.items():
        assert got[name].shape == value.shape, name
        finite = np.isfinite(value)
        # NaN and infinities at the same places, the finite values within `tolerance`
        np.testing.assert_array_equal(got[name][~finite], value[~finite], err_msg=name)
        assert max_scaled_difference(got[name][finite], value[finite]) <= tolerance, name
    return ran
