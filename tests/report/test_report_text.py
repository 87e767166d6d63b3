"""The plain-text tables (report/text.py) against rich, which draws the same tables: rich is the oracle.

Off a terminal, blobtool writes info's and norm's tables itself rather than
loading rich; the text must be what rich would have printed, character for
character, and where blobtool cannot promise that it must hand over to rich.
Neither cuts anything: a table too wide for the width even without its
least needed columns is drawn wider, one line per row.
"""

from __future__ import annotations

import functools
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from blobtool._pb.blobtool_caffe_pb2 import NetParameter
from blobtool.report import tables as render
from blobtool.report import text as layout
from builders import Layer, write_net
from runner import rich_text, run_blobtool, subprocess_env

# Printable ASCII, with the characters rich markup and emoji codes would eat.
ASCII = st.from_regex(r"([!-~]([ -~]{0,28}[!-~])?)?", fullmatch=True)
# Now and then a character the plain writer must refuse: wide, combining, control.
AWKWARD = st.sampled_from(["名前", "é", "e\u0301", "\t", "\n", " lead", "trail ", "\x1b[1m"])
PATH = st.from_regex(r"[!-~]([ -~]{0,40}[!-~])?", fullmatch=True)
WIDTHS = st.one_of(st.integers(20, 220), st.integers(120, 220), st.just(160))
NUMBERS = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(0, 10 ** 12))
SHAPES = st.lists(st.integers(0, 10 ** 6), max_size=5)


def natural_width(renderer, record: dict) -> int:
    return max(len(line) for line in rich_text(renderer, record, 100_000).splitlines())


def assert_whole(text: str, texts) -> None:
    """No ellipsis, and every name, shape and number of the table present whole on a line of its own row."""
    assert "…" not in text
    lines = text.splitlines()
    for cell in texts:
        assert any(cell in line for line in lines), cell


def all_simple(texts) -> bool:
    return all(t.isascii() and t.isprintable() and t == t.strip(" ") for t in texts)


def name_strategies(draw):
    """Names and paths for one record: printable ASCII in most records, now and then awkward ones."""
    if draw(st.integers(0, 4)) == 0:
        return st.one_of(ASCII, AWKWARD), st.one_of(PATH, AWKWARD)
    return ASCII, PATH


@st.composite
def info_records(draw):
    names, paths = name_strategies(draw)
    net = draw(st.booleans())
    blobs = []
    for i in range(draw(st.integers(0, 6))):
        shape = draw(SHAPES)
        blob = {"name": f"{draw(names)}/{i}" if net else str(i), "shape": shape,
                "layout": draw(st.sampled_from(["shape", "legacy"])),
                "dtype": draw(st.sampled_from(["float32", "float64", "float16"])),
                "count": int(np.prod(shape, dtype=object)) if shape else 1,
                "bytes": draw(st.integers(0, 1 << 42)), "has_diff": draw(st.booleans())}
        if net:
            blob["layer"] = draw(st.one_of(names, st.none()))
            blob["type"] = draw(st.one_of(ASCII, st.none()))
        blobs.append(blob)
    record = {"path": draw(paths), "kind": "net" if net else "blob", "bytes": draw(st.integers(0, 1 << 40)),
              "blobs": blobs}
    if net and draw(st.booleans()):
        record["name"] = draw(names)
    return record


@st.composite
def norm_records(draw):
    names, paths = name_strategies(draw)

    def norms():
        return draw(st.one_of(st.none(), st.fixed_dictionaries({"asum": NUMBERS, "sumsq": NUMBERS, "l2": NUMBERS})))

    blobs = [{"name": draw(names), "data": norms(), "diff": norms()} for _ in range(draw(st.integers(0, 5)))]
    return {"path": draw(paths), "kind": draw(st.sampled_from(["blob", "net", "vector", "solverstate"])),
            "blobs": blobs, "total": {"data": norms(), "diff": norms()}}


JSON_NUMBERS = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(["nan", "inf", "-inf"]))


@st.composite
def compare_records(draw):
    names, paths = name_strategies(draw)
    blobs = []
    for _ in range(draw(st.integers(0, 6))):
        shape = draw(SHAPES)
        blob = {"name": draw(names), "equal": False, "shape_a": shape, "shape_b": shape, "max_abs": None,
                "max_rel": None, "rel_l2": None, "mismatches": None, "first_mismatch": None, "diff": None}
        what = draw(st.sampled_from(["equal", "only_in", "shape", "values", "diff"]))
        if what == "only_in":
            side = draw(st.sampled_from(["a", "b"]))
            blob["only_in"] = side
            blob["shape_b" if side == "a" else "shape_a"] = None
        elif what == "shape":
            blob["shape_b"] = draw(SHAPES.filter(lambda other: other != shape))
        else:
            blob.update(max_abs=draw(JSON_NUMBERS), max_rel=draw(JSON_NUMBERS), rel_l2=draw(JSON_NUMBERS),
                        mismatches=0 if what != "values" else draw(st.integers(1, 10 ** 9)), equal=what == "equal")
            if what == "values":
                blob["first_mismatch"] = draw(st.lists(st.integers(0, 10 ** 5), min_size=len(shape),
                                                       max_size=len(shape)))
            if what == "equal":
                blob["mismatches"] = 0
            elif draw(st.booleans()):  # a diff in one file only
                blob["diff_only_in"] = draw(st.sampled_from(["a", "b"]))
        blobs.append(blob)
    return {"a": draw(paths), "b": draw(paths), "equal": all(b["equal"] for b in blobs), "blobs": blobs}


