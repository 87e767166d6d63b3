"""A built net (forward/runner.py's Program) written as one ONNX model, streamed, weights never copied.

`export_program(program, dest, opset=17, outputs=None, ...)`:

- graph inputs: the deploy net's inputs, named by blob name, float32, their
  shapes; graph outputs: the blobs asked for (default the net's outputs),
  each the value after the last layer writing it, named by blob name;
- initializers named as blobtool names Caffe's blobs ("conv1/0", "conv1/1")
  and, for what an operator needs beyond them, "<layer>/<what>";
- values named after Caffe's tops: the last version of a blob by its own
  name, an earlier one (an in-place layer's input) as "<blob>:<layer that
  wrote it>";
- every name valid UTF-8 text (a byte of a Caffe name that is not UTF-8,
  which Python holds as a lone surrogate, written "\\xNN") and used once, as
  ONNX's single assignment asks: the inputs take their names first, then
  the blobs' last versions, their earlier versions, the initializers and
  the values between nodes; a name already taken is numbered ("data#2":
  the value of an input that a layer writes in place), and ExportResult
  says which names changed (`names`, `renamed`, and a line in `notes`);
- the model's metadata: the net's name, the source file, blobtool's version.

Every layer is turned into nodes first (its exporter, blobtool/onnxport/
ops/); a layer no exporter takes, or one whose settings ONNX cannot
compute exactly, is ExportError (exit 3) naming it before anything is
written.

The file is written field by field: the graph's small messages by the
protobuf library, each initializer's raw_data straight from the weight
array, so that memory holds the weights once. A model whose weights pass
EXTERNAL_THRESHOLD (protobuf refuses messages over 2 GiB) keeps them as
ONNX external data in "<file>.data" beside it, each tensor at a 64-byte
aligned offset.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

import numpy as np

from ..errors import UsageError, parameter
from ..files import file_behind, read_mapped
from ..formats.caffe.wire import encode_tag, encode_varint
from .emit import EXPORTERS, Emit, ExportError

__all__ = ["export_program", "ExportResult", "OPSET_DEFAULT", "OPSET_MIN", "opset_range", "EXTERNAL_THRESHOLD",
           "graph_names", "needed_steps", "make_node", "IR_VERSIONS", "onnx_text", "Names"]

# Softmax normalizes over one axis from opset 13 on (1 and 11 flatten to 2-D first).
OPSET_MIN = 13
# onnx2torch reads up to 17.
OPSET_DEFAULT = 17
# A protobuf message holds less than 2 GiB; past this the weights go to external data.
EXTERNAL_THRESHOLD = (2 << 30) - (64 << 20)
_ALIGN = 64

_LEN = 2


# The IR version ONNX pairs with each opset (onnx's helper.VERSION_TABLE: tests/onnxport/test_onnx_schema.py
# holds it to the installed onnx's): a model says the oldest IR its opset needs, so that older
# runtimes read it.
IR_VERSIONS = {13: 7, 14: 7, 15: 8, 16: 8, 17: 8, 18: 8, 19: 9, 20: 9, 21: 10, 22: 10, 23: 11, 24: 12, 25: 13,
               26: 13, 27: 13, 28: 14}


def opset_range() -> tuple:
    """(lowest, highest) opset export writes: 13 to the newest of IR_VERSIONS."""
    return OPSET_MIN, max(IR_VERSIONS)


def _onnx():
    """blobtool's own classes of ONNX's messages (proto/blobtool_onnx.proto): the bytes are ONNX's."""
    from .._pb import blobtool_onnx_pb2

    return blobtool_onnx_pb2


def onnx_text(name) -> str:
    """`name` as text protobuf can write (valid UTF-8): each lone surrogate written as an escape.

    A Caffe name that is not UTF-8 reaches blobtool as bytes or as text
    decoded with surrogateescape (a byte 0xNN that is not UTF-8 held as
    U+DCNN); ONNX's names are protobuf strings, which must be UTF-8. The
    escape can equal another name's text: Names numbers the second one.
    """
    if isinstance(name, bytes):
        name = name.decode("utf-8", "surrogateescape")
    if name.isascii():
        return name
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "".join(_escaped(c) for c in name)
    return name


def _escaped(c: str) -> str:
    code = ord(c)
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's byte
        return f"\\x{code - 0xDC00:02x}"
    if 0xD800 <= code <= 0xDFFF:
        return f"\\u{code:04x}"
    return c


