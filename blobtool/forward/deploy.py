"""The deploy net of any net blobtool reads: the layers Caffe's TEST phase runs, fed by named inputs.

What `blobtool run` runs, what `definition --deploy` writes and what an
export starts from. From the net's definition (its own, or one given apart,
`definition`), in order:

1. Caffe's Net::FilterNet for phase TEST (level 0, the net's own stages):
   a layer its include/exclude rules leave out goes (net/model.py's view).
Which layers are inputs, data layers, losses and the like is their type's
role in a deploy net, from its row in net/layertypes.py (`deploy_role`).

2. Inputs: the net's `input` fields (with `input_shape` or the four
   `input_dim` per input) and its Input layers; each data layer (Data,
   ImageData, HDF5Data, MemoryData, WindowData, AnnotatedData, DummyData)
   becomes an input per top. A shape comes from `shapes` (--input-shape),
   else from the definition where it states one (Input, input fields,
   MemoryData's four sizes, DummyData's shape). A blob that a layer writes
   becomes an input too when `shapes` names it (the Concat that merges a
   training net's data layers, as MTCNN's): the layers that wrote it go.
3. Loss and accuracy layers go (and a type without a row whose name ends
   in "Loss", a fork's loss); SoftmaxWithLoss becomes the Softmax that
   deploy nets end with (its top named "prob" unless that name is taken),
   with the loss layer's softmax axis. Silence goes.
4. A layer that reads a blob nothing gives goes, and with it the layers fed
   only by it (a label's). Such a blob is an error (UsageError, exit 2,
   one line naming it and the --input-shape to give) unless it is a data
   layer's second or later top (a label) or one a loss layer read.
5. Every layer left keeps its parameters; `phase`, `include` and `exclude`
   go, as does the net's `state`. Inputs become Input layers with shapes.

A data layer's preprocessing (transform_param: scale, mean_file,
mean_value, crop_size, mirror) is not part of the deploy net; `Deploy.transforms`
says it, so that the caller can tell the user how the inputs were made.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import FormatError, UsageError, parameter
from ..formats.caffe.containers import name_bytes, name_key, text
from ..net.layertypes import deploy_role
from ..net.model import model

__all__ = ["Deploy", "deploy_net", "parse_shape"]

# The roles (net/layertypes.py, DEPLOY_ROLES) of the layers a deploy net has no use for: they
# compute a loss or a score against labels, or swallow blobs.
_GONE_ROLES = ("loss", "softmax", "score", "swallow")

# Caffe's blobs hold at most 32 axes (blob.hpp kMaxBlobAxes).
MAX_AXES = 32


# The layers a line names before it counts the rest.
_NAMED = 12


@dataclass
class Deploy:
    """The deploy net: its NetParameter (Input layers first), its inputs, and what changed on the way."""

    net: object                                  # NetParameter: Input layers, then the layers that run
    inputs: dict = field(default_factory=dict)   # {input name: shape tuple}
    dropped: list = field(default_factory=list)  # (layer name, type, why)
    replaced: list = field(default_factory=list)  # (layer name, old type, new type)
    transforms: list = field(default_factory=list)  # (data layer name, {setting: value})
    source: str = ""                             # where the definition came from (a path)
    layer_names: list = field(default_factory=list)  # the model's names of the layers that run, in order
    text: str = ""                               # the deploy definition as text, where it was written

    def notes(self, preprocessed: str = "") -> list:
        """Lines for stderr: the layers that went or changed, and the preprocessing a data layer did.

        `preprocessed` says what the caller does of that preprocessing (export
        --preprocess bakes it into the model); without it the inputs are said
        to be taken as they are.
        """
        lines = []
        gone: dict = {}
        for name, kind, why in self.dropped:
            gone.setdefault(why, []).append(f"{name} ({kind})")
        for why, names in gone.items():
            # A generated net can leave out thousands (a net of 8,000 data layers); the record lists every one.
            more = f" and {len(names) - _NAMED:,} more" if len(names) > _NAMED else ""
            lines.append(f"{self.source}: left out of the deploy net ({why}): {', '.join(names[:_NAMED])}{more}")
        for name, old, new in self.replaced:
            lines.append(f"{self.source}: layer {name} ({old}) runs as {new}, as a deploy net computes it")
        for name, settings in self.transforms:
            said = ", ".join(f"{k} {v}" for k, v in settings.items())
            done = preprocessed or "the inputs given here are taken as they are, after that preprocessing"
            lines.append(f"{self.source}: data layer {name} preprocessed its images ({said}); {done}")
        return lines

    def record(self) -> dict:
        """What changed, JSON-ready."""
        return {
            "inputs": {name: list(shape) for name, shape in self.inputs.items()},
            "dropped": [{"layer": n, "type": k, "why": w} for n, k, w in self.dropped],
            "replaced": [{"layer": n, "type": o, "as": t} for n, o, t in self.replaced],
            "preprocessing": [{"layer": n, **s} for n, s in self.transforms],
        }


def parse_shape(text_value: str, *, what: str = "--input-shape") -> tuple:
    """'1,3,224,224' -> (1, 3, 224, 224): positive integers, 1 to 32 axes; UsageError otherwise."""
    parts = [p.strip() for p in text_value.replace("x", ",").split(",")]
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(f"{what}: {text_value!r} is not a shape: expected sizes separated by commas "
                         "(1,3,224,224)") from None
    if not dims or len(dims) > MAX_AXES or any(d < 1 for d in dims):
        raise UsageError(f"{what}: {text_value!r} is not a shape: expected 1 to {MAX_AXES} sizes, each at least 1")
    return dims


def deploy_net(doc, definition=None, shapes: dict | None = None, given: dict | None = None) -> Deploy:
    """The deploy net of net `doc` (or of `definition`, a document whose definition is used instead): see the module.

    `shapes` ({blob name: shape}) gives inputs their shapes, and makes a
    written blob an input. `given` ({blob name: shape} of values the caller
    holds) gives a shape only where the net states none (a data layer's
    input, or a blob taken as the input): a shape the net states is kept,
    and the values must then fit it (run_net). FormatError where the net
    holds no definition (an HDF5 snapshot without `definition`).
    """
    from .._pb import blobtool_caffe_pb2 as pb

    shapes = dict(shapes or {})
    structure = definition if definition is not None else doc
    net, defs, top = _net_of(structure)
    result = Deploy(pb.NetParameter(name=top.name), source=structure.path)
    layers = _sorted_layers(net, defs, top, result, pb, structure.path)
    _inputs_by_shape(layers, shapes, given or {}, result, net, structure.path)
    runs = _fed_layers(layers, result, net, structure.path)
    _write_net(result, layers.declared, runs, shapes, net)
    return result


@dataclass
class _Sorted:
    """The TEST net's layers sorted by their part in a deploy net (steps 2 and 3 of the module)."""

    declared: dict = field(default_factory=dict)  # input name -> shape, or None where the net states none
    labels: set = field(default_factory=set)      # a data layer's later tops
    loss_read: set = field(default_factory=set)   # blobs a loss or accuracy layer read
    kept: list = field(default_factory=list)      # (model index, LayerParameter) of the layers that stay


