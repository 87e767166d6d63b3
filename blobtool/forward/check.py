"""Two nets run on the same input, compared blob by blob: what fold --check and transplant --check prove.

`check_nets(before, after, ...)` runs both nets' deploy nets (forward/run.py)
on the same random normal input (from `seed`), every blob asked for, and
compares each blob both nets have by name (compare_blob). NaN and Inf are
compared by place: a NaN, +Inf or -Inf where the net before has the same
is equal, anything else there is a difference, counted. The finite values
differ when the largest absolute difference is more than CHECK_TOLERANCE
times the largest finite magnitude of the blob in the net before: a fold
recomputes its weights in float64 and stores them in float32, so the two
nets differ by rounding only, a few units of float32's 6e-8 per layer,
where a wrong fold differs by whole values. The scale comes from finite
values only, so that one Inf cannot make every difference small, nor one
NaN make equal nets fail.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import BlobToolError, UsageError
from .run import ALL, run_net

__all__ = ["CheckResult", "check_nets", "compare_blob", "not_written", "CHECK_TOLERANCE"]

# A blob differs when max |after - before| > CHECK_TOLERANCE * max |before| over finite values: the bound the
# tests hold blobtool's run to against OpenCV's, an implementation that rounds in another order.
CHECK_TOLERANCE = 1e-4

# The kinds of value compared by place; any other value is finite.
_FINITE, _NAN, _POS_INF, _NEG_INF = 0, 1, 2, 3


@dataclass
class CheckResult:
    """The comparison: one row per blob both nets have, in the order the net before computes them.

    `refused`, when set, says why the net after could not be compared at all
    (onnxruntime refused the model): the check failed. `withheld` names the
    outputs left unwritten because the check failed (said on its first line).
    """

    before: str
    after: str
    inputs: list
    rows: list = field(default_factory=list)   # see compare_blob
    only_before: list = field(default_factory=list)
    only_after: list = field(default_factory=list)
    refused: str | None = None
    withheld: list = field(default_factory=list)

    @property
    def differing(self) -> list:
        return [row for row in self.rows if row["differs"]]

    @property
    def passed(self) -> bool:
        return self.refused is None and not self.differing

    @property
    def worst(self) -> float:
        """The largest finite difference of any blob, as a fraction of that blob's largest finite magnitude."""
        return max((row["max_abs"] / row["scale"] if row["scale"] else 0.0 for row in self.rows), default=0.0)

    @property
    def nonfinite(self) -> int:
        """How many NaN and Inf values the blobs compared hold in the same places in both nets."""
        return sum(row.get("nonfinite", 0) for row in self.rows)

    def record(self) -> dict:
        out = {"before": self.before, "after": self.after, "inputs": self.inputs, "tolerance": CHECK_TOLERANCE,
               "passed": self.passed, "blobs": self.rows, "only_before": self.only_before,
               "only_after": self.only_after}
        if self.refused is not None:
            out["refused"] = self.refused
        if self.withheld:
            out["not_written"] = list(self.withheld)
        return out

    def lines(self) -> list:
        """Lines for stderr: the verdict, then each blob that differs, most different first."""
        compared = len(self.rows)
        if self.passed:
            blobs = f"{compared} blob{'s' * (compared != 1)}"
            same = self.nonfinite
            nonfinite = (f"; {same} NaN/Inf value{'s' * (same != 1)}, each in the same place in both" if same
                         else "")
            return [f"check: {self.after} computes what {self.before} computes: {blobs} compared on the same random "
                    f"input, the largest difference {self.worst:.3g} of a blob's largest finite value{nonfinite}"] + [
                f"  {row['name']}: {row['said']}" for row in self.rows if row.get("said")]
        withheld = f"; not written: {', '.join(map(str, self.withheld))}" if self.withheld else ""
        if self.refused is not None:
            return [f"check FAILED: {self.refused}{withheld}"]
        out = [f"check FAILED: {len(self.differing)} of {compared} blobs of {self.after} differ from "
               f"{self.before}'s beyond {CHECK_TOLERANCE:g} of their largest finite value, or in where they hold "
               f"NaN or Inf{withheld}"]
        for row in sorted(self.differing, key=_how_different):
            at = ",".join(map(str, row["at"]))
            line = f"  {row['name']}: "
            if row.get("said"):  # a DetectionOutput's rows (onnxport/check.py's compare_rows)
                line += row["said"]
            elif not row["at"] and row["max_abs"] == float("inf"):
                line += f"shape {row['shape'][0]} before, {row['shape'][1]} after"
            else:
                line += f"max |difference| {row['max_abs']:.6g} at [{at}] (largest value {row['scale']:.6g})"
            if row.get("astray"):
                where = ",".join(map(str, row["astray_at"]))
                line += (f"; {row['astray']} NaN/Inf value{'s' * (row['astray'] != 1)} not matched by the same in "
                         f"the other net, first at [{where}] ({row['astray_values'][0]} before, "
                         f"{row['astray_values'][1]} after)")
            out.append(line)
        return out


