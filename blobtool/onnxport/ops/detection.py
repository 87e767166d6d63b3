"""caffe-ssd's DetectionOutput written with standard ONNX operators, its rows those of detection_output_layer.cpp.

The layer's class (blobtool/layers/ssd.py) gives the sums; the nodes take
the same steps, in the same precisions, for every image and class at once:

- decode (DecodeBBox): the location predictions and the priors' boxes and
  variances as element-wise arithmetic, float32 where Caffe computes in
  float and float64 (Cast) where it computes in double (CENTER_SIZE's exp
  and half sizes); variance_encoded_in_target drops the variance's product;
- one row of candidates per image and class but the background
  (B = images x classes): share_location reads the image's one set of
  boxes for every class, otherwise each class its own;
- GetMaxScoreIndex: TopK of the class's scores, those not above
  confidence_threshold (NaN too) made float32's lowest first, k = top_k (every
  prior where top_k is -1); TopK keeps the lower prior first among equal
  scores, as caffe-ssd's std::stable_sort. The candidates' boxes are
  gathered in that order;
- ApplyNMSFast: NonMaxSuppression (center_point_box 0, which reads the
  corners; its intersection over union is JaccardOverlap's for
  normalized boxes, no +1) fed a score of its rank (k for the first
  candidate, down to 1), so that it visits the candidates in Caffe's order
  whatever order a runtime gives equal scores, and 0 for a candidate not
  above confidence_threshold, which its score_threshold of 0.5 drops: a
  candidate is kept where Caffe keeps it. A box whose max corner is below
  its min (CORNER decoding can give one) overlaps nothing in
  JaccardOverlap, while NonMaxSuppression orders corners itself: it is
  given a point there instead, which overlaps nothing either;
- the kept candidates sorted by (image, class, rank in the class's
  candidates), one int64 key, whatever order NonMaxSuppression returned
  them in: caffe-ssd's order, by image, label ascending, score
  descending, the lower prior first among equal scores;
- keep_top_k: those candidates ranked by score (TopK, equal scores in
  that order), their rank within their image counted (CumSum of a
  one-hot of the image), those ranked below keep_top_k kept, in order;
- [image, label, score, xmin, ymin, xmax, ymax] gathered;
- no row at all: caffe-ssd's [image, -1, -1, -1, -1, -1, -1] per image.

The top is (1, 1, N, 7), N a dim_param ("<top>_rows"). eta < 1 lowers
the overlap threshold after each kept box while it is above 0.5, which
NonMaxSuppression's one threshold cannot say: with nms_threshold above
0.5 such a layer is refused, naming the --outputs cut (at or below 0.5
eta changes nothing, and the layer is written as with eta 1).
"""

from __future__ import annotations

import numpy as np

from ...layers.ssd import CORNER, CORNER_SIZE
from ..emit import exporter
from .shape import MAX_COMPUTED

# ONNX's TensorProto.DataType of the values cast between.
_FLOAT, _DOUBLE, _INT64 = 1, 11, 7
# NonMaxSuppression's score_threshold: the ranks fed to it are whole numbers from 1, a candidate below
# Caffe's confidence_threshold 0; 0.5 lies between, whether a runtime keeps scores above it or at it.
_RANK_THRESHOLD = 0.5


class _Once:
    """The Emit `e`, each constant of one suffix and value made once and named by it at every use."""

    def __init__(self, e):
        self._e = e
        self._made: dict = {}

    def __getattr__(self, name):
        return getattr(self._e, name)

    def constant(self, suffix: str, array) -> str:
        array = np.asarray(array)
        key = (suffix, array.dtype.str, array.shape, array.tobytes())
        if key not in self._made:
            self._made[key] = self._e.constant(suffix, array)
        return self._made[key]

    def shape_constant(self, suffix: str, shape) -> str:
        return self.constant(suffix, np.asarray(list(shape), dtype=np.int64))

    def reduce(self, op: str, x: str, axes, out: str, *, keepdims: int = 1) -> str:
        """ReduceSum, its axes an input (from opset 13, the lowest written), that constant made once."""
        assert op == "ReduceSum", op
        return self.node(op, [x, self.shape_constant(f"{op}_axes", axes)], [out], keepdims=keepdims)[0]


