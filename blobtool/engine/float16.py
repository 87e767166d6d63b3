"""Writing blobs in float16 (--half): which blobs fit, and what the others are written in instead.

float16 holds finite values up to 65504 in magnitude; anything larger
becomes Inf, and a value below 6.1e-05 (float16's smallest normal number)
becomes a subnormal, or 0 below 6.0e-08. A running sum that Caffe's
BatchNorm stores reaches 1e7 in real nets, so a blind cast would turn
whole blobs into Inf. As OpenCV's FP16 conversion does, a blob whose finite
values do not all fit stays in float32 (float64 where float32 cannot hold
them either); every format blobtool writes in float16 (Caffe's protobuf
with NVIDIA's raw FLOAT16, .npy/.npz, safetensors, HDF5) types each blob on
its own, so float16 and float32 blobs sit side by side in one file.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UsageError, parameter
from .kernels import finite_range, map_chunks

__all__ = ["Float16Fit", "Narrow", "HALF", "float16_fit", "half_precisions", "overflow_reason", "lossy_line"]

_HALF = np.finfo(np.float16)
_FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass
class Float16Fit:
    """How one blob's values (data, and the diff when it is written) fare in float16."""

    name: str
    count: int
    overflow: int = 0      # finite values past float16's range: they would become Inf
    subnormal: int = 0     # non-zero values that become float16 subnormals (precision lost)
    zero: int = 0          # non-zero values that become 0
    max_abs: float = 0.0   # the largest finite magnitude (found only for a blob that does not fit)

    @property
    def fits(self) -> bool:
        return self.overflow == 0

    @property
    def fallback(self) -> str:
        """The precision to write the blob in when it does not fit: float, or double past float32's range."""
        return "double" if self.max_abs > _FLOAT32_MAX else "float"


def _chunk_counts(part: np.ndarray) -> tuple:
    # Counted from the cast itself, so float16's rounding at each edge is
    # exactly numpy's: a finite value past the range is an Inf the input did
    # not hold; a 0 the input did not hold was flushed; a subnormal float16
    # (0 < |h| < tiny) always comes from a non-zero value. Differences of
    # counts need few masks: 128 MiB of float32 took 1.8 s this way against
    # 3.3 s with a mask per condition and a magnitude array (the cast alone:
    # 0.6 s), on the 2-core machine under load.
    with np.errstate(over="ignore", invalid="ignore"):
        half = part.astype(np.float16)
    magnitude = np.abs(half)
    return (int(np.count_nonzero(np.isinf(half))) - int(np.count_nonzero(np.isinf(part))),
            int(np.count_nonzero((magnitude > 0) & (magnitude < _HALF.tiny))),
            int(np.count_nonzero(half == 0)) - int(np.count_nonzero(part == 0)))


@dataclass(frozen=True)
class Narrow:
    """A 16-bit type blobs may be written in: its names, its range, and how a chunk's losses are counted."""

    name: str          # "float16"
    option: str        # the command line's flag: "--half"
    precision: str     # the write precision: "half"
    max: float         # the largest finite value
    tiny: float        # the smallest normal value
    counts: object     # fn(chunk) -> (overflowed, made subnormal, made zero)
    strict: str | None = None   # the parameter refusing instead of keeping a blob wider: "half_strict"


HALF = Narrow("float16", "--half", "half", float(_HALF.max), float(_HALF.tiny), _chunk_counts, "half_strict")


def float16_fit(name: str, arrays, narrow: Narrow = HALF) -> Float16Fit:
    """Count, over `arrays` (a blob's data and diff as flat arrays), what float16 (or `narrow`) would make of their values."""
    fit = Float16Fit(name, 0)
    for values in arrays:
        fit.count += values.size
        if narrow is HALF and values.dtype == np.float16:
            continue  # already float16: nothing to lose
        for over, sub, zero in map_chunks(narrow.counts, values):
            fit.overflow += over
            fit.subnormal += sub
            fit.zero += zero
    if fit.overflow:  # only then is the largest magnitude needed: for the message and the fallback
        for values in arrays:
            lo, hi, _ = finite_range(values)
            if lo is not None:
                fit.max_abs = max(fit.max_abs, abs(lo), abs(hi))
    return fit