class Names:
    """Names used once each in one namespace of a graph (its values, or its nodes), valid UTF-8 text.

    `claim(wanted)` gives `wanted` where it is free, else "<wanted>#k" with
    the lowest k from 2 that is; a counter per wanted name keeps the search
    linear in the names claimed (a net of 10,000 Eltwise bottoms claims
    10,000 "<layer>/Add"). `changed` lists (what, wanted, given) for the
    claims that said what they name and did not get their name.
    """

    def __init__(self):
        self.taken: set = set()
        self.counters: dict = {}
        self.changed: list = []

    def claim(self, wanted, what: str | None = None) -> str:
        text = onnx_text(wanted)
        given = text
        if not given or given in self.taken:  # an empty name means "no value" to ONNX
            k = self.counters.get(text, 2)
            given = f"{text}#{k}"
            while given in self.taken:
                k += 1
                given = f"{text}#{k}"
            self.counters[text] = k + 1
        self.taken.add(given)
        if what is not None and given != wanted:
            self.changed.append((what, wanted, given))
        return given


def make_node(op: str, inputs: list, outputs: list, *, name: str, **attributes):
    """A NodeProto; each attribute typed as ONNX types it (an int, a float, text, or a list of ints or floats)."""
    pb = _onnx()
    node = pb.NodeProto(op_type=op, name=onnx_text(name))
    node.input.extend(inputs)
    node.output.extend(outputs)
    kinds = pb.AttributeProto
    for key in sorted(attributes):
        value = attributes[key]
        attribute = node.attribute.add(name=key)
        if isinstance(value, (bool, int, np.integer)):
            attribute.type, attribute.i = kinds.INT, int(value)
        elif isinstance(value, (float, np.floating)):
            attribute.type, attribute.f = kinds.FLOAT, float(value)
        elif isinstance(value, (str, bytes)):
            attribute.type, attribute.s = kinds.STRING, value.encode() if isinstance(value, str) else value
        elif all(isinstance(v, (bool, int, np.integer)) for v in value):
            attribute.type = kinds.INTS
            attribute.ints.extend(int(v) for v in value)
        else:
            attribute.type = kinds.FLOATS
            attribute.floats.extend(float(v) for v in value)
    return node


# ONNX's TensorProto.DataType of uint8 (blobtool's own schema lists only the types its initializers take).
_UINT8 = 2


def _value_info(name: str, shape, symbolic=None, uint8: bool = False):
    """A float (or `uint8`) tensor's ValueInfoProto; the axes in `symbolic` ({axis: name}) are named, not sized (dim_param)."""
    symbolic = symbolic or {}
    pb = _onnx()
    info = pb.ValueInfoProto(name=onnx_text(name))
    tensor = info.type.tensor_type
    tensor.elem_type = _UINT8 if uint8 else pb.TensorProto.FLOAT
    tensor.shape.SetInParent()  # a scalar's shape too: present, and empty
    for axis, d in enumerate(shape):
        if axis in symbolic:
            tensor.shape.dim.add(dim_param=symbolic[axis])
        elif isinstance(d, str):  # export --dynamic: a symbolic size
            tensor.shape.dim.add(dim_param=d)
        else:
            tensor.shape.dim.add(dim_value=int(d))
    return info


@dataclass
class ExportResult:
    path: str
    opset: int
    inputs: dict                     # name -> shape
    outputs: dict                    # name -> shape
    nodes: int
    initializers: int
    weight_bytes: int
    external: str | None = None      # the external data file, where one was written
    notes: list = field(default_factory=list)
    names: dict = field(default_factory=dict)    # output blob -> its ONNX name
    input_names: dict = field(default_factory=dict)  # input blob -> its ONNX name
    renamed: list = field(default_factory=list)  # (what, blobtool's name, ONNX's name) where they differ
    dynamic: object = None                       # export --dynamic: the DynamicPlan (onnxport/dynamic.py)

    def record(self) -> dict:
        return {"path": self.path, "opset": self.opset,
                "inputs": {self.input_names.get(k, k): list(v) for k, v in self.inputs.items()},
                "outputs": {self.names.get(k, k): list(v) for k, v in self.outputs.items()},
                "nodes": self.nodes, "initializers": self.initializers, "weight_bytes": self.weight_bytes,
                "external_data": self.external,
                "renamed": [{"what": what, "name": name, "onnx": given} for what, name, given in self.renamed]}


def graph_names(program) -> list:
    """Per step, the names its tops' values want (the last version of a blob by its name, earlier ones "<blob>:<layer>")."""
    return [[top if last else f"{top}:{step.layer.name}" for top, last in zip(step.tops, final)]
            for step, final in zip(program.steps, program.versions.final)]


