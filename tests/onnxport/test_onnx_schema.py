"""blobtool's classes of ONNX's messages (proto/blobtool_onnx.proto) against the installed onnx's own.

blobtool writes ONNX models without importing onnx (its import takes longer than the export of
VGG-16); the bytes must be ONNX's, so every field, type and enum value it declares is the one onnx
declares, and its table of IR versions is onnx's.
"""

from __future__ import annotations

import pytest

from blobtool._pb import blobtool_onnx_pb2 as ours

onnx = pytest.importorskip("onnx", reason="onnx is not installed (blobtool[onnx]; it needs protobuf >= 4.25)")


def _messages(module, descriptor=None, prefix=""):
    descriptors = (descriptor.nested_types if descriptor is not None
                   else module.DESCRIPTOR.message_types_by_name.values())
    for d in descriptors:
        yield prefix + d.name, d
        yield from _messages(module, d, prefix + d.name + ".")


def _repeated(field) -> bool:
    """Whether a field is repeated (protobuf 5 and later have is_repeated; older ones the label)."""
    if hasattr(field, "is_repeated"):
        return field.is_repeated
    return field.label == field.LABEL_REPEATED


def _theirs(name: str):
    from onnx import onnx_ml_pb2

    found = onnx_ml_pb2.DESCRIPTOR.message_types_by_name[name.split(".")[0]]
    for part in name.split(".")[1:]:
        found = found.nested_types_by_name[part]
    return found


@pytest.mark.parametrize("name, descriptor", list(_messages(ours)), ids=lambda v: v if isinstance(v, str) else "")
def test_every_field_is_onnx_s_field(name, descriptor):
    theirs = _theirs(name)
    for field in descriptor.fields:
        other = theirs.fields_by_name[field.name]
        assert (field.number, field.type) == (other.number, other.type), (name, field.name)
        assert _repeated(field) == _repeated(other), (name, field.name)
    for enum in descriptor.enum_types:
        values = theirs.enum_types_by_name[enum.name].values_by_name
        for value in enum.values:
            assert values[value.name].number == value.number, (name, enum.name, value.name)


def test_a_model_written_with_them_reads_back_in_onnx():
    model = ours.ModelProto(ir_version=8, producer_name="blobtool")
    model.opset_import.add(domain="", version=17)
    node = model.graph.node.add(op_type="Relu", name="r")
    node.input.append("x")
    node.output.append("y")
    attribute = node.attribute.add(name="alpha", type=ours.AttributeProto.FLOAT, f=0.5)
    del attribute
    parsed = onnx.ModelProto.FromString(model.SerializeToString())
    assert parsed.graph.node[0].attribute[0].f == 0.5 and parsed.opset_import[0].version == 17


def test_the_ir_versions_are_onnx_s():
    from onnx import helper

    from blobtool.onnxport.graph import IR_VERSIONS

    table = {}
    for _, ir, opset, *_ in helper.VERSION_TABLE:
        table[opset] = max(ir, table.get(opset, 0))
    newest = onnx.defs.onnx_opset_version()
    assert {k: v for k, v in IR_VERSIONS.items() if k <= newest} == {k: table[k] for k in IR_VERSIONS if k <= newest}
