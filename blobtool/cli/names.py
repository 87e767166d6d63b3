"""--names and --no-fold: renaming a net's blobs as PyTorch names them (blobtool.naming), and its warnings."""

from __future__ import annotations

import click

from ..formats import NAMING_SCHEMES as SCHEMES
from .output import say_warning

__all__ = ["names_options", "prefix_options", "prefixes_asked", "renamed", "warn_all"]


def names_options(f):
    f = click.option("--no-fold", is_flag=True,
                     help="With --names torch: keep a Scale after a BatchNorm apart (<scale>.weight) instead of "
                          "folding it into the BatchNorm's names.")(f)
    f = click.option("--names", "names", type=click.Choice(SCHEMES), default="blobtool", show_default=True,
                     help="Blob names: blobtool's (conv1/0), or torch: a .caffemodel's blobs by layer type as "
                          "PyTorch names them (conv1.weight; BatchNorm statistics divided by their factor).")(f)
    return f


def prefix_options(f):
    f = click.option("--add-prefix", metavar="P", default=None,
                     help="Put P before every name of the second file (after --strip-prefix), to match the "
                          "first's.")(f)
    f = click.option("--strip-prefix", metavar="P", default=None,
                     help="Take P off the names of the second file that start with it (module. from "
                          "nn.DataParallel), to match the first's. Without either option a shared prefix that "
                          "makes the names match is found and said; --strip-prefix '' turns that off.")(f)
    return f


def prefixes_asked(strip, add):
    """The Prefixes the options ask for (formats/prefixes.py), or None: find one."""
    from ..formats.prefixes import Prefixes

    change = Prefixes(strip, add)
    return change if change.asked else None


def warn_all(lines) -> None:
    for line in lines:
        say_warning(line)


def renamed(doc, entries, fold: bool):
    """The library's torch_names for the selected entries, its warnings printed."""
    from ..formats.naming import torch_names

    result = torch_names(doc, entries, fold=fold)
    warn_all(result.warnings)
    return result
