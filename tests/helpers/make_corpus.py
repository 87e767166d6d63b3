"""Make tests/corpus/: bad and awkward inputs, and expected.json, what blobtool must answer to each.

Run from anywhere: ``python tests/helpers/make_corpus.py``. The files are small and
committed with this script; tests/formats/test_corpus.py runs the command line on each
(from inside tests/corpus/, so messages name the bare file) and compares the
exit code and the whole of stderr with expected.json.

The expected answers are written out below by hand, not recorded from a run:
when a message changes on purpose, change it here and rerun the script.
"""

from __future__ import annotations

import base64
import gzip
import json
import pickle
import sys
import types
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fuzzcases  # noqa: E402  (the seeds: valid files of every kind)
from blobtool.formats.caffe import wire  # noqa: E402
from builders import (blob_bytes, h5_bytes, h5_net_bytes, h5_solverstate_bytes, h5_string, npy_bytes,  # noqa: E402
                      npy_header_bytes, npz_named, zip_bytes)

CORPUS = HERE.parent / "corpus"
SEEDS = {s.name: s.data for s in fuzzcases.generated_seeds()}


def object_npy() -> bytes:
    # An object array whose pickle names a module that does not exist: loading
    # it would fail with ModuleNotFoundError, so the expected message (refused
    # from the header) also shows that nothing was unpickled.
    module = types.ModuleType("blobtool_never_unpickled")

    class Canary:
        pass

    Canary.__module__ = module.__name__
    Canary.__qualname__ = "Canary"
    module.Canary = Canary
    sys.modules[module.__name__] = module
    try:
        array = np.empty(1, dtype=object)
        array[0] = Canary()
        data = npy_bytes(array, allow_pickle=True)
    finally:
        del sys.modules[module.__name__]
    assert b"blobtool_never_unpickled" in data
    return data


def apple_double() -> bytes:
    # What macOS leaves beside a copied file on a foreign file system: magic,
    # version 2, filler, one entry (Finder info).
    return (b"\x00\x05\x16\x07" + b"\x00\x02\x00\x00" + b"Mac OS X        " + b"\x00\x01"
            + b"\x00\x00\x00\x09" + b"\x00\x00\x00\x32" + b"\x00\x00\x00\x20" + bytes(32))


def hdf5() -> bytes:
    # The HDF5 signature and the start of a version 0 superblock, as Caffe's
    # snapshot_format: HDF5 writes.
    return b"\x89HDF\r\n\x1a\n" + b"\x00\x00\x00\x00\x00\x08\x08\x00\x04\x00\x10\x00" + bytes(84)


