"""formats/safetensors.py: every kind to safetensors and back, against the safetensors package (the oracle).

Files blobtool writes must load with the package, keys and values exact;
files the package writes must read with blobtool, viewed in place; damaged
and forged files are refused with one line, exit 3; the writer streams.
"""

from __future__ import annotations

import io
import json
import os
import struct
import tracemalloc

import numpy as np
import pytest
from safetensors import safe_open
from safetensors import SafetensorError
from safetensors.numpy import load, load_file, save, save_file

import fuzzcases as fc
from blobtool import BlobToolError, __version__, load_all, open_document, write
from blobtool.formats import MAX_BLOBS, Document, Entry
from builders import Layer, blob_bytes, npz_bytes, raw_blob_bytes, write_net, write_npz
from runner import run_blobtool

SEEDS = {s.name: s for s in fc.generated_seeds()}
# Every Caffe kind and encoding blobtool reads (and .npz), as files.
CAFFE_SEEDS = ["blob_shape", "blob_legacy", "blob_double", "blob_unpacked", "vector", "net_layer", "net_v1",
               "net_v0", "solverstate", "nvidia_raw", "ditcaffe_half", "npz"]


FLOATS = (np.float16, np.float32, np.float64)


def expected_arrays(doc) -> dict:
    """{key: array} a safetensors export of `doc` must hold: data and "<name>/diff" in their stored float dtypes."""
    out = {}
    for entry in doc.entries:
        blob = entry.blob()
        stored = entry.dtype if entry.dtype in FLOATS else blob.dtype
        out[entry.name] = blob.cpu_data().reshape(entry.shape).astype(stored)
        if entry.has_diff:
            diff_stored = stored
            if entry.record is not None and entry.record.diff_payload.dtype in FLOATS:
                diff_stored = entry.record.diff_payload.dtype
            elif getattr(entry, "diff_tensor", None) is not None:
                diff_stored = {"F16": np.float16, "F32": np.float32, "F64": np.float64}[entry.diff_tensor.code]
            out[entry.name + "/diff"] = blob.cpu_diff().reshape(entry.shape).astype(diff_stored)
    return out


def assert_bit_exact(got: dict, want: dict) -> None:
    assert list(got) == list(want) or sorted(got) == sorted(want)
    for key, array in want.items():
        assert got[key].dtype == array.dtype, key
        assert got[key].shape == array.shape, key
        assert got[key].tobytes() == array.tobytes(), key


