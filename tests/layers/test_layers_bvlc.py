"""BVLC's recurrent and remaining layers against real Caffe, blob by blob, and their exports against run.

The layers: LSTM and RNN (Caffe's RecurrentLayer), LSTMUnit, SPP, Im2col,
BatchReindex, Filter, Parameter; and a CRNN-shaped net (convolutions, then
a 2-layer LSTM over the width). The oracle of every case is real Caffe
(tests/caffeoracle.py; the `caffe` marker: Caffe runs its own unrolled net
for LSTM and RNN), every top within 1e-5 of the largest magnitude of
Caffe's blob (tests/helpers/bvlcrest.py's against_caffe). Each case is then written
to files, run by `blobtool.api.run`, exported with every blob an output,
checked by onnx's full check and run in onnxruntime: every blob within 1e-5
of blobtool's (against_onnx; opset 13 here, every opset in the slow tests).

The sweeps: LSTM and RNN over several sequence lengths T and stream counts
N, `cont` 0 at step 1 and inside a sequence (and 0.5, which Caffe
multiplies as it is), with and without the static input and expose_hidden,
inputs of more than one axis per step (the full product, T up to 25, is
marked slow); SPP's pyramid heights and pool types on planes that need
pads; Im2col's kernel, stride, pad and dilation and their _h/_w forms;
BatchReindex's permutations with repeats, fewer and more rows than the
batch, fractional indices; Filter's selectors picking some, all and no
rows, a NaN and a negative value (both select). The refusals: an index
outside the batch (as Caffe's CHECK), a layer reading a Filter's top
(its rows are known only as it runs). The inputs are random (seeded).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from bvlcrest import against_caffe, against_onnx
from caffenets import layer, write_net_files
from onnxvalid import every_export_checked  # noqa: F401  (autouse: every model written is checked)

pytestmark = [pytest.mark.caffe]


def _every_opset() -> tuple:
    """13 (the lowest written), 17 (the default), 18 and the newest the installed onnx knows."""
    try:
        import onnx
    except ImportError:
        return (13, 17, 18)
    return tuple(sorted({13, 17, 18, int(onnx.defs.onnx_opset_version())}))


EVERY_OPSET = _every_opset()


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


@pytest.mark.parametrize("streams,hidden", [(1, 2), (3, 5)])
def test_lstm_unit_as_caffe_and_exported(tmp_path, streams, hidden):
    """One LSTM step alone (LSTMUnit): cont 0, 1 and 0.5 across the streams."""
    inputs = {"c_prev": (1, streams, hidden), "gates": (1, streams, 4 * hidden), "cont": (1, streams)}
    feeds = _feeds(inputs, seed=streams)
    feeds["gates"] *= 3
    feeds["cont"] = np.asarray([[0, 1, 0.5][k % 3] for k in range(streams)], np.float32).reshape(1, streams)
    layers = [layer("unit", "LSTMUnit", ["c_prev", "gates", "cont"], ["c", "h"])]
    ours, _ = against_caffe(tmp_path, layers, inputs, feeds)
    assert ours["c"].shape == ours["h"].shape == (1, streams, hidden)
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


def test_recurrent_export_past_its_steps_is_refused(tmp_path):
    """Past MAX_STEPS time steps the export is refused (exit 3, naming the layer) and nothing is written."""
    from caffenets import net
    from runner import assert_error, invoke

    from blobtool.onnxport.ops.recurrent import MAX_STEPS

    layers, inputs, _ = recurrent_case("RNN", 1, 1, (1,), 1)
    inputs = {"x": (MAX_STEPS + 1, 1, 1), "cont": (MAX_STEPS + 1, 1)}
    _, model = write_net_files(tmp_path, net(layers, inputs))
    out = tmp_path / "long.onnx"
    result = invoke("export", str(model), "-o", str(out))
    assert_error(result, 3, "'recur' (RNN)", f"{MAX_STEPS + 1:,} time steps", "past the")
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_recurrent_sweep(tmp_path, kind):
    """Every combination of T in (1, 2, 7, 25), N in (1, 4), static input or not, expose_hidden or not."""
    for k, (steps, streams, static, expose) in enumerate(itertools.product((1, 2, 7, 25), (1, 4), (None, (5,)),
                                                                           (False, True))):
        folder = tmp_path / f"case{k}"
        folder.mkdir()
        layers, inputs, feeds = recurrent_case(kind, steps, streams, (3, 2), 6, static=static, expose=expose, seed=k)
        against_caffe(folder, layers, inputs, feeds)
        against_onnx(folder, layers, inputs, feeds, opsets=EVERY_OPSET)


# -- SPP, Im2col, BatchReindex, Filter, Parameter --------------------------------------------------

def _feeds(inputs: dict, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in inputs.items()}


MAX, AVE = 0, 1

# (pyramid_height, pool, (N, C, H, W)): planes that divide evenly and that need pads; pyramid_height 1 (its
# top not flattened)
SPP_CASES = [(1, MAX, (2, 3, 5, 7)), (2, MAX, (2, 3, 6, 6)), (3, MAX, (1, 2, 9, 13)), (3, AVE, (2, 2, 8, 11)),
             (2, AVE, (1, 3, 5, 4)), (4, MAX, (1, 1, 16, 20))]


@pytest.mark.parametrize("height,pool,shape", SPP_CASES, ids=[f"h{c[0]}-{'ave' if c[1] else 'max'}-{c[2][2]}x{c[2][3]}"
                                                               for c in SPP_CASES])
def test_spp_as_caffe_and_exported(tmp_path, height, pool, shape):
    layers = [layer("spp", "SPP", "data", spp_param={"pyramid_height": height, "pool": pool})]
    inputs = {"data": shape}
    feeds = _feeds(inputs)
    ours, _ = against_caffe(tmp_path, layers, inputs, feeds)
    bins = sum(4 ** level for level in range(height))
    assert ours["spp"].shape == ((shape[0], shape[1], 1, 1) if height == 1 else (shape[0], shape[1] * bins))
    against_onnx(tmp_path, layers, inputs, feeds, opsets=(13,))


# (convolution_param, (N, C, H, W))
IM2COL_CASES = [
    ({"kernel_size": [3]}, (2, 3, 5, 6)),
    ({"kernel_size": [2], "stride": [2]}, (1, 2, 6, 7)),
    ({"kernel_size": [3], "pad": [1], "stride": [2]}, (2, 2, 7, 5)),
    ({"kernel_h": 2, "kernel_w": 3, "pad_h": 1, "pad_w": 0, "stride_h": 1, "stride_w": 2}, (1, 3, 5, 8)),
    ({"kernel_size": [3], "dilation": [2], "pad": [2]}, (1, 2, 7, 7)),
    ({"kernel_size": [2, 3], "dilation": [3, 1], "stride": [2, 1]}, (2, 1, 9, 6)),
    # a kernel past the plane by less than a stride: C++'s division truncates toward 0, one window overhangs
    ({"kernel_size": [5], "stride": [2]}, (1, 2, 4, 6)),
]


@pytest.mark.parametrize("conv,shape", IM2COL_CASES, ids=[str(k) for k in range(len(IM2COL_CASES))])
def test_im2col_as_caffe_and_exported(tmp_path, conv, shape):
    layers = [layer("cols", "Im2col", "data", convolution_param=conv)]
    inputs = {"data": shape}
    feeds = _feeds(inputs)
    against_caffe(tmp_path, layers, inputs, feeds)
    against_onnx(tmp_path, layers, inputs, feeds, opsets=(13,))


# the indices, as floats: repeats, any order, fewer or more rows than the batch, a fraction (truncated)
REINDEX_CASES = [[2, 0, 1], [0, 0, 0, 0, 0], [3, 3, 1, 0, 2, 1], [1], [2.7, 0.2, 1.9]]


@pytest.mark.parametrize("index", REINDEX_CASES, ids=[str(k) for k in range(len(REINDEX_CASES))])
def test_batch_reindex_as_caffe_and_exported(tmp_path, index):
    rows = 4
    layers = [layer("picked", "BatchReindex", ["data", "index"])]
    inputs = {"data": (rows, 2, 3), "index": (len(index),)}
    feeds = dict(_feeds({"data": inputs["data"]}), index=np.asarray(index, np.float32))
    ours, _ = against_caffe(tmp_path, layers, inputs, feeds)
    np.testing.assert_array_equal(ours["picked"], feeds["data"][np.trunc(index).astype(int)])
    against_onnx(tmp_path, layers, inputs, feeds, opsets=(13,))


def test_batch_reindex_refuses_an_index_outside_the_batch(tmp_path):
    """Caffe stops at an index past the batch or below 0; blobtool's forward refuses it, naming it."""
    from caffenets import net, ours_forward

    from blobtool.layers import LayerError

    for bad in ([0, 4], [-1, 0], [float("nan")]):
        message = net([layer("picked", "BatchReindex", ["data", "index"])], {"data": (4, 2), "index": (len(bad),)})
        with pytest.raises(LayerError, match="outside the batch"):
            ours_forward(message, {"data": np.zeros((4, 2), np.float32), "index": np.asarray(bad, np.float32)})


