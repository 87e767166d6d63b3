"""export --dynamic: models of any batch, height and width, proved in onnxruntime against `blobtool run`.

Each net is exported once with --dynamic (at its definition's size) and
run in onnxruntime at three other input sizes (odd and even sides, batch
1 and 2); every blob the model outputs (`--outputs all`) must equal
blobtool's forward of the same input at that size (`run --input-shape`)
within 1e-5 of the blob's largest magnitude. The nets: an MTCNN P-Net
shape (convolutions, PReLU, MAX pooling with Caffe's ceil rounding, two
heads, Softmax over channels), a super-resolution shape (convolution,
Deconvolution, Crop against the input, Eltwise, Upsample, Interp by zoom
factor, Flatten and Reshape with 0 and -1), the real MTCNN P-Net file
(../shared/realworld/mtcnn_det1_half.caffemodel, FP16 convolutions), and a
net whose InnerProduct over the spatial axes ties height and width: the
line naming the layer and the axes is asserted, and the model runs at any
batch at its fixed size. Also: a pooling whose ceil rounding ONNX's rule
gives only from opset 22 ties at 17 and stays free at 22; a layer written
with constant shapes (ShuffleChannel) ties every axis it sees; --check
runs at the exported size; --preprocess stays free unless its mean is an
image; info --layers --input-shape marks the free axes; without --dynamic
nothing changes (every dim a number, other sizes refused).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="ONNX export needs the onnx package (the `onnx` extra)")
ort = pytest.importorskip("onnxruntime", reason="the exported models are run by onnxruntime (the `onnx` extra)")

from caffenets import layer, net, write_net_files  # noqa: E402
from onnxvalid import every_export_checked  # noqa: F401,E402  (autouse: every model written is checked)
from runner import ok, one_json  # noqa: E402

from blobtool import api  # noqa: E402

TOLERANCE = 1e-5
MTCNN = Path(__file__).resolve().parents[3] / "shared" / "realworld" / "mtcnn_det1_half.caffemodel"


def _weights(rng, *shape, scale=0.3):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def pnet_shape(seed: int = 0):
    """MTCNN's P-Net as its det1.prototxt lays it out (its sizes), with random weights."""
    rng = np.random.default_rng(seed)

    def conv(name, bottom, c_in, c_out, k):
        return layer(name, "Convolution", bottom, blobs=[_weights(rng, c_out, c_in, k, k), _weights(rng, c_out)],
                     convolution_param={"num_output": c_out, "kernel_size": [k]})

    def prelu(name, bottom, c):
        return layer(name, "PReLU", bottom, bottom, blobs=[np.abs(_weights(rng, c))])

    layers = [conv("conv1", "data", 3, 10, 3), prelu("PReLU1", "conv1", 10),
              layer("pool1", "Pooling", "conv1", pooling_param={"pool": 0, "kernel_size": 2, "stride": 2}),
              conv("conv2", "pool1", 10, 16, 3), prelu("PReLU2", "conv2", 16),
              conv("conv3", "conv2", 16, 32, 3), prelu("PReLU3", "conv3", 32),
              conv("conv4-1", "conv3", 32, 2, 1), conv("conv4-2", "conv3", 32, 4, 1),
              layer("prob1", "Softmax", "conv4-1")]
    return net(layers, {"data": (1, 3, 12, 12)}, name="PNet")


