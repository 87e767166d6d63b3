"""numpy's formats through the real command: .npz member names, diffs, headers, bounds, and compare's diffs.

numpy is the oracle: what blobtool writes, np.load reads back under the same
names with the same values; the .npy headers blobtool accepts, numpy reads.
"""

from __future__ import annotations

import io
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from blobtool import BlobToolError, load_all, write
from blobtool.engine.blob import Blob
from blobtool.formats import open_document
from blobtool.formats.numpy import pair_diffs
from builders import blob_bytes, npy_header_bytes, npz_named, write_npz, zip_bytes
from runner import invoke, one_json, subprocess_env


def assert_one_line_error(result, code: int, *fragments) -> str:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr
    assert err.endswith("\n") and err.count("\n") == 1 and err.startswith("blobtool: "), repr(err)
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


def values(k: int, n: int = 4) -> np.ndarray:
    return np.arange(n, dtype=np.float32) + 100 * k


# -- member names ---------------------------------------------------------------------------

# numpy's savez keyword names, slashes, a diff of a diff, Unicode, an empty name.
NAMES = ["allow_pickle", "file", "args", "kwds", "x", "x/diff", "x/diff/diff", "y/diff/diff", "ß/名", "a//b",
         "/lead", "", "allow_pickle/diff", "file/diff/diff"]


def test_every_member_name_survives_info_and_convert(tmp_path):
    arrays = {name: values(k) for k, name in enumerate(NAMES)}
    src = tmp_path / "names.npz"
    src.write_bytes(npz_named(arrays))
    record = one_json(invoke("info", "--json", src))
    # "<name>/diff" is the diff of "<name>" unless "<name>" is itself a diff.
    assert [(b["name"], b["has_diff"]) for b in record["blobs"]] == [
        ("allow_pickle", True), ("file", False), ("args", False), ("kwds", False), ("x", True),
        ("x/diff/diff", False), ("y/diff/diff", False), ("ß/名", False), ("a//b", False), ("/lead", False),
        ("", False), ("file/diff/diff", False)]
    out = tmp_path / "out.npz"
    result = invoke("convert", src, "-o", out)
    assert result.exit_code == 0, result.stderr
    with np.load(out, allow_pickle=False) as back:  # numpy is the oracle
        assert sorted(back.files) == sorted(NAMES)
        for name in NAMES:
            np.testing.assert_array_equal(back[name], arrays[name])


def test_a_diff_of_a_diff_is_a_blob_whatever_the_member_order(tmp_path):
    names = ["x", "x/diff", "x/diff/diff", "x/diff/diff/diff"]
    for order in (names, names[::-1]):
        path = tmp_path / "chain.npz"
        path.write_bytes(npz_named({n: values(names.index(n)) for n in order}))
        blobs = load_all(path)
        assert sorted(blobs) == ["x", "x/diff/diff"]
        np.testing.assert_array_equal(blobs["x"].cpu_diff(), values(1))
        np.testing.assert_array_equal(blobs["x/diff/diff"].cpu_data(), values(2))
        np.testing.assert_array_equal(blobs["x/diff/diff"].cpu_diff(), values(3))
    assert pair_diffs(["a/diff/diff", "a"]) == (["a/diff/diff", "a"], {})


def test_a_diff_member_of_another_size_is_refused(tmp_path):
    path = write_npz(tmp_path / "d.npz", {"w": values(0), "w/diff": values(1, n=3)})
    assert_one_line_error(invoke("info", path), 3, "array w/diff has 3 values, w has 4")


@pytest.mark.parametrize("blobs, message", [
    ({"x": "plain", "x/diff": "plain"}, "blob 'x/diff' would read back as the diff of blob 'x'"),
    ({"x": "with diff", "x/diff": "plain"}, "two arrays would be named 'x/diff'"),
    ({"a\x00b": "plain"}, "holds a NUL character"),
    ({"\udcff": "plain"}, "is not valid Unicode text"),
])
def test_names_an_npz_cannot_give_back_are_refused_before_writing(tmp_path, blobs, message):
    made = {}
    for name, how in blobs.items():
        blob = Blob(4)
        blob.set_cpu_data(values(len(made)))
        if how == "with diff":
            blob.set_cpu_diff(values(9))
        made[name] = blob
    out = tmp_path / "out.npz"
    with pytest.raises(BlobToolError, match=message) as info:
        write(None, made, out, format="npz", write_diff=any(h == "with diff" for h in blobs.values()))
    assert info.value.exit_code == 2
    assert list(tmp_path.iterdir()) == []


