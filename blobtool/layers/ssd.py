"""caffe-ssd's detection layers: PriorBox and DetectionOutput (weiliu89/caffe, ssd branch).

PriorBox mirrors prior_box_layer.cpp; DetectionOutput mirrors
detection_output_layer.cpp's Forward_cpu with the helpers of
util/bbox_util.cpp it calls (GetLocPredictions, GetConfidenceScores,
GetPriorBBoxes, DecodeBBoxesAll, ApplyNMSFast, JaccardOverlap). Boxes are
[xmin, ymin, xmax, ymax] normalized to the image. Caffe computes both in
float with some steps in double; the same steps are taken in the same
precisions here, so that which boxes survive the thresholds is what Caffe
decides. DetectionOutput's save_output_param and visualize (files and
windows) are not part of a forward pass and are not read.
"""

from __future__ import annotations

import numpy as np

from .base import FLOAT, Layer, count, register

__all__ = ["PriorBox", "DetectionOutput"]

# PriorBoxParameter.CodeType
CORNER, CENTER_SIZE, CORNER_SIZE = 1, 2, 3
CODE_TYPES = {CORNER: "CORNER", CENTER_SIZE: "CENTER_SIZE", CORNER_SIZE: "CORNER_SIZE"}

# prior_box_layer.cpp: aspect ratios closer than this are one ratio, and a ratio this close to 1 is the square box.
SAME_RATIO = 1e-6
DEFAULT_VARIANCE = 0.1          # prior_box_layer.cpp, when no variance is given
FLT_MAX = float(np.finfo(np.float32).max)
# C++'s int: Forward_cpu reads min_size and max_size into one.
_INT_LIMIT = 2 ** 31
# Candidates whose overlaps ApplyNMSFast's loop takes in one matrix (a block's overlaps with every kept box).
NMS_BLOCK = 256


def _overlaps(a: np.ndarray, a_sizes: np.ndarray, b: np.ndarray, b_sizes: np.ndarray) -> np.ndarray:
    """JaccardOverlap of each box of `a` with each of `b` (normalized boxes, sizes from BBoxSize), in float.

    IntersectBBox's test for boxes apart on an axis is left out: such boxes
    have an intersection of width or height below 0, which gives 0 as well.
    """
    width = np.minimum(a[:, None, 2], b[None, :, 2])
    width -= np.maximum(a[:, None, 0], b[None, :, 0])
    height = np.minimum(a[:, None, 3], b[None, :, 3])
    height -= np.maximum(a[:, None, 1], b[None, :, 1])
    inter = width * height
    union = a_sizes[:, None] + b_sizes[None, :]
    union -= inter
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.divide(inter, union, out=union)
    ratio[~((width > 0) & (height > 0))] = 0     # not '<= 0': a NaN width gives 0, as in Caffe
    return ratio


def _legacy(layer: Layer, shape: tuple, what: str) -> tuple:
    """Blob's num(), channels(), height(), width(): padded with 1s to 4 axes (Caffe CHECKs at most 4)."""
    shape = tuple(shape)
    if len(shape) > 4:
        raise layer.error(f"{what} {shape} has {len(shape)} axes; Caffe's {layer.type} reads num, channels, "
                          "height and width, so at most 4")
    return shape + (1,) * (4 - len(shape))


