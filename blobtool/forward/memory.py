"""How big a net's blobs may be: Caffe's count limit, and the memory this process can get.

Caffe's Blob::Reshape CHECKs that a blob has at most 32 axes, no negative
size and at most INT_MAX (2,147,483,647) values; `check_shape` refuses the
same, so that a definition of a hundred bytes cannot ask for terabytes.

`available_bytes()` is the least of what the machine and the limits on
this process leave: /proc/meminfo's MemAvailable, RLIMIT_AS less the
address space already in use (/proc/self/status VmSize), and the memory
cgroup's limit less its usage (v2 memory.max / memory.current, or v1
memory.limit_in_bytes / memory.usage_in_bytes). None where none of these
can be read (not Linux): then only the count limit applies.
"""

from __future__ import annotations

import resource

from ..errors import FormatError

__all__ = ["MAX_AXES", "MAX_COUNT", "check_shape", "available_bytes", "format_bytes"]

MAX_AXES = 32               # blob.hpp kMaxBlobAxes
MAX_COUNT = 2 ** 31 - 1     # Blob::Reshape: CHECK_LE(count_, INT_MAX)


def check_shape(shape, what: str, path=None) -> tuple:
    """`shape` as a tuple of ints, or FormatError naming `what` where Caffe's Blob::Reshape would refuse it."""
    dims = tuple(int(d) for d in shape)
    if len(dims) > MAX_AXES:
        raise FormatError(f"{what} has {len(dims)} axes; Caffe's blobs hold at most {MAX_AXES}", path=path)
    negative = [d for d in dims if d < 0]
    if negative:
        raise FormatError(f"{what} has shape {dims}, with a size of {negative[0]}; a blob's sizes cannot be "
                          "negative", path=path)
    count = 1
    for d in dims:
        count *= d
    if count > MAX_COUNT:
        raise FormatError(f"{what} would have shape {dims}: {count:,} values, past the {MAX_COUNT:,} (INT_MAX) "
                          "a Caffe blob holds", path=path)
    return dims


def format_bytes(n: int) -> str:
    """A byte count in the largest binary unit that keeps it at 1 or more (1.5 GiB)."""
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{value:.0f} {unit}" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} bytes"


def available_bytes() -> int | None:
    """The bytes this process can still allocate, as the least of the bounds it can read (see the module)."""
    found = [b for b in (_meminfo_available(), _address_space_left(), _cgroup_left()) if b is not None]
    return max(0, min(found)) if found else None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _field_kib(text: str | None, name: str) -> int | None:
    """The value of a "Name:   123 kB" line of a /proc file, in bytes."""
    for line in (text or "").splitlines():
        if line.startswith(name + ":"):
            parts = line.split()
            try:
                return int(parts[1]) * 1024
            except (IndexError, ValueError):
                return None
    return None


def _meminfo_available() -> int | None:
    return _field_kib(_read("/proc/meminfo"), "MemAvailable")


def _address_space_left() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    used = _field_kib(_read("/proc/self/status"), "VmSize") or 0
    return soft - used


def _cgroup_left() -> int | None:
    """The memory cgroup's limit less its usage (v2, else v1), for this process's own cgroup."""
    own = _read("/proc/self/cgroup") or ""
    for line in own.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0] == "0" and parts[1] == "":
            base = "/sys/fs/cgroup" + parts[2].rstrip("/")
            left = _limit_less_usage(base + "/memory.max", base + "/memory.current")
            if left is not None:
                return left
        if len(parts) == 3 and "memory" in parts[1].split(","):
            for base in ("/sys/fs/cgroup/memory" + parts[2].rstrip("/"), "/sys/fs/cgroup/memory"):
                left = _limit_less_usage(base + "/memory.limit_in_bytes", base + "/memory.usage_in_bytes")
                if left is not None:
                    return left
    return _limit_less_usage("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current")


def _limit_less_usage(limit_path: str, usage_path: str) -> int | None:
    limit, usage = _read(limit_path), _read(usage_path)
    if limit is None or usage is None:
        return None
    try:
        limit_value, usage_value = int(limit.strip()), int(usage.strip())
    except ValueError:      # "max": no limit
        return None
    # cgroup v1 says "no limit" with a number near 2^63.
    if limit_value >= 2 ** 60:
        return None
    return limit_value - usage_value