def _net_of(structure) -> tuple:
    """(net model, its layers' LayerParameters, the definition's NetParameter) of a net that can run.

    Refused: an HDF5 snapshot (no layers), a file that is no net, and a
    layer of the TEST net in Caffe's first (V0) format.
    """
    if structure.format == "hdf5":
        raise UsageError(f"Caffe's HDF5 snapshot holds blobs only, no layer types or wiring: give "
                         f"{parameter('definition', True)}the net's .prototxt (or the .caffemodel of the same net)",
                         path=structure.path)
    if structure.kind != "net":
        raise UsageError(f"a {structure.kind} holds no net to run", path=structure.path)
    net = model(structure)
    view = net.test
    defs = net.layer_defs()
    from ..formats.caffe.netdef import definition as net_definition

    found = net_definition(structure)
    v0 = [net.names[i] for i, layer in enumerate(found.layers) if layer.format == "V0" and i not in view.outside]
    if v0:
        # Caffe's first format nests a V0LayerParameter whose settings blobtool does not upgrade.
        raise FormatError(f"layer {v0[0]!r}{f' (and {len(v0) - 1} more)' if len(v0) > 1 else ''} is in Caffe's "
                          "first (V0) layer format, whose parameters blobtool does not upgrade: upgrade the net "
                          "with Caffe's upgrade_net_proto_binary, or give the net's definition", path=structure.path)
    return net, defs, found.net


