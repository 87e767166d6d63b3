"""Make the example blob files in this folder, with the protobuf library.

    python examples/make_examples.py [OUTDIR]

Writes (deterministically, from a fixed seed):

- mean_legacy.binaryproto: a mean-image-like blob, legacy num/channels/height/width
  1 x 3 x 32 x 32, float data (as Caffe's compute_image_mean writes it);
- weights_diff.pb: a conv-weight-like blob, `shape` 16 x 3 x 3 x 3, float data and diff;
- double.pb: a float64 blob, `shape` 4 x 10, in double_data.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from blobtool._pb.blobtool_caffe_pb2 import BlobProto


def mean_legacy(rng: np.random.Generator) -> BlobProto:
    # A smooth "image": per-channel BGR means plus a gentle gradient.
    y, x = np.mgrid[0:32, 0:32].astype(np.float32)
    channels = [104.0 + 0.3 * x, 117.0 + 0.3 * y, 123.0 + 0.15 * (x + y)]
    img = np.stack(channels)[None] + rng.normal(0, 0.5, (1, 3, 32, 32))
    proto = BlobProto(num=1, channels=3, height=32, width=32)
    proto.data.extend(img.astype(np.float32).ravel().tolist())
    return proto


def weights_diff(rng: np.random.Generator) -> BlobProto:
    w = rng.normal(0, 0.1, (16, 3, 3, 3)).astype(np.float32)
    g = rng.normal(0, 0.01, w.shape).astype(np.float32)
    proto = BlobProto()
    proto.shape.dim.extend(w.shape)
    proto.data.extend(w.ravel().tolist())
    proto.diff.extend(g.ravel().tolist())
    return proto


def double_blob(rng: np.random.Generator) -> BlobProto:
    v = rng.normal(0, 1, (4, 10))
    proto = BlobProto()
    proto.shape.dim.extend(v.shape)
    proto.double_data.extend(v.ravel().tolist())
    return proto


EXAMPLES = {
    "mean_legacy.binaryproto": mean_legacy,
    "weights_diff.pb": weights_diff,
    "double.pb": double_blob,
}


def main(outdir: Path) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261129)
    for name, make in EXAMPLES.items():
        (outdir / name).write_bytes(make(rng).SerializeToString())
        print(f"wrote {outdir / name}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)
