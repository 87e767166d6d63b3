"""blobtool: inspect, compare and convert Caffe blob files.

The engine mirrors Caffe's SyncedMemory and Blob; load and save read and
write BlobProto files without copying their payloads.
"""

from .blob import Blob
from .errors import BlobToolError
from .containers import load, load_all
from .files import save
from .syncedmem import SyncedHead, SyncedMemory

__version__ = "0.1.0"

__all__ = ["Blob", "BlobToolError", "SyncedHead", "SyncedMemory", "load", "load_all", "save", "__version__"]
