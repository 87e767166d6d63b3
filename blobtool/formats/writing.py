"""What writing a blob means in every format: values read only as they are written, the request resolved, chunks.

An Unread blob has its shape and origin but reads its values only when a
writer reaches them (the command line's streaming through files larger than
memory); resolve_form fills a write request's Nones from what the blob came
with (Caffe's ToProto defaults for a blob made in Python); write_parts
writes pieces (bytes, or values converted chunk by chunk) and releases the
input pages behind each chunk. The Caffe codec (caffe/blobwrite.py), the
.npy/.npz, safetensors and HDF5 writers and the net rewriting all write
through these.
"""

from __future__ import annotations

import numpy as np

from ..engine.blob import Blob
from ..engine.kernels import cast_written
from ..engine.work import report
from ..errors import UsageError
from ..files import release_pages
from .origin import exact_values

__all__ = ["Unread", "UnreadValues", "check_layout", "resolve_form", "stored_precisions", "write_parts",
           "WRITE_CHUNK"]

# Elements of a payload converted (float32 <-> float64, float16, a
# transform) and written at a time, whatever the payload's size: converting
# never doubles the memory of a large blob.
WRITE_CHUNK = 1 << 20


class Unread:
    """A blob to write whose values are read only when they are written, and let go right after.

    `shell` is a Blob with the shape, dtypes and origin but no values (its
    memory never allocated), `make` builds the Blob with its values. The
    writers plan an output from the shell (sizes, headers, the form each
    side is written in); cpu_data() and cpu_diff() give UnreadValues, which
    write_parts reads when it reaches them: the Blob is built then, kept
    only while the payload written next is its other side, and let go
    otherwise, so an output is written holding one such blob at a time.
    Anything else a Blob offers (its math, its values as an array) is not
    here: it would have to read the values.
    """

    _METADATA = frozenset({"shape", "num_axes", "count", "dtype", "diff_dtype", "origin", "legacy_shape",
                           "shape_string", "data_memory", "diff_memory", "nbytes"})

    def __init__(self, shell: Blob, make):
        self.shell = shell
        self._make = make
        self._blob = None

    def __getattr__(self, name):
        if name in Unread._METADATA:
            return getattr(self.shell, name)
        raise AttributeError(f"an unread blob has no {name!r}: its values are read only as they are written")

    def cpu_data(self) -> "UnreadValues":
        return UnreadValues(self, "data")

    def cpu_diff(self) -> "UnreadValues":
        return UnreadValues(self, "diff")

    def built(self) -> Blob:
        """The Blob with its values, built anew (not kept): for a look at every value before writing."""
        return self._make()


class UnreadValues:
    """One side ("data" or "diff") of an Unread blob: its size now, its values when read()."""

    def __init__(self, unread: Unread, side: str):
        self.unread, self.side = unread, side
        self.size = unread.shell.count

    def read(self) -> np.ndarray:
        """The values, as a flat array of the side's dtype (the blob is built when none of its sides is held)."""
        unread = self.unread
        if unread._blob is None:
            unread._blob = unread._make()
        return unread._blob.cpu_data() if self.side == "data" else unread._blob.cpu_diff()

    def written(self, following=None) -> None:
        """Say these values are written; the blob is let go unless `following` (the payload written next) is its own."""
        if not (isinstance(following, UnreadValues) and following.unread is self.unread):
            self.unread._blob = None


# The largest legacy dimension: num, channels, height and width are int32 fields.
INT32_MAX = 2**31 - 1


def check_layout(blob: Blob, layout: str | None) -> None:
    """Refuse the legacy layout (num/channels/height/width) for more than 4 axes, or a dimension past int32."""
    if layout == "legacy" and blob.num_axes > 4:
        raise UsageError(f"the legacy layout holds at most 4 axes; this blob has {blob.num_axes}")
    too_large = [(axis, d) for axis, d in enumerate(blob.shape) if d > INT32_MAX] if layout == "legacy" else []
    if too_large:
        axis, dim = too_large[0]
        raise UsageError(f"the legacy layout holds dimensions up to {INT32_MAX} (int32 fields); dimension {axis} "
                         f"of shape {tuple(blob.shape)} is {dim}")


