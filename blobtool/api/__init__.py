"""The library's entry points: what each command does, in one call.

Everything the command line does, a Python user can do here in one call:
read any kind of file (the kind sniffed from its bytes), write a selection
of blobs in any format blobtool writes, change, fold, run and export nets,
with the same options. The modules split the calls by job: blobs.py (load,
save, write), nets.py (a net's definition, edit, fold), transplant.py, and
running.py (run, export); every name is reached as blobtool.api.NAME.
"""

from ..formats import open_document
from ..surgery.prefixed import PrefixClash
from .common import OptionsRefused
from .blobs import load, load_all, resolve_precision, save, state_dict, write
from .nets import definition_text, deploy_definition, edit, fold, net_definition
from .running import export, run
from .transplant import transplant

__all__ = ["load", "load_all", "state_dict", "save", "write", "open_document", "net_definition",
           "resolve_precision", "definition_text", "deploy_definition", "transplant", "edit", "fold", "run", "export",
           "OptionsRefused", "PrefixClash"]
