"""Who reads what in a net: each blob name followed version by version through the layers, in order.

Caffe's nets work in place: a ReLU, a BatchNorm or a Scale may read and
write the same blob name, so "conv1" holds another value after each of them.
A layer's bottom reads the version the last layer before it to write that
name left; fold (which BatchNorm takes which Scale, whether anything else
reads a folded output), ``--names torch`` (which Scale merges into a
BatchNorm's module), ``--drop`` (who still reads a dropped layer's output),
a deploy definition's wiring check, a run (which blob it may let go after
which layer, which it may overwrite in place, the net's outputs) and an
export (which versions keep their blob's name, which layers an output
needs) all follow blobs this one way: Versions, walked once per net (a
View of net/model.py, a Program of forward/runner.py).
"""

from __future__ import annotations

from functools import cached_property

__all__ = ["Versions", "scale_merge", "OTHER_READERS", "SECOND_BOTTOM", "OWN_SCALE", "NOT_PER_CHANNEL",
           "OTHER_COUNT"]


class Versions:
    """Each blob name followed version by version through layers given as (bottoms, tops), in order; walked once.

    An in-place layer reads one version and writes the next. A version is
    (writer's index, which of its tops); a bottom that no layer before it
    writes (a net input) reads None. Everything a job asks of the wiring
    comes from this one walk:

    - `reads[i]`: per bottom of layer i, the version it reads;
    - `readers`: {version: indices of the layers reading it}, each layer
      once, in order (a net input's readers are not listed);
    - `freed[i]`: the bottom names whose value layer i is the last to read
      (a net input's included): what a run may let go after it;
    - `final[i]`: per top of layer i, whether it is the blob's last version;
    - `outputs`: Caffe's net outputs, the blobs whose last version no layer
      reads, in the order of that write (Net::Init's available_blobs: a
      bottom is taken out, a top put back, so an in-place layer's top stays
      an output);
    - `needed(wanted)`: the layers the last versions of blobs `wanted` are
      computed from.
    """

    def __init__(self, links: list):
        self.links = links
        current: dict = {}
        self.reads: list = []
        self.readers: dict = {}
        last: dict = {}      # version, or a net input's name, -> the last layer reading it
        first: dict = {}     # blob names in the order layers first write them
        for i, (bottoms, tops) in enumerate(links):
            versions = [current.get(b) for b in bottoms]
            self.reads.append(versions)
            for v in dict.fromkeys(v for v in versions if v is not None):
                self.readers.setdefault(v, []).append(i)
            for b, v in zip(bottoms, versions):
                last[b if v is None else v] = i
            for k, top in enumerate(tops):
                current[top] = (i, k)
                first.setdefault(top)
        self.current = current   # blob name -> its last version
        self._last, self._first = last, first

    # What only a run or an export asks, made when first asked (a net model's view never does).

    @cached_property
    def freed(self) -> list:
        last = self._last
        return [{b for b, v in zip(bottoms, self.reads[i]) if last[b if v is None else v] == i}
                for i, (bottoms, _) in enumerate(self.links)]

    @cached_property
    def final(self) -> list:
        return [[self.current[top][0] == i for top in tops] for i, (_, tops) in enumerate(self.links)]

    @cached_property
    def outputs(self) -> list:
        # Ties (the tops of one layer) keep the order the names were first written in.
        current = self.current
        return [name for name in sorted(self._first, key=lambda n: current[n][0]) if current[name] not in self.readers]

    def needed(self, wanted) -> set:
        """The indices of the layers the blobs `wanted` (each its last version) are computed from."""
        found: set = set()
        open_versions = [self.current[name] for name in wanted if name in self.current]
        while open_versions:
            i = open_versions.pop()[0]
            if i not in found:
                found.add(i)
                open_versions.extend(v for v in self.reads[i] if v is not None)
        return found


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
