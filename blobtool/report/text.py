"""What the info, norm and compare tables say, and those tables as plain text, without rich.

tables.py draws the tables with rich from the rows built here. Off a
terminal, rich draws them without colour, and blobtool writes that same text
itself (plain_info, plain_norm, plain_compare) instead of importing rich: loading rich costs
about 19 ms on the 2-core reference machine, a tenth of a whole
`blobtool norm` of a 256 MiB blob (benchmarks/RESULTS.md). The plain text is
rich's own layout for these tables (box.SIMPLE_HEAD, pad_edge=False), and
tests/report/test_report_text.py checks it against rich character for character. Where
a cell or a title holds anything but printable ASCII (where a character's
width on screen is rich's to measure), the plain functions return None and
rich draws the table.

Nothing is cut: a table leaves out its least needed columns to fit the
width, and where even the columns that always stay are wider, it is drawn
at its own width, one line per row, longer than the width (off a terminal;
on a terminal tables.py folds the names instead). Lines of prose (titles,
notes) are never wrapped off a terminal either.

Names, types and paths from the files are escaped here (escape.escape), so
that both the plain and the rich tables print them safely.
"""

from __future__ import annotations

import math
import os
import sys

from .escape import escape
from .layers import HDF5_NOTE, layer_table

__all__ = ["invalid_message", "check_message", "BAR_LEVELS", "BAR_STEP", "histogram_bars", "fmt_num", "fmt_bytes", "fmt_shape", "title_parts", "fit_columns", "table_width",
           "grid_width", "fold_widths", "FOLD_COLUMNS", "MIN_FOLD", "pick", "left_out_note",
           "info_columns", "info_rows", "info_footer", "fork_note", "info_table", "stats_rows", "stats_table",
           "norm_columns", "norm_rows", "norm_table",
           "compare_verdict", "compare_rows", "compare_table", "compare_footer", "COMPARE_COLUMNS",
           "plain_info", "plain_norm", "plain_compare", "plain_stdout", "plain_width", "stdout_is_terminal",
           "MAX_COLUMNS", "BLOCKS", "DIVIDER", "ASCII_BLOCKS", "ASCII_DIVIDER", "histogram_key_segments", "histogram_cell_segments", "histogram_rows", "KEY_INDENT"]

NORM_COLUMNS = [("blob", "left")] + [(c, "right") for c in ("data asum", "data sumsq", "data l2", "diff asum",
                                                             "diff sumsq", "diff l2")]
COMPARE_COLUMNS = [("blob", "left"), ("what", "left"), ("max_abs", "right"), ("max_rel", "right"),
                   ("rel L2", "right"), ("mismatches", "right"), ("first at", "left")]

# Width of the output off a terminal, where rich would otherwise wrap at 80
# columns; tables read better unwrapped in logs.
DEFAULT_PLAIN_WIDTH = 160
# The widest COLUMNS taken: wider than any terminal, and a bound on what a
# line (or a picture's row) may cost.
MAX_COLUMNS = 10_000

# The eight bar heights of a histogram cell, lowest first, and the bar
# between the bins and the zero count; then the same in ASCII, for an output
# that cannot encode them.
BLOCKS = "▁▂▃▄▅▆▇█"
DIVIDER = "│"
ASCII_BLOCKS = ".:-=+*#@"
ASCII_DIVIDER = "|"


def fmt_num(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:.6g}"


def fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # unreachable


def fmt_shape(shape) -> str:
    if shape is None:
        return "-"
    return "(" + ", ".join(str(d) for d in shape) + ")" if len(shape) != 1 else f"({shape[0]},)"


