"""An export proved: onnx's full check, then onnxruntime and blobtool's own forward on the same input.

`check_export(path, program, outputs)` runs onnx.checker.check_model with
full_check (the graph, the types, every shape inferred), then the model in
onnxruntime and the Caffe net in blobtool's forward (forward/runner.py) on
the same random normal input (numpy's default_rng(seed), one array per
input in order, as `blobtool run` draws them), and compares every output
blob by blob (forward/check.py's rule: beyond 1e-4 of the blob's largest
magnitude is a difference).
"""

from __future__ import annotations

import numpy as np

from ..errors import FormatError
from ..forward.check import CheckResult, compare_blob

__all__ = ["check_export"]


def check_export(path: str, program, outputs: list, *, seed: int = 0, source: str = "") -> CheckResult:
    """CheckResult of the ONNX model at `path` against `program` (before: the Caffe net, after: the model)."""
    import onnx
    import onnxruntime as ort

    try:
        onnx.checker.check_model(path, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise FormatError(f"onnx's checker refuses the export: {str(exc).splitlines()[0]}", path=path) from exc
    program.check_memory(outputs)  # before the inputs are drawn: they are part of what the run holds
    rng = np.random.default_rng(seed)
    feeds = {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in program.inputs.items()}
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    theirs = dict(zip(outputs, session.run(outputs, feeds)))
    ours = program.run(feeds, outputs)
    result = CheckResult(source or program.path, path,
                         [{"name": n, "shape": list(s), "given": f"random normal, seed {seed}"}
                          for n, s in program.inputs.items()])
    for name in outputs:
        result.rows.append(compare_blob(name, ours[name], np.asarray(theirs[name], dtype=np.float32)))
    return result
