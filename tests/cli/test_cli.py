"""The blobtool command: in-process with click's CliRunner, and as real processes in pipes.

The protobuf library is the oracle for what a written blob file holds, numpy
for the numbers. Exit codes and JSON schemas are the documented interface
(README.md, "Exit codes" and "JSON Lines").
"""

from __future__ import annotations

import errno
import importlib.util
import io
import json
import math
import os
import platform
import pty
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import blobtool
from blobtool import work
from blobtool.formats import caffe as caffe_format
from blobtool import records as report_records
from blobtool._pb.blobtool_caffe_pb2 import BlobProto
from blobtool.cli import cli
from builders import Layer, blob_bytes, npy_bytes, npy_header_bytes, write_blob, write_net, write_npy
from runner import (BLOBTOOL, TerminalRunner, invoke, json_lines, one_json, run_blobtool, run_pipeline,
                    subprocess_env)

REPO = Path(__file__).resolve().parents[2]


def _import_make_examples():
    spec = importlib.util.spec_from_file_location("make_examples", REPO / "examples" / "make_examples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_examples = _import_make_examples()

try:
    import cupy  # noqa: F401
    HAVE_CUPY = True
except Exception:
    HAVE_CUPY = False

COMMANDS = ("info", "norm", "scale", "compare", "convert", "update", "devices")

INFO_KEYS = {"path", "kind", "bytes", "blobs"}
INFO_BLOB_KEYS = {"name", "shape", "count", "dtype", "layout", "has_diff", "bytes"}
STATS_KEYS = {"min", "max", "mean", "std", "nan", "inf", "histogram"}
NORM_KEYS = {"path", "kind", "blobs", "total"}
COMPARE_KEYS = {"a", "b", "equal", "rtol", "atol", "blobs"}
COMPARE_BLOB_KEYS = {"name", "equal", "shape_a", "shape_b", "max_abs", "max_rel", "rel_l2",
                     "mismatches", "nonfinite", "first_mismatch", "diff"}
VALUE_DIFF_KEYS = {"equal", "max_abs", "max_rel", "mismatches", "rel_l2", "nonfinite"}

# Values with nothing special about them: distinct, signed, not exactly representable sums.
DATA_23 = np.array([[0.5, -1.25, 2.0], [3.1, -0.7, 4.4]], dtype=np.float32)
DIFF_23 = np.array([[0.1, 0.2, -0.3], [0.05, -1.5, 0.25]], dtype=np.float32)


# -- reading what was written; the error shape ----------------------------------

def parse(source) -> BlobProto:
    raw = source.read_bytes() if isinstance(source, Path) else source
    proto = BlobProto()
    proto.ParseFromString(raw)
    return proto


def proto_values(proto: BlobProto, which: str = "data") -> np.ndarray:
    double = getattr(proto, "double_" + which)
    if len(double):
        return np.array(double, dtype=np.float64)
    return np.array(getattr(proto, which), dtype=np.float32)


def folder_listing(folder: Path) -> set:
    return {p.name for p in folder.iterdir()}


def assert_one_line_error(result, code: int, *fragments) -> str:
    """The documented error shape: exit `code`, one line on stderr, no traceback."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr
    assert err.endswith("\n") and err.count("\n") == 1, repr(err)
    assert err.startswith("blobtool: "), repr(err)
    assert "Traceback" not in err
    for fragment in fragments:
        assert str(fragment) in err, (fragment, err)
    return err


# -- fixtures --------------------------------------------------------------------

@pytest.fixture
def f32(tmp_path) -> Path:
    """A float32 `shape` blob (2, 3) with a diff."""
    return write_blob(tmp_path / "f32.pb", DATA_23, diff=DIFF_23)


@pytest.fixture
def examples(tmp_path) -> dict:
    """The shipped examples, made afresh by examples/make_examples.py's functions."""
    rng = np.random.default_rng(7)
    out = {}
    for name, make in make_examples.EXAMPLES.items():
        out[name] = tmp_path / name
        out[name].write_bytes(make(rng).SerializeToString())
    return out


# -- version and help ------------------------------------------------------------

def test_version():
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"blobtool, version {blobtool.__version__}"


@pytest.mark.parametrize("name", COMMANDS)
def test_help_is_one_sentence_then_ends_with_an_example(name):
    command = cli.commands[name]
    lines = [line.strip() for line in command.help.strip().splitlines()]
    first = lines[0]
    assert first.endswith(".") and first[0].isupper()
    assert ". " not in first[:-1], f"first line is more than one sentence: {first!r}"
    assert len(lines) == 1 or lines[1] == "", "the first sentence fits one line"
    assert "Example:" in lines, "the help ends with an example"
    examples = [line for line in lines[lines.index("Example:") + 1:] if line]
    assert examples, "an example follows 'Example:'"
    for example in examples:
        assert f"blobtool {name}" in example, example

    for flag in ("--help", "-h"):
        result = invoke(name, flag)
        assert result.exit_code == 0, result.stderr
        assert result.stdout.startswith(f"Usage: blobtool {name} ")
        flat = " ".join(result.stdout.split())
        assert " ".join(first.split()) in flat
        assert "Example:" in result.stdout
        for example in examples:
            assert example in result.stdout


def test_top_level_help_lists_every_command_and_the_exit_codes():
    result = invoke("--help")
    assert result.exit_code == 0
    for name in COMMANDS:
        assert f"\n  {name} " in result.stdout
    flat = " ".join(result.stdout.split())
    assert "2 usage error" in flat and "5 output not writable" in flat


# -- info ------------------------------------------------------------------------

def test_info_human(f32, tmp_path):
    legacy = write_blob(tmp_path / "mean.binaryproto", DATA_23.T, layout="legacy", double=True)
    result = invoke("info", f32, legacy)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    out = result.stdout
    assert str(f32) in out and str(legacy) in out
    assert out.index(str(f32)) < out.index(str(legacy))
    for text in ("(2, 3)", "shape", "float32", "yes", "(1, 1, 3, 2)", "legacy", "float64", "no", "48 B"):
        assert text in out, text
    assert "\x1b[" not in out, "no colour when stdout is not a terminal"


@pytest.mark.parametrize("layout", ["shape", "legacy"])
@pytest.mark.parametrize("double", [False, True])
@pytest.mark.parametrize("with_diff", [False, True])
def test_info_json_schema(tmp_path, layout, double, with_diff):
    path = write_blob(tmp_path / "b.pb", DATA_23, diff=DIFF_23 if with_diff else None, layout=layout,
                      double=double)
    result = invoke("info", "--json", path)
    assert result.exit_code == 0, result.stderr
    record = one_json(result)
    assert set(record) == INFO_KEYS
    assert record["path"] == str(path)
    assert record["kind"] == "blob"
    assert record["bytes"] == path.stat().st_size
    (blob,) = record["blobs"]
    assert set(blob) == INFO_BLOB_KEYS
    size = 8 if double else 4
    assert blob == {
        "name": "0",
        "shape": [1, 1, 2, 3] if layout == "legacy" else [2, 3],
        "count": 6,
        "dtype": "float64" if double else "float32",
        "layout": layout,
        "has_diff": with_diff,
        "bytes": 6 * size,
    }


def test_info_stats_match_numpy(examples):
    path = examples["weights_diff.pb"]
    proto = parse(path)
    result = invoke("info", "--json", "--stats", path)
    assert result.exit_code == 0, result.stderr
    (blob,) = one_json(result)["blobs"]
    assert set(blob) == INFO_BLOB_KEYS | {"stats"}
    assert set(blob["stats"]) == {"data", "diff"}
    for which in ("data", "diff"):
        values = proto_values(proto, which).astype(np.float64)
        stats = blob["stats"][which]
        assert set(stats) == STATS_KEYS
        assert stats["min"] == values.min()
        assert stats["max"] == values.max()
        assert stats["mean"] == pytest.approx(values.mean(), rel=1e-12, abs=1e-15)
        assert stats["std"] == pytest.approx(values.std(), rel=1e-12)
        assert stats["nan"] == 0 and stats["inf"] == 0

    no_diff = invoke("info", "--json", "--stats", examples["double.pb"])
    (blob,) = one_json(no_diff)["blobs"]
    assert blob["stats"]["diff"] is None
    values = proto_values(parse(examples["double.pb"]))
    assert blob["stats"]["data"]["mean"] == pytest.approx(values.mean(), rel=1e-12)


def test_info_stats_count_nan_and_inf_and_describe_the_finite_values(tmp_path):
    data = np.array([1.0, np.nan, -2.0, np.inf, 4.0, np.nan, -np.inf, 0.5], dtype=np.float32)
    diff = np.array([np.inf, 1, 2, 3, 4, 5, 6, 7], dtype=np.float32)
    path = write_blob(tmp_path / "nan.pb", data, diff=diff)
    result = invoke("info", "--json", "--stats", path)
    assert result.exit_code == 0, result.stderr
    stats = one_json(result)["blobs"][0]["stats"]
    finite = data[np.isfinite(data)].astype(np.float64)
    assert stats["data"]["nan"] == 2 and stats["data"]["inf"] == 2
    assert stats["data"]["min"] == -2.0 and stats["data"]["max"] == 4.0
    assert stats["data"]["mean"] == pytest.approx(finite.mean(), rel=1e-12)
    assert stats["data"]["std"] == pytest.approx(finite.std(), rel=1e-12)
    assert stats["diff"]["nan"] == 0 and stats["diff"]["inf"] == 1
    assert stats["diff"]["min"] == 1.0

    human = invoke("info", "--stats", path)
    assert human.exit_code == 0
    assert "nan" in human.stdout and "inf" in human.stdout and "0 diff" in human.stdout


def test_info_many_files_one_json_line_each_in_order(examples, f32):
    paths = [examples["double.pb"], f32, examples["mean_legacy.binaryproto"], f32]
    result = invoke("info", "--json", *paths)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.endswith("\n") and result.stdout.count("\n") == len(paths)
    records = json_lines(result)
    assert [r["path"] for r in records] == [str(p) for p in paths]
    assert [r["blobs"][0]["layout"] for r in records] == ["shape", "shape", "legacy", "shape"]


@pytest.mark.parametrize("args", [["-"], []], ids=["dash", "no-file"])
def test_info_reads_stdin(f32, args):
    from_file = one_json(invoke("info", "--json", f32))
    result = invoke("info", "--json", *args, input=f32.read_bytes())
    assert result.exit_code == 0, result.stderr
    from_stdin = one_json(result)
    assert from_stdin["path"] != str(f32)
    del from_stdin["path"], from_file["path"]
    assert from_stdin == from_file


def test_no_file_and_a_terminal_on_stdin_is_a_usage_error():
    result = invoke("info", runner=TerminalRunner(stdin_tty=True), columns=None)
    assert result.exit_code == 2
    assert "standard input is a terminal" in result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr


def test_stdin_can_be_read_only_once(f32):
    result = invoke("info", "-", "-", input=f32.read_bytes())
    assert result.exit_code == 2
    assert "read only once" in result.stderr
    result = invoke("compare", "-", "-", input=f32.read_bytes())
    assert result.exit_code == 2
    assert "read only once" in result.stderr


# -- norm ------------------------------------------------------------------------

def expected_norm(values) -> dict:
    values = np.asarray(values, dtype=np.float64).ravel()
    sumsq = float(np.dot(values, values))
    return {"asum": float(np.abs(values).sum()), "sumsq": sumsq, "l2": math.sqrt(sumsq)}


def assert_norm_close(got: dict, want: dict) -> None:
    assert set(got) == {"asum", "sumsq", "l2"}
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-12), key


