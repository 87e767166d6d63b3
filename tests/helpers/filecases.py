"""Files for the tests of files/: blobs written in chunks (no full array in memory), digests, temporaries.

- ``write_float_blob(path, count, diff=False)``: a BlobProto of a float32 ramp;
- ``digest(path)``: its SHA-256, read in blocks;
- ``temps(folder)``: the temporary outputs left in a folder (``TEMP``: hidden, named
  after the target, as files.atomic_output names them);
- ``small_net()``: a net of one InnerProduct layer, as bytes;
- ``wait_for_temp(proc, folder, at_least)``: the temporary output once it holds that many bytes;
- ``EARLIER``: the bytes of an earlier output, which must survive; ``EXPECTED_SIZE``: the
  size of the big blob (conftest.py's `big`) converted to doubles.
"""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

import numpy as np

from blobtool.formats.caffe import wire
from builders import Layer, blob_bytes, net_bytes

EARLIER = b"the earlier output, which must survive\n"
# A temporary output file: hidden, named after the target (see files.atomic_output).
TEMP = re.compile(r"^\.(?P<target>.+)\.[^.]+\.tmp$")


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def temps(folder: Path) -> list:
    return sorted(p.name for p in folder.iterdir() if TEMP.match(p.name))


def write_float_blob(path: Path, count: int, *, diff: bool = False) -> Path:
    """A BlobProto of `count` float32 values (a ramp), written in chunks (no full-size array in memory)."""
    chunk = np.arange(1 << 20, dtype="<f4")
    with open(path, "wb") as f:
        f.write(blob_bytes(shape=[count]))
        for number in (5, 6) if diff else (5,):
            f.write(wire.len_field_header(number, 4 * count))
            left = count
            while left:
                n = min(left, chunk.size)
                f.write(chunk[:n].tobytes())
                left -= n
    return path


def small_net() -> bytes:
    blobs = [np.linspace(-1, 1, n).astype(np.float32) for n in (6, 3)]
    return net_bytes("new", [Layer("ip", "InnerProduct", blobs, bottom=[], top=[])], name="tiny")


def wait_for_temp(proc, folder: Path, at_least: int, timeout: float = 60.0) -> Path | None:
    """The temporary output once it holds `at_least` bytes (None if the process ended first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        for name in temps(folder):
            try:
                if (folder / name).stat().st_size >= at_least:
                    return folder / name
            except FileNotFoundError:
                pass
        time.sleep(0.001)
    return None


EXPECTED_SIZE = 400_000_014  # 50M doubles, with BlobProto's tags and lengths
