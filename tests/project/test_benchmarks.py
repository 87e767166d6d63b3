"""The benchmark harness runs end to end on tiny inputs (the real run is not part of the tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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
    # The GPU check itself, on tests/helpers/fakecupy.py (its figures mean nothing): every row it
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


def _forward_harness():
    """benchmarks/forward.py as a module (it is a script, not part of the package)."""
    import importlib.util

    name = "blobtool_forward_benchmark"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "forward.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_forward_harness_smoke_run_writes_its_section(tmp_path):
    pytest.importorskip("cv2")
    out = tmp_path / "RESULTS.md"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "forward.py"), "--smoke", "--out", str(out),
                          "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert text.startswith("## blobtool run against OpenCV 4.x's forward\n")
    assert "Machine: " in text and "OpenCV 4." in text
    assert "`python benchmarks/forward.py --smoke`" in text
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ") and "x3x" in line}
    assert sorted(rows) == ["MobileFaceNet", "ResNet-20", "VGG-16"]
    for name, row in rows.items():
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 11, row
        assert cells[5].endswith("x") and float(cells[5][:-1]) > 0, row
        assert cells[9] in ("yes", "NO"), row
        # Both processes drew the same input: blobtool's outputs are OpenCV's, to float32 rounding.
        assert float(cells[10]) < 1e-4, row
    # Every goal is judged, met or not: time and memory for each net.
    assert text.count("met: ") == 6
    assert [p.name for p in tmp_path.iterdir()] == ["RESULTS.md"]



def test_export_harness_smoke_run_writes_its_section_and_keeps_the_others(tmp_path):
    pytest.importorskip("onnx", reason="blobtool export needs the onnx extra")
    pytest.importorskip("onnxruntime", reason="the harness proves the export in onnxruntime")
    out = tmp_path / "RESULTS.md"
    others = ("# blobtool benchmark results\n\nthe standard run\n\n## blobtool run against OpenCV 4.x's forward\n\n"
              "forward's figures\n")
    out.write_text(others)
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "export.py"), "--smoke", "--out", str(out),
                          "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert text.startswith(others + "\n## blobtool export against reading and writing the bytes\n")
    section = text[len(others):]
    assert "Machine: " in section and "onnx 1." in section and "onnxruntime 1." in section
    assert "`python benchmarks/export.py --smoke`" in section
    rows = [line for line in section.splitlines() if line.startswith("| VGG-16 |")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert len(cells) == 11, rows[0]
    assert cells[4].endswith("x") and float(cells[4][:-1]) > 0, rows[0]
    assert cells[8] in ("yes", "NO"), rows[0]
    assert float(cells[9]) > 0, rows[0]
    # onnxruntime ran the export on the input `blobtool run` drew: the same outputs, to float32 rounding.
    assert float(cells[10]) < 1e-4, rows[0]
    # Every goal is judged, met or not: time, memory, the outputs.
    assert section.count("met: ") == 3
    # A second run replaces its own section only.
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "export.py"), "--smoke", "--out", str(out),
                          "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    again = out.read_text()
    assert again.startswith(others + "\n## blobtool export against reading and writing the bytes\n")
    assert again.count("## blobtool export against") == 1
    assert [p.name for p in tmp_path.iterdir()] == ["RESULTS.md"]

def test_forward_harness_replaces_its_own_section_and_keeps_the_rest(tmp_path):
    forward = _forward_harness()
    path = tmp_path / "RESULTS.md"
    path.write_text("# blobtool benchmark results\n\nthe standard run\n\n" + forward.HEADING + "\n\nold figures\n\n"
                    "## Later section\n\nkept\n")
    forward.write_section(path, forward.HEADING + "\n\nnew figures\n")
    assert path.read_text() == ("# blobtool benchmark results\n\nthe standard run\n\n" + forward.HEADING +
                                "\n\nnew figures\n\n## Later section\n\nkept\n")
    # Absent, it goes at the end; a file that does not exist yet holds only the section.
    path.write_text("# blobtool benchmark results\n\nthe standard run\n")
    forward.write_section(path, forward.HEADING + "\n\nfigures\n")
    assert path.read_text() == ("# blobtool benchmark results\n\nthe standard run\n\n" + forward.HEADING +
                                "\n\nfigures\n")
    fresh = tmp_path / "new.md"
    forward.write_section(fresh, forward.HEADING + "\n\nfigures\n")
    assert fresh.read_text() == forward.HEADING + "\n\nfigures\n"


def test_forward_harness_nets_have_the_sizes_they_claim():
    forward = _forward_harness()
    nets = forward.make_nets(smoke=False)
    assert nets["vgg16"].weight_bytes // 4 == 138_357_544
    assert nets["resnet20"].weight_bytes // 4 < 300_000
    assert 900_000 < nets["mobilefacenet"].weight_bytes // 4 < 1_100_000
    # The blob sizes the memory bound uses are the shapes Caffe gives.
    assert nets["resnet20"].shapes["pool"] == (256, 64, 1, 1)
    assert nets["mobilefacenet"].shapes["conv_last"] == (16, 512, 7, 7)
    assert nets["mobilefacenet"].shapes["gdc"] == (16, 512, 1, 1)
    assert nets["vgg16"].shapes["pool5"] == (1, 512, 7, 7)
    assert [size for size, _, _ in nets["vgg16"].largest_blobs()] == [64 * 224 * 224 * 4] * 2
