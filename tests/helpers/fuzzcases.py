"""Seeds, mutations and the per-case check shared by the fuzz tests and the long fuzz run.

Seeds are small valid files of every kind blobtool reads, made with
tests/helpers/builders.py: with the protobuf library (the oracle) where the schema
covers them, by hand for the forks' fields. Mutations damage them the way real
files are damaged or forged: cut at a field boundary or anywhere, bits flipped,
a varint inserted, a length prefix overwritten with a huge value, a tag
replaced, bytes replaced with random ones.

`check_case` runs one input through the library as a user would (open, build
every blob, take its norms) and raises `FuzzFailure` when anything other than
a BlobToolError escapes (a warning included), two blobs share a name, the
case takes longer than `TIME_LIMIT_S`, or the peak of traced allocations
exceeds `memory_bound(len(data))`. `check_rewrite` writes an accepted Caffe
file back with no option and fails unless every blob comes back with its
values, its stored type and the unknown fields inside it.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import time
import tracemalloc
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
# Loaded here, not in the first case that reads a net's definition (whose allocations are measured).
from google.protobuf import json_format, text_format  # noqa: F401

import blobtool.formats.caffe.netdef  # noqa: F401
import blobtool.formats.prototxt  # noqa: F401
from blobtool.formats.caffe import wire
from blobtool._pb import blobtool_caffe_pb2 as pb
from blobtool.formats import open_document
from blobtool.formats.caffe import MAX_LAYERS
from blobtool.errors import BlobToolError
from builders import (I32, I64, Layer, blob_bytes, blob_proto, h5_bytes, h5_net_bytes, h5_solverstate_bytes, h5_string,
                      half_blob_bytes, net_bytes, npy_bytes, npy_header_bytes, npz_bytes, raw_blob_bytes,
                      solverstate_bytes, tag, ternary_blob_bytes, vector_bytes, zip_bytes)

# The format modules are imported here, not inside the first traced case
# (the registry imports each when a file of its format is first met).
for _module in ("caffe", "numpy", "pytorch"):
    importlib.import_module(f"blobtool.formats.{_module}")

# A case that takes longer than this is a hang waiting to happen on a real file.
TIME_LIMIT_S = 1.0
# HDF5 loops forever on some damaged metadata; blobtool stops it after
# BLOBTOOL_HDF5_SECONDS (formats/hdf5/h5.py). The fuzzers give it 1 s, and a
# case refused for that may take that much more than TIME_LIMIT_S.
HDF5_SECONDS = 1
_HDF5_LOOPED = "HDF5's library did not finish reading"
# Traced allocations may reach this multiple of the input size (plus MEMORY_SLACK).
# The largest legitimate growth is ditcaffe's half_data: a value can take one
# byte, passes through a 2-byte float16 array and becomes a 4-byte float32
# blob (6x), on top of the reader's own copy of a stream (1x).
MEMORY_FACTOR = 8
# Fixed allowance: the norms' 512 KiB float64 chunk buffer, protobuf messages,
# numpy's and hypothesis's bookkeeping.
MEMORY_SLACK = 1 << 20

# Lengths a forged length prefix or dimension may claim: just past the end,
# int32 and int64 edges, and the largest varint.
HUGE_VALUES = (2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53, 2**62, 2**63 - 1, 2**63, 2**64 - 1)


def memory_bound(size: int) -> int:
    return MEMORY_FACTOR * size + MEMORY_SLACK


class FuzzFailure(AssertionError):
    """A case broke one of the promises (wrong exception, too slow, too much memory)."""


# -- seeds -------------------------------------------------------------------------

def _values(n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [float(v) for v in rng.standard_normal(n).astype(np.float32)]


def _blob(shape=(2, 3, 2), *, legacy=False, double=False, diff=True, seed=0) -> pb.BlobProto:
    """A blob of random values drawn from `seed` (the diff from seed + 1)."""
    count = int(np.prod(shape)) if shape else 1
    values = np.array(_values(count, seed), np.float32).reshape(shape)
    return blob_proto(values, np.array(_values(count, seed + 1), np.float32).reshape(shape) if diff else None,
                      layout="legacy" if legacy else "shape", double=double)


def _nvidia_raw() -> bytes:
    """NVIDIA Caffe's BlobProto: shape, raw_data_type FLOAT16, raw_data; raw_diff_type FLOAT, raw_diff."""
    return raw_blob_bytes(np.asarray(_values(12, 5), dtype="<f2").reshape(3, 4),
                          np.asarray(_values(12, 6), dtype="<f4").reshape(3, 4))


def _ditcaffe_half() -> bytes:
    """ditcaffe's BlobProto: shape, half_data and half_diff as packed uint32 varints of float16 bits."""
    return half_blob_bytes(np.asarray(_values(10, 7), dtype="<f2").reshape(2, 5),
                           np.asarray(_values(10, 8), dtype="<f2").reshape(2, 5))


def _unpacked_blob() -> bytes:
    """data and double_diff written unpacked (one tagged value each), as old writers did."""
    out = blob_bytes(shape=[5])
    for v in _values(5, 9):
        out += tag(5, I32) + np.float32(v).tobytes()
    for v in _values(5, 10):
        out += tag(9, I64) + np.float64(v).tobytes()
    return out


def _net_layer() -> bytes:
    return net_bytes("new", [
        Layer("conv1", "Convolution", [_blob((2, 1, 2, 2), seed=11), _blob((2,), diff=False, seed=12)],
              bottom=["data"], top=["conv1"]),
        Layer("relu1", "ReLU", bottom=[], top=[]),
        Layer("ip1", "InnerProduct", [_blob((3, 2), double=True, seed=13)], bottom=[], top=[]),
    ], name="tiny", inputs=["data"])


def _net_v1() -> bytes:
    return net_bytes("v1", [
        Layer("conv1", "Convolution", [_blob((2, 1, 2, 2), legacy=True, seed=21),
                                       _blob((2,), legacy=True, diff=False, seed=22)], bottom=["data"]),
        Layer("ip1", "InnerProduct", [_blob((3, 2), legacy=True, seed=23)], bottom=[]),
    ], name="tiny_v1")