def title_parts(record: dict) -> tuple[str, str]:
    """The title line of a file's table: its path, and what follows it ("  net, 1.6 MiB, name LeNet")."""
    extra = [record["kind"] + (f" ({record['format']})" if record.get("format") else "")]
    if "bytes" in record:
        extra.append(fmt_bytes(record["bytes"]))
    for key in ("name", "iter"):
        if record.get(key) is not None:
            extra.append(f"{key} {escape(record[key])}")
    if record.get("device"):
        extra.append(f"on GPU {record['device']['index']} ({escape(record['device']['name'])})")
    return escape(record["path"]), "  " + ", ".join(extra)


def _has_layers(record: dict) -> bool:
    return any("layer" in b for b in record["blobs"])


# The columns a table leaves out, in this order, until it fits the width:
# names, shapes, counts and statistics' extremes are never cut or wrapped.
INFO_DROP_ORDER = ("layout", "bytes", "diff", "dtype", "type")
STATS_DROP_ORDER = ("std", "mean")
STATS_COLUMNS = [("blob", "left")] + [(c, "right") for c in ("min", "max", "mean", "std", "nan", "inf")]


def table_width(widths) -> int:
    """The width of a SIMPLE_HEAD table (pad_edge=False) whose columns are this wide."""
    return 2 + sum(widths) + 3 * (len(widths) - 1)


def grid_width(widths) -> int:
    """The width of the histograms' grid (one blank between cells and at each edge) whose columns are this wide."""
    return 2 + sum(widths) + len(widths) - 1


# The columns that hold names from the files. On a terminal narrower than
# the columns a table always keeps, these fold onto further lines (no
# character is lost) while every other cell stays whole on its line.
FOLD_COLUMNS = ("blob", "layer", "torch name")
# The narrowest a name column is folded to: narrower, a name would take more
# lines than it is worth, and the table is drawn wider than the terminal.
MIN_FOLD = 12


def fold_widths(headers, widths, width: int, total=table_width) -> list | None:
    """Column widths that fit a table into `width` by folding its name columns (FOLD_COLUMNS), or None.

    The widest name column is narrowed first, none below MIN_FOLD; None when
    that is not enough. `total` gives a table's width from its columns'.
    """
    widths = list(widths)
    foldable = [i for i, header in enumerate(headers) if header in FOLD_COLUMNS]
    excess = total(widths) - width
    while excess > 0:
        # The widest name columns give first, together, down to the next widest.
        widest = max((widths[i] for i in foldable), default=0)
        if widest <= MIN_FOLD:
            return None
        at = [i for i in foldable if widths[i] == widest]
        below = max([widths[i] for i in foldable if widths[i] < widest] + [MIN_FOLD])
        give = min(excess, (widest - below) * len(at))
        each, extra = divmod(give, len(at))
        for k, i in enumerate(at):
            widths[i] -= each + (k < extra)
        excess -= give
    return widths


def fit_columns(columns: list, rows: list, width: int | None, drop_order=(), measure=len) -> tuple[list, list]:
    """(indexes of the columns kept, headers left out) so that the table fits `width` (None: no limit).

    Columns in `drop_order` are left out one by one, in that order, until the
    table fits; the others are always kept, whole, even where they are wider
    than `width` together (the table is then drawn wider, or its names folded).
    """
    widths = [measure(h) for h, _ in columns]
    for row in rows:
        widths = [max(w, measure(cell)) for w, cell in zip(widths, row)]
    kept = list(range(len(columns)))
    left = []
    headers = [h for h, _ in columns]
    for header in drop_order:
        if width is None or table_width([widths[i] for i in kept]) <= width:
            break
        if header in headers and headers.index(header) in kept:
            kept.remove(headers.index(header))
            left.append(header)
    return kept, left


def pick(cells: list, kept: list) -> list:
    return [cells[i] for i in kept]


def left_out_note(left: list, width: int | None) -> str | None:
    """The line saying which columns a table left out to fit, or None when it left out none."""
    if not left:
        return None
    return f"  not shown at {width} columns: {', '.join(left)} (--json has them)"


