"""Every reader under damaged and forged input: only BlobToolError, fast, within memory.

The cases start from valid files (made with the protobuf library, and the
real Caffe files beside the checkout) and damage them (see fuzzcases.py).
Each case opens the input (sniffed, and forced to the seed's kind), builds
every blob and takes its norms; it fails when anything but BlobToolError
escapes (a numpy warning included: it would be a second stderr line), when it
takes over fuzzcases.TIME_LIMIT_S, or when traced allocations peak above
fuzzcases.memory_bound(input size) (8x the input plus 1 MiB; see there why).

The hypothesis runs are derandomized, so CI tests the same cases every time;
tests/helpers/fuzz_long.py explores further. BLOBTOOL_FUZZ_EXAMPLES sets the number of
examples per reader (default 300).
"""

from __future__ import annotations

import io
import os
import time
import tracemalloc
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fuzzcases as fc
from blobtool import BlobToolError, load, load_all
from blobtool.formats.caffe import wire
from blobtool._pb import blobtool_caffe_pb2 as pb
from blobtool.formats import MAX_BLOBS, open_document
from blobtool.formats.caffe import MAX_LAYERS
from builders import REFUSES_BAD_UTF8, blob_bytes, npy_bytes, npy_header_bytes, ternary_fork_fields
from runner import run_blobtool

# Fuzzing: long (a minute and more in all); `pytest -m "not slow"` leaves it out, CI runs it.
pytestmark = pytest.mark.slow

SEEDS = fc.generated_seeds()
SEED_IDS = [s.name for s in SEEDS]

FUZZ_SETTINGS = fc.fuzz_settings()


@pytest.fixture(autouse=True, scope="module")
def imported_beforehand():
    """Every blobtool module imported, and the sums' scratch buffers made, before any case is measured.

    blobtool imports a format's module (and sniff.py) when a file first
    needs it, and the kernels keep a scratch buffer per thread (4 MiB at
    most) made on first use: either, landing inside a measured case, counts
    against that input's memory bound. Other test files do both before this
    one when the whole suite runs; alone, this file must pass too.
    """
    import importlib
    import pkgutil

    import blobtool

    for module in pkgutil.walk_packages(blobtool.__path__, "blobtool."):
        if module.name in ("blobtool.__main__", "blobtool.engine.device"):  # runs the command; imports CuPy
            continue
        try:
            importlib.import_module(module.name)
        except ImportError:  # an optional dependency (h5py) missing: that reader is skipped anyway
            pass
    # A blob larger than a group of chunks, data and diff: the scratch buffers at their largest.
    values = np.ones(1 << 20, np.float32)
    fc.read_everything(blob_bytes(values, values), None)


@pytest.fixture
def tracing():
    tracemalloc.start()
    yield
    tracemalloc.stop()


def fuzz_seed(seed: fc.Seed) -> None:
    lay = fc.layout_of(seed)

    @FUZZ_SETTINGS
    @given(st.data())
    def run(data):
        pick = fc.hypothesis_picker(data)
        mutated = fc.mutate(seed, lay, pick, data.draw(st.integers(1, 3)))
        for kind in (None, seed.kind):
            if fc.check_case(mutated, kind).error is None:
                fc.check_rewrite(mutated, kind)

    run()


# -- the harness itself --------------------------------------------------------------------

def test_seeds_are_valid_and_cover_every_reader():
    # Every seed reads cleanly as its own kind (else the mutations test nothing).
    for seed in SEEDS:
        doc = open_document(io.BytesIO(seed.data))
        assert doc.kind == seed.kind, seed.name
        assert doc.entries or doc.format == "prototxt", seed.name  # a text definition holds no blobs
        assert doc.layers or doc.kind != "net", seed.name
        assert fc.check_case(seed.data).error is None, seed.name
    kinds = {s.kind for s in SEEDS}
    assert kinds == {"blob", "vector", "net", "solverstate", "npy", "npz", "pt"}
    # The net seeds hold the three layer formats: layer (100), V1 layers (2), V0 inside V1.
    numbers = {s.name: {f.number for f in wire.iter_fields(memoryview(s.data), 0, len(s.data))}
               for s in SEEDS if s.kind == "net" and not s.name.startswith("prototxt")}
    assert 100 in numbers["net_layer"] and 2 not in numbers["net_layer"]
    assert 2 in numbers["net_v1"] and 2 in numbers["net_v0"]
    v0 = load_all(io.BytesIO(dict(zip(SEED_IDS, SEEDS))["net_v0"].data))
    assert list(v0) == ["conv1/0", "conv1/1", "ip1/0", "ip1/1"]
    # Repeated layer names, and unknown fields inside blobs that a rewrite keeps.
    seeds = dict(zip(SEED_IDS, SEEDS))
    assert open_document(io.BytesIO(seeds["net_repeated_names"].data)).names() == [
        "a/0", "a#3/0", "a#2/0", "layer3#2/0", "layer3/0"]
    for name in ("blob_unknown", "vector_unknown"):
        assert all(e.record.unknown == fc.BLOB_UNKNOWN for e in open_document(io.BytesIO(seeds[name].data)).entries)
        assert fc.check_rewrite(seeds[name].data)
    # The forks' payloads: NVIDIA's raw FLOAT16 data, ditcaffe's half_data.
    for name in ("nvidia_raw", "ditcaffe_half"):
        entry = open_document(io.BytesIO(dict(zip(SEED_IDS, SEEDS))[name].data)).entries[0]
        assert entry.dtype == np.float16 and entry.has_diff
    # A fork that reuses field 10 for packed floats beside Caffe's data: read as BVLC Caffe reads
    # it, its fields kept on a rewrite.
    entry = open_document(io.BytesIO(seeds["ternary_fork"].data)).entries[0]
    assert entry.dtype == np.float32 and not entry.has_diff
    assert [n for n, _ in entry.record.kept_fork_fields] == [10, 11]
    assert entry.record.unknown == ternary_fork_fields()
    assert fc.check_rewrite(seeds["ternary_fork"].data)


