"""PyTorch's zip checkpoints (``torch.save`` since 1.6), read without PyTorch and without running the file's pickle.

The format, as torch.save writes it and torch.load reads it:

- a zip file whose entries all lie in one folder, ``<archive>/`` (its name
  is free; torch uses the file's stem or "archive");
- ``<archive>/data.pkl``: a pickle (protocol 2 unless the caller chose
  another) of the saved object. Each tensor in it is the call
  ``torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride,
  requires_grad, backward_hooks[, metadata])`` (a Parameter wraps that in
  ``torch._utils._rebuild_parameter``), and each storage a persistent id
  ``('storage', torch.<Type>Storage, key, location, numel)``;
- ``<archive>/data/<key>``: one storage's bytes, ``numel`` elements of its
  type, written stored (not compressed) and aligned to 64 bytes;
- ``<archive>/byteorder`` ("little" or "big"; absent: little-endian),
  ``<archive>/version`` and, in recent versions, ``.format_version`` and
  ``.data/serialization_id``, which blobtool does not need.

A pickle runs code when loaded: any callable its GLOBAL opcodes name is
imported and called. blobtool never lets it. data.pkl is run on a pickle
machine of blobtool's own (formats/pickled.py, whose docstring says why not
pickle.Unpickler): it builds dicts, lists, tuples and sets as records that
are never hashed, never changed once placed in another object and never
nested past 64, and it knows exactly the globals a state dict needs, those
``torch.load(weights_only=True)`` accepts for one: collections.OrderedDict,
the two tensor rebuilds above (and ``_rebuild_parameter_with_state``), and
the storage types of the usual dtypes (STORAGE_TYPES). The rebuilds are
blobtool's own functions that check their arguments and return an
immutable description of the tensor; nothing is imported, nothing from the
file is called, and no opcode can set the state of what a rebuild returned
(BUILD is taken only on an OrderedDict, whose ``_metadata`` torch keeps that
way). Any other global (a model's class, numpy, os.system) is refused,
naming it. A pickle of more than MAX_PICKLE bytes or MAX_OPCODES opcodes,
or using an opcode that builds objects by other means (INST, OBJ, NEWOBJ,
extension codes, text persistent ids, out-of-band buffers), is refused.

What is read: the state dict, a dict of tensors by name. A checkpoint that
holds one such dict among other things (``{"state_dict": ..., "epoch": 3}``,
``{"model": {...}, "optimizer": {...}}``) is read through it, saying which
key. An optimizer's state (a dict with "state" and "param_groups", whose
per-parameter dicts of momentum_buffer, exp_avg ... look like state dicts)
is never taken for a model's. Several state dicts ({"model", "ema"}) are
listed and refused, unless the read settings name one (``--key ema``;
nested keys joined by "/"). One tensor saved alone is blob "0".
A TorchScript archive (``constants.pkl``, ``code/``) is refused: its pickle
rebuilds a scripted module from code in the file.

Each tensor is a blob named by its key, in the dict's order, viewing its
storage: float32 and float64 storages in the file's byte order are viewed in
place (the memory-mapped file, no copy); float16 widens to a float32 blob
that keeps float16 as its stored type; bfloat16 widens exactly to float32
(stored type float32: numpy has no bfloat16); integers and bools are held
as float64, exactly (an int64 past 2**53 is refused), and written as
float64, which every reader takes (num_batches_tracked in an .npz). A
tensor's offset, sizes and strides are checked against its storage; a
tensor that is not contiguous (a transposed view) is copied into C order
when its blob is built; one with more elements than its storage (an
expanded view, stride 0) is refused: read whole it would cost its size for
a file holding one element.
"""

from __future__ import annotations

import collections
import functools
import math
import struct
import zipfile
import zlib
from dataclasses import dataclass

import numpy as np

from ..engine.blob import MAX_BLOB_AXES, Blob
from ..errors import BlobToolError, FormatError
from ..files import BufferFile
from . import MAX_BLOBS, Document, Entry
from . import read_settings as reading
from .checkpoint import SAVE_STATE_DICT, find_state_dict, indexed
from .numpy import check_compression, inflate_member  # the .npz reader's rules for zip members, and its inflate
from .origin import Origin
from .pickled import Global, PickledDict, PickledList, PickledTuple, run_pickle, shown
from .zipdir import check_entry_count

