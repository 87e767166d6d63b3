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

from ..errors import DeviceError
from .syncedmem import get_backend, set_backend
from . import work

__all__ = ["use", "current", "list_devices", "CupyBackend", "Streamer", "StreamedNorms", "INSTALL_HINT",
           "STREAM_CHUNK"]

INSTALL_HINT = "install blobtool's CUDA extra: pip install 'blobtool[cuda12]' (or [cuda13])"

# Staging chunk for streamed reductions: large enough that each copy runs at
# full bus speed, small enough that two of them are nothing next to a model.
STREAM_CHUNK = 64 << 20


class StreamedNorms:
    """Stands in for a Blob in norm --device: its data and diff stream through the device, never placed there.

    Offers the two methods norm uses. The first call streams the data and
    the diff through the same pipeline (the diff's copies overlap the data's
    reduction) and keeps the diff's sums for the second.
    """

    def __init__(self, blob, streamer: "Streamer", has_diff: bool):
        self._blob = blob
        self._streamer = streamer
        self._has_diff = has_diff
        self._diff = None

    def asum_sumsq_data(self) -> tuple[float, float]:
        arrays = [self._blob.cpu_data()]
        if self._has_diff:
            arrays.append(self._blob.cpu_diff())
        sums = self._streamer.asum_sumsq(arrays)
        self._diff = sums[1] if self._has_diff else (0.0, 0.0)
        return sums[0]

    def asum_sumsq_diff(self) -> tuple[float, float]:
        if self._diff is None:
            self.asum_sumsq_data()
        diff, self._diff = self._diff, None
        return diff


def _import_cupy():
    try:
        import cupy  # CuPy loads only when a GPU is asked for
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
        # asum and sumsq in one pass (Caffe's caffe_gpu_asum and caffe_gpu_dot
        # read the blob twice): each element maps to the pair (|x|, x*x),
        # carried as the real and imaginary parts of a complex double, whose
        # sum adds each part on its own, in float64.
        self._norms = cupy.ReductionKernel(
            "T x", "complex128 y", "complex<double>(fabs((double)x), (double)x * (double)x)",
            "a + b", "y = a", "0", "blobtool_asum_sumsq")

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
        import cupyx  # CuPy loads only when a GPU is asked for

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
            both = complex(self._norms(x))
            return both.real, both.imag

    def fused_asum_sumsq(self, x):
        """The one-pass kernel's result on the current stream, left on the device: a complex128 (asum + sumsq*1j)."""
        return self._norms(x)

    def streamer(self, chunk_bytes: int = STREAM_CHUNK, *, release: bool = False) -> "Streamer":
        """A Streamer for this device: host arrays reduced through pinned buffers, one chunk at a time."""
        return Streamer(self, chunk_bytes, release=release)

    def streamed_asum_sumsq(self, host: np.ndarray, *, chunk_bytes: int = STREAM_CHUNK,
                            release: bool = False) -> tuple[float, float]:
        """asum and sumsq of a host array, streamed through the device (see Streamer)."""
        return self.streamer(chunk_bytes, release=release).asum_sumsq([host])[0]

    def scal(self, x, alpha: float) -> None:
        with self.cp.cuda.Device(self.index):
            x *= x.dtype.type(alpha)

    def axpy(self, alpha: float, x, y) -> None:
        with self.cp.cuda.Device(self.index):
            if alpha == -1:
                y -= x
            else:
                y += y.dtype.type(alpha) * x


class Streamer:
    """Reduces host arrays on the device without placing them there: asum and sumsq, one chunk at a time.

    Two pinned staging buffers, two device buffers and two streams, used in
    turn: while chunk i is copied (pinned, asynchronously) and reduced on
    stream i % 2, the host fills the other staging buffer with chunk i + 1
    (reading the file). Each chunk is reduced by one fused kernel (asum and
    sumsq in one pass, accumulated in float64) whose result stays on the
    device until the arrays of one call are done. The buffers are made on
    first use, no larger than the largest array met (or `chunk_bytes`), and
    kept for the next call, so device memory stays at two chunks whatever the
    number or size of the arrays. With `release`, each chunk's pages of a
    memory-mapped input are dropped once copied (only for inputs nobody
    changed in memory).
    """

    def __init__(self, backend: CupyBackend, chunk_bytes: int = STREAM_CHUNK, *, release: bool = False):
        self._backend = backend
        self._chunk = max(16, int(chunk_bytes) // 16 * 16)  # whole elements of any dtype
        self._release = release
        self._size = 0
        self._staging = self._device = self._streams = None

    def _buffers(self, nbytes: int) -> None:
        """Make the buffers hold at least `nbytes` (at most a chunk); grows them if an array needs more."""
        import cupyx  # CuPy loads only when a GPU is asked for

        cp = self._backend.cp
        want = min(self._chunk, -(-nbytes // 16) * 16)
        if want <= self._size:
            return
        self._staging = self._device = None  # the old ones go before the new ones are made
        if self._streams is None:
            self._streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
        self._staging = [cupyx.empty_pinned(want, dtype=np.uint8) for _ in range(2)]
        try:
            self._device = [cp.empty(want, dtype=cp.uint8) for _ in range(2)]
        except cp.cuda.memory.OutOfMemoryError as exc:
            self._staging = None
            raise self._backend._oom(2 * want, exc) from exc
        self._size = want

    def asum_sumsq(self, arrays) -> list[tuple[float, float]]:
        """(asum, sumsq) of each host array, all streamed through one pipeline; one wait at the end."""
        pages = work.current().pages if self._release else None  # a mapped input's, for a call that reads it once
        backend = self._backend
        cp = backend.cp
        flats = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
        plan = []  # (array index, first element, element count) per chunk
        for j, flat in enumerate(flats):
            if flat.size == 0:
                continue
            per_chunk = max(1, self._chunk // flat.itemsize)
            for start in range(0, flat.size, per_chunk):
                plan.append((j, start, min(per_chunk, flat.size - start)))
        if not plan:
            return [(0.0, 0.0) for _ in flats]
        with cp.cuda.Device(backend.index):
            self._buffers(max(flat.nbytes for flat in flats))
            partial = cp.zeros(len(plan), dtype=cp.complex128)
            copied = [None, None]
            for i, (j, start, m) in enumerate(plan):
                k = i % 2
                flat = flats[j]
                nbytes = m * flat.itemsize
                if copied[k] is not None:
                    copied[k].synchronize()  # staging[k] is free once its last copy is done
                staging = self._staging[k][:nbytes].view(flat.dtype)
                np.copyto(staging, flat[start:start + m])
                work.report(nbytes)  # read from the input: the progress display counts it
                if pages is not None:
                    pages.release(flat[start:start + m])
                stream = self._streams[k]
                device = self._device[k][:nbytes].view(flat.dtype)
                device.set(staging, stream=stream)
                event = cp.cuda.Event()
                event.record(stream)
                copied[k] = event
                with stream:
                    partial[i] = backend.fused_asum_sumsq(device)
            for stream in self._streams:
                stream.synchronize()
            sums = partial.get()
        out = [[0.0, 0.0] for _ in flats]
        for (j, _, _), value in zip(plan, sums.tolist()):
            out[j][0] += value.real
            out[j][1] += value.imag
        return [(a, s) for a, s in out]

    def close(self) -> None:
        """Free the buffers now (they are also freed with the Streamer)."""
        self._staging = self._device = None
        self._size = 0
