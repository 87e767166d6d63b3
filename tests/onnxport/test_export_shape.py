"""ONNX export of the layers that move values, SSD's PriorBox and DetectionOutput's refusal, and the forks' Upsample and Interp.

Each case is a small net (tests/helpers/caffenets.py) run by blobtool, exported
with every blob it makes as a graph output, checked by onnx's checker
(full_check) and run by onnxruntime; every blob must agree with blobtool's
forward within max_scaled_difference <= 1e-4. Each case is exported at
opset 13 (the lowest written), 17 (the default), 18 (Split's num_outputs
and Resize's new attributes) and the newest the installed onnx knows.
Sweeps put many sizes into one net: Upsample's scales and Interp's sizes,
where a runtime's arithmetic could pick another row. DetectionOutput with
eta < 1 above an nms_threshold of 0.5 is refused, its message asserted
(tests/onnxport/test_ssd_export.py holds the exported DetectionOutput to caffe-ssd).
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="ONNX export needs the onnx package (the `onnx` extra)")
ort = pytest.importorskip("onnxruntime", reason="the exported models are run by onnxruntime (the `onnx` extra)")

from caffenets import layer, max_scaled_difference, net, random_feeds, write_net_files  # noqa: E402
from onnxvalid import every_export_checked  # noqa: F401,E402  (autouse: every model written is checked)

from blobtool import api  # noqa: E402
from blobtool.onnxport.emit import ExportError  # noqa: E402
from blobtool.onnxport.graph import export_program  # noqa: E402

TOLERANCE = 1e-4
OPSETS = sorted({13, 17, 18, int(onnx.defs.onnx_opset_version())})


# -- exporting and running a case ------------------------------------------------------------------

def blobtool_run(folder, message, inputs: dict):
    """(blobtool's RunResult of every blob, the feeds): the net written to `folder` and run from its files."""
    _, model = write_net_files(folder, message)
    feeds = random_feeds(inputs)
    return api.run(str(model), inputs=feeds, outputs="all"), feeds


def computes(message) -> bool:
    """Whether a layer of the net computes new values (bilinear Interp, Softmax, Convolution), not moves them."""
    return any(each.type in ("Softmax", "Convolution")
               or (each.type == "Interp" and each.interp_param.interp_type == "bilinear") for each in message.layer)


def export_and_compare(folder, message, inputs: dict, opset: int) -> dict:
    """Export the net with every blob an output, check and run the model; every blob against blobtool's.

    A net whose layers only move values must give blobtool's values exactly
    (nearest-neighbour reads one value, a prior is a constant); one that
    computes, within TOLERANCE. Returns onnxruntime's values.
    """
    result, feeds = blobtool_run(folder, message, inputs)
    names = [name for name in result.values if name not in result.program.inputs]
    path = folder / f"net-{opset}.onnx"
    export_program(result.program, path, opset=opset, outputs=names)
    onnx.checker.check_model(str(path), full_check=True)
    runtime = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    theirs = dict(zip(names, runtime.run(names, feeds)))
    for name in names:
        ours = result.values[name]
        assert tuple(theirs[name].shape) == tuple(ours.shape), (name, theirs[name].shape, ours.shape)
        difference = max_scaled_difference(theirs[name], ours)
        assert difference <= TOLERANCE, f"blob {name}: max scaled difference {difference:.3g}"
        if not computes(message):
            assert np.array_equal(theirs[name], ours), f"blob {name}: not blobtool's values exactly"
    return theirs


def ops_of(folder, opset: int) -> list:
    return [node.op_type for node in onnx.load(str(folder / f"net-{opset}.onnx")).graph.node]


# -- the cases: (id, layers, inputs) -------------------------------------------------------------------

FOUR = (2, 6, 4, 5)

CASES = [
    # Concat
    ("concat axis 1", [layer("cat", "Concat", ["a", "b", "c"])],
     {"a": (2, 3, 4, 5), "b": (2, 1, 4, 5), "c": (2, 2, 4, 5)}),
    ("concat axis -1", [layer("cat", "Concat", ["a", "b"], concat_param={"axis": -1})],
     {"a": (2, 3, 4, 5), "b": (2, 3, 4, 2)}),
    ("concat axis 0", [layer("cat", "Concat", ["a", "b"], concat_param={"axis": 0})],
     {"a": (1, 3, 4), "b": (2, 3, 4)}),
    ("concat concat_dim 2", [layer("cat", "Concat", ["a", "b"], concat_param={"concat_dim": 2})],
     {"a": (2, 3, 4, 5), "b": (2, 3, 1, 5)}),
    ("concat of one bottom", [layer("cat", "Concat", ["a"])], {"a": FOUR}),
    # Slice
    ("slice points axis 1", [layer("cut", "Slice", "a", ["p", "q", "r"], slice_param={"slice_point": [1, 4]})],
     {"a": FOUR}),
    ("slice equal axis -1", [layer("cut", "Slice", "a", ["p", "q"], slice_param={"axis": -1})],
     {"a": (2, 3, 4, 6)}),
    ("slice equal three axis 0", [layer("cut", "Slice", "a", ["p", "q", "r"], slice_param={"axis": 0})],
     {"a": (3, 2, 5)}),
    ("slice slice_dim 2", [layer("cut", "Slice", "a", ["p", "q"], slice_param={"slice_dim": 2,
                                                                               "slice_point": [3]})],
     {"a": FOUR}),
    ("slice one top", [layer("cut", "Slice", "a", ["p"], slice_param={"axis": 2})], {"a": FOUR}),
    # Split, its tops read by later layers
    ("split three tops", [layer("split", "Split", "a", ["p", "q", "r"]),
                          layer("cat", "Concat", ["r", "p", "q"], concat_param={"axis": 2})], {"a": FOUR}),
    # Flatten
    ("flatten default", [layer("flat", "Flatten", "a")], {"a": FOUR}),
    ("flatten axis 2", [layer("flat", "Flatten", "a", flatten_param={"axis": 2})], {"a": FOUR}),
    ("flatten axis 1 end_axis 2", [layer("flat", "Flatten", "a", flatten_param={"axis": 1, "end_axis": 2})],
     {"a": FOUR}),
    ("flatten end_axis before axis", [layer("flat", "Flatten", "a", flatten_param={"axis": 2, "end_axis": 1})],
     {"a": FOUR}),
    ("flatten axis -3 end_axis -2", [layer("flat", "Flatten", "a", flatten_param={"axis": -3, "end_axis": -2})],
     {"a": FOUR}),
    # Reshape
    ("reshape 0 and -1", [layer("re", "Reshape", "a", reshape_param={"shape": {"dim": [0, -1]}})], {"a": FOUR}),
    ("reshape explicit", [layer("re", "Reshape", "a", reshape_param={"shape": {"dim": [4, 3, 2, 10]}})],
     {"a": FOUR}),
    ("reshape axis 1 num_axes 2", [layer("re", "Reshape", "a", reshape_param={
        "shape": {"dim": [-1]}, "axis": 1, "num_axes": 2})], {"a": FOUR}),
    ("reshape axis -1 appends", [layer("re", "Reshape", "a", reshape_param={
        "shape": {"dim": [1, 1]}, "axis": -1})], {"a": FOUR}),
    ("reshape axis 0 num_axes 0 prepends", [layer("re", "Reshape", "a", reshape_param={
        "shape": {"dim": [1]}, "axis": 0, "num_axes": 0})], {"a": FOUR}),
    ("reshape axis -2 copies", [layer("re", "Reshape", "a", reshape_param={
        "shape": {"dim": [0, 5, -1]}, "axis": -3})], {"a": (2, 6, 4, 5)}),
    # Crop (the second bottom gives the size only)
    ("crop axis 2 offsets", [layer("crop", "Crop", ["a", "like"], crop_param={"offset": [1, 2]})],
     {"a": FOUR, "like": (1, 1, 2, 3)}),
    ("crop axis 1 one offset", [layer("crop", "Crop", ["a", "like"], crop_param={"axis": 1, "offset": [1]})],
     {"a": FOUR, "like": (2, 4, 3, 3)}),
    ("crop no offset", [layer("crop", "Crop", ["a", "like"])], {"a": FOUR, "like": (2, 6, 2, 2)}),
    ("crop axis -1", [layer("crop", "Crop", ["a", "like"], crop_param={"axis": -1, "offset": [2]})],
     {"a": FOUR, "like": (3, 3, 3, 3)}),
    ("crop nothing", [layer("crop", "Crop", ["a", "like"], crop_param={"axis": 0})], {"a": FOUR, "like": FOUR}),
    # Tile
    ("tile axis 1", [layer("tile", "Tile", "a", tile_param={"tiles": 3})], {"a": (2, 2, 3, 2)}),
    ("tile axis -1", [layer("tile", "Tile", "a", tile_param={"axis": -1, "tiles": 2})], {"a": (2, 2, 3, 2)}),
    ("tile axis 0", [layer("tile", "Tile", "a", tile_param={"axis": 0, "tiles": 4})], {"a": (1, 2, 3)}),
    ("tile one", [layer("tile", "Tile", "a", tile_param={"tiles": 1})], {"a": (2, 2, 3)}),
    # Permute
    ("permute 0 2 3 1", [layer("perm", "Permute", "a", permute_param={"order": [0, 2, 3, 1]})], {"a": FOUR}),
    ("permute partial order", [layer("perm", "Permute", "a", permute_param={"order": [2]})], {"a": FOUR}),
    ("permute 3-D", [layer("perm", "Permute", "a", permute_param={"order": [1, 0]})], {"a": (2, 3, 4)}),
    ("permute keeping every axis", [layer("perm", "Permute", "a", permute_param={"order": [0, 1]})],
     {"a": FOUR}),
    ("permute no order", [layer("perm", "Permute", "a")], {"a": FOUR}),
    # ShuffleChannel
    ("shuffle group 2", [layer("shuffle", "ShuffleChannel", "a", shuffle_channel_param={"group": 2})],
     {"a": FOUR}),
    ("shuffle group 3", [layer("shuffle", "ShuffleChannel", "a", shuffle_channel_param={"group": 3})],
     {"a": (1, 12, 3, 3)}),
    ("shuffle group 1", [layer("shuffle", "ShuffleChannel", "a")], {"a": FOUR}),
    ("shuffle 2-D", [layer("shuffle", "ShuffleChannel", "a", shuffle_channel_param={"group": 4})],
     {"a": (3, 8)}),
    ("shuffle 3-D", [layer("shuffle", "ShuffleChannel", "a", shuffle_channel_param={"group": 2})],
     {"a": (2, 6, 5)}),
    # PriorBox (a constant of the shapes)
    ("priorbox ssd", [layer("prior", "PriorBox", ["feat", "data"], prior_box_param={
        "min_size": [30.0], "max_size": [60.0], "aspect_ratio": [2.0, 3.0], "flip": True, "clip": False,
        "variance": [0.1, 0.1, 0.2, 0.2], "step": 8.0, "offset": 0.5})],
     {"feat": (1, 4, 5, 7), "data": (1, 3, 40, 56)}),
    ("priorbox clip one variance", [layer("prior", "PriorBox", ["feat", "data"], prior_box_param={
        "min_size": [20.5, 41.0], "aspect_ratio": [2.0], "flip": False, "clip": True, "variance": [0.2]})],
     {"feat": (1, 2, 3, 4), "data": (1, 3, 30, 40)}),
    ("priorbox img_size step_h step_w", [layer("prior", "PriorBox", ["feat", "data"], prior_box_param={
        "min_size": [16.0], "max_size": [32.0], "aspect_ratio": [2.0, 0.5], "img_size": 64, "step_h": 12.0,
        "step_w": 10.0, "offset": 0.25})],
     {"feat": (2, 2, 4, 6), "data": (2, 3, 20, 20)}),
    ("priorbox img_h img_w", [layer("prior", "PriorBox", ["feat", "data"], prior_box_param={
        "min_size": [8.0], "img_h": 48, "img_w": 64})], {"feat": (1, 1, 3, 4), "data": (1, 3, 10, 10)}),
    # Upsample (nearest, integer scale)
    ("upsample 2", [layer("up", "Upsample", "a", upsample_param={"scale": 2})], {"a": (2, 3, 4, 5)}),
    ("upsample 3 odd", [layer("up", "Upsample", "a", upsample_param={"scale": 3})], {"a": (1, 2, 7, 3)}),
    ("upsample 1", [layer("up", "Upsample", "a", upsample_param={"scale": 1})], {"a": (1, 2, 3, 3)}),
    # Interp (bilinear, corners aligned)
    ("interp zoom 2", [layer("interp", "Interp", "a", interp_param={"zoom_factor": 2})], {"a": (1, 3, 5, 6)}),
    ("interp zoom 8", [layer("interp", "Interp", "a", interp_param={"zoom_factor": 8})], {"a": (1, 2, 3, 4)}),
    ("interp shrink 2", [layer("interp", "Interp", "a", interp_param={"shrink_factor": 2})],
     {"a": (1, 3, 9, 8)}),
    ("interp shrink 3", [layer("interp", "Interp", "a", interp_param={"shrink_factor": 3})],
     {"a": (2, 2, 10, 11)}),
    ("interp height width up", [layer("interp", "Interp", "a", interp_param={"height": 13, "width": 9})],
     {"a": (1, 3, 5, 4)}),
    ("interp height width down", [layer("interp", "Interp", "a", interp_param={"height": 4, "width": 3})],
     {"a": (1, 3, 11, 7)}),
    ("interp to 1 x 1", [layer("interp", "Interp", "a", interp_param={"height": 1, "width": 1})],
     {"a": (1, 3, 5, 4)}),
    ("interp from 1 x 1", [layer("interp", "Interp", "a", interp_param={"height": 4, "width": 3})],
     {"a": (1, 3, 1, 1)}),
    ("interp second bottom", [layer("interp", "Interp", ["a", "like"])],
     {"a": (1, 3, 6, 5), "like": (1, 1, 17, 12)}),
    ("interp same size", [layer("interp", "Interp", "a", interp_param={"height": 5, "width": 4})],
     {"a": (1, 3, 5, 4)}),
    ("interp pads zoom", [layer("interp", "Interp", "a", interp_param={"zoom_factor": 3, "pad_beg": -1,
                                                                       "pad_end": -2})],
     {"a": (1, 2, 8, 9)}),
    ("interp pads shrink", [layer("interp", "Interp", "a", interp_param={"shrink_factor": 2, "pad_beg": -1})],
     {"a": (1, 2, 8, 9)}),
    ("interp pads only", [layer("interp", "Interp", "a", interp_param={"height": 5, "width": 6, "pad_beg": -1,
                                                                       "pad_end": -1})],
     {"a": (1, 2, 7, 8)}),
    ("interp nearest zoom", [layer("interp", "Interp", "a", interp_param={"zoom_factor": 3,
                                                                          "interp_type": "nearest_neighbor"})],
     {"a": (1, 2, 4, 5)}),
    ("interp nearest sizes", [layer("interp", "Interp", "a", interp_param={
        "height": 7, "width": 3, "interp_type": "nearest_neighbor", "pad_end": -1})], {"a": (1, 2, 6, 8)}),
]


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_layer_exports_as_blobtool_runs_it(tmp_path, case, opset):
    _, layers, inputs = case
    export_and_compare(tmp_path, net(layers, inputs), inputs, opset)


# -- what each layer is written as ---------------------------------------------------------------------

FORMS = [
    ("slice points axis 1", ["Split"]),
    ("slice one top", ["Identity"]),
    ("concat of one bottom", ["Identity"]),
    ("split three tops", ["Identity", "Identity", "Identity", "Concat"]),
    ("flatten default", ["Reshape"]),
    ("crop axis 2 offsets", ["Slice"]),
    ("crop nothing", ["Identity"]),
    ("permute 0 2 3 1", ["Transpose"]),
    ("permute keeping every axis", ["Identity"]),
    ("shuffle group 2", ["Reshape", "Transpose", "Reshape"]),
    ("priorbox ssd", ["Identity"]),
    ("upsample 2", ["Resize"]),
    ("upsample 1", ["Identity"]),
    ("interp zoom 2", ["Resize"]),
    ("interp pads zoom", ["Slice", "Resize"]),
    ("interp pads only", ["Slice"]),
    ("interp same size", ["Identity"]),
    ("interp nearest zoom", ["Gather", "Gather"]),
]


@pytest.mark.parametrize("name, ops", FORMS, ids=[form[0] for form in FORMS])
def test_each_layer_is_written_as_its_onnx_form(tmp_path, name, ops):
    _, layers, inputs = next(case for case in CASES if case[0] == name)
    export_and_compare(tmp_path, net(layers, inputs), inputs, 17)
    assert ops_of(tmp_path, 17) == ops


@pytest.mark.parametrize("opset", OPSETS)
def test_resize_attributes(tmp_path, opset):
    """Upsample: nearest, asymmetric, floor; Interp: linear, align_corners; both as the opset's Resize reads them."""
    inputs = {"a": (1, 2, 3, 4)}
    layers = [layer("up", "Upsample", "a", upsample_param={"scale": 2}),
              layer("interp", "Interp", "a", interp_param={"zoom_factor": 2})]
    export_and_compare(tmp_path, net(layers, inputs), inputs, opset)
    nodes = onnx.load(str(tmp_path / f"net-{opset}.onnx")).graph.node
    attributes = [{a.name: onnx.helper.get_attribute_value(a) for a in node.attribute} for node in nodes]
    assert attributes == [
        {"mode": b"nearest", "coordinate_transformation_mode": b"asymmetric", "nearest_mode": b"floor"},
        {"mode": b"linear", "coordinate_transformation_mode": b"align_corners"}]


@pytest.mark.parametrize("opset", OPSETS)
def test_slice_writes_its_sizes_as_splits_input(tmp_path, opset):
    """Split's `split` input holds the pieces' sizes at every opset (18 added num_outputs, which is not used)."""
    inputs = {"a": (2, 10, 3)}
    layers = [layer("cut", "Slice", "a", ["p", "q", "r"], slice_param={"slice_point": [2, 7]})]
    export_and_compare(tmp_path, net(layers, inputs), inputs, opset)
    model = onnx.load(str(tmp_path / f"net-{opset}.onnx"))
    (node,) = model.graph.node
    assert node.op_type == "Split" and [a.name for a in node.attribute] == ["axis"]
    sizes = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}[node.input[1]]
    assert sizes.tolist() == [2, 5, 3]