@register("PriorBox")
class PriorBox(Layer):
    """caffe-ssd's PriorBoxLayer (prior_box_layer.cpp): the default boxes of one feature map, and their variances.

    Bottoms: the feature map (its H x W cells) and the image (its size,
    unless img_size / img_h, img_w give it). Top (1, 2, H * W * priors * 4):
    channel 0 the boxes, channel 1 their variances (one value for all, or
    four per box). For each cell (h, w), row by row, centred at ((w +
    offset) step_w, (h + offset) step_h) (step from step / step_h, step_w,
    else image size / feature size), and for each min_size in turn: the
    square of side min_size; then, with max sizes, the square of side
    sqrt(min_size * max_size); then one box per aspect ratio r other than 1,
    min_size sqrt(r) wide and min_size / sqrt(r) high. Ratios are 1 followed
    by the given ones without repeats, each followed by 1 / r with flip.
    Caffe reads min_size and max_size into an int here (30.5 is 30) and
    divides by the image size in double; clip limits every coordinate to
    [0, 1].
    """

    bottoms = (2, 2)

    def setup(self) -> None:
        p = self.param.prior_box_param
        if not len(p.min_size):
            raise self.error("gives no min_size; PriorBox must be given min_size")
        self.min_sizes = [float(v) for v in p.min_size]
        for v in self.min_sizes:
            # CHECK_GT(min_sizes_.back(), 0): a NaN fails it too.
            if not v > 0:
                raise self.error(f"min_size {v}: min_size must be positive")
        ratios = [1.0]
        for r in p.aspect_ratio:
            # Kept as float32, as Caffe's vector<float>; 1 / r computed in double then stored (1 / 0 is inf,
            # as in C++: Caffe refuses no ratio, and a ratio of 0 or below gives boxes of Inf or NaN).
            r = float(np.float32(r))
            if any(abs(r - known) < SAME_RATIO for known in ratios):
                continue
            ratios.append(r)
            if p.flip:
                with np.errstate(divide="ignore"):
                    ratios.append(float(np.float32(np.float64(1.0) / np.float64(r))))
        self.ratios = ratios
        self.max_sizes = [float(v) for v in p.max_size]
        if self.max_sizes:
            if len(self.max_sizes) != len(self.min_sizes):
                raise self.error(f"gives {len(self.max_sizes)} max_size for {len(self.min_sizes)} min_size; give "
                                 "one max_size per min_size, or none")
            for lo, hi in zip(self.min_sizes, self.max_sizes):
                if not hi > lo:
                    raise self.error(f"max_size {hi} is not greater than its min_size {lo}; max_size must be "
                                     "greater than min_size")
        # Forward_cpu reads each size into an int (int min_size_ = min_sizes_[s]) and multiplies min by max
        # in int: past INT_MAX (an Inf among them) C++ leaves the result undefined, so no box is Caffe's.
        for field, values in (("min_size", self.min_sizes), ("max_size", self.max_sizes)):
            for v in values:
                if not v < _INT_LIMIT:
                    raise self.error(f"{field} {v}: caffe-ssd reads it into an int, which holds at most "
                                     f"{_INT_LIMIT - 1:,}")
        for lo, hi in zip(self.min_sizes, self.max_sizes):
            if int(lo) * int(hi) >= _INT_LIMIT:
                raise self.error(f"min_size {int(lo)} times max_size {int(hi)} is past the {_INT_LIMIT - 1:,} "
                                 "of the int caffe-ssd computes it in")
        self.num_priors = len(self.ratios) * len(self.min_sizes) + len(self.max_sizes)
        self.clip = bool(p.clip)
        variance = [float(v) for v in p.variance]
        if len(variance) > 1 and len(variance) != 4:
            raise self.error(f"gives {len(variance)} variances; give one, or four (one per coordinate)")
        if any(not v > 0 for v in variance):  # CHECK_GT(variance, 0): a NaN fails it
            raise self.error(f"variance {variance}: each variance must be positive")
        self.variance = variance or [DEFAULT_VARIANCE]
        if p.HasField("img_h") or p.HasField("img_w"):
            if p.HasField("img_size"):
                raise self.error("gives img_size and img_h/img_w; give either img_size or img_h/img_w, not both")
            self.img_h, self.img_w = int(p.img_h), int(p.img_w)
            if self.img_h <= 0 or self.img_w <= 0:
                raise self.error(f"img_h {self.img_h} and img_w {self.img_w}: both should be larger than 0")
        elif p.HasField("img_size"):
            if p.img_size <= 0:
                raise self.error("img_size is 0; img_size should be larger than 0")
            self.img_h = self.img_w = int(p.img_size)
        else:
            self.img_h = self.img_w = 0
        if p.HasField("step_h") or p.HasField("step_w"):
            if p.HasField("step"):
                raise self.error("gives step and step_h/step_w; give either step or step_h/step_w, not both")
            self.step_h, self.step_w = FLOAT(p.step_h), FLOAT(p.step_w)
            if not (self.step_h > 0 and self.step_w > 0):
                raise self.error(f"step_h {self.step_h} and step_w {self.step_w}: both should be larger than 0")
        elif p.HasField("step"):
            if not p.step > 0:
                raise self.error(f"step is {p.step}; step should be larger than 0")
            self.step_h = self.step_w = FLOAT(p.step)
        else:
            self.step_h = self.step_w = FLOAT(0)
        self.offset = FLOAT(p.offset)

    def reshape(self, shapes: list) -> list:
        feature = _legacy(self, shapes[0], "bottom 0 (the feature map)")
        image = _legacy(self, shapes[1], "bottom 1 (the image)")
        self.height, self.width = feature[2], feature[3]
        if self.img_h == 0 or self.img_w == 0:
            self.image = (image[2], image[3])
        else:
            self.image = (self.img_h, self.img_w)
        size = self.height * self.width * self.num_priors * 4
        if size <= 0:
            raise self.error(f"the feature map {tuple(shapes[0])} has no cells to put priors on")
        if 0 in self.image:
            raise self.error(f"the image is {self.image[0]} x {self.image[1]}; priors are normalized by its size")
        return [(1, 2, size)]

    def workspace(self, shapes: list) -> tuple:
        """The boxes computed in double before they are stored in float: as many bytes as the top."""
        return 2 * self.height * self.width * self.num_priors * 4, "boxes in double"

    def _box_sizes(self) -> tuple:
        """The (width, height) of each prior of a cell, in float as Caffe computes them, in Caffe's order."""
        widths, heights = [], []
        for k, low in enumerate(self.min_sizes):
            low = int(low)                      # int min_size_ = min_sizes_[s]
            widths.append(low)
            heights.append(low)
            if self.max_sizes:
                side = np.sqrt(float(low * int(self.max_sizes[k])))   # sqrt of an int product, in double
                widths.append(side)
                heights.append(side)
            for r in self.ratios:
                if abs(r - 1.0) < SAME_RATIO:
                    continue
                root = np.sqrt(r)
                widths.append(low * root)
                heights.append(low / root)
        # box_width and box_height are float variables.
        return np.asarray(widths, dtype=FLOAT), np.asarray(heights, dtype=FLOAT)

    def forward(self, xs: list) -> list:
        # A ratio of 0 or below gives Inf or NaN sizes, as Caffe computes them; numpy need not say so.
        with np.errstate(all="ignore"):
            return self._priors()

    def _priors(self) -> list:
        """The top: the boxes of every cell then their variances, as (1, 2, H * W * priors * 4)."""
        img_h, img_w = self.image
        if self.step_w == 0 or self.step_h == 0:
            step_w, step_h = FLOAT(img_w) / FLOAT(self.width), FLOAT(img_h) / FLOAT(self.height)
        else:
            step_w, step_h = self.step_w, self.step_h
        # center_x = (w + offset_) * step_w, all in float.
        cx = (np.arange(self.width, dtype=FLOAT) + self.offset) * step_w
        cy = (np.arange(self.height, dtype=FLOAT) + self.offset) * step_h
        bw, bh = self._box_sizes()
        half_w, half_h = bw.astype(np.float64) / 2.0, bh.astype(np.float64) / 2.0
        cx64, cy64 = cx.astype(np.float64)[None, :, None], cy.astype(np.float64)[:, None, None]
        shape = (self.height, self.width, bw.size)
        # (center - box / 2.) / img in double, stored in float: per cell row by row, per prior, xmin ymin xmax ymax.
        boxes = np.empty(shape + (4,), dtype=np.float64)
        boxes[..., 0] = np.broadcast_to((cx64 - half_w) / img_w, shape)
        boxes[..., 1] = np.broadcast_to((cy64 - half_h) / img_h, shape)
        boxes[..., 2] = np.broadcast_to((cx64 + half_w) / img_w, shape)
        boxes[..., 3] = np.broadcast_to((cy64 + half_h) / img_h, shape)
        boxes = boxes.astype(FLOAT).reshape(-1)
        if self.clip:
            boxes = np.clip(boxes, FLOAT(0), FLOAT(1))
        variances = np.resize(np.asarray(self.variance, dtype=FLOAT), boxes.size)
        return [np.stack([boxes, variances])[None]]


