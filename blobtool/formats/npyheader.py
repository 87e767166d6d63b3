"""numpy's .npy header: the magic, the version, the header dictionary, checked in full.

The layout (numpy/lib/format.py): the magic b"\\x93NUMPY", a major and a
minor version byte, the header's length (2 bytes little-endian in version
1.0, 4 in 2.0 and 3.0), then the header: the text of a Python dictionary
(latin-1; UTF-8 in 3.0), padded with spaces and a newline; the array data
follows. A reader must accept exactly the keys 'descr' (a dtype descriptor),
'fortran_order' (a bool) and 'shape' (a tuple of ints), as text.

parse_npy_header checks all of it (keys and value types, not only what numpy
checks: numpy lets a bytes key through to a TypeError and a bool dimension
through as an int) and says what is wrong in one line.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import warnings
from dataclasses import dataclass

import numpy as np
from numpy.lib import format as npy_format

from ..errors import FormatError, require_bytes

__all__ = ["NpyHeader", "parse_npy_header", "NPY_MAGIC", "NPY_VERSIONS", "NPY_HEADER_READ"]

NPY_MAGIC = b"\x93NUMPY"
# numpy refuses header text longer than this (its max_header_size), as a
# guard against costly literal parsing; blobtool holds to the same limit.
_MAX_HEADER_TEXT = 10000
# Bytes of an .npy read to parse its header: magic, version, a length of up to
# 4 bytes, and the longest header text accepted.
NPY_HEADER_READ = 12 + _MAX_HEADER_TEXT
# version -> (bytes of the header length, the header text's encoding)
NPY_VERSIONS = {(1, 0): (2, "latin1"), (2, 0): (4, "latin1"), (3, 0): (4, "utf8")}
_HEADER_KEYS = ("descr", "fortran_order", "shape")


@dataclass(frozen=True)
class NpyHeader:
    """An .npy header, checked: the array's shape, order and dtype, and where its data starts."""

    shape: tuple
    fortran: bool
    dtype: np.dtype
    offset: int      # bytes of magic, version, length and header text

    @property
    def count(self) -> int:
        count = 1  # Python ints: a forged shape must not wrap around int64
        for d in self.shape:
            count *= d
        return count

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize


def parse_npy_header(head, path=None) -> NpyHeader:
    """The checked header at the start of `head` (at least the header's bytes; more is ignored).

    Raises FormatError ("invalid .npy header: ...") for anything numpy would
    not write: a bad magic or version, a cut header, text that is not a
    literal dictionary of exactly 'descr', 'fortran_order' and 'shape' with
    values of their types, a negative dimension.
    """
    head = bytes(head[:NPY_HEADER_READ])
    if not head.startswith(NPY_MAGIC) or len(head) < 8:
        raise FormatError("invalid .npy header: no .npy magic (\\x93NUMPY and a version)", path=path)
    version = (head[6], head[7])
    if version not in NPY_VERSIONS:
        raise FormatError(f"invalid .npy header: unsupported .npy version {version[0]}.{version[1]}", path=path)
    width, encoding = NPY_VERSIONS[version]
    start = 8 + width
    require_bytes(len(head), 8, width, "the header length needs", path=path, prefix="invalid .npy header: ")
    length = int.from_bytes(head[8:start], "little")
    if length > _MAX_HEADER_TEXT:
        raise FormatError(f"invalid .npy header: {length} bytes of header text, more than the "
                          f"{_MAX_HEADER_TEXT} numpy reads", path=path)
    require_bytes(len(head), start, length, "the header declares", path=path, prefix="invalid .npy header: ")
    try:
        text = head[start:start + length].decode(encoding)
    except UnicodeDecodeError as exc:
        raise FormatError(f"invalid .npy header: not {encoding} text ({exc.reason} at byte "
                          f"{start + exc.start})", path=path) from exc
    try:
        shape, fortran, dtype = _check_header_dict(_header_dict(text, head[:start + length], version))
    except ValueError as exc:
        raise FormatError(f"invalid .npy header: {exc}", path=path) from exc
    return NpyHeader(shape, fortran, dtype, start + length)


