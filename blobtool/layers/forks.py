"""The forks' layers that are neither BVLC's nor SSD's: BN, Axpy, ROIPooling, PSROIPooling, Reorg.

- BN is alexgkendall/caffe-segnet's BNLayer (src/caffe/layers/bn_layer.cpp),
  which ENet's deploy nets use too: blobs scale and shift, (1, C, 1, 1)
  each. bn_mode INFERENCE (ENet's deploy nets, and SegNet's after its
  statistics are folded into scale and shift) is scale x + shift, the
  product taken first. bn_mode LEARN, the default, normalizes by the
  batch's own statistics over N, H and W, as Forward_cpu computes them:
  mean = E[x], variance = E[x^2] - mean^2, then (x - mean) / sqrt(variance +
  1e-9) * scale + shift. A SegNet deploy net run before its statistics are
  folded in is in this mode.
- Axpy is hujie-frank/SENet's AxpyLayer (src/caffe/layers/axpy_layer.cpp):
  bottoms a (N, C) or (N, C, 1, 1), x and y of one shape (N, C, ...); top =
  y + a[n, c] x, per (n, c) plane (caffe_axpy).
- ROIPooling is rbgirshick/caffe-fast-rcnn's, PSROIPooling
  daijifeng001/caffe-rfcn's (its GPU kernel: the fork's Forward_cpu is
  NOT_IMPLEMENTED), Reorg the YOLOv2 ports' darknet layout
  (gklz1982/caffe-yolov2): each class says its rounding.
"""

from __future__ import annotations

import numpy as np

from .base import FLOAT, Layer, count, register

__all__ = ["BN", "Axpy", "ROIPooling", "PSROIPooling", "Reorg", "BN_LEARN", "BN_INFERENCE", "BN_EPS", "c_round"]

BN_LEARN, BN_INFERENCE = 0, 1           # BNParameter.BNMode
BN_EPS = FLOAT(1e-9)                    # bn_layer.cpp: var_eps_ = 1e-9


@register("BN")
class BN(Layer):
    """SegNet's BNLayer (caffe-segnet bn_layer.cpp): scale x + shift, after the batch's normalization in LEARN."""

    blob_count = (2, 2)

    def setup(self) -> None:
        self.mode = int(self.param.bn_param.bn_mode)
        if self.mode not in (BN_LEARN, BN_INFERENCE):
            raise self.error(f"bn_mode is {self.mode}; SegNet's BN takes LEARN (0) or INFERENCE (1)")
        # LEARN may write the batch's mean and variance to tops 1 and 2 (bn_layer.cpp's Reshape).
        self.tops = (1, 3) if self.mode == BN_LEARN else (1, 1)

    def reshape(self, shapes: list) -> list:
        shape = tuple(shapes[0])
        # Reshape reads num(), channels(), height(), width(): a 4-D bottom.
        if len(shape) != 4:
            raise self.error(f"bottom {shape} has {len(shape)} axes; BN takes (N, C, H, W)")
        c = shape[1]
        for k in (0, 1):
            if self.blobs[k].size != c:
                raise self.error(f"blob {k} holds {self.blobs[k].size} values; the bottom has {c} channels")
        return [shape] + [(1, c, 1, 1)] * (max(1, len(self.top_names)) - 1)

    def forward(self, xs: list) -> list:
        x = xs[0]
        c = x.shape[1]
        scale = self.blobs[0].reshape(1, c, 1, 1)
        shift = self.blobs[1].reshape(1, c, 1, 1)
        if self.mode == BN_INFERENCE:
            return [np.ascontiguousarray(x * scale + shift, dtype=FLOAT)]
        mean, variance = batch_statistics(x)
        top = (x - mean.reshape(1, c, 1, 1)) / np.sqrt(variance + BN_EPS).reshape(1, c, 1, 1)
        tops = [np.ascontiguousarray(top * scale + shift, dtype=FLOAT)]
        extra = [mean.reshape(1, c, 1, 1), variance.reshape(1, c, 1, 1)]
        return tops + [np.ascontiguousarray(t, dtype=FLOAT) for t in extra[:len(self.top_names) - 1]]