# the selector's values (N = 5): some rows, all, none, a NaN (not 0: it selects), shaped (N) or (N, 1, 1)
FILTER_CASES = [([1, 0, 1, 0, 0], (5,)), ([1, 1, 1, 1, 1], (5,)), ([0, 0, 0, 0, 0], (5, 1)),
                ([0, float("nan"), 0, -2, 0], (5, 1, 1))]


@pytest.mark.parametrize("selector,shape", FILTER_CASES, ids=["some", "all", "none", "nan-and-negative"])
def test_filter_as_caffe_and_exported(tmp_path, selector, shape):
    layers = [layer("kept", "Filter", ["a", "b", "selector"], ["a_kept", "b_kept"])]
    inputs = {"a": (5, 3), "b": (5, 2, 2, 2), "selector": shape}
    feeds = dict(_feeds({"a": (5, 3), "b": (5, 2, 2, 2)}), selector=np.asarray(selector, np.float32).reshape(shape))
    ours, _ = against_caffe(tmp_path, layers, inputs, feeds)
    chosen = [k for k, v in enumerate(selector) if v != 0]
    assert ours["a_kept"].shape == (len(chosen), 3)
    np.testing.assert_array_equal(ours["b_kept"], feeds["b"][chosen])
    against_onnx(tmp_path, layers, inputs, feeds, opsets=(13,))


