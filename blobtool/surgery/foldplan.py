"""Which BatchNorm layers of a net fold into the layer before them, and why the others cannot.

A BatchNorm folds, with the Scale after it, into the layer that wrote its
input when all of these hold (read from the net's bottoms and tops, each
blob name followed version by version, so in-place layers count right):

- its input comes from a Convolution, Deconvolution or InnerProduct with one
  top, and nothing else reads that output;
- its output is read by one Scale only (the pair folds), or by no Scale at
  all (it folds alone: gamma 1, beta 0);
- the BatchNorm holds Caffe's three blobs; the Scale reads one bottom,
  scales axis 1 (one axis) and holds one value per channel (gamma, and
  beta with bias_term);
- the layer computes as many output channels as the BatchNorm has, along
  axis 1 (convolution_param.axis, inner_product_param.axis), holds its
  weight and bias only, stored as floats, and shares them with no other
  layer (a ParamSpec name);
- its output can take the last folded layer's top: no layer between them
  reads or writes that name;
- the layer and the Scale hold the blobs their bias_term says (a weight,
  and a bias with bias_term; gamma, and beta with bias_term): Caffe loads
  no others into them.

The net folded for is the deployed one, Caffe's TEST net (phase TEST, level
0, the stages the net's own `state` names: netdef.deployment_state): a
layer its include/exclude rules leave out of it is no fold candidate and is
passed over in the walk of who reads what, so a TRAIN-only reader neither
blocks nor takes a fold; a BatchNorm or Scale outside it stays, with the
rule. A layer's own `phase` field, which a snapshot sets on every layer, is
no such rule.

Another definition of the same net (a deploy.prototxt) is the net that
will run: given one, the settings read above come from its layer of the
same name (batch_norm_param.eps; scale_param axis, num_axes, bias_term; the
folded layer's axis, bias_term, transpose, group), and a BatchNorm it sets
`use_global_stats: false` for stays (it normalizes with each batch's
statistics, which no weight holds). Where the definition's value differs
from the net's own and the fold is made with it, `FoldPlan.notes` says so,
one line per setting naming the layers; where the definition's value
leaves no fold, the BatchNorm stays with it in the reason. The net's own
use_global_stats is not read: a snapshot's holds its training setting.

Everything else stays, with the reason. Field numbers are Caffe's:
NetParameter state = 6; LayerParameter bottom = 3, top = 4, param = 6
(ParamSpec name = 1), blobs = 7, include = 8, exclude = 9,
convolution_param = 106 (bias_term = 2, group = 5, axis = 16),
inner_product_param = 117 (bias_term = 2, axis = 5, transpose = 6),
batch_norm_param = 139 (use_global_stats = 1, eps = 3, a float),
scale_param = 142 (axis = 1, num_axes = 2, bias_term = 4).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from ..errors import FormatError, UsageError
from ..formats import Document, Entry, NetLayer, unique_names
from ..formats.caffe import layer_links, wire
from ..formats.naming import layer_type
from .fold import DEFAULT_EPS, FOLDABLE, output_channels

__all__ = ["Fold", "Kept", "FoldPlan", "plan_folds", "check_foldable_net", "layer_fields", "blob_versions",
           "rename_why_not", "definition_layers", "outside_text", "PARAM_FIELD", "TOP", "BLOBS", "BIAS_TERM"]

# LayerParameter fields.
TOP, PARAM, BLOBS, _INCLUDE, _EXCLUDE = 4, 6, 7, 8, 9
# NetParameter.state.
_NET_STATE = 6
# Each foldable type's parameter message (field in LayerParameter), and their bias_term (field 2).
PARAM_FIELD = {"Convolution": 106, "Deconvolution": 106, "InnerProduct": 117}
BIAS_TERM = 2
_BATCH_NORM_PARAM, _SCALE_PARAM = 139, 142
_CONV_GROUP, _CONV_AXIS, _IP_AXIS, _IP_TRANSPOSE = 5, 16, 5, 6
_USE_GLOBAL_STATS, _EPS = 1, 3
_SCALE_AXIS, _SCALE_NUM_AXES, _SCALE_BIAS_TERM = 1, 2, 4
# The parameter messages read, by their field name in LayerParameter (a definition's parsed layers).
_PARAM_NAMES = {106: "convolution_param", 117: "inner_product_param", 139: "batch_norm_param", 142: "scale_param"}

# A layer as Caffe writes it has a few dozen fields besides its blobs; one
# holding more is forged, and is refused rather than walked field by field.
MAX_LAYER_FIELDS = 1 << 16
# Layers named in one reason, at most.
_NAMED = 4


@dataclass
class Setting:
    """A setting a fold was made with as another definition states it, where the net's own differs."""

    name: str                       # the field, as a .prototxt names it: "batch_norm_param.eps"
    layer: str
    value: object                   # the definition's
    own: object                     # the net's