# The dictionary exactly as numpy writes it for a float, integer or bool
# array: read without ast (a fifth of its cost a header, which counts in an
# .npz of thousands of small members). Any other text goes through ast.
_DIM = r"(?:0|[1-9][0-9]*)"
_NUMPY_HEADER = re.compile(r"\{'descr': '([<>|=]?[fiub][0-9]{1,2})', 'fortran_order': (False|True), "
                           rf"'shape': (\(\)|\({_DIM},\)|\({_DIM}(?:, {_DIM})+\)), \}}[ \n]*\Z")


def _header_dict(text: str, raw: bytes, version: tuple):
    """The header text as a Python literal (numpy's own parser only for Python 2's headers)."""
    plain = _NUMPY_HEADER.match(text)
    if plain is not None:
        descr, fortran, shape = plain.groups()
        return {"descr": descr, "fortran_order": fortran == "True",
                "shape": tuple(int(d) for d in shape[1:-1].split(",") if d.strip())}
    try:
        return ast.literal_eval(text)
    except SyntaxError as exc:
        if version > (2, 0):
            raise ValueError(f"not a Python literal ({exc.msg})") from exc
        error = exc
    except (ValueError, TypeError, RecursionError, MemoryError) as exc:  # a non-literal, an unhashable key ...
        raise ValueError(f"not a literal dictionary ({type(exc).__name__}: {_short(str(exc))})") from exc
    # Headers written by numpy on Python 2 (3L, odd line breaks) parse only
    # after numpy's own filter; its results are checked below like any other.
    reader = npy_format.read_array_header_1_0 if version == (1, 0) else npy_format.read_array_header_2_0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the warning that the fallback was needed: a second stderr line
            shape, fortran, dtype = reader(io.BytesIO(raw[8:]))
    except Exception as exc:  # noqa: BLE001  numpy lets tokenize's, ast's and sorting's errors through
        raise ValueError(f"not a Python literal ({error.msg})") from exc
    return {"descr": dtype, "fortran_order": fortran, "shape": shape}


def _check_header_dict(header) -> tuple:
    """(shape, fortran_order, dtype) of a header dictionary, each of its type; ValueError otherwise."""
    if type(header) is not dict:
        raise ValueError(f"not a dictionary: {_short(repr(header))}")
    if len(header) != len(_HEADER_KEYS) or any(type(k) is not str for k in header) or set(header) != set(_HEADER_KEYS):
        got = ", ".join(_short(repr(k), 40) for k in list(header)[:8]) + (", ..." if len(header) > 8 else "")
        raise ValueError(f"keys {got or 'none'}; expected 'descr', 'fortran_order' and 'shape'")
    shape = header["shape"]
    if type(shape) is not tuple or any(type(d) is not int for d in shape):
        raise ValueError(f"shape must be a tuple of integers, got {_short(repr(shape))}")
    if any(d < 0 for d in shape):
        raise ValueError(f"negative dimension in shape {_short(repr(shape))}")
    fortran = header["fortran_order"]
    if type(fortran) is not bool:
        raise ValueError(f"fortran_order must be True or False, got {_short(repr(fortran))}")
    descr = header["descr"]
    if isinstance(descr, np.dtype):
        return shape, fortran, descr
    try:
        dtype = _dtype_of_text(descr) if type(descr) is str else _dtype_of(descr)
    except Exception as exc:  # noqa: BLE001  numpy raises TypeError, ValueError, KeyError ... on a forged descr
        raise ValueError(f"descr {_short(repr(descr))} is not a dtype ({type(exc).__name__})") from exc
    return shape, fortran, dtype


def _dtype_of(descr) -> np.dtype:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's deprecation warnings on odd descriptors: refused
        return npy_format.descr_to_dtype(descr)


# An .npz of thousands of members repeats a few descriptors: each is looked up once.
_dtype_of_text = functools.lru_cache(maxsize=256)(_dtype_of)


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."
