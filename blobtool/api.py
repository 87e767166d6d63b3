"""The library's entry points: load, load_all, state_dict, save, write, and open_document.

Everything the command line does to files, a Python user can do here in one
call: read any kind of file (the kind sniffed from its bytes), and write a
selection of blobs in any format blobtool writes, with the same options.
"""

from __future__ import annotations

import contextlib
import os
import warnings

from .engine.blob import Blob
from .engine.float16 import HALF, half_precisions
from .formats.writing import Unread, check_layout
from .errors import FormatError, UsageError, parameter
from .formats import NAMING_SCHEMES, Document, Entry, module, open_document, reading
from .formats.origin import Precision
from .formats.targets import output_target
from .files import Staged, releasing, writes_in_place

__all__ = ["load", "load_all", "state_dict", "save", "write", "open_document", "net_definition",
           "resolve_precision", "definition_text", "deploy_definition", "transplant", "edit", "fold", "run", "export"]


def load(src) -> Blob:
    """Read the one blob of a BlobProto or .npy file (path, "-" or binary file object).

    The payload is not copied: the blob's data views the memory-mapped file
    (copy-on-write, so changing the blob never changes the file). Values come
    from double_data when it is non-empty (a float64 blob), else data.

    Raises
    ------
    BlobToolError
        FormatError naming the file, byte offset and field on bad input; for
        a container (net, solverstate, vector, npz), pointing to load_all.
    """
    doc = open_document(src)
    if doc.kind in ("blob", "npy"):
        return doc.entries[0].blob()
    raise FormatError(f"this is a {doc.kind} file holding {len(doc.entries)} blobs; "
                      "use blobtool.load_all() to read them", path=doc.path)


def load_all(src, kind: str | None = None, *, key: str | None = None) -> dict:
    """Every blob of any kind of file, as an ordered {name: Blob} dict (names as in blobtool.formats).

    `key`: of a PyTorch checkpoint holding several state dicts, the one to
    read ("ema", "model/state_dict"), as --key.
    """
    with reading(key=key):
        doc = open_document(src, kind)
    return {e.name: e.blob() for e in doc.entries}


def state_dict(src, names: str = "torch", *, kind: str | None = None, key: str | None = None, warn=None) -> dict:
    """Every blob of a file as {name: numpy array}, named as PyTorch names them (default) or as blobtool does.

    With names="torch" (or "torch-identifiers", each module name made a
    Python identifier as ``--names torch-identifiers`` makes it) a .caffemodel's blobs are renamed by layer type as
    ``convert --names torch`` names them (torchport/naming.py: BatchNorm
    statistics divided by their factor, a Scale after a BatchNorm under the
    BatchNorm's name, ...), so that ``model.load_state_dict({k:
    torch.from_numpy(v) for k, v in blobtool.state_dict(path).items()})`` is
    one line; a file without layers (.safetensors, .npz) keeps the names it
    holds. The arrays are copies, writable, float32 or float64 (a float16
    blob comes as float32); diffs are not included. The rename's warnings
    (layer types without a rule) go to `warn(line)` (default: warnings.warn).
    `key` picks a PyTorch checkpoint's state dict, as in load_all.
    """
    if names not in NAMING_SCHEMES:
        raise UsageError(f"unknown naming scheme {names!r}; expected {', '.join(NAMING_SCHEMES)}")
    with reading(key=key):
        doc = open_document(src, kind)
    with doc:
        entries = doc.entries
        if names != "blobtool" and doc.kind == "net":
            from .torchport.metadata import named

            renamed = named(doc, scheme=names)
            _say(renamed.warnings, warn)
            entries = renamed.document.entries
        return {e.name: e.blob().cpu_data().reshape(e.shape).copy() for e in entries}


def _say(lines, warn) -> None:
    for line in lines:
        if warn is not None:
            warn(line)
        else:
            warnings.warn(line, stacklevel=3)


