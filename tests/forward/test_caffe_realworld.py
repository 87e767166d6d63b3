"""The nets Caffe itself wrote (../shared/realworld), run by real Caffe and by blobtool, blob by blob.

Oracle: real Caffe (tests/helpers/caffeoracle.py). Each net's deploy definition is
the one `blobtool definition --deploy` writes, which must load in Caffe with
the net's own weights (`caffe.Net(deploy, weights, TEST)`); both run the same
random input, and every blob both have is compared (Caffe's Split blobs are
its own): within 1e-5 of the largest magnitude of Caffe's blob. The FP16
MTCNN, whose blobs BVLC Caffe cannot read, runs in Caffe from the float32
file `blobtool convert --precision float` writes (float16 widens exactly).
`blobtool export` of each net runs in onnxruntime and its outputs are
compared with Caffe's too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from caffeoracle import Caffe, Refusal, max_relative, require_oracle
from runner import ok
from caffenets import CIFAR10_DEPLOY

pytestmark = pytest.mark.caffe

REALWORLD = Path(__file__).resolve().parents[3] / "shared" / "realworld"
TOLERANCE = 1e-5

NETS = {
    "lenet": ("lenet_iter_10000.caffemodel", {"data": (2, 1, 28, 28)}),
    "resnet20": ("resnet20_cifar10.caffemodel", {"Data1": (3, 3, 32, 32)}),
    "mtcnn-12": ("mtcnn_det1_half.caffemodel", {"data": (1, 3, 12, 12)}),
    "mtcnn-31x47": ("mtcnn_det1_half.caffemodel", {"data": (2, 3, 31, 47)}),
    "cifar10-hdf5": ("cifar10_full_iter_70000.caffemodel.h5", {"data": (2, 3, 32, 32)}),
}


@pytest.fixture(scope="module")
def caffe():
    worker = Caffe(require_oracle())
    yield worker
    worker.close()


def _realworld(name: str) -> Path:
    path = REALWORLD / name
    if not path.is_file():
        pytest.skip(f"{path} is absent (../shared/realworld holds the files Caffe wrote)")
    return path


def _shape_args(shapes: dict) -> list:
    return [a for n, s in shapes.items() for a in ("--input-shape", f"{n}={','.join(map(str, s))}")]


def _prepared(case: str, tmp_path: Path):
    """(deploy.prototxt, the weights Caffe reads, blobtool's net, blobtool's definition or None, inputs)."""
    name, shapes = NETS[case]
    model = _realworld(name)
    if name.endswith(".h5"):
        definition = tmp_path / "cifar10_deploy.prototxt"
        definition.write_text(CIFAR10_DEPLOY.replace("dim: 2 dim: 3", f"dim: {shapes['data'][0]} dim: 3"))
        deploy, weights, ours_definition = definition, model, definition
    else:
        deploy = tmp_path / "deploy.prototxt"
        ok("definition", model, "--deploy", *_shape_args(shapes), "-o", deploy)
        weights, ours_definition = model, None
        if "half" in name:
            weights = tmp_path / "float.caffemodel"
            ok("convert", model, "--precision", "float", "-o", weights)
    rng = np.random.default_rng(7)
    inputs = {n: rng.standard_normal(s, dtype=np.float32) for n, s in shapes.items()}
    return deploy, weights, model, ours_definition, inputs


def _blobtool_run(model, definition, inputs: dict, tmp_path: Path) -> dict:
    args = ["run", model, "--outputs", "all", "-o", tmp_path / "ours.npz"]
    if definition is not None:
        args += ["--definition", definition]
    for n, value in inputs.items():
        np.save(tmp_path / f"in_{n}.npy", value)
        args += ["--input", f"{n}={tmp_path / f'in_{n}.npy'}"]
    ok(*args)
    with np.load(tmp_path / "ours.npz") as out:
        return {k: out[k] for k in out.files}


@pytest.mark.parametrize("case", list(NETS))
def test_every_blob_equals_caffes(caffe, case, tmp_path):
    deploy, weights, model, definition, inputs = _prepared(case, tmp_path)
    theirs = caffe.forward(deploy, weights, inputs, tmp_path)
    assert not isinstance(theirs, Refusal), f"Caffe refused blobtool's deploy definition: {theirs.line}"
    ours = _blobtool_run(model, definition, inputs, tmp_path)
    compared = [n for n in theirs if n in ours]
    # Every blob blobtool computes is one Caffe has; Caffe's own extra blobs are its Split copies.
    assert set(ours) <= set(theirs), sorted(set(ours) - set(theirs))
    assert all("_split_" in n for n in set(theirs) - set(ours)), sorted(set(theirs) - set(ours))
    worst = {n: max_relative(ours[n], theirs[n]) for n in compared}
    for n in compared:
        assert ours[n].shape == theirs[n].shape, (n, ours[n].shape, theirs[n].shape)
    assert max(worst.values()) <= TOLERANCE, sorted(worst.items(), key=lambda p: -p[1])[:5]
    assert len(compared) >= 5


@pytest.mark.parametrize("case", ["lenet", "resnet20", "mtcnn-31x47", "cifar10-hdf5"])
def test_the_export_computes_caffes_outputs(caffe, case, tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="blobtool[onnx] (onnxruntime) runs the exported model")
    deploy, weights, model, definition, inputs = _prepared(case, tmp_path)
    theirs = caffe.forward(deploy, weights, inputs, tmp_path)
    assert not isinstance(theirs, Refusal), theirs.line
    args = ["export", model, "-o", tmp_path / "net.onnx", *_shape_args(NETS[case][1])]
    if definition is not None:
        args += ["--definition", definition]
    ok(*args)
    session = ort.InferenceSession(str(tmp_path / "net.onnx"), providers=["CPUExecutionProvider"])
    outputs = [o.name for o in session.get_outputs()]
    got = session.run(outputs, inputs)
    for name, value in zip(outputs, got):
        assert name in theirs, (name, sorted(theirs))
        assert max_relative(value, theirs[name]) <= TOLERANCE, (name, max_relative(value, theirs[name]))
