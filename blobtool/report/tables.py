"""Human-readable output: rich tables drawn from report records. Computes nothing.

Names and paths from the files are escaped (escape.escape) before they are
drawn. Where the console's encoding cannot write the block characters (a
stream encoded as ASCII, PYTHONIOENCODING=ascii), histograms and pictures
are drawn with ASCII characters instead.

Nothing is cut with an ellipsis: a table leaves out its least needed
columns to fit the console (report.text), and where the columns it always
keeps are still too wide, off a terminal it is drawn at its own width, one
line per row (as report.text writes it); on a terminal its name columns fold
onto further lines, or, where they would be narrower than text.MIN_FOLD,
the table is drawn at its own width and the terminal wraps its lines. Off a
terminal no line is wrapped, titles and notes included.
"""

from __future__ import annotations

from rich import box
from rich.cells import cell_len
from rich.color import Color
from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

from .escape import escape
from .layers import HDF5_NOTE, layer_table
from .text import (ASCII_BLOCKS, ASCII_DIVIDER, BLOCKS, DIVIDER, KEY_INDENT, compare_footer,
                   compare_table, compare_verdict, fmt_bytes, fmt_num, fmt_shape, fold_widths, fork_note, grid_width,
                   histogram_cell_segments, histogram_key_segments, histogram_rows, info_footer, info_table,
                   norm_table, stats_table, table_width, title_parts)


__all__ = ["fmt_num", "fmt_bytes", "fmt_shape", "render_info", "render_norm", "render_compare",
           "render_devices", "histogram_cell", "render_picture", "print_table", "print_line"]


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


def print_line(console: Console, line) -> None:
    """A title or a note: one line off a terminal, however long (on a terminal rich wraps it at its blanks)."""
    console.print(line, soft_wrap=not console.is_terminal)


def _cells(cell) -> int:
    return cell.cell_len if isinstance(cell, Text) else cell_len(cell)


def _whole(console: Console, headers: list, widths: list, total) -> tuple[list | None, bool]:
    """How a table whose columns are `widths` wide is drawn whole: (the folded widths or None, whether wider
    than the console).

    It fits: as it is. Off a terminal: at its own width. On a terminal: its
    name columns folded, or at its own width where folding cannot fit it.
    """
    if total(widths) <= console.width:
        return None, False
    folded = fold_widths(headers, widths, console.width, total) if console.is_terminal else None
    return folded, folded is None


def print_table(console: Console, columns: list, rows: list) -> None:
    """A SIMPLE_HEAD table of these (header, justify) columns and rows (str or Text cells), nothing cut.

    The columns are fitted to the console beforehand (report.text); where they
    are still wider, see _whole.
    """
    headers = [h for h, _ in columns]
    widths = [max([cell_len(h)] + [_cells(row[i]) for row in rows]) for i, h in enumerate(headers)]
    folded, wider = _whole(console, headers, widths, table_width)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for i, (header, justify) in enumerate(columns):
        if folded is not None and folded[i] < widths[i]:
            table.add_column(header, justify=justify, width=folded[i], overflow="fold")
        else:
            table.add_column(header, justify=justify, no_wrap=True)
    for row in rows:
        table.add_row(*row)
    if wider:
        table.width = table_width(widths)
    console.print(table, crop=not wider)


def render_info(console: Console, record: dict) -> None:
    """One table per file, one row per blob (its full name), fitted to the console's width.

    With --stats, the statistics follow in a table of their own and then the
    histograms; with --layers, a table of every layer of a net.
    """
    print_line(console, _title(record))
    columns, rows, note = info_table(record, console.width, cell_len)
    if "layer_defs" in record:  # the layer table holds the blobs' shapes: it stands for the blob table
        note = HDF5_NOTE if record.get("format") == "hdf5" else None
    else:
        print_table(console, columns, [cells for cells, _ in rows])
    for line in (info_footer(record), fork_note(record), note):
        if line is not None:
            print_line(console, line)
    if "all_layers" in record:
        print_table(console, *layer_table(record))
    if any("stats" in b for b in record["blobs"]):
        _render_stats(console, record)
        _render_histograms(console, record["blobs"])


