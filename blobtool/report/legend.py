"""A heat map's PNG with its colour bar and value range drawn under it. Pure numpy: no file is written here.

The terminal view prints a heat map's legend as text beside coloured
cells; a PNG carries it in its pixels (``png_pixels``), on white below the
picture, left-aligned with it:

======  =====================================================================
rows    what
======  =====================================================================
H       the heat map as ``view`` made it (its pixels unchanged)
GAP     white
BAR     the colour bar: column x is the colour map at x / (width - 1), so it
        runs from the colour of the minimum (left) to that of the maximum
        (right), over the whole width of the PNG
GAP/2   white
TEXT    the minimum under the bar's left end and the maximum under its right
        end, as the terminal writes them (6 significant digits); "NaN/Inf"
        beside a magenta square in between when the plane holds any
GAP/2   white
======  =====================================================================

The PNG is at least BAR_MIN_WIDTH pixels wide, and wider where the
numbers need it; a narrower heat map leaves white to its right. The text
is a built-in 3x5 pixel font (digits, ``.-+e``, and the letters of
"NaN/Inf"), each font pixel GLYPH_SCALE x GLYPH_SCALE image pixels, so
no font file or library is needed.
"""

from __future__ import annotations

import numpy as np

from .pictures import NONFINITE_RGB, colourise
from .text import fmt_num

__all__ = ["png_pixels", "colour_bar", "text_pixels", "GLYPHS", "GLYPH_SCALE", "BAR_HEIGHT", "BAR_MIN_WIDTH",
           "GAP", "LEGEND_ROWS", "BACKGROUND_RGB", "TEXT_RGB"]

# The font: 3 columns x 5 rows per glyph, "#" a pixel drawn.
GLYPHS = {
    "0": ("###", "#.#", "#.#", "#.#", "###"), "1": (".#.", "##.", ".#.", ".#.", "###"),
    "2": ("###", "..#", "###", "#..", "###"), "3": ("###", "..#", "###", "..#", "###"),
    "4": ("#.#", "#.#", "###", "..#", "..#"), "5": ("###", "#..", "###", "..#", "###"),
    "6": ("###", "#..", "###", "#.#", "###"), "7": ("###", "..#", "..#", "..#", "..#"),
    "8": ("###", "#.#", "###", "#.#", "###"), "9": ("###", "#.#", "###", "..#", "###"),
    ".": ("...", "...", "...", "...", ".#."), "-": ("...", "...", "###", "...", "..."),
    "+": ("...", ".#.", "###", ".#.", "..."), "e": ("...", "###", "###", "#..", "###"),
    "N": ("#.#", "###", "###", "###", "#.#"), "a": ("...", "##.", "..#", "###", "###"),
    "I": ("###", ".#.", ".#.", ".#.", "###"), "n": ("...", "##.", "#.#", "#.#", "#.#"),
    "f": (".##", "#..", "##.", "#..", "#.."), "/": ("..#", "..#", ".#.", "#..", "#.."),
    " ": ("...", "...", "...", "...", "..."),
}
# Image pixels per font pixel: 6 x 10 per glyph, readable at a PNG's usual zoom.
GLYPH_SCALE = 2
# Blank font columns between two glyphs.
_SPACING = 1
# Rows of the colour bar, and of white between the picture and the bar.
BAR_HEIGHT = 16
GAP = 8
# The narrowest PNG with a colour bar: a bar of fewer pixels shows too few colours to read.
BAR_MIN_WIDTH = 256
# What the legend adds under the heat map.
LEGEND_ROWS = GAP + BAR_HEIGHT + GAP // 2 + 5 * GLYPH_SCALE + GAP // 2
BACKGROUND_RGB = (255, 255, 255)
TEXT_RGB = (0, 0, 0)


def png_pixels(picture) -> np.ndarray:
    """The RGB pixels to write as a PNG: a heat map with its colour bar and range under it, any other picture as it is."""
    if picture.kind != "heat":
        return picture.rgb
    lo, hi = picture.value_range
    texts = [text_pixels(fmt_num(lo)), text_pixels(fmt_num(hi))]
    middle = _nonfinite_key() if picture.nonfinite else None
    needed = sum(t.shape[1] for t in texts) + 4 * GLYPH_SCALE * (1 + 2 * (middle is not None))
    if middle is not None:
        needed += middle.shape[1]
    h, w = picture.height, picture.width
    width = max(w, BAR_MIN_WIDTH, needed)
    out = np.empty((h + LEGEND_ROWS, width, 3), dtype=np.uint8)
    out[...] = BACKGROUND_RGB
    out[:h, :w] = picture.rgb
    top = h + GAP
    out[top:top + BAR_HEIGHT] = colour_bar(width)[None]
    row = top + BAR_HEIGHT + GAP // 2
    _paste(out, texts[0], row, 0)
    _paste(out, texts[1], row, width - texts[1].shape[1])
    if middle is not None:
        _paste(out, middle, row, (width - middle.shape[1]) // 2)
    return out


def colour_bar(width: int) -> np.ndarray:
    """(width, 3) uint8: the heat map's colours from its minimum (column 0) to its maximum (the last column)."""
    return colourise(np.linspace(0.0, 1.0, width)[None, :], 0.0, 1.0, "heat")[0]


def text_pixels(text: str) -> np.ndarray:
    """(5 * GLYPH_SCALE, width) bool: where `text` is drawn in the built-in font (a character it lacks: a blank)."""
    columns = []
    for k, char in enumerate(text):
        glyph = np.array([[c == "#" for c in row] for row in GLYPHS.get(char, GLYPHS[" "])])
        if k:
            columns.append(np.zeros((5, _SPACING), dtype=bool))
        columns.append(glyph)
    mask = np.concatenate(columns, axis=1) if columns else np.zeros((5, 0), dtype=bool)
    return np.repeat(np.repeat(mask, GLYPH_SCALE, axis=0), GLYPH_SCALE, axis=1)


def _nonfinite_key() -> np.ndarray:
    """A magenta square, then "NaN/Inf", as an RGB strip on the background."""
    text = text_pixels("NaN/Inf")
    side = text.shape[0]
    strip = np.empty((side, side + 2 * GLYPH_SCALE + text.shape[1], 3), dtype=np.uint8)
    strip[...] = BACKGROUND_RGB
    strip[:, :side] = NONFINITE_RGB
    strip[:, side + 2 * GLYPH_SCALE:][text] = TEXT_RGB
    return strip


def _paste(out: np.ndarray, what: np.ndarray, row: int, column: int) -> None:
    """Text (a bool mask, drawn in TEXT_RGB) or an RGB strip into `out` at (row, column)."""
    h, w = what.shape[:2]
    target = out[row:row + h, column:column + w]
    if what.dtype == bool:
        target[what] = TEXT_RGB
    else:
        target[...] = what
