"""The layer sweeps export every net they run to ONNX where onnx and onnxruntime are installed.

caffenets.ours_forward runs each sweep's net in blobtool; with SWEEP.opsets set
it also exports the net at opsets 13 and 17, checks the model with onnx's full
check, runs it in onnxruntime and holds every blob to blobtool's values (see
caffenets' onnx_sweep). The export is on for this room's modules only, so a
net another room runs is not exported. test_sweep_export.py then holds the
records to every exporter, once all the sweeps have run in the process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from caffenets import SWEEP, SWEEP_FILES, SWEEP_OPSETS, export_available

HERE = Path(__file__).resolve().parent
LAST = "test_sweep_export.py"


def is_sweep(item) -> bool:
    """Whether `item` is a test of one of the layer sweeps."""
    return item.path.parent == HERE and item.path.name in SWEEP_FILES


@pytest.fixture(autouse=True, scope="module")
def sweeps_export(request):
    """SWEEP.opsets set while a sweep module runs (where the extra is installed), cleared after it."""
    if request.module.__file__ and Path(request.module.__file__).name in SWEEP_FILES and export_available():
        SWEEP.opsets = SWEEP_OPSETS
    yield
    SWEEP.opsets = ()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A sweep test that passed, its exports included, is noted in SWEEP.passed."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.passed and is_sweep(item) and SWEEP.opsets:
        SWEEP.passed.add(item.nodeid)


def pytest_collection_modifyitems(session, config, items):
    """test_sweep_export.py's tests run after every other test, the sweeps' included.

    Under pytest-xdist (`--dist loadgroup`, pyproject.toml) the sweeps and that last check are one
    group, sent to one worker in this order, so the check sees every sweep's exports.
    """
    last = [item for item in items if item.path.parent == HERE and item.path.name == LAST]
    items[:] = [item for item in items if item not in last] + last
    for item in items:
        if is_sweep(item) or item in last:
            item.add_marker(pytest.mark.xdist_group("layer_sweeps"))
