"""Pictures: histogram cells, blobs as images, the terminal view and PNG output of `blobtool show`.

numpy.histogram is the oracle for the histogram counts; pixel values are
worked out by hand for small blobs (viridis stops, pure B/G/R channels,
grey ramps) and by an independent numpy formula for the real files. The
terminal rendering of a small blob is compared with tests/data/show_expected.txt
(made by `python tests/report/test_pictures.py`, then checked by eye with
`cat tests/data/show_expected.txt` on a truecolor terminal), and its cells are
decoded back into pixels. The real mean file and caffemodel are read from
../shared/realworld (skipped with a reason where that folder is absent).
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from PIL import Image

import runner
from blobtool import kernels
from blobtool.errors import UsageError
from blobtool.report import legend, pictures
from blobtool.report.pictures import (BORDER_RGB, EMPTY_RGB, NONFINITE_RGB, PNG_MIN_SIZE, TERMINAL_MIN_SIZE, filter_grid,
                                      heat_map, view)
from blobtool.report.text import histogram_bars
from blobtool.report.tables import SHADES, HalfBlocks, render_picture
from builders import Layer, write_blob, write_net, write_vector

DATA = Path(__file__).resolve().parents[1] / "data"
SHOW_EXPECTED = DATA / "show_expected.txt"

# The nine viridis stops, written out: values at 0, 1/4, 3/4 and 1 of the range
# must land exactly on stops 0, 2, 6 and 8.
VIOLET, BLUE, GREEN, YELLOW = (68, 1, 84), (59, 82, 139), (93, 200, 99), (253, 231, 37)


# -- helpers ---------------------------------------------------------------------

def invoke(*args, env=None):
    """blobtool in-process with NO_COLOR and FORCE_COLOR unset (and then `env`)."""
    return runner.invoke(*args, env={"NO_COLOR": None, "FORCE_COLOR": None, **(env or {})})


def grey(t: float) -> tuple:
    v = int(np.rint(t * 255))
    return (v, v, v)


def stretch(values, lo, hi) -> np.ndarray:
    """The expected 0..255 levels of values stretched from lo..hi (the oracle for real files)."""
    return np.rint((np.asarray(values, np.float64) - lo) / (hi - lo) * 255).astype(np.uint8)


def truecolor_console(width: int) -> Console:
    return Console(record=True, width=width, color_system="truecolor", force_terminal=True, file=io.StringIO(),
                   legacy_windows=False, _environ={})


def show_expected_text() -> str:
    """What render_picture draws for a known 3x4 blob on a 40-column truecolor terminal."""
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    console = truecolor_console(40)
    render_picture(console, "known.pb", "0", (3, 4), view(values, width=40, min_size=TERMINAL_MIN_SIZE))
    return console.export_text(styles=True)


def decode_half_blocks(rgb: np.ndarray, width: int) -> np.ndarray:
    """Draw `rgb` as HalfBlocks and read the pixels back out of the segments' styles."""
    console = truecolor_console(width)
    lines = console.render_lines(HalfBlocks(rgb), console.options.update(width=width), pad=False)
    height = len(lines) * 2
    out = np.full((height, rgb.shape[1], 3), -1, dtype=np.int64)
    for y, line in enumerate(lines):
        x = 0
        for seg in line:
            assert set(seg.text) == {"▀"}, seg.text
            top = seg.style.color.get_truecolor()
            bottom = seg.style.bgcolor.get_truecolor() if seg.style.bgcolor else None
            for _ in seg.text:
                out[2 * y, x] = tuple(top)
                if bottom is not None:
                    out[2 * y + 1, x] = tuple(bottom)
                x += 1
        assert x == rgb.shape[1]
    return out


# -- histogram cells -------------------------------------------------------------

def test_histogram_bars_are_log_scaled_with_a_floor_of_one():
    bars = histogram_bars([128, 64, 63, 32, 2, 1, 0, 100], zeros=16, nonfinite=0)
    # each halving of the count is one step down (64 < c <= 128 is full height,
    # 32 < c <= 64 one lower); any non-empty bin is at least 1
    assert bars["bars"] == [8, 7, 7, 6, 2, 1, 0, 8]
    assert bars["zeros"] == 5 and bars["nonfinite"] is False
    far = histogram_bars([10 ** 6, 1], nonfinite=3)
    assert far["bars"] == [8, 1] and far["zeros"] == 0 and far["nonfinite"] is True
    assert histogram_bars([]) == {"bars": [], "zeros": 0, "nonfinite": False}


def test_info_stats_json_has_the_histogram_of_data_and_diff(tmp_path):
    data = np.array([0.0, 0.0, 1.0, -2.0, np.nan, 4.0, 0.5, np.inf], dtype=np.float32)
    path = write_blob(tmp_path / "h.pb", data, np.arange(8, dtype=np.float32))
    result = invoke("info", "--json", "--stats", path)
    assert result.exit_code == 0, result.stderr
    stats = json.loads(result.stdout)["blobs"][0]["stats"]
    finite = data[np.isfinite(data)].astype(np.float64)
    counts, edges = np.histogram(finite, bins=kernels.HIST_BINS)
    assert stats["data"]["histogram"] == {"edges": edges.tolist(), "counts": counts.tolist(), "zeros": 2}
    counts, edges = np.histogram(np.arange(8.0), bins=kernels.HIST_BINS)
    assert stats["diff"]["histogram"] == {"edges": edges.tolist(), "counts": counts.tolist(), "zeros": 1}