# -- round trips ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", CAFFE_SEEDS)
def test_every_kind_to_safetensors_and_back_bit_exact(tmp_path, name):
    seed = SEEDS[name]
    src = tmp_path / f"{name}.in"
    src.write_bytes(seed.data)
    doc = open_document(src)
    want = expected_arrays(doc)
    out = tmp_path / "out.safetensors"
    result = run_blobtool("convert", src, "-o", out, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    # The oracle reads every key, values bit for bit, in the stored dtype.
    assert_bit_exact(load_file(out), want)
    with safe_open(out, "np") as f:
        assert list(f.keys()) == sorted(want)
        assert f.metadata() == {"source": src.name, "source_kind": seed.kind, "names": "blobtool",
                                "blobtool_version": __version__}
    # The header lists the tensors in the blobs' order.
    length = int.from_bytes(out.read_bytes()[:8], "little")
    header = json.loads(out.read_bytes()[8:8 + length])
    assert [k for k in header if k != "__metadata__"] == list(want)
    # And back: blobtool reads it as the same blobs, diffs included, values bit for bit.
    back = open_document(out)
    assert back.kind == "safetensors" and back.names() == doc.names()
    assert [e.has_diff for e in back.entries] == [e.has_diff for e in doc.entries]
    assert_bit_exact(expected_arrays(back), want)
    # compare across formats: equal, exit 0.
    result = run_blobtool("compare", src, out, text=True)
    assert (result.returncode, result.stderr) == (0, ""), result.stdout
    # Written back as one BlobProto, a stored float16 stays float16 (NVIDIA Caffe's raw form).
    if len(doc.entries) == 1:
        pb = tmp_path / "back.pb"
        assert run_blobtool("convert", out, "-o", pb).returncode == 0
        (entry,) = open_document(pb).entries
        assert entry.dtype == doc.entries[0].dtype
        assert entry.blob().cpu_data().tobytes() == doc.entries[0].blob().cpu_data().tobytes()


def test_precision_options_and_no_diff(tmp_path):
    src = tmp_path / "v.pb"
    src.write_bytes(SEEDS["vector"].data)
    want = expected_arrays(open_document(src))
    for option, dtype in (("--double", np.float64), ("--float", np.float32), ("--half", np.float16)):
        out = tmp_path / f"v{option}.safetensors"
        assert run_blobtool("convert", option, src, "-o", out).returncode == 0
        got = load_file(out)
        assert {a.dtype for a in got.values()} == {np.dtype(dtype)}
        for key, array in want.items():
            assert np.array_equal(got[key], array.astype(dtype))
    out = tmp_path / "nodiff.safetensors"
    assert run_blobtool("convert", "--no-diff", src, "-o", out).returncode == 0
    assert sorted(load_file(out)) == ["0", "1", "2"]


def test_format_option_and_stdout(tmp_path):
    src = tmp_path / "net.caffemodel"
    src.write_bytes(SEEDS["net_layer"].data)
    out = tmp_path / "weights.bin"
    assert run_blobtool("convert", "--format", "safetensors", src, "-o", out).returncode == 0
    assert_bit_exact(load_file(out), expected_arrays(open_document(src)))
    piped = run_blobtool("convert", "--format", "safetensors", src, "-o", "-")
    assert piped.returncode == 0 and piped.stdout == out.read_bytes()
    # Read back from standard input too (safe_open cannot).
    info = run_blobtool("info", "--json", "-", input=piped.stdout)
    assert info.returncode == 0
    record = json.loads(info.stdout)
    assert record["kind"] == "safetensors" and record["metadata"]["source"] == "net.caffemodel"


def test_the_library_writes_and_reads_it(tmp_path):
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    from blobtool import Blob

    blob = Blob(3, 4)
    blob.mutable_cpu_data()[:] = w.ravel()
    assert write(None, {"w": blob}, tmp_path / "w.safetensors") == "safetensors"
    assert_bit_exact(load_file(tmp_path / "w.safetensors"), {"w": w})
    with safe_open(tmp_path / "w.safetensors", "np") as f:
        assert f.metadata() == {"names": "blobtool", "blobtool_version": __version__}
    assert np.array_equal(load_all(tmp_path / "w.safetensors")["w"].cpu_data(), w.ravel())


def test_tensors_are_aligned_by_item_size(tmp_path):
    # Mixed dtypes: float16 first in the blobs' order, float64 last; the data
    # is laid out largest item first, so each tensor starts aligned.
    path = tmp_path / "mixed.pb"
    path.write_bytes(b"".join(b"\x0a" + _varint(len(b)) + b for b in (
        raw_blob_bytes(np.arange(3, dtype=np.float16)), blob_bytes([1.0, 2.0, 3.0]),
        blob_bytes([4.0, 5.0], double=True))))
    out = tmp_path / "mixed.safetensors"
    assert run_blobtool("convert", "--kind", "vector", path, "-o", out).returncode == 0
    raw = out.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    assert length % 8 == 0
    header = json.loads(raw[8:8 + length])
    assert [header[k]["dtype"] for k in ("0", "1", "2")] == ["F16", "F32", "F64"]
    assert header["2"]["data_offsets"][0] == 0
    for key in ("0", "1", "2"):
        begin = header[key]["data_offsets"][0]
        assert begin % np.dtype({"F16": "f2", "F32": "f4", "F64": "f8"}[header[key]["dtype"]]).itemsize == 0
    assert_bit_exact(load_file(out), expected_arrays(open_document(path, "vector")))


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# -- reading files the package wrote ----------------------------------------------------------

def test_reads_what_the_package_writes_in_place(tmp_path):
    rng = np.random.default_rng(5)
    arrays = {"conv.weight": rng.standard_normal((4, 3, 2, 2)).astype(np.float32),
              "conv.weight/diff": rng.standard_normal((4, 3, 2, 2)).astype(np.float32),
              "fc.bias": rng.standard_normal(7),
              "half": rng.standard_normal(5).astype(np.float16),
              "scalar": np.array(2.5, dtype=np.float32)}
    path = tmp_path / "pkg.safetensors"
    save_file(arrays, path, metadata={"format": "pt"})
    doc = open_document(path)
    assert doc.kind == "safetensors" and doc.meta == {"metadata": {"format": "pt"}}
    # In the header's order (the package's: by dtype, then name), "<name>/diff" a diff.
    length = int.from_bytes(path.read_bytes()[:8], "little")
    order = [k for k in json.loads(path.read_bytes()[8:8 + length]) if k not in ("__metadata__", "conv.weight/diff")]
    assert doc.names() == order and sorted(order) == ["conv.weight", "fc.bias", "half", "scalar"]
    by = {e.name: e for e in doc.entries}
    assert by["conv.weight"].has_diff and not by["fc.bias"].has_diff
    assert by["half"].dtype == np.float16 and by["scalar"].shape == ()
    conv = by["conv.weight"].blob()
    assert np.array_equal(conv.cpu_data().reshape(4, 3, 2, 2), arrays["conv.weight"])
    assert np.array_equal(conv.cpu_diff().reshape(4, 3, 2, 2), arrays["conv.weight/diff"])
    assert np.array_equal(by["half"].blob().cpu_data(), arrays["half"].astype(np.float32))
    # float32 and float64 are views of the mapped file, not copies.
    for entry in (by["conv.weight"], by["fc.bias"]):
        base = entry.blob().cpu_data()
        while isinstance(base, np.ndarray):
            base = base.base
        assert isinstance(base, (memoryview, __import__("mmap").mmap)), type(base)
    # Every command reads it.
    for args in (["info"], ["info", "--stats"], ["norm"], ["show", "--blob", "conv.weight"]):
        result = run_blobtool(*args, path, text=True)
        assert (result.returncode, result.stderr) == (0, ""), (args, result.stderr)
    assert run_blobtool("compare", path, path).returncode == 0


def test_integer_and_bf16_tensors_load_only_with_a_cast(tmp_path):
    path = tmp_path / "ints.safetensors"
    save_file({"bn.num_batches_tracked": np.array(7, dtype=np.int64), "w": np.ones(3, np.float32)}, path)
    result = run_blobtool("info", "--json", path, text=True)
    assert result.returncode == 0
    assert [b["dtype"] for b in json.loads(result.stdout)["blobs"]] == ["int64", "float32"]
    result = run_blobtool("norm", path, text=True)
    assert result.returncode == 3
    assert result.stderr.startswith(f"blobtool: {path}: at byte ")
    assert result.stderr.endswith("tensor 'bn.num_batches_tracked' holds int64 values; blobs are float32 or "
                                  "float64 (blobtool convert --float or --double reads it, into a file every "
                                  "command reads)\n")
    out = tmp_path / "f.npz"
    assert run_blobtool("convert", "--double", path, "-o", out).returncode == 0
    assert float(np.load(out)["bn.num_batches_tracked"]) == 7.0
    # BF16 (which the numpy side of the package cannot write): the high halves of float32 values.
    values = np.array([1.5, -2.25, 2.0**100, 0.0], dtype=np.float32)
    bits = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    header = json.dumps({"b": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}).encode()
    (tmp_path / "bf.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bits)
    entry = open_document(tmp_path / "bf.safetensors").entries[0]
    assert entry.dtype.name == "bfloat16" and entry.nbytes == 8
    with pytest.raises(BlobToolError, match="holds bfloat16 values"):
        entry.blob()
    blob = open_document(tmp_path / "bf.safetensors", npy_cast=np.float32).entries[0].blob()
    assert np.array_equal(blob.cpu_data(), values)


# -- bad input ---------------------------------------------------------------------------------

def st(header, data: bytes = b"", *, length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


F4 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
BAD = [
    ("short", b"\x05\x00\x00", "truncated at byte 0: a safetensors file starts with an 8-byte header length, "
                               "3 bytes remain"),
    ("forged header length", st({"a": F4}, bytes(8), length=2**40),
     "truncated at byte 0: the header length declares 1099511627776 bytes, 69 remain"),
    ("header not JSON", st(b'{"a": {"dtype": "F32",, }}'), "at byte 30: the header is not JSON: Expecting "
                                                            "property name enclosed in double quotes"),
    ("header not UTF-8", st(b'{"\xff": 1}'), "at byte 10: the header is not UTF-8 text"),
    ("header a list", st(b"[1, 2]"), "at byte 8: the header is a JSON list, expected an object of tensors"),
    ("key twice", st(b'{"a": {}, "a": {}}'), "at byte 8: the header is not valid: key 'a' appears twice"),
    ("NaN in header", st(b'{"a": NaN}'), "at byte 8: the header is not valid: NaN is not a JSON number"),
    ("offsets outside the file", st({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8)),
     "at byte 70: tensor 'a': data_offsets [0, 16] end past the file: the data holds 8 bytes"),
    ("offsets overlapping", st({"a": F4, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12)),
     "at byte 135: tensor 'b' data_offsets [4, 12] overlaps the tensor before it (expected it to begin at 8)"),
    ("offsets leaving a gap", st({"a": F4, "b": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}},
                                 bytes(16)),
     "at byte 144: tensor 'b' data_offsets [12, 16] leaves a gap before it (expected it to begin at 8)"),
    ("bytes after the tensors", st({"a": F4}, bytes(12)),
     "at byte 77: the tensors end at byte 77, the file at byte 81: the data holds bytes no tensor covers"),
    ("unknown dtype", st({"a": {"dtype": "C128", "shape": [2], "data_offsets": [0, 2]}}, bytes(2)),
     "at byte 8: tensor 'a': unknown dtype 'C128'; blobtool reads F64, F32, F16, I64, I32, I16, I8, U64, "
     "U32, U16, U8, BOOL, BF16"),
    ("negative dimension", st({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}),
     "at byte 8: tensor 'a': shape [-1] is not a list of at most 32 non-negative integers"),
    ("shape and offsets disagree", st({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)),
     "at byte 69: tensor 'a': shape [3] of F32 needs 12 bytes, data_offsets [0, 8] hold 8"),
    ("field missing", st({"a": {"dtype": "F32", "shape": [2]}}),
     "at byte 8: tensor 'a': expected an object with dtype, shape and data_offsets"),
    ("metadata not strings", st({"__metadata__": {"k": 1}}),
     "at byte 8: __metadata__ must map strings to strings"),
    ("diff of another size", st({"a": F4, "a/diff": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}},
                                bytes(12)),
     "at byte 144: tensor 'a/diff' has 1 values, 'a' has 2"),
]


@pytest.mark.parametrize("name, data, message", BAD, ids=[b[0] for b in BAD])
def test_bad_files_are_refused_with_one_line(tmp_path, name, data, message):
    with pytest.raises(BlobToolError) as info:
        open_document(io.BytesIO(data), "safetensors")
    assert str(info.value) == "<stream>: " + message
    # The oracle refuses them too (so blobtool is not stricter than the format).
    if name not in ("metadata not strings", "diff of another size"):
        with pytest.raises(SafetensorError):
            load(data)
    # On the command line (sniffed where the signature allows it): exit 3, one line, nothing written.
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    result = run_blobtool("convert", "--kind", "safetensors", path, "-o", tmp_path / "out.npz", text=True)
    assert result.returncode == 3
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"blobtool: {path}: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.safetensors"]


