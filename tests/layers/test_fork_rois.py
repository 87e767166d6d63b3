"""The forks' ROI and reorganizing layers: Fast R-CNN's ROIPooling, R-FCN's PSROIPooling, YOLOv2's Reorg.

Two oracles each, as real Caffe lacks them: a loop-by-loop definition
written here from the fork's own forward, and OpenCV 4.x, whose Caffe
importer runs all three:

- ROIPooling: rbgirshick/caffe-fast-rcnn, src/caffe/layers/roi_pooling_layer.cpp
  (Forward_cpu);
- PSROIPooling: daijifeng001/caffe-rfcn, src/caffe/layers/psroi_pooling_layer.cu
  (PSROIPoolingForward: the fork's Forward_cpu is NOT_IMPLEMENTED);
- Reorg: gklz1982/caffe-yolov2, src/caffe/layers/reorg_layer.cpp, which calls
  darknet's reorg_cpu (transcribed below) with the bottom's own sizes.
  OpenCV's importer reads no stride from the net (it runs stride 2, as
  YOLOv2's passthrough has it), so it is the oracle at stride 2 only.

Every export runs in onnxruntime and equals `run` blob by blob: ROIPooling
as MaxRoiPool (onnxruntime's rounding is Fast R-CNN's: equal to the bit
here), PSROIPooling from a summed-area table in double (its sums in
another order: within 1e-6), Reorg as Reshape, Transpose, Reshape.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from caffenets import layer, max_scaled_difference, net, opencv_forward, ours_forward, run_and_export, write_net_files
from runner import assert_error, invoke

FLT_MAX = float(np.finfo(np.float32).max)
F = np.float32


def c_round(x: float) -> float:
    """C's round: half away from zero."""
    return math.copysign(math.floor(abs(x) + 0.5), x)


def roi_pooling_loops(x, rois, pooled_h, pooled_w, spatial_scale):
    """caffe-fast-rcnn's ROIPoolingLayer::Forward_cpu, element by element (float arithmetic as float32)."""
    n, c, height, width = x.shape
    rois = rois.reshape(-1, 5)
    top = np.full((len(rois), c, pooled_h, pooled_w), -FLT_MAX, np.float32)
    scale = F(spatial_scale)
    for r, roi in enumerate(rois):
        b = int(roi[0])
        start_w, start_h = int(c_round(F(roi[1]) * scale)), int(c_round(F(roi[2]) * scale))
        end_w, end_h = int(c_round(F(roi[3]) * scale)), int(c_round(F(roi[4]) * scale))
        roi_height, roi_width = max(end_h - start_h + 1, 1), max(end_w - start_w + 1, 1)
        bin_h, bin_w = F(roi_height) / F(pooled_h), F(roi_width) / F(pooled_w)
        for ch in range(c):
            for ph in range(pooled_h):
                for pw in range(pooled_w):
                    hstart = min(max(int(math.floor(F(ph) * bin_h)) + start_h, 0), height)
                    hend = min(max(int(math.ceil(F(ph + 1) * bin_h)) + start_h, 0), height)
                    wstart = min(max(int(math.floor(F(pw) * bin_w)) + start_w, 0), width)
                    wend = min(max(int(math.ceil(F(pw + 1) * bin_w)) + start_w, 0), width)
                    if hend <= hstart or wend <= wstart:
                        top[r, ch, ph, pw] = 0
                    for h in range(hstart, hend):
                        for w in range(wstart, wend):
                            if x[b, ch, h, w] > top[r, ch, ph, pw]:
                                top[r, ch, ph, pw] = x[b, ch, h, w]
    return top


def psroi_pooling_loops(x, rois, output_dim, group, spatial_scale):
    """caffe-rfcn's PSROIPoolingForward, one output element at a time (float arithmetic as float32)."""
    n, c, height, width = x.shape
    rois = rois.reshape(-1, 5)
    top = np.zeros((len(rois), output_dim, group, group), np.float32)
    scale = F(spatial_scale)
    for r, roi in enumerate(rois):
        b = int(roi[0])
        start_w, start_h = F(c_round(roi[1])) * scale, F(c_round(roi[2])) * scale
        end_w, end_h = F(c_round(roi[3]) + 1.0) * scale, F(c_round(roi[4]) + 1.0) * scale
        roi_width, roi_height = F(max(float(end_w - start_w), 0.1)), F(max(float(end_h - start_h), 0.1))
        bin_h, bin_w = roi_height / F(group), roi_width / F(group)
        for ctop in range(output_dim):
            for ph in range(group):
                for pw in range(group):
                    hstart = min(max(int(math.floor(F(ph) * bin_h + start_h)), 0), height)
                    wstart = min(max(int(math.floor(F(pw) * bin_w + start_w)), 0), width)
                    hend = min(max(int(math.ceil(F(ph + 1) * bin_h + start_h)), 0), height)
                    wend = min(max(int(math.ceil(F(pw + 1) * bin_w + start_w)), 0), width)
                    ch = (ctop * group + ph) * group + pw
                    total = F(0)
                    for h in range(hstart, hend):
                        for w in range(wstart, wend):
                            total = F(total + x[b, ch, h, w])
                    area = F((hend - hstart) * (wend - wstart))
                    top[r, ctop, ph, pw] = 0 if (hend <= hstart or wend <= wstart) else total / area
    return top


