"""What `info --names torch` reports: one row per Caffe blob, its PyTorch name, shape and what was done.

mapping_record builds the JSON-ready dict; plain_mapping draws it as plain
text (report.text's table, as rich would) and render_mapping with rich.
"""

from __future__ import annotations

from .escape import escape
from .text import fit_columns, fmt_shape, left_out_note, pick, plain_table, title_parts

__all__ = ["mapping_record", "mapping_columns", "mapping_rows", "mapping_table", "plain_mapping", "render_mapping"]


def mapping_record(doc, result, *, fold: bool, names=None) -> dict:
    """The JSON object of one file: path, kind, the scheme, a row per selected Caffe blob, the settings.

    `names`: the PyTorch names selected (by --blob), whose rows are shown
    with those of their modules' blobs written under no name (a BatchNorm's
    factor); None shows every row.

    `result` is a TorchExport (torchport/metadata.py) or a TorchNames; the
    first adds "settings" ({"<module>.<setting>": text}, as the export's
    metadata holds them) and, for torch-identifiers, "modules"
    ({identifier: Caffe name} of the names changed).
    """
    rows = []
    modules = {m.module for m in result.rows if m.name in names} if names is not None else set()
    for m in result.rows:
        if names is not None and m.name not in names and not (m.name is None and m.module in modules):
            continue
        rows.append({"name": m.entry.name, "layer": m.entry.layer, "type": m.type or m.entry.type, "torch": m.name,
                     "shape": list(m.entry.shape), "torch_shape": list(m.shape) if m.shape is not None else None,
                     "done": m.done})
    out = {"path": doc.path, "kind": doc.kind, "bytes": doc.size, "names": getattr(result, "scheme", "torch"),
           "fold": fold}
    out.update(doc.meta)
    out["blobs"] = rows
    out["settings"] = dict(getattr(result, "settings", {}))
    if getattr(result, "modules", None):
        out["modules"] = dict(result.modules)
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


# Modules named on a settings line, at most (--json has them all).
_SHOWN = 8


def settings_lines(settings: dict) -> list:
    """The settings a port must copy, a line per setting and value with the modules that have it."""
    if not settings:
        return []
    lines = ["  settings a port must copy (the export's metadata keys <module>.<setting>):"]
    groups: dict = {}
    for key, value in settings.items():
        module, setting = key.rsplit(".", 1)
        groups.setdefault((setting, value), []).append(module)
    for (setting, value), modules in groups.items():
        shown = ", ".join(escape(m) for m in modules[:_SHOWN])
        more = f" and {len(modules) - _SHOWN} more" if len(modules) > _SHOWN else ""
        lines.append(f"    {escape(setting)} = {escape(value)}: {shown}{more}")
    return lines


def modules_lines(modules: dict) -> list:
    """torch-identifiers' changed module names, as one line (--json has them all)."""
    if not modules:
        return []
    pairs = [f"{escape(caffe)} -> {escape(ident)}" for ident, caffe in modules.items()]
    more = f" and {len(pairs) - _SHOWN} more" if len(pairs) > _SHOWN else ""
    return [f"  module names made identifiers: {', '.join(pairs[:_SHOWN])}{more}"]


def _notes(record: dict) -> list:
    return settings_lines(record.get("settings") or {}) + modules_lines(record.get("modules") or {})


def plain_mapping(record: dict, width: int) -> str | None:
    """The mapping table as rich prints it off a terminal, or None where rich must draw it."""
    title = "".join(title_parts(record))
    columns, rows, note = mapping_table(record, width)
    table = plain_table(columns, rows)
    if table is None or not (title.isascii() and title.isprintable()):
        return None
    return "\n".join([title, *table, _footer(record), *([note] if note is not None else []), *_notes(record)]) + "\n"


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
    for line in [*([note] if note is not None else []), *_notes(record)]:
        print_line(console, line)


# convert --names torch's summary: a line per kind of renaming (torchport/metadata.py's kinds).
_KIND_LINES = (("renamed", "renamed (the layer's name, PyTorch's parameter name)", True),
               ("transposed", "transposed (InnerProduct's transpose: true, to Linear's (out, in))", False),
               ("folded", "folded (a Scale's gamma and beta as its BatchNorm's weight and bias)", True),
               ("divided", "divided by the factor (BatchNorm's running_mean and running_var, by blob 2)", True),
               ("kept", "left under Caffe's name (<layer>.<index>: no rule for the layer type)", True),
               ("not written", "not written (BatchNorm's factors)", False))


def export_summary(path: str, output: str, scheme: str, types: list, asked: str | None, counts: dict) -> list:
    """The lines convert --names torch prints on stderr: what was written (in which types), then a line per kind."""
    tally: dict = {}
    for name in types:
        tally[name] = tally.get(name, 0) + 1
    if len(tally) == 1:
        written = f"all {next(iter(tally))}"
    else:
        written = " and ".join(f"{n} {name}" for name, n in sorted(tally.items(), key=lambda kv: -kv[1]))
        if asked is None:
            written += " (each as stored: float16 blobs stay float16; --float writes float32 only)"
        elif asked in ("half", "bf16"):
            written += f" (--{asked}: the blobs it cannot hold without an Inf stay wider, as warned)"
    lines = [f"{path}: --names {scheme}: {len(types)} tensors written to {output}, {written}"]
    for kind, label, always in _KIND_LINES:
        if always or counts.get(kind):
            lines.append(f"{path}: {counts.get(kind, 0)} {label}")
    return lines


def origin_rows(record: dict) -> list:
    """info on a --names torch export: (tensor, Caffe blob, done) for each tensor the mapping names."""
    rows = []
    for b in record["blobs"]:
        came = b.get("from")
        if came is not None:
            rows.append([escape(b["name"]), escape(f"{came['layer']}/{came['blob']}"), escape(came["done"])])
    return rows


ORIGIN_COLUMNS = [("tensor", "left"), ("from Caffe blob", "left"), ("done", "left")]


def plain_origins(record: dict) -> list | None:
    """The lines under info's table for a --names torch export ([] for another file), or None where rich must draw them."""
    rows = origin_rows(record)
    if not rows:
        return []
    table = plain_table(ORIGIN_COLUMNS, rows)
    if table is None:
        return None
    return [*table, *_notes(record)]


def render_origins(console, record: dict) -> None:
    """plain_origins with rich."""
    from .tables import print_line, print_table  # rich loads only where a table is drawn (start-up)

    rows = origin_rows(record)
    if not rows:
        return
    print_table(console, ORIGIN_COLUMNS, rows)
    for line in _notes(record):
        print_line(console, line)
