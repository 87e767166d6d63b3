"""blobtool.report.legend and `show -o x.png` of a heat map: enlarged small planes, the colour bar and its range.

The heat map's pixels are checked against the one-pixel-per-value picture
repeated (np.repeat), the bar against viridis's nine stops interpolated
here, and the numbers against the minimum and maximum numpy finds.
"""

from __future__ import annotations

import numpy as np
import pytest

from blobtool.report import legend
from blobtool.report.legend import BAR_HEIGHT, BAR_MIN_WIDTH, GAP, LEGEND_ROWS, colour_bar, png_pixels, text_pixels
from blobtool.report.pictures import MAX_PIXELS, NONFINITE_RGB, PNG_HEAT_SIZE, PNG_MIN_SIZE, VIRIDIS, view
from builders import Layer, write_blob, write_net
from runner import invoke

Image = pytest.importorskip("PIL.Image", reason="Pillow (the image extra) is not installed")

RNG = np.random.default_rng(64)
WHITE = (255, 255, 255)
BLACK = (0, 0, 0)


def png(tmp_path, *args) -> np.ndarray:
    out = tmp_path / "view.png"
    result = invoke("show", *args, "-o", out)
    assert result.exit_code == 0, result.stderr
    with Image.open(out) as im:
        assert im.mode == "RGB"
        return np.asarray(im)


def viridis_at(t: np.ndarray) -> np.ndarray:
    """Viridis's nine stops interpolated at t in 0..1, rounded: the colour map the bar must run over."""
    stops = np.linspace(0.0, 1.0, len(VIRIDIS))
    return np.stack([np.rint(np.interp(t, stops, VIRIDIS[:, k])) for k in range(3)], axis=-1).astype(np.uint8)


def drawn_text(rows: np.ndarray) -> np.ndarray:
    """Where the text colour is, in a strip of the legend."""
    return np.all(rows == BLACK, axis=-1)


