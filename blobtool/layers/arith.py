"""Caffe's arithmetic layers at test time: Scale, Bias, Eltwise, Reduction, ArgMax.

Each class mirrors Caffe's src/caffe/layers/<name>_layer.cpp (BVLC); the
formula sits beside its code. All arithmetic is float32, as Caffe's Dtype
float.
"""

from __future__ import annotations

import abc

import numpy as np

from .base import FLOAT, Layer, as_float, count, register

__all__ = ["Scale", "Bias", "Eltwise", "Reduction", "ArgMax"]

PROD, SUM, MAX = 0, 1, 2                          # EltwiseParameter.EltwiseOp
R_SUM, R_ASUM, R_SUMSQ, R_MEAN = 1, 2, 3, 4       # ReductionParameter.ReductionOp


def _strip_ones(shape) -> tuple:
    """A shape without its leading 1s: a blob stored in the legacy 4-D form (1, 1, 1, C) is Caffe's (C,)."""
    shape = tuple(int(d) for d in shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


class _Broadcast(Layer):
    """What Scale and Bias share (scale_layer.cpp, bias_layer.cpp): an operand laid along axes of bottom 0.

    The operand is bottom 1 when there are two bottoms, else blob 0, of the
    shape bottom 0 has at axis .. axis + num_axes (num_axes -1: to the end);
    an operand of no axes is a scalar. It broadcasts over bottom 0 as
    [outer, operand, inner]. A blob stored in the legacy 4-D form (1, 1, 1, C)
    stands for (C,), as Caffe's Blob::ShapeEquals accepts it.
    """

    bottoms = (1, 2)

    @abc.abstractmethod
    def settings(self) -> tuple:
        """(axis, num_axes) from the type's parameter message."""

    @abc.abstractmethod
    def roles(self, two: bool) -> list:
        """What each blob holds, in order, with one bottom or two."""

    def reshape(self, shapes: list) -> list:
        shape = tuple(shapes[0])
        two = len(shapes) > 1
        roles = self.roles(two)
        if len(self.blobs) != len(roles):
            wanted = f"{len(roles)} ({', '.join(roles)})" if roles else "0"
            raise self.error(f"holds {len(self.blobs)} blob{'s' if len(self.blobs) != 1 else ''}, expected "
                             f"{wanted} with {len(shapes)} bottom{'s' if two else ''}")
        axis, num_axes = self.settings()
        if two:
            operand = tuple(shapes[1])
            # scale_layer.cpp Reshape: axis_ = 0 for a scalar operand; then the operand's shape must be
            # bottom 0's from axis_ on (CHECK_GE on the axis count, CHECK_EQ on each dimension).
            start = self.axis(axis, len(shape)) if operand else 0
            if shape[start:start + len(operand)] != operand:
                raise self.error(f"bottom 1 ({self.operand}) has shape {operand}, which does not match "
                                 f"bottom 0's shape {shape} from axis {start}")
            length = len(operand)
        else:
            start = self.axis(axis, len(shape))
            # scale_layer.cpp LayerSetUp: CHECK_GE(num_axes, -1); CHECK_GE(bottom axes, axis + num_axes).
            if num_axes < -1:
                raise self.error(f"num_axes is {num_axes}: it must be non-negative, or -1 for every axis from "
                                 "axis on")
            length = len(shape) - start if num_axes == -1 else num_axes
            if start + length > len(shape):
                raise self.error(f"{self.operand} spans axes {start} to {start + length - 1}, past bottom 0's "
                                 f"{len(shape)} axes {shape}")
        expected = shape[start:start + length]
        for k, role in enumerate(roles):
            if _strip_ones(self.blobs[k].shape) != _strip_ones(expected):
                raise self.error(f"blob {k} ({role}) has shape {tuple(self.blobs[k].shape)}, expected "
                                 f"{expected} (bottom 0's shape {shape} from axis {start})")
        self.span = (start, length)
        return [shape]

    def laid(self, operand: np.ndarray, shape: tuple) -> np.ndarray:
        """The operand shaped to broadcast over bottom 0: its own axes, then 1 for each inner axis."""
        start, length = self.span
        return operand.reshape(tuple(shape[start:start + length]) + (1,) * (len(shape) - start - length))


@register("Scale")
class Scale(_Broadcast):
    """ScaleLayer (scale_layer.cpp): y = x * scale (+ bias with bias_term), the scale along axis .. axis + num_axes.

    One bottom: blob 0 is the scale (and blob 1 the bias); two bottoms:
    bottom 1 is the scale (and blob 0 the bias, along the same axes).
    """

    operand = "the scale"

    def settings(self) -> tuple:
        p = self.param.scale_param
        return p.axis, p.num_axes

    def roles(self, two: bool) -> list:
        return ([] if two else ["the scale"]) + (["the bias"] if self.param.scale_param.bias_term else [])

    def forward(self, xs: list) -> list:
        x = xs[0]
        scale = xs[1] if len(xs) > 1 else self.blobs[0]
        # scale_layer.cpp: top[n, d, i] = bottom[n, d, i] * scale[d] (outer n, scale d, inner i)
        y = x * self.laid(scale, x.shape)
        if self.param.scale_param.bias_term:
            # bias_layer.cpp, run by the Scale layer on its own top: top[n, d, i] += bias[d]
            y += self.laid(self.blobs[-1], x.shape)
        return [as_float(y)]

    def forward_in_place(self, x: np.ndarray) -> np.ndarray:
        """forward() of one bottom written into x, where the runner may (top is bottom, read by nobody after)."""
        np.multiply(x, self.laid(self.blobs[0], x.shape), out=x)
        if self.param.scale_param.bias_term:
            np.add(x, self.laid(self.blobs[-1], x.shape), out=x)
        return x


@register("Bias")
class Bias(_Broadcast):
    """BiasLayer (bias_layer.cpp): y = x + bias, the bias (blob 0, or bottom 1) along axis .. axis + num_axes."""

    operand = "the bias"

    def settings(self) -> tuple:
        p = self.param.bias_param
        return p.axis, p.num_axes

    def roles(self, two: bool) -> list:
        return [] if two else ["the bias"]

    def forward(self, xs: list) -> list:
        x = xs[0]
        bias = xs[1] if len(xs) > 1 else self.blobs[0]
        # bias_layer.cpp: top[n, d, i] = bottom[n, d, i] + bias[d]
        y = x + self.laid(bias, x.shape)
        return [as_float(y)]


@register("Eltwise")
class Eltwise(Layer):
    """EltwiseLayer (eltwise_layer.cpp): the product, the weighted sum or the maximum of bottoms of one shape."""

    bottoms = (2, None)

    def setup(self) -> None:
        p = self.param.eltwise_param
        self.op = int(p.operation)
        if self.op not in (PROD, SUM, MAX):
            raise self.error(f"operation {self.op} is none of PROD, SUM, MAX")
        self.coeffs = [FLOAT(c) for c in p.coeff]
        # eltwise_layer.cpp LayerSetUp: CHECK(!(op == PROD && coeff_size())); MAX takes them and
        # leaves them unused.
        if self.coeffs and self.op == PROD:
            raise self.error(f"has {len(self.coeffs)} coeff values; Caffe's Eltwise takes none for PROD "
                             "(coefficients are for SUM)")

    def reshape(self, shapes: list) -> list:
        # eltwise_layer.cpp LayerSetUp: one coefficient per bottom, or none.
        if self.coeffs and len(self.coeffs) != len(shapes):
            raise self.error(f"has {len(self.coeffs)} coeff values for {len(shapes)} bottoms; Caffe takes one "
                             "coefficient per bottom, or none")
        first = tuple(shapes[0])
        for i, shape in enumerate(shapes[1:], 1):
            if tuple(shape) != first:
                raise self.error(f"bottom {i} has shape {tuple(shape)}, bottom 0 has {first}; Eltwise takes "
                                 "bottoms of one shape")
        return [first]

    def forward(self, xs: list) -> list:
        if self.op == PROD:
            # y = x0 * x1 * ... in bottom order
            y = xs[0] * xs[1]
            for x in xs[2:]:
                y *= x
        elif self.op == SUM:
            # y = sum of coeff_i * x_i (coeff 1 where none are given), added in bottom order
            coeffs = self.coeffs or [FLOAT(1)] * len(xs)
            y = np.zeros(xs[0].shape, dtype=FLOAT)
            for c, x in zip(coeffs, xs):
                if c == 1:
                    y += x
                else:
                    y += c * x
        else:
            # eltwise_layer.cpp MAX: y = x0 > x1 ? x0 : x1, then y = x_i > y ? x_i : y for each later bottom
            y = np.where(xs[0] > xs[1], xs[0], xs[1])
            for x in xs[2:]:
                y = np.where(x > y, x, y)
        return [as_float(y)]


@register("Reduction")
class Reduction(Layer):
    """ReductionLayer (reduction_layer.cpp): SUM, ASUM, SUMSQ or MEAN of every axis from `axis` on, times coeff.

    The top keeps the axes before `axis` (a scalar, shape (), for axis 0).
    """

    def setup(self) -> None:
        p = self.param.reduction_param
        self.op = int(p.operation)
        if self.op not in (R_SUM, R_ASUM, R_SUMSQ, R_MEAN):
            raise self.error(f"operation {self.op} is none of SUM, ASUM, SUMSQ, MEAN")
        self.coeff = FLOAT(p.coeff)

    def reshape(self, shapes: list) -> list:
        shape = tuple(shapes[0])
        axis = self.axis(self.param.reduction_param.axis, len(shape))
        return [shape[:axis]]

    def forward(self, xs: list) -> list:
        x = xs[0]
        axis = self.axis(self.param.reduction_param.axis, x.ndim)
        rows = x.reshape(count(x.shape, 0, axis), count(x.shape, axis))
        if self.op in (R_SUM, R_MEAN):
            y = rows.sum(axis=1, dtype=FLOAT)                 # dot(x, 1)
        elif self.op == R_ASUM:
            y = np.abs(rows).sum(axis=1, dtype=FLOAT)         # sum |x|
        else:
            y = (rows * rows).sum(axis=1, dtype=FLOAT)        # dot(x, x)
        # reduction_layer.cpp: coeff_ = coeff (/ dim for MEAN); y *= coeff_ where it is not 1
        coeff = self.coeff / FLOAT(rows.shape[1]) if self.op == R_MEAN else self.coeff
        if coeff != 1:
            y = y * coeff
        return [as_float(y.reshape(x.shape[:axis]))]


@register("ArgMax")
class ArgMax(Layer):
    """ArgMaxLayer (argmax_layer.cpp): the indices (or values) of the top_k largest values.

    With `axis`: along that axis, the top of the bottom's shape with top_k at
    axis, holding values when out_max_val, else indices. Without: over
    each image's flattened values (count(1)), the top (N, 1, top_k) or, with
    out_max_val, (N, 2, top_k) holding the indices then the values (at least
    3 axes, 1 for the rest). Caffe orders (value, index) pairs with
    std::greater: among equal values the larger index comes first.
    """

    def setup(self) -> None:
        p = self.param.argmax_param
        self.top_k = int(p.top_k)
        self.out_max_val = bool(p.out_max_val)
        self.has_axis = p.HasField("axis")
        # argmax_layer.cpp LayerSetUp: CHECK_GE(top_k_, 1).
        if self.top_k < 1:
            raise self.error(f"top_k is {self.top_k}: it must be at least 1")

    def reshape(self, shapes: list) -> list:
        shape = tuple(shapes[0])
        if self.has_axis:
            axis = self.axis(self.param.argmax_param.axis, len(shape))
            if self.top_k > shape[axis]:
                raise self.error(f"top_k is {self.top_k}, more than the {shape[axis]} values along axis {axis}")
            return [shape[:axis] + (self.top_k,) + shape[axis + 1:]]
        if not shape:
            # Caffe's count(1, num_axes) of a blob of no axes: CHECK_LE(start_axis, end_axis) fails.
            raise self.error("bottom has no axes; ArgMax without axis takes each image's values from axis 1")
        per_image = count(shape, 1)
        if self.top_k > per_image:
            raise self.error(f"top_k is {self.top_k}, more than the {per_image} values of each image "
                             f"(bottom {shape})")
        top = [1] * max(len(shape), 3)
        top[0], top[1], top[2] = shape[0], 2 if self.out_max_val else 1, self.top_k
        return [tuple(top)]

    def forward(self, xs: list) -> list:
        x = xs[0]
        top_shape = self.reshape([x.shape])[0]
        k = self.top_k
        if self.has_axis:
            axis = self.axis(self.param.argmax_param.axis, x.ndim)
            values = np.moveaxis(x, axis, -1)
        else:
            values = x.reshape(x.shape[0], -1)
        indices, best = _top_k(values, k)
        if self.has_axis:
            y = np.moveaxis(best if self.out_max_val else indices.astype(FLOAT), -1, axis)
        elif self.out_max_val:
            # top[n] = [indices (k), values (k)]
            y = np.stack([indices.astype(FLOAT), best], axis=1)
        else:
            y = indices.astype(FLOAT)
        return [as_float(y.reshape(top_shape))]


def _top_k(values: np.ndarray, k: int):
    """(indices, values) of the k largest along the last axis, in argmax_layer.cpp's order.

    std::partial_sort with std::greater<pair<value, index>>: by value
    descending, equal values by index descending. A stable ascending sort of
    the negated values read back to front gives that order.
    """
    dim = values.shape[-1]
    reversed_values = values[..., ::-1]
    order = np.argsort(-reversed_values, axis=-1, kind="stable")[..., :k]
    indices = (dim - 1) - order
    return indices, np.take_along_axis(values, indices, axis=-1)
