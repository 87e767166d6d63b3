"""Test inputs, built the way Caffe (or a fork, or a hand-edited file) writes them.

- BlobProto: ``blob_proto`` (the message), ``blob_bytes``, ``write_blob``: shape or
  legacy layout, float32 or float64, with or without a diff, or any field set by hand;
  the forks' encodings: ``raw_blob_bytes`` (NVIDIA Caffe) and ``half_blob_bytes`` (ditcaffe).
- BlobProtoVector: ``vector_bytes``, ``write_vector``.
- NetParameter in the three layer formats (``layer`` = 100, V1 ``layers`` = 2, V0 nested
  in V1): ``Layer``, ``layer_bytes``, ``net_bytes``, ``write_net``; unknown fields inside
  when asked, placed where protobuf itself would never put them.
- SolverState: ``solverstate_proto``, ``solverstate_bytes``, ``write_solverstate``.
- .npy and .npz: ``npy_bytes``, ``npy_header_bytes`` (a hand-made header), ``npz_bytes``,
  ``write_npy``, ``write_npz``; ``zip_bytes`` (members of any name and contents, as given),
  ``npz_named`` (arrays under names numpy's savez cannot take: ``file``, ``allow_pickle`` ...).
- Caffe's HDF5 snapshots (with h5py, imported only there): ``h5_net_bytes``,
  ``h5_solverstate_bytes``, ``h5_bytes`` (anything else), ``h5_string``, ``write_h5``.
- Hand encoding: ``varint``, ``tag``, ``varint_field``, ``len_field``.

The nets here are files to read, made byte by byte: the three layer formats, unknown
fields and forks' fields placed by hand, damaged where a test asks. The nets a test runs
(valid deploy definitions with their layers' settings, built as protobuf messages) are
caffenets.py's: the two build different things, and each kind is built only there.

A blob, wherever one is asked for (a vector's, a layer's, a solver state's history),
may be an array (made with ``blob_proto``), a BlobProto message, or bytes already
serialized (kept as they are).
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np

from blobtool._pb import blobtool_caffe_pb2 as pb

LEGACY_FIELDS = ("num", "channels", "height", "width")


def _protobuf_refuses_bad_utf8() -> bool:
    # The pure-Python runtime (protobuf 3.20 where no compiled one exists) refuses
    # a string that is not UTF-8; the compiled ones hand it over as bytes.
    try:
        pb.NetParameter().ParseFromString(b"\x0a\x01\xff")
    except Exception:  # noqa: BLE001  UnicodeDecodeError or DecodeError, by runtime
        return True
    return False


# Whether this protobuf runtime refuses a string that is not UTF-8 (blobtool then refuses it too).
REFUSES_BAD_UTF8 = _protobuf_refuses_bad_utf8()

# -- hand encoding ----------------------------------------------------------------------

VARINT, I64, LEN, I32 = 0, 1, 2, 5


def signed_values(rng, shape, dtype=np.float32) -> np.ndarray:
    """Distinct signed values from `rng`, with no exact binary sum, in `shape`."""
    n = int(np.prod(shape, dtype=np.int64))
    return (rng.standard_normal(n) * 3 + 0.1).astype(dtype).reshape(shape)


def varint(value: int) -> bytes:
    """A base-128 varint; a negative value as its 64-bit two's complement (10 bytes), as protobuf does."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def varint_field(number: int, value: int) -> bytes:
    return tag(number, VARINT) + varint(value)


def len_field(number: int, payload: bytes) -> bytes:
    return tag(number, LEN) + varint(len(payload)) + payload


# -- BlobProto --------------------------------------------------------------------------