@pytest.mark.parametrize("failure, expected", [
    ("exception", "ValueError escaped"),
    ("warning", "RuntimeWarning escaped"),
    ("slow", "took"),
    ("memory", "allocated"),
])
def test_check_case_catches_each_broken_promise(monkeypatch, failure, expected):
    import time
    import warnings

    def broken(data, kind):
        if failure == "exception":
            raise ValueError("not a BlobToolError")
        if failure == "warning":
            warnings.warn("overflow", RuntimeWarning)
        if failure == "slow":
            time.sleep(fc.TIME_LIMIT_S + 0.05)
        if failure == "memory":
            hog = np.ones(fc.memory_bound(len(data)) // 8 + 1024)
            del hog

    monkeypatch.setattr(fc, "read_everything", broken)
    with pytest.raises(fc.FuzzFailure, match=expected):
        fc.check_case(b"\x08\x01")


def test_the_harness_catches_shared_names_and_lossy_rewrites(monkeypatch):
    import blobtool.formats.caffe.blobwrite
    import blobtool.formats.caffe.containers

    seeds = dict(zip(SEED_IDS, SEEDS))
    # Names made up as they once were: a, a, a#2 gave a#2 twice.
    monkeypatch.setattr(blobtool.formats.caffe.containers, "unique_names",
                        lambda names: [n or "layer" for n in names[:1]] + [
                            f"{n}#2" if n in names[:k] else n for k, n in enumerate(names) if k])
    with pytest.raises(fc.FuzzFailure, match="two blobs share a name"):
        fc.check_case(seeds["net_repeated_names"].data)
    monkeypatch.undo()
    # A rewrite that drops the unknown fields inside a blob, or writes integers as float32.
    real = blobtool.formats.caffe.blobwrite.resolve_form
    monkeypatch.setattr(blobtool.formats.caffe.containers, "resolve_form",
                        lambda *a, **k: {**real(*a, **k), "unknown": b""})
    with pytest.raises(fc.FuzzFailure, match="lost unknown fields"):
        fc.check_rewrite(seeds["blob_unknown"].data)
    monkeypatch.setattr(blobtool.formats.caffe.containers, "resolve_form",
                        lambda *a, **k: {**real(*a, **k), "precision": "float", "encoding": None})
    with pytest.raises(fc.FuzzFailure, match="changed"):
        fc.check_rewrite(seeds["vector_unknown"].data)


def test_check_case_accepts_blobtoolerror_and_reports_it():
    outcome = fc.check_case(b"\xff" * 12)
    assert outcome.error is not None and outcome.error.startswith("<stream>: ")


# -- the bounded fuzz run, per reader ---------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS, ids=SEED_IDS)
def test_fuzz_generated(seed):
    fuzz_seed(seed)


@pytest.mark.parametrize("name", sorted(fc.REALWORLD_KINDS))
def test_fuzz_realworld(realworld, name):
    (seed,) = [s for s in fc.realworld_seeds(realworld) if s.name == name]
    fuzz_seed(seed)


# -- Caffe's HDF5 snapshots, read through h5py -----------------------------------------------------

def _hdf5_seeds():
    pytest.importorskip("h5py", reason="h5py (the hdf5 extra) is not installed")
    seeds = fc.hdf5_seeds()
    for seed in seeds:  # h5py's own imports happen here, not inside a traced case
        fc.read_everything(seed.data, None)
    return seeds


HDF5_IDS = ["net_float_diff", "net_double_shared", "solverstate", "net_other_storage"]


def test_hdf5_seeds_are_valid():
    seeds = _hdf5_seeds()
    assert [s.kind for s in seeds] == ["net", "net", "solverstate", "net"]
    for seed in seeds:
        doc = open_document(io.BytesIO(seed.data))
        assert (doc.kind, doc.format) == (seed.kind, "hdf5") and doc.entries
        assert fc.check_case(seed.data).error is None
    assert open_document(io.BytesIO(seeds[1].data)).names() == ["ip1/0", "ip1/1", "ip2/1"]  # ip2/0 is shared
    assert [str(e.dtype) for e in open_document(io.BytesIO(seeds[3].data)).entries] == \
        ["float32", "float32", "float16", "float64"]


@pytest.mark.parametrize("index", range(len(HDF5_IDS)), ids=HDF5_IDS)
def test_fuzz_hdf5_generated(index):
    fuzz_seed(_hdf5_seeds()[index])


def test_fuzz_hdf5_realworld(realworld):
    _hdf5_seeds()
    (seed,) = fc.realworld_hdf5_seeds(realworld)
    fuzz_seed(seed)


@pytest.mark.parametrize("index", range(len(HDF5_IDS)), ids=HDF5_IDS)
def test_hdf5_truncated_at_every_boundary_and_every_address_forged(index):
    assert _every_cut_and_forged_length(_hdf5_seeds()[index], fc.HUGE_VALUES) > 8


HDF5_REFUSED = {"h5_refused_external": "HDF5 /data/ip1/0: keeps its values in another file ('/dev/zero')",
                "h5_refused_virtual": "HDF5 /data/ip1/0: is a virtual dataset",
                "h5_refused_external_link": "HDF5 /data/ip1/0: is an external link",
                "h5_refused_soft_link": "HDF5 /data/ip1/0: is a soft link",
                "h5_refused_not_utf8": "HDF5 /data/ip\\xff: a name that is not UTF-8",
                "h5_refused_external_iter": "HDF5 /iter: keeps its values in another file ('/dev/zero')"}


def _hdf5_refused_seeds():
    _hdf5_seeds()
    return {seed.name: seed for seed in fc.hdf5_refused_seeds()}


@pytest.mark.parametrize("name", sorted(HDF5_REFUSED))
def test_fuzz_hdf5_that_names_other_files(name):
    # Refused whole, before a value is read; mutated, never followed either (a case that read
    # /dev/zero would blow the memory bound, one that crashed HDF5 would end the run).
    seed = _hdf5_refused_seeds()[name]
    for kind in (None, seed.kind):
        assert HDF5_REFUSED[name] in fc.check_case(seed.data, kind).error
    fuzz_seed(seed)


def test_fuzz_hdf5_damage_that_crashes_or_hangs_hdf5_is_a_refusal():
    # One byte of the virtual-dataset seed made chunked kills HDF5 with SIGSEGV; a global heap object
    # whose size runs past its collection makes it loop forever. Both run in a child process that is
    # reaped (a signal) or stopped (BLOBTOOL_HDF5_SECONDS, 1 s under the fuzzers): one line, exit 3.
    data = _hdf5_refused_seeds()["h5_refused_virtual"].data
    crashed = []
    for at in (at for at, byte in enumerate(data) if byte == 3):
        damaged = bytearray(data)
        damaged[at] = 2
        outcome = fc.check_case(bytes(damaged), "net")  # a FuzzFailure past the bounds or on a second line
        crashed += [at] if outcome.error and "HDF5's library crashed (SIGSEGV)" in outcome.error else []
    assert crashed
    loops = bytearray(data)
    loops[data.find(b"GCOL") + 25] = 1
    for kind in (None, "net"):
        outcome = fc.check_case(bytes(loops), kind)
        assert "HDF5's library did not finish reading the file's structure in 1 s" in outcome.error, outcome


# -- exhaustive: every field boundary, every length prefix ------------------------------------

def _every_cut_and_forged_length(seed: fc.Seed, huge_values) -> int:
    lay = fc.layout_of(seed)
    cases = 0
    for cut in lay.boundaries:
        for kind in (None, seed.kind):
            fc.check_case(seed.data[:cut], kind)
            cases += 1
    for start, end in lay.lengths:
        for value in huge_values:
            if end - start in (2, 4) and (seed.kind in ("npy", "npz", "pt") or seed.data.startswith(fc.HDF5_SIGNATURE)):
                forged = (value & ((1 << 8 * (end - start)) - 1)).to_bytes(end - start, "little")
            else:
                forged = wire.encode_varint(value)
            fc.check_case(seed.data[:start] + forged + seed.data[end:], seed.kind)
            cases += 1
    return cases


@pytest.mark.parametrize("seed", SEEDS, ids=SEED_IDS)
def test_truncated_at_every_field_boundary_and_every_length_forged(seed):
    assert _every_cut_and_forged_length(seed, fc.HUGE_VALUES) > 8


@pytest.mark.parametrize("name", sorted(fc.REALWORLD_KINDS))
def test_real_file_truncated_at_every_field_boundary_and_every_length_forged(realworld, name):
    (seed,) = [s for s in fc.realworld_seeds(realworld) if s.name == name]
    # Three values per length prefix keep this to a few seconds on the 1.7 MB files.
    assert _every_cut_and_forged_length(seed, (2**31 - 1, 2**63 - 1, 2**64 - 1)) > 8


# -- inputs the long run (tests/helpers/fuzz_long.py) found -----------------------------------------------

FOUND = {
    # An .npy header that parses only through numpy's Python 2 fallback, which warned.
    "npy header needing numpy's Python 2 fallback":
        "k05VTVBZAQB2AHsnZGVzY3InOiAnPGY0JywgJ2ZvcnRyYW5fb3JkZXInOiBGYWxzZSwgJ3NoYXBlJzogKDMsIDQpLCB9ICAgICAgICAg"
        "ICAgICAgICAgICAgICAgICAgICAgICAgICAgIAogICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAOICAg"
        "ICAgICAgICAgICAgICAgICAgICAgICAgICAgCg==",
}


@pytest.mark.parametrize("name", FOUND)
def test_inputs_found_by_the_long_run(name):
    import base64
    data = base64.b64decode(FOUND[name])
    for kind in (None, "npy", "blob", "net"):
        fc.check_case(data, kind)


# -- hostile shapes and lengths: refused, with their message, before allocating ----------------

def _shape_message(dims_field: bytes) -> bytes:
    return wire.len_field_header(7, len(dims_field)) + dims_field


def _nested_groups(depth: int) -> bytes:
    return wire.encode_tag(2, wire.SGROUP) * depth + wire.encode_tag(2, wire.EGROUP) * depth


DATA4 = wire.len_field_header(5, 4) + bytes(4)
E64 = 2**63 - 1

HOSTILE = [
    # (name, bytes, the message after "<stream>: ", or its start when it ends with "(")
    ("payload length past the end", wire.len_field_header(5, 2**31 - 1) + bytes(4),
     "truncated at byte 0: field 5 (data) declares 2147483647 bytes, 4 remain"),
    ("payload length 2**64 - 1", blob_bytes(shape=[1]) + wire.len_field_header(5, 2**64 - 1) + bytes(4),
     "truncated at byte 5: field 5 (data) declares 18446744073709551615 bytes, 4 remain"),
    ("layer length past the end", fc.one_layer_net(blob_bytes([1.0]))[:-3],
     "truncated at byte 0: field 100 declares 33 bytes, 30 remain"),
    ("layer's blob length forged", fc.one_layer_net(blob_bytes([1.0])) + fc.one_layer_net(blob_bytes([1.0]), forge_blob_length=2**62),
     "truncated at byte 59: field 7 (blobs) declares 4611686018427387904 bytes, 11 remain"),
    ("dims whose product overflows int64", blob_bytes([1.0, 2.0], shape=[2**62, 2**62]),
     "at byte 10: field 7 (shape): invalid blob shape: shape (4611686018427387904, 4611686018427387904) "
     "spans 85070591730234615865843651857942052864 bytes of float32, more than the 9223372036854775807 "
     "an array can address"),
    ("overflowing dims around a zero", blob_bytes(shape=[E64, 0, E64]),
     "at byte 0: field 7 (shape): invalid blob shape: shape (9223372036854775807, 0, 9223372036854775807) "
     "spans 340282366920938463389587631136930004996 bytes of float32, more than the 9223372036854775807 "
     "an array can address"),
    ("dims that disagree with the payload", blob_bytes([1.0, 2.0], shape=[1000, 1000]),
     "at byte 0: field 5 (data): data holds 2 values, shape (1000, 1000) needs 1000000"),
    ("a huge shape and no data", blob_bytes(shape=[2**40, 2**20]),
     "at byte 0: no data: data holds 0 values, shape (1099511627776, 1048576) needs 1152921504606846976"),
    ("33 axes", blob_bytes([1.0], shape=[1] * 33),
     "at byte 6: field 7 (shape): invalid blob shape: a blob has at most 32 axes, got 33"),
    ("a million axes", DATA4 + _shape_message(wire.len_field_header(1, 10**6) + b"\x01" * 10**6),
     "at byte 6: field 7 (shape): invalid blob shape: a blob has at most 32 axes, got 1000000"),
    ("negative legacy num", blob_bytes([1.0], shape=(-1, 1, 1, 1), layout="legacy"),
     "at byte 0: field 1 (num): invalid blob shape: dimension 0 is negative (-1) in shape (-1, 1, 1, 1)"),
    ("negative legacy width -2**31", blob_bytes([1.0], shape=(1, 1, 1, -2**31), layout="legacy"),
     "at byte 6: field 4 (width): invalid blob shape: dimension 3 is negative (-2147483648) "
     "in shape (1, 1, 1, -2147483648)"),
    ("negative shape dim", blob_bytes([1.0], shape=[4, -1]),
     "at byte 6: field 7 (shape): invalid blob shape: dimension 1 is negative (-1) in shape (4, -1)"),
    ("tag varint over 10 bytes", b"\x80" * 10 + b"\x01", "at byte 0: field tag longer than 10 bytes"),
    ("length varint over 10 bytes", b"\x2a" + b"\xff" * 10 + b"\x01",
     "at byte 1: length of field 5 (data) longer than 10 bytes"),
    ("value varint over 10 bytes", b"\x08" + b"\x80" * 10 + b"\x00",
     "at byte 1: field 1 (num) longer than 10 bytes"),
    ("varint over 64 bits", b"\x08" + b"\xff" * 9 + b"\x7f", "at byte 1: field 1 (num) overflows 64 bits"),
    ("start-group wire type", DATA4 + wire.encode_tag(7, wire.SGROUP),
     "at byte 6: field 7 (shape) uses the group wire type 3, which Caffe's schema never writes"),
    ("end-group wire type", wire.encode_tag(1, wire.EGROUP),
     "at byte 0: field 1 (num) uses the group wire type 4, which Caffe's schema never writes"),
    ("group inside a net's layer", fc.one_layer_net(blob_bytes([1.0])) + fc.one_layer_net(b"", extra=wire.encode_tag(9, wire.SGROUP)),
     "at byte 59: field 9 uses the group wire type 3, which Caffe's schema never writes"),
    ("group inside a solver state's history blob",
     pb.SolverState(iter=1, learned_net="a", current_step=1).SerializeToString() + wire.len_field_header(3, 1)
     + wire.encode_tag(5, wire.SGROUP),
     "at byte 9: field 5 (data) uses the group wire type 3, which Caffe's schema never writes"),
    # Inside BlobShape, protobuf parses and refuses groups nested past its recursion limit.
    ("groups nested 100000 deep in a shape", DATA4 + wire.len_field_header(7, 200000) + _nested_groups(100000),
     "at byte 6: field 7 (shape): invalid contents ("),
    ("groups nested 100000 deep in a net's input_shape",
     fc.one_layer_net(blob_bytes([1.0])) + wire.len_field_header(8, 200000) + _nested_groups(100000),
     "at byte 0: invalid NetParameter fields ("),
]


@pytest.mark.parametrize("name, data, message", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_input_is_refused_before_allocating(tracing, name, data, message):
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    with pytest.raises(BlobToolError) as info:
        load_all(io.BytesIO(data))
    peak = tracemalloc.get_traced_memory()[1] - base
    text = str(info.value)
    if message.endswith("("):
        assert text.startswith("<stream>: " + message), text
    else:
        assert text == "<stream>: " + message
    assert info.value.exit_code == 3
    # Nothing near what the forged numbers declare: the reader's own copy of
    # the stream and its bookkeeping only.
    assert peak <= fc.memory_bound(len(data)), (peak, len(data))


@pytest.mark.parametrize("header, message", [
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (9223372036854775807, 0, 9223372036854775807), }",
     "invalid .npy header: shape (9223372036854775807, 0, 9223372036854775807) spans "
     "340282366920938463389587631136930004996 bytes of float32, more than the 9223372036854775807 "
     "an array can address"),
    ("{'descr': '<f4', 'fortran_order': True, 'shape': (4611686018427387904, 4, 0), }",
     "invalid .npy header: shape (4611686018427387904, 4, 0) spans 73786976294838206464 bytes of float32, "
     "more than the 9223372036854775807 an array can address"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (" + "0, " * 33 + "), }",
     "invalid .npy header: a blob has at most 32 axes, got 33"),
    ("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
     "truncated at byte {end}: .npy array data needs 147573952589676412928 bytes, 0 remain"),
])
def test_hostile_npy_shapes_are_refused(header, message):
    data = npy_header_bytes(header)  # a header and no array data
    with pytest.raises(BlobToolError) as info:
        load(io.BytesIO(data))
    assert str(info.value) == "<stream>: " + message.format(end=len(data))


