"""What `blobtool run` prints: a title line, then one row per blob (name, shape, min, max, mean, L2)."""

from __future__ import annotations

from .escape import escape
from .text import fit_columns, fmt_num, fmt_shape, left_out_note, pick, plain_table

__all__ = ["run_title", "run_table", "plain_run", "render_run", "RUN_COLUMNS"]

RUN_COLUMNS = [("blob", "left"), ("shape", "left"), ("min", "right"), ("max", "right"), ("mean", "right"),
               ("l2", "right")]
# Off a narrow output the mean goes first, then the minimum (max and L2 say the most of a net's output).
RUN_DROP_ORDER = ("mean", "min", "l2", "max")


def run_title(record: dict) -> str:
    """'PATH  inputs data 1x3x32x32 (random normal, seed 0)'."""
    inputs = ", ".join(f"{escape(i['name'])} {'x'.join(map(str, i['shape']))} ({i['given']})" for i in record["inputs"])
    return f"{escape(record['path'])}  inputs {inputs}"


def _rows(record: dict) -> list:
    rows = []
    for b in record["blobs"]:
        nonfinite = f" ({b['nan']} NaN, {b['inf']} Inf)" if b["nan"] or b["inf"] else ""
        rows.append([escape(b["name"]), fmt_shape(b["shape"]), fmt_num(b["min"]), fmt_num(b["max"]),
                     fmt_num(b["mean"]), fmt_num(b["l2"]) + nonfinite])
    return rows


def run_table(record: dict, width: int | None, measure=len) -> tuple[list, list, str | None]:
    """(columns, rows, the note on left-out columns) fitted to `width`."""
    rows = _rows(record)
    kept, left = fit_columns(list(RUN_COLUMNS), rows, width, RUN_DROP_ORDER, measure)
    return pick(list(RUN_COLUMNS), kept), [pick(r, kept) for r in rows], left_out_note(left, width)


def plain_run(record: dict, width: int) -> str | None:
    """run's table as rich prints it off a terminal, or None where rich must draw it."""
    columns, rows, note = run_table(record, width)
    table = plain_table(columns, rows)
    if table is None:
        return None
    return "\n".join([run_title(record), *table, *([note] if note is not None else [])]) + "\n"


def render_run(console, record: dict) -> None:
    """run's table drawn by rich, fitted to the console."""
    from rich.cells import cell_len

    from .tables import print_line, print_table

    print_line(console, run_title(record))
    columns, rows, note = run_table(record, console.width, cell_len)
    print_table(console, columns, rows)
    if note is not None:
        print_line(console, note)
