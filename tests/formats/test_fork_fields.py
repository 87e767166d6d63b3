"""Forks' fields and names as bytes: a fork's field number in a layer of another type, unknown fields in text,
and blob and layer names that differ only in bytes that are not UTF-8 or past the first 256 characters.

The nets are built here, field by field where protobuf cannot build them
(another fork's message under a number blobtool's schema gives a fork
parameter; names that are not UTF-8). protobuf's own text parser, told to
pass over unknown fields, is the oracle of what a text net holds besides
them.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from google.protobuf import json_format, text_format

from blobtool._pb import blobtool_caffe_pb2 as pb
from builders import REFUSES_BAD_UTF8, len_field, varint_field
from caffenets import layer, net
from runner import assert_error, invoke, ok, one_json

# -- item 18: a fork's field number in a layer of another type --------------------------------

# A quantization fork's settings under 149-151 in a Convolution layer: 149 holds bytes that are no
# UpsampleParameter (a float field, then a tag cut short), 150 a message, 151 a varint.
QUANT_149 = len_field(149, b"\x0d\x00\x00\x80\x3f\xff")
QUANT_REST = len_field(150, varint_field(1, 8)) + varint_field(151, 3)


def _conv():
    return layer("conv1", "Convolution", "data", blobs=[np.full((2, 1, 1, 1), 2.0), np.array([0.5, -1.0])],
                 convolution_param={"num_output": 2, "kernel_size": [1]})


def _quantized_net(tmp_path, fields=QUANT_149 + QUANT_REST):
    """A net whose Convolution layer carries `fields` after its own; its path."""
    raw = net([], {"data": (1, 1, 2, 2)}).SerializeToString() + len_field(100, _conv().SerializeToString() + fields)
    path = tmp_path / "quantized.caffemodel"
    path.write_bytes(raw)
    return path


def test_a_forks_number_in_a_convolution_does_not_break_reading(tmp_path):
    path = _quantized_net(tmp_path)
    shown = ok("info", "--layers", path).stdout
    assert "not understood: 149, 150, 151" in shown
    record = one_json(ok("info", "--layers", "--json", path))
    assert record["unknown_fields"] == {"conv1": ["149", "150", "151"]}
    assert [d.get("upsample_param") for d in record["layer_defs"]] == [None]
    out = tmp_path / "torch.safetensors"
    ok("convert", "--names", "torch", path, "-o", out)
    from safetensors.numpy import load_file

    got = load_file(str(out))
    assert sorted(got) == ["conv1.bias", "conv1.weight"]
    np.testing.assert_array_equal(got["conv1.bias"], [0.5, -1.0])


def test_a_forks_number_in_a_convolution_runs_and_its_bytes_are_kept(tmp_path):
    path = _quantized_net(tmp_path)
    from blobtool.formats import open_document
    from blobtool.formats.caffe.netdef import definition

    with open_document(str(path)) as doc:
        found = definition(doc)
        assert found.layers[0].unparsed == QUANT_149  # byte for byte, tag included
        assert found.layers[0].lost == ("149", "150", "151")
    result = ok("run", path, "--json")
    assert result.exit_code == 0
    # A rewrite keeps every byte of the layers it does not change: the fork's fields too.
    out = tmp_path / "renamed.caffemodel"
    ok("edit", path, "--rename", "conv1=c1", "-o", out)
    assert QUANT_149 + QUANT_REST in out.read_bytes()
    # A definition in text cannot carry them: named, not dropped in silence.
    text = invoke("definition", path, "-o", tmp_path / "net.prototxt")
    assert text.exit_code == 0, text.stderr
    assert "layer conv1 holds fields text cannot carry: 149, 150, 151" in text.stderr


def test_a_valid_looking_message_under_149_is_upsample_param_only_in_an_upsample_layer(tmp_path):
    # The same bytes (scale: 2) read as upsample_param in an Upsample layer, and as a field not
    # understood in a Convolution layer.
    scale = len_field(149, varint_field(1, 2))
    upsample = layer("up", "Upsample", "conv1").SerializeToString() + scale
    raw = net([], {"data": (1, 1, 2, 2)}).SerializeToString()
    raw += len_field(100, _conv().SerializeToString() + scale) + len_field(100, upsample)
    path = tmp_path / "yolo.caffemodel"
    path.write_bytes(raw)
    record = one_json(ok("info", "--layers", "--json", path))
    conv, up = record["layer_defs"]
    assert "upsample_param" not in conv and up["upsample_param"] == {"scale": 2}
    assert record["unknown_fields"] == {"conv1": ["149"]}
    values = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)
    np.save(tmp_path / "x.npy", values)
    out = tmp_path / "up.npz"
    ok("run", path, "--input", f"data={tmp_path / 'x.npy'}", "--outputs", "up", "-o", out)
    got = np.load(out)["up"]
    conv_out = np.concatenate([values * 2 + 0.5, values * 2 - 1.0], axis=1)
    np.testing.assert_array_equal(got, conv_out.repeat(2, axis=2).repeat(2, axis=3))


# -- item 19: a text net with fields the schema does not know --------------------------------

ENET = """name: "ENet"
input: "data"
input_shape { dim: 1 dim: 3 dim: 8 dim: 8 }
layer {
  name: "conv0_1"
  type: "Convolution"
  bottom: "data"
  top: "conv0_1"
  convolution_param { num_output: 13 kernel_size: 3 pad: 1 stride: 2 }
}
layer {
  name: "bn0_1"
  type: "Region"
  bottom: "conv0_1"
  top: "conv0_1"
  region_param {
    scale_filler { type: "constant" value: 1 }
    shift_filler { type: "constant" value: 0.001 }
    bn_mode: INFERENCE
  }
}
layer {
  name: "prelu0_1"
  type: "PReLU"
  bottom: "conv0_1"
  top: "conv0_1"
  prelu_param { channel_shared: false }
  quantize: [1, 2]
  note: "a" 'b'
}
"""


# ENET's fields that the schema does not know, as the text has them.
ENET_UNKNOWN = ("""  region_param {
    scale_filler { type: "constant" value: 1 }
    shift_filler { type: "constant" value: 0.001 }
    bn_mode: INFERENCE
  }
