"""info's tables on an 80-column terminal (a real pseudo-terminal), through a pipe, and what they say.

A terminal gets tables fitted to its width: names, shapes and numbers whole,
columns left out (and said so) where they do not fit; off a terminal, every
blob is one line with every column, so that grep finds it. Every row carries
the blob's full name (`conv1/1`), a net's layers are counted, and a blob
whose shape disagrees with its stored values is flagged (exit 3).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import termios

import numpy as np
import pytest
from rich.cells import cell_len

from blobtool.report.text import compare_rows, fmt_bytes, fmt_num, fmt_shape
from builders import Layer, blob_proto, write_net
from runner import blobtool_cmd, one_json, rich_text, run_blobtool, subprocess_env

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def run_on_terminal(*args, columns: int = 80, timeout: float = 60) -> tuple[str, str, int]:
    """blobtool ARGS with stdout on a pseudo-terminal `columns` wide; (stdout without colour codes, stderr, exit)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = subprocess_env(TERM="xterm-256color")
    for name in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE"):
        env.pop(name, None)
    proc = subprocess.Popen(blobtool_cmd(*args), stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE,
                            env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the terminal's last writer is gone
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    code = proc.wait(timeout=timeout)
    out = ANSI.sub("", b"".join(chunks).decode()).replace("\r\n", "\n")
    return out, stderr, code


def wide_net_layers() -> list:
    """A real-looking net: long layer names, Convolution/BatchNorm/Scale/InnerProduct, 4-D shapes, layers without
    blobs, some diffs."""
    rng = np.random.default_rng(16)

    def values(*shape):
        return rng.normal(0, 0.05, shape).astype(np.float32)

    return [
        Layer("data", "Data", []),
        Layer("res4b_branch2a", "Convolution", [values(256, 128, 3, 3), values(256)],
              diffs=[values(256, 128, 3, 3), None]),
        Layer("bn4b_branch2a", "BatchNorm", [values(256) * 1e6, np.abs(values(256)) * 1e7, np.float32([999.0])]),
        Layer("scale4b_branch2a", "Scale", [values(256), values(256)]),
        Layer("res4b_branch2a_relu", "ReLU", []),
        Layer("conv_projection_shortcut_long_name", "Convolution", [values(512, 256, 1, 1)]),
        Layer("pool5", "Pooling", []),
        Layer("fc1000", "InnerProduct", [values(1000, 512), values(1000)]),
        Layer("prob", "Softmax", []),
    ]


@pytest.fixture(scope="module")
def wide_net(tmp_path_factory):
    path = tmp_path_factory.mktemp("tables") / "resnet_like.caffemodel"
    layers = wide_net_layers()
    write_net(path, "new", layers)
    names = [f"{layer.name}/{i}" for layer in layers for i in range(len(layer.blobs))]
    return path, layers, names


def info_json(path, *args) -> dict:
    result = run_blobtool("info", "--json", *args, path, text=True)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def assert_fits(out: str, columns: int) -> None:
    lines = out.splitlines()
    too_wide = [line for line in lines if cell_len(line) > columns]
    assert not too_wide, too_wide
    assert "…" not in out


def row_of(out: str, name: str, table: int = 0) -> list:
    """The words of the `table`-th row (0: info's, 1: --stats') whose first word is the blob's full name."""
    rows = [line.split() for line in out.splitlines() if line.split()[:1] == [name]]
    return rows[table]


ALL_COLUMNS = ["blob", "type", "shape", "layout", "dtype", "count", "bytes", "diff"]


def expected_cells(blob: dict) -> dict:
    """info's cells of a blob by column, as words (a shape or a size is several)."""
    return {"blob": [blob["name"]], "type": [blob["type"]], "shape": fmt_shape(blob["shape"]).split(),
            "layout": [blob["layout"]], "dtype": [blob["dtype"]], "count": [fmt_num(blob["count"])],
            "bytes": _bytes_words(blob), "diff": ["yes" if blob["has_diff"] else "no"]}


def test_info_fits_80_columns(wide_net):
    path, _, names = wide_net
    record = info_json(path)
    assert [b["name"] for b in record["blobs"]] == names
    out, err, code = run_on_terminal("info", path)
    assert (code, err) == (0, "")
    assert_fits(out, 80)
    header = next(line for line in out.splitlines() if line.split()[:1] == ["blob"]).split()
    (note,) = [line for line in out.splitlines() if "not shown at 80 columns" in line]
    left_out = note.split(": ", 1)[1].split(" (")[0].split(", ")
    # What did not fit is said, not cut; names, shapes and counts always fit.
    assert sorted(header + left_out) == sorted(ALL_COLUMNS) and "layout" in left_out
    assert {"blob", "shape", "count"} <= set(header)
    for blob in record["blobs"]:
        cells = expected_cells(blob)
        assert row_of(out, blob["name"]) == [word for column in header for word in cells[column]]


def test_wider_terminal_shows_more(wide_net):
    path, _, names = wide_net
    out, err, code = run_on_terminal("info", path, columns=160)
    assert (code, err) == (0, "")
    assert_fits(out, 160)
    header = next(line for line in out.splitlines() if line.split()[:1] == ["blob"])
    assert header.split() == ALL_COLUMNS
    assert "not shown" not in out
    for blob in info_json(path)["blobs"]:
        cells = expected_cells(blob)
        assert row_of(out, blob["name"]) == [word for column in ALL_COLUMNS for word in cells[column]]


def test_info_stats_fits_80_columns_with_numbers_whole(wide_net):
    path, _, names = wide_net
    record = info_json(path, "--stats")
    out, err, code = run_on_terminal("info", "--stats", path)
    assert (code, err) == (0, "")
    assert_fits(out, 80)
    header = [line.split() for line in out.splitlines() if line.split()[:2] == ["blob", "min"]]
    assert len(header) == 1
    shown = header[0][1:]
    assert {"min", "max", "nan", "inf"} <= set(shown)
    # The histograms' key, too long for 80 columns, is split at its clause, not mid-phrase.
    assert [line.strip() for line in out.splitlines() if "values exactly 0" in line] == [
        "after │: ▅ values exactly 0, ! NaN or Inf present"]
    for blob in record["blobs"]:
        for which in ("data", "diff"):
            stats = blob["stats"][which]
            if stats is None:
                continue
            words = row_of(out, blob["name"], table=1)
            if which == "diff":
                words = [w.split() for w in out.splitlines() if w.split()[:2] == [blob["name"], "diff"]][0][1:]
            # Every number shown is the whole number JSON gives.
            assert words[1:] == [fmt_num(stats[k]) if k not in ("nan", "inf") else str(stats[k]) for k in shown]


def test_off_a_terminal_one_line_per_blob(wide_net):
    path, layers, names = wide_net
    record = info_json(path)
    env = subprocess_env()
    env.pop("COLUMNS", None)
    result = run_blobtool("info", path, text=True, env=env)
    assert result.returncode == 0, result.stderr
    for blob in record["blobs"]:
        (line,) = [line for line in result.stdout.splitlines() if line.split()[:1] == [blob["name"]]]
        cells = expected_cells(blob)
        assert line.split() == [word for column in ALL_COLUMNS for word in cells[column]]
    # COLUMNS narrows it as it would a terminal: still one whole line per blob.
    narrow = run_blobtool("info", path, text=True, env=subprocess_env(COLUMNS="80")).stdout
    title, *table = narrow.splitlines()
    assert_fits("\n".join(table), 80)
    # The title is longer than 80 columns here: one line all the same, never wrapped off a terminal.
    assert title.startswith(str(path)) and title.endswith("name testnet")
    for blob in record["blobs"]:
        (line,) = [line for line in narrow.splitlines() if line.split()[:1] == [blob["name"]]]
        assert fmt_shape(blob["shape"]) in line
    # grep finds a layer's every blob: its bias too.
    grepped = [line.split()[0] for line in result.stdout.splitlines() if "fc1000" in line]
    assert grepped == ["fc1000/0", "fc1000/1"]


def _bytes_words(blob) -> list:
    return fmt_bytes(blob["bytes"]).split()


def test_real_resnet_fits_80_columns(realworld):
    path = realworld / "resnet20_cifar10.caffemodel"
    record = info_json(path, "--stats")
    for args in (("info",), ("info", "--stats")):
        out, err, code = run_on_terminal(*args, path)
        assert (code, err) == (0, "")
        assert_fits(out, 80)
        for blob in record["blobs"]:
            words = row_of(out, blob["name"])
            assert fmt_shape(blob["shape"]) in " ".join(words)
            if "--stats" in args:
                stats = row_of(out, blob["name"], table=1)
                assert stats[1] == fmt_num(blob["stats"]["data"]["min"])
                assert stats[2] == fmt_num(blob["stats"]["data"]["max"])


def test_layers_counted_and_listed(wide_net):
    path, layers, _ = wide_net
    record = info_json(path)
    empty = [layer for layer in layers if not layer.blobs]
    assert record["layers"] == len(layers) and record["layers_without_blobs"] == len(empty) == 4
    assert "all_layers" not in record
    result = run_blobtool("info", path, text=True)
    assert f"; {len(layers)} layers, {len(empty)} without blobs" in result.stdout
    record = info_json(path, "--layers")
    assert record["all_layers"] == [{"name": layer.name, "type": layer.type, "blobs": len(layer.blobs)}
                                    for layer in layers]
    result = run_blobtool("info", "--layers", path, text=True)
    assert result.returncode == 0
    listed = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines() if line.split()}
    for layer in layers:
        assert listed[layer.name][0] == layer.type