def batch_statistics(x: np.ndarray) -> tuple:
    """(mean, variance) per channel over N, H, W as bn_layer.cpp's LEARN computes them: E[x^2] - E[x]^2, in float.

    Caffe averages each plane first (gemv with 1 / (H W)), then the planes
    over the batch (1 / N); so here, in float32 (the order of the sums within
    a plane is BLAS's, so the last bits may differ).
    """
    n, c, h, w = x.shape
    planes = x.reshape(n, c, h * w)
    plane_mean = planes.mean(axis=2, dtype=FLOAT)
    plane_square = (planes * planes).mean(axis=2, dtype=FLOAT)
    mean = plane_mean.mean(axis=0, dtype=FLOAT)
    square = plane_square.mean(axis=0, dtype=FLOAT)
    return mean, (square - mean * mean).astype(FLOAT)


@register("Axpy")
class Axpy(Layer):
    """SENet's AxpyLayer (axpy_layer.cpp): top = y + a x with a one value per (image, channel)."""

    bottoms = (3, 3)

    def reshape(self, shapes: list) -> list:
        a, x, y = (tuple(s) for s in shapes)
        if len(a) < 2 or len(x) < 2 or a[:2] != x[:2]:
            raise self.error(f"bottom 0 {a} must have the first two axes of bottom 1 {x} (num and channels)")
        if len(a) == 4 and a[2:] != (1, 1):
            raise self.error(f"bottom 0 {a} must be (N, C, 1, 1): one scale per image and channel")
        if count(a) != a[0] * a[1]:
            raise self.error(f"bottom 0 {a} must hold one value per image and channel")
        if x != y:
            raise self.error(f"bottoms 1 {x} and 2 {y} must have the same shape")
        return [x]

    def forward(self, xs: list) -> list:
        a, x, y = xs
        n, c = x.shape[:2]
        scale = a.reshape((n, c) + (1,) * (x.ndim - 2))
        return [np.ascontiguousarray(y + scale * x, dtype=FLOAT)]


_LOWEST = np.finfo(np.float32).min      # -FLT_MAX, where a MAX bin starts


def c_round(x) -> np.ndarray:
    """C's round(): half away from zero (numpy's round goes to even), in float64 (exact for float32 inputs)."""
    x = np.asarray(x, np.float64)
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def _rois(layer: Layer, shapes: list) -> int:
    """The number of ROIs of bottom 1, checked as (R, 5) or (R, 5, 1, 1): one (batch index, x1, y1, x2, y2) each."""
    rois = tuple(shapes[1])
    if len(rois) < 1 or count(rois, 1) != 5:
        raise layer.error(f"bottom 1 {rois} must hold 5 values per ROI (batch index, x1, y1, x2, y2)")
    if len(tuple(shapes[0])) != 4:
        raise layer.error(f"bottom 0 {tuple(shapes[0])} must be (N, C, H, W)")
    return rois[0]


# Caffe converts the scaled corners to a C++ int; past its range (or NaN) the conversion is undefined.
_INT_RANGE = 2.0 ** 31


def _corners(layer: Layer, values) -> None:
    """Refuse corners whose scaled values are not finite or lie past a C++ int (Caffe's conversion is undefined)."""
    values = np.asarray(values, np.float64)
    if not (np.isfinite(values).all() and (np.abs(values) < _INT_RANGE).all()):
        bad = values[~(np.isfinite(values) & (np.abs(values) < _INT_RANGE))].flat[0]
        raise layer.error(f"a ROI corner scaled by spatial_scale is {bad:g}, past what Caffe converts to an int")


def _batch_index(layer: Layer, value, batch: int) -> int:
    index = int(np.trunc(value)) if np.isfinite(value) else -1
    if not 0 <= index < batch:
        raise layer.error(f"a ROI's batch index is {value:g}; the bottom holds images 0 to {batch - 1}")
    return index