__all__ = ["sniff", "read", "STORAGE_TYPES", "MAX_PICKLE", "MAX_OPCODES", "SAVE_STATE_DICT"]

# torch's storage types a state dict's tensors use, by the name the pickle
# gives them, and the type of their elements (bfloat16: its 16 bits).
STORAGE_TYPES = {
    "FloatStorage": "f4", "DoubleStorage": "f8", "HalfStorage": "f2", "BFloat16Storage": "bf16",
    "ByteStorage": "u1", "CharStorage": "i1", "ShortStorage": "i2", "IntStorage": "i4", "LongStorage": "i8",
    "BoolStorage": "?",
}
# The globals a state dict's pickle names: all that find_class gives it.
_GLOBALS = frozenset([("collections", "OrderedDict"), ("torch._utils", "_rebuild_tensor_v2"),
                      ("torch._utils", "_rebuild_parameter"), ("torch._utils", "_rebuild_parameter_with_state")]
                     + [("torch", name) for name in STORAGE_TYPES])
# A state dict's pickle costs about 100 to 300 bytes and 30 to 60 opcodes a
# tensor: MAX_BLOBS tensors fit in a few MiB and a few hundred thousand
# opcodes. Each opcode can make one object of up to ~100 bytes (an empty
# dict), so these bound what unpickling can build, and its time (walking
# the opcodes costs about 1 us each).
MAX_PICKLE = 32 << 20
MAX_OPCODES = 64 * MAX_BLOBS
# Records an archive holds besides its storages (data.pkl, version, byteorder ...).
_MAX_OTHER_RECORDS = 64
_LOCAL_HEADER = b"PK\x03\x04"
_LOCAL_HEADER_SIZE = 30
# Everything zipfile raises on a damaged archive (a bad CRC, a broken deflate stream, a bad header ...).
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, struct.error, EOFError, OSError, ValueError,
               NotImplementedError, RuntimeError, KeyError, OverflowError, UnicodeDecodeError)


def sniff(source) -> str:
    """"pt" (the registry matched a zip naming "<archive>/data.pkl")."""
    return "pt"


@dataclass(frozen=True, slots=True)
class _StorageType:
    """A storage type a pickle names (torch.FloatStorage), as blobtool holds it: the name and element type."""

    name: str
    code: str

    @property
    def itemsize(self) -> int:
        return 2 if self.code == "bf16" else np.dtype(self.code).itemsize


@dataclass(frozen=True, slots=True)
class _Storage:
    """One storage record: its key, type, element count and zip entry."""

    key: str
    type: _StorageType
    numel: int
    info: zipfile.ZipInfo


@dataclass(frozen=True, slots=True)
class _Tensor:
    """What _rebuild_tensor_v2 would make: a view of a storage (offset and strides in elements)."""

    storage: _Storage
    offset: int
    shape: tuple
    stride: tuple

    @property
    def contiguous(self) -> bool:
        expected = 1
        for size, step in zip(reversed(self.shape), reversed(self.stride)):
            if size != 1 and step != expected:
                return False
            expected *= size
        return True


@dataclass(frozen=True)
class _StoredType:
    """What info shows as the stored type of a bfloat16 tensor (numpy has no bfloat16)."""

    name: str
    itemsize: int


_BF16 = _StoredType("bfloat16", 2)


# -- the archive ------------------------------------------------------------------------