def reorg_loops(x, stride, reverse):
    """darknet's reorg_cpu(x, w, h, c, batch, stride, forward=reverse, out) with the bottom's sizes."""
    batch, c, h, w = x.shape
    flat = x.reshape(-1)
    out = np.empty_like(flat)
    out_c = c // (stride * stride)
    for b in range(batch):
        for k in range(c):
            for j in range(h):
                for i in range(w):
                    in_index = i + w * (j + h * (k + c * b))
                    c2, offset = k % out_c, k // out_c
                    w2, h2 = i * stride + offset % stride, j * stride + offset // stride
                    out_index = w2 + w * stride * (h2 + h * stride * (c2 + out_c * b))
                    if reverse:
                        out[out_index] = flat[in_index]
                    else:
                        out[in_index] = flat[out_index]
    return out


# ROIs in image coordinates (batch index, x1, y1, x2, y2): inside, past the edges, one pixel, halves
# that C's round takes away from zero, a negative corner, a reversed box.
ROIS = np.array([[0, 1, 2, 10.5, 20],
                 [1, -3, 0.5, 6, 7],
                 [1, 2.5, 2.5, 2.5, 2.5],
                 [0, 0, 0, 30, 30],
                 [1, 5, 9, 1, 3],
                 [0, 3.5, -1.5, 7.5, 13.5]], np.float32)


def _feeds(shape, seed=0):
    return {"data": np.random.default_rng(seed).standard_normal(shape).astype(np.float32), "rois": ROIS}


def _opencv(tmp_path, message, feeds, top):
    prototxt, model = write_net_files(tmp_path, message, stem="cv")
    return opencv_forward(prototxt, model, feeds, [top])[top]


@pytest.mark.parametrize("pooled, scale", [((3, 2), 0.5), ((2, 2), 1.0), ((4, 3), 0.25)])
def test_roi_pooling_is_fast_rcnns_loop_and_opencvs(tmp_path, pooled, scale):
    feeds = _feeds((2, 3, 12, 10))
    message = net([layer("roi", "ROIPooling", ["data", "rois"],
                         roi_pooling_param={"pooled_h": pooled[0], "pooled_w": pooled[1], "spatial_scale": scale})],
                  {"data": (2, 3, 12, 10), "rois": ROIS.shape})
    ours = ours_forward(message, feeds)["roi"]
    np.testing.assert_array_equal(ours, roi_pooling_loops(feeds["data"], ROIS, *pooled, scale))
    np.testing.assert_array_equal(ours, _opencv(tmp_path, message, feeds, "roi").reshape(ours.shape))
    ran = run_and_export(tmp_path, message, feeds)
    np.testing.assert_array_equal(ran["roi"], ours)


@pytest.mark.parametrize("output_dim, group, scale", [(2, 2, 0.5), (1, 3, 1.0), (3, 2, 0.25)])
def test_psroi_pooling_is_rfcns_kernel_and_opencvs(tmp_path, output_dim, group, scale):
    shape = (2, output_dim * group * group, 12, 10)
    feeds = _feeds(shape, seed=1)
    message = net([layer("ps", "PSROIPooling", ["data", "rois"], psroi_pooling_param={
        "spatial_scale": scale, "output_dim": output_dim, "group_size": group})], {"data": shape, "rois": ROIS.shape})
    ours = ours_forward(message, feeds)["ps"]
    assert max_scaled_difference(ours, psroi_pooling_loops(feeds["data"], ROIS, output_dim, group, scale)) <= 1e-6
    assert max_scaled_difference(ours, _opencv(tmp_path, message, feeds, "ps").reshape(ours.shape)) <= 1e-6
    run_and_export(tmp_path, message, feeds)


