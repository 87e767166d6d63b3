"""A layer type's blob count is stated once, in its row (net/layertypes.py), and the class that runs it reads it.

- Every type that runs: its class's (fewest, most) is the row's blob_range,
  and the counts the row's rule gives a layer (blob_count, over the
  parameters it reads: bias_term, one bottom or two) lie in that range,
  the fewest reached; the most is reached too, but for BatchNorm, whose
  five are NVIDIA Caffe's (a scale and a bias of its own).
- Bias, per Caffe's bias_layer.cpp: one blob with one bottom, none with
  two. A Bias of two blobs is refused by blobtool's run and, the oracle, by
  real Caffe (CopyTrainedLayersFrom's "Incompatible number of blobs").
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from blobtool._pb import blobtool_caffe_pb2 as pb
from blobtool.layers import LayerError, layer_class
from blobtool.net.layertypes import TYPES, blob_count, blob_range
from caffenets import layer, net

# The types whose row holds more blob roles than its count rule ever gives, and why.
_BEYOND_THE_RULE = {"BatchNorm": 5}  # NVIDIA Caffe's BatchNorm: mean, variance, factor, scale, bias


def _variants(row):
    """LayerParameters of type `row` for every setting its count rule reads: bias_term either way, 1 to 3 bottoms."""
    for bias_term, bottoms in itertools.product((False, True), (1, 2, 3)):
        message = pb.LayerParameter(name="l", type=row.name, bottom=["a", "b", "c"][:bottoms], top=["l"])
        if row.param is not None and hasattr(getattr(message, row.param), "bias_term"):
            getattr(message, row.param).bias_term = bias_term
        yield message


@pytest.mark.parametrize("kind", sorted(k for k, r in TYPES.items() if r.run is not None))
def test_the_class_that_runs_a_type_reads_its_rows_count(kind):
    low, high = blob_range(kind)
    assert layer_class(kind).blob_count == (low, high)
    counts = {blob_count(kind, message) for message in _variants(TYPES[kind])}
    assert None not in counts, f"{kind}: its row states no count"
    assert min(counts) == low and max(counts) <= high
    assert max(counts) == high or high == _BEYOND_THE_RULE.get(kind), (kind, counts, high)


def test_bias_holds_one_blob_with_one_bottom_and_none_with_two():
    one, two = (pb.LayerParameter(type="Bias", bottom=bottoms) for bottoms in (["a"], ["a", "b"]))
    assert (blob_count("Bias", one), blob_count("Bias", two)) == (1, 0)
    assert blob_range("Bias") == (0, 1)  # Scale's (0, 2) is not Bias's
    assert blob_range("Scale") == (0, 2)


def _two_blob_bias():
    return net([layer("b", "Bias", "a", "b", blobs=[np.ones(3), np.ones(3)])], {"a": (2, 3, 4)})


def test_a_bias_of_two_blobs_is_refused():
    message = _two_blob_bias().layer[0]
    bias = layer_class("Bias")("b", "Bias", message, [np.ones(3, np.float32)] * 2)
    with pytest.raises(LayerError, match=r"^layer 'b' \(Bias\): holds 2 blobs, expected 0 to 1$"):
        bias.check_counts(1, 1)


# Slow as well: this module's one Caffe case pays the worker's start (7 s) alone.
@pytest.mark.slow
@pytest.mark.caffe
def test_caffe_refuses_a_bias_of_two_blobs_too(tmp_path):
    from caffeoracle import caffe_refusal

    refusal = caffe_refusal(_two_blob_bias(), {"a": np.ones((2, 3, 4), np.float32)}, tmp_path)
    assert refusal is not None and "Incompatible number of blobs for layer b" in str(refusal), refusal