def info_columns(record: dict) -> list:
    """(header, justify) of info's columns, without the --stats ones."""
    head = [("blob", "left"), ("type", "left")] if _has_layers(record) else [("blob", "left")]
    return head + [("shape", "left"), ("layout", "left"), ("dtype", "left"), ("count", "right"),
                   ("bytes", "right"), ("diff", "left")]


def info_rows(record: dict):
    """Yield (cells, blob) for each blob of info's table: each row its blob's full name (as --blob takes it)."""
    has_layers = _has_layers(record)
    for b in record["blobs"]:
        row = [escape(b["name"])]
        if has_layers:
            row.append(escape(b.get("type") or "-"))
        dtype = b["dtype"] + (f", diff {b['diff_dtype']}" if b.get("diff_dtype") else "")
        row += [fmt_shape(b["shape"]), b["layout"], dtype, fmt_num(b["count"]),
                fmt_bytes(b["bytes"]), "yes" if b["has_diff"] else "no"]
        yield row, b


def info_table(record: dict, width: int | None, measure=len) -> tuple[list, list, str | None]:
    """info's main table fitted to `width`: (columns, [(cells, blob)], the note on left-out columns)."""
    columns = info_columns(record)
    rows = list(info_rows(record))
    kept, left = fit_columns(columns, [cells for cells, _ in rows], width, INFO_DROP_ORDER, measure)
    return pick(columns, kept), [(pick(cells, kept), b) for cells, b in rows], left_out_note(left, width)


def stats_rows(record: dict) -> list:
    """(cells, is_diff) for info --stats' table: one row per blob's data, one per diff ("<name> diff")."""
    rows = []
    for b in record["blobs"]:
        for which in ("data", "diff"):
            s = b["stats"].get(which)
            if s is None:
                continue
            name = escape(b["name"]) + (" diff" if which == "diff" else "")
            rows.append(([name] + [fmt_num(s[k]) for k in ("min", "max", "mean", "std")]
                         + [str(s["nan"]), str(s["inf"])], which == "diff"))
    return rows


def stats_table(record: dict, width: int | None, measure=len) -> tuple[list, list, str | None]:
    """info --stats' table fitted to `width`: (columns, [(cells, is_diff)], the note on left-out columns)."""
    rows = stats_rows(record)
    kept, left = fit_columns(STATS_COLUMNS, [cells for cells, _ in rows], width, STATS_DROP_ORDER, measure)
    return pick(STATS_COLUMNS, kept), [(pick(cells, kept), d) for cells, d in rows], left_out_note(left, width)


def info_footer(record: dict) -> str | None:
    """The totals line under info's table: blobs when the file holds more than one; a net's layers."""
    blobs = record["blobs"]
    parts = []
    if len(blobs) > 1:
        count = sum(b["count"] for b in blobs)
        nbytes = sum(b["bytes"] for b in blobs)
        parts.append(f"{len(blobs)} blobs, {fmt_num(count)} parameters, {fmt_bytes(nbytes)}")
    if "layers" in record:
        empty = record["layers_without_blobs"]
        parts.append(f"{record['layers']} layer{'s' if record['layers'] != 1 else ''}, {empty} without blobs")
    return "  " + "; ".join(parts) if parts else None


def fork_note(record: dict) -> str | None:
    """The note under info's table on the forks' fields read as unknown ones (blobproto.py), or None."""
    blobs = [b for b in record["blobs"] if b.get("kept_fork_fields")]
    if not blobs:
        return None
    numbers = ", ".join(str(n) for n in sorted({k["field"] for b in blobs for k in b["kept_fork_fields"]}))
    return (f"  note: fork fields ({numbers}) in {len(blobs)} blob{'s' if len(blobs) != 1 else ''} read as unknown "
            "fields, as BVLC Caffe reads them; kept as they were")


def norm_columns() -> list:
    return list(NORM_COLUMNS)


