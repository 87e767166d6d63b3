"""Every ONNX model an export test writes, held to onnx's full check and to single assignment.

- ``check_onnx(path)``: onnx.checker.check_model(path, full_check=True) (the
  graph, the types, every shape inferred; external data read beside the
  file), then that every value is assigned once: graph inputs, initializers
  and node outputs are distinct names (onnx accepts an initializer named
  as an input, which then only gives the input a default), and so are the
  nodes' names. Returns the loaded model.
- ``every_export_checked``: an autouse fixture for a test module to import
  (``from onnxvalid import every_export_checked  # noqa: F401``): each model
  blobtool writes while a test runs (the CLI in-process, blobtool.export,
  export_program) is checked as soon as it is written; a test that wrote
  one that fails the check errors at its teardown, naming the file.

The layer sweeps export each net they run (tests/helpers/caffenets.py's
onnx_sweep, turned on by tests/layers/conftest.py): that path calls
check_onnx on each model it writes.
"""

from __future__ import annotations

import os
import stat
from collections import Counter

import pytest


def check_onnx(path):
    """The model at `path`, loaded, after onnx's full check and a check that each name is assigned once."""
    import onnx

    onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    assigned = Counter([i.name for i in graph.input] + [t.name for t in graph.initializer]
                       + [o for node in graph.node for o in node.output if o])
    twice = sorted(name for name, n in assigned.items() if n > 1)
    assert not twice, f"{path}: names assigned more than once: {twice[:8]}"
    nodes = Counter(node.name for node in graph.node)
    same = sorted(name for name, n in nodes.items() if n > 1)
    assert not same, f"{path}: node names used more than once: {same[:8]}"
    return model


def ort_session(path):
    """An onnxruntime session of the model at `path`: CPU, every graph optimization on, its log silenced."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@pytest.fixture(autouse=True)
def every_export_checked(monkeypatch):
    """Check each model blobtool writes during the test (see the module); the test errors where one fails."""
    pytest.importorskip("onnx", reason="onnx is not installed (blobtool[onnx])")
    from blobtool.onnxport import graph

    real = graph._write
    failures = []

    def written(model, initializers, dest, external):
        real(model, initializers, dest, external)
        path = os.fspath(dest)
        try:
            regular = stat.S_ISREG(os.stat(path).st_mode)
        except (OSError, TypeError):
            regular = False
        if not regular:  # a FIFO or a device: the test that wrote it checks what it read
            return
        try:
            check_onnx(path)
        except Exception as exc:  # noqa: BLE001  every reason a model is refused is a failure to report
            failures.append(f"{path}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")

    monkeypatch.setattr(graph, "_write", written)
    yield
    if failures:
        pytest.fail("an exported model fails onnx's full check: " + "; ".join(failures), pytrace=False)