@dataclass
class Fold:
    """One BatchNorm (and its Scale) folded into `target`, which then writes `top`."""

    target: NetLayer
    kind: str                       # the target's type: one of fold.FOLDABLE
    batchnorm: NetLayer
    scale: NetLayer | None
    top: str
    top_bytes: bytes                # `top` as stored (names are shown cut and escaped; these are written)
    weight: Entry
    bias: Entry | None              # None: created by the fold
    stats: tuple                    # the BatchNorm's three blobs (Entry)
    gamma: Entry | None
    beta: Entry | None
    eps: float
    group: int = 1
    transpose: bool = False
    settings: tuple = ()            # Setting: what another definition states otherwise, and the fold used

    @property
    def removed(self) -> tuple:
        return (self.batchnorm.name,) + ((self.scale.name,) if self.scale is not None else ())


@dataclass
class Kept:
    """A BatchNorm that stays, and why."""

    batchnorm: str
    why: str


@dataclass
class KeptScale:
    """A Scale outside the TEST net, which stays whatever its BatchNorm does, and why."""

    scale: str
    why: str


@dataclass
class FoldPlan:
    folds: list = field(default_factory=list)
    kept: list = field(default_factory=list)
    kept_scales: list = field(default_factory=list)
    notes: list = field(default_factory=list)      # lines: settings another definition states otherwise

    @property
    def removed(self) -> set:
        return {name for f in self.folds for name in f.removed}


def layer_fields(doc: Document, layer: NetLayer) -> list:
    """The fields of one layer's message (wire.Field, offsets in the file), at most MAX_LAYER_FIELDS."""
    f = layer.field
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


def _parse(message_type, buf, f, path):
    """A small message field's content parsed by protobuf; FormatError where it is not such a message."""
    from google.protobuf.message import DecodeError

    try:
        return message_type.FromString(bytes(buf[f.start:f.end]))
    except DecodeError as e:
        raise FormatError(f"field {f.number} is not a {message_type.DESCRIPTOR.name}: {e}", path=path,
                          offset=f.offset) from e


def _net_state(doc: Document):
    """The NetState the net's own definition holds (NetParameter.state, 6; occurrences merged), or None."""
    from .._pb import blobtool_caffe_pb2 as pb  # protobuf loads only where a message's small fields are parsed

    buf = memoryview(doc.source.buf)
    state = None
    for f in wire.iter_fields(buf, 0, doc.size, path=doc.path):
        if f.number == _NET_STATE and f.wire_type == wire.LEN:
            part = _parse(pb.NetState, buf, f, doc.path)
            state = part if state is None else (state.MergeFrom(part) or state)
    return state


