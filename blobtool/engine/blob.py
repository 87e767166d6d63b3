"""Blob: an N-D array of float32 or float64 with data, diff and Caffe's math.

Mirrors Caffe's Blob (include/caffe/blob.hpp, src/caffe/blob.cpp): a shape of
at most 32 axes, two SyncedMemory blocks (data and diff), legacy 4-D
accessors, and asum/sumsq/scale/update that run where the data's head is.

Where blobtool differs from Caffe, on purpose:

- asum and sumsq accumulate in float64 for float32 blobs too (more accurate);
  they return Python floats.
- Blob counts are not capped at INT_MAX, so payloads over 2 GiB load.
- Index checks are strict (Caffe's 4-argument offset() lets n == num through).
- The diff may be held in a wider type than the data (`diff_dtype`): a file
  may store float data with a double diff (a BlobProto's data beside
  double_diff, an F32 tensor beside an F64 "<name>/diff"), and narrowing it
  would turn values past float32's range into Inf. Caffe's Blob<Dtype> has
  one type for both; a Blob made in Python has one too unless asked.
"""

from __future__ import annotations

import operator

import numpy as np

from . import kernels
from ..errors import FormatError, UsageError
from .syncedmem import SyncedHead, SyncedMemory

__all__ = ["Blob", "MAX_BLOB_AXES", "LEGACY_FIELDS", "proto_shape", "legacy_shapes_equal", "DTYPES"]

# Caffe's kMaxBlobAxes.
MAX_BLOB_AXES = 32
# The largest array numpy can describe, in bytes (its index type).
_MAX_EXTENT = int(np.iinfo(np.intp).max)

# The deprecated BlobProto fields that, when any is present, define the shape.
LEGACY_FIELDS = ("num", "channels", "height", "width")

DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

_DATA, _DIFF = "data", "diff"


def _check_dtype(dtype) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in DTYPES:
        raise UsageError(f"Blob dtype must be float32 or float64, got {dt}")
    return dt.newbyteorder("=")


def _normalize_shape(args) -> tuple[int, ...]:
    """Accept Blob(2, 3), Blob([2, 3]), Blob((2, 3)), a BlobShape message, or ()."""
    if len(args) == 1 and not isinstance(args[0], (int, np.integer)):
        shape = args[0]
        if hasattr(shape, "dim"):  # a BlobShape message
            shape = list(shape.dim)
        try:
            shape = list(shape)
        except TypeError as exc:
            raise UsageError(f"a shape must be a sequence of ints, got {type(shape).__name__}") from exc
    else:
        shape = list(args)
    try:
        dims = tuple(operator.index(d) for d in shape)
    except TypeError as exc:
        raise UsageError(f"shape dimensions must be integers, got {shape!r}") from exc
    return dims


def proto_shape(proto) -> tuple[tuple[int, ...], str]:
    """The shape a BlobProto message describes, and its layout ("legacy" or "shape").

    Caffe's rule (Blob::FromProto): when any of num/channels/height/width is
    present the shape is those four (absent ones 0, their default); otherwise
    it is shape.dim.
    """
    if any(proto.HasField(name) for name in LEGACY_FIELDS):
        return tuple(int(getattr(proto, name)) for name in LEGACY_FIELDS), "legacy"
    return tuple(int(d) for d in proto.shape.dim), "shape"


def legacy_shapes_equal(shape_a, shape_b) -> bool:
    """Caffe's ShapeEquals rule where a legacy 4-D shape is involved.

    Legacy dims compare from the end: a shape of at most 4 axes equals the
    4-D shape it pads to with leading 1s ((3, 2) equals 1 x 1 x 3 x 2); a
    shape of more than 4 axes equals no legacy shape.
    """
    shape_a, shape_b = tuple(shape_a), tuple(shape_b)
    if len(shape_a) > 4 or len(shape_b) > 4:
        return False
    return (1,) * (4 - len(shape_a)) + shape_a == (1,) * (4 - len(shape_b)) + shape_b