@register("DetectionOutput")
class DetectionOutput(Layer):
    """caffe-ssd's DetectionOutputLayer (detection_output_layer.cpp): SSD's boxes decoded, suppressed and kept.

    Bottoms: the location predictions (num, priors * loc classes * 4), the
    confidences (num, priors * num_classes; already softmaxed by the net)
    and the priors (PriorBox's (1, 2, priors * 4)). For each image and each
    class but the background: the boxes scoring above confidence_threshold,
    best first, the top_k best of them, kept greedily when their overlap
    (intersection over union) with every box kept before is at most
    nms_threshold (which eta < 1 lowers after each kept box while it is
    above 0.5); then, past keep_top_k boxes in an image, the keep_top_k best
    of all its classes. The top is (1, 1, N, 7), rows [image, label, score,
    xmin, ymin, xmax, ymax] by image, then label, then score; with no
    detection at all, one row [image, -1, ..., -1] per image.

    With shared boxes and background_label_id -1 (no background class),
    caffe-ssd's Forward_cpu leaves the shared boxes undecoded and stops
    ("Could not find location predictions for label -1"), while its
    Forward_gpu decodes and uses them; the GPU path is taken here.

    The number of rows is known only once the data is: reshape() gives
    Caffe's Reshape's (1, 1, 1, 7), and forward() the top's real shape
    (`variable_tops` says so to a runner). Its top is rows of detections
    (`detection_rows`: a check compares them row by row).
    """

    bottoms = (3, 3)
    variable_tops = True
    detection_rows = True

    def setup(self) -> None:
        p = self.param.detection_output_param
        if not p.HasField("num_classes"):
            raise self.error("gives no num_classes; DetectionOutput must be given num_classes")
        self.num_classes = int(p.num_classes)
        self.share_location = bool(p.share_location)
        self.loc_classes = 1 if self.share_location else self.num_classes
        self.background = int(p.background_label_id)
        self.code_type = int(p.code_type)
        if self.code_type not in CODE_TYPES:
            raise self.error(f"code_type {self.code_type} is none of CORNER, CENTER_SIZE, CORNER_SIZE")
        self.in_target = bool(p.variance_encoded_in_target)
        self.keep_top_k = int(p.keep_top_k)
        self.threshold = FLOAT(p.confidence_threshold) if p.HasField("confidence_threshold") else FLOAT(-FLT_MAX)
        nms = p.nms_param
        self.nms_threshold = FLOAT(nms.nms_threshold)
        if not self.nms_threshold >= 0:   # CHECK_GE(nms_threshold_, 0.): a NaN fails it too
            raise self.error(f"nms_threshold is {self.nms_threshold}; nms_threshold must be non negative")
        self.eta = FLOAT(nms.eta)
        if not 0 < self.eta <= 1:
            raise self.error(f"eta is {self.eta}; eta must be in (0, 1]")
        self.top_k = int(nms.top_k) if nms.HasField("top_k") else -1

    def reshape(self, shapes: list) -> list:
        loc, conf, prior = (_legacy(self, s, what) for s, what in
                            zip(shapes, ("bottom 0 (locations)", "bottom 1 (confidences)", "bottom 2 (priors)")))
        if loc[0] != conf[0]:
            raise self.error(f"locations {tuple(shapes[0])} and confidences {tuple(shapes[1])} are for "
                             f"{loc[0]} and {conf[0]} images")
        self.num = loc[0]
        self.num_priors = prior[2] // 4
        if self.num_priors * self.loc_classes * 4 != loc[1]:
            raise self.error(f"{self.num_priors} priors x {self.loc_classes} location classes x 4 is not the "
                             f"{loc[1]} channels of the locations {tuple(shapes[0])}: the number of priors must "
                             "match the number of location predictions")
        if self.num_priors * self.num_classes != conf[1]:
            raise self.error(f"{self.num_priors} priors x {self.num_classes} classes is not the {conf[1]} channels "
                             f"of the confidences {tuple(shapes[1])}: the number of priors must match the number "
                             "of confidence predictions")
        if count(shapes[2]) < 2 * self.num_priors * 4:
            raise self.error(f"the priors {tuple(shapes[2])} hold no variances after their boxes")
        return [(1, 1, 1, 7)]

    # -- bbox_util.cpp ----------------------------------------------------------------------------

    def _decode(self, loc: np.ndarray, prior: np.ndarray, var: np.ndarray) -> np.ndarray:
        """DecodeBBox for every prior: (P, 4) location predictions -> (P, 4) boxes, float."""
        if self.in_target:
            var = np.ones_like(var)    # the variance is in the prediction already: the same formulas with 1
        pxmin, pymin, pxmax, pymax = prior.T
        if self.code_type == CORNER:
            # prior corner + variance * offset, in float
            return (prior + var * loc).astype(FLOAT)
        pw, ph = pxmax - pxmin, pymax - pymin
        if np.any(pw <= 0) or np.any(ph <= 0):
            bad = int(np.flatnonzero((pw <= 0) | (ph <= 0))[0])
            raise self.error(f"prior {bad} {prior[bad].tolist()} has no width or height; {CODE_TYPES[self.code_type]} "
                             "decoding divides by it")
        if self.code_type == CORNER_SIZE:
            scale = np.stack([pw, ph, pw, ph], axis=1)
            return (prior + var * loc * scale).astype(FLOAT)
        # CENTER_SIZE: centre (x + y) / 2. in double, stored in float; width exp(v * l) * w with exp in double.
        pcx = ((pxmin + pxmax).astype(np.float64) / 2.0).astype(FLOAT)
        pcy = ((pymin + pymax).astype(np.float64) / 2.0).astype(FLOAT)
        cx = var[:, 0] * loc[:, 0] * pw + pcx
        cy = var[:, 1] * loc[:, 1] * ph + pcy
        w = (np.exp((var[:, 2] * loc[:, 2]).astype(np.float64)) * pw).astype(FLOAT)
        h = (np.exp((var[:, 3] * loc[:, 3]).astype(np.float64)) * ph).astype(FLOAT)
        cx, cy = cx.astype(np.float64), cy.astype(np.float64)
        half_w, half_h = w.astype(np.float64) / 2.0, h.astype(np.float64) / 2.0
        return np.stack([cx - half_w, cy - half_h, cx + half_w, cy + half_h], axis=1).astype(FLOAT)

    @staticmethod
    def _sizes(boxes: np.ndarray) -> np.ndarray:
        """BBoxSize (normalized): width * height in float, 0 for a box whose max is below its min."""
        w = boxes[:, 2] - boxes[:, 0]
        h = boxes[:, 3] - boxes[:, 1]
        return np.where((w < 0) | (h < 0), FLOAT(0), w * h).astype(FLOAT)

    def _nms(self, boxes: np.ndarray, sizes: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """ApplyNMSFast: indices kept, best first.

        Caffe tries each candidate, best first, against every box kept so
        far. The same decisions are taken here a block of candidates at a
        time: their overlaps with the boxes kept before the block in one
        matrix, then with each other, walked in order.
        """
        # GetMaxScoreIndex: scores above the threshold, stable-sorted best first, the top_k first of them.
        candidates = np.flatnonzero(scores > self.threshold)
        candidates = candidates[np.argsort(-scores[candidates], kind="stable")]
        if -1 < self.top_k < candidates.size:
            candidates = candidates[:self.top_k]
        threshold = self.nms_threshold
        kept = np.empty(candidates.size, dtype=np.intp)
        nkept = 0
        for start in range(0, candidates.size, NMS_BLOCK):
            block = candidates[start:start + NMS_BLOCK]
            # keep = overlap <= adaptive_threshold for every kept box: the largest overlap decides (NaN keeps none).
            if nkept:
                earlier = _overlaps(boxes[block], sizes[block], boxes[kept[:nkept]], sizes[kept[:nkept]]).max(axis=1)
            else:
                earlier = np.full(block.size, -np.inf, dtype=FLOAT)
            among = _overlaps(boxes[block], sizes[block], boxes[block], sizes[block])
            chosen: list = []
            for j in range(block.size):
                if not earlier[j] <= threshold:
                    continue
                if chosen and not np.all(among[j, chosen] <= threshold):
                    continue
                chosen.append(j)
                if self.eta < 1 and threshold > 0.5:
                    threshold = FLOAT(threshold * self.eta)
            kept[nkept:nkept + len(chosen)] = block[chosen]
            nkept += len(chosen)
        return kept[:nkept]

    def forward(self, xs: list) -> list:
        num, priors, classes = self.num, self.num_priors, self.num_classes
        # Caffe reads each image's predictions as the next priors * classes (* 4) values of the blob.
        loc = xs[0].reshape(-1)[:num * priors * self.loc_classes * 4].reshape(num, priors, self.loc_classes, 4)
        conf = xs[1].reshape(-1)[:num * priors * classes].reshape(num, priors, classes)
        flat = xs[2].reshape(-1)
        prior = flat[:priors * 4].reshape(priors, 4)
        var = flat[priors * 4:2 * priors * 4].reshape(priors, 4)
        rows = []
        for i in range(num):
            # DecodeBBoxesAll: one set of boxes per location class, none for the background's. (Shared boxes
            # are labelled -1; Caffe's CPU path also skips them when background_label_id is -1, then stops
            # for want of them, while its GPU path decodes them: the GPU path is followed.)
            decoded = {}
            for c in range(self.loc_classes):
                label = -1 if self.share_location else c
                if not self.share_location and label == self.background:
                    continue
                boxes = self._decode(loc[i, :, c], prior, var)
                decoded[label] = (boxes, self._sizes(boxes))
            found = {}
            for c in range(classes):
                if c == self.background:
                    continue
                boxes, sizes = decoded[-1 if self.share_location else c]
                found[c] = self._nms(boxes, sizes, conf[i, :, c])
            picked = [(float(conf[i, idx, c]), c, int(idx)) for c, kept in found.items() for idx in kept]
            if -1 < self.keep_top_k < len(picked):
                # The keep_top_k best of the image's detections (Caffe's std::sort by score; ties in label order).
                order = sorted(range(len(picked)), key=lambda k: -picked[k][0])[:self.keep_top_k]
                found = {}
                for k in order:
                    found.setdefault(picked[k][1], []).append(picked[k][2])
            for c in sorted(found):
                boxes = decoded[-1 if self.share_location else c][0]
                for idx in found[c]:
                    rows.append([i, c, conf[i, idx, c], *boxes[idx]])
        if not rows:
            # No detection in any image: one row [i, -1, -1, -1, -1, -1, -1] per image.
            empty = np.full((num, 7), -1, dtype=FLOAT)
            empty[:, 0] = np.arange(num)
            return [empty[None, None]]
        return [np.asarray(rows, dtype=FLOAT)[None, None]]
