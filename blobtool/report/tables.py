"""Human-readable output: rich tables drawn from report records. Computes nothing.

Names and paths from the files are escaped (escape.escape) before they are
drawn. Where the console's encoding cannot write the block characters (a
stream encoded as ASCII, PYTHONIOENCODING=ascii), histograms and pictures
are drawn with ASCII characters instead.
"""

from __future__ import annotations

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .escape import escape
from .text import (ASCII_BLOCKS, ASCII_DIVIDER, BLOCKS, DIVIDER, KEY_INDENT, LAYERS_COLUMNS, compare_footer,
                   compare_table, compare_verdict, fmt_bytes, fmt_num, fmt_shape, histogram_cell_segments,
                   histogram_key_segments, histogram_rows, fork_note, info_footer, info_table, layers_rows, norm_table,
                   stats_table, title_parts)


__all__ = ["fmt_num", "fmt_bytes", "fmt_shape", "render_info", "render_norm", "render_compare",
           "render_devices", "render_written", "histogram_cell", "render_picture"]

def can_encode(console: Console, chars: str) -> bool:
    """Whether the console's output encoding can write these characters."""
    try:
        chars.encode(console.encoding or "utf-8")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def _bar_characters(console: Console) -> tuple[str, str]:
    """(the eight bar heights, the divider) that this console can write."""
    return (BLOCKS, DIVIDER) if can_encode(console, BLOCKS + DIVIDER) else (ASCII_BLOCKS, ASCII_DIVIDER)


def _title(record: dict) -> Text:
    path, extra = title_parts(record)
    title = Text(path, style="bold")
    title.append(extra, style="dim")
    return title


def render_info(console: Console, record: dict) -> None:
    """One table per file, one row per blob (its full name), fitted to the console's width.

    With --stats, the statistics follow in a table of their own and then the
    histograms; with --all-layers, a table of every layer of a net.
    """
    console.print(_title(record))
    columns, rows, note = info_table(record, console.width, cell_len)
    table = _table(columns)
    for cells, _ in rows:
        table.add_row(*cells)
    console.print(table)
    for line in (info_footer(record), fork_note(record), note):
        if line is not None:
            console.print(line)
    if "all_layers" in record:
        layers = _table(LAYERS_COLUMNS)
        for cells in layers_rows(record):
            layers.add_row(*cells)
        console.print(layers)
    if any("stats" in b for b in record["blobs"]):
        _render_stats(console, record)
        _render_histograms(console, record["blobs"])


def _table(columns: list) -> Table:
    """A SIMPLE_HEAD table of these (header, justify) columns; cells never wrap (the columns are fitted)."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for header, justify in columns:
        table.add_column(header, justify=justify, no_wrap=True)
    return table


def _render_stats(console: Console, record: dict) -> None:
    """info --stats' table: min, max, mean, std and the NaN and Inf counts of each blob's data and diff."""
    columns, rows, note = stats_table(record, console.width, cell_len)
    table = _table(columns)
    headers = [h for h, _ in columns]
    for cells, is_diff in rows:
        styled = [Text(cells[0], style="dim") if is_diff else cells[0], *cells[1:]]
        for col in ("nan", "inf"):
            if col in headers:
                i = headers.index(col)
                styled[i] = Text(cells[i], style="red" if cells[i] != "0" else "")
        table.add_row(*styled)
    console.print(table)
    if note is not None:
        console.print(note)


def _render_histograms(console: Console, blobs: list) -> None:
    """One line per blob (and diff) under the table: min, the histogram cell, max."""
    blocks, divider = _bar_characters(console)
    console.print(histogram_key(blocks, divider, console.width))
    grid = Table.grid(padding=(0, 1), pad_edge=True)
    grid.add_column()
    grid.add_column(justify="right")
    grid.add_column(no_wrap=True)
    grid.add_column()
    for name, is_diff, s in histogram_rows(blobs):
        label = Text(f"{escape(name)} diff", style="dim") if is_diff else Text(escape(name))
        grid.add_row(label, fmt_num(s["min"]), histogram_cell(s, blocks, divider), fmt_num(s["max"]))
    console.print(grid)


def histogram_key(blocks: str = BLOCKS, divider: str = DIVIDER, width: int | None = None) -> Text:
    """The line that explains the histogram cells (drawn with these bar characters).

    Two lines, split at the clause, where one would not fit `width`.
    """
    bins, marks = (Text.assemble(*part) for part in histogram_key_segments(blocks, divider))
    if width is not None and bins.cell_len + marks.cell_len > width:
        return Text("\n").join([bins, Text(KEY_INDENT) + marks])
    return bins + marks


def histogram_cell(s: dict, blocks: str = BLOCKS, divider: str = DIVIDER) -> Text:
    """A fixed-width histogram: one block per bin, then │, the zero count's block and ! for NaN/Inf."""
    return Text.assemble(*histogram_cell_segments(s, blocks, divider))