class _Graph:
    """The nodes and initializers being gathered (Emit's side), with the names of values and of nodes."""

    def __init__(self, opset: int, half: set = frozenset()):
        self.opset = opset
        self.half = half               # (layer, blob index) stored as float16: kept so, cast where used
        self.nodes: list = []
        self.initializers: list = []    # (name, array)
        self.values = Names()
        self.node_names = Names()
        self.notes: list = []           # lines for stderr: constants that became Inf or NaN
        self.symbolic: dict = {}        # value name -> {axis: dim_param}: sizes known only from the data
        self.free_steps: set = set()    # export --dynamic: id() of the steps written without shape constants

    def unique(self, name: str) -> str:
        """A value's name: `name`, or numbered where it is taken."""
        return self.values.claim(name)

    def initializer(self, name: str, array: np.ndarray) -> str:
        name = self.values.claim(name, f"initializer {name!r}")
        self.initializers.append((name, np.asarray(array, order="C")))
        return name

    def node(self, op: str, inputs: list, outputs: list, *, name: str, **attributes) -> None:
        self.nodes.append(make_node(op, list(inputs), list(outputs), name=self.node_names.claim(name), **attributes))


def build_graph(program, opset: int, wanted: list, pixels: dict | None = None, free_steps: set = frozenset()):
    """(the _Graph with every step's nodes, {input: ONNX name}, {blob in `wanted`: ONNX name}); ExportError for a layer.

    The first layer that cannot be written is ExportError naming the net's
    file. The names of the inputs and of every blob version are claimed
    before any layer is written, so that a value of Caffe's keeps its name
    against the names export makes up ("conv1/0", "conv1/flat").
    """
    from . import ops  # noqa: F401  the exporters register on import

    needed = needed_steps(program, wanted)
    cannot = [s.layer for i, s in enumerate(program.steps) if i in needed and s.layer.type not in EXPORTERS]
    if cannot:
        first = cannot[0]
        raise ExportError(f"layer {first.name!r} has type {first.type!r}, which blobtool cannot export to ONNX"
                          + (f" (and {len(cannot) - 1} more)" if len(cannot) > 1 else "") + "; nothing was "
                          "written", path=program.path)
    graph = _Graph(opset, getattr(program, "half", set()))
    graph.free_steps = set(free_steps)
    inputs = {name: graph.values.claim(name, f"input {name!r}") for name in program.inputs}
    current = dict(inputs)
    for name, steps in (pixels or {}).items():  # the input takes pixels: its preprocessing's nodes come first
        from .pixels import pixel_nodes

        current[name] = pixel_nodes(graph, inputs[name], name, steps)
    wants = graph_names(program)
    order = sorted(needed)
    given: dict = {}   # (step, top index) -> ONNX name
    # A blob's last version first (the name users ask for), then the in-place layers' inputs.
    for earlier in (False, True):
        for i in order:
            step = program.steps[i]
            for k, (top, want) in enumerate(zip(step.tops, wants[i])):
                if (want != top) == earlier:
                    what = f"blob {top!r} written by layer {step.layer.name!r}" + (
                        " (an in-place layer's input)" if earlier else "")
                    given[(i, k)] = graph.values.claim(want, what)
    for i in order:
        step = program.steps[i]
        tops = [given[(i, k)] for k in range(len(step.tops))]
        e = Emit(graph, step, [current[b] for b in step.bottoms], tops)
        with np.errstate(all="ignore"):  # a constant that becomes Inf or NaN is said below, in blobtool's words
            try:
                EXPORTERS[step.layer.type](e)
            except ExportError as exc:
                raise exc.with_path(program.path) from None
        said = e.not_finite()
        if said:
            graph.notes.append(f"{program.path}: {said}")
        current.update(zip(step.tops, tops))
    return graph, inputs, {name: current[name] for name in wanted}


def needed_steps(program, wanted: list) -> set:
    """The indices of the steps the blobs `wanted` (each its last version) are computed from."""
    return program.versions.needed(wanted)


