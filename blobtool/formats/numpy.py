"""numpy's .npy and .npz files, both directions, and the "<name>/diff" convention.

Reading .npy: one blob, named "0". The header is checked in full before
anything else is read (npyheader.py: exactly the keys 'descr',
'fortran_order' and 'shape', each of its type; at most 10000 characters,
numpy's own limit). float32/float64 arrays are adopted without a
copy (the memory-mapped file's bytes); other numeric dtypes are refused unless
a cast (float32 or float64) is given. Object arrays are never unpickled.

Reading .npz: one blob per ".npy" member, named by the member without
".npy", in the archive's order. Opening reads only each member's .npy header
(the first bytes of the member, inflated up to the header's end), so listing
a deflate bomb costs what its headers cost. A member's values are inflated
when its blob is first used, to exactly the size its header declares: a
member whose zip entry declares another size is refused when the file is
opened, and one whose deflate stream disagrees with its zip entry fails its
CRC. Members must be stored or deflated (what numpy writes). A zip file with
no ".npy" member is not an .npz.

Diffs (DIFF_SUFFIX): a member "<name>/diff" is the diff of the blob "<name>"
when a member "<name>" exists and is not itself a diff. So every member is
either a blob or the diff of exactly one blob, and none is dropped (a diff
keeps its own dtype: float64 beside float32 data stays float64): with
members "x", "x/diff" and "x/diff/diff", "x/diff" is the diff of "x" and
"x/diff/diff" is a blob of its own (its base is a diff). Names are decided
shortest first, so the answer never depends on the members' order.

Writing: the zip is written here (stored, ZIP64 where needed, as numpy's
savez does) and each array streamed into its member by numpy's own
``numpy.lib.format.write_array``, never with pickles, so any name survives
(numpy's savez takes the names as keyword arguments). An .npy holds the data
of exactly one blob in its dtype; an .npz holds each blob under its name and,
when its diff is written, the diff under "<name>/diff". A set of names that
would read back otherwise (a blob "x" without diff beside a blob "x/diff")
is refused before anything is written.
"""

from __future__ import annotations

import functools
import zipfile
import zlib
from dataclasses import dataclass

import numpy as np
from numpy.lib import format as npy_format

from ..engine.blob import Blob
from .origin import Origin, Precision, exact_values, held_dtype
from .writing import UnreadValues
from ..errors import BlobToolError, FormatError, UsageError, parameter, require_bytes
from ..engine.kernels import cast_written
from ..files import BufferFile, Source, atomic_output
from . import CAST_HINT, DEFLATE_MAX_EXPANSION, MAX_BLOBS, PRECISION_TYPES, Document, Entry
from .npyheader import NPY_HEADER_READ, NPY_MAGIC, NPY_VERSIONS, NpyHeader, parse_npy_header
from .zipdir import check_entry_count

__all__ = ["sniff", "read", "write", "cast_for", "load_npy", "save_arrays", "iter_blob_arrays",
           "member_names", "check_member_names", "pair_diffs", "parse_npy_header", "NpyHeader", "DIFF_SUFFIX",
           "PRECISION_DTYPES"]

# The name suffix of a blob's diff in an .npz (and in other formats that hold
# arrays by name).
DIFF_SUFFIX = "/diff"
# The array dtype each write precision asks for (None: as the blob holds it).
PRECISION_DTYPES = {None: None, **{name: np.dtype(text) for name, text in PRECISION_TYPES.items()}}
# Inflated bytes copied at a time from an .npz member into its array.
_INFLATE_CHUNK = 1 << 22
# Members an .npz may hold besides its arrays (anything not named .npy is passed over).
_MAX_OTHER_MEMBERS = 64


def sniff(source) -> str:
    """"npy" for numpy's .npy magic, else "npz" (the registry matched a zip signature)."""
    return "npy" if bytes(source.buf[:len(NPY_MAGIC)]) == NPY_MAGIC else "npz"


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


