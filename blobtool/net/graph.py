"""Who reads what in a net: each blob name followed version by version through the layers, in order.

Caffe's nets work in place: a ReLU, a BatchNorm or a Scale may read and
write the same blob name, so "conv1" holds another value after each of them.
A layer's bottom reads the version the last layer before it to write that
name left; fold (which BatchNorm takes which Scale, whether anything else
reads a folded output), ``--names torch`` (which Scale merges into a
BatchNorm's module), ``--drop`` (who still reads a dropped layer's output)
and a deploy definition's wiring check all follow blobs this one way.
"""

from __future__ import annotations

__all__ = ["blob_versions", "scale_merge", "OTHER_READERS", "SECOND_BOTTOM", "OWN_SCALE", "NOT_PER_CHANNEL",
           "OTHER_COUNT"]


def blob_versions(links: list) -> tuple[list, dict]:
    """Each blob name followed version by version through layers given as (bottoms, tops), in order.

    Returns (per layer, the version each bottom reads: (writer's index, which
    of its tops), or None for a net input; {version: indices of the layers
    reading it}, each layer once, in order). An in-place layer reads one
    version and writes the next.
    """
    current: dict = {}
    inputs: list = []
    readers: dict = {}
    for i, (bottoms, tops) in enumerate(links):
        versions = [current.get(b) for b in bottoms]
        inputs.append(versions)
        for v in dict.fromkeys(v for v in versions if v is not None):
            readers.setdefault(v, []).append(i)
        for k, top in enumerate(tops):
            current[top] = (i, k)
    return inputs, readers


# Why a Scale does not merge into the BatchNorm before it (scale_merge): each caller words it.
OTHER_READERS, SECOND_BOTTOM, OWN_SCALE, NOT_PER_CHANNEL, OTHER_COUNT = (
    "other readers", "second bottom", "own scale", "not per channel", "other count")


def scale_merge(*, others: list, bottoms: int, batchnorm_blobs: int, axis: int, num_axes: int, counts: list,
                channels: int | None) -> tuple | None:
    """Whether a Scale reading a BatchNorm's output merges with it into one affine BatchNorm: None, or why not.

    The one rule fold and --names torch share: the Scale must be the only
    reader of that output (`others`: the other layers reading the same
    version), take its scale from its blobs (one bottom), follow a
    BatchNorm without a scale of its own (Caffe's 3 blobs, not NVIDIA
    Caffe's 5), scale one value per channel (axis 1, one axis) and hold as
    many values (`counts`, each of its blobs) as the BatchNorm has channels.
    Returns (reason, detail): OTHER_READERS (the names), SECOND_BOTTOM,
    OWN_SCALE, NOT_PER_CHANNEL ((axis, num_axes)), OTHER_COUNT (the counts).
    """
    if others:
        return OTHER_READERS, others
    if bottoms > 1:
        return SECOND_BOTTOM, bottoms
    if batchnorm_blobs == 5:
        return OWN_SCALE, batchnorm_blobs
    if axis != 1 or num_axes != 1:
        return NOT_PER_CHANNEL, (axis, num_axes)
    if channels is not None and any(count != channels for count in counts):
        return OTHER_COUNT, counts
    return None
