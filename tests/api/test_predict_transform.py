"""A training net's data layer for predict and export --preprocess: mirror, force_gray/force_color, is_color, the
data layer's line, and the pixels' channel order of a baked export (onnxruntime)."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from PIL import Image

import blobtool
from caffenets import layer, write_net_files
from onnxvalid import every_export_checked  # noqa: F401
from predictnets import classifier, photo, segmenter
from runner import invoke, ok

TAKEN_AS_THEY_ARE = "the inputs given here are taken as they are"


def _trained(rng, kind: str, transform: dict, channels: int = 3, size: int = 8, **params):
    """A classifier on `size` x `size` images fed by a data layer of `kind` whose transform_param is `transform`."""
    message = classifier(rng, channels=channels, size=(size, size), batch=1)
    del message.input[:]
    del message.input_shape[:]
    message.layer.insert(0, layer("data", kind, (), ["data", "label"], transform_param=transform, **params))
    return message


def _memory(rng, transform: dict, channels: int = 3):
    return _trained(rng, "MemoryData", transform, channels, memory_data_param={
        "batch_size": 1, "channels": channels, "height": 8, "width": 8})


@pytest.fixture(scope="module")
def picture(tmp_path_factory):
    """(folder, a colour PNG, a gray PNG), 8 x 8."""
    folder = tmp_path_factory.mktemp("transform")
    Image.fromarray(photo(8, 8, seed=11)).save(folder / "colour.png")
    Image.fromarray(photo(8, 8, seed=12)[..., 1]).save(folder / "gray.png")
    return folder, folder / "colour.png", folder / "gray.png"


def _stderr_lines(result, fragment: str) -> list:
    return [line for line in result.stderr.splitlines() if fragment in line]


def test_the_data_layers_line_says_what_predict_and_export_do(picture):
    folder, colour, _ = picture
    _, model = write_net_files(folder, _memory(np.random.default_rng(1), {"scale": 0.5, "mean_value": [104.0, 117.0,
                                                                                                      123.0]}),
                               stem="said")
    plain = ok("export", model, "-o", folder / "plain.onnx")  # the inputs are given preprocessed: the line says so
    assert len(_stderr_lines(plain, TAKEN_AS_THEY_ARE)) == 1
    baked = ok("export", model, "-o", folder / "baked.onnx", "--preprocess")
    assert not _stderr_lines(baked, TAKEN_AS_THEY_ARE), baked.stderr
    (line,) = _stderr_lines(baked, "data layer data preprocessed its images (scale 0.5")
    assert line.endswith("the exported model takes uint8 pixels and does in front of the graph the preprocessing "
                         "said below")
    (steps,) = _stderr_lines(baked, "the model takes uint8 pixels")
    assert "minus mean 104,117,123, then times 0.5" in steps
    predicted = ok("predict", model, colour)
    assert not _stderr_lines(predicted, TAKEN_AS_THEY_ARE), predicted.stderr
    (steps,) = _stderr_lines(predicted, "preprocessing: ")
    assert "minus mean 104,117,123, then times 0.5" in steps


def test_mirror_is_said_and_not_done(picture):
    folder, colour, _ = picture
    transform = {"mirror": True, "mean_value": [100.0, 110.0, 120.0]}
    _, model = write_net_files(folder, _memory(np.random.default_rng(2), transform), stem="mirror")
    result = ok("predict", model, colour, "--json")
    (steps,) = _stderr_lines(result, "preprocessing: ")
    assert "; not mirrored (data layer data's transform_param asks for mirror" in steps
    record = json.loads(result.stdout)
    assert record["preprocessing"]["mirror"] == {"done": False, "asked_by": "data layer data's transform_param"}
    (net_input,) = blobtool.predict(model, [colour]).inputs
    image = photo(8, 8, seed=11)
    want = blobtool.preprocess([image], (3, 8, 8), mean=[100, 110, 120])
    np.testing.assert_array_equal(net_input, want)
    flipped = blobtool.preprocess([image[:, ::-1]], (3, 8, 8), mean=[100, 110, 120])
    assert not np.array_equal(net_input, flipped)  # the picture is not symmetric: a flip would show
    baked = ok("export", model, "-o", folder / "mirror.onnx", "--preprocess")
    assert "not mirrored" in _stderr_lines(baked, "the model takes uint8 pixels")[0]
    unasked = ok("predict", write_net_files(folder, _memory(np.random.default_rng(2), {"scale": 1.0}),
                                            stem="nomirror")[1], colour, "--json")
    assert "mirror" not in json.loads(unasked.stdout)["preprocessing"] and "mirrored" not in unasked.stderr


@pytest.mark.parametrize("kind, transform, params, by", [
    ("Data", {"crop_size": 8, "force_gray": True}, {"data_param": {"source": "train_lmdb", "batch_size": 4}},
     "force_gray of data layer data"),
    ("ImageData", {"crop_size": 8}, {"image_data_param": {"source": "list.txt", "is_color": False}},
     "is_color: false of data layer data"),
])
def test_a_gray_decoding_data_layer_gives_opencvs_gray(picture, kind, transform, params, by):
    """Caffe's force_gray (cv::imdecode) and ImageData's is_color: false (cv::imread) decode gray in 8 bits."""
    folder, colour, _ = picture
    _, model = write_net_files(folder, _trained(np.random.default_rng(3), kind, transform, channels=1, **params),
                               stem=f"gray_{kind}")
    result = blobtool.predict(model, [colour])
    (net_input,) = result.inputs
    assert net_input.shape == (1, 1, 8, 8)  # the crop_size's input, one channel as the decoding says
    opencv = cv2.imread(str(colour), cv2.IMREAD_GRAYSCALE).astype(np.float32)
    np.testing.assert_array_equal(np.rint(net_input[0, 0]), opencv)
    np.testing.assert_allclose(net_input[0, 0], opencv, rtol=0, atol=3e-5)  # k / 255 * 255 in float32
    luma = (photo(8, 8, seed=11).astype(np.float32) / 255) @ np.float32([0.299, 0.587, 0.114]) * 255
    assert not np.allclose(net_input[0, 0], luma, rtol=0, atol=1e-3)  # not the float luma of a plain gray net
    assert result.settings.line().startswith(f"preprocessing: colour images made 8-bit gray as OpenCV decodes them "
                                             f"({by})")
    assert result.records[0]["preprocessing"]["decoded_as"] == {"channels": "gray", "by": by}
    # An array (uint8 RGB) has no file format: OpenCV's own conversion, as its imread of a BMP makes.
    array = photo(8, 8, seed=11)
    cv2.imwrite(str(folder / f"{kind}.bmp"), array[..., ::-1])
    (from_array,) = blobtool.predict(model, [array]).inputs
    np.testing.assert_array_equal(np.rint(from_array[0, 0]), cv2.imread(str(folder / f"{kind}.bmp"),
                                                                         cv2.IMREAD_GRAYSCALE))


@pytest.mark.parametrize("suffix, options", [(".bmp", {}), (".tif", {}), (".webp", {"lossless": True}),
                                             (".png", {})])
def test_force_gray_follows_each_formats_opencv_decoder(tmp_path, suffix, options):
    """OpenCV turns colour to gray in the decoder of each format (libpng's, its own, cvtColor's): each is met."""
    image = photo(24, 32, seed=13)
    Image.fromarray(image).save(tmp_path / f"p{suffix}", **options)
    message = _trained(np.random.default_rng(3), "Data", {"crop_size": 8, "force_gray": True}, channels=1,
                       data_param={"source": "train_lmdb", "batch_size": 4})
    _, model = write_net_files(tmp_path, message, stem="gray")
    (net_input,) = blobtool.predict(model, [tmp_path / f"p{suffix}"], resize=(24, 32)).inputs
    opencv = cv2.imread(str(tmp_path / f"p{suffix}"), cv2.IMREAD_GRAYSCALE).astype(np.float32)
    np.testing.assert_array_equal(np.rint(net_input[0, 0]), opencv[8:16, 12:20])  # the centre crop of 8 x 8


def test_force_gray_of_a_jpeg_is_within_a_few_levels_of_libjpegs(tmp_path):
    """A JPEG's gray is libjpeg's luma before any RGB: from Pillow's RGB it is met within a few levels."""
    Image.fromarray(photo(64, 64, seed=11)).save(tmp_path / "p.jpg", quality=90)
    message = _trained(np.random.default_rng(3), "Data", {"crop_size": 64, "force_gray": True}, channels=1,
                       size=64, data_param={"source": "train_lmdb", "batch_size": 4})
    _, model = write_net_files(tmp_path, message, stem="gray")
    (net_input,) = blobtool.predict(model, [tmp_path / "p.jpg"]).inputs
    opencv = cv2.imread(str(tmp_path / "p.jpg"), cv2.IMREAD_GRAYSCALE).astype(np.float32)
    difference = np.abs(np.rint(net_input[0, 0]) - opencv)
    # Measured: 4 levels of 255 at most, 1.8% of the pixels differ at all (libjpeg's luma is not computed from RGB).
    assert 0 < difference.max() <= 4 and np.mean(difference > 0) < 0.05, (difference.max(), np.mean(difference > 0))