def save(blob: Blob, dest, *, double: bool | None = None, write_diff: bool | None = None,
         layout: str | None = None, precision: str | None = None, transforms: dict | None = None,
         half_strict: bool = False, warn=None) -> None:
    """Write `blob` as a BlobProto to a path, "-" or a binary file object.

    Parameters
    ----------
    double : True writes double_data (float64), False data (float32).
    write_diff : whether to write the diff.
    layout : "shape" (Caffe's ToProto) or "legacy" (num/channels/height/width).
    precision : "float", "double" or "half" (NVIDIA Caffe's raw FLOAT16);
        overrides `double`. A blob that float16 cannot hold is written in
        float32 with a warning (or refused with `half_strict`), as in write.
    transforms : optional {"data"|"diff": fn(chunk, start) -> array} applied
        chunk by chunk while writing (see blobwrite.encode_blob_parts).

    None keeps what the blob came with (a blob made in Python: its dtype,
    "shape", no diff). Paths are written atomically: a temporary file beside
    the target, then a rename.
    """
    from .formats.caffe import save_blob  # a format module loads when a file of its format is met

    if precision is None and double is not None:
        precision = "double" if double else "float"
    if precision == "half":
        precision = _half_precisions(None, [_new_entry("0", blob)], [blob], write_diff=write_diff,
                                     transforms={"0": transforms} if transforms else None, strict=half_strict,
                                     warn=warn)["0"]
    save_blob(blob, dest, precision=precision, write_diff=write_diff, layout=layout, transforms=transforms)


def write(doc: Document | None, blobs, dest, *, format: str | None = None, precision: str | None = None,
          layout: str | None = None, write_diff: bool | None = None, transforms: dict | None = None,
          release: bool = False, half_strict: bool = False, warn=None) -> str:
    """Write blobs to `dest` (a path, "-" or a binary file object) in any format blobtool writes.

    Parameters
    ----------
    doc : the Document the blobs came from (open_document), or None for
        blobs made in Python (then only "blob", "npy" and "npz" can be written).
    blobs : {name: Blob} to write, in order; None writes every blob of `doc`.
        Names not in `doc` are new blobs (without a layer).
    format : "blob" (one BlobProto), "npy", "npz", "safetensors", "hdf5"
        (Caffe's HDF5 snapshot of a net or solver state input), "protobuf"
        (the input's kind as Caffe's protobuf: a .prototxt input becomes a
        .caffemodel without blobs), or "same" (the input's own kind and
        format, every other byte of a protobuf container kept); a net's
        definition as text is definition_text's;
        None chooses from dest's extension (.npy, .npz, .safetensors,
        .pb/.binaryproto/.blob/.protobin, .h5/.hdf5,
        .caffemodel/.solverstate); a name without an extension (or a file
        object) gives "same" for a container input and "blob" otherwise;
        any other extension is a UsageError.
    precision : "float", "double", "half", or "bf16" (bfloat16, safetensors
        only; kept wider where it would make an Inf, as "half" is), or a
        {name: precision} dict (resolve_precision's); layout : "shape" or "legacy";
    write_diff : None keeps each blob's stored form.
        With "half", a blob whose finite values do not fit float16 (past
        65504) is written in float32 instead (float64 past float32's range),
        never as Inf: `warn(line)` is called with one line per such blob and
        one counting the values that became subnormal or 0 (default:
        warnings.warn). `half_strict` raises UsageError for such a blob
        instead, before anything is written.
    transforms : {name: {"data"|"diff": fn(chunk, start) -> array}} applied
        chunk by chunk while writing (how scale and update stream).
    release : hand the input's mapped pages back to the kernel as they are
        written out, so that memory stays bounded whatever the file size.
        Only for blobs that are not used afterwards: a page changed in
        memory (scale_data on the host) reads back as the file's bytes.

    Returns the kind written. Paths are written atomically.
    """
    if doc is None and blobs is None:
        raise UsageError("write: nothing to write (no document and no blobs)")
    if doc is not None and output_target(dest, format, doc)[0].name == "prototxt":
        raise UsageError("a .prototxt holds a net's definition and no blobs: blobtool.definition_text(src, dest) "
                         "writes it", path=doc.path)
    if blobs is None:
        entries = list(doc.entries)
        blob_list = [e.blob() for e in entries]
    else:
        known = {e.name: e for e in doc.entries} if doc is not None else {}
        entries = [known.get(name) or _new_entry(name, blob) for name, blob in blobs.items()]
        blob_list = list(blobs.values())
    for entry, blob in zip(entries, blob_list):  # before anything is written, whatever the format
        try:
            check_layout(blob, layout)
        except UsageError as exc:
            raise UsageError(f"blob {entry.name}: {exc.reason}", path=doc.path if doc is not None else None) from exc
    fmt, kind = output_target(dest, format, doc)
    if kind == "blob" and len(blob_list) != 1:
        raise UsageError(_one_blob_message(dest, format, doc, len(blob_list)))
    if precision == "bf16" and fmt.name != "safetensors":
        raise UsageError(f"bfloat16 ({parameter('precision', given='bf16')}) is written to .safetensors only: the "
                         f"{kind} output (format {fmt.name}) has no bfloat16 type; write .safetensors, or use "
                         f"{parameter('precision', given='half')} (float16)")
    precision = resolve_precision(doc, entries, blob_list, precision, write_diff=write_diff, transforms=transforms,
                                  half_strict=half_strict, warn=warn)
    if doc is not None and doc.naming != "blobtool" and fmt.name == doc.format and kind == doc.kind:
        raise UsageError(f"blobs renamed with {parameter('names', True)}{doc.naming} cannot be written back into the {kind} they "
                         "came from; write .safetensors, .npz or .npy")
    if writes_in_place(dest):
        _read_unread(doc, entries, blob_list, fmt, kind)
    with releasing() if release else contextlib.nullcontext():
        module(fmt).write(doc, entries, blob_list, dest, kind=kind, precision=Precision.of(precision),
                          write_diff=write_diff, layout=layout, transforms=transforms)
    return kind