def super_resolution_shape(seed: int = 1):
    """Features, an x2 Deconvolution cropped against the upsampled input, an Eltwise sum; a few shape layers."""
    rng = np.random.default_rng(seed)
    layers = [
        layer("conv1", "Convolution", "data", blobs=[_weights(rng, 8, 3, 3, 3), _weights(rng, 8)],
              convolution_param={"num_output": 8, "kernel_size": [3], "pad": [1]}),
        layer("relu1", "ReLU", "conv1", "conv1"),
        layer("pool1", "Pooling", "conv1", pooling_param={"pool": 1, "kernel_size": 3, "stride": 2, "pad": 1}),
        layer("deconv", "Deconvolution", "pool1", blobs=[_weights(rng, 8, 3, 4, 4), _weights(rng, 3)],
              convolution_param={"num_output": 3, "kernel_size": [4], "stride": [2], "pad": [0]}),
        layer("crop", "Crop", ["deconv", "data"], crop_param={"axis": 2, "offset": [1]}),
        layer("sum", "Eltwise", ["crop", "data"], eltwise_param={"operation": 1}),
        layer("up", "Upsample", "sum", upsample_param={"scale": 2}),
        layer("zoom", "Interp", "pool1", interp_param={"zoom_factor": 2}),
        layer("scale", "Scale", "zoom", blobs=[_weights(rng, 8), _weights(rng, 8)],
              scale_param={"bias_term": True}),
        layer("flat", "Flatten", "scale", flatten_param={"axis": 2}),
        layer("rows", "Reshape", "up", reshape_param={"shape": {"dim": [0, 0, -1]}}),
    ]
    return net(layers, {"data": (1, 3, 9, 10)}, name="SR")


def _export(model, dest, *extra):
    result = ok("export", model, "-o", dest, "--dynamic", "--outputs", "all", *extra)
    return result


def _agree_at_sizes(model, onnx_path, shapes, seed=0):
    """Each size: onnxruntime's every output against `blobtool run --input-shape` of the same input; worst difference."""
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    worst = 0.0
    for k, shape in enumerate(shapes):
        x = np.random.default_rng(seed + k).standard_normal(shape).astype(np.float32)
        ours = api.run(str(model), inputs={"data": x}, shapes={"data": shape}, outputs="all").values
        theirs = dict(zip(names, session.run(names, {"data": x})))
        assert set(theirs) <= set(ours)
        for name, value in theirs.items():
            expected = np.asarray(ours[name], np.float32)
            assert value.shape == expected.shape, (shape, name, value.shape, expected.shape)
            scale = max(float(np.abs(expected).max(initial=0.0)), 1e-30)
            difference = float(np.abs(value - expected).max(initial=0.0)) / scale
            assert difference <= TOLERANCE, (shape, name, difference)
            worst = max(worst, difference)
    return worst


def _input_dims(onnx_path):
    model = onnx.load(str(onnx_path))
    return [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]


def test_pnet_shape_runs_at_any_size(tmp_path):
    _, model = write_net_files(tmp_path, pnet_shape())
    dest = tmp_path / "pnet.onnx"
    result = _export(model, dest)
    assert "--dynamic" not in result.stderr  # nothing in P-Net ties an axis
    assert _input_dims(dest) == ["N", 3, "H", "W"]
    _agree_at_sizes(model, dest, [(1, 3, 12, 12), (2, 3, 25, 17), (1, 3, 48, 31)])


def test_super_resolution_shape_runs_at_any_size(tmp_path):
    _, model = write_net_files(tmp_path, super_resolution_shape())
    dest = tmp_path / "sr.onnx"
    result = _export(model, dest)
    assert "--dynamic" not in result.stderr
    assert _input_dims(dest) == ["N", 3, "H", "W"]
    session_outputs = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim]
                       for o in onnx.load(str(dest)).graph.output}
    # The Crop against the input and the Eltwise keep the input's own sizes, named as its.
    assert session_outputs["sum"] == ["N", 3, "H", "W"]
    _agree_at_sizes(model, dest, [(1, 3, 9, 10), (2, 3, 16, 21), (1, 3, 33, 8)])


def test_real_mtcnn_pnet_runs_at_any_size(tmp_path):
    if not MTCNN.is_file():
        pytest.skip(f"{MTCNN} (the real-world files of ../shared/realworld) is not here")
    dest = tmp_path / "det1.onnx"
    ok("export", MTCNN, "-o", dest, "--dynamic", "--outputs", "all", "--input-shape", "data=1,3,12,12")
    assert _input_dims(dest) == ["N", 3, "H", "W"]
    _agree_at_sizes(MTCNN, dest, [(1, 3, 12, 12), (2, 3, 31, 24), (1, 3, 64, 47)])


