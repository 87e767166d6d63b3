"""Which format and kind an output is written as: the --format asked for, the name's extension, or the input's own."""

from __future__ import annotations

import os

from ..errors import UsageError, parameter
from . import FORMATS, OUTPUT_FORMATS, Format, Output, Document, get_format, CONTAINER_KINDS

__all__ = ["output_target", "output_extensions", "chosen_format"]


def output_target(dest, choice: str | None, doc: Document | None) -> tuple:
    """(Format, kind) to write: the --format `choice`, else by dest's extension, else the input's own.

    With no choice and a name without an extension, a container input is
    written as itself ("same") and anything else as one BlobProto ("blob").
    Raises UsageError for an extension that no format writes (x.json, x.png)
    and when the input cannot be written back as its own kind.
    """
    if choice is None:
        choice = _choice_by_extension(dest)
        if choice is None:
            choice = "same" if doc is not None and doc.kind in CONTAINER_KINDS else "blob"
    if choice == "same":
        if doc is None:
            raise UsageError("blobs made in Python have no container form to write back; "
                             "choose .npy, .npz or a blob file")
        fmt = get_format(doc.format)
        if doc.kind not in fmt.containers + ("blob",):
            raise UsageError(f"a {doc.kind} input has no container form to write back; "
                             "choose .npy, .npz or a blob file")
        return fmt, doc.kind
    for fmt in FORMATS:
        for out in fmt.outputs:
            if out.name == choice:
                return fmt, out.kind or _own_kind(fmt, out, doc)
    raise UsageError(f"unknown output format {choice!r}; expected one of {', '.join(OUTPUT_FORMATS)}")


def chosen_format(dest, choice: str | None) -> str | None:
    """The output format a --format `choice` or dest's extension names; None when neither does."""
    return choice if choice is not None else _choice_by_extension(dest)


# Output names that blobtool never writes itself, and where to go instead.
_PYTORCH = "PyTorch loads .safetensors (safetensors.torch.load_file): write that"
_ELSEWHERE = {".png": "pictures are written by `blobtool show -o PATH.png`", ".pt": _PYTORCH, ".pth": _PYTORCH}


def output_extensions() -> str:
    """The formats blobtool writes and the extensions that choose them: "blob (.pb, ...), npy (.npy), ..."."""
    return ", ".join(f"{out.name} ({', '.join(out.extensions)})" for fmt in FORMATS for out in fmt.outputs)


def _choice_by_extension(dest) -> str | None:
    """The --format an output name's extension chooses; None for a name without one (or a file object).

    The extension is the last one of the file name (`x.caffemodel.h5` is
    HDF5; dots in folder names do not count). An extension no format writes
    is a UsageError naming those that blobtool writes: writing protobuf bytes
    under `x.json` or `x.png` would be an output in another format than asked.
    """
    if not isinstance(dest, (str, os.PathLike)):
        return None
    name = os.path.basename(os.fspath(dest))
    ext = os.path.splitext(name)[1].lower()
    if not ext:
        return None
    for fmt in FORMATS:
        for out in fmt.outputs:
            if ext in out.extensions:
                return out.name
    hint = _ELSEWHERE.get(ext, f"or name the format with {parameter('format')}")
    raise UsageError(f"blobtool does not write {ext!r} files; it writes {output_extensions()}; {hint}",
                     path=os.fspath(dest))


def _own_kind(fmt: Format, out: Output, doc: Document | None) -> str:
    """The kind an Output that writes "the input's own kind" writes for `doc` in `fmt`.

    A kind the format holds is written as itself; otherwise a format that
    writes single blobs writes one ("blob"), and any other refuses.
    """
    if doc is not None and doc.kind in fmt.kinds:
        return doc.kind
    if "blob" in fmt.kinds:
        return "blob"
    if doc is None:
        raise UsageError(f"{parameter('format', True)}{out.name} writes the input's own kind, and there is no input file")
    raise UsageError(f"{out.name} output ({', '.join(out.extensions)}) holds a {' or '.join(fmt.kinds)}, and a "
                     f"{doc.kind} input is neither; choose .npy, .npz or a blob file")