def _native_dtype(header: NpyHeader, cast, path) -> np.dtype:
    """The dtype the blob holds: float32/float64 as stored (native order), else `cast`; FormatError if neither.

    float16 needs no `cast`: it widens to float32 exactly (as Caffe's forks'
    float16 blobs are held), so a `--half` output reads back as it was written.
    """
    dtype = header.dtype
    if dtype.hasobject:
        raise FormatError(f".npy holds {dtype} values (object arrays are never unpickled)", path=path)
    if dtype.kind == "f" and dtype.itemsize == 2 and cast is None:
        return np.dtype(np.float32)
    is_blob_dtype = dtype.kind == "f" and dtype.itemsize in (4, 8)
    if not is_blob_dtype and (cast is None or dtype.kind not in "biuf"):
        hint = f" ({CAST_HINT})" if dtype.kind in "biuf" else ""
        raise FormatError(f".npy holds {dtype} values; blobs are float32 or float64{hint}", path=path)
    return np.dtype(cast) if cast is not None and not is_blob_dtype else dtype.newbyteorder("=")


def _check_shape(header: NpyHeader, native: np.dtype, path) -> None:
    """Refuse a shape a blob cannot take (more than 32 axes, more bytes than numpy addresses)."""
    try:
        _blob_shape_ok(header.shape, native)
    except BlobToolError as exc:
        raise FormatError(f"invalid .npy header: {exc.reason}", path=path) from exc


@functools.lru_cache(maxsize=1024)  # an .npz's members repeat a few shapes
def _blob_shape_ok(shape: tuple, native: np.dtype) -> bool:
    Blob(dtype=native).reshape(shape)
    return True


def _c_order(header: NpyHeader, values: np.ndarray) -> np.ndarray:
    """Flat values in C order (a Fortran-order array's are copied into it)."""
    if header.fortran and len(header.shape) > 1:
        return values.reshape(header.shape[::-1]).transpose().copy().reshape(-1)
    return values


def _blob_from_values(header: NpyHeader, values: np.ndarray, native: np.dtype, diff=None, path=None,
                      diff_native: np.dtype | None = None) -> Blob:
    """A Blob of `values` (flat, in the header's dtype and order) and `diff` (flat, C order, held as
    `diff_native`: its own type, so a float64 diff beside float32 data is not narrowed);
    float32/float64 values adopted without a copy."""
    values = _c_order(header, values)
    if values.dtype != native:
        # Past float32's range: inf, as Caffe's cast; a signalling NaN: a quiet
        # one. numpy's warnings about either would be a second stderr line.
        with np.errstate(over="ignore", invalid="ignore"):
            values = values.astype(native)
    diff_native = native if diff is None or diff_native is None else held_dtype(diff_native, native)
    blob = Blob(dtype=native, diff_dtype=diff_native)
    try:
        blob.fill_from(header.shape, values, diff, adopt=True)
    except BlobToolError as exc:
        raise exc.with_path(path) from exc
    # float16: written as float32 unless --half
    blob.origin = Origin("shape", native, diff is not None, diff_dtype=diff_native if diff_native != native else None)
    return blob


def load_npy(source: Source, cast=None) -> Blob:
    """A Blob holding an .npy file's array; pickles never load.

    float32/float64 arrays are adopted without a copy. Other numeric arrays
    (float16, integers) are refused unless `cast` (float32 or float64) says
    what to convert them to.
    """
    header = parse_npy_header(memoryview(source.buf)[:NPY_HEADER_READ], source.name)
    native = _native_dtype(header, cast, source.name)
    require_bytes(source.size, header.offset, header.nbytes, ".npy array data needs", path=source.name)
    _check_shape(header, native, source.name)
    values = np.frombuffer(source.buf, dtype=header.dtype, count=header.count, offset=header.offset)
    return _blob_from_values(header, values, native, path=source.name)