def hdf5_files() -> dict:
    """Caffe's HDF5 snapshots made with h5py (tests/helpers/builders.py), damaged, or holding what Caffe never writes."""
    values = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 8

    def blob(data):
        def build(f):
            f.create_group("data").create_group("conv1").create_dataset("0", data=data)
        return build

    def other_groups(f):
        blob(values)(f)
        f.create_group("model_weights")

    def int_history(f):
        f.create_dataset("iter", data=np.array([1], np.int32))
        h5_string(f, "learned_net", "net_iter_1.caffemodel.h5")
        f.create_dataset("current_step", data=np.array([0], np.int32))
        f.create_group("history").create_dataset("0", data=np.arange(3, dtype=np.int32))

    def solver(iter_):
        def build(f):
            f.create_dataset("iter", data=np.array([iter_], np.int64))
            h5_string(f, "learned_net", "net_iter_1.caffemodel.h5")
            f.create_dataset("current_step", data=np.array([0], np.int32))
            f.create_group("history").create_dataset("0", data=values)
        return build

    def training_data(f):
        f.create_dataset("data", data=values)
        f.create_dataset("label", data=np.arange(2, dtype=np.float32))

    def huge_chunks(f):
        # Never written: a few KB that declare one 256 MiB chunk.
        f.create_group("data").create_group("ip1").create_dataset("0", shape=(1 << 26,), dtype="<f4",
                                                                  chunks=(1 << 26,), compression="gzip")

    refused = {seed.name: seed.data for seed in fuzzcases.hdf5_refused_seeds()}
    net = h5_net_bytes([("conv1", [values, values[0, 0]]), ("relu1", [])], diffs={})
    twice = h5_solverstate_bytes([values, values[0]])
    assert twice.count(b"1\0") == 1
    return {
        "external_storage.caffemodel.h5": refused["h5_refused_external"],
        "external_iter.solverstate.h5": refused["h5_refused_external_iter"],
        "virtual_self.caffemodel.h5": refused["h5_refused_virtual"],
        "external_link.caffemodel.h5": refused["h5_refused_external_link"],
        "not_utf8.caffemodel.h5": refused["h5_refused_not_utf8"],
        "listed_twice.solverstate.h5": twice.replace(b"1\0", b"0\0"),
        "iter_2_40.solverstate.h5": h5_bytes(solver(1 << 40)),
        "training_data.h5": h5_bytes(training_data),
        "huge_chunks.caffemodel.h5": h5_bytes(huge_chunks),
        "truncated.caffemodel.h5": cut(net, len(net) // 2),
        "truncated.solverstate.h5": cut(h5_solverstate_bytes([values]), 1000),
        "other_groups.caffemodel.h5": h5_bytes(other_groups),
        "string_blob.caffemodel.h5": h5_bytes(blob(np.array([b"conv", b"relu"]))),
        "scalar_blob.caffemodel.h5": h5_bytes(blob(np.float32(0.5))),
        "int_blob.caffemodel.h5": h5_bytes(blob(np.arange(6, dtype=np.int32))),
        "int_history.solverstate.h5": h5_bytes(int_history),
        "keras_weights.h5": h5_bytes(lambda f: f.create_group("model_weights").create_group("dense_1")),
    }


def cut(data: bytes, keep: int) -> bytes:
    assert 0 < keep < len(data)
    return data[:keep]


def signalling_nan_pb() -> bytes:
    # A float32 signalling NaN (0x7fa00000) in place of the packed 2.0: the
    # protobuf library would quieten it on the way through a Python float.
    data = blob_bytes([1.0, 2.0, 3.0, 4.0], shape=[2, 2])
    two = np.float32(2.0).tobytes()
    assert data.count(two) == 1
    return data.replace(two, np.uint32(0x7FA00000).tobytes())


def signalling_nan_npy() -> bytes:
    values = np.arange(1.0, 5.0).reshape(2, 2)
    values.view(np.uint64)[0, 1] = 0x7FF4000000000000  # a float64 signalling NaN
    return npy_bytes(values)


def hostile_names_net() -> bytes:
    # Layer names and a type that would retitle the terminal (OSC 0 ... BEL),
    # clear it (CSI 2 J) and reverse the line (U+202E): printed escaped.
    from builders import Layer, net_bytes

    return net_bytes("new", [Layer("\x1b]0;owned\x07conv1", "Conv\x1b[2J", [np.ones((2, 2), np.float32)]),
                             Layer("fc\u202eevil", "InnerProduct", [np.ones(3, np.float32)])])


NAN_INF = blob_bytes([1.0, float("nan"), float("inf"), -2.0, float("-inf"), float("nan")], shape=[2, 3])
HUGE = blob_bytes([1e308, -1e308, 1e308], double=True)
RNG = np.random.default_rng(20240607)

# file name -> contents
FILES = {
    "empty.pb": b"",
    "random.bin": RNG.bytes(256),
    "net.prototxt": b'name: "LeNet"\nlayer {\n  name: "data"\n  type: "Input"\n  top: "data"\n}\n',
    "solver.prototxt": b'net: "train_val.prototxt"\nbase_lr: 0.01\n',
    "truncated_blob.pb": cut(SEEDS["blob_shape"], 60),
    "truncated_vector.binaryproto": cut(SEEDS["vector"], 100),
    "truncated_layer.caffemodel": cut(SEEDS["net_layer"], 200),
    "truncated_v1.caffemodel": cut(SEEDS["net_v1"], 150),
    "truncated_v0.caffemodel": cut(SEEDS["net_v0"], 150),
    "truncated.solverstate": cut(SEEDS["solverstate"], 100),
    "truncated_nvidia_raw.pb": cut(SEEDS["nvidia_raw"], 50),
    "truncated.npy": cut(SEEDS["npy_f32"], 150),
    "truncated.npz": cut(SEEDS["npz"], 500),
    "._weights.caffemodel": apple_double(),
    "weights.pb.gz": gzip.compress(SEEDS["blob_shape"], mtime=0),
    "snapshot.caffemodel.h5": hdf5(),
    "int32.npy": npy_bytes(np.arange(6, dtype=np.int32)),
    "object.npy": object_npy(),
    "nan_inf.pb": NAN_INF,
    "huge_values.pb": HUGE,
    "forged_length.pb": blob_bytes([], shape=[4]) + wire.len_field_header(5, 2**62) + bytes(16),
    "overflowing_dims.pb": blob_bytes([1.0], shape=[2**62, 2**62, 16]),
    "too_many_axes.pb": blob_bytes([1.0], shape=[1] * 33),
    "negative_legacy.pb": blob_bytes([1.0], shape=(1, -3, 2, 2), layout="legacy"),
    "group.pb": blob_bytes([1.0]) + wire.encode_tag(9, wire.SGROUP),
    "overlong_varint.pb": b"\x08" + b"\xff" * 10 + b"\x01",
    **hdf5_files(),
    # Found by tests/helpers/fuzz_long.py: a header numpy parses only with its Python 2 fallback (and warned).
    "python2_header.npy": base64.b64decode(
        "k05VTVBZAQB2AHsnZGVzY3InOiAnPGY0JywgJ2ZvcnRyYW5fb3JkZXInOiBGYWxzZSwgJ3NoYXBlJzogKDMsIDQpLCB9ICAgICAgICAg"
        "ICAgICAgICAgICAgICAgICAgICAgICAgICAgIAogICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAOICAg"
        "ICAgICAgICAgICAgICAgICAgICAgICAgICAgCg=="),
    # Values at the edges of float64: a constant past 5e14 (numpy's histogram
    # refused "Too many bins"), doubles near its largest (mean and std
    # overflowed), signalling NaNs (numpy warned when widening them).
    "constant_large.pb": blob_bytes([6e14] * 4, double=True),
    "constant_large_float.pb": blob_bytes([1e15] * 4),
    "near_float64_max.pb": blob_bytes([1.7e308, 1.7e308, -1.6e308, 1.79e308], double=True),
    "signalling_nan.pb": signalling_nan_pb(),
    "signalling_nan.npy": signalling_nan_npy(),
    # A dimension past int32 that the legacy fields cannot hold (count 0).
    "legacy_overflow.pb": blob_bytes([], shape=[0, 3_000_000_000]),
    "hostile_names.caffemodel": hostile_names_net(),
}

# .npy headers and .npz archives: header dictionaries of the wrong types, a
# zip without arrays, member sizes that disagree with their headers, member
# names numpy's own savez cannot write, a diff in one file only.
_F4 = "{'descr': '<f4', 'fortran_order': False, 'shape': %s}"
_MEMBER = npy_bytes(np.arange(4, dtype=np.float32))
# Longer than zipfile inflates at once (4 KiB), so that the header is read before the member's end (and CRC).
_LONG_MEMBER = npy_bytes(np.arange(2048, dtype=np.float32))
_MEMBER_SIZE_AT = 22  # the uncompressed size in a zip's local header (and 24 in its central directory)


def forged_member_size(data: bytes, size: int) -> bytes:
    """A one-member zip whose member declares `size` uncompressed bytes, in both headers."""
    out = bytearray(data)
    for sig, at in ((b"PK\x03\x04", _MEMBER_SIZE_AT), (b"PK\x01\x02", 24)):
        start = out.index(sig) + at
        out[start:start + 4] = size.to_bytes(4, "little")
    return bytes(out)


FILES.update({
    "npy_bytes_key.npy": npy_header_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), b'x': 1}",
                                          bytes(8)),
    "npy_bool_dim.npy": npy_header_bytes(_F4 % "(True, 2)", bytes(8)),
    "npy_int_descr.npy": npy_header_bytes("{'descr': 4, 'fortran_order': False, 'shape': (2,)}", bytes(8)),
    "no_npy_member.npz": zip_bytes({"README.txt": b"not an array"}),
    "npz_member_bad_header.npz": zip_bytes({"w.npy": npy_header_bytes(_F4 % "(2, True)", bytes(8))}),
    "npz_member_short.npz": forged_member_size(zip_bytes({"w.npy": _LONG_MEMBER}, compressed=True),
                                               len(_LONG_MEMBER) - 8),
    "npz_member_long.npz": forged_member_size(zip_bytes({"w.npy": _MEMBER}, compressed=True), len(_MEMBER) + 8),
    "npz_keyword_names.npz": npz_named({"file": np.ones(2, np.float32), "allow_pickle": np.zeros(2, np.float32),
                                        "x": np.ones(2, np.float32), "x/diff": np.ones(2, np.float32),
                                        "x/diff/diff": np.full(2, 3, np.float32)}),
    "npz_with_diff.npz": npz_named({"w": np.ones(3, np.float32), "w/diff": np.ones(3, np.float32)}),
    "npz_without_diff.npz": npz_named({"w": np.ones(3, np.float32)}),
})