def _sorted_layers(net, defs: list, top, result: Deploy, pb, path) -> _Sorted:
    """Steps 1 to 3: the TEST net's layers as inputs (the net's own, Input and data layers), losses gone, the rest kept."""
    layers = _Sorted()
    declared = layers.declared
    for k, name in enumerate(top.input):
        declared[name_key(name)] = _input_field_shape(top, k, path)
    names_used = {name_key(t) for m in defs for t in m.top} | {name_key(b) for m in defs for b in m.bottom}
    transformed: set = set()  # data layers (a TRAIN and a TEST one may share a name) said once each
    data_dropped: set = set()
    outside = net.test.outside
    for i, message in enumerate(defs):
        kind = net.types[i]
        name = net.names[i]
        role = deploy_role(kind)
        # A training snapshot holds the TRAIN net: its data layers are TRAIN-only, and still say what
        # the deploy net's inputs are.
        if i in outside and role != "data":
            continue
        if role == "input":
            for k, t in enumerate(message.top):
                declared[name_key(t)] = _input_layer_shape(message, k, path)
            continue
        if role == "data":
            for k, t in enumerate(message.top):
                declared.setdefault(name_key(t), _data_layer_shape(message, kind, k, path))
                if k > 0:
                    layers.labels.add(name_key(t))
            settings = _transform_settings(message)
            if settings and name not in transformed:
                transformed.add(name)
                result.transforms.append((name, settings))
            if name not in data_dropped:
                data_dropped.add(name)
                result.dropped.append((name, kind, "a data layer: its tops are inputs"))
            continue
        if role in _GONE_ROLES:
            layers.loss_read.update(name_key(b) for b in message.bottom)
            if role == "softmax":
                layers.kept.append((i, _softmax_of(message, pb, names_used)))
                result.replaced.append((name, kind, "Softmax"))
            else:
                result.dropped.append((name, kind, "it scores the net against labels" if role != "swallow"
                                       else "it only swallows blobs"))
            continue
        layers.kept.append((i, message))
    return layers


def _inputs_by_shape(layers: _Sorted, shapes: dict, given: dict, result: Deploy, net, path) -> None:
    """Blobs made inputs by --input-shape (`shapes`, and `given` where the net states no shape), their writers gone."""
    declared = layers.declared
    written = {name_key(t) for _, m in layers.kept for t in m.top}
    read = {name_key(b) for _, m in layers.kept for b in m.bottom}
    for n, shape in given.items():
        if n not in shapes and declared.get(n) is None and (n in declared or n in written or n in read):
            shapes[n] = tuple(shape)
    # A blob layers read that nothing writes is an input the net never declared (a net stripped of
    # its input fields): --input-shape declares it.
    unknown = [n for n in shapes if n not in declared and n not in written and n not in read]
    if unknown:
        raise UsageError(f"{parameter('shapes')} names {', '.join(repr(n) for n in unknown)}, which the deploy net "
                         f"neither takes as an input nor computes (inputs: {', '.join(declared) or 'none'})",
                         path=path)
    made_inputs = [n for n in shapes if n in written and n not in declared]
    if made_inputs:
        for n in made_inputs:
            declared[n] = None
        still = []
        for i, m in layers.kept:
            tops = set(map(name_key, m.top))
            if tops & set(made_inputs) and not set(map(name_key, m.bottom)) & tops:
                result.dropped.append((net.names[i], net.types[i], "its top is an input given by --input-shape"))
            else:
                still.append((i, m))
        layers.kept = still
    for n, shape in shapes.items():
        declared[n] = shape


