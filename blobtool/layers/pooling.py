"""Pooling, forward: Caffe's PoolingLayer (src/caffe/layers/pooling_layer.cpp).

Output size per axis (PoolingLayer::Reshape):

    out = ceil((in + 2 pad - kernel) / stride) + 1     (round_mode CEIL, the default)
    out = floor((in + 2 pad - kernel) / stride) + 1    (round_mode FLOOR)

then, where either pad is nonzero, out - 1 more along each axis whose last
window would start at or past in + pad (a window must start inside the
image or its leading pad). Window (y, x) covers rows y s - p .. y s - p + k - 1:

- MAX takes the largest value of the window clipped to the image (a pad
  never wins), starting from -FLT_MAX and keeping a value only when it is
  greater: a NaN never wins, and a window of -inf only (or an empty one)
  gives -FLT_MAX. A second top holds the argmax, h * W + w within the
  plane, the first in row-major order (-1 where nothing beat -FLT_MAX).
- AVE divides the sum of the window clipped to the image by the size of the
  window clipped to in + pad: the pad counts, the overhang past it does not.
- STOCHASTIC has no CPU forward in Caffe (NOT_IMPLEMENTED): refused.
- global_pooling takes kernel = H x W (and needs pad 0, stride 1).

The arithmetic loops over the kernel's offsets (kh x kw array operations over
every window at once), never over pixels.
"""

from __future__ import annotations

import numpy as np

from .base import FLOAT, Layer, register

__all__ = ["Pooling", "pooled_size"]

_PB_MAX, _PB_AVE, _PB_STOCHASTIC = 0, 1, 2          # PoolingParameter.PoolMethod
_PB_CEIL, _PB_FLOOR = 0, 1                           # PoolingParameter.RoundMode
_LOWEST = np.finfo(np.float32).min                   # Caffe's -FLT_MAX, where a MAX window starts
# Up to this many kernel offsets the argmax pooling visits each in turn (8 x 64 planes of 112 x 112,
# 3 x 3 stride 2: 224 ms against 304 ms by rows then columns); past it, rows then columns.
_FEW_OFFSETS = 16


