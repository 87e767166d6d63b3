"""Pictures of blobs as RGB images. Pure numpy: no file is read or written here.

The pages of a mapped input go back as its rows are drawn, when the call
says so (its Work, blobtool.engine.work).

What a blob's shape becomes (``view``):

=================  ===========================================================
shape              picture
=================  ===========================================================
(H, W)             heat map of the values, with their range
(C, H, W)          C == 3: colour image; the channels are Caffe's B, G, R and
(1, C, H, W)       are shown as R, G, B, all three stretched together from the
                   blob's min..max to 0..255. Otherwise (or with ``channel``)
                   one channel as a heat map.
(N, C, H, W)       a grid of the N filters, each stretched from its own
                   min..max to 0..255 (colour when C == 3, else one channel in
                   grey), with a one-pixel blue border between tiles. ``index``
                   shows item N alone as a (C, H, W) image.
=================  ===========================================================

Heat maps use viridis (nine stops, linear between them): dark violet for the
minimum, yellow for the maximum. NaN and Inf are left out of every range and
drawn magenta. A picture is built at one pixel per value; ``width`` shrinks it
(block means of the values) and ``min_size`` enlarges small images and filter
tiles by whole factors (nearest neighbour); borders stay one pixel wide.
A PNG enlarges heat maps further, to PNG_HEAT_SIZE (``heat_size``), and
writes their colour bar and range under them (report/legend.py).

Bounds: a picture holds at most ``max_pixels`` pixels (MAX_PIXELS for a PNG,
TERMINAL_MAX_PIXELS in the terminal): enlargement stops short of it, and a
larger picture is shrunk by block means until it fits. A grid shows at most
MAX_TILES filters, the first ones. ``Picture.limits`` says what a bound left
out or shrank.

Large planes are read in chunks of rows, so no full-size float temporary is
made: the values are widened, averaged and coloured a chunk at a time (a
band of rows averaged into one row of blocks is summed a chunk of rows at a
time), so memory stays bounded by a few rows of the plane.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..engine import kernels
from ..errors import UsageError, parameter
from ..engine.kernels import finite_range
from ..engine.work import current
from .text import fmt_num, fmt_shape

__all__ = ["Picture", "view", "heat_map",
           "colour_image", "filter_grid", "colourise", "grid_columns", "block_mean", "enlarge",
           "VIRIDIS", "NONFINITE_RGB", "BORDER_RGB", "EMPTY_RGB", "PNG_MIN_SIZE", "PNG_HEAT_SIZE", "TERMINAL_MIN_SIZE",
           "MAX_PIXELS",
           "TERMINAL_MAX_PIXELS", "MAX_TILES"]

# Viridis at 0, 1/8, ..., 1: perceptually even, readable in grey, and dark at
# the minimum so that a terminal's dark background frames the picture.
VIRIDIS = np.array([
    (68, 1, 84), (71, 45, 123), (59, 82, 139), (44, 114, 142), (33, 144, 140),
    (39, 173, 129), (93, 200, 99), (170, 220, 50), (253, 231, 37),
], dtype=np.float64)
# NaN and Inf pixels: magenta appears in neither viridis nor grey.
NONFINITE_RGB = (255, 0, 255)
# The border between grid tiles: a blue that no grey tile holds (Caffe's
# vis_square pads with white, which merges with the white pixels of grey
# tiles).
BORDER_RGB = (48, 96, 176)
# The grid cells after the last filter.
EMPTY_RGB = (0, 0, 0)
# Colours in a heat map's legend strip.
LEGEND_STEPS = 24
# Smallest size (pixels, longer side) of an image or filter tile in a PNG,
# and in the terminal: smaller ones are enlarged by a whole factor.
PNG_MIN_SIZE = 32
TERMINAL_MIN_SIZE = 10
# Smallest size (pixels, longer side) of a heat map in a PNG: a plane of values
# (a 10x64 InnerProduct weight) becomes 512x80 pixels, each value a square of
# one colour, rather than a 64x10 sliver; its colour bar and range go under it.
PNG_HEAT_SIZE = 512
# Most pixels in a picture: 4096 x 4096 in a PNG (48 MiB of RGB while it is
# built, about a second to encode), and 512 x 512 in the terminal (128K cells
# of half blocks, about a second for rich to draw). Without a bound, a 1.6 MB
# file of 400,000 1x1 filters made a PNG of 436 million pixels (62 s, 3 GB).
MAX_PIXELS = 1 << 24
TERMINAL_MAX_PIXELS = 1 << 18
# Most filters in a grid (64 x 64 tiles): each tile costs a pass of its own.
MAX_TILES = 4096
# Chunk of values read, widened and coloured at a time.
CHUNK = kernels.CHUNK


# -- the image model -----------------------------------------------------------

@dataclass
class Picture:
    """A blob drawn as an RGB image, with what a legend needs to explain it.

    rgb: (H, W, 3) uint8. kind: "heat", "colour" or "grid". value_range:
    the (min, max) of the finite values the colours span (per-tile ranges of a
    grid are not kept). legend: (LEGEND_STEPS, 3) uint8 colours from min to
    max, for heat maps. caption: one line saying what is shown. nonfinite:
    how many values were NaN or Inf (drawn magenta). scale: the whole factor
    of enlargement, or a negative factor of shrinking (-3: 3x3 values per
    pixel). grid: (rows, columns) of tiles and tile: a tile's (height, width)
    in pixels, for grids. notes: hints for the reader (which option to use).
    limits: what the size bounds left out or shrank, one line each (the
    command prints them as warnings when it writes a PNG).
    """

    rgb: np.ndarray
    kind: str
    caption: str
    value_range: tuple | None = None
    legend: np.ndarray | None = None
    nonfinite: int = 0
    scale: int = 1
    grid: tuple | None = None
    tile: tuple | None = None
    notes: list = field(default_factory=list)
    limits: list = field(default_factory=list)

    @property
    def height(self) -> int:
        return self.rgb.shape[0]

    @property
    def width(self) -> int:
        return self.rgb.shape[1]

    def shades(self, levels: int) -> np.ndarray:
        """Brightness 0..levels-1 of each pair of pixel rows (for a character ramp without colour).

        Returns (ceil(H/2), W) ints; each cell averages an upper and a lower pixel
        (Rec. 601 luma), as a half-block cell covers two rows.
        """
        rgb = self.rgb.astype(np.float64)
        if rgb.shape[0] % 2:
            rgb = np.concatenate([rgb, rgb[-1:]], axis=0)
        return _shade(_luma(rgb[0::2]) / 2.0 + _luma(rgb[1::2]) / 2.0, levels)

    def legend_shades(self, levels: int) -> list:
        """Brightness 0..levels-1 of each legend colour (the ramp a heat map uses without colour)."""
        if self.legend is None:
            return []
        return _shade(_luma(self.legend.astype(np.float64)), levels).tolist()


def _luma(rgb: np.ndarray) -> np.ndarray:
    return rgb @ np.array([0.299, 0.587, 0.114])


def _shade(luma: np.ndarray, levels: int) -> np.ndarray:
    return np.minimum((luma / 256.0 * levels).astype(np.int64), levels - 1)


def view(array: np.ndarray, *, channel: int | None = None, index: int | None = None,
         width: int | None = None, min_size: int = 0, max_pixels: int = MAX_PIXELS,
         heat_size: int | None = None) -> Picture:
    """The picture of a blob's values (shaped as the blob) that its shape calls for; see the module doc.

    width: at most this many pixels wide (None: one pixel per value; a grid
    first puts fewer filters per row). min_size: enlarge an image, or each
    grid tile, by the whole factor that makes its longer side at least this
    many pixels (never past `width`). max_pixels: the most pixels the
    picture may hold (see the module doc). heat_size: min_size for a heat
    map (default: min_size). Raises UsageError for shapes that are
    no picture (fewer than 2 axes, more than 4 that are not leading 1s) and
    for a channel or index out of range.
    """
    shape = tuple(array.shape)
    while array.ndim > 4 and array.shape[0] == 1:
        array = array[0]
    if array.ndim < 2 or array.ndim > 4:
        raise UsageError(f"a blob of shape {fmt_shape(shape)} is no picture: show needs (H, W), (C, H, W) "
                         "or (N, C, H, W)")
    if 0 in array.shape:
        raise UsageError(f"a blob of shape {fmt_shape(shape)} has no values to show")
    if index is not None:
        if array.ndim != 4:
            raise UsageError(f"{parameter('index')} picks one item of a 4-D blob (N, C, H, W); this blob has shape "
                             f"{fmt_shape(shape)}")
        _check_range("index", index, array.shape[0], "items")
        return _image(array[index], channel, width, min_size, max_pixels, f"item {index} of {array.shape[0]}",
                      heat_size)
    if array.ndim == 4:
        if array.shape[0] == 1:
            return _image(array[0], channel, width, min_size, max_pixels, None, heat_size)
        return filter_grid(array, channel=channel, width=width, min_size=min_size, max_pixels=max_pixels)
    if array.ndim == 3:
        return _image(array, channel, width, min_size, max_pixels, None, heat_size)
    if channel is not None:
        raise UsageError(f"{parameter('channel')} picks a channel of a 3-D or 4-D blob; this blob has shape "
                         f"{fmt_shape(shape)}")
    return heat_map(array, width=width, min_size=min_size if heat_size is None else heat_size, max_pixels=max_pixels)


def _image(chw: np.ndarray, channel, width, min_size, max_pixels, what, heat_size=None) -> Picture:
    c = chw.shape[0]
    if channel is None and c == 3:
        picture = colour_image(chw, width=width, min_size=min_size, max_pixels=max_pixels)
    else:
        if channel is not None:
            _check_range("channel", channel, c, "channels")
        picture = heat_map(chw[channel or 0], width=width, min_size=min_size if heat_size is None else heat_size,
                           max_pixels=max_pixels)
        if c > 1:
            picture.caption = f"channel {channel or 0} of {c}, " + picture.caption
            if channel is None:
                picture.notes.append("choose the channel with --channel")
    if what:
        picture.caption = f"{what}, " + picture.caption
    return picture


def heat_map(plane: np.ndarray, *, width: int | None = None, min_size: int = 0,
             max_pixels: int = MAX_PIXELS) -> Picture:
    """One (H, W) plane as viridis colours from its finite minimum to its maximum."""
    lo, hi, nonfinite = finite_range(plane)
    factor, limits = _bounded_factor(plane.shape[1], plane.shape[0], width, min_size, max_pixels)
    values = block_mean(plane, -factor) if factor < 0 else plane
    rgb = colourise(values, lo, hi, "heat")
    if factor > 1:
        rgb = enlarge(rgb, factor)
    caption = f"{plane.shape[0]}x{plane.shape[1]} heat map" + _scale_words(factor)
    return Picture(rgb, "heat", caption, value_range=(lo, hi), legend=_legend(), nonfinite=nonfinite, scale=factor,
                   limits=limits)


def _grey_planes_rgb(planes: list, lo, hi, factor: int) -> np.ndarray:
    """Planes stretched lo..hi to grey levels, as RGB: three planes give R, G, B; one gives grey.

    Shrunk (factor < 0, block means) or enlarged (factor > 1) by the scale
    factor; pixels from non-finite values are NONFINITE_RGB.
    """
    planes = [block_mean(p, -factor) if factor < 0 else p for p in planes]
    rgb = np.stack([colourise(p, lo, hi, "grey")[..., 0] for p in planes], axis=-1)
    if rgb.shape[-1] == 1:
        rgb = np.repeat(rgb, 3, axis=-1)
    bad = np.zeros(rgb.shape[:2], dtype=bool)
    for p in planes:
        bad |= _nonfinite_rows(p)
    rgb[bad] = NONFINITE_RGB
    if factor > 1:
        rgb = enlarge(rgb, factor)
    return rgb


def colour_image(chw: np.ndarray, *, width: int | None = None, min_size: int = 0,
                 max_pixels: int = MAX_PIXELS) -> Picture:
    """A (3, H, W) blob in Caffe's B, G, R order as an RGB image, the channels stretched together."""
    lo, hi, nonfinite = finite_range(chw)
    factor, limits = _bounded_factor(chw.shape[2], chw.shape[1], width, min_size, max_pixels)
    # Caffe keeps OpenCV's B, G, R order; reversing the channel axis gives R, G, B.
    rgb = _grey_planes_rgb([chw[c] for c in (2, 1, 0)], lo, hi, factor)
    caption = (f"{chw.shape[1]}x{chw.shape[2]} colour image, B,G,R shown as R,G,B, "
               f"values {fmt_num(lo)}..{fmt_num(hi)} stretched to 0..255" + _scale_words(factor))
    return Picture(rgb, "colour", caption, value_range=(lo, hi), nonfinite=nonfinite, scale=factor, limits=limits)


