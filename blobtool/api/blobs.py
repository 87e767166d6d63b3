"""Reading and writing blobs: load, load_all, state_dict, save, write, resolve_precision.

Everything the command line does to files, a Python user can do here in one
call: read any kind of file (the kind sniffed from its bytes), and write a
selection of blobs in any format blobtool writes, with the same options.
"""

from __future__ import annotations

import contextlib
import os
import warnings

from ..engine.blob import Blob
from ..engine.float16 import HALF, half_precisions
from ..formats.writing import Unread, check_layout
from ..errors import FormatError, UsageError, parameter
from ..formats import NAMING_SCHEMES, Document, Entry, module, open_document, reading
from ..formats.origin import Precision
from ..formats.targets import output_target
from ..files import releasing, writes_in_place
from .common import say

__all__ = ["load", "load_all", "state_dict", "save", "write", "resolve_precision", "new_entry"]


def load(src) -> Blob:
    """Read the one blob of a BlobProto or .npy file (path, "-" or binary file object).

    The payload is not copied: the blob's data views the memory-mapped file
    (copy-on-write, so changing the blob never changes the file). Values come
    from double_data when it is non-empty (a float64 blob), else data.

    Raises
    ------
    BlobToolError
        FormatError naming the file, byte offset and field on bad input; for
        a container (net, solverstate, vector, npz), pointing to load_all.
    """
    doc = open_document(src)
    if doc.kind in ("blob", "npy"):
        return doc.entries[0].blob()
    raise FormatError(f"this is a {doc.kind} file holding {len(doc.entries)} blobs; "
                      "use blobtool.load_all() to read them", path=doc.path)


def load_all(src, kind: str | None = None, *, key: str | None = None) -> dict:
    """Every blob of any kind of file, as an ordered {name: Blob} dict (names as in blobtool.formats).

    `key`: of a PyTorch checkpoint holding several state dicts, the one to
    read ("ema", "model/state_dict"), as --key.
    """
    with reading(key=key):
        doc = open_document(src, kind)
    return {e.name: e.blob() for e in doc.entries}


def state_dict(src, names: str = "torch", *, kind: str | None = None, key: str | None = None, warn=None) -> dict:
    """Every blob of a file as {name: numpy array}, named as PyTorch names them (default) or as blobtool does.

    With names="torch" (or "torch-identifiers", each module name made a
    Python identifier as ``--names torch-identifiers`` makes it) a .caffemodel's blobs are renamed by layer type as
    ``convert --names torch`` names them (torchport/naming.py: BatchNorm
    statistics divided by their factor, a Scale after a BatchNorm under the
    BatchNorm's name, ...), so that ``model.load_state_dict({k:
    torch.from_numpy(v) for k, v in blobtool.state_dict(path).items()})`` is
    one line; a file without layers (.safetensors, .npz) keeps the names it
    holds. The arrays are copies, writable, float32 or float64 (a float16
    blob comes as float32); diffs are not included. The rename's warnings
    (layer types without a rule) go to `warn(line)` (default: warnings.warn).
    `key` picks a PyTorch checkpoint's state dict, as in load_all.
    """
    if names not in NAMING_SCHEMES:
        raise UsageError(f"unknown naming scheme {names!r}; expected {', '.join(NAMING_SCHEMES)}")
    with reading(key=key):
        doc = open_document(src, kind)
    with doc:
        entries = doc.entries
        if names != "blobtool" and doc.kind == "net":
            from ..torchport.metadata import named

            renamed = named(doc, scheme=names)
            say(renamed.warnings, warn)
            entries = renamed.document.entries
        return {e.name: e.blob().cpu_data().reshape(e.shape).copy() for e in entries}


def save(blob: Blob, dest, *, double: bool | None = None, write_diff: bool | None = None,
         layout: str | None = None, precision: str | None = None, transforms: dict | None = None,
         half_strict: bool = False, warn=None) -> None:
    """Write `blob` as a BlobProto to a path, "-" or a binary file object.

    Parameters
    ----------
    double : True writes double_data (float64), False data (float32).
    write_diff : whether to write the diff.
    layout : "shape" (Caffe's ToProto) or "legacy" (num/channels/height/width).
    precision : "float", "double" or "half" (NVIDIA Caffe's raw FLOAT16);
        overrides `double`. A blob that float16 cannot hold is written in
        float32 with a warning (or refused with `half_strict`), as in write.
    transforms : optional {"data"|"diff": fn(chunk, start) -> array} applied
        chunk by chunk while writing (see blobwrite.encode_blob_parts).

    None keeps what the blob came with (a blob made in Python: its dtype,
    "shape", no diff). Paths are written atomically: a temporary file beside
    the target, then a rename.
    """
    from ..formats.caffe import save_blob  # a format module loads when a file of its format is met

    if precision is None and double is not None:
        precision = "double" if double else "float"
    if precision == "half":
        precision = _half_precisions(None, [new_entry("0", blob)], [blob], write_diff=write_diff,
                                     transforms={"0": transforms} if transforms else None, strict=half_strict,
                                     warn=warn)["0"]
    save_blob(blob, dest, precision=precision, write_diff=write_diff, layout=layout, transforms=transforms)