def test_filter_top_read_by_a_layer_is_refused_before_running(tmp_path):
    """A Filter's rows are known only as it runs: a later layer reading them is refused with one line."""
    from caffenets import net
    from runner import assert_error, invoke

    layers = [layer("kept", "Filter", ["a", "selector"], ["a_kept"]), layer("relu", "ReLU", "a_kept")]
    _, model = write_net_files(tmp_path, net(layers, {"a": (3, 2), "selector": (3,)}))
    result = invoke("run", str(model))
    assert_error(result, 3, "reads blob 'a_kept'", "'kept' (Filter)", "as an output of the net only")


@pytest.mark.parametrize("shape", [(2, 3), (4,), (1, 2, 3, 2)])
def test_parameter_as_caffe_and_exported(tmp_path, shape):
    value = np.random.default_rng(1).standard_normal(shape)
    layers = [layer("param", "Parameter", (), "param", [value], parameter_param={"shape": {"dim": list(shape)}}),
              layer("scaled", "Eltwise", ["param", "x"], eltwise_param={"operation": 1})]
    inputs = {"x": shape}
    feeds = _feeds(inputs)
    ours, _ = against_caffe(tmp_path, layers, inputs, feeds)
    np.testing.assert_array_equal(ours["param"], value.astype(np.float32))
    against_onnx(tmp_path, layers, inputs, feeds, opsets=(13,))


# -- a CRNN-shaped net: convolutions, then a 2-layer LSTM over the width ------------------------------