def test_info_stats_human_output_draws_a_histogram_line_per_blob_and_diff(tmp_path):
    data = np.array([0.0, 0.0, 1.0, -2.0, np.nan, 4.0, 0.5, 3.0], dtype=np.float32)
    path = write_blob(tmp_path / "h.pb", data, [1.0] * 8)
    result = invoke("info", "--stats", path)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    key = next(i for i, line in enumerate(lines) if line.strip().startswith("histograms"))
    data_line, diff_line = lines[key + 1], lines[key + 2]
    # data: counts over 16 bins of -2..4 (log-scaled blocks), then │, the zeros'
    # block (2 zeros, the largest count: full height) and ! for the NaN
    counts = np.histogram(data[np.isfinite(data)], bins=16)[0]
    heights = histogram_bars(counts.tolist(), 2, 1)["bars"]
    cell = "".join("▁▂▃▄▅▆▇█"[h - 1] if h else " " for h in heights) + "│█!"
    assert data_line.split() == ["0", "-2", *cell.split(), "4"]
    assert cell in data_line
    # the diff: all values 1.0 (one bin, the 9th of 0.5..1.5), no zero, no NaN
    assert diff_line.split()[:3] == ["0", "diff", "1"]
    assert " " * 8 + "█" + " " * 7 + "│  " in diff_line


# -- pictures of small known blobs ---------------------------------------------

def test_a_2x2_blob_is_a_heat_map_of_known_colours():
    picture = view(np.array([[0.0, 2.0], [6.0, 8.0]], dtype=np.float32))
    assert picture.kind == "heat" and picture.value_range == (0.0, 8.0)
    assert picture.rgb.dtype == np.uint8 and picture.rgb.shape == (2, 2, 3)
    assert [tuple(p) for p in picture.rgb.reshape(-1, 3)] == [VIOLET, BLUE, GREEN, YELLOW]
    assert tuple(picture.legend[0]) == VIOLET and tuple(picture.legend[-1]) == YELLOW
    assert "2x2 heat map" in picture.caption


def test_nan_and_inf_pixels_are_magenta_and_left_out_of_the_range():
    picture = heat_map(np.array([[np.nan, 2.0], [np.inf, 10.0]]))
    assert picture.value_range == (2.0, 10.0) and picture.nonfinite == 2
    assert [tuple(p) for p in picture.rgb.reshape(-1, 3)] == [NONFINITE_RGB, VIOLET, NONFINITE_RGB, YELLOW]


def test_a_range_past_float64_is_drawn_without_overflow():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        picture = heat_map(np.array([[-1e308, 1e308], [0.0, np.nan]]))
        hist = kernels.histogram(np.array([-1e308, 1e308, 0.0]), bins=4)
    middle = tuple(int(v) for v in pictures.VIRIDIS[4])
    assert [tuple(p) for p in picture.rgb.reshape(-1, 3).tolist()] == [VIOLET, YELLOW, middle, NONFINITE_RGB]
    assert hist["counts"] == [1, 0, 1, 1] and hist["edges"] == [-1e308, -5e307, 0.0, 5e307, 1e308]


def test_a_constant_blob_is_drawn_in_the_middle_colour():
    picture = heat_map(np.full((2, 3), 7.0))
    middle = tuple(pictures.VIRIDIS[4].astype(int))
    assert {tuple(p) for p in picture.rgb.reshape(-1, 3)} == {middle}


def test_a_bgr_mean_image_becomes_rgb_pixels():
    # Caffe's channel order is B, G, R: pure blue, green and red pixels, one black, one grey.
    b = [[0.0, 0.0], [10.0, 5.0]]
    g = [[0.0, 10.0], [0.0, 5.0]]
    r = [[10.0, 0.0], [0.0, 5.0]]
    mean = np.array([[b, g, r]], dtype=np.float32)          # (1, 3, 2, 2)
    picture = view(mean)
    assert picture.kind == "colour" and picture.value_range == (0.0, 10.0)
    assert picture.rgb.tolist() == [[[255, 0, 0], [0, 255, 0]],
                                    [[0, 0, 255], [128, 128, 128]]]
    assert view(mean[0]).rgb.tolist() == picture.rgb.tolist()      # (3, H, W) the same
    # the three channels are stretched together, so their balance is kept
    shifted = view(mean + 100.0)
    assert shifted.value_range == (100.0, 110.0) and shifted.rgb.tolist() == picture.rgb.tolist()


def test_one_channel_of_a_colour_image_is_a_heat_map():
    image = np.zeros((3, 2, 2), dtype=np.float32)
    image[1] = [[0.0, 2.0], [6.0, 8.0]]
    picture = view(image, channel=1)
    assert picture.kind == "heat" and picture.caption.startswith("channel 1 of 3")
    assert [tuple(p) for p in picture.rgb.reshape(-1, 3)] == [VIOLET, BLUE, GREEN, YELLOW]


