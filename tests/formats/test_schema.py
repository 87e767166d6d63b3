"""The committed generated module matches proto/ and carries Caffe's field numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import descriptor_pb2

from blobtool._pb import blobtool_caffe_pb2 as pb

PROTO_DIR = Path(__file__).resolve().parents[2] / "proto"
PROTO_FILE = "blobtool_caffe.proto"


def clear_json_names(messages) -> None:
    """Drop json_name, which protoc puts in descriptor sets and never in generated Python.

    A float default is written as the float32 it is: protoc versions spell
    0.999 as "0.999" or "0.999000013".
    """
    for message in messages:
        for field in message.field:
            field.ClearField("json_name")
            if field.type == descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT and field.HasField("default_value"):
                field.default_value = repr(float(np.float32(float(field.default_value))))
        clear_json_names(message.nested_type)


def test_generated_module_matches_the_schema(tmp_path):
    try:
        from grpc_tools import protoc
    except ImportError:
        pytest.skip("grpcio-tools not installed")
    out = tmp_path / "schema.desc"
    status = protoc.main(["protoc", f"-I{PROTO_DIR}", f"--descriptor_set_out={out}", PROTO_FILE])
    assert status == 0, f"protoc failed on {PROTO_DIR / PROTO_FILE}"
    compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    assert [f.name for f in compiled.file] == [PROTO_FILE]
    schema = compiled.file[0]
    clear_json_names(schema.message_type)

    committed = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(committed)
    clear_json_names(committed.message_type)
    # Compared whole: messages, fields, numbers, types, labels, defaults,
    # options (packed), enums, package. A difference means proto/generate.sh
    # was not rerun after the schema changed (or the module was edited).
    assert committed == schema, (
        "blobtool/_pb/blobtool_caffe_pb2.py is out of date with proto/blobtool_caffe.proto; "
        "run proto/generate.sh")


FDP = descriptor_pb2.FieldDescriptorProto
# (message, field) -> (number, label, type, packed); Caffe's caffe.proto.
CAFFE_FIELDS = {
    ("BlobShape", "dim"): (1, FDP.LABEL_REPEATED, FDP.TYPE_INT64, True),
    ("BlobProto", "num"): (1, FDP.LABEL_OPTIONAL, FDP.TYPE_INT32, False),
    ("BlobProto", "channels"): (2, FDP.LABEL_OPTIONAL, FDP.TYPE_INT32, False),
    ("BlobProto", "height"): (3, FDP.LABEL_OPTIONAL, FDP.TYPE_INT32, False),
    ("BlobProto", "width"): (4, FDP.LABEL_OPTIONAL, FDP.TYPE_INT32, False),
    ("BlobProto", "data"): (5, FDP.LABEL_REPEATED, FDP.TYPE_FLOAT, True),
    ("BlobProto", "diff"): (6, FDP.LABEL_REPEATED, FDP.TYPE_FLOAT, True),
    ("BlobProto", "shape"): (7, FDP.LABEL_OPTIONAL, FDP.TYPE_MESSAGE, False),
    ("BlobProto", "double_data"): (8, FDP.LABEL_REPEATED, FDP.TYPE_DOUBLE, True),
    ("BlobProto", "double_diff"): (9, FDP.LABEL_REPEATED, FDP.TYPE_DOUBLE, True),
    ("BlobProtoVector", "blobs"): (1, FDP.LABEL_REPEATED, FDP.TYPE_MESSAGE, False),
    ("NetParameter", "layer"): (100, FDP.LABEL_REPEATED, FDP.TYPE_MESSAGE, False),
    ("NetParameter", "layers"): (2, FDP.LABEL_REPEATED, FDP.TYPE_MESSAGE, False),
    ("NetParameter", "input_shape"): (8, FDP.LABEL_REPEATED, FDP.TYPE_MESSAGE, False),
    ("LayerParameter", "blobs"): (7, FDP.LABEL_REPEATED, FDP.TYPE_MESSAGE, False),
    ("LayerParameter", "convolution_param"): (106, FDP.LABEL_OPTIONAL, FDP.TYPE_MESSAGE, False),
    ("LayerParameter", "inner_product_param"): (117, FDP.LABEL_OPTIONAL, FDP.TYPE_MESSAGE, False),
    ("LayerParameter", "pooling_param"): (121, FDP.LABEL_OPTIONAL, FDP.TYPE_MESSAGE, False),
    ("LayerParameter", "batch_norm_param"): (139, FDP.LABEL_OPTIONAL, FDP.TYPE_MESSAGE, False),
    ("LayerParameter", "scale_param"): (142, FDP.LABEL_OPTIONAL, FDP.TYPE_MESSAGE, False),
    ("LayerParameter", "input_param"): (143, FDP.LABEL_OPTIONAL, FDP.TYPE_MESSAGE, False),
    ("LayerParameter", "clip_param"): (148, FDP.LABEL_OPTIONAL, FDP.TYPE_MESSAGE, False),
    ("LayerParameter", "norm_param"): (206, FDP.LABEL_OPTIONAL, FDP.TYPE_MESSAGE, False),
    ("ConvolutionParameter", "group"): (5, FDP.LABEL_OPTIONAL, FDP.TYPE_UINT32, False),
    ("ConvolutionParameter", "dilation"): (18, FDP.LABEL_REPEATED, FDP.TYPE_UINT32, False),
    ("BatchNormParameter", "eps"): (3, FDP.LABEL_OPTIONAL, FDP.TYPE_FLOAT, False),
    ("V1LayerParameter", "convolution_param"): (10, FDP.LABEL_OPTIONAL, FDP.TYPE_MESSAGE, False),
    ("V1LayerParameter", "blobs_lr"): (7, FDP.LABEL_REPEATED, FDP.TYPE_FLOAT, False),
    ("V1LayerParameter", "param"): (1001, FDP.LABEL_REPEATED, FDP.TYPE_STRING, False),
}


def committed_fields() -> dict:
    """(message, field) -> FieldDescriptorProto, from the generated module (any protobuf runtime)."""
    file = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(file)
    return {(m.name, f.name): f for m in file.message_type for f in m.field}


@pytest.mark.parametrize("message, name", list(CAFFE_FIELDS), ids=[f"{m}.{f}" for m, f in CAFFE_FIELDS])
def test_field_numbers_are_caffes(message, name):
    number, label, type_, packed = CAFFE_FIELDS[(message, name)]
    field = committed_fields()[(message, name)]
    assert field.number == number
    assert field.label == label
    assert field.type == type_
    assert field.options.packed is packed
    assert field.options.HasField("packed") is packed
    # The runtime's own descriptors agree.
    runtime = pb.DESCRIPTOR.message_types_by_name[message]
    assert runtime.fields_by_name[name].number == number
    assert runtime.fields_by_number[number].name == name


def test_message_fields_point_at_the_right_messages():
    blob = pb.DESCRIPTOR.message_types_by_name["BlobProto"]
    assert blob.fields_by_name["shape"].message_type.full_name == "blobtool.caffe.BlobShape"
    vector = pb.DESCRIPTOR.message_types_by_name["BlobProtoVector"]
    assert vector.fields_by_name["blobs"].message_type.full_name == "blobtool.caffe.BlobProto"


def test_blob_messages_have_no_other_fields():
    # Every field of the three blob messages is Caffe's; nothing renumbered or added.
    for message in ("BlobShape", "BlobProto", "BlobProtoVector"):
        names = set(pb.DESCRIPTOR.message_types_by_name[message].fields_by_name)
        assert names == {f for m, f in CAFFE_FIELDS if m == message}


def test_the_wire_bytes_are_caffes():
    # The runtime writes what Caffe writes: packed payloads and dims under
    # Caffe's numbers, legacy dims as varints.
    msg = pb.BlobProto(num=1, channels=2, height=3, width=4)
    msg.shape.dim.extend([2, 300])
    msg.data.extend([1.0, 2.0])
    msg.diff.append(0.5)
    msg.double_data.append(1.0)
    msg.double_diff.append(-2.0)
    expected = (
        b"\x08\x01\x10\x02\x18\x03\x20\x04"                      # num, channels, height, width
        + b"\x2a\x08" + b"\x00\x00\x80\x3f\x00\x00\x00\x40"       # data, packed float
        + b"\x32\x04" + b"\x00\x00\x00\x3f"                       # diff, packed float
        + b"\x3a\x05" + b"\x0a\x03\x02\xac\x02"                   # shape { dim: [2, 300] packed }
        + b"\x42\x08" + b"\x00\x00\x00\x00\x00\x00\xf0\x3f"       # double_data, packed double
        + b"\x4a\x08" + b"\x00\x00\x00\x00\x00\x00\x00\xc0"       # double_diff, packed double
    )
    assert msg.SerializeToString() == expected
    vector = pb.BlobProtoVector(blobs=[pb.BlobProto(num=7)])
    assert vector.SerializeToString() == b"\x0a\x02\x08\x07"


@pytest.mark.parametrize("header, full", [("NetHeader", "NetParameter"), ("LayerHeader", "LayerParameter"),
                                          ("V1LayerHeader", "V1LayerParameter"), ("V0LayerHeader", "V0LayerParameter")])
def test_header_messages_read_the_full_messages_fields(header, full):
    # What a file is opened with is a subset of the full definition, field for field.
    fields = committed_fields()
    mine = {name: f for (message, name), f in fields.items() if message == header}
    assert mine
    for name, f in mine.items():
        g = fields[(full, name)]
        assert (f.number, f.label, f.type) == (g.number, g.label, g.type), name