def _render_stats(console: Console, record: dict) -> None:
    """info --stats' table: min, max, mean, std and the NaN and Inf counts of each blob's data and diff."""
    columns, rows, note = stats_table(record, console.width, cell_len)
    headers = [h for h, _ in columns]
    styled_rows = []
    for cells, is_diff in rows:
        styled = [Text(cells[0], style="dim") if is_diff else cells[0], *cells[1:]]
        for col in ("nan", "inf"):
            if col in headers:
                i = headers.index(col)
                styled[i] = Text(cells[i], style="red" if cells[i] != "0" else "")
        styled_rows.append(styled)
    print_table(console, columns, styled_rows)
    if note is not None:
        print_line(console, note)


def _render_histograms(console: Console, blobs: list) -> None:
    """One line per blob (and diff) under the table: min, the histogram cell, max."""
    blocks, divider = _bar_characters(console)
    print_line(console, histogram_key(blocks, divider, console.width))
    rows = []
    for name, is_diff, s in histogram_rows(blobs):
        label = Text(f"{escape(name)} diff", style="dim") if is_diff else Text(escape(name))
        rows.append([label, Text(fmt_num(s["min"])), histogram_cell(s, blocks, divider), Text(fmt_num(s["max"]))])
    widths = [max((row[i].cell_len for row in rows), default=0) for i in range(4)]
    folded, wider = _whole(console, ["blob", "min", "histogram", "max"], widths, grid_width)
    grid = Table.grid(padding=(0, 1), pad_edge=True)
    if folded is not None:
        grid.add_column(width=folded[0], overflow="fold")
    else:
        grid.add_column(no_wrap=True)
    grid.add_column(justify="right", no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True)
    for row in rows:
        grid.add_row(*row)
    if wider:
        grid.width = grid_width(widths)
    console.print(grid, crop=not wider)


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
    print_line(console, _title(record))
    columns, rows, note = norm_table(record, console.width, cell_len)
    print_table(console, columns, [[Text(cells[0], style="bold"), *cells[1:]] if is_total else cells
                                   for cells, is_total in rows])
    if note is not None:
        print_line(console, note)


def render_compare(console: Console, record: dict, *, quiet: bool = False) -> None:
    """The answer to "what differs, and by how much": a verdict line, then the differing blobs first."""
    word, rest = compare_verdict(record)
    verdict = Text(word, style="bold green" if record["equal"] else "bold red")
    verdict.append(rest)
    print_line(console, verdict)
    if record["equal"] or quiet:
        return
    columns, rows, note = compare_table(record, console.width, cell_len)
    print_table(console, columns, [[cells[0], Text(cells[1], style="yellow"), *cells[2:]] if warning else cells
                                   for cells, warning in rows])
    footer = compare_footer(record)
    if footer is not None:
        print_line(console, Text(footer, style="dim"))
    if note is not None:
        print_line(console, note)


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


# -- pictures ------------------------------------------------------------------

# Brightness ramp for a console without colour (a pipe, NO_COLOR): dark to bright.
SHADES = " .:-=+*#%@"


class HalfBlocks:
    """An RGB image as rows of "▀" cells: the upper pixel is the foreground, the lower the background."""

    def __init__(self, rgb):
        self.rgb = rgb

    def __rich_console__(self, console, options):
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


class ColourKey:
    """A picture's key: the lowest value, a cell of each colour of the map, the highest value.

    Its cells are segments with Styles of their own, as HalfBlocks' are: rich
    shares the styles it parses or combines (Text's spans) across the process,
    each keeping the codes of the first console that drew it, so a
    truecolor console after a 16-colour one would draw 16 colours.
    """

    def __init__(self, low: str, colours, high: str):
        self.low, self.colours, self.high = low, colours, high

    def __rich_console__(self, console, options):
        yield Segment(f"{self.low} ")
        for r, g, b in self.colours:
            yield Segment("█", Style(color=Color.from_rgb(r, g, b)))
        yield Segment(f" {self.high}")
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
        if ramp:
            shades = "".join(SHADES[v] for v in picture.legend_shades(len(SHADES)))
            console.print(Text(f"{fmt_num(lo)} {shades} {fmt_num(hi)}"), crop=False)
        else:
            console.print(ColourKey(fmt_num(lo), picture.legend, fmt_num(hi)), crop=False)
    if picture.nonfinite:
        console.print(Text(f"{picture.nonfinite:,} NaN/Inf value(s) drawn magenta", style="red"))
    for line in picture.limits:
        console.print(Text(line, style="yellow"))
    for note in picture.notes:
        console.print(Text(note, style="dim"))