def resolve_precision(doc: Document | None, entries: list, blobs: list, precision, *, write_diff=None,
                      transforms=None, half_strict: bool = False, warn=None):
    """The precision `write` writes in: for "half" and "bf16", {name: precision} (see write), else `precision`.

    A blob whose values float16 (bfloat16) cannot hold without an Inf is
    written in float32 (float64) instead, with a warning; `half_strict`
    refuses it (float16 only).
    """
    if precision not in ("half", "bf16"):
        return precision
    from .engine.bfloat16 import BFLOAT16

    return _half_precisions(doc.path if doc is not None else None, entries, blobs, write_diff=write_diff,
                            transforms=transforms, strict=half_strict and precision == "half", warn=warn,
                            narrow=HALF if precision == "half" else BFLOAT16)


def transplant(values, template, dest, *, names: str = "blobtool", partial: bool = False, reshape: bool = False,
               fold: bool = True, definition=None, strip_prefix: str | None = None, add_prefix: str | None = None,
               format: str | None = None, precision: str | None = None, layout: str | None = None,
               half_strict: bool = False, blobs=(), kind: str | None = None, key: str | None = None,
               warn=None) -> str:
    """Write the values of `values` into the net `template`, blob by blob, and write the template to `dest`.

    Caffe's net surgery "transplants" parameters from one net into another
    (examples/net_surgery.ipynb); this is that, for any file blobtool reads.

    Parameters
    ----------
    values : a path or Document (any file blobtool reads: `kind`, `key` and
        `blobs`, patterns as select takes them, as for open_document and
        select), or {name: Blob or numpy array}.
    template : the net written (a path or Document): a .caffemodel, Caffe's
        HDF5 snapshot (with `definition`, the net whose layer types it lacks),
        or a .prototxt (its blobs made from its layers, every one needing a
        value). Every other byte of a .caffemodel is kept (surgery/into.py).
    names : "blobtool" matches the names as they are; "torch" (or
        "torch-identifiers") reads the values under PyTorch's names, as
        convert --names torch writes them (a net given as `values` is
        renamed so first); `fold` False reads names written with --no-fold.
    partial, reshape : strict by default: FitError (exit 3) lists the
        template blobs without a value, the values no blob takes and those
        of another shape; `partial` keeps the template's values instead (the
        lists go to `warn`), `reshape` writes a value of equal count in the
        template's shape.
    strip_prefix, add_prefix : the values' names lose `strip_prefix` (when
        they start with it) and gain `add_prefix` first; given neither, a
        prefix that makes more of them the template's names (a wrapper's
        "module.") is found, used and said to `warn` (surgery/prefixed.py);
        strip_prefix="" turns that off. Two names made one are a UsageError.
    format, precision, layout, half_strict : as write's; `precision` None
        keeps the template's stored types.

    Returns the kind written. Paths are written atomically.
    """
    from .formats import select
    from .formats.numpy import cast_for
    from .surgery.into import fit
    from .surgery.prefixed import prefixed

    with contextlib.ExitStack() as opened:
        doc = None
        if not isinstance(values, dict):
            # Values of another type (float16 .npy, integers, bfloat16) load as float64, which holds them
            # exactly: the template's types decide what is written.
            if isinstance(values, Document):
                doc = values
            else:
                with reading(key=key) if key is not None else contextlib.nullcontext():
                    doc = opened.enter_context(open_document(values, kind, npy_cast=cast_for("double")))
            entries = select(doc, blobs)
            if names == "torch" and doc.kind == "net" and doc.naming == "blobtool":
                from .torchport.naming import has_layer_types, torch_names

                if has_layer_types(doc):
                    renamed = torch_names(doc, entries, fold=fold)
                    _say(renamed.warnings, warn)
                    doc, entries = renamed.document, renamed.document.entries
            values = {e.name: e for e in entries}   # read when fitted; buffers Caffe has no blob for never are
        source = doc.path if doc is not None else "the values"
        if not isinstance(template, Document):
            template = opened.enter_context(open_document(template))
        if definition is not None and not isinstance(definition, Document):
            definition = opened.enter_context(open_document(definition))
        values = prefixed(values, source, template, names, fold, definition, strip_prefix, add_prefix,
                          warn=lambda line: _say([line], warn))
        options = {"format": format, "layout": layout, "half_strict": half_strict}
        if template.format == "prototxt":
            return _transplant_into_definition(template, values, dest, names=names, partial=partial,
                                               reshape=reshape, fold=fold, precision=precision, warn=warn,
                                               source=source, **options)
        fitted = fit(template, values, names=names, partial=partial, reshape=reshape, precision=precision,
                     source=source, fold=fold, net=definition)
        _say(fitted.notes, warn)
        if precision is None and fitted.precision:
            precision = fitted.precision
        written = fitted.blobs
        if output_target(dest, format, template)[1] != template.kind:
            # Not the template's own kind (an .npz, a .safetensors): its blobs kept are written too, as stored.
            written = {e.name: written[e.name] if e.name in written else e.blob() for e in template.entries}
        return write(template, written, dest, precision=precision, warn=warn, **options)


