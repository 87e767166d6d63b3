"""caffe-ssd's DetectionOutput cases, SSD heads and the comparison of detection rows, shared by the tests.

The layer sweeps (tests/layers/test_layers_shape.py) hold blobtool's run of
them to real caffe-ssd, and the export's tests (tests/onnxport/test_ssd_export.py)
hold the exported model's rows to the same; assert_close and the tolerances are
the shape sweeps'.
"""

from __future__ import annotations

import numpy as np
import pytest

from caffenets import layer, max_scaled_difference

TOLERANCE = 1e-4


# Against real Caffe: these layers copy values or compute each in float32 as Caffe does.
CAFFE_TOLERANCE = 1e-5


CORNER, CENTER_SIZE, CORNER_SIZE = 1, 2, 3


def assert_close(name: str, ours: np.ndarray, theirs: np.ndarray, tolerance: float = TOLERANCE) -> None:
    assert ours.shape == theirs.shape, f"{name}: shape {ours.shape}, the oracle's {theirs.shape}"
    difference = max_scaled_difference(ours, theirs) if ours.size else 0.0
    assert difference <= tolerance, f"{name}: scaled difference {difference:.3g}"


def equal_score_runs_as_sets(rows: np.ndarray) -> np.ndarray:
    """`rows` with each run of consecutive rows of one image, label and score put in the order of their boxes."""
    rows = rows.copy()
    start = 0
    for end in range(1, len(rows) + 1):
        if end == len(rows) or not np.array_equal(rows[end, :3], rows[start, :3]):
            run = rows[start:end]
            rows[start:end] = run[np.lexsort(run[:, ::-1].T)]
            start = end
    return rows


def assert_detections(name: str, ours: np.ndarray, theirs: np.ndarray, *, ties_as_sets: bool = False) -> None:
    """DetectionOutput's rows equal caffe-ssd's, row for row in its order.

    Image and label are exact; score and box within CAFFE_TOLERANCE of the
    largest magnitude among Caffe's scores and boxes. `ties_as_sets`:
    rows of one image and label with equal scores are compared as a set
    (see test_detection_output_ties_in_score for where caffe-ssd leaves
    their order undefined).
    """
    assert ours.shape == theirs.shape, f"{name}: {ours.shape[2]} rows, caffe-ssd's {theirs.shape[2]}"
    assert ours.shape[:2] == (1, 1) and ours.shape[3] == 7, ours.shape
    a, b = ours[0, 0], theirs[0, 0]
    if ties_as_sets:
        a, b = equal_score_runs_as_sets(a), equal_score_runs_as_sets(b)
    np.testing.assert_array_equal(a[:, :2], b[:, :2], err_msg=f"{name}: image or label differ from caffe-ssd's rows")
    assert_close(name, a[:, 2:], b[:, 2:], CAFFE_TOLERANCE)


PRIOR_FOR_DETECTION = {"min_size": [30.0], "max_size": [60.0], "aspect_ratio": [2.0],
                       "variance": [0.1, 0.1, 0.2, 0.2], "clip": False}


def detection_case(params: dict, *, num=1, classes=4, feature=(3, 4), seed=0, levels=None):
    """(layers, inputs, feeds): PriorBox over a feature map, then DetectionOutput on random predictions.

    The scores are a softmax's (each prior's sum to 1), or with `levels`
    one of that many equal steps in (0, 1], for ties.
    """
    params = dict(params, num_classes=classes)
    priors = feature[0] * feature[1] * 4          # 1 + 2 ratios + 1 max size per cell
    loc_classes = 1 if params.get("share_location", True) else classes
    inputs = {"feat": (1, 2) + feature, "img": (1, 3, 60, 80), "loc": (num, priors * loc_classes * 4),
              "conf": (num, priors * classes)}
    rng = np.random.default_rng(seed)
    if levels:
        conf = rng.integers(1, levels + 1, (num, priors, classes)) / levels
    else:
        conf = rng.random((num, priors, classes))
        conf /= conf.sum(-1, keepdims=True)
    feeds = {"feat": np.zeros(inputs["feat"], np.float32), "img": np.zeros(inputs["img"], np.float32),
             "loc": (rng.standard_normal(inputs["loc"]) * 0.5).astype(np.float32),
             "conf": conf.reshape(num, -1).astype(np.float32)}
    layers = [layer("priors", "PriorBox", ["feat", "img"], prior_box_param=PRIOR_FOR_DETECTION),
              layer("detections", "DetectionOutput", ["loc", "conf", "priors"], detection_output_param=params)]
    return layers, inputs, feeds, params


def caffe_row_order(rows: np.ndarray) -> np.ndarray:
    """Rows by image, then label, then score (best first): caffe-ssd's order (a stable sort: ties keep theirs)."""
    return rows[np.lexsort((-rows[:, 2], rows[:, 1], rows[:, 0]))]


NMS = {"nms_threshold": 0.45, "top_k": 20}