# -- a top with an axis of size 0 ---------------------------------------------------------------------

@pytest.mark.parametrize("opset", [op for op in OPSETS if op >= 14])
def test_reshape_to_a_size_of_zero(tmp_path, opset):
    # run refuses a blob of no values (Caffe's forward stops at it); the graph is still exported whole,
    # and onnxruntime gives each top its empty shape.
    inputs = {"a": (2, 3, 0)}
    layers = [layer("flat", "Flatten", "a"),
              layer("shuffle", "ShuffleChannel", "a", shuffle_channel_param={"group": 3})]
    _, model = write_net_files(tmp_path, net(layers, inputs))
    path = tmp_path / f"net-{opset}.onnx"
    result, _ = api.export(str(model), str(path), opset=opset, outputs="all")
    onnx.checker.check_model(str(path), full_check=True)
    runtime = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [result.names.get(n, n) for n in ("flat", "shuffle")]
    got = runtime.run(names, {"a": np.zeros((2, 3, 0), np.float32)})
    assert [g.shape for g in got] == [tuple(result.outputs[n]) for n in ("flat", "shuffle")]
    assert got[0].shape == (2, 0) and all(g.size == 0 for g in got)
    (node, *_) = onnx.load(str(path)).graph.node
    assert node.op_type == "Reshape" and [(a.name, a.i) for a in node.attribute] == [("allowzero", 1)]


