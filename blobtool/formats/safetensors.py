"""safetensors files, both directions: blobs as named tensors, "<name>/diff" as a blob's diff.

The format (Hugging Face's safetensors, as its own Rust and Python code
reads it):

- bytes 0-7: N, the header's length in bytes, an unsigned 64-bit
  little-endian integer;
- bytes 8 to 8 + N: the header, a JSON object in UTF-8, which a writer MAY
  pad with trailing blanks. Each key is a tensor's name; its value is an
  object with "dtype" (F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32,
  U16, U8, BOOL, and a few 8-bit float types blobtool does not read),
  "shape" (a list of non-negative integers; [] is a scalar) and
  "data_offsets" ([begin, end], byte offsets into the data that follows the
  header). The one other key, "__metadata__", maps strings to strings;
- the rest: the tensors' bytes, little-endian, C order. The tensors MUST
  cover it exactly: sorted by begin, each begins where the previous ended,
  the last ends at the end of the file, and end - begin is the shape's count
  times the dtype's size.

Reading MUST refuse (one FormatError naming the byte offset): a file under
8 bytes, a header length past the end of the file or over MAX_HEADER, a
header that is not a JSON object (or holds a key twice), a tensor without
those three fields, an unknown dtype, a shape of negative or non-integer
dimensions or more than 32 axes, offsets outside the data, overlapping, leaving a
gap, or not matching the shape. Checked before anything is allocated past
the header.

Reading: float32 and float64 tensors are viewed in place (the memory-mapped
file's bytes, no copy); float16 is converted to a float32 blob that keeps
"float16" as its stored dtype (and is written back as F16). Integer, bool and
BF16 tensors are listed (info) but their values load only with a cast
(convert --float / --double), as for .npy; a PyTorch state_dict's
``num_batches_tracked`` counters are such tensors. A tensor "<name>/diff"
next to "<name>" is that blob's diff, held and written back at its own width
(an F64 diff beside F32 data stays F64). Blobs come in the header's order.

Writing streams: the header is built from the blobs' shapes and dtypes, then
each tensor is converted and written chunk by chunk (writing.write_parts),
releasing the input's pages behind it. The measurement that decided it
(/usr/bin/time -v, a generated 1.0 GiB caffemodel of four 256 MiB blobs,
the 2-core reference machine): ``convert -o big.safetensors`` peaks at 39 MB
resident in 6.2 s; the safetensors package's ``save_file``, which needs every
tensor in memory at once, peaked at 1080 MB given views of the mapped file
and 2129 MB given arrays in memory. So blobtool writes the format itself and
needs no safetensors package at run time. Its reader is its own too:
``safe_open`` cannot read standard input, and its numpy ``get_tensor`` copies
each tensor (summing the same file through it: 2.0 s and 1862 MB, against
0.6 s for ``blobtool norm``, whose views of the mapped file cost no
anonymous memory). The files it writes load with the safetensors package
(the tests use it as the oracle). Tensors are laid out by item size, largest
first, as the package's writer does, so every tensor is aligned; the header
lists them in the blobs' order. ``__metadata__`` records the source file's
name and kind, the naming scheme and blobtool's version.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import numpy as np

from .. import __version__
from ..engine.blob import MAX_BLOB_AXES, Blob
from .origin import Origin, Precision, held_dtype
from .writing import resolve_form, write_parts
from ..errors import BlobToolError, FormatError, UsageError, truncated
from ..files import atomic_output
from . import CAST_HINT, MAX_BLOBS, Document, Entry
from .numpy import DIFF_SUFFIX, PRECISION_DTYPES, check_member_names, pair_diffs

__all__ = ["sniff", "read", "write", "header_bytes", "DTYPES", "MAX_HEADER", "METADATA_KEY"]

# The header's length field.
_LENGTH_BYTES = 8
# The largest header read: the safetensors package's own limit (its
# MAX_HEADER_SIZE), so that what it reads, blobtool reads.
MAX_HEADER = 100_000_000
METADATA_KEY = "__metadata__"
# Writers pad the header with blanks to a multiple of this, so that the
# tensors after it stay aligned.
_HEADER_ALIGN = 8

# safetensors' dtype codes and the numpy dtype of their bytes (little-endian).
DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"), "BF16": np.dtype("<u2"),
}
# What a blob is written as, by its numpy dtype: floats, and the integers
# NVIDIA Caffe's INT/UINT blobs are stored as.
_CODES = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
          np.dtype(np.int32): "I32", np.dtype(np.uint32): "U32"}


@dataclass(frozen=True)
class _StoredType:
    """What info shows as the stored dtype of a BF16 tensor (numpy has no bfloat16)."""

    name: str
    itemsize: int


_BF16 = _StoredType("bfloat16", 2)

# A forged header of millions of tiny JSON values would cost 10 to 30 times
# its bytes as Python objects. Each tensor needs one object, two lists and
# five strings (ten quotes); a --names torch export's metadata adds per
# tensor a row of the mapping (one list, three strings, its quotes escaped
# in the metadata's text but counted here) and a few settings (two strings
# each). These bound what json.loads may build (MAX_BLOBS tensors and that
# metadata), whatever the header's length: 32 quotes a tensor make at most
# about 130,000 strings.
_MAX_BRACES = MAX_BLOBS + 6
_MAX_BRACKETS = 3 * MAX_BLOBS + 8
_MAX_QUOTES = 32 * MAX_BLOBS


def sniff(source) -> str:
    """"safetensors" (the registry matched the header's length and opening brace)."""
    return "safetensors"


# -- reading ----------------------------------------------------------------------------

@dataclass
class _Tensor:
    """One tensor of the header, checked: where its bytes are and what they hold."""

    name: str
    code: str
    shape: tuple
    start: int   # in the file
    end: int

    @property
    def count(self) -> int:
        return math.prod(self.shape)


@dataclass
class TensorEntry(Entry):
    """An Entry whose Blob is built on first use from the tensor's bytes (and its diff's)."""

    tensor: _Tensor | None = None
    diff_tensor: _Tensor | None = None
    source: object = None
    cast: object = None

    def blob(self):
        if self._blob is None:
            self._blob = _build_blob(self)
        return self._blob


def read(doc: Document, cast=None) -> None:
    """Read a safetensors document's header; the tensors become blobs when asked (`cast`: for integer ones)."""
    header_end, header = _read_header(doc.source, doc.path)
    tensors = _check_tensors(header, header_end, doc.size, doc.path)
    meta = header.get(METADATA_KEY)
    if meta:
        doc.meta["metadata"] = meta
    by_name = {t.name: t for t in tensors}
    names, diffs = pair_diffs([t.name for t in tensors])
    for name in names:
        t = by_name[name]
        diff = by_name[diffs[name]] if name in diffs else None
        if diff is not None and diff.count != t.count:
            raise FormatError(f"tensor {diff.name!r} has {diff.count} values, {t.name!r} has {t.count}",
                              path=doc.path, offset=diff.start)
        dtype = _BF16 if t.code == "BF16" else DTYPES[t.code].newbyteorder("=")
        diff_dtype = None
        if diff is not None and diff.code != t.code:
            diff_dtype = _BF16 if diff.code == "BF16" else DTYPES[diff.code].newbyteorder("=")
        doc.entries.append(TensorEntry(t.name, t.shape, "shape", dtype, diff is not None, tensor=t,
                                       diff_tensor=diff, source=doc.source, cast=cast, diff_dtype=diff_dtype))


def _read_header(source, path) -> tuple[int, dict]:
    """(where the data starts, the parsed header), every length checked against the file."""
    if source.size < _LENGTH_BYTES:
        raise FormatError(f"truncated at byte 0: a safetensors file starts with an {_LENGTH_BYTES}-byte header "
                          f"length, {source.size} bytes remain", path=path)
    length = int.from_bytes(bytes(source.buf[:_LENGTH_BYTES]), "little")
    remain = source.size - _LENGTH_BYTES
    if length > remain:
        raise truncated(path, 0, "the header length declares", length, remain)
    if length > MAX_HEADER:
        raise FormatError(f"the header length declares {length} bytes, more than the "
                          f"{MAX_HEADER} safetensors reads", path=path, offset=0)
    raw = bytes(memoryview(source.buf)[_LENGTH_BYTES:_LENGTH_BYTES + length])
    if (raw.count(b"{") > _MAX_BRACES or raw.count(b"[") > _MAX_BRACKETS
            or raw.count(b'"') > _MAX_QUOTES):
        raise FormatError(f"the header holds more JSON values than {MAX_BLOBS} tensors "
                          "need (blobtool's limit)", path=path, offset=_LENGTH_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError("the header is not UTF-8 text", path=path, offset=_LENGTH_BYTES + exc.start) from exc
    try:
        header = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        where = _LENGTH_BYTES + len(text[:exc.pos].encode("utf-8"))
        raise FormatError(f"the header is not JSON: {exc.msg}", path=path, offset=where) from exc
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"the header is not valid: {exc}", path=path, offset=_LENGTH_BYTES) from exc
    if not isinstance(header, dict):
        raise FormatError(f"the header is a JSON {type(header).__name__}, "
                          "expected an object of tensors", path=path, offset=_LENGTH_BYTES)
    return _LENGTH_BYTES + length, header


def _unique_keys(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"key {twice!r} appears twice")
    return out


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _check_tensors(header: dict, data_start: int, size: int, path) -> list:
    """The header's tensors, each checked, in the header's order; their bytes must tile the data exactly."""
    meta = header.get(METADATA_KEY)
    if meta is not None and not (isinstance(meta, dict)
                                 and all(isinstance(v, str) for v in meta.values())):
        raise FormatError(f"{METADATA_KEY} must map strings to strings", path=path, offset=_LENGTH_BYTES)
    names = [k for k in header if k != METADATA_KEY]
    if len(names) > MAX_BLOBS:
        raise FormatError(f"holds {len(names)} tensors, more than {MAX_BLOBS} "
                          "(blobtool's limit)", path=path, offset=_LENGTH_BYTES)
    tensors = [_check_tensor(name, header[name], data_start, size, path) for name in names]
    pos = data_start
    for t in sorted(tensors, key=lambda t: (t.start, t.end)):
        if t.start != pos:
            what = "overlaps the tensor before it" if t.start < pos else "leaves a gap before it"
            raise FormatError(f"tensor {t.name!r} data_offsets {_offsets(t, data_start)} {what} "
                              f"(expected it to begin at {pos - data_start})", path=path, offset=t.start)
        pos = t.end
    if pos != size:
        raise FormatError(f"the tensors end at byte {pos}, the file at byte {size}: the data holds bytes no "
                          "tensor covers", path=path, offset=pos)
    return tensors


def _offsets(t: _Tensor, data_start: int) -> str:
    return f"[{t.start - data_start}, {t.end - data_start}]"


def _check_tensor(name: str, spec, data_start: int, size: int, path) -> _Tensor:
    label = f"tensor {name!r}"
    where = {"path": path, "offset": _LENGTH_BYTES}
    if not isinstance(spec, dict) or not {"dtype", "shape", "data_offsets"} <= set(spec):
        raise FormatError(f"{label}: expected an object with dtype, shape and data_offsets", **where)
    code, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    if not isinstance(code, str) or code not in DTYPES:
        known = ", ".join(DTYPES)
        raise FormatError(f"{label}: unknown dtype {code!r}; blobtool reads {known}", **where)
    if (not isinstance(shape, list) or len(shape) > MAX_BLOB_AXES
            or not all(type(d) is int and d >= 0 for d in shape)):
        raise FormatError(f"{label}: shape {json.dumps(shape)[:80]} is not a list of at most {MAX_BLOB_AXES} "
                          "non-negative integers", **where)
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise FormatError(f"{label}: data_offsets {json.dumps(offsets)[:80]} is not [begin, end] with "
                          "0 <= begin <= end", **where)
    start, end = data_start + offsets[0], data_start + offsets[1]
    if end > size:
        raise FormatError(f"{label}: data_offsets {json.dumps(offsets)} end past the file: the data holds "
                          f"{size - data_start} bytes", path=path, offset=data_start)
    # Python ints: a forged shape cannot wrap around.
    need = math.prod(shape) * DTYPES[code].itemsize
    if need != end - start:
        raise FormatError(f"{label}: shape {shape} of {code} needs {need} bytes, data_offsets "
                          f"{offsets} hold {end - start}", path=path, offset=start)
    return _Tensor(name, code, tuple(shape), start, end)


def _values(t: _Tensor, source, cast, path) -> np.ndarray:
    """A tensor's values as a float32/float64 array: a view of the file for F32/F64, else converted."""
    raw = np.frombuffer(source.buf, dtype=DTYPES[t.code], count=t.count, offset=t.start)
    if t.code in ("F32", "F64"):
        return raw
    if t.code == "F16":
        return raw.astype(np.float32)
    if cast is None:
        stored = "bfloat16" if t.code == "BF16" else DTYPES[t.code].name
        raise FormatError(f"tensor {t.name!r} holds {stored} values; blobs are float32 or float64 "
                          f"({CAST_HINT})", path=path, offset=t.start)
    if t.code == "BF16":  # the high half of a float32: widening is exact
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(cast)
    return raw.astype(cast)


def _build_blob(entry: TensorEntry) -> Blob:
    t, path = entry.tensor, entry.source.name
    data = _values(t, entry.source, entry.cast, path)
    diff = _values(entry.diff_tensor, entry.source, entry.cast, path) if entry.diff_tensor else None
    # Each side in its own type: an F64 diff beside F32 data stays float64.
    held = held_dtype(data.dtype)
    blob = Blob(dtype=held, diff_dtype=held_dtype(diff.dtype, held) if diff is not None else None)
    try:
        blob.fill_from(t.shape, data, diff, adopt=True)
    except BlobToolError as exc:
        raise exc.with_path(path) from exc
    stored = _stored(t, blob.dtype)
    diff_stored = _stored(entry.diff_tensor, blob.diff_dtype) if diff is not None else None
    blob.origin = Origin("shape", stored, diff is not None,
                         diff_dtype=diff_stored if diff_stored is not None and diff_stored != stored else None)
    return blob


def _stored(t: _Tensor, held: np.dtype) -> np.dtype:
    """The dtype a tensor is written back in with no precision asked: its own float type, else the one it is held in."""
    return DTYPES[t.code].newbyteorder("=") if t.code in ("F16", "F32", "F64") else held


# -- writing ----------------------------------------------------------------------------

def _plan(entries: list, blobs: list, precision, write_diff, transforms) -> list:
    """(key, shape, values, target dtype, transform) for each tensor to write, in the blobs' order."""
    plan, names = [], []
    for k, (entry, blob) in enumerate(zip(entries, blobs)):
        asked = Precision.of(precision).for_blob(entry.name)
        form = resolve_form(blob, precision=asked, write_diff=write_diff)
        fns = (transforms or {}).get(entry.name, {})
        target = _target(blob, form, asked, "data")
        plan.append((entry.name, blob.shape, blob.cpu_data(), target, _bits(target, fns.get("data"))))
        names.append((entry.name, k, "data"))
        if form["write_diff"]:
            target = _target(blob, form, asked, "diff")
            plan.append((entry.name + DIFF_SUFFIX, blob.shape, blob.cpu_diff(), target, _bits(target, fns.get("diff"))))
            names.append((entry.name + DIFF_SUFFIX, k, "diff"))
    check_member_names(names, ".safetensors")
    return plan


def _target(blob: Blob, form: dict, asked, which: str) -> np.dtype:
    """The dtype one side of a blob is written in: the precision asked for, else as stored (each side its own).

    NVIDIA Caffe's INT/UINT payloads stay integers when no precision is asked for.
    """
    origin = blob.origin
    if asked is None and origin is not None:
        stored = origin.dtype if which == "data" or origin.diff_dtype is None else origin.diff_dtype
        if stored.kind in "iu":
            return stored.newbyteorder("<")
    precision = form["precision" if which == "data" else "diff_precision"]
    if precision == "bf16":
        return BF16_BITS
    return PRECISION_DTYPES[precision].newbyteorder("<")


# What a tensor written in bfloat16 (--bf16) is written as: its 16 bits, made
# from the values chunk by chunk (engine/bfloat16.py); the header says BF16.
BF16_BITS = np.dtype("<u2", metadata={"safetensors": "BF16"})


def _bits(target: np.dtype, transform):
    """The chunk transform writing `target`: bfloat16 bits after `transform`, or `transform` itself."""
    if target is not BF16_BITS:
        return transform

    def to_bits(chunk, start: int):
        from ..engine.bfloat16 import to_bfloat16_bits

        return to_bfloat16_bits(chunk if transform is None else transform(chunk, start))

    return to_bits


def metadata(doc: Document | None) -> dict:
    """What __metadata__ records: the source file's name and kind, the naming scheme, blobtool's version.

    A --names torch export adds its settings and mapping (Document.export_metadata).
    """
    meta = {}
    if doc is not None:
        source = os.path.basename(doc.path) if doc.path not in ("<stdin>", "<stream>") else doc.path
        meta["source"] = _utf8_text(source)
        meta["source_kind"] = doc.kind
    naming = doc.naming if doc is not None else "blobtool"
    if naming == "blobtool" and doc is not None and doc.kind == "safetensors":
        # A safetensors input keeps the names it was written with.
        naming = doc.meta.get("metadata", {}).get("names", naming)
    meta["names"] = _utf8_text(naming)
    meta["blobtool_version"] = __version__
    if doc is not None:
        # What --names torch knows beyond the tensors (torchport/metadata.py).
        meta.update({_utf8_text(k): _utf8_text(v) for k, v in doc.export_metadata.items()})
    return meta


def _utf8_text(text: str) -> str:
    """A metadata value as UTF-8 can hold it.

    A file name that is not UTF-8 (Python holds its bytes as surrogates) or
    a value read with a lone surrogate gets backslash escapes, as blobtool
    prints such names.
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def header_bytes(tensors: list, meta: dict | None) -> tuple[bytes, list]:
    """(the length field and header, the tensors in the order their bytes follow it).

    `tensors` are (name, shape, dtype) in the order the header lists them;
    the data is laid out by item size, largest first (stable), so that each
    tensor starts at a multiple of its item size.
    """
    order = sorted(range(len(tensors)), key=lambda i: -tensors[i][2].itemsize)
    offsets = {}
    pos = 0
    for i in order:
        name, shape, dtype = tensors[i]
        size = math.prod(shape) * dtype.itemsize
        offsets[i] = [pos, pos + size]
        pos += size
    header = {METADATA_KEY: meta} if meta else {}
    for i, (name, shape, dtype) in enumerate(tensors):
        code = "BF16" if dtype is BF16_BITS else _CODES[np.dtype(dtype).newbyteorder("=")]
        header[name] = {"dtype": code, "shape": list(shape),
                        "data_offsets": offsets[i]}
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % _HEADER_ALIGN)
    return len(text).to_bytes(_LENGTH_BYTES, "little") + text, order


def _check_utf8_names(doc, entries: list) -> None:
    """Refuse a blob name that UTF-8 cannot hold (a lone surrogate), before anything is written.

    A safetensors header is UTF-8 JSON, and a lone surrogate ("\\udc80", which
    a JSON header may spell and Python then holds) has no UTF-8 form: such a
    name cannot be written as it is, and writing another would lose it in
    silence. When the name came from an input file, that file is bad input.
    """
    for entry in entries:
        try:
            entry.name.encode("utf-8")
        except UnicodeEncodeError as exc:
            shown = entry.name.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
            message = (f"blob name '{shown}' holds a lone surrogate ({exc.reason}), which a safetensors "
                       "header (UTF-8 JSON) cannot hold")
            if doc is not None:
                raise FormatError(message, path=doc.path) from exc
            raise UsageError(message) from exc


def write(doc, entries: list, blobs: list, dest, *, kind: str, precision=None, write_diff=None, layout=None,
          transforms: dict | None = None) -> None:
    """Write the selected blobs (and their diffs, unless `write_diff` is False) as one safetensors file.

    `layout` does not apply (a tensor has a shape only). Values stream out
    chunk by chunk in the precision asked for, else as stored.
    """
    _check_utf8_names(doc, entries)
    plan = _plan(entries, blobs, precision, write_diff, transforms)
    head, order = header_bytes([(key, shape, target) for key, shape, _, target, _ in plan], metadata(doc))
    with atomic_output(dest) as out:
        write_parts(out, [head] + [(plan[i][2], plan[i][3], plan[i][4]) for i in order])