def test_zip_without_npy_member_is_not_an_npz(tmp_path):
    path = tmp_path / "docs.zip"
    path.write_bytes(zip_bytes({"README.txt": b"hello", "data/": b""}))
    empty = tmp_path / "empty.zip"
    empty.write_bytes(zip_bytes({}))
    message = "not an .npz: the zip file holds no .npy member"
    for args in (["info", path], ["norm", empty], ["compare", path, path], ["convert", path, "-o", tmp_path / "o.npz"]):
        assert_one_line_error(invoke(*args), 3, message)
    assert not (tmp_path / "o.npz").exists()


def test_two_members_of_one_name_are_refused(tmp_path):
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for k in range(2):
            with pytest.warns(UserWarning) if k else _nothing():  # zipfile's own warning on the duplicate
                archive.writestr("w.npy", npz_member(values(k)))
    path = tmp_path / "dup.npz"
    path.write_bytes(out.getvalue())
    assert_one_line_error(invoke("info", path), 3, "holds two members named 'w.npy'")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def npz_member(array) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


# -- .npy headers ------------------------------------------------------------------------------

HEADERS = [
    # (what, header text, the message after "invalid .npy header: ")
    ("bytes key", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), b'x': 1}",
     "keys 'descr', 'fortran_order', 'shape', b'x'; expected 'descr', 'fortran_order' and 'shape'"),
    ("bytes keys only", "{b'descr': '<f4', b'fortran_order': False, b'shape': (2,)}",
     "keys b'descr', b'fortran_order', b'shape'; expected 'descr', 'fortran_order' and 'shape'"),
    ("bool dimension", "{'descr': '<f4', 'fortran_order': False, 'shape': (True, 2)}",
     "shape must be a tuple of integers, got (True, 2)"),
    ("float dimension", "{'descr': '<f4', 'fortran_order': False, 'shape': (2.0,)}",
     "shape must be a tuple of integers, got (2.0,)"),
    ("shape as a list", "{'descr': '<f4', 'fortran_order': False, 'shape': [2]}",
     "shape must be a tuple of integers, got [2]"),
    ("order as an int", "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}",
     "fortran_order must be True or False, got 0"),
    ("descr as an int", "{'descr': 4, 'fortran_order': False, 'shape': (2,)}",
     "descr 4 is not a dtype (TypeError)"),
    ("unhashable key", "{['shape']: (2,)}", "not a literal dictionary (TypeError: unhashable type: 'list')"),
    ("missing key", "{'descr': '<f4', 'shape': (2,)}",
     "keys 'descr', 'shape'; expected 'descr', 'fortran_order' and 'shape'"),
    ("a set", "{'descr', 'shape'}", "not a dictionary: {"),
    ("not a literal", "{'descr': open('x'), 'fortran_order': False, 'shape': (2,)}", "not a literal dictionary ("),
]


@pytest.mark.parametrize("what, header, message", HEADERS, ids=[h[0] for h in HEADERS])
@pytest.mark.parametrize("command", ["info", "norm"])
def test_npy_header_dictionary_is_checked_in_full(tmp_path, what, header, message, command):
    path = tmp_path / "h.npy"
    path.write_bytes(npy_header_bytes(header, bytes(8)))
    err = assert_one_line_error(invoke(command, path), 3)
    assert err.startswith(f"blobtool: {path}: invalid .npy header: {message}"), err
    # The same header inside an .npz member names the member.
    npz = tmp_path / "h.npz"
    npz.write_bytes(zip_bytes({"w.npy": npy_header_bytes(header, bytes(8))}))
    err = assert_one_line_error(invoke(command, npz), 3)
    assert err.startswith(f"blobtool: {npz}[w.npy]: invalid .npy header: {message}"), err


def test_headers_numpy_writes_still_read(tmp_path):
    for version in ((1, 0), (2, 0), (3, 0)):
        array = np.arange(6, dtype=">f8").reshape(2, 3)
        out = io.BytesIO()
        np.lib.format.write_array(out, np.asfortranarray(array), version=version)
        path = tmp_path / f"v{version[0]}.npy"
        path.write_bytes(out.getvalue())
        result = invoke("info", "--json", "--stats", path)
        assert result.exit_code == 0, result.stderr
        assert one_json(result)["blobs"][0]["shape"] == [2, 3]
        np.testing.assert_array_equal(load_all(path)["0"].cpu_data().reshape(2, 3), array)


# -- bounds: headers alone for info, the declared size for values ------------------------------