def export_program(program, dest, *, opset: int = OPSET_DEFAULT, outputs=None, net_name: str = "",
                   source: str = "", version: str = "", pixels: dict | None = None,
                   dynamic: bool = False) -> ExportResult:
    """Write `program` to `dest` (a path) as an ONNX model; see the module. ExportError, UsageError, OutputError.

    `pixels` ({input: onnxport.pixels.PixelSteps}): those inputs take uint8
    pixels, N x H x W x C, their preprocessing the graph's first nodes.
    `dynamic`: inputs and outputs with symbolic batch, height and width
    where the layers allow it (onnxport/dynamic.py); the layers that fix
    axes are said in the result's notes.
    """
    low, high = opset_range()
    if not low <= opset <= high:
        raise UsageError(f"{parameter('opset', True)}{opset}: blobtool writes opsets {low} to {high}")
    wanted = program.outputs() if outputs is None else list(outputs)
    _check_outputs(program, wanted)
    pixels = pixels or {}
    plan = None
    if dynamic:
        from .dynamic import plan_dynamic

        plan = plan_dynamic(program, opset, pixels)
    graph, inputs, names = build_graph(program, opset, wanted, pixels, plan.free_steps if plan else ())
    shapes = program.shapes
    pb = _onnx()
    model = pb.ModelProto(ir_version=IR_VERSIONS[opset], producer_name="blobtool", producer_version=version)
    model.opset_import.add(domain="", version=opset)
    body = model.graph
    body.name = onnx_text(net_name) or "caffe_net"
    body.node.extend(graph.nodes)
    given = dict(program.inputs)
    if plan is not None:
        shapes = {n: plan.dims(n, shapes[n], names[n]) for n in wanted}
        given = {n: plan.input_dims(n, s) for n, s in given.items()}
    body.input.extend(_value_info(inputs[n], pixels[n].pixel_shape(s), uint8=True) if n in pixels else
                      _value_info(inputs[n], s) for n, s in given.items())
    body.output.extend(_value_info(names[n], shapes[n], graph.symbolic.get(names[n])) for n in wanted)
    for key, value in (("caffe_net", net_name), ("source", os.path.basename(source)), ("blobtool_version", version)):
        model.metadata_props.add(key=key, value=onnx_text(value))
    weight_bytes = sum(a.nbytes for _, a in graph.initializers)
    external = None
    if weight_bytes > EXTERNAL_THRESHOLD:
        external = os.fspath(dest) + ".data"
        beside = os.path.basename(external)
        if onnx_text(beside) != beside:
            # The model names its data file in a protobuf string; an escape would name another file.
            raise UsageError(f"the weights ({weight_bytes:,} bytes) go to {onnx_text(beside)!r} beside the model, "
                             "and the model names that file in UTF-8 text, which this name is not: give the "
                             "model a UTF-8 name; nothing was written", path=os.fspath(dest))
    _write(model, graph.initializers, dest, external)
    renamed = list(graph.values.changed)
    taken = {n: pixels[n].pixel_shape(s) if n in pixels else s for n, s in given.items()}
    return ExportResult(os.fspath(dest), opset, taken, {n: tuple(shapes[n]) for n in wanted},
                        len(graph.nodes), len(graph.initializers), weight_bytes, external,
                        notes=_renamed_note(renamed, program.path) + list(graph.notes)
                        + (plan.lines(program.path) if plan else []), names=names, input_names=inputs,
                        renamed=renamed, dynamic=plan)


def _renamed_note(renamed: list, path) -> list:
    """One line saying which names the model gives otherwise than blobtool, and why (none where all are kept)."""
    if not renamed:
        return []
    shown = "; ".join(f"{what} is {given!r}" for what, _, given in renamed[:4])
    more = f"; and {len(renamed) - 4} more (--json lists them)" if len(renamed) > 4 else ""
    one = len(renamed) == 1
    return [f"{path}: {len(renamed)} name{'' if one else 's'} in the ONNX model differ{'s' if one else ''} from the "
            f"net's, as ONNX names each value once, in UTF-8 text: {shown}{more}"]


def _check_outputs(program, wanted: list) -> None:
    known = set(program.blob_names())
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise UsageError(f"the net has no blob {', '.join(repr(n) for n in unknown)}", path=program.path)


# -- writing, field by field ----------------------------------------------------------------

def _little_endian(array: np.ndarray) -> memoryview:
    """The array's bytes as ONNX's raw_data holds them (little-endian), without a copy where they already are."""
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and not np.little_endian):
        array = array.astype(array.dtype.newbyteorder("<"))
    return memoryview(np.ascontiguousarray(array)).cast("B")


def _tensor_header(name: str, array: np.ndarray, external=None) -> bytes:
    tensors = _onnx().TensorProto
    kind = {np.dtype(np.float32): tensors.FLOAT, np.dtype(np.float16): tensors.FLOAT16}.get(array.dtype,
                                                                                          tensors.INT64)
    header = tensors(name=name, data_type=kind)
    header.dims.extend(int(d) for d in array.shape)
    if external is not None:
        location, offset, length = external
        header.data_location = tensors.EXTERNAL
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
            entry = header.external_data.add()
            entry.key, entry.value = key, value
    return header.SerializeToString()


