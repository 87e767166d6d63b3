"""--names, --no-fold and --net: renaming a net's blobs as PyTorch names them (torchport/naming.py, metadata.py), and its lines."""

from __future__ import annotations

import click

from ..formats import NAMING_SCHEMES as SCHEMES
from .output import say_warning
from .options import listed_names
from .paths import INPUT

__all__ = ["names_options", "check_names", "prefix_options", "prefixes_asked", "renamed", "named", "renamer",
           "warn_all", "say_summary"]


def names_options(f):
    f = click.option("--net", "net", type=INPUT, default=None, metavar="FILE",
                     help="With --names torch: the net whose layer types rename the blobs of a net that holds "
                          "none (Caffe's HDF5 snapshot): the matching .caffemodel, its layers matched by name "
                          "(exit 2 when a layer holding blobs is not in it or its blobs differ). Files with "
                          "types of their own use theirs.")(f)
    f = click.option("--no-fold", is_flag=True,
                     help="With --names torch: keep a Scale after a BatchNorm apart (<scale>.weight) instead of "
                          "folding it into the BatchNorm's names.")(f)
    f = click.option("--names", "names", type=click.Choice(SCHEMES), default="blobtool", show_default=True,
                     help="Blob names: blobtool's (conv1/0), or torch: a net's blobs by layer type as "
                          "PyTorch names them (conv1.weight; BatchNorm statistics divided by their factor; "
                          "BatchNorm eps and the other settings in a .safetensors export's metadata), or "
                          "torch-identifiers: the same with each module name made a Python identifier "
                          "(conv6-1 -> conv6_1). --blob selects by blobtool's names (show's also by PyTorch's).")(f)
    return f


def check_names(names: str, net) -> None:
    """Refuse --net without --names torch (usage error): it would change nothing."""
    if net is not None and names == "blobtool":
        raise click.UsageError("--net gives the layer types that --names torch renames by; add --names torch")
    if net == "-":
        raise click.UsageError("--net names a file: standard input is for the inputs")


def prefix_options(f):
    f = click.option("--add-prefix", metavar="P", default=None, callback=listed_names,
                     help="Put P before every name of the second file (after --strip-prefix), to match the "
                          "first's.")(f)
    f = click.option("--strip-prefix", metavar="P", default=None, callback=listed_names,
                     help="Take P off the names of the second file that start with it (module. from "
                          "nn.DataParallel), to match the first's. Without either option a shared prefix that "
                          "makes the names match is found and said; --strip-prefix '' turns that off.")(f)
    return f


def prefixes_asked(strip, add):
    """The Prefixes the options ask for (torchport/prefixes.py), or None: find one."""
    from ..torchport.prefixes import Prefixes

    change = Prefixes(strip, add)
    return change if change.asked else None


def warn_all(lines) -> None:
    for line in lines:
        say_warning(line)


def renamer(scheme: str):
    """The library's renaming for --names `scheme` (torch or torch-identifiers), as torch_pair takes it."""
    import functools

    from ..torchport.metadata import named as export

    return functools.partial(export, scheme=scheme)


def renamed(doc, entries, fold: bool, net=None, scheme: str = "torch"):
    """The library's TorchExport for the selected entries, its warnings printed; `net`: the --net path or None."""
    from ..torchport.naming import has_layer_types
    from .work import open_input

    rename = renamer(scheme)
    if net is None or has_layer_types(doc):
        result = rename(doc, entries, fold=fold)
    else:
        # Only its layers are read (types, bottoms, tops, settings): it is let go once the names are made.
        with open_input(net) as types:
            result = rename(doc, entries, fold=fold, net=types)
    warn_all(result.warnings)
    return result


def named(doc, entries, names: str, fold: bool, net=None) -> tuple:
    """(document, entries) under the names asked: as they are for blobtool's, renamed for torch's."""
    if names == "blobtool":
        return doc, entries
    result = renamed(doc, entries, fold, net, names)
    return result.document, list(result.document.entries)


def say_summary(lines) -> None:
    """"blobtool: " and each line, on stderr: what a command did, not a warning."""
    from ..report.escape import escape

    for line in lines:
        try:
            click.echo("blobtool: " + escape(line), err=True)
        except (OSError, ValueError):
            pass  # a closed or full stderr loses the line, not the command's result
