"""BVLC's layers that pick along the batch axis or hold a blob: BatchReindex, Filter, Parameter.

BatchReindex and Filter read a bottom's values as indices: which rows of
the batch each top holds. BatchReindex's top size comes from its index
bottom's shape, known before the run; Filter's comes from its selector's
values, known only as it runs (Caffe reshapes it again at each forward):
its tops are `variable_tops`, and the runner lets no later layer read them.
"""

from __future__ import annotations

import numpy as np

from .base import FLOAT, Layer, as_float, register

__all__ = ["BatchReindex", "Filter", "Parameter"]


@register("BatchReindex")
class BatchReindex(Layer):
    """Caffe's BatchReindexLayer (batch_reindex_layer.cpp): top[i] = bottom[int(permut[i])], rows of axis 0.

    Bottom 1 is 1-D (the indices, as floats, truncated by static_cast<int>);
    each must lie in [0, N) of bottom 0 (check_batch_reindex's CHECKs),
    which is known only from the values: forward() refuses the others.
    Repeats and any order are allowed.
    """

    bottoms = (2, 2)

    def reshape(self, shapes: list) -> list:
        data, index = (tuple(int(d) for d in s) for s in shapes)
        if len(index) != 1:
            raise self.error(f"bottom 1 (the indices) has shape {index}; it must have 1 axis "
                             "(CHECK_EQ(1, bottom[1]->num_axes()))")
        if len(data) < 1:
            raise self.error("bottom 0 has no axes; it takes a batch along axis 0")
        return [(index[0],) + data[1:]]

    def forward(self, xs: list) -> list:
        data, index = xs
        index = as_float(index).reshape(-1)
        # check_batch_reindex: CHECK_GE(ridx, 0) and CHECK_LT(ridx, num); a NaN passes neither
        bad = ~((index >= 0) & (index < data.shape[0]))
        if bad.any():
            k = int(np.argmax(bad))
            raise self.error(f"index {k} of bottom 1 is {float(index[k]):g}, outside the batch's 0 .. {data.shape[0] - 1} "
                             "(Caffe stops: 'Index specified for reindex layer was negative' or 'greater than batch "
                             "size')")
        return [np.ascontiguousarray(data[index.astype(np.int64)], dtype=FLOAT)]


@register("Filter")
class Filter(Layer):
    """Caffe's FilterLayer (filter_layer.cpp): the rows of each bottom whose selector (the last bottom) is not 0.

    Bottoms 0 .. k-1 are filtered into tops 0 .. k-1, all by the last
    bottom's values (shape (N) or (N, 1, ...)); a NaN is not 0, so it
    selects. reshape() gives the tops Caffe's first Reshape gives them (N
    rows, LayerSetUp's first_reshape_); forward() the rows selected, as the
    Reshape at each forward does, in their order (0 rows where none is).
    """

    bottoms = (2, None)
    tops = (1, None)
    variable_tops = True

    def reshape(self, shapes: list) -> list:
        shapes = [tuple(int(d) for d in s) for s in shapes]
        if len(self.top_names) != len(shapes) - 1:
            raise self.error(f"has {len(self.top_names)} tops for {len(shapes)} bottoms; it takes one top per "
                             "bottom but the last (the selector)")
        selector = shapes[-1]
        if not selector or any(d != 1 for d in selector[1:]):
            raise self.error(f"the selector (the last bottom) has shape {selector}; its axes but the first must be 1")
        for k, shape in enumerate(shapes[:-1]):
            if not shape or shape[0] != selector[0]:
                raise self.error(f"bottom {k} has shape {shape}; each bottom must have the selector's {selector[0]} "
                                 "rows on axis 0")
        return shapes[:-1]

    def forward(self, xs: list) -> list:
        chosen = np.flatnonzero(as_float(xs[-1]).reshape(-1) != 0)
        return [np.ascontiguousarray(x[chosen], dtype=FLOAT) for x in xs[:-1]]


@register("Parameter")
class Parameter(Layer):
    """Caffe's ParameterLayer (parameter_layer.hpp): no bottom; its top is its one blob, of parameter_param.shape."""

    bottoms = (0, 0)
    blob_count = (1, 1)

    def reshape(self, shapes: list) -> list:
        shape = tuple(int(d) for d in self.param.parameter_param.shape.dim)
        # LayerSetUp makes blob 0 of that shape; a net's stored blob must fit it (CopyTrainedLayersFrom's check)
        # (Blob::ShapeEquals: a legacy 4-D blob of leading 1s stands for the shape it pads).
        stored = tuple(self.blobs[0].shape)
        if stored != shape:
            legacy = len(stored) == 4 and len(shape) <= 4 and stored == (1,) * (4 - len(shape)) + shape
            if not legacy:
                raise self.error(f"blob 0 has shape {stored}, parameter_param.shape is {shape}")
            self.blobs[0] = self.blobs[0].reshape(shape)
        return [shape]

    def forward(self, xs: list) -> list:
        # Forward_cpu does nothing: the top shares the blob's data
        return [self.blobs[0].copy()]