@exporter("DetectionOutput")
def detection_output(e) -> None:
    e = _Once(e)
    layer = e.layer
    layer.reshape([tuple(s) for s in e.bottom_shapes])
    # ApplyNMSFast lowers its threshold only while it is above 0.5: at or below, eta changes nothing.
    if layer.eta < 1 and layer.nms_threshold > 0.5:
        raise e.refuse(f"its eta {float(layer.eta):g} lowers nms_threshold {float(layer.nms_threshold):g} after "
                       "each kept box while it is above 0.5, which NonMaxSuppression's one threshold cannot say; "
                       f"end the graph before it with --outputs, e.g. --outputs {','.join(e.step.bottoms)}, and "
                       "decode those outside the model")
    classes = [c for c in range(layer.num_classes) if c != layer.background]
    num = layer.num
    # The constants below hold a value per image (7 for the rows of nothing detected) and per candidate (the
    # ranks): sizes a definition of a few bytes can declare, bounded before anything is computed.
    for what, size in (("its rows of nothing detected", 7 * num), ("its candidates' ranks", layer.num_priors)):
        if size > MAX_COMPUTED:
            raise e.refuse(f"{what} would be a constant of {size:,} values computed from the net's shapes, past "
                           f"the {MAX_COMPUTED:,} an export computes")
    if not classes or layer.top_k == 0 or layer.keep_top_k == 0:
        # No class to detect, or no candidate kept: Caffe's rows of nothing detected, whatever the data.
        _finish(e, None, num)
        return
    boxes = _decode(e, layer)
    candidates, scores, per = _candidates(e, layer, boxes, classes)
    chosen = _in_caffe_order(e, _suppress(e, layer, candidates, scores, per), per)
    if layer.keep_top_k > -1:
        chosen = _keep_top_k(e, layer, chosen, scores, len(classes))
    rows = _rows(e, chosen, candidates, scores, classes)
    _finish(e, rows, num)


# -- reading the bottoms ---------------------------------------------------------------------------

def _flat_part(e, x: str, shape: tuple, start: int, size: int, suffix: str) -> str:
    """Values start .. start + size of bottom `x` (of `shape`), read in memory order, as 1-D."""
    total = int(np.prod(shape, dtype=np.int64))
    flat = e.node("Reshape", [x, e.shape_constant(f"{suffix}_flat_shape", [-1])], [e.temp(f"{suffix}_flat")])[0]
    if start == 0 and size == total:
        return flat
    return e.node("Slice", [flat, e.shape_constant(f"{suffix}_start", [start]),
                            e.shape_constant(f"{suffix}_end", [start + size]), e.shape_constant(f"{suffix}_axes", [0])],
                  [e.temp(f"{suffix}_part")])[0]


def _coordinate(e, x: str, k: int, suffix: str) -> str:
    """Coordinate k of boxes laid along the last axis (kept, size 1)."""
    return e.node("Slice", [x, e.shape_constant(f"coordinate{k}_start", [k]),
                            e.shape_constant(f"coordinate{k}_end", [k + 1]),
                            e.shape_constant("last_axis", [-1])], [e.temp(suffix)])[0]


def _bottoms(e, layer) -> tuple:
    """(locations (N, P, L, 4), priors (1, P, 1, 4), variances (1, P, 1, 4)) as Caffe reads its three bottoms."""
    num, priors, loc_classes = layer.num, layer.num_priors, layer.loc_classes
    loc = _flat_part(e, e.inputs[0], e.bottom_shapes[0], 0, num * priors * loc_classes * 4, "loc")
    loc = e.node("Reshape", [loc, e.shape_constant("loc_shape", [num, priors, loc_classes, 4])], [e.temp("loc")])[0]
    found = []
    for k, what in enumerate(("prior", "variance")):
        part = _flat_part(e, e.inputs[2], e.bottom_shapes[2], k * priors * 4, priors * 4, what)
        found.append(e.node("Reshape", [part, e.shape_constant(f"{what}_shape", [1, priors, 1, 4])],
                            [e.temp(what)])[0])
    return loc, found[0], found[1]


