"""What a file is, from its bytes: its format and kind, or why it is none blobtool reads.

A format with a signature (numpy's ".npy" and zip magic, safetensors' header
length and brace, HDF5's at 0, 512, 1024, ... bytes) is known by it, listed
in the registry (formats.FORMATS); its module's sniff() then tells the kind.
A header at byte 0 wins over a signature found deeper: HDF5's signature after
a user block counts only when no format starts at byte 0 and the superblock
found there is HDF5's own (formats.format_by_signature). Other well-known signatures (gzip,
bzip2, xz, a macOS '._' file) are refused with a line saying what the file is and what
to do. Everything else goes to the format without a signature, Caffe's
protobuf, whose sniff() reads the kind from the top-level fields (see
formats/caffe.py).
"""

from __future__ import annotations

from ..errors import FormatError
from . import FORMATS, Format, format_by_signature, module

__all__ = ["sniff"]

# Signatures of files that are not Caffe files, and what to say about them.
_MAGICS = (
    (b"\x1f\x8b", "a gzip-compressed file; decompress it first (gunzip -k FILE) and read the result"),
    (b"\x00\x05\x16\x07", "a macOS resource-fork file (AppleDouble '._' metadata), not a Caffe file; "
                          "read the file of the same name without the '._' prefix"),
    (b"BZh", "a bzip2-compressed file; decompress it first (bunzip2 -k FILE)"),
    (b"\xfd7zXZ\x00", "an xz-compressed file; decompress it first (unxz -k FILE)"),
)



def sniff(source) -> tuple[Format, str]:
    """(format, kind) of an input (a source.Source), from its bytes.

    Raises FormatError saying what the file looks like when it is none that blobtool reads.
    """
    head = bytes(source.buf[:16])
    fmt = format_by_signature(source.buf)
    if fmt is not None:
        return fmt, module(fmt).sniff(source)
    for magic, what in _MAGICS:
        if head.startswith(magic):
            raise FormatError(f"not a Caffe file: this looks like {what}", path=source.name)
    fmt = next(fmt for fmt in FORMATS if not fmt.magic and fmt.probe is None)
    return fmt, module(fmt).sniff(source)