def detection_params(p: dict) -> dict:
    params = {"background_label_id": 0, "share_location": True, "nms_param": NMS, "keep_top_k": 10,
              "confidence_threshold": 0.3}
    params.update(p)
    return {k: v for k, v in params.items() if v is not None}


DETECTION = [pytest.param(p, kw, id=name) for name, p, kw in [
    ("center-size", {"code_type": CENTER_SIZE}, {}),
    ("corner", {"code_type": CORNER}, {}),
    ("corner-size", {"code_type": CORNER_SIZE}, {}),
    ("code-type-default", {"code_type": None}, {}),
    ("not-shared", {"code_type": CENTER_SIZE, "share_location": False}, {}),
    ("not-shared-corner", {"code_type": CORNER, "share_location": False, "confidence_threshold": 0.1,
                           "nms_param": {"nms_threshold": 0.6}, "keep_top_k": 1000}, {"classes": 3}),
    ("corner-size-not-shared", {"code_type": CORNER_SIZE, "share_location": False}, {"num": 2}),
    ("variance-in-target", {"code_type": CENTER_SIZE, "variance_encoded_in_target": True}, {}),
    ("variance-in-target-corner", {"code_type": CORNER, "variance_encoded_in_target": True}, {}),
    ("variance-in-target-corner-size", {"code_type": CORNER_SIZE, "variance_encoded_in_target": True,
                                        "share_location": False}, {"classes": 3}),
    ("batch3", {"code_type": CENTER_SIZE}, {"num": 3}),
    ("batch3-not-shared", {"code_type": CENTER_SIZE, "share_location": False, "keep_top_k": 5}, {"num": 3}),
    ("background2", {"code_type": CENTER_SIZE, "background_label_id": 2}, {}),
    ("background-last-not-shared", {"code_type": CENTER_SIZE, "background_label_id": 3,
                                    "share_location": False}, {}),
    ("background-past-labels-shared", {"code_type": CENTER_SIZE, "background_label_id": 4}, {}),
    ("background-none-not-shared", {"code_type": CENTER_SIZE, "background_label_id": -1,
                                    "share_location": False}, {"classes": 3}),
    ("background-default", {"code_type": CENTER_SIZE, "background_label_id": None}, {}),
    ("no-threshold", {"code_type": CENTER_SIZE, "keep_top_k": 7, "confidence_threshold": None}, {}),
    ("threshold0", {"code_type": CENTER_SIZE, "confidence_threshold": 0.0, "keep_top_k": 100}, {}),
    ("many", {"code_type": CENTER_SIZE, "nms_param": {"nms_threshold": 0.45, "top_k": 100}, "keep_top_k": 50,
              "confidence_threshold": 0.05}, {"classes": 6, "num": 3, "feature": (5, 7)}),
    ("top_k3", {"code_type": CENTER_SIZE, "nms_param": {"nms_threshold": 0.5, "top_k": 3}, "keep_top_k": 100}, {}),
    ("top_k1", {"code_type": CORNER, "nms_param": {"nms_threshold": 0.5, "top_k": 1}}, {"num": 2}),
    ("top_k0", {"code_type": CENTER_SIZE, "nms_param": {"nms_threshold": 0.5, "top_k": 0}}, {}),
    ("nms-threshold0", {"code_type": CENTER_SIZE, "nms_param": {"nms_threshold": 0.0}, "keep_top_k": None}, {}),
    ("nms-threshold1", {"code_type": CENTER_SIZE, "nms_param": {"nms_threshold": 1.0, "top_k": 15},
                        "keep_top_k": None}, {}),
    ("no-keep_top_k", {"code_type": CENTER_SIZE, "keep_top_k": None}, {"num": 2}),
    ("no-top_k", {"code_type": CENTER_SIZE, "nms_param": {"nms_threshold": 0.3}, "keep_top_k": None}, {}),
    ("keep_top_k0", {"code_type": CENTER_SIZE, "keep_top_k": 0}, {}),
    ("keep_top_k1", {"code_type": CENTER_SIZE, "keep_top_k": 1}, {"num": 2}),
    ("eta", {"code_type": CENTER_SIZE, "nms_param": {"nms_threshold": 0.7, "eta": 0.9}, "keep_top_k": 1000}, {}),
    ("eta-top_k", {"code_type": CENTER_SIZE, "nms_param": {"nms_threshold": 0.9, "eta": 0.7, "top_k": 12},
                   "keep_top_k": 8, "confidence_threshold": 0.1}, {"num": 2}),
    ("eta-not-shared", {"code_type": CORNER, "share_location": False, "confidence_threshold": 0.1,
                        "nms_param": {"nms_threshold": 0.9, "eta": 0.8}, "keep_top_k": 1000}, {"classes": 3}),
    ("nothing-detected", {"code_type": CENTER_SIZE, "confidence_threshold": 0.99}, {"num": 2}),
    ("blocks-of-candidates", {"code_type": CENTER_SIZE, "nms_param": {"nms_threshold": 0.6, "eta": 0.95},
                              "keep_top_k": None, "confidence_threshold": None},
     {"classes": 2, "feature": (10, 15)}),
    ("defaults", {"background_label_id": None, "nms_param": None, "keep_top_k": None,
                  "confidence_threshold": None}, {"classes": 2, "feature": (1, 2)}),
]]