def _net_v0() -> bytes:
    return net_bytes("v0", [
        Layer(name, type_, [_blob((2, 2), legacy=True, seed=31 + k), _blob((2,), legacy=True, diff=False, seed=41 + k)],
              bottom=["data"], top=[])
        for k, (name, type_) in enumerate((("conv1", "conv"), ("ip1", "innerproduct")))
    ], name="tiny_v0")


def _solverstate() -> bytes:
    return solverstate_bytes([_blob((2, 1, 2, 2), diff=False, seed=51), _blob((2,), diff=False, seed=52),
                              _blob((3, 2), legacy=True, diff=False, seed=53)],
                             iter_=1000, learned_net="tiny_iter_1000.caffemodel", current_step=2)


def _vector() -> bytes:
    return vector_bytes([_blob((2, 3), seed=61), _blob((4,), double=True, seed=62),
                         _blob((1, 2, 2, 1), legacy=True, diff=False, seed=63)])


# Fields no BlobProto schema knows, as a fork might add them after the known ones.
BLOB_UNKNOWN = (wire.encode_tag(14, wire.VARINT) + wire.encode_varint(300) + wire.len_field_header(100, 3) + b"ext"
                + wire.encode_tag(2000, wire.I32) + b"\x01\x02\x03\x04")


def _blob_with_unknown() -> bytes:
    return _blob((2, 3), seed=91).SerializeToString() + BLOB_UNKNOWN


def _net_repeated_names() -> bytes:
    """Layer names that collide with the names blobtool makes up: a, a, a#2, an unnamed one, layer3."""
    return net_bytes("new", [
        Layer(name, "InnerProduct", [_blob((2,), diff=False, seed=95 + k)], bottom=[], top=[])
        for k, name in enumerate(("a", "a", "a#2", "", "layer3"))
    ], name="names")


def _vector_unknown() -> bytes:
    """A vector of blobs with unknown fields inside, one an NVIDIA raw INT blob."""
    raw_int = raw_blob_bytes(np.arange(-3, 3, dtype="<i4").reshape(2, 3) * 16777217)
    return b"".join(wire.len_field_header(1, len(b)) + b for b in (_blob_with_unknown(), raw_int + BLOB_UNKNOWN))


def _npz(compressed: bool) -> bytes:
    rng = np.random.default_rng(71)
    arrays = {"w": rng.standard_normal((3, 4)).astype(np.float32),
              "w/diff": rng.standard_normal((3, 4)).astype(np.float32),
              "b": rng.standard_normal(4)}
    return npz_bytes(arrays, compressed=compressed)


def _pt(**kw) -> bytes:
    """A PyTorch checkpoint (tests/helpers/ptfiles.py) of float32, float16, bfloat16 and int64 tensors, one a strided view."""
    import collections

    from ptfiles import Storage, Tensor, pt_bytes

    rng = np.random.default_rng(73)
    shared = Storage(rng.standard_normal(12))
    state = collections.OrderedDict([
        ("conv.weight", Tensor(rng.standard_normal((2, 3, 2)).astype(np.float32), parameter=True)),
        ("conv.bias", Tensor(rng.standard_normal(2).astype(np.float16))),
        ("bn.weight", Tensor(np.array([0x3F80, 0xC040], np.uint16), bf16=True)),
        ("bn.num_batches_tracked", Tensor(np.array(12, np.int64))),
        ("fc.weight", Tensor(storage=shared, offset=1, size=(3, 3), stride=(1, 3))),
    ])
    return pt_bytes({"state_dict": state, "epoch": 3}, **kw)


def _pt_training() -> bytes:
    """A training checkpoint: model, an Adam optimizer's state (tensors by int key), a scheduler, numbers."""
    import collections

    from ptfiles import Tensor, pt_bytes

    model = collections.OrderedDict([("fc.weight", Tensor(np.ones((2, 3), np.float32), parameter=True)),
                                     ("fc.bias", Tensor(np.zeros(2, np.float32), parameter=True))])
    adam = {"state": {0: {"step": Tensor(np.array(3.0, np.float32)), "exp_avg": Tensor(np.ones((2, 3), np.float32))}},
            "param_groups": [{"lr": 0.001, "betas": (0.9, 0.999), "params": [0, 1], "amsgrad": False}]}
    return pt_bytes({"model": model, "optimizer": adam, "lr_scheduler": {"last_epoch": 3}, "epoch": 3,
                     "best": float("nan"), "name": "run", "sizes": (None, True, -7)})


@dataclass(frozen=True)
class Seed:
    """A valid input: its name, the kind its reader is, and its bytes."""

    name: str
    kind: str
    data: bytes


def generated_seeds() -> list:
    """One small valid file per reader and encoding."""
    rng = np.random.default_rng(81)
    return [
        Seed("blob_shape", "blob", _blob((2, 3, 2)).SerializeToString()),
        Seed("blob_legacy", "blob", _blob((3, 2, 2), legacy=True).SerializeToString()),
        Seed("blob_double", "blob", _blob((4, 3), double=True).SerializeToString()),
        Seed("blob_unpacked", "blob", _unpacked_blob()),
        Seed("vector", "vector", _vector()),
        Seed("net_layer", "net", _net_layer()),
        Seed("net_v1", "net", _net_v1()),
        Seed("net_v0", "net", _net_v0()),
        Seed("solverstate", "solverstate", _solverstate()),
        Seed("nvidia_raw", "blob", _nvidia_raw()),
        Seed("ditcaffe_half", "blob", _ditcaffe_half()),
        Seed("ternary_fork", "blob", ternary_blob_bytes(np.asarray(_values(8, 71), np.float32).reshape(2, 4))),
        Seed("blob_unknown", "blob", _blob_with_unknown()),
        Seed("net_repeated_names", "net", _net_repeated_names()),
        Seed("vector_unknown", "vector", _vector_unknown()),
        Seed("npy_f32", "npy", npy_bytes(rng.standard_normal((3, 4)).astype(np.float32))),
        Seed("npy_f64_fortran", "npy", npy_bytes(np.asfortranarray(rng.standard_normal((4, 3))))),
        Seed("npz", "npz", _npz(False)),
        Seed("npz_compressed", "npz", _npz(True)),
        Seed("prototxt", "net", PROTOTXT_SEED),
        Seed("prototxt_v1", "net", PROTOTXT_V1_SEED),
        Seed("pt", "pt", _pt()),
        Seed("pt_deflated_big_endian", "pt", _pt(deflate_storages=True, byteorder="big")),
        Seed("pt_training_checkpoint", "pt", _pt_training()),
    ]


