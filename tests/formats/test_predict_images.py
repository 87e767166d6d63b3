"""Decoding for predict: EXIF orientation, 16-bit and palette PNG, gray and colour nets, the net's transform_param."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

import blobtool
from blobtool.formats.images import decode_image
from caffenets import layer, net, write_net_files
from predictnets import classifier, files, photo
from runner import invoke

REAL_MEAN = __import__("pathlib").Path(__file__).resolve().parents[3] / "shared" / "realworld" / \
    "imagenet_mean.binaryproto"


def test_exif_orientation_is_followed(tmp_path):
    stored = photo(4, 6, seed=1)
    exif = Image.Exif()
    exif[0x0112] = 6  # shown turned 90 degrees clockwise
    Image.fromarray(stored).save(tmp_path / "turned.png", exif=exif)
    decoded = decode_image(tmp_path / "turned.png")
    assert decoded.size == (6, 4)
    np.testing.assert_array_equal(np.round(decoded.pixels * 255).astype(np.uint8), np.rot90(stored, k=-1))
    assert decoded.notes == ["EXIF orientation 6 followed (turned as a viewer shows it)"]


def test_sixteen_bit_png_keeps_its_bits(tmp_path):
    values = np.random.default_rng(2).integers(0, 65536, (5, 7), dtype=np.uint16)
    Image.fromarray(values).save(tmp_path / "deep.png")
    decoded = decode_image(tmp_path / "deep.png")
    assert decoded.pixels.shape == (5, 7, 1)
    np.testing.assert_allclose(decoded.pixels[..., 0], values / 65535.0, rtol=1e-6)


def test_palette_png_is_expanded(tmp_path):
    rgb = photo(6, 8, seed=3)
    paletted = Image.fromarray(rgb).convert("P", palette=Image.ADAPTIVE, colors=16)
    paletted.save(tmp_path / "palette.png")
    decoded = decode_image(tmp_path / "palette.png")
    want = np.asarray(paletted.convert("RGB"), np.float32) / 255
    np.testing.assert_array_equal(decoded.pixels, want)
    assert "palette expanded" in decoded.notes


def test_gray_into_colour_net_and_colour_into_gray_net(tmp_path):
    gray = photo(8, 8, seed=4)[..., 0]
    Image.fromarray(gray).save(tmp_path / "gray.png")
    Image.fromarray(photo(8, 8, seed=5)).save(tmp_path / "colour.png")
    colour_net = files(tmp_path, classifier(np.random.default_rng(1), channels=3), "colour")[1]
    gray_net = files(tmp_path, classifier(np.random.default_rng(1), channels=1), "gray")[1]
    (into_colour,) = blobtool.predict(colour_net, [tmp_path / "gray.png"]).inputs
    np.testing.assert_array_equal(into_colour[0], np.repeat(gray[None].astype(np.float32), 3, axis=0))
    (into_gray,) = blobtool.predict(gray_net, [tmp_path / "colour.png"]).inputs
    rgb = photo(8, 8, seed=5).astype(np.float32) / 255
    np.testing.assert_allclose(into_gray[0, 0], (rgb @ [0.299, 0.587, 0.114]) * 255, rtol=1e-5)


def _memory_data_net(rng, transform: dict):
    """A classifier fed by a MemoryData layer whose transform_param states the preprocessing."""
    message = classifier(rng, size=(8, 8), batch=1)
    del message.input[:]
    del message.input_shape[:]
    data = layer("data", "MemoryData", (), ["data", "label"],
                 memory_data_param={"batch_size": 1, "channels": 3, "height": 8, "width": 8},
                 transform_param=transform)
    message.layer.insert(0, data)
    return message


def test_defaults_from_transform_param_and_a_mean_file_not_opened(tmp_path):
    transform = {"scale": 0.5, "mean_value": [104.0, 117.0, 123.0]}
    _, model = write_net_files(tmp_path, _memory_data_net(np.random.default_rng(3), transform), stem="train")
    _, other = write_net_files(tmp_path, _memory_data_net(np.random.default_rng(3), {
        "mean_file": "elsewhere/mean.binaryproto"}), stem="other")
    Image.fromarray(photo(8, 8, seed=6)).save(tmp_path / "p.png")
    result = invoke("predict", model, tmp_path / "p.png", "--json")
    assert result.exit_code == 0, result.stderr
    assert "scale 0.5 from data layer data's transform_param" in result.stderr
    result = invoke("predict", other, tmp_path / "p.png")
    assert result.exit_code == 0, result.stderr
    assert "mean_file elsewhere/mean.binaryproto, which is not opened here: give it with --mean FILE" in result.stderr
    lib = blobtool.predict(model, [tmp_path / "p.png"])
    want = blobtool.preprocess([photo(8, 8, seed=6)], (3, 8, 8), mean=[104, 117, 123], scale=0.5)
    np.testing.assert_array_equal(lib.inputs[0], want)
    given = blobtool.predict(model, [tmp_path / "p.png"], scale=1.0, mean=[0, 0, 0])
    np.testing.assert_array_equal(given.inputs[0], blobtool.preprocess([photo(8, 8, seed=6)], (3, 8, 8)))


@pytest.mark.skipif(not REAL_MEAN.exists(), reason="no ../shared/realworld/imagenet_mean.binaryproto")
def test_real_imagenet_mean_cropped_as_caffes_data_layer(tmp_path):
    _, model = files(tmp_path, classifier(np.random.default_rng(4), size=(227, 227), batch=1, classes=3), "big")
    image = photo(256, 256, seed=7)
    result = blobtool.predict(model, [image], mean=str(REAL_MEAN), resize=(256, 256))
    mean = np.asarray(blobtool.load(REAL_MEAN).data, np.float32).reshape(3, 256, 256)
    want = image[14:241, 14:241].astype(np.float32).transpose(2, 0, 1)[::-1] - mean[:, 14:241, 14:241]
    np.testing.assert_allclose(result.inputs[0][0], want, rtol=1e-5, atol=1e-3)
    assert result.records[0]["preprocessing"]["mean"] == {"image": str(REAL_MEAN), "shape": [3, 256, 256]}


def _data_layer_net(rng, transform: dict):
    """A classifier fed by an LMDB Data layer, which states no shape: a training snapshot's."""
    message = classifier(rng, size=(8, 8), batch=1)
    del message.input[:]
    del message.input_shape[:]
    message.layer.insert(0, layer("data", "Data", (), ["data", "label"], data_param={"source": "train_lmdb",
                                                                                     "batch_size": 64},
                                  transform_param=transform))
    return message


