"""caffe-ssd's DetectionOutput exported whole: the model's rows equal real caffe-ssd's, in onnxruntime at every opset.

The oracle is real caffe-ssd (tests/caffeoracle.py, the `caffe` marker);
blobtool's own run (blobtool.api.run, what `blobtool run` calls) and the
exported model in onnxruntime at opsets 13, 17 and the newest blobtool
writes are held to it:

- every option of the layer (tests/layers/test_layers_shape.py's DETECTION
  cases: code types, variance_encoded_in_target, share_location,
  background_label_id, thresholds, top_k, keep_top_k, batches of 1 and 3,
  nothing above the threshold), scores made to tie, a keep_top_k cut
  between two scores, and the generated SSD heads (Normalize, Permute,
  Flatten, Concat, PriorBox, Softmax), all put side by side in ONE net, so
  that Caffe runs once for the module: the rows equal caffe-ssd's row for
  row in its order (image and label exact, score and box within 1e-5 of
  the largest; rows of equal scores where caffe-ssd's std::sort leaves
  their order open compared as a set), and the model's rows equal
  blobtool's exactly;
- background_label_id -1 with shared boxes (Caffe's CPU forward dies,
  blobtool follows its GPU forward): the model's rows equal Caffe's with
  the background past the labels, as blobtool's do;
- a generated MobileNet-SSD (300 x 300, 1,917 priors, 21 classes) end to
  end: Caffe, `blobtool run` and the model; SSD512's sizes (24,564
  priors) the same, marked slow;
- OpenCV 5's ONNX importer (cv2.dnn.readNetFromONNX) reads the model and
  gives the rows: run in an environment of its own, named by
  BLOBTOOL_OPENCV5_PYTHON (a python with opencv-python 5), skipped where
  none is given;
- eta < 1 with nms_threshold above 0.5 is refused in one line naming the
  --outputs cut, nothing written; at or below 0.5 eta changes nothing and
  the layer is exported (in the net above); constants sized by the
  declared shapes are bounded as PriorBox's are;
- `export --check` compares the rows and says how many matched.
"""

from __future__ import annotations

import functools
import os
import subprocess

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="ONNX export needs the onnx package (the `onnx` extra)")
ort = pytest.importorskip("onnxruntime", reason="the exported models are run by onnxruntime (the `onnx` extra)")

from caffenets import layer, net, ours_forward, write_net_files
from caffeoracle import caffe_files, caffe_refusal
from onnxvalid import every_export_checked  # noqa: F401  (autouse: every model written is checked)
from runner import assert_error, invoke, ok, run_blobtool
from ssdcases import (
    CENTER_SIZE,
    DETECTION,
    NMS,
    assert_detections,
    caffe_row_order,
    detection_case,
    ssd_head,
    ssd_tail,
)

from blobtool import api
from blobtool.onnxport.check import compare_rows
from blobtool.onnxport.emit import ExportError
from blobtool.onnxport.graph import opset_range

OPSETS = (13, 17, opset_range()[1])
OPENCV5 = "BLOBTOOL_OPENCV5_PYTHON"


def detection_params(p: dict) -> dict:
    """A DETECTION case's parameters over the defaults the cases of tests/layers/test_layers_shape.py are written against."""
    params = {"background_label_id": 0, "share_location": True, "nms_param": NMS, "keep_top_k": 10,
              "confidence_threshold": 0.3}
    params.update(p)
    return {k: v for k, v in params.items() if v is not None}


# -- many cases side by side in one net -----------------------------------------------------------------

def prefixed(layers, feeds: dict, prefix: str) -> tuple:
    """(layers, feeds) with every blob and layer name prefixed, so that several cases share one net."""
    renamed = []
    for each in layers:
        copy = type(each)()
        copy.CopyFrom(each)
        copy.name = prefix + each.name
        copy.bottom[:] = [prefix + b for b in each.bottom]
        copy.top[:] = [prefix + t for t in each.top]
        renamed.append(copy)
    return renamed, {prefix + name: value for name, value in feeds.items()}


