"""export --preprocess: the model takes uint8 pixels, and computes predict's net input and outputs (onnxruntime)."""

from __future__ import annotations

import numpy as np
import pytest

import blobtool
from predictnets import classifier, files, photo, segmenter
from onnxvalid import every_export_checked  # noqa: F401
from runner import invoke, ok

ort = pytest.importorskip("onnxruntime")


def _session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("options, predict_options", [
    ({"mean": [104, 117, 123], "scale": [0.5]}, {"mean": [104, 117, 123], "scale": [0.5]}),
    ({"rgb": True, "raw_scale": 1.0, "mean": [0.485, 0.456, 0.406], "scale": [4.367, 4.464, 4.444]},
     {"rgb": True, "raw_scale": 1.0, "mean": [0.485, 0.456, 0.406], "scale": [4.367, 4.464, 4.444]}),
    ({}, {}),
])
def test_baked_model_equals_predicts_input_and_output(tmp_path, options, predict_options):
    _, model = files(tmp_path, classifier(np.random.default_rng(7), size=(8, 8), batch=2), "net")
    dest = tmp_path / "pixels.onnx"
    result, verdict = blobtool.export(model, dest, preprocess=options or True, check=True,
                                        warn=lambda line: None)
    assert verdict.passed and result.inputs == {"data": (2, 8, 8, 3)}
    images = [photo(8, 8, seed=k) for k in range(2)]
    predicted = blobtool.predict(model, images, **predict_options)
    session = _session(dest)
    assert session.get_inputs()[0].type == "tensor(uint8)" and session.get_inputs()[0].shape == [2, 8, 8, 3]
    names = [o.name for o in session.get_outputs()]
    got = dict(zip(names, session.run(None, {"data": np.stack(images)})))
    # onnxruntime sums the layers' products in its own order: float32 rounding apart.
    np.testing.assert_allclose(got["prob"], np.concatenate([o["prob"] for o in predicted.outputs]), rtol=1e-5)


def test_baked_net_input_is_predicts_to_the_bit(tmp_path):
    """The preprocessing subgraph alone (a net that is its input's identity) gives predict's input exactly."""
    _, model = files(tmp_path, segmenter(np.random.default_rng(8), size=(6, 10), classes=3), "seg")
    mean = np.random.default_rng(9).uniform(0, 255, (3, 6, 10)).astype(np.float32)
    np.save(tmp_path / "mean.npy", mean[None])
    ok("export", model, "-o", tmp_path / "m.onnx", "--preprocess", "--mean", tmp_path / "mean.npy", "--scale",
       "0.017", "--check")
    image = photo(6, 10, seed=3)
    predicted = blobtool.predict(model, [image], mean=str(tmp_path / "mean.npy"), scale=[0.017])
    import onnx

    graph = onnx.load(str(tmp_path / "m.onnx"))
    last = [n for n in graph.graph.node if n.name == "data/scale"][0].output[0]
    graph.graph.output.add().name = last
    onnx.save(graph, str(tmp_path / "probe.onnx"))
    session = _session(tmp_path / "probe.onnx")
    out = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"data": image[None]})))
    np.testing.assert_array_equal(out[last], predicted.inputs[0])
    np.testing.assert_allclose(out["score"], predicted.outputs[0]["score"], rtol=1e-5, atol=1e-5)


def test_preprocessing_options_need_preprocess(tmp_path):
    _, model = files(tmp_path, classifier(np.random.default_rng(7)), "net")
    result = invoke("export", model, "-o", tmp_path / "x.onnx", "--mean", "1,2,3")
    assert result.exit_code == 2 and "--mean applies only with --preprocess" in result.stderr
    assert not (tmp_path / "x.onnx").exists()