def tied_net(seed: int = 2):
    """A convolution, then an InnerProduct over (C, H, W): height and width are fixed, the batch is not."""
    rng = np.random.default_rng(seed)
    layers = [layer("conv", "Convolution", "data", blobs=[_weights(rng, 4, 3, 3, 3), _weights(rng, 4)],
                    convolution_param={"num_output": 4, "kernel_size": [3]}),
              layer("fc", "InnerProduct", "conv", blobs=[_weights(rng, 5, 4 * 6 * 6), _weights(rng, 5)],
                    inner_product_param={"num_output": 5}),
              layer("prob", "Softmax", "fc")]
    return net(layers, {"data": (1, 3, 8, 8)}, name="tied")


def test_inner_product_ties_height_and_width(tmp_path):
    _, model = write_net_files(tmp_path, tied_net())
    dest = tmp_path / "tied.onnx"
    result = _export(model, dest)
    lines = [line for line in result.stderr.splitlines() if "--dynamic" in line]
    assert len(lines) == 1, result.stderr
    assert "layer 'fc' (InnerProduct) fixes H (height) = 8, W (width) = 8" in lines[0]
    assert _input_dims(dest) == ["N", 3, 8, 8]
    _agree_at_sizes(model, dest, [(1, 3, 8, 8), (2, 3, 8, 8), (3, 3, 8, 8)])
    session = ort.InferenceSession(str(dest), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="(?i)dimension"):
        session.run(None, {"data": np.zeros((1, 3, 9, 9), np.float32)})


def test_check_runs_at_the_exported_size(tmp_path):
    _, model = write_net_files(tmp_path, pnet_shape())
    dest = tmp_path / "checked.onnx"
    record = one_json(ok("export", model, "-o", dest, "--dynamic", "--check", "--json"))
    assert record["inputs"] == {"data": ["N", 3, "H", "W"]}
    assert record["outputs"]["prob1"][:2] == ["N", 2]
    assert record["check"]["passed"] is True
    assert record["check"]["inputs"][0]["shape"] == [1, 3, 12, 12]
    assert _input_dims(dest) == ["N", 3, "H", "W"]


def test_a_layer_written_with_constant_shapes_ties_every_axis_it_sees(tmp_path):
    rng = np.random.default_rng(4)
    message = net([layer("conv", "Convolution", "data", blobs=[_weights(rng, 4, 3, 1, 1), _weights(rng, 4)],
                         convolution_param={"num_output": 4, "kernel_size": [1]}),
                   layer("shuffle", "ShuffleChannel", "conv", shuffle_channel_param={"group": 2})],
                  {"data": (1, 3, 6, 5)})
    _, model = write_net_files(tmp_path, message)
    dest = tmp_path / "shuffle.onnx"
    result = _export(model, dest)
    lines = [line for line in result.stderr.splitlines() if "--dynamic" in line]
    assert len(lines) == 1, result.stderr
    assert ("layer 'shuffle' (ShuffleChannel) fixes N (batch) = 1, H (height) = 6, W (width) = 5 at the exported "
            "size: blobtool writes its shapes as constants") in lines[0]
    assert _input_dims(dest) == [1, 3, 6, 5]
    _agree_at_sizes(model, dest, [(1, 3, 6, 5)])


def test_info_layers_marks_the_free_axes(tmp_path):
    _, model = write_net_files(tmp_path, tied_net())
    record = one_json(ok("info", "--layers", "--json", "--input-shape", "data=2,3,8,8", model))
    # fc ties height and width for the whole graph: conv before it keeps only its batch free.
    assert record["free_axes"]["conv"] == [{"0": ["N"]}]
    assert record["free_axes"]["fc"] == [{"0": ["N"]}]
    _, pnet = write_net_files(tmp_path, pnet_shape(), stem="pnet")
    record = one_json(ok("info", "--layers", "--json", "--input-shape", "data=2,3,12,12", pnet))
    assert record["free_axes"]["conv3"] == [{"0": ["N"], "2": ["H"], "3": ["W"]}]
    text = ok("info", "--layers", "--input-shape", "data=2,3,8,8", model).stdout
    assert "free axes (--dynamic)" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("fc "))
    assert row.split()[-2:] == ["0:N", "2x5"]  # the free axes, then the top shapes, still the last column
    plain = ok("info", "--layers", model).stdout
    assert "free axes" not in plain