def test_hdf5_layers_have_no_type(realworld):
    record = info_json(realworld / "cifar10_full_iter_70000.caffemodel.h5", "--layers")
    assert record["layers"] == len(record["all_layers"]) >= record["layers_without_blobs"] + 1
    assert {layer["type"] for layer in record["all_layers"]} == {None}
    assert sum(layer["blobs"] for layer in record["all_layers"]) == len(record["blobs"])


def test_shape_that_disagrees_with_values_is_exit_3(tmp_path):
    # A mean file whose script wrote the legacy dims without num: count 0, 37,632 values.
    proto = blob_proto(np.zeros(3 * 112 * 112, np.float32), shape=[1, 3, 112, 112], layout="legacy")
    proto.ClearField("num")
    path = tmp_path / "mean.binaryproto"
    path.write_bytes(proto.SerializeToString())
    line = f"blobtool: {path}: blob 0: shape (0, 3, 112, 112) needs 0 values, but field 5 (data) holds 37,632\n"
    result = run_blobtool("info", path, text=True)
    assert (result.returncode, result.stderr) == (3, line)
    assert "(0, 3, 112, 112)" in result.stdout  # the table is still printed
    result = run_blobtool("info", "--json", path, text=True)
    assert (result.returncode, result.stderr) == (3, line)
    assert one_json(result)["invalid"] == [{"name": "0", "shape": [0, 3, 112, 112], "count": 0, "which": "data",
                                            "field": "field 5 (data)", "values": 37632}]
    # Every command that reads the values refuses it too.
    assert run_blobtool("norm", path).returncode == 3
    # A diff that disagrees is named as the diff.
    proto = blob_proto([1.0, 2.0], diff=[1.0], shape=[2])
    path.write_bytes(proto.SerializeToString())
    result = run_blobtool("info", path, text=True)
    assert (result.returncode, result.stderr) == (
        3, f"blobtool: {path}: blob 0: shape (2,) needs 2 values, but field 6 (diff) holds 1\n")