def _read_npy(doc: Document, cast) -> None:
    blob = load_npy(doc.source, cast=cast)
    doc.entries.append(Entry("0", blob.shape, "shape", blob.dtype, False, _blob=blob))


# -- .npz -----------------------------------------------------------------------------------

def pair_diffs(names) -> tuple:
    """(blob names in order, {blob name: its diff's name}) for arrays named `names` (see DIFF_SUFFIX).

    "<name>/diff" is the diff of "<name>" when "<name>" is among the names
    and is not itself a diff; decided shortest name first, so every name is
    exactly one blob or one diff, whatever the order.
    """
    present = set(names)
    is_diff = {}
    for name in sorted(present, key=len):
        base = name[:-len(DIFF_SUFFIX)] if name.endswith(DIFF_SUFFIX) else None
        is_diff[name] = base is not None and base in present and not is_diff[base]
    blobs = [n for n in names if not is_diff[n]]
    diffs = {n[:-len(DIFF_SUFFIX)]: n for n in names if is_diff[n]}
    return blobs, diffs


# Everything zipfile raises on a damaged archive (a bad CRC, a bad local header,
# a broken deflate stream, an unknown compression method or zip version ...).
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError,
               RuntimeError, KeyError, OverflowError, UnicodeDecodeError)
# numpy writes .npz members stored or deflated; a member declaring more than
# deflate can expand to is forged, and is refused before reading.
_NPZ_MAX_EXPANSION = {zipfile.ZIP_STORED: 1, zipfile.ZIP_DEFLATED: DEFLATE_MAX_EXPANSION}


@dataclass
class _Member:
    """An .npz member whose header has been read: where it is, and its checked header."""

    info: zipfile.ZipInfo
    header: NpyHeader
    native: np.dtype
    path: str        # "<file>[<member>]", for messages about its contents


def _member_blob(member: _Member, diff: _Member | None, archive, doc_path) -> Blob:
    """An .npz blob, its values (and its diff's) inflated now: an Entry's `build`, run when the blob is first used."""
    values = _inflate(archive, member, doc_path)
    diff_values = None
    if diff is not None:
        diff_values = _c_order(diff.header, _inflate(archive, diff, doc_path))
    return _blob_from_values(member.header, values, member.native, diff_values, member.path,
                             diff_native=diff.native if diff is not None else None)


def _read_npz(doc: Document, cast) -> None:
    check_entry_count(doc.source.buf, MAX_BLOBS + _MAX_OTHER_MEMBERS,
                      f"the {MAX_BLOBS} arrays blobtool reads (its limit)", doc.path)
    try:
        archive = zipfile.ZipFile(BufferFile(doc.source.buf))
        infos = archive.infolist()
    except _ZIP_ERRORS as exc:
        raise FormatError(f"not a readable .npz (zip) file: {exc}", path=doc.path) from exc
    infos = [info for info in infos if info.filename.endswith(".npy")]
    if not infos:
        raise FormatError("not an .npz: the zip file holds no .npy member", path=doc.path)
    if len(infos) > MAX_BLOBS:
        raise FormatError(f"holds {len(infos)} arrays, more than {MAX_BLOBS} (blobtool's limit)", path=doc.path)
    members = {}
    for info in infos:
        name = info.filename[:-len(".npy")]
        if name in members:
            raise FormatError(f"holds two members named {info.filename!r}", path=doc.path, offset=info.header_offset)
        members[name] = _open_member(archive, info, doc.path, cast)
    blobs, diffs = pair_diffs(list(members))
    for name in blobs:
        member, diff = members[name], members.get(diffs.get(name))
        if diff is not None and diff.header.count != member.header.count:
            raise FormatError(f"array {diff.info.filename[:-4]} has {diff.header.count} values, {name} has "
                              f"{member.header.count}", path=doc.path)
        doc.entries.append(Entry(name, member.header.shape, "shape", member.native, diff is not None,
                                 build=functools.partial(_member_blob, member, diff, archive, doc.path),
                                 diff_dtype=diff.native if diff is not None and diff.native != member.native
                                 else None))