def blob_proto(data=None, diff=None, *, shape=None, layout: str = "shape", double: bool = False,
               **fields) -> pb.BlobProto:
    """A BlobProto holding `data` (and `diff`) as Caffe's ToProto writes it.

    The dims are `shape` when given (they need not match the values), else the
    data's shape; ``layout="legacy"`` writes them as num, channels, height and
    width (padded with 1s in front to four), as pre-2015 Caffe did. Values go to
    data/diff as float32, or to double_data/double_diff with `double`. Any other
    BlobProto field may be given by name: a repeated one is extended, a
    singular one set, whatever the rest says.
    """
    proto = pb.BlobProto()
    dims = shape if shape is not None else (np.shape(data) if data is not None else None)
    if dims is not None:
        if layout == "legacy":
            proto.num, proto.channels, proto.height, proto.width = (1,) * (4 - len(dims)) + tuple(dims)
        else:
            assert layout == "shape", layout
            proto.shape.dim.extend(dims)
    dtype = np.float64 if double else np.float32
    if data is not None:
        (proto.double_data if double else proto.data).extend(np.asarray(data, dtype).ravel().tolist())
    if diff is not None:
        (proto.double_diff if double else proto.diff).extend(np.asarray(diff, dtype).ravel().tolist())
    for name, value in fields.items():
        if name in LEGACY_FIELDS:
            setattr(proto, name, value)
        else:
            getattr(proto, name).extend(np.asarray(value).ravel().tolist())
    return proto


def blob_bytes(data=None, diff=None, **kw) -> bytes:
    """``blob_proto(...)`` serialized."""
    return blob_proto(data, diff, **kw).SerializeToString()


def as_blob_bytes(blob, diff=None, **kw) -> bytes:
    """A blob given as an array, a BlobProto or serialized bytes, as bytes."""
    if isinstance(blob, (bytes, bytearray)):
        return bytes(blob)
    if isinstance(blob, pb.BlobProto):
        return blob.SerializeToString()
    return blob_bytes(blob, diff, **kw)


def write_blob(path: Path, data=None, diff=None, **kw) -> Path:
    """A file holding ``blob_bytes(data, diff, **kw)``."""
    path.write_bytes(blob_bytes(data, diff, **kw))
    return path


RAW_TYPE = {"float64": 0, "float32": 1, "float16": 2, "int32": 3, "uint32": 4}


def raw_blob_bytes(data: np.ndarray, diff: np.ndarray | None = None) -> bytes:
    """NVIDIA Caffe's encoding: shape (7), raw_data_type (10), raw_diff_type (11), raw_data (12), raw_diff (13)."""
    out = blob_bytes(shape=data.shape) + varint_field(10, RAW_TYPE[data.dtype.name])
    if diff is not None:
        out += varint_field(11, RAW_TYPE[diff.dtype.name])
    out += len_field(12, data.astype(data.dtype.newbyteorder("<")).tobytes())
    if diff is not None:
        out += len_field(13, diff.astype(diff.dtype.newbyteorder("<")).tobytes())
    return out


def half_blob_bytes(data: np.ndarray, diff: np.ndarray | None = None) -> bytes:
    """ditcaffe's encoding: shape (7), half_data (10) and half_diff (11), packed uint32 varints of float16 bits."""
    out = blob_bytes(shape=np.shape(data))
    for number, values in ((10, data), (11, diff)):
        if values is not None:
            bits = np.asarray(values, np.float16).view(np.uint16).ravel()
            out += len_field(number, b"".join(varint(int(b)) for b in bits))
    return out


def ternary_fork_fields(scale: float = 0.5) -> bytes:
    """A ternary-quantization fork's own BlobProto fields, as raw wire bytes.

    Field 10 ``repeated float ternary [packed]`` (values whose bytes end with
    a byte of 0x80 or more: no valid run of varints), field 11 packed floats
    that do read as 7 varints, fixed32 fields 12 (alpha) and 13 (delta), and
    a varint field 14.
    """
    ternary = np.array([1, 0, -1, 1, 0, -1], "<f4") * np.float32(scale)
    return (len_field(10, ternary.tobytes()) + len_field(11, np.array([0.0, 1.0], "<f4").tobytes())
            + tag(12, 5) + struct.pack("<f", scale) + tag(13, 5) + struct.pack("<f", 0.7) + varint_field(14, 3))


def ternary_blob_bytes(data: np.ndarray) -> bytes:
    """The fork's BlobProto: Caffe's data (5) and shape (7) as protobuf writes them, then ternary_fork_fields."""
    return blob_bytes(data) + ternary_fork_fields()