# -- DecodeBBox ------------------------------------------------------------------------------------

def _decode(e, layer) -> str:
    """The decoded boxes (N, P, L, 4), float32, as DecodeBBox computes them (ssd.py's _decode)."""
    loc, prior, var = _bottoms(e, layer)
    # variance_encoded_in_target: the prediction holds the variance already, and Caffe's product by 1 is exact.
    offset = loc if layer.in_target else e.node("Mul", [var, loc], [e.temp("scaled")])[0]
    if layer.code_type == CORNER:
        return e.node("Add", [prior, offset], [e.temp("boxes")])[0]
    p = [_coordinate(e, prior, k, f"prior_{k}") for k in range(4)]
    pw = e.node("Sub", [p[2], p[0]], [e.temp("prior_width")])[0]
    ph = e.node("Sub", [p[3], p[1]], [e.temp("prior_height")])[0]
    if layer.code_type == CORNER_SIZE:
        size = e.node("Concat", [pw, ph, pw, ph], [e.temp("prior_sizes")], axis=-1)[0]
        moved = e.node("Mul", [offset, size], [e.temp("moved")])[0]
        return e.node("Add", [prior, moved], [e.temp("boxes")])[0]
    return _decode_center(e, offset, p, pw, ph)


def _decode_center(e, offset: str, p: list, pw: str, ph: str) -> str:
    """CENTER_SIZE: centre in float, width exp(v l) w and the half sizes in double, each corner stored in float."""
    two = e.constant("two", np.float32(2))
    two_wide = _cast(e, two, _DOUBLE, "two_double")
    o = [_coordinate(e, offset, k, f"offset_{k}") for k in range(4)]
    corners = []
    for axis, (low, high, size) in enumerate(((p[0], p[2], pw), (p[1], p[3], ph))):
        # (min + max) / 2. in double is the float sum halved: exact, so computed in float.
        centre = e.node("Div", [e.node("Add", [low, high], [e.temp("prior_sum")])[0], two], [e.temp("prior_centre")])[0]
        shift = e.node("Mul", [o[axis], size], [e.temp("shift")])[0]
        centre = e.node("Add", [shift, centre], [e.temp("centre")])[0]
        grown = e.node("Exp", [_cast(e, o[axis + 2], _DOUBLE, "log_size")], [e.temp("grow")])[0]
        side = e.node("Mul", [grown, _cast(e, size, _DOUBLE, "prior_side")], [e.temp("side_wide")])[0]
        side = _cast(e, side, _FLOAT, "side")
        half = e.node("Div", [_cast(e, side, _DOUBLE, "side_again"), two_wide], [e.temp("half")])[0]
        wide = _cast(e, centre, _DOUBLE, "centre_wide")
        corners.append([_cast(e, e.node(op, [wide, half], [e.temp("corner_wide")])[0], _FLOAT, "corner")
                        for op in ("Sub", "Add")])
    (xmin, xmax), (ymin, ymax) = corners
    return e.node("Concat", [xmin, ymin, xmax, ymax], [e.temp("boxes")], axis=-1)[0]


def _cast(e, x: str, to: int, suffix: str) -> str:
    return e.node("Cast", [x], [e.temp(suffix)], to=to)[0]


# -- candidates and their suppression --------------------------------------------------------------