def deflate_bomb(path: Path, count: int, *, stream_count: int | None = None) -> Path:
    """An .npz whose one member declares `count` float32 zeros and inflates `stream_count` of them (default: count)."""
    header = npy_header_bytes(f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({count},), }}")
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("w.npy", "w") as member:
            member.write(header)
            chunk = bytes(1 << 22)
            left = 4 * (count if stream_count is None else stream_count)
            while left:
                member.write(chunk[:min(left, len(chunk))])
                left -= min(left, len(chunk))
    if stream_count is not None:  # the zip entry agrees with the header, the deflate stream does not
        declared = len(header) + 4 * count
        data = bytearray(path.read_bytes())
        for sig, size_at in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
            at = bytes(data).index(sig)
            data[at + size_at:at + size_at + 4] = declared.to_bytes(4, "little")
        path.write_bytes(bytes(data))
    return path


# Runs blobtool and writes the process's peak resident memory (VmHWM, which
# starts afresh at exec, unlike getrusage's maxrss: that keeps the forked
# parent's) to the file named by its first argument.
_MEASURED = """
import atexit, runpy, sys
out = sys.argv.pop(1)
def report():
    with open("/proc/self/status") as status:
        peak = next(line for line in status if line.startswith("VmHWM:")).split()[1]
    with open(out, "w") as f:
        f.write(peak)
atexit.register(report)
sys.argv[0] = "blobtool"
runpy.run_module("blobtool", run_name="__main__")
"""


def run_measured(*args, cwd: Path) -> tuple:
    """(exit code, stdout, stderr, peak resident MiB, seconds) of a real blobtool process (Linux: /proc)."""
    if not Path("/proc/self/status").is_file():
        pytest.skip("the peak memory of a process is read from /proc/self/status (Linux)")
    peak_file = cwd / "peak.txt"
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _MEASURED, str(peak_file), *map(str, args)], cwd=cwd,
                          env=subprocess_env(), capture_output=True, timeout=120)
    seconds = time.perf_counter() - start
    peak_mib = int(peak_file.read_text()) / 1024
    peak_file.unlink()
    return proc.returncode, proc.stdout, proc.stderr.decode(), peak_mib, seconds


def test_info_of_a_deflate_bomb_reads_its_header_only(tmp_path):
    # 256 MiB of zeros in a 250 KB file: info once inflated all of it (twice over).
    path = deflate_bomb(tmp_path / "bomb.npz", 1 << 26)
    assert path.stat().st_size < 400_000
    code, stdout, stderr, peak_mib, seconds = run_measured("info", "--json", path.name, cwd=tmp_path)
    assert code == 0, stderr
    assert b'"shape": [67108864]' in stdout
    assert peak_mib < 120, peak_mib   # the interpreter and its modules; the member would be 256 MiB


def test_a_deflate_stream_longer_than_declared_is_not_inflated_past_it(tmp_path):
    # The zip entry and the header agree on 4 MiB; the stream holds 64 MiB.
    path = deflate_bomb(tmp_path / "long.npz", 1 << 20, stream_count=1 << 24)
    code, stdout, stderr, peak_mib, _ = run_measured("norm", path.name, cwd=tmp_path)
    assert code == 3 and stdout == b""
    assert stderr == "blobtool: long.npz: at byte 0: member 'w.npy' is unreadable: Bad CRC-32 for file 'w.npy'\n"
    assert peak_mib < 120, peak_mib


def test_a_member_whose_size_disagrees_with_its_header_is_refused_before_inflating(tmp_path):
    path = deflate_bomb(tmp_path / "short.npz", 1 << 20, stream_count=1 << 20)
    data = bytearray(path.read_bytes())
    for sig, size_at in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = bytes(data).index(sig)
        data[at + size_at:at + size_at + 4] = (1 << 20).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    assert_one_line_error(invoke("info", path), 3, f"{path}[w.npy]: truncated at byte 128: .npy array data needs "
                                                   f"{4 << 20} bytes, {(1 << 20) - 128} remain")
    longer = tmp_path / "longer.npz"
    member = npz_member(values(0))
    longer.write_bytes(zip_bytes({"w.npy": member + b"\0" * 8}, compressed=True))
    assert_one_line_error(invoke("norm", longer), 3,
                          f"member 'w.npy' holds {len(member) + 8} bytes; its .npy header declares {len(member)}")


