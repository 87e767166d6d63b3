"""What an exporter of one layer type writes with: its bottoms' and tops' ONNX names, constants, nodes.

An exporter is a function registered for Caffe layer types
(`@exporter("ReLU")`, each type's row in blobtool/net/layertypes.py naming
it: "elementwise.relu") that takes an Emit and adds the ONNX nodes that
compute the layer's tops from its bottoms, exactly as the layer's class in
blobtool/layers/ computes them. The Emit gives it:

- `e.layer`: the built Layer (its parameters `e.layer.param`, its blobs
  `e.layer.blobs` as float32 arrays), `e.bottom_shapes`, `e.top_shapes`;
- `e.inputs`, `e.outputs`: the ONNX value names of its bottoms and tops;
- `e.blob(k)`: blob k as an initializer named as blobtool names it
  ("conv1/0"), `e.constant(suffix, array)` any other ("conv1/mean");
- `e.node(op, inputs, outputs, **attributes)`, `e.temp(suffix)` for the
  name of a value between nodes ("conv1/flat");
- `e.opset`: the opset being written, for operators whose form changed;
- `e.free`: with export --dynamic, the layer's bottoms have symbolic axes
  and it writes no shape as a constant (onnxport/dynamic.py says which);
- `e.refuse(why)`: ExportError naming the layer (exit 3, before anything
  is written).

Nothing here imports the onnx package: graph.py writes ONNX's messages with blobtool's own
classes (proto/blobtool_onnx.proto); only --check (check.py) needs the `onnx` extra.
"""

from __future__ import annotations

import numpy as np

from ..errors import FormatError
from ..net.layertypes import check_join

__all__ = ["Emit", "ExportError", "exporter", "EXPORTERS"]

# Caffe type name -> function(Emit); filled as the family modules load, for the types whose row in
# TYPES names the function.
EXPORTERS: dict = {}


class ExportError(FormatError):
    """A layer that cannot be written as ONNX exactly (exit 3, before anything is written)."""


def exporter(*types: str):
    """Decorator: the function writes layers of these Caffe types as ONNX nodes (each row in TYPES naming it)."""

    def add(function):
        for name in types:
            check_join(name, "export", function)
            if name in EXPORTERS:
                raise TypeError(f"layer type {name!r} has two exporters")
            EXPORTERS[name] = function
        return function

    return add


class Emit:
    """One layer being written: see the module."""

    def __init__(self, graph, step, inputs: list, outputs: list):
        self.graph = graph
        self.step = step
        self.layer = step.layer
        self.name = step.layer.name
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.bottom_shapes = [tuple(s) for s in step.bottom_shapes]
        self.top_shapes = [tuple(s) for s in step.top_shapes]
        self.opset = graph.opset
        self.computed: list = []   # (suffix, array) of the constants computed from the layer's parameters
        # export --dynamic: the step's shapes are symbolic, so it computes them in the graph (onnxport/dynamic.py)
        self.free = id(step) in graph.free_steps

    @property
    def param(self):
        return self.layer.param

    def refuse(self, why: str) -> ExportError:
        return ExportError(f"layer {self.name!r} ({self.layer.type}) cannot be exported to ONNX: {why}")

    def blob(self, k: int, shape: tuple | None = None) -> str:
        """Blob k of the layer as an initializer named "<layer>/<k>" (viewed in `shape` where given).

        A blob the file stores as float16 stays float16, with a Cast to
        float32 where the net uses it ("<layer>/<k>:float32"): exact, as every
        float16 is a float32, and half the bytes.
        """
        array = self.layer.blobs[k]
        if shape is not None:
            array = array.reshape(shape)
        if (self.name, k) not in self.graph.half:
            return self.graph.initializer(f"{self.name}/{k}", array)
        stored = self.graph.initializer(f"{self.name}/{k}", array.astype(np.float16))
        return self.node("Cast", [stored], [self.graph.unique(f"{self.name}/{k}:float32")], to=1)[0]

    def constant(self, suffix: str, array) -> str:
        """Another initializer, "<layer>/<suffix>": a float32 array, or int64 where `array` holds integers."""
        array = np.asarray(array)
        if array.dtype.kind in "iub":
            array = array.astype(np.int64)
        elif array.dtype != np.float32:
            with np.errstate(all="ignore"):  # a value past float32's range is said by not_finite()
                array = array.astype(np.float32)
        self.computed.append((suffix, array))
        return self.graph.initializer(f"{self.name}/{suffix}", array)

    def not_finite(self) -> str:
        """A line naming the constants computed for this layer that hold Inf or NaN ("" where none does).

        Caffe computes them so too (a BatchNorm whose factor 1 / s overflows
        float32, a Power of 0 to the power -1): the model keeps them, and its
        tops hold Inf or NaN where they are used.
        """
        found = []
        for suffix, array in self.computed:
            if array.dtype.kind != "f" or array.size == 0:
                continue
            bad = ~np.isfinite(array)
            if bad.any():
                kinds = [k for k, mask in (("inf", np.isposinf(array)), ("-inf", np.isneginf(array)),
                                           ("NaN", np.isnan(array))) if mask.any()]
                found.append(f"{suffix} ({int(bad.sum())} of {array.size} value{'s' * (array.size != 1)} "
                             f"{'/'.join(kinds)})")
        if not found:
            return ""
        them = "it" if len(found) == 1 else "them"
        return (f"layer {self.name!r} ({self.layer.type}): its constant{'s' * (len(found) != 1)} {', '.join(found)}, "
                f"as Caffe computes {them} from the layer's blobs and parameters in float32; the model keeps {them}, "
                "so its output holds Inf or NaN where Caffe's does")

    def shape_constant(self, suffix: str, shape) -> str:
        return self.constant(suffix, np.asarray(list(shape), dtype=np.int64))

    def temp(self, suffix: str) -> str:
        """The name of a value between this layer's nodes."""
        return self.graph.unique(f"{self.name}/{suffix}")

    def node(self, op: str, inputs: list, outputs: list, **attributes) -> list:
        """Add a node; returns its outputs."""
        self.graph.node(op, inputs, outputs, name=f"{self.name}/{op}", **attributes)
        return outputs

    def reduce(self, op: str, x: str, axes, out: str, *, keepdims: int = 1) -> str:
        """A Reduce* node over `axes`: the axes an attribute up to its opset's change, an input after it."""
        axes = [int(a) for a in axes]
        # ReduceSum took its axes as an input from opset 13, the others from 18.
        as_input = self.opset >= (13 if op == "ReduceSum" else 18)
        if as_input:
            self.node(op, [x, self.shape_constant(f"{op}_axes", axes)], [out], keepdims=keepdims)
        else:
            self.node(op, [x], [out], axes=axes, keepdims=keepdims)
        return out

    def broadcast(self, suffix: str, array: np.ndarray, axis: int, ndim: int) -> str:
        """`array` laid along axes axis.. of an ndim-axis value (trailing ones added), as an initializer."""
        shape = tuple(array.shape) + (1,) * (ndim - axis - array.ndim)
        return self.constant(suffix, array.reshape(shape))