def test_force_color_makes_a_gray_image_opencvs_colour(picture):
    folder, _, gray = picture
    _, model = write_net_files(folder, _memory(np.random.default_rng(4), {"force_color": True}), stem="colour")
    result = ok("predict", model, gray, "--json")
    (steps,) = _stderr_lines(result, "preprocessing: ")
    assert "gray images made colour as OpenCV decodes them (force_color of data layer data)" in steps
    (net_input,) = blobtool.predict(model, [gray]).inputs
    opencv = cv2.imread(str(gray), cv2.IMREAD_COLOR).astype(np.float32).transpose(2, 0, 1)  # BGR, as Caffe's
    np.testing.assert_allclose(net_input[0], opencv, rtol=0, atol=3e-5)


def test_a_decoding_the_input_contradicts_follows_the_input(picture):
    folder, colour, _ = picture
    _, model = write_net_files(folder, _memory(np.random.default_rng(5), {"force_gray": True}), stem="contradicts")
    result = ok("predict", model, colour)
    assert ("force_gray of data layer data decodes images to gray, but the net's input has 3 channels: the images "
            "are made colour as the input takes them") in result.stderr
    assert "OpenCV" not in _stderr_lines(result, "preprocessing: ")[0]
    (net_input,) = blobtool.predict(model, [colour]).inputs
    np.testing.assert_array_equal(net_input, blobtool.preprocess([photo(8, 8, seed=11)], (3, 8, 8)))
    baked = ok("export", model, "-o", folder / "forced.onnx", "--preprocess")
    assert ("data layer data's force_gray decoded its images gray: the model takes 3-channel pixels, decoded so by "
            "the caller") in baked.stderr


