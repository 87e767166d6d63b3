"""blobtool run, definition --deploy, info --layers --input-shape, fold --check and transplant --check.

The nets are generated here (tests/helpers/caffenets.py); OpenCV 4.x, where a test
needs an oracle, runs the deploy definitions blobtool writes.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from google.protobuf import text_format

import blobtool
from blobtool._pb import blobtool_caffe_pb2 as pb
from caffenets import layer, max_scaled_difference, net, ours_forward, write_net_files
from caffeoracle import caffe_files
from runner import assert_error, assert_usage, invoke, ok, run_blobtool

TRAIN, TEST = 0, 1


def _rng(seed=0):
    return np.random.default_rng(seed)


def _small_layers(rng):
    """conv -> ReLU (in place) -> pool -> ip -> softmax, reading "data"."""
    return [
        layer("conv1", "Convolution", "data", blobs=[rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)],
              convolution_param={"num_output": 4, "kernel_size": [3], "pad": [1]}),
        layer("relu1", "ReLU", "conv1", "conv1"),
        layer("pool1", "Pooling", "conv1", pooling_param={"pool": 0, "kernel_size": 3, "stride": 2}),
        layer("ip1", "InnerProduct", "pool1", blobs=[rng.standard_normal((5, 4 * 3 * 3)), rng.standard_normal(5)],
              inner_product_param={"num_output": 5}),
        layer("prob", "Softmax", "ip1"),
    ]


@pytest.fixture
def deploy_net(tmp_path):
    """(prototxt, caffemodel) of a small deploy net with input data 2x3x7x7."""
    return write_net_files(tmp_path, net(_small_layers(_rng()), {"data": (2, 3, 7, 7)}))


def _training_net(rng, *, merged=False):
    """A training snapshot: TRAIN and TEST data layers, Dropout, Accuracy (TEST), SoftmaxWithLoss."""
    if merged:  # MTCNN's: three TRAIN-only data layers concatenated into "data" and "label"
        data = [layer(f"data_{k}", "HDF5Data", [], [f"{k}_data", f"{k}_label"], include=[{"phase": TRAIN}],
                      hdf5_data_param={"source": f"{k}.txt", "batch_size": 10}) for k in ("pos", "neg", "part")]
        data += [layer("cat_data", "Concat", ["pos_data", "neg_data", "part_data"], "data", concat_param={"axis": 0}),
                 layer("cat_label", "Concat", ["pos_label", "neg_label", "part_label"], "label",
                       concat_param={"axis": 0})]
    else:
        data = [layer("train_data", "Data", [], ["data", "label"], include=[{"phase": TRAIN}],
                      transform_param={"scale": 0.00390625, "mirror": True},
                      data_param={"source": "train_lmdb", "batch_size": 64}),
                layer("test_data", "Data", [], ["data", "label"], include=[{"phase": TEST}],
                      transform_param={"scale": 0.00390625}, data_param={"source": "test_lmdb", "batch_size": 100})]
    body = _small_layers(rng)[:-1]
    body.insert(4, layer("drop1", "Dropout", "ip1", "ip1", dropout_param={"dropout_ratio": 0.5}))
    tail = [layer("accuracy", "Accuracy", ["ip1", "label"], include=[{"phase": TEST}]),
            layer("loss", "SoftmaxWithLoss", ["ip1", "label"])]
    return net(data + body + tail, {}, name="trained")


# -- run ------------------------------------------------------------------------------------------

def test_run_prints_each_output_and_says_the_random_input(deploy_net):
    _, model = deploy_net
    result = ok("run", model)
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{model}  inputs data 2x3x7x7 (random normal, seed 0)")
    assert [line.split()[0] for line in lines if line.strip().startswith("prob")] == ["prob"]
    assert "input data (2x3x7x7): random normal, seed 0" in result.stderr


def test_run_json_gives_each_blob_summary_as_computed(deploy_net):
    _, model = deploy_net
    record = json.loads(ok("run", model, "--outputs", "all", "--json").stdout)
    values = blobtool.run(str(model), outputs="all").values
    assert [b["name"] for b in record["blobs"]] == ["data", "conv1", "pool1", "ip1", "prob"] == list(values)
    for b in record["blobs"]:
        v = values[b["name"]].astype(np.float64)
        assert b["shape"] == list(v.shape)
        assert b["max"] == pytest.approx(v.max()) and b["min"] == pytest.approx(v.min())
        assert b["l2"] == pytest.approx(np.sqrt((v * v).sum()))
    assert record["inputs"] == [{"name": "data", "shape": [2, 3, 7, 7], "given": "random normal, seed 0"}]


@pytest.mark.caffe
def test_run_writes_float32_arrays_that_match_caffe_blob_by_blob(deploy_net, tmp_path):
    prototxt, model = deploy_net
    x = _rng(5).standard_normal((2, 3, 7, 7)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    ok("run", model, "--input", f"data={tmp_path / 'x.npy'}", "--outputs", "all", "-o", tmp_path / "out.npz")
    with np.load(tmp_path / "out.npz") as out:
        arrays = dict(out)
    assert list(arrays) == ["data", "conv1", "pool1", "ip1", "prob"]
    assert all(a.dtype == np.float32 for a in arrays.values())
    np.testing.assert_array_equal(arrays["data"], x)
    theirs = caffe_files(prototxt, model, {"data": x}, tmp_path)
    assert list(theirs) == list(arrays)
    for name, value in theirs.items():
        assert max_scaled_difference(arrays[name], value) <= 1e-5, name


def test_outputs_by_name_and_the_seed_decide_what_is_written(deploy_net, tmp_path):
    _, model = deploy_net
    ok("run", model, "--outputs", "ip1,conv1", "-o", tmp_path / "a.npz")
    ok("run", model, "--outputs", "ip1,conv1", "-o", tmp_path / "b.npz", "--seed", "3")
    with np.load(tmp_path / "a.npz") as a, np.load(tmp_path / "b.npz") as b:
        assert list(a) == ["ip1", "conv1"]
        assert not np.array_equal(a["ip1"], b["ip1"])
        again = blobtool.run(str(model), outputs=["ip1"], seed=3).values["ip1"]
        np.testing.assert_array_equal(b["ip1"], again)


def test_an_input_shape_given_reshapes_the_net(deploy_net):
    _, model = deploy_net
    record = json.loads(ok("run", model, "--input-shape", "data=5,3,7,7", "--outputs", "pool1", "--json").stdout)
    assert record["blobs"][0]["shape"] == [5, 4, 3, 3]  # Caffe's ceil: (7 - 3) / 2 + 1 = 3
    # A shape the inner product cannot take is refused before anything runs: its K is fixed by its weight.
    assert_error(invoke("run", model, "--input-shape", "data=1,3,11,9"), 3, "layer 'ip1' (InnerProduct)")


# Click's own usage line ("blobtool run: ...") for what the command line gets wrong, the library's
# ("blobtool: PATH: ...") for what does not fit the net: both exit 2.
@pytest.mark.parametrize("args, fragment, click_line", [
    (["--outputs", "nope"], "the net has no blob 'nope'", False),
    (["--input-shape", "data=2,3,x"], "is not a shape", True),
    (["--input-shape", "label=2"], "names 'label', which the deploy net neither takes as an input nor computes",
     False),
    (["--input", "data"], "expected NAME=FILE", True),
    (["-o", "{tmp}/out.npy"], "run writes its blobs to an .npz", True),
    (["--json", "-o", "{tmp}/out.npz"], "--json does not apply with --output", True),
])
def test_usage_errors_are_one_line_and_exit_2(deploy_net, tmp_path, args, fragment, click_line):
    _, model = deploy_net
    result = invoke("run", model, *[a.format(tmp=tmp_path) for a in args])
    if click_line:
        assert_usage(result, "run", fragment)
    else:
        assert_error(result, 2, fragment)
    assert not (tmp_path / "out.npz").exists() and not (tmp_path / "out.npy").exists()


def test_an_input_of_another_shape_is_refused(deploy_net, tmp_path):
    _, model = deploy_net
    np.save(tmp_path / "x.npy", np.zeros((2, 3, 7), np.float32))
    result = invoke("run", model, "--input", f"data={tmp_path / 'x.npy'}", "--input-shape", "data=2,3,7,7")
    assert_error(result, 2, "input 'data': ", "x.npy holds shape (2, 3, 7), the net takes (2, 3, 7, 7)")


def test_a_layer_blobtool_cannot_run_is_exit_3_before_anything_is_computed(tmp_path):
    rng = _rng()
    layers = _small_layers(rng) + [layer("mystery", "FancyFork", "prob")]
    _, model = write_net_files(tmp_path, net(layers, {"data": (2, 3, 7, 7)}))
    result = invoke("run", model, "-o", tmp_path / "out.npz")
    line = assert_error(result, 3)
    assert "layer 'mystery' has type 'FancyFork', which blobtool cannot run; nothing was computed" in line
    assert not (tmp_path / "out.npz").exists()


def test_shapes_a_layer_refuses_are_exit_3_naming_it(tmp_path):
    layers = [layer("conv1", "Convolution", "data", blobs=[np.ones((2, 3, 5, 5)), np.ones(2)],
                    convolution_param={"num_output": 2, "kernel_size": [5]})]
    _, model = write_net_files(tmp_path, net(layers, {"data": (1, 3, 3, 3)}))
    line = assert_error(invoke("run", model), 3)
    assert "conv1" in line and "Convolution" in line


def test_a_layer_without_its_weights_is_exit_3_naming_it(deploy_net):
    prototxt, _ = deploy_net
    line = assert_error(invoke("run", prototxt), 3)
    assert "conv1" in line


def test_run_in_a_pipe_is_a_real_process(deploy_net, tmp_path):
    _, model = deploy_net
    done = run_blobtool("run", model, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["blobs"][0]["name"] == "prob"


# -- the deploy definition --------------------------------------------------------------------------

def test_a_training_snapshot_runs_as_its_deploy_net(tmp_path):
    trained = tmp_path / "trained.caffemodel"
    trained.write_bytes(_training_net(_rng(1)).SerializeToString())
    line = assert_error(invoke("run", trained), 2, "input 'data' has no shape")
    assert "--input-shape data=N,C,H,W" in line
    result = ok("run", trained, "--input-shape", "data=2,3,7,7", "--json")
    record = json.loads(result.stdout)
    assert [b["name"] for b in record["blobs"]] == ["prob"]  # SoftmaxWithLoss runs as the deploy net's Softmax
    assert record["deploy"]["replaced"] == [{"layer": "loss", "type": "SoftmaxWithLoss", "as": "Softmax"}]
    assert "train_data (Data), test_data (Data)" in result.stderr
    assert "accuracy (Accuracy)" in result.stderr
    assert "data layer train_data preprocessed its images (scale 0.00390625, mirror True)" in result.stderr


@pytest.mark.caffe
def test_definition_deploy_writes_what_caffe_loads_and_what_run_runs(tmp_path):
    trained = tmp_path / "trained.caffemodel"
    trained.write_bytes(_training_net(_rng(1)).SerializeToString())
    out = tmp_path / "deploy.prototxt"
    result = ok("definition", trained, "--deploy", "--input-shape", "data=2,3,7,7", "-o", out, "--json")
    record = json.loads(result.stdout)
    assert record["inputs"] == {"data": [2, 3, 7, 7]}
    assert {"layer": "test_data", "scale": 0.00390625} in record["preprocessing"]
    deploy = text_format.Parse(out.read_text(), pb.NetParameter())
    assert [(m.name, m.type) for m in deploy.layer] == [
        ("data", "Input"), ("conv1", "Convolution"), ("relu1", "ReLU"), ("pool1", "Pooling"),
        ("ip1", "InnerProduct"), ("drop1", "Dropout"), ("loss", "Softmax")]
    assert list(deploy.layer[-1].top) == ["prob"]
    assert not any(m.include or m.exclude or m.HasField("phase") for m in deploy.layer)
    x = _rng(2).standard_normal((2, 3, 7, 7)).astype(np.float32)
    ours = blobtool.run(str(trained), inputs={"data": x}, outputs="all").values
    by_definition = blobtool.run(str(trained), definition=str(out), inputs={"data": x}, outputs="all").values
    assert list(ours) == list(by_definition)
    for name in ours:
        np.testing.assert_array_equal(ours[name], by_definition[name])
    theirs = caffe_files(out, trained, {"data": x}, tmp_path)   # the training snapshot's weights, by layer name
    assert list(theirs) == list(ours)
    for name, value in theirs.items():
        assert max_scaled_difference(ours[name], value) <= 1e-5, name


def test_merged_data_layers_say_which_blob_to_give(tmp_path):
    trained = tmp_path / "merged.caffemodel"
    trained.write_bytes(_training_net(_rng(1), merged=True).SerializeToString())
    line = assert_error(invoke("definition", trained, "--deploy"), 2, "layer cat_data (Concat) merges")
    assert "give --input-shape data=N,C,H,W to take that blob as the input" in line
    result = ok("definition", trained, "--deploy", "--input-shape", "data=1,3,7,7")
    deploy = text_format.Parse(result.stdout, pb.NetParameter())
    assert [m.name for m in deploy.layer][:2] == ["data", "conv1"]
    assert "cat_label" not in result.stdout and "cat_data" not in result.stdout


def test_deploy_options_need_deploy(deploy_net, tmp_path):
    prototxt, _ = deploy_net
    assert_usage(invoke("definition", prototxt, "--input-shape", "data=1,3,7,7"), "definition",
                 "--input-shape applies only with --deploy")
    assert_usage(invoke("definition", prototxt, "--deploy", "--json"), "definition",
                 "--json does not apply with --output")


# -- every blob's shape -----------------------------------------------------------------------------

def test_info_layers_shows_every_top_shape(deploy_net):
    _, model = deploy_net
    text = ok("info", "--layers", "--input-shape", "data=6,3,7,7", model).stdout
    rows = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    assert rows["conv1"].rstrip().endswith("6x4x7x7")
    assert rows["pool1"].rstrip().endswith("6x4x3x3")
    assert rows["ip1"].rstrip().endswith("6x5")
    record = json.loads(ok("info", "--layers", "--input-shape", "data=6,3,7,7", "--json", model).stdout)
    assert record["top_shapes"]["pool1"] == [[6, 4, 3, 3]]
    assert_usage(invoke("info", "--input-shape", "data=6,3,7,7", model), "info",
                 "--input-shape applies only with --layers")


# -- proved by running both nets ---------------------------------------------------------------------

def _bn_net(rng, *, factor=7.5):
    layers = [
        layer("conv1", "Convolution", "data", blobs=[rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)],
              convolution_param={"num_output": 4, "kernel_size": [3]}),
        layer("bn1", "BatchNorm", "conv1", "conv1",
              blobs=[rng.standard_normal(4) * factor, rng.uniform(0.5, 2.0, 4) * factor, [factor]]),
        layer("scale1", "Scale", "conv1", "conv1", blobs=[rng.uniform(0.5, 1.5, 4), rng.standard_normal(4)],
              scale_param={"bias_term": True}),
        layer("relu1", "ReLU", "conv1", "conv1"),
        layer("ip1", "InnerProduct", "conv1", blobs=[rng.standard_normal((3, 4 * 5 * 5)), rng.standard_normal(3)],
              inner_product_param={"num_output": 3}),
    ]
    return net(layers, {"data": (2, 3, 7, 7)})


def test_fold_check_runs_both_nets_and_passes(tmp_path):
    _, model = write_net_files(tmp_path, _bn_net(_rng(3)))
    result = ok("fold", model, "-o", tmp_path / "folded.caffemodel", "--check", "--json")
    record = json.loads(result.stdout)
    assert record["check"]["passed"] is True
    assert [b["name"] for b in record["check"]["blobs"]] == ["conv1", "ip1"]
    assert "computes what" in result.stderr


def test_fold_check_without_a_binary_output_still_runs_the_folded_net(tmp_path):
    _, model = write_net_files(tmp_path, _bn_net(_rng(3)))
    result = ok("fold", model, "-o", tmp_path / "folded.prototxt", "--check")
    assert "2 blobs compared" in result.stderr


def test_transplant_check_passes_a_round_trip_and_fails_other_values(tmp_path):
    _, model = write_net_files(tmp_path, _bn_net(_rng(3)), "a")
    _, other = write_net_files(tmp_path, _bn_net(_rng(4)), "b")
    ok("convert", "--names", "torch", model, "-o", tmp_path / "a.safetensors")
    back = ok("transplant", tmp_path / "a.safetensors", model, "--names", "torch", "-o", tmp_path / "back.caffemodel",
              "--check")
    assert "computes what" in back.stderr
    result = invoke("transplant", other, model, "-o", tmp_path / "mixed.caffemodel", "--check")
    assert result.exit_code == 1, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith("blobtool: check FAILED: 2 of 2 blobs")
    assert any(line.startswith("blobtool:   ip1: max |difference|") for line in lines)


@pytest.mark.caffe
def test_an_ssd_head_runs_whole_and_its_blobs_match_caffe_ssd(tmp_path):
    """conv features -> loc and conf convs -> Permute, Flatten -> PriorBox -> DetectionOutput (rows known at run)."""
    rng = _rng(9)
    priors = 3  # min_size, sqrt(min * max), aspect ratio 2 (no flip)
    layers = [
        layer("feat", "Convolution", "data", blobs=[rng.standard_normal((8, 3, 3, 3)) * 0.3, rng.standard_normal(8)],
              convolution_param={"num_output": 8, "kernel_size": [3], "pad": [1], "stride": [2]}),
        layer("loc", "Convolution", "feat", blobs=[rng.standard_normal((4 * priors, 8, 1, 1)) * 0.1,
                                                   np.zeros(4 * priors)],
              convolution_param={"num_output": 4 * priors, "kernel_size": [1]}),
        layer("loc_perm", "Permute", "loc", permute_param={"order": [0, 2, 3, 1]}),
        layer("loc_flat", "Flatten", "loc_perm", flatten_param={"axis": 1}),
        layer("conf", "Convolution", "feat", blobs=[rng.standard_normal((3 * priors, 8, 1, 1)), np.zeros(3 * priors)],
              convolution_param={"num_output": 3 * priors, "kernel_size": [1]}),
        layer("conf_perm", "Permute", "conf", permute_param={"order": [0, 2, 3, 1]}),
        layer("conf_flat", "Flatten", "conf_perm", flatten_param={"axis": 1}),
        layer("priors", "PriorBox", ["feat", "data"],
              prior_box_param={"min_size": [4.0], "max_size": [9.0], "aspect_ratio": [2.0], "flip": False,
                               "clip": False, "variance": [0.1, 0.1, 0.2, 0.2]}),
        layer("conf_soft", "Reshape", "conf_flat", reshape_param={"shape": {"dim": [0, -1, 3]}}),
        layer("conf_prob", "Softmax", "conf_soft", softmax_param={"axis": 2}),
        layer("conf_back", "Flatten", "conf_prob", flatten_param={"axis": 1}),
        layer("detections", "DetectionOutput", ["loc_flat", "conf_back", "priors"],
              detection_output_param={"num_classes": 3, "share_location": True, "background_label_id": 0,
                                      "nms_param": {"nms_threshold": 0.45, "top_k": 20}, "keep_top_k": 10,
                                      "confidence_threshold": 0.2, "code_type": 2}),
    ]
    prototxt, model = write_net_files(tmp_path, net(layers, {"data": (1, 3, 16, 16)}))
    # Small inputs keep the scores off 1.0: past keep_top_k caffe-ssd orders equal scores by std::sort,
    # which leaves their order open.
    x = (_rng(10).standard_normal((1, 3, 16, 16)) * 0.05).astype(np.float32)
    values = blobtool.run(str(model), inputs={"data": x}, outputs="all").values
    found = values["detections"]
    assert found.shape[:2] == (1, 1) and found.shape[3] == 7 and 3 <= found.shape[2] <= 10
    assert len(set(found[0, 0, :, 2].tolist())) == found.shape[2]   # no two scores equal
    assert np.all((found[0, 0, :, 1] >= 1) | (found[0, 0, :, 1] == -1))  # no background rows
    # Every blob against caffe-ssd, the detection rows in its order (by label, then score).
    theirs = caffe_files(prototxt, model, {"data": x}, tmp_path)
    for name in values:
        assert values[name].shape == theirs[name].shape, name
        assert max_scaled_difference(values[name], theirs[name]) <= 1e-5, name
    info = json.loads(ok("info", "--layers", "--input-shape", "data=1,3,16,16", "--json", model).stdout)
    assert info["top_shapes"]["priors"] == [[1, 2, 8 * 8 * priors * 4]]


def test_in_place_layers_never_write_a_blob_another_reads_nor_the_callers_input(tmp_path):
    """Caffe's in-place layers write into their bottom; blobtool does so only where nothing else holds it."""
    rng = _rng(12)
    layers = [
        layer("relu0", "ReLU", "data", "data"),                       # the caller's array: copied, not written
        layer("split", "Split", "data", ["a", "b"]),                  # one array, two names
        layer("bn", "BatchNorm", "a", "a", blobs=[rng.standard_normal(3), rng.uniform(0.5, 2, 3), [1.0]]),
        layer("scale", "Scale", "a", "a", blobs=[rng.uniform(0.5, 2, 3), rng.standard_normal(3)],
              scale_param={"bias_term": True}),
        layer("prelu", "PReLU", "a", "a", blobs=[rng.uniform(0.1, 0.3, 3)]),
        layer("flat", "Flatten", "b", "flat"),                        # a view of b
        layer("drop", "Dropout", "flat", "flat"),
        layer("relu1", "ReLU", "flat", "flat"),
        layer("sum", "Eltwise", ["a", "b"], "sum"),
    ]
    _, model = write_net_files(tmp_path, net(layers, {"data": (2, 3, 4, 5)}))
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    before = x.copy()
    values = blobtool.run(str(model), inputs={"data": x}, outputs="all").values
    np.testing.assert_array_equal(x, before)
    expected = ours_forward(net(layers, {"data": (2, 3, 4, 5)}), {"data": before})
    for name, value in values.items():
        np.testing.assert_array_equal(value, expected[name], err_msg=name)


