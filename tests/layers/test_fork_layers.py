"""The forks' layers SegNet and ENet carry (BN, max-unpooling Upsample) and SENet's Axpy, run and exported.

Real Caffe lacks these layers and OpenCV 4.x's Caffe importer reads none
of them as the forks compute them, so each is held to a loop-by-loop
definition written here from its fork's own Forward_cpu:

- BN: alexgkendall/caffe-segnet, src/caffe/layers/bn_layer.cpp (LEARN:
  the batch's mean and E[x^2] - mean^2 over N, H, W, eps 1e-9, then scale
  and shift; INFERENCE: scale x + shift);
- Upsample with two bottoms: alexgkendall/caffe-segnet,
  src/caffe/layers/upsample_layer.cpp (top[mask[i]] = value[i], plane by
  plane, i in order);
- Axpy: hujie-frank/SENet, src/caffe/layers/axpy_layer.cpp (top = y,
  then caffe_axpy of a[n, c] x per plane).

MAX pooling's mask top, which these nets feed to the unpooling, is real
Caffe's (tests/layers/test_layers_spatial.py holds it to Caffe); here its export
(MaxPool's Indices moved to Caffe's layout) is held to `run`. Every export
runs in onnxruntime and equals `run` blob by blob.
"""

from __future__ import annotations

import numpy as np
import pytest

from caffenets import layer, max_scaled_difference, net, ours_forward, run_and_export, write_net_files
from runner import assert_error, invoke, ok, one_json

MAX = 0
LEARN, INFERENCE = 0, 1
# The loops sum in float64, blobtool (and Caffe) in float32.
TOLERANCE = 1e-5


def _rng(seed):
    return np.random.default_rng(seed)


# -- the definitions, loop by loop -------------------------------------------------------------


def bn_loops(x, scale, shift, mode):
    """caffe-segnet's BNLayer::Forward_cpu, channel by channel, in float64."""
    n, c, h, w = x.shape
    top = np.empty(x.shape, np.float64)
    for ch in range(c):
        plane = x[:, ch].astype(np.float64)
        if mode == INFERENCE:
            top[:, ch] = plane * scale.flat[ch] + shift.flat[ch]
            continue
        # EX across spatial, then across the batch; E(X^2) the same way; variance E(X^2) - (EX)^2.
        mean = sum(plane[i].sum() / (h * w) for i in range(n)) / n
        square = sum((plane[i] ** 2).sum() / (h * w) for i in range(n)) / n
        variance = square - mean * mean
        top[:, ch] = (plane - mean) / np.sqrt(variance + 1e-9) * scale.flat[ch] + shift.flat[ch]
    return top


def unpool_loops(values, mask, out_h, out_w):
    """caffe-segnet's UpsampleLayer::Forward_cpu: zeros, then top[mask[i]] = bottom[i] for i in order."""
    n, c, h, w = values.shape
    top = np.zeros((n, c, out_h * out_w), np.float32)
    for a in range(n):
        for ch in range(c):
            flat_values, flat_mask = values[a, ch].reshape(-1), mask[a, ch].reshape(-1)
            for i in range(h * w):
                top[a, ch, int(flat_mask[i])] = flat_values[i]
    return top.reshape(n, c, out_h, out_w)


def axpy_loops(a, x, y):
    """SENet's AxpyLayer::Forward_cpu: top = y, then top += a[n, c] x over each (n, c) plane."""
    top = y.astype(np.float64)
    for i in range(x.shape[0]):
        for ch in range(x.shape[1]):
            top[i, ch] += float(a.reshape(x.shape[:2])[i, ch]) * x[i, ch]
    return top


# -- run and export ---------------------------------------------------------------------------


def _bn(name, bottom, c, mode, seed, tops=None):
    rng = _rng(seed)
    return layer(name, "BN", bottom, tops, blobs=[1 + 0.3 * rng.standard_normal((1, c, 1, 1)),
                                                  0.2 * rng.standard_normal((1, c, 1, 1))],
                 bn_param={"bn_mode": mode})


# -- BN ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [LEARN, INFERENCE], ids=["LEARN", "INFERENCE"])
@pytest.mark.parametrize("shape", [(1, 3, 5, 4), (3, 2, 1, 7), (2, 4, 6, 6)])
def test_bn_is_segnets_loop(tmp_path, mode, shape):
    x = (_rng(1).standard_normal(shape) * 3 + 1).astype(np.float32)
    made = _bn("bn", "data", shape[1], mode, seed=2)
    message = net([made], {"data": shape})
    ours = ours_forward(message, {"data": x})["bn"]
    scale, shift = (np.asarray(b.data, np.float32) for b in made.blobs)
    assert max_scaled_difference(ours, bn_loops(x, scale, shift, mode)) <= TOLERANCE
    ran = run_and_export(tmp_path, message, {"data": x})
    np.testing.assert_array_equal(ran["bn"], ours)