def filter_grid(nchw: np.ndarray, *, channel: int | None = None, columns: int | None = None,
                width: int | None = None, min_size: int = 0, max_pixels: int = MAX_PIXELS) -> Picture:
    """N filters (N, C, kh, kw) as tiles in a grid, each stretched from its own min..max.

    Colour (B,G,R as R,G,B) when C == 3 and no channel is chosen, else one
    channel in grey. One-pixel BORDER_RGB borders between tiles, none around the
    grid. columns: tiles per row (default: ceil(sqrt(N)), fewer when
    `width` needs it). At most MAX_TILES filters, the first ones, and at
    most `max_pixels` pixels: the tiles are enlarged less, or shrunk, to fit.
    """
    total, c, kh, kw = nchw.shape
    if channel is not None:
        _check_range("channel", channel, c, "channels")
    limits = []
    if total > MAX_TILES:
        nchw = nchw[:MAX_TILES]
        limits.append(f"showing the first {MAX_TILES:,} of {total:,} filters (a grid holds at most {MAX_TILES:,}); "
                      "show any one with --index N")
    n = nchw.shape[0]
    colour = c == 3 and channel is None
    wanted = _factor(kw, kh, width, min_size)

    def layout(factor):
        th, tw = _scaled(kh, factor), _scaled(kw, factor)
        cols = columns or grid_columns(n, tw, width)
        rows = -(-n // cols)
        return th, tw, cols, rows, (rows * th + rows - 1) * (cols * tw + cols - 1)

    factor = wanted
    th, tw, cols, rows, pixels = layout(factor)
    # Tiles of one pixel take about 4 pixels each with their borders: under
    # any bound of MAX_TILES * 4 pixels or more, the loop ends.
    while pixels > max_pixels and (th > 1 or tw > 1):
        factor = _smaller(factor, pixels / max_pixels)
        th, tw, cols, rows, pixels = layout(factor)
    limits += _shrink_limits(factor, wanted, max_pixels)
    columns = cols
    rgb = np.empty((rows * th + rows - 1, columns * tw + columns - 1, 3), dtype=np.uint8)
    rgb[...] = BORDER_RGB
    # The cells after the last filter are empty: black, as a dark terminal's background.
    used = n - (rows - 1) * columns
    if used < columns:
        rgb[(rows - 1) * (th + 1):, used * (tw + 1):] = EMPTY_RGB
    nonfinite = 0
    for i in range(n):
        tile = nchw[i] if colour else nchw[i, channel or 0][None]
        lo, hi, bad_here = finite_range(tile)
        nonfinite += bad_here
        cells = _grey_planes_rgb(list(tile[::-1] if colour else tile), lo, hi, factor)
        r, k = divmod(i, columns)
        rgb[r * (th + 1):r * (th + 1) + th, k * (tw + 1):k * (tw + 1) + tw] = cells
    what = "colour (B,G,R shown as R,G,B)" if colour else f"channel {channel or 0} of {c} in grey"
    shown = f"{n} filters" if n == total else f"the first {n:,} of {total:,} filters"
    caption = (f"{shown} of {kh}x{kw}, {what}, in {rows} rows of {columns}, "
               f"each stretched from its own min..max" + _scale_words(factor))
    picture = Picture(rgb, "grid", caption, nonfinite=nonfinite, scale=factor, grid=(rows, columns), tile=(th, tw),
                      limits=limits)
    if not colour and c > 1 and channel is None:
        picture.notes.append("choose the channel with --channel")
    return picture


def grid_columns(n: int, tile_width: int, width: int | None) -> int:
    """Tiles per grid row: ceil(sqrt(n)), or as many as fit in `width` pixels (at least 1)."""
    columns = math.ceil(math.sqrt(n))
    if width is not None:
        columns = min(columns, max(1, (width + 1) // (tile_width + 1)))
    return columns


# -- pixels --------------------------------------------------------------------

def colourise(values: np.ndarray, lo, hi, mode: str) -> np.ndarray:
    """(H, W) values to (H, W, 3) uint8: lo..hi to viridis ("heat") or black..white ("grey").

    Values are clipped to lo..hi; non-finite values become NONFINITE_RGB;
    lo == hi (or no finite value) gives the middle colour. Row chunks of
    about CHUNK values at a time.
    """
    h, w = values.shape
    out = np.empty((h, w, 3), dtype=np.uint8)
    span = (hi - lo) if lo is not None and hi is not None else 0.0
    rows = max(1, CHUNK // max(w, 1))
    for start in range(0, h, rows):
        part = kernels.widened(values[start:start + rows])
        finite = np.isfinite(part)
        if span > 0 and math.isfinite(span):
            t = (np.where(finite, part, lo) - lo) / span
            np.clip(t, 0.0, 1.0, out=t)
        elif span > 0:
            # a range past float64 (only from double blobs near 1.8e308)
            t = np.clip((np.where(finite, part, lo) / 2 - lo / 2) / (hi / 2 - lo / 2), 0.0, 1.0)
        else:
            t = np.full(part.shape, 0.5)
        block = out[start:start + rows]
        if mode == "heat":
            stops = np.linspace(0.0, 1.0, len(VIRIDIS))
            for k in range(3):
                block[..., k] = np.rint(np.interp(t, stops, VIRIDIS[:, k]))
        else:
            grey = np.rint(t * 255.0)
            block[...] = grey[..., None]
        block[~finite] = NONFINITE_RGB
    return out


def block_mean(plane: np.ndarray, factor: int) -> np.ndarray:
    """Mean of the finite values in each factor x factor block (edge blocks may be smaller).

    Returns (ceil(H/factor), ceil(W/factor)) float64, NaN where a block holds
    no finite value. Reads about CHUNK values at a time (whole rows), so the
    temporaries stay small at any plane size: a band of `factor` rows larger
    than that is summed a few rows at a time.
    """
    h, w = plane.shape
    if factor <= 1:
        return kernels.widened(plane)
    starts = np.arange(0, w, factor)
    out = np.empty((-(-h // factor), starts.size), dtype=np.float64)
    rows = max(1, CHUNK // max(w, 1))
    if rows >= factor:  # whole bands of blocks fit a chunk
        band = rows // factor * factor
        for start in range(0, h, band):
            sums, counts = _column_sums(plane[start:start + band], factor)
            out[start // factor:start // factor + sums.shape[0]] = _means(sums, counts, starts)
            # Inside source.releasing(), the rows' mapped pages go back (with the
            # page shared with the rows before): memory stays bounded.
            _release(plane[max(0, start - band):start + band])
        return out
    for b in range(out.shape[0]):
        sums = counts = None
        for start in range(b * factor, min(h, (b + 1) * factor), rows):
            stop = min(h, (b + 1) * factor, start + rows)
            sums, counts = _column_sums(plane[start:stop], stop - start, sums, counts)
            _release(plane[max(0, start - rows):stop])
        out[b] = _means(sums, counts, starts)[0]
    return out


def _column_sums(rows: np.ndarray, factor: int, sums=None, counts=None) -> tuple:
    """Per column, the sum and count of the finite values in each band of `factor` rows.

    The rows are added in order, one after the other (numpy reduces a
    C-ordered array over an outer axis so), on top of `sums`/`counts`, the
    rows of the band added before: a band summed in parts gives the same
    bits as a band summed at once.
    """
    part = kernels.widened(rows)
    finite = np.isfinite(part)
    part = np.where(finite, part, 0.0)
    tally = finite.astype(np.int64)
    if sums is not None:
        part[0] += sums[0]
        tally[0] += counts[0]
    r, w = part.shape
    full = r // factor * factor
    out = []
    for values in (part, tally):
        bands = [np.add.reduce(values[:full].reshape(-1, factor, w), axis=1)] if full else []
        if full < r:
            bands.append(np.add.reduce(values[full:], axis=0, keepdims=True))
        out.append(np.concatenate(bands) if len(bands) > 1 else bands[0])
    return out[0], out[1]


def _means(sums: np.ndarray, counts: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Block means from per-column band sums and counts: columns summed in blocks from `starts`."""
    sums = np.add.reduceat(sums, starts, axis=1)
    counts = np.add.reduceat(counts, starts, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / counts, np.nan)


def enlarge(rgb: np.ndarray, factor: int) -> np.ndarray:
    """Nearest-neighbour enlargement by a whole factor: each pixel becomes factor x factor."""
    if factor <= 1:
        return rgb
    return np.repeat(np.repeat(rgb, factor, axis=0), factor, axis=1)


def _nonfinite_rows(plane: np.ndarray) -> np.ndarray:
    out = np.zeros(plane.shape, dtype=bool)
    w = plane.shape[1]
    rows = max(1, CHUNK // max(w, 1))
    for start in range(0, plane.shape[0], rows):
        out[start:start + rows] = ~np.isfinite(plane[start:start + rows])
    return out


def _factor(w: int, h: int, width: int | None, min_size: int) -> int:
    """Whole scale factor for an image (or tile) w x h: >1 enlarges, <-1 shrinks, 1 keeps."""
    if width is not None and w > width:
        return -math.ceil(w / width)
    factor = max(1, math.ceil(min_size / max(w, h))) if min_size else 1
    if width is not None:
        factor = max(1, min(factor, width // w))
    return factor


def _bounded_factor(w: int, h: int, width: int | None, min_size: int, max_pixels: int) -> tuple[int, list]:
    """_factor for an image, then made smaller until the image holds at most `max_pixels`; and the limits line."""
    wanted = factor = _factor(w, h, width, min_size)
    while _scaled(w, factor) * _scaled(h, factor) > max_pixels and (_scaled(w, factor) > 1 or _scaled(h, factor) > 1):
        factor = _smaller(factor, _scaled(w, factor) * _scaled(h, factor) / max_pixels)
    return factor, _shrink_limits(factor, wanted, max_pixels)


def _smaller(factor: int, ratio: float) -> int:
    """The next smaller scale factor for a picture `ratio` times too large (in pixels)."""
    step = math.sqrt(ratio)
    if factor > 1:
        return max(1, min(factor - 1, math.floor(factor / step)))
    shrink = max(1, -factor)
    return -max(shrink + 1, math.ceil(shrink * step))


def _shrink_limits(factor: int, wanted: int, max_pixels: int) -> list:
    """The limits line when the pixel bound shrank a picture that would otherwise not have been shrunk as much."""
    if factor >= min(wanted, -1):
        return []
    return [f"shrunk to at most {max_pixels:,} pixels: each pixel the mean of {-factor}x{-factor} values"]


def _scaled(n: int, factor: int) -> int:
    return n * factor if factor >= 1 else -(-n // -factor)


def _legend() -> np.ndarray:
    t = np.linspace(0.0, 1.0, LEGEND_STEPS)[None, :]
    return colourise(t, 0.0, 1.0, "heat")[0]


def _scale_words(factor: int) -> str:
    if factor > 1:
        return f", each value {factor}x{factor} pixels"
    if factor < -1:
        return f", each pixel the mean of {-factor}x{-factor} values"
    return ""


def _check_range(name: str, value: int, size: int, what: str) -> None:
    if not 0 <= value < size:
        raise UsageError(f"{parameter(name, True)}{value} is out of range: the blob has {size} {what} (0..{size - 1})")


def _release(view) -> None:
    """Let the pages of a mapped input behind `view` go, when the call reads its values once (blobtool.work)."""
    pages = current().pages
    if pages is not None:
        pages.release(view)
