"""Safetensors seeds and mutations, shared by tests/formats/test_safetensors_fuzz.py and tests/helpers/fuzz_long.py.

Seeds are files blobtool writes and files the safetensors package writes.
Besides fuzzcases' byte mutations (cuts, flipped bits, random bytes,
repeated spans), the header is attacked where it matters: its length field
forged, and its JSON values (offsets, dimensions, dtypes) replaced with
hostile ones while the length stays right, so that every check behind the
JSON parser is reached.
"""

from __future__ import annotations

import io
import json
import re

import numpy as np
from safetensors.numpy import save

import fuzzcases as fc
from blobtool import write
from blobtool.formats import open_document


def _export(seed_name: str) -> bytes:
    seed = next(s for s in fc.generated_seeds() if s.name == seed_name)
    out = io.BytesIO()
    write(open_document(io.BytesIO(seed.data)), None, out, format="safetensors")
    return out.getvalue()


def _package_file() -> bytes:
    rng = np.random.default_rng(91)
    return save({"w": rng.standard_normal((3, 2)).astype(np.float32), "w/diff": rng.standard_normal((3, 2)),
                 "h": rng.standard_normal(4).astype(np.float16), "n": np.array(3, np.int64),
                 "s": np.array(1.5, np.float32), "e": np.zeros((0, 2), np.float32)}, metadata={"k": "v"})


def seeds() -> list:
    """Two files blobtool wrote (a net, NVIDIA's raw encoding) and one the safetensors package wrote."""
    return [fc.Seed("st_net", "safetensors", _export("net_layer")),
            fc.Seed("st_nvidia_raw", "safetensors", _export("nvidia_raw")),
            fc.Seed("st_package", "safetensors", _package_file())]


def header_length(data: bytes) -> int:
    return int.from_bytes(data[:8], "little")


def st_layout(data: bytes) -> fc.Layout:
    """The length field, the header's end, and each tensor's bytes, as fuzzcases aims at field boundaries."""
    end = 8 + header_length(data)
    header = json.loads(data[8:end])
    bounds = {0, 8, end, len(data)}
    for key, spec in header.items():
        if key != "__metadata__":
            bounds.update(end + o for o in spec["data_offsets"])
    return fc.Layout(tuple(sorted(bounds)), (), ())


def forge_length(data: bytes, pick) -> bytes:
    n = header_length(data)
    value = pick("choice", fc.HUGE_VALUES + (0, 1, n - 1, n + 1, 2 * n, len(data), len(data) - 8, 100_000_001))
    return (value % 2**64).to_bytes(8, "little") + data[8:]


NUMBER = re.compile(rb"-?\d+")
HOSTILE = (b"-1", b"0", b"1", b"18446744073709551616", b"9223372036854775807", b"4294967296", b"1.5", b"1e400",
           b'"7"', b"null", b"[]", b"{}", b"true", b"[1,[2]]")
DTYPES = (b"F32", b"F64", b"F16", b"BF16", b"I64", b"BOOL", b"U8", b"F8_E4M3", b"", b"f32", b"F32 ")


def rewrite_header(data: bytes, pick) -> bytes:
    """Replace one JSON value (a number, a dtype, a key) and fix the length field, so the parser accepts it."""
    end = 8 + header_length(data)
    header = data[8:end]
    choice = pick("int", 0, 3)
    if choice == 0:
        spots = [m.span() for m in NUMBER.finditer(header)]
        start, stop = pick("index", spots) if spots else (0, 0)
        header = header[:start] + pick("choice", HOSTILE) + header[stop:]
    elif choice == 1:
        spots = [m.span(1) for m in re.finditer(rb'"dtype":\s*"([^"]*)"', header)]
        start, stop = pick("index", spots) if spots else (0, 0)
        header = header[:start] + pick("choice", DTYPES) + header[stop:]
    elif choice == 2:
        # A tensor's entry repeated under another name (overlaps), or under its own (a duplicate key).
        m = re.search(rb'("[^"]+"):(\{"dtype"[^{}]*\})', header)
        if m:
            name = m.group(1) if pick("bool") else b'"x%d"' % pick("int", 0, 9)
            header = header.rstrip()[:-1] + b"," + name + b":" + m.group(2) + b"}"
    else:
        header = header.rstrip()[:pick("int", 0, max(len(header.rstrip()) - 1, 0))]
    return len(header).to_bytes(8, "little") + header + data[end:]


def mutate(seed: fc.Seed, lay: fc.Layout, pick, rounds: int) -> bytes:
    data = seed.data
    for _ in range(rounds):
        what = pick("int", 0, 5)
        if what == 0:
            data = forge_length(data, pick)
        elif what <= 3 and len(data) >= 8 and header_length(data) <= len(data) - 8:
            data = rewrite_header(data, pick)
        else:
            data = pick("choice", fc.MUTATIONS)(data, lay, pick)
    return data