def write(doc: Document | None, blobs, dest, *, format: str | None = None, precision: str | None = None,
          layout: str | None = None, write_diff: bool | None = None, transforms: dict | None = None,
          release: bool = False, half_strict: bool = False, warn=None) -> str:
    """Write blobs to `dest` (a path, "-" or a binary file object) in any format blobtool writes.

    Parameters
    ----------
    doc : the Document the blobs came from (open_document), or None for
        blobs made in Python (then only "blob", "npy" and "npz" can be written).
    blobs : {name: Blob} to write, in order; None writes every blob of `doc`.
        Names not in `doc` are new blobs (without a layer).
    format : "blob" (one BlobProto), "npy", "npz", "safetensors", "hdf5"
        (Caffe's HDF5 snapshot of a net or solver state input), "protobuf"
        (the input's kind as Caffe's protobuf: a .prototxt input becomes a
        .caffemodel without blobs), or "same" (the input's own kind and
        format, every other byte of a protobuf container kept); a net's
        definition as text is definition_text's;
        None chooses from dest's extension (.npy, .npz, .safetensors,
        .pb/.binaryproto/.blob/.protobin, .h5/.hdf5,
        .caffemodel/.solverstate); a name without an extension (or a file
        object) gives "same" for a container input and "blob" otherwise;
        any other extension is a UsageError.
    precision : "float", "double", "half", or "bf16" (bfloat16, safetensors
        only; kept wider where it would make an Inf, as "half" is), or a
        {name: precision} dict (resolve_precision's); layout : "shape" or "legacy";
    write_diff : None keeps each blob's stored form.
        With "half", a blob whose finite values do not fit float16 (past
        65504) is written in float32 instead (float64 past float32's range),
        never as Inf: `warn(line)` is called with one line per such blob and
        one counting the values that became subnormal or 0 (default:
        warnings.warn). `half_strict` raises UsageError for such a blob
        instead, before anything is written.
    transforms : {name: {"data"|"diff": fn(chunk, start) -> array}} applied
        chunk by chunk while writing (how scale and update stream).
    release : hand the input's mapped pages back to the kernel as they are
        written out, so that memory stays bounded whatever the file size.
        Only for blobs that are not used afterwards: a page changed in
        memory (scale_data on the host) reads back as the file's bytes.

    Returns the kind written. Paths are written atomically.
    """
    if doc is None and blobs is None:
        raise UsageError("write: nothing to write (no document and no blobs)")
    if doc is not None and output_target(dest, format, doc)[0].name == "prototxt":
        raise UsageError("a .prototxt holds a net's definition and no blobs: blobtool.definition_text(src, dest) "
                         "writes it", path=doc.path)
    entries, blob_list = _to_write(doc, blobs, layout)
    fmt, kind = output_target(dest, format, doc)
    if kind == "blob" and len(blob_list) != 1:
        raise UsageError(_one_blob_message(dest, format, doc, len(blob_list)))
    if precision == "bf16" and fmt.name != "safetensors":
        raise UsageError(f"bfloat16 ({parameter('precision', given='bf16')}) is written to .safetensors only: the "
                         f"{kind} output (format {fmt.name}) has no bfloat16 type; write .safetensors, or use "
                         f"{parameter('precision', given='half')} (float16)")
    precision = resolve_precision(doc, entries, blob_list, precision, write_diff=write_diff, transforms=transforms,
                                  half_strict=half_strict, warn=warn)
    if doc is not None and doc.naming != "blobtool" and fmt.name == doc.format and kind == doc.kind:
        raise UsageError(f"blobs renamed with {parameter('names', True)}{doc.naming} cannot be written back into the {kind} they "
                         "came from; write .safetensors, .npz or .npy")
    if writes_in_place(dest):
        _read_unread(doc, entries, blob_list, fmt, kind)
    with releasing() if release else contextlib.nullcontext():
        module(fmt).write(doc, entries, blob_list, dest, kind=kind, precision=Precision.of(precision),
                          write_diff=write_diff, layout=layout, transforms=transforms)
    return kind


