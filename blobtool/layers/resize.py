"""The forks' resizing layers: the YOLOv3 ports' Upsample (nearest neighbour) and PSPNet's Interp (bilinear).

Neither is BVLC Caffe's. "Upsample" names two different layers in the
forks: the YOLOv3 ports' nearest-neighbour upsampling (one bottom,
upsample_param.scale; eric612/MobileNet-YOLO's upsample_layer.cpp and the
darknet2caffe ports) and SegNet's max-unpooling (two bottoms, the second
the pooling mask; alexgkendall/caffe-segnet's upsample_layer.cpp). Both
run here, told apart by their bottoms as the forks' nets tell them.
Interp is hszhao/PSPNet's interp_layer.cpp with its caffe_cpu_interp2
(util/interp.cpp): bilinear with the corners aligned, its weights computed
in float as Caffe computes them.
"""

from __future__ import annotations

import numpy as np

from .base import FLOAT, Layer, register

__all__ = ["Upsample", "Interp"]

BILINEAR, NEAREST = "bilinear", "nearest_neighbor"   # InterpParameter.interp_type


@register("Upsample")
class Upsample(Layer):
    """Two forks' UpsampleLayer, told apart by the bottoms: nearest neighbour (one) or SegNet's unpooling (two).

    One bottom, the YOLOv3 ports' upsample_layer.cpp: output height and
    width are the input's times `scale`, top[n, c, h, w] = bottom[n, c,
    h // scale, w // scale].

    Two bottoms, caffe-segnet's upsample_layer.cpp: the values and a MAX
    pooling's mask (h * W_out + w within the plane, as Pooling's second top
    holds it), of one shape. The top, upsample_h x upsample_w (or H scale_h -
    pad_out_h by W scale_w - pad_out_w, scale for both where scale_h and
    scale_w are not given), is zero but where the mask points: Forward_cpu
    writes top[mask[i]] = value[i] for each i of a plane in order, so of two
    values the mask sends to one place the later stays. An index past the
    plane is Caffe's LOG(FATAL); a negative one (a window no value beat
    -FLT_MAX in) writes before the plane in Caffe, so both are refused here.
    """

    bottoms = (1, 2)

    def setup(self) -> None:
        p = self.param.upsample_param
        self.unpool = len(self.param.bottom) == 2
        if not self.unpool:
            self.scale = int(p.scale)
            if self.scale < 1:
                raise self.error(f"scale is {self.scale}; the nearest-neighbour Upsample takes a scale of 1 or more")
            return
        has = p.HasField
        if not ((has("upsample_h") and has("upsample_w")) or (not has("scale") and has("scale_h") and has("scale_w"))
                or (not has("scale_h") and not has("scale_w"))):
            raise self.error("upsample_h and upsample_w are required, else scale, or scale_h and scale_w "
                             "(caffe-segnet's upsample_layer.cpp)")
        self.size = None
        if has("upsample_h") and has("upsample_w"):
            self.size = (int(p.upsample_h), int(p.upsample_w))
            if min(self.size) <= 1:
                raise self.error(f"upsample_h {self.size[0]} and upsample_w {self.size[1]} must be greater than 1")
            return
        self.scales = (int(p.scale_h), int(p.scale_w)) if has("scale_h") else (int(p.scale),) * 2
        if min(self.scales) <= 1:
            raise self.error(f"scale {self.scales[0]} x {self.scales[1]}: SegNet's Upsample takes scales greater than 1")
        self.pad_out = (int(p.pad_out_h), int(p.pad_out_w))
        for pad, scale, axis in zip(self.pad_out, self.scales, ("h", "w")):
            if pad and scale != 2:
                raise self.error(f"pad_out_{axis} requires scale_{axis} 2 (the output size is ill-defined otherwise)")

    def reshape(self, shapes: list) -> list:
        shape = tuple(shapes[0])
        # Forward_cpu indexes the bottom as (N, C, H, W).
        if len(shape) != 4:
            raise self.error(f"bottom {shape} has {len(shape)} axes; Upsample takes (N, C, H, W)")
        n, c, h, w = shape
        if not self.unpool:
            return [(n, c, h * self.scale, w * self.scale)]
        if tuple(shapes[1]) != shape:
            raise self.error(f"the mask {tuple(shapes[1])} must have the values' shape {shape}")
        if self.size is not None:
            return [(n, c) + self.size]
        out = (h * self.scales[0] - self.pad_out[0], w * self.scales[1] - self.pad_out[1])
        if min(out) <= 0:
            raise self.error(f"the output would be {out[0]} x {out[1]}")
        return [(n, c) + out]

    def forward(self, xs: list) -> list:
        x = xs[0]
        n, c, h, w = x.shape
        if self.unpool:
            return [self._unpool(x, xs[1])]
        s = self.scale
        # top[..., i, j] = bottom[..., i // s, j // s]: each value spread over an s x s block.
        spread = np.broadcast_to(x[:, :, :, None, :, None], (n, c, h, s, w, s))
        return [np.ascontiguousarray(spread, dtype=FLOAT).reshape(n, c, h * s, w * s)]

    def _unpool(self, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
        n, c, h, w = x.shape
        out_h, out_w = self.reshape([x.shape, mask.shape])[0][2:]
        # static_cast<int>: truncation toward zero.
        index = np.trunc(mask.reshape(n * c, h * w).astype(np.float64))
        if not np.isfinite(index).all() or (index < 0).any() or (index >= out_h * out_w).any():
            bad = index[~(np.isfinite(index) & (index >= 0) & (index < out_h * out_w))]
            raise self.error(f"the mask holds {bad.flat[0]:g}, outside the {out_h} x {out_w} output (indices 0 to "
                             f"{out_h * out_w - 1}); check the scale against the pooling that made the mask")
        top = np.zeros((n * c, out_h * out_w), FLOAT)
        planes = np.arange(n * c)[:, None]
        # numpy's assignment writes in index order, so of repeated places the last value stays, as in Caffe's loop.
        top[np.broadcast_to(planes, index.shape), index.astype(np.intp)] = x.reshape(n * c, h * w)
        return top.reshape(n, c, out_h, out_w)


@register("Interp")
class Interp(Layer):
    """PSPNet's InterpLayer (interp_layer.cpp, caffe_cpu_interp2 in util/interp.cpp): resize H x W, corners aligned.

    The output size is given by exactly one of: zoom_factor (out = in + (in
    - 1)(zoom - 1)), shrink_factor (out = (in - 1) / shrink + 1), height
    and width, or a second bottom (its height and width). pad_beg and
    pad_end (0 or negative) first crop the input to in + pad_beg + pad_end
    rows and columns starting at -pad_beg. Bilinear: with r = (in - 1) /
    (out - 1) in float (0 when out is 1), output i reads input rows
    floor(r i) and the next (the last row repeats), weighted by the fraction
    (PSPNet's interp_type nearest_neighbor reads row floor(r i + 0.5)). Equal
    sizes copy the cropped input.
    """

    bottoms = (1, 2)

    def setup(self) -> None:
        p = self.param.interp_param
        self.kind = p.interp_type
        if self.kind not in (BILINEAR, NEAREST):
            raise self.error(f"interp_type is {self.kind!r}; Interp takes 'bilinear' or 'nearest_neighbor'")
        specs = {"zoom_factor": p.HasField("zoom_factor"), "shrink_factor": p.HasField("shrink_factor"),
                 "height and width": p.HasField("height") and p.HasField("width"),
                 "a second bottom": len(self.param.bottom) == 2}
        given = [name for name, present in specs.items() if present]
        if len(given) != 1:
            said = ", ".join(given) if given else "none of them"
            more = (" (DeepLab's Interp reads zoom_factor with shrink_factor as a shrink then a zoom; PSPNet's, "
                    "which blobtool runs, refuses it)"
                    if specs["zoom_factor"] and specs["shrink_factor"] else "")
            raise self.error("the output size must be given by exactly one of zoom_factor, shrink_factor, height "
                             f"and width, or a second bottom; this layer gives {said}{more}")
        self.spec = given[0]
        self.zoom, self.shrink = int(p.zoom_factor), int(p.shrink_factor)
        self.height, self.width = int(p.height), int(p.width)
        self.pad_beg, self.pad_end = int(p.pad_beg), int(p.pad_end)
        if self.pad_beg > 0 or self.pad_end > 0:
            raise self.error(f"pad_beg {self.pad_beg} and pad_end {self.pad_end}: Interp only supports "
                             "non-positive padding (cropping)")

    def reshape(self, shapes: list) -> list:
        shape = tuple(shapes[0])
        # Reshape reads num(), channels(), height(), width() and makes a 4-D top.
        if len(shape) != 4:
            raise self.error(f"bottom {shape} has {len(shape)} axes; Interp takes (N, C, H, W)")
        n, c, h, w = shape
        self.h_in, self.w_in = h + self.pad_beg + self.pad_end, w + self.pad_beg + self.pad_end
        if self.spec == "zoom_factor":
            if self.zoom < 1:
                raise self.error(f"zoom_factor is {self.zoom}; zoom factor must be positive")
            h_out = self.h_in + (self.h_in - 1) * (self.zoom - 1)
            w_out = self.w_in + (self.w_in - 1) * (self.zoom - 1)
        elif self.spec == "shrink_factor":
            if self.shrink < 1:
                raise self.error(f"shrink_factor is {self.shrink}; shrink factor must be positive")
            # C++ integer division truncates toward 0 ((in - 1) is >= 0 wherever in > 0).
            h_out = (self.h_in - 1) // self.shrink + 1
            w_out = (self.w_in - 1) // self.shrink + 1
        elif self.spec == "height and width":
            h_out, w_out = self.height, self.width
        else:
            like = tuple(shapes[1])
            if len(like) != 4:
                raise self.error(f"bottom 1 {like} has {len(like)} axes; it gives the output's height and width "
                                 "as (N, C, H, W)")
            h_out, w_out = like[2], like[3]
        if self.h_in <= 0 or self.w_in <= 0:
            raise self.error(f"pad_beg {self.pad_beg} and pad_end {self.pad_end} crop the {h} x {w} input to "
                             f"{self.h_in} x {self.w_in}; height and width should be positive")
        if h_out <= 0 or w_out <= 0:
            raise self.error(f"the output would be {h_out} x {w_out}; height and width should be positive")
        self.h_out, self.w_out = h_out, w_out
        return [(n, c, h_out, w_out)]

    def workspace(self, shapes: list) -> tuple:
        """The rows read before the columns are (N, C, out height, cropped input width), twice for bilinear."""
        n, c = tuple(shapes[0])[:2]
        return n * c * self.h_out * self.w_in * (2 if self.kind == BILINEAR else 1), "rows read"

    def _taps(self, size_in: int, size_out: int):
        """Per output index: the first input index, the step to the second (0 at the last), the weight of the second."""
        # caffe_cpu_interp2: rheight = (height2 > 1) ? float(height1 - 1) / (height2 - 1) : 0.f, all in float.
        ratio = FLOAT(size_in - 1) / FLOAT(size_out - 1) if size_out > 1 else FLOAT(0)
        real = ratio * np.arange(size_out, dtype=FLOAT)
        if self.kind == NEAREST:
            # caffe_cpu_nninterp2: h1 = floor(h1r + 0.5), h1r + 0.5 taken in double.
            return np.floor(real.astype(np.float64) + 0.5).astype(np.intp), None, None
        first = real.astype(np.intp)                      # int conversion truncates (h1r >= 0)
        step = (first < size_in - 1).astype(np.intp)      # h1p: 0 at the last input row
        return first, step, (real - first.astype(FLOAT)).astype(FLOAT)

    def forward(self, xs: list) -> list:
        top = -self.pad_beg   # caffe_cpu_interp2's x1 and y1 are both -pad_beg
        x = xs[0][:, :, top:top + self.h_in, top:top + self.w_in]
        if (self.h_in, self.w_in) == (self.h_out, self.w_out):
            return [np.ascontiguousarray(x, dtype=FLOAT)]
        rows, row_step, row_weight = self._taps(self.h_in, self.h_out)
        cols, col_step, col_weight = self._taps(self.w_in, self.w_out)
        if self.kind == NEAREST:
            return [np.ascontiguousarray(x[:, :, rows][:, :, :, cols], dtype=FLOAT)]
        upper, lower = x[:, :, rows], x[:, :, rows + row_step]
        w1 = col_weight
        w0 = FLOAT(1) - w1
        h1 = row_weight[:, None]
        h0 = FLOAT(1) - h1
        # h0 (w0 p00 + w1 p01) + h1 (w0 p10 + w1 p11), in this order and in float, as caffe_cpu_interp2.
        near = w0 * upper[:, :, :, cols] + w1 * upper[:, :, :, cols + col_step]
        far = w0 * lower[:, :, :, cols] + w1 * lower[:, :, :, cols + col_step]
        return [np.ascontiguousarray(h0 * near + h1 * far, dtype=FLOAT)]