def test_norm_json_matches_numpy_for_data_and_diff(f32):
    result = invoke("norm", "--json", f32)
    assert result.exit_code == 0, result.stderr
    record = one_json(result)
    assert set(record) == NORM_KEYS
    assert record["path"] == str(f32) and record["kind"] == "blob"
    (blob,) = record["blobs"]
    assert set(blob) == {"name", "data", "diff"}
    assert blob["name"] == "0"
    assert_norm_close(blob["data"], expected_norm(DATA_23))
    assert_norm_close(blob["diff"], expected_norm(DIFF_23))
    assert_norm_close(record["total"]["data"], expected_norm(DATA_23))
    assert_norm_close(record["total"]["diff"], expected_norm(DIFF_23))


def test_norm_diff_is_null_without_diff_and_doubles_keep_precision(examples):
    path = examples["double.pb"]
    values = proto_values(parse(path))
    record = one_json(invoke("norm", "--json", path))
    (blob,) = record["blobs"]
    assert blob["diff"] is None
    assert record["total"]["diff"] is None
    assert_norm_close(blob["data"], expected_norm(values))
    assert_norm_close(record["total"]["data"], expected_norm(values))


def test_norm_legacy_double_with_diff(tmp_path):
    data = np.linspace(-3, 3, 24).reshape(2, 3, 4)
    diff = np.cos(np.arange(24.0)).reshape(2, 3, 4)
    path = write_blob(tmp_path / "leg.pb", data, diff=diff, layout="legacy", double=True)
    (blob,) = one_json(invoke("norm", "--json", path))["blobs"]
    assert_norm_close(blob["data"], expected_norm(data))
    assert_norm_close(blob["diff"], expected_norm(diff))


def test_norm_human_and_several_files(f32, examples):
    result = invoke("norm", f32, examples["double.pb"])
    assert result.exit_code == 0, result.stderr
    want = expected_norm(DATA_23)
    assert f"{want['asum']:.6g}" in result.stdout
    assert f"{want['l2']:.6g}" in result.stdout
    assert str(f32) in result.stdout and str(examples["double.pb"]) in result.stdout
    records = json_lines(invoke("norm", "--json", f32, examples["double.pb"]))
    assert [r["path"] for r in records] == [str(f32), str(examples["double.pb"])]


# -- scale -----------------------------------------------------------------------

def test_scale_data_only_keeps_diff_and_dtype(f32, tmp_path):
    out = tmp_path / "scaled.pb"
    result = invoke("scale", f32, "0.3", "-o", out)
    assert result.exit_code == 0, result.stderr
    proto = parse(out)
    assert len(proto.double_data) == 0 and len(proto.double_diff) == 0
    np.testing.assert_array_equal(proto_values(proto).reshape(2, 3), DATA_23 * np.float32(0.3))
    np.testing.assert_array_equal(proto_values(proto, "diff").reshape(2, 3), DIFF_23)
    assert list(proto.shape.dim) == [2, 3]


def test_scale_with_diff_factor(f32, tmp_path):
    out = tmp_path / "scaled.pb"
    result = invoke("scale", f32, "-2", "--diff-factor", "0.5", "-o", out)
    assert result.exit_code == 0, result.stderr
    proto = parse(out)
    np.testing.assert_array_equal(proto_values(proto).reshape(2, 3), DATA_23 * np.float32(-2))
    np.testing.assert_array_equal(proto_values(proto, "diff").reshape(2, 3), DIFF_23 * np.float32(0.5))


@pytest.mark.parametrize("factor", ["-1", "-0.25", "-1e-3"])
def test_scale_by_a_negative_factor(f32, tmp_path, factor):
    out = tmp_path / "neg.pb"
    result = invoke("scale", f32, factor, "-o", out, "--diff-factor", "-2")
    assert result.exit_code == 0, result.stderr
    proto = parse(out)
    np.testing.assert_array_equal(proto_values(proto).reshape(2, 3), DATA_23 * np.float32(float(factor)))
    np.testing.assert_array_equal(proto_values(proto, "diff").reshape(2, 3), DIFF_23 * np.float32(-2))


@pytest.mark.parametrize("args", [
    ["{f}", "2", "--diff-factr", "3"],
    ["{f}", "2", "-x"],
    ["{f}", "half"],
    ["{f}"],
])
def test_scale_usage_errors(f32, tmp_path, args):
    result = invoke("scale", *[a.format(f=f32) for a in args], "-o", tmp_path / "out.pb")
    assert result.exit_code == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out.pb").exists()


def test_scale_double_legacy_stays_double_legacy(tmp_path):
    data = np.array([[1.0 / 3, 2.0 / 7], [1e-300, -5.5]])
    src = write_blob(tmp_path / "d.pb", data, layout="legacy", double=True)
    out = tmp_path / "d2.pb"
    result = invoke("scale", src, "0.1", "-o", out)
    assert result.exit_code == 0, result.stderr
    proto = parse(out)
    assert len(proto.data) == 0
    assert (proto.num, proto.channels, proto.height, proto.width) == (1, 1, 2, 2)
    assert not proto.HasField("shape")
    np.testing.assert_array_equal(np.array(proto.double_data), (data * 0.1).ravel())


# -- update ----------------------------------------------------------------------

def test_update_subtracts_diff(f32, tmp_path):
    out = tmp_path / "stepped.pb"
    result = invoke("update", f32, "-o", out)
    assert result.exit_code == 0, result.stderr
    proto = parse(out)
    np.testing.assert_array_equal(proto_values(proto).reshape(2, 3), DATA_23 - DIFF_23)
    np.testing.assert_array_equal(proto_values(proto, "diff").reshape(2, 3), DIFF_23)


def test_update_without_diff_is_exit_3_and_writes_nothing(examples, tmp_path):
    out = tmp_path / "stepped.pb"
    before = folder_listing(tmp_path)
    result = invoke("update", examples["double.pb"], "-o", out)
    assert_one_line_error(result, 3, "no diff", examples["double.pb"])
    assert not out.exists()
    assert folder_listing(tmp_path) == before


# -- convert ---------------------------------------------------------------------

def convert(src: Path, out: Path, *flags) -> BlobProto:
    result = invoke("convert", *flags, src, "-o", out)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    return parse(out)


def test_convert_default_keeps_dtype_layout_and_diff(tmp_path):
    src = write_blob(tmp_path / "in.pb", DATA_23.T, diff=DIFF_23.T, layout="legacy")
    proto = convert(src, tmp_path / "out.pb")
    assert (proto.num, proto.channels, proto.height, proto.width) == (1, 1, 3, 2)
    assert not proto.HasField("shape")
    np.testing.assert_array_equal(proto_values(proto), DATA_23.T.ravel())
    np.testing.assert_array_equal(proto_values(proto, "diff"), DIFF_23.T.ravel())
    assert len(proto.double_data) == 0 and len(proto.double_diff) == 0


def test_convert_double_and_float(f32, tmp_path):
    proto = convert(f32, tmp_path / "d.pb", "--double")
    assert len(proto.data) == 0 and len(proto.diff) == 0
    np.testing.assert_array_equal(np.array(proto.double_data), DATA_23.astype(np.float64).ravel())
    np.testing.assert_array_equal(np.array(proto.double_diff), DIFF_23.astype(np.float64).ravel())
    assert list(proto.shape.dim) == [2, 3]

    back = convert(tmp_path / "d.pb", tmp_path / "f.pb", "--float")
    assert len(back.double_data) == 0 and len(back.double_diff) == 0
    np.testing.assert_array_equal(np.array(back.data, np.float32), DATA_23.ravel())
    np.testing.assert_array_equal(np.array(back.diff, np.float32), DIFF_23.ravel())


