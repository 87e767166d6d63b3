"""An export proved: onnx's full check, then onnxruntime and blobtool's own forward on the same input.

`check_export(path, program, outputs)` runs onnx.checker.check_model with
full_check (the graph, the types, every shape inferred), then the model in
onnxruntime and the Caffe net in blobtool's forward (forward/runner.py) on
the same random normal input (numpy's default_rng(seed), one array per
input in order, as `blobtool run` draws them), and compares every output
blob by blob (forward/check.py's rule: beyond 1e-4 of the blob's largest
finite magnitude is a difference, NaN and Inf compared by place).

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
from ..forward.check import CheckResult, compare_blob, not_written

__all__ = ["check_export", "prove_export"]

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
    rng = np.random.default_rng(seed)
    # An input that takes pixels is fed random pixels, and blobtool's forward their preprocessing in numpy.
    given = {name: (rng.integers(0, 256, pixels[name].pixel_shape(shape), dtype=np.uint8) if name in pixels else
                    rng.standard_normal(shape, dtype=np.float32)) for name, shape in program.inputs.items()}
    feeds = {name: pixels[name].apply(v) if name in pixels else v for name, v in given.items()}
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
    for name in outputs:
        result.rows.append(compare_blob(name, ours[name], np.asarray(theirs[name], dtype=np.float32)))
    return result


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