def test_four_filters_tile_into_a_grid_with_one_pixel_borders():
    # each filter is 0..8 plus its own offset and scale: each is stretched alone
    ramp = np.arange(9, dtype=np.float32).reshape(3, 3)
    filters = np.stack([(ramp * (k + 1) + 100 * k)[None] for k in range(4)])   # (4, 1, 3, 3)
    picture = view(filters)
    assert picture.kind == "grid" and picture.grid == (2, 2)
    assert picture.rgb.shape == (2 * 3 + 1, 2 * 3 + 1, 3)
    border = [tuple(p) for p in picture.rgb[3].tolist()] + [tuple(p) for p in picture.rgb[:, 3].tolist()]
    assert set(border) == {BORDER_RGB}
    expected = [[grey(v / 8.0) for v in row] for row in ramp]
    for top in (0, 4):
        for left in (0, 4):
            tile = [[tuple(p) for p in row] for row in picture.rgb[top:top + 3, left:left + 3].tolist()]
            assert tile == expected


def test_a_grid_leaves_the_cells_after_the_last_filter_empty():
    filters = np.random.default_rng(1).normal(size=(5, 1, 2, 2))
    picture = filter_grid(filters)
    assert picture.grid == (2, 3) and picture.rgb.shape == (2 * 2 + 1, 3 * 2 + 2, 3)
    # the last row: filters 3 and 4 at columns 0-1 and 3-4, borders at 2 and 5, empty after
    assert {tuple(p) for p in picture.rgb[3:, 6:].reshape(-1, 3).tolist()} == {EMPTY_RGB}
    assert {tuple(p) for p in picture.rgb[:, 5].tolist()} == {BORDER_RGB}


def test_colour_filters_are_shown_in_colour_and_a_channel_in_grey():
    filters = np.zeros((2, 3, 1, 2), dtype=np.float32)
    filters[:, 0, 0, 0] = 1.0       # B in the left pixel
    filters[:, 2, 0, 1] = 1.0       # R in the right pixel
    picture = filter_grid(filters)
    assert picture.rgb.shape == (1, 5, 3)
    assert picture.rgb[0].tolist() == [[0, 0, 255], [255, 0, 0], list(BORDER_RGB), [0, 0, 255], [255, 0, 0]]
    channel = filter_grid(filters, channel=2)
    assert channel.rgb[0].tolist() == [[0, 0, 0], [255, 255, 255], list(BORDER_RGB), [0, 0, 0], [255, 255, 255]]
    assert "channel 2 of 3 in grey" in channel.caption