def check_compression(info: zipfile.ZipInfo, label: str, expected: str, path, end: int) -> None:
    """Refuse a zip member neither stored nor deflated, lying outside the members' bytes, or declaring more
    bytes than its stored ones can hold.

    `end`: where the members' bytes end (zipfile's start_dir, the central
    directory's start): a member's header and stored bytes lie before it,
    so what it declares is bounded by the file, not by its own forged sizes.
    """
    expansion = _NPZ_MAX_EXPANSION.get(info.compress_type)
    if expansion is None:
        raise FormatError(f"{label} uses zip compression method {info.compress_type}; {expected}", path=path,
                          offset=info.header_offset)
    if info.header_offset < 0 or info.header_offset + info.compress_size > end:
        raise FormatError(f"{label}: {info.compress_size} stored bytes from byte {info.header_offset} lie outside "
                          f"the zip's members (bytes 0 to {end})", path=path, offset=max(info.header_offset, 0))
    if info.file_size > expansion * info.compress_size:
        raise FormatError(f"{label} declares {info.file_size} bytes, more than its {info.compress_size} "
                          "stored bytes can hold", path=path, offset=info.header_offset)


def _open_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path, cast) -> _Member:
    """Read and check a member's .npy header, inflating no more of it than the header."""
    label = f"member {info.filename!r}"
    check_compression(info, label, ".npz members are stored or deflated", path, archive.start_dir)
    try:
        with archive.open(info) as stream:
            head = _read_head(stream, min(info.file_size, NPY_HEADER_READ))
    except _ZIP_ERRORS as exc:
        raise FormatError(f"{label} is unreadable: {exc}", path=path, offset=info.header_offset) from exc
    where = f"{path}[{info.filename}]"
    header = parse_npy_header(head, where)
    native = _native_dtype(header, cast, where)
    if info.file_size != header.offset + header.nbytes:
        require_bytes(info.file_size, header.offset, header.nbytes, ".npy array data needs", path=where)
        raise FormatError(f"{label} holds {info.file_size} bytes; its .npy header declares "
                          f"{header.offset + header.nbytes}", path=path, offset=info.header_offset)
    _check_shape(header, native, where)
    return _Member(info, header, native, where)


def _read_head(stream, size: int) -> bytes:
    """The member's first bytes up to its .npy header's end (at most `size`): the length first, then the text."""
    head = stream.read(min(size, 12))
    if len(head) >= 10 and head.startswith(NPY_MAGIC):
        width = NPY_VERSIONS.get((head[6], head[7]), (4, None))[0]
        end = 8 + width + int.from_bytes(head[8:8 + width], "little")
        head += stream.read(max(0, min(size, end) - len(head)))
    return head


def _inflate(archive: zipfile.ZipFile, member: _Member, doc_path) -> np.ndarray:
    """The member's array data, flat in its stored dtype: exactly the bytes its header declares."""
    header = member.header
    return inflate_member(archive, member.info, header.offset, header.nbytes, f"member {member.info.filename!r}",
                          doc_path).view(header.dtype)


def inflate_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, skip: int, nbytes: int, label: str,
                   doc_path) -> np.ndarray:
    """`nbytes` of a zip member after its first `skip`, inflated into one new uint8 array; its CRC checked.

    Read _INFLATE_CHUNK at a time: zipfile's readinto reads the whole
    request into a bytes object first, which doubled the peak (a 512 MiB
    member peaked at 1.13 GB; chunked, at the array and one chunk).
    """
    out = np.empty(nbytes, np.uint8)
    try:
        with archive.open(info) as stream:
            stream.read(skip)
            done = 0
            while done < nbytes:
                chunk = stream.read(min(_INFLATE_CHUNK, nbytes - done))
                if not chunk:
                    raise EOFError(f"ends after {done} of {nbytes} bytes of array data")
                out[done:done + len(chunk)] = np.frombuffer(chunk, np.uint8)
                done += len(chunk)
            stream.read(1)  # the end of the member: zipfile checks its CRC there
    except _ZIP_ERRORS as exc:
        raise FormatError(f"{label} is unreadable: {exc}", path=doc_path, offset=info.header_offset) from exc
    return out