def test_headers_of_too_many_values_are_refused_before_parsing():
    many = b"{" + b",".join(b'"%d":[]' % i for i in range(140_000)) + b"}"
    with pytest.raises(BlobToolError, match=f"the header holds more JSON values than {MAX_BLOBS} tensors need"):
        open_document(io.BytesIO(st(many)), "safetensors")


def test_sniffing_tells_it_from_the_other_formats(tmp_path):
    data = save({"a": np.ones(2, np.float32)})
    assert open_document(io.BytesIO(data)).kind == "safetensors"
    for seed in fc.generated_seeds():
        assert open_document(io.BytesIO(seed.data)).kind == seed.kind


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _with_signature_at(offset: int, dtype, before: int) -> np.ndarray:
    """Values whose bytes, placed `before` bytes into a file, hold HDF5's signature at file offset `offset`."""
    raw = bytearray(2048)
    at = offset - before
    raw[at:at + len(HDF5_SIGNATURE)] = HDF5_SIGNATURE
    return np.frombuffer(bytes(raw), dtype).copy()


def test_a_header_at_byte_0_wins_over_hdf5s_signature_deeper(tmp_path):
    import h5py

    # safetensors: the tensor's bytes hold the signature at file offset 1024.
    probe = save({"w": np.zeros(512, np.float32)})
    before = 8 + struct.unpack("<Q", probe[:8])[0]
    values = _with_signature_at(1024, np.float32, before)
    save_file({"w": values}, tmp_path / "sig.safetensors")
    data = (tmp_path / "sig.safetensors").read_bytes()
    assert data[1024:1032] == HDF5_SIGNATURE
    result = run_blobtool("info", "--json", tmp_path / "sig.safetensors", text=True)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert (record["kind"], record["blobs"][0]["name"], record["blobs"][0]["shape"]) == ("safetensors", "w", [512])
    out = tmp_path / "back.safetensors"
    assert run_blobtool("convert", tmp_path / "sig.safetensors", "-o", out).returncode == 0
    assert load_file(out)["w"].tobytes() == values.tobytes()
    # .npy: the data holds it at 512 (numpy's header takes the first 128 bytes).
    values = _with_signature_at(512, np.float32, 128)
    np.save(tmp_path / "sig.npy", values)
    assert (tmp_path / "sig.npy").read_bytes()[512:520] == HDF5_SIGNATURE
    record = json.loads(run_blobtool("info", "--json", tmp_path / "sig.npy", text=True).stdout)
    assert record["kind"] == "npy"
    # A Caffe blob's values, and an .npz member's, holding it at 512.
    before = blob_bytes(np.zeros(512, np.float32)).index(bytes(2048))
    blob = blob_bytes(_with_signature_at(512, np.float32, before))
    assert blob[512:520] == HDF5_SIGNATURE
    (tmp_path / "sig.pb").write_bytes(blob)
    record = json.loads(run_blobtool("info", "--json", tmp_path / "sig.pb", text=True).stdout)
    assert record["kind"] == "blob" and record["blobs"][0]["shape"] == [512]
    before = npz_bytes({"w": np.zeros(512, np.float32)}).index(bytes(2048))
    zipped = npz_bytes({"w": _with_signature_at(1024, np.float32, before)})
    assert zipped[1024:1032] == HDF5_SIGNATURE
    (tmp_path / "sig.npz").write_bytes(zipped)
    assert open_document(tmp_path / "sig.npz").kind == "npz"
    # Real HDF5 files after a user block still sniff as HDF5, in both superblock layouts.
    for libver in ("earliest", "latest"):
        path = tmp_path / f"ub_{libver}.caffemodel.h5"
        with h5py.File(path, "w", userblock_size=1024, libver=libver) as f:
            f.create_dataset("data/conv1/0", data=np.ones((2, 3), np.float32))
        assert path.read_bytes()[1024:1032] == HDF5_SIGNATURE
        record = json.loads(run_blobtool("info", "--json", path, text=True).stdout)
        assert (record["kind"], record["format"], record["blobs"][0]["name"]) == ("net", "hdf5", "conv1/0")


