"""The bad-input corpus (tests/corpus/, made by tests/helpers/make_corpus.py) through the real command line.

Each file gets the exit code and the exact stderr written in expected.json;
nothing is written, nothing is left behind, the input does not change. Also
`info --check finite`, whose answers the corpus pins for NaN, Inf and huge
values, in detail.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import make_corpus
from blobtool.formats.caffe import wire
from blobtool.formats import open_document
from blobtool.records import check_finite
from blobtool.report.text import check_message
from builders import blob_bytes, vector_bytes
from runner import invoke, run_blobtool

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parent / "corpus"
EXPECTED = json.loads((CORPUS / "expected.json").read_text())


def snapshot(folder: Path) -> dict:
    """Every file in the folder (hidden ones too) and its bytes."""
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.fixture
def corpus(tmp_path) -> Path:
    """A copy of the corpus to run in, so that anything written would show."""
    folder = tmp_path / "corpus"
    shutil.copytree(CORPUS, folder)
    return folder


def test_corpus_is_what_make_corpus_makes(tmp_path):
    make_corpus.write_corpus(tmp_path)
    assert snapshot(tmp_path) == snapshot(CORPUS)


def test_corpus_covers_what_it_promises():
    names = {row["file"] for row in EXPECTED}
    assert names == set(make_corpus.FILES)
    for needed in ("empty.pb", "random.bin", "._weights.caffemodel", "weights.pb.gz", "snapshot.caffemodel.h5",
                   "int32.npy", "object.npy", "nan_inf.pb"):
        assert needed in names
    # Every kind truncated, the nets in all three layer formats.
    truncated = {n for n in names if n.startswith("truncated")}
    kinds = {open_document(io.BytesIO(make_corpus.SEEDS[s])).kind for s in make_corpus.SEEDS}
    assert len(truncated) >= len(kinds) + 2
    assert {"truncated_layer.caffemodel", "truncated_v1.caffemodel", "truncated_v0.caffemodel"} <= truncated
    # The object array really holds a pickle (of a class nobody can import).
    assert b"blobtool_never_unpickled" in (CORPUS / "object.npy").read_bytes()


@pytest.mark.parametrize("row", EXPECTED, ids=[f"{r['file']} {' '.join(r['args'])}" for r in EXPECTED])
def test_corpus_file_gets_its_exit_code_and_message(corpus, row, monkeypatch):
    # In-process (runner.invoke): the command is the same; a real process's start-up for each of
    # the corpus's files would be most of the suite's time here (test_convert_of_a_bad_file_writes_nothing
    # runs each failing file in a real process).
    monkeypatch.chdir(corpus)
    before = snapshot(corpus)
    result = invoke(*row["args"], row["file"], columns=None)
    assert result.exit_code == row["exit"], result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.stderr == (row["stderr"] + "\n" if row["stderr"] else "")
    if row["exit"] in (2, 3):  # an error: nothing on stdout
        assert result.stdout == ""
    else:
        assert result.stdout  # the table is printed, NaN or not
    # Nothing written (not even a temporary file), nothing changed.
    assert snapshot(corpus) == before


FAILING = sorted({row["file"] for row in EXPECTED if row["exit"] == 3})


@pytest.mark.parametrize("name", FAILING)
def test_convert_of_a_bad_file_writes_nothing(corpus, name):
    # The same answer as the expected.json one (the read fails before any write).
    (row,) = [r for r in EXPECTED if r["file"] == name][:1]
    before = snapshot(corpus)
    result = run_blobtool("convert", name, "-o", "out.pb", cwd=corpus, text=True)
    assert result.returncode == 3
    assert result.stderr == row["stderr"] + "\n"
    assert snapshot(corpus) == before


def test_info_stats_counts_nan_and_inf(corpus):
    result = run_blobtool("info", "--json", "--stats", "nan_inf.pb", cwd=corpus, text=True)
    assert result.returncode == 0 and result.stderr == ""
    stats = json.loads(result.stdout)["blobs"][0]["stats"]["data"]
    assert (stats["nan"], stats["inf"]) == (2, 2)
    assert (stats["min"], stats["max"]) == (-2.0, 1.0)


# -- info --check finite ------------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("raw, failures", [
    (blob_bytes([1.0, 2.0], [0.0, 0.0]), []),
    (blob_bytes([1.0, NAN]), [("0", "data", 1, 0)]),
    (blob_bytes([1.0, 2.0], [-INF, 0.0]), [("0", "diff", 0, 1)]),          # the diff counts too
    (blob_bytes([NAN, INF, -INF], [NAN, NAN, 1.0], double=True), [("0", "data", 1, 2), ("0", "diff", 2, 0)]),
    (blob_bytes([1e308, -1e308], double=True), []),                        # huge is finite
    (vector_bytes([blob_bytes([1.0]), blob_bytes([INF]), blob_bytes([2.0])]), [("1", "data", 0, 1)]),
])
def test_check_finite_in_the_library(raw, failures):
    doc = open_document(io.BytesIO(raw))
    result = check_finite(doc.entries)
    assert result["passed"] == (not failures)
    assert [(f["name"], f["which"], f["nan"], f["inf"]) for f in result["failures"]] == failures


def test_check_finite_counts_chunk_by_chunk():
    # More values than one chunk, NaN and Inf in different chunks.
    values = np.zeros(300_000, dtype=np.float32)
    values[[5, 70_000, 299_999]] = [np.nan, np.inf, np.nan]
    raw = blob_bytes(shape=[values.size]) + wire.len_field_header(5, values.nbytes) + values.tobytes()
    result = check_finite(open_document(io.BytesIO(raw)).entries)
    assert result["failures"] == [{"name": "0", "which": "data", "nan": 2, "inf": 1}]


def test_check_message_is_one_line_or_none():
    assert check_message({"path": "a.pb"}) is None
    assert check_message({"path": "a.pb", "check": {"name": "finite", "passed": True, "failures": []}}) is None
    record = {"path": "a.pb", "check": {"name": "finite", "passed": False, "failures": [
        {"name": "conv1/0", "which": "data", "nan": 3, "inf": 0},
        {"name": "conv1/0", "which": "diff", "nan": 0, "inf": 1}]}}
    assert check_message(record) == ("a.pb: check finite failed: blob conv1/0 data has 3 NaN and 0 Inf; "
                                     "blob conv1/0 diff has 0 NaN and 1 Inf")


def test_check_finite_on_the_command_line(tmp_path):
    (tmp_path / "ok.pb").write_bytes(blob_bytes([1.0, 2.0], [3.0, 4.0]))
    (tmp_path / "bad.pb").write_bytes(blob_bytes([1.0, 2.0], [NAN, 4.0]))
    (tmp_path / "vec.pb").write_bytes(vector_bytes([blob_bytes([1.0]), blob_bytes([INF])]))
    # Passing: exit 0, quiet.
    result = run_blobtool("info", "--check", "finite", "ok.pb", cwd=tmp_path, text=True)
    assert (result.returncode, result.stderr) == (0, "")
    # Every file is still reported; each failing file gets its line; then exit 1.
    result = run_blobtool("info", "--json", "--check", "finite", "bad.pb", "ok.pb", "vec.pb", cwd=tmp_path, text=True)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "blobtool: bad.pb: check finite failed: blob 0 diff has 1 NaN and 0 Inf",
        "blobtool: vec.pb: check finite failed: blob 1 data has 0 NaN and 1 Inf"]
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["path"] for r in records] == ["bad.pb", "ok.pb", "vec.pb"]
    assert [r["check"]["passed"] for r in records] == [False, True, False]
    assert records[0]["check"] == {"name": "finite", "passed": False,
                                   "failures": [{"name": "0", "which": "diff", "nan": 1, "inf": 0}]}
    # Only the selected blobs are checked.
    result = run_blobtool("info", "--check", "finite", "--blob", "0", "vec.pb", cwd=tmp_path, text=True)
    assert (result.returncode, result.stderr) == (0, "")
    # Without --check, no "check" key and exit 0 whatever the values.
    result = run_blobtool("info", "--json", "bad.pb", cwd=tmp_path, text=True)
    assert result.returncode == 0 and "check" not in json.loads(result.stdout)
    # An unknown check is a usage error.
    assert run_blobtool("info", "--check", "sorted", "ok.pb", cwd=tmp_path, text=True).returncode == 2