# -- BlobProtoVector --------------------------------------------------------------------

def vector_bytes(blobs, diffs=None, **kw) -> bytes:
    """A BlobProtoVector of `blobs` (with `diffs`, and ``blob_proto``'s options `kw`, for arrays)."""
    diffs = diffs or [None] * len(blobs)
    return b"".join(len_field(1, as_blob_bytes(b, d, **kw)) for b, d in zip(blobs, diffs))


def write_vector(path: Path, blobs, diffs=None, **kw) -> Path:
    path.write_bytes(vector_bytes(blobs, diffs, **kw))
    return path


# -- NetParameter -----------------------------------------------------------------------

# V1 enum names and the type string Caffe's UpgradeV1LayerType gives them.
V1_TYPES = {"CONVOLUTION": "Convolution", "INNER_PRODUCT": "InnerProduct", "SOFTMAX_LOSS": "SoftmaxWithLoss",
            "RELU": "ReLU", "POOLING": "Pooling", "DATA": "Data"}
NEW_TYPE_OF_V1 = {v: k for k, v in V1_TYPES.items()}

# Fields of real Caffe messages that blobtool's schema does not list, so the
# protobuf library keeps them as unknown fields: LayerParameter.phase (10),
# .param (6, ParamSpec lr_mult = 3), .convolution_param (106, num_output = 1);
# NetParameter.debug_info (7), and a field no Caffe version has (4242).
LAYER_UNKNOWN_HEAD = varint_field(10, 1) + len_field(6, b"\x1d\x00\x00\x80\x3f")
LAYER_UNKNOWN_TAIL = len_field(106, varint_field(1, 20) + varint_field(4, 5))
NET_UNKNOWN = varint_field(7, 1) + len_field(4242, b"kept as it was")
# Fields a fork might add to a SolverState.
SOLVERSTATE_UNKNOWN = varint_field(99, 42) + len_field(777, b"\x01\x02\x03")


class Layer:
    """A layer to write: its name ('' for none), type (new-style string), and blobs.

    Blobs given as arrays are written with `diffs`, `double` and `legacy`; BlobProto
    messages and bytes as they are. `bottom` and `top` default to each format's
    usual connections (bottom "in", or "data" in V0; top the layer's name, none in V1).
    `params` are raw bytes of more LayerParameter (or V1LayerParameter) fields, such as a
    layer parameter message (``len_field(117, varint_field(6, 1))``: inner_product_param
    { transpose: true }), written after the name, type, bottoms and tops.
    """

    def __init__(self, name, type_, blobs=(), diffs=None, double=False, legacy=False, *, bottom=None, top=None,
                 params: bytes = b""):
        self.name = name
        self.type = type_
        self.blobs = [b if isinstance(b, (bytes, bytearray, pb.BlobProto)) else np.asarray(b) for b in blobs]
        self.diffs = diffs or [None] * len(self.blobs)
        self.double = double
        self.legacy = legacy
        self.bottom = bottom
        self.top = top
        self.params = params

    def blob_bytes(self) -> list:
        layout = "legacy" if self.legacy else "shape"
        return [as_blob_bytes(b, d, double=self.double, layout=layout) for b, d in zip(self.blobs, self.diffs)]