""", "  quantize: [1, 2]\n", """  note: "a" 'b'\n""")


def _oracle(content: str) -> dict:
    """What protobuf's own text parser makes of ENET without the fields it does not know.

    (protobuf's allow_unknown_field cannot stand in: 3.20.3's parser does
    not pass over a list.)
    """
    for unknown in ENET_UNKNOWN:
        assert unknown in content
        content = content.replace(unknown, "")
    message = text_format.Parse(content, pb.NetParameter())
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def test_enet_deploy_definition_is_listed_and_refused_by_type(tmp_path):
    path = tmp_path / "enet.prototxt"
    path.write_text(ENET)
    shown = ok("info", "--layers", path).stdout
    assert "(not understood: region_param)" in shown and "no channel_shared (not understood: quantize, note)" in shown
    record = one_json(ok("info", "--layers", "--json", path))
    assert record["unknown_fields"] == {"bn0_1": ["region_param"], "prelu0_1": ["quantize", "note"]}
    assert [d["type"] for d in record["layer_defs"]] == ["Convolution", "Region", "PReLU"]
    assert record["layer_defs"] == _oracle(ENET)["layer"]
    assert_error(invoke("run", path), 3, "layer 'bn0_1' has type 'Region', which blobtool cannot run")
    assert_error(invoke("export", path, "-o", tmp_path / "enet.onnx"), 3,
                 "layer 'bn0_1' has type 'Region', which blobtool cannot run")
    assert not (tmp_path / "enet.onnx").exists()


def test_unknown_text_fields_are_named_when_written(tmp_path):
    path = tmp_path / "enet.prototxt"
    path.write_text(ENET)
    result = invoke("definition", path, "-o", tmp_path / "out.prototxt")
    assert result.exit_code == 0, result.stderr
    assert "layer bn0_1 holds fields blobtool's schema does not know: region_param; left out of the text" in result.stderr
    result = invoke("definition", path, "-o", tmp_path / "out.caffemodel")
    assert result.exit_code == 0, result.stderr
    assert "layer bn0_1 holds fields blobtool's schema does not know: region_param; left out of the binary net" \
        in result.stderr
    written = pb.NetParameter.FromString((tmp_path / "out.caffemodel").read_bytes())
    assert json_format.MessageToDict(written, preserving_proto_field_name=True) == _oracle(ENET)


@pytest.mark.parametrize("content, unknown", [
    # the list syntax of layers, each its own layer
    ('layer: [{ name: "a" type: "Region" region_param { x: 1 } }, { name: "b" type: "ReLU" y: [3] }]\n',
     {"a": ["region_param"], "b": ["y"]}),
    # V1 layers, named in the order the net lists them
    ('layers { name: "a" type: RELU region_param < x: 1 > }\nlayers { name: "b" type: TANH }\n', {"a": ["region_param"]}),
    # values of every shape: a negative number, a run of strings, nested messages
    ('layer { name: "a" type: "Region" w: - 5 z: "q" "r" v { u { t: 1 } } }\n', {"a": ["w", "z", "v"]}),
], ids=["list", "v1", "values"])
def test_unknown_fields_in_every_layer_syntax(tmp_path, content, unknown):
    path = tmp_path / "net.prototxt"
    path.write_text(content)
    record = one_json(ok("info", "--layers", "--json", path))
    assert record["unknown_fields"] == unknown


@pytest.mark.parametrize("content, where", [
    # the net's own field: a solver's text, not a net
    ('net: "train_val.prototxt"\nbase_lr: 0.01\n', 'line 1, column 1: Message type "caffe.NetParameter" has no '
                                                     'field named "net"'),
    # a misspelt setting in a message Caffe knows, after a fork's field passed over
    ('layer {\n  type: "Convolution"\n  region_param { x: 1 }\n  convolution_param { stide: 2 }\n}\n',
     'line 4, column 23: Message type "caffe.ConvolutionParameter" has no field named "stide"'),
], ids=["net", "nested"])
def test_unknown_fields_outside_a_layers_own_are_refused(tmp_path, content, where):
    path = tmp_path / "net.prototxt"
    path.write_text(content)
    assert_error(invoke("info", "--layers", path), 3, f"not a Caffe net definition: {where}")


def test_an_error_after_an_unknown_field_keeps_its_line_and_column(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text('layer {\n  name: "a"\n  region_param { x: 1 }\n  type: "Region"\n  top: \n}\n')
    direct = text_format.Parse  # the error protobuf gives for the same text without the unknown field
    with pytest.raises(text_format.ParseError) as caught:
        direct('layer {\n  name: "a"\n                   \n  type: "Region"\n  top: \n}\n', pb.NetParameter())
    line = assert_error(invoke("info", "--layers", path), 3, "not a Caffe net definition: line 6, column 1")
    assert str(caught.value).startswith("6:1 :"), str(caught.value)
    assert "region_param" not in line


def test_a_misspelt_field_where_text_cannot_walk_is_still_refused(tmp_path):
    # An unknown field followed by text that is not a message: protobuf's own error, nothing passed over.
    path = tmp_path / "net.prototxt"
    path.write_text('layer { name: "a" region_param { x: 1 } type: "Region" } }\n')
    assert_error(invoke("info", path), 3, "not a Caffe net definition: line 1")


# -- item 6: names are byte strings ----------------------------------------------------------



def _refused_where_protobuf_refuses(*args) -> bool:
    """On a runtime that refuses strings that are not UTF-8: blobtool's one line, exit 3 (and True)."""
    if not REFUSES_BAD_UTF8:
        return False
    assert_error(invoke(*args), 3, "fields (")
    return True


