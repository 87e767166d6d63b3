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

The net folded for is the deployed one, Caffe's TEST net (the TEST view of net/model.py):
layers its include/exclude rules leave out of it are passed over in the
walk of who reads what, and a BatchNorm or Scale outside it stays, with the
rules (a Scale in `kept_scales`).

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

The types a BatchNorm folds into, their parameter message and where their
output channels lie are their rows in net/layertypes.py; the settings'
field numbers come from Caffe's schema (formats/caffe/schema.py).
Everything else stays, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UsageError
from ..formats import Document, Entry, NetLayer
from ..net.batchnorm import CAFFE_BLOBS, NVCAFFE_BLOBS
from ..net.layertypes import TYPES, foldable, output_channels, param_of
from ..net.graph import NOT_PER_CHANNEL, OTHER_COUNT, OTHER_READERS, SECOND_BOTTOM, scale_merge
from ..net.model import View, definition_layers, layer_fields, model

__all__ = ["Fold", "Kept", "KeptScale", "Setting", "FoldPlan", "plan_folds", "check_foldable_net", "layer_fields",
           "rename_why_not", "definition_layers", "outside_text"]

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
    kind: str                       # the target's type: one a BatchNorm folds into (net/layertypes.py)
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
    if any(layer.wire.number != 100 for layer in doc.layers):
        raise UsageError(f"{doc.path}: a V1 net (NetParameter.layers, enum layer types): V1 has no BatchNorm type, "
                         "so nothing in it can fold, and fold writes no V1 net")


def outside_text(why: str) -> str:
    """Why a layer its rules leave out of the TEST net is not folded (`why`: the rules, netdef.state_excludes)."""
    return f"it is not in the TEST net (the one deployed), by its {why}"


def plan_folds(doc: Document, definition: Document | None = None) -> FoldPlan:
    """The folds of a net's BatchNorm layers, in file order, and those that stay with why (module docstring).

    `definition`: another definition of the same net (a deploy.prototxt),
    whose settings the folds are made with (module docstring); its wiring
    is checked where it is folded (folddef.py).
    """
    check_foldable_net(doc)
    net = model(doc, definition).test
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
        plan.notes += _train_phase_lines(net, definition.path, plan.folds)
    return plan


def _train_phase_lines(net: View, path: str, folds: list) -> list:
    """A line naming the folded BatchNorm layers a definition gives `phase: TRAIN` of their own (and no use_global_stats).

    Caffe's BatchNorm takes use_global_stats from its own phase when unset:
    such a layer normalizes by each batch's statistics, even in a TEST net.
    Folding replaces it with what the TEST phase computes, which is said.
    """
    from ..formats.caffe.netdef import TRAIN

    names = []
    for f in folds:
        message = net.defined_layer(f.batchnorm.name)
        if message is not None and message.HasField("phase") and message.phase == TRAIN \
                and not message.batch_norm_param.HasField("use_global_stats"):
            names.append(f.batchnorm.name)
    if not names:
        return []
    shown = ", ".join(names[:_NAMED_SETTINGS])
    more = f" and {len(names) - _NAMED_SETTINGS} more" if len(names) > _NAMED_SETTINGS else ""
    return [f"{path}: BatchNorm {shown}{more} set phase: TRAIN of their own, with which Caffe normalizes by each "
            "batch's statistics; folded with the stored ones, as the TEST phase computes"]


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


def _foldable_types() -> str:
    """The types a BatchNorm folds into, as text ("Convolution, Deconvolution or InnerProduct")."""
    names = [t.name for t in TYPES.values() if t.folds is not None]
    return " or ".join(filter(None, [", ".join(names[:-1]), names[-1]]))


