"""blobtool predict and blobtool.predict: the three kinds of answer on generated nets, labels, the command's output."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

import blobtool
from blobtool.api.answers import read_labels
from predictnets import classifier, files, photo, segmenter, ssd
from runner import assert_error, invoke, json_lines, ok

RNG = np.random.default_rng(47)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    folder = tmp_path_factory.mktemp("predict")
    nets = {"classifier": files(folder, classifier(np.random.default_rng(1)), "classifier"),
            "segmenter": files(folder, segmenter(np.random.default_rng(2)), "segmenter"),
            "ssd": files(folder, ssd(np.random.default_rng(3)), "ssd")}
    images = folder / "images"
    images.mkdir()
    for k, (h, w) in enumerate(((8, 8), (20, 30), (9, 7))):
        Image.fromarray(photo(h, w, seed=k)).save(images / f"p{k}.png")
    (images / "notes.txt").write_text("not an image, and not named as one")
    return folder, nets, images


def _run(net, net_input):
    return blobtool.run(net, inputs={"data": net_input}).values


def test_classifier_answer_is_the_nets_output_on_the_preprocessed_image(made):
    folder, nets, images = made
    model = nets["classifier"][1]
    paths = sorted(images.glob("p*.png"))
    result = blobtool.predict(model, paths, mean=[100, 110, 120], scale=0.5, top=3)
    assert result.kind == "classes" and result.failed == 0
    for path, record, net_input in zip(paths, result.records, result.inputs):
        pixels = np.asarray(Image.open(path))
        np.testing.assert_array_equal(net_input, blobtool.preprocess([pixels], (3, 8, 8), mean=[100, 110, 120],
                                                                     scale=0.5))
        batch = np.concatenate([net_input, net_input])  # the net's batch is 2
        prob = _run(model, batch)["prob"][0]
        order = np.argsort(-prob, kind="stable")[:3]
        assert [c["class"] for c in record["answer"]["top"]] == order.tolist()
        assert [c["probability"] for c in record["answer"]["top"]] == pytest.approx(prob[order].tolist(), rel=1e-5)
        assert record["size"] == list(pixels.shape[:2])


def test_segmentation_class_map_and_shares(made):
    _, nets, _ = made
    image = photo(24, 32, seed=9)
    result = blobtool.predict(nets["segmenter"][1], [image])
    assert result.kind == "segmentation"
    scores = _run(nets["segmenter"][1], result.inputs[0])["score"][0]
    np.testing.assert_array_equal(result.classmaps[0], np.argmax(scores, axis=0))
    shares = {c["class"]: c["share"] for c in result.records[0]["answer"]["classes"]}
    counts = np.bincount(np.argmax(scores, axis=0).ravel(), minlength=4) / scores[0].size
    assert shares == {k: pytest.approx(v, abs=1e-6) for k, v in enumerate(counts) if v}
    assert sum(shares.values()) == pytest.approx(1.0)


def test_ssd_boxes_in_the_images_pixels(made):
    _, nets, _ = made
    image = photo(30, 50, seed=4)
    result = blobtool.predict(nets["ssd"][1], [image], threshold=0.2, labels=["bg", "cat", "dog"])
    assert result.kind == "detections"
    rows = _run(nets["ssd"][1], result.inputs[0])["detection_out"].reshape(-1, 7)
    rows = rows[rows[:, 2] >= 0.2]
    boxes = result.records[0]["answer"]["boxes"]
    assert len(boxes) == len(rows) > 0
    want = sorted(([float(r[2]), int(r[1]), np.clip(r[3:] * [50, 30, 50, 30], 0, [50, 30, 50, 30])] for r in rows),
                  key=lambda t: -t[0])
    for box, (score, label, corners) in zip(boxes, want):
        assert box["score"] == pytest.approx(score, rel=1e-6) and box["class"] == label
        assert box["label"] == ["bg", "cat", "dog"][label]
        np.testing.assert_allclose(box["box"], corners, atol=0.006)


@pytest.mark.parametrize("text, names", [
    ("n01440764 tench, Tinca tinca\nn01443537 goldfish, Carassius auratus\n", ["tench, Tinca tinca",
                                                                              "goldfish, Carassius auratus"]),
    ('"cat"\r\n"dog"\r\n', ["cat", "dog"]),
    ("'a b'\nplain\n\n", ["a b", "plain"]),
    ("\ufeffbackground\rperson", ["background", "person"]),
])
def test_labels_files(tmp_path, text, names):
    path = tmp_path / "labels.txt"
    path.write_bytes(text.encode("utf-8"))
    assert read_labels(path) == names


def test_command_text_json_and_a_bad_image_goes_on(made, tmp_path):
    folder, nets, images = made
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff not really a jpeg")
    labels = tmp_path / "synset_words.txt"
    labels.write_text("".join(f"n0{k:07d} name{k}\n" for k in range(6)))
    result = invoke("predict", nets["classifier"][1], bad, images, "--labels", labels, "--top", "2", "--json")
    assert result.exit_code == 3, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if not ln.startswith("blobtool: warning: ")]
    assert len(errors) == 1 and "broken.jpg" in errors[0] and "not an image" in errors[0]
    records = json_lines(result)
    assert [r["image"].rsplit("/", 1)[-1] for r in records] == ["broken.jpg", "p0.png", "p1.png", "p2.png"]
    assert all(r["answer"]["top"][0]["label"].startswith("name") for r in records[1:])
    assert records[1]["preprocessing"]["channels"] == "BGR" and records[1]["input"] == [1, 3, 8, 8]
    assert "preprocessing: values in [0, 1] x 255, then RGB -> BGR" in result.stderr
    text = ok("predict", nets["classifier"][1], images / "p1.png", "--top", "2").stdout.splitlines()
    assert text[0].endswith("p1.png: 30x20 -> 1x3x8x8") and len(text) == 3


def test_command_writes_pictures_and_raw_outputs(made, tmp_path):
    folder, nets, images = made
    ok("predict", nets["segmenter"][1], images / "p1.png", "-o", tmp_path / "one.png")
    with Image.open(tmp_path / "one.png") as picture:
        assert picture.size == (30, 20) and picture.mode == "RGB"
    ok("predict", nets["ssd"][1], images, "-o", tmp_path / "drawn", "--threshold", "0.1")
    assert sorted(p.name for p in (tmp_path / "drawn").iterdir()) == ["p0.png", "p1.png", "p2.png"]
    ok("predict", nets["classifier"][1], images, "-o", tmp_path / "raw.npz")
    result = blobtool.predict(nets["classifier"][1], sorted(images.glob("p*.png")))
    with np.load(tmp_path / "raw.npz") as raw:
        np.testing.assert_array_equal(raw["prob"], np.concatenate([o["prob"] for o in result.outputs]))


def test_pillow_missing_is_exit_2_naming_the_extra(made, monkeypatch):
    _, nets, images = made
    import sys

    for name in [m for m in sys.modules if m == "PIL" or m.startswith("PIL.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "PIL", None)
    assert_error(invoke("predict", nets["classifier"][1], images / "p0.png"), 2, "blobtool[image]", "Pillow")


def test_oversample_needs_resize_and_a_classifier(made):
    _, nets, images = made
    result = invoke("predict", nets["classifier"][1], images / "p0.png", "--oversample")
    assert result.exit_code == 2 and "--resize" in result.stderr
    result = invoke("predict", nets["segmenter"][1], images / "p0.png", "--oversample", "--resize", "20,20")
    assert_error(result, 2, "--oversample averages a classifier", warnings=True)


@pytest.mark.parametrize("args, code, text", [
    (["--labels", "missing.txt"], 3, "missing.txt: cannot open"),
    (["--mean", "1,2"], 2, "--mean: 2 values for a net input of 3 channels"),
    (["--scale", "1,2"], 2, "--scale: 2 factors for a net input of 3 channels"),
    (["--mean", "missing.binaryproto"], 3, "missing.binaryproto: cannot open"),
])
def test_bad_settings_are_one_line_before_any_image(made, tmp_path, monkeypatch, args, code, text):
    _, nets, images = made
    monkeypatch.chdir(tmp_path)
    result = invoke("predict", nets["classifier"][1], images / "p0.png", *args)
    assert_error(result, code, text, warnings=True)
    assert result.stdout == ""


def test_an_empty_folder_is_one_line_and_the_rest_go_on(made, tmp_path):
    _, nets, images = made
    (tmp_path / "empty").mkdir()
    result = invoke("predict", nets["classifier"][1], tmp_path / "empty", images / "p0.png")
    assert_error(result, 3, "no image files", warnings=True)
    assert result.stdout.startswith(str(images / "p0.png"))
