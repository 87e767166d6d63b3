"""What every layer of Caffe's forward pass is here: a class per type, with Caffe's Reshape and Forward_cpu.

A layer is made from its LayerParameter (the parsed message: every
parameter of its type, with Caffe's defaults) and its blobs (float32
arrays in their stored shapes). `reshape(bottom shapes)` is Caffe's
LayerSetUp + Reshape: it checks the parameters against the bottoms and
returns the top shapes, or raises LayerError naming the layer and what is
wrong. `forward(bottoms)` is Forward_cpu: float32 arrays in, float32 arrays
out, in the shapes reshape gave. A layer never changes its bottoms, so an
in-place layer (top named as its bottom) costs one more array for as long
as both are alive; the runner drops the older one as soon as no later layer
reads it.

A type runs through its row in blobtool/net/layertypes.py (TYPES), which
names its class ("neuron.ReLU"); `@register("ReLU")` puts the class in
REGISTRY, a view of the rows that name a class, and refuses a type whose
row is missing or names another class. The runner finds a class by its
type name, and refuses a type with no class before anything is computed.
"""

from __future__ import annotations

import abc

import numpy as np

from ..errors import FormatError
from ..net.layertypes import blob_range, check_join

__all__ = ["Layer", "LayerError", "register", "REGISTRY", "FLOAT", "as_float", "canonical_axis",
           "count"]

FLOAT = np.float32  # Caffe's Dtype for a net run in float

# Type name -> Layer subclass; filled by @register as the family modules load, for the types whose
# row in TYPES names the class.
REGISTRY: dict = {}


class LayerError(FormatError):
    """A layer's parameters or bottoms are not what Caffe's Reshape accepts (exit 3)."""


def register(*names: str):
    """Class decorator: the layer class runs layers of these type names (each row in TYPES naming it)."""

    def add(cls):
        for name in names:
            check_join(name, "run", cls)
            if name in REGISTRY:
                raise TypeError(f"layer type {name!r} is registered twice")
            REGISTRY[name] = cls
        cls.types = tuple(getattr(cls, "types", ())) + names
        return cls

    return add


def as_float(x) -> np.ndarray:
    """`x` as a C-contiguous float32 array of its own shape (no copy where it is one already).

    np.ascontiguousarray would give a blob of no axes (a shared PReLU slope,
    a scalar Scale) one axis, and numpy's ufuncs hand back a bare scalar for
    one: both come back here as the 0-axis array they are.
    """
    return np.asarray(x, dtype=FLOAT, order="C")


def count(shape, start: int = 0, end: int | None = None) -> int:
    """Blob::count(start, end): the product of shape[start:end] (1 for an empty range)."""
    n = 1
    for d in tuple(shape)[start:end]:
        n *= int(d)
    return n


class _RowCount:
    """(fewest, most) blobs a layer holds, read from its type's row (net/layertypes.py blob_range), not stated here.

    On a class, the row of the first type it runs; on a layer, its own type's.
    """

    def __get__(self, layer, cls) -> tuple:
        kind = layer.type if layer is not None else next(iter(cls.types), None)
        return blob_range(kind) or (0, 0)


class Layer(abc.ABC):
    """One layer of a net, ready to run: its name, its parameters, its blobs.

    Subclasses set `bottoms` and `tops` ((min, max) counts, max None for
    any) and write reshape() and forward(); how many blobs the type holds
    is its row's (blob_count).
    """

    types: tuple = ()
    bottoms: tuple = (1, 1)
    tops: tuple = (1, 1)
    blob_count = _RowCount()

    def __init__(self, name: str, kind: str, param, blobs: list):
        self.name = name
        self.type = kind
        self.param = param                  # the LayerParameter message
        self.blobs = [as_float(b) for b in blobs]
        self.top_names = tuple(param.top) if param is not None else ()
        self.setup()

    # -- what subclasses write ------------------------------------------------------------

    def setup(self) -> None:
        """Caffe's LayerSetUp for what does not depend on the bottoms (parameters read, checked)."""

    def reshape(self, shapes: list) -> list:
        """The top shapes for bottoms of `shapes` (tuples), as Caffe's Reshape; LayerError where it refuses."""
        return [tuple(shapes[0])]

    def workspace(self, shapes: list) -> tuple:
        """(values, what) of the largest array forward() makes besides its tops, for bottoms of `shapes`.

        The runner counts it with the blobs alive at that step and refuses a
        layer whose working array would pass a blob's limit (a pad of 2^20
        asks for terabytes of padded input where the top is 2 x 2). Most
        layers make nothing larger than their tops: (0, "").
        """
        return 0, ""

    @abc.abstractmethod
    def forward(self, xs: list) -> list:
        """Caffe's Forward_cpu: the tops' float32 arrays from the bottoms' (which it never changes)."""

    # -- shared ---------------------------------------------------------------------------

    def error(self, what: str) -> LayerError:
        """LayerError naming this layer and its type."""
        return LayerError(f"layer {self.name!r} ({self.type}): {what}")

    def check_counts(self, nbottoms: int, ntops: int) -> None:
        """Refuse a layer wired with a count of bottoms or tops Caffe's type does not take."""
        for what, n, (low, high) in (("bottom", nbottoms, self.bottoms), ("top", ntops, self.tops)):
            if n < low or (high is not None and n > high):
                wanted = str(low) if high == low else (f"{low} or more" if high is None else f"{low} to {high}")
                raise self.error(f"has {n} {what}{'s' if n != 1 else ''}, expected {wanted}")
        low, high = self.blob_count
        if len(self.blobs) < low or (high is not None and len(self.blobs) > high):
            wanted = str(low) if high == low else f"{low} to {high}"
            raise self.error(f"holds {len(self.blobs)} blobs, expected {wanted}")

    def axis(self, axis: int, ndim: int, what: str = "axis") -> int:
        """Blob::CanonicalAxisIndex: a negative axis counts from the end; out of range is an error."""
        return canonical_axis(axis, ndim, lambda text: self.error(f"{what} {text}"))

    def blob_shape(self, k: int, shape: tuple) -> None:
        """Refuse blob k unless it holds `shape` (Caffe checks the count or the shape where it reads a blob)."""
        got = self.blobs[k].shape
        if tuple(got) != tuple(shape):
            raise self.error(f"blob {k} has shape {tuple(got)}, expected {tuple(shape)}")


def canonical_axis(axis: int, ndim: int, fail) -> int:
    """Caffe's CanonicalAxisIndex; `fail(text)` makes the error to raise."""
    if not -ndim <= axis < ndim:
        raise fail(f"{axis} is out of range for a {ndim}-axis blob")
    return axis + ndim if axis < 0 else axis
