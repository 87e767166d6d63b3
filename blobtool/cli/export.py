"""The export command: a Caffe net written as one ONNX model, and with --check proved against blobtool's forward."""

from __future__ import annotations

import click

from .options import INPUT, NAMED_SHAPE, OUTPUT, parse_named_shapes, parse_numbers, parse_outputs
from .output import emit_json, say_check, say_warning
from .rules import Needs, verb

__all__ = ["export"]


_PIXELS = Needs("preprocess", why="it is a step of the preprocessing --preprocess bakes into the model")


@verb(rules={"seed": (Needs("check", why="the check draws its input from it"),), "mean": (_PIXELS,),
             "scale": (_PIXELS,), "raw_scale": (_PIXELS,), "rgb": (_PIXELS,), "pixels": (_PIXELS,)})
@click.argument("net", type=INPUT)
@click.option("-o", "--output", type=OUTPUT, required=True, metavar="FILE.onnx",
              help="Where to write the model (a model over 2 GiB keeps its weights in FILE.onnx.data beside it).")
@click.option("--definition", type=INPUT, default=None, metavar="PATH",
              help="The net's definition to export (a deploy.prototxt, or the .caffemodel whose definition an HDF5 "
                   "NET lacks); NET gives the weights, by layer name.")
@NAMED_SHAPE
@click.option("--opset", type=click.IntRange(min=1), default=None, metavar="N",
              help="The ONNX opset, 13 (Softmax on one axis needs it) to 28; default 17 (onnx2torch reads up to "
                   "17).")
@click.option("--outputs", "outputs", default=None, metavar="all|NAME[,NAME...]",
              help="The graph's outputs: all, or these blob names (the graph ends where they are computed). "
                   "Default: the net's outputs.")
@click.option("--check", is_flag=True,
              help="Run onnx's full check, then onnxruntime and blobtool's own forward on the same random input; "
                   "exit 1 when an output differs beyond float32 rounding, or onnx or onnxruntime refuses the "
                   "model. The model is written only when the check passes.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="The seed of --check's random normal input.")
@click.option("--preprocess", is_flag=True,
              help="Bake predict's preprocessing into the model: it takes uint8 pixels, N x H x W x C, RGB (or "
                   "--pixels bgr), of the input's size (defaults from the net's transform_param).")
@click.option("--mean", default=None, metavar="FILE|V[,V,V]", help="With --preprocess: the mean, as predict takes it.")
@click.option("--scale", default=None, metavar="F[,F,F]", help="With --preprocess: the scale, as predict takes it.")
@click.option("--raw-scale", type=float, default=None, metavar="F",
              help="With --preprocess: pixel values over 255 times F (default 255).")
@click.option("--rgb", is_flag=True, help="With --preprocess: the net takes RGB (default BGR, Caffe's order).")
@click.option("--pixels", type=click.Choice(["rgb", "bgr"], case_sensitive=False), default=None,
              help="With --preprocess: the channel order of the pixels the model is given: rgb (default, as Pillow "
                   "and most decoders give them) or bgr (as OpenCV's imread gives them).")
@click.option("--dynamic", is_flag=True,
              help="Inputs and blobs of any batch, height and width (dim_param N, H, W) wherever the layers allow "
                   "it; each layer that fixes axes at the exported size says so on stderr. --check checks at the "
                   "exported size.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written (and the check) as one JSON object.")
def export(net, output, definition, input_shapes, opset, outputs, check, seed, preprocess, mean, scale, raw_scale,
           rgb, pixels, dynamic, as_json):
    """Export a Caffe net to ONNX: the deploy net, definition and weights, as one model.

    The graph is the deploy net `blobtool run` runs (Caffe's TEST phase,
    data layers as inputs named by their blobs, shapes from the definition
    or --input-shape), every layer written exactly as Caffe computes it:
    pooling through pads with ceil_mode, LRN with Caffe's k and alpha, PReLU's
    slope per channel, Eltwise's coefficients, BatchNorm's factor and eps.
    Initializers are named after Caffe's blobs (conv1/0), values after its
    tops. A layer that cannot be exported exactly is exit 3, naming it,
    before anything is written. --check needs blobtool[onnx] (onnx and
    onnxruntime).

    \b
    Example:
      blobtool export resnet.caffemodel -o resnet.onnx --check
      blobtool export net.caffemodel --definition deploy.prototxt -o net.onnx --opset 13
      blobtool export lenet.caffemodel --input-shape data=1,1,28,28 -o lenet.onnx
      blobtool export resnet.caffemodel -o resnet_pixels.onnx --preprocess --mean 104,117,123 --check
      blobtool export resnet.caffemodel -o resnet_cv.onnx --preprocess --pixels bgr --mean 104,117,123
      blobtool export det1.caffemodel -o pnet.onnx --dynamic --check
    """
    from ..api import export as export_net

    if not str(output).endswith(".onnx") and output != "-":
        raise click.UsageError(f"-o {output}: export writes an ONNX model (FILE.onnx)")
    if output == "-":
        raise click.UsageError("export writes a file (-o FILE.onnx): an ONNX model may keep its weights beside it")
    steps = {"mean": mean, "scale": parse_numbers(scale, "'--scale'"), "raw_scale": raw_scale,
             "rgb": rgb, "pixels": pixels} if preprocess else None
    result, verdict = export_net(net, output, definition=definition, shapes=parse_named_shapes(input_shapes),
                                 opset=opset, outputs=parse_outputs(outputs), check=check, seed=seed,
                                 warn=say_warning, preprocess=steps, dynamic=dynamic)
    if as_json:
        emit_json({**result.record(), **({"check": verdict.record()} if verdict is not None else {})})
    else:
        from ..report.escape import escape

        data = f", weights in {result.external}" if result.external else ""
        inputs = [f"{result.input_names.get(n, n)} {'x'.join(map(str, s))}" for n, s in result.inputs.items()]
        outputs = [result.names.get(n, n) for n in result.outputs]
        click.echo(escape(f"{result.path}: opset {result.opset}, {result.nodes} nodes, {result.initializers} "
                          f"initializers ({result.weight_bytes:,} bytes{data}); inputs {_listed(inputs)}; outputs "
                          f"{_listed(outputs)}"))
    if verdict is not None:
        say_check(verdict)


# A net of 40,000 outputs (--outputs all on a wide Split) would print them all on one line; --json lists every one.
_SHOWN = 12


def _listed(names: list) -> str:
    """The names, the first _SHOWN of them where there are more, with how many were left out."""
    if len(names) <= _SHOWN:
        return ", ".join(names)
    return ", ".join(names[:_SHOWN]) + f" and {len(names) - _SHOWN:,} more (--json lists them)"