def _raw_layer(name: str, kind: str, bottoms=(), tops=(), params=(), **settings) -> bytes:
    """A `layer` field whose bottoms, tops and ParamSpec names are any bytes (protobuf's setters take UTF-8 only)."""
    body = layer(name, kind, [], [], **settings).SerializeToString()
    body += b"".join(len_field(3, b) for b in bottoms) + b"".join(len_field(4, t) for t in tops)
    body += b"".join(len_field(6, len_field(1, p)) for p in params)
    return len_field(100, body)


# Pairs of names that blobtool once made one: bytes that are not UTF-8 against their \xNN text, and
# two names that differ only past their first 256 characters.
CLASHING = {"not UTF-8": (b"x\xff", b"x\\xff"), "long": (b"y" * 300 + b"1", b"y" * 300 + b"2")}


def _clashing_net(tmp_path, first: bytes, second: bytes):
    """data -> Power(+2) -> `first`, data -> Power(+1) -> `second`, Eltwise SUM of both -> sum: 1 gives 5."""
    raw = net([], {"data": (1,)}).SerializeToString()
    raw += _raw_layer("p1", "Power", [b"data"], [first], power_param={"shift": 2.0})
    raw += _raw_layer("p2", "Power", [b"data"], [second], power_param={"shift": 1.0})
    raw += _raw_layer("sum", "Eltwise", [first, second], [b"sum"])
    path = tmp_path / "clash.caffemodel"
    path.write_bytes(raw)
    ones = tmp_path / "one.npy"
    np.save(ones, np.ones((1,), np.float32))
    return path, ones


@pytest.mark.parametrize("names", list(CLASHING.values()), ids=list(CLASHING))
def test_two_names_never_become_one_blob(tmp_path, names):
    path, ones = _clashing_net(tmp_path, *names)
    if names[0] == b"x\xff" and _refused_where_protobuf_refuses("run", path, "--input", f"data={ones}"):
        return
    record = one_json(ok("run", path, "--input", f"data={ones}", "--outputs", "all", "--json"))
    values = {b["name"]: b["max"] for b in record["blobs"]}
    # Caffe: 3 and 2 are two blobs, and their sum is 5 (one blob would give 4).
    assert values == {"data": 1.0, names[0].decode("utf-8", "surrogateescape"): 3.0,
                      names[1].decode("utf-8", "surrogateescape"): 2.0, "sum": 5.0}