def test_convert_float_rounds_doubles(tmp_path):
    data = np.array([1.0 / 3, 1e-40, 123456789.123])
    src = write_blob(tmp_path / "d.pb", data, double=True)
    proto = convert(src, tmp_path / "f.pb", "--float")
    assert len(proto.double_data) == 0
    np.testing.assert_array_equal(np.array(proto.data, np.float32), data.astype(np.float32))


def test_convert_legacy_and_shape(tmp_path):
    src = write_blob(tmp_path / "s.pb", DATA_23.T)
    legacy = convert(src, tmp_path / "l.pb", "--legacy")
    assert (legacy.num, legacy.channels, legacy.height, legacy.width) == (1, 1, 3, 2)
    assert not legacy.HasField("shape")
    np.testing.assert_array_equal(proto_values(legacy), DATA_23.T.ravel())

    shaped = convert(tmp_path / "l.pb", tmp_path / "s2.pb", "--shape")
    assert list(shaped.shape.dim) == [1, 1, 3, 2]
    for field in ("num", "channels", "height", "width"):
        assert not shaped.HasField(field), field
    np.testing.assert_array_equal(proto_values(shaped), DATA_23.T.ravel())


def test_convert_no_diff(f32, tmp_path):
    proto = convert(f32, tmp_path / "nd.pb", "--no-diff", "--double")
    assert len(proto.diff) == 0 and len(proto.double_diff) == 0
    np.testing.assert_array_equal(np.array(proto.double_data), DATA_23.astype(np.float64).ravel())


def test_convert_legacy_on_five_axes_is_a_usage_error_and_writes_nothing(tmp_path):
    src = write_blob(tmp_path / "five.pb", np.arange(32, dtype=np.float32).reshape(2, 2, 2, 2, 2))
    out = tmp_path / "out.pb"
    before = folder_listing(tmp_path)
    result = invoke("convert", "--legacy", src, "-o", out)
    assert_one_line_error(result, 2, "4 axes")
    assert not out.exists()
    assert folder_listing(tmp_path) == before


def test_convert_legacy_of_a_dimension_past_int32_is_a_usage_error_and_writes_nothing(tmp_path):
    src = write_blob(tmp_path / "big.pb", [], shape=[0, 2**31])
    out = tmp_path / "out.pb"
    before = folder_listing(tmp_path)
    result = invoke("convert", "--legacy", src, "-o", out)
    assert_one_line_error(result, 2, "legacy layout holds dimensions up to 2147483647", "is 2147483648")
    assert folder_listing(tmp_path) == before
    # the largest int32 is written, and read back as Caffe would
    ok = write_blob(tmp_path / "ok.pb", [], shape=[0, 2**31 - 1])
    assert invoke("convert", "--legacy", ok, "-o", out).exit_code == 0
    proto = BlobProto.FromString(out.read_bytes())
    assert (proto.num, proto.channels, proto.height, proto.width) == (1, 1, 0, 2**31 - 1)


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "", "16M"])
def test_a_bad_parallel_threshold_in_the_environment_is_a_usage_error_naming_it(f32, value):
    env = subprocess_env(BLOBTOOL_PARALLEL_MIN_BYTES=value)
    result = run_blobtool("info", f32, f32, env=env, text=True)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (f"blobtool: environment variable BLOBTOOL_PARALLEL_MIN_BYTES={value!r} is not a byte "
                             "count: expected a whole number >= 0\n")
    good = run_blobtool("info", f32, f32, env=subprocess_env(BLOBTOOL_PARALLEL_MIN_BYTES="0"), text=True)
    assert good.returncode == 0 and good.stderr == ""


def _edge_value_inputs(folder: Path) -> None:
    """Inputs that made numpy warn: signalling NaNs (float32 data and diff, float64 .npy), doubles near 1.8e308."""
    f32 = np.arange(1.0, 5.0, dtype=np.float32).reshape(2, 2)
    raw = blob_bytes(f32, f32 / 4 + 10)
    for value in (np.float32(2.0), np.float32(10.5)):  # one in data, one in diff
        assert raw.count(value.tobytes()) == 1
        raw = raw.replace(value.tobytes(), np.uint32(0x7FA00000).tobytes())
    (folder / "snan.pb").write_bytes(raw)
    f64 = np.arange(1.0, 5.0).reshape(2, 2)
    f64.view(np.uint64)[1, 0] = 0x7FF4000000000000
    write_npy(folder / "snan.npy", f64)
    near = np.array([[1.7e308, -1.7e308], [1.79e308, 1e308]])
    write_blob(folder / "near_max.pb", near, -near, double=True)


EDGE_VALUE_COMMANDS = [
    ["info", "--stats", "{}"], ["info", "--stats", "--json", "{}"], ["norm", "{}"], ["compare", "{}", "{}"],
    ["compare", "--rtol", "0.1", "--atol", "1e-3", "{}", "{}"], ["show", "{}"], ["show", "{}", "-o", "out.png"],
    ["convert", "--float", "{}", "-o", "out.pb"], ["convert", "--double", "{}", "-o", "out.pb"],
    ["convert", "--half", "{}", "-o", "out.pb"], ["convert", "{}", "-o", "out.npz"],
    ["convert", "--float", "{}", "-o", "out.npy"], ["scale", "{}", "3", "--diff-factor", "-2", "-o", "out.pb"],
    ["update", "{}", "-o", "out.pb"],
]
# (input, command): an .npy has no diff, which update and --diff-factor need
EDGE_VALUE_CASES = [(name, args) for name in ("snan.pb", "snan.npy", "near_max.pb") for args in EDGE_VALUE_COMMANDS
                    if not (name.endswith(".npy") and ("--diff-factor" in args or args[0] == "update"))]


@pytest.mark.parametrize("name, args", EDGE_VALUE_CASES,
                         ids=[f"{n} {' '.join(a for a in args if a != '{}')}" for n, args in EDGE_VALUE_CASES])
def test_no_numpy_warning_reaches_stderr_in_any_command(tmp_path, name, args):
    _edge_value_inputs(tmp_path)
    result = run_blobtool(*[name if a == "{}" else a for a in args], cwd=tmp_path, text=True)
    assert result.returncode == 0, result.stderr
    # Values pushed past their dtype's range (float16 by --half, float32 by --float,
    # float64 by scale and update) get blobtool's own one line, never numpy's warnings.
    if name == "near_max.pb" and (args[0] in ("scale", "update") or "--half" in args or "--float" in args):
        (line,) = result.stderr.splitlines()
        assert line.startswith("blobtool: warning: near_max.pb: blob 0: ")
    else:
        assert result.stderr == ""


def test_convert_to_npy_keeps_shape_and_dtype(tmp_path):
    src = write_blob(tmp_path / "leg.pb", DATA_23, diff=DIFF_23, layout="legacy", double=True)
    out = tmp_path / "leg.npy"
    convert_result = invoke("convert", src, "-o", out)
    assert convert_result.exit_code == 0, convert_result.stderr
    array = np.load(out, allow_pickle=False)
    assert array.dtype == np.float64 and array.shape == (1, 1, 2, 3)
    np.testing.assert_array_equal(array.reshape(2, 3), DATA_23.astype(np.float64))


def test_convert_to_npz_holds_data_and_diff(f32, tmp_path):
    out = tmp_path / "w.npz"
    assert invoke("convert", f32, "-o", out).exit_code == 0
    with np.load(out, allow_pickle=False) as z:
        assert sorted(z.files) == ["0", "0/diff"]
        assert z["0"].dtype == np.float32
        np.testing.assert_array_equal(z["0"], DATA_23)
        np.testing.assert_array_equal(z["0/diff"], DIFF_23)

    out64 = tmp_path / "w64.npz"
    assert invoke("convert", "--double", "--no-diff", f32, "-o", out64).exit_code == 0
    with np.load(out64, allow_pickle=False) as z:
        assert z.files == ["0"]
        assert z["0"].dtype == np.float64


def test_convert_format_overrides_the_extension(f32, tmp_path):
    as_npy = tmp_path / "data.bin"
    result = invoke("convert", "--format", "npy", f32, "-o", as_npy)
    assert result.exit_code == 0, result.stderr
    np.testing.assert_array_equal(np.load(as_npy, allow_pickle=False), DATA_23)

    as_blob = tmp_path / "looks.npy"
    result = invoke("convert", "--format", "blob", f32, "-o", as_blob)
    assert result.exit_code == 0, result.stderr
    assert as_blob.read_bytes()[:6] != b"\x93NUMPY"
    np.testing.assert_array_equal(proto_values(parse(as_blob)), DATA_23.ravel())

    bad = invoke("convert", "--format", "hdf5", f32, "-o", tmp_path / "x")
    assert bad.exit_code == 2


