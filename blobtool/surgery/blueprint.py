"""A net's blobs made from its definition alone: a .prototxt as the template of transplant.

A definition holds no blobs. How many each layer has comes from its type and
parameters, as Caffe's layers make them in LayerSetUp:

================================  ==============================================================
layer type                        blobs
================================  ==============================================================
Convolution, Deconvolution        weight; bias unless ``convolution_param { bias_term: false }``
InnerProduct                      weight; bias unless ``inner_product_param { bias_term: false }``
Embed                             weight; bias unless ``embed_param { bias_term: false }``
BatchNorm                         3: the sums of the mean and variance, and their factor
Scale                             the scale (with one bottom; a second bottom gives it), and a bias
                                  with ``scale_param { bias_term: true }``
Bias                              the bias (with one bottom)
PReLU                             the slopes
the others net/layertypes.py has  none
any other                         as many as the values given for it (``<layer>/<k>`` or
                                  ``<layer>.<k>``, k = 0, 1, ...), with a line saying so
================================  ==============================================================

The shapes come from the values, read back through the naming scheme's own
rows (torchport/naming.py): the blob names of each layer are found by naming a
net of the definition's layers whose blobs have placeholder shapes, and each
blob then takes its value's shape as Caffe stores it: the same, but for a
transposed InnerProduct weight ((N, K) given, (K, N) stored), a shared PReLU
slope (no axes in Caffe) and BatchNorm's factor (one value, 1). The blobs are
then filled as for any template (surgery/into.py), with no template values to
keep: every blob needs a value. Values are stored as float64 where the
source holds float64, else float32 (standard Caffe's two types), unless a
precision is asked for.
"""

from __future__ import annotations

import numpy as np

from ..engine.blob import Blob
from ..errors import UsageError
from ..formats import Document, Entry
from ..formats.origin import Origin
from ..net.layertypes import blob_count, foldable
from ..net.model import model

__all__ = ["blob_counts", "template_from_definition", "net_with_blobs"]

def blob_counts(doc: Document) -> dict:
    """{layer name: blob count} by type and parameters (net/layertypes.py), None for a type without a rule."""
    return {layer.name: blob_count(layer.type, layer.stored.message) for layer in model(doc).layers}


def _matrix(kind: str | None) -> bool:
    """Whether a layer of type `kind` holds its weight as a matrix (net/layertypes.py: an InnerProduct's)."""
    how = foldable(kind)
    return how is not None and how.channels == "matrix"


def template_from_definition(doc: Document, values: dict, names: str, fold: bool, precision, notes: list) -> Document:
    """A net Document of `doc`'s layers (a .prototxt) with blobs shaped by `values` ({name: value with .shape}).

    Its blobs hold placeholders (zeros; BatchNorm's factor 1) and an origin
    in the type the values will be written in; fit() then fills them.
    """
    counts = blob_counts(doc)
    guessed = {}
    unruled = []
    net = model(doc)
    for layer in net.layers:
        count = counts[layer.name]
        if count is None:
            sep = "." if names == "torch" else "/"
            count = 0
            while f"{layer.name}{sep}{count}" in values:
                count += 1
            unruled.append(f"{layer.name} ({layer.stored.type or 'no type'}: {count})")
        guessed[layer.name] = count
    if unruled:
        notes.append(f"{doc.path}: the definition does not say how many blobs these layers hold; each takes the "
                     f"values given for it: {', '.join(unruled)}")
    placeholder = _doc(doc, {name: [(1, 1) if (k == 0 and _matrix(layer_type)) else (1,)
                                    for k in range(guessed[name])]
                             for name, layer_type in ((layer.name, layer.type) for layer in net.layers)},
                       precision, {})
    shapes: dict = {}
    dtypes: dict = {}
    shared = {layer.name for layer in net.layers
              if layer.type == "PReLU" and layer.stored.message.prelu_param.channel_shared}
    for entry, name, made in _named(placeholder, names, fold):
        value = values.get(name) if name is not None else None
        layer, index = entry.layer, int(entry.name.rpartition("/")[2])
        shape = _stored_shape(made, value, layer in shared)
        shapes.setdefault(layer, [None] * guessed[layer])[index] = shape
        if value is not None:
            dtypes[entry.name] = np.dtype(getattr(value, "dtype", np.float32))
    return _doc(doc, {layer.name: shapes.get(layer.name, []) for layer in doc.layers}, precision, dtypes)


