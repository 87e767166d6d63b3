"""The fold command: a net's BatchNorm layers (and the Scale after each) folded into the layer before them."""

from __future__ import annotations

import click

from .options import INPUT, NAMED_SHAPE, OUTPUT, output_target, parse_named_shapes
from .output import emit_json, say_check, say_warning
from .rules import Needs, verb

__all__ = ["fold"]


@verb(rules={"input_shapes": (Needs("check", why="the check runs the nets on inputs of these shapes"),)})
@click.argument("net", type=INPUT)
@click.option("-o", "--output", "outputs", type=OUTPUT, multiple=True, metavar="PATH",
              help="Where to write: the folded net (.caffemodel, or a name without an extension), or its "
                   "definition as text (.prototxt); repeatable, to write both. '-' is stdout; default stdout "
                   "when it is not a terminal.")
@click.option("--definition", type=INPUT, default=None, metavar="PATH",
              help="The definition a .prototxt output folds (a deploy.prototxt of the same net), by layer name, "
                   "instead of the one NET holds, and whose settings (eps, the Scale's axes) the folds use; "
                   "refused where it wires the folded layers otherwise.")
@click.option("--json", "as_json", is_flag=True,
              help="Print what was folded as one JSON object (with -o PATH: stdout cannot hold both).")
@click.option("--check", is_flag=True,
              help="Run the net before and after the fold on the same random input and compare every blob both "
                   "have; exit 1 when one differs beyond float32 rounding (the blobs listed on stderr). The outputs "
                   "are written only when the check passes.")
@NAMED_SHAPE
def fold(net, outputs, definition, as_json, check, input_shapes):
    """Fold each BatchNorm, and the Scale after it, into the Convolution, Deconvolution or InnerProduct before it.

    For deployment: the folded layer computes what the three computed at test
    time (Caffe's stored statistics divided by the BatchNorm's factor, its
    eps), with W' = W * gamma / sqrt(var + eps) and b' = (b - mean) * gamma /
    sqrt(var + eps) + beta per output channel (axis 1 of a Deconvolution's
    weight, in its group), computed in float64 and stored in the type the
    weights were stored in. A bias is created where the layer had none
    (bias_term set). The BatchNorm and Scale layers leave the net, the folded
    layer writes the Scale's (or BatchNorm's) top, and every other layer and
    byte stays as it was. A BatchNorm with no Scale after it folds alone.
    A .prototxt output gets the folded net's definition (no weights), or with
    --definition that definition (a deploy.prototxt) folded the same way.

    The net folded is the deployed one, Caffe's TEST net: a layer its
    include/exclude rules leave out of it (include { phase: TRAIN }) is kept
    as it is and counts as no reader. A BatchNorm stays, with a warning line
    saying why, when it is not in the TEST net, its input comes from another
    layer type or also feeds other layers, or its output feeds more than the
    Scale. With --definition the folds use that definition's settings, and a
    warning line names each one it states otherwise than NET. Folded layers
    are listed on stdout (one per line, or --json) unless an output is
    written there.

    \b
    Example:
      blobtool fold resnet.caffemodel -o resnet_folded.caffemodel
      blobtool fold resnet.caffemodel -o folded.caffemodel -o folded.prototxt --json
      blobtool fold resnet.caffemodel --definition deploy.prototxt -o folded.caffemodel -o folded_deploy.prototxt
      blobtool fold resnet.caffemodel -o folded.caffemodel --check --input-shape data=1,3,32,32
    """
    from ..api import OptionsRefused, fold as fold_net
    from .group import error_line

    outputs = list(outputs) or [output_target(None)]
    if outputs.count("-") > 1:
        raise click.UsageError("standard output ('-') can be written only once")
    if as_json and "-" in outputs:
        raise click.UsageError("--json prints to stdout, where an output is written: give -o PATH")
    shapes = parse_named_shapes(input_shapes)
    try:
        result = fold_net(net, *outputs, definition=definition, check=check, shapes=shapes, warn=say_warning)
    except OptionsRefused as exc:
        raise click.UsageError(error_line(exc)) from exc
    verdict = result.check
    for kept in result.plan.kept:
        say_warning(f"{result.path}: BatchNorm {kept.batchnorm} stays: {kept.why}")
    for kept in result.plan.kept_scales:
        say_warning(f"{result.path}: Scale {kept.scale} stays: {kept.why}")
    for line in result.warnings:
        say_warning(line)
    if "-" not in outputs:
        if as_json:
            emit_json({**result.record(), **({"check": verdict.record()} if verdict is not None else {})})
        else:
            _list_folds(result)
    if verdict is not None:
        say_check(verdict)


def _list_folds(result) -> None:
    from ..report.escape import escape

    for f in result.plan.folds:
        into = f"{f.batchnorm.name} + {f.scale.name}" if f.scale is not None else f"{f.batchnorm.name} (no Scale)"
        bias = ", bias created" if f.bias is None else ""
        click.echo(escape(f"{f.target.name} <- {into}{bias}"))
    click.echo(escape(f"{result.path}: {len(result.plan.folds)} BatchNorm folded, {len(result.plan.kept)} kept; "
                      f"{result.layers_before} layers -> {result.layers_after}"))