# -- writing ----------------------------------------------------------------------------

def member_names(entries: list, *, with_diff: bool, write_diff=None) -> list:
    """[(array name, entry index, "data" or "diff")] in the order they are written.

    Diffs are written when `with_diff` (the format holds several arrays) and
    `write_diff` (None: each blob that has one).
    """
    names = []
    for k, entry in enumerate(entries):
        names.append((entry.name, k, "data"))
        if with_diff and (entry.has_diff if write_diff is None else write_diff):
            names.append((entry.name + DIFF_SUFFIX, k, "diff"))
    return names


def check_member_names(names: list, what: str = ".npz", source: str | None = None) -> None:
    """Refuse array names a `what` file (.npz, .safetensors) cannot hold or would read back otherwise.

    A UsageError, raised before anything is written; a name that is not
    text at all (a lone surrogate) read from the input `source` makes that
    input bad (FormatError).
    """
    keys = [key for key, _, _ in names]
    seen = set()
    for key in keys:
        if key in seen:
            raise UsageError(f"two arrays would be named {key!r} in the {what} (a blob's diff is \"<name>/diff\")")
        seen.add(key)
        if what == ".npz":
            _check_zip_name(key, source)
    read_as_diff = set(pair_diffs(keys)[1].values())
    for key, _, which in names:  # a blob's data comes before its diff: the first mismatch is a data array
        if (which == "diff") != (key in read_as_diff):
            base = key[:-len(DIFF_SUFFIX)]
            raise UsageError(f"blob {key!r} would read back as the diff of blob {base!r} (a {what} keeps a diff as "
                             "\"<name>/diff\"); select the blobs to write with "
                             f"{parameter('blobs')}, or write another format")


def _check_zip_name(key: str, source: str | None = None) -> None:
    """Refuse a name that a zip member cannot hold as it is (zipfile would cut it at a NUL).

    A name with a lone surrogate has no UTF-8 form: when it came from the
    input `source`, that input is bad (exit 3), as for safetensors' names.
    """
    if "\x00" in key:
        raise UsageError(f"blob name {key!r} holds a NUL character, which a zip member name cannot")
    try:
        size = len((key + ".npy").encode("utf-8"))
    except UnicodeEncodeError as exc:
        shown = key.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
        message = f"blob name '{shown}' is not valid Unicode text ({exc.reason}), which a zip member name cannot hold"
        if source is not None:
            raise FormatError(message, path=source) from exc
        raise UsageError(message) from exc
    if size > 0xFFFF:
        raise UsageError(f"blob name of {size} bytes; a zip member name holds at most 65535")


def iter_blob_arrays(entries: list, blobs: list, *, with_diff: bool, precision=None, write_diff=None,
                     transforms: dict | None = None):
    """(name, array) for the blobs, each in its shape and made when it is asked for (one converted copy at a time).

    The data, and "<name>/diff" for each diff written: diffs are written
    when `with_diff` (the format holds several arrays) and `write_diff`
    (None: each blob that has one). `precision` converts ("float", "double",
    "half"); None keeps the blob's dtype, or the integer type a blob stored
    as integers came with. `transforms` are applied to the values first.
    A blob whose values are not read yet (writing.Unread) is read for its
    pairs and let go after its last one, once the caller asks for the next.
    """
    names = member_names(entries, with_diff=with_diff, write_diff=write_diff)
    following = None
    for i, (key, k, which) in enumerate(names):
        blob = blobs[k]
        values = following or (blob.cpu_data() if which == "data" else blob.cpu_diff())
        following = None
        if not isinstance(values, UnreadValues):
            yield key, _blob_array(entries[k].name, blob, which, values, precision, transforms)
            continue
        if i + 1 < len(names) and names[i + 1][1] == k:  # its diff next: the blob stays read for it
            following = blob.cpu_diff()
        yield key, _blob_array(entries[k].name, blob, which, values.read(), precision, transforms)
        values.written(following)