def crnn_net(seed: int = 0, *, streams: int = 2, width: int = 24) -> tuple:
    """(layers, inputs, feeds) of a text recogniser's shape: conv, pool, conv, pool, height folded, 2 LSTMs, classes.

    The image (N, 1, 8, W) becomes T = W / 4 steps of N streams: a Permute
    puts the width first and a Reshape gives (T, N, C h); cont is 0 at step 1.
    """
    rng = np.random.default_rng(seed)

    def weights(*shape):
        return 0.3 * rng.standard_normal(shape)

    steps, hidden, classes = width // 4, 6, 5
    layers = [
        layer("conv1", "Convolution", "image", blobs=[weights(4, 1, 3, 3), weights(4)],
              convolution_param={"num_output": 4, "kernel_size": [3], "pad": [1]}),
        layer("relu1", "ReLU", "conv1", "conv1"),
        layer("pool1", "Pooling", "conv1", pooling_param={"pool": MAX, "kernel_size": 2, "stride": 2}),
        layer("conv2", "Convolution", "pool1", blobs=[weights(8, 4, 3, 3), weights(8)],
              convolution_param={"num_output": 8, "kernel_size": [3], "pad": [1]}),
        layer("relu2", "ReLU", "conv2", "conv2"),
        layer("pool2", "Pooling", "conv2", pooling_param={"pool": MAX, "kernel_size": 2, "stride": 2}),
        layer("by_width", "Permute", "pool2", permute_param={"order": [3, 0, 1, 2]}),
        layer("sequence", "Reshape", "by_width", reshape_param={"shape": {"dim": [0, 0, -1]}}),
        layer("lstm1", "LSTM", ["sequence", "cont"], blobs=[weights(4 * hidden, 16), weights(4 * hidden),
                                                             weights(4 * hidden, hidden)],
              recurrent_param={"num_output": hidden}),
        layer("lstm2", "LSTM", ["lstm1", "cont"], blobs=[weights(4 * hidden, hidden), weights(4 * hidden),
                                                          weights(4 * hidden, hidden)],
              recurrent_param={"num_output": hidden}),
        layer("scores", "InnerProduct", "lstm2", blobs=[weights(classes, hidden), weights(classes)],
              inner_product_param={"num_output": classes, "axis": 2}),
        layer("prob", "Softmax", "scores", softmax_param={"axis": 2}),
    ]
    inputs = {"image": (streams, 1, 8, width), "cont": (steps, streams)}
    feeds = _feeds({"image": inputs["image"]}, seed)
    feeds["cont"] = np.ones((steps, streams), np.float32)
    feeds["cont"][0] = 0
    return layers, inputs, feeds


def test_crnn_net_runs_as_caffe_and_exports(tmp_path):
    layers, inputs, feeds = crnn_net()
    ours, _ = against_caffe(tmp_path, layers, inputs, feeds)
    assert ours["prob"].shape == (6, 2, 5)
    np.testing.assert_allclose(ours["prob"].sum(axis=2), 1, rtol=0, atol=1e-6)
    against_onnx(tmp_path, layers, inputs, feeds, opsets=(13, 17))


def test_crnn_net_through_the_commands(tmp_path):
    """`blobtool run` and `blobtool export --check` of the CRNN-shaped net, from its files, as a user gives them."""
    from caffenets import net
    from runner import ok

    layers, inputs, feeds = crnn_net(seed=3)
    _, model = write_net_files(tmp_path, net(layers, inputs))
    np.save(tmp_path / "cont.npy", feeds["cont"])
    result = ok("run", str(model), "--input", f"cont={tmp_path / 'cont.npy'}", "-o", str(tmp_path / "out.npz"))
    assert np.load(tmp_path / "out.npz")["prob"].shape == (6, 2, 5), result.output
    result = ok("export", str(model), "-o", str(tmp_path / "crnn.onnx"), "--check")
    assert "computes what" in result.output + result.stderr


def test_batch_reindex_index_outside_the_batch_through_run(tmp_path):
    from caffenets import net
    from runner import assert_error, invoke

    _, model = write_net_files(tmp_path, net([layer("picked", "BatchReindex", ["data", "index"])],
                                             {"data": (4, 2), "index": (2,)}))
    np.save(tmp_path / "index.npy", np.array([0, 7], np.float32))
    result = invoke("run", str(model), "--input", f"index={tmp_path / 'index.npy'}")
    assert_error(result, 3, "'picked' (BatchReindex)", "index 1 of bottom 1 is 7, outside the batch's 0 .. 3")