def _named(doc: Document, names: str, fold: bool):
    """(entry, the name its value has, how it is made) per blob of `doc`, by the naming scheme."""
    if names == "blobtool":
        return [(e, e.name, "view") for e in doc.entries]
    from ..torchport.naming import torch_names

    return [(row.entry, row.name, row.made) for row in torch_names(doc, fold=fold).rows]


def _stored_shape(made: str, value, shared_slope: bool) -> tuple | None:
    """The shape Caffe stores a blob in, from the value given for it (None when none is: the blob is missing)."""
    if made == "factor":
        return (1,)
    if value is None:
        return None
    shape = tuple(value.shape)
    if made == "transposed":
        return tuple(reversed(shape))
    if shared_slope and shape in ((1,), ()):
        return ()   # Caffe's shared PReLU slope has no axes
    return shape


def _doc(definition: Document, shapes: dict, precision, dtypes: dict) -> Document:
    """The definition as a net holding blobs of `shapes` ({layer: [shape or None]}), placeholders for values."""
    entries = []
    for layer in definition.layers:
        for index, shape in enumerate(shapes.get(layer.name, [])):
            name = f"{layer.name}/{index}"
            if shape is None:
                shape = (0,)    # no value given: missing, whatever its shape
            dtype = _stored_dtype(precision, dtypes.get(name))
            blob = Blob(shape, dtype=np.float64 if dtype == np.float64 else np.float32)
            if layer.type == "BatchNorm" and index == 2 and blob.count == 1:
                blob.mutable_cpu_data()[:] = 1
            else:
                blob.mutable_cpu_data()[:] = 0
            blob.origin = Origin("shape", dtype, False)
            entries.append(Entry(name, tuple(shape), "shape", dtype, False, layer=layer.name, type=layer.type,
                                 _blob=blob))
    return Document(definition.path, "net", definition.source, entries=entries, meta=definition.meta,
                    format=definition.format, layers=definition.layers, definition=definition.definition,
                    parsed=definition.parsed)


def _stored_dtype(precision, given) -> np.dtype:
    if precision == "double" or (precision is None and given is not None and given == np.float64):
        return np.dtype(np.float64)
    if precision == "half":
        return np.dtype(np.float16)
    return np.dtype(np.float32)


def net_with_blobs(template: Document, blobs: dict, dest, *, precision=None, layout=None) -> None:
    """Write the definition `template` (a .prototxt read as a net) as a .caffemodel holding `blobs` ({name: Blob}).

    The definition's NetParameter as parsed (V1 layers stay V1), each layer
    followed by its blobs (LayerParameter.blobs = 7; V1's = 6).
    """
    from ..files import atomic_output
    from ..formats.caffe import wire
    from ..formats.caffe.blobwrite import blob_encoded_size, encode_blob_parts, resolve_form
    from ..formats.writing import write_parts
    from ..formats.origin import Precision

    net = template.parsed
    head = type(net)()
    head.CopyFrom(net)
    del head.layer[:]
    del head.layers[:]
    parts = [head.SerializeToString()]
    held = [(2, layer) for layer in net.layers] + [(100, layer) for layer in net.layer]
    if net.layers and net.layer:
        raise UsageError("the definition holds both V1 `layers` and `layer`; Caffe reads only one kind",
                         path=template.path)
    chosen = Precision.of(precision)
    for (number, message), layer in zip(held, template.layers):
        body = [message.SerializeToString()]
        index = 0
        while f"{layer.name}/{index}" in blobs:
            name = f"{layer.name}/{index}"
            blob = blobs[name]
            content = encode_blob_parts(blob, **resolve_form(blob, precision=chosen.for_blob(name), layout=layout))
            body += [wire.len_field_header(7 if number == 100 else 6, blob_encoded_size(content)), *content]
            index += 1
        parts += [wire.len_field_header(number, blob_encoded_size(body)), *body]
    with atomic_output(dest) as out:
        write_parts(out, parts)
