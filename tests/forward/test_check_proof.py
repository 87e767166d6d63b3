"""The proof itself: fold --check, transplant --check and export --check (issue 43, items 1 to 4 and 14).

- NaN and Inf are compared by place, the finite values against a scale taken
  from finite values only: an Inf no longer hides a difference, a NaN no
  longer fails identical nets (forward/check.py's compare_blob);
- both nets of a check are fed the input as drawn, not as the net before
  left it (a first layer working in place on its input);
- a check that fails (exit 1) or cannot run (exit 3) leaves no output, and
  any earlier file as it was (files/outputs.py's Staged);
- onnxruntime refusing a model is a failed check: one line, exit 1, nothing
  of onnxruntime's own log on stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from blobtool.forward import check as checking
from blobtool.forward.check import compare_blob
from caffenets import layer, net, write_net_files
from runner import assert_error, invoke, ok, subprocess_env


def _ip(name, bottom, weight, bias, top=None):
    weight = np.asarray(weight, dtype=np.float64)
    return layer(name, "InnerProduct", bottom, top, blobs=[weight, bias],
                 inner_product_param={"num_output": weight.shape[0]})


def _files(folder) -> list:
    """Every name in `folder`, hidden ones too (a staging folder left behind would show)."""
    return sorted(os.listdir(folder))


def _no_numpy_warning(stderr: str) -> None:
    assert "RuntimeWarning" not in stderr and "Traceback" not in stderr, stderr


# -- 1. An Inf does not hide a difference ---------------------------------------------------------

def test_an_inf_in_a_blob_does_not_hide_weights_100_times_apart(tmp_path):
    """The template's ip computes Inf in one place; the values written are 100 times the template's elsewhere."""
    template = np.array([[np.inf, 0.0], [1.5, -0.5]])
    source = template * np.array([[1.0, 1.0], [-100.0, -100.0]])
    _, before = write_net_files(tmp_path, net([_ip("ip", "data", template, [0.0, 0.0])], {"data": (1, 2)}), "t")
    _, values = write_net_files(tmp_path, net([_ip("ip", "data", source, [0.0, 0.0])], {"data": (1, 2)}), "s")
    out = tmp_path / "o.caffemodel"
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # numpy's warning on Inf - Inf would be an exit 70 here
        result = invoke("transplant", values, before, "-o", out, "--check")
    assert result.exit_code == 1, result.stderr
    _no_numpy_warning(result.stderr)
    lines = result.stderr.splitlines()
    assert lines[0].startswith("blobtool: check FAILED: 1 of 1 blobs") and f"not written: {out}" in lines[0]
    assert lines[1].startswith("blobtool:   ip: max |difference| ") and "at [0,1]" in lines[1]
    assert not out.exists()
    # The Inf itself is in the same place in both: only the finite value differs.
    ours = compare_blob("ip", np.array([np.inf, -1.5], np.float32), np.array([np.inf, 149.97], np.float32))
    assert ours["differs"] and ours["max_abs"] == pytest.approx(151.47) and ours["scale"] == 1.5
    assert ours["nonfinite"] == 1 and ours["astray"] == 0 and ours["at"] == [1]


# -- 2. A NaN does not fail identical nets ---------------------------------------------------------

def test_identical_nets_holding_nan_pass_and_say_how_many(tmp_path):
    """A NaN weight (transplant of a net into itself) and a Log layer on negatives (fold of a net without BatchNorm)."""
    nan_weight = np.array([[np.nan, 0.0], [1.5, 0.0]])
    _, model = write_net_files(tmp_path, net([_ip("ip", "data", nan_weight, [0.0, 0.0])], {"data": (1, 2)}), "w")
    result = ok("transplant", model, model, "-o", tmp_path / "same.caffemodel", "--check")
    _no_numpy_warning(result.stderr)
    assert "computes what" in result.stderr and "1 NaN/Inf value, each in the same place in both" in result.stderr

    layers = [layer("log", "Log", "data"), _ip("ip", "log", [[1.0, 1.0, 1.0, 1.0]], [0.0])]
    _, logs = write_net_files(tmp_path, net(layers, {"data": (1, 4)}), "log")
    result = ok("fold", logs, "-o", tmp_path / "folded.caffemodel", "--check", "--json")
    _no_numpy_warning(result.stderr)
    record = json.loads(result.stdout)["check"]
    assert record["passed"] is True
    drawn = np.random.default_rng(0).standard_normal((1, 4), dtype=np.float32)  # the check's input, seed 0
    negatives = int((drawn < 0).sum())
    assert negatives > 0
    by_name = {row["name"]: row for row in record["blobs"]}
    assert by_name["log"]["nonfinite"] == negatives and by_name["log"]["astray"] == 0
    assert by_name["ip"]["nonfinite"] == 1  # the sum of NaNs
    assert f"{negatives + 1} NaN/Inf values, each in the same place in both" in result.stderr


def test_nan_and_inf_are_compared_by_place_and_kind():
    a = np.array([np.nan, np.inf, -np.inf, 1.0, 2.0], np.float32)
    assert not compare_blob("x", a, a.copy())["differs"]
    assert compare_blob("x", a, a.copy())["nonfinite"] == 3
    for k, other in ((0, 0.0), (1, -np.inf), (2, np.nan), (3, np.inf)):
        b = a.copy()
        b[k] = other
        row = compare_blob("x", a, b)
        assert row["differs"] and row["astray"] == 1 and row["astray_at"] == [k], (k, row)
    # All of a blob NaN before, finite after: every place astray, and no NaN scale.
    row = compare_blob("x", np.full((2, 2), np.nan, np.float32), np.zeros((2, 2), np.float32))
    assert row["differs"] and row["astray"] == 4 and row["scale"] == 0.0 and row["max_abs"] == 0.0


def test_a_nan_where_the_net_before_has_a_value_fails_the_check(tmp_path):
    good = np.array([[1.0, 0.0], [1.5, 0.0]])
    bad = np.array([[np.nan, 0.0], [1.5, 0.0]])
    _, before = write_net_files(tmp_path, net([_ip("ip", "data", good, [0.0, 0.0])], {"data": (1, 2)}), "t")
    _, values = write_net_files(tmp_path, net([_ip("ip", "data", bad, [0.0, 0.0])], {"data": (1, 2)}), "s")
    result = invoke("transplant", values, before, "-o", tmp_path / "o.caffemodel", "--check")
    assert result.exit_code == 1, result.stderr
    _no_numpy_warning(result.stderr)
    assert "ip: max |difference| 0 at" in result.stderr
    assert "1 NaN/Inf value not matched by the same in the other net, first at [0,0]" in result.stderr


# -- 3. Both nets get the pristine input -----------------------------------------------------------

def test_a_first_layer_in_place_on_the_input_passes_fold_and_transplant_checks(tmp_path):
    """Power data -> data (a mean/scale layer) before an InnerProduct: the net unchanged must pass."""
    layers = [layer("scale", "Power", "data", "data", power_param={"scale": 2.0, "shift": 1.0}),
              _ip("ip", "data", [[1.0, 2.0, -1.0]], [0.5])]
    _, model = write_net_files(tmp_path, net(layers, {"data": (1, 3)}))
    folded = ok("fold", model, "-o", tmp_path / "folded.caffemodel", "--check", "--json")
    record = json.loads(folded.stdout)["check"]
    assert record["passed"] is True
    # The input as the Power layer left it is compared too: it is a blob the net computes.
    assert [row["name"] for row in record["blobs"]] == ["data", "ip"]
    assert all(row["max_abs"] == 0.0 for row in record["blobs"])
    back = ok("transplant", model, model, "-o", tmp_path / "back.caffemodel", "--check")
    assert "2 blobs compared" in back.stderr


# -- 4. No output before the proof ----------------------------------------------------------------

def _unrunnable(tmp_path):
    """{why: net} of nets no check can run: a Python layer; an Embed, whose random input is never an index."""
    python = net([layer("py", "Python", "data", python_param={"module": "m", "layer": "L"})], {"data": (1, 2)})
    embed = net([layer("em", "Embed", "data", blobs=[np.ones((3, 2))],
                       embed_param={"num_output": 2, "input_dim": 3, "bias_term": False})], {"data": (1, 2)})
    return {"Python": write_net_files(tmp_path, python, "python")[1],
            "Embed": write_net_files(tmp_path, embed, "embed")[1]}


@pytest.mark.parametrize("kind", ["Python", "Embed"])
@pytest.mark.parametrize("command", ["fold", "transplant", "export"])
def test_a_check_that_cannot_run_leaves_no_output(tmp_path, command, kind):
    model = _unrunnable(tmp_path)[kind]
    out = tmp_path / ("out.onnx" if command == "export" else "out.caffemodel")
    if command == "export":
        pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (blobtool[onnx])")
    before = _files(tmp_path)
    args = {"fold": ("fold", model), "transplant": ("transplant", model, model), "export": ("export", model)}[command]
    result = invoke(*args, "-o", out, "--check")
    if command == "export" and kind == "Python":
        # export refuses the layer before writing anything: no check was started.
        line = assert_error(result, 3, str(model), "layer 'py'", warnings=True)
    else:
        line = assert_error(result, 3, str(model), f"the check cannot run, so {out} is not written", warnings=True)
    assert kind in line
    assert _files(tmp_path) == before


@pytest.mark.parametrize("command", ["fold", "transplant"])
def test_a_check_that_fails_leaves_no_output_and_an_earlier_file_as_it_was(tmp_path, monkeypatch, command):
    layers = [_ip("ip", "data", [[1.0, 2.0]], [0.5])]
    _, model = write_net_files(tmp_path, net(layers, {"data": (1, 2)}))
    out = tmp_path / "out.caffemodel"
    out.write_bytes(b"earlier")
    before = _files(tmp_path)
    monkeypatch.setattr(checking, "CHECK_TOLERANCE", -1.0)  # every blob differs
    args = ("fold", model) if command == "fold" else ("transplant", model, model)
    result = invoke(*args, "-o", out, "-o", tmp_path / "out.prototxt", "--check") if command == "fold" else \
        invoke(*args, "-o", out, "--check")
    assert result.exit_code == 1, result.stderr
    assert "check FAILED" in result.stderr and f"not written: {out}" in result.stderr
    assert _files(tmp_path) == before and out.read_bytes() == b"earlier"
    monkeypatch.undo()
    result = invoke(*args, "-o", out, "--check")
    assert result.exit_code == 0, result.stderr
    assert out.read_bytes() == model.read_bytes()  # no BatchNorm, no values changed: the same net
    assert _files(tmp_path) == before


def test_a_passing_check_writes_through_a_link_and_to_stdout(tmp_path):
    layers = [_ip("ip", "data", [[1.0, 2.0]], [0.5])]
    _, model = write_net_files(tmp_path, net(layers, {"data": (1, 2)}))
    target = tmp_path / "target.caffemodel"
    target.write_bytes(b"old")
    link = tmp_path / "link.caffemodel"
    link.symlink_to(target.name)
    ok("fold", model, "-o", link, "--check")
    assert link.is_symlink() and target.read_bytes() == model.read_bytes()
    result = ok("fold", model, "-o", "-", "--check")
    assert result.stdout_bytes == model.read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["link.caffemodel", "net.caffemodel", "net.prototxt", "target.caffemodel"]


# -- 14. onnxruntime's refusal is a failed check, in blobtool's words ----------------------------

_REFUSED_BY_ONNXRUNTIME = """
import sys
import numpy as np
from blobtool.cli import main
from blobtool.onnxport import ops  # the exporters register
from blobtool.onnxport.emit import EXPORTERS

