"""What `info --names torch` reports: one row per Caffe blob, its PyTorch name, shape and what was done.

mapping_record builds the JSON-ready dict; plain_mapping draws it as plain
text (report.text's table, as rich would) and render_mapping with rich.
"""

from __future__ import annotations

from .escape import escape
from .text import fmt_shape, plain_table, title_parts

__all__ = ["mapping_record", "mapping_columns", "mapping_rows", "plain_mapping", "render_mapping"]


def mapping_record(doc, result, *, fold: bool) -> dict:
    """The JSON object of one file: path, kind, the scheme, and a row per selected Caffe blob."""
    rows = []
    for m in result.rows:
        rows.append({"name": m.entry.name, "layer": m.entry.layer, "type": m.entry.type, "torch": m.name,
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


def _footer(record: dict) -> str:
    written = sum(1 for b in record["blobs"] if b["torch"] is not None)
    return f"  {len(record['blobs'])} Caffe blobs, {written} PyTorch tensors"


def plain_mapping(record: dict, width: int) -> str | None:
    """The mapping table as rich prints it off a terminal, or None where rich must draw it."""
    title = "".join(title_parts(record))
    table = plain_table(mapping_columns(), mapping_rows(record), width)
    if table is None or not (title.isascii() and title.isprintable()) or len(title) > width:
        return None
    return "\n".join([title, *table, _footer(record)]) + "\n"


def render_mapping(console, record: dict) -> None:
    """The mapping table with rich."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    path, extra = title_parts(record)
    title = Text(path, style="bold")
    title.append(extra, style="dim")
    console.print(title)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for header, justify in mapping_columns():
        table.add_column(header, justify=justify)
    for row in mapping_rows(record):
        table.add_row(*row)
    console.print(table)
    console.print(_footer(record))