def test_reshape_to_a_size_of_zero_is_refused_at_opset_13(tmp_path):
    inputs = {"a": (2, 3, 0)}
    _, model = write_net_files(tmp_path, net([layer("flat", "Flatten", "a")], inputs))
    with pytest.raises(ExportError, match=r"layer 'flat' \(Flatten\) cannot be exported to ONNX: its top \(2, 0\) "
                                          r"has an axis of size 0, which Reshape says only from opset 14 "
                                          r"\(allowzero\); export with --opset 14 or later$"):
        api.export(str(model), str(tmp_path / "flat.onnx"), opset=13)
    assert not (tmp_path / "flat.onnx").exists()


# -- a net of several of them: an SSD head, the priors of two maps -----------------------------------------

def ssd_head(detection_output: bool = False) -> tuple:
    rng = np.random.default_rng(1)
    layers = []
    maps = {"conv4": (1, 8, 6, 6), "conv7": (1, 8, 3, 3)}
    priors_per_cell = {"conv4": 4, "conv7": 6}
    for name, shape in maps.items():
        k = priors_per_cell[name]
        for what, per in (("loc", 4), ("conf", 3)):
            out = f"{name}_mbox_{what}"
            weight = rng.standard_normal((k * per, shape[1], 3, 3)).astype(np.float32) * 0.1
            bias = rng.standard_normal(k * per).astype(np.float32) * 0.1
            layers += [layer(out, "Convolution", name, blobs=[weight, bias],
                             convolution_param={"num_output": k * per, "kernel_size": [3], "pad": [1]}),
                       layer(f"{out}_perm", "Permute", out, permute_param={"order": [0, 2, 3, 1]}),
                       layer(f"{out}_flat", "Flatten", f"{out}_perm")]
        ratios = [2.0] if k == 4 else [2.0, 3.0]
        layers.append(layer(f"{name}_mbox_priorbox", "PriorBox", [name, "data"], prior_box_param={
            "min_size": [30.0 if k == 4 else 60.0], "max_size": [60.0 if k == 4 else 111.0],
            "aspect_ratio": ratios, "flip": True, "clip": False, "variance": [0.1, 0.1, 0.2, 0.2]}))
    for what, axis in (("loc", 1), ("conf", 1), ("priorbox", 2)):
        bottoms = [f"{name}_mbox_{what}" + ("" if what == "priorbox" else "_flat") for name in maps]
        layers.append(layer(f"mbox_{what}", "Concat", bottoms, concat_param={"axis": axis}))
    layers += [layer("mbox_conf_reshape", "Reshape", "mbox_conf", reshape_param={"shape": {"dim": [0, -1, 3]}}),
               layer("mbox_conf_softmax", "Softmax", "mbox_conf_reshape", softmax_param={"axis": 2}),
               layer("mbox_conf_flatten", "Flatten", "mbox_conf_softmax")]
    if detection_output:
        layers.append(layer("detection_out", "DetectionOutput", ["mbox_loc", "mbox_conf_flatten",
                                                                  "mbox_priorbox"],
                            detection_output_param={"num_classes": 3, "nms_param": {"nms_threshold": 0.45},
                                                    "keep_top_k": 20, "confidence_threshold": 0.01,
                                                    "code_type": 2}))
    return layers, {"data": (1, 3, 48, 48), **maps}