def _fed_layers(layers: _Sorted, result: Deploy, net, path) -> list:
    """Step 4: the layers that run, (model index, LayerParameter); a layer fed by what nothing gives goes.

    UsageError for a blob nothing gives that is neither a label nor one a
    loss layer read, and where no layer is left.
    """
    declared, labels = layers.declared, layers.labels
    available = {n for n, s in declared.items() if s is not None}
    runs: list = []
    absent: dict = {}   # blob name -> the first layer that wanted it
    for i, m in layers.kept:
        wanted = [name_key(b) for b in m.bottom if name_key(b) not in available]
        if wanted:
            for b in wanted:
                absent.setdefault(b, net.names[i])
            if all(b in labels or b in layers.loss_read for b in wanted):
                labels.update(name_key(t) for t in m.top)  # computed from labels only (MTCNN's merged labels)
            why = f"it reads {', '.join(wanted)}, which the deploy net does not give"
            result.dropped.append((net.names[i], net.types[i], why))
            continue
        runs.append((i, m))
        available.update(name_key(t) for t in m.top)
    needed = [b for b in absent if b not in labels and b not in layers.loss_read]
    if needed:
        raise _unfed(needed[0], absent[needed[0]], layers, net, path)
    if not runs:
        raise UsageError("the deploy net runs no layer", path=path)
    return runs


def _unfed(b: str, reader: str, layers: _Sorted, net, path) -> UsageError:
    """The error for blob `b`, which layer `reader` reads and nothing gives: the shape or the definition to give."""
    declared = layers.declared
    where = f"layer {_printable(reader)} reads it"
    merged = _merging_layer(layers.kept, net, b, declared)
    if merged is not None:
        shape = f"{parameter('shapes', True)}{_printable(merged[2])}=N,C,H,W"
        return UsageError(f"{b!r} comes from data layers outside the TEST net ({where}); layer "
                          f"{_printable(merged[0])} ({merged[1]}) merges them into {merged[2]!r}: give {shape} to take that "
                          f"blob as the input, or {parameter('definition')} with the net's deploy.prototxt",
                          path=path)
    if b in declared and declared[b] is None:
        return UsageError(f"input {b!r} has no shape ({where}; a data layer's shape lies in its database): "
                          f"give {parameter('shapes', True)}{_printable(b)}=N,C,H,W", path=path)
    return UsageError(f"blob {b!r} is an input of the deploy net that nothing gives ({where}): give "
                      f"{parameter('shapes', True)}{_printable(b)}=N,C,H,W, or {parameter('definition')} with the net's "
                      "deploy.prototxt", path=path)


def _write_net(result: Deploy, declared: dict, runs: list, shapes: dict, net) -> None:
    """Step 5: the deploy NetParameter: an Input layer per input read, then each layer that runs, phase rules gone."""
    read = {name_key(b) for _, m in runs for b in m.bottom}
    for n, shape in declared.items():
        if shape is None or (n not in read and n not in shapes):
            continue
        layer = result.net.layer.add(type="Input")
        _add_names(layer, (1, n), (4, n))
        layer.input_param.shape.add().dim.extend(shape)
        result.inputs[n] = tuple(shape)
    for i, m in runs:
        layer = result.net.layer.add()
        layer.CopyFrom(m)
        for gone in ("phase", "include", "exclude"):
            layer.ClearField(gone)
        result.layer_names.append(net.names[i])


def _printable(name: str) -> str:
    """A name as a message shows it in place: as it is, or escaped where it holds a line break or other control."""
    return name if name.isprintable() else repr(name)[1:-1]


def _softmax_of(loss, pb, taken: set):
    """The Softmax a deploy net has where a training net has SoftmaxWithLoss: scores in, probabilities out.

    Its top is "prob", as Caffe's deploy nets name it, unless the net uses
    that name already; then the loss layer's own top.
    """
    out = pb.LayerParameter(type="Softmax")
    name = name_key(loss.name)
    top = "prob" if "prob" not in taken else name_key(loss.top[0]) if loss.top else f"{name}_prob"
    _add_names(out, (1, name), (3, name_key(loss.bottom[0])), (4, top))
    if loss.HasField("softmax_param"):
        out.softmax_param.CopyFrom(loss.softmax_param)
    return out


