"""The forks' resizing layers: the YOLOv3 ports' Upsample (nearest neighbour) and PSPNet's Interp (bilinear).

Neither is BVLC Caffe's. "Upsample" names two different layers in the
forks: the YOLOv3 ports' nearest-neighbour upsampling (one bottom,
upsample_param.scale; eric612/MobileNet-YOLO's upsample_layer.cpp and the
darknet2caffe ports) and SegNet's max-unpooling (two bottoms, the second
the pooling mask; alexgkendall/caffe-segnet's upsample_layer.cpp). Only the
first is run here; the second is refused by name, never guessed at.
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
    """The YOLOv3 ports' UpsampleLayer (upsample_layer.cpp): each value repeated scale x scale times.

    Output height and width are the input's times `scale`:
    top[n, c, h, w] = bottom[n, c, h // scale, w // scale]. A layer of this
    type with two bottoms is SegNet's max-unpooling, which is refused.
    """

    bottoms = (1, 2)

    def setup(self) -> None:
        if len(self.param.bottom) == 2:
            raise self.error("has two bottoms: that is SegNet's Upsample (max-unpooling with the pooling "
                             "layer's mask as its second bottom, alexgkendall/caffe-segnet), which blobtool does "
                             "not run; blobtool runs the YOLOv3 ports' nearest-neighbour Upsample, with one bottom "
                             "and upsample_param.scale")
        self.scale = int(self.param.upsample_param.scale)
        if self.scale < 1:
            raise self.error(f"scale is {self.scale}; the nearest-neighbour Upsample takes a scale of 1 or more")

    def reshape(self, shapes: list) -> list:
        shape = tuple(shapes[0])
        # Forward_cpu indexes the bottom as (N, C, H, W).
        if len(shape) != 4:
            raise self.error(f"bottom {shape} has {len(shape)} axes; Upsample takes (N, C, H, W)")
        n, c, h, w = shape
        return [(n, c, h * self.scale, w * self.scale)]

    def forward(self, xs: list) -> list:
        x, s = xs[0], self.scale
        n, c, h, w = x.shape
        # top[..., i, j] = bottom[..., i // s, j // s]: each value spread over an s x s block.
        spread = np.broadcast_to(x[:, :, :, None, :, None], (n, c, h, s, w, s))
        return [np.ascontiguousarray(spread, dtype=FLOAT).reshape(n, c, h * s, w * s)]


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