def _signed(value: int) -> int:
    """An int32 field's value as read from its varint (a negative one is a 10-byte varint)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >> 63 else value


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


def _some(names) -> str:
    names = list(names)
    shown = ", ".join(names[:_NAMED])
    return shown + (f" and {len(names) - _NAMED} more" if len(names) > _NAMED else "")


def check_foldable_net(doc: Document) -> None:
    """Refuse (UsageError) what is not a protobuf net of today's format, with its layer types."""
    if doc.kind != "net":
        raise UsageError(f"{doc.path}: fold rewrites a net (.caffemodel); this is a {doc.kind} file")
    if doc.format == "hdf5":
        raise UsageError(f"{doc.path}: fold needs the layer types, and Caffe's HDF5 snapshots hold none; fold the "
                         ".caffemodel of the same net")
    if doc.format != "caffe":
        raise UsageError(f"{doc.path}: a net definition without weights ({doc.format}): fold the .caffemodel, "
                         "and give -o NAME.prototxt for its folded definition")
    if any(layer.field.number != 100 for layer in doc.layers):
        raise UsageError(f"{doc.path}: a V1 net (NetParameter.layers, enum layer types): V1 has no BatchNorm type, "
                         "so nothing in it can fold, and fold writes no V1 net")


def blob_versions(links: list) -> tuple[list, dict]:
    """Each blob name followed version by version through layers given as (bottoms, tops), in order.

    Returns (per layer, the version each bottom reads: (writer's index, which
    of its tops), or None for a net input; {version: indices of the layers
    reading it}). An in-place layer reads one version and writes the next.
    """
    current: dict = {}
    inputs: list = []
    readers: dict = {}
    for i, (bottoms, tops) in enumerate(links):
        versions = [current.get(b) for b in bottoms]
        inputs.append(versions)
        for v in dict.fromkeys(v for v in versions if v is not None):
            readers.setdefault(v, []).append(i)
        for k, top in enumerate(tops):
            current[top] = (i, k)
    return inputs, readers


def definition_layers(doc: Document) -> tuple[list, list]:
    """(names, LayerParameter messages) of a definition's layers, in order, named as the plan names layers.

    Names are told apart as a net's layers are (unique_names: a repeated
    name gets "#2").
    """
    from ..formats.caffe.containers import text
    from ..formats.caffe.netdef import definition

    messages = [layer.message for layer in definition(doc).layers]
    return unique_names([text(m.name) for m in messages]), messages


def outside_text(why: str) -> str:
    """Why a layer its rules leave out of the TEST net is not folded (`why`: the rules, netdef.state_excludes)."""
    return f"it is not in the TEST net (the one deployed), by its {why}"


class _Net:
    """A net's layers with their links in its TEST net, each blob version's writer and readers, and their settings.

    A layer outside the TEST net keeps no links here (it reads and writes
    nothing), and is in `outside` with the rules that leave it out.
    `definition`: the settings of layers it has by name come from it.
    """

    def __init__(self, doc: Document, definition: Document | None = None):
        from ..formats.caffe.netdef import deployment_state, state_excludes

        self.doc = doc
        self.layers = doc.layers
        self.types = [layer_type(layer.type) for layer in doc.layers]
        self._fields: dict = {}
        self._names = None
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
                rules[f.number - _INCLUDE].append(_parse(pb.NetStateRule, buf, f, self.doc.path))
        return rules

    def defined(self, i: int):
        """Layer i's LayerParameter in the definition given, or None (none given, or it has no layer of that name)."""
        return self._defined.get(self.name(i))

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
        return _message_values(getattr(message, _PARAM_NAMES[number]))

    def fields(self, i: int) -> list:
        if i not in self._fields:
            self._fields[i] = layer_fields(self.doc, self.layers[i])
        return self._fields[i]

    def param(self, i: int, number: int) -> dict:
        return _param(self.doc, self.fields(i), number)

    def sharing(self, i: int) -> list:
        """(layer, name) for each other layer holding a ParamSpec of the same name as one of layer i's."""
        own = _param_names(self.doc, self.fields(i))
        if not own:
            return []
        if self._names is None:
            self._names = [_param_names(self.doc, self.fields(j)) for j in range(len(self.layers))]
        return [(self.layers[j].name, name.decode("utf-8", "backslashreplace"))
                for j, names in enumerate(self._names) if j != i for name in sorted(own & names)]

    def top_bytes(self, i: int) -> bytes:
        """Layer i's first top as stored."""
        buf = memoryview(self.doc.source.buf)
        f = next(f for f in self.fields(i) if f.number == TOP and f.wire_type == wire.LEN)
        return bytes(buf[f.start:f.end])

    def name(self, i: int) -> str:
        return self.layers[i].name