def test_a_v1_net_runs_as_caffe_upgrades_it_and_an_undeclared_input_takes_a_shape(tmp_path):
    rng = _rng(13)
    weight, bias = rng.standard_normal((2, 1, 3, 3)).astype(np.float32), rng.standard_normal(2).astype(np.float32)
    old = pb.NetParameter(name="v1")   # no input fields: "data" is read, never declared
    conv = old.layers.add(name="conv1", type=pb.V1LayerParameter.CONVOLUTION)
    conv.bottom.append("data")
    conv.top.append("conv1")
    conv.convolution_param.num_output = 2
    conv.convolution_param.kernel_size.append(3)
    for array in (weight, bias):
        blob = conv.blobs.add()
        blob.shape.dim.extend(array.shape)
        blob.data.extend(array.reshape(-1).tolist())
    relu = old.layers.add(name="relu1", type=pb.V1LayerParameter.RELU)
    relu.bottom.append("conv1")
    relu.top.append("conv1")
    path = tmp_path / "v1.caffemodel"
    path.write_bytes(old.SerializeToString())
    line = assert_error(invoke("run", path), 2, "blob 'data' is an input of the deploy net that nothing gives")
    assert "--input-shape data=N,C,H,W" in line
    x = rng.standard_normal((1, 1, 5, 5)).astype(np.float32)
    ours = blobtool.run(str(path), inputs={"data": x}).values["conv1"]
    new = net([layer("conv1", "Convolution", "data", blobs=[weight, bias],
                     convolution_param={"num_output": 2, "kernel_size": [3]}),
               layer("relu1", "ReLU", "conv1", "conv1")], {"data": (1, 1, 5, 5)})
    np.testing.assert_array_equal(ours, ours_forward(new, {"data": x})["conv1"])


