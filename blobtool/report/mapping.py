"""What `info --names torch` reports: one row per Caffe blob, its PyTorch name, shape and what was done.

mapping_record builds the JSON-ready dict; plain_mapping draws it as plain
text (report.text's table, as rich would) and render_mapping with rich.
"""

from __future__ import annotations

from .escape import escape
from .text import fit_columns, fmt_shape, left_out_note, pick, plain_table, title_parts

__all__ = ["mapping_record", "mapping_columns", "mapping_rows", "mapping_table", "plain_mapping", "render_mapping"]


def mapping_record(doc, result, *, fold: bool) -> dict:
    """The JSON object of one file: path, kind, the scheme, and a row per selected Caffe blob."""
    rows = []
    for m in result.rows:
        rows.append({"name": m.entry.name, "layer": m.entry.layer, "type": m.type or m.entry.type, "torch": m.name,
                     "shape": list(m.entry.shape), "torch_shape": list(m.shape) if m.shape is not None else None,
                     "done": m.done})
    out = {"path": doc.path, "kind": doc.kind, "bytes": doc.size, "names": "torch", "fold": fold}
    out.update(doc.meta)
    out["blobs"] = rows
    return out


def mapping_columns() -> list:
    return [("blob", "left"), ("type", "left"), ("torch name", "left"), ("shape", "left"), ("done", "left")]


def mapping_rows(record: dict) -> list:
    return [[escape(b["name"]), escape(b["type"] or ""), escape(b["torch"] or "-"), fmt_shape(b["torch_shape"]),
             escape(b["done"])] for b in record["blobs"]]


# The columns left out, in this order, where the table is too wide: the
# Caffe and PyTorch names always stay, whole.
MAPPING_DROP_ORDER = ("type", "done", "shape")


def mapping_table(record: dict, width: int | None, measure=len) -> tuple[list, list, str | None]:
    """The mapping table fitted to `width`: (columns, rows, the note on left-out columns)."""
    columns = mapping_columns()
    rows = mapping_rows(record)
    kept, left = fit_columns(columns, rows, width, MAPPING_DROP_ORDER, measure)
    return pick(columns, kept), [pick(cells, kept) for cells in rows], left_out_note(left, width)


def _footer(record: dict) -> str:
    written = sum(1 for b in record["blobs"] if b["torch"] is not None)
    return f"  {len(record['blobs'])} Caffe blobs, {written} PyTorch tensors"


def plain_mapping(record: dict, width: int) -> str | None:
    """The mapping table as rich prints it off a terminal, or None where rich must draw it."""
    title = "".join(title_parts(record))
    columns, rows, note = mapping_table(record, width)
    table = plain_table(columns, rows)
    if table is None or not (title.isascii() and title.isprintable()):
        return None
    return "\n".join([title, *table, _footer(record), *([note] if note is not None else [])]) + "\n"


def render_mapping(console, record: dict) -> None:
    """The mapping table with rich, fitted to the console as info's is."""
    from rich.cells import cell_len  # rich loads only where a table is drawn (start-up)
    from rich.text import Text  # rich loads only where a table is drawn (start-up)

    from .tables import print_line, print_table  # rich loads only where a table is drawn (start-up)

    path, extra = title_parts(record)
    title = Text(path, style="bold")
    title.append(extra, style="dim")
    print_line(console, title)
    columns, rows, note = mapping_table(record, console.width, cell_len)
    print_table(console, columns, rows)
    print_line(console, _footer(record))
    if note is not None:
        print_line(console, note)