def norm_rows(record: dict) -> list:
    """(cells, is_total) for each row of norm's table: one per blob, then the total when there are several."""
    def cells(v):
        return [fmt_num(v[k]) for k in ("asum", "sumsq", "l2")] if v else ["-", "-", "-"]

    rows = [([escape(b["name"]), *cells(b["data"]), *cells(b["diff"])], False) for b in record["blobs"]]
    if len(record["blobs"]) > 1:
        t = record["total"]
        rows.append((["total", *cells(t["data"]), *cells(t["diff"])], True))
    return rows


# norm leaves out the squared sums first (l2 says the same), and the diff's
# columns before the data's.
NORM_DROP_ORDER = ("diff sumsq", "data sumsq", "diff asum", "data asum", "diff l2")


def norm_table(record: dict, width: int | None, measure=len) -> tuple[list, list, str | None]:
    """norm's table fitted to `width`: (columns, [(cells, is_total)], the note on left-out columns).

    When no blob has a diff, the diff's columns (all "-") go first.
    """
    columns = norm_columns()
    rows = norm_rows(record)
    order = NORM_DROP_ORDER
    if all(b["diff"] is None for b in record["blobs"]):
        order = ("diff sumsq", "diff asum", "diff l2") + tuple(h for h in order if not h.startswith("diff"))
    kept, left = fit_columns(columns, [cells for cells, _ in rows], width, order, measure)
    return pick(columns, kept), [(pick(cells, kept), total) for cells, total in rows], left_out_note(left, width)


def compare_verdict(record: dict) -> tuple[str, str]:
    """compare's first line: the verdict word ("equal" or "DIFFERENT") and the rest of the line."""
    blobs = record["blobs"]
    path_a, path_b = escape(record["a"]), escape(record["b"])
    tolerance = f"rtol={_tolerance(record.get('rtol'))}, atol={_tolerance(record.get('atol'))}"
    if record["equal"]:
        return "equal", f"  {path_a} and {path_b}: {len(blobs)} blob(s) match within {tolerance}"
    differing = sum(1 for b in blobs if not b["equal"])
    return "DIFFERENT", f"  {path_a} vs {path_b}: {differing} of {len(blobs)} blob(s) differ beyond {tolerance}"


def _tolerance(value) -> str:
    """A tolerance as the user would type it back: 0, 0.01, 1e-06."""
    return "0" if not value else repr(float(value))


def _nonfinite(b: dict) -> int:
    """How many of a blob's differing values (data and diff) are Inf or NaN on one side."""
    return (b.get("nonfinite") or 0) + ((b.get("diff") or {}).get("nonfinite") or 0)


def compare_rows(record: dict) -> list:
    """(cells, is_warning) for each differing blob: blobs in one file only and shape mismatches first,
    then those with values that are Inf or NaN on one side only (the largest change there is; most first),
    then by relative L2 error, largest first. is_warning marks a "what" cell that is not a value difference."""
    def severity(b):
        if b.get("only_in") or b["shape_a"] != b["shape_b"] and b["max_abs"] is None:
            return (0, 0, 0.0)
        rel = b["rel_l2"]
        rel = float("inf") if isinstance(rel, str) else (rel or 0.0)
        return (1, -_nonfinite(b), -rel)

    rows = []
    for b in sorted((b for b in record["blobs"] if not b["equal"]), key=severity):
        if b.get("only_in"):
            rows.append(([escape(b["name"]), f"only in {b['only_in']}", "", "", "", "", ""], True))
        elif b["max_abs"] is None:
            what = f"shape {fmt_shape(b['shape_a'])} vs {fmt_shape(b['shape_b'])}"
            rows.append(([escape(b["name"]), what, "", "", "", "", ""], True))
        else:
            total = 1
            for d in b["shape_a"]:
                total *= d
            first = fmt_shape(b["first_mismatch"]) if b["first_mismatch"] is not None else "-"
            what = "values" if b["mismatches"] else "diff"
            if _nonfinite(b):
                what += f" ({_nonfinite(b):,} Inf/NaN)"
            if b.get("diff_only_in"):
                what = ("values, " if b["mismatches"] else "") + f"diff only in {b['diff_only_in']}"
            rows.append(([escape(b["name"]), what, fmt_num(b["max_abs"]),
                          fmt_num(b["max_rel"]), fmt_num(b["rel_l2"]), f"{b['mismatches']:,} / {total:,}", first],
                         bool(b.get("diff_only_in"))))
    return rows