INFO = ["info"]
# (file, command line before the file, exit code, stderr); stderr "" means nothing at all.
EXPECTED = [
    ("empty.pb", INFO, 3, "blobtool: empty.pb: empty file: a Caffe file holds at least one field"),
    ("random.bin", INFO, 3, "blobtool: random.bin: at byte 9: field 2971696 uses the group wire type 3, which Caffe's "
                              "schema never writes"),
    ("net.prototxt", INFO, 0, ""),
    ("solver.prototxt", INFO, 3, "blobtool: solver.prototxt: not a Caffe net definition: line 1, column 1: Message "
                                 "type \"caffe.NetParameter\" has no field named \"net\"."),
    ("truncated_blob.pb", INFO, 3, "blobtool: truncated_blob.pb: truncated at byte 50: field 6 (diff) declares "
                                   "48 bytes, 8 remain"),
    ("truncated_vector.binaryproto", INFO, 3, "blobtool: truncated_vector.binaryproto: truncated at byte 60: "
                                              "field 1 (blobs) declares 73 bytes, 38 remain"),
    ("truncated_layer.caffemodel", INFO, 3, "blobtool: truncated_layer.caffemodel: truncated at byte 160: "
                                            "field 100 (layer) declares 127 bytes, 37 remain"),
    ("truncated_v1.caffemodel", INFO, 3, "blobtool: truncated_v1.caffemodel: truncated at byte 124: "
                                         "field 2 (layers) declares 69 bytes, 24 remain"),
    ("truncated_v0.caffemodel", INFO, 3, "blobtool: truncated_v0.caffemodel: truncated at byte 100: "
                                         "field 2 (layers) declares 95 bytes, 48 remain"),
    ("truncated.solverstate", INFO, 3, "blobtool: truncated.solverstate: truncated at byte 91: field 3 "
                                       "(history) declares 34 bytes, 7 remain"),
    ("truncated_nvidia_raw.pb", INFO, 3, "blobtool: truncated_nvidia_raw.pb: truncated at byte 36: field 13 "
                                         "(raw_diff) declares 48 bytes, 12 remain"),
    ("truncated.npy", INFO, 3, "blobtool: truncated.npy: truncated at byte 128: .npy array data needs 48 bytes, "
                               "22 remain"),
    ("truncated.npz", INFO, 3, "blobtool: truncated.npz: not a readable .npz (zip) file: File is not a zip file"),
    ("._weights.caffemodel", INFO, 3, "blobtool: ._weights.caffemodel: not a Caffe file: this looks like a macOS "
                                      "resource-fork file (AppleDouble '._' metadata); read the "
                                      "file of the same name without the '._' prefix"),
    ("weights.pb.gz", INFO, 3, "blobtool: weights.pb.gz: not a Caffe file: this looks like a gzip-compressed "
                               "file; decompress it first (gunzip -k FILE) and read the result"),
    ("snapshot.caffemodel.h5", INFO, 3, "blobtool: snapshot.caffemodel.h5: HDF5 /: not a readable HDF5 file: "
                                        "ring type mismatch occurred for cache entry"),
    ("int32.npy", INFO, 3, "blobtool: int32.npy: .npy holds int32 values; blobs are float32 or float64 "
                           "(blobtool convert --float or --double reads it, into a file every command reads)"),
    ("object.npy", INFO, 3, "blobtool: object.npy: .npy holds object values (object arrays are never unpickled)"),
    ("object.npy", ["convert", "--double", "-o", "out.pb"], 3,
     "blobtool: object.npy: .npy holds object values (object arrays are never unpickled)"),
    ("nan_inf.pb", ["info", "--stats"], 0, ""),
    ("nan_inf.pb", ["norm"], 0, ""),
    ("nan_inf.pb", ["info", "--check", "finite"], 1,
     "blobtool: nan_inf.pb: check finite failed: blob 0 data has 2 NaN and 2 Inf"),
    ("huge_values.pb", ["info", "--stats"], 0, ""),
    ("huge_values.pb", ["norm"], 0, ""),
    ("huge_values.pb", ["info", "--check", "finite"], 0, ""),
    ("forged_length.pb", INFO, 3, "blobtool: forged_length.pb: truncated at byte 5: field 5 (data) declares "
                                  "4611686018427387904 bytes, 16 remain"),
    ("overflowing_dims.pb", ["norm"], 3, "blobtool: overflowing_dims.pb: at byte 6: field 7 (shape): invalid blob "
                                         "shape: shape (4611686018427387904, 4611686018427387904, 16) spans "
                                         "1361129467683753853853498429727072845824 bytes of float32, more than "
                                         "the 9223372036854775807 an array can address"),
    ("too_many_axes.pb", INFO, 3, "blobtool: too_many_axes.pb: at byte 6: field 7 (shape): invalid blob shape: a "
                                  "blob has at most 32 axes, got 33"),
    ("negative_legacy.pb", ["norm"], 3, "blobtool: negative_legacy.pb: at byte 2: field 2 (channels): invalid blob "
                                        "shape: dimension 1 is negative (-3) in shape (1, -3, 2, 2)"),
    ("group.pb", INFO, 3, "blobtool: group.pb: at byte 11: field 9 (double_diff) uses the group wire type 3, "
                          "which Caffe's schema never writes"),
    ("overlong_varint.pb", INFO, 3, "blobtool: overlong_varint.pb: at byte 1: field 1 (num) longer than 10 bytes"),
    ("python2_header.npy", ["info", "--stats"], 0, ""),
    ("npy_bytes_key.npy", ["norm"], 3, "blobtool: npy_bytes_key.npy: invalid .npy header: keys 'descr', "
                                       "'fortran_order', 'shape', b'x'; expected 'descr', 'fortran_order' and "
                                       "'shape'"),
    ("npy_bool_dim.npy", INFO, 3, "blobtool: npy_bool_dim.npy: invalid .npy header: shape must be a tuple of "
                                  "integers, got (True, 2)"),
    ("npy_int_descr.npy", INFO, 3, "blobtool: npy_int_descr.npy: invalid .npy header: descr 4 is not a dtype "
                                   "(TypeError)"),
    ("no_npy_member.npz", ["compare", "no_npy_member.npz"], 3,
     "blobtool: no_npy_member.npz: not an .npz: the zip file holds no .npy member"),
    ("npz_member_bad_header.npz", INFO, 3, "blobtool: npz_member_bad_header.npz[w.npy]: invalid .npy header: shape "
                                           "must be a tuple of integers, got (2, True)"),
    ("npz_member_short.npz", INFO, 3, "blobtool: npz_member_short.npz[w.npy]: truncated at byte 128: .npy array "
                                      "data needs 8192 bytes, 8184 remain"),
    ("npz_member_long.npz", INFO, 3, "blobtool: npz_member_long.npz: at byte 0: member 'w.npy' holds 152 bytes; "
                                     "its .npy header declares 144"),
    ("npz_keyword_names.npz", INFO, 0, ""),
    ("npz_with_diff.npz", ["compare", "npz_without_diff.npz"], 1, ""),
    ("npz_without_diff.npz", ["compare", "npz_with_diff.npz"], 1, ""),
]