def out_of_bounds(e):
    # Valid for onnx's checker (it does not read the indices); onnxruntime refuses to run it.
    e.node("Gather", [e.inputs[0], e.constant("indices", np.array([5, 0]))], e.outputs, axis=1)

EXPORTERS["ReLU"] = out_of_bounds
main(sys.argv[1:])
"""


def test_a_model_onnxruntime_refuses_is_a_failed_check_in_one_line(tmp_path):
    pytest.importorskip("onnx", reason="onnx is not installed (blobtool[onnx])")
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (blobtool[onnx])")
    layers = [layer("relu1", "ReLU", "data"), _ip("ip", "relu1", [[1.0, 2.0]], [0.0])]
    _, model = write_net_files(tmp_path, net(layers, {"data": (1, 2)}))
    out = tmp_path / "refused.onnx"
    before = _files(tmp_path)
    # A real process: onnxruntime logs from C++ straight to file descriptor 2.
    done = subprocess.run([sys.executable, "-c", _REFUSED_BY_ONNXRUNTIME, "export", str(model), "-o", str(out),
                           "--check"], env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("blobtool: check FAILED: onnxruntime cannot run the model: ")
    assert "indices element out of data bounds" in lines[0] and lines[0].endswith(f"not written: {out}")
    assert "\x1b[" not in done.stderr
    assert _files(tmp_path) == before


def test_a_model_onnx_refuses_is_a_failed_check(tmp_path, monkeypatch):
    pytest.importorskip("onnx", reason="onnx is not installed (blobtool[onnx])")
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (blobtool[onnx])")
    from blobtool.onnxport import ops  # noqa: F401  the exporters register
    from blobtool.onnxport.emit import EXPORTERS

    def wrong_shape(e):
        e.node("Reshape", [e.inputs[0], e.constant("shape", np.array([1, 3]))], e.outputs)

    monkeypatch.setitem(EXPORTERS, "ReLU", wrong_shape)
    layers = [layer("relu1", "ReLU", "data"), _ip("ip", "relu1", [[1.0, 2.0]], [0.0])]
    _, model = write_net_files(tmp_path, net(layers, {"data": (1, 2)}))
    out = tmp_path / "refused.onnx"
    before = _files(tmp_path)
    result = invoke("export", model, "-o", out, "--check", "--json")
    assert result.exit_code == 1, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("blobtool: check FAILED: onnx's checker refuses the model: ")
    record = json.loads(result.stdout)
    assert record["check"]["passed"] is False and record["check"]["not_written"] == [str(out)]
    assert record["check"]["refused"].startswith("onnx's checker refuses the model")
    assert _files(tmp_path) == before
