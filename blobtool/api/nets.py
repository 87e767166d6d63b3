"""A net's definition and surgery on it: net_definition, definition_text, deploy_definition, edit, fold."""

from __future__ import annotations

import contextlib
import warnings

from ..errors import UsageError, parameter
from ..formats import Document, open_document
from .blobs import write
from .common import opened_net, say

__all__ = ["net_definition", "definition_text", "deploy_definition", "edit", "fold"]


def net_definition(src):
    """A net's full definition (formats/caffe/netdef.py NetDefinition), from a Document or what open_document takes.

    `.net` is its NetParameter without blobs (V1 layers upgraded as Caffe
    does, V2); `.layers` holds, per layer in file order (as Document.layers),
    `.message` (its LayerParameter), `.format` ("V2", "V1", "V0") and `.lost`
    (fields protobuf's text format cannot write: another fork's). A
    .caffemodel, .prototxt or any protobuf net has one; Caffe's HDF5
    snapshot, which holds blobs only, is a UsageError.
    """
    from ..formats.caffe.netdef import definition

    if isinstance(src, Document):
        return definition(src)
    with open_document(src) as doc:
        return definition(doc)


def definition_text(src, dest=None, *, strict: bool = False, warn=None) -> str:
    """A net's definition (every layer's parameters and wiring, no blobs) in protobuf's text format.

    `src`: a Document or what open_document takes (a .caffemodel in any of
    Caffe's layer formats, V1 and V0 upgraded as Caffe does, a .prototxt);
    Caffe's HDF5 snapshot holds no definition (UsageError). With `dest` (a
    path, "-" or a binary file object) the text is also written there, as
    UTF-8, atomically. Fields that text cannot carry (another fork's) are
    said to `warn` (default warnings.warn) and left out, or with `strict`
    refused (UsageError, nothing written).
    """
    from ..files import atomic_output
    from ..formats.caffe.netdef import definition
    from ..formats.prototxt import definition_text as text_of

    with contextlib.ExitStack() as opened:
        doc = src if isinstance(src, Document) else opened.enter_context(open_document(src))
        found = definition(doc)
        lines = found.lost_lines(doc.path) + found.escaped_lines(doc.path)
        if lines and strict:
            raise UsageError(f"{lines[0]}; {parameter('strict')} refuses to leave them out ({len(lines)} such "
                             f"line{'s' * (len(lines) != 1)})")
        for line in lines:
            (warn or warnings.warn)(line if "written as escapes" in line else f"{line}; left out of the text")
        text = text_of(found.net)
    if dest is not None:
        with atomic_output(dest) as out:
            out.write(text.encode("utf-8"))
    return text


def deploy_definition(src, dest=None, *, shapes: dict | None = None, strict: bool = False, warn=None):
    """The deploy definition of a net (a training snapshot's included), as text; returns the Deploy.

    As forward/deploy.py makes it: Caffe's TEST net, data layers as Input
    layers with the shapes `shapes` ({blob name: shape}) gives, loss and
    accuracy layers gone, SoftmaxWithLoss as Softmax, phase rules gone. The
    text (`Deploy.text`) is written to `dest` (a path, "-" or a binary file
    object) when given, atomically. What went and the data layers'
    preprocessing are said to `warn` (Deploy.notes()); fields text cannot
    carry as definition_text says them.
    """
    from ..files import atomic_output
    from ..formats.caffe.netdef import NetDefinition, definition
    from ..formats.prototxt import definition_text as text_of
    from ..forward.deploy import deploy_net
    from ..net.model import model

    with contextlib.ExitStack() as opened:
        doc = src if isinstance(src, Document) else opened.enter_context(open_document(src))
        deploy = deploy_net(doc, None, shapes)
        found = definition(doc)
        kept = set(deploy.layer_names) - {name for name, _, _ in deploy.replaced}  # a replaced layer is new
        layers = [layer for layer, name in zip(found.layers, model(doc).names) if name in kept]
        lost = NetDefinition(found.net, layers, from_text=found.from_text)
        lines = lost.lost_lines(doc.path) + lost.escaped_lines(doc.path)
        if lines and strict:
            raise UsageError(f"{lines[0]}; {parameter('strict')} refuses to leave them out ({len(lines)} such "
                             f"line{'s' * (len(lines) != 1)})")
        for line in deploy.notes() + [ln if "written as escapes" in ln else f"{ln}; left out of the text"
                                      for ln in lines]:
            (warn or warnings.warn)(line)
        deploy.text = text_of(deploy.net)
    if dest is not None:
        with atomic_output(dest) as out:
            out.write(deploy.text.encode("utf-8"))
    return deploy


def edit(src, dest, *, renames=None, drops=(), format: str | None = None, warn=None) -> str:
    """Net surgery on a rewrite: the net in `src` with layers renamed and dropped, written to `dest`.

    `renames`: {old: new} or "OLD=NEW" strings (a layer's blobs follow its
    name: OLD/0 becomes NEW/0; its tops and bottoms stay); `drops`: layer
    names, left out with their blobs (the layers that read a dropped
    layer's output stay as they are, and are named to `warn`). Every other
    byte of a protobuf net is kept (surgery/rename.py). `format` as write's.
    Returns the kind written.
    """
    from ..surgery.rename import edit_layers, parse_renames

    if renames is not None and not isinstance(renames, dict):
        renames = parse_renames(renames)
    with contextlib.ExitStack() as opened:
        doc = src if isinstance(src, Document) else opened.enter_context(open_document(src))
        edited, lines = edit_layers(doc, renames or {}, tuple(drops))
        say(lines, warn)
        edited.source.will_read_through()
        return write(edited, {e.name: e.blob_to_write() for e in edited.entries}, dest, format=format, warn=warn)


def fold(src, *outputs, definition=None, check: bool = False, shapes: dict | None = None, warn=None):
    """Fold each BatchNorm (and the Scale after it) of the net in `src` into the layer before it; write `outputs`.

    As surgery.foldnet.fold_document: `src` and `definition` Documents or what
    open_document takes; each output a path, "-" or a binary file object
    (the folded .caffemodel, or its definition as .prototxt); `definition`
    a deploy definition whose settings the folds use and which a .prototxt
    output folds. With `check`, as fold --check (api/checks.py): the net
    before and after (with `definition`, that definition before and the
    folded one after, which an output must then hold) run on the same
    random input of `shapes` ({input: shape}), and the outputs put in place
    only when every blob agrees. Returns the FoldResult (its `plan`, its
    `warnings`, `record()` as fold --json prints it, and `check`: the
    CheckResult, whose `passed` is False and `withheld` the outputs when a
    blob differs, or None without `check`). The warnings of the files
    opened here go to `warn` when it is given; the fold's own are the
    result's.
    """
    from ..surgery.foldnet import fold_document
    from .checks import folded_and_checked

    with contextlib.ExitStack() as opened:
        doc, other = opened_net(opened, src, definition, warn)
        if check:
            return folded_and_checked(doc, outputs, other, shapes, warn)
        return fold_document(doc, *outputs, definition=other)