def test_a_data_layer_takes_its_shape_from_crop_size_or_input_shape(tmp_path):
    image = photo(12, 12, seed=8)
    Image.fromarray(image).save(tmp_path / "p.png")
    _, cropped = write_net_files(tmp_path, _data_layer_net(np.random.default_rng(4), {"crop_size": 8, "scale": 2.0}),
                                 stem="cropped")
    result = invoke("predict", cropped, tmp_path / "p.png", "--resize", "12,12", "--json")
    assert result.exit_code == 0, result.stderr
    lib = blobtool.predict(cropped, [tmp_path / "p.png"], resize=(12, 12))
    np.testing.assert_array_equal(lib.inputs[0], blobtool.preprocess([image], (3, 8, 8), resize=(12, 12), scale=2.0))
    _, plain = write_net_files(tmp_path, _data_layer_net(np.random.default_rng(4), {"scale": 0.5}), stem="plain")
    refused = invoke("predict", plain, tmp_path / "p.png")
    assert refused.exit_code == 2 and "--input-shape" in refused.stderr
    shaped = invoke("predict", plain, tmp_path / "p.png", "--input-shape", "data=1,3,8,8", "--json")
    assert shaped.exit_code == 0, shaped.stderr
    assert json.loads(shaped.stdout)["preprocessing"]["scale"] == [0.5]


def test_an_image_declaring_too_many_pixels_is_refused(tmp_path, monkeypatch):
    from PIL import Image as PILImage

    Image.fromarray(photo(40, 40, seed=1)).save(tmp_path / "big.png")
    monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", 100)  # Pillow refuses twice its bound: 1,600 > 200
    from blobtool.errors import FormatError

    with pytest.raises(FormatError, match="too many pixels to decode"):
        decode_image(tmp_path / "big.png")


@pytest.mark.parametrize("suffix, options, tolerance", [
    (".bmp", {}, 0), (".tif", {}, 0), (".webp", {"lossless": True}, 0), (".jpg", {"quality": 95}, None),
])
def test_every_format_decodes_to_rgb_fractions(tmp_path, suffix, options, tolerance):
    from PIL import features

    if suffix == ".webp" and not features.check("webp"):
        pytest.skip("this Pillow was built without WebP")
    pixels = photo(16, 24, seed=11)
    Image.fromarray(pixels).save(tmp_path / f"p{suffix}", **options)
    decoded = decode_image(tmp_path / f"p{suffix}")
    assert decoded.pixels.shape == (16, 24, 3) and decoded.pixels.dtype == np.float32
    with Image.open(tmp_path / f"p{suffix}") as opened:   # Pillow's own decode, as 8-bit RGB
        np.testing.assert_array_equal(np.round(decoded.pixels * 255), np.asarray(opened.convert("RGB")))
    if tolerance is not None:  # the lossless formats give the pixels back
        np.testing.assert_array_equal(np.round(decoded.pixels * 255), pixels)
