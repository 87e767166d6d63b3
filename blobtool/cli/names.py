"""--names and --no-fold: renaming a net's blobs as PyTorch names them (formats/naming.py, torchmeta.py), and its lines."""

from __future__ import annotations

import click

from ..formats import NAMING_SCHEMES as SCHEMES
from .output import say_warning

__all__ = ["names_options", "renamed", "warn_all", "say_summary", "renamer"]


def names_options(f):
    f = click.option("--no-fold", is_flag=True,
                     help="With --names torch: keep a Scale after a BatchNorm apart (<scale>.weight) instead of "
                          "folding it into the BatchNorm's names.")(f)
    f = click.option("--names", "names", type=click.Choice(SCHEMES), default="blobtool", show_default=True,
                     help="Blob names: blobtool's (conv1/0), or torch: a .caffemodel's blobs by layer type as "
                          "PyTorch names them (conv1.weight; BatchNorm statistics divided by their factor; "
                          "BatchNorm eps and other settings in the metadata), or torch-identifiers: the same "
                          "with each module name made a Python identifier (conv6-1 -> conv6_1).")(f)
    return f


def warn_all(lines) -> None:
    for line in lines:
        say_warning(line)


def renamer(scheme: str):
    """The library's renaming for --names `scheme` (torch or torch-identifiers), as torch_pair takes it."""
    import functools

    from ..formats.torchmeta import named

    return functools.partial(named, scheme=scheme)


def renamed(doc, entries, fold: bool, scheme: str = "torch"):
    """The library's TorchExport for the selected entries, its warnings printed."""
    result = renamer(scheme)(doc, entries, fold=fold)
    warn_all(result.warnings)
    return result


def say_summary(lines) -> None:
    """"blobtool: " and each line, on stderr: what a command did, not a warning."""
    from ..report.escape import escape

    for line in lines:
        try:
            click.echo("blobtool: " + escape(line), err=True)
        except (OSError, ValueError):
            pass  # a closed or full stderr loses the line, not the command's result