def test_bn_learn_writes_the_batch_statistics_as_tops_and_exports_them(tmp_path):
    x = _rng(3).standard_normal((2, 3, 4, 5)).astype(np.float32)
    message = net([_bn("bn", "data", 3, LEARN, 4, tops=["y", "mean", "variance"])], {"data": x.shape})
    got = ours_forward(message, {"data": x})
    wide = x.astype(np.float64)
    np.testing.assert_allclose(got["mean"].reshape(-1), wide.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["variance"].reshape(-1), wide.var(axis=(0, 2, 3)), rtol=1e-4, atol=1e-6)
    ran = run_and_export(tmp_path, message, {"data": x})
    np.testing.assert_array_equal(ran["variance"], got["variance"])


def test_bn_refuses_blobs_that_are_not_one_per_channel(tmp_path):
    made = layer("bn", "BN", "data", blobs=[np.ones((1, 2, 1, 1)), np.zeros((1, 2, 1, 1))])
    _, model = write_net_files(tmp_path, net([made], {"data": (1, 3, 2, 2)}))
    assert_error(invoke("run", model), 3, "layer 'bn' (BN): blob 0 holds 2 values; the bottom has 3 channels")


# -- max-unpooling ----------------------------------------------------------------------------


def _pool_unpool(pool: dict, upsample: dict, shape, values_from=None):
    """data -> MAX pooling (with its mask) -> Upsample of the pooled values (or `values_from`) by that mask."""
    layers = [layer("pool", "Pooling", "data", ["pool", "mask"], pooling_param={"pool": MAX, **pool})]
    values = "pool"
    if values_from is not None:
        layers.append(layer("values", "Eltwise", ["pool", values_from]))
        values = "values"
    layers.append(layer("unpool", "Upsample", [values, "mask"], upsample_param=upsample))
    inputs = {"data": shape}
    if values_from is not None:
        inputs[values_from] = None
    return layers, inputs


@pytest.mark.parametrize("pool, upsample, shape, out", [
    ({"kernel_size": 2, "stride": 2}, {"scale": 2}, (2, 3, 8, 6), (8, 6)),
    # an odd size: the pooling's ceil adds a window; pad_out_h takes the row off again
    ({"kernel_size": 2, "stride": 2}, {"scale": 2, "pad_out_h": True}, (1, 2, 7, 6), (7, 6)),
    ({"kernel_size": 2, "stride": 2}, {"upsample_h": 7, "upsample_w": 9}, (1, 2, 7, 9), (7, 9)),
    ({"kernel_h": 2, "kernel_w": 3, "stride_h": 2, "stride_w": 3}, {"scale_h": 2, "scale_w": 3}, (1, 2, 6, 9), (6, 9)),
], ids=["scale", "pad_out", "upsample_hw", "scale_hw"])
def test_unpooling_is_segnets_loop(tmp_path, pool, upsample, shape, out):
    x = _rng(5).standard_normal(shape).astype(np.float32)
    layers, _ = _pool_unpool(pool, upsample, shape)
    message = net(layers, {"data": shape})
    got = ours_forward(message, {"data": x})
    assert got["unpool"].shape == shape[:2] + out
    np.testing.assert_array_equal(got["unpool"], unpool_loops(got["pool"], got["mask"], *out))
    ran = run_and_export(tmp_path, message, {"data": x})
    np.testing.assert_array_equal(ran["mask"], got["mask"])


def test_overlapping_windows_unpool_the_later_value_where_two_share_a_place(tmp_path):
    # 3 x 3 windows at stride 1: neighbouring windows share their maximum, so the mask repeats places;
    # the values unpooled are the pooled ones plus another input, so the repeated places get different values.
    shape = (1, 2, 6, 7)
    x = _rng(6).standard_normal(shape).astype(np.float32)
    v = _rng(7).standard_normal(shape).astype(np.float32)
    layers = [layer("pool", "Pooling", "data", ["pool", "mask"],
                    pooling_param={"pool": MAX, "kernel_size": 3, "stride": 1, "pad": 1}),
              layer("values", "Eltwise", ["pool", "v"]),
              layer("unpool", "Upsample", ["values", "mask"], upsample_param={"upsample_h": 6, "upsample_w": 7})]
    message = net(layers, {"data": shape, "v": shape})
    got = ours_forward(message, {"data": x, "v": v})
    plane = got["mask"][0, 0].reshape(-1)
    assert len(set(plane.tolist())) < plane.size  # places repeat
    np.testing.assert_array_equal(got["unpool"], unpool_loops(got["values"], got["mask"], 6, 7))
    run_and_export(tmp_path, message, {"data": x, "v": v})