# compare leaves out where the first difference is first, then the other
# measures; the blob, what differs and the relative L2 change always stay.
COMPARE_DROP_ORDER = ("first at", "max_rel", "mismatches", "max_abs")


def compare_table(record: dict, width: int | None, measure=len) -> tuple[list, list, str | None]:
    """compare's table fitted to `width`: (columns, [(cells, is_warning)], the note on left-out columns)."""
    rows = compare_rows(record)
    kept, left = fit_columns(COMPARE_COLUMNS, [cells for cells, _ in rows], width, COMPARE_DROP_ORDER, measure)
    return pick(COMPARE_COLUMNS, kept), [(pick(cells, kept), w) for cells, w in rows], left_out_note(left, width)


def compare_footer(record: dict) -> str | None:
    """The lines under compare's table: how many blobs matched, when some did; what a max_rel of inf means."""
    same = sum(1 for b in record["blobs"] if b["equal"])
    lines = [f"  {same} other blob(s) equal"] if same else []
    if any(b["max_rel"] == "inf" and not b.get("nonfinite") for b in record["blobs"] if not b["equal"]):
        lines.append("  max_rel inf: b holds 0 where a does not")
    return "\n".join(lines) or None


# -- plain text -------------------------------------------------------------------

def stdout_is_terminal() -> bool:
    """Whether rich would treat stdout as a terminal (its rule: TTY_COMPATIBLE, then FORCE_COLOR, then isatty)."""
    tty_compatible = os.environ.get("TTY_COMPATIBLE", "")
    if tty_compatible in ("0", "1"):
        return tty_compatible == "1"
    force_color = os.environ.get("FORCE_COLOR")
    if force_color is not None:
        return force_color != ""
    try:
        return bool(sys.stdout.isatty())
    except (AttributeError, ValueError):
        return False


def plain_stdout() -> bool:
    """Whether rich would draw on stdout in plain text with Unicode rules: the case plain_info/plain_norm copy."""
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower()
    return encoding.startswith("utf") and not stdout_is_terminal()


def plain_width() -> int:
    """The output width off a terminal: $COLUMNS, else DEFAULT_PLAIN_WIDTH.

    A COLUMNS that is not a whole number from 1 to MAX_COLUMNS is ignored,
    as Python's shutil.get_terminal_size and rich ignore one that is not a
    positive number.
    """
    value = os.environ.get("COLUMNS", "").strip()
    if value.isascii() and value.isdigit() and 1 <= int(value) <= MAX_COLUMNS:
        return int(value)
    return DEFAULT_PLAIN_WIDTH


def _simple(text: str) -> bool:
    """Printable ASCII without leading or trailing blanks: one character per column, as rich lays it out."""
    return text.isascii() and text.isprintable() and text == text.strip(" ")


def plain_table(columns: list, rows: list) -> list | None:
    """rich's SIMPLE_HEAD table with pad_edge=False, off a terminal: its lines, or None where rich must draw it.

    Each row is edge, cells separated by three blanks (padding, divider,
    padding), edge; blank lines above and below, a rule under the header.
    The table is as wide as its cells make it: where that is wider than the
    output, its lines are longer (tables.py draws it so off a terminal too).
    """
    if any(not _simple(cell) for row in rows for cell in row) or any(not _simple(h) for h, _ in columns):
        return None
    widths = [len(h) for h, _ in columns]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row)]
    total = table_width(widths)

    def line(cells):
        parts = [cell.rjust(w) if justify == "right" else cell.ljust(w)
                 for cell, w, (_, justify) in zip(cells, widths, columns)]
        return " " + "   ".join(parts) + " "

    blank = " " * total
    return [blank, line([h for h, _ in columns]), " " + "─" * (total - 2) + " ",
            *(line(row) for row in rows), blank]


