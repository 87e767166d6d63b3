"""What files are and which formats write them, as the command names them: the registry's names.

Only the registry (blobtool.formats) is imported: the command reads these
at start-up, before any format module or numpy loads.
"""

from ..formats import (EXTENSIONS, KINDS, NAMING_SCHEMES, OUTPUT_FORMATS, ReadSettings, listed_name, open_document,
                       open_documents, read_settings, select, use_read_settings)

__all__ = ["EXTENSIONS", "KINDS", "NAMING_SCHEMES", "OUTPUT_FORMATS", "ReadSettings", "listed_name", "open_document",
           "open_documents", "read_settings", "select", "use_read_settings"]