def half_precisions(path, entries, blobs, *, write_diff=None, transforms=None, strict: bool = False,
                    narrow: Narrow = HALF) -> tuple:
    """({name: precision} for writing `blobs` in float16, [warning lines]), or UsageError when `strict`.

    A blob whose finite values all fit is written in "half"; the others in
    Float16Fit.fallback (or as stored, None, for a blob whose diff is held
    wider than its data), each with one warning line saying why. The values
    that become subnormal or 0 in the blobs written in float16 are counted
    in one more line. With `strict`, a blob that does not fit is a
    UsageError, raised before anything is written. `narrow` is the type
    (HALF; engine/bfloat16.py's BFLOAT16 for --bf16).
    """
    precisions, lines = {}, []
    lossy = Float16Fit("", 0)
    where = f"{path}: " if path is not None else ""
    blobs = iter(blobs)
    for entry in entries:  # not zip: its reused result tuple would hold the last blob while the next is made
        blob = next(blobs)
        fns = (transforms or {}).get(entry.name, {})
        sides = [("data", blob.cpu_data)]
        diff = write_diff if write_diff is not None else bool(blob.origin and blob.origin.has_diff)
        if diff and blob.diff_memory is not None:
            sides.append(("diff", blob.cpu_diff))
        arrays = [fns[side](get(), 0) if fns.get(side) else get() for side, get in sides]
        fit = float16_fit(entry.name, arrays, narrow)
        dtypes, diff_side = (blob.dtype, blob.diff_dtype), len(sides) == 2
        # Let go of the values before `blobs` gives the next (one read only for this look).
        del blob, sides, arrays
        if fit.fits:
            precisions[entry.name] = narrow.precision
            lossy.subnormal += fit.subnormal
            lossy.zero += fit.zero
            lossy.count += 1
            continue
        reason = overflow_reason(fit, narrow)
        if strict:
            raise UsageError(f"{parameter(narrow.strict)}: {reason}; nothing written", path=path)
        if diff_side and dtypes[1] != dtypes[0]:
            # A diff held wider than its data (float data, double diff):
            # both sides as stored, so neither is narrowed.
            precisions[entry.name] = None
            kept = f"as stored ({dtypes[0].name}, diff {dtypes[1].name})"
        else:
            precisions[entry.name] = fit.fallback
            kept = f"in {'float32' if fit.fallback == 'float' else 'float64'}"
        lines.append(f"{where}{reason}: kept {kept} "
                     f"({fit.subnormal:,} values would have become subnormal and {fit.zero:,} zero)")
    if lossy.subnormal or lossy.zero:
        lines.append(lossy_line(where, narrow.option, lossy, narrow))
    return precisions, lines


def overflow_reason(fit: Float16Fit, narrow: Narrow = HALF) -> str:
    """Why a blob cannot be written in float16 (or `narrow`): how many of its values are past the range."""
    return (f"blob {fit.name}: {fit.overflow:,} of {fit.count:,} values are past {narrow.name}'s range "
            f"(largest {fit.max_abs:.6g}, {narrow.name} holds up to {narrow.max:g})")


def lossy_line(where: str, option: str, lossy: Float16Fit, narrow: Narrow = HALF, rounded: tuple | None = None,
               hint: str = "") -> str:
    """The line saying what float16 (or `narrow`) made of the values of the `lossy.count` blobs written in it.

    `lossy` sums their subnormal and zero counts; `rounded`, when given, is
    (values that changed, values written), said before them; `hint` ends the line.
    """
    counts = (f"{lossy.subnormal:,} values became subnormal (below {narrow.tiny:.3g}) and {lossy.zero:,} "
              "became 0")
    if rounded is not None:
        counts = f"{rounded[0]:,} of {rounded[1]:,} values were rounded to {narrow.name}'s precision; {counts}"
    return f"{where}{option}: in the {lossy.count:,} blob(s) written in {narrow.name}, {counts}{hint}"