def test_a_small_inner_product_is_enlarged_by_a_whole_factor(tmp_path):
    weight = RNG.standard_normal((10, 64)).astype(np.float32)
    net = write_net(tmp_path / "ip.caffemodel", "new", [Layer("ip", "InnerProduct", [weight, np.zeros(10)])])
    pixels = png(tmp_path, net, "--blob", "ip/0")
    factor = -(-PNG_HEAT_SIZE // 64)
    assert factor == 8 and pixels.shape == (10 * 8 + LEGEND_ROWS, 64 * 8, 3)
    one_per_value = view(weight).rgb
    assert one_per_value.shape == (10, 64, 3)
    # Nearest neighbour: each value a factor x factor square of its colour.
    assert np.array_equal(pixels[:80], np.repeat(np.repeat(one_per_value, factor, axis=0), factor, axis=1))
    # The same blob under its PyTorch name is the same picture.
    assert np.array_equal(png(tmp_path, net, "--names", "torch", "--blob", "ip.weight"), pixels)


def test_the_colour_bar_runs_over_the_colour_map_from_min_to_max(tmp_path):
    plane = RNG.standard_normal((6, 9))
    path = write_blob(tmp_path / "p.pb", plane.astype(np.float32))
    pixels = png(tmp_path, path)
    factor = -(-PNG_HEAT_SIZE // 9)
    h, w = 6 * factor, 9 * factor
    assert pixels.shape == (h + LEGEND_ROWS, w, 3)
    bar = pixels[h + GAP:h + GAP + BAR_HEIGHT]
    assert np.array_equal(bar, np.broadcast_to(bar[0], bar.shape))      # every row of the bar the same
    assert np.array_equal(bar[0], viridis_at(np.linspace(0.0, 1.0, w)))
    assert bar[0, 0].tolist() == VIRIDIS[0].tolist() and bar[0, -1].tolist() == VIRIDIS[-1].tolist()
    # White between the picture and the bar, and around the numbers.
    assert np.all(pixels[h:h + GAP] == WHITE)
    text = pixels[h + GAP + BAR_HEIGHT:]
    assert np.all((text == WHITE).all(axis=-1) | (text == BLACK).all(axis=-1))
    # The minimum under the bar's left end, the maximum under its right end, as numpy finds them.
    lo, hi = text_pixels(f"{plane.astype(np.float32).min():.6g}"), text_pixels(f"{plane.astype(np.float32).max():.6g}")
    row = h + GAP + BAR_HEIGHT + GAP // 2
    ink = drawn_text(pixels[row:row + lo.shape[0]])
    assert np.array_equal(ink[:, :lo.shape[1]], lo)
    assert np.array_equal(ink[:, w - hi.shape[1]:], hi)
    assert not ink[:, lo.shape[1]:w - hi.shape[1]].any()


def test_the_bar_is_the_colour_map_at_any_width():
    for width in (2, 9, 256, 1000):
        assert np.array_equal(colour_bar(width), viridis_at(np.linspace(0.0, 1.0, width)))


def test_the_font_draws_every_character_it_needs_and_tells_them_apart():
    chars = "0123456789.-+eNaIf/"
    masks = [text_pixels(c) for c in chars]
    assert all(m.shape == (5 * legend.GLYPH_SCALE, 3 * legend.GLYPH_SCALE) and m.any() for m in masks)
    assert len({m.tobytes() for m in masks}) == len(chars)
    # What fmt_num writes fits the font: "-1.5e-07" is 8 glyphs and 7 spaces.
    assert text_pixels("-1.5e-07").shape == (10, (8 * 3 + 7) * legend.GLYPH_SCALE)


def test_a_narrow_plane_gets_a_bar_of_readable_width(tmp_path):
    column = np.linspace(-3.0, 1.0, 600).reshape(600, 1).astype(np.float32)
    pixels = png(tmp_path, write_blob(tmp_path / "c.pb", column))
    # 600 values already pass 512 pixels: one pixel each; the PNG is as wide as the bar.
    assert pixels.shape == (600 + LEGEND_ROWS, BAR_MIN_WIDTH, 3)
    assert np.array_equal(pixels[:600, :1], view(column).rgb)
    assert np.all(pixels[:600, 1:] == WHITE)
    assert np.array_equal(pixels[600 + GAP], viridis_at(np.linspace(0.0, 1.0, BAR_MIN_WIDTH)))


def test_nan_and_inf_get_a_magenta_key(tmp_path):
    plane = np.arange(12, dtype=np.float32).reshape(3, 4)
    plane[1, 1] = np.nan
    plane[2, 0] = np.inf
    pixels = png(tmp_path, write_blob(tmp_path / "n.pb", plane))
    h = 3 * (PNG_HEAT_SIZE // 4)
    key = pixels[h + GAP + BAR_HEIGHT:]
    assert np.all(key == NONFINITE_RGB, axis=-1).any()
    # The picture's own NaN and Inf pixels are magenta too; the range is the finite values'.
    assert pixels[PNG_HEAT_SIZE // 4 + 1, PNG_HEAT_SIZE // 4 + 1].tolist() == list(NONFINITE_RGB)
    row = h + GAP + BAR_HEIGHT + GAP // 2
    lo = text_pixels("0")
    assert np.array_equal(drawn_text(pixels[row:row + lo.shape[0], :lo.shape[1]]), lo)


def test_large_planes_keep_their_size_and_shrinking():
    big = RNG.standard_normal((700, 600))
    # Past PNG_HEAT_SIZE: one pixel per value, as before.
    assert np.array_equal(view(big, min_size=PNG_MIN_SIZE, heat_size=PNG_HEAT_SIZE).rgb, view(big).rgb)
    # The pixel bound still shrinks (block means) and stops enlargement short of it.
    small = RNG.standard_normal((40, 50))
    bounded = view(small, min_size=PNG_MIN_SIZE, heat_size=PNG_HEAT_SIZE, max_pixels=200 * 200)
    assert bounded.scale == 4 and bounded.rgb.shape == (160, 200, 3)
    shrunk = view(big, heat_size=PNG_HEAT_SIZE, max_pixels=300 * 350)
    assert shrunk.scale == -2 and shrunk.rgb.shape == (350, 300, 3)
    assert png_pixels(shrunk).shape == (350 + LEGEND_ROWS, 300, 3)
    assert MAX_PIXELS == 4096 * 4096


def test_other_pictures_are_written_as_they_are(tmp_path):
    filters = RNG.standard_normal((4, 1, 3, 3)).astype(np.float32)
    net = write_net(tmp_path / "f.caffemodel", "new", [Layer("conv", "Convolution", [filters])])
    assert np.array_equal(png(tmp_path, net, "--blob", "conv/0"), view(filters, min_size=PNG_MIN_SIZE).rgb)
    # The terminal view keeps its own enlargement (TERMINAL_MIN_SIZE), not the PNG's.
    plane = view(RNG.standard_normal((2, 2)), min_size=10, max_pixels=1 << 18)
    assert plane.rgb.shape == (10, 10, 3)


DOCS = __import__("pathlib").Path(__file__).resolve().parents[2] / "docs"
# The pictures of docs/pictures.md and the commands that make them (from ../shared/realworld).
DOC_PICTURES = {"lenet_conv1.png": ("lenet_iter_10000.caffemodel", "--blob", "conv1/0"),
                "imagenet_mean.png": ("imagenet_mean.binaryproto",),
                "lenet_ip2.png": ("lenet_iter_10000.caffemodel", "--names", "torch", "--blob", "ip2.weight")}


@pytest.mark.parametrize("name", DOC_PICTURES)
def test_the_pictures_in_the_docs_are_what_show_makes(realworld, tmp_path, name):
    source, *args = DOC_PICTURES[name]
    with Image.open(DOCS / name) as im:
        shown = np.asarray(im.convert("RGB"))
    assert np.array_equal(png(tmp_path, realworld / source, *args), shown), f"regenerate docs/{name}"
    assert f"-o docs/{name}" in (DOCS / "pictures.md").read_text()