def _candidates(e, layer, boxes: str, classes: list) -> tuple:
    """(boxes (B, K, 4), scores (B, K), K): each image and class's top K candidates, best first.

    B = images x classes, the background left out; K = top_k, or every
    prior where top_k is -1 or past the priors.
    """
    num, priors, total = layer.num, layer.num_priors, layer.num_classes
    per = priors if layer.top_k < 0 else min(layer.top_k, priors)
    batch = num * len(classes)
    conf = _flat_part(e, e.inputs[1], e.bottom_shapes[1], 0, num * priors * total, "conf")
    conf = e.node("Reshape", [conf, e.shape_constant("conf_shape", [num, priors, total])], [e.temp("conf")])[0]
    wanted = e.constant("classes", np.asarray(classes, dtype=np.int64)) if len(classes) != total else None
    if wanted is not None:
        conf = e.node("Gather", [conf, wanted], [e.temp("class_conf")], axis=2)[0]
    conf = e.node("Transpose", [conf], [e.temp("class_major")], perm=[0, 2, 1])[0]
    conf = e.node("Reshape", [conf, e.shape_constant("batch_scores", [batch, priors])], [e.temp("scores")])[0]
    # GetMaxScoreIndex drops the scores not above the threshold (a NaN too) before it takes top_k: here they
    # become float32's lowest, below every candidate, so that they come last and take no place among the top_k
    # (the ranks of _suppress are 0 for them).
    above = e.node("Greater", [conf, e.constant("confidence_threshold", np.float32(layer.threshold))],
                   [e.temp("candidate")])[0]
    lowest = e.constant("lowest", np.finfo(np.float32).min)
    conf = e.node("Where", [above, conf, lowest], [e.temp("candidate_scores")])[0]
    scores, order = e.node("TopK", [conf, e.shape_constant("top_k", [per])], [e.temp("top"), e.temp("top_index")],
                           axis=1, largest=1, sorted=1)
    if layer.share_location:
        # One set of boxes per image: every class's candidates read from it, (N, classes x K) at once.
        source = e.node("Reshape", [boxes, e.shape_constant("image_boxes", [num, priors, 4])], [e.temp("shared")])[0]
        index = e.node("Reshape", [order, e.shape_constant("image_index", [num, len(classes) * per, 1])],
                       [e.temp("image_index")])[0]
        shape = [num, len(classes) * per, 4]
    else:
        if wanted is not None:
            boxes = e.node("Gather", [boxes, wanted], [e.temp("class_boxes")], axis=2)[0]
        boxes = e.node("Transpose", [boxes], [e.temp("class_boxes_major")], perm=[0, 2, 1, 3])[0]
        source = e.node("Reshape", [boxes, e.shape_constant("batch_boxes", [batch, priors, 4])], [e.temp("per")])[0]
        index = e.node("Unsqueeze", [order, e.shape_constant("last", [2])], [e.temp("index")])[0]
        shape = [batch, per, 4]
    index = e.node("Expand", [index, e.shape_constant("index_shape", shape)], [e.temp("index_4")])[0]
    picked = e.node("GatherElements", [source, index], [e.temp("picked")], axis=1)[0]
    picked = e.node("Reshape", [picked, e.shape_constant("candidate_shape", [batch, per, 4])],
                    [e.temp("candidates")])[0]
    return picked, scores, per


def _suppress(e, layer, candidates: str, scores: str, per: int) -> str:
    """The kept candidates, (M, 2) int64 [row b of B, rank in the row], in the order the runtime gives."""
    above = e.node("Greater", [scores, e.constant("confidence_threshold", np.float32(layer.threshold))],
                   [e.temp("above")])[0]
    ranks = e.constant("ranks", np.arange(per, 0, -1, dtype=np.float32)[None, :])
    ranked = e.node("Where", [above, ranks, e.constant("zero", np.float32(0))], [e.temp("ranked")])[0]
    ranked = e.node("Unsqueeze", [ranked, e.shape_constant("class_axis", [1])], [e.temp("nms_scores")])[0]
    # NonMaxSuppression takes an iou_threshold in [0, 1] (onnxruntime fails past 1); caffe-ssd takes any
    # nms_threshold from 0, and past 1 suppresses nothing, as at 1: no overlap in float exceeds 1 (the union
    # is at least the intersection).
    overlap = min(float(layer.nms_threshold), 1.0)
    selected = e.node("NonMaxSuppression", [_as_caffe_overlaps(e, candidates), ranked,
                                            e.shape_constant("max_boxes", [per]),
                                            e.constant("nms_threshold", np.asarray([overlap], np.float32)),
                                            e.constant("rank_threshold", np.asarray([_RANK_THRESHOLD], np.float32))],
                      [e.temp("selected")], center_point_box=0)[0]
    return e.node("Gather", [selected, e.shape_constant("row_and_rank", [0, 2])], [e.temp("kept")], axis=1)[0]