def test_a_one_blob_extension_on_a_net_says_what_chose_it_and_how_to_keep_the_net(tmp_path):
    # A net without blobs, named .protobin (a blob-file extension, as Caffe's own examples name nets).
    empty = write_net(tmp_path / "net.protobin", "new", [Layer("relu", "ReLU", [])])
    two = write_net(tmp_path / "ip.caffemodel", "new", [Layer("ip", "InnerProduct", [np.ones((2, 2)), np.ones(2)])])
    result = invoke("convert", empty, "-o", tmp_path / "x.protobin")
    assert_one_line_error(result, 2, f"the extension .protobin of {tmp_path / 'x.protobin'} chose the one-blob "
                                     "format (a BlobProto file): 0 selected; --format same keeps the input's kind (net)")
    result = invoke("convert", two, "-o", tmp_path / "x.pb")
    assert_one_line_error(result, 2, "the extension .pb of", "2 selected; choose one with --blob, keep the input's "
                                     "kind (net) with --format same, or write .npz")
    result = invoke("convert", two, "--format", "blob", "-o", tmp_path / "x.npy")
    assert_one_line_error(result, 2, "--format blob writes one blob (a BlobProto file): 2 selected")
    assert not {"x.protobin", "x.pb", "x.npy"} & folder_listing(tmp_path)
    # What the message names works: --format same writes the net back as it was, under the name asked for.
    result = invoke("convert", empty, "--format", "same", "-o", tmp_path / "x.protobin")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "x.protobin").read_bytes() == empty.read_bytes()
    assert "--format [blob|protobuf|hdf5|npy|npz|safetensors|same]" in invoke("convert", "--help").stdout


def test_values_only_convert_reads_name_convert_whatever_the_command(tmp_path):
    # bfloat16 tensors (a PyTorch export's) and an int32 .npy: only convert takes a precision to read them as.
    from safetensors.numpy import save_file

    bf16 = tmp_path / "w.safetensors"
    values = np.array([1.0, 2.0, -0.5], np.float32)
    header = json.dumps({"w": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}}).encode()
    bf16.write_bytes(len(header).to_bytes(8, "little") + header + (values.view(np.uint32) >> 16).astype("<u2").tobytes())
    ints = write_npy(tmp_path / "i.npy", np.arange(4, dtype=np.int32))
    f32 = tmp_path / "w32.safetensors"
    save_file({"w": values}, f32)
    hint = "(blobtool convert --float or --double reads it, into a file every command reads)"
    for args in (["compare", f32, bf16], ["compare", bf16, f32], ["norm", bf16], ["info", "--stats", bf16],
                 ["scale", bf16, "2", "-o", tmp_path / "x.npz"], ["update", bf16, "-o", tmp_path / "x.npz"],
                 ["show", bf16], ["norm", ints], ["compare", ints, ints]):
        err = assert_one_line_error(invoke(*args), 3, "blobs are float32 or float64", hint)
        assert "convert it with" not in err
    # What it names works: convert, then compare.
    assert invoke("convert", "--float", bf16, "-o", tmp_path / "w.float32.safetensors").exit_code == 0
    assert invoke("compare", f32, tmp_path / "w.float32.safetensors").exit_code == 0
    # A blob stored as integers (NVIDIA Caffe's raw INT) that scale would make fractional: scale has no --float.
    from builders import raw_blob_bytes

    raw = tmp_path / "int.pb"
    raw.write_bytes(raw_blob_bytes(np.arange(4, dtype=np.int32)))
    err = assert_one_line_error(invoke("scale", raw, "0.5", "-o", tmp_path / "half.pb"), 2, "is not an int32",
                                "scale and update keep the stored type; blobtool convert --float or --double")
    assert "a precision (--float" not in err


@pytest.mark.parametrize("command", ["info", "norm"])
def test_a_folder_says_what_it_skipped_and_all_files_reads_it(tmp_path, command):
    # Old Caffe named its snapshots without an extension: a V1 net, valid, that a folder batch skips by name.
    folder = tmp_path / "snapshots"
    (folder / "old").mkdir(parents=True)
    layers = [Layer("ip", "InnerProduct", [np.ones((2, 2)), np.ones(2)])]
    write_net(folder / "old" / "cifar10_quick_iter_4000", "v1", layers)
    write_net(folder / "cifar10_quick_iter_5000.caffemodel", "new", layers)
    (folder / "solver.prototxt").write_text("net: 'x'\n")
    (folder / "README").write_text("snapshots\n")
    (folder / "z.log").write_text("log\n")
    os.mkfifo(folder / "pipe")  # never read from a folder, with or without --all-files
    result = run_blobtool(command, "--json", folder, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert [r["path"] for r in map(json.loads, result.stdout.splitlines())] == [
        str(folder / "cifar10_quick_iter_5000.caffemodel")]
    assert result.stderr == (f"blobtool: warning: {folder}: skipped 4 files without an extension blobtool reads "
                             "(README, old/cifar10_quick_iter_4000, solver.prototxt, ...); name them as arguments, "
                             "or give --all-files, to read them\n")
    # Named as an argument, the V1 net is read (its kind comes from its bytes).
    named = run_blobtool(command, "--json", folder / "old" / "cifar10_quick_iter_4000", text=True)
    assert (named.returncode, named.stderr) == (0, "")
    assert json.loads(named.stdout)["kind"] == "net"
    # --all-files reads every regular file: the net, and a bad-input line for each file that is no blob file.
    every = run_blobtool(command, "--json", "--all-files", folder, text=True, timeout=60)
    assert every.returncode == 3
    assert [r["path"] for r in map(json.loads, every.stdout.splitlines())] == [
        str(folder / name) for name in ("cifar10_quick_iter_5000.caffemodel", "old/cifar10_quick_iter_4000")]
    assert [line.split(": ")[1] for line in every.stderr.splitlines()] == [
        str(folder / name) for name in ("README", "solver.prototxt", "z.log")]
    # A folder of extensionless snapshots only: one line, saying how to read them.
    only = tmp_path / "only"
    only.mkdir()
    write_net(only / "snap_iter_10", "v1", layers)
    result = invoke(command, only)
    assert_one_line_error(result, 3, f"{only}: is a folder holding no file with an extension blobtool reads (",
                          "and 1 file without one (snap_iter_10): name it as an argument, or give --all-files, "
                          "to read it")
    assert invoke(command, "--all-files", only).exit_code == 0


@pytest.mark.parametrize("array", [
    np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
    np.arange(6, dtype=np.float64).reshape(3, 2) / 7,
    np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4)),
    np.arange(6, dtype=">f8").reshape(2, 3),
], ids=["float32", "float64", "fortran", "big-endian"])
def test_npy_input_becomes_a_blob(tmp_path, array):
    src = tmp_path / "a.npy"
    write_npy(src, array)
    proto = convert(src, tmp_path / "a.pb")
    assert list(proto.shape.dim) == list(array.shape)
    double = array.dtype.itemsize == 8
    assert (len(proto.double_data) > 0) == double and (len(proto.data) > 0) != double
    np.testing.assert_array_equal(proto_values(proto), np.ascontiguousarray(array).ravel())

    record = one_json(invoke("info", "--json", src))
    assert record["kind"] == "npy"
    assert record["blobs"][0]["shape"] == list(array.shape)


def test_float16_npy_and_npz_read_as_float32_so_half_outputs_read_back(tmp_path):
    array = np.array([[0.5, -2.0, 65504.0], [6e-8, 0.0, 1.0]], np.float16)
    src = tmp_path / "h.npy"
    write_npy(src, array)
    record = one_json(invoke("info", "--json", src))
    assert record["blobs"][0]["shape"] == [2, 3]
    proto = convert(src, tmp_path / "h.pb")  # exact: float16 widens to float32
    np.testing.assert_array_equal(np.array(proto.data, np.float32), array.astype(np.float32).ravel())
    out = tmp_path / "h.npz"
    result = invoke("convert", "--half", src, "-o", out)
    assert result.exit_code == 0, result.output
    compared = invoke("compare", src, out)
    assert compared.exit_code == 0, compared.output


@pytest.mark.parametrize("dtype", ["int32", "uint8"])
def test_npy_of_other_dtypes_needs_float_or_double(tmp_path, dtype):
    array = np.arange(6).reshape(2, 3).astype(dtype)
    src = tmp_path / "a.npy"
    write_npy(src, array)
    out = tmp_path / "a.pb"
    refused = invoke("convert", src, "-o", out)
    assert_one_line_error(refused, 3, src, dtype, "--float")
    assert not out.exists()

    proto = convert(src, out, "--float")
    assert len(proto.double_data) == 0
    np.testing.assert_array_equal(np.array(proto.data, np.float32), array.astype(np.float32).ravel())
    proto = convert(src, out, "--double")
    assert len(proto.data) == 0
    np.testing.assert_array_equal(np.array(proto.double_data), array.astype(np.float64).ravel())


