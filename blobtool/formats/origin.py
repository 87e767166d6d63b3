"""How a blob was stored and how it is written back: its Origin, the type holding its values, the Precision asked for.

The readers of every format record an Origin on the blobs they build, so
that a re-save keeps the layout, type and encoding unless asked otherwise;
the writers read it back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UsageError

__all__ = ["Origin", "Precision", "held_dtype", "exact_values", "written_type"]


def exact_values(values: np.ndarray, dtype) -> np.ndarray:
    """`values` as integer `dtype`, refusing (UsageError) any value that is not exactly one of its integers.

    A blob stored as integers (NVIDIA Caffe's raw INT and UINT) is held as
    float64, which holds every 32-bit integer exactly; written back in its
    stored type, a value that is no longer an integer (scaled by 0.5), NaN
    or out of range would be changed in silence.
    """
    target = np.dtype(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        converted = values.astype(target)
        bad = np.flatnonzero(converted != values)
    if bad.size:
        raise UsageError(f"value {values[bad[0]]!r} (at {int(bad[0])}) is not an {target.name}: a blob stored as "
                         f"integers is written back as {target.name} (scale and update keep the stored type; "
                         "blobtool convert --float or --double writes float32 or float64)")
    return converted



@dataclass(frozen=True)
class Origin:
    """How a blob was stored in the file it came from, so that a re-save keeps it unless asked otherwise."""

    layout: str          # "shape" or "legacy"
    dtype: np.dtype      # as stored: float32 (data), float64 (double_data), float16 (raw/half), int32, uint32
    has_diff: bool
    # How data and diff were encoded, as the file's format records it (a
    # BlobProto's payload fields and raw types); () when not recorded.
    encoding: tuple = ()
    # The message's fields the reader does not know, as they were in the file,
    # written back after the known ones (where protobuf puts unknown fields).
    unknown: bytes = b""
    # The diff's stored type where it differs from the data's (float data
    # beside a double diff); None when the diff is stored as the data is.
    diff_dtype: np.dtype | None = None

    @property
    def precision(self) -> str:
        """The precision to write this blob's data back in: "double", "half" or "float"."""
        return _precision_of(self.dtype)

    @property
    def diff_precision(self) -> str:
        """The precision to write this blob's diff back in (its own where it was stored apart from the data's)."""
        return _precision_of(self.diff_dtype if self.diff_dtype is not None else self.dtype)


def _precision_of(dtype) -> str:
    if dtype == np.float64:
        return "double"
    if dtype == np.float16:
        return "half"
    return "float"


def held_dtype(stored, data=None) -> np.dtype:
    """The Blob dtype holding `stored` values exactly: float64 (doubles, 32-bit integers), else float32.

    For a diff, `data` is the data's Blob dtype: the diff is held in the wider
    of the two, so a double diff beside float data stays float64, and a float
    diff beside double data is widened as Caffe's FromProto widens it.
    """
    stored = np.dtype(stored)
    wide = stored.itemsize >= 4 and stored != np.float32
    return np.dtype(np.float64) if wide or (data is not None and np.dtype(data) == np.float64) else np.dtype(np.float32)


@dataclass(frozen=True)
class Precision:
    """What a write asks blob values to be written in: one precision for every blob, or each blob's own.

    `name` is "float", "double", "half", or None (each blob as it was
    stored); `per_blob` gives blobs their own ((name, precision), ...: --half
    keeps a blob float16 cannot hold in float32), a blob not in it keeping
    its stored form. Made once where a write is asked for (Precision.of);
    the writers only ask for_blob().
    """

    name: str | None = None
    per_blob: tuple | None = None

    @classmethod
    def of(cls, value) -> "Precision":
        """A Precision from what a caller gives: None, a precision's name, {blob name: precision}, or a Precision."""
        if isinstance(value, Precision):
            return value
        if isinstance(value, dict):
            return cls(per_blob=tuple(value.items()))
        if value is not None and not isinstance(value, str):
            raise UsageError(f"precision must be 'float', 'double', 'half' or None, got {value!r}")
        return cls(name=value)

    def for_blob(self, name: str) -> str | None:
        """The precision blob `name` is written in; None keeps its stored form."""
        if self.per_blob is None:
            return self.name
        return dict(self.per_blob).get(name)


# The type each write precision writes a float blob's values in, by name.
_WRITTEN = {"float": "float32", "double": "float64", "half": "float16", "bf16": "bfloat16"}


def written_type(blob, precision: str | None) -> str:
    """The name of the type a blob's data is written in as a tensor or array: `precision`'s, else as stored."""
    if precision is not None:
        return _WRITTEN[precision]
    origin = blob.origin
    stored = np.dtype(origin.dtype if origin is not None else blob.dtype)
    return stored.name if stored.kind in "fiu" else np.dtype(blob.dtype).name
