"""Images made into a net's input as Caffe's users made them: pycaffe's Transformer, in its order.

pycaffe's ``caffe.io.Transformer.preprocess`` takes an image as
``caffe.io.load_image`` gives it (H x W x K, RGB, float values in [0, 1])
and does, in this order: resize to the input's height and width, transpose
to K x H x W, reorder the channels (``channel_swap``, RGB to BGR for nets
trained on Caffe's own data layers, which read images with OpenCV), multiply
by ``raw_scale`` (255 for nets trained on pixel values 0-255), subtract the
mean (per channel, or an image), multiply by ``input_scale`` (Caffe's
``transform_param.scale``). ``preprocess`` does the same steps in float32,
so that without a resize its array equals the Transformer's to float32
rounding. ``caffe.Classifier``'s resize-then-crop (centre crop, or the ten
crops of ``caffe.io.oversample``: four corners and the centre, then the same
mirrored) is the `resize` and `oversample` arguments.

The resize is bilinear with half-pixel centres, as OpenCV's INTER_LINEAR
(Caffe's C++ data layers, cv::resize) computes it on float values, without
the Gaussian pre-filter that pycaffe's skimage applies when it shrinks:
docs/preprocessing.md gives the measured differences from both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import UsageError

__all__ = ["Preprocessing", "preprocess", "opencv_gray", "resize_bilinear", "crop_boxes", "to_channels", "mean_for", "scale_for"]

# The luma weights of OpenCV's cvtColor(BGR2GRAY), which Caffe's force_gray and its data layers' gray read use.
_GRAY = np.array([0.299, 0.587, 0.114], dtype=np.float32)


@dataclass
class Preprocessing:
    """The settings of one preprocessing, as the net's input takes them; `record()` says them in Caffe's order.

    `mean`: None, per-channel values (one, or one per channel in the net's
    channel order) or an image (C x H x W); `scale`: None, one factor or one
    per channel; `raw_scale`: the factor on values in [0, 1] (255: pixel
    values); `rgb`: keep RGB (default BGR, as Caffe's data layers read
    images); `resize`: (height, width) before a crop to the input's size, or
    None (the image resized to the input's size); `oversample`: ten crops.
    """

    mean: object = None
    scale: object = None
    raw_scale: float = 255.0
    rgb: bool = False
    resize: tuple | None = None
    oversample: bool = False
    mean_source: str = ""
    channels: int = 3               # the net input's: a gray net's order is neither RGB nor BGR
    notes: list = field(default_factory=list)
    forced: str = ""                # "gray" or "colour": the channels a data layer decoded its images to
    forced_by: str = ""             # which setting of which layer said so (force_gray of data layer data)
    mirror_by: str = ""             # the data layer whose transform_param asks for mirror (not done here)

    def record(self) -> dict:
        """JSON-ready, the steps in the order they are done."""
        mean = self.mean
        if mean is not None and np.ndim(mean) == 3:
            mean_said = {"image": self.mean_source or "given", "shape": list(np.shape(mean))}
        else:
            mean_said = None if mean is None else [float(v) for v in np.ravel(mean)]
        said = {"raw_scale": float(self.raw_scale), "channels": self._order(),
                "resize": list(self.resize) if self.resize else None, "oversample": bool(self.oversample),
                "mean": mean_said,
                "scale": None if self.scale is None else [float(v) for v in np.ravel(self.scale)]}
        if self.forced:
            said["decoded_as"] = {"channels": self.forced, "by": self.forced_by}
        if self.mirror_by:
            said["mirror"] = {"done": False, "asked_by": self.mirror_by}
        return said

    def _order(self) -> str:
        return "gray" if self.channels == 1 else "RGB" if self.rgb else "BGR"

    def line(self) -> str:
        """One line for stderr: what was done, in Caffe's order."""
        order = {"RGB": "RGB kept", "BGR": "RGB -> BGR", "gray": "gray"}[self._order()]
        steps = [f"values in [0, 1] x {_num(self.raw_scale)}", order]
        if self.forced == "gray":
            steps.insert(0, f"colour images made 8-bit gray as OpenCV decodes them ({self.forced_by})")
        elif self.forced:
            steps.insert(0, f"gray images made colour as OpenCV decodes them ({self.forced_by})")
        if self.resize:
            steps.append(f"resize to {self.resize[0]}x{self.resize[1]}, "
                         f"{'10 crops (corners, centre, mirrored)' if self.oversample else 'centre crop'}")
        if self.mean is not None:
            if np.ndim(self.mean) == 3:
                steps.append(f"minus mean image {self.mean_source or ''} ({'x'.join(map(str, np.shape(self.mean)))})"
                             .replace("  ", " "))
            else:
                steps.append(f"minus mean {','.join(_num(v) for v in np.ravel(self.mean))}")
        if self.scale is not None:
            steps.append(f"times {','.join(_num(v) for v in np.ravel(self.scale))}")
        line = "preprocessing: " + ", then ".join(steps)
        if self.mirror_by:
            # Caffe's DataTransformer flips at random whenever mirror is set, TEST phase included; a deploy net's
            # caller gives each image once, as it is.
            line += (f"; not mirrored ({self.mirror_by} asks for mirror: Caffe's data layer flips images at "
                     "random, a deploy net takes each image as it is)")
        return line


def _num(value) -> str:
    return f"{float(value):g}"


def to_channels(image: np.ndarray, channels: int) -> np.ndarray:
    """An H x W x K image with `channels` channels: gray repeated into colour, colour to luma (Caffe's force_gray)."""
    image = np.asarray(image, dtype=np.float32)
    if image.ndim == 2:
        image = image[:, :, None]
    have = image.shape[2]
    if have == channels:
        return image
    if have == 1 and channels == 3:
        return np.repeat(image, 3, axis=2)
    if have == 3 and channels == 1:
        return (image @ _GRAY)[:, :, None].astype(np.float32)
    raise UsageError(f"an image of {have} channels cannot be made into a net input of {channels} channels")


# OpenCV's 8-bit colour-to-gray by the decoder its imread and imdecode use: R, G, B weights, the added rounding
# term and the shift. libpng's own rgb_to_gray (PNG: truncated), OpenCV's icvCvt_BGR2Gray (BMP, TIFF, and the
# rest), cvtColor's (WebP, decoded to BGR first). Measured against OpenCV 4's IMREAD_GRAYSCALE: equal.
_GRAY_FIXED = {"PNG": (9797, 19234, 3737, 0, 15), "WEBP": (9798, 19235, 3735, 1 << 14, 15)}
_GRAY_ICV = (4899, 9617, 1868, 1 << 13, 14)


def opencv_gray(image: np.ndarray, fmt: str = "") -> np.ndarray:
    """A colour image (float in [0, 1], or integers) made gray as Caffe's force_gray and is_color: false decode it.

    Caffe decodes with OpenCV's imread/imdecode and IMREAD_GRAYSCALE, which
    turns colour to gray in the decoder of the file's format `fmt` (Pillow's
    name: PNG, WEBP, BMP, ...), in fixed point from the 8-bit values
    (_GRAY_FIXED): each pixel a whole 8-bit level, not the float luma a gray
    net is otherwise given. A JPEG's gray is libjpeg's luma of its YCbCr,
    before any RGB exists: from RGB it is approached within a few levels
    (docs/preprocessing.md). An image of one channel is returned as it is.
    """
    image = _fraction(image)
    if image.ndim != 3 or image.shape[2] != 3:
        return image
    red, green, blue, half, shift = _GRAY_FIXED.get(str(fmt).upper(), _GRAY_ICV)
    levels = np.rint(np.clip(image, 0, 1) * 255).astype(np.int64)
    gray = (levels[..., 0] * red + levels[..., 1] * green + levels[..., 2] * blue + half) >> shift
    return (gray.astype(np.float32) / np.float32(255))[:, :, None]


def resize_bilinear(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """The H x W x K image resized to `height` x `width`: bilinear, half-pixel centres, edges repeated (float32).

    Mirrors cv::resize with INTER_LINEAR on float values: source coordinate
    (x + 0.5) * scale - 0.5, clamped to the image.
    """
    image = np.asarray(image, dtype=np.float32)
    h, w = image.shape[:2]
    if (h, w) == (height, width):
        return image.copy()
    y0, y1, fy = _axis(h, height)
    x0, x1, fx = _axis(w, width)
    rows = image[y0] * (1 - fy)[:, None, None] + image[y1] * fy[:, None, None]
    out = rows[:, x0] * (1 - fx)[None, :, None] + rows[:, x1] * fx[None, :, None]
    return out.astype(np.float32)


def _axis(size: int, new: int) -> tuple:
    """The two source indices and the weight of the second, for each of `new` positions along an axis of `size`."""
    scale = size / new
    where = (np.arange(new, dtype=np.float64) + 0.5) * scale - 0.5
    where = np.clip(where, 0, size - 1)
    low = np.floor(where).astype(np.intp)
    high = np.minimum(low + 1, size - 1)
    return low, high, (where - low).astype(np.float32)


def crop_boxes(size: tuple, crop: tuple, oversample: bool) -> list:
    """(top, left) of each crop of `crop` in an image of `size`: the centre, or pycaffe's five (mirrored later).

    The centre is caffe.Classifier's (centre minus half the crop, truncated),
    which is Caffe's data layer's (size - crop) // 2 in TEST; the five are
    caffe.io.oversample's order: the four corners, then the centre.
    """
    (h, w), (ch, cw) = size, crop
    centre = (int(h / 2.0 - ch / 2.0), int(w / 2.0 - cw / 2.0))
    if not oversample:
        return [centre]
    return [(0, 0), (0, w - cw), (h - ch, 0), (h - ch, w - cw), centre]


def mean_for(mean, channels: int, size: tuple, where: str = "--mean") -> np.ndarray | None:
    """The mean as an array that broadcasts over a C x H x W image of `size`: values per channel, or an image cropped.

    A mean image larger than `size` is cropped at its centre, as Caffe's data
    layer crops it with the image ((mean - size) // 2 in TEST).
    """
    if mean is None:
        return None
    array = np.asarray(mean, dtype=np.float32)
    if array.ndim <= 1:
        array = array.reshape(-1)
        if array.size not in (1, channels):
            raise UsageError(f"{where}: {array.size} values for a net input of {channels} channels (give 1 or "
                             f"{channels})")
        return array.reshape(-1, 1, 1)
    if array.ndim == 4 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 3 or array.shape[0] not in (1, channels):
        raise UsageError(f"{where}: a mean image of shape {tuple(np.shape(mean))}, the net's input has {channels} "
                         "channels")
    (mh, mw), (h, w) = array.shape[1:], size
    if mh < h or mw < w:
        raise UsageError(f"{where}: a mean image of {mh}x{mw} is smaller than the {h}x{w} it is taken from")
    top, left = (mh - h) // 2, (mw - w) // 2
    return array[:, top:top + h, left:left + w]


def _transform(crop: np.ndarray, settings: Preprocessing, mean: np.ndarray | None, scale) -> np.ndarray:
    """One H x W x K crop (values in [0, 1]) to K x H x W in the Transformer's order and float32 arithmetic."""
    out = np.ascontiguousarray(crop.transpose(2, 0, 1), dtype=np.float32)
    if out.shape[0] == 3 and not settings.rgb:
        out = out[[2, 1, 0], :, :]
    out = out * np.float32(settings.raw_scale)
    if mean is not None:
        out = out - mean
    if scale is not None:
        out = out * scale
    return out.astype(np.float32, copy=False)


def scale_for(scale, channels: int):
    """The scale as an array that broadcasts over a C x H x W image (or None); UsageError for a wrong count."""
    if scale is None:
        return None
    array = np.asarray(scale, dtype=np.float32).reshape(-1)
    if array.size not in (1, channels):
        raise UsageError(f"--scale: {array.size} factors for a net input of {channels} channels (give 1 or "
                         f"{channels})")
    return array.reshape(-1, 1, 1)


def preprocess(images, shape, settings: Preprocessing | None = None, **options) -> np.ndarray:
    """The net input of `images`: float32, (N x crops) x C x H x W, as pycaffe's Transformer (and Classifier) make it.

    Parameters
    ----------
    images : H x W x K arrays (K 1 or 3, RGB), float values in [0, 1] as
        caffe.io.load_image gives them, or integers (uint8, uint16) taken
        as fractions of their type's maximum.
    shape : the net input's shape (C, H, W) or (N, C, H, W).
    settings : a Preprocessing, or its fields as keyword `options` (mean,
        scale, raw_scale, rgb, resize, oversample).

    Without `resize`, an image not of the input's size is resized to it; with
    `resize` (height, width) it is resized to that, then its centre crop (or,
    with `oversample`, ten crops: caffe.io.oversample's) is taken. A mean image
    of the resized image's size is subtracted where the crop was taken from
    (as Caffe's data layer does); one of the input's size, or larger, from
    each crop (centre-cropped first).
    """
    settings = settings or Preprocessing(**options)
    channels, height, width = (tuple(shape)[-3:])
    scale = scale_for(settings.scale, channels)
    out = []
    for image in images:
        image = to_channels(_fraction(image), channels)
        size = tuple(settings.resize) if settings.resize else (height, width)
        if image.shape[:2] != size:
            image = resize_bilinear(image, *size)
        whole = _whole_mean(settings.mean, channels, size, (height, width))
        mean = None if whole is not None else mean_for(settings.mean, channels, (height, width))
        crops = []
        for top, left in crop_boxes(size, (height, width), settings.oversample):
            piece = image[top:top + height, left:left + width]
            part = None if whole is None else whole[:, top:top + height, left:left + width]
            crops.append((piece, part))
        if settings.oversample:  # caffe.io.oversample: the five, then each mirrored left to right
            crops += [(piece[:, ::-1], None if part is None else part[:, :, ::-1]) for piece, part in crops]
        out += [_transform(piece, settings, part if part is not None else mean, scale) for piece, part in crops]
    if not out:
        return np.zeros((0, channels, height, width), dtype=np.float32)
    return np.stack(out)


def _whole_mean(mean, channels: int, size: tuple, crop: tuple):
    """A mean image of the resized image's own size (not the crop's): subtracted where each crop came from."""
    if mean is None or np.ndim(mean) < 3 or tuple(size) == tuple(crop):
        return None
    array = np.asarray(mean, dtype=np.float32)
    array = array[0] if array.ndim == 4 else array
    if tuple(array.shape[1:]) != tuple(size):
        return None
    return mean_for(array, channels, size)


def _fraction(image) -> np.ndarray:
    """An image's values as float32 fractions: floats as they are, integers over their type's maximum."""
    array = np.asarray(image)
    if np.issubdtype(array.dtype, np.integer):
        return array.astype(np.float32) / np.float32(np.iinfo(array.dtype).max)
    if array.dtype == np.bool_:
        return array.astype(np.float32)
    return array.astype(np.float32, copy=False)