@pytest.mark.parametrize("opset", OPSETS)
def test_ssd_head(tmp_path, opset):
    layers, inputs = ssd_head()
    theirs = export_and_compare(tmp_path, net(layers, inputs), inputs, opset)
    assert theirs["mbox_priorbox"].shape == (1, 2, (36 * 4 + 9 * 6) * 4)


def test_detection_output_with_an_adaptive_nms_is_refused_naming_its_bottoms_for_outputs(tmp_path):
    layers, inputs = ssd_head(detection_output=True)
    layers[-1].detection_output_param.nms_param.nms_threshold = 0.6
    layers[-1].detection_output_param.nms_param.eta = 0.9
    result, _ = blobtool_run(tmp_path, net(layers, inputs), inputs)
    with pytest.raises(ExportError) as raised:
        export_program(result.program, tmp_path / "ssd.onnx", opset=17)
    text = str(raised.value)
    assert text == f"{result.program.path}: " + (
        "layer 'detection_out' (DetectionOutput) cannot be exported to ONNX: its eta 0.9 lowers nms_threshold 0.6 "
        "after each kept box while it is above 0.5, which NonMaxSuppression's one threshold cannot say; end the graph "
        "before it with --outputs, e.g. --outputs mbox_loc,mbox_conf_flatten,mbox_priorbox, and decode those outside "
        "the model")
    assert "\n" not in text
    assert not (tmp_path / "ssd.onnx").exists()