@register("ROIPooling")
class ROIPooling(Layer):
    """Fast R-CNN's ROIPoolingLayer (rbgirshick/caffe-fast-rcnn, src/caffe/layers/roi_pooling_layer.cpp).

    Per ROI (b, x1, y1, x2, y2): its corners round(x spatial_scale) (the
    product in float, C's round: half away from zero), its size end - start
    + 1 (at least 1), bin size = size / pooled in float; bin (ph, pw)
    covers rows floor(ph bin_h) .. ceil((ph + 1) bin_h) from the start,
    clipped to the image. An empty bin is 0; any other the largest value in
    it, starting from -FLT_MAX and keeping only a greater one (a NaN never
    wins).
    """

    bottoms = (2, 2)

    def setup(self) -> None:
        p = self.param.roi_pooling_param
        self.pooled = (int(p.pooled_h), int(p.pooled_w))
        if min(self.pooled) <= 0:
            raise self.error(f"pooled_h {self.pooled[0]} and pooled_w {self.pooled[1]} must be > 0")
        self.spatial_scale = FLOAT(p.spatial_scale)

    def reshape(self, shapes: list) -> list:
        rois = _rois(self, shapes)
        return [(rois, shapes[0][1]) + self.pooled]

    def bins(self, roi, height: int, width: int) -> tuple:
        """(rows, cols): per pooled index, the [start, end) of its bin in the image, clipped."""
        starts_ends = []
        with np.errstate(over="ignore", invalid="ignore"):
            _corners(self, FLOAT(roi[1:]) * self.spatial_scale)
        for lo, hi, pooled, size in ((roi[2], roi[4], self.pooled[0], height),
                                     (roi[1], roi[3], self.pooled[1], width)):
            start = int(c_round(FLOAT(lo) * self.spatial_scale))
            end = int(c_round(FLOAT(hi) * self.spatial_scale))
            bin_size = FLOAT(max(end - start + 1, 1)) / FLOAT(pooled)
            steps = np.arange(pooled + 1, dtype=FLOAT) * bin_size
            first = np.clip(np.floor(steps[:-1]).astype(np.int64) + start, 0, size)
            last = np.clip(np.ceil(steps[1:]).astype(np.int64) + start, 0, size)
            starts_ends.append((first, last))
        return tuple(starts_ends)

    def forward(self, xs: list) -> list:
        x, rois = xs[0], xs[1].reshape(-1, 5)
        top = np.zeros((rois.shape[0], x.shape[1]) + self.pooled, FLOAT)
        for r, roi in enumerate(rois):
            image = x[_batch_index(self, roi[0], x.shape[0])]
            (h0, h1), (w0, w1) = self.bins(roi, *x.shape[2:])
            # Bins repeat where pooled passes the ROI's size: each distinct bin is computed once (at most
            # about 2 (H + 1) x 2 (W + 1) of them, whatever pooled_h and pooled_w are), then laid out.
            rows, row_of = np.unique(np.stack([h0, h1], axis=1), axis=0, return_inverse=True)
            cols, col_of = np.unique(np.stack([w0, w1], axis=1), axis=0, return_inverse=True)
            table = np.zeros((x.shape[1], len(rows), len(cols)), FLOAT)
            for i, (a, b) in enumerate(rows):
                for j, (c, d) in enumerate(cols):
                    if b > a and d > c:  # an empty bin stays 0
                        window = image[:, a:b, c:d].reshape(x.shape[1], -1)
                        table[:, i, j] = np.fmax.reduce(window, axis=1, initial=_LOWEST)
            top[r] = table[:, row_of.reshape(-1)][:, :, col_of.reshape(-1)]
        return [top]