def plan_folds(doc: Document, definition: Document | None = None) -> FoldPlan:
    """The folds of a net's BatchNorm layers, in file order, and those that stay with why (module docstring).

    `definition`: another definition of the same net (a deploy.prototxt),
    whose settings the folds are made with (module docstring); its wiring
    is checked where it is folded (folddef.py).
    """
    check_foldable_net(doc)
    net = _Net(doc, definition)
    plan = FoldPlan()
    for i, kind in enumerate(net.types):
        if kind == "Scale" and i in net.outside:
            plan.kept_scales.append(KeptScale(net.name(i), outside_text(net.outside[i])))
        if kind != "BatchNorm":
            continue
        result = outside_text(net.outside[i]) if i in net.outside else _fold_of(net, i)
        if isinstance(result, str):
            plan.kept.append(Kept(net.name(i), result))
        else:
            plan.folds.append(result)
    if definition is not None:
        plan.notes = _setting_lines(definition.path, doc.path, [s for f in plan.folds for s in f.settings])
    return plan


# Layers named in one line of settings, at most.
_NAMED_SETTINGS = 8


def _setting_lines(path: str, net_path: str, settings: list) -> list:
    """One line per setting another definition states otherwise, naming the layers folded with its value."""
    groups: dict = {}
    for s in settings:
        groups.setdefault(s.name, []).append(s)
    lines = []
    for name, found in groups.items():
        shown = ", ".join(f"{s.layer} {_value_text(s.value)} (not {_value_text(s.own)})"
                          for s in found[:_NAMED_SETTINGS])
        more = f" and {len(found) - _NAMED_SETTINGS} more" if len(found) > _NAMED_SETTINGS else ""
        lines.append(f"{path}: folded with this definition's {name}, not {net_path}'s: {shown}{more}")
    return lines


def _value_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.7g}"
    return str(value)