@pytest.mark.parametrize("columns", [80, 160])
def test_norm_fits_the_terminal(wide_net, columns):
    path, _, names = wide_net
    result = run_blobtool("norm", "--json", path, text=True)
    record = json.loads(result.stdout)
    out, err, code = run_on_terminal("norm", path, columns=columns)
    assert (code, err) == (0, "")
    assert_fits(out, columns)
    header = next(line for line in out.splitlines() if line.split()[:1] == ["blob"])
    shown = re.split(r"\s{2,}", header.strip())[1:]
    assert "data l2" in shown
    for blob in [*record["blobs"], {"name": "total", **record["total"]}]:
        words = row_of(out, blob["name"])
        expected = []
        for column in shown:
            which, key = column.split()
            expected.append(fmt_num(blob[which][key]) if blob[which] else "-")
        assert words[1:] == expected
    if columns == 160:
        assert len(shown) == 6 and "not shown" not in out
    else:
        assert "not shown at 80 columns: diff sumsq, data sumsq" in out


def test_compare_fits_80_columns(wide_net, tmp_path):
    path, layers, _ = wide_net
    changed = write_net(tmp_path / "changed.caffemodel", "new", [
        Layer(layer.name, layer.type, [b * 1.5 if i == 0 else b for i, b in enumerate(layer.blobs)],
              diffs=layer.diffs) for layer in layers])
    result = run_blobtool("compare", "--json", path, changed, text=True)
    record = json.loads(result.stdout)
    differing = [b for b in record["blobs"] if not b["equal"]]
    assert len(differing) == 5
    out, err, code = run_on_terminal("compare", path, changed)
    # Two nets with a BatchNorm: one line says how its statistics were compared.
    assert code == 1 and err.splitlines() == [f"blobtool: {path}, {changed}: BatchNorm statistics compared as Caffe "
                                              "uses them, each net's sums divided by its own factor (blob 2); the 1 "
                                              "factor blob not compared on their own"]
    assert_fits(out, 80)
    header = next(line for line in out.splitlines() if line.split()[:1] == ["blob"])
    shown = re.split(r"\s{2,}", header.strip())
    assert shown[:2] == ["blob", "what"] and "rel L2" in shown
    for blob in differing:
        words = row_of(out, blob["name"])
        assert words[shown.index("rel L2")] == fmt_num(blob["rel_l2"])
    wide, _, _ = run_on_terminal("compare", path, changed, columns=160)
    assert "not shown" not in wide and "first at" in wide


