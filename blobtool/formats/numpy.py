"""numpy's .npy and .npz files, both directions, and the "<name>/diff" convention.

Reading: an .npy holds one blob, named "0"; an .npz holds one blob per
member, named by the member (without ".npy"), and a member "<name>/diff" is
the diff of blob "<name>". float32/float64 arrays are adopted without a copy
(the memory-mapped file's bytes); other numeric dtypes are refused unless a
cast (float32 or float64) is given. Object arrays are never unpickled, and
.npz members must be stored or deflated (what numpy writes).

Writing: numpy's own writer (``numpy.save``/``numpy.savez``), never with
pickles. An .npy holds the data of exactly one blob in its dtype; an .npz
holds each blob under its name and, when its diff is written, the diff under
"<name>/diff".
"""

from __future__ import annotations

import io
import tokenize
import warnings
import zipfile
import zlib

import numpy as np

from ..blob import Blob, Origin, exact_values
from ..errors import BlobToolError, FormatError, UsageError
from ..source import Source, atomic_output
from . import MAX_BLOBS, Document, Entry

__all__ = ["sniff", "read", "write", "cast_for", "load_npy", "save_arrays", "blob_arrays", "DIFF_SUFFIX", "PRECISION_DTYPES"]

# Bytes of an .npy read to parse its header: magic, version, a length of up to
# 4 bytes, and the most header text numpy agrees to parse (10000 bytes).
_NPY_HEADER_READ = 12 + 10000
# The name suffix of a blob's diff in an .npz (and in other formats that hold
# arrays by name).
DIFF_SUFFIX = "/diff"
# The array dtype each write precision asks for (None: as the blob holds it).
PRECISION_DTYPES = {None: None, "float": np.dtype(np.float32), "double": np.dtype(np.float64),
                    "half": np.dtype(np.float16)}


_NPY_MAGIC = b"\x93NUMPY"


def sniff(source) -> str:
    """"npy" for numpy's .npy magic, else "npz" (the registry matched a zip signature)."""
    return "npy" if bytes(source.buf[:len(_NPY_MAGIC)]) == _NPY_MAGIC else "npz"


def cast_for(precision):
    """The dtype an .npy of another dtype (float16, integers) loads as when it is to be written in `precision`.

    None (no precision asked for) refuses such a file; "double" loads it as
    float64; "float" and "half" as float32 (a Blob holds float32 or float64).
    """
    if precision is None:
        return None
    return PRECISION_DTYPES["double" if precision == "double" else "float"]


def read(doc: Document, cast=None) -> None:
    """Read an .npy or .npz document's arrays as blobs (`cast`: float32/float64 for other numeric dtypes)."""
    (_read_npy if doc.kind == "npy" else _read_npz)(doc, cast)