class _Archive:
    """An opened checkpoint: its zip, the folder its records are in, its storages' records and byte order."""

    def __init__(self, doc: Document):
        self.path = doc.path
        self.source = doc.source
        check_entry_count(doc.source.buf, MAX_BLOBS + _MAX_OTHER_RECORDS,
                          f"the {MAX_BLOBS} storages blobtool reads (its limit) and their records", self.path)
        try:
            self.zip = zipfile.ZipFile(BufferFile(doc.source.buf))
            infos = self.zip.infolist()
        except _ZIP_ERRORS as exc:
            raise FormatError(f"not a readable zip file: {exc}", path=self.path) from exc
        folders = sorted({i.filename[:-len("/data.pkl")] for i in infos
                          if i.filename.endswith("/data.pkl") and i.filename.count("/") == 1})
        if len(folders) != 1:
            what = "no" if not folders else f"{len(folders)} ({', '.join(map(repr, folders[:4]))})"
            raise FormatError(f"holds {what} PyTorch archives (<archive>/data.pkl); torch.save writes one",
                              path=self.path)
        self.folder = folders[0]
        self.records = {i.filename: i for i in infos}
        if len(self.records) != len(infos):
            raise FormatError("the zip holds two entries of the same name", path=self.path)
        self._refuse_torchscript()
        self.shared: set = set()    # ids of the storages several tensors view (read() says which)
        self.inflated: dict = {}    # ... and those of them inflated, by id
        self.order = self._byteorder()
        data = f"{self.folder}/data/"
        self.storages = {name[len(data):]: info for name, info in self.records.items() if name.startswith(data)}

    def _refuse_torchscript(self) -> None:
        folder = self.folder + "/"
        if folder + "constants.pkl" in self.records or any(n.startswith(folder + "code/") for n in self.records):
            raise FormatError("a TorchScript archive (torch.jit.save): its data.pkl rebuilds a scripted module "
                              "with code from the file, which blobtool never runs; " + SAVE_STATE_DICT,
                              path=self.path)

    def _byteorder(self) -> str:
        info = self.records.get(f"{self.folder}/byteorder")
        if info is None:
            return "<"
        text = self.member_bytes(info, 16)
        if text not in (b"little", b"big"):
            raise FormatError(f"{info.filename} holds {text[:16]!r}; expected 'little' or 'big'",
                              path=self.path, offset=info.header_offset)
        return "<" if text == b"little" else ">"

    def member_bytes(self, info: zipfile.ZipInfo, limit: int) -> bytes:
        """A small record's bytes (data.pkl, byteorder), at most `limit` declared; its CRC checked."""
        _check_method(self.zip, info, self.path)
        if info.file_size > limit:
            raise FormatError(f"{info.filename} declares {info.file_size} bytes, more than the {limit} "
                              "blobtool reads there", path=self.path, offset=info.header_offset)
        try:
            with self.zip.open(info) as stream:
                data = stream.read(info.file_size + 1)
        except _ZIP_ERRORS as exc:
            raise FormatError(f"{info.filename} is unreadable: {exc}", path=self.path,
                              offset=info.header_offset) from exc
        if len(data) != info.file_size:
            raise FormatError(f"{info.filename} holds {len(data)} bytes; its zip entry declares {info.file_size}",
                              path=self.path, offset=info.header_offset)
        return data

    def storage_values(self, storage: _Storage) -> np.ndarray:
        """A storage's elements, flat, in the file's byte order: a view of the file when stored, else inflated."""
        info, dtype = storage.info, _element_dtype(storage.type, self.order)
        if info.compress_type == zipfile.ZIP_STORED:
            start = _data_start(self.source.buf, info, self.path)
            return np.frombuffer(self.source.buf, dtype=dtype, count=storage.numel, offset=start)
        # A deflated storage several tensors view is inflated once and kept
        # (each view inflating it again: 20 one-element views of a 64 MiB
        # storage in a 67 KB file took 6 s and 1.36 GB); one used once is not kept.
        kept = self.inflated.get(id(storage))
        if kept is None:
            kept = inflate_member(self.zip, info, 0, info.file_size, info.filename, self.path).view(dtype)
            if id(storage) in self.shared:
                self.inflated[id(storage)] = kept
        return kept


def _check_method(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path) -> None:
    """Refuse an entry neither stored nor deflated, outside the members' bytes, or declaring too much (.npz's rule)."""
    check_compression(info, info.filename, "torch.save stores its records", path, archive.start_dir)


