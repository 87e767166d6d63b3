"""The library does what the commands do: blobtool.fold and blobtool.transplant check, blobtool.run writes.

fold(check=True) and transplant(check=True) return the check's verdict as
data (forward/check.py's CheckResult) and write nothing when it fails; run
reads its inputs from files and writes the .npz as `run -o` does.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import blobtool
from blobtool.errors import ExitCode, UsageError
from caffenets import layer, net, write_net_files


def _conv_bn_net(folder, stem="net", scale=1.0):
    """A Convolution, its BatchNorm and Scale, then an InnerProduct: (deploy.prototxt, .caffemodel)."""
    rng = np.random.default_rng(3)
    layers = [
        layer("conv", "Convolution", "data", blobs=[rng.standard_normal((3, 2, 3, 3)) * scale, rng.standard_normal(3)],
              convolution_param={"num_output": 3, "kernel_size": [3], "pad": [1]}),
        layer("bn", "BatchNorm", "conv", blobs=[rng.standard_normal(3), rng.random(3) + 0.5, [2.0]]),
        layer("sc", "Scale", "bn", blobs=[rng.standard_normal(3), rng.standard_normal(3)],
              scale_param={"bias_term": True}),
        layer("ip", "InnerProduct", "sc", blobs=[rng.standard_normal((4, 3 * 5 * 5)), rng.standard_normal(4)],
              inner_product_param={"num_output": 4}),
    ]
    return write_net_files(folder, net(layers, {"data": (1, 2, 5, 5)}), stem)


def test_fold_with_check_returns_the_verdict_and_writes_the_outputs(tmp_path):
    prototxt, model = _conv_bn_net(tmp_path)
    out, text = tmp_path / "folded.caffemodel", tmp_path / "folded.prototxt"
    result = blobtool.fold(model, out, text, check=True)
    verdict = result.check
    assert verdict.passed and verdict.withheld == [] and verdict.after == str(out)
    assert {row["name"] for row in verdict.rows} >= {"sc", "ip"}
    assert result.outputs == [str(out), str(text)]
    assert [f.target.name for f in result.plan.folds] == ["conv"]
    assert out.exists() and text.exists()
    # Without a check there is no verdict, and the same net is written.
    plain = blobtool.fold(model, tmp_path / "plain.caffemodel")
    assert plain.check is None
    assert (tmp_path / "plain.caffemodel").read_bytes() == out.read_bytes()
    # With a definition, the folded definition runs after: an output must hold it.
    with pytest.raises(UsageError, match="runs the folded definition") as refused:
        blobtool.fold(model, tmp_path / "d.caffemodel", definition=prototxt, check=True)
    assert refused.value.exit_code == ExitCode.USAGE and not (tmp_path / "d.caffemodel").exists()
    both = blobtool.fold(model, tmp_path / "d.caffemodel", tmp_path / "d.prototxt", definition=prototxt, check=True)
    assert both.check.passed


def test_fold_with_a_failing_check_writes_nothing(tmp_path, monkeypatch):
    """A fold made wrong on purpose (its bias moved by 1): the verdict says so, and no output appears."""
    from blobtool.surgery import foldnet
    from blobtool.surgery.fold import Folded

    right = foldnet.fold_params

    def wrong(*args, **kwargs):
        folded = right(*args, **kwargs)
        return Folded(folded.weight, folded.bias + 1.0)

    monkeypatch.setattr(foldnet, "fold_params", wrong)
    _, model = _conv_bn_net(tmp_path)
    before = sorted(os.listdir(tmp_path))
    out, text = tmp_path / "folded.caffemodel", tmp_path / "folded.prototxt"
    result = blobtool.fold(model, out, text, check=True)
    verdict = result.check
    assert not verdict.passed and verdict.withheld == [out, text]
    assert {row["name"] for row in verdict.differing} == {"sc", "ip"}
    assert sorted(os.listdir(tmp_path)) == before  # no output, no staging folder left
    assert verdict.record()["passed"] is False


def test_transplant_with_check_returns_the_verdict_and_keeps_a_failed_net_out(tmp_path):
    _, model = _conv_bn_net(tmp_path)
    _, other = _conv_bn_net(tmp_path, "other", scale=3.0)  # the same blobs, other values
    same = tmp_path / "same.caffemodel"
    verdict = blobtool.transplant(model, model, same, check=True)
    assert verdict.passed and verdict.after == str(same) and same.exists()
    # Without a check: the kind written, as before.
    assert blobtool.transplant(model, model, tmp_path / "plain.caffemodel") == "net"

    out = tmp_path / "out.caffemodel"
    out.write_bytes(b"an earlier file")
    before = sorted(os.listdir(tmp_path))
    verdict = blobtool.transplant(other, model, out, check=True)
    assert not verdict.passed and verdict.withheld == [out] and "ip" in {row["name"] for row in verdict.differing}
    assert out.read_bytes() == b"an earlier file" and sorted(os.listdir(tmp_path)) == before


def test_transplant_with_check_refuses_what_it_cannot_read_back(tmp_path):
    prototxt, model = _conv_bn_net(tmp_path)
    for dest, kwargs, said in [("-", {}, "runs the net written"),
                               (tmp_path / "x.npz", {"format": "npz"}, "runs the net written"),
                               (tmp_path / "x.caffemodel", {}, "is a definition and holds no weights")]:
        template = prototxt if "definition" in said else model
        with pytest.raises(UsageError, match=said) as refused:
            blobtool.transplant(model, template, dest, check=True, **kwargs)
        assert "check" in str(refused.value)
    assert not (tmp_path / "x.npz").exists() and not (tmp_path / "x.caffemodel").exists()


def test_run_reads_input_files_and_writes_the_npz(tmp_path):
    _, model = _conv_bn_net(tmp_path)
    values = np.random.default_rng(5).standard_normal((1, 2, 5, 5)).astype(np.float32)
    np.save(tmp_path / "in.npy", values)
    out = tmp_path / "out.npz"
    result = blobtool.run(model, inputs={"data": tmp_path / "in.npy"}, outputs="all", output=out)
    assert result.inputs == [{"name": "data", "shape": [1, 2, 5, 5], "given": "values given"}]
    with np.load(out) as saved:
        assert list(saved) == list(result.values)
        for name, value in result.values.items():
            assert np.array_equal(saved[name], value)
    given = blobtool.run(model, inputs={"data": values}, outputs="all")
    assert np.array_equal(given.values["ip"], result.values["ip"])
    with pytest.raises(UsageError, match="run writes its blobs to an .npz"):
        blobtool.run(model, inputs={"data": tmp_path / "missing.npy"}, output=tmp_path / "out.npy")
    assert not (tmp_path / "out.npy").exists()
