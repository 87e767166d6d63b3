"""The benchmark harness runs end to end on tiny inputs (the real run is not part of the tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_harness_smoke_run_writes_its_table(tmp_path):
    out = tmp_path / "RESULTS.md"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--smoke", "--reps", "1",
                          "--out", str(out), "--workdir", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert text.startswith("# blobtool benchmark results")
    assert "Machine: " in text
    for case in ("norm f32: blobtool", "norm f32: floor", "norm f32: pycaffe idiom", "norm f64: blobtool",
                 "norm net: blobtool", "convert --double f32", "scale f32", "info net", "info small",
                 "import numpy"):
        assert f"| {case}" in text, case
    assert "files --jobs 1 |" in text
    # Every target is judged, met or not.
    assert text.count("met: ") == 12
    for case in ("big: read floor (cat)", "big: norm", "big: info --stats", "big: show", "big: compare, 1 in 1000 differ"):
        assert f"| {case} |" in text, case
    assert "Floods" in text
    for layout in ("float32, h5py's latest format", "float32, HDF5's default format", "float16, h5py's latest format",
                   "float16, HDF5's default format"):
        assert f"| HDF5 net of 50 one-value layers, {layout} |" in text, layout
    # Nothing is left behind in the work folder.
    assert [p.name for p in tmp_path.iterdir()] == ["RESULTS.md"]


@pytest.mark.slow
def test_harness_floods_alone_time_the_hdf5_nets_info_norm_and_compare(tmp_path):
    out = tmp_path / "RESULTS.md"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--floods", "--smoke", "--reps", "1",
                          "--out", str(out), "--workdir", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert "`python benchmarks/run.py --floods --smoke`" in text
    assert "big: norm" not in text
    rows = [line for line in text.splitlines() if line.startswith("| HDF5 net of 50 one-value layers, ")]
    assert len(rows) == 4
    for row in rows:
        # info, norm and compare: each a median (range), then CPU seconds.
        cells = row.strip("|").split("|")
        assert len(cells) == 6, row
        for cell in cells[2:5]:
            wall, cpu = cell.split("),")
            assert float(cpu) > 0, row
            assert "(" in wall and "-" in wall, row
    assert text.count("met: ") == 2
    assert [p.name for p in tmp_path.iterdir()] == ["RESULTS.md"]


def test_gpu_check_runs_on_the_fake_cupy_and_reports_copies_and_reductions(tmp_path):
    # The GPU check itself, on tests/fakecupy.py (its figures mean nothing): every row it
    # reports is there, and nothing failed on the way.
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--fake"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "OUT": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    table = (tmp_path / "gpu_check.txt").read_text()
    assert table == res.stdout
    assert "failed" not in table
    for row in ("H2D copy, pinned, 1 MiB", "H2D copy, pageable, 1 MiB", "device copy, 4 MiB",
                "fused asum+sumsq, 4 MiB on device", "streamed asum+sumsq, 2 MiB from host"):
        assert row in table, row
    assert table.count(" GB/s") == 5
    assert "nothing installed" in table
