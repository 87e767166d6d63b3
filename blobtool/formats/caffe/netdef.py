"""A net's definition: each layer's full LayerParameter (blobs left out), as Caffe reads it.

A .caffemodel holds the whole net it was trained as, not only its blobs.
Files are opened through header messages (names, types, wiring, blobs:
containers.py); this module parses a net's full definition only when a
command asks for it (info --layers, a .prototxt output), with the schema of
proto/blobtool_caffe.proto (every BVLC layer parameter, and SSD's):

- V2 layers (NetParameter.layer, 100) are parsed as they are, their blobs
  skipped unparsed;
- V1 layers (NetParameter.layers, 2) are upgraded as Caffe's
  UpgradeV1LayerParameter does it: the enum type becomes today's type name,
  `param` names, `blob_share_mode`, `blobs_lr` and `weight_decay` become
  ParamSpecs (name, share_mode, lr_mult, decay_mult), every parameter
  message moves to the field of the same name; and before that, as Caffe's
  UpgradeNetDataTransformation, a Data, ImageData or WindowData layer's
  scale, mean_file, crop_size and mirror move to its transform_param;
- a V0 layer nested in a V1 one (Caffe's first format) keeps its name and
  type only: its parameters are not upgraded, and are reported as lost.

Net-level fields (name, input, input_shape, input_dim, force_backward,
state, debug_info) are kept as the file has them; Caffe's reader takes the
`input` fields as they are, so they are not turned into an Input layer.

Which layers a net holds in a given state (Caffe's Net::FilterNet and
Net::StateMeetsRule, net.cpp): a layer with no `include` rule is in the net
unless one of its `exclude` rules is met; a layer with `include` rules is
in it when one of them is met; a layer with both kinds is refused. A rule
is met when each thing it sets holds: its phase is the state's, the
state's level is at least min_level and at most max_level, the state has
every `stage` it names and none of its `not_stage`. A layer's own `phase`
field (LayerParameter.phase, 10, which a snapshot sets to TRAIN on every
layer) is no rule: it only says which phase the layer computes in. A net is
deployed in phase TEST at level 0 with the stages its own `state` names
(Caffe's Net(file, TEST) sets the phase and level and keeps the file's
stages): `deployment_state`.

What text cannot carry: protobuf's text format writes only fields the
schema knows. Fields of other forks (unknown numbers), a fork's field where
BVLC has another type under the same number (NVIDIA Caffe's varints 145-148
on every layer, where BVLC has messages), and enum values the schema does
not list are found by walking the bytes against the schema (`lost`), so a
writer can name them rather than drop them in silence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import wire
from .containers import (LAYER_FIELD_NAMES, NET_FIELD_NAMES, V0_FIELD_NAMES, V0_TYPE_NAMES, V1_FIELD_NAMES,
                         V1_TYPE_NAMES, split_message, text)
from .blobproto import parse_errors
from .schema import fork_fields, renumbered
from ...errors import FormatError, UsageError

__all__ = ["LayerDef", "NetDefinition", "definition", "upgrade_v1", "lost_fields", "MAX_DEFINITION_FIELDS", "V0_LOST",
           "TRAIN", "TEST", "deployment_state", "state_meets_rule", "state_excludes", "rule_text"]


# A layer's definition as Caffe writes it holds tens of fields; one holding
# more than this is damaged or forged, and is refused rather than walked.
MAX_DEFINITION_FIELDS = 1 << 16

# What a V0 layer nested in a V1 one loses: its parameters, which blobtool does not upgrade.
V0_LOST = "layer (a V0 layer's parameters, not upgraded)"

# Caffe's Phase enum (caffe.proto).
TRAIN, TEST = 0, 1


@dataclass
class LayerDef:
    """One layer's definition: its V2 LayerParameter without blobs, and the fields text cannot carry.

    `lost` holds field paths: a known field by name, an unknown one by number
    ("145", "convolution_param.19"); `format` is "V2", "V1" or "V0";
    `unparsed` the bytes of the fields kept unparsed (schema.FORK_PARAMS: a
    fork's parameter number in a layer of another type), tags included.
    """

    message: object
    lost: tuple = ()
    format: str = "V2"
    unparsed: bytes = b""   # fields kept as the file has them, not parsed (a fork's number in another type)


@dataclass
class NetDefinition:
    """A net's definition: its NetParameter (layers in V2 form, no blobs) and what text cannot carry."""

    net: object                      # NetParameter: net-level fields and `layer`
    layers: list = field(default_factory=list)   # LayerDef per layer, file order (as doc.layers)
    lost: tuple = ()                 # net-level fields text cannot carry
    upgraded: bool = False           # V1 layers were upgraded
    from_text: bool = False          # read from text: what is lost is what the schema does not know

    def escaped_lines(self, path: str) -> list:
        """One line per layer holding text fields that are not UTF-8 (a damaged or foreign name).

        Such bytes are written as escapes (\\xNN), which
        Caffe's reader takes back as the same bytes; Python's text reader
        (blobtool's) refuses them.
        """
        lines = []
        found = [name for name in _byte_strings(self.net) if not name.startswith("layer.")]
        if found:
            lines.append(f"{path}: the net's {', '.join(found)} not UTF-8 text, written as escapes (Caffe "
                         "reads them; blobtool's text reader does not)")
        for layer in self.layers:
            found = _byte_strings(layer.message)
            if found:
                lines.append(f"{path}: layer {text(layer.message.name) or '(unnamed)'}: {', '.join(found)} not "
                             "UTF-8 text, written as escapes (Caffe reads them; blobtool's text reader does not)")
        return lines

    def lost_lines(self, path: str) -> list:
        """One line per set of lost fields, naming every layer that holds it (a net of many fork layers: all)."""
        lines = []
        if self.lost:
            lines.append(f"{path}: the net holds fields text cannot carry: {', '.join(self.lost)}")
        groups: dict = {}
        for layer in self.layers:
            if layer.lost:
                groups.setdefault(layer.lost, []).append(text(layer.message.name) or "(unnamed)")
        what = "fields blobtool's schema does not know" if self.from_text else "fields text cannot carry"
        for lost, names in groups.items():
            shown = ", ".join(names)
            which = f"layer {shown}" if len(names) == 1 else f"{len(names)} layers ({shown})"
            lines.append(f"{path}: {which} hold{'s' * (len(names) == 1)} {what}: {', '.join(lost)}")
        return lines


def definition(doc) -> NetDefinition:
    """The definition of a net document (a Caffe protobuf net or a .prototxt), parsed once and kept.

    UsageError for a document that holds no definition (not a net, or
    Caffe's HDF5 snapshot, which holds blobs only).
    """
    cached = getattr(doc, "definition", None)
    if cached is not None:
        return cached
    if doc.kind != "net":
        raise UsageError(f"a {doc.kind} holds no net definition (layers, their parameters and wiring)",
                         path=doc.path)
    if doc.format != "caffe":
        raise UsageError("Caffe's HDF5 snapshot holds blobs only, no layer types, parameters or wiring; "
                         "the net's .prototxt or .caffemodel holds them", path=doc.path)
    doc.definition = _from_bytes(doc)
    return doc.definition


def _from_bytes(doc) -> NetDefinition:
    from ..._pb import blobtool_caffe_pb2 as pb  # protobuf loads only where a message's small fields are parsed

    buf = memoryview(doc.source.buf)
    net, _ = split_message(buf, 0, doc.size, doc.path, NET_FIELD_NAMES, {2, 100}, pb.NetParameter)
    result = NetDefinition(net, lost=tuple(lost_fields(buf, 0, doc.size, pb.NetParameter.DESCRIPTOR,
                                                       skip={2, 100}, path=doc.path)))
    v1 = bool(doc.layers) and doc.layers[0].wire.number == 2
    for layer in doc.layers:
        f = layer.wire
        if f.number == 100:
            # A fork's parameter field in a layer of another type is another fork's message under the
            # same number: located and kept as bytes, never parsed as the message the schema names.
            foreign = fork_fields(layer.type)
            moved = renumbered(layer.type)
            message, held = split_message(buf, f.start, f.end, doc.path, LAYER_FIELD_NAMES,
                                          {7} | foreign | set(moved), pb.LayerParameter)
            _read_renumbered(message, held, moved, buf, doc.path)
            lost = lost_fields(buf, f.start, f.end, pb.LayerParameter.DESCRIPTOR, skip={7} | set(moved),
                               path=doc.path, unknown=foreign)
            unparsed = b"".join(bytes(buf[g.offset:g.end]) for g in held if g.number in foreign)
            result.layers.append(LayerDef(message, tuple(lost), "V2", unparsed))
        else:
            old, kept = split_message(buf, f.start, f.end, doc.path, V1_FIELD_NAMES, {1, 6}, pb.V1LayerParameter)
            lost = lost_fields(buf, f.start, f.end, pb.V1LayerParameter.DESCRIPTOR, skip={1, 6}, path=doc.path)
            v0 = None
            for g in (g for g in kept if g.number == 1):
                header, _ = split_message(buf, g.start, g.end, doc.path, V0_FIELD_NAMES, {50}, pb.V0LayerHeader)
                v0 = (header.name, header.type)
            message = upgrade_v1(old, v0)
            if v0 is not None:
                lost.append(V0_LOST)
            result.layers.append(LayerDef(message, tuple(lost), "V0" if v0 else "V1"))
    result.upgraded = v1 or any(layer.format != "V2" for layer in result.layers)
    for layer in result.layers:
        result.net.layer.append(layer.message)
    del result.net.layers[:]
    return result


def _read_renumbered(message, held: list, moved: dict, buf, path) -> None:
    """Merge each field a fork stores under another number (schema.RENUMBERED) into the field it stands for."""
    for g in held:
        if g.number not in moved:
            continue
        target = getattr(message, moved[g.number])
        try:
            target.MergeFromString(bytes(buf[g.start:g.end]))
        except parse_errors() as exc:
            raise FormatError(f"layer {message.name!r}: field {g.number} is no {type(target).__name__} ({exc})",
                              path=path, offset=g.offset) from exc


def from_message(net, path: str, unknown: dict | None = None) -> NetDefinition:
    """The definition of a parsed NetParameter (a .prototxt): V1 layers upgraded, blobs dropped.

    `unknown` names the fields the text's layers held that the schema does
    not know (prototxt.py passed them over): {k: the k-th layer's (V2
    layers first, then V1)}; they are those layers' `lost`.
    """
    unknown = unknown or {}
    from ..._pb import blobtool_caffe_pb2 as pb  # protobuf loads only where a message's small fields are parsed

    out = pb.NetParameter()
    out.CopyFrom(net)
    del out.layer[:]
    del out.layers[:]
    result = NetDefinition(out, from_text=True)
    for k, layer in enumerate(net.layer):
        message = pb.LayerParameter()
        message.CopyFrom(layer)
        del message.blobs[:]
        result.layers.append(LayerDef(message, tuple(unknown.get(k, ()))))
    for k, old in enumerate(net.layers, len(net.layer)):
        v0 = (old.layer.name, old.layer.type) if old.HasField("layer") else None
        message = upgrade_v1(old, v0)
        lost = tuple(unknown.get(k, ())) + ((V0_LOST,) if v0 else ())
        result.layers.append(LayerDef(message, lost, "V1" if v0 is None else "V0"))
        result.upgraded = True
    for layer in result.layers:
        result.net.layer.append(layer.message)
    return result


# V1 layer types whose data parameter's transformation fields Caffe moves
# to transform_param (UpgradeNetDataTransformation), and that message's name.
_DATA_TRANSFORM = {5: "data_param", 12: "image_data_param", 24: "window_data_param"}
_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")


def upgrade_v1(old, v0: tuple | None = None):
    """The LayerParameter Caffe's upgrade makes of a V1LayerParameter (blobs left out).

    `v0` is (name, type) of the V0 layer nested in it, if any: they stand in
    for a V1 name or type the layer lacks; its other parameters are not
    upgraded.
    """
    from ..._pb import blobtool_caffe_pb2 as pb  # protobuf loads only where a message's small fields are parsed

    v1 = pb.V1LayerParameter()
    v1.CopyFrom(old)
    v1.ClearField("layer")
    v1.ClearField("blobs")
    holder = _DATA_TRANSFORM.get(v1.type) if v1.HasField("type") else None
    if holder is not None and v1.HasField(holder):
        source = getattr(v1, holder)
        for name in _TRANSFORM_FIELDS:
            if source.HasField(name):
                setattr(v1.transform_param, name, getattr(source, name))
                source.ClearField(name)

    layer = pb.LayerParameter()
    if v1.HasField("name"):
        layer.name = _str(v1.name)
    if v1.HasField("type"):
        layer.type = V1_TYPE_NAMES.get(v1.type, "")
    layer.bottom.extend(map(_str, v1.bottom))
    layer.top.extend(map(_str, v1.top))
    layer.loss_weight.extend(v1.loss_weight)
    layer.include.extend(v1.include)
    layer.exclude.extend(v1.exclude)

    def spec(i):
        while len(layer.param) <= i:
            layer.param.add()
        return layer.param[i]

    for i, name in enumerate(v1.param):
        spec(i).name = _str(name)
    for i, mode in enumerate(v1.blob_share_mode):
        spec(i).share_mode = mode  # the two DimCheckMode enums number STRICT and PERMISSIVE alike
    for i, value in enumerate(v1.blobs_lr):
        spec(i).lr_mult = value
    for i, value in enumerate(v1.weight_decay):
        spec(i).decay_mult = value
    for descriptor, value in v1.ListFields():
        if descriptor.message_type is not None and descriptor.name.endswith("_param") and not _repeated(descriptor):
            getattr(layer, descriptor.name).CopyFrom(value)
    if v0 is not None:
        name, type_ = map(_str, v0)
        if not layer.name and name:
            layer.name = name
        if not layer.type and type_:
            layer.type = V0_TYPE_NAMES.get(type_, type_)
    return layer


def _str(value) -> str:
    """A string field's value for another message: protobuf takes no bytes that are not UTF-8, so those are escaped."""
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def lost_fields(buf, start: int, end: int, descriptor, *, skip=frozenset(), path=None, prefix: str = "",
                unknown=frozenset()) -> list:
    """The fields of the message in buf[start:end] that protobuf's text format cannot write (see the module doc).

    Fields numbered in `skip` (blobs) are passed over unparsed; those
    numbered in `unknown` (a fork's number in a layer of another type) count
    as fields the schema does not know. At most MAX_DEFINITION_FIELDS fields
    are walked (FormatError past that).
    """
    lost: list = []
    budget = [MAX_DEFINITION_FIELDS]
    _walk(buf, start, end, descriptor, skip, path, prefix, lost, budget, unknown)
    return list(dict.fromkeys(lost))


def _repeated(fd) -> bool:
    # protobuf 5.28 added is_repeated and later runtimes dropped `label`; 3.20 has only `label`.
    flag = getattr(fd, "is_repeated", None)
    return flag if flag is not None else fd.label == fd.LABEL_REPEATED


# The wire type each protobuf field type is written with (repeated scalars may also come packed, as LEN).
def _wire_type(fd) -> int:
    if fd.type in (fd.TYPE_MESSAGE, fd.TYPE_STRING, fd.TYPE_BYTES):
        return wire.LEN
    if fd.type in (fd.TYPE_DOUBLE, fd.TYPE_FIXED64, fd.TYPE_SFIXED64):
        return wire.I64
    if fd.type in (fd.TYPE_FLOAT, fd.TYPE_FIXED32, fd.TYPE_SFIXED32):
        return wire.I32
    return wire.VARINT


def _walk(buf, start, end, descriptor, skip, path, prefix, lost, budget, unknown=frozenset()) -> None:
    by_number = descriptor.fields_by_number
    pos = start
    while pos < end:
        budget[0] -= 1
        if budget[0] < 0:
            raise FormatError(f"a layer's definition holds more than {MAX_DEFINITION_FIELDS} fields "
                              "(blobtool's limit)", path=path, offset=pos)
        f = wire.read_field(buf, pos, end, path=path)
        pos = f.end
        if f.number in skip:
            continue
        fd = by_number.get(f.number) if f.number not in unknown else None
        if fd is None:
            lost.append(f"{prefix}{f.number}")
            continue
        expected = _wire_type(fd)
        packed = _repeated(fd) and expected != wire.LEN and f.wire_type == wire.LEN
        if f.wire_type != expected and not packed:
            lost.append(f"{prefix}{f.number}")
        elif fd.type == fd.TYPE_MESSAGE:
            try:
                _walk(buf, f.start, f.end, fd.message_type, frozenset(), path, f"{prefix}{fd.name}.", lost, budget)
            except FormatError:
                if budget[0] < 0:
                    raise
                lost.append(f"{prefix}{fd.name}")  # not a message: protobuf refuses it when parsing
        elif fd.type == fd.TYPE_ENUM and not packed and fd.enum_type.values_by_number.get(f.value) is None:
            lost.append(f"{prefix}{fd.name}={f.value}")


def _byte_strings(message, prefix: str = "") -> list:
    """The string fields of `message` (nested too) that protobuf hands over as bytes: not UTF-8."""
    found = []
    for fd, value in message.ListFields():
        values = value if _repeated(fd) else [value]
        if fd.type == fd.TYPE_STRING and any(isinstance(v, bytes) for v in values):
            found.append(prefix + fd.name)
        elif fd.type == fd.TYPE_MESSAGE:
            for v in values:
                found += _byte_strings(v, f"{prefix}{fd.name}.")
    return list(dict.fromkeys(found))


# -- which layers a net holds in a state (module docstring) -------------------------------------

def deployment_state(state=None, phase: int = TEST):
    """The NetState a net is deployed in: phase TEST (or `phase`), level 0, and the stages of `state` (the net's own).

    Mirrors Caffe's Net(param_file, TEST): the phase and the level are set,
    the stages the file's `state` names are kept.
    """
    from ..._pb import blobtool_caffe_pb2 as pb  # protobuf loads only where a message's small fields are parsed

    out = pb.NetState(phase=phase, level=0)
    if state is not None:
        out.stage.extend(state.stage)
    return out


def state_meets_rule(state, rule) -> bool:
    """Whether a NetState meets a NetStateRule. Mirrors Net::StateMeetsRule.

    Only what the rule sets is checked: its phase, min_level and max_level
    (the state's level within them), every `stage` it names present in the
    state and no `not_stage` it names.
    """
    if rule.HasField("phase") and rule.phase != state.phase:
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        return False
    stages = set(state.stage)
    if any(stage not in stages for stage in rule.stage):
        return False
    return not any(stage in stages for stage in rule.not_stage)


def state_excludes(state, include=(), exclude=(), *, layer: str = "", path=None) -> str | None:
    """None when a layer with these rules is in the net of `state`, else the rules that leave it out, as text.

    Mirrors Net::FilterNet for one layer: without `include` rules the layer
    is in unless an `exclude` rule is met; with them, it is in when one is
    met. A layer with both kinds is refused as Caffe refuses it (FormatError
    naming `layer`).
    """
    include, exclude = list(include), list(exclude)
    if include and exclude:
        raise FormatError(f"layer {layer!r} has both include and exclude rules; Caffe's net refuses a layer "
                          "with both", path=path)
    if include:
        if any(state_meets_rule(state, rule) for rule in include):
            return None
        return ", ".join(rule_text("include", rule) for rule in include)
    met = [rule for rule in exclude if state_meets_rule(state, rule)]
    return rule_text("exclude", met[0]) if met else None


def rule_text(kind: str, rule) -> str:
    """A rule as a .prototxt writes it on one line: 'include { phase: TRAIN }'."""
    from google.protobuf import text_format  # protobuf loads only where a message's small fields are parsed

    body = text_format.MessageToString(rule, as_one_line=True, as_utf8=True)
    return f"{kind} {{ {body} }}" if body else f"{kind} {{ }}"
