"""--names and --no-fold: renaming a net's blobs as PyTorch names them (blobtool.naming), and its warnings."""

from __future__ import annotations

import click

from ..formats import NAMING_SCHEMES as SCHEMES
from .output import say_warning

__all__ = ["names_options", "renamed", "warn_all"]


def names_options(f):
    f = click.option("--no-fold", is_flag=True,
                     help="With --names torch: keep a Scale after a BatchNorm apart (<scale>.weight) instead of "
                          "folding it into the BatchNorm's names.")(f)
    f = click.option("--names", "names", type=click.Choice(SCHEMES), default="blobtool", show_default=True,
                     help="Blob names: blobtool's (conv1/0), or torch: a .caffemodel's blobs by layer type as "
                          "PyTorch names them (conv1.weight; BatchNorm statistics divided by their factor).")(f)
    return f


def warn_all(lines) -> None:
    for line in lines:
        say_warning(line)


def renamed(doc, entries, fold: bool):
    """The library's torch_names for the selected entries, its warnings printed."""
    from ..formats.naming import torch_names

    result = torch_names(doc, entries, fold=fold)
    warn_all(result.warnings)
    return result