class Blob:
    """An N-D float32/float64 array with data and diff (mirrors caffe::Blob).

    Memory is allocated lazily by the SyncedMemory blocks; asum/sumsq of
    memory never written are 0, as in Caffe.

    Parameters
    ----------
    *dims : int, or one sequence of ints
        ``Blob()`` is empty (0 axes, count 0); ``Blob(2, 3, 4, 5)``;
        ``Blob([3, 2])``.
    dtype : numpy.float32 or numpy.float64
    diff_dtype : numpy.float32, numpy.float64 or None
        The diff's type; None (the default) makes it `dtype`, as in Caffe,
        whose Blob<Dtype> has one type. A blob read from a file whose diff
        is stored wider than its data (float data, double diff) holds each
        side in its own type, so that no diff value is narrowed (a blobtool
        extension).

    Attributes
    ----------
    origin : blobtool.formats.origin.Origin or None
        How the blob was stored, for a blob read from a file (its layout,
        stored dtype and whether it had a diff); None for a blob made in
        Python. Writers keep the stored form unless told otherwise.
    """

    def __init__(self, *dims, dtype=np.float32, diff_dtype=None):
        self._dtype = _check_dtype(dtype)
        self._diff_dtype = self._dtype if diff_dtype is None else _check_dtype(diff_dtype)
        self._shape: tuple[int, ...] = ()
        self._count = 0
        self._capacity = 0
        self._data: SyncedMemory | None = None
        self._diff: SyncedMemory | None = None
        self.origin = None  # how it was stored (formats.origin.Origin), for a blob read from a file
        if dims:
            self.reshape(*dims)

    # -- shape -------------------------------------------------------------

    def reshape(self, *dims) -> None:
        """Change the shape; reallocates only when the count grows past capacity.

        Mirrors Blob::Reshape: at most 32 axes, no negative dimension;
        ``reshape([])`` makes a scalar of count 1.
        """
        shape = _normalize_shape(dims)
        if len(shape) > MAX_BLOB_AXES:
            raise UsageError(f"a blob has at most {MAX_BLOB_AXES} axes, got {len(shape)}")
        count = 1
        extent = max(self._dtype.itemsize, self._diff_dtype.itemsize)  # bytes spanned by the non-zero dimensions
        for axis, d in enumerate(shape):
            if d < 0:
                raise UsageError(f"dimension {axis} is negative ({d}) in shape {shape}")
            count *= d
            extent *= max(d, 1)
        # numpy refuses such a shape even with a zero dimension in it; Caffe
        # caps counts at INT_MAX, blobtool at what numpy can address.
        if extent > _MAX_EXTENT:
            raise UsageError(f"shape {shape} spans {extent} bytes of {self._wider.name}, "
                             f"more than the {_MAX_EXTENT} an array can address")
        self._shape = shape
        self._count = count
        if count > self._capacity:
            self._capacity = count
            self._data = SyncedMemory(count * self._dtype.itemsize)
            self._diff = SyncedMemory(count * self._diff_dtype.itemsize)

    def reshape_like(self, other: "Blob") -> None:
        """Take `other`'s shape (Blob::ReshapeLike)."""
        self.reshape(other.shape)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def num_axes(self) -> int:
        return len(self._shape)

    @property
    def count(self) -> int:
        """Number of elements (Caffe's count())."""
        return self._count

    @property
    def dtype(self) -> np.dtype:
        """The data's type (and the diff's, unless diff_dtype says otherwise)."""
        return self._dtype

    @property
    def diff_dtype(self) -> np.dtype:
        """The diff's type: the data's, or a wider one for a diff stored wider than its data."""
        return self._diff_dtype

    @property
    def _wider(self) -> np.dtype:
        return self._diff_dtype if self._diff_dtype.itemsize > self._dtype.itemsize else self._dtype

    def _side_dtype(self, which: str) -> np.dtype:
        return self._dtype if which == _DATA else self._diff_dtype

    def _side_nbytes(self, which: str) -> int:
        return self._count * self._side_dtype(which).itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of data (count times the element size)."""
        return self._count * self._dtype.itemsize

    def count_range(self, start: int, end: int | None = None) -> int:
        """Product of dimensions start..end-1 (Blob::count(start, end))."""
        end = self.num_axes if end is None else end
        if not 0 <= start <= end <= self.num_axes:
            raise UsageError(f"count({start}, {end}) out of range for {self.num_axes} axes")
        n = 1
        for d in self._shape[start:end]:
            n *= d
        return n

    def canonical_axis_index(self, axis: int) -> int:
        """Map a negative axis to its positive index (Blob::CanonicalAxisIndex)."""
        if not -self.num_axes <= axis < max(self.num_axes, 1) or (self.num_axes == 0):
            raise UsageError(f"axis {axis} out of range for a {self.num_axes}-axis blob")
        return axis + self.num_axes if axis < 0 else axis

    def legacy_shape(self, index: int) -> int:
        """Blob::LegacyShape: dimension `index` in [-4, 3], padded with 1.

        Raises BlobToolError on blobs with more than 4 axes.
        """
        if self.num_axes > 4:
            raise UsageError(f"cannot use legacy accessors on a blob with {self.num_axes} axes (> 4)")
        if not -4 <= index < 4:
            raise UsageError(f"legacy axis index {index} outside [-4, 3]")
        if index >= self.num_axes or index < -self.num_axes:
            return 1
        return self._shape[index]

    @property
    def num(self) -> int:
        return self.legacy_shape(0)

    @property
    def channels(self) -> int:
        return self.legacy_shape(1)

    @property
    def height(self) -> int:
        return self.legacy_shape(2)

    @property
    def width(self) -> int:
        return self.legacy_shape(3)

    def offset(self, n, c: int = 0, h: int = 0, w: int = 0) -> int:
        """Flat index of (n, c, h, w), or of a sequence of indices (Blob::offset)."""
        if isinstance(n, (list, tuple)):
            indices = list(n)
            if len(indices) > self.num_axes:
                raise UsageError(f"{len(indices)} indices for a {self.num_axes}-axis blob")
            off = 0
            for axis in range(self.num_axes):
                off *= self._shape[axis]
                if axis < len(indices):
                    i = indices[axis]
                    if not 0 <= i < self._shape[axis]:
                        raise UsageError(f"index {i} out of range for axis {axis} of size {self._shape[axis]}")
                    off += i
            return off
        dims = (self.num, self.channels, self.height, self.width)
        for name, i, d in zip("nchw", (n, c, h, w), dims):
            if not 0 <= i < d:
                raise UsageError(f"{name}={i} out of range [0, {d})")
        return ((n * dims[1] + c) * dims[2] + h) * dims[3] + w

    def shape_string(self) -> str:
        """"2 3 4 5 (120)", as Caffe logs a shape (Blob::shape_string).

        Each dimension is followed by a blank, then the count in parentheses:
        "(1)" for a scalar (0 axes), "(0)" for an empty Blob.
        """
        return "".join(f"{d} " for d in self._shape) + f"({self._count})"

    def shape_equals(self, proto) -> bool:
        """Blob::ShapeEquals: compare with a BlobProto's shape.

        Legacy dims compare from the end, so shape (3, 2) equals legacy
        1 x 1 x 3 x 2.
        """
        shape, layout = proto_shape(proto)
        if layout == "legacy":
            return legacy_shapes_equal(self._shape, shape)
        return self._shape == shape

    # -- memory ------------------------------------------------------------

    def _mem(self, which: str) -> SyncedMemory | None:
        return self._data if which == _DATA else self._diff

    @property
    def data_memory(self) -> SyncedMemory | None:
        """The SyncedMemory behind data (Caffe's data()); None for an empty blob."""
        return self._data

    @property
    def diff_memory(self) -> SyncedMemory | None:
        """The SyncedMemory behind diff (Caffe's diff()); None for an empty blob."""
        return self._diff

    def _host_view(self, which: str, mutable: bool) -> np.ndarray:
        mem = self._mem(which)
        dtype = self._side_dtype(which)
        if mem is None:
            out = np.zeros(0, dtype=dtype)
            out.flags.writeable = mutable
            return out
        raw = mem.mutable_cpu_data() if mutable else mem.cpu_data()
        return raw[: self._side_nbytes(which)].view(dtype)

    def _device_view(self, which: str, mutable: bool):
        mem = self._mem(which)
        if mem is None:
            raise UsageError("an empty blob has no device memory")
        raw = mem.mutable_gpu_data() if mutable else mem.gpu_data()
        return raw[: self._side_nbytes(which)].view(self._side_dtype(which))

    def cpu_data(self) -> np.ndarray:
        """Read-only flat view of the data's `count` elements (copies from the GPU if newer)."""
        return self._host_view(_DATA, False)

    def cpu_diff(self) -> np.ndarray:
        """Read-only flat view of the diff's `count` elements."""
        return self._host_view(_DIFF, False)

    def mutable_cpu_data(self) -> np.ndarray:
        """Writable flat view of the data; the data's head becomes HEAD_AT_CPU."""
        return self._host_view(_DATA, True)

    def mutable_cpu_diff(self) -> np.ndarray:
        """Writable flat view of the diff; the diff's head becomes HEAD_AT_CPU."""
        return self._host_view(_DIFF, True)

    def gpu_data(self):
        """Flat device view of the data (needs a GPU backend)."""
        return self._device_view(_DATA, False)

    def gpu_diff(self):
        """Flat device view of the diff (needs a GPU backend)."""
        return self._device_view(_DIFF, False)

    def mutable_gpu_data(self):
        """Writable flat device view of the data; the head becomes HEAD_AT_GPU."""
        return self._device_view(_DATA, True)

    def mutable_gpu_diff(self):
        """Writable flat device view of the diff; the head becomes HEAD_AT_GPU."""
        return self._device_view(_DIFF, True)

    @property
    def data(self) -> np.ndarray:
        """Writable view of the data in the blob's shape (as pycaffe's Blob.data)."""
        return self.mutable_cpu_data().reshape(self._shape)

    @property
    def diff(self) -> np.ndarray:
        """Writable view of the diff in the blob's shape (as pycaffe's Blob.diff)."""
        return self.mutable_cpu_diff().reshape(self._shape)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """The data in the blob's shape, so that ``np.asarray(blob)`` is an array of its values.

        A read-only view in the stored dtype (no copy, no change of the
        head) unless `dtype` asks for another type or `copy` is True;
        ``copy=False`` with a dtype that needs a conversion raises ValueError
        (numpy 2's protocol). An empty Blob gives an array of shape (0,).
        """
        values = self.cpu_data()
        values = values.reshape(self._shape) if self._count or self._shape else values
        if dtype is not None and np.dtype(dtype) != values.dtype:
            if copy is False:
                raise ValueError(f"a {values.dtype} blob cannot be viewed as {np.dtype(dtype)} without a copy")
            return values.astype(dtype)
        return values.copy() if copy else values

    def _at(self, which: str, index) -> float:
        return self._host_view(which, False)[index].item()

    def data_at(self, n, c: int = 0, h: int = 0, w: int = 0) -> float:
        """data[offset(n, c, h, w)] (Blob::data_at); n may be a sequence of indices."""
        return self._at(_DATA, self.offset(n, c, h, w))

    def diff_at(self, n, c: int = 0, h: int = 0, w: int = 0) -> float:
        """diff[offset(n, c, h, w)] (Blob::diff_at)."""
        return self._at(_DIFF, self.offset(n, c, h, w))

    def set_cpu_data(self, array) -> None:
        """Adopt `array` (count elements of the blob's dtype) as the data, without copying."""
        self._adopt(_DATA, array)

    def set_cpu_diff(self, array) -> None:
        """Adopt `array` (count elements of diff_dtype) as the diff, without copying."""
        self._adopt(_DIFF, array)

    def _adopt(self, which: str, array) -> None:
        array = np.asarray(array)
        dtype = self._side_dtype(which)
        if array.dtype != dtype:
            raise UsageError(f"set_cpu_{which}: array dtype {array.dtype} differs from the blob's {dtype}")
        if array.size != self._count:
            raise UsageError(f"set_cpu_{which}: array has {array.size} elements, the blob {self._count}")
        mem = self._mem(which)
        if mem is None:
            return
        if mem.size != self._side_nbytes(which):
            # Blob::set_cpu_data / set_cpu_diff: a blob shrunk below its
            # capacity gets memory of exactly count elements (data and diff
            # for the data, the diff alone for the diff) so the buffer fits.
            if which == _DATA:
                self._data = SyncedMemory(self.nbytes)
            self._diff = SyncedMemory(self._side_nbytes(_DIFF))
            # Growing again must reallocate rather than read past the buffer.
            self._capacity = self._count
        self._mem(which).set_cpu_data(array)

    def share_data(self, other: "Blob") -> None:
        """Use `other`'s data memory (Blob::ShareData); the counts must match."""
        self._share(_DATA, other)

    def share_diff(self, other: "Blob") -> None:
        """Use `other`'s diff memory (Blob::ShareDiff); the counts must match."""
        self._share(_DIFF, other)

    def _share(self, which: str, other: "Blob") -> None:
        if other.count != self._count:
            raise UsageError(f"share_{which}: counts differ ({self._count} vs {other.count})")
        mine, theirs = self._side_dtype(which), other._side_dtype(which)
        if mine != theirs:
            raise UsageError(f"share_{which}: dtypes differ ({mine} vs {theirs})")
        if which == _DATA:
            self._data = other._data
        else:
            self._diff = other._diff

    # -- math: runs where the head is (Caffe's switch) ----------------------

    def _where(self, which: str) -> str | None:
        """"cpu", "gpu", or None when there is nothing to compute on."""
        mem = self._mem(which)
        if mem is None or mem.head is SyncedHead.UNINITIALIZED:
            return None
        if mem.head is SyncedHead.HEAD_AT_CPU:
            return "cpu"
        return "gpu"  # HEAD_AT_GPU or SYNCED

    def _math(self, which: str, mutable: bool):
        """(the side's values where its head is, the kernels or device backend whose math runs there), or None."""
        where = self._where(which)
        if where is None:
            return None
        if where == "cpu":
            return self._host_view(which, mutable), kernels
        return self._device_view(which, mutable), self._mem(which)._gpu_backend

    def _asum_sumsq(self, which: str) -> tuple[float, float]:
        found = self._math(which, False)
        return (0.0, 0.0) if found is None else found[1].asum_sumsq(found[0])

    def asum_data(self) -> float:
        """Sum of |data| (Blob::asum_data), float64 accumulation; 0 if never written."""
        return self._asum_sumsq(_DATA)[0]

    def asum_diff(self) -> float:
        """Sum of |diff| (Blob::asum_diff)."""
        return self._asum_sumsq(_DIFF)[0]

    def sumsq_data(self) -> float:
        """Sum of data squared (Blob::sumsq_data), float64 accumulation."""
        return self._asum_sumsq(_DATA)[1]

    def sumsq_diff(self) -> float:
        """Sum of diff squared (Blob::sumsq_diff)."""
        return self._asum_sumsq(_DIFF)[1]

    def asum_sumsq_data(self) -> tuple[float, float]:
        """(asum_data(), sumsq_data()) in one pass over the data (blobtool extension)."""
        return self._asum_sumsq(_DATA)

    def asum_sumsq_diff(self) -> tuple[float, float]:
        """(asum_diff(), sumsq_diff()) in one pass over the diff (blobtool extension)."""
        return self._asum_sumsq(_DIFF)

    def _scale(self, which: str, factor: float) -> None:
        found = self._math(which, True)
        if found is not None:
            found[1].scal(found[0], factor)

    def scale_data(self, factor: float) -> None:
        """data *= factor in the blob's dtype (Blob::scale_data)."""
        self._scale(_DATA, factor)

    def scale_diff(self, factor: float) -> None:
        """diff *= factor in the diff's dtype (Blob::scale_diff)."""
        self._scale(_DIFF, factor)

    def update(self) -> None:
        """data -= diff (Blob::Update), on the device when the data's head is there.

        Computed in the data's dtype, as Caffe's caffe_axpy<Dtype>: a diff
        held wider than the data is first rounded to the data's type (a
        value past its range becomes Inf there, as Caffe's cast makes it).
        """
        where = self._where(_DATA)
        if where is None:
            raise UsageError("update: the blob's data was never initialised")
        diff = self._host_view(_DIFF, False) if where == "cpu" else self._device_view(_DIFF, False)
        data, math = self._math(_DATA, True)
        if diff.dtype != data.dtype:
            with np.errstate(over="ignore", invalid="ignore"):
                diff = diff.astype(data.dtype)
        math.axpy(-1.0, diff, data)

    # -- protobuf ------------------------------------------------------------

    def from_proto(self, proto, reshape: bool = True) -> None:
        """Fill the blob from a BlobProto message (Blob::FromProto).

        Accepts any protobuf message with BlobProto's fields (blobtool's own
        or a caffe_pb2 of the user's). The values are copied and converted to
        the blob's dtype (the diff to diff_dtype); double_data wins over data
        when it is non-empty.
        """
        shape, _ = proto_shape(proto)
        data = _repeated(proto, "double_data", np.float64)
        if data is None:
            data = np.asarray(proto.data, dtype=np.float32)
        diff = _repeated(proto, "double_diff", np.float64)
        if diff is None:
            diff = _repeated(proto, "diff", np.float32)
        self.fill_from(shape, data, diff, reshape=reshape, shape_proto=proto)

    def fill_from(self, shape, data: np.ndarray, diff: np.ndarray | None, *,
                  reshape: bool = True, shape_proto=None, adopt: bool = False) -> None:
        """The body of FromProto once the arrays are found; used by from_proto and the codec.

        With `adopt`, arrays already in the side's dtype (dtype, diff_dtype)
        are adopted without a copy (set_cpu_data); otherwise values are copied.
        """
        if reshape:
            try:
                self.reshape(shape)
            except UsageError as exc:
                raise FormatError(f"invalid blob shape: {exc.reason}") from exc
        elif shape_proto is not None and not self.shape_equals(shape_proto):
            raise FormatError(f"shape mismatch (reshape not set): blob is {self._shape}, proto is {tuple(shape)}")
        elif shape_proto is None and tuple(shape) != self._shape:
            raise FormatError(f"shape mismatch (reshape not set): blob is {self._shape}, proto is {tuple(shape)}")
        for which, values in ((_DATA, data), (_DIFF, diff)):
            if values is None:
                continue
            if values.size != self._count:
                raise FormatError(
                    f"{which} holds {values.size} values, shape {self._shape} needs {self._count}"
                )
            if self._count == 0:
                continue
            if adopt and values.dtype == self._side_dtype(which) and values.flags.c_contiguous:
                self._adopt(which, values)
            else:
                # Out-of-range doubles become inf, as Caffe's cast makes them.
                with np.errstate(over="ignore", invalid="ignore"):
                    np.copyto(self._host_view(which, True), values.reshape(-1), casting="unsafe")

    def to_proto(self, write_diff: bool = False, proto=None):
        """Return a BlobProto holding this blob (Blob::ToProto).

        Writes `shape`, then data (float32 blob) or double_data (float64
        blob), and diff/double_diff (by diff_dtype) when `write_diff`. Builds a blobtool
        message unless `proto` (any BlobProto-like message) is given; it is
        cleared first.
        """
        if proto is None:  # protobuf loads only here, where a message is made
            from .._pb.blobtool_caffe_pb2 import BlobProto
            proto = BlobProto()
        proto.Clear()
        if self._shape:  # Caffe writes no shape field for a 0-axis blob
            proto.shape.dim.extend(self._shape)
        values_field = "double_data" if self._dtype == np.float64 else "data"
        diff_field = "double_diff" if self._diff_dtype == np.float64 else "diff"
        getattr(proto, values_field).extend(self.cpu_data().tolist())
        if write_diff:
            getattr(proto, diff_field).extend(self.cpu_diff().tolist())
        return proto

    def __repr__(self) -> str:
        diff = f", diff_dtype={self._diff_dtype.name}" if self._diff_dtype != self._dtype else ""
        return f"Blob(shape={self._shape}, dtype={self._dtype.name}{diff})"


def _repeated(proto, name: str, dtype) -> np.ndarray | None:
    values = getattr(proto, name)
    if len(values) == 0:
        return None
    return np.asarray(values, dtype=dtype)