# -- nothing is cut: names, shapes and numbers wider than the width ---------------------------

# A layer name as long as a deep PyTorch export's (155 characters with "/0"): the
# fewest columns a table keeps are wider than 80 columns, and than 160 with --names torch.
LONG_LAYER = "backbone_stage4_unit3_bottleneck_branch2b_conv3x3_grouped_dilated_" \
             "with_squeeze_excitation_and_stochastic_depth_projection_shortcut_fused_bn_relu_v2_final"
assert len(LONG_LAYER + "/0") == 155


def long_name_layers(stem: str = LONG_LAYER) -> list:
    """Convolution, BatchNorm, Scale and InnerProduct layers whose names start with `stem`."""
    rng = np.random.default_rng(22)

    def values(*shape):
        return rng.normal(0, 0.05, shape).astype(np.float32) + 1.234567

    return [
        Layer(stem, "Convolution", [values(64, 32, 3, 3), values(64)], bottom=["data"], top=[stem]),
        Layer(stem + "_bn", "BatchNorm", [values(64), np.abs(values(64)), np.float32([999.0])],
              bottom=[stem], top=[stem]),
        Layer(stem + "_scale", "Scale", [values(64), values(64)], bottom=[stem], top=[stem]),
        Layer(stem + "_fc", "InnerProduct", [values(10, 64), values(10)], bottom=[stem], top=[stem + "_fc"]),
    ]


@pytest.fixture(scope="module")
def long_net(tmp_path_factory):
    folder = tmp_path_factory.mktemp("long")
    layers = long_name_layers()
    path = write_net(folder / "long.caffemodel", "new", layers)
    # The same net, every weight changed: compare lists every blob.
    changed = write_net(folder / "changed.caffemodel", "new", [
        Layer(layer.name, layer.type, [b * 1.5 for b in layer.blobs], bottom=layer.bottom, top=layer.top)
        for layer in layers])
    names = [f"{layer.name}/{i}" for layer in layers for i in range(len(layer.blobs))]
    return path, changed, names


