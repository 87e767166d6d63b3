"""Caffe's schema asked for its field numbers: from the generated descriptors (proto/), never typed in.

The module that parses a layer by hand (the wire format, without protobuf)
still needs each field's number; these functions give them from
blobtool_caffe.proto's descriptors, which hold Caffe's own numbers. protobuf
is imported on the first question, not at import (the command's start-up).
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["layer_field", "param_field", "layer_field_name", "FORK_PARAMS", "fork_fields", "RENUMBERED", "renumbered"]

# The forks' parameter messages the schema holds, and the layer types that own each. Their
# numbers are not BVLC's and other forks use them for other messages (a quantization fork's
# Convolution layers hold theirs under 149-152): a layer of another type keeps such a field
# as bytes blobtool does not understand, never parsed as the message named here.
FORK_PARAMS = {
    "upsample_param": ("Upsample",),
    "interp_param": ("Interp",),
    "shuffle_channel_param": ("ShuffleChannel",),
    "bn_param": ("BN",),
    "roi_pooling_param": ("ROIPooling",),
    "psroi_pooling_param": ("PSROIPooling",),
    "reorg_param": ("Reorg",),
}


# A fork's message stored under another number than the schema's, read as that message in layers of the
# fork's type: caffe-segnet stores its UpsampleParameter under 137, which BVLC gives to embed_param (meaningless
# in an Upsample layer). {layer type: {number: field name}}.
RENUMBERED = {
    "Upsample": {137: "upsample_param"},
}


def renumbered(layer_type: str) -> dict:
    """{field number: the field it stands for} of the fork numbers read as another field in a layer of `layer_type`."""
    return RENUMBERED.get(layer_type, {})


def _pb():
    from ..._pb import blobtool_caffe_pb2 as pb  # protobuf loads only where the schema is asked

    return pb


@lru_cache(maxsize=None)
def layer_field(name: str, v1: bool = False) -> int | None:
    """The number of LayerParameter's field `name` (V1LayerParameter's with `v1`), None where it has none."""
    message = _pb().V1LayerParameter if v1 else _pb().LayerParameter
    fd = message.DESCRIPTOR.fields_by_name.get(name)
    return None if fd is None else fd.number


@lru_cache(maxsize=None)
def param_field(param: str, name: str) -> int:
    """The number of field `name` in the layer parameter message `param` ("convolution_param", "group": 5)."""
    message = _pb().LayerParameter.DESCRIPTOR.fields_by_name[param].message_type
    return message.fields_by_name[name].number


@lru_cache(maxsize=None)
def layer_field_name(number: int) -> str | None:
    """The name of LayerParameter's field `number` (106: "convolution_param"), None where it has none."""
    fd = _pb().LayerParameter.DESCRIPTOR.fields_by_number.get(number)
    return None if fd is None else fd.name


@lru_cache(maxsize=None)
def _fork_numbers() -> tuple:
    return tuple((layer_field(name), owners) for name, owners in FORK_PARAMS.items())


def fork_fields(layer_type: str) -> frozenset:
    """The numbers of the forks' parameter fields (FORK_PARAMS) that a layer of type `layer_type` does not own."""
    return frozenset(number for number, owners in _fork_numbers() if layer_type not in owners)