def test_small_filters_are_enlarged_for_png_and_borders_stay_one_pixel():
    filters = np.random.default_rng(2).normal(size=(4, 1, 5, 5))
    picture = view(filters, min_size=PNG_MIN_SIZE)
    factor = -(-PNG_MIN_SIZE // 5)
    tile = 5 * factor
    assert picture.scale == factor and picture.tile == (tile, tile)
    assert picture.rgb.shape == (2 * tile + 1, 2 * tile + 1, 3)
    assert {tuple(p) for p in picture.rgb[tile].tolist()} == {BORDER_RGB}
    assert {tuple(p) for p in picture.rgb[:, tile].tolist()} == {BORDER_RGB}
    assert BORDER_RGB not in {tuple(p) for p in picture.rgb[tile - 1, :tile].tolist()}
    assert BORDER_RGB not in {tuple(p) for p in picture.rgb[:tile, tile - 1].tolist()}
    # nearest neighbour: each value is a factor x factor block of one colour
    small = view(filters).rgb
    assert np.array_equal(picture.rgb[:tile, :tile], np.repeat(np.repeat(small[:5, :5], factor, 0), factor, 1))


def test_a_grid_puts_fewer_filters_per_row_to_fit_a_width():
    filters = np.random.default_rng(4).normal(size=(20, 1, 5, 5))
    assert view(filters).grid == (4, 5)
    narrow = view(filters, width=20)
    assert narrow.grid == (7, 3) and narrow.width == 3 * 5 + 2 <= 20


def test_a_wide_image_shrinks_to_the_width_by_block_means():
    plane = np.arange(64, dtype=np.float64).reshape(8, 8)
    plane[0, 0] = np.nan
    picture = heat_map(plane, width=4)
    assert picture.scale == -2 and picture.rgb.shape == (4, 4, 3)
    means = plane.reshape(4, 2, 4, 2).transpose(0, 2, 1, 3).reshape(4, 4, 4)
    expected = np.array([[np.nanmean(block) for block in row] for row in means])
    assert np.array_equal(picture.rgb, pictures.colourise(expected, 1.0, 63.0, "heat"))
    # the range stays that of the values, not of the block means
    assert picture.value_range == (1.0, 63.0)


def test_block_mean_handles_edge_blocks_and_chunks():
    rng = np.random.default_rng(5)
    plane = rng.normal(size=(301, pictures.CHUNK // 50 + 7))
    got = pictures.block_mean(plane, 3)
    h, w = plane.shape
    expected = np.array([[plane[i:i + 3, j:j + 3].mean() for j in range(0, w, 3)] for i in range(0, h, 3)])
    assert got.shape == expected.shape and np.allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape, factor", [((301, 50), 5), ((37, 203), 7), ((9, 1000), 4)])
def test_block_mean_in_parts_of_a_band_is_the_band_at_once(monkeypatch, shape, factor):
    # Bands of `factor` rows wider than a chunk are summed a few rows at a time; the rows are still added
    # in order, so the means are the same bits as a band summed at once (as when the band fits a chunk).
    rng = np.random.default_rng(6)
    plane = rng.normal(size=shape) * 10.0 ** rng.integers(-8, 8, size=shape)
    plane[::7, ::5] = np.nan
    plane[1, :] = np.inf
    monkeypatch.setattr(pictures, "CHUNK", 1 << 22)
    at_once = pictures.block_mean(plane, factor)
    # The plain computation: each band's rows added in order, then each block's columns summed.
    h, w = shape
    finite = np.isfinite(plane)
    values = np.where(finite, plane, 0.0)
    starts = np.arange(0, w, factor)
    expected = []
    for b in range(0, h, factor):
        sums, counts = values[b].copy(), finite[b].astype(np.int64)
        for row in range(b + 1, min(h, b + factor)):
            sums = sums + values[row]
            counts = counts + finite[row]
        block_sums, block_counts = np.add.reduceat(sums, starts), np.add.reduceat(counts, starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            expected.append(np.where(block_counts > 0, block_sums / block_counts, np.nan).tolist())
    assert repr(at_once.tolist()) == repr(expected)
    monkeypatch.setattr(pictures, "CHUNK", 2 * shape[1] - 1)  # one row at a time
    in_parts = pictures.block_mean(plane, factor)
    assert repr(in_parts.tolist()) == repr(at_once.tolist())
    monkeypatch.setattr(pictures, "CHUNK", 1)
    assert repr(pictures.block_mean(plane, factor).tolist()) == repr(at_once.tolist())


USAGE_ERRORS = {
    # name: (shape, options, text in the message: view()'s keyword arguments, the command's options in show's tests)
    "1-D": ((6,), {}, "a blob of shape (6,) is no picture"),
    "0-D": ((), {}, "a blob of shape () is no picture"),
    "5-D": ((2, 1, 3, 2, 2), {}, "a blob of shape (2, 1, 3, 2, 2) is no picture"),
    "empty": ((0, 3), {}, "has no values to show"),
    "channel out of range": ((3, 2, 2), {"channel": 3}, "channel=3 is out of range: the blob has 3 channels"),
    "index out of range": ((4, 1, 2, 2), {"index": 4}, "index=4 is out of range: the blob has 4 items"),
    "index of a 3-D blob": ((3, 2, 2), {"index": 0}, "index picks one item of a 4-D blob"),
    "channel of a 2-D blob": ((2, 2), {"channel": 0}, "channel picks a channel of a 3-D or 4-D blob"),
    "grid channel out of range": ((4, 2, 2, 2), {"channel": 2}, "channel=2 is out of range"),
}


@pytest.mark.parametrize("name", USAGE_ERRORS)
def test_shapes_and_options_that_make_no_picture_are_usage_errors(name):
    shape, options, text = USAGE_ERRORS[name]
    with pytest.raises(UsageError) as err:
        view(np.zeros(shape, dtype=np.float32), **options)
    assert text in str(err.value)
    assert err.value.exit_code == 2


def test_leading_ones_past_four_axes_are_dropped():
    picture = view(np.array([0.0, 2.0, 6.0, 8.0]).reshape(1, 1, 1, 2, 2))
    assert [tuple(p) for p in picture.rgb.reshape(-1, 3)] == [VIOLET, BLUE, GREEN, YELLOW]


# -- the terminal view -----------------------------------------------------------

def test_terminal_rendering_of_a_known_blob_matches_the_stored_text():
    assert show_expected_text() == SHOW_EXPECTED.read_text(encoding="utf-8")


def test_a_picture_drawn_in_16_colours_first_leaves_the_truecolor_text_as_stored():
    # One process draws for consoles of several colour systems (a library caller, the tests' in-process runs).
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    console = Console(record=True, width=40, color_system="standard", force_terminal=True, file=io.StringIO(),
                      legacy_windows=False, _environ={})
    render_picture(console, "known.pb", "0", (3, 4), view(values, width=40, min_size=TERMINAL_MIN_SIZE))
    assert "\x1b[38;2;" not in console.export_text(styles=True)
    assert show_expected_text() == SHOW_EXPECTED.read_text(encoding="utf-8")


def test_the_stored_terminal_text_holds_the_expected_cells():
    text = SHOW_EXPECTED.read_text(encoding="utf-8")
    # 3x4 values enlarged 3x (TERMINAL_MIN_SIZE 10) to 9x12 pixels: 5 lines of 12 cells,
    # the last line only an upper pixel (foreground, no background)
    lines = text.splitlines()
    assert lines[0].startswith("\x1b[1mknown.pb\x1b[0m")
    image = lines[1:6]
    assert all(line.count("▀") == 12 for line in image)
    assert "\x1b[38;2;68;1;84;48;2;68;1;84m▀▀▀" in image[0]            # value 0: violet over violet
    assert image[4].endswith("\x1b[38;2;253;231;37m▀▀▀\x1b[0m")          # value 11: yellow, no background
    assert "12x4" not in text and "3x4 heat map, each value 3x3 pixels" in text
    assert lines[7].startswith("0 ") and lines[7].rstrip().endswith(" 11")


@pytest.mark.parametrize("shape", [(9, 12), (8, 5), (1, 1), (2, 7)])
def test_half_block_cells_decode_back_to_the_pixels(shape):
    rgb = np.random.default_rng(sum(shape)).integers(0, 256, size=(*shape, 3), dtype=np.uint8)
    got = decode_half_blocks(rgb, width=shape[1] + 10)
    assert np.array_equal(got[:shape[0]], rgb)
    if shape[0] % 2:
        assert (got[shape[0]] == -1).all()       # the odd last row has no lower pixel


def test_without_colour_the_view_is_a_brightness_ramp():
    plane = np.array([[0.0, 8.0], [0.0, 8.0]])
    picture = view(plane)
    console = Console(record=True, width=30, color_system=None, file=io.StringIO())
    render_picture(console, "p.pb", "0", (2, 2), picture)
    lines = console.export_text().splitlines()
    # Rec. 601 luma of viridis' violet (68, 1, 84) is 30.4 of 256: shade 1 of 10;
    # of its yellow (253, 231, 37) 215.4: shade 8
    assert lines[1] == ".%"
    # the legend: the same ramp, from the minimum's shade to the maximum's
    assert lines[3].startswith("0 .") and lines[3].endswith("% 8")
    ramp = lines[3][2:-2]
    assert len(ramp) == pictures.LEGEND_STEPS and list(ramp) == sorted(ramp, key=SHADES.index)


# -- blobtool show ---------------------------------------------------------------

def test_show_draws_a_blob_in_a_pipe_without_colour(tmp_path):
    path = write_blob(tmp_path / "w.pb", [[0.0, 8.0], [0.0, 8.0]])
    result = invoke("show", path)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"{path}  blob 0 (2, 2)"
    # enlarged 5x to 10x10 pixels: 5 lines of 10 characters, dark left, bright right
    assert lines[1:6] == ["." * 5 + "%" * 5] * 5
    assert "2x2 heat map, each value 5x5 pixels" in lines[6]
    assert lines[7].startswith("0 .") and lines[7].endswith("% 8")


def test_each_command_in_one_process_gets_its_own_width(tmp_path):
    # The library's callers (and click's CliRunner) run many commands in one process: the width of the
    # first one's $COLUMNS is not kept for the next.
    path = write_blob(tmp_path / "w.pb", [[0.0, 8.0], [0.0, 8.0]])
    narrow = invoke("show", path, env={"COLUMNS": "20"})
    wide = invoke("show", path, env={"COLUMNS": "200"})
    assert narrow.exit_code == wide.exit_code == 0, (narrow.stderr, wide.stderr)
    assert narrow.stdout.splitlines()[0] != f"{path}  blob 0 (2, 2)"  # wrapped at 20 columns
    assert wide.stdout.splitlines()[0] == f"{path}  blob 0 (2, 2)"


def test_show_width_limits_the_terminal_view(tmp_path):
    path = write_blob(tmp_path / "wide.pb", np.arange(300, dtype=np.float32).reshape(3, 100))
    result = invoke("show", "--width", 25, path)
    assert result.exit_code == 0, result.stderr
    image = result.stdout.splitlines()[1:2]
    assert [len(line) for line in image] == [25]
    assert "each pixel the mean of 4x4 values" in result.stdout


def test_show_writes_a_png_at_full_resolution(tmp_path):
    path = write_blob(tmp_path / "mean.pb", [[[[0, 0], [10, 5]], [[0, 10], [0, 5]], [[10, 0], [0, 5]]]],
                      layout="legacy")
    out = tmp_path / "view.png"
    result = invoke("show", path, "-o", out)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    with Image.open(out) as im:
        assert im.format == "PNG" and im.mode == "RGB"
        pixels = np.asarray(im)
    # 2x2 pixels, enlarged 16x (PNG_MIN_SIZE 32) by nearest neighbour
    assert pixels.shape == (32, 32, 3)
    assert pixels[0, 0].tolist() == [255, 0, 0] and pixels[0, 31].tolist() == [0, 255, 0]
    assert pixels[31, 0].tolist() == [0, 0, 255] and pixels[31, 31].tolist() == [128, 128, 128]
    assert pixels[15, 15].tolist() == [255, 0, 0] and pixels[16, 16].tolist() == [128, 128, 128]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mean.pb", "view.png"]


def test_show_png_of_a_filter_grid(tmp_path):
    filters = np.random.default_rng(6).normal(size=(4, 1, 3, 3)).astype(np.float32)
    path = write_vector(tmp_path / "v.pb", [filters, np.zeros(4, np.float32)])
    out = tmp_path / "grid.png"
    result = invoke("show", path, "--blob", "0", "-o", out)
    assert result.exit_code == 0, result.stderr
    with Image.open(out) as im:
        pixels = np.asarray(im)
    factor = -(-PNG_MIN_SIZE // 3)
    assert pixels.shape == (2 * 3 * factor + 1, 2 * 3 * factor + 1, 3)
    assert np.array_equal(pixels, view(filters, min_size=PNG_MIN_SIZE).rgb)
    # the filter at the lower right, its last value, read back and checked against its own range
    f = filters[3, 0].astype(np.float64)
    expected = stretch(f[2, 2], f.min(), f.max())
    assert pixels[-1, -1].tolist() == [expected] * 3


def test_show_png_without_pillow_is_a_usage_error_naming_the_extra(tmp_path, monkeypatch):
    path = write_blob(tmp_path / "w.pb", [[0.0, 1.0], [2.0, 3.0]])
    out = tmp_path / "view.png"
    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    result = invoke("show", path, "-o", out)
    assert result.exit_code == 2
    assert "pip install 'blobtool[image]'" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert not out.exists()
    # the terminal view needs no Pillow
    assert invoke("show", path).exit_code == 0


def test_show_png_write_is_atomic(tmp_path, monkeypatch):
    path = write_blob(tmp_path / "w.pb", [[0.0, 1.0], [2.0, 3.0]])
    out = tmp_path / "view.png"
    out.write_bytes(b"earlier output")

    def broken_save(self, fp, format=None, **params):
        fp.write(b"\x89PNG half written")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Image.Image, "save", broken_save)
    result = invoke("show", path, "-o", out)
    assert result.exit_code == 5, result.stderr
    assert "No space left on device" in result.stderr
    assert out.read_bytes() == b"earlier output"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["view.png", "w.pb"]


def test_show_png_to_stdout_in_a_pipe(tmp_path):
    path = write_blob(tmp_path / "w.pb", [[0.0, 1.0], [2.0, 3.0]])
    result = runner.invoke("show", path, "-o", "-", columns=None)
    assert result.exit_code == 0, result.stderr
    with Image.open(io.BytesIO(result.stdout_bytes)) as im:
        # 2x2 values at 256x256 pixels each (PNG_HEAT_SIZE 512), the colour bar under them (tests/report/test_legend.py)
        assert im.size == (512, 512 + legend.LEGEND_ROWS)


SHOW_ERRORS = {
    # name: (arguments after the file, exit code, text in the one stderr line)
    "1-D blob": (["--blob", "1"], 2, "a blob of shape (4,) is no picture"),
    "several blobs": ([], 2, "show draws one blob; 2 match (0, 1): choose one with --blob NAME"),
    "no such blob": (["--blob", "conv9"], 3, "conv9"),
    "not a png name": (["--blob", "0", "-o", "view.jpg"], 2, "show writes PNG only"),
    "channel out of range": (["--blob", "0", "--channel", "5"], 2, "--channel 5 is out of range"),
    "negative width": (["--blob", "0", "--width", "0"], 2, "--width"),
}


@pytest.mark.parametrize("name", SHOW_ERRORS)
def test_show_errors(tmp_path, name):
    args, code, text = SHOW_ERRORS[name]
    path = write_vector(tmp_path / "v.pb", [np.zeros((4, 1, 3, 3), np.float32), np.zeros(4, np.float32)])
    result = invoke("show", path, *args)
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert text in result.stderr
    assert not (tmp_path / "view.jpg").exists()


def test_show_help_names_the_options():
    result = invoke("show", "--help")
    assert result.exit_code == 0
    for option in ("--blob", "--channel", "--index", "--width", "-o", "blobtool[image]"):
        assert option in result.stdout


# -- the real files Caffe wrote ------------------------------------------------

def test_show_png_of_the_real_imagenet_mean(realworld, tmp_path):
    from blobtool.formats import open_document

    source = realworld / "imagenet_mean.binaryproto"
    out = tmp_path / "mean.png"
    result = invoke("show", source, "-o", out)
    assert result.exit_code == 0, result.stderr
    with Image.open(out) as im:
        pixels = np.asarray(im)
    entry = open_document(str(source)).entries[0]
    bgr = entry.blob().cpu_data().reshape(entry.shape)[0].astype(np.float64)     # (3, 256, 256)
    assert pixels.shape == (256, 256, 3)
    expected = stretch(bgr[::-1].transpose(1, 2, 0), bgr.min(), bgr.max())
    assert np.array_equal(pixels, expected)
    # ImageNet's mean is B 104 < G 117 < R 123: the picture is warm (red above blue)
    assert pixels[..., 0].mean() > pixels[..., 1].mean() > pixels[..., 2].mean()


def test_show_terminal_view_of_the_real_imagenet_mean(realworld):
    result = invoke("show", "--width", 64, realworld / "imagenet_mean.binaryproto")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    # 256x256 values in 4x4 blocks: 64x64 pixels, 32 lines of 64 characters
    assert [len(line) for line in lines[1:33]] == [64] * 32
    assert "256x256 colour image, B,G,R shown as R,G,B, values 94.0228..130.697" in lines[33]
    picture = view(np.zeros((3, 256, 256)), width=64)
    assert picture.rgb.shape == (64, 64, 3)


def test_show_png_of_the_real_lenet_conv1_filters(realworld, tmp_path):
    from blobtool.formats import open_document, select

    source = realworld / "lenet_iter_10000.caffemodel"
    out = tmp_path / "conv1.png"
    result = invoke("show", source, "--blob", "conv1/0", "-o", out)
    assert result.exit_code == 0, result.stderr
    with Image.open(out) as im:
        pixels = np.asarray(im)
    (entry,) = select(open_document(str(source)), ["conv1/0"])
    weights = entry.blob().cpu_data().reshape(entry.shape).astype(np.float64)      # (20, 1, 5, 5)
    factor = -(-PNG_MIN_SIZE // 5)
    tile = 5 * factor
    # 20 filters: 4 rows of 5, one-pixel borders
    assert pixels.shape == (4 * tile + 3, 5 * tile + 4, 3)
    for i in range(20):
        r, c = divmod(i, 5)
        w = weights[i, 0]
        got = pixels[r * (tile + 1):r * (tile + 1) + tile:factor, c * (tile + 1):c * (tile + 1) + tile:factor]
        assert np.array_equal(got[..., 0], stretch(w, w.min(), w.max())), i
        assert np.array_equal(got[..., 0], got[..., 2])
    for k in range(1, 5):
        assert {tuple(p) for p in pixels[:, k * (tile + 1) - 1].tolist()} == {BORDER_RGB}
    assert {tuple(p) for p in pixels[tile].tolist()} == {BORDER_RGB}


def test_show_terminal_view_of_the_real_lenet_conv1_filters(realworld):
    result = invoke("show", "--width", 80, realworld / "lenet_iter_10000.caffemodel", "--blob", "conv1/0")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    # 5x5 filters enlarged 2x (TERMINAL_MIN_SIZE 10): 5 columns of 10 + 4 borders = 54 wide,
    # 4 rows of 10 + 3 borders = 43 pixels high: 22 lines
    factor = -(-TERMINAL_MIN_SIZE // 5)
    assert factor == 2
    assert [len(line) for line in lines[1:23]] == [54] * 22
    assert lines[23].startswith("20 filters of 5x5, channel 0 of 1 in grey, in 4 rows of 5")


def test_info_stats_histograms_of_the_real_caffemodel(realworld):
    from blobtool.formats import open_document

    source = realworld / "lenet_iter_10000.caffemodel"
    result = invoke("info", "--json", "--stats", source)
    assert result.exit_code == 0, result.stderr
    blobs = json.loads(result.stdout)["blobs"]
    doc = open_document(str(source))
    assert [b["name"] for b in blobs] == doc.names()
    for b, entry in zip(blobs, doc.entries):
        values = entry.blob().cpu_data().astype(np.float64)
        counts, edges = np.histogram(values, bins=kernels.HIST_BINS)
        assert b["stats"]["data"]["histogram"] == {"edges": edges.tolist(), "counts": counts.tolist(),
                                                   "zeros": int(np.count_nonzero(values == 0))}
    human = invoke("info", "--stats", source)
    assert human.exit_code == 0
    assert sum(1 for line in human.stdout.splitlines() if "│" in line and line.split()[0] in doc.names()) == 8


if __name__ == "__main__":
    # Regenerate the stored terminal rendering (then look at it: cat tests/data/show_expected.txt).
    DATA.mkdir(exist_ok=True)
    SHOW_EXPECTED.write_text(show_expected_text(), encoding="utf-8")
    print(f"wrote {SHOW_EXPECTED}")


# -- bounds on a picture's size -------------------------------------------------------

def test_a_grid_shows_at_most_max_tiles_filters_and_says_so():
    filters = np.arange(pictures.MAX_TILES + 904, dtype=np.float32).reshape(-1, 1, 1, 1)
    picture = view(filters, min_size=PNG_MIN_SIZE)
    rows, columns = picture.grid
    assert rows * columns >= pictures.MAX_TILES > (rows - 1) * columns
    assert picture.caption.startswith("the first 4,096 of 5,000 filters of 1x1")
    assert picture.limits == ["showing the first 4,096 of 5,000 filters (a grid holds at most 4,096); "
                              "show any one with --index N"]
    assert np.array_equal(picture.rgb, view(filters[:pictures.MAX_TILES], min_size=PNG_MIN_SIZE).rgb)


def test_a_picture_past_max_pixels_is_shrunk_by_block_means_and_says_so():
    plane = np.random.default_rng(8).normal(size=(100, 100))
    picture = heat_map(plane, max_pixels=1000)
    # 3x3 blocks would give 34 x 34 = 1156 pixels: 4x4 give 25 x 25
    assert picture.scale == -4 and picture.rgb.shape == (25, 25, 3)
    lo, hi = plane.min(), plane.max()
    assert np.array_equal(picture.rgb, pictures.colourise(pictures.block_mean(plane, 4), lo, hi, "heat"))
    assert picture.limits == ["shrunk to at most 1,000 pixels: each pixel the mean of 4x4 values"]
    assert "each pixel the mean of 4x4 values" in picture.caption


def test_the_pixel_bound_enlarges_less_without_a_warning():
    picture = view(np.array([[0.0, 1.0], [2.0, 3.0]]), min_size=PNG_MIN_SIZE, max_pixels=100)
    assert picture.scale == 5 and picture.rgb.shape == (10, 10, 3) and picture.limits == []
    # a shrink the width asks for is no limit either
    assert heat_map(np.zeros((4, 40)), width=10, max_pixels=1000).limits == []


def test_a_grid_past_max_pixels_has_smaller_tiles():
    filters = np.random.default_rng(9).normal(size=(100, 1, 8, 8))
    picture = filter_grid(filters, min_size=PNG_MIN_SIZE, max_pixels=2000)
    assert picture.height * picture.width <= 2000
    assert picture.scale < -1 and picture.limits and picture.limits[0].startswith("shrunk to at most 2,000 pixels")
    unbounded = filter_grid(filters, min_size=PNG_MIN_SIZE)
    assert unbounded.scale == 4 and unbounded.limits == []


def test_show_png_of_400000_one_pixel_filters_is_bounded(tmp_path):
    # A 1.6 MB file that made a PNG of 436 million pixels (62 s, 3 GB) before the bounds.
    # The bound is on the picture's size; the time it takes follows from it.
    path = write_blob(tmp_path / "many.pb", np.arange(400_000, dtype=np.float32).reshape(400_000, 1, 1, 1))
    out = tmp_path / "many.png"
    result = runner.run_blobtool("show", path, "-o", out, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr == (f"blobtool: warning: {path}: blob 0: showing the first 4,096 of 400,000 filters "
                             "(a grid holds at most 4,096); show any one with --index N\n")
    with Image.open(out) as im:
        assert im.width * im.height <= pictures.MAX_PIXELS
        assert im.size == (64 * 33 - 1, 64 * 33 - 1)  # 64 x 64 tiles of 32 x 32 pixels, borders between


def test_the_terminal_view_is_bounded_in_height_too(tmp_path):
    # 100,000 x 10 values: a million pixels at one a value, four times the terminal's bound
    path = write_blob(tmp_path / "tall.pb", np.arange(1_000_000, dtype=np.float32).reshape(100_000, 10))
    result = invoke("show", path)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    image = lines[1:lines.index(next(line for line in lines if "heat map" in line))]
    assert len(image) * 2 * max(map(len, image)) <= pictures.TERMINAL_MAX_PIXELS
    assert "shrunk to at most 262,144 pixels: each pixel the mean of" in result.stdout


@pytest.mark.parametrize("columns", ["-5", "0", "abc", "-100000", "99999999", ""])
def test_a_bad_columns_variable_is_ignored(tmp_path, columns):
    path = write_blob(tmp_path / "wide.pb", np.arange(3000, dtype=np.float32).reshape(3, 1000))
    result = runner.run_blobtool("show", path, env=runner.subprocess_env(COLUMNS=columns), text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == ""
    image = result.stdout.splitlines()[1:2]
    assert len(image[0]) <= 160  # the width off a terminal when COLUMNS says nothing usable


def test_show_width_past_the_maximum_is_a_usage_error(tmp_path):
    path = write_blob(tmp_path / "w.pb", np.zeros((2, 2), np.float32))
    result = runner.run_blobtool("show", "--width", "10001", path, text=True)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "--width" in result.stderr and "10000" in result.stderr


# -- streams that cannot encode the block characters ----------------------------------------

def test_info_stats_on_an_ascii_stream_draws_ascii_histograms(tmp_path):
    data = np.array([0.0, 0.0, 1.0, -2.0, np.nan, 4.0, 0.5, 3.0], dtype=np.float32)
    path = write_net(tmp_path / "n.caffemodel", "new", [Layer("свёртка", "Convolution", [data])])
    result = runner.run_blobtool("info", "--stats", path, env=runner.subprocess_env(PYTHONIOENCODING="ascii"),
                                 timeout=60)
    assert result.returncode == 0 and result.stderr == b""
    text = result.stdout.decode("ascii")  # nothing but ASCII
    counts = np.histogram(data[np.isfinite(data)], bins=16)[0]
    heights = histogram_bars(counts.tolist(), 2, 1)["bars"]
    cell = "".join(".:-=+*#@"[h - 1] if h else " " for h in heights) + "|@!"
    assert cell in text
    assert "\\u0441\\u0432\\u0451\\u0440\\u0442\\u043a\\u0430/0" in text  # the name, escaped, not lost


def test_show_on_an_ascii_stream_draws_the_ramp(tmp_path):
    path = write_blob(tmp_path / "w.pb", [[0.0, 8.0], [0.0, 8.0]])
    env = runner.subprocess_env(PYTHONIOENCODING="ascii", FORCE_COLOR="1")
    result = runner.run_blobtool("show", path, env=env, timeout=60)
    assert result.returncode == 0 and result.stderr == b""
    text = result.stdout.decode("ascii")
    assert "....." + "%%%%%" in text