@pytest.mark.parametrize("pool", [
    {"kernel_size": 3, "stride": 2, "pad": 1},    # padded, and onnx's ceil size sliced to Caffe's before opset 22
    {"kernel_size": 3, "stride": 2},              # the last window overhangs the image
    {"global_pooling": True},
], ids=["padded", "ceil", "global"])
def test_the_mask_top_exports_in_caffes_layout(tmp_path, pool):
    shape = (2, 3, 7, 8)
    x = _rng(8).standard_normal(shape).astype(np.float32)
    message = net([layer("pool", "Pooling", "data", ["pool", "mask"], pooling_param={"pool": MAX, **pool})],
                  {"data": shape})
    ran = run_and_export(tmp_path, message, {"data": x})
    # Caffe's mask: h * W + w within the plane, the value there the window's maximum.
    n, c, h, w = shape
    index = ran["mask"].astype(np.int64)
    assert index.min() >= 0 and index.max() < h * w
    picked = np.take_along_axis(x.reshape(n, c, h * w), index.reshape(n, c, -1), axis=2)
    np.testing.assert_array_equal(picked.reshape(ran["pool"].shape), ran["pool"])


def test_the_mask_exports_as_caffe_where_windows_hold_nan_or_nothing_above_flt_max(tmp_path):
    x = np.zeros((1, 1, 2, 6), np.float32)
    x[0, 0, :, :2] = [[np.nan, 1.0], [-2.0, np.nan]]     # NaN never wins
    x[0, 0, :, 2:4] = -np.inf                            # nothing beats -FLT_MAX: -FLT_MAX and -1
    x[0, 0, :, 4:] = [[np.nan, np.nan], [np.nan, 3.0]]
    message = net([layer("pool", "Pooling", "data", ["pool", "mask"], pooling_param={"pool": MAX, "kernel_size": 2,
                                                                                    "stride": 2})], {"data": x.shape})
    ran = run_and_export(tmp_path, message, {"data": x})
    assert ran["pool"].reshape(-1).tolist() == [1.0, float(np.finfo(np.float32).min), 3.0]
    assert ran["mask"].reshape(-1).tolist() == [1.0, -1.0, 11.0]


def test_a_mask_past_the_output_is_refused(tmp_path):
    layers = [layer("pool", "Pooling", "data", ["pool", "mask"], pooling_param={"pool": MAX, "kernel_size": 2,
                                                                              "stride": 2}),
              layer("unpool", "Upsample", ["pool", "mask"], upsample_param={"upsample_h": 3, "upsample_w": 3})]
    _, model = write_net_files(tmp_path, net(layers, {"data": (1, 1, 6, 6)}))
    np.save(tmp_path / "x.npy", np.arange(36, dtype=np.float32).reshape(1, 1, 6, 6))
    assert_error(invoke("run", model, "--input", f"data={tmp_path / 'x.npy'}"), 3,
                 "layer 'unpool' (Upsample): the mask holds 9, outside the 3 x 3 output (indices 0 to 8)")


@pytest.mark.parametrize("upsample, why", [
    ({"scale": 1}, "SegNet's Upsample takes scales greater than 1"),
    ({"scale": 3, "pad_out_w": True}, "pad_out_w requires scale_w 2"),
    ({"scale": 2, "scale_h": 2, "scale_w": 2}, "upsample_h and upsample_w are required"),
])
def test_unpooling_settings_caffe_refuses_are_refused(tmp_path, upsample, why):
    layers, _ = _pool_unpool({"kernel_size": 2, "stride": 2}, upsample, (1, 1, 4, 4))
    _, model = write_net_files(tmp_path, net(layers, {"data": (1, 1, 4, 4)}))
    assert_error(invoke("run", model), 3, why)