def compare_texts(record: dict) -> list:
    return ["".join(layout.compare_verdict(record))] + [cell for cells, _ in layout.compare_rows(record)
                                                        for cell in cells]


def info_texts(record: dict) -> list:
    texts = ["".join(layout.title_parts(record))]
    texts += [cell for cells, _ in layout.info_rows(record) for cell in cells]
    return texts


def norm_texts(record: dict) -> list:
    return ["".join(layout.title_parts(record))] + [cell for cells, _ in layout.norm_rows(record) for cell in cells]


# What each table always shows, whatever the width: the title (or verdict), then (header, cells) of
# the columns that are never left out.
def compare_whole(record: dict, quiet: bool = False) -> list:
    rows = [] if record["equal"] or quiet else [cells for cells, _ in layout.compare_rows(record)]
    return ["".join(layout.compare_verdict(record))] + [cell for cells in rows for cell in cells[:2] + cells[4:5]]


def info_whole(record: dict) -> list:
    shape = 2 if any("layer" in b for b in record["blobs"]) else 1
    return ["".join(layout.title_parts(record))] + [cell for cells, _ in layout.info_rows(record)
                                                    for cell in (cells[0], cells[shape], cells[shape + 3])]


def norm_whole(record: dict) -> list:
    return ["".join(layout.title_parts(record))] + [cells[0] for cells, _ in layout.norm_rows(record)]


def check(plain, renderer, texts, record, width, whole=()):
    text = plain(record, width)
    drawn = rich_text(renderer, record, width)
    if text is not None:
        assert text == drawn
    else:
        # Handing over to rich is allowed only where the plain writer cannot promise rich's text.
        assert not all_simple(texts)
    # Off a terminal nothing is cut or wrapped, however narrow the width: rich's text neither.
    assert_whole(drawn, [t for t in whole if all_simple([t])])


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(record=info_records(), width=WIDTHS)
def test_plain_info_is_richs_text(record, width):
    check(layout.plain_info, render.render_info, info_texts(record), record, width, info_whole(record))


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(record=norm_records(), width=WIDTHS)
def test_plain_norm_is_richs_text(record, width):
    check(layout.plain_norm, render.render_norm, norm_texts(record), record, width, norm_whole(record))


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(record=compare_records(), width=WIDTHS, quiet=st.booleans())
def test_plain_compare_is_richs_text(record, width, quiet):
    renderer = functools.partial(render.render_compare, quiet=quiet)
    check(functools.partial(layout.plain_compare, quiet=quiet), renderer, compare_texts(record), record, width,
          compare_whole(record, quiet))


def test_plain_table_at_exactly_the_width():
    record = {"path": "w.pb", "kind": "blob", "blobs": [{"name": "0", "data": {"asum": 1.5, "sumsq": 2.25, "l2": 1.5},
                                                          "diff": None}]}
    width = natural_width(render.render_norm, record)
    assert layout.plain_norm(record, width) == rich_text(render.render_norm, record, width)
    assert "not shown" not in layout.plain_norm(record, width)
    # One column less: a column is left out (and said so), as rich's table leaves it out.
    narrower = layout.plain_norm(record, width - 1)
    assert narrower == rich_text(render.render_norm, record, width - 1)
    assert f"not shown at {width - 1} columns: diff sumsq" in narrower
    # Narrower than the columns that always stay: drawn wider than the width, as rich draws it off a terminal.
    assert layout.plain_norm(record, 2) == rich_text(render.render_norm, record, 2)
    assert " 0          1.5 " in layout.plain_norm(record, 2).splitlines()


STAT_NUMBERS = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-10 ** 6, 10 ** 6))


@st.composite
def blob_stats(draw):
    """One side's figures as records.py gives them: no finite value (None and no bins), or 16 counted bins."""
    nan, inf = draw(st.integers(0, 10 ** 9)), draw(st.integers(0, 3))
    if draw(st.integers(0, 5)) == 0:
        return {"min": None, "max": None, "mean": None, "std": None, "nan": nan, "inf": inf,
                "histogram": {"edges": [], "counts": [], "zeros": 0}}
    counts = draw(st.lists(st.integers(0, 10 ** 9), min_size=16, max_size=16))
    return {"min": draw(STAT_NUMBERS), "max": draw(STAT_NUMBERS), "mean": draw(STAT_NUMBERS),
            "std": draw(STAT_NUMBERS), "nan": nan, "inf": inf,
            "histogram": {"edges": [0.0] * 17, "counts": counts, "zeros": draw(st.integers(0, 10 ** 9))}}