def test_names_utf8_cannot_hold_are_refused_or_escaped(tmp_path):
    # JSON may spell a lone surrogate; UTF-8 cannot hold it, so no safetensors header can.
    src = tmp_path / "sur.safetensors"
    src.write_bytes(st(b'{"\\udc80":' + json.dumps(F4).encode() + b"}", np.ones(2, np.float32).tobytes()))
    assert run_blobtool("info", src).returncode == 0
    out = tmp_path / "out.safetensors"
    result = run_blobtool("convert", src, "-o", out, text=True)
    assert result.returncode == 3
    assert result.stderr == (f"blobtool: {src}: blob name '\\udc80' holds a lone surrogate (surrogates not "
                             "allowed), which a safetensors header (UTF-8 JSON) cannot hold\n")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["sur.safetensors"]
    # Nor can a zip member's name: the same bad input for an .npz output.
    npz = tmp_path / "out.npz"
    result = run_blobtool("convert", src, "-o", npz, text=True)
    assert (result.returncode, result.stderr) == (3, f"blobtool: {src}: blob name '\\udc80' is not valid Unicode "
                                                     "text (surrogates not allowed), which a zip member name cannot hold\n")
    assert not npz.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["sur.safetensors"]
    # Metadata blobtool writes: the input's file name (bytes that are not UTF-8) and a scheme
    # name read with a lone surrogate are written with backslash escapes.
    odd = os.path.join(os.fsencode(tmp_path), b"n\xffame.safetensors")
    with open(odd, "wb") as f:
        f.write(st({"__metadata__": {"names": "\ud800x"}, "w": F4}, np.ones(2, np.float32).tobytes()))
    result = run_blobtool("convert", os.fsdecode(odd), "-o", out, text=True)
    assert (result.returncode, result.stderr) == (0, "")
    with safe_open(out, "np") as f:
        meta = f.metadata()
        assert f.get_tensor("w").tolist() == [1.0, 1.0]
    assert (meta["source"], meta["names"]) == ("n\\xffame.safetensors", "\\ud800x")