def _npz_with(member: bytes, *, method=None, declared=None) -> bytes:
    import zipfile
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("w.npy", member)
    data = bytearray(out.getvalue())
    # Patch the local header and the central directory alike.
    for sig, method_at, size_at in ((b"PK\x03\x04", 8, 22), (b"PK\x01\x02", 10, 24)):
        at = bytes(data).index(sig)
        if method is not None:
            data[at + method_at:at + method_at + 2] = method.to_bytes(2, "little")
        if declared is not None:
            data[at + size_at:at + size_at + 4] = declared.to_bytes(4, "little")
    return bytes(data)


def test_hostile_npz_members_are_refused_before_reading():
    member = npy_bytes(np.zeros(4, np.float32))
    with pytest.raises(BlobToolError, match=r"member 'w.npy' declares 4294967295 bytes, more than its "
                                            rf"{len(member)} stored bytes can hold"):
        load_all(io.BytesIO(_npz_with(member, declared=2**32 - 1)))
    with pytest.raises(BlobToolError, match=r"member 'w.npy' uses zip compression method 12; "
                                            r"\.npz members are stored or deflated"):
        load_all(io.BytesIO(_npz_with(member, method=12)))



def test_non_utf8_names_are_text():
    # proto2 strings are bytes on the wire; protobuf hands invalid UTF-8 over as
    # bytes (or, the pure-Python runtime, refuses it: then so does blobtool).
    layer = pb.LayerParameter(type="Convolution").SerializeToString() + wire.len_field_header(1, 2) + b"\xff\xfe"
    blob = blob_bytes([1.0])
    layer += wire.len_field_header(7, len(blob)) + blob
    net = wire.len_field_header(1, 2) + b"\xc3\x28" + wire.len_field_header(100, len(layer)) + layer
    if REFUSES_BAD_UTF8:
        with pytest.raises(BlobToolError, match=r"^<stream>: at byte 0: invalid NetParameter fields \("):
            open_document(io.BytesIO(net))
        return
    doc = open_document(io.BytesIO(net))
    assert doc.meta["name"] == "\\xc3("
    assert [e.name for e in doc.entries] == ["\\xff\\xfe/0"]
    state = pb.SolverState(iter=1).SerializeToString() + wire.len_field_header(2, 1) + b"\x80"
    state += wire.len_field_header(3, len(blob)) + blob
    assert open_document(io.BytesIO(state)).meta["learned_net"] == "\\x80"