def _fold_of(net: View, i: int):
    """The Fold of BatchNorm layer i, or why it cannot fold (a str)."""
    bottoms, tops = net.links[i]
    if len(bottoms) != 1 or len(tops) != 1:
        return f"it has {len(bottoms)} bottoms and {len(tops)} tops; Caffe's BatchNorm has one of each"
    source = net.inputs[i][0]
    if source is None:
        return f"its input {bottoms[0]!r} is a net input, not the output of a {_foldable_types()}"
    p = source[0]
    target, kind = net.name(p), net.types[p]
    if foldable(kind) is None:
        return f"its input {bottoms[0]!r} comes from {target} ({kind or 'no type'}), not a {_foldable_types()}"
    others = [net.name(r) for r in net.readers[source] if r != i]
    if others:
        return f"its input {bottoms[0]!r} (from {target}) also feeds {_some(others)}"
    why = _target_why_not(net, p, target, kind)
    if why:
        return why
    if net.defined(i) is not None and not net.setting(i, "batch_norm_param", "use_global_stats", unset=True):
        return (f"{net.definition.path} sets use_global_stats: false for it: there it normalizes with each "
                "batch's own mean and variance, which no folded weight holds")
    stats = net.blobs.get(net.name(i), [])
    if len(stats) != CAFFE_BLOBS:
        if len(stats) == NVCAFFE_BLOBS:
            return f"it holds its own scale and bias (NVIDIA Caffe's BatchNorm, {NVCAFFE_BLOBS} blobs)"
        return (f"it holds {len(stats)} blobs; Caffe's BatchNorm holds {CAFFE_BLOBS} (the mean and variance sums, "
                "the factor)")
    channels = stats[0].count
    if stats[1].count != channels or stats[2].count != 1:
        return (f"its blobs hold {', '.join(str(e.count) for e in stats)} values; Caffe's BatchNorm holds the "
                "same count twice, then one factor")
    param, how = param_of(kind), foldable(kind)
    where = net.where(p)
    axis = net.setting(p, param, how.axis)
    transpose = how.transpose and net.setting(p, param, "transpose")
    group = net.setting(p, param, "group") if how.group else 1
    if axis != 1:
        return f"{target} computes its channels on axis {axis}{where}; BatchNorm normalizes axis 1"
    layer_blobs = net.blobs[target]
    weight = layer_blobs[0]
    bias = layer_blobs[1] if len(layer_blobs) > 1 else None
    bias_term = net.setting(p, param, "bias_term")
    if bias_term != (bias is not None):
        return (f"{target} has bias_term: {_value_text(bias_term)}{where} and holds {len(layer_blobs)} blobs: "
                "Caffe loads no such weights into it")
    computed = output_channels(kind, weight.shape, group=group, transpose=transpose)
    if computed != channels:
        what = "a shape that is no weight of its type" if computed is None else f"{computed} channels"
        how = f"transpose {_value_text(transpose)}" if foldable(kind).transpose else f"group {group}"
        return f"{target}'s weight {weight.shape} ({how}{where}) computes {what}; it has {channels}"
    if bias is not None and bias.count != channels:
        return f"{target}'s bias holds {bias.count} values; it has {channels} channels"
    scale = _scale_of(net, i, channels)
    if isinstance(scale, str):
        return scale
    last = scale if scale is not None else i
    top = net.links[last][1][0]
    why = rename_why_not(net.links, net.names, p, last, i, top)
    if why:
        return why
    gamma = beta = None
    if scale is not None:
        held = net.blobs[net.name(scale)]
        gamma, beta = held[0], (held[1] if len(held) > 1 else None)
    eps = net.setting(i, "batch_norm_param", "eps")
    layers = net.layers
    return Fold(layers[p].stored, kind, layers[i].stored, layers[scale].stored if scale is not None else None, top,
                net.top_bytes(last), weight, bias, tuple(stats), gamma, beta, float(eps), group, transpose,
                tuple(_settings_used(net, p, kind, i, scale)))


def _settings_used(net: View, p: int, kind: str, i: int, scale: int | None) -> list:
    """A Setting for each value the fold read from the definition given that the net's own states otherwise."""
    name, how = param_of(kind), foldable(kind)
    read = [(i, "batch_norm_param", "eps"), (p, name, "bias_term")]
    if how.transpose:
        read += [(p, name, how.axis), (p, name, "transpose")]
    else:
        read.append((p, name, how.axis))
        if how.channels == "groups":  # the group moves a grouped weight's channels (a Convolution's stay on axis 0)
            read.append((p, name, "group"))
    if scale is not None:
        read += [(scale, "scale_param", setting) for setting in ("axis", "num_axes", "bias_term")]
    found = []
    for j, message, setting in read:
        if net.defined(j) is None:
            continue
        value, own = net.setting(j, message, setting), net.setting(j, message, setting, own=True)
        if value != own:
            found.append(Setting(f"{message}.{setting}", net.name(j), value, own))
    return found


def _target_why_not(net: View, p: int, target: str, kind: str) -> str | None:
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


def _scale_of(net: View, i: int, channels: int):
    """The index of the Scale that folds with BatchNorm i, None when it folds alone, or why it cannot fold (a str)."""
    readers = net.readers.get((i, 0), [])
    scales = [r for r in readers if net.types[r] == "Scale"]
    if not scales:
        return None
    s = scales[0]
    name = net.name(s)
    others = [net.name(r) for r in readers if r != s]
    bottoms, tops = net.links[s]
    held = net.blobs.get(name, [])
    where = net.where(s)
    axis = net.setting(s, "scale_param", "axis")
    num_axes = net.setting(s, "scale_param", "num_axes")
    why = scale_merge(others=others, bottoms=len(bottoms), batchnorm_blobs=len(net.blobs.get(net.name(i), [])),
                      axis=axis, num_axes=num_axes, counts=[e.count for e in held], channels=channels)
    reason, detail = why if why is not None else (None, None)
    if reason == OTHER_READERS:
        return f"its output feeds {_some(detail)} besides the Scale {name}"
    if reason == SECOND_BOTTOM:
        return f"the Scale after it, {name}, takes its scale from a second bottom, not from its blobs"
    # What Caffe loads into the Scale, and what folding computes with.
    if len(tops) != 1:
        return f"the Scale after it, {name}, has {len(tops)} tops"
    if len(held) not in (1, 2):
        return f"the Scale after it, {name}, holds {len(held)} blobs; gamma (and beta) expected"
    bias_term = net.setting(s, "scale_param", "bias_term")
    if bias_term != (len(held) == 2):
        return (f"the Scale after it, {name}, has bias_term: {_value_text(bias_term)}{where} and holds "
                f"{len(held)} blobs: Caffe loads no such weights into it")
    if reason == OTHER_COUNT:
        return (f"the Scale after it, {name}, holds {', '.join(str(e.count) for e in held)} values; "
                f"{channels} channels expected")
    if any(e.dtype.kind in "iu" for e in held):
        return f"the Scale after it, {name}, holds its values as integers"
    if reason == NOT_PER_CHANNEL:
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