def load_npy(source: Source, cast=None) -> Blob:
    """A Blob holding an .npy file's array; pickles never load.

    float32/float64 arrays are adopted without a copy. Other numeric arrays
    (float16, integers) are refused unless `cast` (float32 or float64) says
    what to convert them to.
    """
    from numpy.lib import format as npy_format

    # The header only (numpy refuses headers over 10000 bytes), not a copy of the whole file.
    stream = io.BytesIO(bytes(memoryview(source.buf)[:_NPY_HEADER_READ]))
    try:
        # numpy warns when a mangled header parses only with its Python 2
        # fallback; the header is judged below, and a warning would be a
        # second stderr line.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            version = npy_format.read_magic(stream)
            if version == (1, 0):
                shape, fortran, dtype = npy_format.read_array_header_1_0(stream)
            elif version == (2, 0):
                shape, fortran, dtype = npy_format.read_array_header_2_0(stream)
            else:
                raise ValueError(f"unsupported .npy version {version[0]}.{version[1]}")
    except (ValueError, OSError, SyntaxError, tokenize.TokenError) as exc:
        # numpy's header reader lets tokenize's and ast's errors through on a mangled header.
        raise FormatError(f"invalid .npy header: {exc}", path=source.name) from exc
    if dtype.hasobject:
        raise FormatError(f".npy holds {dtype} values (object arrays are never unpickled)", path=source.name)
    is_blob_dtype = dtype.kind == "f" and dtype.itemsize in (4, 8)
    if not is_blob_dtype and (cast is None or dtype.kind not in "biuf"):
        hint = " (convert it with --float or --double)" if dtype.kind in "biuf" else ""
        raise FormatError(f".npy holds {dtype} values; blobs are float32 or float64{hint}", path=source.name)
    if any(d < 0 for d in shape):
        raise FormatError(f"invalid .npy header: negative dimension in shape {shape}", path=source.name)
    native = np.dtype(cast) if cast is not None else dtype.newbyteorder("=")
    offset = stream.tell()
    # Python ints: a forged shape must not wrap around int64 and pass the size check.
    count = 1
    for d in shape:
        count *= d
    need = count * dtype.itemsize
    if source.size - offset < need:
        raise FormatError(
            f"truncated at byte {offset}: .npy array data needs {need} bytes, {source.size - offset} remain",
            path=source.name)
    blob = Blob(dtype=native)
    try:
        blob.reshape(shape)  # more than 32 axes, or an empty array too large for numpy
    except BlobToolError as exc:
        raise FormatError(f"invalid .npy header: {exc.reason}", path=source.name) from exc
    values = np.frombuffer(source.buf, dtype=dtype, count=count, offset=offset)
    if fortran and len(shape) > 1:
        values = values.reshape(shape[::-1]).transpose().copy().reshape(-1)
    if values.dtype != native:
        values = values.astype(native)
    try:
        blob.fill_from(shape, values, None, adopt=True)
    except BlobToolError as exc:
        raise exc.with_path(source.name) from exc
    blob.origin = Origin("shape", native, False)
    return blob


def _read_npy(doc: Document, cast) -> None:
    blob = load_npy(doc.source, cast=cast)
    doc.entries.append(Entry("0", blob.shape, "shape", blob.dtype, False, _blob=blob))


def _read_npz(doc: Document, cast) -> None:
    try:
        archive = zipfile.ZipFile(io.BytesIO(memoryview(doc.source.buf)))
        members = [info for info in archive.infolist() if info.filename.endswith(".npy")]
    except _ZIP_ERRORS as exc:
        raise FormatError(f"not a readable .npz (zip) file: {exc}", path=doc.path) from exc
    if len(members) > MAX_BLOBS:
        raise FormatError(f"holds {len(members)} arrays, more than {MAX_BLOBS} (blobtool's limit)", path=doc.path)
    arrays = {}
    for info in members:
        data = _read_member(archive, info, doc.path)
        sub = Source(f"{doc.path}[{info.filename}]", data, len(data))
        arrays[info.filename[:-4]] = load_npy(sub, cast=cast)
    for key, blob in arrays.items():
        if key.endswith(DIFF_SUFFIX) and key[:-len(DIFF_SUFFIX)] in arrays:
            continue
        diff = arrays.get(key + DIFF_SUFFIX)
        if diff is not None:
            if diff.count != blob.count:
                raise FormatError(f"array {key + DIFF_SUFFIX} has {diff.count} values, {key} has {blob.count}",
                                  path=doc.path)
            with np.errstate(over="ignore", invalid="ignore"):  # doubles past float32's range become inf
                np.copyto(blob.mutable_cpu_diff(), diff.cpu_data(), casting="unsafe")
            blob.origin = Origin("shape", blob.dtype, True)
        doc.entries.append(Entry(key, blob.shape, "shape", blob.dtype, diff is not None, _blob=blob))


# Everything zipfile raises on a damaged archive (a bad CRC, a bad local header,
# a broken deflate stream, an unknown compression method or zip version ...).
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError,
               RuntimeError, KeyError, OverflowError, UnicodeDecodeError)