def _to_write(doc: Document | None, blobs: dict | None, layout: str | None) -> tuple:
    """(entries, blobs) that write writes: `doc`'s every blob, or `blobs` (a name not in `doc` a new entry).

    Each blob's layout is checked here, before anything is written, whatever the format.
    """
    if blobs is None:
        entries = list(doc.entries)
        blob_list = [e.blob() for e in entries]
    else:
        known = {e.name: e for e in doc.entries} if doc is not None else {}
        entries = [known.get(name) or new_entry(name, blob) for name, blob in blobs.items()]
        blob_list = list(blobs.values())
    for entry, blob in zip(entries, blob_list):
        try:
            check_layout(blob, layout)
        except UsageError as exc:
            raise UsageError(f"blob {entry.name}: {exc.reason}", path=doc.path if doc is not None else None) from exc
    return entries, blob_list


def resolve_precision(doc: Document | None, entries: list, blobs: list, precision, *, write_diff=None,
                      transforms=None, half_strict: bool = False, warn=None):
    """The precision `write` writes in: for "half" and "bf16", {name: precision} (see write), else `precision`.

    A blob whose values float16 (bfloat16) cannot hold without an Inf is
    written in float32 (float64) instead, with a warning; `half_strict`
    refuses it (float16 only).
    """
    if precision not in ("half", "bf16"):
        return precision
    from ..engine.bfloat16 import BFLOAT16

    return _half_precisions(doc.path if doc is not None else None, entries, blobs, write_diff=write_diff,
                            transforms=transforms, strict=half_strict and precision == "half", warn=warn,
                            narrow=HALF if precision == "half" else BFLOAT16)


def _read_unread(doc: Document | None, entries: list, blobs: list, fmt, kind: str) -> None:
    """Read every blob to be written whose values are read only as they are written (writing.Unread), and let it go.

    For an output written in place (standard output, a pipe): bad values
    (a damaged HDF5 chunk) are then found before the first byte goes out, as
    when every blob is read before writing, and no partial output is left;
    memory stays one blob. A container written whole (an HDF5 input written
    as protobuf or HDF5) writes the blobs not selected too.
    """
    pending = [blob for blob in blobs if isinstance(blob, Unread)]
    if doc is not None and kind == doc.kind and kind in fmt.containers:
        selected = {id(e) for e in entries}
        pending += [blob for blob in (e.blob_to_write() for e in doc.entries if id(e) not in selected)
                    if isinstance(blob, Unread)]
    for blob in pending:
        blob.built()


def _one_blob_message(dest, format: str | None, doc: Document | None, selected: int) -> str:
    """Why a one-blob output refuses `selected` blobs: what chose that format, and what writes them instead."""
    ext = os.path.splitext(os.fspath(dest))[1] if isinstance(dest, (str, os.PathLike)) else ""
    if format is None and ext:
        chosen = f"the extension {ext} of {os.fspath(dest)} chose the one-blob format (a BlobProto file)"
    else:
        chosen = f"{parameter('format', given=format or 'blob')} writes one blob (a BlobProto file)"
    own = doc is not None and doc.kind != "blob"
    if not selected:
        ways = (f"{parameter('format', given='same')} keeps the input's kind ({doc.kind})" if own
                else f"select a blob with {parameter('blobs')}")
    else:
        ways = ", ".join([f"choose one with {parameter('blobs')}",
                          *([f"keep the input's kind ({doc.kind}) with {parameter('format', given='same')}"]
                            if own else []), "or write .npz"])
    return f"{chosen}: {selected} selected; {ways}"


def _half_precisions(path, entries, blobs, *, write_diff, transforms, strict, warn, narrow=None) -> dict:
    """{name: precision} for writing in float16 or `narrow` (float16.half_precisions), its warnings handed to `warn`."""
    # A blob not read yet is read for this look and let go (read again when written).
    blobs = (blob.built() if isinstance(blob, Unread) else blob for blob in blobs)
    precisions, lines = half_precisions(path, entries, blobs, write_diff=write_diff, transforms=transforms,
                                        strict=strict, narrow=narrow or HALF)
    for line in lines:
        if warn is not None:
            warn(line)
        else:
            warnings.warn(line, stacklevel=4)
    return precisions


def new_entry(name: str, blob: Blob) -> Entry:
    """An Entry for a blob made in Python (no file it came from), as write describes it."""
    origin = blob.origin
    return Entry(name, blob.shape, origin.layout if origin else "shape", blob.dtype,
                 bool(origin and origin.has_diff), _blob=blob,
                 diff_dtype=blob.diff_dtype if blob.diff_dtype != blob.dtype else None)
