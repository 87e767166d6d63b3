"""pycaffe's own preprocessing as an oracle: caffe.io.Transformer, resize_image and caffe.Classifier.

All the cases of a test go to one process under /usr/bin/python3
(tests/caffe_preprocess_worker.py), which imports Caffe once; see that
file for the requests. Tests using it carry the ``caffe`` marker.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

import os

from caffeoracle import HERE, ORACLE, SYSTEM_PYTHON, require_oracle, save_arrays

WORKER = HERE / "caffe_preprocess_worker.py"


def _environment() -> dict:
    """Debian's Python with pycaffe on its path, quiet, one thread (as caffeoracle's worker runs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=str(ORACLE / "python"), GLOG_minloglevel="2", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    return env


def pycaffe(requests: list, images: list, folder: Path, extra: dict | None = None) -> list:
    """Each request's array as pycaffe computes it (see the worker); `images` are indexed by the requests."""
    require_oracle()
    folder = Path(folder)
    (folder / "requests.json").write_text(json.dumps(requests))
    arrays = {f"image{i}": np.asarray(im, np.float32) for i, im in enumerate(images)}
    save_arrays(folder / "images.npz", {**arrays, **(extra or {})})
    done = subprocess.run([SYSTEM_PYTHON, str(WORKER), str(folder / "requests.json"), str(folder / "images.npz"),
                           str(folder / "pycaffe.npz")], env=_environment(), capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.fail(f"pycaffe's preprocessing failed: {done.stderr.strip().splitlines()[-1:]}")
    with np.load(folder / "pycaffe.npz") as out:
        return [out[f"out{k}"] for k in range(len(requests))]