# Weights go out in pieces of this size, each handed to the disk as it is written (POSIX_FADV_DONTNEED
# starts its writeback): the atomic write's fsync then finds little left to do (VGG-16's 528 MB: the
# fsync took 0.13 s after one write, 4 ms after pieces of 16 MiB).
_PIECE = 16 << 20


def _write_bytes(out, array: np.ndarray, buffer: np.ndarray) -> None:
    """Write an array's little-endian bytes in _PIECE pieces, each one's writeback started where the output is a file.

    A weight that views the mapped input is read from its file into
    `buffer` piece by piece (files/pages.py) rather than through the
    mapping, whose first touch of each page costs a fault (VGG-16: 0.33 s
    of writes from the mapping against about 0.1 s from the file).
    """
    behind = file_behind(array) if array.dtype.byteorder in "=<|" and np.little_endian else None
    data = _little_endian(array) if behind is None else None
    fd = _regular_file(out)
    for start in range(0, array.nbytes, _PIECE):
        size = min(_PIECE, array.nbytes - start)
        if behind is not None:
            piece = memoryview(buffer)[:size]
            read_mapped(behind[0], behind[1] + start, piece)
        else:
            piece = data[start:start + size]
        out.write(piece)
        if fd is not None:
            out.flush()
            position = out.tell()
            try:
                os.posix_fadvise(fd, position - size, size, os.POSIX_FADV_DONTNEED)
            except OSError:
                fd = None  # a file system that takes no advice: plain writes


def _regular_file(out) -> int | None:
    """The descriptor of `out` where it is a regular file that takes advice; None for a FIFO, a socket, a device.

    Only a regular file has a position: tell() on a pipe is ESPIPE ("Illegal
    seek"), and the model, written in one pass, needs none.
    """
    if not hasattr(os, "posix_fadvise"):
        return None
    try:
        fd = out.fileno()
        return fd if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except (AttributeError, OSError, ValueError):
        return None


def _numbers() -> tuple:
    """(ModelProto.graph, GraphProto.initializer, TensorProto.raw_data) field numbers, from ONNX's schema."""
    pb = _onnx()
    return (pb.ModelProto.DESCRIPTOR.fields_by_name["graph"].number,
            pb.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number,
            pb.TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number)


def _write(model, initializers: list, dest, external: str | None) -> None:
    """The model's bytes: ModelProto without its graph, then the graph with each initializer streamed."""
    from ..files import atomic_output, releasing

    with releasing():  # where the weights view the mapped input, they are read from its file
        _write_model(model, initializers, dest, external, atomic_output)


def _write_model(model, initializers: list, dest, external: str | None, atomic_output) -> None:
    graph_field, initializer_field, raw_field = _numbers()
    graph_fields = model.graph.SerializeToString()
    model.ClearField("graph")
    head = model.SerializeToString()
    pieces = []   # (prefix bytes, the array's bytes or None)
    offsets = []
    if external is not None:
        position = 0
        for name, array in initializers:
            position = -(-position // _ALIGN) * _ALIGN
            offsets.append((os.path.basename(external), position, array.nbytes))
            position += array.nbytes
    for k, (name, array) in enumerate(initializers):
        if external is not None:
            header = _tensor_header(name, array, offsets[k])
            pieces.append((encode_tag(initializer_field, _LEN) + encode_varint(len(header)) + header, None))
        else:
            header = _tensor_header(name, array)
            raw = encode_tag(raw_field, _LEN) + encode_varint(array.nbytes)
            size = len(header) + len(raw) + array.nbytes
            pieces.append((encode_tag(initializer_field, _LEN) + encode_varint(size) + header + raw, array))
    graph_size = len(graph_fields) + sum(len(p) + (a.nbytes if a is not None else 0) for p, a in pieces)
    buffer = np.empty(min(_PIECE, max((a.nbytes for _, a in initializers), default=0)), np.uint8)
    if external is not None:
        with atomic_output(external) as out:
            position = 0
            for (name, array), (_, offset, _) in zip(initializers, offsets):
                out.write(b"\0" * (offset - position))
                _write_bytes(out, array, buffer)
                position = offset + array.nbytes
    with atomic_output(dest) as out:
        out.write(head)
        out.write(encode_tag(graph_field, _LEN) + encode_varint(graph_size))
        out.write(graph_fields)
        for prefix, array in pieces:
            out.write(prefix)
            if array is not None:
                _write_bytes(out, array, buffer)