class _Trap:
    """Unpickling this creates the file `marker`: proof that a pickle was loaded."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_object_npy_is_refused_without_unpickling(tmp_path):
    marker = tmp_path / "unpickled"
    src = tmp_path / "obj.npy"
    write_npy(src, np.array([_Trap(str(marker))], dtype=object), allow_pickle=True)
    np.load(src, allow_pickle=True)  # the trap works ...
    assert marker.exists()
    marker.unlink()

    for args in (["info", src], ["convert", "--double", src, "-o", tmp_path / "o.pb"], ["norm", src]):
        result = invoke(*args)
        assert_one_line_error(result, 3, src, "object")
    assert not marker.exists()  # ... and blobtool never sprang it
    assert not (tmp_path / "o.pb").exists()


# -- compare ---------------------------------------------------------------------

def test_compare_same_file_is_equal(f32):
    result = invoke("compare", f32, f32)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("equal")
    record = one_json(invoke("compare", "--json", f32, f32))
    assert record["equal"] is True
    (blob,) = record["blobs"]
    assert blob["mismatches"] == 0 and blob["first_mismatch"] is None
    assert blob["max_abs"] == 0 and blob["max_rel"] == 0
    assert blob["diff"] == {"equal": True, "max_abs": 0.0, "max_rel": 0.0, "mismatches": 0, "rel_l2": 0.0, "nonfinite": 0}


@pytest.fixture
def pair(tmp_path):
    """b is the reference; a differs from it at (0, 2) by 0.25 and at (1, 1) by 0.5."""
    b = np.array([[1.0, 2.0, 4.0], [8.0, -1.0, 3.0]])
    a = b.copy()
    a[0, 2] += 0.25   # abs 0.25, rel 0.0625
    a[1, 1] += 0.5    # abs 0.5,  rel 0.5
    return (write_blob(tmp_path / "a.pb", a), write_blob(tmp_path / "b.pb", b), a, b)


def test_compare_different_json(pair):
    pa, pb, a, b = pair
    result = invoke("compare", "--json", pa, pb)
    assert result.exit_code == 1
    assert result.stderr == ""
    record = one_json(result)
    assert set(record) == COMPARE_KEYS
    assert record["a"] == str(pa) and record["b"] == str(pb) and record["equal"] is False
    (blob,) = record["blobs"]
    assert set(blob) == COMPARE_BLOB_KEYS
    assert blob["name"] == "0" and blob["equal"] is False
    assert blob["shape_a"] == [2, 3] and blob["shape_b"] == [2, 3]
    assert blob["max_abs"] == 0.5
    assert blob["max_rel"] == 0.5
    assert blob["mismatches"] == 2
    assert blob["first_mismatch"] == [0, 2]
    assert blob["rel_l2"] == pytest.approx(np.linalg.norm(a - b) / np.linalg.norm(b), rel=1e-12)
    assert blob["diff"] is None


def test_compare_different_human_says_what_and_how_much(pair):
    pa, pb, _, _ = pair
    result = invoke("compare", pa, pb)
    assert result.exit_code == 1
    out = result.stdout
    assert out.startswith("DIFFERENT")
    assert "2 / 6" in out and "(0, 2)" in out and "0.5" in out

    quiet = invoke("compare", "--quiet", pa, pb)
    assert quiet.exit_code == 1
    assert quiet.stdout.startswith("DIFFERENT")
    assert len(quiet.stdout.strip().splitlines()) <= 2  # the verdict line (rich may wrap it)
    assert "2 / 6" not in quiet.stdout
    same = invoke("compare", "-q", pb, pb)
    assert same.exit_code == 0 and same.stdout.startswith("equal")


@pytest.mark.parametrize("tolerance, code", [
    (["--atol", "0.5"], 0),
    (["--atol", "0.49"], 1),
    (["--rtol", "0.5"], 0),       # |da| = 0.5 <= 0.5 * |b| = 0.5
    (["--rtol", "0.4"], 1),
    (["--atol", "0.3", "--rtol", "0.2"], 0),  # 0.5 <= 0.3 + 0.2 * 1
    (["--atol", "0.2", "--rtol", "0.2"], 1),
])
def test_compare_tolerances(pair, tolerance, code):
    pa, pb, _, _ = pair
    result = invoke("compare", "--json", *tolerance, pa, pb)
    assert result.exit_code == code, result.stdout
    record = one_json(result)
    assert record["equal"] is (code == 0)
    assert record["blobs"][0]["max_abs"] == 0.5  # tolerances change the verdict, not the measure


@pytest.mark.parametrize("option", ["--rtol", "--atol"])
@pytest.mark.parametrize("value", ["-1", "-1e-9", "nan", "-nan", "inf", "-inf", "1e400", "abc", ""])
def test_compare_tolerance_that_is_not_finite_and_non_negative_is_a_usage_error(pair, option, value):
    result = run_blobtool("compare", f"{option}={value}", pair[0], pair[1], text=True)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and option in result.stderr and "Traceback" not in result.stderr


def test_compare_arrays_refuses_a_nan_tolerance():
    from blobtool.engine.compare import compare_arrays
    from blobtool.errors import UsageError

    for tolerances in ({"rtol": math.nan}, {"atol": -1.0}, {"atol": math.inf}):
        with pytest.raises(UsageError, match="must be a finite number >= 0"):
            compare_arrays(np.zeros(3), np.zeros(3), **tolerances)


def test_compare_nan_equals_nan_at_the_same_place(tmp_path):
    x = np.array([1.0, np.nan, np.inf, -np.inf], dtype=np.float32)
    a = write_blob(tmp_path / "a.pb", x)
    b = write_blob(tmp_path / "b.pb", x.copy())
    assert invoke("compare", a, b).exit_code == 0
    y = x.copy()
    y[0] = np.nan
    c = write_blob(tmp_path / "c.pb", y)
    result = invoke("compare", "--json", a, c)
    assert result.exit_code == 1
    blob = one_json(result)["blobs"][0]
    assert blob["mismatches"] == 1 and blob["first_mismatch"] == [0]


def test_compare_infinity_matches_only_itself_whatever_the_tolerance(tmp_path):
    a = write_blob(tmp_path / "a.pb", np.array([np.inf, 1.0, np.nan], dtype=np.float32))
    b = write_blob(tmp_path / "b.pb", np.array([1e30, np.inf, 1.0], dtype=np.float32))
    for tolerance in ([], ["--rtol", "1"], ["--rtol", "1e30", "--atol", "1e30"]):
        result = invoke("compare", "--json", *tolerance, a, b)
        assert result.exit_code == 1, tolerance
        blob = one_json(result)["blobs"][0]
        assert blob["mismatches"] == 3 and blob["first_mismatch"] == [0]
        assert blob["max_abs"] == "inf"


def test_compare_float_file_equals_its_double_conversion(examples, tmp_path):
    src = examples["weights_diff.pb"]
    double = tmp_path / "w64.pb"
    assert invoke("convert", "--double", src, "-o", double).exit_code == 0
    assert len(parse(double).double_data) == 432
    result = invoke("compare", "--json", double, src)
    assert result.exit_code == 0, result.stdout
    assert one_json(result)["blobs"][0]["diff"]["equal"] is True


def test_compare_legacy_1x1x3x2_equals_shape_3x2(tmp_path):
    legacy = write_blob(tmp_path / "l.pb", DATA_23.T, layout="legacy")
    shaped = write_blob(tmp_path / "s.pb", DATA_23.T)
    for a, b in ((legacy, shaped), (shaped, legacy)):
        result = invoke("compare", "--json", a, b)
        assert result.exit_code == 0, result.stdout
        assert one_json(result)["equal"] is True


def test_compare_shape_mismatch_is_unequal(tmp_path):
    a = write_blob(tmp_path / "a.pb", DATA_23)
    b = write_blob(tmp_path / "b.pb", DATA_23.T.copy())
    result = invoke("compare", "--json", a, b)
    assert result.exit_code == 1
    blob = one_json(result)["blobs"][0]
    assert blob["equal"] is False
    assert blob["shape_a"] == [2, 3] and blob["shape_b"] == [3, 2]
    assert blob["max_abs"] is None and blob["mismatches"] is None
    human = invoke("compare", a, b)
    assert human.exit_code == 1
    assert "(2, 3)" in human.stdout and "(3, 2)" in human.stdout


def test_compare_diffs_when_both_have_one(tmp_path):
    a = write_blob(tmp_path / "a.pb", DATA_23, diff=DIFF_23)
    b = write_blob(tmp_path / "b.pb", DATA_23, diff=DIFF_23 * 2)
    result = invoke("compare", "--json", a, b)
    assert result.exit_code == 1
    blob = one_json(result)["blobs"][0]
    assert blob["mismatches"] == 0
    assert set(blob["diff"]) == VALUE_DIFF_KEYS
    assert blob["diff"]["equal"] is False and blob["diff"]["mismatches"] == 6
    assert blob["diff"]["max_abs"] == pytest.approx(1.5)


# -- writing ---------------------------------------------------------------------

def test_refuses_binary_output_to_a_terminal(f32, tmp_path):
    runner = TerminalRunner(stdout_tty=True)
    for args in (["scale", f32, "2"], ["convert", f32], ["update", f32]):
        result = invoke(*args, runner=runner, columns=None)
        assert result.exit_code == 2, (args, result.stderr)
        assert "refusing to write binary data to a terminal" in result.stderr
        assert result.stdout == ""
    assert folder_listing(tmp_path) == {"f32.pb"}


def test_refuses_binary_output_to_a_real_terminal(f32):
    leader, follower = pty.openpty()
    try:
        proc = run_blobtool("scale", f32, "2", stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.PIPE)
    finally:
        os.close(follower)
        os.close(leader)
    assert proc.returncode == 2
    assert b"refusing to write binary data to a terminal" in proc.stderr
    assert b"Traceback" not in proc.stderr


@pytest.mark.parametrize("output", [None, "-"], ids=["no-o-not-a-terminal", "dash"])
def test_output_to_stdout(f32, output):
    args = ["scale", f32, "2"] + ([] if output is None else ["-o", output])
    result = invoke(*args)
    assert result.exit_code == 0, result.stderr
    proto = parse(result.stdout_bytes)
    np.testing.assert_array_equal(proto_values(proto).reshape(2, 3), DATA_23 * 2)
    np.testing.assert_array_equal(proto_values(proto, "diff").reshape(2, 3), DIFF_23)


def test_npz_to_stdout(f32):
    result = invoke("convert", "--format", "npz", f32, "-o", "-")
    assert result.exit_code == 0, result.stderr
    with np.load(io.BytesIO(result.stdout_bytes), allow_pickle=False) as z:
        assert sorted(z.files) == ["0", "0/diff"]


def test_output_may_name_the_input(f32, tmp_path):
    expected = DATA_23.copy()
    for _ in range(2):  # the second run reads what the first wrote
        result = invoke("scale", f32, "3", "-o", f32)
        assert result.exit_code == 0, result.stderr
        expected = expected * np.float32(3)
        np.testing.assert_array_equal(proto_values(parse(f32)).reshape(2, 3), expected)
    result = invoke("update", f32, "-o", f32)
    assert result.exit_code == 0, result.stderr
    np.testing.assert_array_equal(proto_values(parse(f32)).reshape(2, 3), expected - DIFF_23)
    assert folder_listing(tmp_path) == {"f32.pb"}, "no temporary file left behind"


def test_successful_writes_leave_no_temporary_files(f32, tmp_path):
    outs = {"a.pb": [], "b.npy": [], "c.npz": [], "d.pb": ["--legacy", "--double"]}
    for name, flags in outs.items():
        result = invoke("convert", *flags, f32, "-o", tmp_path / name)
        assert result.exit_code == 0, result.stderr
    assert folder_listing(tmp_path) == {"f32.pb", *outs}


def test_input_is_never_changed(f32, tmp_path):
    before = f32.read_bytes()
    for args in (["scale", f32, "5", "--diff-factor", "2", "-o", tmp_path / "s.pb"],
                 ["update", f32, "-o", tmp_path / "u.pb"],
                 ["convert", "--double", "--legacy", "--no-diff", f32, "-o", tmp_path / "c.pb"]):
        assert invoke(*args).exit_code == 0
    assert f32.read_bytes() == before


@pytest.fixture
def earlier_output(tmp_path, f32):
    """An output file from an earlier, successful run."""
    out = tmp_path / "out.pb"
    assert invoke("scale", f32, "2", "-o", out).exit_code == 0
    return out


def test_failing_write_keeps_the_earlier_output(f32, tmp_path, earlier_output, monkeypatch):
    before = earlier_output.read_bytes()
    listing = folder_listing(tmp_path)

    def disk_full(out, *args, **kwargs):
        out.write(b"\x0a\x02partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(caffe_format.containers, "write_blob", disk_full)
    result = invoke("scale", f32, "3", "-o", earlier_output)
    assert_one_line_error(result, 5, earlier_output, os.strerror(errno.ENOSPC))
    assert earlier_output.read_bytes() == before
    assert folder_listing(tmp_path) == listing, "the temporary file was removed"


def test_interrupted_write_keeps_the_earlier_output(f32, tmp_path, earlier_output, monkeypatch):
    before = earlier_output.read_bytes()
    listing = folder_listing(tmp_path)

    def interrupted(out, *args, **kwargs):
        out.write(b"\x0a\x02partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(caffe_format.containers, "write_blob", interrupted)
    result = invoke("convert", f32, "-o", earlier_output)
    assert result.exit_code == 130
    assert result.stderr.strip() == "blobtool: interrupted"
    assert earlier_output.read_bytes() == before
    assert folder_listing(tmp_path) == listing


@pytest.mark.parametrize("args, code", [
    (["update", "{nodiff}", "-o", "{out}"], 3),
    (["convert", "--legacy", "{five}", "-o", "{out}"], 2),
    (["scale", "{missing}", "2", "-o", "{out}"], 3),
    (["norm", "--device", "0", "{nodiff}"], 4),
])
def test_failing_commands_keep_the_earlier_output(tmp_path, earlier_output, args, code):
    if code == 4 and HAVE_CUPY:
        pytest.skip("CuPy is importable here, so --device 0 may succeed")
    names = {
        "nodiff": write_blob(tmp_path / "nodiff.pb", DATA_23),
        "five": write_blob(tmp_path / "five.pb", np.zeros((1, 2, 1, 2, 1), np.float32)),
        "missing": tmp_path / "missing.pb",
        "out": earlier_output,
    }
    before = earlier_output.read_bytes()
    listing = folder_listing(tmp_path)
    result = invoke(*[a.format(**names) for a in args])
    assert_one_line_error(result, code)
    assert earlier_output.read_bytes() == before
    assert folder_listing(tmp_path) == listing


@pytest.mark.parametrize("where", ["missing-folder", "folder-is-a-file"])
def test_unwritable_output_is_exit_5(f32, tmp_path, where):
    if where == "missing-folder":
        target = tmp_path / "no" / "such" / "out.pb"
    else:
        (tmp_path / "plain").write_bytes(b"not a folder")
        target = tmp_path / "plain" / "out.pb"
    listing = folder_listing(tmp_path)
    for args in (["scale", f32, "2", "-o", target], ["convert", f32, "-o", target.with_suffix(".npz")]):
        result = invoke(*args)
        assert_one_line_error(result, 5, target.parent)
    assert folder_listing(tmp_path) == listing


def test_output_naming_a_directory_is_a_usage_error(f32, tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep").write_bytes(b"x")
    result = invoke("scale", f32, "2", "-o", tmp_path / "d", "--format", "blob")
    assert result.exit_code == 2, result.stderr
    assert "is a directory" in result.stderr
    assert "Traceback" not in result.stderr
    assert folder_listing(tmp_path / "d") == {"keep"}


# -- exit codes, errors, debug ---------------------------------------------------

def test_each_exit_code(tmp_path, f32):
    other = write_blob(tmp_path / "other.pb", DATA_23 + 1)
    cases = {
        0: ["norm", f32],
        1: ["compare", f32, other],
        2: ["norm", "--no-such-option", f32],
        3: ["norm", tmp_path / "missing.pb"],
        5: ["convert", f32, "-o", tmp_path / "missing-folder" / "x.pb"],
    }
    if not HAVE_CUPY:
        cases[4] = ["norm", "--device", "0", f32]
    for code, args in cases.items():
        result = invoke(*args)
        assert result.exit_code == code, (code, args, result.stderr)
        assert "Traceback" not in result.stderr


@pytest.mark.skipif(HAVE_CUPY, reason="CuPy is importable here; exit 4 needs it missing")
@pytest.mark.parametrize("args", [
    ["norm", "--device", "0", "{f}"],
    ["scale", "--device", "0", "{f}", "2", "-o", "{out}"],
    ["update", "--device", "0", "{f}", "-o", "{out}"],
    ["compare", "--device", "0", "{f}", "{f}"],
])
def test_device_without_cupy_is_exit_4_naming_the_extra(f32, tmp_path, args):
    out = tmp_path / "out.pb"
    result = invoke(*[a.format(f=f32, out=out) for a in args])
    assert_one_line_error(result, 4, "CuPy", "blobtool[cuda")
    assert result.stdout == ""
    assert not out.exists()


def test_convert_refuses_device_as_a_usage_error(f32, tmp_path):
    # convert computes nothing a GPU could run: refused before CuPy is looked for.
    out = tmp_path / "out.pb"
    result = invoke("convert", "--device", "0", f32, "-o", out)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("blobtool convert: --device: convert computes nothing")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stdout == ""
    assert not out.exists()


def test_device_must_be_a_non_negative_index(f32):
    result = invoke("norm", "--device", "-1", f32)
    assert result.exit_code == 2


def test_devices_without_cupy(monkeypatch):
    if HAVE_CUPY:
        pytest.skip("CuPy is importable here, so devices may list real GPUs")
    result = invoke("devices", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {"devices": []}
    assert result.stdout.count("\n") == 1
    human = invoke("devices")
    assert human.exit_code == 0
    assert "no CUDA device visible" in human.stdout


def test_debug_shows_the_traceback(tmp_path):
    missing = tmp_path / "missing.pb"
    plain = invoke("info", missing)
    assert_one_line_error(plain, 3, missing, "cannot open")
    for args, env in ((["--debug", "info", missing], None), (["info", missing], {"BLOBTOOL_DEBUG": "1"})):
        result = invoke(*args, env=env)
        assert result.exit_code == 3
        assert "Traceback (most recent call last)" in result.stderr
        assert result.stderr.splitlines()[-1] == plain.stderr.strip()
    quiet = invoke("info", missing, env={"BLOBTOOL_DEBUG": "0"})
    assert "Traceback" not in quiet.stderr


def test_internal_error_is_one_line_and_exit_70(f32, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(report_records, "norm_record", broken)
    result = invoke("norm", f32)
    assert_one_line_error(result, 70, "internal error", "RuntimeError", "boom", "--debug")
    debug = invoke("--debug", "norm", f32)
    assert debug.exit_code == 70 and "Traceback" in debug.stderr


def _truncated(path: Path) -> bytes:
    raw = blob_bytes(np.arange(100, dtype=np.float32))
    return raw[:len(raw) // 2]


def _npy_with_header(header: str) -> bytes:
    """A version 1.0 .npy file with this header text and 64 bytes of payload."""
    return npy_header_bytes(header, bytes(64))


BAD_INPUTS = [
    # (name, file contents or None for a missing file, text the error must contain)
    ("truncated", _truncated, "truncated"),
    ("random", lambda p: np.random.default_rng(1).bytes(200), "at byte"),
    ("overlong-tag", lambda p: b"\xff" * 64, "at byte 0"),
    ("empty", lambda p: b"", "empty"),
    ("missing", None, "cannot open"),
    ("npy-header-cut-short", lambda p: b"\x93NUMPY\x01\x00\x10\x00{'descr': garbage", "invalid .npy header"),
    ("truncated-npy", lambda p: npy_bytes(np.zeros(100, np.float32))[:-40], "truncated"),
    ("npy-negative-dim", lambda p: _npy_with_header(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (-5,), }"), "negative"),
    ("npy-negative-dims", lambda p: _npy_with_header(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (-1, -1), }"), "negative"),
    ("npy-count-wraps-int64", lambda p: _npy_with_header(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }"), "truncated"),
    ("npy-count-beyond-int64", lambda p: _npy_with_header(
        "{'descr': '<f8', 'fortran_order': False, 'shape': (100000000000000000000000,), }"), "truncated"),
    ("npy-header-not-a-dict", lambda p: _npy_with_header("[1, 2]"), "invalid .npy header"),
    ("npy-complex", lambda p: npy_bytes(np.zeros(3, np.complex64)), "complex64"),
]


@pytest.mark.parametrize("name, contents, text", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
@pytest.mark.parametrize("command", ["info", "norm", "convert"])
def test_bad_input_is_exit_3_naming_the_file(tmp_path, name, contents, text, command):
    path = tmp_path / f"{name}.pb"
    if contents is not None:
        path.write_bytes(contents(path))
    args = [command, path] + (["-o", tmp_path / "out.pb"] if command == "convert" else [])
    result = invoke(*args)
    err = assert_one_line_error(result, 3, path, text)
    assert err.startswith(f"blobtool: {path}: ")
    assert result.stdout == ""
    assert not (tmp_path / "out.pb").exists()


def test_bad_input_on_stdin_names_stdin():
    result = invoke("norm", "-", input=b"\xff" * 8)
    assert_one_line_error(result, 3, "stdin")


def test_later_bad_file_still_prints_the_earlier_records(f32, tmp_path):
    missing = tmp_path / "missing.pb"
    result = invoke("info", "--json", f32, missing)
    assert_one_line_error(result, 3, missing)
    assert [r["path"] for r in json_lines(result)] == [str(f32)]


# -- real processes in pipelines -------------------------------------------------

def test_cat_into_norm(examples, tmp_path):
    path = examples["weights_diff.pb"]
    proto = parse(path)
    proc = run_pipeline(f"cat {shlex.quote(str(path))} | {BLOBTOOL} norm --json", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""
    (blob,) = json.loads(proc.stdout)["blobs"]
    assert_norm_close(blob["data"], expected_norm(proto_values(proto)))
    assert_norm_close(blob["diff"], expected_norm(proto_values(proto, "diff")))


def test_scale_into_norm(examples, tmp_path):
    path = examples["mean_legacy.binaryproto"]
    values = proto_values(parse(path))
    proc = run_pipeline(f"{BLOBTOOL} scale {shlex.quote(str(path))} 0.5 -o - | {BLOBTOOL} norm -", tmp_path)
    assert proc.returncode == 0, proc.stderr
    want = expected_norm(values * np.float32(0.5))
    assert f"{want['asum']:.6g}".encode() in proc.stdout
    assert f"{want['l2']:.6g}".encode() in proc.stdout


def test_convert_double_into_compare(examples, tmp_path):
    path = shlex.quote(str(examples["weights_diff.pb"]))
    same = run_pipeline(f"{BLOBTOOL} convert --double {path} -o - | {BLOBTOOL} compare - {path}", tmp_path)
    assert same.returncode == 0, same.stderr
    assert same.stdout.startswith(b"equal")
    changed = run_pipeline(f"{BLOBTOOL} scale {path} 1.0001 -o - | {BLOBTOOL} compare --json - {path}",
                           tmp_path)
    assert changed.returncode == 1, changed.stderr
    record = json.loads(changed.stdout)
    assert record["equal"] is False and record["blobs"][0]["mismatches"] > 400


@pytest.mark.parametrize("flags", [["--json"], []], ids=["json", "table"])
def test_reader_going_away_is_quiet(examples, tmp_path, flags):
    # Far more output than a pipe holds, so blobtool is still writing when head has gone.
    assert examples["weights_diff.pb"].parent == tmp_path
    names = " ".join(["weights_diff.pb"] * 1500)
    proc = run_pipeline(f"{BLOBTOOL} info {' '.join(flags)} {names} | head -1", tmp_path)
    assert proc.stderr == b""
    assert proc.returncode == 0
    assert proc.stdout.count(b"\n") == 1
    assert proc.stdout.startswith(b"weights_diff.pb") or proc.stdout.startswith(b'{"path": "weights_diff.pb"')


def test_subprocess_errors_are_one_line_unless_debug(tmp_path):
    missing = tmp_path / "missing.pb"
    plain = run_blobtool("info", missing)
    assert plain.returncode == 3
    assert plain.stderr.decode() == f"blobtool: {missing}: cannot open: No such file or directory\n"
    assert plain.stdout == b""
    debug = run_blobtool("info", missing, env=subprocess_env(BLOBTOOL_DEBUG="1"))
    assert debug.returncode == 3
    assert b"Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.endswith(plain.stderr)


def test_subprocess_devices_json():
    if HAVE_CUPY:
        pytest.skip("CuPy is importable here, so devices may list real GPUs")
    proc = run_blobtool("devices", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"devices": []}


def test_jobs_runs_files_in_worker_processes_in_input_order(tmp_path):
    # Below BLOBTOOL_PARALLEL_MIN_BYTES files run one by one; set it to 0 so
    # that these small files go through the worker processes.
    import numpy as np
    from blobtool import Blob, save

    paths = []
    for i in range(5):
        blob = Blob(3, 4)
        blob.mutable_cpu_data()[:] = np.arange(12) * (i + 1)
        path = tmp_path / f"b{i}.pb"
        save(blob, path)
        paths.append(str(path))
    env = subprocess_env(BLOBTOOL_PARALLEL_MIN_BYTES="0")
    one = run_blobtool("norm", "--json", "--jobs", "1", *paths, text=True, env=env, timeout=None)
    many = run_blobtool("norm", "--json", "--jobs", "3", *paths, text=True, env=env, timeout=None)
    assert one.returncode == many.returncode == 0, many.stderr
    assert many.stdout == one.stdout
    assert [json.loads(line)["path"] for line in many.stdout.splitlines()] == paths
    asums = [json.loads(line)["blobs"][0]["data"]["asum"] for line in many.stdout.splitlines()]
    assert asums == [66.0 * (i + 1) for i in range(5)]
    # A bad file is its own line; the others are still reported; exit 3 at the end.
    bad = tmp_path / "bad.pb"
    bad.write_bytes(b"\x2a\x10\x00")
    res = run_blobtool("norm", "--json", "--jobs", "2", paths[0], bad, paths[1], text=True, env=env, timeout=None)
    assert res.returncode == 3
    assert [json.loads(line)["path"] for line in res.stdout.splitlines()] == [paths[0], paths[1]]
    assert "bad.pb" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    # --fail-fast: the first bad file stops the run with its own exit code and message.
    res = run_blobtool("norm", "--json", "--jobs", "2", "--fail-fast", paths[0], bad, paths[1], text=True, env=env,
                       timeout=None)
    assert res.returncode == 3
    assert len(res.stdout.splitlines()) == 1
    assert "bad.pb" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_human_output_prints_names_literally(tmp_path):
    # Layer names and paths come from users' files: brackets and colons are
    # text, not rich markup or emoji codes.
    name = "res2a[branch]:smile:[/]"
    path = write_net(tmp_path / "w[bold].caffemodel", "new", [Layer(name, "Convolution", [DATA_23], bottom=[], top=[])],
                     name="n")
    for command in ("info", "norm"):
        result = invoke(command, path)
        assert result.exit_code == 0, result.stderr
        assert name in result.stdout, result.stdout
        assert str(path) in result.stdout


def _env_without_blas_settings() -> dict:
    env = subprocess_env()
    for name in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        env.pop(name, None)
    return env


@pytest.mark.parametrize("preset", [None, "3"])
def test_the_command_runs_blas_single_threaded_unless_told_otherwise(preset):
    # blobtool's kernels split big reductions over the cores themselves; BLAS
    # threads on cache-sized dot products only cost time.
    code = ("import os, sys\n"
            "from blobtool.cli import process\n"
            "process.single_threaded_blas()\n"
            "import numpy\n"
            "print(os.environ['OPENBLAS_NUM_THREADS'], os.environ['MKL_NUM_THREADS'])\n")
    env = _env_without_blas_settings()
    if preset:
        env["OPENBLAS_NUM_THREADS"] = preset
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == [preset or "1", "1"]


def test_main_sets_the_blas_threads_before_numpy_loads(tmp_path):
    # The variables act only if they are set before numpy's BLAS starts; main()
    # sets them first, and a variable the user set is kept.
    path = write_blob(tmp_path / "b.pb", np.arange(4, dtype=np.float32))
    code = ("import os, sys\n"
            "import blobtool.cli as command\n"
            "real = command.single_threaded_blas\n"
            "def recording():\n"
            "    print('numpy loaded' if 'numpy' in sys.modules else 'numpy not loaded')\n"
            "    real()\n"
            "command.single_threaded_blas = recording\n"
            "try:\n"
            "    command.main(['info', sys.argv[1]])\n"
            "except SystemExit:\n"
            "    pass\n"
            "print(os.environ['OPENBLAS_NUM_THREADS'], os.environ['MKL_NUM_THREADS'])\n")
    env = _env_without_blas_settings()
    env["MKL_NUM_THREADS"] = "5"
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env,
                         check=True).stdout.splitlines()
    assert out[0] == "numpy not loaded"
    assert out[-1].split() == ["1", "5"]


def test_norm_gives_the_same_sums_with_one_job_or_all_cores(tmp_path, monkeypatch):
    from blobtool import kernels

    monkeypatch.setattr(kernels.threads, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)  # --jobs 4 is not capped
    # Groups of chunks enough for four threads (asum_sumsq splits at group boundaries).
    values = np.random.default_rng(5).standard_normal(4 * kernels.GROUP * kernels.CHUNK + 3).astype(np.float32)
    path = write_blob(tmp_path / "big.pb", values)
    split = []
    real = kernels.threads._in_threads
    monkeypatch.setattr(kernels.threads, "_in_threads", lambda fn, arg_lists: (split.append(len(arg_lists)),
                                                                       real(fn, arg_lists)))
    previous = work.current().threads
    one = one_json(invoke("norm", "--json", "--jobs", "1", path))
    assert split == []
    many = one_json(invoke("norm", "--json", "--jobs", "4", path))
    assert split == [4]
    assert work.current().threads == previous, "the command's threads end with it"
    assert one == many
    assert one["blobs"][0]["data"]["asum"] == pytest.approx(math.fsum(np.abs(values.astype(np.float64))), rel=1e-12)


@pytest.mark.parametrize("tolerances", [{}, {"rtol": 1e-3, "atol": 1e-6}])
def test_compare_arrays_is_the_same_for_any_thread_count(threaded, tolerances):
    from blobtool import kernels
    from blobtool.engine.compare import compare_arrays

    rng = np.random.default_rng(11)
    a = rng.standard_normal(7 * kernels.CHUNK + 5).astype(np.float32)
    b = a.astype(np.float64)
    b[3 * kernels.CHUNK + 2::50_000] += 1e-2   # first difference in the fourth chunk
    b[::33_333] *= 1 + 1e-4
    a[5::70_001] = np.nan
    b[5::70_001] = np.nan
    a[9] = b[9] = np.inf
    b[kernels.CHUNK * 6] = -np.inf
    threaded(1)
    serial = compare_arrays(a, b, **tolerances)
    assert not serial.equal
    assert serial.first_mismatch == (0 if not tolerances else 3 * kernels.CHUNK + 2)
    wide = a.astype(np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~((wide == b) | (np.isnan(wide) & np.isnan(b)) |
                (np.isfinite(wide - b) & (np.abs(wide - b) <= tolerances.get("atol", 0) +
                                          tolerances.get("rtol", 0) * np.abs(b))))
    assert serial.mismatches == int(np.count_nonzero(bad))
    for threads in (2, 3, 8):
        threaded(threads)
        assert compare_arrays(a, b, **tolerances) == serial, threads


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="mallopt settings are glibc's")
def test_the_command_keeps_freed_chunk_buffers_with_glibc():
    from blobtool.cli import process as cli_module

    assert cli_module.keep_freed_memory() is True


def test_compare_splits_large_blobs_over_the_cores_and_restores_the_setting(tmp_path, monkeypatch):
    from blobtool import kernels

    monkeypatch.setattr(kernels.threads, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    split = []
    real = kernels.threads._in_threads
    monkeypatch.setattr(kernels.threads, "_in_threads", lambda fn, arg_lists: (split.append(len(arg_lists)),
                                                                       real(fn, arg_lists)))
    values = np.random.default_rng(2).standard_normal(4 * kernels.CHUNK).astype(np.float32)
    a = write_blob(tmp_path / "a.pb", values)
    b = write_blob(tmp_path / "b.pb", values.astype(np.float64), double=True)
    previous = work.current().threads
    result = invoke("compare", a, b)
    assert result.exit_code == 0, result.stderr
    assert split and set(split) == {3}
    assert work.current().threads == previous


# -- --jobs: the cores the process may run on -------------------------------------------------

# Runs blobtool in a child pinned to the CPUs given first (as `taskset -c` does) and prints, after
# the command's own output, how many worker processes and threads its work was split over.
_PINNED = """
import os, sys, json, concurrent.futures
os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')})
from blobtool import kernels
seen = {"threads": [], "workers": []}
real_in_threads, real_pool = kernels.threads._in_threads, concurrent.futures.ProcessPoolExecutor
def in_threads(fn, arg_lists):
    seen["threads"].append(len(arg_lists))
    return real_in_threads(fn, arg_lists)
