"""Caffe's protobuf files: BlobProto, BlobProtoVector, NetParameter (three layer formats), SolverState.

The codec, bottom up: wire.py (the protobuf wire format), blobheader.py (a
BlobProto's small fields), blobproto.py (a BlobProto's payloads, located
without copying), blobwrite.py (a Blob as BlobProto, in chunks). The
format module the registry (blobtool.formats) uses: sniff.py (which
message a file holds) and containers.py (reading, rewriting a container,
writing another format's net or solver state); its functions are the
names below.
"""

from __future__ import annotations

from .containers import (MAX_LAYERS, MAX_NAME, V1_TYPE_NAMES, container_parts, layer_links,
                         layer_param_values, layer_param_varints, read, save_blob, write, write_container, write_new)
from .sniff import sniff

__all__ = ["sniff", "read", "write", "write_new", "write_container", "save_blob", "container_parts", "MAX_LAYERS",
           "MAX_NAME", "V1_TYPE_NAMES", "layer_links", "layer_param_varints", "layer_param_values"]
