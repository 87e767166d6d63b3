"""Names of the values for write(into=...): a wrapper's prefix taken off or put on before they are fitted.

The values' names are changed as `strip_prefix`/`add_prefix` ask
(torchport/prefixes.py), or, given neither, by the prefix that makes the most
of them names of the template (its blobtool names, or PyTorch's when
`names` is a torch scheme: those its rows give and the BatchNorm buffers
Caffe has no blob for). A prefix found is said in one line, as compare says
it. Two values whose names become one are refused (PrefixClash, exit 2): the
fit would be ambiguous.
"""

from __future__ import annotations

from ..errors import BlobToolError, UsageError
from ..torchport.prefixes import Prefixes, detect

__all__ = ["PrefixClash", "prefixed"]


class PrefixClash(UsageError):
    """Two values' names made one by the prefixes asked or found (exit 2)."""


def prefixed(values: dict, path, template, names: str, fold: bool, net, strip=None, add=None, warn=None) -> dict:
    """`values` ({name: value}, read from `path`) under the names the prefixes make; a prefix found goes to `warn`."""
    change = Prefixes(strip, add)
    if not change.asked:
        try:
            wanted = _wanted(template, names, fold, net)
        except BlobToolError:
            return values  # the fit says what is wrong with the template
        change, count = detect(wanted, list(values))
        if change is None:
            return values
        warn(f"{path}: names matched {change.how()} ({count} of {len(values)} then match the template's); "
             f"{change.options()} says so, --strip-prefix '' matches them as they are")
    renamed = {}
    for name, value in values.items():
        new = change.apply(name)
        if new in renamed:
            raise PrefixClash(f"{change.parameters()} makes two of {path}'s names {new!r}")
        renamed[new] = value
    return renamed


def _wanted(template, names: str, fold: bool, net) -> list:
    """The names the template's blobs are matched by."""
    if names == "blobtool":
        return template.names()
    from ..torchport.naming import TORCH_ONLY_BUFFERS, torch_names

    found = torch_names(template, fold=fold, net=net)
    return [e.name for e in found.document.entries] + [f"{bn}.{buf}" for bn in found.batchnorms
                                                       for buf in TORCH_ONLY_BUFFERS]
