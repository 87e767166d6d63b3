"""Files: opening inputs without copying them, guarding them while they are read, their pages, atomic outputs.

inputs.py opens (maps a file, reads a stream), mapped.py keeps the registry
of mapped inputs and guards them (leases, watches, SIGBUS), pages.py lets a
call read a mapped input's values from its file and release its pages,
outputs.py writes atomically. The names below are the ones the rest of
blobtool uses.
"""

from __future__ import annotations

from .inputs import STDIO, STREAM_LIMIT, BufferFile, Source, display_name, open_source, stream_limit
from .mapped import WRITTEN, Guard, guarded, guarding, note_written
from .news import check_inputs, pending_change, raise_deferred_stop, settle, take_change
from .outputs import Staged, atomic_output, writes_in_place
from .pages import PAGES, MappedPages, file_behind, read_mapped, release_pages, releasing

__all__ = ["Source", "BufferFile", "open_source", "display_name", "stream_limit", "STDIO", "STREAM_LIMIT", "guarded", "Guard", "guarding",
           "settle", "take_change", "pending_change", "raise_deferred_stop", "check_inputs", "note_written", "WRITTEN", "atomic_output",
           "writes_in_place", "Staged", "PAGES", "MappedPages", "file_behind", "read_mapped", "release_pages", "releasing"]
