"""convert's net surgery: --into TEMPLATE (with --partial, --reshape) and --rename / --drop (blobtool.surgery)."""

from __future__ import annotations

import click

from .options import listed_names
from .paths import INPUT

__all__ = ["surgery_options", "open_edited", "write_into"]


def surgery_options(f):
    f = click.option("--add-prefix", metavar="P", default=None, callback=listed_names,
                     help="With --into: put P before every name of FILE (after --strip-prefix) before matching.")(f)
    f = click.option("--strip-prefix", metavar="P", default=None, callback=listed_names,
                     help="With --into: take P off FILE's names that start with it (module. from nn.DataParallel) "
                          "before matching them with TEMPLATE's. Without either option a prefix that makes the "
                          "names match is found and said on stderr; --strip-prefix '' turns that off.")(f)
    f = click.option("--drop", "drops", multiple=True, metavar="LAYER",
                     help="Leave layer LAYER (named as info --layers lists it) and its blobs out of the net "
                          "written (of TEMPLATE with --into); "
                          "the layers reading its output are left as they are and named on stderr. "
                          "Repeatable.")(f)
    f = click.option("--rename", "renames", multiple=True, metavar="OLD=NEW",
                     help="Rename layer OLD to NEW in the net written (of TEMPLATE with --into), and so its "
                          "blobs (OLD/0 becomes NEW/0); its tops and bottoms stay. NEW must be UTF-8 text. "
                          "Repeatable.")(f)
    f = click.option("--reshape", is_flag=True,
                     help="With --into: write a value of the same count but another shape in the template's "
                          "shape (default: refused, listed as mismatched).")(f)
    f = click.option("--partial", is_flag=True,
                     help="With --into: keep the template's values where FILE has none that fits, and name them "
                          "on stderr (default: exit 3 listing the missing, unexpected and mismatched blobs).")(f)
    f = click.option("--into", "template", type=INPUT, default=None, metavar="TEMPLATE",
                     help="Write FILE's values into the net TEMPLATE (.caffemodel, .caffemodel.h5, or .prototxt: blobs "
                          "made from its layers), matched by "
                          "name (--names torch: PyTorch's names, as convert --names torch writes them), keeping "
                          "TEMPLATE's every other byte and stored types.")(f)
    return f


def open_edited(path, kind, patterns, npy_cast, renames, drops):
    """(document, selected entries, their Blobs to write): the input with --rename and --drop applied, then selected.

    Selection (--blob) is by the names after renaming.
    """
    from ..formats import select
    from ..surgery.rename import edit_layers, parse_renames
    from .names import warn_all
    from .work import open_input

    doc = open_input(path, kind, npy_cast=npy_cast)
    doc, lines = edit_layers(doc, parse_renames(renames), drops)
    warn_all(lines)
    entries = select(doc, patterns)
    doc.source.will_read_through()
    return doc, entries, [e.blob_to_write() for e in entries]


def write_into(file, template, output, fmt, *, kind, patterns, names, fold, partial, reshape, precision, layout,
               half_strict, renames, drops, net=None, strip_prefix=None, add_prefix=None) -> None:
    """convert FILE --into TEMPLATE: FILE's selected values written into TEMPLATE (edited), by api.write.

    `net` (--net) gives the layer types of a template without them (an HDF5 snapshot).
    """
    from ..api import write
    from ..torchport.naming import has_layer_types
    from ..formats.numpy import cast_for
    from ..surgery.prefixed import PrefixClash
    from .group import error_line
    from .names import renamed
    from .output import progress, say_warning
    from .work import load_selected, open_input

    target, _, _ = open_edited(template, None, (), None, renames, drops)
    # Values of another type (float16 .npy, integers, bfloat16) load as float64,
    # which holds them exactly: the template's types decide what is written.
    doc, entries = load_selected(file, kind, patterns, npy_cast=cast_for("double"))[:2]
    if names == "torch" and has_layer_types(doc):
        result = renamed(doc, entries, fold)
        doc, entries = result.document, result.document.entries
    # Entries, read when fitted: PyTorch's buffers Caffe has no blob for are named, never read.
    values = {e.name: e for e in entries}
    types = open_input(net) if net is not None else None
    try:
        with progress(target, "writing"):
            write(doc, values, output, format=fmt, precision=precision, layout=layout, half_strict=half_strict,
                  warn=say_warning, into=target, names=names, partial=partial, reshape=reshape, fold=fold,
                  net=types, strip_prefix=strip_prefix, add_prefix=add_prefix)
    except PrefixClash as exc:
        # The options asked for a rename that cannot be: the command's usage error, as click's own.
        raise click.UsageError(error_line(exc)) from exc
