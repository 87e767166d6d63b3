"""InnerProduct and Embed, forward: Caffe's src/caffe/layers/inner_product_layer.cpp and embed_layer.cpp.

InnerProduct flattens the bottom from `axis` on into K values and multiplies
each of the M = count(0, axis) rows by the weights:

    top[m, n] = sum over k of bottom[m, k] W[n, k] + bias[n]    (W is (N, K))
    top[m, n] = sum over k of bottom[m, k] W[k, n] + bias[n]    (transpose: W is (K, N))

with top shape = bottom shape[:axis] + [N]. Embed looks each bottom value up
as a row index: top[..., n] = W[index, n] + bias[n], W (input_dim, N), top
shape = bottom shape + [N].

A weight stored by an old Caffe keeps its legacy 4-D shape ((1, 1, N, K),
a bias (1, 1, 1, N)); Caffe's ShapeEquals takes it for the 2-D one.
"""

from __future__ import annotations

import numpy as np

from .base import FLOAT, Layer, count, register
from .conv import stored_shape_fits

__all__ = ["InnerProduct", "Embed"]


class _Dense(Layer):
    """Weights and an optional bias of N outputs: the checks InnerProduct and Embed share."""

    def _check_blob_count(self) -> None:
        if self.blobs and len(self.blobs) != 1 + self.bias_term:
            raise self.error(f"holds {len(self.blobs)} blobs, expected {1 + self.bias_term} (weights"
                             f"{' and bias' if self.bias_term else ''}; bias_term is {str(self.bias_term).lower()})")

    def _check_blobs(self, weight_shape: tuple, roles: str) -> None:
        if not self.blobs:
            return
        if not stored_shape_fits(self.blobs[0].shape, weight_shape):
            raise self.error(f"weight blob has shape {self.blobs[0].shape}, expected {weight_shape} ({roles})")
        if self.bias_term and not stored_shape_fits(self.blobs[1].shape, (self.num_output,)):
            raise self.error(f"bias blob has shape {self.blobs[1].shape}, expected ({self.num_output},)")

    def _need_weights(self) -> None:
        if not self.blobs:
            raise self.error("has no weights to run with (the net's weights were not given)")


@register("InnerProduct")
class InnerProduct(_Dense):
    """Caffe's InnerProductLayer (src/caffe/layers/inner_product_layer.cpp): a matrix product over the last axes."""

    def setup(self) -> None:
        ip = self.param.inner_product_param
        self.num_output = int(ip.num_output)
        if self.num_output <= 0:
            raise self.error("num_output must be positive (it is 0 or not set)")
        self.bias_term = bool(ip.bias_term)
        self.transpose = bool(ip.transpose)
        self._check_blob_count()

    def _plan(self, shape) -> tuple:
        """(axis, M, K) for a bottom of `shape`, with the weights checked against K."""
        shape = tuple(int(d) for d in shape)
        axis = self.axis(self.param.inner_product_param.axis, len(shape))
        k = count(shape, axis)
        if self.transpose:
            self._check_blobs((k, self.num_output), f"K, num_output with transpose, K = {k} values from axis {axis}")
        else:
            self._check_blobs((self.num_output, k), f"num_output, K with K = {k} values from axis {axis}")
        return axis, count(shape, 0, axis), k

    def reshape(self, shapes: list) -> list:
        axis, _, _ = self._plan(shapes[0])
        return [tuple(shapes[0][:axis]) + (self.num_output,)]

    def forward(self, xs: list) -> list:
        self._need_weights()
        x = xs[0]
        axis, m, k = self._plan(x.shape)
        rows = np.ascontiguousarray(x, dtype=FLOAT).reshape(m, k)
        weight = self.blobs[0].reshape((k, self.num_output) if self.transpose else (self.num_output, k))
        # top (M, N) = bottom (M, K) x W^T, or x W where W is stored (K, N) (inner_product_layer.cpp, Forward_cpu).
        y = rows @ (weight if self.transpose else weight.T)
        if self.bias_term:
            y += self.blobs[1].reshape(-1)
        return [np.ascontiguousarray(y).reshape(tuple(x.shape[:axis]) + (self.num_output,))]


@register("Embed")
class Embed(_Dense):
    """Caffe's EmbedLayer (src/caffe/layers/embed_layer.cpp): each bottom value picks a row of the weights.

    Caffe checks the indices only in debug builds (DCHECK); blobtool always
    refuses a value that is not an integer in [0, input_dim).
    """

    def setup(self) -> None:
        embed = self.param.embed_param
        self.num_output = int(embed.num_output)
        if self.num_output <= 0:
            raise self.error("num_output must be positive (it is 0 or not set)")
        self.input_dim = int(embed.input_dim)
        if self.input_dim <= 0:
            raise self.error("input_dim must be positive (it is 0 or not set)")
        self.bias_term = bool(embed.bias_term)
        self._check_blob_count()
        self._check_blobs((self.input_dim, self.num_output), "input_dim, num_output")

    def reshape(self, shapes: list) -> list:
        return [tuple(shapes[0]) + (self.num_output,)]

    def forward(self, xs: list) -> list:
        self._need_weights()
        x = xs[0]
        values = np.asarray(x, dtype=FLOAT).reshape(-1)
        with np.errstate(invalid="ignore"):
            whole = np.isfinite(values) & (np.trunc(values) == values)
        if not whole.all():
            at = int(np.argmin(whole))
            raise self.error(f"bottom value {float(values[at])} at flat position {at} is not an integer index")
        indices = values.astype(np.int64)
        outside = (indices < 0) | (indices >= self.input_dim)
        if outside.any():
            at = int(np.argmax(outside))
            raise self.error(f"index {indices[at]} at flat position {at} is out of range [0, {self.input_dim}) "
                             f"(input_dim {self.input_dim})")
        weight = self.blobs[0].reshape(self.input_dim, self.num_output)
        # top[m, n] = W[index m, n] + bias[n] (embed_layer.cpp, Forward_cpu).
        y = weight.take(indices, axis=0)
        if self.bias_term:
            y += self.blobs[1].reshape(-1)
        return [y.reshape(tuple(x.shape) + (self.num_output,))]