def _as_caffe_overlaps(e, candidates: str) -> str:
    """The candidates as NonMaxSuppression should see them: a box whose max is below its min made a point.

    JaccardOverlap gives such a box (CORNER decoding can make one) an
    overlap of 0 with every box, since its intersection with any has no
    width or height; NonMaxSuppression would read its corners in either
    order. A point overlaps nothing there either (its intersection is
    empty), so it suppresses nothing and is suppressed by nothing, as in
    Caffe. The boxes of the rows keep their corners as decoded.
    """
    x0, y0, x1, y1 = (_coordinate(e, candidates, k, f"candidate_{k}") for k in range(4))
    flipped = e.node("Or", [e.node("Less", [x1, x0], [e.temp("x_flipped")])[0],
                            e.node("Less", [y1, y0], [e.temp("y_flipped")])[0]], [e.temp("flipped")])[0]
    point = e.node("Concat", [x0, y0, x0, y0], [e.temp("point")], axis=-1)[0]
    return e.node("Where", [flipped, point, candidates], [e.temp("nms_boxes")])[0]


def _in_caffe_order(e, chosen: str, per: int) -> str:
    """`chosen` sorted by (image, class, rank in the class's candidates): one int64 key, b K + rank, ascending."""
    key = e.node("Mul", [chosen, e.constant("key_weights", np.asarray([per, 1], dtype=np.int64))], [e.temp("key2")])[0]
    key = e.reduce("ReduceSum", key, [1], e.temp("key"), keepdims=0)
    order = _sorted(e, key, largest=0)
    return e.node("Gather", [chosen, order], [e.temp("ordered")], axis=0)[0]


def _sorted(e, x: str, *, largest: int) -> str:
    """The indices that sort 1-D `x` (descending where `largest`); among equal values the lower index first."""
    count = e.node("Shape", [x], [e.temp("count")])[0]
    return e.node("TopK", [x, count], [e.temp("sorted"), e.temp("order")], axis=0, largest=largest, sorted=1)[1]


def _keep_top_k(e, layer, chosen: str, scores: str, classes: int) -> str:
    """Of `chosen` (in Caffe's order), those among the keep_top_k best of their image by score, order kept.

    Equal scores rank in Caffe's row order (by label, then candidate),
    where caffe-ssd's std::sort leaves them unordered.
    """
    score = e.node("GatherND", [scores, chosen], [e.temp("kept_scores")])[0]
    order = _sorted(e, score, largest=1)
    row = e.node("Gather", [chosen, e.shape_constant("row_column", [0])], [e.temp("kept_row")], axis=1)[0]
    count = e.constant("classes_count", np.asarray([classes], np.int64))
    image = e.node("Div", [row, count], [e.temp("kept_image")])[0]
    image = e.node("Gather", [image, order], [e.temp("ranked_image")])[0]
    images = e.constant("images", np.arange(layer.num, dtype=np.int64)[None, :])
    onehot = _cast(e, e.node("Equal", [image, images], [e.temp("onehot_bool")])[0], _INT64, "onehot")
    before = e.node("CumSum", [onehot, e.constant("down", np.int64(0))], [e.temp("before")], exclusive=1)[0]
    rank = e.node("Mul", [before, onehot], [e.temp("image_rank_by_image")])[0]
    rank = e.reduce("ReduceSum", rank, [1], e.temp("image_rank"), keepdims=0)
    keep = e.node("Less", [rank, e.constant("keep_top_k", np.int64(layer.keep_top_k))], [e.temp("keep")])[0]
    # NonZero and Gather rather than Compress, which more runtimes (TensorRT's parser among them) know.
    where = e.node("NonZero", [keep], [e.temp("keep_where")])[0]
    where = e.node("Reshape", [where, e.shape_constant("flat", [-1])], [e.temp("keep_at")])[0]
    kept = e.node("Gather", [order, where], [e.temp("kept_order")], axis=0)[0]
    # Back to Caffe's order: `chosen` was in it, so its indices ascending.
    kept = e.node("Gather", [kept, _sorted(e, kept, largest=0)], [e.temp("kept_in_order")], axis=0)[0]
    return e.node("Gather", [chosen, kept], [e.temp("top_kept")], axis=0)[0]