# safetensors: a length field past the file, a header that is not JSON,
# offsets outside the file or overlapping, an unknown dtype.
def safetensors_file(header, data: bytes = b"", *, length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return (len(raw) if length is None else length).to_bytes(8, "little") + raw + data


_F32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
FILES.update({
    "forged_header_length.safetensors": safetensors_file({"w": _F32}, bytes(8), length=2**40),
    "header_not_json.safetensors": safetensors_file(b'{"w": {"dtype": "F32", "shape": [2],, }}', bytes(8)),
    "offsets_outside.safetensors": safetensors_file(
        {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8)),
    "overlapping.safetensors": safetensors_file(
        {"w": _F32, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12)),
    "unknown_dtype.safetensors": safetensors_file({"w": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}},
                                                  bytes(16)),
})
# PyTorch's .pt: a pickle naming os.system (never run), a whole pickled model, a
# TorchScript archive, the legacy format, a tensor past its storage; a checkpoint
# holding one state dict among other things is read through it.
class _System:
    def __reduce__(self):
        import os

        return os.system, ("touch blobtool_ran_a_pickle",)


def _pt_corpus() -> dict:
    import collections

    from ptfiles import Tensor, pickle_with_torch, pt_bytes

    state = collections.OrderedDict([("conv1.weight", Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))),
                                     ("conv1.bias", Tensor(np.array([0.5, -1.5], np.float32)))])
    model = types.SimpleNamespace(weight=Tensor(np.ones(2, np.float32)))
    data, storages = pickle_with_torch(model)
    forged = (b"\x80\x02}X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storage"
              b"ctorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x02tQK\x01K\x02\x85K\x01\x85"
              b"\x89ccollections\nOrderedDict\n)RtRs.")
    return {
        "pickle_runs_code.pt": pt_bytes(None, data_pkl=pickle.dumps({"w": _System()}, protocol=2)),
        "whole_model.pt": pt_bytes(None, data_pkl=data, storages=storages),
        "torchscript.pt": pt_bytes(state, records={"constants.pkl": b"\x80\x02).", "code/m.py": b"pass"}),
        "legacy.pth": pickle.dumps(0x1950a86a20f9469cfc6c, protocol=2) + pickle.dumps(1001, protocol=2),
        "tensor_past_storage.pt": pt_bytes(None, data_pkl=forged, records={"data/0": bytes(8)}),
        "checkpoint.pth": pt_bytes({"state_dict": state, "epoch": 3}),
    }