def _data_start(buf, info: zipfile.ZipInfo, path) -> int:
    """Where a stored entry's bytes begin: after its local header, whose name and extra field lengths it gives."""
    at = info.header_offset
    head = bytes(buf[at:at + _LOCAL_HEADER_SIZE])
    if len(head) < _LOCAL_HEADER_SIZE or head[:4] != _LOCAL_HEADER:
        raise FormatError(f"{info.filename}: no zip local header at its offset", path=path, offset=at)
    name_len, extra_len = struct.unpack_from("<HH", head, 26)
    start = at + _LOCAL_HEADER_SIZE + name_len + extra_len
    if start + info.file_size > len(buf):
        raise FormatError(f"{info.filename}: {info.file_size} bytes declared from byte {start}, the file ends at "
                          f"{len(buf)}", path=path, offset=at)
    return start


def _element_dtype(stype: _StorageType, order: str) -> np.dtype:
    return np.dtype(order + ("u2" if stype.code == "bf16" else stype.code))


# -- the pickle -------------------------------------------------------------------------

# What a tensor's offset, sizes and strides may be: what torch itself holds (int64).
_MAX_INDEX = (1 << 63) - 1
# Bytes an array can span (numpy's limit), counted at the widest type a blob holds them in.
_MAX_EXTENT = (1 << 63) - 1
_WIDEST = 8


class _Rebuilds:
    """What data.pkl may call and name: blobtool's own checked rebuilds, and the storages' records."""

    def __init__(self, archive: _Archive):
        self.archive = archive
        self.where = f"{archive.folder}/data.pkl"
        self.loaded: dict = {}
        self.taken: dict = {}  # the lists OrderedDict was given, by id
        self.tensors = 0
        rebuilds = {"OrderedDict": self.ordered_dict, "_rebuild_tensor_v2": self.rebuild_tensor,
                    "_rebuild_parameter": self.rebuild_parameter,
                    "_rebuild_parameter_with_state": self.rebuild_parameter}
        self.allowed = {(module, name): rebuilds[name] if name in rebuilds else _StorageType(name, STORAGE_TYPES[name])
                        for module, name in _GLOBALS}

    def refuse(self, what: str) -> FormatError:
        return FormatError(f"{self.where}: {what}", path=self.archive.path)

    def ordered_dict(self, *args):
        """collections.OrderedDict() as pickle calls it: no argument, or a list of (key, value) pairs.

        A list is taken once: copied into each OrderedDict given it, one list
        of n pairs handed to m calls would cost n x m for 3 opcodes a call.
        """
        made = PickledDict(ordered=True)
        if not args:
            return made
        pairs = args[0]
        if len(args) != 1 or not isinstance(pairs, PickledList) or not all(
                isinstance(p, PickledTuple) and len(p.items) == 2 for p in pairs.items):
            raise self.refuse(f"calls OrderedDict with {len(args)} arguments; a pickle gives it none or a list "
                              "of pairs")
        if id(pairs) in self.taken:
            raise self.refuse("gives OrderedDict the same list of pairs twice; a pickle builds each dict once")
        self.taken[id(pairs)] = pairs  # kept, so that the id stays its own
        made.pairs = [p.items for p in pairs.items]
        made.depth = pairs.depth
        return made

    def persistent_load(self, pid):
        items = pid.items if isinstance(pid, PickledTuple) else None
        if not (items is not None and len(items) == 5 and items[0] == "storage"):
            raise self.refuse(f"persistent id {shown(pid)} is not ('storage', type, key, location, numel)")
        _, stype, key, location, numel = items
        if not isinstance(stype, Global) or not isinstance(stype.target, _StorageType) or type(key) is not str \
                or type(location) is not str or not _index_ok(numel):
            raise self.refuse(f"persistent id {shown(pid)} is not ('storage', type, key, location, numel)")
        stype = stype.target
        found = self.loaded.get((key, stype.name))
        if found is not None:
            return found
        if len(self.loaded) >= MAX_BLOBS:
            raise self.refuse(f"names more than {MAX_BLOBS} storages (blobtool's limit)")
        info = self.archive.storages.get(key)
        if info is None:
            raise self.refuse(f"storage {key!r} has no record {self.archive.folder}/data/{key}")
        _check_method(self.archive.zip, info, self.archive.path)
        if info.file_size != numel * stype.itemsize:
            raise self.refuse(f"storage {key!r} holds {numel} elements of {stype.name} ({numel * stype.itemsize} "
                              f"bytes); its record {info.filename} holds {info.file_size}")
        found = self.loaded[(key, stype.name)] = _Storage(key, stype, numel, info)
        return found

    def rebuild_tensor(self, *args):
        if len(args) not in (6, 7):
            raise self.refuse(f"_rebuild_tensor_v2 is given {len(args)} arguments; it takes 6 or 7")
        storage, offset, shape, stride = args[:4]
        if not isinstance(storage, _Storage):
            raise self.refuse(f"a tensor's storage is {shown(storage)}, not a storage record")
        shape, stride = _indices(shape), _indices(stride)
        if shape is None or stride is None or len(shape) != len(stride) or not _index_ok(offset):
            raise self.refuse(f"a tensor of storage {storage.key!r} has offset {shown(offset)}, size "
                              f"{shown(args[2])} and stride {shown(args[3])}: expected non-negative integers, "
                              "one stride per dimension")
        if len(shape) > MAX_BLOB_AXES:
            raise self.refuse(f"a tensor of storage {storage.key!r} has {len(shape)} dimensions; a blob holds at "
                              f"most {MAX_BLOB_AXES}")
        extent = _WIDEST * math.prod(max(size, 1) for size in shape)
        if extent > _MAX_EXTENT:
            raise self.refuse(f"a tensor of storage {storage.key!r} has size {shape}, which spans more bytes than "
                              "an array can address")
        count = math.prod(shape)
        last = offset + sum((size - 1) * step for size, step in zip(shape, stride)) if count else offset - 1
        if last >= storage.numel:
            raise self.refuse(f"a tensor of size {shape}, stride {stride} at offset {offset} reaches element "
                              f"{last} of storage {storage.key!r}, which holds {storage.numel}")
        if count > storage.numel:
            # An expanded view (stride 0): each stored element read many times.
            # Read whole, it would cost count elements for a file holding
            # numel; blobtool reads a tensor no larger than its storage.
            raise self.refuse(f"a tensor of size {shape}, stride {stride} has {count} elements over storage "
                              f"{storage.key!r} of {storage.numel} (an expanded view, which repeats stored "
                              "elements); blobtool reads tensors no larger than their storage: save "
                              "tensor.contiguous() (or .clone()) instead")
        self.tensors += 1
        if self.tensors > MAX_BLOBS:
            raise self.refuse(f"holds more than {MAX_BLOBS} tensors (blobtool's limit)")
        return _Tensor(storage, offset, shape, stride)

    def rebuild_parameter(self, data, *rest):
        if not isinstance(data, _Tensor):
            raise self.refuse(f"a Parameter wraps {shown(data)}, not a tensor")
        return data