def refused_at_export(params: dict) -> bool:
    nms = params.get("nms_param") or {}
    return nms.get("eta", 1.0) < 1 and nms.get("nms_threshold", 0.3) > 0.5


def tie_cases() -> list:
    """(name, params, shape, ties as sets) of scores on 8 levels: equal scores within a class and across classes."""
    shape = {"classes": 3, "num": 2, "feature": (4, 5), "levels": 8, "seed": 4}
    found = []
    for shared in (True, False):
        base = {"code_type": CENTER_SIZE, "share_location": shared, "confidence_threshold": 0.2,
                "nms_param": {"nms_threshold": 0.5}}
        found += [(f"ties-{shared}", {**base, "keep_top_k": -1}, shape, False),
                  (f"ties-top_k-{shared}", {**base, "nms_param": {"nms_threshold": 0.5, "top_k": 9}}, shape, False)]
    # keep_top_k cutting between two scores of one image's rows (blobtool's rows, which test_layers_shape holds
    # to caffe-ssd's), so that caffe-ssd keeps the same rows whatever order its std::sort gives equal scores.
    one = dict(shape, num=1)
    base = {"code_type": CENTER_SIZE, "share_location": True, "confidence_threshold": 0.2,
            "nms_param": {"nms_threshold": 0.5}, "keep_top_k": -1}
    layers, inputs, feeds, _ = detection_case(base, **one)
    rows = ours_forward(net(layers, inputs), feeds)["detections"][0, 0]
    scores = np.sort(rows[:, 2])[::-1]
    cuts = [k for k in range(1, len(scores)) if scores[k - 1] > scores[k]]
    keep = min(cuts, key=lambda k: abs(k - len(scores) // 2))
    found.append(("ties-keep_top_k-cut", {**base, "keep_top_k": keep}, one, True))
    return found


@functools.cache
def cases() -> list:
    """(name, layers, feeds, detection top, ties as sets) of every case the module compares."""
    found = []
    for p in DETECTION:
        params, shape = p.values
        params = detection_params(params)
        if refused_at_export(params):
            continue
        found.append((p.id, params, shape, False))
    found.append(("nms-threshold-past-1", detection_params({"code_type": CENTER_SIZE, "keep_top_k": None,
                                                           "nms_param": {"nms_threshold": 1.5, "top_k": 15}}), {},
                  False))
    found.append(("eta-at-0.45", detection_params({"code_type": CENTER_SIZE, "nms_param": {"nms_threshold": 0.45,
                                                                                             "eta": 0.8}}), {}, False))
    found += tie_cases()
    out = []
    for name, params, shape, as_sets in found:
        layers, _, feeds, _ = detection_case(params, **shape)
        out.append((name, layers, feeds, "detections", as_sets))
    out += odd_boxes_and_scores()
    for k, (across, channels, shared, code) in enumerate([(True, True, True, 2), (True, False, False, 1),
                                                          (False, True, True, 3), (False, False, False, 2)]):
        layers, feeds = ssd_head(across_spatial=across, channel_shared=channels, share_location=shared, code_type=code)
        out.append((f"head{k}", layers, feeds, "detection_out", False))
    return out


def odd_boxes_and_scores() -> list:
    """Cases of boxes decoded with their max corner below their min, and of NaN scores.

    CORNER and CORNER_SIZE decode each corner on its own: offsets 20 times
    the usual turn many boxes inside out, which JaccardOverlap says overlap
    nothing. A NaN score is no candidate (not above the threshold) and
    takes no place among top_k.
    """
    out = []
    for code in (1, 3):
        params = detection_params({"code_type": code, "nms_param": {"nms_threshold": 0.3}, "keep_top_k": -1,
                                   "confidence_threshold": 0.1})
        layers, _, feeds, _ = detection_case(params, num=2)
        feeds["loc"] = feeds["loc"] * np.float32(20)
        out.append((f"inside-out-{code}", layers, feeds, "detections", False))
    params = detection_params({"code_type": CENTER_SIZE, "nms_param": {"nms_threshold": 0.45, "top_k": 4},
                               "confidence_threshold": 0.05})
    layers, _, feeds, _ = detection_case(params, num=2)
    feeds["conf"] = feeds["conf"].copy()
    feeds["conf"][:, ::3] = np.nan
    out.append(("nan-scores", layers, feeds, "detections", False))
    return out


def side_by_side(chosen: list) -> tuple:
    """(net message, feeds, {case: its detection top in the net}) of the cases in one net."""
    layers, feeds, tops = [], {}, {}
    for k, (name, case_layers, case_feeds, top, _) in enumerate(chosen):
        more, more_feeds = prefixed(case_layers, case_feeds, f"c{k}_")
        layers += more
        feeds.update(more_feeds)
        tops[name] = f"c{k}_{top}"
    return net(layers, {n: x.shape for n, x in feeds.items()}, name="ssd_cases"), feeds, tops


def onnxruntime_rows(path, feeds: dict, outputs: list, *, optimized: bool = True) -> dict:
    """{output: its value} of the model in onnxruntime, with its default graph optimizations or none."""
    options = ort.SessionOptions()
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    return dict(zip(outputs, session.run(outputs, {n: v for n, v in feeds.items() if n in wanted})))


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """Every case's rows: caffe-ssd's (one run), blobtool's, and the model's at each opset."""
    folder = tmp_path_factory.mktemp("ssd_cases")
    chosen = cases()
    message, feeds, tops = side_by_side(chosen)
    prototxt, model = write_net_files(folder, message)
    outputs = list(tops.values())
    theirs = caffe_files(prototxt, model, feeds, folder)
    ours = api.run(str(model), inputs=feeds, outputs=outputs).values
    models = {}
    for opset in OPSETS:
        path = folder / f"ssd-{opset}.onnx"
        api.export(str(model), str(path), opset=opset, outputs=outputs)
        # Without graph optimizations: a session of some 6,000 nodes built in a third of the time. The DETECTION
        # cases run with every optimization in tests/layers' sweeps (opsets 13 and 17), and the whole
        # MobileNet-SSD below with the defaults.
        models[opset] = onnxruntime_rows(path, feeds, outputs, optimized=False)
    return {"cases": {name: (tops[name], as_sets) for name, _, _, _, as_sets in chosen}, "caffe": theirs,
            "ours": ours, "models": models, "folder": folder, "model": model}


CASE_NAMES = [c[0] for c in cases()]


@pytest.mark.caffe
@pytest.mark.parametrize("name", CASE_NAMES)
def test_exported_rows_equal_caffe_ssd(compared, name):
    top, as_sets = compared["cases"][name]
    caffe = compared["caffe"][top]
    ours = compared["ours"][top]
    assert_detections(name, ours, caffe, ties_as_sets=as_sets)
    for opset, values in compared["models"].items():
        model = values[top]
        assert_detections(f"{name} (opset {opset})", model, caffe, ties_as_sets=as_sets)
        if top.endswith("_detections"):
            # DetectionOutput alone on the inputs: every value is computed as blobtool computes it, to the bit.
            np.testing.assert_array_equal(model, ours, err_msg=f"{name}: the model's rows at opset {opset}")
        else:
            assert_detections(f"{name} (opset {opset}, against blobtool)", model, ours)
    rows = caffe[0, 0]
    if name.startswith("inside-out"):
        assert ((rows[:, 5] < rows[:, 3]) | (rows[:, 6] < rows[:, 4])).sum() >= 5, "too few boxes inside out"
    if (rows[:, 1] == -1).all():
        assert len(rows) == int(rows[-1, 0]) + 1 and (rows[:, 2:] == -1).all()   # one row per image
    else:
        np.testing.assert_array_equal(rows, caffe_row_order(rows))


def test_the_model_is_standard_operators_with_a_symbolic_row_count(compared):
    for opset in OPSETS:
        model = onnx.load(str(compared["folder"] / f"ssd-{opset}.onnx"))
        assert [(o.domain, o.version) for o in model.opset_import] == [("", opset)]
        assert not {n.domain for n in model.graph.node} - {""}, "a node outside ONNX's own operators"
        for output in model.graph.output:
            dims = output.type.tensor_type.shape.dim
            assert [d.dim_value for d in dims[:2]] + [dims[3].dim_value] == [1, 1, 7]
            assert dims[2].dim_param == f"{output.name}_rows" and not dims[2].HasField("dim_value")


def test_the_cases_cover_every_option():
    """The cases hold each option the issue names, nothing-detected and batches of 3 among them."""
    names = set(CASE_NAMES)
    for wanted in ("center-size", "corner", "corner-size", "variance-in-target", "not-shared", "background2",
                   "background-none-not-shared", "background-past-labels-shared", "threshold0", "top_k3", "no-top_k",
                   "keep_top_k1", "no-keep_top_k", "nms-threshold-past-1", "batch3", "batch3-not-shared", "nothing-detected", "eta-at-0.45",
                   "ties-True", "ties-False", "ties-keep_top_k-cut", "head0", "head3"):
        assert wanted in names, wanted


@pytest.mark.caffe
def test_no_background_with_shared_boxes_gives_caffes_rows_with_the_background_past_the_labels(compared, tmp_path):
    """background_label_id -1, shared boxes: blobtool and the model follow caffe-ssd's GPU forward (every class)."""
    layers, inputs, feeds, _ = detection_case(detection_params({"code_type": CENTER_SIZE, "background_label_id": -1}))
    _, model = write_net_files(tmp_path, net(layers, inputs))
    path = tmp_path / "none.onnx"
    api.export(str(model), str(path))
    rows = onnxruntime_rows(path, feeds, ["detections"])["detections"]
    top, _ = compared["cases"]["background-past-labels-shared"]
    twin = compared["caffe"][top]
    assert 0 in rows[0, 0, :, 1]
    assert_detections("detections", rows, twin)


# -- refusals and the check ---------------------------------------------------------------------------

def test_eta_above_half_is_refused_naming_the_outputs_cut(tmp_path):
    layers, inputs, _, _ = detection_case(detection_params({"code_type": CENTER_SIZE,
                                                             "nms_param": {"nms_threshold": 0.7, "eta": 0.9}}))
    _, model = write_net_files(tmp_path, net(layers, inputs))
    with pytest.raises(ExportError) as raised:
        api.export(str(model), str(tmp_path / "eta.onnx"))
    text = str(raised.value)
    assert text.endswith("layer 'detections' (DetectionOutput) cannot be exported to ONNX: its eta 0.9 lowers "
                         "nms_threshold 0.7 after each kept box while it is above 0.5, which NonMaxSuppression's one "
                         "threshold cannot say; end the graph before it with --outputs, e.g. --outputs "
                         "loc,conf,priors, and decode those outside the model"), text
    assert "\n" not in text and not (tmp_path / "eta.onnx").exists()
    result = invoke("export", str(model), "-o", str(tmp_path / "eta.onnx"))
    assert_error(result, 3, "its eta 0.9 lowers nms_threshold 0.7", "--outputs loc,conf,priors")
    assert not (tmp_path / "eta.onnx").exists()


@pytest.mark.caffe
def test_a_nan_nms_threshold_is_refused_as_caffe_refuses_it(tmp_path):
    layers, inputs, feeds, _ = detection_case(detection_params({"nms_param": {"nms_threshold": float("nan")}}))
    message = net(layers, inputs)
    refusal = caffe_refusal(message, feeds, tmp_path)
    assert refusal is not None and "Check failed: nms_threshold_ >= 0. (nan vs. 0)" in refusal.line, refusal
    _, model = write_net_files(tmp_path, message)
    for command in ("run", "export"):
        result = invoke(command, model, *(["-o", tmp_path / "nan.onnx"] if command == "export" else []))
        assert_error(result, 3, "layer 'detections' (DetectionOutput): nms_threshold is nan; nms_threshold must be "
                                "non negative")
    assert not (tmp_path / "nan.onnx").exists()


def test_constants_from_declared_sizes_are_bounded(tmp_path):
    """A definition of a few bytes declaring 2^25 priors: refused before the ranks' constant is made."""
    priors = 2 ** 25
    inputs = {"l": (1, 4 * priors), "c": (1, 2 * priors), "p": (1, 2, 4 * priors)}
    _, model = write_net_files(tmp_path, net([layer("d", "DetectionOutput", ["l", "c", "p"],
                                                    detection_output_param={"num_classes": 2})], inputs))
    result = invoke("export", model, "-o", tmp_path / "big.onnx")
    assert_error(result, 3, "layer 'd' (DetectionOutput) cannot be exported to ONNX: its candidates' ranks would be "
                            "a constant of 33,554,432 values computed from the net's shapes, past the 16,777,216")
    assert not (tmp_path / "big.onnx").exists()


def test_export_check_compares_the_rows(tmp_path):
    layers, feeds = ssd_head(across_spatial=True, channel_shared=True, share_location=True, code_type=CENTER_SIZE)
    _, model = write_net_files(tmp_path, net(layers, {n: x.shape for n, x in feeds.items()}))
    done = ok("export", model, "-o", tmp_path / "head.onnx", "--check", "--opset", "13")
    said = [line for line in done.stderr.splitlines() if "detection rows equal" in line]
    assert len(said) == 1, done.stderr
    count = int(said[0].split("detection_out: ")[1].split(" of ")[0])
    assert count > 10 and said[0].endswith(f"{count} of {count} detection rows equal"), said
    assert (tmp_path / "head.onnx").exists()


def test_compare_rows_counts_then_rows():
    rng = np.random.default_rng(0)
    rows = np.concatenate([np.zeros((6, 1)), rng.integers(1, 4, (6, 1)), rng.random((6, 5))], axis=1)
    rows = rows.astype(np.float32)[None, None]
    same = compare_rows("d", rows, rows.copy())
    assert not same["differs"] and same["said"] == "6 of 6 detection rows equal"
    moved = rows.copy()
    moved[0, 0, 4, 3] += 0.01
    moved[0, 0, 5, 1] = 7
    other = compare_rows("d", rows, moved)
    assert other["differs"] and other["said"].startswith("4 of 6 detection rows equal; row 4 is [")
    huge = rows.copy()
    huge[0, 0, 2, 3:] = [np.inf, -np.inf, np.nan, 3e38]
    assert compare_rows("d", huge, huge.copy())["said"] == "6 of 6 detection rows equal"
    other = huge.copy()
    other[0, 0, 2, 3] = -np.inf
    assert compare_rows("d", huge, other)["said"] == ("5 of 6 detection rows equal; row 2 is [0, 2, 0.0335856, inf, "
                                                      "-inf, nan, 3e+38] before, [0, 2, 0.0335856, -inf, -inf, nan, "
                                                      "3e+38] after")
    fewer = compare_rows("d", rows, rows[:, :, :5])
    assert fewer["differs"] and fewer["said"] == "6 detection rows before, shape [1, 1, 5, 7] after"


# -- a whole generated MobileNet-SSD -----------------------------------------------------------------------

def mobilenet_ssd(size: int, seed: int = 0) -> tuple:
    """(net message, feeds) of an SSD of MobileNet-SSD's head on a size x size image, generated weights.

    Strided 3 x 3 convolutions (8 channels, ReLU) halve the image down to
    1 x 1; the heads read MobileNet-SSD's six maps at 300 (19, 10, 5, 3, 2,
    1: 1,917 priors) or SSD512's seven at 512 (64 down to 1: 24,564), with
    their PriorBox settings; 21 classes, background 0, CENTER_SIZE, NMS 0.45
    with top_k 100, keep_top_k 100, threshold 0.25, as the deploy nets.
    """
    rng = np.random.default_rng(seed)
    classes, channels = 21, 8
    if size == 300:
        maps = {19: (60, None, [2.0]), 10: (105, 150, [2.0, 3.0]), 5: (150, 195, [2.0, 3.0]),
                3: (195, 240, [2.0, 3.0]), 2: (240, 285, [2.0, 3.0]), 1: (285, 300, [2.0, 3.0])}
    else:
        maps = {64: (36, 77, [2.0]), 32: (77, 154, [2.0, 3.0]), 16: (154, 231, [2.0, 3.0]), 8: (231, 308, [2.0, 3.0]),
                4: (308, 384, [2.0, 3.0]), 2: (384, 461, [2.0]), 1: (461, 538, [2.0])}
    layers, source, side, heads = [], "data", size, {"loc": [], "conf": [], "priors": []}
    while side > 1:
        name = f"conv{len(layers) // 2}"
        weights = (rng.standard_normal((channels, 3 if source == "data" else channels, 3, 3)) * 0.2).astype(np.float32)
        layers += [layer(name, "Convolution", source, blobs=[weights, np.full(channels, 0.1, np.float32)],
                         convolution_param={"num_output": channels, "kernel_size": [3], "pad": [1], "stride": [2]}),
                   layer(f"{name}_relu", "ReLU", name, name)]
        source, side = name, (side - 1) // 2 + 1
        if side in maps:
            heads_of(layers, heads, rng, source, maps[side], classes, channels)
    layers += ssd_tail(heads, classes, {"share_location": True, "background_label_id": 0,
                                        "nms_param": {"nms_threshold": 0.45, "top_k": 100}, "code_type": 2,
                                        "keep_top_k": 100, "confidence_threshold": 0.25})
    feeds = {"data": rng.standard_normal((1, 3, size, size)).astype(np.float32)}
    return net(layers, {"data": feeds["data"].shape}, name=f"mobilenet_ssd_{size}"), feeds


def heads_of(layers: list, heads: dict, rng, source: str, prior: tuple, classes: int, channels: int) -> None:
    """The location and confidence convolutions of one map (permuted, flattened) and its PriorBox."""
    low, high, ratios = prior
    per_cell = 1 + 2 * len(ratios) + (high is not None)
    for kind, outputs, scale in (("loc", per_cell * 4, 0.1), ("conf", per_cell * classes, 0.12)):
        name = f"{source}_mbox_{kind}"
        weights = (rng.standard_normal((outputs, channels, 3, 3)) * scale).astype(np.float32)
        layers += [layer(name, "Convolution", source, blobs=[weights, np.zeros(outputs, np.float32)],
                         convolution_param={"num_output": outputs, "kernel_size": [3], "pad": [1]}),
                   layer(f"{name}_perm", "Permute", name, permute_param={"order": [0, 2, 3, 1]}),
                   layer(f"{name}_flat", "Flatten", f"{name}_perm", flatten_param={"axis": 1})]
        heads[kind].append(f"{name}_flat")
    params = {"min_size": [float(low)], "aspect_ratio": ratios, "flip": True, "clip": False,
              "variance": [0.1, 0.1, 0.2, 0.2], "offset": 0.5}
    if high is not None:
        params["max_size"] = [float(high)]
    layers.append(layer(f"{source}_mbox_priorbox", "PriorBox", [source, "data"], prior_box_param=params))
    heads["priors"].append(f"{source}_mbox_priorbox")


def whole_ssd(tmp_path, size: int) -> tuple:
    """(Caffe's rows, the model path, feeds file): the net run by Caffe, `blobtool run` and the model at each opset."""
    message, feeds = mobilenet_ssd(size)
    prototxt, model = write_net_files(tmp_path, message)
    caffe = caffe_files(prototxt, model, feeds, tmp_path)["detection_out"]
    np.save(tmp_path / "data.npy", feeds["data"])
    done = run_blobtool("run", str(model), "--input", f"data={tmp_path / 'data.npy'}", "-o", str(tmp_path / "run.npz"),
                        text=True)
    assert done.returncode == 0, done.stderr
    with np.load(tmp_path / "run.npz") as saved:
        ours = saved["detection_out"]
    assert_detections("detection_out (blobtool run)", ours, caffe)
    rows = caffe[0, 0]
    assert len(rows) >= 10 and len(set(rows[:, 1].tolist())) >= 3, rows[:, :3]
    for opset in OPSETS:
        path = tmp_path / f"ssd{size}-{opset}.onnx"
        done = run_blobtool("export", str(model), "-o", str(path), "--opset", str(opset), text=True)
        assert done.returncode == 0, done.stderr
        model_rows = onnxruntime_rows(path, feeds, ["detection_out"])["detection_out"]
        assert_detections(f"detection_out (opset {opset})", model_rows, caffe)
    return caffe, tmp_path / f"ssd{size}-{OPSETS[1]}.onnx", feeds


@pytest.mark.caffe
@pytest.mark.slow
def test_mobilenet_ssd_300_end_to_end(tmp_path):
    caffe, path, feeds = whole_ssd(tmp_path, 300)
    graph = onnx.load(str(path)).graph
    assert not {n.domain for n in graph.node} - {""}, "a node outside ONNX's own operators"
    assert graph.output[0].type.tensor_type.shape.dim[2].dim_param == "detection_out_rows"
    if os.environ.get(OPENCV5):
        assert_detections("detection_out (OpenCV 5)", opencv5_rows(os.environ[OPENCV5], path, feeds, tmp_path), caffe)


@pytest.mark.caffe
@pytest.mark.slow
def test_ssd512_sized_end_to_end(tmp_path):
    whole_ssd(tmp_path, 512)


# -- OpenCV 5 -------------------------------------------------------------------------------------------

_OPENCV5_RUN = """
import sys, numpy as np, cv2
assert int(cv2.__version__.split(".")[0]) >= 5, cv2.__version__
net = cv2.dnn.readNetFromONNX(sys.argv[1])
with np.load(sys.argv[2]) as feeds:
    for name in feeds.files:
        net.setInput(feeds[name], name)
np.save(sys.argv[3], net.forward(net.getUnconnectedOutLayersNames()[0]))
"""


@pytest.mark.caffe
def test_opencv5_reads_the_model_and_gives_caffes_rows(tmp_path):
    """cv2.dnn.readNetFromONNX of opencv-python 5, in its own environment (BLOBTOOL_OPENCV5_PYTHON)."""
    python = os.environ.get(OPENCV5)
    if not python:
        why = (f"no OpenCV 5 environment: set {OPENCV5} to a python with opencv-python 5 (python -m venv cv5 "
               "&& cv5/bin/pip install 'opencv-python-headless>=5' numpy); it cannot share blobtool's "
               "environment, whose OpenCV 4.x reads Caffe files in other tests")
        if os.environ.get("CI"):  # .ci/run makes that environment: CI runs every `caffe` test
            pytest.fail(why)
        pytest.skip(why)
    layers, feeds = ssd_head(across_spatial=True, channel_shared=False, share_location=True, code_type=CENTER_SIZE)
    prototxt, model = write_net_files(tmp_path, net(layers, {n: x.shape for n, x in feeds.items()}))
    caffe = caffe_files(prototxt, model, feeds, tmp_path)["detection_out"]
    api.export(str(model), str(tmp_path / "head.onnx"))
    # OpenCV's convolutions round in another order: scores and boxes within 1e-5, as blobtool's are held.
    assert_detections("detection_out (OpenCV 5)", opencv5_rows(python, tmp_path / "head.onnx", feeds, tmp_path), caffe)


def opencv5_rows(python: str, path, feeds: dict, folder) -> np.ndarray:
    """The model's first output as OpenCV 5's dnn module computes it, run by `python` (its own environment)."""
    np.savez(folder / "feeds.npz", **feeds)
    done = subprocess.run([python, "-c", _OPENCV5_RUN, str(path), str(folder / "feeds.npz"), str(folder / "rows.npy")],
                          check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return np.load(folder / "rows.npy")