def _how_different(row: dict) -> tuple:
    return (-row.get("astray", 0), -(row["max_abs"] / (row["scale"] or 1.0)))


def check_nets(before, after, *, before_definition=None, after_definition=None, shapes: dict | None = None,
               seed: int = 0) -> CheckResult:
    """Run net documents `before` and `after` on the same random input; compare every blob both have."""
    try:
        first = run_net(before, definition=before_definition, shapes=shapes, seed=seed, outputs=ALL,
                        keep_inputs=True)
    except BlobToolError as exc:
        raise exc.with_path(before.path)
    # The input as drawn, not as the net before left it (a layer working in place on its input,
    # Power data -> data, replaces the blob's value; the run never writes the arrays it was fed):
    # the same arrays feed the net after (run_net refuses an input it does not take).
    feeds = first.fed
    try:
        second = run_net(after, definition=after_definition, feeds=feeds, shapes=shapes, seed=seed, outputs=ALL)
    except BlobToolError as exc:
        raise exc.with_path(after.path)
    if set(second.program.inputs) != set(first.program.inputs):
        raise UsageError(f"the nets take other inputs: {', '.join(first.program.inputs)} before, "
                         f"{', '.join(second.program.inputs)} after", path=after.path)
    written = first.program.versions.current
    result = CheckResult(before.path, after.path, first.inputs)
    for name, a in first.values.items():
        if name in first.program.inputs and name not in written:
            continue
        b = second.values.get(name)
        if b is None:
            result.only_before.append(name)
            continue
        result.rows.append(compare_blob(name, a, b))
    result.only_after = [n for n in second.values if n not in first.values]
    return result


def not_written(exc: BlobToolError, outputs) -> BlobToolError:
    """`exc`, which stopped a check before its verdict, saying that `outputs` were not written (its exit code kept)."""
    names = ", ".join(map(str, outputs))
    try:
        said = type(exc)(f"{exc.reason}; the check cannot run, so {names} {'is' if len(outputs) == 1 else 'are'} "
                         "not written", path=exc.path, offset=exc.offset, field=exc.field)
    except TypeError:  # an error class of other arguments: as it was
        return exc
    said.__cause__ = exc
    return said


def _kinds(x: np.ndarray) -> np.ndarray:
    """Each value's kind as compared by place: finite, NaN, +Inf or -Inf (int8, x's shape)."""
    kinds = np.zeros(x.shape, np.int8)
    kinds[np.isnan(x)] = _NAN
    kinds[np.isposinf(x)] = _POS_INF
    kinds[np.isneginf(x)] = _NEG_INF
    return kinds


def compare_blob(name: str, a: np.ndarray, b: np.ndarray) -> dict:
    """One row of a check: `a` (before) against `b` (after), as the module says.

    The row: name, shape, max_abs (the largest |b - a| where both are
    finite), at (where), scale (a's largest finite magnitude), nonfinite
    (NaN and Inf values in the same place, of the same kind, in both),
    astray (places where either holds NaN or Inf and the other not the
    same; with astray_at and astray_values, the first), differs.
    """
    if a.shape != b.shape:
        return {"name": name, "shape": [list(a.shape), list(b.shape)], "max_abs": float("inf"), "at": [],
                "scale": 0.0, "nonfinite": 0, "astray": 0, "differs": True}
    row = {"name": name, "shape": list(a.shape), "max_abs": 0.0, "at": [], "scale": 0.0, "nonfinite": 0,
           "astray": 0, "differs": False}
    if not a.size:
        return row
    a = np.asarray(a)
    b = np.asarray(b)
    finite_a, finite_b = np.isfinite(a), np.isfinite(b)
    both = finite_a & finite_b
    if not both.all():
        kinds_a, kinds_b = _kinds(a), _kinds(b)
        astray = kinds_a != kinds_b
        row["nonfinite"] = int(np.count_nonzero(~finite_a & ~astray))
        row["astray"] = int(np.count_nonzero(astray))
        if row["astray"]:
            k = int(np.argmax(astray.reshape(-1)))
            row["astray_at"] = [int(i) for i in np.unravel_index(k, a.shape)]
            row["astray_values"] = [_said(a.reshape(-1)[k]), _said(b.reshape(-1)[k])]
    if row["nonfinite"] or row["astray"]:
        a, b = np.where(both, a, 0), np.where(both, b, 0)
    wide_a = a.astype(np.float64)
    diff = np.abs(wide_a - b.astype(np.float64))
    k = int(np.argmax(diff))
    row["max_abs"] = float(diff.reshape(-1)[k])
    row["at"] = [int(i) for i in np.unravel_index(k, a.shape)]
    row["scale"] = float(np.max(np.abs(wide_a)))
    row["differs"] = bool(row["astray"]) or not row["max_abs"] <= CHECK_TOLERANCE * max(row["scale"],
                                                                                       np.finfo(np.float32).tiny)
    return row


def _said(value) -> str:
    return "nan" if np.isnan(value) else f"{float(value):.6g}"
