"""The show command: a blob as a picture in the terminal, or as a PNG."""

from __future__ import annotations

import sys

import click

from ..errors import UsageError
from ..report.text import MAX_COLUMNS
from .completion import complete_blob_names
from .names import NAMES_MOVED, NAMES_RULES, check_names, named, names_options
from .options import INPUT, OUTPUT, kind_option
from .output import consoles, say_warning
from .rules import Refuses, verb
from .work import open_input

__all__ = ["show"]


@verb(rules={**NAMES_RULES, "width": (Refuses("output", why="a PNG holds the picture at full resolution"),)},
      moved=NAMES_MOVED)
@click.argument("file", type=INPUT)
@click.option("--blob", "name", metavar="NAME", default=None, shell_complete=complete_blob_names,
              help="The blob to show (name or glob that matches one blob); needed when the file holds several.")
@click.option("--channel", type=click.IntRange(min=0), metavar="C", default=None,
              help="Show channel C (from 0) as a heat map; in a filter grid, channel C of every filter.")
@click.option("--index", type=click.IntRange(min=0), metavar="N", default=None,
              help="Of a 4-D blob (N, C, H, W), show item N (from 0) alone instead of the filter grid.")
@click.option("--width", type=click.IntRange(min=1, max=MAX_COLUMNS), metavar="COLUMNS", default=None,
              help=f"Terminal view at most COLUMNS characters wide, 1 to {MAX_COLUMNS:,} (default: the terminal's "
                   "width).")
@click.option("-o", "--output", type=OUTPUT, default=None, metavar="PATH.png",
              help="Write the picture as a PNG (full resolution; small filters enlarged to 32 pixels, heat maps "
                   "to 512 on the longer side, with their colour bar and range under them) instead of drawing it; "
                   "needs Pillow: pip install 'blobtool[image]'.")
@kind_option
@names_options
def show(file, name, channel, index, width, output, kind, names, no_fold, net):
    """Draw a blob as a picture in the terminal, or write it as a PNG.

    (H, W): a heat map with its value range. (C, H, W) or (1, C, H, W) with
    C == 3: a colour image (Caffe's B, G, R shown as R, G, B). (N, C, H, W):
    a grid of the N filters, each stretched from its own min to max, with
    one-pixel borders. The terminal view uses coloured half-block cells
    (two pixels per character) and shrinks to the terminal's width.
    A picture holds at most 4096 x 4096 pixels (512 x 512 in the terminal)
    and a grid at most 4096 filters; a warning says what was shrunk or left out.

    With --names torch the blob is drawn as PyTorch would hold it (an
    InnerProduct weight as Linear's (out, in), BatchNorm statistics divided by
    their factor), and --blob takes its blobtool name (ip2/0) or its PyTorch
    name (ip2.weight).

    \b
    Example:
      blobtool show imagenet_mean.binaryproto
      blobtool show lenet.caffemodel --blob conv1/0 -o conv1.png
      blobtool show net.caffemodel --blob conv2/0 --index 3 --channel 0
      blobtool show -o ip2.png --names torch --blob ip2.weight net.caffemodel
    """
    from ..api.session import releasing

    check_names(names, net)
    image_module = None
    if output is not None:
        if output != "-" and not output.lower().endswith(".png"):
            raise UsageError(f"show writes PNG only: name the output *.png (got {output!r})")
        if output == "-" and sys.stdout.isatty():
            raise click.UsageError("refusing to write a PNG to a terminal; use -o PATH.png")
        image_module = _pillow_image()
    doc = open_input(file, kind)
    entries = named(doc, [name] if name is not None else [], names, not no_fold, net)[1]
    if len(entries) != 1:
        names = ", ".join(e.name for e in entries[:8]) + (", ..." if len(entries) > 8 else "")
        raise UsageError(f"{doc.path}: show draws one blob; {len(entries)} match ({names}): "
                         "choose one with --blob NAME")
    entry = entries[0]
    with releasing():  # the values are only read: their pages can go back as they are
        _draw(doc, entry, entry.blob().cpu_data().reshape(entry.shape), channel, index, width, output,
              image_module)


def _draw(doc, entry, data, channel, index, width, output, image_module) -> None:
    from ..report.pictures import MAX_PIXELS, PNG_HEAT_SIZE, PNG_MIN_SIZE, TERMINAL_MIN_SIZE, TERMINAL_MAX_PIXELS, view
    from ..report.tables import render_picture

    def picture_of(**bounds):
        try:
            return view(data, channel=channel, index=index, **bounds)
        except UsageError as exc:  # the shape is no picture, or --channel/--index out of range
            raise UsageError(f"blob {entry.name}: {exc.reason}", path=doc.path) from exc

    if image_module is None:
        out, _ = consoles()
        picture = picture_of(width=width or min(out.width, MAX_COLUMNS), min_size=TERMINAL_MIN_SIZE,
                             max_pixels=TERMINAL_MAX_PIXELS)
        render_picture(out, doc.path, entry.name, entry.shape, picture)
        return
    from ..api.session import atomic_output

    from ..report.legend import png_pixels

    picture = picture_of(min_size=PNG_MIN_SIZE, max_pixels=MAX_PIXELS, heat_size=PNG_HEAT_SIZE)
    with atomic_output(output) as f:
        image_module.fromarray(png_pixels(picture)).save(f, format="PNG")
    for line in picture.limits:
        say_warning(f"{doc.path}: blob {entry.name}: {line}")


def _pillow_image():
    """Pillow's Image module, imported only when a PNG is asked for (the optional image extra)."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise UsageError("writing PNG needs Pillow, which is not installed: pip install 'blobtool[image]'") from exc
    return Image