# Net definitions in text (no blobs): every kind of field, a V2 and a V1 net.
PROTOTXT_SEED = b"""# a deploy net
name: "seed"
input: "data"
input_shape { dim: 1 dim: 3 dim: 8 dim: 8 }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  param { lr_mult: 1 decay_mult: 1 }
  convolution_param { num_output: 4 kernel_size: 3 stride: 2 pad: 1 group: 1 bias_term: false
                      weight_filler { type: "msra" } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" batch_norm_param { eps: 0.001 } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: AVE global_pooling: true } }
layer { name: "fc" type: "InnerProduct" bottom: "pool1" top: "fc" inner_product_param { num_output: 10 } }
"""
PROTOTXT_V1_SEED = b"""name: "old"
layers { name: "data" type: DATA top: "data" data_param { source: "lmdb" scale: 0.5 mirror: true } }
layers { name: "ip" type: INNER_PRODUCT bottom: "data" top: "ip" blobs_lr: 1 blobs_lr: 2
         inner_product_param { num_output: 3 } }
"""


# The real files and the kind each is.
REALWORLD_KINDS = {"imagenet_mean.binaryproto": "blob", "lenet_iter_10000.caffemodel": "net",
                   "lenet_iter_10000.solverstate": "solverstate"}


def realworld_seeds(folder: Path) -> list:
    return [Seed(name, kind, (folder / name).read_bytes()) for name, kind in REALWORLD_KINDS.items()
            if (folder / name).is_file()]


# Caffe's HDF5 snapshots (h5py needed): their seeds and the real one, kept apart from the
# protobuf and numpy seeds above, whose checks walk protobuf fields.
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
REALWORLD_HDF5_KINDS = {"cifar10_full_iter_70000.caffemodel.h5": "net"}


def hdf5_seeds() -> list:
    """Nets (float with diffs, a layer without parameters, a shared parameter; double) and a solver state."""
    def arrays(seed, *shapes, dtype=np.float32):
        return [np.array(_values(int(np.prod(s)), seed + k), dtype).reshape(s) for k, s in enumerate(shapes)]

    float_layers = [("conv1", arrays(91, (2, 1, 2, 2), (2,))), ("relu1", []), ("ip1", arrays(93, (3, 4), (3,)))]
    double_layers = [("ip1", arrays(95, (3, 4), (3,), dtype=np.float64)), ("ip2", arrays(97, (3, 4), (3,)))]
    diffs = {(name, i): a * 0.5 for name, blobs in float_layers for i, a in enumerate(blobs)}
    def other_storage(f):
        # What other writers make and blobtool reads through h5py: chunked and
        # compressed, big-endian, float16, compact.
        data = f.create_group("data")
        conv, ip = arrays(101, (4, 2, 3, 3), (6, 5))
        data.create_group("conv1").create_dataset("0", data=conv, chunks=(1, 2, 3, 3), compression="gzip",
                                                  shuffle=True)
        data.create_group("ip1").create_dataset("0", data=ip.astype(">f4"), chunks=(2, 5))
        data.create_group("ip2").create_dataset("0", data=ip.astype(np.float16))
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        dsid = h5py.h5d.create(data.create_group("ip3").id, b"0", h5py.h5t.IEEE_F64LE,
                               h5py.h5s.create_simple((6, 5)), dcpl=dcpl)
        dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, ip.astype(np.float64))

    import h5py

    return [
        Seed("h5_net_float_diff", "net", h5_net_bytes(float_layers, diffs=diffs)),
        Seed("h5_net_double_shared", "net", h5_net_bytes(double_layers, shared={("ip2", 0)})),
        Seed("h5_solverstate", "solverstate", h5_solverstate_bytes(arrays(99, (2, 1, 2, 2), (2,), (3, 2)),
                                                                   iter_=1000, current_step=2)),
        Seed("h5_net_other_storage", "net", h5_bytes(other_storage)),
    ]


def hdf5_refused_seeds() -> list:
    """Files that name other files or damage names, each refused whole (exit 3) before a value is read.

    External storage (/dev/zero: never read), a virtual dataset whose source
    is the file itself ("."), an external link, a soft link, a layer name
    that is not UTF-8. Their mutations reach the same checks from damaged
    bytes.
    """
    import h5py

    ones = np.ones((2, 3), np.float32)

    def net(extra):
        def build(f):
            data = f.create_group("data")
            data.create_group("conv1").create_dataset("0", data=ones)
            extra(f, data)
        return build

    def external(f, data):
        data.create_group("ip1").create_dataset("0", shape=(4,), dtype="<f4", external=[("/dev/zero", 0, 16)])

    def untimed():  # no timestamps: the same bytes every time
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_obj_track_times(False)
        return dcpl

    def virtual(f, data):
        dcpl = untimed()
        dcpl.set_layout(h5py.h5d.VIRTUAL)
        dcpl.set_virtual(h5py.h5s.create_simple((6,)), b".", b"/data/ip1/0", h5py.h5s.create_simple((6,)))
        h5py.h5d.create(data.create_group("ip1").id, b"0", h5py.h5t.IEEE_F32LE, h5py.h5s.create_simple((6,)),
                        dcpl=dcpl)

    def external_link(f, data):
        data.create_group("ip1")["0"] = h5py.ExternalLink("/nonexistent/other.h5", "/data/conv1/0")

    def soft_link(f, data):
        data.create_group("ip1")["0"] = h5py.SoftLink("/data/conv1/0")

    def not_utf8(f, data):
        gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
        gcpl.set_obj_track_times(False)
        group = h5py.h5g.create(data.id, b"ip\xff", gcpl=gcpl)
        h5py.h5d.create(group, b"0", h5py.h5t.IEEE_F32LE, h5py.h5s.create_simple((2,)), dcpl=untimed())

    def external_iter(f):
        dcpl = untimed()
        dcpl.set_external(b"/dev/zero", 0, 4)
        h5py.h5d.create(f.id, b"iter", h5py.h5t.STD_I32LE, h5py.h5s.create_simple((1,)), dcpl=dcpl)
        h5_string(f, "learned_net", "x")
        f.create_dataset("current_step", data=np.array([0], np.int32))
        f.create_group("history").create_dataset("0", data=ones)

    return [
        Seed("h5_refused_external", "net", h5_bytes(net(external))),
        Seed("h5_refused_virtual", "net", h5_bytes(net(virtual))),
        Seed("h5_refused_external_link", "net", h5_bytes(net(external_link))),
        Seed("h5_refused_soft_link", "net", h5_bytes(net(soft_link))),
        Seed("h5_refused_not_utf8", "net", h5_bytes(net(not_utf8))),
        Seed("h5_refused_external_iter", "solverstate", h5_bytes(external_iter)),
    ]