@st.composite
def info_stats_records(draw):
    record = draw(info_records())
    for blob in record["blobs"]:
        blob["stats"] = {"data": draw(blob_stats()), "diff": draw(blob_stats()) if blob["has_diff"] else None}
    return record


def info_stats_texts(record: dict) -> list:
    return info_texts(record) + [cell for cells, _ in layout.stats_rows(record) for cell in cells]


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(record=info_stats_records(), width=WIDTHS)
def test_plain_info_with_stats_is_richs_text(record, width):
    whole = info_whole(record) + [cells[0] for cells, _ in layout.stats_rows(record)]
    check(layout.plain_info, render.render_info, info_stats_texts(record), record, width, whole)


ENVIRONMENTS = [{}, {"FORCE_COLOR": "1"}, {"FORCE_COLOR": ""}, {"TTY_COMPATIBLE": "1"}, {"TTY_COMPATIBLE": "0"},
                {"TTY_COMPATIBLE": "0", "FORCE_COLOR": "1"}, {"TTY_COMPATIBLE": "x", "FORCE_COLOR": "1"},
                {"NO_COLOR": "1"}]


@pytest.mark.parametrize("env", ENVIRONMENTS, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()) or "none")
@pytest.mark.parametrize("tty", [False, True])
def test_terminal_rule_is_richs(monkeypatch, env, tty):
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    class Stream(io.StringIO):
        def isatty(self):
            return tty

    monkeypatch.setattr(sys, "stdout", Stream())
    assert layout.stdout_is_terminal() == Console().is_terminal


def test_plain_width_follows_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "97")
    assert layout.plain_width() == 97
    monkeypatch.setenv("COLUMNS", "wide")
    assert layout.plain_width() == layout.DEFAULT_PLAIN_WIDTH
    monkeypatch.delenv("COLUMNS")
    assert layout.plain_width() == layout.DEFAULT_PLAIN_WIDTH


def _run(args, tmp_path, **env):
    """blobtool in a process that reports its imports on stderr; FORCE_COLOR and TTY_COMPATIBLE only from `env`."""
    environ = subprocess_env(**env)
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        if name not in env:
            environ.pop(name, None)
    return run_blobtool(*args, python_flags=("-X", "importtime"), text=True, env=environ, cwd=tmp_path,
                        timeout=None)


@pytest.fixture
def small_net(tmp_path) -> Path:
    blobs = [np.array([[1, -2, 3], [-4, 5, -6]]), np.array([0.5])]
    return write_net(tmp_path / "tiny.caffemodel", "new", [Layer("conv1", "Convolution", blobs, bottom=[], top=[])],
                     name="tiny")


@pytest.mark.parametrize("command", [["info"], ["info", "--stats"], ["norm"]], ids=" ".join)
def test_command_off_a_terminal_prints_richs_text_without_loading_rich(tmp_path, small_net, command):
    plain = _run([*command, str(small_net)], tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert " rich" not in plain.stderr, "rich was imported"
    as_json = _run([*command, "--json", str(small_net)], tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    renderer = render.render_info if command[0] == "info" else render.render_norm
    assert plain.stdout == rich_text(renderer, json.loads(as_json.stdout), layout.DEFAULT_PLAIN_WIDTH)
    assert "conv1" in plain.stdout


@pytest.mark.parametrize("quiet", [False, True])
def test_compare_off_a_terminal_prints_richs_text_without_loading_rich(tmp_path, small_net, quiet):
    net = NetParameter.FromString(small_net.read_bytes())
    net.layer[0].blobs[0].data[4] = 5.5
    net.layer.add(name="extra").blobs.add(data=[1.0]).shape.dim.append(1)
    other = tmp_path / "other.caffemodel"
    other.write_bytes(net.SerializeToString())
    flags = ["--quiet"] if quiet else []
    for b, code in ((small_net, 0), (other, 1)):  # names relative to tmp_path: the verdict line fits
        plain = _run(["compare", *flags, small_net.name, b.name], tmp_path)
        assert plain.returncode == code, plain.stderr
        assert " rich" not in plain.stderr, "rich was imported"
        as_json = _run(["compare", "--json", small_net.name, b.name], tmp_path)
        assert as_json.returncode == code, as_json.stderr
        renderer = functools.partial(render.render_compare, quiet=quiet)
        assert plain.stdout == rich_text(renderer, json.loads(as_json.stdout), layout.DEFAULT_PLAIN_WIDTH)
    assert ("conv1" in plain.stdout) != quiet and "DIFFERENT" in plain.stdout


def test_forced_terminal_output_still_uses_rich(tmp_path, small_net):
    forced = _run(["norm", str(small_net)], tmp_path, FORCE_COLOR="1")
    assert forced.returncode == 0, forced.stderr
    assert " rich.console" in forced.stderr
    assert "\x1b[" in forced.stdout
