"""PyTorch's names of a net's blobs and the prefixes between two files, as the commands print and match them."""

from ..net.batchnorm import statistic_factors
from ..surgery.prefixed import PrefixClash
from ..torchport.metadata import eps_warnings, kind_counts, named
from ..torchport.naming import has_layer_types, renamed_selection, torch_pair
from ..torchport.prefixes import Prefixes, match_documents

__all__ = ["PrefixClash", "Prefixes", "eps_warnings", "has_layer_types", "kind_counts", "match_documents", "named",
           "renamed_selection", "statistic_factors", "torch_pair"]