def test_a_v0_net_is_refused_naming_the_upgrade(tmp_path):
    from builders import Layer, write_net

    path = write_net(tmp_path / "v0.caffemodel", "v0", [Layer("conv1", "Convolution", [np.ones((2, 1, 3, 3))],
                                                              bottom=["data"], top=["conv1"])])
    assert_error(invoke("run", path, "--input-shape", "data=1,1,5,5"), 3,
                 "layer 'conv1' is in Caffe's first (V0) layer format", "upgrade_net_proto_binary")


@pytest.mark.caffe
@pytest.mark.parametrize("case", ["two-layers", "over-the-input", "split-onto-the-input"])
def test_a_blob_of_two_sources_is_refused_as_caffe_refuses_it(tmp_path, case):
    # Caffe's Net::AppendTop: a top that is not in place (its bottom of the same position) and is known
    # already is "Top blob produced by multiple sources". blobtool let the later writer win.
    from caffeoracle import caffe_refusal

    layers = {
        "two-layers": [layer("a", "Power", "data", "x", power_param={"scale": 2.0}),
                       layer("b", "Power", "data", "x", power_param={"scale": 3.0})],
        "over-the-input": [layer("a", "Power", "data", "y"), layer("b", "Power", "y", "data")],
        "split-onto-the-input": [layer("s", "Split", "data", ["data2", "data"])],
    }[case]
    message = net(layers, {"data": (1, 2, 3)})
    refusal = caffe_refusal(message, {"data": np.ones((1, 2, 3), np.float32)}, tmp_path)
    assert refusal is not None and "Top blob" in refusal.line and "produced by multiple sources" in refusal.line
    _, model = write_net_files(tmp_path, message)
    said = ("writes its bottom 'data' in place; Caffe's Split layer does not allow in-place computation",) \
        if case == "split-onto-the-input" else ("gives already, and not in place", "produced by multiple sources")
    for command in ("run", "export"):
        args = ["-o", tmp_path / "out.onnx"] if command == "export" else []
        assert_error(invoke(command, model, *args), 3, *said)
    assert not (tmp_path / "out.onnx").exists()
