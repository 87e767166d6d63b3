"""blobtool: inspect, compare and convert Caffe blob files.

The engine mirrors Caffe's SyncedMemory and Blob; load and save read and
write BlobProto files without copying their payloads.
"""

from .blob import Blob
from .errors import BlobToolError
from .files import load, save
from .syncedmem import SyncedHead, SyncedMemory

__version__ = "0.1.0"

__all__ = ["Blob", "BlobToolError", "SyncedHead", "SyncedMemory", "load", "save", "__version__"]