def _blob_array(name: str, blob, which: str, values: np.ndarray, precision, transforms) -> np.ndarray:
    """One side of blob `name` as the array to write, in its shape (iter_blob_arrays)."""
    target = PRECISION_DTYPES[Precision.of(precision).for_blob(name)]
    transform = (transforms or {}).get(name, {}).get(which)
    if transform:
        values = transform(values, 0)
    values = values.reshape(blob.shape)
    stored = _stored_dtype(blob, which)
    if target is None and stored is not None and stored.kind in "iu":
        values = exact_values(values, stored)  # integers stay integers
    elif target is not None:
        values = cast_written(values, target, transform)  # quietly, as in the cast on reading
    return values


def _stored_dtype(blob: Blob, which: str) -> np.dtype | None:
    """The dtype one side of a loaded blob was stored in (the diff may differ from the data); None for a new blob."""
    origin = blob.origin
    if origin is None:
        return None
    return origin.diff_dtype if which == "diff" and origin.diff_dtype is not None else origin.dtype


def write(doc, entries: list, blobs: list, dest, *, kind: str, precision=None, write_diff=None, layout=None,
          transforms: dict | None = None) -> None:
    """Write the selected blobs as an .npy (`kind` "npy": one blob's data) or .npz ("npz": every blob and diff)."""
    names = member_names(entries, with_diff=kind == "npz", write_diff=write_diff)
    if kind == "npz":
        check_member_names(names, source=doc.path if doc is not None else None)
    elif len(names) != 1:
        raise UsageError(f".npy holds one array; {len(names)} selected (choose one with {parameter('blobs')}, or use .npz)")
    arrays = iter_blob_arrays(entries, blobs, with_diff=kind == "npz", precision=precision, write_diff=write_diff,
                              transforms=transforms)
    save_arrays(arrays, dest, fmt=kind)


class _Writes:
    """Only the write() of a file: numpy then writes through it in chunks.

    Given a real file, np.save uses ndarray.tofile, whose short write on a
    full disk says "N requested and M written" and loses the reason (errno).
    """

    def __init__(self, out):
        self.write = out.write


def save_arrays(arrays, dest, *, fmt: str) -> None:
    """Write arrays (a {name: array} dict or (name, array) pairs) as .npy (exactly one) or .npz, atomically.

    Arrays are written with numpy's own format writer, one at a time;
    pickles are never written (allow_pickle=False). A name a zip member
    cannot hold is refused; whether the names read back as meant (a diff
    as "<name>/diff") is for the caller to check (check_member_names).
    """
    pairs = arrays.items() if isinstance(arrays, dict) else arrays
    if fmt == "npy":
        pairs = list(pairs)
        if len(pairs) != 1:
            raise UsageError(f".npy holds one array; {len(pairs)} selected (choose one with {parameter('blobs')}, or use .npz)")
        with atomic_output(dest) as out:
            np.save(_Writes(out), pairs[0][1], allow_pickle=False)
    elif fmt == "npz":
        with atomic_output(dest) as out:
            written = 0
            # What numpy's savez does, without its keyword arguments: stored
            # members, ZIP64 where needed, each array streamed by write_array.
            with zipfile.ZipFile(out, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
                for key, array in pairs:
                    _check_zip_name(key)
                    with archive.open(key + ".npy", mode="w", force_zip64=True) as member:
                        npy_format.write_array(member, np.asarray(array), allow_pickle=False)
                    written += 1
                    del array  # before the next is made: one array held at a time
            if not written:
                raise UsageError("an .npz holds at least one array; nothing was selected")
    else:
        raise UsageError(f"unknown array format {fmt!r}")