# -- Axpy -------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale_shape", [(2, 3, 1, 1), (2, 3)])
def test_axpy_is_senets_loop(tmp_path, scale_shape):
    rng = _rng(9)
    a = rng.standard_normal(scale_shape).astype(np.float32)
    x, y = (rng.standard_normal((2, 3, 4, 5)).astype(np.float32) for _ in range(2))
    message = net([layer("axpy", "Axpy", ["a", "x", "y"])], {"a": scale_shape, "x": x.shape, "y": y.shape})
    got = ours_forward(message, {"a": a, "x": x, "y": y})["axpy"]
    assert max_scaled_difference(got, axpy_loops(a, x, y)) <= 1e-6
    run_and_export(tmp_path, message, {"a": a, "x": x, "y": y})


def test_axpy_refuses_a_scale_per_pixel(tmp_path):
    message = net([layer("axpy", "Axpy", ["a", "x", "y"])], {"a": (1, 2, 3, 3), "x": (1, 2, 3, 3), "y": (1, 2, 3, 3)})
    _, model = write_net_files(tmp_path, message)
    assert_error(invoke("run", model), 3, "bottom 0 (1, 2, 3, 3) must be (N, C, 1, 1)")


# -- an ENet-shaped net, end to end -----------------------------------------------------------


def _conv(name, bottom, cin, cout, kernel, pad, seed, dilation=1, stride=1):
    rng = _rng(seed)
    return layer(name, "Convolution", bottom,
                 blobs=[rng.standard_normal((cout, cin) + kernel) * 0.3, rng.standard_normal(cout) * 0.1],
                 convolution_param={"num_output": cout, "kernel_h": kernel[0], "kernel_w": kernel[1],
                                    "pad_h": pad[0], "pad_w": pad[1], "dilation": [dilation],
                                    "stride_h": stride, "stride_w": stride})


def _prelu(name, bottom, c, seed):
    return layer(name, "PReLU", bottom, blobs=[0.25 + 0.1 * _rng(seed).standard_normal(c)])


def enet_shaped():
    """ENet's bottleneck pattern: an initial block, a downsampling bottleneck keeping its pooling's mask,
    dilated and asymmetric convolutions, BN and PReLU after each, and the upsampling bottleneck unpooling by the mask."""
    return net([
        _conv("init_conv", "data", 3, 13, (3, 3), (1, 1), 1, stride=2),
        layer("init_pool", "Pooling", "data", pooling_param={"pool": MAX, "kernel_size": 2, "stride": 2}),
        layer("init", "Concat", ["init_conv", "init_pool"]),
        _bn("init_bn", "init", 16, INFERENCE, 2), _prelu("init_prelu", "init_bn", 16, 3),
        # downsampling bottleneck: the main branch pools with its mask
        layer("down_pool", "Pooling", "init_prelu", ["down_pool", "down_mask"],
              pooling_param={"pool": MAX, "kernel_size": 2, "stride": 2}),
        _conv("down_conv", "init_prelu", 16, 16, (2, 2), (0, 0), 4, stride=2),
        _bn("down_bn", "down_conv", 16, INFERENCE, 5), _prelu("down_prelu", "down_bn", 16, 6),
        _conv("dilated", "down_prelu", 16, 16, (3, 3), (2, 2), 7, dilation=2),
        _bn("dilated_bn", "dilated", 16, INFERENCE, 8), _prelu("dilated_prelu", "dilated_bn", 16, 9),
        _conv("asym_a", "dilated_prelu", 16, 16, (5, 1), (2, 0), 10),
        _conv("asym_b", "asym_a", 16, 16, (1, 5), (0, 2), 11),
        _bn("asym_bn", "asym_b", 16, LEARN, 12), _prelu("asym_prelu", "asym_bn", 16, 13),
        layer("merged", "Eltwise", ["asym_prelu", "down_pool"]),
        # upsampling bottleneck: unpool by the downsampling's mask
        layer("unpool", "Upsample", ["merged", "down_mask"], upsample_param={"scale": 2}),
        _conv("up_conv", "init_prelu", 16, 16, (1, 1), (0, 0), 14),
        layer("up_sum", "Eltwise", ["unpool", "up_conv"]),
        _conv("classes", "up_sum", 16, 5, (1, 1), (0, 0), 15),
    ], {"data": (2, 3, 16, 20)}, name="enet_shaped")


