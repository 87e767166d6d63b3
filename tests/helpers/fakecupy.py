"""A host-only stand-in for the part of CuPy that blobtool/device.py uses.

It lets the CuPy backend's own code (device selection, pinned memory,
copies, streams and events of the streamed norm, reduction kernels,
check_device, the CLI's --device paths) run on a machine without a GPU.
Device arrays are numpy arrays of a subclass that remembers its device.
It proves the backend's logic, not CuPy's: tests/engine/test_gpu.py does that on a
real device.

The state dict that install() returns records what a test may count:

- ``copies``: ("h2d" or "d2h", bytes, stream, pinned), pinned telling whether
  the host side of the copy is pinned memory (cupyx.empty_pinned/zeros_pinned)
- ``held``, ``peak``: device bytes allocated (cupy.empty/zeros, kernel results)
  and not yet freed, now and at most; ``allocations``: how many were made
- ``kernels``: (kernel name, bytes read) for each reduction kernel launched
"""

from __future__ import annotations

import contextlib
import sys
import types
import weakref

import numpy as np

from modswap import modules_restored


class FakeOutOfMemoryError(MemoryError):
    pass


class ndarray(np.ndarray):  # noqa: N801 - CuPy's name
    """A "device" array: numpy memory tagged with the device it lives on."""

    def __array_finalize__(self, obj):
        self._device_id = getattr(obj, "_device_id", None)
        if self._device_id is None:
            self._device_id = _state["current"]

    @property
    def device(self):  # numpy 2's ndarray.device is read-only; CuPy's is a Device
        return _Device(self._device_id)

    def set(self, arr, stream=None):
        assert isinstance(arr, np.ndarray) and not isinstance(arr, ndarray), "set() takes a host array"
        assert arr.shape == self.shape and arr.dtype == self.dtype, "set() copies like to like, as CuPy's"
        _state["copies"].append(("h2d", arr.nbytes, stream, is_pinned(arr)))
        np.copyto(self.view(np.ndarray), arr)

    def get(self, stream=None, order="C", out=None):
        _state["copies"].append(("d2h", self.nbytes, stream, out is not None and is_pinned(out)))
        if out is None:
            return np.array(self.view(np.ndarray))
        np.copyto(out, self.view(np.ndarray))
        return out


class PinnedHost(np.ndarray):
    """Host memory allocated pinned (what cupyx.empty_pinned returns); views keep the class."""


def is_pinned(arr) -> bool:
    """Whether `arr` is (a view of) pinned host memory."""
    base = arr
    while isinstance(base, np.ndarray):
        if isinstance(base, PinnedHost):
            return True
        base = base.base
    return False


def _pinned(values) -> PinnedHost:
    return values.view(PinnedHost)


_state = {"current": 0, "count": 1, "copies": [], "free": 1 << 34, "held": 0, "peak": 0, "allocations": 0,
          "kernels": [], "generation": 0}


def _freed(nbytes: int, generation: int) -> None:
    if _state["generation"] == generation:
        _state["held"] -= nbytes


def _allocated(values: np.ndarray) -> None:
    """Count `values` (a new array standing for device memory) as held until it is freed."""
    _state["held"] += values.nbytes
    _state["peak"] = max(_state["peak"], _state["held"])
    _state["allocations"] += 1
    weakref.finalize(values, _freed, values.nbytes, _state["generation"])


class _Device:
    def __init__(self, index=None):
        self.id = _state["current"] if index is None else index

    def use(self):
        _state["current"] = self.id

    def synchronize(self):
        pass

    def __enter__(self):
        self._previous = _state["current"]
        _state["current"] = self.id
        return self

    def __exit__(self, *exc):
        _state["current"] = self._previous


class _Stream:
    def __init__(self, non_blocking=False):
        self.non_blocking = non_blocking

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Event:
    def record(self, stream=None):
        self.stream = stream

    def synchronize(self):
        pass


def _on_device(values) -> ndarray:
    if _state["count"] == 0:
        raise RuntimeError("no CUDA device")
    values = np.asarray(values)
    _allocated(values)
    out = values.view(ndarray)
    out._device_id = _state["current"]
    return out


def empty(shape, dtype=np.float32):
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if nbytes > _state["free"]:
        raise FakeOutOfMemoryError(f"out of memory allocating {nbytes} bytes")
    return _on_device(np.full(shape, 0xAB, dtype=np.uint8).view(dtype) if np.dtype(dtype) == np.uint8
                      else np.empty(shape, dtype=dtype))


def zeros(shape, dtype=np.float32):
    return _on_device(np.zeros(shape, dtype=dtype))


class ReductionKernel:
    """Only the kernels blobtool defines, in float64: sum of |x|, sum of x*x, or both in one pass (complex128)."""

    def __init__(self, in_params, out_params, map_expr, reduce_expr, post_map_expr, identity, name):
        assert in_params == "T x" and reduce_expr == "a + b"
        assert out_params in ("float64 y", "complex128 y")
        self.fused = out_params == "complex128 y"
        self.square = "*" in map_expr
        self.name = name

    def __call__(self, x):
        assert isinstance(x, ndarray), "kernels run on device arrays"
        _state["kernels"].append((self.name, x.nbytes))
        wide = np.asarray(x, dtype=np.float64).reshape(-1)
        if self.fused:
            return _on_device(np.array(complex(np.abs(wide).sum(), np.dot(wide, wide))))
        value = np.dot(wide, wide) if self.square else np.abs(wide).sum()
        return _on_device(np.array(value))


def _properties(index):
    return {"name": b"Fake GPU", "major": 9, "minor": 0}


def install(count: int = 1):
    """Put fake `cupy` and `cupyx` modules in sys.modules; returns the state dict."""
    _state.update(current=0, count=count, copies=[], free=1 << 34, held=0, peak=0, allocations=0, kernels=[],
                  generation=_state["generation"] + 1)
    cupy = types.ModuleType("cupy")
    cupy.ndarray = ndarray
    cupy.uint8, cupy.float32, cupy.float64, cupy.complex128 = np.uint8, np.float32, np.float64, np.complex128
    cupy.empty, cupy.zeros = empty, zeros
    cupy.empty_like = lambda a, dtype=None: empty(a.shape, a.dtype if dtype is None else dtype)
    cupy.asarray = lambda a, dtype=None: _on_device(np.array(a, dtype=dtype))
    cupy.ReductionKernel = ReductionKernel
    for name in ("isnan", "isfinite", "abs", "count_nonzero", "flatnonzero", "where", "dot", "inf"):
        setattr(cupy, name, getattr(np, name))
    cuda = types.SimpleNamespace(
        Device=_Device, Stream=_Stream, Event=_Event,
        memory=types.SimpleNamespace(OutOfMemoryError=FakeOutOfMemoryError),
        runtime=types.SimpleNamespace(
            getDeviceCount=lambda: _state["count"],
            getDeviceProperties=_properties,
            memGetInfo=lambda: (_state["free"], 1 << 35),
            getDevice=lambda: _state["current"],
        ),
    )
    cupy.cuda = cuda
    cupyx = types.ModuleType("cupyx")
    cupyx.zeros_pinned = lambda n, dtype=np.uint8: _pinned(np.zeros(n, dtype=dtype))
    cupyx.empty_pinned = lambda n, dtype=np.uint8: _pinned(np.empty(n, dtype=dtype))
    sys.modules["cupy"] = cupy
    sys.modules["cupyx"] = cupyx
    return _state


@contextlib.contextmanager
def installed(count: int = 1):
    with modules_restored("cupy", "cupyx"):
        yield install(count)
