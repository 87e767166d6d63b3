"""The GPU side of SyncedMemory, with CuPy: the only module that imports CuPy.

Nothing here runs unless a GPU is asked for (``--device N`` or
``blobtool.device.use(N)``). ``use`` selects the device, makes host memory
pinned from then on (as Caffe's CaffeMallocHost does in GPU mode), and gives
SyncedMemory a backend whose methods move bytes and run Blob's math on the
device. Every failure is a DeviceError (exit 4) saying what is missing and
how to fix it.
"""

from __future__ import annotations

import numpy as np

from .errors import DeviceError
from .syncedmem import get_backend, set_backend

__all__ = ["use", "current", "list_devices", "CupyBackend", "StreamedNorms", "INSTALL_HINT",
           "STREAM_CHUNK", "STREAM_THRESHOLD"]

INSTALL_HINT = "install blobtool's CUDA extra: pip install 'blobtool[cuda12]' (or [cuda13])"

# Staging chunk for streamed reductions: large enough that each copy runs at
# full bus speed, small enough that two of them are nothing next to a model.
STREAM_CHUNK = 64 << 20
# Payloads larger than this are streamed through the device by norm --device
# rather than placed on it whole.
STREAM_THRESHOLD = 1 << 30


class StreamedNorms:
    """Stands in for a Blob in norm --device when its payload is streamed rather than placed.

    Offers the two methods norm uses, computed by the backend's streamed
    reduction over the blob's host arrays (the memory-mapped file).
    """

    def __init__(self, blob, backend, has_diff: bool):
        self._blob = blob
        self._backend = backend
        self._has_diff = has_diff

    def asum_sumsq_data(self) -> tuple[float, float]:
        return self._backend.streamed_asum_sumsq(self._blob.cpu_data(), chunk_bytes=STREAM_CHUNK, release=True)

    def asum_sumsq_diff(self) -> tuple[float, float]:
        if not self._has_diff:
            return 0.0, 0.0
        return self._backend.streamed_asum_sumsq(self._blob.cpu_diff(), chunk_bytes=STREAM_CHUNK, release=True)


def _import_cupy():
    try:
        import cupy
    except ImportError as exc:
        raise DeviceError(f"a GPU was requested, but CuPy is not installed; {INSTALL_HINT}") from exc
    except Exception as exc:  # a broken CUDA install fails inside CuPy's import
        raise DeviceError(f"a GPU was requested, but CuPy failed to load: {exc}") from exc
    return cupy


def _device_count(cupy) -> int:
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:
        raise DeviceError(f"a GPU was requested, but no CUDA driver or device is usable: {exc}") from exc


def list_devices() -> list:
    """Each visible CUDA device: index, name, total and free memory (bytes), compute capability.

    An empty list where CuPy, the driver or a device is missing.
    """
    try:
        cupy = _import_cupy()
        count = _device_count(cupy)
    except DeviceError:
        return []
    out = []
    for index in range(count):
        props = cupy.cuda.runtime.getDeviceProperties(index)
        with cupy.cuda.Device(index):
            free, total = cupy.cuda.runtime.memGetInfo()
        name = props["name"]
        out.append({
            "index": index,
            "name": name.decode() if isinstance(name, bytes) else str(name),
            "total_memory": int(total),
            "free_memory": int(free),
            "compute_capability": f"{props['major']}.{props['minor']}",
        })
    return out


def use(index: int) -> "CupyBackend":
    """Select GPU `index` for device work; returns the backend.

    Called plainly, the choice lasts (as ``cupy.cuda.Device(n).use()``): new
    blobs allocate pinned host memory and the math of blobs whose head is on
    the device runs there. Used as a context manager, it lasts for the block
    only: on exit the caller's CUDA device and SyncedMemory backend (None:
    host only) are restored::

        with blobtool.device.use(1) as gpu:
            blob.gpu_data()

    Raises DeviceError when CuPy, the driver or the device is missing, naming
    the visible devices when the index is out of range.
    """
    cupy = _import_cupy()
    count = _device_count(cupy)
    if count == 0:
        raise DeviceError(f"GPU {index} requested, but no CUDA device is visible")
    if not 0 <= index < count:
        names = ", ".join(f"{d['index']} {d['name']}" for d in list_devices())
        raise DeviceError(f"GPU {index} requested; {count} visible: {names}")
    try:
        previous_device = cupy.cuda.runtime.getDevice()
        cupy.cuda.Device(index).use()
    except Exception as exc:
        raise DeviceError(f"cannot use GPU {index}: {exc}") from exc
    backend = CupyBackend(cupy, index)
    backend._restore = (previous_device, set_backend(backend))
    return backend


def current():
    """The backend selected by use(), or None."""
    return get_backend()


