"""SyncedMemory: a block of bytes that lives on the host, a GPU, or both.

Mirrors Caffe's SyncedMemory (src/caffe/syncedmem.cpp). The head says where
the freshest copy is:

==============  ============================================================
UNINITIALIZED   nothing allocated yet; the first read allocates zeroed memory
HEAD_AT_CPU     the host copy is current (the device copy, if any, is stale)
HEAD_AT_GPU     the device copy is current (the host copy, if any, is stale)
SYNCED          both copies hold the same bytes
==============  ============================================================

The head changes in two private places only, ``_to_cpu`` and ``_to_gpu``,
each a switch over the four states, plus the ``mutable_*``/``set_*`` methods
that claim it, exactly as in Caffe. The device side is a backend object
(``blobtool.device`` provides the CuPy one); this module never imports CuPy.
Without a backend every GPU accessor raises DeviceError.
"""

from __future__ import annotations

import enum
from typing import Any, Protocol

import numpy as np

from ..errors import DeviceError, UsageError
from .work import current, note_written, set_device

__all__ = ["SyncedHead", "SyncedMemory", "DeviceBackend", "get_backend", "set_backend"]


class SyncedHead(enum.Enum):
    """Where the current copy of a SyncedMemory lives (Caffe's SyncedHead)."""

    UNINITIALIZED = 0
    HEAD_AT_CPU = 1
    HEAD_AT_GPU = 2
    SYNCED = 3


class DeviceBackend(Protocol):
    """What SyncedMemory and Blob need from a device: memory, copies, and Blob's math.

    ``blobtool.device.CupyBackend`` is the real one (CUDA through CuPy); the
    tests use a host-only stand-in. Device buffers are 1-D uint8 arrays of
    the backend's kind, which Blob views with ``.view(dtype)``.
    """

    def host_zeros(self, size: int) -> np.ndarray:
        """Zeroed host memory of `size` bytes (pinned in the real backend: Caffe's CaffeMallocHost)."""

    def device_empty(self, size: int) -> Any:
        """An uninitialised device buffer of `size` bytes."""

    def device_zeros(self, size: int) -> Any:
        """A zeroed device buffer of `size` bytes."""

    def copy_to_host(self, gpu: Any, cpu: np.ndarray) -> None:
        """Copy the device buffer's bytes into the host array."""

    def copy_to_device(self, cpu: np.ndarray, gpu: Any) -> None:
        """Copy the host array's bytes into the device buffer."""

    def copy_to_device_async(self, cpu: np.ndarray, gpu: Any, stream: Any) -> None:
        """The same, queued on `stream` (SyncedMemory::async_gpu_push)."""

    def adopt_device(self, array: Any, size: int) -> Any:
        """A 1-D uint8 view of the first `size` bytes of a caller's device array (set_gpu_data)."""

    def check_device(self, gpu: Any) -> None:
        """Caffe's check_device: refuse a buffer of another device than the current one (DeviceError)."""

    def asum_sumsq(self, x: Any) -> tuple[float, float]:
        """Sum of |x| and of x*x over a device array, accumulated in float64."""

    def scal(self, x: Any, alpha: float) -> None:
        """x *= alpha in place, on the device."""

    def axpy(self, alpha: float, x: Any, y: Any) -> None:
        """y += alpha * x in place, on the device."""


# The backend used for new device allocations is the call's (its Work's
# `device`), set when a GPU is selected: Caffe keeps the same thing in
# Caffe::mode() and the current device, per thread; here it belongs to the
# thread, or the with block, that selected it (blobtool.engine.work).


def set_backend(backend: DeviceBackend | None):
    """Make `backend` the device side of SyncedMemory for this thread's calls from now on (None: host only).

    Returns the previous backend, so that callers can restore it. Inside a
    ``with work.using(...)`` block the choice ends with the block.
    """
    previous = current().device
    set_device(backend)
    return previous


def get_backend():
    """The device backend of this call, or None when no GPU was selected."""
    return current().device