def _add_names(message, *fields) -> None:
    """Set string fields of `message` from (field number, name_key) pairs, by the bytes the names stand for.

    protobuf's setters take only UTF-8 text, and a name Caffe reads may be
    any bytes: the fields go in through the wire format, which keeps them.
    """
    from ..formats.caffe import wire

    parts = []
    for number, name in fields:
        raw = name_bytes(name)
        parts += [wire.len_field_header(number, len(raw)), raw]
    message.MergeFromString(b"".join(parts))


def _merging_layer(kept: list, net, blob: str, declared: dict):
    """(layer, type, top) of the first layer merging `blob` with other inputs lacking a shape, or None.

    MTCNN's training nets concatenate the tops of three data layers into
    "data": none of them is the deploy net's input; the merged blob is.
    """
    for i, m in kept:
        bottoms = [name_key(b) for b in m.bottom]
        if blob in bottoms and len(bottoms) > 1 and m.top and \
                all(b in declared and declared[b] is None for b in bottoms):
            return net.names[i], net.types[i], name_key(m.top[0])
    return None


def _input_field_shape(top, k: int, path) -> tuple | None:
    """The shape of the net's k-th `input`: its input_shape, or its four input_dim."""
    name = text(top.input[k])
    if len(top.input_shape) > k:
        return _declared(top.input_shape[k].dim, f"input {name!r} (the net's input_shape {k})", path)
    if top.input_shape:
        raise FormatError(f"the net has {len(top.input)} inputs and {len(top.input_shape)} input_shape fields; "
                          "Caffe takes one shape per input", path=path)
    dims = list(top.input_dim)
    if dims:
        if len(dims) != 4 * len(top.input):
            raise FormatError(f"the net has {len(top.input)} inputs and {len(dims)} input_dim values; Caffe takes "
                              "four per input", path=path)
        return _declared(dims[4 * k:4 * k + 4], f"input {name!r} (the net's input_dim {4 * k} to {4 * k + 3})", path)
    return None


def _declared(dims, what: str, path) -> tuple | None:
    """A shape the definition declares, checked as Caffe's Blob::Reshape checks it; None for no axes (no shape given).

    FormatError (exit 3) naming `what` for more than 32 axes, a negative
    size or more than INT_MAX values; a size of 0 is Caffe's empty blob.
    """
    from .memory import check_shape

    return check_shape(dims, what, path) or None


def _input_layer_shape(message, k: int, path=None) -> tuple | None:
    """An Input layer's k-th top's shape (its one shape serves every top)."""
    shapes = message.input_param.shape
    if not shapes:
        return None
    which = k if len(shapes) > k else 0
    return _declared(shapes[which].dim, f"layer {text(message.name)!r} (Input): input_param.shape {which}", path)


def _data_layer_shape(message, kind: str, k: int, path=None) -> tuple | None:
    """The shape a data layer states for its k-th top, where its definition states one (MemoryData, DummyData)."""
    where = f"layer {text(message.name)!r} ({kind})"
    if kind == "MemoryData" and k == 0:
        p = message.memory_data_param
        dims = (p.batch_size, p.channels, p.height, p.width)
        return _declared(dims, f"{where}: memory_data_param's sizes", path) if all(dims) else None
    if kind == "DummyData":
        p = message.dummy_data_param
        if len(p.shape) > k:
            return _declared(p.shape[k].dim, f"{where}: dummy_data_param.shape {k}", path)
        if len(p.shape) == 1:
            return _declared(p.shape[0].dim, f"{where}: dummy_data_param.shape 0", path)
        legacy = [list(getattr(p, f)) for f in ("num", "channels", "height", "width")]
        if all(len(v) > k for v in legacy):
            return _declared([v[k] for v in legacy], f"{where}: dummy_data_param's num, channels, height and "
                             f"width {k}", path)
    return None


def _transform_settings(message) -> dict:
    """The preprocessing a data layer's transform_param states: {setting: value} of those set."""
    if not message.HasField("transform_param"):
        return {}
    p = message.transform_param
    out = {}
    for fd, value in p.ListFields():
        if not isinstance(value, (bool, int, float, str, bytes)):  # a repeated field
            out[fd.name] = [float(v) if isinstance(v, float) else v for v in value]
        elif isinstance(value, bytes):
            out[fd.name] = value.decode("utf-8", "backslashreplace")
        else:
            out[fd.name] = value
    return out

