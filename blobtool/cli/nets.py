"""The commands on a net as a whole: definition, transplant, edit (fold is fold.py's)."""

from __future__ import annotations

import click

from ..api.kinds import NAMING_SCHEMES
from .names import NAMES_MOVED, NAMES_RULES, check_names, prefix_options
from .options import INPUT, NAMED_SHAPE, OUTPUT, blob_option, kind_option, output_options, parse_named_shapes
from .output import emit_json, progress, say_check, say_warning
from .rules import Needs, Refuses, verb
from .write import EDITS_MOVED, blob_output

__all__ = ["definition", "transplant", "edit"]


def _text_output(output) -> bool:
    """Whether definition writes text there: standard output, or a name that is not a binary net's."""
    from ..api.choices import chosen_format

    return output is None or output == "-" or chosen_format(output, None) not in ("protobuf", "same")


def _stdout(output) -> bool:
    return output is None or output == "-"


@verb(rules={"strict": (Needs("output", _text_output, shown="a text output (-o FILE.prototxt, or stdout)"),),
             "input_shapes": (Needs("deploy", why="a deploy net's inputs take shapes"),),
             "as_json": (Needs("deploy"), Refuses("output", (None, "-"), "the definition goes to stdout: give -o "
                                                                          "FILE.prototxt")),
             "deploy": (Needs("output", _text_output, shown="a text output (-o FILE.prototxt, or stdout)"),)})
@click.argument("net", type=INPUT)
@click.option("-o", "--output", type=OUTPUT, default=None, metavar="PATH",
              help="Write to PATH: .prototxt or .pbtxt (the text; the default is stdout), or, for a .prototxt "
                   "NET, .caffemodel (a binary net without blobs).")
@click.option("--strict", is_flag=True,
              help="Fields that text cannot carry (another fork's) are an error (exit 2, nothing written), not a "
                   "warning line each.")
@click.option("--deploy", is_flag=True,
              help="The deploy definition: Caffe's TEST net with data layers as Input layers, loss and accuracy "
                   "layers gone (SoftmaxWithLoss as Softmax), phase rules gone.")
@NAMED_SHAPE
@click.option("--json", "as_json", is_flag=True,
              help="With --deploy and -o PATH: print the deploy net's inputs, what went and the data layers' "
                   "preprocessing as one JSON object.")
def definition(net, output, strict, deploy, input_shapes, as_json):
    """Print a net's definition as text: every layer's parameters and wiring, without blobs.

    NET is a .caffemodel in any of Caffe's layer formats (V1 and V0 are
    upgraded as Caffe upgrades them) or a .prototxt; Caffe's HDF5 snapshot
    holds no definition (it holds blobs under layer names only). The text is
    protobuf's text format, as Caffe reads it (deploy.prototxt, train_val).
    With a .prototxt NET and -o FILE.caffemodel the definition is written
    as a binary net without blobs. With --deploy, a training net's deploy
    definition (data layers become Input layers whose shape --input-shape
    gives): what went, and the preprocessing the data layers did, are said
    on stderr.

    \b
    Example:
      blobtool definition model.caffemodel > model.prototxt
      blobtool definition model.caffemodel -o model.prototxt --strict
      blobtool definition deploy.prototxt -o deploy.caffemodel
      blobtool definition lenet.caffemodel --deploy --input-shape data=1,1,28,28 -o deploy.prototxt
    """
    from ..api import definition_text, deploy_definition, write
    from .work import open_input

    doc = open_input(net)
    with doc:
        if deploy:
            made = deploy_definition(doc, output or "-", shapes=parse_named_shapes(input_shapes), strict=strict,
                                     warn=say_warning)
            if as_json:
                emit_json({"path": doc.path, "output": output, **made.record()})
            return
        if not _text_output(output):
            if doc.format != "prototxt":
                raise click.UsageError(f"{doc.path} is a binary net already: its definition goes to a .prototxt "
                                       "(blobtool convert re-encodes the net itself)")
            from ..api import net_definition

            # A field the text held that the schema does not know has no number to encode it with.
            for line in net_definition(doc).lost_lines(doc.path):
                say_warning(f"{line}; left out of the binary net (their field numbers are unknown)")
            write(doc, None, output, format="protobuf", warn=say_warning)
            return
        definition_text(doc, output or "-", strict=strict, warn=say_warning)


TRANSPLANT_RULES = {
    "input_shapes": (Needs("check", why="the check runs the nets on inputs of these shapes"),),
    "no_fold": NAMES_RULES["no_fold"],
    "net": (Needs("names", tuple(s for s in NAMING_SCHEMES if s != "blobtool"),
                  "it gives the layer types of a template without them, to name its blobs as PyTorch does"),),
}


@verb(rules=TRANSPLANT_RULES, moved={**NAMES_MOVED, **EDITS_MOVED,
                                    "--into": "--into is not needed: blobtool transplant SOURCE TEMPLATE -o OUT"},
      respelled={f"--{p}": ("--precision", p) for p in ("float", "double", "half")})
@click.argument("source", type=INPUT)
@click.argument("template", type=INPUT)
@output_options
@click.option("--names", type=click.Choice(NAMING_SCHEMES), default="blobtool", show_default=True,
              help="How SOURCE's values are named: blobtool's (conv1/0, as TEMPLATE's blobs), or torch: PyTorch's "
                   "(conv1.weight, as convert --names torch writes them; a .caffemodel SOURCE is renamed so "
                   "first), or torch-identifiers.")