def pool(*args, **kw):
    seen["workers"].append(kw["max_workers"])
    return real_pool(*args, **kw)
kernels.threads._in_threads, concurrent.futures.ProcessPoolExecutor = in_threads, pool
from blobtool.cli import main
try:
    main(sys.argv[2:])
except SystemExit as exc:
    print(json.dumps(seen))
    raise
"""


needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                                    reason="needs CPU affinity (Linux) and at least 2 cores to pin to one")


def _pinned(cpus: str, *args, env=None):
    res = subprocess.run([sys.executable, "-c", _PINNED, cpus, *map(str, args)], capture_output=True, text=True,
                         env=env or subprocess_env(), timeout=120)
    *records, seen = res.stdout.splitlines()
    return res, records, json.loads(seen)


@pytest.mark.slow
@needs_affinity
@pytest.mark.parametrize("jobs", [[], ["--jobs", "16"]])
def test_jobs_default_and_cap_follow_the_cpu_affinity(tmp_path, jobs):
    from blobtool import kernels

    # One large blob (split over threads above PARALLEL_MIN_BYTES) and several files (worker processes).
    big = write_blob(tmp_path / "big.pb", np.ones((kernels.PARALLEL_MIN_BYTES // 4) * 2, dtype=np.float32))
    small = [write_blob(tmp_path / f"s{k}.pb", np.arange(10, dtype=np.float32) + k) for k in range(3)]
    env = subprocess_env(BLOBTOOL_PARALLEL_MIN_BYTES="0")
    one_core, records, seen = _pinned("0", "norm", "--json", *jobs, big)
    assert one_core.returncode == 0, one_core.stderr
    assert seen["threads"] == []  # one core: the sums stay in the calling thread
    assert json.loads(records[0])["blobs"][0]["data"]["asum"] == float(2 * kernels.PARALLEL_MIN_BYTES // 4)
    res, records, seen = _pinned("0", "norm", "--json", *jobs, *small, env=env)
    assert res.returncode == 0, res.stderr
    assert seen["workers"] == [] and len(records) == 3  # one core: no worker processes
    res, _, seen = _pinned("0,1", "norm", "--json", *jobs, big)
    assert res.returncode == 0, res.stderr
    assert seen["threads"] and set(seen["threads"]) == {2}
    res, records, seen = _pinned("0,1", "norm", "--json", *jobs, *small, env=env)
    assert res.returncode == 0, res.stderr
    assert seen["workers"] == [2] and len(records) == 3


@pytest.mark.slow
@needs_affinity
def test_compare_uses_the_cores_of_its_affinity(tmp_path):
    from blobtool import kernels

    values = np.ones((kernels.PARALLEL_MIN_BYTES // 4) * 2, dtype=np.float32)
    a, b = write_blob(tmp_path / "a.pb", values), write_blob(tmp_path / "b.pb", values)
    res, _, seen = _pinned("0", "compare", a, b)
    assert res.returncode == 0, res.stderr
    assert seen["threads"] == []


def test_jobs_to_use_caps_at_the_cores_and_falls_back_to_the_cpu_count(monkeypatch):
    from blobtool.cli.process import jobs_to_use

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 5}, raising=False)
    assert (jobs_to_use(None), jobs_to_use(1), jobs_to_use(2), jobs_to_use(16)) == (2, 1, 2, 2)

    def no_affinity(pid):
        raise AttributeError("no sched_getaffinity here")

    monkeypatch.setattr(os, "sched_getaffinity", no_affinity, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert (jobs_to_use(None), jobs_to_use(16)) == (3, 3)


def _leave_with_exit_3(path, show_progress=True):
    """A worker's work that ends its process as blobtool's SIGBUS handler does (its line said, exit 3)."""
    if path.endswith("b.pb"):
        os._exit(3)
    return path


def test_a_worker_that_leaves_with_exit_3_ends_the_command_with_exit_3(tmp_path, monkeypatch):
    from blobtool.cli.process import records

    monkeypatch.setenv("BLOBTOOL_PARALLEL_MIN_BYTES", "0")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    paths = [str(write_blob(tmp_path / f"{name}.pb", np.arange(4, dtype=np.float32))) for name in "abc"]
    with pytest.raises(SystemExit) as stopped:
        list(records(paths, _leave_with_exit_3, None, fail_fast=False))
    assert stopped.value.code == 3


_WORKER_BLAS = """
import os, sys
from blobtool.cli import process

