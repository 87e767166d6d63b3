"""Layers renamed and dropped on a rewrite of a net (convert --rename OLD=NEW, --drop LAYER).

A rename changes the layer's name, and so its blobs' names (``old/0`` becomes
``new/0``); its tops and bottoms stay as they are (they name the data that
flows, not the layer). A drop removes the layer, its blobs with it. Nothing
else changes: in a protobuf net the name field is re-encoded and the enclosing
messages get new length prefixes, every other byte is copied as it was (the
edits travel with the Document, formats/caffe/containers.py applies them);
a net read from Caffe's HDF5 snapshot is written from the new names.

Where the name is: LayerParameter.name (1); V1LayerParameter.name (4), or the
nested V0LayerParameter's name (1) for a V0 layer named only there. Every
occurrence is rewritten (protobuf keeps the last); a layer without a name
gets one, written at the end of its message.

A layer is named as blobtool lists it (info --layers): a name read with bytes
that are not UTF-8 as its \\xNN escapes, or those bytes themselves as a
command line hands them over (surrogate escapes: formats.listed_name) when no
other layer is listed alike (``b\\xff1#2``: then the listed form is asked for).
A new name must be UTF-8 text (a protobuf string): other bytes are refused.

A dropped layer's consumers (the layers after it that read a top it wrote,
until another layer writes that top) are left as they are, never rewired:
dropped() lists them, so that the command says so.
"""

from __future__ import annotations

import dataclasses

from ..errors import FormatError, UsageError, parameter
from ..formats import Document, listed_name

__all__ = ["edit_layers", "parse_renames", "dropped"]

# Name fields: LayerParameter (100) and V1LayerParameter (2) by their field in
# NetParameter; V0LayerParameter nested in V1's field 1.
_NAME_FIELD = {100: 1, 2: 4}
_V1_NESTED_V0 = 1
_V0_NAME = 1


def parse_renames(pairs) -> dict:
    """{old: new} from OLD=NEW strings; UsageError for one without '=' or with an empty side, a new name
    that is not UTF-8 text, or a layer given twice."""
    renames: dict = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        if not sep or not old or not new:
            raise UsageError(f"{parameter('pairs', True)}{_quoted(pair)}: expected OLD=NEW (a layer's name, '=', "
                             "its new name)")
        if not _is_text(new):
            raise UsageError(f"{parameter('pairs', True)}{_quoted(pair)}: the new name {_quoted(new)} is not UTF-8 "
                             "text (bytes shown as \\xNN); a layer's name is a protobuf string, written as UTF-8")
        if old in renames:
            raise UsageError(f"{parameter('pairs')}: layer {_quoted(old)} is renamed twice "
                             f"({_quoted(renames[old])} and {_quoted(new)})")
        renames[old] = new
    return renames


