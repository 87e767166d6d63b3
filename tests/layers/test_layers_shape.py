"""The layers that move values, SSD's PriorBox and DetectionOutput, and the forks' ShuffleChannel, Upsample and Interp.

Every case is a small net (tests/helpers/caffenets.py) run by blobtool and by an
oracle, compared on every blob it makes. The oracle of each layer type:

- real Caffe (BVLC plus caffe-ssd's layers, tests/helpers/caffeoracle.py; the
  `caffe` marker), within 1e-5 of the largest magnitude of Caffe's blob:
  Concat (concat_dim too), Slice (slice_dim, equal pieces, one top), Split, Flatten, Reshape, Crop, Tile, Permute (partial orders too),
  PriorBox (every option), DetectionOutput (every option: its rows equal
  caffe-ssd's row for row, in its order; see `assert_detections`) and the
  generated SSD heads (Normalize, Permute, Flatten, Concat, PriorBox,
  Softmax and DetectionOutput together); and the refusals: for each net
  blobtool refuses of a type Caffe has, Caffe refuses it too, its CHECK
  line beside blobtool's message (`test_caffe_refuses_what_blobtool_refuses`);
- OpenCV 4.x's Caffe importer (max_scaled_difference <= 1e-4), for the
  forks' layers this Caffe lacks: ShuffleChannel (4-D) and Interp (zoom and
  size);
- loop-by-loop definitions below, written from the fork's source named in
  each docstring, where neither has the case: Upsample (OpenCV has no such
  type), ShuffleChannel below 4-D (OpenCV takes 4-D only) and Interp's
  pad_beg / pad_end, shrink_factor, second bottom and nearest_neighbor
  (OpenCV ignores or refuses them).

Where OpenCV 4.x, the oracle before, departs from Caffe on the layers Caffe
now checks (measured with opencv-python-headless 4.14): Concat's concat_dim
and Slice's slice_dim are not read; Slice into equal pieces or one top,
Reshape's negative axis, Flatten's end_axis one before axis and a Permute
order not naming every axis are refused; a 1-D blob comes back as (n, 1);
Tile reads no tile_param; PriorBox clips unless clip is given false, ignores
img_size / img_h / img_w, uses fractional min_size and max_size as they are
(caffe-ssd reads them into an int) and needs variance given;
DetectionOutput needs background_label_id, share_location and keep_top_k
given, ignores eta, knows no CORNER_SIZE, refuses
variance_encoded_in_target, orders its rows by score (caffe-ssd: by label,
then score), pads them with zero rows to keep_top_k and gives zero rows for
caffe-ssd's -1 row when nothing is detected.

Where blobtool and this Caffe part (each a test below): a Slice whose last
piece is empty (a slice point at the axis's end), which Caffe's forward
cannot run and blobtool does (expected to fail until blobtool refuses it);
DetectionOutput's background_label_id -1 with shared boxes, where Caffe's
CPU forward dies and blobtool computes what its GPU forward computes; and
the order of equal scores after keep_top_k, which caffe-ssd leaves to
std::sort (compared as a set).

The inputs are random (seeded): no realworld file is read here.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from blobtool.layers import LayerError
from caffenets import against_opencv as opencv_against
from caffenets import layer, net, ours_forward, random_feeds, tops_of, write_net_files
from runner import assert_error, invoke
from caffeoracle import against_caffe as caffe_against
from caffeoracle import caffe_refusal, caffe_refusals, caffe_values
from ssdcases import (CAFFE_TOLERANCE, CENTER_SIZE, CORNER, CORNER_SIZE, DETECTION, TOLERANCE, assert_close,
                      assert_detections, caffe_row_order, detection_case, detection_params, ssd_head)



# -- running a case ----------------------------------------------------------------------------------

def feeds_for(inputs: dict, seed: int = 0) -> dict:
    """The sweeps' inputs: standard normal (caffenets.random_feeds)."""
    return random_feeds(inputs, seed)




def against_caffe(tmp_path, layers, inputs: dict, feeds: dict | None = None, *, detections=()) -> dict:
    """caffeoracle.against_caffe within CAFFE_TOLERANCE; blobtool's values back.

    The blobs named in `detections` are DetectionOutput tops, compared row
    for row by `assert_detections`.
    """
    return caffe_against(tmp_path, layers, feeds if feeds is not None else feeds_for(inputs),
                         tolerance=CAFFE_TOLERANCE, compare=dict.fromkeys(detections, assert_detections))


def check_opencv(layers, inputs: dict, feeds: dict | None = None) -> dict:
    """caffenets.against_opencv within TOLERANCE."""
    return opencv_against(layers, inputs, feeds if feeds is not None else feeds_for(inputs), tolerance=TOLERANCE)


def check_loops(layers, inputs: dict, reference, feeds: dict | None = None) -> dict:
    """Run the net by blobtool; `reference(feeds)` gives every top's value by the fork's loops."""
    message = net(layers, inputs)
    feeds = feeds if feeds is not None else feeds_for(inputs)
    ours = ours_forward(message, feeds)
    expected = reference(feeds)
    assert set(expected) == set(tops_of(layers))
    for top, value in expected.items():
        assert_close(top, ours[top], np.asarray(value, np.float32))
    return ours






# -- the forks' loops (layers this Caffe lacks) ----------------------------------------------------------

def shuffle_loops(x, group):
    """ShuffleChannelLayer::Resize_cpu (shuffle_channel_layer.cpp): block (i, j) of (group, C / group) to (j, i).

    The top is 4-D, as the layer's Reshape makes it.
    """
    shape = x.shape + (1,) * (4 - x.ndim)
    num, chs = shape[:2]
    size = shape[2] * shape[3]
    rows, cols = group, chs // group
    flat, top = x.reshape(num, chs * size), np.empty((num, chs * size), np.float32)
    for n in range(num):
        for i in range(rows):
            for j in range(cols):
                top[n, (j * rows + i) * size:(j * rows + i + 1) * size] = flat[n, (i * cols + j) * size:
                                                                               (i * cols + j + 1) * size]
    return top.reshape(shape)


