"""Size and time bombs in run and export: tiny definitions that state huge sizes or windows.

Each bomb is a net of a few hundred bytes. `run` and `export` must refuse
the oversized ones (exit 3, one line naming the layer or input and the
size) before anything is allocated: the commands run as real processes
under an address-space limit of 2 GiB (RLIMIT_AS), where an allocation of
32 GiB would be a MemoryError (exit 70). The layers whose cost grew with a
window (LRN, Pooling) must cost what the output and Caffe's own loops do,
and give the values a direct computation of Caffe's formula gives.
"""

from __future__ import annotations

import json
import resource
import subprocess
import time

import numpy as np
import pytest

from blobtool.layers import layer_class
from caffenets import layer, net, write_net_files
from runner import assert_error, blobtool_cmd, invoke, ok, subprocess_env

LIMIT = 2 << 30   # 2 GiB of address space


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def _run_limited(*args, timeout=120) -> subprocess.CompletedProcess:
    """blobtool ARGS as a process under RLIMIT_AS 2 GiB; stdout and stderr as text."""
    return subprocess.run(blobtool_cmd(*args), env=subprocess_env(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=timeout, preexec_fn=_limited)


def _one_error(done: subprocess.CompletedProcess, code: int, *fragments) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("blobtool: "), done.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def _noise(stderr: str) -> list:
    """The lines of stderr other than run's note of the random input it drew."""
    return [ln for ln in stderr.splitlines() if not (ln.startswith("blobtool: warning: input ") and "random" in ln)]


def _model(tmp_path, layers, inputs, stem="net"):
    return write_net_files(tmp_path, net(layers, inputs), stem)[1]


ONE = np.ones((1, 1, 1, 1), np.float32)

# name: (layers, inputs, what the refusal names)
BOMBS = {
    "tile": ([layer("t", "Tile", "data", tile_param={"tiles": 2 ** 31 - 1})], {"data": (1, 4)}, "layer 't' (Tile)"),
    "deconvolution stride 65535": (
        [layer("d", "Deconvolution", "data", blobs=[ONE],
               convolution_param={"num_output": 1, "kernel_size": [1], "stride": [65535], "bias_term": False})],
        {"data": (1, 1, 100, 100)}, "layer 'd' (Deconvolution)"),
    "upsample scale 10^6": ([layer("u", "Upsample", "data", upsample_param={"scale": 10 ** 6})],
                            {"data": (1, 1, 2, 2)}, "layer 'u' (Upsample)"),
    "interp zoom 10^6": ([layer("i", "Interp", "data", interp_param={"zoom_factor": 10 ** 6})],
                         {"data": (1, 1, 3, 3)}, "layer 'i' (Interp)"),
    "convolution pad 2^30": (
        [layer("c", "Convolution", "data", blobs=[ONE],
               convolution_param={"num_output": 1, "kernel_size": [1], "pad": [2 ** 30], "bias_term": False})],
        {"data": (1, 1, 1, 1)}, "layer 'c' (Convolution)"),
    "input 2^62": ([layer("r", "ReLU", "data")], {"data": (2 ** 31, 2 ** 31)}, "input 'data'"),
}

# A top of a few values computed through a padded input or an uncropped output of terabytes.
WORK_BOMBS = {
    "pooling pad 2^30": ([layer("p", "Pooling", "data",
                                pooling_param={"pool": 0, "kernel_size": 2 ** 31 - 1, "pad": 2 ** 30})],
                         {"data": (1, 1, 1, 1)}, "layer 'p' (Pooling)"),
    "convolution pad 2^20 stride 2^21": (
        [layer("c", "Convolution", "data", blobs=[ONE],
               convolution_param={"num_output": 1, "kernel_size": [1], "pad": [2 ** 20], "stride": [2 ** 21],
                                  "bias_term": False})], {"data": (1, 1, 1, 1)}, "layer 'c' (Convolution)"),
    "pooling pad 2^20 stride 2^21": (
        [layer("p", "Pooling", "data", pooling_param={"pool": 1, "kernel_size": 2 ** 20 + 1, "pad": 2 ** 20,
                                                      "stride": 2 ** 21})], {"data": (1, 1, 1, 1)},
        "layer 'p' (Pooling)"),
    "deconvolution pad 2^20 stride 2^21": (
        [layer("d", "Deconvolution", "data", blobs=[ONE],
               convolution_param={"num_output": 1, "kernel_size": [1], "pad": [2 ** 20], "stride": [2 ** 21],
                                  "bias_term": False})], {"data": (1, 1, 2, 2)}, "layer 'd' (Deconvolution)"),
}


# -- item 9: tops of any size ---------------------------------------------------------------

@pytest.mark.slow  # a real process's limits, time or memory: its cost is the point
@pytest.mark.parametrize("name", list(BOMBS))
def test_run_and_export_refuse_a_top_past_int_max_before_allocating(tmp_path, name):
    layers, inputs, named = BOMBS[name]
    model = _model(tmp_path, layers, inputs)
    assert model.stat().st_size < 200
    line = _one_error(_run_limited("run", model), 3, named)
    assert "2,147,483,647" in line and "values" in line
    out = tmp_path / "out.onnx"
    line = _one_error(_run_limited("export", model, "-o", out), 3, named)
    assert "2,147,483,647" in line
    assert not out.exists()


@pytest.mark.slow  # a real process's limits, time or memory: its cost is the point
@pytest.mark.parametrize("name", list(WORK_BOMBS))
def test_run_refuses_a_working_array_past_int_max(tmp_path, name):
    layers, inputs, named = WORK_BOMBS[name]
    model = _model(tmp_path, layers, inputs)
    line = _one_error(_run_limited("run", model), 3, named, "nothing was computed")
    assert "2,147,483,647" in line


@pytest.mark.slow  # a real process's limits, time or memory: its cost is the point
def test_run_refuses_blobs_past_the_memory_that_can_be_had(tmp_path):
    # 1.6 billion values: under Caffe's count limit, 6 GiB: past the 2 GiB the process may map.
    model = _model(tmp_path, [layer("t", "Tile", "data", tile_param={"tiles": 400_000_000})], {"data": (1, 4)})
    line = _one_error(_run_limited("run", model), 3, "at once", "can be had", "nothing was computed")
    assert "6.0 GiB" in line


@pytest.mark.slow  # a real process's limits, time or memory: its cost is the point
def test_run_under_the_limit_still_runs_a_net_that_fits(tmp_path):
    model = _model(tmp_path, [layer("t", "Tile", "data", tile_param={"tiles": 1000})], {"data": (1, 4)})
    done = _run_limited("run", model, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["blobs"][0]["shape"] == [1, 4000]


def test_peak_counts_the_blobs_alive_at_once(tmp_path):
    from blobtool.formats import open_document
    from blobtool.forward.deploy import deploy_net
    from blobtool.forward.runner import build

    # data (400 B) -> a (4000 B) -> b (4000 B) -> c (4 B): a goes once b is made; b once c is.
    layers = [layer("a", "Tile", "data", tile_param={"tiles": 10}), layer("b", "ReLU", "a"),
              layer("c", "Reduction", "b", reduction_param={"axis": 1})]
    model = _model(tmp_path, layers, {"data": (1, 100)})
    with open_document(model) as doc:
        program = build(deploy_net(doc), doc)
    # At b: data was let go after a; a (4000) and b (4000) alive; then at c: b and c.
    assert program.peak_bytes(["c"]) == 8000
    assert program.peak_bytes(["data", "a", "b", "c"]) == 400 + 4000 + 4000 + 4


# -- item 10: declared shapes ---------------------------------------------------------------

def _declared_nets():
    relu = layer("r", "ReLU", "data")
    shapes = {"-3": (1, -3, 2), "70 axes": (1,) * 70, "2^62": (2 ** 62,)}
    for label, shape in shapes.items():
        yield f"input_shape {label}", net([relu], {"data": shape}), "input 'data' (the net's input_shape 0)"
        by_layer = net([layer("in", "Input", [], "data", input_param={"shape": [{"dim": list(shape)}]}), relu], {})
        yield f"Input layer {label}", by_layer, "layer 'in' (Input): input_param.shape 0"
    # input_dim is int32: four per input.
    for label, dims in {"-3": [1, -3, 2, 1], "2^32": [65536, 65536, 1, 1]}.items():
        by_dim = net([relu], {})
        by_dim.input.append("data")
        by_dim.input_dim.extend(dims)
        yield f"input_dim {label}", by_dim, "input 'data' (the net's input_dim 0 to 3)"


@pytest.mark.slow  # a real process's limits, time or memory: its cost is the point
@pytest.mark.parametrize("case", list(_declared_nets()), ids=lambda c: c[0])
def test_declared_shapes_are_checked_as_caffe_checks_them(tmp_path, case):
    _, message, named = case
    prototxt, model = write_net_files(tmp_path, message)
    for source in (model, prototxt):
        _one_error(_run_limited("run", source), 3, named)
        out = tmp_path / "out.onnx"
        _one_error(_run_limited("export", source, "-o", out), 3, named)
        assert not out.exists()


def test_input_shape_past_int_max_is_refused(tmp_path):
    model = _model(tmp_path, [layer("r", "ReLU", "data")], {"data": (1, 2)})
    done = _run_limited("run", model, "--input-shape", "data=100000,100000,1000")
    _one_error(done, 3, "input 'data'", "2,147,483,647")


@pytest.mark.parametrize("kind, params, shape", [
    ("Softmax", {}, (1, 0, 3)),
    ("Softmax", {}, (0, 3)),
    ("MVN", {}, (0, 3, 2, 2)),
    ("MVN", {"mvn_param": {"across_channels": True}}, (2, 3, 0, 2)),
    ("BatchNorm", {"batch_norm_param": {"use_global_stats": False}}, (0, 3, 2, 2)),
])
def test_an_empty_blob_is_refused_as_caffe_refuses_it(tmp_path, kind, params, shape):
    # Caffe allocates no memory for a blob of 0 values and its forward stops at CHECK(data_): blobtool
    # refuses such a run before computing (it was exit 70, then numpy's "Mean of empty slice").
    blobs = [np.zeros(3), np.ones(3), np.ones(1)] if kind == "BatchNorm" else []
    model = _model(tmp_path, [layer("x", kind, "data", blobs=blobs, **params)], {"data": shape})
    done = subprocess.run(blobtool_cmd("run", model, "--json"), env=subprocess_env(), capture_output=True, text=True,
                          timeout=60)
    _one_error(done, 3, "the net takes blob 'data' of shape", "which holds no values",
               "Check failed: data_")
    assert done.stdout == ""


@pytest.mark.caffe
def test_caffe_refuses_a_blob_of_no_values(tmp_path):
    from caffeoracle import caffe_refusal

    made = net([layer("x", "Softmax", "data")], {"data": (1, 0, 3)})
    refusal = caffe_refusal(made, {"data": np.zeros((1, 0, 3), np.float32)}, tmp_path)
    assert refusal is not None and "Check failed: data_" in refusal.line


# -- item 11: constants an export computes ---------------------------------------------------

def test_export_refuses_priors_past_the_bound_before_computing_them(tmp_path):
    # 2 x 1200 x 1200 cells x 10 priors x 4 = 115,200,000 values: a blob Caffe holds, 0.9 GiB of
    # float64 boxes to compute and a 460 MB constant to write.
    prior = layer("p", "PriorBox", ["data", "img"], prior_box_param={"min_size": [4], "aspect_ratio": [2, 3, 4, 5],
                                                                    "flip": True, "max_size": [8]})
    model = _model(tmp_path, [prior], {"data": (1, 1, 1200, 1200), "img": (1, 1, 8, 8)})
    out = tmp_path / "out.onnx"
    line = _one_error(_run_limited("export", model, "-o", out), 3, "layer 'p' (PriorBox)", "16,777,216")
    assert "115,200,000" in line
    assert not out.exists()


def test_export_refuses_interp_indices_past_the_bound(tmp_path):
    interp = layer("i", "Interp", "data", interp_param={"height": 40_000_000, "width": 1,
                                                        "interp_type": "nearest_neighbor"})
    model = _model(tmp_path, [interp], {"data": (1, 1, 2, 2)})
    out = tmp_path / "out.onnx"
    started = time.perf_counter()
    _one_error(_run_limited("export", model, "-o", out), 3, "layer 'i' (Interp)", "40,000,001")
    assert time.perf_counter() - started < 30
    assert not out.exists()


def test_export_still_writes_ordinary_priors(tmp_path):
    prior = layer("p", "PriorBox", ["data", "img"], prior_box_param={"min_size": [4], "aspect_ratio": [2],
                                                                    "flip": True})
    model = _model(tmp_path, [prior], {"data": (1, 1, 19, 19), "img": (1, 3, 300, 300)})
    ok("export", model, "-o", tmp_path / "out.onnx")
    assert (tmp_path / "out.onnx").stat().st_size > 19 * 19 * 3 * 4 * 2 * 4


# -- item 13: LRN and Pooling ----------------------------------------------------------------

def _layer(kind, params, shapes, blobs=()):
    message = layer("x", kind, ["b"] * len(shapes), **params)
    made = layer_class(kind)("x", kind, message, list(blobs))
    return made, made.reshape(shapes)


def _lrn_reference(x, size, alpha, beta, k, region):
    """Caffe's LRN formula summed in float64 over the window clipped to the blob (the pad adds zeros)."""
    x64 = x.astype(np.float64)
    r = (size - 1) // 2
    n, c, h, w = x.shape
    total = np.zeros_like(x64)
    if region == 0:
        for ch in range(c):
            total[:, ch] = (x64[:, max(0, ch - r):ch + r + 1] ** 2).sum(axis=1)
        return x64 * (k + alpha / size * total) ** -beta
    for i in range(h):
        for j in range(w):
            total[:, :, i, j] = (x64[:, :, max(0, i - r):i + r + 1, max(0, j - r):j + r + 1] ** 2).sum(axis=(2, 3))
    return x64 * (1 + alpha * total / (size * size)) ** -beta


@pytest.mark.slow  # a real process's limits, time or memory: its cost is the point
def test_lrn_cost_follows_the_blob_not_local_size():
    made, _ = _layer("LRN", {"lrn_param": {"local_size": 5_999_999}}, [(1, 1, 1, 1)])
    x = np.full((1, 1, 1, 1), 2.0, np.float32)
    started = time.perf_counter()
    (y,) = made.forward([x])
    assert time.perf_counter() - started < 2.0     # 15 s looping over every offset of the window
    # scale = 1 + 1e-4 / 5999999 * 4; y = 2 * scale^-0.75
    assert y[0, 0, 0, 0] == pytest.approx(2 * (1 + 1e-4 / 5_999_999 * 4) ** -0.75, rel=1e-6)
    made, _ = _layer("LRN", {"lrn_param": {"local_size": 5_999_999, "norm_region": 1}}, [(1, 1, 2, 2)])
    started = time.perf_counter()
    made.forward([np.ones((1, 1, 2, 2), np.float32)])
    assert time.perf_counter() - started < 2.0


@pytest.mark.parametrize("size", [3, 5, 63, 65, 101, 1001])
@pytest.mark.parametrize("region", [0, 1])
def test_lrn_wide_windows_match_caffe_formula(size, region):
    rng = np.random.default_rng(size + region)
    x = rng.standard_normal((2, 40, 5, 6)).astype(np.float32) * 3
    params = {"lrn_param": {"local_size": size, "alpha": 0.5, "beta": 0.75, "k": 2.0, "norm_region": region}}
    made, _ = _layer("LRN", params, [x.shape])
    (y,) = made.forward([x])
    k = 2.0 if region == 0 else 1.0
    expected = _lrn_reference(x, size, 0.5, 0.75, k, region)
    np.testing.assert_allclose(y, expected, rtol=2e-6, atol=1e-7)


def _pool_reference(x, kernel, stride, pad, method):
    """Caffe's Forward_cpu loops: each window clipped as pooling_layer.cpp clips it (MAX: image; AVE: image + pad)."""
    n, c, h, w = x.shape
    from blobtool.layers.pooling import pooled_size
    any_pad = pad != (0, 0)
    ho = pooled_size(h, kernel[0], stride[0], pad[0], True, any_pad)
    wo = pooled_size(w, kernel[1], stride[1], pad[1], True, any_pad)
    y = np.zeros((n, c, ho, wo), np.float64)
    mask = np.full((n, c, ho, wo), -1.0)
    for a in range(ho):
        for b in range(wo):
            hs, ws = a * stride[0] - pad[0], b * stride[1] - pad[1]
            he, we = min(hs + kernel[0], h + pad[0]), min(ws + kernel[1], w + pad[1])
            size = (he - hs) * (we - ws)
            hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
            window = x[:, :, hs:he, ws:we].reshape(n, c, -1)
            if method == 1:
                y[:, :, a, b] = window.astype(np.float64).sum(axis=2) / size
            else:
                best = window.argmax(axis=2)
                y[:, :, a, b] = window.max(axis=2)
                mask[:, :, a, b] = (hs + best // (we - ws)) * w + ws + best % (we - ws)
    return y, mask


@pytest.mark.slow  # a real process's limits, time or memory: its cost is the point
@pytest.mark.parametrize("method", [0, 1])
def test_pooling_a_kernel_of_2000_costs_what_caffe_does(method):
    rng = np.random.default_rng(method)
    x = rng.standard_normal((1, 1, 2001, 2001)).astype(np.float32)
    params = {"pooling_param": {"pool": method, "kernel_size": 2000}}
    made = layer_class("Pooling")("x", "Pooling", layer("x", "Pooling", "b", tops=["x", "m"] if method == 0 else None,
                                                        **params), [])
    made.reshape([x.shape])
    started = time.perf_counter()
    ys = made.forward([x])
    assert time.perf_counter() - started < 3.0     # 14.5 s over four million kernel offsets
    expected, mask = _pool_reference(x, (2000, 2000), (1, 1), (0, 0), method)
    np.testing.assert_allclose(ys[0], expected, rtol=1e-5, atol=1e-6)
    if method == 0:
        np.testing.assert_array_equal(ys[1], mask)


@pytest.mark.parametrize("seed", range(6))
def test_pooling_matches_caffe_loops_with_ties_and_pads(seed):
    rng = np.random.default_rng(seed)
    h, w = rng.integers(3, 12, 2)
    kernel = tuple(int(v) for v in rng.integers(2, 5, 2))
    pad = tuple(int(rng.integers(0, k)) for k in kernel)
    stride = tuple(int(v) for v in rng.integers(1, 4, 2))
    x = rng.integers(-2, 3, (2, 3, h, w)).astype(np.float32)   # many ties: the first greatest wins
    for method in (0, 1):
        params = {"pooling_param": {"pool": method, "kernel_h": kernel[0], "kernel_w": kernel[1], "pad_h": pad[0],
                                    "pad_w": pad[1], "stride_h": stride[0], "stride_w": stride[1]}}
        message = layer("x", "Pooling", "b", tops=["x", "m"] if method == 0 else None, **params)
        made = layer_class("Pooling")("x", "Pooling", message, [])
        made.reshape([x.shape])
        ys = made.forward([x])
        expected, mask = _pool_reference(x, kernel, stride, pad, method)
        np.testing.assert_allclose(ys[0], expected, rtol=1e-6, atol=1e-6)
        if method == 0:
            np.testing.assert_array_equal(ys[1], mask)


# -- item 14: PriorBox's parameters ------------------------------------------------------------

@pytest.mark.parametrize("params, named", [
    ({"min_size": [float("inf")]}, "min_size inf"),
    ({"min_size": [float("nan")]}, "min_size nan"),
    ({"min_size": [4], "max_size": [float("inf")]}, "max_size inf"),
    ({"min_size": [4], "max_size": [float("nan")]}, "max_size nan"),
    ({"min_size": [3e9]}, "min_size 3000000000"),
    ({"min_size": [60000], "max_size": [60001]}, "min_size 60000 times max_size 60001"),
    ({"min_size": [4], "variance": [float("nan")]}, "variance"),
])
def test_priorbox_refuses_what_caffe_ssd_refuses(tmp_path, params, named):
    model = _model(tmp_path, [layer("p", "PriorBox", ["data", "data"], prior_box_param=params)], {"data": (1, 1, 2, 2)})
    assert_error(invoke("run", model), 3, "layer 'p' (PriorBox)", named)
    assert_error(invoke("export", model, "-o", tmp_path / "o.onnx"), 3, "layer 'p' (PriorBox)", named)


def test_priorbox_aspect_ratio_zero_flipped_computes_as_caffe(tmp_path):
    # caffe-ssd keeps ratio 0 and, with flip, 1 / 0. = inf: boxes 0 wide and Inf high, then Inf wide and 0 high.
    params = {"min_size": [4], "aspect_ratio": [0], "flip": True}
    model = _model(tmp_path, [layer("p", "PriorBox", ["data", "data"], prior_box_param=params)], {"data": (1, 1, 2, 2)})
    done = subprocess.run(blobtool_cmd("run", model, "--json"), env=subprocess_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert _noise(done.stderr) == []
    (blob,) = json.loads(done.stdout)["blobs"]
    assert blob["shape"] == [1, 2, 2 * 2 * 3 * 4]
    # Per cell: the square (finite), then ratio 0 (ymin -inf, ymax inf), then ratio inf (xmin -inf, xmax inf).
    assert blob["inf"] == 4 * 4 and blob["nan"] == 0


# -- item 15: shapes without a copy of the weights ------------------------------------------------

@pytest.mark.slow  # a real process's limits, time or memory: its cost is the point
def test_info_input_shape_does_not_copy_the_weights(tmp_path):
    weight = np.zeros((500, 100_000), np.float32)      # 200 MB
    model = _model(tmp_path, [layer("ip", "InnerProduct", "data", blobs=[weight],
                                    inner_product_param={"num_output": 500, "bias_term": False})],
                   {"data": (1, 100_000)})
    script = ("import resource, subprocess, sys; "
              "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
              "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    import sys

    def peak(*args):
        done = subprocess.run([sys.executable, "-c", script, *blobtool_cmd(*args)], env=subprocess_env(),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return int(done.stdout) * 1024

    with_shapes = peak("info", "--layers", "--input-shape", "data=1,100000", model)
    without = peak("info", "--layers", model)
    assert with_shapes < without + 50 * 2 ** 20, (with_shapes, without)    # the copy was 200 MB more
