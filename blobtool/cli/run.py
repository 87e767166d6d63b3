"""The run command: a Caffe net run forward without Caffe, as its TEST phase, in float32."""

from __future__ import annotations

import click

from .options import INPUT, NAMED_SHAPE, OUTPUT, parse_named_shapes, parse_outputs
from .output import emit, emit_json, say_warning
from .rules import Refuses, verb

__all__ = ["run"]


@verb(rules={"as_json": (Refuses("output", why="-o writes the values; --json prints their summary to stdout"),)})
@click.argument("net", type=INPUT)
@click.option("--definition", type=INPUT, default=None, metavar="PATH",
              help="The net's definition to run (a deploy.prototxt, or the .caffemodel whose definition an HDF5 "
                   "NET lacks); NET gives the weights, by layer name.")
@click.option("--input", "input_files", multiple=True, metavar="NAME=FILE",
              help="The values of input NAME, from a file of one blob (.npy, a BlobProto); repeatable. Default: "
                   "random normal values (--seed).")
@NAMED_SHAPE
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="The seed of the random normal values of inputs given no --input.")
@click.option("--outputs", "outputs", default=None, metavar="all|NAME[,NAME...]",
              help="Which blobs: all, or these names (each its value after the last layer writing it). Default: "
                   "the net's outputs, the blobs no layer reads.")
@click.option("-o", "--output", type=OUTPUT, default=None, metavar="OUT.npz",
              help="Write the blobs' values to an .npz (float32, one array per blob name); default: a table of "
                   "each blob's shape, min, max, mean and L2.")
@click.option("--json", "as_json", is_flag=True, help="Print the inputs and each blob's summary as one JSON object.")
def run(net, definition, input_files, input_shapes, seed, outputs, output, as_json):
    """Run a Caffe net forward without Caffe: Caffe's TEST phase, in float32, layer by layer.

    NET is a .caffemodel (any layer format, FP16 blobs included) with its own
    definition, or with a deploy --definition; an HDF5 snapshot with
    --definition. A training net runs as its deploy net: data layers become
    inputs (their shape from --input-shape), loss and accuracy layers go,
    SoftmaxWithLoss becomes Softmax, Dropout passes values through and
    BatchNorm uses its stored statistics. Every layer and shape is checked
    before anything is computed: a layer type blobtool cannot run is exit 3,
    naming it. Inputs without --input get random normal values from --seed,
    said on stderr.

    \b
    Example:
      blobtool run resnet.caffemodel --input-shape data=1,3,32,32
      blobtool run net.caffemodel --definition deploy.prototxt --input data=image.npy -o out.npz
      blobtool run lenet.caffemodel --input-shape data=1,1,28,28 --outputs all --json
    """
    from ..api import OptionsRefused, run as run_net
    from .group import error_line

    shapes = parse_named_shapes(input_shapes)
    wanted = parse_outputs(outputs)
    files = _input_files(input_files)
    try:
        result = run_net(net, definition=definition, inputs=files, shapes=shapes, seed=seed, outputs=wanted,
                         output=output, warn=say_warning)
    except OptionsRefused as exc:
        raise click.UsageError(error_line(exc)) from exc
    for line in result.notes:
        say_warning(line)
    for said in result.inputs:
        if said["given"] != "values given":
            say_warning(f"input {said['name']} ({'x'.join(map(str, said['shape']))}): {said['given']}")
    if output is not None:
        return
    record = result.record()
    if as_json:
        emit_json(record)
        return
    from ..report import running

    emit(record, False, plain=running.plain_run, draw=lambda out: running.render_run(out, record))


def _input_files(values) -> dict:
    """{name: file} from NAME=FILE values (the library reads each as one blob, once its shape is checked)."""
    files = {}
    for value in values:
        name, eq, path = value.partition("=")
        if not eq or not name or not path:
            raise click.BadParameter(f"{value!r}: expected NAME=FILE (data=image.npy)", param_hint="'--input'")
        if name in files:
            raise click.BadParameter(f"{name!r} is given twice", param_hint="'--input'")
        files[name] = path
    return files