ort = pytest.importorskip("onnxruntime")


def _net_input_and_outputs(path, pixels: np.ndarray, last: str) -> dict:
    """onnxruntime's values of the model at `path` fed `pixels`, the value `last` (the net's input) among them."""
    import onnx

    model = onnx.load(str(path))
    model.graph.output.add().name = last
    probe = path.with_suffix(".probe.onnx")
    onnx.save(model, str(probe))
    session = ort.InferenceSession(str(probe), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, {"data": pixels})))


@pytest.mark.parametrize("net_rgb", [False, True], ids=["bgr-net", "rgb-net"])
def test_bgr_pixels_give_predicts_net_input(tmp_path, net_rgb):
    """--pixels BGR: the model fed OpenCV's BGR pixels computes predict's net input to the bit, and its outputs."""
    _, model = write_net_files(tmp_path, segmenter(np.random.default_rng(6), size=(6, 10), classes=3), stem="seg")
    image = photo(6, 10, seed=5)
    Image.fromarray(image).save(tmp_path / "p.png")
    bgr = cv2.imread(str(tmp_path / "p.png"), cv2.IMREAD_COLOR)  # what an OpenCV user holds
    np.testing.assert_array_equal(bgr, image[..., ::-1])
    rgb_flag = ["--rgb"] if net_rgb else []
    result = ok("export", model, "-o", tmp_path / "bgr.onnx", "--preprocess", "--pixels", "BGR", "--mean",
                "90,100,110", "--scale", "0.02", *rgb_flag, "--check")
    (steps,) = _stderr_lines(result, "the model takes uint8 pixels")
    assert "in BGR order (1x6x10x3)" in steps
    assert ("BGR -> RGB" if net_rgb else "BGR kept") in steps
    predicted = blobtool.predict(model, [tmp_path / "p.png"], mean=[90, 100, 110], scale=0.02, rgb=net_rgb)
    got = _net_input_and_outputs(tmp_path / "bgr.onnx", bgr[None], "data/scale_applied")
    np.testing.assert_array_equal(got["data/scale_applied"], predicted.inputs[0])
    np.testing.assert_allclose(got["score"], predicted.outputs[0]["score"], rtol=1e-5, atol=1e-5)
    ok("export", model, "-o", tmp_path / "rgb.onnx", "--preprocess", "--mean", "90,100,110", "--scale", "0.02",
       *rgb_flag)
    from_rgb = _net_input_and_outputs(tmp_path / "rgb.onnx", image[None], "data/scale_applied")
    np.testing.assert_array_equal(from_rgb["data/scale_applied"], predicted.inputs[0])
    swaps = ["Gather" == n.op_type for n in __import__("onnx").load(str(tmp_path / "bgr.onnx")).graph.node]
    assert any(swaps) == net_rgb  # BGR pixels into a BGR net: no swap at all


def test_pixels_needs_preprocess_and_a_known_order(tmp_path):
    _, model = write_net_files(tmp_path, classifier(np.random.default_rng(7)), stem="net")
    refused = invoke("export", model, "-o", tmp_path / "x.onnx", "--pixels", "bgr")
    assert refused.exit_code == 2 and "--pixels applies only with --preprocess" in refused.stderr
    unknown = invoke("export", model, "-o", tmp_path / "x.onnx", "--preprocess", "--pixels", "YUV")
    assert unknown.exit_code == 2 and "'YUV' is not one of 'rgb', 'bgr'" in unknown.stderr, unknown.stderr
    assert not (tmp_path / "x.onnx").exists()
    from blobtool.errors import UsageError

    with pytest.raises(UsageError, match="RGB or BGR"):
        blobtool.export(model, tmp_path / "x.onnx", preprocess={"pixels": "HSV"}, warn=lambda line: None)
    assert not (tmp_path / "x.onnx").exists()