@pytest.mark.slow
def test_every_case_exported_at_every_opset(tmp_path):
    """Each SPP, Im2col, BatchReindex, Filter, Parameter case, the CRNN net and LSTMUnit at every opset of EVERY_OPSET."""
    cases = [([layer("spp", "SPP", "data", spp_param={"pyramid_height": h, "pool": p})], {"data": shape})
             for h, p, shape in SPP_CASES]
    cases += [([layer("cols", "Im2col", "data", convolution_param=conv)], {"data": shape})
              for conv, shape in IM2COL_CASES]
    cases = [(layers, inputs, _feeds(inputs)) for layers, inputs in cases]
    for index in REINDEX_CASES:
        feeds = dict(_feeds({"data": (4, 2, 3)}), index=np.asarray(index, np.float32))
        cases.append(([layer("picked", "BatchReindex", ["data", "index"])], {"data": (4, 2, 3), "index": (len(index),)},
                      feeds))
    for selector, shape in FILTER_CASES:
        feeds = dict(_feeds({"a": (5, 3)}), selector=np.asarray(selector, np.float32).reshape(shape))
        cases.append(([layer("kept", "Filter", ["a", "selector"], ["a_kept"])], {"a": (5, 3), "selector": shape},
                      feeds))
    value = np.arange(6, dtype=np.float32).reshape(2, 3)
    cases.append(([layer("param", "Parameter", (), "param", [value], parameter_param={"shape": {"dim": [2, 3]}}),
                   layer("summed", "Eltwise", ["param", "x"])], {"x": (2, 3)}, _feeds({"x": (2, 3)})))
    cases.append(crnn_net(seed=5, width=40))
    unit = {"c_prev": (1, 3, 4), "gates": (1, 3, 16), "cont": (1, 3)}
    cases.append(([layer("unit", "LSTMUnit", ["c_prev", "gates", "cont"], ["c", "h"])], unit,
                  dict(_feeds(unit), cont=np.asarray([[0, 1, 0.5]], np.float32))))
    for k, (layers, inputs, feeds) in enumerate(cases):
        folder = tmp_path / f"case{k}"
        folder.mkdir()
        against_onnx(folder, layers, inputs, feeds, opsets=EVERY_OPSET)


def _refused_cases() -> list:
    """(id, layers, inputs, feeds, blobtool's words) of nets both blobtool and Caffe refuse."""
    rng = np.random.default_rng(2)
    lstm_blobs = [rng.standard_normal((8, 3)), rng.standard_normal(8), rng.standard_normal((8, 2))]
    rnn_bad = [rng.standard_normal((2, 3)), rng.standard_normal(2), rng.standard_normal((2, 3)),
               rng.standard_normal((2, 2)), rng.standard_normal(2)]
    cases = [
        ("spp level pad past its kernel", [layer("spp", "SPP", "data", spp_param={"pyramid_height": 3})],
         {"data": (1, 1, 3, 3)}, "pyramid level 2"),
        ("lstm cont of other streams", [layer("lstm", "LSTM", ["x", "cont"], blobs=lstm_blobs,
                                              recurrent_param={"num_output": 2})],
         {"x": (4, 2, 3), "cont": (4, 3)}, "cont"),
        ("rnn W_hh of the wrong shape", [layer("rnn", "RNN", ["x", "cont"], blobs=rnn_bad,
                                               recurrent_param={"num_output": 2})],
         {"x": (4, 2, 3), "cont": (4, 2)}, "blob 2 (W_hh)"),
        ("im2col kernel past the input", [layer("cols", "Im2col", "data", convolution_param={"kernel_size": [5]})],
         {"data": (1, 1, 3, 3)}, "smaller than the dilated kernel"),
        ("filter selector of two columns", [layer("kept", "Filter", ["a", "selector"], ["a_kept"])],
         {"a": (3, 2), "selector": (3, 2)}, "its axes but the first must be 1"),
        ("batch reindex of 2-D indices", [layer("picked", "BatchReindex", ["data", "index"])],
         {"data": (3, 2), "index": (2, 1)}, "it must have 1 axis"),
    ]
    return [(name, layers, inputs, _feeds(inputs), words) for name, layers, inputs, words in cases]


def test_caffe_refuses_what_blobtool_refuses(tmp_path):
    """Each net blobtool refuses (LayerError naming the layer), Caffe refuses too (its CHECK line)."""
    from caffenets import net, ours_forward
    from caffeoracle import caffe_refusals

    from blobtool.layers import LayerError

    cases = _refused_cases()
    for name, layers, inputs, feeds, words in cases:
        with pytest.raises(LayerError, match=words.replace("(", r"\(").replace(")", r"\)")):
            ours_forward(net(layers, inputs), feeds)
    found = caffe_refusals([(net(layers, inputs), feeds) for _, layers, inputs, feeds, _ in cases], tmp_path)
    runs = [name for (name, *_), refusal in zip(cases, found) if refusal is None]
    assert not runs, f"Caffe runs what blobtool refuses: {runs}"
