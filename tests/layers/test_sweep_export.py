"""Every layer type with an exporter is exported by the layer sweeps, and onnxruntime computes it as blobtool.

The sweeps of this room export each net they run (conftest.py; caffenets'
onnx_sweep checks each model and holds onnxruntime to blobtool's forward as it
goes). What is left to hold them to is the whole: every exporter met at least
once at each opset, every refusal one docs/onnx.md gives, the worst difference
within 1e-4. That needs every sweep to have run in this process first: this
test runs last (conftest.py; under pytest-xdist the sweeps and this test are
one group, in one worker), and skips with the reason where the sweeps did not
all run (a -k selection, a file alone).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from caffenets import DOCUMENTED_REFUSALS, SWEEP, SWEEP_FILES, SWEEP_OPSETS, export_available

HERE = Path(__file__).resolve().parent

TOLERANCE = 1e-4

# Exporters held to onnxruntime, every case, by their own test files rather than by the sweeps:
# BVLC's recurrent and remaining layers (layers/test_layers_bvlc.py), the forks' layers
# (layers/test_fork_layers.py, layers/test_fork_rois.py) and DetectionOutput (onnxport/test_ssd_export.py).
ELSEWHERE = {"LSTM", "LSTMUnit", "RNN", "SPP", "Im2col", "BatchReindex", "Filter", "Parameter",
             "BN", "Axpy", "ROIPooling", "PSROIPooling", "Reorg", "DetectionOutput"}


def test_every_exporter_is_met_by_the_sweeps_within_the_tolerance(request):
    if not export_available():
        pytest.skip("onnx or onnxruntime is not installed (blobtool[onnx]): the sweeps ran without exporting")
    sweeps = {item.nodeid for item in request.session.items
              if item.path.parent == HERE and item.path.name in SWEEP_FILES}
    missing = sweeps - SWEEP.passed
    if not sweeps:
        pytest.skip("the layer sweeps are not in this run: run tests/layers whole, in one process")
    if missing:
        pytest.skip(f"{len(missing)} of the {len(sweeps)} layer sweep tests did not run and pass in this process "
                    "before this one: run tests/layers whole, in one process")
    from blobtool.onnxport import ops  # noqa: F401  (the exporters register on import)
    from blobtool.onnxport.emit import EXPORTERS

    assert {line["opset"] for line in SWEEP.lines} == set(SWEEP_OPSETS)
    for opset in SWEEP_OPSETS:
        exported = {t for line in SWEEP.lines if line["opset"] == opset and "worst" in line for t in line["types"]}
        assert set(EXPORTERS) - ELSEWHERE <= exported, (opset, set(EXPORTERS) - ELSEWHERE - exported)
    refused = [line["refused"] for line in SWEEP.lines if "refused" in line]
    assert all(any(reason in r for reason in DOCUMENTED_REFUSALS) for r in refused), refused
    assert max(line["worst"] for line in SWEEP.lines if "worst" in line) <= TOLERANCE