def off_terminal(*args, columns: int | None = None) -> str:
    """blobtool ARGS through a pipe, COLUMNS unset (the default width) or `columns`; its stdout."""
    env = subprocess_env()
    for name in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE"):
        env.pop(name, None)
    if columns is not None:
        env["COLUMNS"] = str(columns)
    result = run_blobtool(*args, text=True, env=env)
    assert result.returncode in (0, 1), result.stderr
    return result.stdout


def assert_one_line_per_name(out: str, names: list, per_table: int = 1) -> None:
    """No ellipsis; each name whole on `per_table` lines (one per table that lists it), never broken over two."""
    assert "…" not in out
    lines = out.splitlines()
    for name in names:
        whole = [line for line in lines if line.split()[:1] == [name]]
        assert len(whole) == per_table, (name, whole)
    # No piece of a name on a line of its own: every line that holds the stem holds a whole name (or layer).
    layers = [name.rsplit("/", 1)[0] for name in names]
    for line in lines:
        if LONG_LAYER[:40] in line:
            assert any(name in line.split() for name in names + layers), line


@pytest.mark.parametrize("args, per_table", [
    (["info"], 1), (["info", "--stats"], 3), (["norm"], 1)], ids=str)
def test_a_155_character_name_off_a_terminal_is_one_whole_line(long_net, args, per_table):
    path, _, names = long_net
    record = info_json(path, "--stats")
    out = off_terminal(*args, path)
    # info --stats lists each blob in info's table, in the statistics and in the histograms.
    assert_one_line_per_name(out, names, per_table)
    for blob in record["blobs"]:
        line = next(line for line in out.splitlines() if line.split()[:1] == [blob["name"]])
        if args[0] == "info":  # the shape and the count, whole
            assert fmt_shape(blob["shape"]) in line and f" {fmt_num(blob['count'])} " in line + " "
    if args == ["info", "--stats"]:
        for blob in record["blobs"]:
            stats = row_of(out, blob["name"], table=1)
            assert stats[1:3] == [fmt_num(blob["stats"]["data"]["min"]), fmt_num(blob["stats"]["data"]["max"])]


def test_a_155_character_name_in_compare_and_torch_names_off_a_terminal(long_net):
    path, changed, names = long_net
    record = json.loads(run_blobtool("compare", "--json", path, changed, text=True).stdout)
    out = off_terminal("compare", path, changed)
    # A BatchNorm's factor is not compared on its own (its statistics are divided by it): it is not listed.
    factors = {b["name"] for b in record["blobs"] if b.get("compared") == "not compared"}
    assert len(factors) == 1
    assert_one_line_per_name(out, [name for name in names if name not in factors])
    for blob in record["blobs"]:
        if blob["name"] not in factors:
            assert row_of(out, blob["name"])[1] == "values" and fmt_num(blob["rel_l2"]) in row_of(out, blob["name"])
    mapping = json.loads(run_blobtool("info", "--names", "torch", "--json", path, text=True).stdout)
    for columns in (None, 80):
        out = off_terminal("info", "--names", "torch", path, columns=columns)
        assert_one_line_per_name(out, names)
        for blob in mapping["blobs"]:
            assert row_of(out, blob["name"])[1] == (blob["torch"] or "-")


def test_a_long_name_that_is_not_ascii_is_whole_off_a_terminal_too(tmp_path):
    # Not printable ASCII: rich draws this table (the plain writer hands over), and cuts nothing either.
    stem = "слой_" * 40
    path = write_net(tmp_path / "wide.caffemodel", "new", long_name_layers(stem))
    names = [blob["name"] for blob in info_json(path)["blobs"]]
    for args in (["info"], ["info", "--stats"], ["norm"], ["info", "--names", "torch"]):
        out = off_terminal(*args, path)
        assert "…" not in out
        for name in names:
            assert [line for line in out.splitlines() if line.split()[:1] == [name]], (args, name)