def _plain_title(record: dict) -> str | None:
    text = "".join(title_parts(record))
    return text if _simple(text) else None


# Bar heights a histogram cell can show (the eight blocks ▁..█), and the
# ratio of counts between neighbouring heights: log-scaled, so that a bin
# with 1/1000 of the largest count still shows, and with steps of x2
# the shape of a bell still reads (log(count)/log(max) would
# draw nearly every bin of a large blob full height).
BAR_LEVELS = 8
BAR_STEP = 2.0


def histogram_bars(counts, zeros: int = 0, nonfinite: int = 0, levels: int = BAR_LEVELS,
                   step: float = BAR_STEP) -> dict:
    """Bar heights 0..`levels` for a histogram cell, log-scaled against the largest count.

    The largest count is `levels` high and each step down divides the count
    by `step`; an empty bin is 0 and a non-empty one at least 1 (so a single
    value still shows). The zero count gets a height on the same scale.
    Returns ``{"bars": [...], "zeros": height, "nonfinite": bool}``.
    """
    top = max([*counts, zeros, 0])

    def height(c: int) -> int:
        if c <= 0:
            return 0
        # the small epsilon keeps an exact power of `step` on its own level
        below = math.log(top / c) / math.log(step)
        return max(1, levels - math.floor(below + 1e-9))

    return {"bars": [height(c) for c in counts], "zeros": height(zeros), "nonfinite": nonfinite > 0}


def histogram_key_segments(blocks: str, divider: str) -> tuple[list, list]:
    """The line that explains the histogram cells, as two clauses of (text, style) segments."""
    from ..engine.kernels import HIST_BINS  # numpy loads only when values are read (start-up)

    bins = [(" histograms", "bold"),
            (f"  {HIST_BINS} bins from min to max, counts log-scaled (one step = x{BAR_STEP:g});", "dim")]
    marks = [(" after ", "dim"), (divider, "dim"), (": ", "dim"), (blocks[4], "yellow"),
             (" values exactly 0, ", "dim"), ("!", "bold red"), (" NaN or Inf present", "dim")]
    return bins, marks


# Where the key's second clause starts when it needs a line of its own.
KEY_INDENT = "           "


def histogram_cell_segments(s: dict, blocks: str, divider: str) -> list:
    """A fixed-width histogram as (text, style) segments: one block per bin, │, the zero count's block, ! for
    NaN/Inf."""
    from ..engine.kernels import HIST_BINS  # numpy loads only when values are read (start-up)

    hist = s.get("histogram") or {"counts": [], "zeros": 0}
    bars = histogram_bars(hist["counts"], hist["zeros"], s["nan"] + s["inf"])
    if bars["bars"]:
        cell = [("".join(blocks[h - 1] if h else " " for h in bars["bars"]), "cyan")]
    else:
        cell = [("no finite value".center(HIST_BINS)[:HIST_BINS], "dim")]
    return cell + [(divider, "dim"), (blocks[bars["zeros"] - 1] if bars["zeros"] else " ", "yellow"),
                   ("!" if bars["nonfinite"] else " ", "bold red")]


def histogram_rows(blobs: list) -> list:
    """(name, is_diff, stats) for each histogram line: a blob's data, then its diff."""
    return [(b["name"], which == "diff", b["stats"][which]) for b in blobs for which in ("data", "diff")
            if b["stats"].get(which) is not None]