def _transplant_into_definition(definition, blobs, dest, *, names, partial, reshape, fold, precision, warn, source,
                                **options) -> str:
    """transplant into a .prototxt: the blobs made from the definition and the values, written as a net."""
    from .surgery.blueprint import net_with_blobs, template_from_definition
    from .surgery.into import fit

    if partial:
        raise UsageError(f"{parameter('partial')} keeps a template's values, and a .prototxt holds none: every blob needs a value",
                         path=definition.path)
    notes: list = []
    template = template_from_definition(definition, blobs, names, fold, precision, notes)
    _say(notes, warn)
    fitted = fit(template, blobs, names=names, reshape=reshape, precision=precision, source=source, fold=fold)
    _say(fitted.notes, warn)
    fmt, kind = output_target(dest, options.get("format"), template)
    if fmt.name == "caffe" and kind == "net":
        net_with_blobs(template, fitted.blobs, dest, precision=precision, layout=options.get("layout"))
        return kind
    if fmt.name == "prototxt":
        raise UsageError("a .prototxt output holds no blobs: write the values into the definition as a "
                         ".caffemodel (or .h5, .npz, .safetensors)", path=definition.path)
    return write(template, fitted.blobs, dest, precision=precision, warn=warn, **options)


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
    from .files import atomic_output
    from .formats.caffe.netdef import definition
    from .formats.prototxt import definition_text as text_of

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
    from .files import atomic_output
    from .formats.caffe.netdef import NetDefinition, definition
    from .formats.prototxt import definition_text as text_of
    from .forward.deploy import deploy_net
    from .net.model import model

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


def run(src, *, definition=None, inputs: dict | None = None, shapes: dict | None = None, seed: int = 0,
        outputs=None):
    """Run the net in `src` forward as Caffe's TEST phase, in float32; the RunResult (its `values`: {blob: array}).

    `src` and `definition` are Documents or what open_document takes;
    `definition` is the net's definition to run (a deploy.prototxt), whose
    layers take `src`'s weights by name. `inputs` ({name: array}) gives
    inputs' values, `shapes` ({name: shape}) their shapes (a data layer's);
    inputs without values get random normal values from `seed`. `outputs`:
    None (the net's outputs), "all", or blob names.
    """
    from .forward.run import run_net

    with contextlib.ExitStack() as opened:
        doc, other = _open_net(opened, src, definition)
        return run_net(doc, definition=other, feeds=inputs, shapes=shapes, seed=seed, outputs=outputs)


def _open_net(opened: contextlib.ExitStack, src, definition) -> tuple:
    """(the net's Document, the definition's or None), each opened in `opened` unless given as a Document."""
    doc = src if isinstance(src, Document) else opened.enter_context(open_document(src))
    if definition is None or isinstance(definition, Document):
        return doc, definition
    return doc, opened.enter_context(open_document(definition))