def realworld_hdf5_seeds(folder: Path) -> list:
    return [Seed(name, kind, (folder / name).read_bytes()) for name, kind in REALWORLD_HDF5_KINDS.items()
            if (folder / name).is_file()]


def hdf5_layout(data: bytes) -> Layout:
    """For HDF5: the superblock's fields and where each dataset's values start and end stand in for field
    boundaries; the low 4 bytes of the superblock's base and end-of-file addresses for lengths."""
    import h5py

    boundaries = {0, 8, 16, 24, 32, 40, 48, 56, 64, 96, len(data)}
    try:
        with h5py.File(io.BytesIO(data), "r") as f:
            def visit(name, obj):
                if isinstance(obj, h5py.Dataset) and obj.id.get_offset() is not None:
                    boundaries.update((obj.id.get_offset(), obj.id.get_offset() + obj.id.get_storage_size()))
                boundaries.add(h5py.h5o.get_info(obj.id).addr)
            f.visititems(visit)
    except Exception:  # noqa: BLE001  any damage: best effort
        pass
    return Layout(tuple(sorted(b for b in boundaries if 0 <= b <= len(data))), ((24, 28), (40, 44)), ())


# -- where the fields are ---------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """Byte positions in a protobuf input worth aiming at.

    boundaries: where a field starts or ends, at every nesting depth.
    lengths: (start, end) of each length prefix of a LEN field.
    tags: (start, end) of each field's tag.
    """

    boundaries: tuple
    lengths: tuple
    tags: tuple


def _walk(buf, start, end, depth, boundaries, lengths, tags, budget):
    try:
        for f in wire.iter_fields(buf, start, end):
            if budget[0] <= 0:
                return
            budget[0] -= 1
            tag_end = wire.read_varint(buf, f.offset, end)[1]
            boundaries.update((f.offset, f.end))
            tags.append((f.offset, tag_end))
            if f.wire_type == wire.LEN:
                lengths.append((tag_end, f.start))
                boundaries.add(f.start)
                # Payloads of floats are not messages; everything else may be.
                if depth < 6 and f.end - f.start and not _is_payload(f.number):
                    _walk(buf, f.start, f.end, depth + 1, boundaries, lengths, tags, budget)
    except BlobToolError:
        return


def _is_payload(number: int) -> bool:
    return number in (5, 6, 8, 9, 12, 13)


def layout(data: bytes, *, max_fields: int = 20000) -> Layout:
    """The field boundaries, length prefixes and tags of a protobuf input (best effort)."""
    boundaries, lengths, tags = {0, len(data)}, [], []
    _walk(memoryview(data), 0, len(data), 0, boundaries, lengths, tags, [max_fields])
    return Layout(tuple(sorted(boundaries)), tuple(lengths), tuple(tags))


def zip_layout(data: bytes) -> Layout:
    """For .npz: the zip records' offsets stand in for field boundaries, sizes for lengths."""
    boundaries = {0, len(data)}
    lengths = []
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for info in archive.infolist():
                boundaries.add(info.header_offset)
                # The local header's compressed and uncompressed sizes (4 bytes each).
                lengths.append((info.header_offset + 18, info.header_offset + 22))
                lengths.append((info.header_offset + 22, info.header_offset + 26))
                data_start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
                boundaries.update((data_start, data_start + 10, data_start + info.compress_size))
    except Exception:  # noqa: BLE001  any damage: best effort (zipfile raises a dozen kinds)
        pass
    return Layout(tuple(sorted(boundaries)), tuple(lengths), ())


def npy_layout(data: bytes) -> Layout:
    """For .npy: magic, version, header length, header, array data."""
    header_end = 10 + int.from_bytes(data[8:10], "little") if len(data) >= 10 else len(data)
    return Layout(tuple(sorted({0, 6, 8, 10, header_end, len(data)})), ((8, 10),), ())


def text_layout(data: bytes) -> Layout:
    """For text: where each line starts, and each word."""
    starts = {0, len(data)}
    for i, byte in enumerate(data):
        if byte in b" \n{}:":
            starts.add(i + 1)
    return Layout(tuple(sorted(s for s in starts if s <= len(data))), (), ())


def layout_of(seed: Seed) -> Layout:
    if seed.name.startswith("prototxt"):
        return text_layout(seed.data)
    if seed.data.startswith(HDF5_SIGNATURE):
        return hdf5_layout(seed.data)
    if seed.kind in ("npz", "pt"):
        return zip_layout(seed.data)
    if seed.kind == "npy":
        return npy_layout(seed.data)
    return layout(seed.data)


# -- mutations ----------------------------------------------------------------------------
# Each takes the input, its layout and a source of choices `pick(kind, *args)`
# so the same code serves hypothesis (st.data()) and a plain random.Random.

