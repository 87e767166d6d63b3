"""bfloat16 (--bf16, PyTorch's usual half type): converting float32 values to its bits, and what that loses.

bfloat16 is the upper 16 bits of a float32: the same 8-bit exponent (so the
same range, up to about 3.39e38, and the same smallest normal number,
1.18e-38) and 7 bits of mantissa (about 3 significant digits). numpy has no
such type, so blobtool makes the bits itself: float32 values rounded to the
nearest bfloat16, ties to even (as PyTorch's and the hardware's conversion
rounds), NaN kept a quiet NaN of the same sign. float64 values are first
rounded to float32. A value whose rounding passes bfloat16's largest finite
number becomes Inf; one below its smallest normal becomes a subnormal or 0.
float16.half_precisions applies the rules --half has to these counts
(BFLOAT16): a blob that would gain an Inf is written wider, with a warning.
"""

from __future__ import annotations

import numpy as np

from .float16 import Narrow

__all__ = ["to_bfloat16_bits", "from_bfloat16_bits", "BFLOAT16"]

# The largest finite bfloat16 (0x7F7F) and the smallest normal one (0x0080).
_MAX = float(np.array([0x7F7F0000], np.uint32).view(np.float32)[0])
_TINY = float(np.finfo(np.float32).tiny)


def to_bfloat16_bits(values) -> np.ndarray:
    """`values` rounded to bfloat16 (nearest, ties to even), as their 16 bits (uint16; a new array)."""
    with np.errstate(over="ignore", invalid="ignore"):
        single = np.asarray(values, dtype=np.float32)
    bits = single.view(np.uint32)
    # Adding 0x7FFF plus the lowest kept bit, then cutting, rounds to nearest, ties to even.
    rounded = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)
    nan = np.isnan(single)
    if nan.any():
        rounded[nan] = ((bits[nan] >> 16) | 0x0040).astype(np.uint16)
    return rounded


def from_bfloat16_bits(bits) -> np.ndarray:
    """bfloat16 bits (uint16) as float32 values (exactly: each is a float32 with 16 zero bits)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _chunk_counts(part: np.ndarray) -> tuple:
    """(finite values that become Inf, non-zero values that become subnormal, that become 0) in bfloat16."""
    with np.errstate(over="ignore", invalid="ignore"):
        back = from_bfloat16_bits(to_bfloat16_bits(part))
    magnitude = np.abs(back)
    return (int(np.count_nonzero(np.isinf(back))) - int(np.count_nonzero(np.isinf(part))),
            int(np.count_nonzero((magnitude > 0) & (magnitude < _TINY))),
            int(np.count_nonzero(back == 0)) - int(np.count_nonzero(part == 0)))


BFLOAT16 = Narrow("bfloat16", "--bf16", "bf16", _MAX, _TINY, _chunk_counts)