def test_an_enet_shaped_net_runs_and_exports(tmp_path):
    message = enet_shaped()
    x = _rng(16).standard_normal((2, 3, 16, 20)).astype(np.float32)
    ran = run_and_export(tmp_path, message, {"data": x})
    assert ran["classes"].shape == (2, 5, 8, 10)
    ours = ours_forward(message, {"data": x})
    np.testing.assert_array_equal(ran["unpool"], unpool_loops(ours["merged"], ours["down_mask"], 8, 10))
    _, model = write_net_files(tmp_path, message)
    shown = ok("info", "--layers", model).stdout
    assert "BN (caffe-segnet)" in shown and "Upsample (caffe-segnet)" in shown
    record = one_json(ok("info", "--layers", "--json", model))
    assert record["forks"]["unpool"] == "caffe-segnet" and "init_conv" not in record["forks"]


# -- the forks' parameter messages, read only in layers of their type -------------------------


def test_the_forks_numbers_are_read_only_in_layers_of_their_type(tmp_path):
    from builders import len_field, varint_field

    # bn_param (45) bn_mode INFERENCE, roi_pooling_param (8266711) pooled_h 2, psroi_pooling_param (10001)
    # output_dim 3, reorg_param (159) stride 2: in a Convolution layer another fork's fields, not understood.
    fields = {45: varint_field(3, 1), 8266711: varint_field(1, 2), 10001: varint_field(2, 3), 159: varint_field(1, 2)}
    conv = layer("conv1", "Convolution", "data", blobs=[np.ones((1, 1, 1, 1)), np.zeros(1)],
                 convolution_param={"num_output": 1, "kernel_size": [1]})
    raw = net([], {"data": (1, 1, 2, 2)}).SerializeToString()
    raw += len_field(100, conv.SerializeToString() + b"".join(len_field(k, v) for k, v in fields.items()))
    owners = {45: ("BN", "conv1", [np.ones((1, 1, 1, 1)), np.zeros((1, 1, 1, 1))]),
              8266711: ("ROIPooling", ["conv1", "rois"], []), 10001: ("PSROIPooling", ["conv1", "rois"], []),
              159: ("Reorg", "conv1", [])}
    for number, (kind, bottoms, blobs) in owners.items():
        own = layer(f"l{number}", kind, bottoms, blobs=blobs).SerializeToString() + len_field(number, fields[number])
        raw += len_field(100, own)
    path = tmp_path / "forks.caffemodel"
    path.write_bytes(raw)
    record = one_json(ok("info", "--layers", "--json", path))
    assert sorted(record["unknown_fields"]["conv1"], key=int) == ["45", "159", "10001", "8266711"]
    assert set(record["unknown_fields"]) == {"conv1"}
    defs = {d["name"]: d for d in record["layer_defs"]}
    assert defs["l45"]["bn_param"] == {"bn_mode": "INFERENCE"}
    assert defs["l8266711"]["roi_pooling_param"] == {"pooled_h": 2}
    assert defs["l10001"]["psroi_pooling_param"] == {"output_dim": 3}
    assert defs["l159"]["reorg_param"] == {"stride": 2}
    assert record["forks"] == {"l45": "caffe-segnet", "l8266711": "caffe-fast-rcnn", "l10001": "R-FCN",
                               "l159": "YOLOv2"}
    assert not any(k.endswith("_param") and k != "convolution_param" for k in defs["conv1"])


def test_segnets_upsample_param_under_137_is_read_in_an_upsample_layer(tmp_path):
    from builders import len_field, varint_field

    # caffe-segnet numbers UpsampleParameter 137 (BVLC's embed_param): upsample_h 6 (field 6), upsample_w 4 (7).
    settings = len_field(137, varint_field(6, 6) + varint_field(7, 4))
    pool = layer("pool", "Pooling", "data", ["pool", "mask"], pooling_param={"pool": MAX, "kernel_size": 2,
                                                                            "stride": 2})
    raw = net([], {"data": (1, 2, 6, 4)}).SerializeToString() + len_field(100, pool.SerializeToString())
    raw += len_field(100, layer("unpool", "Upsample", ["pool", "mask"]).SerializeToString() + settings)
    path = tmp_path / "segnet.caffemodel"
    path.write_bytes(raw)
    record = one_json(ok("info", "--layers", "--json", path))
    assert record["layer_defs"][1]["upsample_param"] == {"upsample_h": 6, "upsample_w": 4}
    assert "unknown_fields" not in record
    x = _rng(10).standard_normal((1, 2, 6, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    ok("run", path, "--input", f"data={tmp_path / 'x.npy'}", "--outputs", "pool,mask,unpool", "-o", tmp_path / "o.npz")
    got = np.load(tmp_path / "o.npz")
    np.testing.assert_array_equal(got["unpool"], unpool_loops(got["pool"], got["mask"], 6, 4))
