"""Values written into a net's blobs by name: transplant (Caffe's net surgery, from any file blobtool reads)."""

from __future__ import annotations

import contextlib

from ..errors import UsageError, parameter
from ..formats import Document, reading
from ..formats.targets import output_target
from .blobs import write
from .common import opened_document, say

__all__ = ["transplant"]


def transplant(values, template, dest, *, names: str = "blobtool", partial: bool = False, reshape: bool = False,
               fold: bool = True, definition=None, strip_prefix: str | None = None, add_prefix: str | None = None,
               format: str | None = None, precision: str | None = None, layout: str | None = None,
               half_strict: bool = False, blobs=(), kind: str | None = None, key: str | None = None,
               check: bool = False, shapes: dict | None = None, warn=None):
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
    check : as transplant --check (api/checks.py): the template and the
        net written run on the same random input of `shapes` ({input:
        shape}), and `dest` (a path of a net: .caffemodel or .h5) is put in
        place only when every blob agrees.

    Returns the kind written; with `check`, the CheckResult (its `passed`
    False, and `withheld` naming `dest`, when a blob differs: nothing is
    written then). Paths are written atomically. The warnings of the files
    opened here go to `warn` when it is given.
    """
    from ..surgery.prefixed import prefixed
    from .checks import refuse_checking_a_definition, refuse_unchecked_transplant, transplanted_and_checked

    if check:
        refuse_unchecked_transplant(dest, format)
    with contextlib.ExitStack() as opened:
        # Opened in the command's order: the template, the values, the definition.
        template = opened_document(opened, template, warn)
        if check:
            refuse_checking_a_definition(template)
        doc = None if isinstance(values, dict) else _values_document(opened, values, kind, key, warn)
        if definition is not None:
            definition = opened_document(opened, definition, warn)
        if doc is not None:
            values, doc = _named_values(doc, blobs, names, fold, warn)
        source = doc.path if doc is not None else "the values"
        values = prefixed(values, source, template, names, fold, definition, strip_prefix, add_prefix,
                          warn=lambda line: say([line], warn))
        options = {"format": format, "layout": layout, "half_strict": half_strict}

        def write_to(out):
            if template.format == "prototxt":
                return _transplant_into_definition(template, values, out, names=names, partial=partial,
                                                   reshape=reshape, fold=fold, precision=precision, warn=warn,
                                                   source=source, **options)
            return _transplant_into_net(template, values, out, definition, names=names, partial=partial,
                                        reshape=reshape, fold=fold, precision=precision, warn=warn, source=source,
                                        **options)

        if check:
            return transplanted_and_checked(template, dest, definition, shapes, warn, write_to)
        return write_to(dest)


def _values_document(opened: contextlib.ExitStack, values, kind, key, warn) -> Document:
    """The Document of transplant's `values` (a path or Document), opened in `opened` unless given open."""
    from ..formats.numpy import cast_for

    if isinstance(values, Document):
        return values
    # Values of another type (float16 .npy, integers, bfloat16) load as float64, which holds them
    # exactly: the template's types decide what is written.
    with reading(key=key) if key is not None else contextlib.nullcontext():
        doc = opened_document(opened, values, warn, kind=kind, npy_cast=cast_for("double"))
    doc.source.will_read_through()
    return doc


def _named_values(doc: Document, blobs, names: str, fold: bool, warn) -> tuple:
    """({name: Entry} of the values selected by `blobs`, under the names asked; the Document they are of).

    A net's values asked for under PyTorch's names are renamed so first.
    """
    from ..formats import select

    entries = select(doc, blobs)
    if names == "torch" and doc.kind == "net" and doc.naming == "blobtool":
        from ..torchport.naming import has_layer_types, torch_names

        if has_layer_types(doc):
            renamed = torch_names(doc, entries, fold=fold)
            say(renamed.warnings, warn)
            doc, entries = renamed.document, renamed.document.entries
    return {e.name: e for e in entries}, doc   # read when fitted; buffers Caffe has no blob for never are


def _transplant_into_net(template, values, dest, definition, *, names, partial, reshape, fold, precision, warn,
                         source, **options) -> str:
    """transplant into a net with blobs: each fitted into the template's blob, and the template written."""
    from ..surgery.into import fit

    fitted = fit(template, values, names=names, partial=partial, reshape=reshape, precision=precision,
                 source=source, fold=fold, net=definition)
    say(fitted.notes, warn)
    if precision is None and fitted.precision:
        precision = fitted.precision
    written = fitted.blobs
    if output_target(dest, options["format"], template)[1] != template.kind:
        # Not the template's own kind (an .npz, a .safetensors): its blobs kept are written too, as stored.
        written = {e.name: written[e.name] if e.name in written else e.blob() for e in template.entries}
    return write(template, written, dest, precision=precision, warn=warn, **options)


def _transplant_into_definition(definition, blobs, dest, *, names, partial, reshape, fold, precision, warn, source,
                                **options) -> str:
    """transplant into a .prototxt: the blobs made from the definition and the values, written as a net."""
    from ..surgery.blueprint import net_with_blobs, template_from_definition
    from ..surgery.into import fit

    if partial:
        raise UsageError(f"{parameter('partial')} keeps a template's values, and a .prototxt holds none: every blob needs a value",
                         path=definition.path)
    notes: list = []
    template = template_from_definition(definition, blobs, names, fold, precision, notes)
    say(notes, warn)
    fitted = fit(template, blobs, names=names, reshape=reshape, precision=precision, source=source, fold=fold)
    say(fitted.notes, warn)
    fmt, kind = output_target(dest, options.get("format"), template)
    if fmt.name == "caffe" and kind == "net":
        net_with_blobs(template, fitted.blobs, dest, precision=precision, layout=options.get("layout"))
        return kind
    if fmt.name == "prototxt":
        raise UsageError("a .prototxt output holds no blobs: write the values into the definition as a "
                         ".caffemodel (or .h5, .npz, .safetensors)", path=definition.path)
    return write(template, fitted.blobs, dest, precision=precision, warn=warn, **options)