def pooled_size(size: int, kernel: int, stride: int, pad: int, ceil: bool, any_pad: bool) -> int:
    """PoolingLayer::Reshape's output length along one axis.

    `any_pad`: whether either axis has a pad (Caffe's `if (pad_h_ || pad_w_)`),
    which alone decides whether the last window may start past in + pad.
    """
    span = size + 2 * pad - kernel
    out = (-(-span // stride) if ceil else span // stride) + 1
    if any_pad and (out - 1) * stride >= size + pad:
        out -= 1
    return out


@register("Pooling")
class Pooling(Layer):
    """Caffe's PoolingLayer (src/caffe/layers/pooling_layer.cpp): MAX or AVE over windows of each plane."""


    def setup(self) -> None:
        pool = self.param.pooling_param
        self.method = int(pool.pool)
        if self.method not in (_PB_MAX, _PB_AVE, _PB_STOCHASTIC):
            raise self.error(f"unknown pooling method {self.method}")
        # MAX may write its argmax to a second top (PoolingLayer::MaxTopBlobs).
        self.tops = (1, 2) if self.method == _PB_MAX else (1, 1)
        self.global_pooling = bool(pool.global_pooling)
        has = pool.HasField
        if self.global_pooling:
            if has("kernel_size") or has("kernel_h") or has("kernel_w"):
                raise self.error("global_pooling takes its kernel from the bottom: kernel_size, kernel_h and "
                                 "kernel_w must not be given")
            self.kernel = None
        else:
            if has("kernel_size") == (has("kernel_h") and has("kernel_w")):
                raise self.error("the kernel is kernel_size, or both kernel_h and kernel_w; not both"
                                 if has("kernel_size") else
                                 "has no kernel: give kernel_size, or both kernel_h and kernel_w")
            self.kernel = ((pool.kernel_size,) * 2 if has("kernel_size") else (pool.kernel_h, pool.kernel_w))
            if min(self.kernel) <= 0:
                raise self.error(f"kernel {self.kernel[0]} x {self.kernel[1]}: filter dimensions cannot be zero")
        self.pad = self._pair(pool, "pad", 0)
        self.stride = self._pair(pool, "stride", 1)
        if min(self.stride) <= 0:
            raise self.error(f"stride {self.stride[0]} x {self.stride[1]}: stride must be positive")
        if self.global_pooling and (self.pad != (0, 0) or self.stride != (1, 1)):
            raise self.error("global_pooling takes only pad 0 and stride 1")
        if self.pad != (0, 0):
            if self.method == _PB_STOCHASTIC:
                raise self.error("pad is implemented only for MAX and AVE pooling")
            if self.pad[0] >= self.kernel[0] or self.pad[1] >= self.kernel[1]:
                raise self.error(f"pad {self.pad[0]} x {self.pad[1]} must be smaller than the kernel "
                                 f"{self.kernel[0]} x {self.kernel[1]}")
        self.ceil = int(pool.round_mode) != _PB_FLOOR

    def _pair(self, pool, name: str, default: int) -> tuple:
        """(height, width) of pad or stride: `name` for both, or name_h and name_w together."""
        has_h, has_w = pool.HasField(f"{name}_h"), pool.HasField(f"{name}_w")
        if has_h or has_w:
            if pool.HasField(name) or not (has_h and has_w):
                raise self.error(f"give {name}, or both {name}_h and {name}_w (not {name} with one of them)")
            return int(getattr(pool, f"{name}_h")), int(getattr(pool, f"{name}_w"))
        value = int(getattr(pool, name)) if pool.HasField(name) else default
        return value, value

    def _plan(self, shape) -> tuple:
        """((N, C, H, W), kernel, (Ho, Wo)) for a bottom of `shape`, checked."""
        shape = tuple(int(d) for d in shape)
        if len(shape) != 4:
            raise self.error(f"bottom has shape {shape}; pooling takes 4 axes (num, channels, height, width)")
        if self.method == _PB_STOCHASTIC:
            raise self.error("STOCHASTIC pooling has no CPU forward in Caffe (NOT_IMPLEMENTED in "
                             "pooling_layer.cpp; its training forward samples at random)")
        height, width = shape[2:]
        kernel = (height, width) if self.global_pooling else tuple(int(k) for k in self.kernel)
        any_pad = self.pad != (0, 0)
        out = []
        for size, k, s, p, name in zip((height, width), kernel, self.stride, self.pad, ("height", "width")):
            if k > size + 2 * p:
                raise self.error(f"kernel {k} is larger than the padded {name} {size + 2 * p} ({name} {size} "
                                 f"+ 2 x pad {p})")
            out.append(pooled_size(size, k, s, p, self.ceil, any_pad))
        return shape, kernel, tuple(out)

    def reshape(self, shapes: list) -> list:
        shape, _, (out_h, out_w) = self._plan(shapes[0])
        top = (shape[0], shape[1], out_h, out_w)
        return [top] * max(1, len(self.top_names))

    def workspace(self, shapes: list) -> tuple:
        """The input extended by its pad and the last window's overhang (_extended)."""
        (n, c, h, w), kernel, (ho, wo) = self._plan(shapes[0])
        (ph, pw), (sh, sw) = self.pad, self.stride
        rows = ph + h + max(0, (ho - 1) * sh - ph + kernel[0] - h)
        cols = pw + w + max(0, (wo - 1) * sw - pw + kernel[1] - w)
        return n * c * rows * cols, "padded input"

    def forward(self, xs: list) -> list:
        x = np.ascontiguousarray(xs[0], dtype=FLOAT)
        shape, kernel, out = self._plan(x.shape)
        with_mask = len(self.top_names) > 1
        # Window (y, x) starts at (y s_h - p_h, x s_w - p_w) (pooling_layer.cpp, Forward_cpu): AVE divides its
        # sum by its size clipped to in + pad; MAX takes its largest value inside the image.
        if self.method == _PB_AVE:
            return [_average(x, kernel, self.stride, self.pad, out)]
        if with_mask:
            return list(_max_with_argmax(x, kernel, self.stride, self.pad, out))
        return [_max(x, kernel, self.stride, self.pad, out)]


def _extended(x: np.ndarray, pad: tuple, kernel: tuple, stride: tuple, out: tuple, fill) -> np.ndarray:
    """x with `pad` before each plane and what the last window needs after it (pad or overhang), filled with `fill`."""
    n, c, h, w = x.shape
    (ph, pw), (kh, kw), (sh, sw), (ho, wo) = pad, kernel, stride, out
    after_h = max(0, (ho - 1) * sh - ph + kh - h)
    after_w = max(0, (wo - 1) * sw - pw + kw - w)
    if ph == pw == after_h == after_w == 0:
        return x
    full = np.full((n, c, ph + h + after_h, pw + w + after_w), fill, FLOAT)
    full[:, :, ph:ph + h, pw:pw + w] = x
    return full


def _offset_views(xp: np.ndarray, kernel: tuple, stride: tuple, out: tuple):
    """(i, j, the (N, C, Ho, Wo) view of every window's element at kernel offset (i, j))."""
    (kh, kw), (sh, sw), (ho, wo) = kernel, stride, out
    for i in range(kh):
        for j in range(kw):
            yield i, j, xp[:, :, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw]


def _max(x, kernel, stride, pad, out) -> np.ndarray:
    """MAX pooling: fmax over the offsets from -FLT_MAX, the pad and overhang -FLT_MAX too.

    fmax keeps the non-NaN side, so a NaN never wins, as with Caffe's
    `bottom > top` test, and starting from -FLT_MAX gives Caffe's value for
    a window of -inf (or none) as well. The maximum of a window is the
    maximum of its rows' maxima: the columns' offsets first, then the rows',
    kh + kw array operations rather than kh x kw.
    """
    n, c, h, w = x.shape
    if kernel == (h, w) and out == (1, 1) and pad == (0, 0):
        flat = x.reshape(n, c, h * w)
        return np.fmax.reduce(flat, axis=2, initial=_LOWEST).astype(FLOAT, copy=False).reshape(n, c, 1, 1)
    xp = _extended(x, pad, kernel, stride, out, _LOWEST)
    (kh, kw), (sh, sw), (ho, wo) = kernel, stride, out
    rows = np.full((n, c, xp.shape[2], wo), _LOWEST, FLOAT)
    for j in range(kw):
        np.fmax(rows, xp[:, :, :, j:j + sw * (wo - 1) + 1:sw], out=rows)
    y = np.full((n, c, ho, wo), _LOWEST, FLOAT)
    for i in range(kh):
        np.fmax(y, rows[:, :, i:i + sh * (ho - 1) + 1:sh], out=y)
    return y


def _max_with_argmax(x, kernel, stride, pad, out) -> tuple:
    """MAX pooling and its argmax top (float h * W + w of the first greatest value, -1 where none beat -FLT_MAX).

    Caffe scans a window row by row and keeps a value only when it is
    strictly greater: the first greatest value in row-major order. Each
    window row's first greatest column is found first (kw operations), then
    the first row whose maximum is strictly greater than those above it (kh
    operations): the same element, at kh + kw array operations.
    """
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (ho, wo) = kernel, stride, pad, out
    xp = _extended(x, pad, kernel, stride, out, _LOWEST)
    if kh * kw <= _FEW_OFFSETS:
        return _max_with_argmax_by_offset(x, xp, kernel, stride, pad, out)
    cols = np.arange(wo) * sw - pw
    row_best = np.full((n, c, xp.shape[2], wo), _LOWEST, FLOAT)
    row_col = np.full((n, c, xp.shape[2], wo), -1, np.int32)
    for j in range(kw):
        view = xp[:, :, :, j:j + sw * (wo - 1) + 1:sw]
        better = view > row_best
        np.copyto(row_best, view, where=better)
        np.copyto(row_col, np.broadcast_to((cols + j).astype(np.int32), row_col.shape), where=better)
    y = np.full((n, c, ho, wo), _LOWEST, FLOAT)
    best_row = np.full((n, c, ho, wo), -1, np.int32)
    for i in range(kh):
        view = row_best[:, :, i:i + sh * (ho - 1) + 1:sh]
        better = view > y
        np.copyto(y, view, where=better)
        np.copyto(best_row, i, where=better)
    # The winning element: padded row a s_h + i (image row a s_h + i - p_h), the column its row kept.
    padded_row = (np.arange(ho, dtype=np.int32) * sh)[:, None] + np.maximum(best_row, 0)
    col = np.take_along_axis(row_col, padded_row, axis=2)
    mask = np.where(best_row >= 0, (padded_row - ph).astype(np.int64) * w + col, -1).astype(FLOAT)
    return y, mask


def _window_by_window(xp: np.ndarray, kernel: tuple, stride: tuple, out: tuple) -> np.ndarray:
    """The float32 sum of each window of extended `xp`, one window at a time, in Caffe's row-major order.

    For windows larger than their count (a kernel of 2000 over 2 x 2
    outputs): the Python loop then runs over the windows, and each window's
    values are added one after another (cumsum accumulates in order, as
    Caffe's loop does), so the work is Caffe's own.
    """
    n, c = xp.shape[:2]
    (kh, kw), (sh, sw), (ho, wo) = kernel, stride, out
    y = np.empty((n, c, ho, wo), FLOAT)
    for a in range(ho):
        for b in range(wo):
            window = xp[:, :, a * sh:a * sh + kh, b * sw:b * sw + kw].reshape(n, c, -1)
            y[:, :, a, b] = np.cumsum(window, axis=2, dtype=FLOAT)[:, :, -1] if window.shape[2] else 0
    return y


def _max_with_argmax_by_offset(x, xp, kernel, stride, pad, out) -> tuple:
    """_max_with_argmax for a small kernel: every offset in row-major order (quicker there than rows then columns)."""
    n, c, h, w = x.shape
    (sh, sw), (ph, pw), (ho, wo) = stride, pad, out
    y = np.full((n, c, ho, wo), _LOWEST, FLOAT)
    mask = np.full((n, c, ho, wo), -1.0, FLOAT)
    rows = np.arange(ho) * sh - ph
    cols = np.arange(wo) * sw - pw
    for i, j, view in _offset_views(xp, kernel, stride, out):
        # Only a value strictly greater replaces the best so far: the first of equal maxima stays.
        better = view > y
        np.copyto(y, view, where=better)
        index = ((rows + i)[:, None] * w + (cols + j)[None, :]).astype(FLOAT)
        np.copyto(mask, np.broadcast_to(index, mask.shape), where=better)
    return y, mask


def _average(x, kernel, stride, pad, out) -> np.ndarray:
    """AVE pooling: the sum over the offsets (zeros in the pad and overhang) over the window clipped to in + pad."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (ho, wo) = kernel, stride, pad, out
    if kernel == (h, w) and out == (1, 1) and pad == (0, 0):
        total = x.reshape(n, c, h * w).sum(axis=2, dtype=FLOAT)
        return (total / FLOAT(h * w)).reshape(n, c, 1, 1)
    xp = _extended(x, pad, kernel, stride, out, 0.0)
    if kh * kw <= ho * wo:
        y = np.zeros((n, c, ho, wo), FLOAT)
        for _, _, view in _offset_views(xp, kernel, stride, out):
            y += view
    else:
        y = _window_by_window(xp, kernel, stride, out)
    # pool_size = (hend - hstart) (wend - wstart), with the ends clipped to in + pad, the starts not clipped.
    start_h = np.arange(ho) * sh - ph
    start_w = np.arange(wo) * sw - pw
    size_h = np.minimum(start_h + kh, h + ph) - start_h
    size_w = np.minimum(start_w + kw, w + pw) - start_w
    sizes = (size_h[:, None] * size_w[None, :]).astype(FLOAT)
    with np.errstate(divide="ignore", invalid="ignore"):
        y /= sizes
    return y
