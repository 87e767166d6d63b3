"""An export proved: onnx's full check, then onnxruntime and blobtool's own forward on the same input.

`check_export(path, program, outputs)` runs onnx.checker.check_model with
full_check (the graph, the types, every shape inferred), then the model in
onnxruntime and the Caffe net in blobtool's forward (forward/runner.py) on
the same random normal input (numpy's default_rng(seed), one array per
input in order, as `blobtool run` draws them), and compares every output
blob by blob (forward/check.py's rule: beyond 1e-4 of the blob's largest
finite magnitude is a difference, NaN and Inf compared by place). A
DetectionOutput top, whose row count comes from the data, is compared by
compare_rows: the counts, then row by row, saying how many rows match.

A model that onnx's checker or onnxruntime refuses (to load or to run) is
a failed check, as a model that computes otherwise is: the result's
`refused` says who refused it and onnxruntime's own first line (exit 1,
and the model is not written). blobtool wrote that model, so the input is
not to blame (exit 3 would say it was), and the check did what it is for
(exit 70 would say blobtool failed). onnxruntime logs nothing to stderr:
its session logs at FATAL only, and its errors come back as that one line.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import BlobToolError
from ..forward.check import CHECK_TOLERANCE, CheckResult, compare_blob, not_written
from ..forward.run import random_inputs

__all__ = ["check_export", "compare_rows", "prove_export"]

# onnxruntime's log severities: 0 verbose ... 3 error, 4 fatal. Its errors reach blobtool as exceptions.
_ORT_QUIET = 4


def check_export(path: str, program, outputs: list, *, seed: int = 0, source: str = "", input_names=None,
                 names=None, pixels=None) -> CheckResult:
    """CheckResult of the ONNX model at `path` against `program` (before: the Caffe net, after: the model).

    `input_names` and `names` ({blob: its name in the model}, the export's
    ExportResult) say where a blob's name had to change in the model (a
    collision, a name that is not UTF-8): the model is fed and read by its own.
    """
    input_names, names, pixels = input_names or {}, names or {}, pixels or {}
    import onnx
    import onnxruntime as ort

    result = CheckResult(source or program.path, path,
                         [{"name": n, "shape": list(s), "given": (f"random uint8 pixels, seed {seed}" if n in pixels
                                                                  else f"random normal, seed {seed}")}
                          for n, s in program.inputs.items()])
    try:
        onnx.checker.check_model(path, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        result.refused = f"onnx's checker refuses the model: {_first_line(exc)}"
        return result
    program.check_memory(outputs)  # before the inputs are drawn: they are part of what the run holds
    if pixels:
        rng = np.random.default_rng(seed)
        # An input that takes pixels is fed random pixels, and blobtool's forward their preprocessing in numpy.
        given = {name: (rng.integers(0, 256, pixels[name].pixel_shape(shape), dtype=np.uint8) if name in pixels else
                        rng.standard_normal(shape, dtype=np.float32)) for name, shape in program.inputs.items()}
        feeds = {name: pixels[name].apply(v) if name in pixels else v for name, v in given.items()}
    else:
        given = feeds = random_inputs(program.inputs, seed)
    options = ort.SessionOptions()
    options.log_severity_level = _ORT_QUIET
    try:
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except _ort_errors() as exc:
        result.refused = f"onnxruntime refuses to load the model: {_first_line(exc)}"
        return result
    run_options = ort.RunOptions()
    run_options.log_severity_level = _ORT_QUIET
    try:
        fed = {input_names.get(n, n): v for n, v in given.items()}
        theirs = dict(zip(outputs, session.run([names.get(o, o) for o in outputs], fed, run_options)))
    except _ort_errors() as exc:
        result.refused = f"onnxruntime cannot run the model: {_first_line(exc)}"
        return result
    ours = program.run(feeds, outputs)
    detections = {top for step in program.steps if getattr(step.layer, "detection_rows", False) for top in step.tops}
    for name in outputs:
        compare = compare_rows if name in detections else compare_blob
        result.rows.append(compare(name, ours[name], np.asarray(theirs[name], dtype=np.float32)))
    return result


def compare_rows(name: str, ours: np.ndarray, theirs: np.ndarray) -> dict:
    """compare_blob's row for a DetectionOutput top (1, 1, N, 7): the row counts first, then row by row.

    A row matches where its image and label are equal and its score and box
    within CHECK_TOLERANCE of the largest finite magnitude among blobtool's
    scores and boxes (an Inf or NaN where blobtool's row holds the same);
    `said` counts the rows that match.
    """
    row = compare_blob(name, ours, theirs)
    a = ours.reshape(-1, 7)
    if ours.shape != theirs.shape:
        row["said"] = f"{len(a)} detection row{'s' * (len(a) != 1)} before, shape {list(theirs.shape)} after"
        return row
    b = theirs.reshape(-1, 7)
    values, others = a[:, 2:], b[:, 2:]
    finite = np.isfinite(values)
    # The scale of the finite values (compare_blob's rule); an Inf or NaN matches the same value only.
    scale = float(np.max(np.abs(values[finite]), initial=0.0))
    with np.errstate(invalid="ignore"):
        bound = CHECK_TOLERANCE * max(scale, np.finfo(np.float32).tiny)
        close = finite & (np.abs(values.astype(np.float64) - others) <= bound)
    close |= (~finite & (values == others)) | (np.isnan(values) & np.isnan(others))
    matched = np.all(a[:, :2] == b[:, :2], axis=1) & np.all(close, axis=1)
    count = int(np.count_nonzero(matched))
    row["differs"] = count < len(a)
    row["said"] = f"{count} of {len(a)} detection row{'s' * (len(a) != 1)} equal"
    if row["differs"]:
        first = int(np.argmin(matched))
        row["said"] += (f"; row {first} is {_row_text(a[first])} before, {_row_text(b[first])} after")
    return row


def _row_text(row: np.ndarray) -> str:
    return "[" + ", ".join(f"{float(v):.6g}" for v in row) + "]"


def prove_export(staged, dest, program, outputs: list, *, seed: int = 0, source: str = "",
                 exported=None, pixels=None) -> CheckResult:
    """check_export of the model at `staged.path(dest)`, put at `dest` (files.outputs.Staged) only when it passes.

    A failed check names `dest` in the result's `withheld`; an error that
    stops the check (the Caffe net cannot run) says `dest` is not written.
    `exported` (the ExportResult) gives the names the model calls its
    inputs and outputs by.
    """
    name = os.fspath(dest)
    try:
        verdict = check_export(os.fspath(staged.path(dest)), program, outputs, seed=seed, source=source,
                               input_names=getattr(exported, "input_names", None),
                               names=getattr(exported, "names", None), pixels=pixels)
    except BlobToolError as exc:
        raise not_written(exc.with_path(source or None), [name]) from exc
    verdict.after = name
    if verdict.passed:
        staged.place()
    else:
        verdict.withheld = [name]
    return verdict


def _ort_errors() -> tuple:
    """The exception classes onnxruntime raises for a model it refuses (its pybind module's), or RuntimeError."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as state
    except ImportError:
        return (RuntimeError,)
    found = tuple(v for v in vars(state).values() if isinstance(v, type) and issubclass(v, Exception))
    return found + (RuntimeError,)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
