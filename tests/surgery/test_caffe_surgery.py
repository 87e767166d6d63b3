"""fold and transplant proved in real Caffe: the nets they write load in Caffe and compute what the originals compute.

Oracle: real Caffe (tests/helpers/caffeoracle.py), so that the proof of a fold no
longer rests on blobtool's own forward. The real ResNet-20 of
../shared/realworld (BatchNorm and Scale after every convolution) is folded,
and carried through PyTorch's names and back into itself; each net written
runs in Caffe from the deploy definition `definition --deploy` writes for
it, on the same input as the original, and every blob both nets have is
compared.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from caffeoracle import Caffe, Refusal, max_relative, require_oracle
from runner import ok

pytestmark = pytest.mark.caffe

REALWORLD = Path(__file__).resolve().parents[3] / "shared" / "realworld"
SHAPE = {"Data1": (2, 3, 32, 32)}
# A folded weight is computed in float64 and stored in float32: the nets differ by float32 rounding,
# summed over 20 layers. Measured: 2.8e-6 of a blob's largest value at most.
FOLD_TOLERANCE = 2e-5


@pytest.fixture(scope="module")
def caffe():
    worker = Caffe(require_oracle())
    yield worker
    worker.close()


@pytest.fixture
def resnet():
    path = REALWORLD / "resnet20_cifar10.caffemodel"
    if not path.is_file():
        pytest.skip(f"{path} is absent (../shared/realworld holds the files Caffe wrote)")
    return path


def _in_caffe(caffe, model: Path, inputs: dict, folder: Path, stem: str) -> dict:
    deploy = folder / f"{stem}_deploy.prototxt"
    ok("definition", model, "--deploy", "--input-shape", "Data1=" + ",".join(map(str, SHAPE["Data1"])), "-o", deploy)
    work = folder / stem
    work.mkdir()
    got = caffe.forward(deploy, model, inputs, work)
    assert not isinstance(got, Refusal), f"Caffe refused {model.name}: {got.line}"
    return got


def _inputs() -> dict:
    return {"Data1": np.random.default_rng(3).standard_normal(SHAPE["Data1"], dtype=np.float32)}


def test_a_folded_net_computes_in_caffe_what_the_original_computes(caffe, resnet, tmp_path):
    folded = tmp_path / "folded.caffemodel"
    folds = ok("fold", resnet, "-o", folded).stdout.splitlines()
    assert sum(" <- " in line for line in folds) == 21 and folds[-1].endswith("21 BatchNorm folded, 0 kept; 104 layers -> 62")
    inputs = _inputs()
    before = _in_caffe(caffe, resnet, inputs, tmp_path, "before")
    after = _in_caffe(caffe, folded, inputs, tmp_path, "after")
    # BatchNorm and Scale work in place on each convolution's top: the folded net has the same blobs,
    # each holding the convolution's output that BatchNorm and Scale rewrote in the original.
    assert set(after) == set(before)
    kept = [n for n in after if n != "Data1"]
    assert len(kept) >= 20
    worst = {n: max_relative(after[n], before[n]) for n in kept}
    assert max(worst.values()) <= FOLD_TOLERANCE, sorted(worst.items(), key=lambda p: -p[1])[:3]
    # ... and the net's output is among them.
    assert list(before)[-1] in after


def test_a_transplanted_net_computes_in_caffe_what_the_template_computes(caffe, resnet, tmp_path):
    port = tmp_path / "resnet.safetensors"
    ok("convert", "--names", "torch", resnet, "-o", port)
    back = tmp_path / "back.caffemodel"
    ok("transplant", port, resnet, "--names", "torch", "-o", back)
    inputs = _inputs()
    template = _in_caffe(caffe, resnet, inputs, tmp_path, "template")
    written = _in_caffe(caffe, back, inputs, tmp_path, "written")
    assert list(written) == list(template)
    # BatchNorm's statistics go out divided by their factor and come back with a factor of 1:
    # Caffe computes with mean / factor either way, to float32 rounding (measured: 2.0e-6).
    worst = {n: max_relative(written[n], template[n]) for n in template}
    assert max(worst.values()) <= 1e-5, sorted(worst.items(), key=lambda p: -p[1])[:3]
