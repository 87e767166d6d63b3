"""A folded net's definition: the net's own, or another one of the same net (a deploy.prototxt), with the folds applied.

A definition (formats/caffe/netdef.py) is each layer's full LayerParameter
without blobs. Folding changes it as it changes the net: the BatchNorm and
Scale layers folded leave it, each folded layer writes the top of the last
layer it took in, and its bias_term is true where the fold created a bias.

Caffe loads weights into the net a definition builds, by layer name, so a
deploy definition must change as the weights did. Another definition is
folded by the plan made on the net's weights (foldplan.py, with this
definition's settings), layer by name, and only where it wires those
layers as the net does in its TEST net (the one deployed: layers its
include/exclude rules leave out read and write nothing there): the folded
layers are in it, the layer before each folded BatchNorm writes its input
and nothing else reads it, the BatchNorm's output feeds that Scale only
(or no Scale, where it folded alone), and the new top clashes with nothing
between. Otherwise the definition is refused (UsageError) naming the
layer: folded weights loaded into a net wired otherwise would compute
something else. Layers outside the TEST net are kept as they are.
"""

from __future__ import annotations

import dataclasses

from ..errors import UsageError
from ..formats import Document
from ..net.layertypes import param_of
from ..net.model import model
from .foldplan import FoldPlan, outside_text, rename_why_not

__all__ = ["folded_definition", "definition_text"]



def folded_definition(doc: Document, plan: FoldPlan, other: Document | None = None):
    """The folded definition (a NetParameter without blobs) of `doc`, or of `other`, by the plan made on `doc`."""
    from ..formats.caffe.netdef import definition

    source = other if other is not None else doc
    whole = definition(source)
    messages = [layer.message for layer in whole.layers]
    names = _names(doc, other)
    if other is not None:
        _check_wiring(other, doc.path, plan)
    net = type(whole.net)()
    net.CopyFrom(whole.net)
    del net.layer[:]
    by_name = dict(zip(names, messages))
    folds = {f.target.name: f for f in plan.folds}
    removed = plan.removed
    for name, message in zip(names, messages):
        if name in removed:
            continue
        layer = net.layer.add()
        layer.CopyFrom(message)
        fold = folds.get(name)
        if fold is None:
            continue
        last = by_name[(fold.scale or fold.batchnorm).name]
        del layer.top[:]
        layer.top.append(last.top[0])
        if fold.bias is None:
            getattr(layer, param_of(fold.kind)).bias_term = True
    return net


def _names(doc: Document, other: Document | None) -> list:
    """The layer names of the definition folded, as the plan names layers (its model's: duplicates told apart)."""
    return model(other if other is not None else doc).names


def _check_wiring(definition: Document, net_path: str, plan: FoldPlan) -> None:
    """Refuse (UsageError) a definition whose TEST net lacks a folded layer or wires one otherwise than the net."""
    view = model(definition).test
    index = {name: i for i, name in enumerate(view.names)}
    for fold in plan.folds:
        why = _why_different(fold, index, view)
        if why:
            raise UsageError(f"{why}, where {net_path} folds {fold.batchnorm.name} into {fold.target.name}: "
                             "folded weights would compute something else in this definition", path=definition.path)


def _why_different(fold, index: dict, view) -> str | None:
    names, types, links = view.names, view.types, view.links
    wanted = [(fold.target.name, fold.kind), (fold.batchnorm.name, "BatchNorm")]
    if fold.scale is not None:
        wanted.append((fold.scale.name, "Scale"))
    for name, kind in wanted:
        if name not in index:
            return f"it has no layer {name}"
        if types[index[name]] != kind:
            return f"its layer {name} is a {types[index[name]] or 'layer without a type'}, not a {kind}"
        if index[name] in view.outside:
            return f"its layer {name}: {outside_text(view.outside[index[name]])}"
    p, i = index[fold.target.name], index[fold.batchnorm.name]
    if len(links[i][0]) != 1 or len(links[i][1]) != 1 or len(links[p][1]) != 1:
        return f"its {names[i]} or {names[p]} has another number of bottoms or tops"
    source = view.inputs[i][0]
    if source is None or source[0] != p or view.readers[source] != [i]:
        return f"its {names[i]} does not read {names[p]}'s output alone"
    after = view.readers.get((i, 0), [])
    scales = [r for r in after if types[r] == "Scale"]
    if fold.scale is None:
        if scales:
            return f"its {names[i]} feeds the Scale {names[scales[0]]}"
        last = i
    else:
        s = index[fold.scale.name]
        if after != [s] or len(links[s][0]) != 1 or len(links[s][1]) != 1:
            return f"its {names[i]}'s output does not feed {names[s]} alone"
        last = s
    return rename_why_not(links, names, p, last, i, links[last][1][0])


def definition_text(doc: Document, plan: FoldPlan, warnings: list, other: Document | None = None) -> bytes:
    """The folded definition in protobuf's text format (UTF-8); fields text cannot carry are warned about."""
    from google.protobuf import text_format  # protobuf loads only where a definition is written

    from ..formats.caffe.netdef import definition

    source = other if other is not None else doc
    net = folded_definition(doc, plan, other)
    whole = definition(source)
    kept = [d for name, d in zip(_names(doc, other), whole.layers) if name not in plan.removed]
    lines = dataclasses.replace(whole, layers=kept).lost_lines(source.path)
    warnings += [f"{line}; left out of the text" for line in lines]
    return text_format.MessageToString(net, as_utf8=True).encode("utf-8")
