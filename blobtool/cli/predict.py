"""The predict command: images in, answers out (classes, boxes, class maps), as Caffe's users preprocessed them."""

from __future__ import annotations

import contextlib
import sys

import click

from .options import INPUT, NAMED_SHAPE, parse_named_shapes, parse_numbers
from .output import emit_json, say_warning
from .rules import verb

__all__ = ["predict"]


def _size(text) -> tuple | None:
    values = parse_numbers(text, "'--resize'", 2)
    if values is None:
        return None
    if any(v != int(v) or v < 1 for v in values):
        raise click.BadParameter(f"{text!r}: expected a height and width in pixels (256,256)", param_hint="'--resize'")
    return int(values[0]), int(values[1])


@verb()
@click.argument("net", type=INPUT)
@click.argument("images", nargs=-1, required=True, type=click.Path(readable=False), metavar="IMAGE...")
@click.option("--definition", type=INPUT, default=None, metavar="PATH",
              help="The net's definition (a deploy.prototxt); NET gives the weights, by layer name.")
@NAMED_SHAPE
@click.option("--mean", default=None, metavar="FILE|V[,V,V]",
              help="Subtract a mean: an image (.binaryproto, .npy; centre-cropped as Caffe's data layer crops) or "
                   "values per channel in the net's channel order. Default: the net's transform_param mean_value.")
@click.option("--scale", default=None, metavar="F[,F,F]",
              help="Multiply by F after the mean (transform_param.scale, pycaffe's input_scale); one per channel "
                   "for ports that divide by each channel's std. Default: the net's transform_param scale.")
@click.option("--raw-scale", type=float, default=None, metavar="F",
              help="Pixel values are fractions in [0, 1] times F (pycaffe's raw_scale). Default: 255.")
@click.option("--rgb", is_flag=True, help="Keep RGB channel order (default BGR, as Caffe's data layers read images).")
@click.option("--resize", default=None, metavar="H,W",
              help="Resize to H,W, then take the centre crop of the net's input size. Default: resize to the input.")
@click.option("--oversample", is_flag=True,
              help="Average a classifier over 10 crops of the --resize image (corners, centre, mirrored), as "
                   "caffe.Classifier.")
@click.option("--labels", type=click.Path(dir_okay=False, readable=False), default=None, metavar="FILE",
              help="Class names: synset_words.txt or one name a line (quoted or not).")
@click.option("--top", type=click.IntRange(min=1), default=5, show_default=True, metavar="K",
              help="How many classes a classifier's answer lists.")
@click.option("--threshold", type=click.FloatRange(min=0), default=0.5, show_default=True, metavar="F",
              help="The least score of a detected box shown.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object an image (JSON Lines): image, input shape, preprocessing, answer.")
@click.option("-o", "--output", type=click.Path(readable=False), default=None, metavar="OUT",
              help="OUT.png: the answer drawn on the image (a folder for several images); OUT.npz: the raw output "
                   "blobs, as run writes them.")
def predict(net, images, definition, input_shapes, mean, scale, raw_scale, rgb, resize, oversample, labels, top, threshold,
            as_json, output):
    """Run a Caffe net on images: the top classes, the boxes, or the class map of each, preprocessed as Caffe's.

    IMAGE is a JPEG, PNG, BMP, TIFF or WebP file, or a folder of them (the
    `image` extra: Pillow). Each is decoded to RGB values in [0, 1] (EXIF
    orientation followed), made the net's channels (gray repeated, colour to
    luma; OpenCV's 8-bit gray where the data layer's force_gray or is_color:
    false asks; a data layer's mirror is not done), resized bilinearly to the net's input (or to --resize, then
    cropped), then in Caffe's order: times --raw-scale, RGB to BGR, minus
    --mean, times --scale. The steps are said on stderr. The answer follows
    from what the net ends in: a classifier's top classes, an SSD's boxes in
    the image's pixels, a dense output's class map with each class's share,
    or else each output blob's summary. An image that cannot be read is one
    line on stderr and the rest go on; the exit code is then 3.

    \b
    Example:
      blobtool predict bvlc_googlenet.caffemodel --definition deploy.prototxt cat.jpg --labels synset_words.txt
      blobtool predict ssd.caffemodel --definition deploy.prototxt street.jpg --threshold 0.6 -o street.png
      blobtool predict fcn.caffemodel photos/ --json -o maps/
    """
    from ..api import predict as predict_images
    from ..errors import ExitCode

    if oversample and not resize:
        raise click.UsageError("--oversample takes its 10 crops from the --resize image: give --resize H,W")
    with _progress_bar() as bar:
        result = predict_images(net, list(images), definition=definition, mean=mean,
                                scale=parse_numbers(scale, "'--scale'"), raw_scale=raw_scale, rgb=rgb,
                                resize=_size(resize), oversample=oversample, labels=labels, top=top,
                                threshold=threshold, shapes=parse_named_shapes(input_shapes) or None,
                                warn=say_warning, progress=bar)
    for line in result.notes:
        say_warning(line)
    say_warning(result.settings.line())
    _report(result, as_json)
    if output is not None:
        _write(result, output)
    if result.failed:
        raise click.exceptions.Exit(int(ExitCode.INPUT))


# A bar for more crops than this, on a terminal: fewer run in a blink.
_BAR_FROM = 16


@contextlib.contextmanager
def _progress_bar():
    """A callback (done, total) drawing a rich bar on stderr when it is a terminal and the work is long; else None."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from .output import consoles

    _, err = consoles()
    columns = (TextColumn("running"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = []

        def advance(done: int, total: int) -> None:
            if total <= _BAR_FROM:
                return
            if not task:
                task.append(bar.add_task("running", total=total))
            bar.update(task[0], completed=done)

        yield advance


def _report(result, as_json: bool) -> None:
    """Each record: JSON Lines, or its lines of text; an image that failed as one line on stderr."""
    from ..report.answers import answer_lines
    from .group import say_error

    for record in result.records:
        if "error" in record:
            say_error(record["error"])
        for note in record.get("decoded", ()):
            say_warning(f"{record['image']}: {note}")
        if as_json:
            emit_json(record)
        else:
            for line in answer_lines(record):
                click.echo(line)


def _write(result, output) -> None:
    """-o: the raw outputs as an .npz, or each image's answer drawn."""
    from ..api.predicting import picture_paths, save_picture, write_outputs

    if str(output).lower().endswith(".npz"):
        write_outputs(result, output)
        return
    from ..report.drawing import draw_answer

    for index, dest in enumerate(picture_paths(result, output)):
        if dest is not None:
            record = result.records[index]
            picture = draw_answer(result.images[index].pixels, record["answer"], result.classmaps[index])
            save_picture(picture, dest)
