"""Caffe's LSTM and RNN (BVLC's RecurrentLayer): blobtool's run against real Caffe, blob by blob, and the export.

Each case is one recurrent layer with random weights (seeded), run by
blobtool and by real Caffe (tests/caffeoracle.py: Caffe runs its own
unrolled net), every top within 1e-5 of the largest magnitude of Caffe's
blob; then written to files, run by `blobtool.api.run`, exported with every
blob an output and run in onnxruntime, every blob within 1e-5 of blobtool's.
The sweep: several sequence lengths T and stream counts N, `cont` zeros at
the start and inside a sequence (and a cont of 0.5, which Caffe multiplies
as it is), with and without the static input and expose_hidden, an input
of more than one axis per step. The quick cases hold one of each setting;
the full product is marked slow.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bvlcrest import against_caffe, against_onnx
from caffenets import layer
from onnxvalid import every_export_checked  # noqa: F401  (autouse: every model written is checked)

pytestmark = pytest.mark.caffe


def recurrent_case(kind: str, steps: int, streams: int, step_shape: tuple, hidden: int, *, static=None,
                   expose=False, seed=0) -> tuple:
    """(layers, inputs, feeds) of one LSTM or RNN layer: its weights, x, cont with zeros inside, the rest."""
    rng = np.random.default_rng(seed)
    width = 4 * hidden if kind == "LSTM" else hidden
    size = int(np.prod(step_shape))
    blobs = [rng.standard_normal((width, size)), rng.standard_normal(width)]
    if static is not None:
        blobs.append(rng.standard_normal((width, int(np.prod(static)))))
    if kind == "LSTM":
        blobs.append(rng.standard_normal((width, hidden)))
    else:
        blobs += [rng.standard_normal((hidden, hidden)), rng.standard_normal((hidden, hidden)),
                  rng.standard_normal(hidden)]
    blobs = [0.6 * b for b in blobs]
    bottoms, tops = ["x", "cont"], ["y"]
    inputs = {"x": (steps, streams) + tuple(step_shape), "cont": (steps, streams)}
    if static is not None:
        bottoms.append("static")
        inputs["static"] = (streams,) + tuple(static)
    if expose:
        for state in ("h", "c") if kind == "LSTM" else ("h",):
            bottoms.append(f"{state}0")
            inputs[f"{state}0"] = (1, streams, hidden)
            tops.append(f"{state}T")
    made = layer("recur", kind, bottoms, tops, blobs, recurrent_param={"num_output": hidden, "expose_hidden": expose})
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in inputs.items()}
    cont = np.ones((steps, streams), np.float32)
    cont[0] = 0                                  # every stream starts a sequence at step 1
    if steps > 2:
        cont[steps // 2, 0] = 0                  # stream 0 starts another inside
    if steps > 3 and streams > 1:
        cont[steps - 1, streams - 1] = 0.5       # not 0 or 1: Caffe multiplies by it
    feeds["cont"] = cont
    return [made], inputs, feeds


QUICK = [
    ("LSTM", 1, 1, (3,), 2, None, False),
    ("LSTM", 6, 3, (4,), 5, None, False),
    ("LSTM", 5, 2, (2, 3), 4, (3,), False),
    ("LSTM", 4, 2, (3,), 3, None, True),
    ("LSTM", 5, 3, (3,), 4, (2, 2), True),
    ("RNN", 1, 2, (3,), 2, None, False),
    ("RNN", 6, 3, (4,), 5, None, False),
    ("RNN", 5, 2, (2, 3), 4, (3,), False),
    ("RNN", 4, 2, (3,), 3, None, True),
    ("RNN", 5, 3, (3,), 4, (2, 2), True),
]


@pytest.mark.parametrize("kind,steps,streams,step_shape,hidden,static,expose", QUICK,
                         ids=[f"{c[0]}-T{c[1]}-N{c[2]}{'-static' if c[5] else ''}{'-expose' if c[6] else ''}"
                              for c in QUICK])
def test_recurrent_as_caffe_and_exported(tmp_path, kind, steps, streams, step_shape, hidden, static, expose):
    layers, inputs, feeds = recurrent_case(kind, steps, streams, step_shape, hidden, static=static, expose=expose)
    ours, _ = against_caffe(tmp_path, layers, inputs, feeds)
    assert ours["y"].shape == (steps, streams, hidden)
    against_onnx(tmp_path, layers, inputs, feeds, opsets=(13,))


def test_cont_zero_restarts_the_sequence(tmp_path):
    """A stream restarted by cont 0 at step t computes from t on what a fresh sequence from t computes."""
    layers, inputs, feeds = recurrent_case("LSTM", 6, 2, (3,), 4)
    feeds["cont"][:] = 1
    feeds["cont"][0] = 0
    feeds["cont"][3, 0] = 0
    ours, _ = against_caffe(tmp_path, layers, inputs, feeds)
    fresh = dict(feeds, x=feeds["x"][3:].copy(), cont=feeds["cont"][3:].copy())
    fresh["cont"][0] = 0
    (tmp_path / "fresh").mkdir()
    alone, _ = against_caffe(tmp_path / "fresh", layers, {"x": (3, 2, 3), "cont": (3, 2)}, fresh)
    np.testing.assert_allclose(ours["y"][3:, 0], alone["y"][:, 0], rtol=0, atol=1e-6)
    assert not np.allclose(ours["y"][3:, 1], alone["y"][:, 1], atol=1e-3)  # stream 1 went on: its state differs


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_recurrent_sweep(tmp_path, kind):
    """Every combination of T in (1, 2, 7), N in (1, 4), static input or not, expose_hidden or not."""
    for k, (steps, streams, static, expose) in enumerate(itertools.product((1, 2, 7), (1, 4), (None, (5,)),
                                                                           (False, True))):
        folder = tmp_path / f"case{k}"
        folder.mkdir()
        layers, inputs, feeds = recurrent_case(kind, steps, streams, (3, 2), 6, static=static, expose=expose, seed=k)
        against_caffe(folder, layers, inputs, feeds)
        against_onnx(folder, layers, inputs, feeds, opsets=(13, 17))
