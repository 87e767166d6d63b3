"""--names, --no-fold and --definition: renaming a net's blobs as PyTorch names them (torchport/naming.py, metadata.py), and its lines."""

from __future__ import annotations

import click

from ..api.kinds import NAMING_SCHEMES as SCHEMES
from .output import say_warning
from .options import listed_names
from .paths import INPUT
from .rules import Needs

# The schemes that rename by PyTorch's names, which --no-fold and --definition go with.
TORCH_NAMES = tuple(s for s in SCHEMES if s != "blobtool")

# The rules of names_options (cli/rules.py), for the commands that take them.
NAMES_RULES = {
    "no_fold": (Needs("names", TORCH_NAMES, "it keeps a Scale apart from the BatchNorm in PyTorch's names"),),
    "net": (Needs("names", TORCH_NAMES, "it gives the layer types that PyTorch's names are made from"),),
}
NAMES_MOVED = {"--net": "--net is now --definition PATH (the net whose definition gives the layer types)"}

__all__ = ["names_options", "NAMES_RULES", "NAMES_MOVED", "TORCH_NAMES", "check_names", "prefix_options", "prefixes_asked", "renamed", "named", "selected_renamed", "renamer",
           "warn_all", "say_summary"]


def names_options(f):
    f = click.option("--definition", "net", type=INPUT, default=None, metavar="PATH",
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
    """Refuse --definition - (usage error): standard input is for the inputs."""
    if net == "-":
        raise click.UsageError("--definition names a file: standard input is for the inputs")


def prefix_options(f=None, *, changed: str = "the second file", other: str = "the first's"):
    """--strip-prefix and --add-prefix, said of the file whose names they change (compare's second, by default)."""
    def add(f):
        f = click.option("--add-prefix", metavar="P", default=None, callback=listed_names,
                         help=f"Put P before every name of {changed} (after --strip-prefix), to match {other}.")(f)
        f = click.option("--strip-prefix", metavar="P", default=None, callback=listed_names,
                         help=f"Take P off the names of {changed} that start with it (module. from "
                              f"nn.DataParallel), to match {other}. Without either option a shared prefix that "
                              "makes the names match is found and said; --strip-prefix '' turns that off.")(f)
        return f

    return add(f) if f is not None else add


def prefixes_asked(strip, add):
    """The Prefixes the options ask for (torchport/prefixes.py), or None: find one."""
    from ..api.naming import Prefixes

    change = Prefixes(strip, add)
    return change if change.asked else None


def warn_all(lines) -> None:
    for line in lines:
        say_warning(line)


def renamer(scheme: str):
    """The library's renaming for --names `scheme` (torch or torch-identifiers), as torch_pair takes it."""
    import functools

    from ..api.naming import named as export

    return functools.partial(export, scheme=scheme)


def renamed(doc, entries, fold: bool, net=None, scheme: str = "torch"):
    """The library's TorchExport for the selected entries, its warnings printed; `net`: the --definition or None."""
    return _renamed(doc, lambda rename, **options: rename(doc, entries, **options), fold, net, scheme)


def named(doc, patterns, names: str, fold: bool, net=None) -> tuple:
    """(document, entries) --blob `patterns` select under the names asked (see selected_renamed)."""
    from ..api.kinds import select

    if names == "blobtool":
        return doc, select(doc, patterns)
    result, entries = selected_renamed(doc, patterns, fold, net, names)
    return result.document, entries


def selected_renamed(doc, patterns, fold: bool, net=None, scheme: str = "torch") -> tuple:
    """(the TorchExport, the renamed entries `patterns` select), its warnings printed.

    The blobs are selected by the file's names (conv1/0, bn1), or where no
    pattern is one of those, by PyTorch's (bn1.running_var), as
    torchport.naming.renamed_selection does.
    """
    from ..api.naming import renamed_selection

    picked = []

    def run(rename, **options):
        result, entries = renamed_selection(doc, patterns, rename, **options)
        picked.append(entries)
        return result

    return _renamed(doc, run, fold, net, scheme), picked[0]


def _renamed(doc, run, fold: bool, net, scheme: str):
    """run(rename, fold=..., net=...) with the types of `net` (a path) open where `doc` holds none; warnings said."""
    from ..api.naming import has_layer_types
    from .work import open_input

    rename = renamer(scheme)
    if net is None or has_layer_types(doc):
        result = run(rename, fold=fold)
    else:
        # Only its layers are read (types, bottoms, tops, settings): it is let go once the names are made.
        with open_input(net) as types:
            result = run(rename, fold=fold, net=types)
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