@register("PSROIPooling")
class PSROIPooling(Layer):
    """R-FCN's PSROIPoolingLayer (daijifeng001/caffe-rfcn): its CPU forward is NOT_IMPLEMENTED, so this is its GPU kernel.

    psroi_pooling_layer.cu, PSROIPoolingForward: per ROI (b, x1, y1, x2, y2),
    start = round(x1) spatial_scale, end = (round(x2) + 1) spatial_scale (C's
    round, products in float), size max(end - start, 0.1), bin = size /
    group_size; bin (ph, pw) covers floor(ph bin + start) .. ceil((ph + 1)
    bin + start), clipped to the image; output (r, ctop, ph, pw) is the mean
    of channel (ctop group_size + ph) group_size + pw over that bin, 0 where
    it is empty. (nvcc may fuse ph bin + start into one rounding; this
    computes it with two, as Caffe's CPU arithmetic would.)
    """

    bottoms = (2, 2)

    def setup(self) -> None:
        p = self.param.psroi_pooling_param
        self.output_dim, self.group = int(p.output_dim), int(p.group_size)
        if self.output_dim <= 0 or self.group <= 0:
            raise self.error(f"output_dim {self.output_dim} and group_size {self.group} must be > 0")
        self.spatial_scale = FLOAT(p.spatial_scale)

    def reshape(self, shapes: list) -> list:
        rois = _rois(self, shapes)
        channels = shapes[0][1]
        if channels != self.output_dim * self.group * self.group:
            raise self.error(f"the bottom has {channels} channels; output_dim {self.output_dim} x group_size "
                             f"{self.group}^2 is {self.output_dim * self.group * self.group}")
        return [(rois, self.output_dim, self.group, self.group)]

    def bins(self, roi, height: int, width: int) -> tuple:
        """(rows, cols): per pooled index, the [start, end) of its bin, clipped; as the kernel computes them."""
        found = []
        with np.errstate(over="ignore", invalid="ignore"):
            _corners(self, (c_round(roi[1:]) + 1.0).astype(FLOAT) * self.spatial_scale)
            _corners(self, c_round(roi[1:]).astype(FLOAT) * self.spatial_scale)
        for lo, hi, size in ((roi[2], roi[4], height), (roi[1], roi[3], width)):
            start = FLOAT(c_round(lo)) * self.spatial_scale
            end = FLOAT(c_round(hi) + 1.0) * self.spatial_scale
            extent = FLOAT(max(float(end - start), 0.1))
            bin_size = extent / FLOAT(self.group)
            grid = np.arange(self.group + 1, dtype=FLOAT) * bin_size
            first = np.clip(np.floor(grid[:-1] + start).astype(np.int64), 0, size)
            last = np.clip(np.ceil(grid[1:] + start).astype(np.int64), 0, size)
            found.append((first, last))
        return tuple(found)

    def forward(self, xs: list) -> list:
        x, rois = xs[0], xs[1].reshape(-1, 5)
        n, _, height, width = x.shape
        g = self.group
        top = np.zeros((rois.shape[0], self.output_dim, g, g), FLOAT)
        groups = np.arange(self.output_dim) * g * g
        for r, roi in enumerate(rois):
            image = x[_batch_index(self, roi[0], n)]
            (h0, h1), (w0, w1) = self.bins(roi, height, width)
            for ph in range(g):
                for pw in range(g):
                    area = (h1[ph] - h0[ph]) * (w1[pw] - w0[pw])
                    if h1[ph] <= h0[ph] or w1[pw] <= w0[pw]:
                        continue  # an empty bin: 0
                    window = image[groups + ph * g + pw, h0[ph]:h1[ph], w0[pw]:w1[pw]]
                    total = window.reshape(self.output_dim, -1).sum(axis=1, dtype=FLOAT)
                    top[r, :, ph, pw] = total / FLOAT(area)
        return [top]


@register("Reorg")
class Reorg(Layer):
    """YOLOv2's ReorgLayer as the darknet ports have it (gklz1982/caffe-yolov2, src/caffe/layers/reorg_layer.cpp).

    Forward_cpu calls darknet's reorg_cpu(bottom, W, H, C, N, stride,
    reverse, top) with the bottom's own sizes. With reverse false it reads
    the bottom as if it were (N, C / s^2, H s, W s) and writes top[b, k, j,
    i] (top as (N, C, H, W)) = that[b, k % (C / s^2), j s + (k / (C / s^2)) /
    s, i s + (k / (C / s^2)) % s]; the top is (N, C s^2, H / s, W / s) over
    the same values. Not a space-to-depth of the image as it stands: the
    darknet layout, which the nets' later layers were trained on. reverse
    true is the opposite move, top (N, C / s^2, H s, W s).
    """

    def setup(self) -> None:
        p = self.param.reorg_param
        if not p.HasField("stride"):
            raise self.error("needs reorg_param.stride")
        self.stride, self.reverse = int(p.stride), bool(p.reverse)
        if self.stride <= 0:
            raise self.error(f"stride is {self.stride}; it must be positive")

    def reshape(self, shapes: list) -> list:
        shape = tuple(shapes[0])
        if len(shape) != 4:
            raise self.error(f"bottom {shape} has {len(shape)} axes; Reorg takes (N, C, H, W)")
        n, c, h, w = shape
        s = self.stride
        if c % (s * s):
            raise self.error(f"{c} channels are not a multiple of stride^2 = {s * s}")
        if self.reverse:
            return [(n, c // (s * s), h * s, w * s)]
        if h % s or w % s:
            raise self.error(f"height {h} and width {w} must be multiples of the stride {s}")
        return [(n, c * s * s, h // s, w // s)]

    def forward(self, xs: list) -> list:
        x = xs[0]
        n, c, h, w = x.shape
        s = self.stride
        inner = c // (s * s)
        if self.reverse:
            moved = x.reshape(n, s, s, inner, h, w).transpose(0, 3, 4, 1, 5, 2)
        else:
            moved = x.reshape(n, inner, h, s, w, s).transpose(0, 3, 5, 1, 2, 4)
        top = np.ascontiguousarray(moved, dtype=FLOAT)
        return [top.reshape(self.reshape([x.shape])[0])]
