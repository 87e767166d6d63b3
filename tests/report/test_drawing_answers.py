"""report/drawing.py: boxes, a class map blended with its legend, the top classes, drawn where the answer says."""

from __future__ import annotations

import numpy as np

from blobtool.report.drawing import PALETTE, draw_answer


def _gray(h=60, w=80, value=0.5):
    return np.full((h, w, 3), value, dtype=np.float32)


def test_a_box_is_drawn_on_its_corners_in_its_class_colour():
    answer = {"kind": "detections", "threshold": 0.5,
              "boxes": [{"class": 2, "label": "dog", "score": 0.9, "box": [10.0, 20.0, 50.0, 40.0]}]}
    picture = np.asarray(draw_answer(_gray(), answer))
    assert picture.shape == (60, 80, 3)
    assert tuple(picture[40, 30]) == PALETTE[2] and tuple(picture[30, 50]) == PALETTE[2]   # bottom and right edges
    assert tuple(picture[30, 30]) == (128, 128, 128)                                        # inside: the photo


def test_a_class_map_is_blended_at_the_images_size_with_a_legend():
    classmap = np.zeros((3, 4), dtype=np.int32)
    classmap[:, 2:] = 1
    answer = {"kind": "segmentation", "map": [3, 4],
              "classes": [{"class": 0, "label": "sky", "share": 0.5}, {"class": 1, "label": None, "share": 0.5}]}
    picture = np.asarray(draw_answer(_gray(value=0.0), answer, classmap)).astype(int)
    # Far from the legend: half the class colour over a black photo; the map's right half is class 1.
    assert np.abs(picture[50, 10] - np.array(PALETTE[0]) // 2).max() <= 1
    assert np.abs(picture[50, 70] - np.array(PALETTE[1]) // 2).max() <= 1
    assert tuple(picture[5, 5]) == PALETTE[0]   # the legend's swatch of the first class


def test_a_classifiers_top_classes_are_written_on_dark_bands():
    answer = {"kind": "classes", "values": "probability",
              "top": [{"class": 3, "label": "cat", "probability": 0.7}, {"class": 1, "label": None,
                                                                          "probability": 0.2}]}
    picture = np.asarray(draw_answer(_gray(value=1.0), answer))
    band = picture[2:14, 2:40]
    assert (band == 0).all(axis=2).any() and (band > 200).all(axis=2).any()    # black band, light text
    assert (picture[40:, :] == 255).all()                                        # the rest untouched
