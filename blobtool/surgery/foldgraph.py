"""A net as fold reads it: its TEST net's layers, who reads which blob version, and each layer's settings.

The net folded for is the deployed one, Caffe's TEST net (phase TEST, level
0, the stages the net's own `state` names: netdef.deployment_state). A
layer its include/exclude rules leave out of it (netdef.state_excludes)
keeps no links here: it reads and writes nothing, so a TRAIN-only reader
neither blocks a fold nor takes one. A layer's own `phase` field, which a
snapshot sets on every layer, is no such rule.

A layer's settings are read from the net's bytes (its parameter messages'
varint and float fields, the last one winning), or, where another
definition of the same net is given (a deploy.prototxt, the net that will
run), from its layer of the same name. Field numbers are Caffe's:
NetParameter state = 6; LayerParameter top = 4, param = 6 (ParamSpec
name = 1), include = 8, exclude = 9; a parameter message's from the
schema (formats/caffe/schema.py).
"""

from __future__ import annotations

import struct

from ..errors import FormatError
from ..formats import Document, NetLayer, unique_names
from ..formats.caffe import layer_links, wire
from ..formats.caffe.schema import layer_field_name
from ..formats.caffe.wire import signed
from ..net.graph import blob_versions
from ..torchport.naming import layer_type

__all__ = ["DeployedNet", "layer_fields", "definition_layers", "signed",
           "MAX_LAYER_FIELDS"]

# LayerParameter fields.
TOP, PARAM, _INCLUDE, _EXCLUDE = 4, 6, 8, 9
# NetParameter.state.
_NET_STATE = 6

# A layer as Caffe writes it has a few dozen fields besides its blobs; one
# holding more is forged, and is refused rather than walked field by field.
MAX_LAYER_FIELDS = 1 << 16


def layer_fields(doc: Document, layer: NetLayer) -> list:
    """The fields of one layer's message (wire.Field, offsets in the file), at most MAX_LAYER_FIELDS."""
    f = layer.wire
    buf = memoryview(doc.source.buf)
    fields = []
    for g in wire.iter_fields(buf, f.start, f.end, path=doc.path):
        if len(fields) == MAX_LAYER_FIELDS:
            raise FormatError(f"layer {layer.name!r} holds more than {MAX_LAYER_FIELDS} fields",
                              path=doc.path, offset=g.offset)
        fields.append(g)
    return fields


def _param(doc: Document, fields: list, number: int) -> dict:
    """{field number: value} of the varint and 32-bit float fields of a parameter message, the last one winning."""
    buf = memoryview(doc.source.buf)
    values = {}
    for f in fields:
        if f.number != number or f.wire_type != wire.LEN:
            continue
        for k, g in enumerate(wire.iter_fields(buf, f.start, f.end, path=doc.path)):
            if k == MAX_LAYER_FIELDS:
                raise FormatError(f"a parameter message (field {number}) holds more than {MAX_LAYER_FIELDS} "
                                  "fields", path=doc.path, offset=g.offset)
            if g.wire_type == wire.VARINT:
                values[g.number] = g.value
            elif g.wire_type == wire.I32:
                values[g.number] = struct.unpack("<f", bytes(buf[g.start:g.end]))[0]
    return values


def _message_values(message) -> dict:
    """{field number: value} of a parsed parameter message's scalar fields that are set (as _param gives them)."""
    values = {}
    for fd, value in message.ListFields():
        if isinstance(value, bool):
            values[fd.number] = int(value)
        elif isinstance(value, float) and fd.type == fd.TYPE_FLOAT:
            values[fd.number] = struct.unpack("<f", struct.pack("<f", value))[0]
        elif isinstance(value, (int, float)):
            values[fd.number] = value
    return values


def _parse(message_type, buf, f, path, what: str):
    """A small message field's content parsed by protobuf; FormatError naming `what` where it is not such a message."""
    from google.protobuf.message import DecodeError

    try:
        return message_type.FromString(bytes(buf[f.start:f.end]))
    except DecodeError as e:
        raise FormatError(f"{what} (field {f.number}) is not a {message_type.DESCRIPTOR.name}: {e}", path=path,
                          offset=f.offset) from e


def _net_state(doc: Document):
    """The NetState the net's own definition holds (NetParameter.state, 6; occurrences merged), or None."""
    from .._pb import blobtool_caffe_pb2 as pb  # protobuf loads only where a message's small fields are parsed

    buf = memoryview(doc.source.buf)
    state = None
    for f in wire.iter_fields(buf, 0, doc.size, path=doc.path):
        if f.number == _NET_STATE and f.wire_type == wire.LEN:
            part = _parse(pb.NetState, buf, f, doc.path, "the net's state")
            state = part if state is None else (state.MergeFrom(part) or state)
    return state