def test_without_dynamic_the_bytes_do_not_change(tmp_path):
    """--dynamic off writes what export wrote before it existed: every dim a number, no Shape node."""
    _, model = write_net_files(tmp_path, super_resolution_shape())
    dest = tmp_path / "static.onnx"
    ok("export", model, "-o", dest, "--outputs", "all")
    written = onnx.load(str(dest))
    assert _input_dims(dest) == [1, 3, 9, 10]
    assert "Shape" not in {n.op_type for n in written.graph.node}
    session = ort.InferenceSession(str(dest), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="(?i)dimension"):
        session.run(None, {"data": np.zeros((1, 3, 10, 10), np.float32)})


def test_pooling_whose_ceil_rounding_needs_the_size_ties(tmp_path):
    """Kernel 2, stride 2, pad 1: Caffe drops a last window in the pad that ONNX's ceil_mode keeps before opset 22."""
    rng = np.random.default_rng(3)
    message = net([layer("conv", "Convolution", "data", blobs=[_weights(rng, 2, 3, 1, 1)],
                         convolution_param={"num_output": 2, "kernel_size": [1], "bias_term": False}),
                   layer("pool", "Pooling", "conv", pooling_param={"pool": 0, "kernel_size": 2, "stride": 2,
                                                                   "pad": 1})],
                  {"data": (1, 3, 7, 6)})
    _, model = write_net_files(tmp_path, message)
    dest = tmp_path / "pool17.onnx"
    result = _export(model, dest, "--opset", "17")
    assert "layer 'pool' (Pooling) fixes H (height) = 7, W (width) = 6" in result.stderr
    assert _input_dims(dest) == ["N", 3, 7, 6]
    _agree_at_sizes(model, dest, [(1, 3, 7, 6), (2, 3, 7, 6)])
    dest22 = tmp_path / "pool22.onnx"
    # From opset 22 ONNX's ceil_mode drops that window too: the axes stay free.
    result = _export(model, dest22, "--opset", "22")
    assert "--dynamic" not in result.stderr
    assert _input_dims(dest22) == ["N", 3, "H", "W"]
    _agree_at_sizes(model, dest22, [(1, 3, 7, 6), (2, 3, 8, 9), (1, 3, 13, 4)])


def test_preprocessing_keeps_the_size_free_unless_its_mean_is_an_image(tmp_path):
    _, model = write_net_files(tmp_path, pnet_shape())
    dest = tmp_path / "pixels.onnx"
    result = ok("export", model, "-o", dest, "--dynamic", "--preprocess", "--mean", "104,117,123")
    assert "--dynamic" not in result.stderr
    assert _input_dims(dest) == ["N", "H", "W", 3]
    session = ort.InferenceSession(str(dest), providers=["CPUExecutionProvider"])
    pixels = np.random.default_rng(5).integers(0, 256, (2, 21, 16, 3), dtype=np.uint8)
    x = np.ascontiguousarray(pixels.astype(np.float32).transpose(0, 3, 1, 2)[:, ::-1]) - np.float32(
        [104, 117, 123]).reshape(1, 3, 1, 1)
    ours = api.run(str(model), inputs={"data": x}, shapes={"data": x.shape}, outputs=["prob1"]).values["prob1"]
    theirs = session.run(["prob1"], {"data": pixels})[0]
    assert np.abs(theirs - ours).max() <= TOLERANCE * np.abs(ours).max()
    mean = tmp_path / "mean.npy"
    np.save(mean, np.full((3, 12, 12), 100, np.float32))
    result = ok("export", model, "-o", tmp_path / "image_mean.onnx", "--dynamic", "--preprocess", "--mean", mean)
    assert ("--dynamic: the preprocessing of input 'data' fixes H (height) = 12, W (width) = 12 at the exported size: "
            "its mean is an image of that size") in result.stderr
    assert _input_dims(tmp_path / "image_mean.onnx") == ["N", 12, 12, 3]