def _rows(e, chosen: str, candidates: str, scores: str, classes: list) -> str:
    """(M, 7) float32 rows [image, label, score, xmin, ymin, xmax, ymax] of `chosen` (rows of B, ranks)."""
    row = e.node("Gather", [chosen, e.shape_constant("row_columns", [0])], [e.temp("row")], axis=1)[0]
    size = e.constant("class_count", np.asarray([len(classes)], np.int64))
    image = e.node("Div", [row, size], [e.temp("image")])[0]
    label = e.node("Gather", [e.constant("labels", np.asarray(classes, dtype=np.int64)),
                              e.node("Mod", [row, size], [e.temp("class_position")])[0]], [e.temp("label")])[0]
    score = e.node("GatherND", [scores, chosen], [e.temp("score")])[0]
    score = e.node("Unsqueeze", [score, e.shape_constant("column", [1])], [e.temp("score_column")])[0]
    box = e.node("GatherND", [candidates, chosen], [e.temp("box")])[0]
    columns = [_cast(e, image, _FLOAT, "image_column"), _cast(e, label, _FLOAT, "label_column"), score, box]
    return e.node("Concat", columns, [e.temp("rows")], axis=1)[0]


def _finish(e, rows: str | None, num: int) -> None:
    """The top (1, 1, N, 7): `rows`, or where there is none (or `rows` is None) one [i, -1, ...] row per image."""
    empty = np.full((num, 7), -1, dtype=np.float32)
    empty[:, 0] = np.arange(num)
    empty = e.constant("no_detection", empty)
    e.graph.symbolic[e.outputs[0]] = {2: f"{e.outputs[0]}_rows"}
    if rows is None:
        e.node("Reshape", [empty, e.shape_constant("top_shape", [1, 1, num, 7])], e.outputs)
        return
    shape = e.node("Shape", [rows], [e.temp("rows_shape")])[0]
    count = e.node("Slice", [shape, e.shape_constant("first_row", [0]), e.shape_constant("one", [1])],
                   [e.temp("count")])[0]
    none = _cast(e, e.node("Equal", [count, e.constant("nothing", np.asarray([0], np.int64))], [e.temp("none")])[0],
                 _INT64, "none_count")
    # Nothing found: the first num rows of [rows; empty] are empty's; else the rows alone.
    end = e.node("Add", [count, e.node("Mul", [none, e.constant("image_count", np.asarray([num], np.int64))],
                                       [e.temp("fallback")])[0]], [e.temp("end")])[0]
    both = e.node("Concat", [rows, empty], [e.temp("with_empty")], axis=0)[0]
    taken = e.node("Slice", [both, e.shape_constant("first_row", [0]), end, e.shape_constant("row_axis", [0])],
                   [e.temp("taken")])[0]
    e.node("Reshape", [taken, e.shape_constant("top_shape", [1, 1, -1, 7])], e.outputs)