def truncate_at_boundary(data, lay, pick):
    return data[:pick("index", lay.boundaries)]


def truncate_anywhere(data, lay, pick):
    return data[:pick("int", 0, max(len(data) - 1, 0))]


def flip_bits(data, lay, pick):
    out = bytearray(data)
    for _ in range(pick("int", 1, 8)):
        if not out:
            break
        out[pick("int", 0, len(out) - 1)] ^= 1 << pick("int", 0, 7)
    return bytes(out)


def insert_varint(data, lay, pick):
    value = pick("choice", (0, 1, 127, 128, 300, 2**32, 2**64 - 1, pick("int", 0, 2**64 - 1)))
    raw = wire.encode_varint(value)
    if pick("bool"):  # an overlong varint: continuation bytes past the 10th
        raw = b"\xff" * pick("int", 9, 12) + b"\x01"
    where = pick("index", lay.boundaries) if pick("bool") else pick("int", 0, len(data))
    return data[:where] + raw + data[where:]


def overwrite_length(data, lay, pick):
    if not lay.lengths:
        return flip_bits(data, lay, pick)
    start, end = pick("index", lay.lengths)
    if end > len(data):
        return flip_bits(data, lay, pick)
    if end - start == 4 or (end - start == 2 and lay.tags == ()):  # zip / npy: fixed-width integers
        value = pick("choice", (0xFFFFFFFF, 0x7FFFFFFF, 0, len(data) + 1))
        return data[:start] + (value & ((1 << (8 * (end - start))) - 1)).to_bytes(end - start, "little") + data[end:]
    try:
        current = wire.read_varint(memoryview(data), start, min(end, len(data)))[0]
    except BlobToolError:  # an earlier mutation moved or cut it
        current = 0
    value = pick("choice", HUGE_VALUES + (current + 1, len(data), current * 2 + 8))
    return data[:start] + wire.encode_varint(value) + data[end:]


def replace_tag(data, lay, pick):
    if not lay.tags:
        return flip_bits(data, lay, pick)
    start, end = pick("index", lay.tags)
    number = pick("choice", (1, 2, 3, 5, 7, 8, 10, 12, 50, 100, pick("int", 1, 2**29 - 1)))
    wire_type = pick("int", 0, 7)  # 3/4 are groups, 6/7 invalid
    return data[:start] + wire.encode_tag(number, wire_type) + data[end:]


def random_bytes(data, lay, pick):
    n = pick("int", 1, 64)
    noise = pick("bytes", n)
    if pick("bool") or not data:
        return noise
    where = pick("int", 0, len(data))
    return data[:where] + noise + data[where + n:]


def duplicate_span(data, lay, pick):
    # A field repeated: merges, split payloads, a second shape.
    if len(lay.boundaries) < 2:
        return data
    a = pick("index", lay.boundaries)
    b = pick("index", lay.boundaries)
    a, b = min(a, b), max(a, b)
    return data[:b] + data[a:b] + data[b:]


# -- .npy header dictionaries and .npz member names --------------------------------------------

# Keys a header dictionary may hold: the three numpy writes, as bytes, in
# another case, extra ones, ones of other types.
HEADER_KEYS = ("descr", "fortran_order", "shape", b"descr", b"shape", "Shape", "extra", 0, True, None, ("shape",), 1.5)
# descr values: blob dtypes in both byte orders, dtypes blobs refuse, strings
# numpy refuses, structured and sub-array descriptors, other types.
DESCRS = ("<f4", ">f4", "<f8", ">f8", "f4", "float64", "<f2", "<i4", "|u1", "|b1", "O", "|O", "<U4", "|S3", "V8",
          "<c8", "(2,)<f4", "<M8[s]", "", "<f3", "<f4f", "\x00", [("a", "<f4")], [("a", "<f4"), ("a", "<f4")],
          [("", "<f4")], [("a", "<f4", (2,))], [("a",)], [], [[]], ("<f4", (2,)), 4, None, b"<f4", True, 1.5)
# shape values: ordinary, empty, bools, negative, past int32/int64, too many
# axes, overflowing products, other types.
SHAPES = ((), (0,), (3,), (2, 3), (3, 2, 1), (True, 2), (False,), (True,), (-1,), (2, -3), (2**31,), (2**63,),
          (2**64,), (1,) * 33, (0,) * 40, (2**62, 2**62), (0, 2**63), (10**30,), [2, 3], (2.0,), ("2",), (b"2",),
          None, 3, (1, (2,)), (None,), ())
FORTRAN_ORDERS = (False, True, 0, 1, None, "False", b"", 0.0)
ODD_LITERALS = ("{}", "[]", "()", "None", "{1, 2}", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), "
                "'shape': (3,)}", "{[1]: 2}", "{'shape': {}}", "-" * 200 + "1", "(" * 150 + ")" * 150, "",
                "{'descr': '<f4', 'fortran_order': False, 'shape': (2L,)}", "b'x'", "1e999")


def header_dict_text(pick) -> str:
    """The text of an .npy header dictionary: numpy's, with keys or values changed, or an odd literal."""
    how = pick("int", 0, 9)
    if how == 0:
        return pick("choice", ODD_LITERALS)
    header = {"descr": pick("choice", ("<f4", ">f8", "<f8")), "fortran_order": pick("bool"),
              "shape": pick("choice", ((), (3,), (2, 3), (3, 2, 1)))}
    for _ in range(pick("int", 0, 2)):
        field = pick("int", 0, 5)
        if field == 0:
            header["descr"] = pick("choice", DESCRS)
        elif field == 1:
            header["fortran_order"] = pick("choice", FORTRAN_ORDERS)
        elif field in (2, 3):
            header["shape"] = pick("choice", SHAPES)
        elif field == 4:
            header[pick("choice", HEADER_KEYS)] = pick("choice", ("<f4", (2,), False, None, b"x"))
        else:
            header.pop(pick("choice", ("descr", "fortran_order", "shape")), None)
    text = repr(header)
    if pick("bool"):  # numpy's own layout: a trailing comma and space before the brace
        text = text[:-1] + ", }"
    return text