def export(src, dest, *, definition=None, shapes: dict | None = None, opset: int | None = None, outputs=None,
           check: bool = False, seed: int = 0, warn=None):
    """Write the net in `src` as one ONNX model at `dest`; returns (ExportResult, the check's CheckResult or None).

    The deploy net of `run` (forward/deploy.py): `definition` (a
    deploy.prototxt, or the definition an HDF5 snapshot lacks), `shapes`
    ({input: shape}) and `outputs` (None: the net's outputs; "all"; names)
    as `run` takes them; `opset` from 13 to the installed onnx's newest
    (default 17). With `check`, onnx's full check and onnxruntime against
    blobtool's forward on the same random input (onnxport/check.py), which
    need the `onnx` extra (UsageError naming it otherwise), and write `dest`
    only when it passes (onnxport/check.py's prove_export). What the deploy
    net left out and what changed on the way are said to `warn`.
    """
    from .forward.deploy import deploy_net
    from .forward.run import ALL
    from .forward.runner import build

    _needs_onnx(check)
    from .onnxport.check import prove_export
    from .onnxport.graph import OPSET_DEFAULT, export_program

    with contextlib.ExitStack() as opened:
        doc, other = _open_net(opened, src, definition)
        deploy = deploy_net(doc, other, shapes)
        weights = doc if doc.kind == "net" and doc.format != "prototxt" else None
        # Only written out, the weights are viewed in the mapped file; a check runs them, so it reads them.
        program = build(deploy, weights, aligned=check)
        wanted = program.outputs() if outputs is None else (
            program.blob_names() if outputs == ALL else program.check_outputs(outputs))
        notes = deploy.notes()
        half = [f"{layer}/{k}" for layer, k in sorted(program.half)]
        if half:
            notes.append(f"{doc.path}: {len(half)} float16 blob{'s' * (len(half) != 1)} ({', '.join(half[:4])}"
                         f"{' ...' if len(half) > 4 else ''}) kept as float16, each cast to float32 where the net "
                         "uses it (exactly: every float16 value is a float32 one)")
        from . import __version__
        # With a check the model is written where nothing reads it, and put in place only when the check passes.
        staged = opened.enter_context(Staged([dest] if check else ()))
        result = export_program(program, staged.path(dest), opset=opset or OPSET_DEFAULT, outputs=wanted,
                                net_name=deploy.net.name, source=doc.path, version=__version__)
        result.path, result.external = os.fspath(dest), result.external and os.fspath(dest) + ".data"
        result.notes = notes + result.notes  # the deploy net's, then the model's (names changed, Inf/NaN constants)
        for line in result.notes:
            (warn or warnings.warn)(line)
        verdict = (prove_export(staged, dest, program, wanted, seed=seed, source=doc.path, exported=result)
                   if check else None)
        return result, verdict


def _needs_onnx(check: bool) -> None:
    """UsageError naming the extra where a check is asked for and onnx or onnxruntime is not installed.

    Writing the model needs neither: blobtool writes ONNX's messages with
    classes of its own (proto/blobtool_onnx.proto says why).
    """
    import importlib.util

    missing = [m for m in (("onnx", "onnxruntime") if check else ()) if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"{parameter('check')} needs {' and '.join(missing)}: pip install 'blobtool[onnx]' (onnx "
                         "and onnxruntime, which need protobuf 4.25 or newer)")


def edit(src, dest, *, renames=None, drops=(), format: str | None = None, warn=None) -> str:
    """Net surgery on a rewrite: the net in `src` with layers renamed and dropped, written to `dest`.

    `renames`: {old: new} or "OLD=NEW" strings (a layer's blobs follow its
    name: OLD/0 becomes NEW/0; its tops and bottoms stay); `drops`: layer
    names, left out with their blobs (the layers that read a dropped
    layer's output stay as they are, and are named to `warn`). Every other
    byte of a protobuf net is kept (surgery/rename.py). `format` as write's.
    Returns the kind written.
    """
    from .surgery.rename import edit_layers, parse_renames

    if renames is not None and not isinstance(renames, dict):
        renames = parse_renames(renames)
    with contextlib.ExitStack() as opened:
        doc = src if isinstance(src, Document) else opened.enter_context(open_document(src))
        edited, lines = edit_layers(doc, renames or {}, tuple(drops))
        _say(lines, warn)
        edited.source.will_read_through()
        return write(edited, {e.name: e.blob_to_write() for e in edited.entries}, dest, format=format, warn=warn)