def render_norm(console: Console, record: dict) -> None:
    """One table per file, fitted to the console's width; the total in bold."""
    console.print(_title(record))
    columns, rows, note = norm_table(record, console.width, cell_len)
    table = _table(columns)
    for cells, is_total in rows:
        if is_total:
            cells = [Text(cells[0], style="bold"), *cells[1:]]
        table.add_row(*cells)
    console.print(table)
    if note is not None:
        console.print(note)


def render_compare(console: Console, record: dict, *, quiet: bool = False) -> None:
    """The answer to "what differs, and by how much": a verdict line, then the differing blobs first."""
    word, rest = compare_verdict(record)
    verdict = Text(word, style="bold green" if record["equal"] else "bold red")
    verdict.append(rest)
    console.print(verdict)
    if record["equal"] or quiet:
        return
    columns, rows, note = compare_table(record, console.width, cell_len)
    table = _table(columns)
    for cells, warning in rows:
        if warning:
            cells = [cells[0], Text(cells[1], style="yellow"), *cells[2:]]
        table.add_row(*cells)
    console.print(table)
    footer = compare_footer(record)
    if footer is not None:
        console.print(Text(footer, style="dim"))
    if note is not None:
        console.print(note)


def render_devices(console: Console, devices: list) -> None:
    if not devices:
        console.print("no CUDA device visible")
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("index", "name", "total", "free", "compute"):
        table.add_column(col)
    for d in devices:
        table.add_row(str(d["index"]), escape(d["name"]), fmt_bytes(d["total_memory"]), fmt_bytes(d["free_memory"]),
                      d["compute_capability"])
    console.print(table)


def render_written(console: Console, path: str, fmt: str, blobs: int) -> None:
    console.print(Text(f"wrote {escape(path)} ({fmt}, {blobs} blob{'s' if blobs != 1 else ''})", style="dim"))


# -- pictures ------------------------------------------------------------------

# Brightness ramp for a console without colour (a pipe, NO_COLOR): dark to bright.
SHADES = " .:-=+*#%@"


class HalfBlocks:
    """An RGB image as rows of "▀" cells: the upper pixel is the foreground, the lower the background."""

    def __init__(self, rgb):
        self.rgb = rgb

    def __rich_console__(self, console, options):
        from rich.color import Color
        from rich.segment import Segment
        from rich.style import Style

        rgb = self.rgb
        height, width = rgb.shape[0], rgb.shape[1]
        styles = {}

        def style(top, bottom):
            key = (top, bottom)
            if key not in styles:
                styles[key] = Style(color=Color.from_rgb(*top),
                                    bgcolor=Color.from_rgb(*bottom) if bottom is not None else None)
            return styles[key]

        for y in range(0, height, 2):
            upper = [tuple(int(v) for v in p) for p in rgb[y]]
            lower = [tuple(int(v) for v in p) for p in rgb[y + 1]] if y + 1 < height else [None] * width
            run_style, run = None, 0
            for x in range(width):
                cell = style(upper[x], lower[x])
                if cell is run_style:
                    run += 1
                    continue
                if run:
                    yield Segment("▀" * run, run_style)
                run_style, run = cell, 1
            if run:
                yield Segment("▀" * run, run_style)
            yield Segment.line()


def render_picture(console: Console, path: str, name: str, shape, picture) -> None:
    """Draw a pictures.Picture: a title, the image, and what its colours mean.

    In colour as half-block cells (two pixels per character, so pixels are
    about square); without colour, or where the console cannot encode the
    block characters, as a brightness ramp of characters.
    """
    title = Text(escape(path), style="bold")
    title.append(f"  blob {escape(name)} {fmt_shape(shape)}", style="dim")
    console.print(title)
    ramp = console.color_system is None or console.no_color or not can_encode(console, "▀█")
    if ramp:
        for row in picture.shades(len(SHADES)):
            console.print("".join(SHADES[v] for v in row), crop=False, highlight=False)
    else:
        console.print(HalfBlocks(picture.rgb), crop=False)
    console.print(Text(picture.caption, style="dim"))
    if picture.legend is not None:
        lo, hi = picture.value_range
        legend = Text(f"{fmt_num(lo)} ")
        if ramp:
            legend.append("".join(SHADES[v] for v in picture.legend_shades(len(SHADES))))
        else:
            for r, g, b in picture.legend:
                legend.append("█", style=f"rgb({r},{g},{b})")
        legend.append(f" {fmt_num(hi)}")
        console.print(legend, crop=False)
    if picture.nonfinite:
        console.print(Text(f"{picture.nonfinite:,} NaN/Inf value(s) drawn magenta", style="red"))
    for line in picture.limits:
        console.print(Text(line, style="yellow"))
    for note in picture.notes:
        console.print(Text(note, style="dim"))
