"""Names from hostile files reach no terminal raw: report/escape.py, and every human output that prints names.

A layer named ``ESC ] 0 ; title BEL`` would retitle the terminal, ``ESC [ 2 J``
clear it, U+202E reverse the rest of the line. Each output path (info's
table off a terminal and through rich, the histogram lines, norm, compare's
verdict and rows, show's title, error lines, click's usage errors, warning
lines, check failures, the devices table) is run and searched for the raw
characters; JSON Lines keep the exact names, escaped by JSON itself.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from rich.console import Console

from blobtool.report.escape import escape
from blobtool.report.tables import render_devices
from builders import Layer, write_blob, write_net
from runner import invoke, run_blobtool

OSC_TITLE = "\x1b]0;owned\x07"
CLEAR = "\x1b[2J"
RLO = "\u202e"
HOSTILE = f"{OSC_TITLE}conv{RLO}1"
ESCAPED = "\\x1b]0;owned\\x07conv\\u202e1"
# What no human output may hold: C0 controls but the line break, DEL, C1 controls, bidi controls.
RAW = [chr(c) for c in range(0x20) if c != 0x0A] + ["\x7f", "\x9b"] + [chr(c) for c in range(0x202A, 0x202F)] + \
      [chr(c) for c in range(0x2066, 0x206A)] + ["\u200e", "\u200f", "\u061c", "\u2028", "\u2029"]


def assert_safe(text: str) -> None:
    found = sorted({repr(c) for c in text if c in RAW})
    assert not found, (found, text)


@pytest.fixture
def hostile_net(tmp_path):
    """A net whose layer name, type and file name carry escape sequences and a bidi override."""
    layers = [Layer(HOSTILE, f"Conv{CLEAR}", [np.arange(6, dtype=np.float32).reshape(2, 3)]),
              Layer(f"fc{RLO}", "InnerProduct", [np.array([1.0, np.nan, 2.0], np.float32)])]
    return write_net(tmp_path / f"net{CLEAR}.caffemodel", "new", layers)


# -- the function ---------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("conv1/0", "conv1/0"),
    ("свёртка 名前 é", "свёртка 名前 é"),             # letters of any script stay
    ("a b", "a b"),
    (OSC_TITLE, "\\x1b]0;owned\\x07"),
    (CLEAR, "\\x1b[2J"),
    ("tab\there\nline\rret", "tab\\there\\nline\\rret"),
    ("\x00\x7f\x85\x9b", "\\x00\\x7f\\x85\\x9b"),     # NUL, DEL, C1 NEL and CSI
    (f"abc{RLO}def", "abc\\u202edef"),
    ("\u2066x\u2069\u200f\u061c", "\\u2066x\\u2069\\u200f\\u061c"),
    ("\u2028\u2029\ufeff\u200b", "\\u2028\\u2029\\ufeff\\u200b"),
    ("\udcff", "\\udcff"),                            # a lone surrogate (a path that is not UTF-8)
    ("\U000e0001", "\\U000e0001"),                    # a tag character
    ("\u00a0nbsp", "\u00a0nbsp"),                     # not printable for Python, harmless: kept
])
def test_escape(text, expected):
    assert escape(text) == expected
    assert_safe(escape(text))


def test_escape_makes_any_character_safe():
    every = "".join(chr(c) for c in range(0x3000)) + "\ud800\U000e007f\U0010ffff"
    assert_safe(escape(every))
    assert escape(12) == "12"


# -- every human output -------------------------------------------------------------------

@pytest.mark.parametrize("args", [["info"], ["info", "--stats"], ["norm"]], ids=["info", "info-stats", "norm"])
def test_tables_escape_names_types_and_paths(hostile_net, args):
    # info without --stats is written as plain text, with --stats by rich: both paths
    result = invoke(*args, hostile_net)
    assert result.exit_code == 0, result.stderr
    assert_safe(result.stdout)
    assert ESCAPED in result.stdout
    assert "fc\\u202e" in result.stdout
    assert "net\\x1b[2J.caffemodel" in result.stdout
    if args == ["info"]:
        assert "Conv\\x1b[2J" in result.stdout
    if args == ["info", "--stats"]:
        histograms = result.stdout[result.stdout.index(" histograms"):]
        assert f"{ESCAPED}/0" in histograms


def test_the_real_command_in_a_pipe_escapes_names(hostile_net):
    result = run_blobtool("info", "--stats", hostile_net, text=True)
    assert result.returncode == 0 and result.stderr == ""
    assert_safe(result.stdout)
    assert ESCAPED in result.stdout


def test_compare_escapes_the_verdict_and_the_rows(hostile_net, tmp_path):
    other = write_net(tmp_path / f"other{RLO}.caffemodel", "new",
                      [Layer(HOSTILE, "Convolution", [np.zeros((2, 3), np.float32)])])
    result = invoke("compare", hostile_net, other)
    assert result.exit_code == 1
    assert_safe(result.stdout)
    assert "net\\x1b[2J.caffemodel vs " in result.stdout and "other\\u202e.caffemodel" in result.stdout
    assert f"{ESCAPED}/0" in result.stdout and "fc\\u202e/0" in result.stdout  # a value row, an "only in" row


def test_show_escapes_its_title(tmp_path):
    path = write_net(tmp_path / f"img{CLEAR}.caffemodel", "new",
                     [Layer(HOSTILE, "Convolution", [np.arange(12, dtype=np.float32).reshape(3, 4)])])
    for env in ({"NO_COLOR": "1"}, {"FORCE_COLOR": "1"}):
        result = invoke("show", path, env=env)
        assert result.exit_code == 0, result.stderr
        title = result.stdout.splitlines()[0]
        assert "img\\x1b[2J.caffemodel" in title and f"{ESCAPED}/0" in title
        if "NO_COLOR" in env:
            assert_safe(result.stdout)


def test_error_lines_escape_names(hostile_net):
    result = run_blobtool("show", hostile_net, text=True)
    assert result.returncode == 2
    assert_safe(result.stderr)
    assert result.stderr.count("\n") == 1
    assert f"({ESCAPED}/0, fc\\u202e/0)" in result.stderr
    assert "net\\x1b[2J.caffemodel: show draws one blob" in result.stderr


@pytest.mark.parametrize("args", [["--kind", f"blob{CLEAR}"], [f"--x{CLEAR}"]], ids=["value", "option"])
def test_usage_errors_from_click_escape_what_was_given(hostile_net, args):
    result = run_blobtool("info", *args, hostile_net, text=True)
    assert result.returncode == 2
    assert_safe(result.stderr)
    assert "\\x1b[2J" in result.stderr and result.stderr.count("\n") == 1


def test_blob_selection_errors_escape_the_pattern(hostile_net):
    result = run_blobtool("norm", "--blob", f"x{OSC_TITLE}", hostile_net, text=True)
    assert result.returncode != 0
    assert_safe(result.stderr)
    assert "x\\x1b]0;owned\\x07" in result.stderr


def test_check_failures_escape_names(hostile_net):
    result = run_blobtool("info", "--check", "finite", hostile_net, text=True)
    assert result.returncode == 1
    assert_safe(result.stderr)
    assert "check finite failed: blob fc\\u202e/0 data has 1 NaN" in result.stderr


def test_warning_lines_escape_names(tmp_path):
    # A grid past its bound of filters: the PNG is written, a warning names the blob.
    filters = np.arange(5000, dtype=np.float32).reshape(5000, 1, 1, 1)
    path = write_net(tmp_path / "many.caffemodel", "new", [Layer(HOSTILE, "Convolution", [filters])])
    result = run_blobtool("show", path, "-o", tmp_path / "grid.png", text=True)
    assert result.returncode == 0, result.stderr
    assert_safe(result.stderr)
    assert result.stderr.startswith(f"blobtool: warning: {path}: blob {ESCAPED}/0: showing the first 4,096 of 5,000")


def test_devices_table_escapes_the_device_name():
    out = io.StringIO()
    console = Console(file=out, width=120, color_system=None)
    render_devices(console, [{"index": 0, "name": f"GPU{OSC_TITLE}", "total_memory": 1 << 30,
                              "free_memory": 1 << 29, "compute_capability": "9.0"}])
    assert_safe(out.getvalue())
    assert "GPU\\x1b]0;owned\\x07" in out.getvalue()


def test_json_keeps_the_exact_names_escaped_by_json(hostile_net):
    result = invoke("info", "--json", hostile_net)
    assert result.exit_code == 0
    assert_safe(result.stdout)
    assert result.stdout.isascii()
    record = json.loads(result.stdout)
    assert [b["layer"] for b in record["blobs"]] == [HOSTILE, f"fc{RLO}"]
    assert record["blobs"][0]["type"] == f"Conv{CLEAR}"


def test_an_ordinary_name_prints_as_it_is(tmp_path):
    path = write_blob(tmp_path / "mean.binaryproto", np.ones((2, 2), np.float32))
    result = invoke("info", path)
    assert result.exit_code == 0
    assert str(path) in result.stdout and "\\" not in result.stdout