# numpy writes .npz members stored or deflated; deflate expands at most 1032:1,
# so a member declaring more than that is forged, and is refused before reading.
_NPZ_MAX_EXPANSION = {zipfile.ZIP_STORED: 1, zipfile.ZIP_DEFLATED: 1032}


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path) -> bytearray:
    label = f"member {info.filename!r}"
    expansion = _NPZ_MAX_EXPANSION.get(info.compress_type)
    if expansion is None:
        raise FormatError(f"{label} uses zip compression method {info.compress_type}; "
                          ".npz members are stored or deflated", path=path, offset=info.header_offset)
    if info.file_size > expansion * info.compress_size:
        raise FormatError(f"{label} declares {info.file_size} bytes, more than its {info.compress_size} "
                          "stored bytes can hold", path=path, offset=info.header_offset)
    try:
        return bytearray(archive.read(info))
    except _ZIP_ERRORS as exc:
        raise FormatError(f"{label} is unreadable: {exc}", path=path, offset=info.header_offset) from exc


# -- writing ----------------------------------------------------------------------------

def blob_arrays(entries: list, blobs: list, *, with_diff: bool, precision=None, write_diff=None,
                transforms: dict | None = None) -> dict:
    """{name: array} for the blobs, each in its shape: the data, and "<name>/diff" for each diff written.

    Diffs are written when `with_diff` (the format holds several arrays) and
    `write_diff` (None: each blob that has one). `precision` converts
    ("float", "double", "half"); None keeps the blob's dtype, or the integer
    type a blob stored as integers came with. `transforms` are applied first.
    """
    target = PRECISION_DTYPES[precision]
    arrays = {}
    for entry, blob in zip(entries, blobs):
        fns = (transforms or {}).get(entry.name, {})
        keep_diff = with_diff and (entry.has_diff if write_diff is None else write_diff)
        for which, key in (("data", entry.name), ("diff", entry.name + DIFF_SUFFIX)):
            if which == "diff" and not keep_diff:
                continue
            values = blob.cpu_data() if which == "data" else blob.cpu_diff()
            if fns.get(which):
                values = fns[which](values, 0)
            values = values.reshape(blob.shape)
            if target is None and blob.origin is not None and blob.origin.dtype.kind in "iu":
                values = exact_values(values, blob.origin.dtype)  # integers stay integers
            arrays[key] = values if target is None else values.astype(target)
    return arrays


def write(doc, entries: list, blobs: list, dest, *, kind: str, precision=None, write_diff=None, layout=None,
          transforms: dict | None = None) -> None:
    """Write the selected blobs as an .npy (`kind` "npy": one blob's data) or .npz ("npz": every blob and diff)."""
    arrays = blob_arrays(entries, blobs, with_diff=kind == "npz", precision=precision, write_diff=write_diff,
                         transforms=transforms)
    save_arrays(arrays, dest, fmt=kind)


class _Writes:
    """Only the write() of a file: numpy then writes through it in chunks.

    Given a real file, np.save uses ndarray.tofile, whose short write on a
    full disk says "N requested and M written" and loses the reason (errno).
    """

    def __init__(self, out):
        self.write = out.write


def save_arrays(arrays: dict, dest, *, fmt: str) -> None:
    """Write arrays as .npy (exactly one) or .npz (keyed by name), atomically.

    Arrays are written with numpy's own format writer; pickles are never
    written (allow_pickle=False).
    """
    if fmt == "npy":
        if len(arrays) != 1:
            raise UsageError(f".npy holds one array; {len(arrays)} selected (choose one with --blob, or use .npz)")
        (array,) = arrays.values()
        with atomic_output(dest) as out:
            np.save(_Writes(out), array, allow_pickle=False)
    elif fmt == "npz":
        with atomic_output(dest) as out:
            np.savez(out, **arrays)
    else:
        raise UsageError(f"unknown array format {fmt!r}")
