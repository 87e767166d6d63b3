"""Caffe's layers that move values and compute none: Concat, Slice, Split, Flatten, Reshape, Crop, Tile, and more.

The others are caffe-ssd's Permute and the forks' ShuffleChannel. Each
class mirrors Caffe's src/caffe/layers/<name>_layer.cpp (BVLC; Permute is
weiliu89/caffe's permute_layer.cpp of caffe-ssd; ShuffleChannel is
farmingyard/ShuffleNet's shuffle_channel_layer.cpp, copied by the forks
that run ShuffleNet), with Caffe's checks and their error cases. Where Caffe
shares the bottom's memory (Split, Flatten, Reshape; Concat and Slice of one
blob; a Permute that keeps the order) the top here is a view of the bottom:
no layer writes into its bottoms, so the sharing is safe, and it costs no
copy. Every other top is a new C-contiguous float32 array.
"""

from __future__ import annotations

import numpy as np

from .base import FLOAT, Layer, count, register

__all__ = ["Concat", "Slice", "Split", "Flatten", "Reshape", "Crop", "Tile", "Permute", "ShuffleChannel"]

# Blob's kMaxBlobAxes (blob.hpp): the most axes a blob has, and the bound of concat_dim / slice_dim.
MAX_BLOB_AXES = 32


def _contiguous(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=FLOAT)


def _refuse_in_place(layer: Layer) -> None:
    """Caffe's CHECK_NE(top[0], bottom[0]): this type does not allow in-place computation."""
    shared = set(layer.param.bottom) & set(layer.top_names)
    if shared:
        raise layer.error(f"writes its bottom {sorted(shared)[0]!r} in place; Caffe's {layer.type} layer does "
                          "not allow in-place computation")


def _legacy_dim(layer: Layer, value: int, ndim: int, what: str) -> int:
    """concat_dim / slice_dim: a uint32 read as int, never counted from the end (Caffe's check)."""
    if value >= 2 ** 31:
        raise layer.error(f"{what} {value} is negative as Caffe reads it (a uint32 cast to int); {what} must "
                          f"satisfy 0 <= {what} < {MAX_BLOB_AXES}")
    if value >= ndim:
        raise layer.error(f"{what} {value} is out of range for a {ndim}-axis blob")
    return value


@register("Concat")
class Concat(Layer):
    """ConcatLayer (concat_layer.cpp): the bottoms joined along `axis`; every other axis must agree.

    `concat_dim` is the legacy spelling of the axis (never negative); a layer
    may give one of the two, not both.
    """

    bottoms = (1, None)

    def setup(self) -> None:
        p = self.param.concat_param
        if p.HasField("axis") and p.HasField("concat_dim"):
            raise self.error("gives both axis and concat_dim; Caffe takes one of them")
        self.legacy = p.HasField("concat_dim")
        self.value = int(p.concat_dim) if self.legacy else int(p.axis)

    def reshape(self, shapes: list) -> list:
        first = tuple(shapes[0])
        ndim = len(first)
        self.at = (_legacy_dim(self, self.value, ndim, "concat_dim") if self.legacy
                   else self.axis(self.value, ndim))
        total = first[self.at]
        for k, shape in enumerate(shapes[1:], start=1):
            shape = tuple(shape)
            if len(shape) != ndim:
                raise self.error(f"bottom {k} has {len(shape)} axes {shape}, bottom 0 has {ndim} {first}; all "
                                 "inputs must have the same number of axes")
            for j in range(ndim):
                if j != self.at and shape[j] != first[j]:
                    raise self.error(f"bottom {k} has shape {shape}, bottom 0 {first}: all inputs must have the "
                                     f"same shape except at the concat axis {self.at} (they differ at axis {j})")
            total += shape[self.at]
        return [first[:self.at] + (total,) + first[self.at + 1:]]

    def forward(self, xs: list) -> list:
        if len(xs) == 1:
            return [xs[0]]      # Caffe shares the one bottom's data
        return [_contiguous(np.concatenate(xs, axis=self.at))]