# -- writing: atomic, streamed ------------------------------------------------------------------

def test_a_failed_write_leaves_the_earlier_file(tmp_path):
    src = tmp_path / "v.pb"
    src.write_bytes(SEEDS["vector"].data)
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"earlier")
    result = run_blobtool("convert", src, "-o", out, "--blob", "nothing", text=True)
    assert result.returncode == 3 and out.read_bytes() == b"earlier"
    # A write that fails on the way (file-size limit): exit 5, the earlier file intact, no temporary file.
    import resource

    limited = run_blobtool("convert", src, "-o", out, text=True,
                           preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100)))
    assert limited.returncode == 5, limited.stderr
    assert "cannot write" in limited.stderr
    assert out.read_bytes() == b"earlier"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.safetensors", "v.pb"]


def test_the_writer_streams_in_bounded_memory(tmp_path):
    # A 64 MiB blob: traced allocations while writing stay a few chunk sizes,
    # far below the blob (the package's save_file would hold it all, twice).
    n = 16 << 20
    path = tmp_path / "big.pb"
    from blobtool.formats.caffe import wire

    with open(path, "wb") as f:
        f.write(blob_bytes(shape=[n]) + wire.len_field_header(5, 4 * n))
        chunk = np.arange(1 << 20, dtype=np.float32).tobytes()
        for _ in range(16):
            f.write(chunk)
    doc = open_document(path)
    tracemalloc.start()
    try:
        write(doc, None, tmp_path / "big.safetensors", precision="double", release=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20, peak
    with safe_open(tmp_path / "big.safetensors", "np") as f:
        got = f.get_tensor("0")
    assert got.dtype == np.float64 and got.size == n and got[(1 << 20) + 5] == 5.0


def test_names_that_collide_with_a_diff_are_refused(tmp_path):
    path = write_npz(tmp_path / "c.npz", {"a": np.ones(2), "a/diff": np.ones(2)})
    doc = open_document(path)
    entries = [Entry("a/diff", (2,), "shape", np.dtype(np.float64), False, _blob=doc.entries[0].blob())]
    doc2 = Document(doc.path, doc.kind, doc.source, entries=doc.entries + entries)
    with pytest.raises(BlobToolError, match="two arrays would be named 'a/diff' in the .safetensors"):
        write(doc2, None, tmp_path / "c.safetensors")
    assert not (tmp_path / "c.safetensors").exists()


def test_net_with_diffs_and_npz_metadata(tmp_path):
    net = write_net(tmp_path / "n.caffemodel", "new", [Layer("ip", "InnerProduct", [np.ones((2, 3)), np.ones(2)],
                                                             diffs=[np.full((2, 3), 0.5), None])])
    out = tmp_path / "n.safetensors"
    assert run_blobtool("convert", net, "-o", out).returncode == 0
    got = load_file(out)
    assert sorted(got) == ["ip/0", "ip/0/diff", "ip/1"]
    assert np.array_equal(got["ip/0/diff"], np.full((2, 3), 0.5, np.float32))
    (tmp_path / "z.npz").write_bytes(npz_bytes({"w": np.ones(2, np.float32)}))
    assert run_blobtool("convert", tmp_path / "z.npz", "-o", tmp_path / "z.safetensors").returncode == 0
    with safe_open(tmp_path / "z.safetensors", "np") as f:
        assert f.metadata()["source_kind"] == "npz"
    assert os.path.getsize(tmp_path / "z.safetensors") > 8


def test_written_back_as_itself_keeping_its_naming(tmp_path):
    net = write_net(tmp_path / "n.caffemodel", "new", [Layer("ip", "InnerProduct", [np.ones((2, 3)), np.ones(2)],
                                                             diffs=[np.full((2, 3), 0.25), None])])
    torch_named = tmp_path / "t.safetensors"
    assert run_blobtool("convert", "--names", "torch", net, "-o", torch_named).returncode == 0
    # scale, with no extension to go by: the input's own format (same), its naming scheme kept.
    scaled = tmp_path / "scaled"
    assert run_blobtool("scale", torch_named, "2", "-o", scaled).returncode == 0
    with safe_open(scaled, "np") as f:
        assert f.metadata()["names"] == "torch" and f.metadata()["source_kind"] == "safetensors"
        assert np.array_equal(f.get_tensor("ip.weight"), np.full((2, 3), 2.0, np.float32))
    # update: data -= diff, on a safetensors file with "<name>/diff".
    plain = tmp_path / "p.safetensors"
    assert run_blobtool("convert", net, "-o", plain).returncode == 0
    stepped = tmp_path / "u.safetensors"
    assert run_blobtool("update", "--blob", "ip/0", plain, "-o", stepped).returncode == 0
    got = load_file(stepped)
    assert sorted(got) == ["ip/0", "ip/0/diff"]
    assert np.array_equal(got["ip/0"], np.full((2, 3), 0.75, np.float32))


def test_a_tensor_named_like_a_diff_of_a_diff_stays_a_blob(tmp_path):
    # "x/diff/diff" beside "x" and "x/diff": the first diff pairs with x, the second is a blob of its own.
    arrays = {"x": np.arange(3, dtype=np.float32), "x/diff": np.ones(3, np.float32),
              "x/diff/diff": np.full(3, 7, np.float32)}
    save_file(arrays, str(tmp_path / "d.safetensors"))
    doc = open_document(tmp_path / "d.safetensors")
    assert [(e.name, e.has_diff) for e in doc.entries] == [("x", True), ("x/diff/diff", False)]
    assert doc.entries[1].blob().cpu_data().tolist() == [7, 7, 7]
