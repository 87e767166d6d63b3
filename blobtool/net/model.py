"""A net, modelled once: its layers in order, their blobs by role, who reads which blob version, a view per phase.

model(doc) builds it from any net blobtool reads and keeps it with the
document, so that the jobs of one command (fold, the way back into a net,
--rename/--drop, --names torch, the layer table) share one:

- a binary net (.caffemodel, V0, V1 and V2 layers): names, types (V0's
  strings as today's names), bottoms and tops read from the file when the
  model is built;
- a text net (.prototxt): the same from its parsed layers (V1 upgraded);
- an HDF5 snapshot, which holds layer names and blobs only: given
  `definition` (the .prototxt or .caffemodel of the same net), each layer
  takes its type, bottoms, tops and rules from the definition's layer of
  the same name.

`definition` also gives the settings of the layers it has by name (a
deploy.prototxt: the net that will run), where the net's own differ.

A view (Net.view) is the net one phase runs: Caffe's Net::FilterNet with
the state of that phase (phase, level 0, the stages the net's own `state`
names: netdef.deployment_state). A layer its include/exclude rules leave
out keeps no links in that view (it reads and writes nothing), and is in
`outside` with the rules that leave it out. `view(None)` is every layer as
stored, rules unread (--drop and --names torch follow a file's layers as
they are). A layer's own `phase` field, which a snapshot sets on every
layer, is no such rule.

A binary net's settings are read from its bytes (a parameter message's
varint and float fields, the last one winning); field numbers come from
Caffe's schema (formats/caffe/schema.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import FormatError
from ..formats import Document, NetLayer, unique_names
from ..formats.caffe import layer_links, wire
from ..formats.caffe.containers import V0_TYPE_NAMES, name_key, text
from ..formats.caffe.schema import layer_field
from .graph import Versions
from .layertypes import row

__all__ = ["Net", "Layer", "View", "model", "type_name", "layer_fields", "definition_layers", "MAX_LAYER_FIELDS",
           "TRAIN", "TEST"]

# Caffe's phases (caffe.proto's Phase).
TRAIN, TEST = 0, 1

# A layer as Caffe writes it has a few dozen fields besides its blobs; one
# holding more is forged, and is refused rather than walked field by field.
MAX_LAYER_FIELDS = 1 << 16


def type_name(stored: str | None) -> str:
    """Today's type name of a layer's stored type (V0's lower-case strings included); "" for none."""
    return V0_TYPE_NAMES.get(stored or "", stored or "")


def model(doc: Document, definition: Document | None = None) -> Net:
    """The model of net `doc` (with the settings of `definition`, when given): built at the first call, then kept.

    Kept with the document for as long as its layers and entries are the
    ones it was built from (a closed document has none). A copy of a
    document made with dataclasses.replace (other entries' names) gets its own.
    """
    for made in doc.models:
        if made.doc is doc and made.definition is definition and made.stored is doc.layers \
                and made.entries is doc.entries:
            return made
    made = Net(doc, definition)
    doc.models = [m for m in doc.models if m.doc is doc and m.stored is doc.layers] + [made]
    return made


@dataclass(eq=False)
class Layer:
    """One layer of the model: where it is, what it is, what it reads and writes, the blobs it holds."""

    index: int
    name: str                  # as its blobs' names use it (unique_names: a repeated name gets "#2")
    type: str                  # today's type name; "" where neither the net nor a definition gives one
    blobs: list                # its Entries, in order
    stored: NetLayer           # the document's layer
    defined: object = None     # the definition given's LayerParameter of the same name, or None
    net: Net = field(default=None, repr=False)

    @property
    def bottoms(self) -> tuple:
        """The blob names it reads (read from the file when the net's links are first asked for)."""
        return self.net.links[self.index][0]

    @property
    def tops(self) -> tuple:
        return self.net.links[self.index][1]

    def blob(self, role: str):
        """The Entry holding `role` ("weight", "bias", "mean", "variance", "factor", "slope"), or None.

        Roles are the layer type's (net/layertypes.py), by index: a layer
        holding fewer blobs has no entry for the later roles.
        """
        found = row(self.type)
        if found is None or role not in found.blobs:
            return None
        index = found.blobs.index(role)
        return self.blobs[index] if index < len(self.blobs) else None

    def roles(self) -> dict:
        """{role: Entry} of the blobs its type names (net/layertypes.py)."""
        found = row(self.type)
        return {} if found is None else dict(zip(found.blobs, self.blobs))


class Net:
    """The layers of a net in order (Layer), each once; views per phase (view()) built when first asked for."""

    def __init__(self, doc: Document, definition: Document | None = None):
        self.doc = doc
        self.path = doc.path
        self.definition = definition
        self.stored = doc.layers
        self.entries = doc.entries
        self._defined = dict(zip(*definition_layers(definition))) if definition is not None else {}
        self._fields: dict = {}
        self._own = None   # layer_defs(), parsed when a setting is first read
        self._views: dict = {}
        self._state = None
        self._shared_names = None
        self._links = None
        held: dict = {}
        for e in doc.entries:
            held.setdefault(e.layer, []).append(e)
        self.blobs = held  # {layer name: its entries}
        self.layers = [self._layer(i, stored, held.get(stored.name, [])) for i, stored in enumerate(self._order())]
        self.names = [layer.name for layer in self.layers]
        self.types = [layer.type for layer in self.layers]
        self.by_name = {layer.name: layer for layer in self.layers}

    def _order(self) -> list:
        """The document's layers in the net's order: an HDF5 snapshot's (by name, as HDF5 lists groups) as its definition's.

        A layer the definition has and the snapshot lacks is one without
        blobs; one only the snapshot has follows, without links.
        """
        if self.definition is None or any(s.wire is not None or s.message is not None for s in self.stored):
            return list(self.stored)
        names = definition_layers(self.definition)[0]
        by_name = {s.name: s for s in self.stored}
        known = set(names)
        return [by_name.get(name) or NetLayer(name) for name in names] + [s for s in self.stored if s.name not in known]

    def _layer(self, i: int, stored: NetLayer, blobs: list) -> Layer:
        defined = self._defined.get(stored.name)
        kind = type_name(stored.type)
        if not kind and stored.wire is None and stored.message is None and defined is not None:
            kind = type_name(text(defined.type))  # HDF5: the definition's layer of that name says
        return Layer(i, stored.name, kind, blobs, stored, defined, self)

    @property
    def links(self) -> list:
        """(bottoms, tops) of every layer, in order: read from the net (HDF5: the definition given) when first asked for.

        Not at open: a forged layer of millions of one-byte names costs far
        more as Python strings than as its bytes, and only the jobs that
        follow blobs (fold, --drop, --names torch's Scale merge) need them.
        """
        if self._links is None:
            self._links = [self._links_of(layer) for layer in self.layers]
        return self._links

    def _links_of(self, layer: Layer) -> tuple:
        if layer.stored.wire is not None or layer.stored.message is not None:
            return layer_links(self.doc, layer.stored)
        if layer.defined is not None:
            return tuple(map(name_key, layer.defined.bottom)), tuple(map(name_key, layer.defined.top))
        return (), ()

    def layer_defs(self) -> list:
        """Each layer's full LayerParameter without blobs, in order (V0 and V1 layers upgraded: formats/caffe/netdef.py).

        None for each layer of a format that holds no definition (HDF5).
        """
        if self.doc.format == "hdf5":
            return [None] * len(self.layers)
        from ..formats.caffe.netdef import definition

        return [layer.message for layer in definition(self.doc).layers]

    # -- phases -------------------------------------------------------------------------------

    def view(self, phase: int | None = TEST) -> View:
        """The net phase `phase` runs (TEST: the deployed one; TRAIN), or every layer as stored (None)."""
        if phase not in self._views:
            self._views[phase] = View(self, phase)
        return self._views[phase]

    @property
    def test(self) -> View:
        return self.view(TEST)

    @property
    def train(self) -> View:
        return self.view(TRAIN)

    def state(self):
        """The NetState the net's own definition holds (NetParameter.state; occurrences merged), or None."""
        if self._state is None:
            holds = any(layer.wire is not None or layer.message is not None for layer in self.stored)
            source = self.doc if holds or self.definition is None else self.definition  # HDF5: the definition's
            self._state = (_net_state(source),)
        return self._state[0]

    def rules(self, i: int) -> tuple[list, list]:
        """Layer i's include and exclude rules (NetStateRule messages)."""
        stored = self.layers[i].stored
        message = stored.message if stored.message is not None else (
            self.layers[i].defined if stored.wire is None else None)
        if message is not None:
            return list(message.include), list(message.exclude)
        if stored.wire is None:
            return [], []
        from .._pb import blobtool_caffe_pb2 as pb  # protobuf loads only where a message's small fields are parsed

        v1 = stored.wire.number != 100
        numbers = (layer_field("include", v1=v1), layer_field("exclude", v1=v1))
        buf = memoryview(self.doc.source.buf)
        rules: tuple = ([], [])
        for f in self.fields(i):
            if f.number in numbers and f.wire_type == wire.LEN:
                k = numbers.index(f.number)
                what = f"an {('include', 'exclude')[k]} rule of layer {self.name(i)!r}"
                rules[k].append(_parse(pb.NetStateRule, buf, f, self.path, what))
        return rules

    # -- a layer's settings ---------------------------------------------------------------------

    def name(self, i: int) -> str:
        return self.names[i]

    def defined(self, i: int):
        """Layer i's LayerParameter in the definition given, or None (none given, or it has no layer of that name)."""
        return self.defined_layer(self.name(i))

    def defined_layer(self, name: str):
        """The definition given's LayerParameter of the layer named `name` (as the model names it), or None."""
        return self._defined.get(name)

    def where(self, i: int) -> str:
        """' in PATH' where layer i's settings come from the definition given, else ''."""
        return f" in {self.definition.path}" if self.defined(i) is not None else ""

    def setting(self, i: int, message: str, name: str, *, own: bool = False, unset=None):
        """Layer i's `message`.`name` (a parameter message and its field, by name) from its parsed LayerParameter.

        As the net that runs states it: the definition given's layer of the
        same name where there is one, else the net's own (`own`: always the
        net's own). A field left unset is the schema's default; `unset`, where
        given, is returned instead for a field the layer does not set (a
        setting whose absence means something else: BatchNorm's
        use_global_stats follows the phase).
        """
        layer = None if own else self.defined(i)
        if layer is None:
            if self._own is None:
                self._own = self.layer_defs()
            layer = self._own[i]
        if layer is None:  # an HDF5 snapshot states no settings: the schema's defaults
            from .._pb import blobtool_caffe_pb2 as pb

            layer = pb.LayerParameter()
        params = getattr(layer, message)
        if unset is not None and not params.HasField(name):
            return unset
        return getattr(params, name)

    def fields(self, i: int) -> list:
        """The fields of binary layer i's message (wire.Field), read once."""
        if i not in self._fields:
            self._fields[i] = layer_fields(self.doc, self.layers[i].stored)
        return self._fields[i]

    def param_names(self, i: int) -> set:
        """The names of layer i's ParamSpecs (bytes): blobs shared between layers by name."""
        stored = self.layers[i].stored
        if stored.message is not None:
            return {p.name.encode() if isinstance(p.name, str) else p.name for p in stored.message.param if p.name}
        if stored.wire is None:
            return set()
        return _param_names(self.doc, self.fields(i), layer_field("param", v1=stored.wire.number != 100))

    def all_param_names(self) -> list:
        """param_names of every layer, in order, read once."""
        if self._shared_names is None:
            self._shared_names = [self.param_names(j) for j in range(len(self.layers))]
        return self._shared_names

    def top_bytes(self, i: int) -> bytes:
        """Binary layer i's first top as stored."""
        buf = memoryview(self.doc.source.buf)
        number = layer_field("top", v1=self.layers[i].stored.wire.number != 100)
        f = next(f for f in self.fields(i) if f.number == number and f.wire_type == wire.LEN)
        return bytes(buf[f.start:f.end])


class View:
    """The layers of a Net one phase runs: each layer's (bottoms, tops), each blob version's writer and readers.

    `links[i]` is ((), ()) for a layer in `outside` ({index: the rules
    that leave it out, as text}). `inputs[i]` holds, per bottom of layer
    i, the version it reads ((writer's index, which of its tops), or None
    for a net input); `readers` maps a version to the layers reading it,
    each once, in order (net/graph.py).
    """

    def __init__(self, net: Net, phase: int | None):
        from ..formats.caffe.netdef import deployment_state, state_excludes

        self.net = net
        self.phase = phase
        self.outside: dict = {}
        if phase is not None:
            state = deployment_state(net.state(), phase=phase)
            for i in range(len(net.layers)):
                why = state_excludes(state, *net.rules(i), layer=net.name(i), path=net.path)
                if why is not None:
                    self.outside[i] = why
        self.links = [((), ()) if i in self.outside else both for i, both in enumerate(net.links)]
        self.versions = Versions(self.links)
        self.inputs, self.readers = self.versions.reads, self.versions.readers

    def __getattr__(self, name: str):
        # What a view does not hold itself (the layers, names, types, blobs, the definition,
        # settings, param, top_bytes...) is its net's.
        if name == "net":
            raise AttributeError(name)
        return getattr(self.net, name)

    def writer(self, i: int, k: int = 0):
        """The version layer i's bottom k reads: (writer's index, which of its tops), or None (a net input)."""
        return self.inputs[i][k]

    def others_reading(self, version, i: int) -> list:
        """The indices of the layers other than i reading `version`, in order."""
        return [r for r in self.readers.get(version, []) if r != i]

    def sharing(self, i: int) -> list:
        """(layer, name) for each other layer of this view holding a ParamSpec named as one of layer i's."""
        own = self.net.param_names(i)
        if not own:
            return []
        return [(self.net.names[j], name.decode("utf-8", "backslashreplace"))
                for j, names in enumerate(self.net.all_param_names())
                if j != i and j not in self.outside for name in sorted(own & names)]


def layer_fields(doc: Document, layer: NetLayer) -> list:
    """The fields of one binary layer's message (wire.Field, offsets in the file), at most MAX_LAYER_FIELDS."""
    f = layer.wire
    buf = memoryview(doc.source.buf)
    fields = []
    for g in wire.iter_fields(buf, f.start, f.end, path=doc.path):
        if len(fields) == MAX_LAYER_FIELDS:
            raise FormatError(f"layer {layer.name!r} holds more than {MAX_LAYER_FIELDS} fields",
                              path=doc.path, offset=g.offset)
        fields.append(g)
    return fields


def definition_layers(doc: Document) -> tuple[list, list]:
    """(names, LayerParameter messages) of a definition's layers, in order, named as the model names layers.

    Names are told apart as a net's layers are (unique_names: a repeated
    name gets "#2").
    """
    from ..formats.caffe.netdef import definition

    messages = [layer.message for layer in definition(doc).layers]
    return unique_names([text(m.name) for m in messages]), messages


def _parse(message_type, buf, f, path, what: str):
    """A small message field's content parsed by protobuf; FormatError naming `what` where it is not such a message."""
    from google.protobuf.message import DecodeError

    try:
        return message_type.FromString(bytes(buf[f.start:f.end]))
    except DecodeError as e:
        raise FormatError(f"{what} (field {f.number}) is not a {message_type.DESCRIPTOR.name}: {e}", path=path,
                          offset=f.offset) from e


def _net_state(doc: Document):
    """The NetState a net's own definition holds (NetParameter.state; occurrences merged), or None."""
    if doc.parsed is not None:  # a text net
        return doc.parsed.state if doc.parsed.HasField("state") else None
    if doc.format != "caffe":
        return None
    from .._pb import blobtool_caffe_pb2 as pb  # protobuf loads only where a message's small fields are parsed

    number = pb.NetParameter.DESCRIPTOR.fields_by_name["state"].number
    buf = memoryview(doc.source.buf)
    state = None
    for f in wire.iter_fields(buf, 0, doc.size, path=doc.path):
        if f.number == number and f.wire_type == wire.LEN:
            part = _parse(pb.NetState, buf, f, doc.path, "the net's state")
            state = part if state is None else (state.MergeFrom(part) or state)
    return state


def _param_names(doc: Document, fields: list, number: int) -> set:
    """The names of a binary layer's ParamSpecs (its `param` field `number`, ParamSpec.name): bytes."""
    from .._pb import blobtool_caffe_pb2 as pb  # protobuf loads only where a message's small fields are parsed

    name = pb.ParamSpec.DESCRIPTOR.fields_by_name["name"].number
    buf = memoryview(doc.source.buf)
    names = set()
    for f in fields:
        if f.number == number and f.wire_type == wire.LEN:
            for g in wire.iter_fields(buf, f.start, f.end, path=doc.path):
                if g.number == name and g.wire_type == wire.LEN:
                    names.add(bytes(buf[g.start:g.end]))
    return names