def _require_backend(what: str):
    backend = current().device
    if backend is None:
        raise DeviceError(
            f"{what} needs a GPU, and none was selected: install blobtool's CUDA extra "
            "and pass --device N (or call blobtool.device.use(N))"
        )
    return backend


def _host_zeros(size: int) -> np.ndarray:
    # Caffe's CaffeMallocHost: pinned memory once a GPU is in use, so that
    # host-device copies run at full speed; plain memory otherwise.
    backend = current().device
    if backend is not None:
        return backend.host_zeros(size)
    return np.zeros(size, dtype=np.uint8)


class SyncedMemory:
    """`size` bytes kept in step between host memory and one GPU.

    Mirrors caffe::SyncedMemory. Host views are 1-D numpy uint8 arrays; device
    views are whatever the backend uses (CuPy arrays).

    Parameters
    ----------
    size : int
        Number of bytes. Nothing is allocated until first use.
    """

    def __init__(self, size: int = 0):
        size = int(size)
        if size < 0:
            raise UsageError(f"SyncedMemory size must be >= 0, got {size}")
        self._size = size
        self._head = SyncedHead.UNINITIALIZED
        self._cpu = None
        self._gpu = None
        self._own_cpu_data = False
        self._own_gpu_data = False
        self._gpu_backend = None  # the backend (and so the device) _gpu lives on

    @property
    def size(self) -> int:
        """Size in bytes (Caffe's size())."""
        return self._size

    @property
    def head(self) -> SyncedHead:
        """Where the current copy is (Caffe's head())."""
        return self._head

    @property
    def own_cpu_data(self) -> bool:
        """Whether the host buffer was allocated here (False once adopted)."""
        return self._own_cpu_data

    @property
    def own_gpu_data(self) -> bool:
        """Whether the device buffer was allocated here (False once adopted)."""
        return self._own_gpu_data

    # -- the two places that move the head -------------------------------

    def _to_cpu(self) -> None:
        self._check_device()
        head = self._head
        if head is SyncedHead.UNINITIALIZED:
            self._cpu = _host_zeros(self._size)
            self._own_cpu_data = True
            self._head = SyncedHead.HEAD_AT_CPU
        elif head is SyncedHead.HEAD_AT_GPU:
            if self._cpu is None:
                self._cpu = _host_zeros(self._size)
                self._own_cpu_data = True
            note_written(self._cpu)  # the device's values over an adopted file view: no longer the file's
            self._gpu_backend.copy_to_host(self._gpu, self._cpu)
            self._head = SyncedHead.SYNCED
        elif head in (SyncedHead.HEAD_AT_CPU, SyncedHead.SYNCED):
            pass

    def _to_gpu(self) -> None:
        backend = self._device_backend("gpu_data")
        self._check_device()
        head = self._head
        if head is SyncedHead.UNINITIALIZED:
            self._gpu = backend.device_zeros(self._size)
            self._gpu_backend = backend
            self._own_gpu_data = True
            self._head = SyncedHead.HEAD_AT_GPU
        elif head is SyncedHead.HEAD_AT_CPU:
            if self._gpu is None:
                self._gpu = backend.device_empty(self._size)
                self._gpu_backend = backend
                self._own_gpu_data = True
            backend.copy_to_device(self._cpu, self._gpu)
            self._head = SyncedHead.SYNCED
        elif head in (SyncedHead.HEAD_AT_GPU, SyncedHead.SYNCED):
            pass

    def _device_backend(self, what: str):
        # Device memory stays with the backend (device) it was allocated on.
        if self._gpu_backend is not None:
            return self._gpu_backend
        return _require_backend(what)

    def _check_device(self) -> None:
        # Caffe's check_device(): device memory may only be used while its
        # own device is current.
        if self._gpu is not None and self._gpu_backend is not None:
            self._gpu_backend.check_device(self._gpu)

    # -- host side -------------------------------------------------------

    def cpu_data(self) -> np.ndarray:
        """Read-only 1-D uint8 view of the host copy (allocates zeroed memory on first use)."""
        self._to_cpu()
        view = self._cpu.view()
        view.flags.writeable = False
        return view

    def mutable_cpu_data(self) -> np.ndarray:
        """Writable 1-D uint8 view of the host copy; the head becomes HEAD_AT_CPU."""
        self._to_cpu()
        self._head = SyncedHead.HEAD_AT_CPU
        note_written(self._cpu)  # an adopted file view stops being read as the file (blobtool.files)
        return self._cpu

    def set_cpu_data(self, array) -> None:
        """Adopt `array`'s bytes as the host copy, without copying (Caffe's set_cpu_data).

        The buffer stays the caller's (own_cpu_data is False) and the head
        becomes HEAD_AT_CPU. It must be C-contiguous and hold at least `size`
        bytes; only the first `size` are used.
        """
        self._check_device()
        self._cpu = _as_bytes(array, self._size, "set_cpu_data")
        self._own_cpu_data = False
        self._head = SyncedHead.HEAD_AT_CPU

    # -- device side -----------------------------------------------------

    def gpu_data(self):
        """The device copy for reading (copies host to device when the host is newer)."""
        self._to_gpu()
        return self._gpu

    def mutable_gpu_data(self):
        """The device copy for writing; the head becomes HEAD_AT_GPU."""
        self._to_gpu()
        self._head = SyncedHead.HEAD_AT_GPU
        return self._gpu

    def set_gpu_data(self, array) -> None:
        """Adopt a device array as the device copy, without copying; the head becomes HEAD_AT_GPU."""
        backend = self._device_backend("set_gpu_data")
        self._check_device()
        self._gpu = backend.adopt_device(array, self._size)
        self._gpu_backend = backend
        self._own_gpu_data = False
        self._head = SyncedHead.HEAD_AT_GPU

    def async_gpu_push(self, stream) -> None:
        """Start copying the host copy to the device on `stream`; the head becomes SYNCED.

        As in Caffe the head must be HEAD_AT_CPU, and the caller synchronises
        the stream before using the device copy.
        """
        backend = self._device_backend("async_gpu_push")
        self._check_device()
        if self._head is not SyncedHead.HEAD_AT_CPU:
            raise UsageError(f"async_gpu_push needs head HEAD_AT_CPU, head is {self._head.name}")
        if self._gpu is None:
            self._gpu = backend.device_empty(self._size)
            self._gpu_backend = backend
            self._own_gpu_data = True
        backend.copy_to_device_async(self._cpu, self._gpu, stream)
        self._head = SyncedHead.SYNCED

    def release_gpu(self) -> None:
        """Bring the host copy up to date and free the device copy; the head becomes HEAD_AT_CPU (blobtool extension).

        For a caller done with the device who keeps the memory: Caffe frees
        device memory only with the SyncedMemory. A device buffer adopted
        with set_gpu_data is let go, not freed (it stays the caller's).
        Nothing happens when there is no device copy.
        """
        if self._gpu is None:
            return
        if self._head is SyncedHead.HEAD_AT_GPU:
            self._to_cpu()
        self._gpu = None
        self._gpu_backend = None
        self._own_gpu_data = False
        if self._head is SyncedHead.SYNCED:
            self._head = SyncedHead.HEAD_AT_CPU

    def __repr__(self) -> str:
        return f"SyncedMemory(size={self._size}, head={self._head.name})"


def _as_bytes(array, size: int, what: str) -> np.ndarray:
    """A 1-D uint8 view of `array`'s first `size` bytes, refusing anything that needs a copy."""
    if not isinstance(array, np.ndarray):
        try:
            array = np.frombuffer(array, dtype=np.uint8)
        except TypeError as exc:
            raise UsageError(f"{what}: expected a numpy array or buffer, got {type(array).__name__}") from exc
    if not array.flags.c_contiguous:
        raise UsageError(f"{what}: the array must be C-contiguous to be adopted without a copy")
    flat = array.reshape(-1).view(np.uint8)
    if flat.size < size:
        raise UsageError(f"{what}: buffer holds {flat.size} bytes, {size} needed")
    return flat[:size]