def fold(src, *outputs, definition=None):
    """Fold each BatchNorm (and the Scale after it) of the net in `src` into the layer before it; write `outputs`.

    As surgery.foldnet.fold_net: each output a path, "-" or a binary file
    object (the folded .caffemodel, or its definition as .prototxt);
    `definition` a deploy definition whose settings the folds use and which
    a .prototxt output folds. Returns the FoldResult (its `plan`, its
    `warnings`, `record()` as fold --json prints it).
    """
    from .surgery.foldnet import fold_net

    return fold_net(src, *outputs, definition=definition)


def _read_unread(doc: Document | None, entries: list, blobs: list, fmt, kind: str) -> None:
    """Read every blob to be written whose values are read only as they are written (writing.Unread), and let it go.

    For an output written in place (standard output, a pipe): bad values
    (a damaged HDF5 chunk) are then found before the first byte goes out, as
    when every blob is read before writing, and no partial output is left;
    memory stays one blob. A container written whole (an HDF5 input written
    as protobuf or HDF5) writes the blobs not selected too.
    """
    pending = [blob for blob in blobs if isinstance(blob, Unread)]
    if doc is not None and kind == doc.kind and kind in fmt.containers:
        selected = {id(e) for e in entries}
        pending += [blob for blob in (e.blob_to_write() for e in doc.entries if id(e) not in selected)
                    if isinstance(blob, Unread)]
    for blob in pending:
        blob.built()


def _one_blob_message(dest, format: str | None, doc: Document | None, selected: int) -> str:
    """Why a one-blob output refuses `selected` blobs: what chose that format, and what writes them instead."""
    ext = os.path.splitext(os.fspath(dest))[1] if isinstance(dest, (str, os.PathLike)) else ""
    if format is None and ext:
        chosen = f"the extension {ext} of {os.fspath(dest)} chose the one-blob format (a BlobProto file)"
    else:
        chosen = f"{parameter('format', given=format or 'blob')} writes one blob (a BlobProto file)"
    own = doc is not None and doc.kind != "blob"
    if not selected:
        ways = (f"{parameter('format', given='same')} keeps the input's kind ({doc.kind})" if own
                else f"select a blob with {parameter('blobs')}")
    else:
        ways = ", ".join([f"choose one with {parameter('blobs')}",
                          *([f"keep the input's kind ({doc.kind}) with {parameter('format', given='same')}"]
                            if own else []), "or write .npz"])
    return f"{chosen}: {selected} selected; {ways}"


def _half_precisions(path, entries, blobs, *, write_diff, transforms, strict, warn, narrow=None) -> dict:
    """{name: precision} for writing in float16 or `narrow` (float16.half_precisions), its warnings handed to `warn`."""
    # A blob not read yet is read for this look and let go (read again when written).
    blobs = (blob.built() if isinstance(blob, Unread) else blob for blob in blobs)
    precisions, lines = half_precisions(path, entries, blobs, write_diff=write_diff, transforms=transforms,
                                        strict=strict, narrow=narrow or HALF)
    for line in lines:
        if warn is not None:
            warn(line)
        else:
            warnings.warn(line, stacklevel=4)
    return precisions


def _new_entry(name: str, blob: Blob) -> Entry:
    origin = blob.origin
    return Entry(name, blob.shape, origin.layout if origin else "shape", blob.dtype,
                 bool(origin and origin.has_diff), _blob=blob,
                 diff_dtype=blob.diff_dtype if blob.diff_dtype != blob.dtype else None)



def net_definition(src):
    """A net's full definition (formats/caffe/netdef.py NetDefinition), from a Document or what open_document takes.

    `.net` is its NetParameter without blobs (V1 layers upgraded as Caffe
    does, V2); `.layers` holds, per layer in file order (as Document.layers),
    `.message` (its LayerParameter), `.format` ("V2", "V1", "V0") and `.lost`
    (fields protobuf's text format cannot write: another fork's). A
    .caffemodel, .prototxt or any protobuf net has one; Caffe's HDF5
    snapshot, which holds blobs only, is a UsageError.
    """
    from .formats.caffe.netdef import definition

    if isinstance(src, Document):
        return definition(src)
    with open_document(src) as doc:
        return definition(doc)
