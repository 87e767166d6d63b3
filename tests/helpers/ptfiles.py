"""PyTorch zip checkpoints written without PyTorch, in the layout torch.save (1.6 and later) writes.

The pickle is written by Python's own pickle.Pickler at protocol 2 (torch's
default), as torch.save writes it: each tensor reduces to
``torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
requires_grad, OrderedDict())``, each storage is the persistent id
``('storage', torch.<Type>Storage, key, 'cpu', numel)``. pickle names a
global by its module and name and checks that importing it gives the same
object, so stand-in modules ``torch`` and ``torch._utils`` are put in
sys.modules while a pickle is written (and the real ones, if any, put back).

The zip holds ``<folder>/data.pkl``, ``<folder>/byteorder``, one stored
record ``<folder>/data/<key>`` per storage, its bytes aligned to 64 (a
padding extra field, as torch's writer pads), then ``<folder>/version`` and
``<folder>/.data/serialization_id``.
"""

from __future__ import annotations

import collections
import contextlib
import io
import pickle
import struct
import sys
import types
import zipfile

import numpy as np

from modswap import modules_restored

__all__ = ["Tensor", "Storage", "BF16", "pt_bytes", "write_pt", "pickle_with_torch", "STORAGE_NAMES", "op_int",
           "op_long", "op_str", "op_tuple", "storage_pickle", "PID", "HOOKS", "REBUILD"]

# numpy dtype (or BF16) -> torch's storage type name.
BF16 = "bfloat16"
STORAGE_NAMES = {np.dtype(np.float32): "FloatStorage", np.dtype(np.float64): "DoubleStorage",
                 np.dtype(np.float16): "HalfStorage", BF16: "BFloat16Storage", np.dtype(np.uint8): "ByteStorage",
                 np.dtype(np.int8): "CharStorage", np.dtype(np.int16): "ShortStorage",
                 np.dtype(np.int32): "IntStorage", np.dtype(np.int64): "LongStorage", np.dtype(np.bool_): "BoolStorage"}
_ALIGN = 64


class Storage:
    """A storage: flat elements (a numpy array; for BF16 the uint16 bit patterns) saved as data/<key>."""

    def __init__(self, values, kind=None, key=None):
        self.values = np.ascontiguousarray(values).reshape(-1)
        self.kind = kind if kind is not None else self.values.dtype
        self.key = key

    @property
    def numel(self) -> int:
        return self.values.size


class Tensor:
    """A tensor to save: an array (its own storage), or a view (offset, size, stride) of a Storage."""

    def __init__(self, array=None, *, storage=None, offset=0, size=None, stride=None, parameter=False, bf16=False):
        if storage is None:
            array = np.asarray(array)
            storage = Storage(array, BF16 if bf16 else None)
            size = array.shape
            stride = tuple(s // array.itemsize for s in np.ascontiguousarray(array).strides) if array.ndim else ()
        self.storage, self.offset, self.size, self.stride = storage, offset, tuple(size), tuple(stride)
        self.parameter = parameter


def _stand_ins():
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*args):
        raise AssertionError("a stand-in: never called")

    def _rebuild_parameter(*args):
        raise AssertionError("a stand-in: never called")

    for fn in (_rebuild_tensor_v2, _rebuild_parameter):
        fn.__module__ = "torch._utils"
        fn.__qualname__ = fn.__name__
        setattr(utils, fn.__name__, fn)
    for name in STORAGE_NAMES.values():
        setattr(torch, name, type(name, (), {"__module__": "torch"}))
    torch._utils = utils
    return torch, utils


@contextlib.contextmanager
def _torch_names():
    with modules_restored("torch", "torch._utils"):
        torch, utils = _stand_ins()
        sys.modules["torch"], sys.modules["torch._utils"] = torch, utils
        yield torch, utils