# -- sweeps: the sizes at which a runtime's arithmetic could read another row -----------------------------

def sweep_net(kind: str, sizes: list) -> tuple:
    """One net of many Upsample or Interp layers, one input each: (layers, inputs)."""
    layers, inputs = [], {}
    for k, (shape, param) in enumerate(sizes):
        inputs[f"in{k}"] = shape
        layers.append(layer(f"{kind.lower()}{k}", kind, f"in{k}", **param))
    return layers, inputs


@pytest.mark.parametrize("opset", [13, 17])
def test_upsample_sweep(tmp_path, opset):
    sizes = [((1, 1, h, w), {"upsample_param": {"scale": s}})
             for s in range(2, 17) for h, w in ((1, 1), (3, 7), (13, 5), (29, 2))]
    layers, inputs = sweep_net("Upsample", sizes)
    export_and_compare(tmp_path, net(layers, inputs), inputs, opset)


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("kind", ["bilinear", "nearest_neighbor"])
def test_interp_sweep(tmp_path, opset, kind):
    sizes = []
    for size_in in (1, 2, 3, 5, 6, 7, 12):
        for size_out in (1, 2, 3, 4, 7, 9, 11, 13, 25):
            sizes.append(((1, 2, size_in, size_out), {"interp_param": {
                "height": size_out, "width": size_in, "interp_type": kind}}))
    # Sizes where Resize's nearest (round_prefer_ceil, corners aligned) reads another row than the layer.
    for size_in, size_out in ((14, 23), (4, 75), (32, 15), (8, 47)):
        sizes.append(((1, 1, size_in, 3), {"interp_param": {"height": size_out, "width": 3, "interp_type": kind}}))
    for zoom in (2, 3, 5, 8):
        sizes.append(((1, 1, 7, 4), {"interp_param": {"zoom_factor": zoom, "interp_type": kind}}))
    for shrink in (2, 3, 4):
        sizes.append(((1, 1, 9, 14), {"interp_param": {"shrink_factor": shrink, "interp_type": kind}}))
    layers, inputs = sweep_net("Interp", sizes)
    export_and_compare(tmp_path, net(layers, inputs), inputs, opset)
