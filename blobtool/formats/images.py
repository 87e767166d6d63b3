"""Image files decoded to values in [0, 1]: JPEG, PNG, BMP, TIFF, WebP through Pillow (the `image` extra).

An image is decoded as caffe.io.load_image gave it to pycaffe (H x W x K,
RGB, float values in [0, 1]), with these choices, each said in the
Decoded's `notes`:

- EXIF orientation is followed (the image turned as a viewer shows it);
  pycaffe's skimage read did not turn it, OpenCV's imread (Caffe's C++
  data layers) does since OpenCV 3.1.
- 16-bit gray PNG and TIFF keep their 16 bits (values over 65535);
  palette images are expanded to their colours; an alpha channel is
  dropped (a net takes no alpha); CMYK and other modes are converted to RGB
  by Pillow.

Pillow is imported here only, on first use; without it a UsageError names
the extra (exit 2).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import FormatError, UsageError

__all__ = ["Decoded", "decode_image", "image_files", "IMAGE_SUFFIXES", "pillow"]

# What a folder's files are taken as images by: their names (a folder holds other files too).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")

# EXIF's Orientation tag.
_ORIENTATION = 0x0112


@dataclass
class Decoded:
    """One image: `pixels` H x W x K float32 in [0, 1] (K 1 or 3, RGB), its file's size and mode, what was done."""

    path: str
    pixels: np.ndarray
    mode: str
    notes: list = field(default_factory=list)
    format: str = ""                # Pillow's name of the file's format (PNG, JPEG, ...); "" for an array

    @property
    def size(self) -> tuple:
        return self.pixels.shape[:2]


def pillow():
    """The PIL.Image module; UsageError naming the extra where Pillow is not installed."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise UsageError("reading images needs Pillow: pip install 'blobtool[image]'") from exc
    return Image


def image_files(paths) -> list:
    """The image files of `paths`: files as given, a folder's image files (by suffix) in name order."""
    found = []
    for path in paths:
        path = os.fspath(path)
        if os.path.isdir(path):
            names = sorted(n for n in os.listdir(path) if n.lower().endswith(IMAGE_SUFFIXES))
            found += [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]
        else:
            found.append(path)
    return found


def decode_image(path) -> Decoded:
    """The image in file `path` (see the module); FormatError (exit 3) naming the file where it is not one."""
    image_module = pillow()
    from PIL import ImageOps, UnidentifiedImageError

    path = os.fspath(path)
    try:
        with image_module.open(path) as image:
            image.load()
            fmt = image.format or ""  # a turned image (exif_transpose) is a copy without it
            notes = []
            orientation = image.getexif().get(_ORIENTATION, 1)
            if orientation not in (1, None):
                image = ImageOps.exif_transpose(image)
                notes.append(f"EXIF orientation {orientation} followed (turned as a viewer shows it)")
            mode = image.mode
            pixels = _values(image, notes)
    except FileNotFoundError as exc:
        raise UsageError("no such file", path=path) from exc
    except image_module.DecompressionBombError as exc:
        # Pillow's bound on pixels (about 179 million): a small file can declare a huge image.
        raise FormatError(f"too many pixels to decode ({_why(exc)})", path=path) from exc
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise FormatError(f"not an image Pillow can read ({_why(exc)})", path=path) from exc
    return Decoded(path, pixels, mode, notes, fmt)


def _why(exc: Exception) -> str:
    text = str(exc).split("\n")[0]
    return text.replace(os.getcwd() + os.sep, "")[:120] or type(exc).__name__


def _values(image, notes: list) -> np.ndarray:
    """H x W x K float32 fractions of the decoded image's values, by its mode."""
    mode = image.mode
    if mode in ("I;16", "I;16B", "I;16L", "I;16N"):
        return (np.asarray(image, dtype=np.uint16).astype(np.float32) / 65535.0)[:, :, None]
    if mode == "I":  # Pillow's 16-bit PNGs open as 32-bit integers holding 0-65535
        values = np.asarray(image, dtype=np.int64)
        notes.append("16-bit values")
        return (np.clip(values, 0, 65535).astype(np.float32) / 65535.0)[:, :, None]
    if mode == "F":
        return np.asarray(image, dtype=np.float32)[:, :, None]
    if mode in ("1", "L"):
        return (np.asarray(image.convert("L"), dtype=np.float32) / 255.0)[:, :, None]
    if mode in ("LA", "La"):
        notes.append("alpha dropped")
        return (np.asarray(image.convert("L"), dtype=np.float32) / 255.0)[:, :, None]
    if mode == "P":
        notes.append("palette expanded")
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
        mode = image.mode
    if mode in ("RGBA", "RGBa", "PA"):
        notes.append("alpha dropped")
    return np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