def _is_text(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _quoted(name: str) -> str:
    """`name` in quotes for a message, as info --layers lists it (a command line's bytes as \\xNN, see listed_name)."""
    return f"'{listed_name(name)}'"


def _layer_named(given: str, names: list, path) -> str:
    """The layer name (of `names`, as listed) that `given` names (see the module doc)."""
    if given in names:
        return given
    listed = listed_name(given)
    if listed != given and listed in names:
        alike = [name for name in names if name == listed or
                 (name.startswith(listed + "#") and name[len(listed) + 1:].isdigit())]
        if len(alike) > 1:
            raise UsageError(f"{_quoted(given)} (bytes that are not UTF-8) could name any of the {len(alike)} "
                             f"layers listed as {', '.join(alike)}; give the name as info --layers lists it",
                             path=path)
        return listed
    shown = ", ".join(names[:64]) + (f" and {len(names) - 64} more" if len(names) > 64 else "")
    raise FormatError(f"no layer called {_quoted(given)} ({parameter('renames')}, {parameter('drops')}); "
                      f"layers: {shown or 'none'}", path=path)


def edit_layers(doc: Document, renames: dict, drops) -> tuple[Document, list]:
    """`doc` (a net) with layers renamed ({old: new}) and dropped: (the edited Document, lines to say).

    The edited Document shares the input's bytes; its entries and layers carry
    the new names and lack the dropped layers, and for a protobuf net its
    `edits` make the rewrite. The lines name each dropped layer's consumers.
    Raises FormatError for a layer the net does not hold (listing those it
    does), UsageError for a new name another layer bears, a layer both
    renamed and dropped (or renamed twice, by its two forms), or bytes that
    could name several layers.
    """
    if not renames and not drops:
        return doc, []
    if doc.kind != "net":
        raise UsageError(f"{doc.path}: {parameter('renames')} and {parameter('drops')} change a net's layers; "
                         f"this is a {doc.kind} file")
    names = [layer.name for layer in doc.layers]
    drops = list(dict.fromkeys(_layer_named(name, names, doc.path) for name in drops))
    given, renames = renames, {}
    for old, new in given.items():
        layer = _layer_named(old, names, doc.path)
        if layer in renames:
            raise UsageError(f"{parameter('renames')}: layer {_quoted(layer)} is renamed twice "
                             f"({_quoted(renames[layer])} and {_quoted(new)})")
        renames[layer] = new
    both = [name for name in drops if name in renames]
    if both:
        raise UsageError(f"layer {_quoted(both[0])} is both renamed and dropped")
    final = [renames.get(name, name) for name in names if name not in drops]
    for old, new in renames.items():
        if final.count(new) > 1:
            raise UsageError(f"{parameter('renames')} {old}={new}: another layer is called {_quoted(new)}",
                             path=doc.path)
    edits = []
    extra = {}
    if doc.format == "prototxt":
        extra = _edited_definition(doc, renames, drops)
    elif doc.format == "caffe":
        buf = memoryview(doc.source.buf)
        for layer in doc.layers:
            if layer.name in drops:
                edits.append(((), layer.wire.offset, layer.wire.end, b""))
            elif layer.name in renames:
                edits += _name_edits(buf, doc.path, layer.wire, renames[layer.name].encode())
    # Only a protobuf net says which blobs its layers read (HDF5 holds names and blobs only).
    lines = dropped(doc, drops) if drops and doc.format == "caffe" else []
    layers = [dataclasses.replace(layer, name=renames.get(layer.name, layer.name))
              for layer in doc.layers if layer.name not in drops]
    entries = []
    for entry in doc.entries:
        if entry.layer in drops:
            continue
        if entry.layer in renames:
            index = entry.name.rpartition("/")[2]
            entry = dataclasses.replace(entry, name=f"{renames[entry.layer]}/{index}", layer=renames[entry.layer])
        entries.append(entry)
    edited = Document(doc.path, doc.kind, doc.source, entries=entries, meta=doc.meta, format=doc.format,
                      layers=layers, naming=doc.naming, edits=[*doc.edits, *edits], **extra)
    return edited, lines


def _edited_definition(doc: Document, renames: dict, drops) -> dict:
    """A definition read from text (.prototxt): its parsed NetParameter with the layers renamed and dropped."""
    from ..formats.caffe.netdef import V0_LOST, from_message

    net = type(doc.parsed)()
    net.CopyFrom(doc.parsed)
    held = net.layer if len(net.layer) else net.layers
    # The fields the text's layers held that the schema does not know stay named with their layers.
    kept = [d for layer, d in zip(doc.layers, doc.definition.layers) if layer.name not in drops]
    unknown = {k: tuple(f for f in d.lost if f != V0_LOST) for k, d in enumerate(kept)}
    for index in reversed(range(len(doc.layers))):
        name = doc.layers[index].name
        if name in drops:
            del held[index]
        elif name in renames:
            message = held[index]
            if held is net.layers and not message.name and message.HasField("layer"):
                message.layer.name = renames[name]   # a V0 layer named only inside
            else:
                message.name = renames[name]
    return {"parsed": net, "definition": from_message(net, doc.path, unknown)}


def _name_edits(buf, path, lf, name: bytes) -> list:
    """The edits that give the layer in field `lf` the name `name`: each name field rewritten, or one added."""
    from ..formats.caffe import wire

    number = _NAME_FIELD[lf.number]
    field = wire.len_field_header(number, len(name)) + name
    fields = list(wire.iter_fields(buf, lf.start, lf.end, path=path))
    own = [f for f in fields if f.number == number and f.wire_type == wire.LEN]
    if own:
        return [((lf,), f.offset, f.end, field) for f in own]
    if lf.number == 2:
        for v0 in (f for f in fields if f.number == _V1_NESTED_V0 and f.wire_type == wire.LEN):
            nested = [f for f in wire.iter_fields(buf, v0.start, v0.end, path=path)
                      if f.number == _V0_NAME and f.wire_type == wire.LEN]
            if nested:
                v0_field = wire.len_field_header(_V0_NAME, len(name)) + name
                return [((lf, v0), f.offset, f.end, v0_field) for f in nested]
    return [((lf,), lf.end, lf.end, field)]


def dropped(doc: Document, drops) -> list:
    """One line per dropped layer whose output later layers read: those layers, left as they are."""
    from ..net.model import model

    net = model(doc).view(None)  # every layer as stored: a reader in any phase is left reading nothing
    readers: dict = {}        # dropped layer -> {layer reading its output: [tops read]}
    in_place: dict = {}       # dropped layer -> its tops that were also its bottoms
    for layer, (bottoms, tops), versions in zip(net.layers, net.links, net.inputs):
        for bottom, version in dict(zip(bottoms, versions)).items():  # each name once (it reads one version)
            writer = net.names[version[0]] if version is not None else None
            if writer in drops and writer != layer.name:
                readers.setdefault(writer, {}).setdefault(layer.name, []).append(bottom)
        if layer.name in drops:
            in_place[layer.name] = [top for top in tops if top in bottoms]
    lines = []
    for name in drops:
        found = readers.get(name)
        if not found:
            continue
        read = ", ".join(f"{reader} ({', '.join(tops)})" for reader, tops in found.items())
        note = ""
        if in_place.get(name):
            note = (f"; {name} worked in place on {', '.join(in_place[name])}, so they now read that blob as "
                    "the layer before it left it")
        lines.append(f"{doc.path}: --drop {name}: {len(found)} layer{'s' * (len(found) != 1)} still read "
                     f"its output, left as they are (not rewired): {read}{note}")
    return lines
