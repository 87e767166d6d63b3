"""predict's records as lines of text: a heading for each image, then its answer, indented."""

from __future__ import annotations

__all__ = ["answer_lines"]

# Where a segmentation has many classes, the largest shares are listed and the rest counted.
_SHARES_SHOWN = 8


def _name(entry: dict) -> str:
    return entry.get("label") or f"class {entry['class']}"


def answer_lines(record: dict) -> list:
    """The lines of one image's record (an error record has none: its line goes to stderr)."""
    if "error" in record:
        return []
    h, w = record["size"]
    lines = [f"{record['image']}: {w}x{h} -> {'x'.join(map(str, record['input']))}"]
    answer = record["answer"]
    kind = answer["kind"]
    if kind == "classes":
        word = answer["values"]
        lines += [f"  {c[word]:.4f}  {_name(c)} ({c['class']})" for c in answer["top"]]
    elif kind == "detections":
        if not answer["boxes"]:
            lines.append(f"  no box scores {answer['threshold']:g} or more")
        for b in answer["boxes"]:
            x0, y0, x1, y1 = b["box"]
            lines.append(f"  {b['score']:.3f}  {_name(b)} ({b['class']}) at {x0:g},{y0:g} - {x1:g},{y1:g}")
    elif kind == "segmentation":
        shown = answer["classes"][:_SHARES_SHOWN]
        more = len(answer["classes"]) - len(shown)
        text = ", ".join(f"{_name(c)} {c['share'] * 100:.1f}%" for c in shown)
        lines.append(f"  class map {'x'.join(map(str, answer['map']))}: {text}" + (f" and {more} more" if more else ""))
    else:
        for b in answer["blobs"]:
            lines.append(f"  {b['name']} {'x'.join(map(str, b['shape']))}: min {b['min']:.6g} max {b['max']:.6g} "
                         f"mean {b['mean']:.6g} l2 {b['l2']:.6g}")
    return lines