@pytest.mark.parametrize("name", [b"\xff" * 2_000_000, b"a" * 2_000_000], ids=["not UTF-8", "UTF-8"])
def test_a_huge_layer_name_is_cut_not_copied_into_each_blob_name(name):
    # Found by the long run: a damaged .caffemodel whose layer name swallowed
    # a payload; its escaped text, copied into each blob's name, took 6 times
    # the file's size and over a second.
    layer = wire.len_field_header(1, len(name)) + name
    for _ in range(5):
        layer += wire.len_field_header(7, len(blob_bytes([1.0]))) + blob_bytes([1.0])
    net = wire.len_field_header(1, len(name)) + name + wire.len_field_header(100, len(layer)) + layer
    outcome = fc.check_case(net)  # within time and memory
    if name[0] == 0xFF and REFUSES_BAD_UTF8:
        assert outcome.error.startswith("<stream>: at byte 0: invalid NetParameter fields (")
        return
    assert outcome.error is None
    doc = open_document(io.BytesIO(net))
    shown = "\\xff" * 256 if name[0] == 0xFF else "a" * 256
    assert doc.meta["name"] == shown + "..."
    assert [e.name for e in doc.entries] == [f"{shown}.../{k}" for k in range(5)]


def test_overlong_tags_on_unpacked_values_read_in_one_run():
    # A writer may pad a tag (0xad 0x00 is field 5, I32, in two bytes); 200000
    # such values once cost a Python loop each (seconds), now one numpy pass.
    n = 200_000
    values = np.arange(n, dtype="<f4")
    records = np.empty((n, 6), dtype=np.uint8)
    records[:, 0], records[:, 1] = 0xAD, 0x00
    records[:, 2:] = values.view(np.uint8).reshape(n, 4)
    data = blob_bytes(shape=[n]) + records.tobytes()
    assert fc.check_case(data).error is None  # within TIME_LIMIT_S, else FuzzFailure
    np.testing.assert_array_equal(load(io.BytesIO(data)).cpu_data(), values)