def _fold_of(net: _Net, i: int):
    """The Fold of BatchNorm layer i, or why it cannot fold (a str)."""
    bottoms, tops = net.links[i]
    if len(bottoms) != 1 or len(tops) != 1:
        return f"it has {len(bottoms)} bottoms and {len(tops)} tops; Caffe's BatchNorm has one of each"
    source = net.inputs[i][0]
    if source is None:
        return (f"its input {bottoms[0]!r} is a net input, not the output of a Convolution, Deconvolution or "
                "InnerProduct")
    p = source[0]
    target, kind = net.name(p), net.types[p]
    if kind not in FOLDABLE:
        return (f"its input {bottoms[0]!r} comes from {target} ({kind or 'no type'}), not a Convolution, "
                "Deconvolution or InnerProduct")
    others = [net.name(r) for r in net.readers[source] if r != i]
    if others:
        return f"its input {bottoms[0]!r} (from {target}) also feeds {_some(others)}"
    why = _target_why_not(net, p, target, kind)
    if why:
        return why
    batchnorm = net.settings(i, _BATCH_NORM_PARAM)
    if net.defined(i) is not None and batchnorm.get(_USE_GLOBAL_STATS, 1) == 0:
        return (f"{net.definition.path} sets use_global_stats: false for it: there it normalizes with each "
                "batch's own mean and variance, which no folded weight holds")
    stats = net.blobs.get(net.name(i), [])
    if len(stats) != 3:
        if len(stats) == 5:
            return "it holds its own scale and bias (NVIDIA Caffe's BatchNorm, 5 blobs)"
        return f"it holds {len(stats)} blobs; Caffe's BatchNorm holds 3 (the mean and variance sums, the factor)"
    channels = stats[0].count
    if stats[1].count != channels or stats[2].count != 1:
        return (f"its blobs hold {', '.join(str(e.count) for e in stats)} values; Caffe's BatchNorm holds the "
                "same count twice, then one factor")
    conv = net.settings(p, PARAM_FIELD[kind])
    where = net.where(p)
    group, transpose = 1, False
    if kind == "InnerProduct":
        axis, transpose = _signed(conv.get(_IP_AXIS, 1)), bool(conv.get(_IP_TRANSPOSE, 0))
    else:
        axis, group = _signed(conv.get(_CONV_AXIS, 1)), conv.get(_CONV_GROUP, 1)
    if axis != 1:
        return f"{target} computes its channels on axis {axis}{where}; BatchNorm normalizes axis 1"
    layer_blobs = net.blobs[target]
    weight = layer_blobs[0]
    bias = layer_blobs[1] if len(layer_blobs) > 1 else None
    bias_term = bool(conv.get(BIAS_TERM, 1))
    if bias_term != (bias is not None):
        return (f"{target} has bias_term: {_value_text(bias_term)}{where} and holds {len(layer_blobs)} blobs: "
                "Caffe loads no such weights into it")
    computed = output_channels(kind, weight.shape, group=group, transpose=transpose)
    if computed != channels:
        what = "a shape that is no weight of its type" if computed is None else f"{computed} channels"
        how = f"transpose {_value_text(transpose)}" if kind == "InnerProduct" else f"group {group}"
        return f"{target}'s weight {weight.shape} ({how}{where}) computes {what}; it has {channels}"
    if bias is not None and bias.count != channels:
        return f"{target}'s bias holds {bias.count} values; it has {channels} channels"
    scale = _scale_of(net, i, channels)
    if isinstance(scale, str):
        return scale
    last = scale if scale is not None else i
    top = net.links[last][1][0]
    why = rename_why_not(net.links, [layer.name for layer in net.layers], p, last, i, top)
    if why:
        return why
    gamma = beta = None
    if scale is not None:
        held = net.blobs[net.name(scale)]
        gamma, beta = held[0], (held[1] if len(held) > 1 else None)
    eps = batchnorm.get(_EPS, DEFAULT_EPS)
    return Fold(net.layers[p], kind, net.layers[i], net.layers[scale] if scale is not None else None, top,
                net.top_bytes(last), weight, bias, tuple(stats), gamma, beta, float(eps), group, transpose,
                tuple(_settings_used(net, p, kind, i, scale)))


def _settings_used(net: _Net, p: int, kind: str, i: int, scale: int | None) -> list:
    """A Setting for each value the fold read from the definition given that the net's own states otherwise."""
    param = PARAM_FIELD[kind]
    name = _PARAM_NAMES[param]
    read = [(i, _BATCH_NORM_PARAM, _EPS, DEFAULT_EPS, "batch_norm_param.eps"),
            (p, param, BIAS_TERM, 1, f"{name}.bias_term")]
    if kind == "InnerProduct":
        read += [(p, param, _IP_AXIS, 1, f"{name}.axis"), (p, param, _IP_TRANSPOSE, 0, f"{name}.transpose")]
    else:
        read.append((p, param, _CONV_AXIS, 1, f"{name}.axis"))
        if kind == "Deconvolution":
            read.append((p, param, _CONV_GROUP, 1, f"{name}.group"))
    if scale is not None:
        read += [(scale, _SCALE_PARAM, _SCALE_AXIS, 1, "scale_param.axis"),
                 (scale, _SCALE_PARAM, _SCALE_NUM_AXES, 1, "scale_param.num_axes"),
                 (scale, _SCALE_PARAM, _SCALE_BIAS_TERM, 0, "scale_param.bias_term")]
    found = []
    for j, number, field_number, default, label in read:
        if net.defined(j) is None:
            continue
        value = net.settings(j, number).get(field_number, default)
        own = net.param(j, number).get(field_number, default)
        value, own = (_signed(v) if isinstance(v, int) else v for v in (value, own))
        if value != own:
            if label.endswith((".bias_term", ".transpose")):
                value, own = bool(value), bool(own)
            found.append(Setting(label, net.name(j), value, own))
    return found