def _plain_stats(record: dict, width: int) -> list | None:
    """info --stats' table, the histogram key and one histogram line per row, as rich prints them off a
    terminal (a grid: one blank between cells and at each edge), or None."""
    columns, rows, note = stats_table(record, width)
    table = plain_table(columns, [cells for cells, _ in rows])
    if table is None:
        return None
    blocks, divider = BLOCKS, DIVIDER  # the plain text is written only to UTF outputs (plain_stdout)
    bins, marks = ("".join(text for text, _ in part) for part in histogram_key_segments(blocks, divider))
    key = [bins + marks] if len(bins) + len(marks) <= width else [bins, KEY_INDENT + marks]
    grid = [[escape(name) + (" diff" if is_diff else ""), fmt_num(s["min"]),
             "".join(text for text, _ in histogram_cell_segments(s, blocks, divider)), fmt_num(s["max"])]
            for name, is_diff, s in histogram_rows(record["blobs"])]
    if any(not _simple(cells[0]) for cells in grid):
        return None
    widths = [max((len(cells[i]) for cells in grid), default=0) for i in range(4)]
    lines = [" " + " ".join((cells[i].rjust if i == 1 else cells[i].ljust)(widths[i]) for i in range(4)) + " "
             for cells in grid]
    return [*table, *([note] if note is not None else []), *key, *lines]


def plain_info(record: dict, width: int) -> str | None:
    """info's tables (and --stats' table and histograms) as rich prints them off a terminal with a UTF
    encoding, or None where rich must draw them (a name that is not printable ASCII)."""
    stats = None
    if any("stats" in b for b in record["blobs"]):
        stats = _plain_stats(record, width)
        if stats is None:
            return None
    title = _plain_title(record)
    columns, rows, note = info_table(record, width)
    table = plain_table(columns, [cells for cells, _ in rows])
    layers = plain_table(*layer_table(record)) if "all_layers" in record else []
    if title is None or table is None or layers is None:
        return None
    if "layer_defs" in record:  # the layer table holds the blobs' shapes: it stands for the blob table
        table, note = [], HDF5_NOTE if record.get("format") == "hdf5" else None
    out = [title, *table, *(line for line in (info_footer(record), fork_note(record), note) if line is not None)]
    out += layers
    return "\n".join(out + (stats or [])) + "\n"


def plain_norm(record: dict, width: int) -> str | None:
    """norm's table as rich prints it off a terminal, or None where rich must draw it."""
    title = _plain_title(record)
    columns, rows, note = norm_table(record, width)
    table = plain_table(columns, [cells for cells, _ in rows])
    if title is None or table is None:
        return None
    return "\n".join([title, *table, *([note] if note is not None else [])]) + "\n"


def plain_compare(record: dict, width: int, quiet: bool = False) -> str | None:
    """compare's verdict (and table of differences) as rich prints it off a terminal, or None where rich must."""
    verdict = "".join(compare_verdict(record))
    if not (verdict.isascii() and verdict.isprintable()):
        return None
    if record["equal"] or quiet:
        return verdict + "\n"
    columns, rows, note = compare_table(record, width)
    table = plain_table(columns, [cells for cells, _ in rows])
    lines = [line for line in (compare_footer(record), note) if line is not None]
    if table is None:
        return None
    return "\n".join([verdict, *table, *lines]) + "\n"


def invalid_message(record: dict) -> str | None:
    """The stderr line for an info record whose blobs' shapes disagree with their values, or None."""
    found = record.get("invalid")
    if not found:
        return None
    return f"{record['path']}: " + "; ".join(
        f"blob {f['name']}: shape {fmt_shape(f['shape'])} needs {f['count']:,} values, but {f['field']} "
        f"holds {f['values']:,}" for f in found)


def check_message(record: dict) -> str | None:
    """The one line saying why a record's check failed, or None when it passed (or none ran)."""
    check = record.get("check")
    if not check or check["passed"]:
        return None
    found = "; ".join(f"blob {f['name']} {f['which']} has {f['nan']} NaN and {f['inf']} Inf"
                      for f in check["failures"])
    return f"{record['path']}: check {check['name']} failed: {found}"