def layer_bytes(fmt: str, layer: Layer, *, unknown: bool = False) -> tuple[int, bytes]:
    """(NetParameter field number, serialized layer) in format `fmt`, unknown fields inside when asked."""
    blobs = layer.blob_bytes()
    if fmt == "new":
        head = pb.LayerParameter()
        if layer.name:
            head.name = layer.name
        head.type = layer.type
        head.bottom.extend(["in"] if layer.bottom is None else layer.bottom)
        head.top.extend([layer.name or "out"] if layer.top is None else layer.top)
        body = head.SerializeToString() + layer.params
        if unknown:
            body += LAYER_UNKNOWN_HEAD
        for i, b in enumerate(blobs):
            body += len_field(7, b)
            if unknown and i == 0:
                body += varint_field(4243, 7)  # between two blobs of one layer
        if unknown:
            body += LAYER_UNKNOWN_TAIL
        return 100, body
    if fmt == "v1":
        head = pb.V1LayerParameter()
        if layer.name:
            head.name = layer.name
        head.type = pb.V1LayerParameter.LayerType.Value(NEW_TYPE_OF_V1[layer.type])
        head.bottom.extend(["in"] if layer.bottom is None else layer.bottom)
        head.top.extend(layer.top or [])
        body = head.SerializeToString() + layer.params
        if unknown:
            body += len_field(100, b"\x08\x01")  # V1's include (NetStateRule)
        for b in blobs:
            body += len_field(6, b)
        if unknown:
            body += len_field(1001, b"V1 blobs_lr")
        return 2, body
    assert fmt == "v0", fmt
    v0 = pb.V0LayerParameter()
    if layer.name:
        v0.name = layer.name
    v0.type = layer.type.lower()
    inner = v0.SerializeToString()
    if unknown:
        inner += varint_field(3, 20)  # V0's num_output
    for b in blobs:
        inner += len_field(50, b)
    if unknown:
        inner += varint_field(51, 1)  # V0's blobs_lr
    body = len_field(1, inner)
    for name in ["data"] if layer.bottom is None else layer.bottom:
        body += len_field(2, name.encode())
    for name in [layer.name or "out"] if layer.top is None else layer.top:
        body += len_field(3, name.encode())
    return 2, body


def net_bytes(fmt: str, layers, *, name="testnet", inputs=(), unknown=False, extra_top=b"") -> bytes:
    """A NetParameter holding `layers` in format `fmt` ("new", "v1" or "v0"), as Caffe would write it.

    `name` None writes no name; `inputs` are the net's input blob names;
    `extra_top` are bytes written after the name, before the layers; `unknown`
    puts unknown fields in the net and in every layer.
    """
    head = pb.NetParameter()
    if name is not None:
        head.name = name
    head.input.extend(inputs)
    out = head.SerializeToString() + extra_top
    if unknown:
        out += NET_UNKNOWN
    for i, layer in enumerate(layers):
        number, body = layer_bytes(fmt, layer, unknown=unknown)
        out += len_field(number, body)
        if unknown and i == 0:
            out += varint_field(4244, 3)  # between two layers
    return out


def write_net(path: Path, fmt: str, layers, **kw) -> Path:
    path.write_bytes(net_bytes(fmt, layers, **kw))
    return path


# -- SolverState ------------------------------------------------------------------------

def solverstate_proto(history, *, iter_=1234, learned_net="snapshots/net_iter_1234.caffemodel",
                      current_step=2) -> pb.SolverState:
    """A SolverState whose history holds `history` (arrays as float32 `shape` blobs)."""
    state = pb.SolverState(iter=iter_, learned_net=learned_net, current_step=current_step)
    for blob in history:
        state.history.add().MergeFromString(as_blob_bytes(blob))
    return state


def solverstate_bytes(history, *, unknown=False, **kw) -> bytes:
    """``solverstate_proto(history, **kw)`` serialized, with a fork's unknown fields after it when asked."""
    return solverstate_proto(history, **kw).SerializeToString() + (SOLVERSTATE_UNKNOWN if unknown else b"")


def write_solverstate(path: Path, history, **kw) -> Path:
    path.write_bytes(solverstate_bytes(history, **kw))
    return path


# -- .npy and .npz ----------------------------------------------------------------------

def npy_bytes(array, *, allow_pickle: bool = False) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=allow_pickle)
    return out.getvalue()