def _target_why_not(net: _Net, p: int, target: str, kind: str) -> str | None:
    """Why the layer a BatchNorm reads cannot take it in (tops, blobs, their type, shared weights), or None."""
    tops = net.links[p][1]
    if len(tops) != 1:
        return f"{target} has {len(tops)} tops (bottom and top pairs that share its weights)"
    held = net.blobs.get(target, [])
    if not held:
        return f"{target} holds no weights"
    if len(held) > 2:
        return f"{target} holds {len(held)} blobs; a {kind} holds a weight and a bias"
    integers = [e.name for e in held if e.dtype.kind in "iu"]
    if integers:
        return f"{target}'s blobs are stored as integers ({_some(integers)}), and folding makes fractions"
    shared = net.sharing(p)
    if shared:
        return f"{target} shares its weights with {_some(f'{layer} (param {name!r})' for layer, name in shared)}"
    return None


def _scale_of(net: _Net, i: int, channels: int):
    """The index of the Scale that folds with BatchNorm i, None when it folds alone, or why it cannot fold (a str)."""
    readers = net.readers.get((i, 0), [])
    scales = [r for r in readers if net.types[r] == "Scale"]
    if not scales:
        return None
    s = scales[0]
    name = net.name(s)
    others = [net.name(r) for r in readers if r != s]
    if others:
        return f"its output feeds {_some(others)} besides the Scale {name}"
    bottoms, tops = net.links[s]
    if len(bottoms) != 1:
        return f"the Scale after it, {name}, takes its scale from a second bottom, not from its blobs"
    if len(tops) != 1:
        return f"the Scale after it, {name}, has {len(tops)} tops"
    held = net.blobs.get(name, [])
    if len(held) not in (1, 2):
        return f"the Scale after it, {name}, holds {len(held)} blobs; gamma (and beta) expected"
    settings = net.settings(s, _SCALE_PARAM)
    where = net.where(s)
    bias_term = bool(settings.get(_SCALE_BIAS_TERM, 0))
    if bias_term != (len(held) == 2):
        return (f"the Scale after it, {name}, has bias_term: {_value_text(bias_term)}{where} and holds "
                f"{len(held)} blobs: Caffe loads no such weights into it")
    if any(e.count != channels for e in held):
        return (f"the Scale after it, {name}, holds {', '.join(str(e.count) for e in held)} values; "
                f"{channels} channels expected")
    if any(e.dtype.kind in "iu" for e in held):
        return f"the Scale after it, {name}, holds its values as integers"
    axis, num_axes = _signed(settings.get(_SCALE_AXIS, 1)), _signed(settings.get(_SCALE_NUM_AXES, 1))
    if axis != 1 or num_axes != 1:
        return (f"the Scale after it, {name}, has axis {axis} and num_axes {num_axes}{where}: not one value per "
                "channel")
    return s


def rename_why_not(links: list, names: list, p: int, last: int, i: int, top: str) -> str | None:
    """Why layer p cannot write `top` in place of the layers it takes in (BatchNorm i, up to layer `last`), or None.

    `links` holds each layer's (bottoms, tops), `names` their names.
    """
    if top == links[p][1][0]:
        return None
    if top in links[p][0]:
        return f"{names[p]} reads {top!r}, the name its folded output would take"
    for j in range(p + 1, last):
        if j != i and (top in links[j][0] or top in links[j][1]):
            return (f"{names[j]}, between {names[p]} and {names[last]}, uses {top!r}, the name the folded "
                    "output would take")
    return None