def upsample_loops(x, scale):
    """The YOLOv3 ports' UpsampleLayer::Forward_cpu (eric612/MobileNet-YOLO upsample_layer.cpp)."""
    n_, c_, h_, w_ = x.shape[0], x.shape[1], x.shape[2] * scale, x.shape[3] * scale
    top = np.empty((n_, c_, h_, w_), np.float32)
    for h in range(h_):
        for w in range(w_):
            top[:, :, h, w] = x[:, :, h // scale, w // scale]
    return top


def interp_loops(x, pad_beg, pad_end, height2, width2, nearest=False):
    """PSPNet's caffe_cpu_interp2 / caffe_cpu_nninterp2 (util/interp.cpp), x1 = y1 = -pad_beg, in float."""
    num, chs, big_h, big_w = x.shape
    height1, width1 = big_h + pad_beg + pad_end, big_w + pad_beg + pad_end
    y1 = x1 = -pad_beg
    data = x.reshape(num * chs, big_h, big_w)
    top = np.empty((num * chs, height2, width2), np.float32)
    f32 = np.float32
    if height1 == height2 and width1 == width2:
        for h2 in range(height2):
            for w2 in range(width2):
                top[:, h2, w2] = data[:, y1 + h2, x1 + w2]
        return top.reshape(num, chs, height2, width2)
    rheight = f32(height1 - 1) / f32(height2 - 1) if height2 > 1 else f32(0)
    rwidth = f32(width1 - 1) / f32(width2 - 1) if width2 > 1 else f32(0)
    for h2 in range(height2):
        h1r = f32(rheight * f32(h2))
        for w2 in range(width2):
            w1r = f32(rwidth * f32(w2))
            if nearest:
                h1, w1 = math.floor(float(h1r) + 0.5), math.floor(float(w1r) + 0.5)
                top[:, h2, w2] = data[:, y1 + h1, x1 + w1]
                continue
            h1, w1 = int(h1r), int(w1r)
            h1p, w1p = (1 if h1 < height1 - 1 else 0), (1 if w1 < width1 - 1 else 0)
            h1l = f32(h1r - f32(h1))
            h0l = f32(1) - h1l
            w1l = f32(w1r - f32(w1))
            w0l = f32(1) - w1l
            p = data[:, y1 + h1:, x1 + w1:]
            top[:, h2, w2] = (h0l * (w0l * p[:, 0, 0] + w1l * p[:, 0, w1p])
                              + h1l * (w0l * p[:, h1p, 0] + w1l * p[:, h1p, w1p]))
    return top.reshape(num, chs, height2, width2)


# -- Concat, Slice, Split (Caffe) -----------------------------------------------------------------------

def _concat_inputs(shape, axis, sizes):
    axis = axis % len(shape)
    return {f"x{k}": tuple(n if j == axis else d for j, d in enumerate(shape)) for k, n in enumerate(sizes)}


CONCAT = [pytest.param(shape, axis, sizes, id=f"{len(shape)}d-axis{axis}-{'+'.join(map(str, sizes))}")
          for shape, axis, sizes in [
              ((2, 3, 5, 7), 1, (3, 1, 4)), ((2, 3, 5, 7), 2, (5, 2)), ((2, 3, 5, 7), 3, (7, 1, 3)),
              ((2, 3, 5, 7), 0, (2, 1)), ((2, 3, 5, 7), -1, (7, 4)), ((2, 3, 5, 7), -3, (1, 2, 3)),
              ((3, 5), 1, (5, 2, 9)), ((3, 5), 0, (3, 4)), ((3, 5, 7), 2, (7, 2)), ((2, 3, 5, 7), 1, (3,)),
              ((1, 3, 2, 2, 3), 4, (3, 1)), ((7,), 0, (7, 2, 1))]]


@pytest.mark.caffe
@pytest.mark.parametrize("shape, axis, sizes", CONCAT)
def test_concat(tmp_path, shape, axis, sizes):
    inputs = _concat_inputs(shape, axis, sizes)
    against_caffe(tmp_path, [layer("cat", "Concat", list(inputs), concat_param={"axis": axis})], inputs)


@pytest.mark.caffe
@pytest.mark.parametrize("concat_dim, sizes", [(0, (2, 1, 3)), (1, (3, 4)), (2, (5, 1)), (3, (7, 2))],
                         ids=lambda v: str(v))
def test_concat_legacy_concat_dim(tmp_path, concat_dim, sizes):
    inputs = _concat_inputs((2, 3, 5, 7), concat_dim, sizes)
    against_caffe(tmp_path, [layer("cat", "Concat", list(inputs), concat_param={"concat_dim": concat_dim})], inputs)


SLICE = [pytest.param(params, ntops, id=name) for name, params, ntops in [
    ("axis1-at1", {"axis": 1, "slice_point": [1]}, 2),
    ("axis1-at2-3", {"axis": 1, "slice_point": [2, 3]}, 3),
    ("axis2-at4", {"axis": 2, "slice_point": [4]}, 2),
    ("axis2-at1-2-5", {"axis": 2, "slice_point": [1, 2, 5]}, 4),
    ("axis3-at1-4", {"axis": 3, "slice_point": [1, 4]}, 3),
    ("axis0-at1", {"axis": 0, "slice_point": [1]}, 2),
    ("axis-1-at1-3", {"axis": -1, "slice_point": [1, 3]}, 3),
    ("axis-3-at2", {"axis": -3, "slice_point": [2]}, 2),
    ("axis-4-at2", {"axis": -4, "slice_point": [2]}, 2),
    ("equal-thirds-axis2", {"axis": 2}, 3),
    ("equal-fifths-last-axis", {"axis": -1}, 5),
    ("one-top", {}, 1),
    ("slice_dim0", {"slice_dim": 0, "slice_point": [1]}, 2),
    ("slice_dim2", {"slice_dim": 2, "slice_point": [2, 8]}, 3),
    ("slice_dim1-equal", {"slice_dim": 1}, 2),
]]


@pytest.mark.caffe
@pytest.mark.parametrize("params, ntops", SLICE)
def test_slice(tmp_path, params, ntops):
    tops = [f"s{k}" for k in range(ntops)]
    against_caffe(tmp_path, [layer("cut", "Slice", "x", tops, slice_param=params)], {"x": (3, 4, 9, 5)})


@pytest.mark.caffe
def test_slice_with_an_empty_piece_is_refused_as_caffe_refuses_it(tmp_path):
    """A slice point at the end of the axis leaves the last top empty: Caffe's forward dies on it.

    Blob::Reshape allocates no memory for a count of 0, and
    SliceLayer::Forward_cpu asks every top for its mutable_cpu_data, whose
    CHECK(data_) fails (blob.cpp): Caffe cannot run such a net.
    """
    layers = [layer("cut", "Slice", "x", ["s0", "s1"], slice_param={"axis": 1, "slice_point": [4]})]
    inputs = {"x": (3, 4, 9, 5)}
    refusal = caffe_refusal(net(layers, inputs), feeds_for(inputs), tmp_path)
    assert refusal is not None and "blob.cpp:115] Check failed: data_" in refusal.line, refusal
    # blobtool's run refuses it before computing (its shape pass allows it, as Caffe's Reshape does).
    _, model = write_net_files(tmp_path, net(layers, inputs))
    assert_error(invoke("run", model), 3, "layer 'cut' (Slice) gives blob 's1' of shape (3, 0, 9, 5), which holds "
                                          "no values", "Check failed: data_")


@pytest.mark.caffe
@pytest.mark.parametrize("ntops", [1, 2, 4])
def test_split(tmp_path, ntops):
    tops = [f"copy{k}" for k in range(ntops)]
    against_caffe(tmp_path, [layer("fan", "Split", "x", tops), layer("cat", "Concat", tops, concat_param={"axis": 2})],
                  {"x": (2, 3, 5, 7)})


# -- Flatten, Reshape (Caffe) ---------------------------------------------------------------------------

FLATTEN = [pytest.param(axis, end, id=f"axis{axis}-end{end}")
           for axis, end in [(1, -1), (2, 3), (0, 1), (1, 2), (-2, -1), (0, -1), (3, 3), (1, 1), (0, 2), (-3, -2),
                             (2, 1), (1, 0), (-1, -2)]]


@pytest.mark.caffe
@pytest.mark.parametrize("axis, end", FLATTEN)
def test_flatten(tmp_path, axis, end):
    # (2, 1), (1, 0), (-1, -2): end_axis one before axis, which inserts an axis of 1 (flatten_layer.cpp:
    # count(axis, end_axis + 1) is 1).
    against_caffe(tmp_path, [layer("flat", "Flatten", "x", flatten_param={"axis": axis, "end_axis": end})],
                  {"x": (2, 3, 5, 7)})


RESHAPE = [pytest.param(dims, axis, num_axes, id=f"{'x'.join(map(str, dims))}-axis{axis}-n{num_axes}")
           for dims, axis, num_axes in [
               ([0, -1], 0, -1), ([-1], 0, -1), ([2, 0, -1], 0, -1), ([5, -1], 1, 2), ([3, 5], 1, 1),
               ([0, 0, 0, 0], 0, -1), ([-1, 7], 2, -1), ([1, -1], 0, 1), ([0, 5, -1], 1, -1), ([-1, 3, 5], 1, 1),
               ([1, 1, 0, -1], 0, -1), ([7, 5, 3, 10], 0, -1), ([-1, 1], 3, 1), ([1, 1], -1, 0), ([-1, 1], -2, -1),
               ([0, -1], -3, 2), ([1], 2, 0), ([], 1, 0), ([-1], 1, 3)]]


@pytest.mark.caffe
@pytest.mark.parametrize("dims, axis, num_axes", RESHAPE)
def test_reshape(tmp_path, dims, axis, num_axes):
    # Negative axes count from after the last axis (reshape_layer.cpp: axis -1 appends).
    against_caffe(tmp_path, [layer("shaped", "Reshape", "x", reshape_param={"shape": {"dim": dims}, "axis": axis,
                                                                            "num_axes": num_axes})],
                  {"x": (2, 15, 5, 7)})


@pytest.mark.caffe
@pytest.mark.parametrize("kind, params, shape", [
    pytest.param("Flatten", {"flatten_param": {"axis": 0, "end_axis": -1}}, (210,), id="flatten-all"),
    pytest.param("Flatten", {}, (2, 105), id="flatten-defaults"),
    pytest.param("Reshape", {"reshape_param": {"shape": {"dim": [-1]}}}, (210,), id="reshape-1d"),
    pytest.param("Reshape", {"reshape_param": {"shape": {"dim": [1]}, "axis": 2, "num_axes": 0}}, (2, 3, 1, 5, 7),
                 id="reshape-insert-axis"),
])
def test_shape_of_a_flatten_or_reshape(tmp_path, kind, params, shape):
    values = against_caffe(tmp_path, [layer("out", kind, "x", **params)], {"x": (2, 3, 5, 7)})
    assert values["out"].shape == shape


@pytest.mark.caffe
def test_reshape_of_a_1d_blob(tmp_path):
    against_caffe(tmp_path, [layer("a", "Reshape", "x", reshape_param={"shape": {"dim": [5, -1]}}),
                             layer("b", "Flatten", "a", flatten_param={"axis": 0}),
                             layer("c", "Reshape", "b", reshape_param={"shape": {"dim": [1, 1]}, "axis": 0,
                                                                       "num_axes": 0})], {"x": (30,)})


# -- Crop, Tile, Permute (Caffe) ------------------------------------------------------------------------

CROP = [pytest.param(axis, offsets, id=f"axis{axis}-off{'-'.join(map(str, offsets)) or 'none'}")
        for axis, offsets in [(2, []), (2, [1]), (2, [1, 3]), (1, [1, 0, 2]), (3, [4]), (-1, [3]), (-2, [2, 0]),
                              (0, [0, 1, 2, 3]), (0, []), (1, [2]), (2, [4, 4])]]


@pytest.mark.caffe
@pytest.mark.parametrize("axis, offsets", CROP)
def test_crop(tmp_path, axis, offsets):
    against_caffe(tmp_path, [layer("cropped", "Crop", ["x", "reference"],
                                   crop_param={"axis": axis, "offset": offsets})],
                  {"x": (3, 4, 7, 9), "reference": (2, 2, 3, 5)})


@pytest.mark.caffe
def test_crop_of_a_3d_blob_by_a_5d_one(tmp_path):
    # Only the axes from `axis` on are cropped; the second bottom may have more axes than the first's.
    against_caffe(tmp_path, [layer("cropped", "Crop", ["x", "reference"], crop_param={"axis": 1, "offset": [1, 2]})],
                  {"x": (2, 5, 6), "reference": (1, 3, 2, 4, 4)})


@pytest.mark.caffe
@pytest.mark.parametrize("axis, tiles", list(itertools.product([0, 1, 2, 3, -1, -4], [1, 2, 3])),
                         ids=lambda v: str(v))
def test_tile(tmp_path, axis, tiles):
    against_caffe(tmp_path, [layer("tiled", "Tile", "x", tile_param={"axis": axis, "tiles": tiles})],
                  {"x": (2, 3, 5, 1)})


@pytest.mark.caffe
@pytest.mark.parametrize("shape, axis, tiles", [((5,), 0, 4), ((2, 3), 1, 7), ((1, 2, 3, 2, 2), 3, 2)],
                         ids=lambda v: str(v))
def test_tile_other_ranks(tmp_path, shape, axis, tiles):
    against_caffe(tmp_path, [layer("tiled", "Tile", "x", tile_param={"axis": axis, "tiles": tiles})], {"x": shape})


PERMUTE_4D = [pytest.param(list(order), id="order" + "".join(map(str, order)))
              for order in itertools.permutations(range(4))]


@pytest.mark.caffe
@pytest.mark.parametrize("order", PERMUTE_4D)
def test_permute(tmp_path, order):
    against_caffe(tmp_path, [layer("moved", "Permute", "x", permute_param={"order": order})], {"x": (2, 3, 5, 7)})


@pytest.mark.caffe
@pytest.mark.parametrize("shape, order", [
    pytest.param((2, 3, 5), [0, 2, 1], id="3d"),
    pytest.param((2, 3, 5, 2, 3), [0, 2, 1, 4, 3], id="5d"),
    pytest.param((2, 3, 5, 7), [0, 2], id="first-two-named"),
    pytest.param((2, 3, 5, 7), [3], id="last-first"),
    pytest.param((2, 3, 5, 7), [], id="no-order"),
    pytest.param((3, 5, 7), [2, 0], id="3d-partial"),
    pytest.param((4, 6), [1], id="2d"),
    pytest.param((7,), [0], id="1d"),
])
def test_permute_other_ranks_and_partial_orders(tmp_path, shape, order):
    # A partial order names the axes that come first; the others follow in their order (permute_layer.cpp).
    against_caffe(tmp_path, [layer("moved", "Permute", "x", permute_param={"order": order})], {"x": shape})


# -- ShuffleChannel (OpenCV, and the fork's loops below 4-D) ---------------------------------------------------

@pytest.mark.parametrize("group, shape", [
    pytest.param(g, s, id=f"group{g}-{'x'.join(map(str, s))}")
    for g, s in [(1, (2, 6, 3, 5)), (2, (2, 6, 3, 5)), (3, (2, 6, 3, 5)), (6, (1, 6, 1, 1)), (4, (2, 12, 5, 3)),
                 (5, (3, 15, 1, 7))]])
def test_shuffle_channel(group, shape):
    # OpenCV: this Caffe has no ShuffleChannel (a fork's layer).
    check_opencv([layer("mixed", "ShuffleChannel", "x", shuffle_channel_param={"group": group})], {"x": shape})


@pytest.mark.parametrize("group, shape", [pytest.param(3, (2, 6), id="2d"), pytest.param(2, (2, 6, 5), id="3d")])
def test_shuffle_channel_below_4d(group, shape):
    # The fork's loops: the layer's Reshape makes the top 4-D; OpenCV takes 4-D bottoms only.
    check_loops([layer("mixed", "ShuffleChannel", "x", shuffle_channel_param={"group": group})], {"x": shape},
                lambda f: {"mixed": shuffle_loops(f["x"], group)})


# -- Upsample, Interp (the fork's loops, OpenCV) ----------------------------------------------------------------

@pytest.mark.parametrize("scale, shape", [
    pytest.param(s, shape, id=f"scale{s}-{'x'.join(map(str, shape))}")
    for s, shape in [(1, (2, 3, 5, 7)), (2, (2, 3, 5, 7)), (3, (1, 2, 3, 1)), (2, (1, 1, 1, 1)), (4, (2, 1, 3, 2))]])
def test_upsample(scale, shape):
    # The fork's loops: neither this Caffe nor OpenCV has an Upsample type.
    check_loops([layer("up", "Upsample", "x", upsample_param={"scale": scale})], {"x": shape},
                lambda f: {"up": upsample_loops(f["x"], scale)})


INTERP_OPENCV = [pytest.param(p, id="-".join(f"{k}{v}" for k, v in p.items())) for p in [
    {"zoom_factor": 1}, {"zoom_factor": 2}, {"zoom_factor": 3}, {"zoom_factor": 5},
    {"height": 7, "width": 4}, {"height": 1, "width": 1}, {"height": 3, "width": 5}, {"height": 11, "width": 13},
    {"height": 2, "width": 9}, {"height": 1, "width": 6}, {"height": 5, "width": 1}]]


@pytest.mark.parametrize("params", INTERP_OPENCV)
def test_interp(params):
    # OpenCV: this Caffe has no Interp (PSPNet's and DeepLab's fork).
    check_opencv([layer("resized", "Interp", "x", interp_param=params)], {"x": (2, 3, 3, 5)})


@pytest.mark.parametrize("params, bottom2, out_hw", [
    pytest.param({"shrink_factor": 2}, None, (4, 3), id="shrink2"),
    pytest.param({"shrink_factor": 3}, None, (3, 2), id="shrink3"),
    pytest.param({"shrink_factor": 1}, None, (7, 5), id="shrink1"),
    pytest.param({"zoom_factor": 2, "pad_beg": -1, "pad_end": -1}, None, (9, 5), id="zoom2-pad-1"),
    pytest.param({"zoom_factor": 3, "pad_beg": 0, "pad_end": -2}, None, (13, 7), id="zoom3-pad-end-2"),
    pytest.param({"height": 4, "width": 4, "pad_beg": -2}, None, (4, 4), id="size-pad-beg-2"),
    pytest.param({"height": 5, "width": 3, "pad_beg": -1, "pad_end": -1}, None, (5, 3), id="same-size-cropped"),
    pytest.param({}, (1, 1, 10, 4), (10, 4), id="second-bottom"),
    pytest.param({"height": 3, "width": 8, "interp_type": "nearest_neighbor"}, None, (3, 8), id="nearest"),
    pytest.param({"zoom_factor": 2, "interp_type": "nearest_neighbor"}, None, (13, 9), id="nearest-zoom2"),
])
def test_interp_where_opencv_departs(params, bottom2, out_hw):
    # The fork's loops: OpenCV ignores pad_beg / pad_end and refuses shrink_factor, a second bottom and
    # nearest_neighbor.
    inputs = {"x": (2, 3, 7, 5)}
    bottoms = ["x"]
    if bottom2 is not None:
        inputs["reference"] = bottom2
        bottoms.append("reference")
    nearest = params.get("interp_type") == "nearest_neighbor"
    check_loops([layer("resized", "Interp", bottoms, interp_param=params)], inputs,
                lambda f: {"resized": interp_loops(f["x"], params.get("pad_beg", 0), params.get("pad_end", 0),
                                                   *out_hw, nearest=nearest)})


# -- PriorBox (Caffe) -------------------------------------------------------------------------------------

PRIOR = [pytest.param(p, id=name) for name, p in {
    "min": {},
    "min-max": {"max_size": [60.0]},
    "min-max-ratio2": {"max_size": [60.0], "aspect_ratio": [2.0]},
    "ratios-flip": {"max_size": [60.0], "aspect_ratio": [2.0, 3.0], "flip": True},
    "ratios-flip-default": {"aspect_ratio": [2.0, 3.0]},
    "ratios-noflip": {"aspect_ratio": [2.0, 3.0], "flip": False},
    "repeated-ratios": {"aspect_ratio": [2.0, 0.5, 2.0, 1.0], "flip": True},
    "fractional-ratios": {"aspect_ratio": [1.5, 2.5, 0.3], "flip": True},
    "two-sizes": {"min_size": [20.0, 45.0], "max_size": [45.0, 70.0], "aspect_ratio": [2.0]},
    "two-sizes-nomax": {"min_size": [20.0, 45.0], "aspect_ratio": [2.0, 0.5]},
    "fractional-sizes": {"min_size": [30.5], "max_size": [61.7], "aspect_ratio": [2.0]},
    "fractional-two-sizes": {"min_size": [12.9, 33.3], "max_size": [33.3, 50.5], "aspect_ratio": [2.5]},
    "size-below-one": {"min_size": [0.5], "max_size": [7.0]},
    "clip": {"clip": True, "max_size": [90.0], "aspect_ratio": [2.0]},
    "clip-false": {"clip": False, "max_size": [90.0], "aspect_ratio": [2.0]},
    "clip-default-off": {"min_size": [40.0], "max_size": [80.0], "aspect_ratio": [3.0]},
    "one-variance": {"variance": [0.3]},
    "four-variances": {"variance": [0.1, 0.1, 0.2, 0.2]},
    "default-variance": {"aspect_ratio": [2.0]},
    "img_size": {"img_size": 100, "variance": [0.1]},
    "img_hw": {"img_h": 90, "img_w": 120, "max_size": [50.0]},
    "img_hw-step": {"img_h": 90, "img_w": 120, "step": 16.0},
    "img_hw-step_hw": {"min_size": [24.0], "max_size": [48.0], "img_h": 64, "img_w": 80, "step_h": 20.0,
                       "step_w": 16.0},
    "img_size-clip": {"img_size": 20, "clip": True, "aspect_ratio": [3.0]},
    "step-offset": {"step": 8.0, "offset": 0.25},
    "fractional-step": {"step": 6.4, "offset": 0.3},
    "step-hw": {"step_h": 8.0, "step_w": 6.0, "aspect_ratio": [3.0]},
    "offset0": {"offset": 0.0, "max_size": [50.0]},
    "offset1": {"offset": 1.0},
    "everything": {"min_size": [10.0, 21.5], "max_size": [21.5, 40.0], "aspect_ratio": [2.0, 3.0], "flip": True,
                   "clip": True, "variance": [0.1, 0.15, 0.2, 0.25], "img_h": 50, "img_w": 70, "step_h": 9.0,
                   "step_w": 11.5, "offset": 0.4},
}.items()]


@pytest.mark.caffe
@pytest.mark.parametrize("extra", PRIOR)
@pytest.mark.parametrize("feature", [(3, 5), (1, 1), (4, 3)], ids=lambda v: f"cells{v[0]}x{v[1]}")
def test_prior_box(tmp_path, extra, feature):
    params = {"min_size": [30.0], **extra}
    against_caffe(tmp_path, [layer("priors", "PriorBox", ["feat", "img"], prior_box_param=params)],
                  {"feat": (1, 3) + feature, "img": (1, 3, 30, 47)})


@pytest.mark.caffe
def test_prior_box_of_a_batch(tmp_path):
    # The priors depend on the shapes only: one set for the whole batch (the top's axis 0 is 1).
    values = against_caffe(tmp_path, [layer("priors", "PriorBox", ["feat", "img"],
                                            prior_box_param={"min_size": [8.0], "aspect_ratio": [2.0]})],
                           {"feat": (3, 4, 2, 3), "img": (3, 3, 17, 23)})
    assert values["priors"].shape == (1, 2, 2 * 3 * 3 * 4)


# -- DetectionOutput (Caffe) ------------------------------------------------------------------------------













@pytest.mark.caffe
@pytest.mark.parametrize("params, shape", DETECTION)
def test_detection_output(tmp_path, params, shape):
    layers, inputs, feeds, params = detection_case(detection_params(params), **shape)
    ours = against_caffe(tmp_path, layers, inputs, feeds, detections=["detections"])
    rows = ours["detections"][0, 0]
    nothing = params.get("confidence_threshold") == 0.99 or 0 in (params.get("keep_top_k"),
                                                                   params.get("nms_param", {}).get("top_k"))
    if nothing:
        assert (rows[:, 1:] == -1).all()      # caffe-ssd's "no detection" rows, one per image
    else:
        assert len(rows) > 1 and (rows[:, 1] >= 0).all()
        np.testing.assert_array_equal(rows, caffe_row_order(rows))


@pytest.mark.caffe
def test_detection_output_no_background_with_shared_boxes(tmp_path):
    """background_label_id -1 with share_location: Caffe's CPU forward aborts; blobtool computes its GPU forward's rows.

    DecodeBBoxesAll (bbox_util.cpp) passes over the location label equal to
    background_label_id, and the shared boxes' label is -1: the CPU forward
    then finds no boxes and dies (LOG(FATAL)). The GPU forward
    (detection_output_layer.cu) decodes the shared boxes whatever the
    background and skips no class: what the CPU forward computes with a
    background label past the classes (4 of 4), the oracle here.
    """
    layers, inputs, feeds, _ = detection_case(detection_params({"code_type": CENTER_SIZE, "background_label_id": -1}))
    refusal = caffe_refusal(net(layers, inputs), feeds, tmp_path)
    assert refusal is not None and "Could not find location predictions for label -1" in refusal.line, refusal
    ours = ours_forward(net(layers, inputs), feeds)["detections"]
    layers, inputs, feeds, _ = detection_case(detection_params({"code_type": CENTER_SIZE, "background_label_id": 4}))
    theirs = caffe_values(net(layers, inputs), feeds, tmp_path, ["detections"])["detections"]
    assert 0 in theirs[0, 0, :, 1]      # label 0, the background when none is given, among the rows
    assert_detections("detections", ours, theirs)


@pytest.mark.caffe
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "not-shared"])
def test_detection_output_ties_in_score(tmp_path, shared):
    """Scores of 8 levels: many equal scores in each class, and across classes.

    Within a class caffe-ssd orders the candidates with std::stable_sort
    (GetMaxScoreIndex, bbox_util.cpp): equal scores keep the prior's order,
    which decides the NMS and the rows, compared row for row; top_k cuts
    that order. keep_top_k sorts the kept boxes of all classes with
    std::sort, which leaves the order of equal scores undefined: which of
    them survive a cut among equal scores, and their order in their class's
    rows. There keep_top_k is chosen from caffe-ssd's own rows to cut
    between two scores, and rows of one image, label and score are compared
    as a set.
    """
    base = {"code_type": CENTER_SIZE, "share_location": shared, "confidence_threshold": 0.2,
            "nms_param": {"nms_threshold": 0.5}}
    shape = {"classes": 3, "num": 2, "feature": (4, 5), "levels": 8, "seed": 4}
    for more in ({"keep_top_k": -1}, {"nms_param": {"nms_threshold": 0.5, "top_k": 9}}):
        layers, inputs, feeds, _ = detection_case({**base, **more}, **shape)
        ours = against_caffe(tmp_path, layers, inputs, feeds, detections=["detections"])
        rows = ours["detections"][0, 0]
        for i in range(shape["num"]):
            scores = rows[rows[:, 0] == i][:, 2]
            assert len(scores) > len(set(scores.tolist())) + 5, "too few equal scores to test ties"
    # keep_top_k cuts between two scores of caffe-ssd's rows (one image: the cut is per image), so that
    # caffe-ssd keeps the same rows whatever order its std::sort gives equal scores.
    one = dict(shape, num=1)
    layers, inputs, feeds, _ = detection_case({**base, "keep_top_k": -1}, **one)
    rows = caffe_values(net(layers, inputs), feeds, tmp_path, ["detections"])["detections"][0, 0]
    scores = np.sort(rows[:, 2])[::-1]
    cuts = [k for k in range(1, len(scores)) if scores[k - 1] > scores[k]]
    keep_top_k = min(cuts, key=lambda k: abs(k - len(scores) // 2))
    layers, inputs, feeds, _ = detection_case({**base, "keep_top_k": keep_top_k}, **one)
    message = net(layers, inputs)
    ours = ours_forward(message, feeds)["detections"]
    theirs = caffe_values(message, feeds, tmp_path, ["detections"])["detections"]
    assert ours.shape[2] == keep_top_k
    assert_detections("detections", ours, theirs, ties_as_sets=True)


# -- generated SSD heads (Caffe) ----------------------------------------------------------------------------



@pytest.mark.caffe
@pytest.mark.parametrize("across_spatial, channel_shared, share_location, code_type", [
    pytest.param(True, True, True, CENTER_SIZE, id="across-shared-center-size"),
    pytest.param(True, False, False, CORNER, id="across-channels-not-shared-corner"),
    pytest.param(False, True, True, CORNER_SIZE, id="per-position-shared-corner-size"),
    pytest.param(False, False, False, CENTER_SIZE, id="per-position-channels-not-shared-center-size"),
])
def test_generated_ssd_head(tmp_path, across_spatial, channel_shared, share_location, code_type):
    layers, feeds = ssd_head(across_spatial=across_spatial, channel_shared=channel_shared,
                             share_location=share_location, code_type=code_type)
    ours = against_caffe(tmp_path, layers, {name: x.shape for name, x in feeds.items()}, feeds,
                         detections=["detection_out"])
    rows = ours["detection_out"][0, 0]
    assert len(rows) > 10 and set(rows[:, 0].tolist()) == {0.0, 1.0}


# -- refusals ------------------------------------------------------------------------------------------

REFUSALS = [pytest.param(layers, inputs, text, id=name) for name, layers, inputs, text in [
    ("reshape-two-inferred", [layer("r", "Reshape", "x", reshape_param={"shape": {"dim": [-1, 5, -1]}})],
     {"x": (2, 3, 5)}, r"layer 'r' \(Reshape\): new shape \[-1, 5, -1\] contains multiple -1 dims"),
    ("reshape-copy-past-end", [layer("r", "Reshape", "x", reshape_param={"shape": {"dim": [0, 0, 0, 0]}})],
     {"x": (2, 3, 5)}, r"layer 'r' \(Reshape\): new shape \[0, 0, 0, 0\] has a 0 at position 3, but the bottom "
                       r"\(2, 3, 5\) has no axis 3 to copy"),
    ("reshape-indivisible", [layer("r", "Reshape", "x", reshape_param={"shape": {"dim": [7, -1]}})],
     {"x": (2, 3, 5)}, r"layer 'r' \(Reshape\): bottom count \(30\) of \(2, 3, 5\) must be divisible by the "
                       r"product of the specified dimensions \(7\)"),
    ("reshape-count", [layer("r", "Reshape", "x", reshape_param={"shape": {"dim": [4, 4]}})],
     {"x": (2, 3, 5)}, r"layer 'r' \(Reshape\): output count 16 of \(4, 4\) must match the bottom's count 30"),
    ("reshape-axis", [layer("r", "Reshape", "x", reshape_param={"shape": {"dim": [1]}, "axis": 4})],
     {"x": (2, 3, 5)}, r"layer 'r' \(Reshape\): axis 4 is out of range for a 3-axis bottom"),
    ("reshape-in-place", [layer("r", "Reshape", "x", "x", reshape_param={"shape": {"dim": [-1]}})],
     {"x": (2, 3, 5)}, r"layer 'r' \(Reshape\): writes its bottom 'x' in place; Caffe's Reshape layer does not "
                       r"allow in-place computation"),
    ("slice-points-out-of-order", [layer("s", "Slice", "x", ["a", "b", "c"], slice_param={"slice_point": [3, 2]})],
     {"x": (2, 5, 3)}, r"layer 's' \(Slice\): slice points \[3, 2\] are not increasing from 0"),
    ("slice-point-zero", [layer("s", "Slice", "x", ["a", "b"], slice_param={"slice_point": [0]})],
     {"x": (2, 5, 3)}, r"layer 's' \(Slice\): slice points \[0\] are not increasing from 0"),
    ("slice-point-past-end", [layer("s", "Slice", "x", ["a", "b"], slice_param={"slice_point": [6]})],
     {"x": (2, 5, 3)}, r"layer 's' \(Slice\): slice point 6 is past the end of axis 1 \(size 5\)"),
    ("slice-point-count", [layer("s", "Slice", "x", ["a", "b"], slice_param={"slice_point": [1, 2]})],
     {"x": (2, 5, 3)}, r"layer 's' \(Slice\): has 2 slice points for 2 tops"),
    ("slice-uneven", [layer("s", "Slice", "x", ["a", "b"])],
     {"x": (2, 5, 3)}, r"layer 's' \(Slice\): 2 tops do not evenly divide axis 1 of size 5"),
    ("slice-axis-and-dim", [layer("s", "Slice", "x", ["a", "b"], slice_param={"axis": 1, "slice_dim": 1})],
     {"x": (2, 4, 3)}, r"layer 's' \(Slice\): gives both axis and slice_dim"),
    ("concat-shape-mismatch", [layer("c", "Concat", ["x", "y"])], {"x": (2, 3, 5), "y": (2, 4, 6)},
     r"layer 'c' \(Concat\): bottom 1 has shape \(2, 4, 6\), bottom 0 \(2, 3, 5\): all inputs must have the "
     r"same shape except at the concat axis 1 \(they differ at axis 2\)"),
    ("concat-axes-mismatch", [layer("c", "Concat", ["x", "y"])], {"x": (2, 3, 5), "y": (2, 3)},
     r"layer 'c' \(Concat\): bottom 1 has 2 axes \(2, 3\), bottom 0 has 3"),
    ("concat-axis-range", [layer("c", "Concat", ["x", "y"], concat_param={"axis": 3})],
     {"x": (2, 3, 5), "y": (2, 3, 5)}, r"layer 'c' \(Concat\): axis 3 is out of range for a 3-axis blob"),
    ("concat-dim-range", [layer("c", "Concat", ["x", "y"], concat_param={"concat_dim": 3})],
     {"x": (2, 3, 5), "y": (2, 3, 5)}, r"layer 'c' \(Concat\): concat_dim 3 is out of range for a 3-axis blob"),
    ("concat-axis-and-dim", [layer("c", "Concat", ["x", "y"], concat_param={"axis": 1, "concat_dim": 1})],
     {"x": (2, 3, 5), "y": (2, 3, 5)}, r"layer 'c' \(Concat\): gives both axis and concat_dim"),
    ("crop-axis-range", [layer("k", "Crop", ["x", "y"], crop_param={"axis": 4})],
     {"x": (1, 3, 6, 8), "y": (1, 3, 5, 5)}, r"layer 'k' \(Crop\): crop axis 4 is out of range for a 4-axis blob"),
    ("crop-too-big", [layer("k", "Crop", ["x", "y"], crop_param={"axis": 2, "offset": [2]})],
     {"x": (1, 3, 6, 8), "y": (1, 3, 5, 5)}, r"layer 'k' \(Crop\): the crop of axis 2 is out of bounds: size 5 at "
                                             r"offset 2 does not fit in bottom 0's 6"),
    ("crop-offset-count", [layer("k", "Crop", ["x", "y"], crop_param={"axis": 1, "offset": [0, 1]})],
     {"x": (1, 3, 6, 8), "y": (1, 3, 5, 5)}, r"layer 'k' \(Crop\): gives 2 offsets for the 3 axes from axis 1"),
    ("flatten-end-before-axis", [layer("f", "Flatten", "x", flatten_param={"axis": 2, "end_axis": 0})],
     {"x": (2, 3, 5)}, r"layer 'f' \(Flatten\): end_axis 0 \(axis 0\) comes before axis 2"),
    ("split-in-place", [layer("p", "Split", "x", ["x", "y"])], {"x": (2, 3)},
     r"layer 'p' \(Split\): writes its bottom 'x' in place"),
    ("tile-zero-tiles", [layer("t", "Tile", "x", tile_param={"axis": 1, "tiles": 0})], {"x": (2, 3)},
     r"layer 't' \(Tile\): tiles is 0; the number of tiles must be positive"),
    ("flatten-in-place", [layer("f", "Flatten", "x", "x")], {"x": (2, 3, 5)},
     r"layer 'f' \(Flatten\): writes its bottom 'x' in place; Caffe's Flatten layer does not allow"),
    ("tile-no-tiles", [layer("t", "Tile", "x", tile_param={"axis": 1})], {"x": (2, 3)},
     r"layer 't' \(Tile\): gives no tiles"),
    ("permute-duplicate", [layer("m", "Permute", "x", permute_param={"order": [0, 2, 2]})], {"x": (2, 3, 5)},
     r"layer 'm' \(Permute\): order \[0, 2, 2\] names axis 2 twice"),
    ("permute-range", [layer("m", "Permute", "x", permute_param={"order": [3]})], {"x": (2, 3, 5)},
     r"layer 'm' \(Permute\): order \[3\] names axis 3; an order should be less than the input dimension 3"),
    ("shuffle-group", [layer("g", "ShuffleChannel", "x", shuffle_channel_param={"group": 4})], {"x": (1, 6, 2, 2)},
     r"layer 'g' \(ShuffleChannel\): group 4 does not divide the 6 channels"),
    ("upsample-segnet-mask", [layer("u", "Upsample", ["x", "mask"], upsample_param={"scale": 2})],
     {"x": (1, 2, 3, 3), "mask": (1, 2, 3, 4)}, r"layer 'u' \(Upsample\): the mask \(1, 2, 3, 4\) must have the "
                                                r"values' shape \(1, 2, 3, 3\)"),
    ("upsample-3d", [layer("u", "Upsample", "x", upsample_param={"scale": 2})], {"x": (1, 2, 3)},
     r"layer 'u' \(Upsample\): bottom \(1, 2, 3\) has 3 axes; Upsample takes \(N, C, H, W\)"),
    ("interp-two-sizes", [layer("i", "Interp", "x", interp_param={"zoom_factor": 2, "shrink_factor": 2})],
     {"x": (1, 2, 3, 3)}, r"layer 'i' \(Interp\): the output size must be given by exactly one of .*this layer "
                          r"gives zoom_factor, shrink_factor \(DeepLab's Interp"),
    ("interp-no-size", [layer("i", "Interp", "x", interp_param={"height": 4})], {"x": (1, 2, 3, 3)},
     r"layer 'i' \(Interp\): the output size must be given by exactly one of .*this layer gives none of them"),
    ("interp-zoom0", [layer("i", "Interp", "x", interp_param={"zoom_factor": 0})], {"x": (1, 2, 3, 3)},
     r"layer 'i' \(Interp\): zoom_factor is 0; zoom factor must be positive"),
    ("interp-type", [layer("i", "Interp", "x", interp_param={"zoom_factor": 2, "interp_type": "cubic"})],
     {"x": (1, 2, 3, 3)}, r"layer 'i' \(Interp\): interp_type is 'cubic'"),
    ("upsample-scale0", [layer("u", "Upsample", "x", upsample_param={"scale": 0})], {"x": (1, 2, 3, 3)},
     r"layer 'u' \(Upsample\): scale is 0"),
    ("interp-positive-pad", [layer("i", "Interp", "x", interp_param={"zoom_factor": 2, "pad_end": 1})],
     {"x": (1, 2, 3, 3)}, r"layer 'i' \(Interp\): pad_beg 0 and pad_end 1: Interp only supports non-positive"),
    ("prior-no-min-size", [layer("p", "PriorBox", ["x", "y"], prior_box_param={"max_size": [3.0]})],
     {"x": (1, 2, 3, 3), "y": (1, 3, 9, 9)}, r"layer 'p' \(PriorBox\): gives no min_size"),
    ("prior-max-below-min", [layer("p", "PriorBox", ["x", "y"], prior_box_param={"min_size": [4.0],
                                                                                 "max_size": [3.0]})],
     {"x": (1, 2, 3, 3), "y": (1, 3, 9, 9)}, r"layer 'p' \(PriorBox\): max_size 3.0 is not greater than its "
                                             r"min_size 4.0"),
    ("prior-three-variances", [layer("p", "PriorBox", ["x", "y"], prior_box_param={"min_size": [4.0],
                                                                                   "variance": [0.1, 0.1, 0.2]})],
     {"x": (1, 2, 3, 3), "y": (1, 3, 9, 9)}, r"layer 'p' \(PriorBox\): gives 3 variances"),
    ("prior-img-size-twice", [layer("p", "PriorBox", ["x", "y"], prior_box_param={"min_size": [4.0], "img_size": 9,
                                                                                  "img_h": 9, "img_w": 9})],
     {"x": (1, 2, 3, 3), "y": (1, 3, 9, 9)}, r"layer 'p' \(PriorBox\): gives img_size and img_h/img_w"),
    ("prior-step-twice", [layer("p", "PriorBox", ["x", "y"], prior_box_param={"min_size": [4.0], "step": 3.0,
                                                                              "step_h": 3.0, "step_w": 3.0})],
     {"x": (1, 2, 3, 3), "y": (1, 3, 9, 9)}, r"layer 'p' \(PriorBox\): gives step and step_h/step_w"),
    ("detection-eta", [layer("d", "DetectionOutput", ["l", "c", "p"],
                             detection_output_param={"num_classes": 3, "nms_param": {"eta": 1.5}})],
     {"l": (1, 40), "c": (1, 30), "p": (1, 2, 40)}, r"layer 'd' \(DetectionOutput\): eta is 1.5; eta must be in"),
    ("detection-images", [layer("d", "DetectionOutput", ["l", "c", "p"], detection_output_param={"num_classes": 3})],
     {"l": (2, 40), "c": (1, 30), "p": (1, 2, 40)}, r"layer 'd' \(DetectionOutput\): locations \(2, 40\) and "
                                                    r"confidences \(1, 30\) are for 2 and 1 images"),
    ("detection-prior-count", [layer("d", "DetectionOutput", ["l", "c", "p"],
                                     detection_output_param={"num_classes": 3})],
     {"l": (1, 40), "c": (1, 33), "p": (1, 2, 40)}, r"layer 'd' \(DetectionOutput\): 10 priors x 3 classes is not "
                                                    r"the 33 channels of the confidences"),
    ("detection-no-classes", [layer("d", "DetectionOutput", ["l", "c", "p"], detection_output_param={})],
     {"l": (1, 40), "c": (1, 30), "p": (1, 2, 40)}, r"layer 'd' \(DetectionOutput\): gives no num_classes"),
    ("reshape-num-axes", [layer("r", "Reshape", "x", reshape_param={"shape": {"dim": [-1]}, "num_axes": -2})],
     {"x": (2, 3, 5)}, r"layer 'r' \(Reshape\): num_axes -2 must be >= 0, or -1 for all"),
    ("reshape-negative-axis", [layer("r", "Reshape", "x", reshape_param={"shape": {"dim": [-1]}, "axis": -5})],
     {"x": (2, 3, 5)}, r"layer 'r' \(Reshape\): axis -5 is out of range for a 3-axis bottom"),
    ("reshape-num-axes-past-end", [layer("r", "Reshape", "x", reshape_param={"shape": {"dim": [-1]}, "axis": 1,
                                                                             "num_axes": 3})],
     {"x": (2, 3, 5)}, r"layer 'r' \(Reshape\): end axis = axis 1 \+ num_axes 3 is out of range"),
    ("slice-axis-range", [layer("s", "Slice", "x", ["a", "b"], slice_param={"axis": 4})], {"x": (1, 2, 4, 4)},
     r"layer 's' \(Slice\): axis 4 is out of range for a 4-axis blob"),
    ("slice-one-top-one-point", [layer("s", "Slice", "x", ["a"], slice_param={"slice_point": [1]})],
     {"x": (2, 3, 5)}, r"layer 's' \(Slice\): has 1 slice points for 1 tops"),
    ("crop-negative-axis", [layer("k", "Crop", ["x", "y"], crop_param={"axis": -5})],
     {"x": (1, 3, 6, 8), "y": (1, 3, 5, 5)}, r"layer 'k' \(Crop\): crop axis -5 is out of range for a 4-axis blob"),
    ("crop-reference-rank", [layer("k", "Crop", ["x", "y"], crop_param={"axis": 1})],
     {"x": (1, 3, 6, 8), "y": (1, 3, 5)}, r"layer 'k' \(Crop\): bottom 1 \(1, 3, 5\) has fewer axes than bottom 0"),
    ("flatten-axis-range", [layer("f", "Flatten", "x", flatten_param={"axis": 4})], {"x": (1, 2, 3, 3)},
     r"layer 'f' \(Flatten\): axis 4 is out of range for a 4-axis blob"),
    ("tile-axis-range", [layer("t", "Tile", "x", tile_param={"axis": 4, "tiles": 2})], {"x": (1, 2, 3, 3)},
     r"layer 't' \(Tile\): axis 4 is out of range for a 4-axis blob"),
    ("prior-variance-zero", [layer("p", "PriorBox", ["x", "y"], prior_box_param={"min_size": [4.0],
                                                                                 "variance": [0.0]})],
     {"x": (1, 2, 3, 3), "y": (1, 3, 9, 9)}, r"layer 'p' \(PriorBox\): variance \[0.0\]: each variance must be "
                                             r"positive"),
    ("prior-variance-negative", [layer("p", "PriorBox", ["x", "y"],
                                       prior_box_param={"min_size": [4.0], "variance": [0.1, 0.1, -0.2, 0.2]})],
     {"x": (1, 2, 3, 3), "y": (1, 3, 9, 9)}, r"layer 'p' \(PriorBox\): variance \[.*\]: each variance must be "
                                             r"positive"),
    ("prior-step-zero", [layer("p", "PriorBox", ["x", "y"], prior_box_param={"min_size": [4.0], "step": 0.0})],
     {"x": (1, 2, 3, 3), "y": (1, 3, 9, 9)}, r"layer 'p' \(PriorBox\): step is 0.0; step should be larger than 0"),
    ("prior-img_size-zero", [layer("p", "PriorBox", ["x", "y"], prior_box_param={"min_size": [4.0], "img_size": 0})],
     {"x": (1, 2, 3, 3), "y": (1, 3, 9, 9)}, r"layer 'p' \(PriorBox\): img_size is 0; img_size should be larger "
                                             r"than 0"),
    ("prior-img_h-alone", [layer("p", "PriorBox", ["x", "y"], prior_box_param={"min_size": [4.0], "img_h": 9})],
     {"x": (1, 2, 3, 3), "y": (1, 3, 9, 9)}, r"layer 'p' \(PriorBox\): img_h 9 and img_w 0: both should be larger "
                                             r"than 0"),
    ("prior-step_h-alone", [layer("p", "PriorBox", ["x", "y"], prior_box_param={"min_size": [4.0], "step_h": 3.0})],
     {"x": (1, 2, 3, 3), "y": (1, 3, 9, 9)}, r"layer 'p' \(PriorBox\): step_h 3.0 and step_w 0.0: both should be "
                                             r"larger than 0"),
    ("prior-max-size-count", [layer("p", "PriorBox", ["x", "y"], prior_box_param={"min_size": [4.0, 5.0],
                                                                                  "max_size": [6.0]})],
     {"x": (1, 2, 3, 3), "y": (1, 3, 9, 9)}, r"layer 'p' \(PriorBox\): gives 1 max_size for 2 min_size"),
    ("detection-nms-negative", [layer("d", "DetectionOutput", ["l", "c", "p"],
                                      detection_output_param={"num_classes": 3, "nms_param": {"nms_threshold": -0.1}})],
     {"l": (1, 40), "c": (1, 30), "p": (1, 2, 40)}, r"layer 'd' \(DetectionOutput\): nms_threshold is "
                                                    r"-0.1\d*; nms_threshold must be non negative"),
    ("detection-eta-zero", [layer("d", "DetectionOutput", ["l", "c", "p"],
                                  detection_output_param={"num_classes": 3, "nms_param": {"eta": 0.0}})],
     {"l": (1, 40), "c": (1, 30), "p": (1, 2, 40)}, r"layer 'd' \(DetectionOutput\): eta is 0.0; eta must be in"),
    ("detection-loc-count", [layer("d", "DetectionOutput", ["l", "c", "p"],
                                   detection_output_param={"num_classes": 3})],
     {"l": (1, 44), "c": (1, 30), "p": (1, 2, 40)}, r"layer 'd' \(DetectionOutput\): 10 priors x 1 location classes "
                                                    r"x 4 is not the 44 channels of the locations"),
]]

# What Caffe says of each refusal above whose layer type it has (its CHECK line holds this text).
CAFFE_SAYS = {
    "reshape-two-inferred": "new shape contains multiple -1 dims",
    "reshape-copy-past-end": "new shape contains a 0, but there was no corresponding bottom axis to copy",
    "reshape-indivisible": "bottom count (30) must be divisible by the product of the specified dimensions (7)",
    "reshape-count": "output count must match input count",
    "reshape-axis": "axis 4 out of range for 3-D input blob",
    "reshape-in-place": "Reshape Layer does not allow in-place computation",
    "reshape-num-axes": "num_axes must be >= 0, or -1 for all",
    "reshape-negative-axis": "axis -5 out of range",
    "reshape-num-axes-past-end": "end_axis = axis + num_axes is out of range",
    "slice-points-out-of-order": "slice_point_[i] > prev (2 vs. 3)",
    "slice-point-zero": "slice_point_[i] > prev (0 vs. 0)",
    "slice-point-past-end": "shape[i] >= 0 (-1 vs. 0)",       # the last piece's size, -1, in Blob::Reshape
    "slice-point-count": "slice_point_.size() == top.size() - 1 (2 vs. 1)",
    "slice-uneven": "Number of top blobs (2) should evenly divide input slice axis (5)",
    "slice-axis-and-dim": "Either axis or slice_dim should be specified; not both.",
    "slice-axis-range": "axis 4 out of range for 4-D Blob",
    "slice-one-top-one-point": "slice_point_.size() == top.size() - 1 (1 vs. 0)",
    "concat-shape-mismatch": "All inputs must have the same shape, except at concat_axis.",
    "concat-axes-mismatch": "All inputs must have the same #axes.",
    "concat-axis-range": "axis 3 out of range for 3-D Blob",
    "concat-dim-range": "concat_dim out of range.",
    "concat-axis-and-dim": "Either axis or concat_dim should be specified; not both.",
    "crop-axis-range": "axis 4 out of range for 4-D Blob",
    "crop-too-big": "the crop for dimension 2 is out-of-bounds with size 5 and offset 2",
    "crop-offset-count": "number of offset values specified must be equal to the number of dimensions following axis",
    "crop-negative-axis": "axis -5 out of range for 4-D Blob",
    "crop-reference-rank": "axis 3 out of range for 3-D Blob",     # bottom 1's shape(3), which it lacks
    "flatten-end-before-axis": "start_axis <= end_axis (2 vs. 1)",
    "flatten-in-place": "Flatten Layer does not allow in-place computation.",
    "flatten-axis-range": "axis 4 out of range for 4-D Blob",
    "split-in-place": "Split Layer does not allow in-place computation.",
    "tile-zero-tiles": "Number of tiles must be positive.",
    "tile-no-tiles": "Number of tiles must be specified",
    "tile-axis-range": "axis 4 out of range for 4-D Blob",
    "permute-duplicate": "there are duplicate orders",
    "permute-range": "order should be less than the input dimension.",
    "prior-no-min-size": "must provide min_size.",
    "prior-max-below-min": "max_size must be greater than min_size.",
    "prior-three-variances": "prior_box_param.variance_size() == 4 (3 vs. 4)",
    "prior-img-size-twice": "Either img_size or img_h/img_w should be specified; not both.",
    "prior-step-twice": "Either step or step_h/step_w should be specified; not both.",
    "prior-variance-zero": "prior_box_param.variance(0) > 0 (0 vs. 0)",
    "prior-variance-negative": "prior_box_param.variance(i) > 0 (-0.2 vs. 0)",
    "prior-step-zero": "step should be larger than 0.",
    "prior-img_size-zero": "img_size should be larger than 0.",
    "prior-img_h-alone": "img_w should be larger than 0.",
    "prior-step_h-alone": "step_w should be larger than 0.",
    "prior-max-size-count": "prior_box_param.min_size_size() == prior_box_param.max_size_size() (2 vs. 1)",
    "detection-eta": "eta_ <= 1. (1.5 vs. 1)",
    "detection-eta-zero": "eta_ > 0. (0 vs. 0)",
    "detection-nms-negative": "nms_threshold must be non negative.",
    "detection-images": "bottom[0]->num() == bottom[1]->num() (2 vs. 1)",
    "detection-prior-count": "Number of priors must match number of confidence predictions.",
    "detection-loc-count": "Number of priors must match number of location predictions.",
    "detection-no-classes": "Must specify num_classes",
}



@pytest.mark.parametrize("layers, inputs, text", REFUSALS)
def test_refusals_name_the_layer(layers, inputs, text):
    with pytest.raises(LayerError, match=text):
        ours_forward(net(layers, inputs), feeds_for(inputs))


@pytest.mark.caffe
def test_caffe_refuses_what_blobtool_refuses(tmp_path):
    """Each refusal above of a layer type Caffe has, side by side: blobtool's message and Caffe's CHECK line.

    The forks' layers (ShuffleChannel, Upsample, Interp) are left out: this
    Caffe lacks them. The nets run in one Caffe process, each in a child of
    its own (caffeoracle.caffe_refusals).
    """
    from caffeoracle import shared_worker

    types = set(shared_worker().layer_types())
    cases = [each for each in REFUSALS if each.values[0][0].type in types]
    assert sorted(each.id for each in cases) == sorted(CAFFE_SAYS)
    refusals = caffe_refusals([(net(layers, inputs), feeds_for(inputs)) for layers, inputs, _ in
                               (each.values for each in cases)], tmp_path)
    table, wrong = [], []
    for each, refusal in zip(cases, refusals):
        layers, inputs, _ = each.values
        with pytest.raises(LayerError) as caught:
            ours_forward(net(layers, inputs), feeds_for(inputs))
        caffes = "runs it" if refusal is None else refusal.line.split("] ", 1)[-1]
        table.append(f"{each.id}:\n  blobtool: {caught.value}\n  Caffe:    {caffes}")
        if refusal is None or CAFFE_SAYS[each.id] not in refusal.line:
            wrong.append(each.id)
    assert not wrong, f"Caffe does not refuse these as expected: {wrong}\n" + "\n".join(table)