@pytest.mark.parametrize("stride, shape", [(2, (2, 8, 6, 4)), (3, (1, 9, 6, 9))])
def test_reorg_is_darknets_loop_and_opencvs(tmp_path, stride, shape):
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    message = net([layer("reorg", "Reorg", "data", reorg_param={"stride": stride})], {"data": shape})
    ours = ours_forward(message, {"data": x})["reorg"]
    n, c, h, w = shape
    assert ours.shape == (n, c * stride * stride, h // stride, w // stride)
    np.testing.assert_array_equal(ours.reshape(-1), reorg_loops(x, stride, reverse=False))
    if stride == 2:
        # OpenCV's importer takes no stride from the net (its Reorg is stride 2 whatever reorg_param says).
        np.testing.assert_array_equal(ours, _opencv(tmp_path, message, {"data": x}, "reorg").reshape(ours.shape))
    run_and_export(tmp_path, message, {"data": x})


def test_reverse_reorg_is_darknets_loop(tmp_path):
    x = np.random.default_rng(3).standard_normal((2, 8, 3, 5)).astype(np.float32)
    message = net([layer("reorg", "Reorg", "data", reorg_param={"stride": 2, "reverse": True})], {"data": x.shape})
    ours = ours_forward(message, {"data": x})["reorg"]
    assert ours.shape == (2, 2, 6, 10)
    np.testing.assert_array_equal(ours.reshape(-1), reorg_loops(x, 2, reverse=True))
    run_and_export(tmp_path, message, {"data": x})


@pytest.mark.parametrize("layers, inputs, why", [
    ([layer("roi", "ROIPooling", ["data", "rois"], roi_pooling_param={"pooled_h": 2, "pooled_w": 2})],
     {"data": (1, 2, 4, 4), "rois": (2, 4)}, "bottom 1 (2, 4) must hold 5 values per ROI"),
    ([layer("roi", "ROIPooling", ["data", "rois"], roi_pooling_param={"pooled_h": 0, "pooled_w": 2})],
     {"data": (1, 2, 4, 4), "rois": (2, 5)}, "pooled_h 0 and pooled_w 2 must be > 0"),
    ([layer("ps", "PSROIPooling", ["data", "rois"], psroi_pooling_param={"output_dim": 2, "group_size": 2,
                                                                       "spatial_scale": 1})],
     {"data": (1, 6, 4, 4), "rois": (2, 5)}, "the bottom has 6 channels; output_dim 2 x group_size 2^2 is 8"),
    ([layer("reorg", "Reorg", "data", reorg_param={"stride": 2})], {"data": (1, 4, 5, 4)},
     "height 5 and width 4 must be multiples of the stride 2"),
    ([layer("reorg", "Reorg", "data")], {"data": (1, 4, 4, 4)}, "needs reorg_param.stride"),
], ids=["roi-shape", "pooled", "ps-channels", "reorg-size", "reorg-stride"])
def test_settings_the_forks_refuse_are_refused(tmp_path, layers, inputs, why):
    _, model = write_net_files(tmp_path, net(layers, inputs))
    assert_error(invoke("run", model), 3, why)


def test_a_roi_of_an_image_the_batch_lacks_is_refused(tmp_path):
    message = net([layer("roi", "ROIPooling", ["data", "rois"], roi_pooling_param={"pooled_h": 2, "pooled_w": 2})],
                  {"data": (1, 2, 4, 4), "rois": (1, 5)})
    _, model = write_net_files(tmp_path, message)
    np.save(tmp_path / "r.npy", np.array([[1, 0, 0, 2, 2]], np.float32))
    assert_error(invoke("run", model, "--input", f"rois={tmp_path / 'r.npy'}"), 3,
                 "a ROI's batch index is 1; the bottom holds images 0 to 0")


@pytest.mark.parametrize("kind, param", [
    ("ROIPooling", {"roi_pooling_param": {"pooled_h": 2, "pooled_w": 2}}),
    ("PSROIPooling", {"psroi_pooling_param": {"output_dim": 1, "group_size": 1, "spatial_scale": 1}}),
])
def test_a_corner_caffe_cannot_make_an_int_is_refused(tmp_path, kind, param):
    message = net([layer("r", kind, ["data", "rois"], **param)], {"data": (1, 1, 3, 3), "rois": (1, 5)})
    _, model = write_net_files(tmp_path, message)
    np.save(tmp_path / "r.npy", np.array([[0, 1, np.nan, 2, 2]], np.float32))
    assert_error(invoke("run", model, "--input", f"rois={tmp_path / 'r.npy'}"), 3,
                 f"layer 'r' ({kind}): a ROI corner scaled by spatial_scale is nan")