def test_values_of_a_compressed_npz_are_what_numpy_reads(tmp_path):
    arrays = {"w": np.random.default_rng(3).standard_normal((5, 7)).astype(np.float32),
              "w/diff": np.ones((5, 7), np.float32), "b": np.arange(3, dtype=">f8")}
    path = tmp_path / "c.npz"
    path.write_bytes(npz_named(arrays, compressed=True))
    blobs = load_all(path)
    np.testing.assert_array_equal(blobs["w"].cpu_data().reshape(5, 7), arrays["w"])
    np.testing.assert_array_equal(blobs["w"].cpu_diff().reshape(5, 7), arrays["w/diff"])
    np.testing.assert_array_equal(blobs["b"].cpu_data(), arrays["b"])
    norms = one_json(invoke("norm", "--json", path))
    assert norms["blobs"][0]["data"]["sumsq"] == pytest.approx(float((arrays["w"].astype(np.float64) ** 2).sum()))


# -- compare: a diff in one file only ------------------------------------------------------------

@pytest.mark.parametrize("ext", [".npz", ".pb"])
def test_compare_reports_a_diff_present_in_one_file_only(tmp_path, ext):
    data = values(0, n=6).reshape(2, 3)
    if ext == ".npz":
        with_diff = write_npz(tmp_path / f"d{ext}", {"w": data, "w/diff": data})
        without = write_npz(tmp_path / f"n{ext}", {"w": data})
    else:
        with_diff = tmp_path / f"d{ext}"
        with_diff.write_bytes(blob_bytes(data, diff=data))
        without = tmp_path / f"n{ext}"
        without.write_bytes(blob_bytes(data))
    name = "w" if ext == ".npz" else "0"
    for a, b, side in ((with_diff, without, "a"), (without, with_diff, "b")):
        result = invoke("compare", "--json", a, b)
        assert result.exit_code == 1, result.stderr
        record = one_json(result)
        assert record["equal"] is False
        (row,) = record["blobs"]
        assert row["equal"] is False and row["diff_only_in"] == side and row["mismatches"] == 0
        human = invoke("compare", a, b)
        assert human.exit_code == 1
        assert human.stdout.startswith(f"DIFFERENT  {a} vs {b}: 1 of 1 blob(s) differ")
        assert f"diff only in {side}" in human.stdout
        assert name in human.stdout
    # Both with, both without: equal as before.
    assert invoke("compare", with_diff, with_diff).exit_code == 0
    assert invoke("compare", without, without).exit_code == 0
    assert "diff_only_in" not in one_json(invoke("compare", "--json", without, without))["blobs"][0]


def test_compare_names_both_value_and_diff_differences(tmp_path):
    a = write_npz(tmp_path / "a.npz", {"w": values(0), "w/diff": values(0)})
    b = write_npz(tmp_path / "b.npz", {"w": values(1)})
    result = invoke("compare", a, b)
    assert result.exit_code == 1
    assert "values, diff only in a" in result.stdout


def test_open_document_lists_npz_members_without_inflating_them():
    # The header of each member is read at open; a broken deflate stream past it shows only when values are read.
    member = npz_member(np.random.default_rng(5).standard_normal(4096).astype(np.float32))
    data = bytearray(zip_bytes({"w.npy": member}, compressed=True))
    data[len(data) // 2] ^= 0xFF  # inside the deflate stream, far past the header
    doc = open_document(io.BytesIO(bytes(data)))
    assert doc.names() == ["w"] and doc.entries[0].shape == (4096,)
    with pytest.raises(BlobToolError, match="member 'w.npy' is unreadable"):
        doc.entries[0].blob()


def test_headers_numpy_writes_parse_as_numpy_parses_them():
    # numpy's own header reader is the oracle (blobtool reads numpy's layout without ast).
    from blobtool.formats.numpy import parse_npy_header

    dtypes = ["<f4", ">f4", "<f8", ">f8", "<f2", "|u1", "<i4", ">i8", "|b1", "<c8", "<U3", "|S2", "<M8[s]"]
    shapes = [(), (0,), (1,), (7,), (2, 3), (1, 0, 5), (10 ** 6, 3), (2,) * 32]
    for descr in dtypes:
        for shape in shapes:
            for fortran in (False, True):
                out = io.BytesIO()
                header = {"descr": descr, "fortran_order": fortran, "shape": shape}
                np.lib.format.write_array_header_1_0(out, header)
                data = out.getvalue()
                stream = io.BytesIO(data)
                np.lib.format.read_magic(stream)
                expected = np.lib.format.read_array_header_1_0(stream)
                got = parse_npy_header(data)
                assert (got.shape, got.fortran, got.dtype) == expected, (header, got)
                assert got.offset == len(data)