class CupyBackend:
    """SyncedMemory's device side on one CUDA device, with CuPy.

    Device buffers are 1-D uint8 CuPy arrays; Blob views them with
    ``.view(dtype)``. Reductions accumulate in float64, as on the host.
    """

    def __init__(self, cupy, index: int):
        self.cp = cupy
        self.index = index
        props = cupy.cuda.runtime.getDeviceProperties(index)
        name = props["name"]
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        self._asum = cupy.ReductionKernel(
            "T x", "float64 y", "fabs((double)x)", "a + b", "y = a", "0", "blobtool_asum")
        self._sumsq = cupy.ReductionKernel(
            "T x", "float64 y", "(double)x * (double)x", "a + b", "y = a", "0", "blobtool_sumsq")

    def describe(self) -> dict:
        return {"index": self.index, "name": self.name}

    # use() as a context manager: what it changed is put back on exit.
    _restore = None

    def __enter__(self) -> "CupyBackend":
        return self

    def __exit__(self, *exc_info) -> None:
        if self._restore is None:
            return
        previous_device, previous_backend = self._restore
        self._restore = None
        set_backend(previous_backend)
        self.cp.cuda.Device(previous_device).use()

    def _oom(self, size: int, exc) -> DeviceError:
        try:
            free, _ = self.cp.cuda.runtime.memGetInfo()
            free_text = f"{free / 2**20:.1f} MiB free"
        except Exception:
            free_text = "free memory unknown"
        return DeviceError(f"out of memory on GPU {self.index} ({self.name}): "
                           f"{size / 2**20:.1f} MiB needed, {free_text}")

    # -- memory ----------------------------------------------------------

    def host_zeros(self, size: int) -> np.ndarray:
        """Zeroed pinned host memory (CaffeMallocHost in GPU mode)."""
        import cupyx

        return cupyx.zeros_pinned(size, dtype=np.uint8)

    def device_empty(self, size: int):
        try:
            with self.cp.cuda.Device(self.index):
                return self.cp.empty(size, dtype=self.cp.uint8)
        except self.cp.cuda.memory.OutOfMemoryError as exc:
            raise self._oom(size, exc) from exc

    def device_zeros(self, size: int):
        buf = self.device_empty(size)
        buf.fill(0)
        return buf

    def copy_to_host(self, gpu, cpu: np.ndarray) -> None:
        with self.cp.cuda.Device(self.index):
            gpu.get(out=cpu)

    def copy_to_device(self, cpu: np.ndarray, gpu) -> None:
        with self.cp.cuda.Device(self.index):
            gpu.set(cpu)

    def copy_to_device_async(self, cpu: np.ndarray, gpu, stream) -> None:
        with self.cp.cuda.Device(self.index):
            gpu.set(cpu, stream=stream)

    def adopt_device(self, array, size: int):
        if not isinstance(array, self.cp.ndarray):
            raise DeviceError(f"set_gpu_data: expected a CuPy array, got {type(array).__name__}")
        if array.device.id != self.index:
            raise DeviceError(f"set_gpu_data: array device = {array.device.id} while current = {self.index}")
        if not array.flags.c_contiguous:
            raise DeviceError("set_gpu_data: the array must be C-contiguous")
        flat = array.reshape(-1).view(self.cp.uint8)
        if flat.size < size:
            raise DeviceError(f"set_gpu_data: array holds {flat.size} bytes, {size} needed")
        return flat[:size]

    def check_device(self, gpu) -> None:
        current = self.cp.cuda.runtime.getDevice()
        if gpu.device.id != current:
            raise DeviceError(f"device memory used from another GPU: array device = {gpu.device.id} "
                              f"while current = {current}")

    # -- math --------------------------------------------------------------

    def asum_sumsq(self, x) -> tuple[float, float]:
        with self.cp.cuda.Device(self.index):
            if x.size == 0:
                return 0.0, 0.0
            return float(self._asum(x)), float(self._sumsq(x))

    def streamed_asum_sumsq(self, host: np.ndarray, *, chunk_bytes: int = STREAM_CHUNK,
                            release: bool = False) -> tuple[float, float]:
        """asum and sumsq of a host array too large to keep, streamed through the device.

        Two pinned staging buffers and two streams, double-buffered: while
        chunk i is copied to the device and reduced on stream i % 2, the host
        fills the other buffer with chunk i + 1 (reading the file). Partial
        sums stay on the device in float64 and are added at the end. Host
        memory stays at two chunks; with `release`, the input's pages are
        dropped after each chunk (only for inputs nobody changed in memory).
        """
        import cupyx

        from .files import release_pages, releasing

        cp = self.cp
        host = host.reshape(-1)
        n = host.size
        if n == 0:
            return 0.0, 0.0
        per_chunk = max(1, chunk_bytes // host.itemsize)
        chunks = -(-n // per_chunk)
        with cp.cuda.Device(self.index):
            streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
            staging = [cupyx.empty_pinned(per_chunk, dtype=host.dtype) for _ in range(2)]
            try:
                device = [cp.empty(per_chunk, dtype=host.dtype) for _ in range(2)]
            except cp.cuda.memory.OutOfMemoryError as exc:
                raise self._oom(2 * per_chunk * host.itemsize, exc) from exc
            partial = cp.zeros((chunks, 2), dtype=cp.float64)
            copied = [None, None]
            for i in range(chunks):
                k = i % 2
                start = i * per_chunk
                m = min(per_chunk, n - start)
                if copied[k] is not None:
                    copied[k].synchronize()  # staging[k] is free once its copy is done
                np.copyto(staging[k][:m], host[start:start + m])
                if release:
                    with releasing():
                        release_pages(host[start:start + m])
                stream = streams[k]
                device[k][:m].set(staging[k][:m], stream=stream)
                event = cp.cuda.Event()
                event.record(stream)
                copied[k] = event
                with stream:
                    partial[i, 0] = self._asum(device[k][:m])
                    partial[i, 1] = self._sumsq(device[k][:m])
            for stream in streams:
                stream.synchronize()
            totals = partial.sum(axis=0).get()
        return float(totals[0]), float(totals[1])

    def scal(self, x, alpha: float) -> None:
        with self.cp.cuda.Device(self.index):
            x *= x.dtype.type(alpha)

    def axpy(self, alpha: float, x, y) -> None:
        with self.cp.cuda.Device(self.index):
            if alpha == -1:
                y -= x
            else:
                y += y.dtype.type(alpha) * x
