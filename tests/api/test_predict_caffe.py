"""blobtool's preprocessing against pycaffe's own, in one pycaffe process for the module.

- caffe.io.Transformer: every combination of channel swap, raw scale, mean
  (none, per channel, an image) and input scale, colour and gray; equal to
  float32 rounding.
- caffe.Classifier on a generated net: the centre crop and the ten crops of
  oversample, images of image_dims' size (no resize): equal to rounding.
- With a resize (48x64 photos to 12x16): top-1 agrees; the probabilities
  differ by the interpolation (skimage smooths before it shrinks).
- caffe.io.resize_image (skimage) against blobtool's resize and OpenCV's:
  the measured differences docs/preprocessing.md gives.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

import blobtool
from blobtool.api.preprocessing import resize_bilinear
from caffepreprocess import pycaffe
from predictnets import classifier, files, photo
from predictnets import photo_like

pytestmark = pytest.mark.caffe

MEANS = {"none": None, "small": [0.31, 0.2, 0.45], "channels": [104.0, 117.0, 123.0], "image": "mean_image"}
CLASSIFIER = {"swap": True, "raw_scale": 255.0, "mean": [104.0, 117.0, 123.0], "input_scale": 0.8}
RESIZES = ((12, 16), (24, 32), (96, 128))   # from 48 x 64: shrink by 4 and 2, grow by 2


class Cases:
    """Requests for the pycaffe process, the images they index, and what blobtool computed for each."""

    def __init__(self):
        self.requests, self.images, self.ours = [], [], []

    def image(self, array) -> int:
        self.images.append(np.asarray(array, np.float32))
        return len(self.images) - 1

    def add(self, request: dict, ours) -> None:
        self.requests.append(request)
        self.ours.append(ours)


def _transformer_cases(cases: Cases, mean_image) -> None:
    shape = (3, 12, 10)
    colour, gray = photo_like(12, 10, 3, seed=1), photo_like(12, 10, 1, seed=2)
    c, g = cases.image(colour), cases.image(gray)
    for swap, raw, mean, scale in itertools.product((False, True), (None, 255.0), MEANS, (None, 0.017)):
        given = mean_image if mean == "image" else MEANS[mean]
        cases.add({"kind": "transformer", "image": c, "shape": list(shape), "swap": swap, "raw_scale": raw,
                   "mean": None if mean == "image" else MEANS[mean],
                   "mean_image": "mean_image" if mean == "image" else None, "input_scale": scale},
                  blobtool.preprocess([colour], shape, mean=given, scale=scale, raw_scale=raw or 1.0, rgb=not swap)[0])
    for raw, mean, scale in itertools.product((None, 255.0), (None, [0.5]), (None, 2.0)):
        cases.add({"kind": "transformer", "image": g, "shape": [1, 12, 10], "raw_scale": raw, "mean": mean,
                   "input_scale": scale},
                  blobtool.preprocess([gray], (1, 12, 10), mean=mean, scale=scale, raw_scale=raw or 1.0)[0])


def _classifier_cases(cases: Cases, folder) -> None:
    _, model = files(folder, classifier(np.random.default_rng(5), size=(8, 8), batch=2), "exact")
    prototxt = folder / "exact.prototxt"
    images = [photo(10, 12, seed=k).astype(np.float32) / 255 for k in range(3)]
    index = [cases.image(im) for im in images]
    for oversample in (False, True):
        result = blobtool.predict(model, images, resize=(10, 12), oversample=oversample, mean=[104, 117, 123],
                                  scale=0.8, top=6)
        cases.add({"kind": "classifier", "prototxt": str(prototxt), "weights": str(model), "images": index,
                   "image_dims": [10, 12], "oversample": oversample, "name": f"oversample={oversample}",
                   **CLASSIFIER}, result)
    _, model = files(folder, classifier(np.random.default_rng(6), size=(8, 8), batch=1), "resized")
    photos = [photo(48, 64, seed=10 + k).astype(np.float32) / 255 for k in range(4)]
    result = blobtool.predict(model, photos, resize=(12, 16), mean=[104, 117, 123], scale=0.8)
    cases.add({"kind": "classifier", "prototxt": str(folder / "resized.prototxt"), "weights": str(model),
               "images": [cases.image(p) for p in photos], "image_dims": [12, 16], "oversample": False,
               "name": "resized", **CLASSIFIER}, result)


LENET = Path(__file__).resolve().parents[3] / "shared" / "realworld" / "lenet_iter_10000.caffemodel"
DIGITS = (0, 1, 3, 4, 7)


def digit(d: int, size: int = 140) -> np.ndarray:
    """A digit drawn white on black, as MNIST's are, with Pillow's lines (a test's own picture)."""
    from PIL import Image, ImageDraw

    image = Image.new("L", (140, 140), 0)
    pen = ImageDraw.Draw(image)
    strokes = {0: lambda: pen.ellipse([40, 25, 100, 115], outline=255, width=14),
               1: lambda: pen.line([70, 20, 70, 120], fill=255, width=14),
               3: lambda: (pen.arc([40, 20, 100, 70], -160, 90, fill=255, width=12),
                           pen.arc([40, 65, 100, 120], -90, 160, fill=255, width=12)),
               4: lambda: pen.line([85, 20, 85, 120, 85, 20, 35, 85, 110, 85], fill=255, width=14),
               7: lambda: pen.line([35, 25, 105, 25, 60, 120], fill=255, width=14)}
    strokes[d]()
    return np.asarray(image.resize((size, size)) if size != 140 else image)[:, :, None]


def _lenet_cases(cases: Cases, folder) -> None:
    """The real LeNet (Caffe's MNIST example, trained) on drawn digits shrunk from 140 to 28 pixels."""
    if not LENET.exists():
        return
    shapes = {"data": (1, 1, 28, 28)}
    deploy = folder / "lenet_deploy.prototxt"
    blobtool.deploy_definition(LENET, deploy, shapes=shapes, warn=lambda line: None)
    digits = [digit(d).astype(np.float32) / 255 for d in DIGITS]
    result = blobtool.predict(LENET, digits, shapes=shapes)
    cases.add({"kind": "classifier", "prototxt": str(deploy), "weights": str(LENET),
               "images": [cases.image(im) for im in digits], "image_dims": [28, 28], "oversample": False,
               "name": "lenet", "raw_scale": 255.0, "input_scale": 0.00390625}, result)


def _resize_cases(cases: Cases) -> None:
    for k in range(3):
        image = photo(48, 64, seed=20 + k).astype(np.float32) / 255
        i = cases.image(image)
        for size in RESIZES:
            cases.add({"kind": "resize", "image": i, "size": list(size)}, (image, resize_bilinear(image, *size)))


@pytest.fixture(scope="module")
def answered(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pycaffe")
    mean_image = np.random.default_rng(47).uniform(0, 200, (3, 12, 10)).astype(np.float32)
    cases = Cases()
    _transformer_cases(cases, mean_image)
    _classifier_cases(cases, folder)
    _resize_cases(cases)
    _lenet_cases(cases, folder)
    theirs = pycaffe(cases.requests, cases.images, folder, {"mean_image": mean_image})
    return list(zip(cases.requests, cases.ours, theirs))


def test_equals_pycaffe_transformer_every_combination(answered):
    done = [(r, o, t) for r, o, t in answered if r["kind"] == "transformer"]
    assert len(done) == 40
    worst = max(float(np.abs(o - t).max() / max(np.abs(t).max(), 1e-30)) for _, o, t in done)
    print(f"\nTransformer: worst difference {worst:.3g} of the largest magnitude")
    for request, ours, theirs in done:
        assert ours.dtype == np.float32 and ours.shape == theirs.shape, request
        np.testing.assert_allclose(ours, theirs, rtol=2e-7, atol=float(np.abs(theirs).max()) * 2e-7,
                                   err_msg=str(request))


@pytest.mark.parametrize("name", ["oversample=False", "oversample=True"])
def test_equals_caffe_classifier_without_a_resize(answered, name):
    ((_, result, theirs),) = [(r, o, t) for r, o, t in answered if r.get("name") == name]
    ours = np.stack([o["prob"].reshape(-1) for o in result.outputs])
    assert ours.shape == theirs.shape == (3, 6)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6)
    assert [r["answer"]["top"][0]["class"] for r in result.records] == np.argmax(theirs, axis=1).tolist()


def test_with_a_resize_top1_agrees_and_the_difference_is_the_interpolations(answered):
    ((_, result, theirs),) = [(r, o, t) for r, o, t in answered if r.get("name") == "resized"]
    ours = np.stack([o["prob"].reshape(-1) for o in result.outputs])
    assert np.argmax(ours, axis=1).tolist() == np.argmax(theirs, axis=1).tolist()
    print(f"\nresized 48x64 -> 12x16: probabilities differ by at most {np.abs(ours - theirs).max():.4f}")
    assert 0 < np.abs(ours - theirs).max() < 0.05


def test_resize_differences_from_skimage_and_opencv(answered):
    """Values 0-255. Growing, blobtool's bilinear is skimage's inside the image; at its edge skimage mirrors
    the image where blobtool and OpenCV repeat the edge pixel. Shrinking, skimage smooths first."""
    cv2 = pytest.importorskip("cv2")
    worst: dict = {}
    for request, (image, ours), theirs in (a for a in answered if a[0]["kind"] == "resize"):
        size = tuple(request["size"])
        pixels = np.clip(image * 255 + 0.5, 0, 255).astype(np.uint8)   # what Caffe's data layers resize
        opencv = cv2.resize(pixels, (size[1], size[0]), interpolation=cv2.INTER_LINEAR).astype(np.float32)
        gap = np.abs(ours - theirs) * 255
        found = [float(gap.max()), float(gap.mean()), float(gap[1:-1, 1:-1].max()),
                 float(np.abs(ours * 255 - opencv).max()), float(np.abs(ours * 255 - opencv).mean())]
        worst[size] = np.maximum(worst.get(size, found), found).tolist()
    print("\nresize: skimage max, mean, max inside; OpenCV uint8 max, mean (levels of 255):",
          {f"{h}x{w}": [round(v, 3) for v in f] for (h, w), f in worst.items()})
    assert worst[(96, 128)][2] < 1e-3                 # growing: skimage's order 1 is the same bilinear inside
    assert worst[(12, 16)][0] > 1                      # shrinking by 4: skimage smooths first
    assert all(f[3] <= 1.0 for f in worst.values())    # OpenCV on uint8: its rounding, within one level


def test_real_lenet_reads_drawn_digits_as_caffe_classifier_does(answered):
    """A resize by 5: top-1 is the digit drawn for both, and the probabilities differ by the interpolation."""
    found = [(o, t) for r, o, t in answered if r.get("name") == "lenet"]
    if not found:
        pytest.skip(f"no {LENET}")
    ((result, theirs),) = found
    ours = np.stack([o["prob"].reshape(-1) for o in result.outputs])
    assert np.argmax(ours, axis=1).tolist() == list(DIGITS) == np.argmax(theirs, axis=1).tolist()
    print(f"\nLeNet, digits 140 -> 28: probabilities differ by at most {np.abs(ours - theirs).max():.4f}")
    assert result.records[0]["preprocessing"]["scale"] == [0.00390625]   # the snapshot's transform_param
