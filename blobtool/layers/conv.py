"""Convolution and Deconvolution, forward: Caffe's src/caffe/layers/{base_conv,conv,deconv}_layer.cpp.

Both read convolution_param the same way (BaseConvolutionLayer::LayerSetUp):
kernel, stride, pad and dilation are given once for both spatial axes, once
per axis (repeated), or as kernel_h/kernel_w, stride_h/stride_w,
pad_h/pad_w (never both spellings). The weight blob is

- Convolution: (num_output, channels / group, kernel_h, kernel_w);
- Deconvolution: (channels, num_output / group, kernel_h, kernel_w)
  (Caffe's reverse_dimensions: the layer is the data gradient of a
  convolution from num_output to channels);

and the bias (num_output,). The forks' ConvolutionDepthwise is Convolution
under another name (it reads convolution_param and its weights alike, with
group = channels).

How the arithmetic is laid out here (Caffe runs one image at a time through
an im2col buffer and a GEMM per group):

- A convolution is one batched float32 matrix product per chunk of images
  side by side (or of output rows, for a large image): the chunk's rows of
  the padded input are made (only those), its column matrix is copied from
  a strided view of them, about kernels.COLUMN_BYTES at a time, and BLAS multiplies
  every group in one np.matmul, written to the top with the bias added.
- With stride 1 the columns of an output row are read as one run of the
  padded row-major plane, Wp wide, that runs on into the next row ("wide"
  columns): each column row is a contiguous copy, and the Wp - Wo extra
  outputs per row are dropped as the product is written.
- A 1 x 1 convolution with stride 1 and no pad needs no columns: the input
  is already the column matrix (Caffe's is_1x1_).
- A 3 x 3 convolution of stride 1 with many channels per group goes by
  Winograd's minimal filtering F(4 x 4, 3 x 3) (Lavin and Gray, "Fast
  Algorithms for Convolutional Neural Networks", 2016): each 6 x 6 input
  tile and each kernel are transformed (B^T d B, G g G^T), multiplied
  channel by channel as 36 matrix products, and transformed back
  (A^T m A) into a 4 x 4 output tile: 36 multiplications per 16 outputs
  instead of 144. Its rounding differs from Caffe's GEMM by about 1e-5 of
  a top's largest value (OpenCV's own 3 x 3 convolutions are Winograd's
  F(6 x 6, 3 x 3)), and a NaN or infinity in the bottom reaches the whole
  4 x 4 tiles whose 6 x 6 inputs hold it (Caffe: the outputs whose windows
  hold it). The kernels are transformed at each call: kept, they would
  hold 4 times the layer's weights.
- A depthwise convolution (one input channel per group) is a sum over the
  kernel's offsets of weight x shifted input, a block of planes at a time
  (cache-sized), each offset one contiguous run per plane (the plane split
  by stride phase, the rows wide as above): there is no matrix product
  worth a BLAS call.
- A deconvolution multiplies the transposed weights by the input (the
  columns), then adds each kernel offset's columns into the padded output
  at stride s (Caffe's col2im), one strided add per offset.

Where blobtool refuses what Caffe would run: only 2 spatial axes (Caffe
also runs N-D convolution through im2col_nd), and a kernel larger than the
padded input (Caffe's integer division truncates toward zero there, giving
one output that reads only padding or a CHECK failure).
"""

from __future__ import annotations

import numpy as np

from ..engine.blob import legacy_shapes_equal
from . import convkernels as kernels
from .base import FLOAT, Layer, count, register

__all__ = ["Convolution", "Deconvolution", "conv_output_size", "deconv_output_size", "stored_shape_fits"]

def stored_shape_fits(stored, expected) -> bool:
    """Whether a blob stored with shape `stored` is the `expected` one, as Caffe's Blob::ShapeEquals decides.

    A blob from an old model keeps its legacy 4-D shape (num, channels,
    height, width): a bias (1, 1, 1, N) is the (N,) Caffe expects. The
    stored shape does not say whether it came from the legacy fields, so
    any 4-D shape that pads so is taken (Caffe: only the legacy fields').
    """
    stored, expected = tuple(stored), tuple(expected)
    return stored == expected or (len(stored) == 4 and legacy_shapes_equal(stored, expected))