_real_start = process._start_worker


def _start(*args):  # runs in each worker (this file is imported there too): was numpy loaded before the set-up?
    os.environ["NUMPY_BEFORE_SET_UP"] = str("numpy" in sys.modules)
    _real_start(*args)


process._start_worker = _start


def record(path, show_progress=True):
    return os.environ["NUMPY_BEFORE_SET_UP"], os.environ["OPENBLAS_NUM_THREADS"], os.environ["MKL_NUM_THREADS"]


if __name__ == "__main__":
    os.environ["OPENBLAS_NUM_THREADS"] = "3"  # the user's choice, for the command itself
    os.environ["BLOBTOOL_PARALLEL_MIN_BYTES"] = "0"
    print(list(process.records(sys.argv[1:3], record, 2)))
    print(os.environ["OPENBLAS_NUM_THREADS"], os.environ.get("MKL_NUM_THREADS"))
"""


def test_worker_processes_get_one_blas_thread_and_the_command_s_environment_is_left_alone(tmp_path):
    # Each worker sets its own environment before numpy loads in it; the parent's is never edited.
    a, b = tmp_path / "a.pb", tmp_path / "b.pb"
    for path in (a, b):
        path.write_bytes(b"")
    env = subprocess_env()
    env.pop("MKL_NUM_THREADS", None)
    script = tmp_path / "worker_blas.py"
    script.write_text(_WORKER_BLAS)
    out = subprocess.run([sys.executable, str(script), str(a), str(b)], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [str([("False", "1", "1")] * 2), "3 None"]