# Modules whose names a pickle uses to run commands, read files or load code, never to hold weights.
_SYSTEM_MODULES = frozenset({"os", "posix", "nt", "subprocess", "builtins", "__builtin__", "sys", "shutil",
                             "socket", "runpy", "importlib", "pickle", "marshal", "code", "codeop", "pty",
                             "commands", "webbrowser", "ctypes", "timeit", "pdb", "multiprocessing"})


def _not_allowed(module: str, name: str, where: str, path) -> FormatError:
    what = f"{shown(module)[1:-1]}.{shown(name)[1:-1]}"
    refused = ("blobtool reads only tensors, their storages, dicts, lists and numbers, and never imports or runs "
               "what a pickle names")
    if module.split(".")[0] in _SYSTEM_MODULES or not name[:1].isupper():
        # A function (os.system, builtins.eval): a pickle names one to call it when it is loaded.
        return FormatError(f"{where}: calls the function {what} when it is unpickled, which no state dict does: "
                           f"{refused}, so nothing was run", path=path)
    return FormatError(f"{where}: names the class {what}, which a state dict does not hold; {refused} (a whole "
                       f"pickled model? {SAVE_STATE_DICT})", path=path)


def _index_ok(value) -> bool:
    return type(value) is int and 0 <= value <= _MAX_INDEX


def _indices(value) -> tuple | None:
    """A tuple of non-negative int64 values as a Python tuple, else None."""
    if not isinstance(value, PickledTuple) or not all(_index_ok(v) for v in value.items):
        return None
    return tuple(value.items)