def conv_output_size(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    """Convolution's output length along one axis (conv_layer.cpp, compute_output_shape).

    out = (in + 2 pad - (dilation (kernel - 1) + 1)) / stride + 1, the division
    rounding down; the caller has made sure the kernel fits the padded input.
    """
    extent = dilation * (kernel - 1) + 1
    return (size + 2 * pad - extent) // stride + 1


def deconv_output_size(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    """Deconvolution's output length along one axis (deconv_layer.cpp, compute_output_shape).

    out = stride (in - 1) + dilation (kernel - 1) + 1 - 2 pad: the input a
    convolution of these parameters maps onto `size` outputs.
    """
    extent = dilation * (kernel - 1) + 1
    return stride * (size - 1) + extent - 2 * pad


class _BaseConvolution(Layer):
    """What Convolution and Deconvolution share: BaseConvolutionLayer's LayerSetUp and Reshape (base_conv_layer.cpp).

    Caffe lets a convolution take several bottoms, each of the same shape,
    convolved with the same weights into the top of the same position.
    """

    bottoms = (1, None)
    tops = (1, None)
    # Caffe's reverse_dimensions(): Deconvolution swaps the weight's channel roles.
    reverse = False

    def setup(self) -> None:
        conv = self.param.convolution_param
        self.kernel = self._per_axis(conv, "kernel_size", "kernel_h", "kernel_w", None)
        self.stride = self._per_axis(conv, "stride", "stride_h", "stride_w", 1)
        self.pad = self._per_axis(conv, "pad", "pad_h", "pad_w", 0)
        dilation = list(conv.dilation)
        if len(dilation) not in (0, 1, 2):
            raise self.error(f"dilation is given {len(dilation)} times; Caffe takes it once, or once per "
                             "spatial axis (2)")
        self.dilation = (tuple(dilation) * 2)[:2] if dilation else (1, 1)
        for what, values in (("kernel", self.kernel), ("stride", self.stride)):
            if min(values) <= 0:
                raise self.error(f"{what} {values[0]} x {values[1]}: {what} dimensions must be nonzero")
        self.num_output = int(conv.num_output)
        if self.num_output <= 0:
            raise self.error("num_output must be positive (it is 0 or not set)")
        self.group = int(conv.group)
        if self.group <= 0:
            raise self.error("group must be positive")
        if self.num_output % self.group:
            raise self.error(f"num_output {self.num_output} is not a multiple of group {self.group}")
        self.bias_term = bool(conv.bias_term)
        if self.blobs and len(self.blobs) != 1 + self.bias_term:
            raise self.error(f"holds {len(self.blobs)} blobs, expected {1 + self.bias_term} (weights"
                             f"{' and bias' if self.bias_term else ''}; bias_term is {str(self.bias_term).lower()})")

    def _per_axis(self, conv, repeated: str, name_h: str, name_w: str, default) -> tuple:
        """(height, width) of one of kernel, stride, pad: from `repeated` (once or per axis) or the _h/_w pair."""
        values = list(getattr(conv, repeated))
        if conv.HasField(name_h) or conv.HasField(name_w):
            if values:
                raise self.error(f"gives both {repeated} and {name_h}/{name_w}; Caffe takes one or the other")
            return int(getattr(conv, name_h)), int(getattr(conv, name_w))
        if not values:
            if default is None:
                raise self.error(f"has no {repeated} (nor {name_h} and {name_w})")
            return default, default
        if len(values) == 1:
            return int(values[0]), int(values[0])
        if len(values) == 2:
            return int(values[0]), int(values[1])
        raise self.error(f"{repeated} is given {len(values)} times; Caffe takes it once, or once per spatial "
                         "axis (2)")

    # -- Reshape --------------------------------------------------------------------------

    def _plan(self, shape) -> tuple:
        """(channel axis, (N, C, H, W) of the bottom with the leading axes folded into N, (Ho, Wo)), checked."""
        shape = tuple(int(d) for d in shape)
        axis = self.axis(self.param.convolution_param.axis, len(shape))
        spatial = len(shape) - axis - 1
        if spatial != 2:
            raise self.error(f"bottom shape {shape} has {spatial} spatial axes after axis {axis}: blobtool runs "
                             "2-D convolution only (height and width after the channel axis)")
        channels, height, width = shape[axis:]
        if channels % self.group:
            raise self.error(f"bottom has {channels} channels, not a multiple of group {self.group}")
        self._check_blobs(channels)
        out = tuple(self._output_size(size, k, s, p, d, name)
                    for size, k, s, p, d, name in zip((height, width), self.kernel, self.stride, self.pad,
                                                      self.dilation, ("height", "width")))
        return axis, (count(shape, 0, axis), channels, height, width), out

    def _check_blobs(self, channels: int) -> None:
        if not self.blobs:
            return
        c_out, c_in = (channels, self.num_output) if self.reverse else (self.num_output, channels)
        expected = (c_out, c_in // self.group) + self.kernel
        if not stored_shape_fits(self.blobs[0].shape, expected):
            roles = ("channels, num_output / group" if self.reverse else "num_output, channels / group")
            raise self.error(f"weight blob has shape {self.blobs[0].shape}, expected {expected} ({roles}, "
                             f"kernel_h, kernel_w) for a bottom of {channels} channels")
        if self.bias_term and not stored_shape_fits(self.blobs[1].shape, (self.num_output,)):
            raise self.error(f"bias blob has shape {self.blobs[1].shape}, expected ({self.num_output},)")

    def reshape(self, shapes: list) -> list:
        if self.top_names and len(shapes) != len(self.top_names):
            raise self.error(f"has {len(shapes)} bottoms and {len(self.top_names)} tops; Caffe's convolution "
                             "takes one top per bottom")
        first = tuple(shapes[0])
        for other in shapes[1:]:
            if tuple(other) != first:
                raise self.error(f"bottoms have shapes {first} and {tuple(other)}; all must have the same shape")
        axis, _, (out_h, out_w) = self._plan(first)
        return [first[:axis] + (self.num_output, out_h, out_w)] * len(shapes)

    def forward(self, xs: list) -> list:
        if not self.blobs:
            raise self.error("has no weights to run with (the net's weights were not given)")
        outputs = []
        for x in xs:
            axis, dims, out = self._plan(x.shape)
            x4 = np.ascontiguousarray(x, dtype=FLOAT).reshape(dims)
            y = self._forward4(x4, out)
            outputs.append(y.reshape(tuple(x.shape[:axis]) + y.shape[1:]))
        return outputs

    def _bias(self):
        return self.blobs[1].reshape(-1) if self.bias_term else None

    def workspace(self, shapes: list) -> tuple:
        """The padded input a convolution reads (convkernels.padded, band), at most."""
        _, (n, c, h, w), _ = self._plan(shapes[0])
        (ph, pw) = self.pad
        if (ph, pw) == (0, 0):
            return 0, ""
        return n * c * (h + 2 * ph) * (w + 2 * pw), "padded input"


@register("Convolution", "ConvolutionDepthwise")
class Convolution(_BaseConvolution):
    """Caffe's ConvolutionLayer (src/caffe/layers/conv_layer.cpp): cross-correlation of each image with the weights.

    top[n, o, y, x] = bias[o] + sum over c in o's group, i, j of
        weight[o, c', i, j] * bottom[n, c, y s_h - p_h + i d_h, x s_w - p_w + j d_w]
    (zero outside the image), with out = (in + 2p - (d (k - 1) + 1)) / s + 1.
    """

    def _output_size(self, size, kernel, stride, pad, dilation, name) -> int:
        extent = dilation * (kernel - 1) + 1
        if extent > size + 2 * pad:
            raise self.error(f"kernel extent {extent} (kernel {kernel}, dilation {dilation}) is larger than the "
                             f"padded {name} {size + 2 * pad} ({name} {size} + 2 x pad {pad})")
        return conv_output_size(size, kernel, stride, pad, dilation)

    def _forward4(self, x: np.ndarray, out_hw: tuple) -> np.ndarray:
        n, channels, _, _ = x.shape
        weight = self.blobs[0].reshape(self.num_output, channels // self.group, *self.kernel)
        bias = self._bias()
        tiles = n * -(-out_hw[0] // 4) * -(-out_hw[1] // 4)
        # Winograd and the columns add the bias as they write each chunk; the other two after.
        if (self.kernel == (3, 3) and self.stride == (1, 1) and self.dilation == (1, 1) and channels != self.group
                and min(channels, self.num_output) // self.group >= kernels.WINOGRAD_MIN_CHANNELS
                and tiles >= kernels.WINOGRAD_MIN_TILES):
            return kernels.conv_winograd(x, weight, bias, self.group, self.pad, out_hw)
        if self.kernel == (1, 1) and self.stride == (1, 1) and self.pad == (0, 0):
            y = kernels.conv_1x1(x, weight, self.group)
        elif channels == self.group:
            y = kernels.conv_depthwise(x, weight, self.stride, self.pad, self.dilation, out_hw)
        else:
            return kernels.conv_columns(x, weight, bias, self.group, self.stride, self.pad, self.dilation, out_hw)
        if bias is not None:
            y += bias[:, None, None]
        return y


@register("Deconvolution")
class Deconvolution(_BaseConvolution):
    """Caffe's DeconvolutionLayer (src/caffe/layers/deconv_layer.cpp): the transpose of a convolution.

    Each bottom pixel (c, y, x) adds weight[c, o', i, j] * bottom[n, c, y, x] to
    top[n, o, y s_h - p_h + i d_h, x s_w - p_w + j d_w] for o in c's group
    (what falls outside the top is dropped), with
    out = s (in - 1) + d (k - 1) + 1 - 2p.
    """

    reverse = True

    def _output_size(self, size, kernel, stride, pad, dilation, name) -> int:
        out = deconv_output_size(size, kernel, stride, pad, dilation)
        if out <= 0:
            raise self.error(f"output {name} would be {out} (stride {stride} x ({name} {size} - 1) + dilation "
                             f"{dilation} x (kernel {kernel} - 1) + 1 - 2 x pad {pad})")
        return out

    def workspace(self, shapes: list) -> tuple:
        """The uncropped output convkernels.deconv adds into: by stride phase, or padded where dilated."""
        _, (n, _, h, w), (ho, wo) = self._plan(shapes[0])
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.pad
        phased = n * self.num_output * sh * (h + -(-kh // sh) - 1) * sw * (w + -(-kw // sw) - 1)
        padded = n * self.num_output * (ho + 2 * ph) * (wo + 2 * pw)
        return max(phased, padded), "uncropped output"

    def _forward4(self, x: np.ndarray, out_hw: tuple) -> np.ndarray:
        n, channels, _, _ = x.shape
        weight = self.blobs[0].reshape(channels, self.num_output // self.group, *self.kernel)
        y = kernels.deconv(x, weight, self.group, self.stride, self.pad, self.dilation, out_hw)
        bias = self._bias()
        if bias is not None:
            y += bias[:, None, None]
        return y