def test_half_data_decodes_within_the_memory_bound():
    # ditcaffe's half_data at one byte a value, the largest growth there is:
    # it once took 33 times the input in index arrays.
    n = 1_000_000
    data = blob_bytes(shape=[n]) + wire.len_field_header(10, n) + bytes(range(128)) * (n // 128) + bytes(n % 128)
    outcome = fc.check_case(data)
    assert outcome.error is None
    assert outcome.peak <= fc.memory_bound(len(data))
    half = load(io.BytesIO(data)).cpu_data()
    expected = np.frombuffer(bytes(range(128)) * (n // 128) + bytes(n % 128), np.uint8).astype("<u2").view("<f2")
    np.testing.assert_array_equal(half, expected.astype(np.float32))


def _pure_python_protobuf() -> bool:
    try:
        from google.protobuf.internal import api_implementation
    except ImportError:
        return False
    return api_implementation.Type() == "python"


# Bookkeeping per blob entry (a record, its payload table, an Entry) and per
# layer: the costs not proportional to bytes, which MAX_BLOBS and MAX_LAYERS cap.
# protobuf's pure-Python runtime (3.20 where no compiled one exists) makes
# messages dearer and keeps each unknown field as Python objects.
PURE_PYTHON_PROTOBUF = _pure_python_protobuf()
PER_BLOB = 3000 if PURE_PYTHON_PROTOBUF else 1600
PER_LAYER = 400
PER_UNKNOWN_FIELD = 250 if PURE_PYTHON_PROTOBUF else 0


@pytest.mark.parametrize("data, kind, blobs, layers, unknown", [
    (b"\x0a\x00" * 5000, "vector", 5000, 0, 0),                       # 5000 empty blobs
    (b"\xa2\x06\x00" * 10_000, "net", 0, 10_000, 0),                   # 10000 empty layers
    (b"\x78\x01" * 200_000 + blob_bytes([1.0]), "blob", 1, 0, 200_000),  # 400 KB of unknown fields
    (DATA4 + _shape_message(b"\x08\x01" * 300_000), "blob", 1, 0, 0),   # 300000 unpacked dims
    (b"\x3a\x02\x08\x01" * 50_000 + DATA4, "blob", 1, 0, 0),           # 50000 shape fields to merge
], ids=["empty blobs", "empty layers", "unknown fields", "unpacked dims", "repeated shapes"])
def test_many_tiny_fields_cost_memory_in_proportion(tracing, data, kind, blobs, layers, unknown):
    # No Python object of blobtool's per tiny field (they once cost 20 to 100
    # times the input), beyond the bookkeeping of each blob and layer.
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        fc.read_everything(data, kind)
    except BlobToolError:
        pass
    peak = tracemalloc.get_traced_memory()[1] - base
    bound = fc.memory_bound(len(data)) + PER_BLOB * blobs + PER_LAYER * layers + PER_UNKNOWN_FIELD * unknown
    assert peak <= bound, peak


@pytest.mark.parametrize("data, message", [
    (b"\x0a\x00" * (MAX_BLOBS + 1), f"at byte {2 * MAX_BLOBS}: holds more than {MAX_BLOBS} blobs (blobtool's limit)"),
    (b"\xa2\x06\x00" * (MAX_LAYERS + 1),
     f"at byte {3 * MAX_LAYERS}: NetParameter holds more than {MAX_LAYERS} layer fields (blobtool's limit)"),
    (fc.one_layer_net(b"", extra=b"\x3a\x00" * (MAX_BLOBS + 1)),
     f"at byte {25 + 2 * MAX_BLOBS}: LayerParameter holds more than {MAX_BLOBS} blobs fields (blobtool's limit)"),
    # Alternating unpacked data and diff values: a piece each.
    (blob_bytes(shape=[5000]) + (b"\x2d" + bytes(4) + b"\x35" + bytes(4)) * 5000,
     "at byte 40966: field 5 (data) is split into more than 4096 pieces (blobtool's limit)"),
], ids=["blobs", "layers", "blobs in a layer", "pieces of a payload"])
def test_blob_layer_and_piece_counts_are_capped(data, message):
    # Their bookkeeping is the one cost not proportional to bytes: capped at
    # MAX_BLOBS * PER_BLOB (about 100 MB) for a forged file of empty blobs.
    with pytest.raises(BlobToolError) as info:
        fc.read_everything(data, "net" if data.startswith(b"\xa2\x06\x00") else None)
    assert str(info.value) == "<stream>: " + message


# -- .npy header dictionaries and .npz member names ---------------------------------------------

def test_npy_header_dictionaries():
    # Keys of other types and values of other types (bytes keys, bool dimensions,
    # structured descriptors ...): only BlobToolError; what blobtool accepts,
    # numpy (the oracle) reads as the same array.
    @FUZZ_SETTINGS
    @given(st.data())
    def run(data):
        npy = fc.npy_with_header(fc.hypothesis_picker(data))
        for kind in (None, "npy"):
            outcome = fc.check_case(npy, kind)
        member = fc.check_case(fc.zip_bytes({"w.npy": npy}), "npz")
        if outcome.error is not None:
            assert member.error is not None
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # numpy's note on a header written by Python 2
                expected = np.load(io.BytesIO(npy), allow_pickle=False)
            # An .npz member holds exactly its header and array data; an .npy may run on.
            if len(npy) == 10 + int.from_bytes(npy[8:10], "little") + expected.nbytes:
                assert member.error is None, member.error
            else:
                assert "its .npy header declares" in member.error, member.error
            blob = load(io.BytesIO(npy))
            assert blob.shape == expected.shape
            np.testing.assert_array_equal(blob.cpu_data().reshape(expected.shape), expected)

    run()


def test_npz_member_names():
    # numpy's keyword names, slashes, "/diff" suffixes, Unicode: every member
    # is a blob or the diff of one, and a rewrite gives numpy every name back.
    from blobtool import write

    @FUZZ_SETTINGS
    @given(st.data())
    def run(data):
        npz, arrays = fc.npz_with_names(fc.hypothesis_picker(data))
        assert fc.check_case(npz).error is None
        doc = open_document(io.BytesIO(npz))
        seen = {}
        for entry in doc.entries:
            seen[entry.name] = entry.blob().cpu_data()
            if entry.has_diff:
                seen[entry.name + "/diff"] = entry.blob().cpu_diff()
        assert sorted(seen) == sorted(arrays)
        for name, values in seen.items():
            np.testing.assert_array_equal(values, arrays[name])
        out = io.BytesIO()
        write(doc, None, out, format="npz")
        with np.load(io.BytesIO(out.getvalue()), allow_pickle=False) as back:
            assert sorted(back.files) == sorted(arrays)
            for name, values in arrays.items():
                np.testing.assert_array_equal(back[name], values)

    run()


@pytest.mark.parametrize("mutation", [fc.forge_npy_header, fc.rename_npz_members, fc.damage_pickle,
                                      fc.mutate_pickle_ops], ids=lambda m: m.__name__)
def test_npy_and_npz_mutations_change_what_they_aim_at(mutation):
    # The mutations reach their target (else the fuzz runs test nothing new).
    target = {fc.forge_npy_header: "npy_f32", fc.rename_npz_members: "npz", fc.damage_pickle: "pt",
              fc.mutate_pickle_ops: "pt"}[mutation]
    seed = {s.name: s for s in SEEDS}[target]
    import random
    pick = fc.random_picker(random.Random(3))
    changed = {mutation(seed.data, fc.layout_of(seed), pick) != seed.data for _ in range(20)}
    assert changed == {True}
TINY_FIELD_FLOODS = fc.TINY_FIELD_FLOODS


@pytest.mark.parametrize("name", list(TINY_FIELD_FLOODS))
def test_many_tiny_fields_are_read(tmp_path, name):
    data = TINY_FIELD_FLOODS[name]
    path = tmp_path / "flood.pb"
    path.write_bytes(data)
    commands = [("info",), ("norm",)]
    if name in ("unknown fields in a blob", "as many layers as allowed, each with a blob"):
        commands += [("convert", "-o", tmp_path / "out.pb", "--format", "same"), ("compare", path)]
    for command in commands:
        result = run_blobtool(command[0], path, *command[1:], timeout=300)
        assert result.returncode == 0, (command, result.stderr)
        assert not result.stderr, (command, result.stderr)
    if len(commands) > 2:
        assert (tmp_path / "out.pb").read_bytes() == data  # unknown fields and all, as they were


# -- pickles mutated opcode by opcode ----------------------------------------------------------

PICKLE_SEEDS = [s for s in SEEDS if s.kind == "pt"]
PICKLE_SECONDS = float(os.environ.get("BLOBTOOL_FUZZ_PICKLE_SECONDS", "40"))


@pytest.mark.parametrize("seed", PICKLE_SEEDS, ids=[s.name for s in PICKLE_SEEDS])
def test_pickle_opcode_mutations(seed, tracing):
    # Opcodes inserted, replaced, removed, reordered and repeated (BUILD and
    # SETITEM on what a rebuild returned, memo slots, nesting past the
    # limit), up to four rounds, for a bounded time per seed.
    import random

    lay = fc.layout_of(seed)
    deadline = time.monotonic() + PICKLE_SECONDS / len(PICKLE_SEEDS)
    cases = 0
    while time.monotonic() < deadline or cases < 50:
        rng = random.Random(cases)  # case N is random.Random(N): a failure names its N to rerun
        pick = fc.random_picker(rng)
        mutated = seed.data
        for _ in range(rng.randint(1, 4)):
            mutated = pick("choice", fc.PICKLE_MUTATIONS)(mutated, lay, pick)
        try:
            fc.check_case(mutated, "pt")
        except fc.FuzzFailure as exc:
            raise fc.FuzzFailure(f"case {cases} (random.Random({cases})): {exc}") from exc
        cases += 1
    print(f"{seed.name}: {cases} cases")
