"""GPU tests: Caffe's GPU cases for SyncedMemory and Blob, and the CLI's --device, on a real CUDA device.

Marked `gpu`; skipped with a reason where CuPy or a CUDA device is missing.
The state machine's GPU transitions are also tested without a GPU, with a
host-only backend (test_syncedmem.py, test_blob.py); these tests do not
replace that, nor the other way round.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from blobtool import Blob, SyncedHead, SyncedMemory
from blobtool.engine.syncedmem import get_backend, set_backend
from builders import Layer, write_blob, write_net
from runner import invoke, run_blobtool


def _cupy_and_device():
    try:
        import cupy
    except Exception as exc:  # not installed, or a broken CUDA install
        return None, f"CuPy is not importable ({type(exc).__name__})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return None, f"no CUDA driver or device ({exc})"
    if count == 0:
        return None, "no CUDA device visible"
    return cupy, None


cp, _why = _cupy_and_device()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cp is None, reason=f"needs a CUDA GPU: {_why}")]


@pytest.fixture
def backend():
    from blobtool.engine import device
    previous = get_backend()
    b = device.use(0)
    yield b
    set_backend(previous)


# -- test_syncedmem.cpp, GPU cases --------------------------------------------------

def test_gpu_read_after_cpu_write(backend):
    # Caffe's TestGPURead: write on the host, read on the device.
    mem = SyncedMemory(10)
    host = mem.mutable_cpu_data()
    host[:] = 1
    assert mem.head is SyncedHead.HEAD_AT_CPU
    gpu = mem.gpu_data()
    assert mem.head is SyncedHead.SYNCED
    assert cp.asnumpy(gpu).tolist() == [1] * 10
    # Write on the device, read back on the host.
    gpu_w = mem.mutable_gpu_data()
    assert mem.head is SyncedHead.HEAD_AT_GPU
    gpu_w.fill(2)
    assert mem.cpu_data().tolist() == [2] * 10
    assert mem.head is SyncedHead.SYNCED


def test_gpu_write_from_uninitialized(backend):
    # Caffe's TestGPUWrite: first access on the device allocates zeroed memory.
    mem = SyncedMemory(10)
    gpu = mem.mutable_gpu_data()
    assert mem.head is SyncedHead.HEAD_AT_GPU
    assert cp.asnumpy(gpu).tolist() == [0] * 10
    gpu.fill(1)
    assert mem.cpu_data().tolist() == [1] * 10
    assert mem.head is SyncedHead.SYNCED
    mem.mutable_gpu_data().fill(2)
    assert mem.head is SyncedHead.HEAD_AT_GPU
    assert mem.cpu_data().tolist() == [2] * 10


def test_gpu_data_from_uninitialized_is_zeros(backend):
    mem = SyncedMemory(16)
    assert cp.asnumpy(mem.gpu_data()).tolist() == [0] * 16
    assert mem.head is SyncedHead.HEAD_AT_GPU


def test_host_memory_is_pinned_once_a_gpu_is_used(backend):
    mem = SyncedMemory(64)
    # cupyx's pinned arrays are numpy arrays over a PinnedMemoryPointer.
    base = mem.cpu_data()
    while isinstance(base, np.ndarray):
        base = base.base
    assert type(base).__name__ == "PinnedMemoryPointer"


def test_async_gpu_push(backend):
    mem = SyncedMemory(32)
    mem.mutable_cpu_data()[:] = 7
    stream = cp.cuda.Stream(non_blocking=True)
    mem.async_gpu_push(stream)
    assert mem.head is SyncedHead.SYNCED
    stream.synchronize()
    assert cp.asnumpy(mem.gpu_data()).tolist() == [7] * 32


def test_set_gpu_data_adopts(backend):
    mem = SyncedMemory(8)
    array = cp.arange(8, dtype=cp.uint8)
    mem.set_gpu_data(array)
    assert mem.head is SyncedHead.HEAD_AT_GPU
    assert not mem.own_gpu_data
    assert mem.cpu_data().tolist() == list(range(8))


# -- BlobMathTest on the GPU, both dtypes --------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_blob_math_on_gpu_matches_cpu(backend, dtype):
    rng = np.random.default_rng(1)
    values = rng.standard_normal(2 * 3 * 4 * 5).astype(dtype)
    cpu_blob = Blob(2, 3, 4, 5, dtype=dtype)
    cpu_blob.mutable_cpu_data()[:] = values
    gpu_blob = Blob(2, 3, 4, 5, dtype=dtype)
    gpu_blob.mutable_cpu_data()[:] = values
    gpu_blob.gpu_data()
    assert gpu_blob.data_memory.head is SyncedHead.SYNCED
    assert math.isclose(gpu_blob.asum_data(), cpu_blob.asum_data(), rel_tol=1e-6)
    assert math.isclose(gpu_blob.sumsq_data(), cpu_blob.sumsq_data(), rel_tol=1e-6)
    gpu_blob.mutable_gpu_data()
    assert gpu_blob.data_memory.head is SyncedHead.HEAD_AT_GPU
    gpu_blob.scale_data(0.25)
    cpu_blob.scale_data(0.25)
    assert gpu_blob.data_memory.head is SyncedHead.HEAD_AT_GPU
    np.testing.assert_allclose(gpu_blob.cpu_data(), cpu_blob.cpu_data(), rtol=1e-6)
    # Update: data -= diff on the device.
    diff = rng.standard_normal(values.size).astype(dtype)
    gpu_blob.mutable_cpu_diff()[:] = diff
    cpu_blob.mutable_cpu_diff()[:] = diff
    gpu_blob.mutable_gpu_data()
    gpu_blob.update()
    cpu_blob.update()
    np.testing.assert_allclose(gpu_blob.cpu_data(), cpu_blob.cpu_data(), rtol=1e-6, atol=1e-7)


def test_streamed_norms_match_cpu(backend):
    rng = np.random.default_rng(2)
    values = rng.standard_normal(3_000_001).astype(np.float32)
    got = backend.streamed_asum_sumsq(values, chunk_bytes=1 << 20)
    from blobtool.engine.kernels import asum_sumsq
    want = asum_sumsq(values)
    assert math.isclose(got[0], want[0], rel_tol=1e-9)
    assert math.isclose(got[1], want[1], rel_tol=1e-9)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_asum_sumsq_matches_the_host(backend, dtype):
    # One kernel gives both sums (complex128: asum + sumsq*1j), in float64.
    values = np.random.default_rng(4).standard_normal(1_000_003).astype(dtype)
    got = backend.asum_sumsq(cp.asarray(values))
    from blobtool.engine.kernels import asum_sumsq
    want = asum_sumsq(values)
    assert math.isclose(got[0], want[0], rel_tol=1e-12)
    assert math.isclose(got[1], want[1], rel_tol=1e-12)


def test_streamer_reduces_mixed_arrays_through_one_pipeline(backend):
    from blobtool.engine.kernels import asum_sumsq
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(n).astype(t) for n, t in
              ((10, np.float32), (300_001, np.float64), (0, np.float32), (70_000, np.float32))]
    streamer = backend.streamer(1 << 16)
    got = streamer.asum_sumsq(arrays)
    for (a, s), array in zip(got, arrays):
        want = asum_sumsq(array)
        assert math.isclose(a, want[0], rel_tol=1e-12) and math.isclose(s, want[1], rel_tol=1e-12)
    # Reused for a second call, as norm reuses it blob after blob.
    assert streamer.asum_sumsq([arrays[3]]) == [pytest.approx(asum_sumsq(arrays[3]), rel=1e-12)]
    streamer.close()


def test_cli_norm_device_streams_a_net_in_chunks_and_matches_cpu(tmp_path, monkeypatch):
    from blobtool.engine import device
    rng = np.random.default_rng(6)
    layers = [Layer(f"l{i}", "InnerProduct", [rng.standard_normal(n).astype(np.float32)],
                    [rng.standard_normal(n).astype(np.float32)]) for i, n in enumerate((3000, 17, 100_000))]
    path = write_net(tmp_path / "net.caffemodel", "new", layers)
    monkeypatch.setattr(device, "STREAM_CHUNK", 4096)  # many chunks per blob
    previous = get_backend()
    try:
        cpu = json.loads(invoke("norm", "--json", path).stdout)
        res = invoke("norm", "--json", "--device", "0", path)
    finally:
        set_backend(previous)
    assert res.exit_code == 0, res.stderr
    gpu = json.loads(res.stdout)
    for got, want in zip(gpu["blobs"] + [gpu["total"]], cpu["blobs"] + [cpu["total"]]):
        for part in ("data", "diff"):
            for key in ("asum", "sumsq", "l2"):
                assert math.isclose(got[part][key], want[part][key], rel_tol=1e-12)


def test_device_index_out_of_range_names_visible_devices():
    from blobtool.engine import device
    from blobtool.errors import DeviceError
    count = cp.cuda.runtime.getDeviceCount()
    with pytest.raises(DeviceError, match=rf"GPU {count} requested; {count} visible: 0 "):
        device.use(count)


# -- the command line --------------------------------------------------------------------

def _blob_file(tmp_path, dtype=np.float32, with_diff=True):
    rng = np.random.default_rng(3)
    data = rng.standard_normal((4, 3, 8, 8)).astype(dtype)
    diff = rng.standard_normal((4, 3, 8, 8)).astype(dtype)
    return write_blob(tmp_path / "w.pb", data, diff if with_diff else None, double=dtype == np.float64)


def _run(*args):
    return run_blobtool(*args, text=True, timeout=None)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cli_norm_device_matches_cpu(tmp_path, dtype):
    path = _blob_file(tmp_path, dtype)
    cpu = json.loads(_run("norm", "--json", str(path)).stdout)
    res = _run("norm", "--json", "--device", "0", str(path))
    assert res.returncode == 0, res.stderr
    gpu = json.loads(res.stdout)
    assert gpu["device"]["index"] == 0 and gpu["device"]["name"]
    for part in ("data", "diff"):
        for key in ("asum", "sumsq", "l2"):
            assert math.isclose(gpu["blobs"][0][part][key], cpu["blobs"][0][part][key], rel_tol=1e-6)


def test_cli_norm_device_human_output_names_the_gpu(tmp_path):
    path = _blob_file(tmp_path)
    res = _run("norm", "--device", "0", str(path))
    assert res.returncode == 0, res.stderr
    assert "on GPU 0" in res.stdout


@pytest.mark.parametrize("command", [["scale", "0.5"], ["scale", "0.5", "--diff-factor", "2"], ["update"]])
def test_cli_writes_on_device_match_cpu(tmp_path, command):
    path = _blob_file(tmp_path)
    name = command[0]
    args = [name, str(path), *command[1:]]
    cpu_out = tmp_path / f"{name}-cpu.pb"
    gpu_out = tmp_path / f"{name}-gpu.pb"
    assert _run(*args, "-o", str(cpu_out)).returncode == 0
    res = _run(*args, "--device", "0", "-o", str(gpu_out))
    assert res.returncode == 0, res.stderr
    cmp = _run("compare", "--rtol", "1e-6", "--atol", "1e-7", str(gpu_out), str(cpu_out))
    assert cmp.returncode == 0, cmp.stdout


def test_cli_compare_on_device(tmp_path):
    path = _blob_file(tmp_path)
    res = _run("compare", "--json", "--device", "0", str(path), str(path))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["device"]["index"] == 0


def test_cli_device_out_of_range_is_exit_4_and_writes_nothing(tmp_path):
    path = _blob_file(tmp_path)
    out = tmp_path / "never.pb"
    res = _run("scale", str(path), "2", "--device", "99", "-o", str(out))
    assert res.returncode == 4
    assert "GPU 99 requested" in res.stderr and "visible" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_cli_devices_lists_the_gpu():
    res = _run("devices", "--json")
    assert res.returncode == 0
    devices = json.loads(res.stdout)["devices"]
    assert devices and devices[0]["index"] == 0
    assert devices[0]["total_memory"] >= devices[0]["free_memory"] > 0
    assert "." in devices[0]["compute_capability"]