def resolve_form(blob: Blob, *, precision: str | None = None, write_diff: bool | None = None,
                 layout: str | None = None) -> dict:
    """Fill the Nones in a write request for a format without BlobProto encodings (HDF5, safetensors, .npz).

    The precision is "float", "double" or "half" as stored, and "double" for
    integers (which float64 holds exactly); the dict also says the diff's
    ("diff_precision"). A blob made in Python writes as its dtype, in the
    `shape` layout, without diff (Caffe's ToProto defaults). A precision
    asked for applies to both sides. caffe/blobwrite.py's resolve_form is
    the same request for a BlobProto, which can also keep a stored encoding.
    """
    diff_precision = precision
    if precision is None:
        data_side, diff_side = stored_precisions(blob)
        if blob.origin is not None:
            precision, diff_precision = data_side, diff_side
        elif diff_side == data_side:
            precision = data_side
    form = written_sides(blob, write_diff=write_diff, layout=layout)
    form["diff_precision"] = diff_precision
    return {"precision": precision, **form}


def written_sides(blob: Blob, *, write_diff: bool | None, layout: str | None) -> dict:
    """The diff, layout and unknown fields of a write request: as asked, else as the blob came (resolve_form)."""
    origin = blob.origin
    if write_diff is None:
        write_diff = bool(origin.has_diff) if origin else False
    if layout is None:
        layout = origin.layout if origin else "shape"
        if layout == "legacy" and blob.num_axes > 4:
            layout = "shape"
    return {"write_diff": write_diff, "layout": layout, "unknown": origin.unknown if origin else b""}


def stored_precisions(blob: Blob) -> tuple:
    """The precisions ("float", "double", "half") of the data and the diff as stored, or as held for a new blob.

    Integers (NVIDIA Caffe's INT/UINT) count as "double", which holds them exactly.
    """
    origin = blob.origin
    if origin is None:
        return tuple("double" if dtype == np.float64 else "float" for dtype in (blob.dtype, blob.diff_dtype))
    data = "double" if origin.dtype.kind in "iu" else origin.precision
    diff_stored = origin.diff_dtype if origin.diff_dtype is not None else origin.dtype
    diff = "double" if diff_stored.kind in "iu" else origin.diff_precision
    return data, diff


def write_parts(out, parts, following=None) -> None:
    """Write encode_blob_parts' pieces to a binary file object, chunk by chunk.

    Payloads are written in chunks of WRITE_CHUNK elements: converted to the
    target dtype, passed through the part's transform if it has one, and the
    input pages behind each written chunk are released (files.release_pages),
    so memory stays bounded whatever the file size. Values not read yet
    (UnreadValues) are read when their part is reached and let go once it is
    written, unless the next payload is the same blob's other side (for the
    last part: `following`, the payload a later call writes next), so one
    blob's values are held at a time.
    """
    payloads = [part[0] for part in parts if isinstance(part, tuple)] + [following]
    n = 0
    for part in parts:
        if not isinstance(part, tuple):  # bytes, or a memoryview of the input
            out.write(part)
            continue
        n += 1
        transform = part[2] if len(part) > 2 else None
        if not isinstance(part[0], UnreadValues):
            _write_values(out, part[0], part[1], transform)
            continue
        if part[0].size:
            _write_values(out, part[0].read(), part[1], transform)
        part[0].written(payloads[n])


def _write_values(out, values: np.ndarray, target: np.dtype, transform) -> None:
    """Write one payload's values in chunks (see write_parts); nothing of them is held once this returns."""
    values = values.reshape(-1)
    # Doubles past float32's range become infinities, as Caffe's cast
    # makes them; numpy's warning about it would break the one-line stderr.
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, values.size, WRITE_CHUNK):
            chunk = values[start:start + WRITE_CHUNK]
            data = chunk if transform is None else transform(chunk, start)
            if target.kind in "iu":
                data = exact_values(data, target)
            else:
                data = cast_written(data, target, transform)
            out.write(memoryview(np.ascontiguousarray(data)).cast("B"))
            report(chunk.nbytes)
            release_pages(chunk)
