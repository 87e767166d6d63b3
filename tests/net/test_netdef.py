"""A net's definition: info --layers, .prototxt out and in, against protobuf's own decoding of the same bytes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from google.protobuf import json_format, text_format

from blobtool._pb import blobtool_caffe_pb2 as pb
from builders import Layer, len_field, net_bytes, varint_field, write_net, h5_net_bytes, write_h5, write_blob
from runner import assert_error, invoke, ok, one_json, run_blobtool

import blobtool
from blobtool.formats import MAX_BLOBS

REAL_NETS = ["lenet_iter_10000.caffemodel", "resnet20_cifar10.caffemodel", "mtcnn_det1_half.caffemodel"]


def oracle_defs(raw: bytes) -> list:
    """Each V2 layer of a binary net as protobuf decodes the whole file, blobs cleared, as MessageToDict writes it."""
    net = pb.NetParameter.FromString(raw)
    out = []
    for layer in net.layer:
        layer.ClearField("blobs")
        out.append(json_format.MessageToDict(layer, preserving_proto_field_name=True))
    return out


def layer_defs(path) -> list:
    return one_json(ok("info", "--layers", "--json", path))["layer_defs"]


@pytest.mark.parametrize("name", REAL_NETS)
def test_real_nets_layers_equal_protobufs_decode(realworld, name):
    path = realworld / name
    assert layer_defs(path) == oracle_defs(path.read_bytes())


@pytest.mark.parametrize("name", REAL_NETS)
def test_real_nets_round_trip_through_prototxt(realworld, tmp_path, name):
    path = realworld / name
    out = tmp_path / "net.prototxt"
    result = invoke("definition", path, "-o", out)
    assert result.exit_code == 0, result.stderr
    parsed = text_format.Parse(out.read_text(), pb.NetParameter())
    whole = pb.NetParameter.FromString(path.read_bytes())
    for layer in whole.layer:
        layer.ClearField("blobs")
    whole.DiscardUnknownFields()  # a fork's fields, which text cannot carry (and which are warned about)
    assert parsed == whole  # field for field
    # and read back by blobtool, the same definitions
    assert layer_defs(out) == oracle_defs(path.read_bytes())


def test_info_layers_text_shows_wiring_parameters_and_shapes(tmp_path):
    conv = Layer("conv1", "Convolution", [np.ones((32, 1, 3, 3), np.float32)], bottom=["data"], top=["conv1"],
                 params=len_field(106, varint_field(1, 32) + varint_field(2, 0) + varint_field(4, 3)
                                  + varint_field(6, 2) + varint_field(3, 1) + varint_field(5, 32)))
    bn = Layer("bn1", "BatchNorm", [np.zeros(32, np.float32), np.ones(32, np.float32), np.ones(1, np.float32)],
               bottom=["conv1"], top=["conv1"],
               params=len_field(139, varint_field(1, 1) + b"\x1d" + np.float32(1e-3).tobytes()))
    pool = Layer("pool1", "Pooling", bottom=["conv1"], top=["pool1"],
                 params=len_field(121, varint_field(1, 1) + varint_field(2, 3) + varint_field(3, 2)))
    path = write_net(tmp_path / "n.caffemodel", "new", [conv, bn, pool])
    out = ok("info", "--layers", path).stdout
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip().split()[:1] in (["conv1"], ["bn1"],
                                                                                                ["pool1"])}
    assert "data -> conv1" in lines["conv1"] and "k3 s2 p1 g32 out32 no bias" in lines["conv1"]
    assert "32x1x3x3" in lines["conv1"]
    assert "conv1 -> conv1" in lines["bn1"] and "eps 0.001 global" in lines["bn1"] and "32, 32, 1" in lines["bn1"]
    assert "AVE k3 s2" in lines["pool1"]


def test_v1_layers_are_listed_as_caffe_upgrades_them(tmp_path):
    v1 = pb.V1LayerParameter(name="conv1", type=pb.V1LayerParameter.CONVOLUTION, bottom=["data"], top=["conv1"],
                             blobs_lr=[1, 2], weight_decay=[1, 0], param=["w"])
    v1.convolution_param.num_output = 8
    v1.convolution_param.kernel_size.append(3)
    data = pb.V1LayerParameter(name="data", type=pb.V1LayerParameter.DATA, top=["data"])
    data.data_param.source = "train_lmdb"
    data.data_param.scale = 0.5
    data.data_param.mirror = True
    net = pb.NetParameter(name="old", layers=[data, v1])
    path = tmp_path / "v1.caffemodel"
    path.write_bytes(net.SerializeToString())
    defs = layer_defs(path)
    assert defs[0] == {"name": "data", "type": "Data", "top": ["data"],
                       "transform_param": {"scale": 0.5, "mirror": True},
                       "data_param": {"source": "train_lmdb"}}
    assert defs[1] == {"name": "conv1", "type": "Convolution", "bottom": ["data"], "top": ["conv1"],
                       "param": [{"name": "w", "lr_mult": 1.0, "decay_mult": 1.0},
                                 {"lr_mult": 2.0, "decay_mult": 0.0}],
                       "convolution_param": {"num_output": 8, "kernel_size": [3]}}
    out = tmp_path / "v2.prototxt"
    ok("definition", path, "-o", out)
    text = out.read_text()
    assert "layers {" not in text and "layer {" in text
    written = text_format.Parse(text, pb.NetParameter())
    assert [json_format.MessageToDict(layer, preserving_proto_field_name=True) for layer in written.layer] == defs


def test_fields_text_cannot_carry_are_named_and_strict_refuses(tmp_path):
    # NVIDIA Caffe writes varints 145-148 on every layer, where BVLC has messages under those numbers.
    fork = b"".join(varint_field(n, 0) for n in (145, 146, 147, 148))
    layers = [Layer(f"conv{i}", "Convolution", [np.ones((2, 1, 1, 1), np.float32)], params=fork) for i in range(3)]
    layers.append(Layer("ip", "InnerProduct", [np.ones((2, 2), np.float32)], params=len_field(117, varint_field(99, 1))))
    path = write_net(tmp_path / "fork.caffemodel", "new", layers)
    out = tmp_path / "fork.prototxt"
    result = invoke("definition", path, "-o", out)
    assert result.exit_code == 0
    warnings = [line for line in result.stderr.splitlines() if line]
    assert len(warnings) == 2
    assert "3 layers (conv0, conv1, conv2) hold fields text cannot carry: 145, 146, 147, 148" in warnings[0]
    assert "layer ip holds fields text cannot carry: inner_product_param.99" in warnings[1]
    assert text_format.Parse(out.read_text(), pb.NetParameter()).layer[3].name == "ip"
    out.unlink()
    result = invoke("definition", path, "-o", out, "--strict")
    assert_error(result, 2, "--strict", "145, 146, 147, 148")
    assert not out.exists()


def test_every_layer_holding_fields_text_cannot_carry_is_named_in_one_line(tmp_path):
    # A fork's net (caffe-ssd's yufacedetectnet) held an unknown field in 80 layers: each one is named.
    layers = [Layer(f"conv{i}", "ReLU", params=varint_field(4321, i)) for i in range(80)]
    path = write_net(tmp_path / "fork.caffemodel", "new", layers)
    out = tmp_path / "fork.prototxt"
    result = run_blobtool("definition", path, "-o", out, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"blobtool: warning: {path}: 80 layers ({', '.join(f'conv{i}' for i in range(80))}) hold fields text "
        "cannot carry: 4321; left out of the text"]
    assert len(text_format.Parse(out.read_text(), pb.NetParameter()).layer) == 80
    out.unlink()
    line = assert_error(invoke("definition", path, "-o", out, "--strict"), 2, "--strict", "conv0, conv1", "conv79)")
    assert "more" not in line and not out.exists()


def test_prototxt_input_info_layers_and_binary_out(tmp_path):
    text = '''# a deploy definition
name: "tiny"
input: "data"
input_shape { dim: 1 dim: 3 dim: 8 dim: 8 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }
layer { name: "prob" type: "Softmax" bottom: "conv" top: "prob" }
'''
    path = tmp_path / "deploy.prototxt"
    path.write_text(text)
    record = one_json(ok("info", "--json", path))
    assert (record["kind"], record["name"], record["layers"], record["blobs"]) == ("net", "tiny", 2, [])
    defs = layer_defs(path)
    assert defs[0]["convolution_param"] == {"num_output": 4, "kernel_size": [3], "pad": [1]}
    binary = tmp_path / "deploy.caffemodel"
    ok("definition", path, "-o", binary)
    assert pb.NetParameter.FromString(binary.read_bytes()) == text_format.Parse(text, pb.NetParameter())
    assert layer_defs(binary) == defs
    with blobtool.open_document(path) as doc:
        assert [layer.name for layer in doc.layers] == ["conv", "prob"]
        assert blobtool.net_definition(doc).net.layer[0].convolution_param.num_output == 4


@pytest.mark.parametrize("text, where", [
    ('net: "train_val.prototxt"\nbase_lr: 0.01\n', "line 1, column 1"),
    ('name: "x"\nlayer {\n  name: "a"\n  convolution_param { kernel: 3 }\n}\n', "line 4, column 23"),
    ('name: "x"\nlayer { name: "a" \n', "line 2"),
])
def test_text_that_is_not_a_net_is_exit_3_with_line_and_column(tmp_path, text, where):
    path = tmp_path / "bad.prototxt"
    path.write_text(text)
    for command in ("info", "definition"):
        args = ("-o", tmp_path / "out.caffemodel") if command == "definition" else ()
        line = assert_error(invoke(command, path, *args), 3, str(path), "not a Caffe net definition", where)
        assert "\n" not in line.strip()
    assert not (tmp_path / "out.caffemodel").exists()


def test_hostile_text_is_refused_in_bounded_time(tmp_path):
    floods = {
        "layers.prototxt": b"layer {}\n" * (MAX_BLOBS + 1),
        "string.prototxt": b'name: "' + b"a" * (9 << 20) + b'"\n',
        "binary.prototxt": b'name: "x"\nlayer { name: "\xff\xfe" }\n',
        # Runs of blanks where the sniffer and the layer count look (once exponential and quadratic).
        "blank_run.prototxt": b"name: 'x'\nlayer" + b" " * (1 << 20) + b"x",
        "blank_head.prototxt": b" " * (1 << 16) + b"!",
        "comment_head.prototxt": (b"# a comment\n" + b" " * 200) * 300 + b"!",
    }
    for name, data in floods.items():
        path = tmp_path / name
        path.write_bytes(data)
        result = run_blobtool("info", path, timeout=30)
        assert result.returncode == 3, (name, result.stderr)
        assert len(result.stderr.splitlines()) == 1 and str(path) in result.stderr.decode()


def test_binary_net_whose_name_reads_as_text_stays_binary(tmp_path):
    # A 10-character name makes the length byte a newline: "\n\nResNet: 50".
    path = tmp_path / "n.caffemodel"
    path.write_bytes(net_bytes("new", [Layer("fc", "InnerProduct", [np.ones((2, 2), np.float32)])],
                               name="ResNet: 50"))
    record = one_json(ok("info", "--json", path))
    assert record["name"] == "ResNet: 50" and record["blobs"][0]["name"] == "fc/0"


def test_layers_on_hdf5_and_on_a_blob(tmp_path):
    h5 = write_h5(tmp_path / "s.caffemodel.h5", h5_net_bytes([("conv1", [np.ones((2, 1, 3, 3), np.float32)])]))
    result = ok("info", "--layers", h5)
    assert "holds blobs only" in result.stdout and "2x1x3x3" in result.stdout
    assert layer_defs(h5) == [{"name": "conv1"}]
    assert_error(invoke("definition", h5, "-o", tmp_path / "x.prototxt"), 2, "blobs only")
    blob = write_blob(tmp_path / "b.pb", np.ones(3, np.float32))
    assert_error(invoke("info", "--layers", blob), 2, "--layers")


def test_a_prototxt_gives_an_hdf5_snapshot_its_layer_types(tmp_path):
    # --names torch needs layer types, which Caffe's HDF5 snapshot lacks: the net's text definition has them.
    from safetensors.numpy import load_file

    rng = np.random.default_rng(5)
    conv = [rng.standard_normal((4, 2, 3, 3)).astype(np.float32), rng.standard_normal(4).astype(np.float32)]
    fc = [rng.standard_normal((3, 36)).astype(np.float32), rng.standard_normal(3).astype(np.float32)]
    h5 = write_h5(tmp_path / "s.caffemodel.h5", h5_net_bytes([("conv1", conv), ("relu1", []), ("fc", fc)]))
    deploy = tmp_path / "deploy.prototxt"
    deploy.write_text('name: "n"\n'
                      'layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" }\n'
                      'layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }\n'
                      'layer { name: "fc" type: "InnerProduct" bottom: "conv1" top: "fc" }\n')
    out = tmp_path / "s.safetensors"
    result = invoke("convert", "--names", "torch", "--definition", deploy, h5, "-o", out)
    assert result.exit_code == 0, result.stderr
    got = load_file(str(out))
    assert sorted(got) == ["conv1.bias", "conv1.weight", "fc.bias", "fc.weight"]
    assert got["fc.weight"].tobytes() == fc[0].tobytes() and got["conv1.bias"].tobytes() == conv[1].tobytes()


def test_a_name_that_is_not_utf8_is_written_escaped_in_one_pass(tmp_path):
    # protobuf's own printer escapes such a string in quadratic time (2 MB: minutes).
    from google.protobuf import text_encoding

    name = b"\xff\xfe" * 1_000_000 + b'"\\\n\x01'
    layer = len_field(1, name) + len_field(2, b"ReLU")
    path = tmp_path / "odd.caffemodel"
    path.write_bytes(len_field(1, b"n") + len_field(100, layer))
    out = tmp_path / "odd.prototxt"
    result = run_blobtool("definition", path, "-o", out, timeout=60, text=True)
    try:
        pb.NetParameter().ParseFromString(b"\x0a\x01\xff")
    except Exception:  # noqa: BLE001  the pure-Python runtime (protobuf 3.20) refuses such a string: so does blobtool
        assert result.returncode == 3 and "invalid LayerParameter fields" in result.stderr, result.stderr
        assert len(result.stderr.splitlines()) == 1 and not out.exists()
        return
    assert result.returncode == 0, result.stderr
    assert "not UTF-8 text, written as" in result.stderr and len(result.stderr.splitlines()) == 1
    text = out.read_text()
    quoted = text.split('name: "', 2)[2].split('"\n', 1)[0]
    assert text_encoding.CUnescape(quoted) == name  # the escapes give back the very bytes
    assert_error(invoke("definition", path, "-o", out, "--strict"), 2, "not UTF-8")


def test_strict_goes_with_a_text_output(tmp_path):
    path = write_net(tmp_path / "n.caffemodel", "new", [Layer("fc", "InnerProduct", [np.ones((2, 2), np.float32)])])
    result = invoke("definition", path, "-o", tmp_path / "x.caffemodel", "--strict")
    assert result.exit_code == 2 and "--strict applies only with a text output" in result.stderr
    assert not (tmp_path / "x.caffemodel").exists()


# -- which layers a net holds in a state (Net::FilterNet, Net::StateMeetsRule) ------------------

def _rule(**fields):
    return pb.NetStateRule(**fields)


# (rule, state, met): each thing a rule sets checked alone, then together, as net.cpp does.
_RULES = [
    ("empty", _rule(), pb.NetState(phase=1), True),
    ("phase met", _rule(phase=1), pb.NetState(phase=1), True),
    ("phase not met", _rule(phase=0), pb.NetState(phase=1), False),
    ("TEST is the state's default phase", _rule(phase=1), pb.NetState(), True),
    ("min_level met", _rule(min_level=2), pb.NetState(level=2), True),
    ("min_level not met", _rule(min_level=2), pb.NetState(level=1), False),
    ("max_level met", _rule(max_level=2), pb.NetState(level=2), True),
    ("max_level not met", _rule(max_level=2), pb.NetState(level=3), False),
    ("negative levels", _rule(min_level=-3, max_level=-1), pb.NetState(level=-2), True),
    ("every stage present", _rule(stage=["a", "b"]), pb.NetState(stage=["b", "c", "a"]), True),
    ("a stage missing", _rule(stage=["a", "b"]), pb.NetState(stage=["a"]), False),
    ("no not_stage present", _rule(not_stage=["x"]), pb.NetState(stage=["a"]), True),
    ("a not_stage present", _rule(not_stage=["x", "y"]), pb.NetState(stage=["y"]), False),
    ("all at once", _rule(phase=1, min_level=0, max_level=0, stage=["deploy"], not_stage=["train"]),
     pb.NetState(phase=1, level=0, stage=["deploy"]), True),
    ("all at once, a stage excluded", _rule(phase=1, stage=["deploy"], not_stage=["train"]),
     pb.NetState(phase=1, stage=["deploy", "train"]), False),
]


@pytest.mark.parametrize("rule, state, met", [c[1:] for c in _RULES], ids=[c[0] for c in _RULES])
def test_a_rule_is_met_as_caffes_state_meets_rule_says(rule, state, met):
    from blobtool.formats.caffe.netdef import state_meets_rule

    assert state_meets_rule(state, rule) is met


# (include, exclude, in the TEST net at level 0 without stages, the rules named when out)
_FILTERS = [
    ("no rules", [], [], None),
    ("included in TRAIN only", [_rule(phase=0)], [], "include { phase: TRAIN }"),
    ("included in TEST", [_rule(phase=1)], [], None),
    ("one include rule of two met", [_rule(phase=0), _rule(max_level=0)], [], None),
    ("no include rule of two met", [_rule(phase=0), _rule(stage=["deploy"])], [],
     'include { phase: TRAIN }, include { stage: "deploy" }'),
    ("excluded from TEST", [], [_rule(phase=1)], "exclude { phase: TEST }"),
    ("excluded from TRAIN", [], [_rule(phase=0)], None),
    ("the second exclude rule met", [], [_rule(phase=0), _rule(not_stage=["train"])],
     'exclude { not_stage: "train" }'),
    ("an empty exclude rule", [], [_rule()], "exclude { }"),
]


@pytest.mark.parametrize("include, exclude, why", [c[1:] for c in _FILTERS], ids=[c[0] for c in _FILTERS])
def test_a_layer_is_in_the_deployed_net_as_caffes_filter_net_says(include, exclude, why):
    from blobtool.formats.caffe.netdef import deployment_state, state_excludes

    state = deployment_state()
    assert (state.phase, state.level, list(state.stage)) == (1, 0, [])
    assert state_excludes(state, include, exclude) == why


def test_the_deployed_state_keeps_the_nets_stages_and_sets_test_and_level_0():
    from blobtool.formats.caffe.netdef import deployment_state, state_excludes

    state = deployment_state(pb.NetState(phase=0, level=3, stage=["deploy"]))
    assert (state.phase, state.level, list(state.stage)) == (1, 0, ["deploy"])
    assert state_excludes(state, [_rule(stage=["deploy"])], []) is None
    assert state_excludes(state, [_rule(min_level=1)], []) == "include { min_level: 1 }"


def test_a_layer_with_include_and_exclude_rules_is_refused_as_caffe_refuses_it():
    from blobtool.errors import FormatError
    from blobtool.formats.caffe.netdef import deployment_state, state_excludes

    with pytest.raises(FormatError, match="layer 'bn' has both include and exclude rules") as e:
        state_excludes(deployment_state(), [_rule(phase=1)], [_rule(phase=0)], layer="bn", path="net.prototxt")
    assert str(e.value).startswith("net.prototxt")
