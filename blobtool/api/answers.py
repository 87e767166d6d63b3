"""What a net's outputs answer for one image: classes, boxes, a class map, or the blobs' summaries.

The kind of answer comes from what the net ends in:

- ``detections``: an output written by SSD's DetectionOutput (1 x 1 x K x 7
  rows of image id, label, score, xmin, ymin, xmax, ymax in [0, 1]); the
  boxes are given in the image's own pixels (its decoded size, after
  EXIF's turn), those scoring at least the threshold;
- ``classes``: one output of N x C (or N x C x 1 x 1): the top K classes,
  as probabilities where the values are a distribution (non-negative,
  summing to 1 within 1e-3), else as scores;
- ``segmentation``: an output of N x C x H x W with H, W > 1: the class of
  each pixel (argmax over C, at the output's resolution) and each class's
  share of the pixels;
- ``blobs``: anything else, each output's summary as `run` gives it.

Labels come from a text file: Caffe's synset_words.txt ("n01440764 tench,
Tinca tinca": the name after the WordNet id) or one name a line, quoted or
not, CRLF or not.
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import FormatError

__all__ = ["read_labels", "answer_kind", "classes", "detections", "segmentation", "summaries", "DETECTION_TYPES"]

DETECTION_TYPES = ("DetectionOutput",)

_SYNSET = re.compile(r"^n\d{8}\s+")


def read_labels(path) -> list:
    """The names in a labels file, in order (see the module); FormatError naming the file when it is not text."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise FormatError(f"cannot open: {exc.strerror}", path=str(path)) from exc
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FormatError(f"not a text file of labels (byte {exc.start} is not UTF-8)", path=str(path)) from exc
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    return [_label(line) for line in lines]


def _label(line: str) -> str:
    name = _SYNSET.sub("", line.strip())
    if len(name) >= 2 and name[0] == name[-1] and name[0] in "\"'":
        name = name[1:-1]
    return name


def _name(labels, index: int) -> str | None:
    return labels[index] if labels and 0 <= index < len(labels) else None


def answer_kind(outputs: dict, writers: dict) -> str:
    """Which answer a net's outputs ({name: shape without the batch axis}) give; `writers`: {name: layer type}."""
    if any(writers.get(n) in DETECTION_TYPES for n in outputs):
        return "detections"
    if len(outputs) == 1:
        (shape,) = outputs.values()
        if len(shape) >= 1 and all(d == 1 for d in shape[1:]):
            return "classes"
        if len(shape) == 3 and shape[1] > 1 and shape[2] > 1:
            return "segmentation"
    return "blobs"


def classes(scores: np.ndarray, labels=None, top: int = 5) -> dict:
    """The top `top` classes of one image's score vector, highest first (ties: the lower index first)."""
    values = np.asarray(scores, dtype=np.float64).reshape(-1)
    order = np.argsort(-values, kind="stable")[:max(top, 0)]
    distribution = bool(values.size and values.min() >= 0 and abs(values.sum() - 1) <= 1e-3)
    word = "probability" if distribution else "score"
    return {"kind": "classes", "values": word,
            "top": [{"class": int(i), "label": _name(labels, int(i)), word: float(values[i])} for i in order]}


def detections(rows: np.ndarray, image: int, size: tuple, labels=None, threshold: float = 0.5) -> dict:
    """One image's boxes from DetectionOutput's rows (those of image id `image`), in pixels of an image of `size`.

    DetectionOutput writes a row of -1 where it found nothing; its corners
    are fractions of the image, so they are multiplied by the width and
    height and clipped to the image.
    """
    rows = np.asarray(rows, dtype=np.float64).reshape(-1, 7)
    h, w = size
    boxes = []
    for row in rows[(rows[:, 0] == image) & (rows[:, 2] >= threshold)]:
        x0, y0, x1, y1 = (float(np.clip(row[3] * w, 0, w)), float(np.clip(row[4] * h, 0, h)),
                          float(np.clip(row[5] * w, 0, w)), float(np.clip(row[6] * h, 0, h)))
        boxes.append({"class": int(row[1]), "label": _name(labels, int(row[1])), "score": float(row[2]),
                      "box": [round(x0, 2), round(y0, 2), round(x1, 2), round(y1, 2)]})
    boxes.sort(key=lambda b: -b["score"])
    return {"kind": "detections", "threshold": float(threshold), "boxes": boxes}


def segmentation(scores: np.ndarray, labels=None) -> tuple:
    """(the answer, the class map): each pixel's argmax class over C x H x W, and each class's share of pixels."""
    values = np.asarray(scores)
    classmap = np.argmax(values, axis=0).astype(np.int32)
    counts = np.bincount(classmap.reshape(-1), minlength=values.shape[0])
    shares = [{"class": int(c), "label": _name(labels, int(c)), "share": round(float(n) / classmap.size, 6)}
              for c, n in enumerate(counts) if n]
    shares.sort(key=lambda s: -s["share"])
    return {"kind": "segmentation", "map": list(classmap.shape), "classes": shares}, classmap


def summaries(values: dict) -> dict:
    """Each output's shape, min, max, mean and L2, as `run` gives them."""
    from ..forward.run import blob_summary

    return {"kind": "blobs", "blobs": [{"name": n, **blob_summary(v)} for n, v in values.items()]}