FILES.update(_pt_corpus())
EXPECTED += [
    ("pickle_runs_code.pt", INFO, 3, "blobtool: pickle_runs_code.pt: archive/data.pkl: calls the function "
                                     "posix.system when it is unpickled, which no state dict does: blobtool reads "
                                     "only tensors, their storages, dicts, lists and numbers, and never imports or "
                                     "runs what a pickle names, so nothing was run"),
    ("whole_model.pt", INFO, 3, "blobtool: whole_model.pt: archive/data.pkl: names the class types.SimpleNamespace, which a "
                                "state dict does not hold; blobtool reads only tensors, their storages, dicts, lists "
                                "and numbers, and never imports or runs what a pickle names (a whole pickled model? "
                                "save the weights as a state dict instead: torch.save(model.state_dict(), path))"),
    ("torchscript.pt", INFO, 3, "blobtool: torchscript.pt: a TorchScript archive (torch.jit.save): its data.pkl "
                                "rebuilds a scripted module with code from the file, which blobtool never runs; save "
                                "the weights as a state dict instead: torch.save(model.state_dict(), path)"),
    ("legacy.pth", INFO, 3, "blobtool: legacy.pth: a PyTorch file in the legacy "
                            "format (torch.save before 1.6), a bare pickle that only running it can read; save it "
                            "again in PyTorch's zip format, which blobtool reads: "
                            "torch.save(torch.load(FILE, weights_only=True), NEW_FILE)"),
    ("tensor_past_storage.pt", ["norm"], 3, "blobtool: tensor_past_storage.pt: archive/data.pkl: a tensor of size "
                                            "(2,), stride (1,) at offset 1 reaches element 2 of storage '0', which "
                                            "holds 2"),
    ("checkpoint.pth", ["compare", "checkpoint.pth"], 0, "blobtool: warning: checkpoint.pth: reading the state dict "
                                                         "checkpoint['state_dict'] (the file also holds 'epoch')\n"
                                                         "blobtool: warning: checkpoint.pth: reading the state dict "
                                                         "checkpoint['state_dict'] (the file also holds 'epoch')"),
]
EXPECTED += [
    ("forged_header_length.safetensors", INFO, 3, "blobtool: forged_header_length.safetensors: truncated at byte 0: "
                                                  "the header length declares 1099511627776 bytes, 69 remain"),
    ("header_not_json.safetensors", INFO, 3, "blobtool: header_not_json.safetensors: at byte 44: the header is not "
                                             "JSON: Expecting property name enclosed in double quotes"),
    ("offsets_outside.safetensors", INFO, 3, "blobtool: offsets_outside.safetensors: at byte 70: tensor 'w': "
                                             "data_offsets [0, 16] end past the file: the data holds 8 bytes"),
    ("overlapping.safetensors", INFO, 3, "blobtool: overlapping.safetensors: at byte 135: tensor 'b' data_offsets "
                                         "[4, 12] overlaps the tensor before it (expected it to begin at 8)"),
    ("unknown_dtype.safetensors", INFO, 3, "blobtool: unknown_dtype.safetensors: at byte 8: tensor 'w': unknown "
                                           "dtype 'F128'; blobtool reads F64, F32, F16, I64, I32, I16, I8, U64, "
                                           "U32, U16, U8, BOOL, BF16"),
    # Caffe's HDF5 snapshots: the file and the HDF5 path at fault.
    ("truncated.caffemodel.h5", INFO, 3, "blobtool: truncated.caffemodel.h5: HDF5 /: not a readable HDF5 file: "
                                         "truncated file: eof = 3988, sblock->base_addr = 0, stored_eof = 7976"),
    ("truncated.solverstate.h5", INFO, 3, "blobtool: truncated.solverstate.h5: HDF5 /: not a readable HDF5 file: "
                                          "truncated file: eof = 1000, sblock->base_addr = 0, stored_eof = 3390"),
    ("other_groups.caffemodel.h5", INFO, 3, "blobtool: other_groups.caffemodel.h5: HDF5 /model_weights: not part "
                                            "of Caffe's net snapshot (which holds data, diff)"),
    ("string_blob.caffemodel.h5", INFO, 3, "blobtool: string_blob.caffemodel.h5: HDF5 /data/conv1/0: holds string "
                                           "values; a blob is a float dataset (float32 or float64)"),
    ("scalar_blob.caffemodel.h5", INFO, 3, "blobtool: scalar_blob.caffemodel.h5: HDF5 /data/conv1/0: is a 0-d "
                                           "(scalar) dataset; a blob's dataset has 1 to 32 axes"),
    ("int_blob.caffemodel.h5", INFO, 3, "blobtool: int_blob.caffemodel.h5: HDF5 /data/conv1/0: holds int32 values; "
                                        "a blob is a float dataset (float32 or float64)"),
    ("int_history.solverstate.h5", INFO, 3, "blobtool: int_history.solverstate.h5: HDF5 /history/0: holds int32 "
                                            "values; a blob is a float dataset (float32 or float64)"),
    # A file names only itself: what points elsewhere is refused before a value is read.
    ("external_storage.caffemodel.h5", INFO, 3, "blobtool: external_storage.caffemodel.h5: HDF5 /data/ip1/0: keeps "
                                                "its values in another file ('/dev/zero') (HDF5 external storage); "
                                                "a file names only itself: blobtool never reads another"),
    ("external_iter.solverstate.h5", INFO, 3, "blobtool: external_iter.solverstate.h5: HDF5 /iter: keeps its values "
                                              "in another file ('/dev/zero') (HDF5 external storage); a file names "
                                              "only itself: blobtool never reads another"),
    ("virtual_self.caffemodel.h5", ["norm"], 3, "blobtool: virtual_self.caffemodel.h5: HDF5 /data/ip1/0: is a virtual "
                                                "dataset (its values are mapped from other datasets, maybe in other "
                                                "files); a file names only itself: blobtool never follows one"),
    ("external_link.caffemodel.h5", INFO, 3, "blobtool: external_link.caffemodel.h5: HDF5 /data/ip1/0: is an "
                                             "external link to '/nonexistent/other.h5:/data/conv1/0'; a file names "
                                             "only itself: blobtool never follows a link into another file"),
    ("not_utf8.caffemodel.h5", INFO, 3, "blobtool: not_utf8.caffemodel.h5: HDF5 /data/ip\\xff: a name that is not "
                                        "UTF-8 (Caffe's layer names are text)"),
    ("listed_twice.solverstate.h5", INFO, 3, "blobtool: listed_twice.solverstate.h5: HDF5 /history/0: listed twice "
                                             "in its group (a damaged file)"),
    ("iter_2_40.solverstate.h5", ["convert", "-o", "out.solverstate"], 3,
     "blobtool: iter_2_40.solverstate.h5: HDF5 /iter: 1099511627776 does not fit Caffe's iter (a 32-bit integer)"),
    ("training_data.h5", INFO, 3, "blobtool: training_data.h5: HDF5 /: an HDF5 dataset file (training data, as "
                                  "Caffe's HDF5Data layer reads: data, label), not a Caffe snapshot; blobtool reads "
                                  "snapshots (.caffemodel.h5, .solverstate.h5)"),
    ("huge_chunks.caffemodel.h5", ["norm"], 3, "blobtool: huge_chunks.caffemodel.h5: HDF5 /data/ip1/0: is stored in "
                                               "chunks of 268435456 bytes, more than blobtool's bound of 64 MiB "
                                               "(HDF5 reads a chunk whole); rechunk it, for example h5repack -l "
                                               "CONTI"),
    ("keras_weights.h5", INFO, 3, "blobtool: keras_weights.h5: HDF5 /: not a Caffe snapshot: the file holds "
                                  "model_weights; expected a group 'data' (a net) or iter, learned_net, "
                                  "current_step, history (a solver state)"),
    ("constant_large.pb", ["info", "--stats"], 0, ""),
    ("constant_large_float.pb", ["info", "--stats"], 0, ""),
    ("near_float64_max.pb", ["info", "--stats"], 0, ""),
    ("signalling_nan.pb", ["info", "--stats"], 0, ""),
    ("signalling_nan.pb", ["compare", "signalling_nan.npy"], 0, ""),  # NaN at the same place: equal
    ("signalling_nan.pb", ["show"], 0, ""),
    ("signalling_nan.npy", ["compare", "--rtol", "0.1", "signalling_nan.pb"], 0, ""),
    ("signalling_nan.npy", ["info", "--stats", "--check", "finite"], 1,
     "blobtool: signalling_nan.npy: check finite failed: blob 0 data has 1 NaN and 0 Inf"),
    ("legacy_overflow.pb", ["convert", "--legacy", "-o", "out.pb"], 2,
     "blobtool: legacy_overflow.pb: blob 0: the legacy layout holds dimensions up to 2147483647 (int32 fields); "
     "dimension 1 of shape (0, 3000000000) is 3000000000"),
    # Nothing written in another format than asked, no value turned into Inf in silence.
    ("huge_values.pb", ["convert", "--half-strict", "-o", "out.npz"], 2,
     "blobtool: huge_values.pb: --strict: blob 0: 3 of 3 values are past float16's range (largest 1e+308, "
     "float16 holds up to 65504); nothing written"),
    ("huge_values.pb", ["convert", "-o", "out.json"], 2,
     "blobtool: out.json: blobtool does not write '.json' files; it writes blob (.pb, .binaryproto, .blob, "
     ".protobin), protobuf (.caffemodel, .solverstate), hdf5 (.h5, .hdf5), npy (.npy), npz (.npz), safetensors "
     "(.safetensors), prototxt (.prototxt, .pbtxt); or name the format with --format"),
    ("huge_values.pb", ["convert", "-o", "mean.png"], 2,
     "blobtool: mean.png: blobtool does not write '.png' files; it writes blob (.pb, .binaryproto, .blob, "
     ".protobin), protobuf (.caffemodel, .solverstate), hdf5 (.h5, .hdf5), npy (.npy), npz (.npz), safetensors "
     "(.safetensors), prototxt (.prototxt, .pbtxt); pictures are written by `blobtool show -o PATH.png`"),
    ("hostile_names.caffemodel", ["info", "--stats"], 0, ""),
    ("hostile_names.caffemodel", ["show"], 2,
     "blobtool: hostile_names.caffemodel: show draws one blob; 2 match (\\x1b]0;owned\\x07conv1/0, "
     "fc\\u202eevil/0): choose one with --blob NAME"),
]


def write_corpus(folder: Path) -> None:
    """Write the files and expected.json into `folder`, replacing what is there."""
    folder.mkdir(exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    for name, data in FILES.items():
        (folder / name).write_bytes(data)
    missing = {f for f, *_ in EXPECTED} ^ set(FILES)
    assert not missing, f"files without an expected answer, or answers without a file: {missing}"
    rows = [{"file": f, "args": args, "exit": code, "stderr": err} for f, args, code, err in EXPECTED]
    (folder / "expected.json").write_text(json.dumps(rows, indent=1) + "\n")


def main() -> None:
    write_corpus(CORPUS)
    print(f"wrote {len(FILES)} files and expected.json ({len(EXPECTED)} answers) to {CORPUS}")


if __name__ == "__main__":
    main()