@click.option("--no-fold", is_flag=True,
              help="With --names torch: the values keep a Scale after a BatchNorm apart (<scale>.weight), as "
                   "convert --names torch --no-fold writes them.")
@click.option("--definition", "net", type=INPUT, default=None, metavar="PATH",
              help="With --names torch and an HDF5 snapshot TEMPLATE (which holds no layer types): the net "
                   "whose definition gives them (the matching .caffemodel or .prototxt).")
@click.option("--partial", is_flag=True,
              help="Keep TEMPLATE's values where SOURCE has none that fits, and name them on stderr (default: "
                   "exit 3 listing the missing, unexpected and mismatched blobs).")
@click.option("--reshape", is_flag=True,
              help="Write a value of the same count but another shape in the template's shape (default: refused, "
                   "listed as mismatched).")
@prefix_options(changed="SOURCE", other="TEMPLATE's")
@click.option("--precision", type=click.Choice(("float", "double", "half")), default=None,
              help="Write the values as float32, float64 or float16 (default: each blob in TEMPLATE's stored "
                   "type).")
@blob_option
@kind_option
@click.option("--check", is_flag=True,
              help="Run TEMPLATE and the net written on the same random input and compare every blob both have; "
                   "exit 1 when one differs beyond float32 rounding (a round trip must compute what TEMPLATE "
                   "did). The output is written only when the check passes.")
@NAMED_SHAPE
def transplant(source, template, output, fmt, names, no_fold, net, partial, reshape, strip_prefix, add_prefix,
               precision, patterns, kind, check, input_shapes):
    """Write SOURCE's values into the net TEMPLATE, blob by blob, and write TEMPLATE with them.

    Caffe's net surgery "transplants" parameters from one net into another;
    SOURCE is any file blobtool reads (a .caffemodel, .safetensors, .npz, a
    PyTorch .pt/.pth state dict), TEMPLATE a .caffemodel (every other byte
    kept, its stored types too), Caffe's HDF5 snapshot, or a .prototxt (the
    blobs made from its layers). Values match blobs by name; strict by
    default (exit 3 naming the missing, unexpected and mismatched blobs).
    A prefix that makes SOURCE's names TEMPLATE's (module. from
    nn.DataParallel) is found and said on stderr, or given with
    --strip-prefix and --add-prefix. --blob selects SOURCE's values.

    \b
    Example:
      blobtool transplant finetuned.caffemodel net.caffemodel -o merged.caffemodel --partial
      blobtool transplant finetuned.safetensors net.caffemodel --names torch -o finetuned.caffemodel
      blobtool transplant port.pth deploy.prototxt --names torch -o port.caffemodel
      blobtool transplant port.safetensors net.caffemodel --names torch -o back.caffemodel --check
    """
    from ..api import OptionsRefused, PrefixClash, transplant as transplant_values
    from .group import error_line
    from .work import open_input

    check_names(names, net)
    output = blob_output(output, fmt)
    shapes = parse_named_shapes(input_shapes)
    # The template is opened here for the progress bar of its writing.
    with open_input(template) as target:
        try:
            with progress(target, "writing"):
                verdict = transplant_values(source, target, output, names=names, partial=partial, reshape=reshape,
                                            fold=not no_fold, definition=net, strip_prefix=strip_prefix,
                                            add_prefix=add_prefix, format=fmt, precision=precision,
                                            blobs=patterns, kind=kind, check=check, shapes=shapes,
                                            warn=say_warning)
        except (OptionsRefused, PrefixClash) as exc:
            # The options asked for what cannot be (a rename, a check): the command's usage error, as click's own.
            raise click.UsageError(error_line(exc)) from exc
    if check:
        say_check(verdict)


@verb()
@click.argument("net", type=INPUT)
@output_options
@click.option("--rename", "renames", multiple=True, metavar="OLD=NEW",
              help="Rename layer OLD to NEW, and so its blobs (OLD/0 becomes NEW/0); its tops and bottoms stay. "
                   "NEW must be UTF-8 text. Repeatable.")
@click.option("--drop", "drops", multiple=True, metavar="LAYER",
              help="Leave layer LAYER (named as info --layers lists it) and its blobs out; the layers reading its "
                   "output stay as they are and are named on stderr. Repeatable.")
def edit(net, output, fmt, renames, drops):
    """Net surgery on a rewrite: rename layers, drop layers, keep every other byte.

    NET is a .caffemodel (any layer format) or Caffe's HDF5 snapshot; the
    output is the same kind, or any format convert writes (a name without an
    extension: NET's own format). Nothing is computed: a renamed layer's blobs
    are its blobs, under its new name.

    \b
    Example:
      blobtool edit net.caffemodel --rename fc8=fc8_cats --drop loss -o surgery.caffemodel
    """
    from ..api import edit as edit_net
    from .work import open_input

    if not renames and not drops:
        raise click.UsageError("nothing to edit: give --rename OLD=NEW or --drop LAYER")
    output = blob_output(output, fmt)
    doc = open_input(net)
    with doc, progress(doc, "writing"):
        edit_net(doc, output, renames=renames, drops=drops, format=fmt, warn=say_warning)
