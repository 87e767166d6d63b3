"""A host-only stand-in for the part of CuPy that blobtool/device.py uses.

It lets the CuPy backend's own code (device selection, pinned memory,
copies, streams and events of the streamed norm, reduction kernels,
check_device, the CLI's --device paths) run on a machine without a GPU.
Device arrays are numpy arrays of a subclass that remembers its device.
It proves the backend's logic, not CuPy's: tests/test_gpu.py does that on a
real device.
"""

from __future__ import annotations

import contextlib
import sys
import types

import numpy as np


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
        _state["copies"].append(("h2d", arr.nbytes, stream))
        np.copyto(self.view(np.ndarray), arr)

    def get(self, stream=None, order="C", out=None):
        _state["copies"].append(("d2h", self.nbytes, stream))
        if out is None:
            return np.array(self.view(np.ndarray))
        np.copyto(out, self.view(np.ndarray))
        return out


_state = {"current": 0, "count": 1, "copies": [], "free": 1 << 34}


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
    out = np.asarray(values).view(ndarray)
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
    """Only the two kernels blobtool defines: sum of |x| and sum of x*x, in float64."""

    def __init__(self, in_params, out_params, map_expr, reduce_expr, post_map_expr, identity, name):
        assert in_params == "T x" and out_params == "float64 y" and reduce_expr == "a + b"
        self.square = "*" in map_expr

    def __call__(self, x):
        assert isinstance(x, ndarray), "kernels run on device arrays"
        wide = np.asarray(x, dtype=np.float64)
        value = np.dot(wide, wide) if self.square else np.abs(wide).sum()
        return _on_device(np.array(value))


def _properties(index):
    return {"name": b"Fake GPU", "major": 9, "minor": 0}


def install(count: int = 1):
    """Put fake `cupy` and `cupyx` modules in sys.modules; returns the state dict."""
    _state.update(current=0, count=count, copies=[], free=1 << 34)
    cupy = types.ModuleType("cupy")
    cupy.ndarray = ndarray
    cupy.uint8, cupy.float32, cupy.float64 = np.uint8, np.float32, np.float64
    cupy.empty, cupy.zeros = empty, zeros
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
    cupyx.zeros_pinned = lambda n, dtype=np.uint8: np.zeros(n, dtype=dtype)
    cupyx.empty_pinned = lambda n, dtype=np.uint8: np.empty(n, dtype=dtype)
    sys.modules["cupy"] = cupy
    sys.modules["cupyx"] = cupyx
    return _state


@contextlib.contextmanager
def installed(count: int = 1):
    saved = {name: sys.modules.get(name) for name in ("cupy", "cupyx")}
    try:
        yield install(count)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
