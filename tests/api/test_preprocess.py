"""blobtool.preprocess: its steps, crops, means and channels, and its resize against OpenCV's (pycaffe's Transformer: test_predict_caffe.py)."""

from __future__ import annotations

import numpy as np
import pytest

import blobtool
from blobtool.api.preprocessing import crop_boxes, mean_for, resize_bilinear, to_channels
from blobtool.errors import UsageError
from predictnets import photo_like

RNG = np.random.default_rng(47)


def test_integer_images_are_fractions_of_their_type():
    pixels = RNG.integers(0, 256, (4, 5, 3), dtype=np.uint8)
    deep = pixels.astype(np.uint16) * 257
    a = blobtool.preprocess([pixels], (3, 4, 5), rgb=True)
    b = blobtool.preprocess([deep], (3, 4, 5), rgb=True)
    np.testing.assert_allclose(a[0], pixels.transpose(2, 0, 1).astype(np.float32), rtol=1e-6)
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_per_channel_scale_is_applied_after_the_mean_in_each_channel():
    image = photo_like(6, 7, 3, seed=3)
    mean, scale = [0.485, 0.456, 0.406], [4.367, 4.464, 4.444]
    got = blobtool.preprocess([image], (1, 3, 6, 7), raw_scale=1, rgb=True, mean=mean, scale=scale)[0]
    want = (image.transpose(2, 0, 1) - np.array(mean, np.float32)[:, None, None]) * np.array(scale, np.float32)[:, None,
                                                                                                                  None]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_resize_equals_opencv_inter_linear_on_floats():
    cv2 = pytest.importorskip("cv2")
    image = photo_like(37, 53, 3, seed=4)
    for size in ((20, 30), (64, 96), (37, 20), (5, 80)):
        ours = resize_bilinear(image, *size)
        theirs = cv2.resize(image, (size[1], size[0]), interpolation=cv2.INTER_LINEAR)
        assert np.abs(ours - theirs).max() < 2e-6, size


def test_crops_are_caffes_centre_and_pycaffes_ten():
    assert crop_boxes((256, 256), (227, 227), False) == [(14, 14)]  # Caffe's data layer: (256 - 227) // 2
    assert crop_boxes((255, 300), (227, 227), False) == [(14, 36)]
    assert crop_boxes((8, 9), (4, 4), True) == [(0, 0), (0, 5), (4, 0), (4, 5), (2, 2)]
    image = photo_like(8, 9, 3, seed=5)
    ten = blobtool.preprocess([image], (3, 4, 4), resize=(8, 9), oversample=True, rgb=True, raw_scale=1)
    assert ten.shape == (10, 3, 4, 4)
    np.testing.assert_array_equal(ten[1], image[0:4, 5:9].transpose(2, 0, 1))
    np.testing.assert_array_equal(ten[6], image[0:4, 5:9][:, ::-1].transpose(2, 0, 1))


def test_mean_image_cropped_as_caffes_data_layer():
    mean = RNG.uniform(0, 255, (3, 10, 12)).astype(np.float32)
    np.testing.assert_array_equal(mean_for(mean, 3, (6, 6)), mean[:, 2:8, 3:9])
    # A mean of the resized image's size is taken where each crop came from, mirrored with it.
    image = photo_like(10, 12, 3, seed=6)
    ten = blobtool.preprocess([image], (3, 6, 6), resize=(10, 12), oversample=True, rgb=True, mean=mean)
    np.testing.assert_allclose(ten[3], image[4:10, 6:12].transpose(2, 0, 1) * 255 - mean[:, 4:10, 6:12], rtol=1e-5,
                               atol=1e-4)
    np.testing.assert_allclose(ten[8], (image[4:10, 6:12].transpose(2, 0, 1) * 255 - mean[:, 4:10, 6:12])[:, :, ::-1],
                               rtol=1e-5, atol=1e-4)


def test_channels_gray_and_colour():
    colour = photo_like(3, 4, 3, seed=7)
    np.testing.assert_allclose(to_channels(colour, 1)[..., 0], colour @ np.array([0.299, 0.587, 0.114]), rtol=1e-5)
    gray = photo_like(3, 4, 1, seed=8)
    np.testing.assert_array_equal(to_channels(gray, 3), np.repeat(gray, 3, axis=2))


@pytest.mark.parametrize("options, text", [
    ({"mean": [1, 2]}, "--mean: 2 values for a net input of 3 channels"),
    ({"scale": [1, 2]}, "--scale: 2 factors for a net input of 3 channels"),
    ({"mean": np.zeros((3, 4, 4))}, "--mean: a mean image of 4x4 is smaller than the 6x6"),
    ({"mean": np.zeros((2, 6, 6))}, "--mean: a mean image of shape (2, 6, 6)"),
])
def test_bad_settings_are_one_line(options, text):
    with pytest.raises(UsageError, match=text.replace("(", r"\(").replace(")", r"\)")):
        blobtool.preprocess([photo_like(6, 6)], (3, 6, 6), **options)