def pickle_with_torch(obj, *, protocol: int = 2) -> tuple:
    """(data.pkl's bytes, {key: Storage}) for `obj`, its Tensors pickled as torch.save pickles them."""
    storages: dict = {}
    with _torch_names() as (torch, utils):
        class _Saved:
            def __init__(self, tensor):
                self.tensor = tensor

            def __reduce__(self):
                t = self.tensor
                rebuilt = (utils._rebuild_tensor_v2, (t.storage, t.offset, t.size, t.stride, False,
                                                      collections.OrderedDict()))
                if not t.parameter:
                    return rebuilt
                return utils._rebuild_parameter, (_Reduced(rebuilt), True, collections.OrderedDict())

        class _Reduced:
            def __init__(self, rv):
                self.rv = rv

            def __reduce__(self):
                return self.rv

        class _Pickler(pickle.Pickler):
            def persistent_id(self, obj):
                if not isinstance(obj, Storage):
                    return None
                if obj.key is None:
                    obj.key = str(len(storages))
                storages[obj.key] = obj
                return ("storage", getattr(torch, STORAGE_NAMES[obj.kind]), obj.key, "cpu", obj.numel)

        def swap(value):
            if isinstance(value, Tensor):
                return _Saved(value)
            if isinstance(value, dict):
                out = type(value)()
                for k, v in value.items():
                    out[k] = swap(v)
                return out
            if isinstance(value, (list, tuple)):
                return type(value)(swap(v) for v in value)
            return value

        out = io.BytesIO()
        _Pickler(out, protocol=protocol).dump(swap(obj))
    return out.getvalue(), storages


def _storage_bytes(storage: Storage, byteorder: str) -> bytes:
    values = storage.values
    if storage.kind == BF16:
        values = values.astype(np.uint16)
    if values.dtype.itemsize > 1:
        values = values.astype(values.dtype.newbyteorder("<" if byteorder == "little" else ">"))
    return values.tobytes()


def pt_bytes(obj, *, folder: str = "archive", byteorder: str | None = "little", data_pkl: bytes | None = None,
             records: dict | None = None, deflate_storages: bool = False, storages: dict | None = None) -> bytes:
    """A torch.save zip of `obj` (a state dict of Tensors, or anything holding them).

    `data_pkl` replaces the pickle (with `storages` its {key: Storage});
    `records` adds (or, with None values, leaves out) records by their name
    inside the folder; `byteorder` None leaves out the byteorder record.
    """
    if data_pkl is None:
        data_pkl, storages = pickle_with_torch(obj)
    members = {"data.pkl": data_pkl}
    if byteorder is not None:
        members["byteorder"] = byteorder.encode()
    for key, storage in (storages or {}).items():
        members[f"data/{key}"] = _storage_bytes(storage, byteorder or "little")
    members["version"] = b"3\n"
    members[".data/serialization_id"] = b"1234567890"
    for name, data in (records or {}).items():
        if data is None:
            members.pop(name, None)
        else:
            members[name] = data
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(f"{folder}/{name}")
            method = zipfile.ZIP_DEFLATED if deflate_storages and name.startswith("data/") else zipfile.ZIP_STORED
            info.compress_type = method
            if method == zipfile.ZIP_STORED:
                # torch pads the local header's extra field so that the record starts at a multiple of 64.
                start = out.tell() + 30 + len(info.filename.encode())
                pad = -(start + 4) % _ALIGN
                info.extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
            archive.writestr(info, data)
    return out.getvalue()


def write_pt(path, obj, **kw):
    path.write_bytes(pt_bytes(obj, **kw))
    return path


# -- pickles written by hand, opcode by opcode (hostile ones: what pickle.Pickler never writes) ----------

def op_int(value: int) -> bytes:
    """BININT: a signed 32-bit int."""
    return b"J" + value.to_bytes(4, "little", signed=True)


def op_long(value: int) -> bytes:
    """LONG1 (LONG4 past 255 bytes): any int, as two's complement bytes."""
    data = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    if len(data) > 255:
        return b"\x8b" + len(data).to_bytes(4, "little") + data
    return b"\x8a" + bytes([len(data)]) + data


def op_str(text: str) -> bytes:
    """BINUNICODE."""
    data = text.encode()
    return b"X" + len(data).to_bytes(4, "little") + data


def op_tuple(*values) -> bytes:
    return b"(" + b"".join(values) + b"t"


REBUILD = b"ctorch._utils\n_rebuild_tensor_v2\n"
# ('storage', torch.FloatStorage, '0', 'cpu', 12)
PID = op_tuple(op_str("storage"), b"ctorch\nFloatStorage\n", op_str("0"), op_str("cpu"), op_int(12))
# backward_hooks: OrderedDict()
HOOKS = b"\x89ccollections\nOrderedDict\n)R"


def storage_pickle(pid, *args, after_pid: bytes = b"", after_tensor: bytes = b"") -> bytes:
    """A pickle of {"w": _rebuild_tensor_v2(<persistent id pid>, *args)} with hand-picked arguments.

    `after_pid` and `after_tensor` are opcodes run right after the storage
    and the tensor are made (with them on top of the stack).
    """
    return (b"\x80\x02}" + op_str("w") + REBUILD + b"(" + pid + b"Q" + after_pid + b"".join(args) + b"t" + b"R"
            + after_tensor + b"s.")