def _param_names(doc: Document, fields: list) -> set:
    """The names of a layer's ParamSpecs (param = 6, name = 1): blobs shared between layers by name."""
    buf = memoryview(doc.source.buf)
    names = set()
    for f in fields:
        if f.number == PARAM and f.wire_type == wire.LEN:
            for g in wire.iter_fields(buf, f.start, f.end, path=doc.path):
                if g.number == 1 and g.wire_type == wire.LEN:
                    names.add(bytes(buf[g.start:g.end]))
    return names


def definition_layers(doc: Document) -> tuple[list, list]:
    """(names, LayerParameter messages) of a definition's layers, in order, named as the plan names layers.

    Names are told apart as a net's layers are (unique_names: a repeated
    name gets "#2").
    """
    from ..formats.caffe.containers import text
    from ..formats.caffe.netdef import definition

    messages = [layer.message for layer in definition(doc).layers]
    return unique_names([text(m.name) for m in messages]), messages


class DeployedNet:
    """A net's layers with their links in its TEST net, each blob version's writer and readers, and their settings.

    A layer outside the TEST net keeps no links here (it reads and writes
    nothing), and is in `outside` with the rules that leave it out.
    `definition`: the settings of layers it has by name come from it.
    """

    def __init__(self, doc: Document, definition: Document | None = None):
        from ..formats.caffe.netdef import deployment_state, state_excludes

        self.doc = doc
        self.layers = doc.layers
        self.names = [layer.name for layer in doc.layers]
        self.types = [layer_type(layer.type) for layer in doc.layers]
        self._fields: dict = {}
        self._shared_names = None
        state = deployment_state(_net_state(doc))
        self.outside = {}
        for i in range(len(self.layers)):
            why = state_excludes(state, *self._rules(i), layer=self.name(i), path=doc.path)
            if why is not None:
                self.outside[i] = why
        self.links = [((), ()) if i in self.outside else layer_links(doc, layer) for i, layer in enumerate(doc.layers)]
        self.blobs: dict = {}
        for e in doc.entries:
            self.blobs.setdefault(e.layer, []).append(e)
        self.inputs, self.readers = blob_versions(self.links)
        self.definition = definition
        self._defined = dict(zip(*definition_layers(definition))) if definition is not None else {}

    def _rules(self, i: int) -> tuple[list, list]:
        """Layer i's include and exclude rules (NetStateRule messages)."""
        from .._pb import blobtool_caffe_pb2 as pb  # protobuf loads only where a message's small fields are parsed

        buf = memoryview(self.doc.source.buf)
        rules: tuple = ([], [])
        for f in self.fields(i):
            if f.number in (_INCLUDE, _EXCLUDE) and f.wire_type == wire.LEN:
                what = f"an {'include' if f.number == _INCLUDE else 'exclude'} rule of layer {self.name(i)!r}"
                rules[f.number - _INCLUDE].append(_parse(pb.NetStateRule, buf, f, self.doc.path, what))
        return rules

    def defined(self, i: int):
        """Layer i's LayerParameter in the definition given, or None (none given, or it has no layer of that name)."""
        return self.defined_layer(self.name(i))

    def defined_layer(self, name: str):
        """The definition given's LayerParameter of the layer named `name` (as the plan names it), or None."""
        return self._defined.get(name)

    def where(self, i: int) -> str:
        """' in PATH' where layer i's settings come from the definition given, else ''."""
        return f" in {self.definition.path}" if self.defined(i) is not None else ""

    def settings(self, i: int, number: int) -> dict:
        """{field number: value} of layer i's parameter message `number` as the net that runs states it.

        The definition's layer of the same name where one is given and has
        it, else the net's own (`param`).
        """
        message = self.defined(i)
        if message is None:
            return self.param(i, number)
        return _message_values(getattr(message, layer_field_name(number)))

    def fields(self, i: int) -> list:
        if i not in self._fields:
            self._fields[i] = layer_fields(self.doc, self.layers[i])
        return self._fields[i]

    def param(self, i: int, number: int) -> dict:
        return _param(self.doc, self.fields(i), number)

    def sharing(self, i: int) -> list:
        """(layer, name) for each other layer of the TEST net holding a ParamSpec named as one of layer i's."""
        own = _param_names(self.doc, self.fields(i))
        if not own:
            return []
        if self._shared_names is None:
            self._shared_names = [set() if j in self.outside else _param_names(self.doc, self.fields(j))
                                  for j in range(len(self.layers))]
        return [(self.names[j], name.decode("utf-8", "backslashreplace"))
                for j, names in enumerate(self._shared_names) if j != i for name in sorted(own & names)]

    def top_bytes(self, i: int) -> bytes:
        """Layer i's first top as stored."""
        buf = memoryview(self.doc.source.buf)
        f = next(f for f in self.fields(i) if f.number == TOP and f.wire_type == wire.LEN)
        return bytes(buf[f.start:f.end])

    def name(self, i: int) -> str:
        return self.names[i]