def npy_header_bytes(header: str, payload: bytes = b"") -> bytes:
    """A version 1.0 .npy file with this header text (padded to 64 bytes, as numpy does), then `payload`."""
    raw = header.encode("latin1")
    raw += b" " * (-(10 + len(raw) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(raw).to_bytes(2, "little") + raw + payload


def npz_bytes(arrays: dict, *, compressed: bool = False) -> bytes:
    """An .npz as numpy's savez writes it, built here: numpy releases differ in its zip headers (zip64 or not)."""
    members = {}
    for name, array in arrays.items():
        member = io.BytesIO()
        np.save(member, array, allow_pickle=False)
        members[name + ".npy"] = member.getvalue()
    return zip_bytes(members, compressed=compressed)


def zip_bytes(members: dict, *, compressed: bool = False) -> bytes:
    """A zip file of these {name: bytes} members, in order (fixed timestamps: the same bytes every run)."""
    import zipfile

    out = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED
    with zipfile.ZipFile(out, "w", compression=method) as archive:
        for name, data in members.items():
            archive.writestr(zipfile.ZipInfo(name), data, compress_type=method)
    return out.getvalue()


def npz_named(arrays: dict, *, compressed: bool = False) -> bytes:
    """An .npz whose members are the arrays under exactly these names (plus ".npy"), written with np.save."""
    return zip_bytes({name + ".npy": npy_bytes(np.asarray(a)) for name, a in arrays.items()}, compressed=compressed)


def write_npy(path: Path, array, **kw) -> Path:
    path.write_bytes(npy_bytes(array, **kw))
    return path


def write_npz(path: Path, arrays: dict, **kw) -> Path:
    path.write_bytes(npz_bytes(arrays, **kw))
    return path


# -- Caffe's HDF5 snapshots ------------------------------------------------------------------
# Built with h5py the way Caffe's hdf5.cpp does it (H5LTmake_dataset_*: contiguous datasets of
# the blob's shape, native float/double; int datasets of shape (1,); a scalar NUL-terminated
# string), imported only here so that the other builders work without h5py.

def h5_string(group, name: str, text: str) -> None:
    """A scalar, NUL-terminated fixed-length string dataset, as H5LTmake_dataset_string writes."""
    import h5py

    raw = text.encode()
    tid = h5py.h5t.C_S1.copy()
    tid.set_size(len(raw) + 1)
    tid.set_strpad(h5py.h5t.STR_NULLTERM)
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_obj_track_times(False)  # no timestamp: the same input gives the same bytes
    dsid = h5py.h5d.create(group.id, name.encode(), tid, h5py.h5s.create(h5py.h5s.SCALAR), dcpl=dcpl)
    dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, np.array(raw + b"\0", dtype=f"S{len(raw) + 1}"), mtype=tid)


def h5_bytes(build, *, userblock: int = 0) -> bytes:
    """The bytes of an HDF5 file made by `build(h5py_file)` (in memory, no timestamps)."""
    import h5py

    stream = io.BytesIO()
    with h5py.File(stream, "w", libver="earliest", userblock_size=userblock) as f:
        build(f)
    return stream.getvalue()


def h5_net_bytes(layers, *, diffs: dict | None = None, shared=(), userblock: int = 0) -> bytes:
    """A net as Caffe's Net::ToHDF5: `layers` [(name, [array, ...])] (an empty list: a layer without
    parameters); `diffs` {(layer, index): array} adds the group "diff" mirroring "data"; `shared`
    {(layer, index)} are parameters owned by an earlier layer, absent from "data"."""
    def build(f):
        data = f.create_group("data")
        diff = f.create_group("diff") if diffs is not None else None
        for name, arrays in layers:
            group = data.create_group(name)
            diff_group = diff.create_group(name) if diff is not None else None
            for index, array in enumerate(arrays):
                if (name, index) not in shared:
                    group.create_dataset(str(index), data=array)
                if diff_group is not None:
                    diff_group.create_dataset(str(index), data=diffs.get((name, index), np.zeros_like(array)))
    return h5_bytes(build, userblock=userblock)


def h5_solverstate_bytes(history, *, iter_=1234, learned_net="snapshots/net_iter_1234.caffemodel.h5",
                         current_step=0) -> bytes:
    """A solver state as Caffe's SGDSolver::SnapshotSolverStateToHDF5."""
    def build(f):
        f.create_dataset("iter", data=np.array([iter_], dtype=np.int32))
        h5_string(f, "learned_net", learned_net)
        f.create_dataset("current_step", data=np.array([current_step], dtype=np.int32))
        group = f.create_group("history")
        for index, array in enumerate(history):
            group.create_dataset(str(index), data=array)
    return h5_bytes(build)


def write_h5(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
