"""A host-only stand-in for blobtool.engine.device.CupyBackend, for testing SyncedMemory and Blob.

Device memory is numpy arrays of the ``DeviceArray`` subclass, so a test can
tell a device buffer from a host one (views keep the subclass), and every
method the engine calls is recorded in ``calls`` (copies also in ``copies``),
so a test can say which side did the work and how many bytes moved.

The engine's side of the contract (see syncedmem.py and blob.py):

- ``host_zeros(size)``: zeroed host memory (pinned, in the real backend)
- ``device_zeros(size)``, ``device_empty(size)``: device buffers, 1-D uint8
- ``copy_to_host(gpu, cpu)``, ``copy_to_device(cpu, gpu)``,
  ``copy_to_device_async(cpu, gpu, stream)``: byte copies
- ``adopt_device(array, size)``: a 1-D uint8 view of a device array
- ``check_device(gpu)``: Caffe's check_device, refuses memory of another device
- ``asum_sumsq(x)``, ``scal(x, factor)``, ``axpy(alpha, x, y)``: Blob's math
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

from blobtool.errors import DeviceError
from blobtool.engine.syncedmem import set_backend

# device_empty fills new buffers with this byte, so that a test notices when
# the engine reads device memory it never wrote or copied (as cudaMalloc
# would hand back whatever was there).
GARBAGE = 0xAB


class DeviceArray(np.ndarray):
    """A numpy array that stands for device memory; ``fake_device`` is the fake GPU index (numpy 2 reserves ``device``)."""

    def __array_finalize__(self, obj):
        self.fake_device = getattr(obj, "fake_device", None)


class FakeStream:
    """Stands for a CUDA stream; only its identity matters."""

    def __init__(self, name: str = "stream"):
        self.name = name

    def __repr__(self) -> str:
        return f"FakeStream({self.name!r})"


class FakeBackend:
    """The device side of SyncedMemory, on the host, recording what the engine asks of it.

    Parameters
    ----------
    index : int
        The fake device's index; ``current`` is the device that is "current"
        for check_device (set it to another value to simulate a switch).
    """

    def __init__(self, index: int = 0):
        self.index = index
        self.current = index
        self.calls: list[tuple] = []
        self.copies: list[tuple] = []

    # -- helpers for tests -------------------------------------------------

    def device_array(self, data, dtype=np.uint8, device=None) -> DeviceArray:
        """A device array holding `data` (what a user's CuPy array would be)."""
        arr = np.array(data, dtype=dtype).view(DeviceArray)
        arr.fake_device = self.index if device is None else device
        return arr

    def names(self) -> list[str]:
        """The names of the calls recorded so far, in order."""
        return [call[0] for call in self.calls]

    def clear(self) -> None:
        self.calls.clear()
        self.copies.clear()

    def _new(self, size: int, fill: int) -> DeviceArray:
        arr = np.full(size, fill, dtype=np.uint8).view(DeviceArray)
        arr.fake_device = self.index
        return arr

    @staticmethod
    def _require_device(what: str, array) -> None:
        if not isinstance(array, DeviceArray):
            raise AssertionError(f"{what} was given host memory ({type(array).__name__}), not device memory")

    @staticmethod
    def _require_host(what: str, array) -> None:
        if isinstance(array, DeviceArray) or not isinstance(array, np.ndarray):
            raise AssertionError(f"{what} was given {type(array).__name__}, not host memory")

    # -- memory ------------------------------------------------------------

    def host_zeros(self, size: int) -> np.ndarray:
        self.calls.append(("host_zeros", size))
        return np.zeros(size, dtype=np.uint8)

    def device_zeros(self, size: int) -> DeviceArray:
        self.calls.append(("device_zeros", size))
        return self._new(size, 0)

    def device_empty(self, size: int) -> DeviceArray:
        self.calls.append(("device_empty", size))
        return self._new(size, GARBAGE)

    def copy_to_host(self, gpu, cpu) -> None:
        self._require_device("copy_to_host", gpu)
        self._require_host("copy_to_host", cpu)
        assert gpu.nbytes == cpu.nbytes, (gpu.nbytes, cpu.nbytes)
        np.copyto(cpu, np.asarray(gpu))
        self.calls.append(("copy_to_host", cpu.nbytes))
        self.copies.append(("D2H", cpu.nbytes))

    def copy_to_device(self, cpu, gpu) -> None:
        self._require_host("copy_to_device", cpu)
        self._require_device("copy_to_device", gpu)
        assert gpu.nbytes == cpu.nbytes, (gpu.nbytes, cpu.nbytes)
        np.copyto(gpu, cpu)
        self.calls.append(("copy_to_device", gpu.nbytes))
        self.copies.append(("H2D", gpu.nbytes))

    def copy_to_device_async(self, cpu, gpu, stream) -> None:
        self._require_host("copy_to_device_async", cpu)
        self._require_device("copy_to_device_async", gpu)
        assert gpu.nbytes == cpu.nbytes, (gpu.nbytes, cpu.nbytes)
        np.copyto(gpu, cpu)
        self.calls.append(("copy_to_device_async", gpu.nbytes, stream))
        self.copies.append(("H2D async", gpu.nbytes))

    def adopt_device(self, array, size: int) -> DeviceArray:
        self.calls.append(("adopt_device", size))
        if not isinstance(array, DeviceArray):
            raise DeviceError(f"set_gpu_data: expected a device array, got {type(array).__name__}")
        if array.fake_device != self.index:
            raise DeviceError(f"set_gpu_data: array device = {array.fake_device} while current = {self.index}")
        if not array.flags.c_contiguous:
            raise DeviceError("set_gpu_data: the array must be C-contiguous")
        flat = array.reshape(-1).view(np.uint8)
        if flat.size < size:
            raise DeviceError(f"set_gpu_data: array holds {flat.size} bytes, {size} needed")
        return flat[:size]

    def check_device(self, gpu) -> None:
        self._require_device("check_device", gpu)
        if gpu.fake_device != self.current:
            raise DeviceError(f"device memory used from another GPU: array device = {gpu.fake_device} "
                              f"while current = {self.current}")

    # -- math ----------------------------------------------------------------

    def asum_sumsq(self, x) -> tuple[float, float]:
        self._require_device("asum_sumsq", x)
        self.calls.append(("asum_sumsq", x.size))
        wide = np.asarray(x, dtype=np.float64).reshape(-1)
        return math.fsum(np.abs(wide)), math.fsum(wide * wide)

    def scal(self, x, alpha: float) -> None:
        self._require_device("scal", x)
        self.calls.append(("scal", x.size, alpha))
        x *= x.dtype.type(alpha)

    def axpy(self, alpha: float, x, y) -> None:
        self._require_device("axpy x", x)
        self._require_device("axpy y", y)
        self.calls.append(("axpy", y.size, alpha))
        y += y.dtype.type(alpha) * x


@contextlib.contextmanager
def installed(backend=None):
    """Make `backend` (a new FakeBackend by default) SyncedMemory's device side; restore the previous one after."""
    backend = FakeBackend() if backend is None else backend
    previous = set_backend(backend)
    try:
        yield backend
    finally:
        set_backend(previous)


@contextlib.contextmanager
def no_backend():
    """Run with no device backend (host only); restore the previous one after."""
    previous = set_backend(None)
    try:
        yield
    finally:
        set_backend(previous)