def test_names_that_are_not_utf8_print_in_tables_and_json(tmp_path):
    from runner import run_blobtool

    path, ones = _clashing_net(tmp_path, *CLASHING["not UTF-8"])
    if _refused_where_protobuf_refuses("run", path, "--input", f"data={ones}"):
        return
    for env in ({}, {"PYTHONIOENCODING": "ascii"}):
        result = run_blobtool("run", path, "--input", f"data={ones}", "--outputs", "all", env=env, text=True)
        assert result.returncode == 0, result.stderr
        words = set(re.split(r"[\s|]+", result.stdout))
        assert {"data", "x\\udcff", "x\\xff", "sum"} <= words  # escaped, and told apart
    result = run_blobtool("run", path, "--input", f"data={ones}", "--outputs", "all", "--json", text=True)
    assert result.returncode == 0, result.stderr
    assert [b["name"] for b in json.loads(result.stdout)["blobs"]] == ["data", "x\udcff", "x\\xff", "sum"]


def test_a_deploy_net_keeps_the_bytes_of_its_names(tmp_path):
    # The deploy net's own Input layer is named after an input that is not UTF-8: its bytes, not
    # their \xNN text, so that Caffe finds the layer that reads it.
    raw = len_field(1, b"n") + len_field(3, b"in\xfe") + len_field(8, varint_field(1, 1))
    raw += _raw_layer("p1", "Power", [b"in\xfe"], [b"out"], power_param={"shift": 1.0})
    path = tmp_path / "odd_input.caffemodel"
    path.write_bytes(raw)
    if _refused_where_protobuf_refuses("run", path):
        return
    record = one_json(ok("run", path, "--outputs", "all", "--json"))
    assert [b["name"] for b in record["blobs"]] == ["in\udcfe", "out"]
    from blobtool.formats import open_document
    from blobtool.forward.deploy import deploy_net

    with open_document(str(path)) as doc:
        deploy = deploy_net(doc)
    made = pb.NetParameter.FromString(deploy.net.SerializeToString())
    assert (made.layer[0].name, made.layer[0].top[:], made.layer[1].bottom[:]) == (b"in\xfe", [b"in\xfe"],
                                                                                   [b"in\xfe"])


def test_parameters_shared_by_name_are_shared_only_by_the_same_bytes(tmp_path):
    # Caffe shares a blob between layers whose ParamSpec names are equal; b"w\xff" and "w\\xff" are not.
    raw = net([], {"data": (1, 1)}).SerializeToString()
    raw += _raw_layer("s1", "Scale", [b"data"], [b"s1"], [b"w\xff"], blobs=[[2.0]])
    raw += _raw_layer("s2", "Scale", [b"data"], [b"s2"], [b"w\\xff"], blobs=[[3.0]])
    path = tmp_path / "shared.caffemodel"
    path.write_bytes(raw)
    ones = tmp_path / "one.npy"
    np.save(ones, np.ones((1, 1), np.float32))
    if _refused_where_protobuf_refuses("run", path, "--input", f"data={ones}"):
        return
    record = one_json(ok("run", path, "--input", f"data={ones}", "--outputs", "all", "--json"))
    assert {b["name"]: b["max"] for b in record["blobs"]} == {"data": 1.0, "s1": 2.0, "s2": 3.0}


def test_the_forks_parameters_agree_with_the_table_of_layer_types():
    # schema.py (a format, below the net model) names each fork's message and its owner types itself.
    from blobtool.formats.caffe.schema import FORK_PARAMS, fork_fields, layer_field
    from blobtool.net.layertypes import param_of

    for name, owners in FORK_PARAMS.items():
        assert all(param_of(kind) == name for kind in owners), name
        assert layer_field(name) not in fork_fields(owners[0]) and layer_field(name) in fork_fields("Convolution")


def test_an_edited_text_definition_keeps_its_unknown_fields_named(tmp_path):
    from blobtool.formats import open_document
    from blobtool.formats.caffe.netdef import definition
    from blobtool.surgery.rename import edit_layers

    path = tmp_path / "enet.prototxt"
    path.write_text(ENET)
    with open_document(str(path)) as doc:
        edited, _ = edit_layers(doc, {"bn0_1": "bn"}, ("conv0_1",))
        found = definition(edited)
    assert [(d.message.name, d.lost) for d in found.layers] == [("bn", ("region_param",)),
                                                                ("prelu0_1", ("quantize", "note"))]