def npy_with_header(pick) -> bytes:
    """An .npy of a drawn header dictionary, then a drawn amount of array data (often the right amount)."""
    text = header_dict_text(pick)
    size = pick("choice", (0, 4, 8, 12, 24, 48, 96))
    return npy_header_bytes(text, bytes(np.arange(size // 4 + 1, dtype="<f4").tobytes()[:size]))


# Parts of member names: numpy's savez keyword names, slashes, the diff
# suffix, non-ASCII letters, bidi controls, dots.
NAME_PARTS = ("file", "allow_pickle", "args", "kwds", "compress", "x", "w", "diff", "/diff", "/", "//", "..", ".npy",
              " ", "ß", "名", "é", "\u202e", "\\", "0", "")


def member_names(pick) -> list:
    """Distinct .npz member names (without ".npy"), from NAME_PARTS, with "/diff" suffixes repeated."""
    names = []
    for _ in range(pick("int", 1, 6)):
        name = "".join(pick("choice", NAME_PARTS) for _ in range(pick("int", 1, 3)))
        name += "/diff" * pick("int", 0, 3)
        if name not in names:
            names.append(name)
    return names


def npz_with_names(pick) -> tuple:
    """(an .npz of float32 arrays of 3 values under drawn names, {name: array}); sometimes compressed."""
    names = member_names(pick)
    arrays = {name: np.arange(3, dtype=np.float32) + 10 * k for k, name in enumerate(names)}
    data = zip_bytes({name + ".npy": npy_bytes(a) for name, a in arrays.items()}, compressed=pick("bool"))
    return data, arrays


def forge_npy_header(data, lay, pick):
    """An .npy seed's header replaced by a drawn dictionary (other inputs: bits flipped)."""
    if not data.startswith(b"\x93NUMPY") or len(data) < 10:
        return flip_bits(data, lay, pick)
    payload = data[10 + int.from_bytes(data[8:10], "little"):]
    return npy_header_bytes(header_dict_text(pick), payload)


def rename_npz_members(data, lay, pick):
    """A readable .npz's members renamed with drawn names (other inputs: bits flipped)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            contents = [archive.read(info) for info in archive.infolist()]
    except Exception:  # noqa: BLE001  any damage: leave it to the byte mutations
        return flip_bits(data, lay, pick)
    names = member_names(pick)
    members = {}
    for k, content in enumerate(contents):
        members[(names[k] if k < len(names) else f"extra{k}") + ".npy"] = content
    return zip_bytes(members, compressed=pick("bool"))


def _zip_members(data) -> tuple:
    """({name: bytes} of a zip's members, the name of its data.pkl or None); ({}, None) for a zip that does not open."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = {info.filename: archive.read(info) for info in archive.infolist()}
    except Exception:  # noqa: BLE001  any damage: leave it to the byte mutations
        return {}, None
    return members, next((name for name in members if name.endswith("/data.pkl")), None)


def damage_pickle(data, lay, pick):
    """A PyTorch checkpoint whose data.pkl (only) is damaged, its CRC made right again (other inputs: bits flipped).

    Damage to the zip's bytes mostly fails data.pkl's CRC, so the unpickler
    is reached through this one.
    """
    members, target = _zip_members(data)
    if target is None:
        return flip_bits(data, lay, pick)
    pickled = members[target]
    plain = Layout((0, len(pickled)), (), ())
    how = pick("choice", (flip_bits, truncate_anywhere, random_bytes, duplicate_span, insert_varint))
    members[target] = how(pickled, plain, pick)
    return zip_bytes(members)


def _pickle_snippets(pick) -> list:
    """Opcodes a hostile pickle inserts: changes onto what is on the stack, memo slots near and far, nesting
    past the limit, globals allowed and not, calls, numbers at the edges of int64."""
    import struct

    from ptfiles import op_int, op_long, op_str

    deep = pick("choice", (63, 64, 65, 2000))
    return [
        # BUILD onto the top: a slotted object's state (None, {...}), a 4-tuple
        # (a frozen dataclass's fields: storage, offset, size, stride), a dict.
        b"b", b"N}" + op_str("storage_offset") + op_long(1 << 40) + b"s\x86b", b"}b",
        b"(N" + op_long(1 << 40) + b"(" + op_int(1 << 30) + b"t(" + op_int(1) + b"ttb", b"2b",
        op_str("k") + op_int(1) + b"s", op_int(1) + b"a", b"(" + op_int(1) + b"\x90",   # SETITEM/APPEND/ADDITEMS
        b"0", b"2", b"1", b"(", b"t", b")", b"}", b"]", b"\x8f", b"\x85", b"\x86", b"\x87", b"e", b"u", b"l",
        b"q\x00", b"h\x00", b"\x94", b"r" + struct.pack("<I", pick("choice", (0, 1, 1 << 20, 1 << 31))),
        b"j" + struct.pack("<I", pick("choice", (0, 3, 1 << 26))),                        # memo slots
        b"N" + b"\x85" * deep, b"]" * deep + b"a" * (deep - 1), b"}" * deep,                # nesting
        b"ccollections\nOrderedDict\n)R", b"ctorch._utils\n_rebuild_tensor_v2\n", b"ctorch\nFloatStorage\n",
        b"cos\nsystem\n", b"R", b"Q", op_str("torch") + op_str("FloatStorage") + b"\x93",
        op_long(pick("choice", ((1 << 62), (1 << 63), -1, (1 << 64) + 1))), op_int(-1), op_int(0x7FFFFFFF),
        b"N", b"\x88", b"\x89", b"\x80\x02", b".",
    ]


def mutate_pickle_ops(data, lay, pick):
    """A PyTorch checkpoint whose data.pkl has opcodes inserted, replaced, removed, reordered or repeated.

    Works on whole opcodes (pickletools.genops' positions), so the result
    still parses as far as the change and reaches the unpickler's handling
    of each opcode (BUILD and SETITEM on what a rebuild returned, memo slots,
    nesting), where byte damage mostly makes an unparsable pickle. Other
    inputs: bits flipped.
    """
    import pickletools

    members, target = _zip_members(data)
    if target is None:
        return flip_bits(data, lay, pick)
    pickled = members[target]
    try:
        with warnings.catch_warnings():  # genops' own complaint of a bad escape in a text string
            warnings.simplefilter("ignore")
            starts = [pos for _, _, pos in pickletools.genops(pickled)]
    except Exception:  # noqa: BLE001  an earlier mutation broke it: cut anywhere instead
        starts = list(range(len(pickled)))
    spans = [(a, b) for a, b in zip(starts, starts[1:] + [len(pickled)])]
    if not spans:
        return flip_bits(data, lay, pick)
    ops = [pickled[a:b] for a, b in spans]
    how = pick("choice", ("insert", "replace", "delete", "swap", "repeat"))
    at = pick("int", 0, len(ops) - 1)
    if how == "insert":
        ops.insert(at, pick("choice", _pickle_snippets(pick)))
    elif how == "replace":
        ops[at] = pick("choice", _pickle_snippets(pick))
    elif how == "delete":
        del ops[at]
    elif how == "swap":
        other = pick("int", 0, len(ops) - 1)
        ops[at], ops[other] = ops[other], ops[at]
    else:
        end = min(len(ops), at + pick("int", 1, 8))
        ops[at:at] = ops[at:end] * pick("choice", (1, 2, 100))
    members[target] = b"".join(ops)
    return zip_bytes(members)


MUTATIONS = (truncate_at_boundary, truncate_anywhere, flip_bits, insert_varint, overwrite_length,
             replace_tag, random_bytes, duplicate_span, forge_npy_header, rename_npz_members, damage_pickle,
             mutate_pickle_ops)
# What the pickle fuzzing applies to checkpoints alone (test_fuzz, fuzz_long --pickle).
PICKLE_MUTATIONS = (mutate_pickle_ops, damage_pickle)


def random_picker(rng):
    """A `pick` over random.Random, for the long run without hypothesis."""

    def pick(what, *args):
        if what == "index":
            return rng.choice(args[0])
        if what == "int":
            return rng.randint(args[0], args[1])
        if what == "choice":
            return rng.choice(args[0])
        if what == "bool":
            return rng.random() < 0.5
        if what == "bytes":
            return rng.randbytes(args[0])
        raise ValueError(what)

    return pick


def mutate(seed: Seed, lay: Layout, pick, rounds: int) -> bytes:
    data = seed.data
    for _ in range(rounds):
        data = pick("choice", MUTATIONS)(data, lay, pick)
    return data


# -- the check --------------------------------------------------------------------------------

def read_everything(data: bytes, kind: str | None) -> None:
    """What a user does: open (sniffed or forced kind), build every blob, take its norms."""
    doc = open_document(io.BytesIO(data), kind)
    names = doc.names()
    if len(set(names)) != len(names):
        raise FuzzFailure(f"two blobs share a name: {sorted(n for n in names if names.count(n) > 1)[:4]}")
    for entry in doc.entries:
        blob = entry.blob()
        blob.asum_data()
        blob.sumsq_data()
        blob.asum_diff()
        blob.sumsq_diff()
    if doc.kind == "net" and doc.format in ("caffe", "prototxt"):
        check_definition(doc)


def check_definition(doc) -> None:
    """A net's definition as info --layers and a .prototxt output make it; its text parses back the same."""
    from google.protobuf import json_format, text_format

    from blobtool import net_definition
    from blobtool.formats.prototxt import definition_text

    found = net_definition(doc)
    for layer in found.layers:
        json_format.MessageToDict(layer.message, preserving_proto_field_name=True)
    if found.escaped_lines("x"):
        # Escapes of bytes that are not UTF-8 (protobuf's Python reader refuses them), up to 4 characters a
        # byte: past the bound on what reading may allocate for a large input, so only a small one's text.
        if doc.size < (1 << 16):
            definition_text(found.net)
        return
    text = definition_text(found.net)
    known = pb.NetParameter()
    known.CopyFrom(found.net)
    known.DiscardUnknownFields()  # a fork's fields, which text cannot carry (and which are warned about)
    if text_format.Parse(text, pb.NetParameter()) != known:
        raise FuzzFailure("a net's definition does not parse back from its text")


@dataclass
class Outcome:
    error: str | None   # the BlobToolError message, or None when the input was accepted
    seconds: float
    peak: int           # peak traced bytes during the case


def check_case(data: bytes, kind: str | None = None) -> Outcome:
    """Run one input; raise FuzzFailure when a promise is broken.

    Traces allocations for the case alone (tracemalloc started and stopped
    around it, so the fuzzer's own work is neither traced nor slowed), or
    within the caller's tracing when it is already on.
    """
    own = not tracemalloc.is_tracing()
    if own:
        tracemalloc.start()
    try:
        with hdf5_time_limit():
            return _check_traced(data, kind)
    finally:
        if own:
            tracemalloc.stop()


@contextlib.contextmanager
def hdf5_time_limit():
    """BLOBTOOL_HDF5_SECONDS at HDF5_SECONDS while a fuzz case is read (unless the caller set it), then as it was.

    Only the fuzz cases get the short limit: a real file read by another test
    on the same worker, on a loaded machine, keeps blobtool's default.
    """
    before = os.environ.get("BLOBTOOL_HDF5_SECONDS")
    if before is None:
        os.environ["BLOBTOOL_HDF5_SECONDS"] = str(HDF5_SECONDS)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("BLOBTOOL_HDF5_SECONDS", None)


def _check_traced(data: bytes, kind: str | None) -> Outcome:
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    start = time.perf_counter()
    error = None
    try:
        # A warning would be a second stderr line on the command line.
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            read_everything(data, kind)
    except BlobToolError as exc:
        error = str(exc)
        if "\n" in error or not error.strip():
            raise FuzzFailure(f"error message is not one non-empty line: {error!r}") from exc
    except FuzzFailure:
        raise
    except Exception as exc:
        raise FuzzFailure(f"{type(exc).__name__} escaped (kind={kind}, {len(data)} bytes): {exc}") from exc
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1] - base
    if seconds > TIME_LIMIT_S + (HDF5_SECONDS if error and _HDF5_LOOPED in error else 0):
        raise FuzzFailure(f"took {seconds:.2f} s (limit {TIME_LIMIT_S} s; kind={kind}, {len(data)} bytes)")
    if peak > memory_bound(len(data)):
        raise FuzzFailure(f"allocated {peak} bytes at peak for a {len(data)}-byte input "
                          f"(bound {memory_bound(len(data))}; kind={kind})")
    return Outcome(error, seconds, peak)


CAFFE_KINDS = ("blob", "vector", "net", "solverstate")


def check_rewrite(data: bytes, kind: str | None = None) -> bool:
    """Write an accepted Caffe file back with no option; FuzzFailure unless every blob survives.

    Each blob must come back under its name with the same shape, stored
    dtype, values (bit for bit, NaN included) and diff, and the same unknown
    fields inside it. Returns False when the input is refused or is not a
    Caffe protobuf kind (nothing to check).
    """
    with hdf5_time_limit():
        return _rewritten_alike(data, kind)


def _rewritten_alike(data: bytes, kind: str | None) -> bool:
    from blobtool import write
    try:
        doc = open_document(io.BytesIO(data), kind)
        if doc.kind not in CAFFE_KINDS or doc.format != "caffe":  # Caffe's HDF5 snapshots hold no records
            return False
        before = {e.name: (e.blob(), e.record) for e in doc.entries}
    except BlobToolError:
        return False
    out = io.BytesIO()
    try:
        write(doc, None, out, format="same")
        again = open_document(io.BytesIO(out.getvalue()), doc.kind)
    except BlobToolError as exc:
        raise FuzzFailure(f"an accepted {doc.kind} could not be written back and read: {exc}") from exc
    after = {e.name: (e.blob(), e.record) for e in again.entries}
    if list(after) != list(before):
        raise FuzzFailure(f"blob names changed on a rewrite: {list(before)[:4]} -> {list(after)[:4]}")
    for name, (blob, record) in before.items():
        blob2, record2 = after[name]
        if (blob2.shape, record2.stored_dtype, record2.has_diff) != (blob.shape, record.stored_dtype, record.has_diff):
            raise FuzzFailure(f"blob {name} changed form on a rewrite")
        if record2.unknown != record.unknown:
            raise FuzzFailure(f"blob {name} lost unknown fields on a rewrite")
        sides = [(blob.cpu_data(), blob2.cpu_data())]
        if record.has_diff:
            sides.append((blob.cpu_diff(), blob2.cpu_diff()))
        if any(a.tobytes() != b.tobytes() for a, b in sides):
            raise FuzzFailure(f"blob {name} changed values on a rewrite")
    return True


# -- shared with the fuzz tests (hypothesis is imported only where they run) --------------------

def fuzz_settings():
    """The fuzz tests' hypothesis settings: derandomized, so CI tests the same cases every time.

    BLOBTOOL_FUZZ_EXAMPLES sets the number of examples per reader (300 unless set).
    """
    from hypothesis import HealthCheck, settings

    examples = int(os.environ.get("BLOBTOOL_FUZZ_EXAMPLES", "300"))
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def hypothesis_picker(data):
    """fuzzcases' `pick` over hypothesis draws, so failures shrink and print."""
    from hypothesis import strategies as st

    def pick(what, *args):
        if what in ("index", "choice"):
            return data.draw(st.sampled_from(args[0]))
        if what == "int":
            return data.draw(st.integers(args[0], args[1]))
        if what == "bool":
            return data.draw(st.booleans())
        if what == "bytes":
            return data.draw(st.binary(min_size=args[0], max_size=args[0]))
        raise ValueError(what)

    return pick


def one_layer_net(blob: bytes, *, extra: bytes = b"", forge_blob_length: int | None = None) -> bytes:
    """One layer (new format) holding `blob` (if any) and then `extra` bytes."""
    layer = pb.LayerParameter(name="conv1", type="Convolution").SerializeToString()
    if blob:
        layer += wire.len_field_header(7, forge_blob_length or len(blob)) + blob
    layer += extra
    return wire.len_field_header(100, len(layer)) + layer


# Inputs made of millions of tiny fields, each within blobtool's limits. Each
# once took about 11 us a field (a 6 MB file of unknown varints 11 s of CPU
# for `info`; 65,536 layers holding an empty blob 4 s). The time they take
# (the goal: about 1 s + 0.2 s per MB read whole) is measured by
# benchmarks/run.py's "floods" case; here every command must read them right.
_UNKNOWN_VARINTS = b"\xf8\x01\x01" * 1_000_000            # field 31, varint 1: 3 MB
TINY_FIELD_FLOODS = {
    "unknown fields in a blob": blob_bytes([1.0]) + _UNKNOWN_VARINTS,  # where protobuf writes them
    "unknown fields in a net and its layer": (wire.len_field_header(1, 1) + b"n" + _UNKNOWN_VARINTS
                                              + one_layer_net(blob_bytes([1.0]), extra=b"\xf8\x01\x01" * 100_000)),
    "unknown fields in a vector": wire.len_field_header(1, len(blob_bytes([1.0]))) + blob_bytes([1.0])
                                  + _UNKNOWN_VARINTS,
    "legacy dims repeated": b"\x08\x01" * 1_500_000 + blob_bytes([1.0], shape=(1, 1, 1, 1), layout="legacy"),
    "empty shapes repeated": b"\x3a\x00" * 1_500_000 + blob_bytes([1.0]),
    "empty data repeated": blob_bytes([1.0]) + b"\x2a\x00" * 1_500_000,
    "raw types repeated": blob_bytes([1.0]) + b"\x50\x01" * 1_500_000,
    "as many layers as allowed, each with a blob": one_layer_net(blob_bytes([1.0])) * MAX_LAYERS,
}