def _unpickle(archive: _Archive):
    where = f"{archive.folder}/data.pkl"
    data = archive.member_bytes(archive.records[where], MAX_PICKLE)
    rebuilds = _Rebuilds(archive)
    return run_pickle(data, max_opcodes=MAX_OPCODES, callables=rebuilds.allowed,
                      persistent=rebuilds.persistent_load,
                      refuse=lambda text: FormatError(f"{where} {text}", path=archive.path),
                      not_allowed=lambda module, name: _not_allowed(module, name, where, archive.path))


# -- the state dict ---------------------------------------------------------------------

def read(doc: Document, cast=None) -> None:
    """Read a checkpoint's state dict: an Entry per tensor, its Blob viewing the storage when first used.

    `cast` does not apply: every type read here has a blob type holding it
    exactly. The checkpoint key read (reading(key=...)) picks one state dict
    where a file holds several.
    """
    archive = _Archive(doc)
    obj = _unpickle(archive)
    keys, tensors = find_state_dict(obj, doc.path, _Tensor, reading().key)
    if len(tensors) > MAX_BLOBS:  # names: a pickle's memo lets one tensor have any number of them
        raise FormatError(f"holds a state dict of {len(tensors)} tensors, more than {MAX_BLOBS} (blobtool's "
                          "limit)", path=doc.path)
    users = collections.Counter(id(t.storage) for t in tensors.values())
    archive.shared = {id(t.storage) for t in tensors.values() if users[id(t.storage)] > 1}
    if keys:
        others = [shown(k) for k in obj.keys() if k != keys[0]]
        also = f" (the file also holds {', '.join(others[:6])}{' ...' if len(others) > 6 else ''})" if others else ""
        doc.notes.append(f"reading the state dict checkpoint{indexed(keys)}{also}")
        doc.meta["state_dict"] = indexed(keys)
    for name, tensor in tensors.items():
        code = tensor.storage.type.code
        dtype = _BF16 if code == "bf16" else np.dtype(code)
        doc.entries.append(Entry(name, tensor.shape, "shape", dtype, False,
                                 build=functools.partial(_build_blob, archive, name, tensor)))


def _build_blob(archive: _Archive, name: str, tensor: _Tensor) -> Blob:
    """A tensor's Blob: float32/float64 in native order viewing the file; other types converted exactly."""
    storage = archive.storage_values(tensor.storage)
    count = math.prod(tensor.shape)
    if tensor.contiguous or not count:  # an empty tensor's strides point nowhere
        raw = storage[tensor.offset:tensor.offset + count]
    else:
        item = storage.dtype.itemsize
        strided = np.lib.stride_tricks.as_strided(storage[tensor.offset:], shape=tensor.shape,
                                                  strides=tuple(s * item for s in tensor.stride), writeable=False)
        raw = np.ascontiguousarray(strided).reshape(-1)
    values, stored = _held(raw, tensor.storage.type.code, name, archive.path)
    blob = Blob(dtype=values.dtype)
    try:
        blob.fill_from(tensor.shape, values, None, adopt=True)
    except BlobToolError as exc:
        raise exc.with_path(archive.path) from exc
    blob.origin = Origin("shape", stored, False)
    return blob


# int64 values past this are not all float64 values.
_EXACT_INTEGER = 1 << 53


def _held(raw: np.ndarray, code: str, name: str, path) -> tuple:
    """(the values as the blob holds them, the type they are written back in)."""
    if code in ("f4", "f8"):
        native = raw.dtype.newbyteorder("=")
        return (raw if raw.dtype == native else raw.astype(native)), native
    if code == "f2":
        return raw.astype(np.float32), np.dtype(np.float16)
    if code == "bf16":  # the high half of a float32: widening is exact
        return (raw.astype(np.uint32) << 16).view(np.float32), np.dtype(np.float32)
    if code == "i8" and raw.size and (int(raw.max()) >= _EXACT_INTEGER or int(raw.min()) <= -_EXACT_INTEGER):
        raise FormatError(f"tensor {name!r} holds int64 values past 2**53, which a blob (float64) cannot hold "
                          "exactly", path=path)
    return raw.astype(np.float64), np.dtype(np.float64)