@register("Slice")
class Slice(Layer):
    """SliceLayer (slice_layer.cpp): the bottom cut along `axis` at each `slice_point`, one piece per top.

    Without slice points the axis is split into as many equal pieces as
    there are tops (it must divide evenly). `slice_dim` is the legacy
    spelling of the axis (never negative).
    """

    tops = (1, None)

    def setup(self) -> None:
        p = self.param.slice_param
        if p.HasField("axis") and p.HasField("slice_dim"):
            raise self.error("gives both axis and slice_dim; Caffe takes one of them")
        self.legacy = p.HasField("slice_dim")
        self.value = int(p.slice_dim) if self.legacy else int(p.axis)
        self.points = [int(v) for v in p.slice_point]

    def reshape(self, shapes: list) -> list:
        shape = tuple(shapes[0])
        ndim = len(shape)
        self.at = (_legacy_dim(self, self.value, ndim, "slice_dim") if self.legacy
                   else self.axis(self.value, ndim))
        size = shape[self.at]
        ntops = len(self.top_names)
        if self.points:
            if len(self.points) != ntops - 1:
                raise self.error(f"has {len(self.points)} slice points for {ntops} tops; Caffe wants one fewer "
                                 "point than tops")
            if ntops > size:
                raise self.error(f"has {ntops} tops, more than the {size} values of axis {self.at} to slice")
            prev = 0
            for point in self.points:
                if point <= prev:
                    raise self.error(f"slice points {self.points} are not increasing from 0: each must be "
                                     "greater than the one before it (and the first greater than 0)")
                prev = point
            if prev > size:
                raise self.error(f"slice point {prev} is past the end of axis {self.at} (size {size})")
            edges = [0] + self.points + [size]
            sizes = [b - a for a, b in zip(edges, edges[1:])]
        else:
            if size % ntops:
                raise self.error(f"{ntops} tops do not evenly divide axis {self.at} of size {size}; give "
                                 "slice_point for unequal pieces")
            sizes = [size // ntops] * ntops
        self.edges = np.cumsum([0] + sizes).tolist()
        return [shape[:self.at] + (n,) + shape[self.at + 1:] for n in sizes]

    def forward(self, xs: list) -> list:
        x = xs[0]
        if len(self.edges) == 2:
            return [x]          # one top: Caffe shares the bottom's data
        index = [slice(None)] * x.ndim
        pieces = []
        for a, b in zip(self.edges, self.edges[1:]):
            index[self.at] = slice(a, b)
            pieces.append(_contiguous(x[tuple(index)]))
        return pieces


@register("Split")
class Split(Layer):
    """SplitLayer (split_layer.cpp): every top is the bottom (Caffe shares its data with each)."""

    tops = (1, None)

    def setup(self) -> None:
        _refuse_in_place(self)

    def reshape(self, shapes: list) -> list:
        return [tuple(shapes[0])] * len(self.top_names)

    def forward(self, xs: list) -> list:
        return [xs[0]] * len(self.top_names)


@register("Flatten")
class Flatten(Layer):
    """FlattenLayer (flatten_layer.cpp): axes `axis` .. `end_axis` (both counted from the end when negative) made one.

    The data is shared, as Caffe's ShareData does; only the shape changes.
    """

    def setup(self) -> None:
        _refuse_in_place(self)
        p = self.param.flatten_param
        self.start, self.end = int(p.axis), int(p.end_axis)

    def reshape(self, shapes: list) -> list:
        shape = tuple(shapes[0])
        start = self.axis(self.start, len(shape), "axis")
        end = self.axis(self.end, len(shape), "end_axis")
        # Blob::count(start, end + 1) CHECKs start <= end + 1; end == start - 1 inserts an axis of 1.
        if end + 1 < start:
            raise self.error(f"end_axis {self.end} (axis {end}) comes before axis {self.start} (axis {start})")
        self.shape = shape[:start] + (count(shape, start, end + 1),) + shape[end + 1:]
        return [self.shape]

    def forward(self, xs: list) -> list:
        return [xs[0].reshape(self.shape)]


@register("Reshape")
class Reshape(Layer):
    """ReshapeLayer (reshape_layer.cpp): axes `axis` .. `axis + num_axes` replaced by reshape_param's shape.

    In the new shape 0 copies the bottom's dimension at the same place and
    one -1 is inferred from the count. A negative `axis` counts from the end
    with -1 meaning after the last axis; `num_axes` -1 takes every axis from
    `axis` on. The data is shared (Caffe's ShareData); only the shape changes.
    """

    def setup(self) -> None:
        _refuse_in_place(self)
        p = self.param.reshape_param
        self.dims = [int(d) for d in p.shape.dim]
        self.start_param, self.num_axes = int(p.axis), int(p.num_axes)
        self.copy_axes = [i for i, d in enumerate(self.dims) if d == 0]
        inferred = [i for i, d in enumerate(self.dims) if d == -1]
        if len(inferred) > 1:
            raise self.error(f"new shape {self.dims} contains multiple -1 dims; at most one -1 may be given")
        bad = [d for d in self.dims if d < -1]
        if bad:
            raise self.error(f"new shape {self.dims} has dimension {bad[0]}; a dimension is positive, 0 (copy) "
                             "or -1 (infer)")
        self.inferred = inferred[0] if inferred else None
        self.constant = count([d for d in self.dims if d > 0])

    def reshape(self, shapes: list) -> list:
        shape = tuple(shapes[0])
        ndim = len(shape)
        # reshape_layer.cpp: a negative axis counts so that -1 is the position after the last axis.
        start = self.start_param if self.start_param >= 0 else ndim + self.start_param + 1
        if not 0 <= start <= ndim:
            raise self.error(f"axis {self.start_param} is out of range for a {ndim}-axis bottom {shape}")
        if self.num_axes < -1:
            raise self.error(f"num_axes {self.num_axes} must be >= 0, or -1 for all")
        end = ndim if self.num_axes == -1 else start + self.num_axes
        if end > ndim:
            raise self.error(f"end axis = axis {start} + num_axes {self.num_axes} is out of range for a "
                             f"{ndim}-axis bottom {shape}")
        top = list(shape[:start]) + list(self.dims) + list(shape[end:])
        for i in self.copy_axes:
            if start + i >= ndim:
                raise self.error(f"new shape {self.dims} has a 0 at position {i}, but the bottom {shape} has no "
                                 f"axis {start + i} to copy")
            top[start + i] = shape[start + i]
        total = count(shape)
        if self.inferred is not None:
            explicit = self.constant * count(shape, 0, start) * count(shape, end)
            explicit *= count([top[start + i] for i in self.copy_axes])
            if explicit == 0 or total % explicit:
                raise self.error(f"bottom count ({total}) of {shape} must be divisible by the product of the "
                                 f"specified dimensions ({explicit}) of new shape {self.dims}")
            top[start + self.inferred] = total // explicit
        if count(top) != total:
            raise self.error(f"output count {count(top)} of {tuple(top)} must match the bottom's count {total} "
                             f"of {shape}")
        self.shape = tuple(top)
        return [self.shape]

    def forward(self, xs: list) -> list:
        return [xs[0].reshape(self.shape)]


@register("Crop")
class Crop(Layer):
    """CropLayer (crop_layer.cpp): bottom 0 cut to bottom 1's size on every axis from `axis` on.

    `offset` is one value for every cropped axis, one per cropped axis, or
    none (0). Axes before `axis` keep bottom 0's size.
    """

    bottoms = (2, 2)

    def setup(self) -> None:
        p = self.param.crop_param
        self.start_param = int(p.axis)
        self.offsets = [int(v) for v in p.offset]

    def reshape(self, shapes: list) -> list:
        data, like = tuple(shapes[0]), tuple(shapes[1])
        ndim = len(data)
        start = self.axis(self.start_param, ndim, "crop axis")
        if len(self.offsets) > 1 and start + len(self.offsets) != ndim:
            raise self.error(f"gives {len(self.offsets)} offsets for the {ndim - start} axes from axis {start} "
                             f"of {data}; give one offset, or one per cropped axis")
        if len(like) < ndim:
            raise self.error(f"bottom 1 {like} has fewer axes than bottom 0 {data}; it gives the size of every "
                             f"axis from {start} on")
        self.begin = [0] * ndim
        top = list(data)
        for i in range(start, ndim):
            offset = self.offsets[0] if len(self.offsets) == 1 else (
                self.offsets[i - start] if self.offsets else 0)
            if data[i] - offset < like[i]:
                raise self.error(f"the crop of axis {i} is out of bounds: size {like[i]} at offset {offset} "
                                 f"does not fit in bottom 0's {data[i]} (bottom 0 {data}, bottom 1 {like})")
            top[i] = like[i]
            self.begin[i] = offset
        self.shape = tuple(top)
        return [self.shape]

    def forward(self, xs: list) -> list:
        index = tuple(slice(b, b + n) for b, n in zip(self.begin, self.shape))
        return [_contiguous(xs[0][index])]


@register("Tile")
class Tile(Layer):
    """TileLayer (tile_layer.cpp): the block of axes `axis` .. last repeated `tiles` times along `axis`."""

    def setup(self) -> None:
        p = self.param.tile_param
        if not p.HasField("tiles"):
            raise self.error("gives no tiles; the number of tiles must be specified")
        self.tiles = int(p.tiles)
        if self.tiles <= 0:
            raise self.error(f"tiles is {self.tiles}; the number of tiles must be positive")
        self.axis_param = int(p.axis)

    def reshape(self, shapes: list) -> list:
        shape = tuple(shapes[0])
        self.at = self.axis(self.axis_param, len(shape))
        return [shape[:self.at] + (shape[self.at] * self.tiles,) + shape[self.at + 1:]]

    def forward(self, xs: list) -> list:
        # Forward_cpu copies each outer block (axes axis..) `tiles` times in a row: np.tile along `axis`.
        reps = [1] * xs[0].ndim
        reps[self.at] = self.tiles
        return [_contiguous(np.tile(xs[0], reps))]


@register("Permute")
class Permute(Layer):
    """caffe-ssd's PermuteLayer (permute_layer.cpp): the axes reordered, `order`'s axes first, then the rest in order.

    An order that leaves every axis in place shares the bottom's data, as
    Caffe does.
    """

    def setup(self) -> None:
        self.order_param = [int(v) for v in self.param.permute_param.order]

    def reshape(self, shapes: list) -> list:
        shape = tuple(shapes[0])
        ndim = len(shape)
        order = []
        for axis in self.order_param:
            if axis >= ndim:
                raise self.error(f"order {self.order_param} names axis {axis}; an order should be less than the "
                                 f"input dimension {ndim} (bottom {shape})")
            if axis in order:
                raise self.error(f"order {self.order_param} names axis {axis} twice; there are duplicate orders")
            order.append(axis)
        order += [axis for axis in range(ndim) if axis not in order]
        self.order = tuple(order)
        return [tuple(shape[a] for a in self.order)]

    def forward(self, xs: list) -> list:
        if self.order == tuple(range(xs[0].ndim)):
            return [xs[0]]
        return [_contiguous(xs[0].transpose(self.order))]


@register("ShuffleChannel")
class ShuffleChannel(Layer):
    """The forks' ShuffleChannelLayer (shuffle_channel_layer.cpp, farmingyard/ShuffleNet): ShuffleNet's channel shuffle.

    Axis 1's C channels are read as (group, C / group) and transposed:
    output channel j * group + i is input channel i * (C / group) + j. The
    top is 4-D, as Caffe's Reshape makes it (a 2-D or 3-D bottom gains axes
    of 1).
    """

    def setup(self) -> None:
        self.group = int(self.param.shuffle_channel_param.group)
        if self.group <= 0:
            raise self.error(f"group is {self.group}; group must be greater than 0")

    def reshape(self, shapes: list) -> list:
        shape = tuple(shapes[0])
        # Reshape reads num(), channels(), height(), width() (at most 4 axes) and makes the top 4-D.
        if not 2 <= len(shape) <= 4:
            raise self.error(f"bottom {shape} has {len(shape)} axes; Caffe's ShuffleChannel reads num, channels, "
                             "height and width, so 2 to 4")
        if shape[1] % self.group:
            raise self.error(f"group {self.group} does not divide the {shape[1]} channels of {shape} (wrong group "
                             "size)")
        self.shape = shape + (1,) * (4 - len(shape))
        return [self.shape]

    def forward(self, xs: list) -> list:
        n, c = self.shape[:2]
        grouped = xs[0].reshape((n, self.group, c // self.group, -1))
        return [_contiguous(grouped.transpose(0, 2, 1, 3)).reshape(self.shape)]
