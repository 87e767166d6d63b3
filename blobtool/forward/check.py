"""Two nets run on the same input, compared blob by blob: what fold --check and transplant --check prove.

`check_nets(before, after, ...)` runs both nets' deploy nets (forward/run.py)
on the same random normal input (from `seed`), every blob asked for, and
compares each blob both nets have by name: the largest absolute difference,
where it is, and whether it is beyond float32 rounding. "Beyond" means more
than CHECK_TOLERANCE times the blob's largest magnitude in the net before:
a fold recomputes its weights in float64 and stores them in float32, so
the two nets differ by rounding only, a few units of float32's 6e-8 per
layer, where a wrong fold differs by whole values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import UsageError
from .run import ALL, run_net

__all__ = ["CheckResult", "check_nets", "compare_blob", "CHECK_TOLERANCE"]

# A blob differs when max |after - before| > CHECK_TOLERANCE * max |before|: the bound the tests hold
# blobtool's run to against OpenCV's, an implementation that rounds in another order.
CHECK_TOLERANCE = 1e-4


@dataclass
class CheckResult:
    """The comparison: one row per blob both nets have, in the order the net before computes them."""

    before: str
    after: str
    inputs: list
    rows: list = field(default_factory=list)   # {"name", "shape", "max_abs", "at", "scale", "differs"}
    only_before: list = field(default_factory=list)
    only_after: list = field(default_factory=list)

    @property
    def differing(self) -> list:
        return [row for row in self.rows if row["differs"]]

    @property
    def passed(self) -> bool:
        return not self.differing

    @property
    def worst(self) -> float:
        """The largest difference of any blob, as a fraction of that blob's largest magnitude."""
        return max((row["max_abs"] / row["scale"] if row["scale"] else 0.0 for row in self.rows), default=0.0)

    def record(self) -> dict:
        return {"before": self.before, "after": self.after, "inputs": self.inputs, "tolerance": CHECK_TOLERANCE,
                "passed": self.passed, "blobs": self.rows, "only_before": self.only_before,
                "only_after": self.only_after}

    def lines(self) -> list:
        """Lines for stderr: the verdict, then each blob that differs, most different first."""
        compared = len(self.rows)
        if self.passed:
            blobs = f"{compared} blob{'s' * (compared != 1)}"
            return [f"check: {self.after} computes what {self.before} computes: {blobs} compared on the same random "
                    f"input, the largest difference {self.worst:.3g} of a blob's largest value"]
        out = [f"check FAILED: {len(self.differing)} of {compared} blobs of {self.after} differ from "
               f"{self.before}'s beyond {CHECK_TOLERANCE:g} of their largest value"]
        for row in sorted(self.differing, key=lambda r: -(r["max_abs"] / (r["scale"] or 1.0))):
            at = ",".join(map(str, row["at"]))
            out.append(f"  {row['name']}: max |difference| {row['max_abs']:.6g} at [{at}] (largest value "
                       f"{row['scale']:.6g})")
        return out


def check_nets(before, after, *, before_definition=None, after_definition=None, shapes: dict | None = None,
               seed: int = 0) -> CheckResult:
    """Run net documents `before` and `after` on the same random input; compare every blob both have."""
    first = run_net(before, definition=before_definition, shapes=shapes, seed=seed, outputs=ALL)
    feeds = {name: first.values[name] for name in first.program.inputs}
    # The same arrays feed the net after (run_net refuses an input it does not take).
    second = run_net(after, definition=after_definition, feeds=feeds, shapes=shapes, seed=seed, outputs=ALL)
    if set(second.program.inputs) != set(first.program.inputs):
        raise UsageError(f"the nets take other inputs: {', '.join(first.program.inputs)} before, "
                         f"{', '.join(second.program.inputs)} after", path=after.path)
    result = CheckResult(before.path, after.path, first.inputs)
    for name, a in first.values.items():
        if name in first.program.inputs:
            continue
        b = second.values.get(name)
        if b is None:
            result.only_before.append(name)
            continue
        result.rows.append(compare_blob(name, a, b))
    result.only_after = [n for n in second.values if n not in first.values]
    return result


def compare_blob(name: str, a: np.ndarray, b: np.ndarray) -> dict:
    """One row of a check: the largest |b - a|, where, a's largest magnitude, and whether it is beyond the tolerance."""
    if a.shape != b.shape:
        return {"name": name, "shape": [list(a.shape), list(b.shape)], "max_abs": float("inf"), "at": [],
                "scale": 0.0, "differs": True}
    wide_a = a.astype(np.float64)
    diff = np.abs(wide_a - b.astype(np.float64))
    scale = float(np.max(np.abs(wide_a))) if a.size else 0.0
    if not a.size:
        return {"name": name, "shape": list(a.shape), "max_abs": 0.0, "at": [], "scale": 0.0, "differs": False}
    nan = np.isnan(a) != np.isnan(b)
    if nan.any():
        at = np.unravel_index(int(np.argmax(nan)), a.shape)
        return {"name": name, "shape": list(a.shape), "max_abs": float("nan"), "at": [int(i) for i in at],
                "scale": scale, "differs": True}
    diff = np.where(np.isnan(diff), 0.0, diff)
    k = int(np.argmax(diff))
    worst = float(diff.reshape(-1)[k])
    differs = not worst <= CHECK_TOLERANCE * max(scale, np.finfo(np.float32).tiny)
    return {"name": name, "shape": list(a.shape), "max_abs": worst,
            "at": [int(i) for i in np.unravel_index(k, a.shape)], "scale": scale, "differs": differs}