def _folded(out: str, header: str, names: list) -> str:
    """The pieces of the column `header` (the table's first with that header), joined: the names folded in it."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:1] == ["blob"] and header in line)
    start = lines[at].index(header)
    following = re.search(r"\S", lines[at][start + len(header):])
    end = start + len(header) + following.start() if following else None
    pieces = []
    for line in lines[at + 2:]:
        if not line.strip():
            break
        pieces.append(line[start:end].strip())
    return "".join(pieces)


@pytest.mark.parametrize("columns", [80, 100])
def test_torch_names_on_a_terminal_fold_long_names_and_cut_none(long_net, columns):
    path, _, names = long_net
    mapping = json.loads(run_blobtool("info", "--names", "torch", "--json", path, text=True).stdout)
    out, err, code = run_on_terminal("info", "--names", "torch", path, columns=columns)
    assert (code, err) == (0, "")
    assert "…" not in out
    table = [line for line in out.splitlines() if line.startswith(" ")]
    assert all(cell_len(line) <= columns for line in table), table
    # Folded within their columns, the names read back whole, in order.
    assert _folded(out, "blob", names) == "".join(names)
    assert _folded(out, "torch name", names) == "".join(b["torch"] or "-" for b in mapping["blobs"])


@pytest.mark.parametrize("columns", [80, 100])
def test_real_resnet_torch_names_whole_at_80_and_100_columns(realworld, columns):
    path = realworld / "resnet20_cifar10.caffemodel"
    mapping = json.loads(run_blobtool("info", "--names", "torch", "--json", path, text=True).stdout)
    terminal, err, code = run_on_terminal("info", "--names", "torch", path, columns=columns)
    assert (code, err) == (0, "")
    for out in (terminal, off_terminal("info", "--names", "torch", path, columns=columns)):
        assert "…" not in out
        rows = [line for line in out.splitlines() if line.split()[:1] in ([b["name"]] for b in mapping["blobs"])]
        assert len(rows) == len(mapping["blobs"]) and all(cell_len(line) <= columns for line in rows)
        for blob in mapping["blobs"]:
            words = row_of(out, blob["name"])
            assert words[1] == (blob["torch"] or "-")
            if blob["torch"] is not None:
                assert " ".join(words[2:]).startswith(fmt_shape(blob["torch_shape"]))
        assert f"not shown at {columns} columns: type, done (--json has them)" in out


@pytest.mark.parametrize("width", [60, 80, 100, 160])
def test_on_a_simulated_terminal_nothing_is_cut(long_net, width):
    from blobtool.report import mapping, tables

    path, changed, names = long_net
    records = {
        "info": (tables.render_info, info_json(path, "--stats")),
        "norm": (tables.render_norm, json.loads(run_blobtool("norm", "--json", path, text=True).stdout)),
        "compare": (tables.render_compare,
                    json.loads(run_blobtool("compare", "--json", path, changed, text=True).stdout)),
        "mapping": (mapping.render_mapping,
                    json.loads(run_blobtool("info", "--names", "torch", "--json", path, text=True).stdout)),
    }
    for what, (render, record) in records.items():
        out = rich_text(render, record, width, terminal=True)
        assert "…" not in out, what
        table = [line for line in out.splitlines() if line.startswith(" ")]
        assert all(cell_len(line) <= width for line in table), (what, table)
        listed = names + ["total"] if what == "norm" else names
        if what == "compare":  # most changed first
            listed = [cells[0] for cells, _ in compare_rows(record)]
        assert _folded(out, "blob", names) == "".join(listed), what
    # info's numbers whole: the shapes and counts.
    out = rich_text(*records["info"], width, terminal=True)
    for blob in records["info"][1]["blobs"]:
        assert fmt_shape(blob["shape"]) in out


def test_on_a_terminal_too_narrow_to_fold_the_table_is_drawn_wider():
    from blobtool.report import tables

    record = {"path": "n.pb", "kind": "blob", "bytes": 1,
              "blobs": [{"name": "a_name_of_thirty_characters_xx", "shape": [10 ** 6] * 6, "layout": "shape",
                         "dtype": "float32", "count": 10 ** 36, "bytes": 4, "has_diff": False}]}
    out = rich_text(tables.render_info, record, 30, terminal=True)
    assert "…" not in out
    (row,) = [line for line in out.splitlines() if "a_name_of_thirty_characters_xx" in line]
    assert fmt_shape(record["blobs"][0]["shape"]) in row and fmt_num(10 ** 36) in row