def ssd_head(*, across_spatial: bool, channel_shared: bool, share_location: bool, code_type: int, classes: int = 4,
             seed: int = 0):
    """(layers, feeds) of an SSD head on two feature maps, as SSD's deploy nets build it, with random weights.

    The first map is L2-normalized (Normalize, as conv4_3_norm); each map
    gets its location and confidence convolutions, permuted to NHWC and
    flattened, and its PriorBox; the three are concatenated, the
    confidences go through a softmax per prior, and DetectionOutput decodes.
    """
    rng = np.random.default_rng(seed)
    maps = {"map1": (2, 6, 5, 6), "map2": (2, 5, 3, 3)}
    prior = {"map1": {"min_size": [12.0], "max_size": [25.0], "aspect_ratio": [2.0], "flip": True, "clip": False,
                      "variance": [0.1, 0.1, 0.2, 0.2], "step": 8.0, "offset": 0.5},
             "map2": {"min_size": [25.0], "max_size": [40.0], "aspect_ratio": [2.0, 3.0], "flip": True,
                      "clip": True, "variance": [0.1, 0.1, 0.2, 0.2]}}
    per_cell = {"map1": 4, "map2": 6}
    loc_classes = 1 if share_location else classes
    feeds = {"img": rng.standard_normal((2, 3, 40, 48)).astype(np.float32)}
    feeds.update({name: (rng.standard_normal(shape) * 3).astype(np.float32) for name, shape in maps.items()})
    scale = np.asarray(rng.uniform(5, 20), np.float32) if channel_shared else \
        rng.uniform(5, 20, maps["map1"][1]).astype(np.float32)
    layers = [layer("map1_norm", "Normalize", "map1", blobs=[scale],
                    norm_param={"across_spatial": across_spatial, "channel_shared": channel_shared})]
    heads = {"loc": [], "conf": [], "priors": []}
    for name in maps:
        source = "map1_norm" if name == "map1" else name
        channels = maps[name][1]
        for kind, outputs in (("loc", per_cell[name] * loc_classes * 4), ("conf", per_cell[name] * classes)):
            weights = (rng.standard_normal((outputs, channels, 3, 3)) * 0.1).astype(np.float32)
            bias = (rng.standard_normal(outputs) * 0.1).astype(np.float32)
            layers += [layer(f"{name}_{kind}", "Convolution", source, blobs=[weights, bias],
                             convolution_param={"num_output": outputs, "kernel_size": [3], "pad": [1]}),
                       layer(f"{name}_{kind}_perm", "Permute", f"{name}_{kind}", permute_param={"order": [0, 2, 3, 1]}),
                       layer(f"{name}_{kind}_flat", "Flatten", f"{name}_{kind}_perm", flatten_param={"axis": 1})]
            heads[kind].append(f"{name}_{kind}_flat")
        layers.append(layer(f"{name}_priors", "PriorBox", [source, "img"], prior_box_param=prior[name]))
        heads["priors"].append(f"{name}_priors")
    layers += ssd_tail(heads, classes, {"share_location": share_location, "background_label_id": 0,
                                        "code_type": code_type, "nms_param": {"nms_threshold": 0.45, "top_k": 40},
                                        "keep_top_k": 25, "confidence_threshold": 0.2})
    return layers, feeds


def ssd_tail(heads: dict, classes: int, detection: dict) -> list:
    """The layers every SSD ends in: its heads' loc, conf and priors concatenated, softmax, DetectionOutput.

    `heads` names each head's flattened loc and conf blobs and its PriorBox
    top ({"loc": [...], "conf": [...], "priors": [...]}); `detection` is
    detection_output_param beyond num_classes.
    """
    return [layer("mbox_loc", "Concat", heads["loc"], concat_param={"axis": 1}),
            layer("mbox_conf", "Concat", heads["conf"], concat_param={"axis": 1}),
            layer("mbox_priorbox", "Concat", heads["priors"], concat_param={"axis": 2}),
            layer("mbox_conf_reshape", "Reshape", "mbox_conf", reshape_param={"shape": {"dim": [0, -1, classes]}}),
            layer("mbox_conf_softmax", "Softmax", "mbox_conf_reshape", softmax_param={"axis": 2}),
            layer("mbox_conf_flatten", "Flatten", "mbox_conf_softmax"),
            layer("detection_out", "DetectionOutput", ["mbox_loc", "mbox_conf_flatten", "mbox_priorbox"],
                  detection_output_param={"num_classes": classes, **detection})]
