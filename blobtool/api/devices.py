"""A GPU, for the commands that place their work on one: imported only when a GPU is asked for (it loads the backend)."""

from ..engine import device
from ..engine.device import StreamedNorms, list_devices

__all__ = ["StreamedNorms", "device", "list_devices"]
