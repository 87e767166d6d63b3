"""The arithmetic of Convolution and Deconvolution (conv.py): columns, 1 x 1, depthwise, Winograd, col2im.

conv.py's docstring says how each is laid out and when each is taken;
the sizes below are the chunks each works in, measured on the reference
machine.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .base import FLOAT

__all__ = ["COLUMN_BYTES", "DEPTHWISE_BYTES", "WINOGRAD_MIN_CHANNELS", "WINOGRAD_MIN_TILES", "WINOGRAD_CHUNK_TILES",
           "padded", "band", "conv_1x1", "conv_depthwise", "chunks", "conv_columns", "conv_winograd", "deconv"]

# The column matrix is built and multiplied in chunks of about this many
# bytes: the VGG-16 64 -> 64 3x3 layer at 224 x 224 took 21 ms with 8 MiB
# chunks, 22-24 ms with 2 or 16 MiB and 30 ms with the whole 117 MiB at once
# (pages of a fresh buffer that size fault in at every call).
COLUMN_BYTES = 8 << 20

# A depthwise convolution works through blocks of planes of about this many bytes (input, sum,
# term), which stay in cache across its taps: 16 x 64 planes of 56 x 56 took 6.5 ms in blocks of
# 1 MiB, 8 ms of 256 KiB, 22 ms as whole arrays.
DEPTHWISE_BYTES = 1 << 20

# Winograd's F(4x4, 3x3) runs a 3 x 3 convolution of stride 1 where both channel counts of a
# group reach this: its transforms cost about as much as the products they save below it
# (16 -> 16 channels at 32 x 32 took 25 ms against 20 ms by columns; 64 -> 64 at 8 x 8,
# 11 ms against 16 ms; 512 -> 512 at 28 x 28, 14 ms against 35 ms, one thread each).
WINOGRAD_MIN_CHANNELS = 32
# ... and where the call has this many 4 x 4 output tiles: each call transforms the kernels anew
# (36 / 9 of the weights), which 512 -> 512 at 14 x 14 (16 tiles) does not earn back.
WINOGRAD_MIN_TILES = 32
# Tiles transformed and multiplied at a time: enough for the 36 products to run at BLAS's speed,
# few enough for the transforms to stay in cache (64 -> 64 at 224 x 224: 23 ms with 256 tiles,
# 33 ms with 2048; 128 -> 128 at 112 x 112: 16 ms with 128, 18 ms with 2048).
WINOGRAD_CHUNK_TILES = 192

# A deconvolution of at least this stride sums its output with the column phase innermost (the
# adds then run along s values of a row): an upsampling by 32 (FCN-32s's 64 x 64 kernel) took
# 61 ms the other way, where a stride of 2 keeps the phases outermost (4.9 ms against 18 ms).
_DECONV_STRIDE_Q_INNER = 8

# The transforms of F(4x4, 3x3) at the points 0, +-1, +-2 and infinity (Lavin and Gray's):
# input tile d (6 x 6) -> B^T d B, kernel g (3 x 3) -> G g G^T, product m (6 x 6) -> A^T m A (4 x 4).
_WINOGRAD_BT = np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                         [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float64)
_WINOGRAD_G = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                        [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64)
_WINOGRAD_AT = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
                        np.float64)
# Both sides of each transform at once, on a tile flattened row by row: kron(L, L) vec(t) = vec(L t L^T).
_TILE_IN = np.kron(_WINOGRAD_BT, _WINOGRAD_BT).astype(FLOAT)     # (36, 36)
_KERNEL_IN = np.kron(_WINOGRAD_G, _WINOGRAD_G).astype(FLOAT)      # (36, 9)
_TILE_OUT = np.kron(_WINOGRAD_AT, _WINOGRAD_AT).astype(FLOAT)    # (16, 36)


def padded(x: np.ndarray, pad: tuple) -> np.ndarray:
    """x (N, C, H, W) with pad zeros around each plane, C-contiguous (x itself when there is no pad)."""
    (ph, pw), (n, c, h, w) = pad, x.shape
    if ph == 0 and pw == 0:
        return x
    xp = np.zeros((n, c, h + 2 * ph, w + 2 * pw), FLOAT)
    xp[:, :, ph:ph + h, pw:pw + w] = x
    return xp


def band(x: np.ndarray, pad: tuple, first: int, count: int, width: int) -> np.ndarray:
    """Rows first .. first + count of x's padded planes, `width` columns wide: zeros past the image.

    Padded row r is x's row r - pad_h; a chunk pads only the rows it reads,
    so the copy stays small and in cache for the reads that follow. x itself
    where that is exactly x.
    """
    (ph, pw), (n, c, h, w) = pad, x.shape
    top, bottom = max(first - ph, 0), min(first + count - ph, h)
    if (first - ph, count, pw, width) == (0, h, 0, w):
        return x
    band = np.zeros((n, c, count, width), FLOAT)
    if bottom > top:
        columns = min(w, width - pw)
        band[:, :, top + ph - first:bottom + ph - first, pw:pw + columns] = x[:, :, top:bottom, :columns]
    return band


def conv_1x1(x: np.ndarray, weight: np.ndarray, group: int) -> np.ndarray:
    """A 1 x 1 convolution of stride 1 without pad: the bottom's planes are the column matrix already."""
    n, c, h, w = x.shape
    c_out = weight.shape[0]
    wg = weight.reshape(group, c_out // group, c // group)
    y = np.matmul(wg, x.reshape(n, group, c // group, h * w))
    return y.reshape(n, c_out, h, w)


def conv_depthwise(x, weight, stride, pad, dilation, out_hw) -> np.ndarray:
    """A convolution with one input channel per group: the sum over the kernel's offsets of weight x shifted input.

    The planes go in blocks of about DEPTHWISE_BYTES, padded, and split by
    stride phase: tap (i, j) reads phase ((i d_h) mod s_h, (j d_w) mod s_w)
    of the padded plane, shifted by ((i d_h) div s_h, (j d_w) div s_w), so
    that with the outputs of each row laid out as wide as a phase row (the
    extra columns dropped at the end) every tap is one contiguous run per
    plane: a multiply and an add of whole blocks, in cache.
    """
    n, c, h, w = x.shape
    c_out, _, kh, kw = weight.shape
    (sh, sw), (ph, pw), (dh, dw), (ho, wo) = stride, pad, dilation, out_hw
    if kh * kw > ho * wo:
        return conv_depthwise_small(x, weight, stride, pad, dilation, out_hw)
    multiplier = c_out // c
    rows = ho + (kh - 1) * dh // sh + 1        # a phase's rows: the outputs', the last tap's shift, one for the run
    width = wo + (kw - 1) * dw // sw           # a phase's columns
    planes = n * c
    flat = x.reshape(planes, h, w)
    taps = weight.reshape(c, multiplier, kh * kw)
    y = np.empty((planes, multiplier, ho, wo), FLOAT)
    block = max(1, DEPTHWISE_BYTES // ((sh * rows * sw * width + 2 * multiplier * ho * width) * 4))
    for p0 in range(0, planes, block):
        p1 = min(planes, p0 + block)
        b = p1 - p0
        padded = np.zeros((b, sh * rows, sw * width), FLOAT)
        # Rows and columns past what the outputs read are left out (the buffer stops there).
        padded[:, ph:ph + h, pw:pw + w] = flat[p0:p1, :sh * rows - ph, :sw * width - pw]
        if sh == 1 and sw == 1:
            phases = {(0, 0): padded.reshape(b, rows * width)}
        else:
            phases = {(a, e): np.ascontiguousarray(padded[:, a::sh, e::sw]).reshape(b, rows * width)
                      for a in range(sh) for e in range(sw)}
        weights = taps[np.arange(p0, p1) % c]  # (b, multiplier, kh kw)
        wide = np.zeros((b, multiplier, ho * width), FLOAT)
        term = np.empty_like(wide)
        for i in range(kh):
            shift_i, phase_i = divmod(i * dh, sh)
            for j in range(kw):
                shift_j, phase_j = divmod(j * dw, sw)
                start = shift_i * width + shift_j
                run = phases[(phase_i, phase_j)][:, None, start:start + ho * width]
                np.multiply(run, weights[:, :, i * kw + j, None], out=term)
                wide += term
        y[p0:p1] = wide.reshape(b, multiplier, ho, width)[..., :wo]
    return y.reshape(n, c_out, ho, wo)


def conv_depthwise_small(x, weight, stride, pad, dilation, out_hw) -> np.ndarray:
    """A depthwise convolution whose kernel has more taps than its output pixels (a global 7 x 7 one, say).

    One multiply and add of the whole batch per tap: with so few outputs a
    tap's work is small, and blocks would only add calls.
    """
    n, c, _, _ = x.shape
    c_out, _, kh, kw = weight.shape
    multiplier = c_out // c
    (sh, sw), (dh, dw), (ho, wo) = stride, dilation, out_hw
    xp = padded(x, pad)
    y = np.zeros((n, c, multiplier, ho, wo), FLOAT)
    term = np.empty_like(y)
    taps = weight.reshape(c, multiplier, kh, kw)
    for i in range(kh):
        for j in range(kw):
            shifted = xp[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh, j * dw:j * dw + sw * (wo - 1) + 1:sw]
            np.multiply(shifted[:, :, None], taps[None, :, :, i, j, None, None], out=term)
            y += term
    return y.reshape(n, c_out, ho, wo)


def chunks(images: int, rows: int, per_row: int, budget: int | None = None):
    """(first image, stop image, first row, stop row) chunks of `per_row` floats a row, about `budget` bytes each.

    Whole images go together while they fit; a larger image is cut into bands
    of rows. The budget is COLUMN_BYTES unless given.
    """
    rows_per_chunk = max(1, (budget or COLUMN_BYTES) // max(1, per_row * 4))
    if rows_per_chunk >= rows:
        step = max(1, rows_per_chunk // max(1, rows))
        for n0 in range(0, images, step):
            yield n0, min(images, n0 + step), 0, rows
    else:
        for n0 in range(images):
            for h0 in range(0, rows, rows_per_chunk):
                yield n0, n0 + 1, h0, min(rows, h0 + rows_per_chunk)


def conv_columns(x, weight, bias, group, stride, pad, dilation, out_hw) -> np.ndarray:
    """Convolution by im2col and matrix products: the columns of a chunk of images or rows, one matmul per chunk.

    Column row (c, i, j) of output pixel (y, x) is the padded input at
    (c, y s_h + i d_h, x s_w + j d_w) (Caffe's im2col_cpu), so the columns
    are a strided view of the padded input, copied per chunk into a
    (C kh kw, images, rows, row) matrix: the images of a chunk side by side,
    so that small images still make one large product. With stride 1 an
    output row's columns are one contiguous run of the padded plane (Wp
    wide, reading on into the next row); the outputs past Wo in each row are
    dropped as the chunk's product is written to the top.
    """
    n, c, h, w = x.shape
    c_out, _, kh, kw = weight.shape
    (sh, sw), (dh, dw), (ho, wo) = stride, dilation, out_hw
    hp, wp = h + 2 * pad[0], w + 2 * pad[1]
    wide = sh == 1 and sw == 1
    row = wp if wide else wo          # column entries per output row
    k = c * kh * kw
    kg = k // group
    weights = weight.reshape(group, c_out // group, kg)
    y = np.empty((n, c_out, ho, wo), FLOAT)
    pieces = list(chunks(n, ho, k * row))
    most = max(((n1 - n0) * (h1 - h0) for n0, n1, h0, h1 in pieces), default=0)
    # Zeros where a wide run stops short of its last row's end: those outputs are dropped, but stay finite.
    buffer = np.zeros(k * most * row, FLOAT)
    for n0, n1, h0, h1 in pieces:
        images, rows = n1 - n0, h1 - h0
        # The padded rows these outputs read (a wide run reads on into one more, but for the last rows).
        reads = (rows - 1) * sh + (kh - 1) * dh + 1 + wide
        xp = band(x[n0:n1], pad, h0 * sh, min(reads, hp - h0 * sh), wp)
        s_n, s_c, s_h, s_w = xp.strides
        columns = buffer[:k * images * rows * row].reshape(c, kh, kw, images, rows * row)
        if wide:
            # The run for rows h0..h1 stops where the last kernel offset would read past the plane.
            length = min(rows * wp, (ho - h0) * wp - (kw - 1) * dw)
            view = as_strided(xp, (c, kh, kw, images, length), (s_c, dh * s_h, dw * s_w, s_n, s_w), writeable=False)
            np.copyto(columns[..., :length], view)
        else:
            view = as_strided(xp, (c, kh, kw, images, rows, wo),
                              (s_c, dh * s_h, dw * s_w, s_n, sh * s_h, sw * s_w), writeable=False)
            np.copyto(columns.reshape(view.shape), view)
        product = np.matmul(weights, columns.reshape(group, kg, images * rows * row))
        kept = product.reshape(c_out, images, rows, row)[..., :wo].transpose(1, 0, 2, 3)
        if bias is None:
            y[n0:n1, :, h0:h1] = kept
        else:
            np.add(kept, bias[:, None, None], out=y[n0:n1, :, h0:h1])
    return y


def conv_winograd(x, weight, bias, group, pad, out_hw) -> np.ndarray:
    """A 3 x 3 convolution of stride 1 by Winograd's F(4x4, 3x3).

    Output tile (Y, X) (rows 4Y..4Y+3, columns 4X..4X+3) reads the 6 x 6
    padded input from (4Y, 4X); the tiles of a chunk of images or tile rows
    (about WINOGRAD_CHUNK_TILES) are gathered as a (36, C, tiles) matrix (the
    input past the bottom and right edges is zeros, and the outputs it makes
    are dropped). The kernels are transformed at each call, in blocks of
    output channels of about COLUMN_BYTES: kept, they would hold 4 times the
    layer's weights.
    """
    n, c, _, _ = x.shape
    c_out = weight.shape[0]
    per_group, c_group = c_out // group, c // group
    ho, wo = out_hw
    kernels = weight.reshape(group, per_group, c_group * 9)
    step = max(1, COLUMN_BYTES // (36 * group * c_group * 4))
    blocks = [(o0, min(per_group, o0 + step)) for o0 in range(0, per_group, step)]

    def transformed(o0: int, o1: int) -> np.ndarray:
        """G g G^T of the kernels of outputs o0..o1 of each group: (36, group, o1 - o0, c_group)."""
        flat = np.ascontiguousarray(kernels[:, o0:o1]).reshape(-1, 9)
        return (_KERNEL_IN @ flat.T).reshape(36, group, o1 - o0, c_group)

    once = transformed(*blocks[0]) if len(blocks) == 1 else None
    biases = None if bias is None else bias.reshape(group, per_group)
    tiles_h, tiles_w = -(-ho // 4), -(-wo // 4)
    y = np.empty((n, c_out, ho, wo), FLOAT)
    by_group = y.reshape(n, group, per_group, ho, wo)
    for n0, n1, r0, r1 in chunks(n, tiles_h, 36 * c * tiles_w, 36 * c * 4 * WINOGRAD_CHUNK_TILES):
        images, rows = n1 - n0, r1 - r0
        tiles = images * rows * tiles_w
        xp = band(x[n0:n1], pad, 4 * r0, 4 * rows + 2, 4 * tiles_w + 2)
        s_n, s_c, s_h, s_w = xp.strides
        view = as_strided(xp, (6, 6, c, images, rows, tiles_w),
                          (s_h, s_w, s_c, s_n, 4 * s_h, 4 * s_w), writeable=False)
        inputs = (_TILE_IN @ np.ascontiguousarray(view).reshape(36, c * tiles)).reshape(36, group, c_group, tiles)
        height = min(ho, 4 * r1) - 4 * r0
        for o0, o1 in blocks:
            products = np.matmul(once if once is not None else transformed(o0, o1), inputs)  # (36, g, o, tiles)
            outputs = (_TILE_OUT @ products.reshape(36, -1)).reshape(4, 4, group, o1 - o0, images, rows, tiles_w)
            # (row in tile, column in tile, g, o, image, tile row, tile column) -> (image, g, o, row, column)
            plane = outputs.transpose(4, 2, 3, 5, 0, 6, 1).reshape(images, group, o1 - o0, 4 * rows, 4 * tiles_w)
            kept = plane[..., :height, :wo]
            target = by_group[n0:n1, :, o0:o1, 4 * r0:4 * r0 + height]
            if biases is None:
                target[...] = kept
            else:
                np.add(kept, biases[:, o0:o1, None, None], out=target)
    return y


def deconv(x, weight, group, stride, pad, dilation, out_hw) -> np.ndarray:
    """Deconvolution: columns = weight^T x per group, then col2im (Caffe's col2im_cpu).

    Column row (o, i, j) of input pixel (y, x) lands on output
    (o, y s_h - p_h + i d_h, x s_w - p_w + j d_w), added into an output
    padded by p on each side and cropped after.
    """
    n, c, h, w = x.shape
    _, per_group, kh, kw = weight.shape
    c_out = per_group * group
    (sh, sw), (ph, pw), (ho, wo) = stride, pad, out_hw
    planes = x.reshape(n, group, c // group, h * w)
    if (kh, kw, sh, sw, ph, pw) == (1, 1, 1, 1, 0, 0):
        weights_t = weight.reshape(group, c // group, per_group).transpose(0, 2, 1)
        return np.matmul(weights_t, planes).reshape(n, c_out, ho, wo)
    if dilation != (1, 1):
        return deconv_dilated(planes, weight, group, stride, pad, dilation, out_hw)
    y = np.empty((n, c_out, ho, wo), FLOAT)
    # With dilation 1, kernel row i = a s + r of input row y lands on padded output row (y + a) s + r.
    # The output is summed by phase, for row Y s + r and column X s + q: the columns of kernel row
    # band a and column band b add into it at (Y, X) = (y + a, x + b) in one add, every phase at once;
    # the phases are interleaved at the end. The phase axes go where the add's innermost run is
    # longest: (r, q, Y, X) for a small stride, (r, Y, X, q) for a large one (an upsampling by 32).
    # A band's kernel rows are multiplied in blocks of about COLUMN_BYTES.
    bands_h, bands_w = -(-kh // sh), -(-kw // sw)
    q_inner = sw >= _DECONV_STRIDE_Q_INNER
    per_kernel_row = c_out * kw * h * w * 4
    step = max(1, COLUMN_BYTES // (per_kernel_row * kh))
    for n0 in range(0, n, step):
        n1 = min(n, n0 + step)
        images = n1 - n0
        rows, cols = h + bands_h - 1, w + bands_w - 1
        phased = np.zeros((images, c_out, sh, rows, cols, sw) if q_inner else (images, c_out, sh, sw, rows, cols),
                          FLOAT)
        rows_per_block = max(1, COLUMN_BYTES // (per_kernel_row * images))
        for a in range(bands_h):
            band = min(sh, kh - a * sh)
            for r0 in range(0, band, rows_per_block):
                r1 = min(band, r0 + rows_per_block)
                kernel_rows = weight[:, :, a * sh + r0:a * sh + r1]
                weights_t = kernel_rows.reshape(group, c // group, -1).transpose(0, 2, 1)
                if c == group:
                    # One input channel per group: the product is an outer product, cheaper broadcast.
                    columns = weights_t * planes[n0:n1]
                else:
                    columns = np.matmul(weights_t, planes[n0:n1])
                columns = columns.reshape(images, c_out, r1 - r0, kw, h, w)
                for b in range(bands_w):
                    width = min(sw, kw - b * sw)
                    block = columns[:, :, :, b * sw:b * sw + width]          # (image, o, r, q, y, x)
                    if q_inner:
                        phased[:, :, r0:r1, a:a + h, b:b + w, :width] += block.transpose(0, 1, 2, 4, 5, 3)
                    else:
                        phased[:, :, r0:r1, :width, a:a + h, b:b + w] += block
        full = np.empty((images, c_out, rows, sh, cols, sw), FLOAT)
        np.copyto(full, phased.transpose(0, 1, 3, 2, 4, 5) if q_inner else phased.transpose(0, 1, 4, 2, 5, 3))
        flat = full.reshape(images, c_out, rows * sh, cols * sw)
        y[n0:n1] = flat[:, :, ph:ph + ho, pw:pw + wo]
    return y


def deconv_dilated(planes, weight, group, stride, pad, dilation, out_hw) -> np.ndarray:
    """A dilated deconvolution: each kernel offset's columns added into the padded output at stride s."""
    n, _, c_group, hw = planes.shape
    _, per_group, kh, kw = weight.shape
    c_out = per_group * group
    (sh, sw), (ph, pw), (dh, dw), (ho, wo) = stride, pad, dilation, out_hw
    h = (ho + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    w = hw // h
    weights_t = weight.reshape(group, c_group, per_group * kh * kw).transpose(0, 2, 1)
    y = np.empty((n, c_out, ho, wo), FLOAT)
    step = max(1, COLUMN_BYTES // max(1, c_out * kh * kw * hw * 4))
    for n0 in range(0, n, step):
        n1 = min(n, n0 + step)
        columns = np.matmul(weights_t, planes[n0:n1]).reshape(n1 - n0, c_out, kh, kw, h, w)
        full = np.zeros((n1 - n0, c_out, ho + 2 * ph, wo + 2 * pw), FLOAT)
        for i in range(kh):
            for j in range(kw):
                full[:, :, i * dh:i * dh + sh * (h - 1) + 1:sh, j * dw:j * dw + sw * (w - 1) + 1:sw] += \
                    columns[:, :, i, j]
        y[n0:n1] = full[:, :, ph:ph + ho, pw:pw + wo]
    return y
