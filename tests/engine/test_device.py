"""blobtool/device.py's own code, run against a host-only stand-in for CuPy (tests/helpers/fakecupy.py).

These run everywhere and exercise the CuPy backend's logic: device selection
and its errors, pinned host memory, copies, check_device, out-of-memory
messages, the double-buffered streamed norm, and the CLI's --device paths.
They do not replace tests/engine/test_gpu.py, which runs the same paths on a real
GPU.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import fakecupy
from blobtool import Blob, SyncedHead, SyncedMemory
from blobtool.engine import device
from blobtool.errors import DeviceError
from blobtool.engine.kernels import asum_sumsq
from blobtool.engine.syncedmem import get_backend, set_backend
from builders import Layer, write_blob, write_net
from runner import invoke


@pytest.fixture
def cupy_state():
    previous = get_backend()
    with fakecupy.installed(count=2) as state:
        yield state
    set_backend(previous)


@pytest.fixture
def backend(cupy_state):
    return device.use(0)


def test_use_selects_the_device_and_describes_it(backend, cupy_state):
    assert backend.describe() == {"index": 0, "name": "Fake GPU"}
    assert get_backend() is backend
    assert cupy_state["current"] == 0


def test_use_as_a_context_manager_restores_the_callers_device_and_backend(cupy_state):
    before = get_backend()
    assert cupy_state["current"] == 0
    with device.use(1) as gpu:
        assert get_backend() is gpu and gpu.index == 1
        assert cupy_state["current"] == 1
        assert SyncedMemory(8).gpu_data() is not None  # device work inside the block runs on GPU 1
    assert get_backend() is before
    assert cupy_state["current"] == 0
    outer = device.use(0)
    with device.use(1):
        assert get_backend() is not outer
    assert get_backend() is outer and cupy_state["current"] == 0


@pytest.mark.parametrize("count, index, message", [
    (2, 5, "GPU 5 requested; 2 visible: 0 Fake GPU, 1 Fake GPU"),
    (0, 0, "GPU 0 requested, but no CUDA device is visible"),
])
def test_use_refuses_missing_devices(count, index, message):
    previous = get_backend()
    with fakecupy.installed(count=count):
        with pytest.raises(DeviceError) as info:
            device.use(index)
    set_backend(previous)
    assert str(info.value) == message
    assert info.value.exit_code == 4


def test_list_devices(cupy_state):
    found = device.list_devices()
    assert [d["index"] for d in found] == [0, 1]
    assert found[0]["name"] == "Fake GPU" and found[0]["compute_capability"] == "9.0"
    assert found[0]["total_memory"] >= found[0]["free_memory"]


def test_synced_memory_moves_through_the_backend(backend, cupy_state):
    mem = SyncedMemory(16)
    mem.mutable_cpu_data()[:] = 7
    assert mem.head is SyncedHead.HEAD_AT_CPU
    gpu = mem.gpu_data()
    assert isinstance(gpu, fakecupy.ndarray)
    assert mem.head is SyncedHead.SYNCED
    assert [c[0] for c in cupy_state["copies"]] == ["h2d"]
    mem.mutable_gpu_data()[:] = 9
    assert mem.head is SyncedHead.HEAD_AT_GPU
    assert mem.cpu_data().tolist() == [9] * 16
    assert mem.head is SyncedHead.SYNCED
    assert [c[0] for c in cupy_state["copies"]] == ["h2d", "d2h"]


def test_first_device_use_gives_zeros_not_garbage(backend):
    mem = SyncedMemory(8)
    assert np.asarray(mem.gpu_data()).tolist() == [0] * 8
    assert mem.head is SyncedHead.HEAD_AT_GPU


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_blob_math_on_the_device_matches_the_host(backend, dtype):
    rng = np.random.default_rng(4)
    values = rng.standard_normal(1000).astype(dtype)
    diff = rng.standard_normal(1000).astype(dtype)
    host = Blob(10, 100, dtype=dtype)
    dev = Blob(10, 100, dtype=dtype)
    for blob in (host, dev):
        blob.mutable_cpu_data()[:] = values
        blob.mutable_cpu_diff()[:] = diff
    dev.gpu_data()
    dev.gpu_diff()
    assert math.isclose(dev.asum_data(), host.asum_data(), rel_tol=1e-12)
    assert math.isclose(dev.sumsq_diff(), host.sumsq_diff(), rel_tol=1e-12)
    dev.scale_data(0.5)
    host.scale_data(0.5)
    assert dev.data_memory.head is SyncedHead.HEAD_AT_GPU
    dev.update()
    host.update()
    np.testing.assert_array_equal(dev.cpu_data(), host.cpu_data())


def test_device_memory_used_from_another_device_names_both(backend, cupy_state):
    mem = SyncedMemory(8)
    mem.gpu_data()
    cupy_state["current"] = 1
    with pytest.raises(DeviceError, match="array device = 0 while current = 1"):
        mem.gpu_data()


def test_set_gpu_data_refuses_another_devices_array(backend, cupy_state):
    cupy_state["current"] = 1
    other = fakecupy.zeros(8, dtype=np.uint8)
    cupy_state["current"] = 0
    with pytest.raises(DeviceError, match="set_gpu_data: array device = 1 while current = 0"):
        SyncedMemory(8).set_gpu_data(other)


def test_out_of_device_memory_names_the_sizes(backend, cupy_state):
    cupy_state["free"] = 1 << 20
    blob = Blob(1 << 20)  # 4 MiB of float32
    blob.mutable_cpu_data()
    with pytest.raises(DeviceError) as info:
        blob.gpu_data()
    assert str(info.value) == "out of memory on GPU 0 (Fake GPU): 4.0 MiB needed, 1.0 MiB free"


def test_streamed_norm_double_buffers_and_matches(backend, cupy_state):
    values = np.random.default_rng(5).standard_normal(3_000_001).astype(np.float32)
    got = backend.streamed_asum_sumsq(values, chunk_bytes=1 << 20)
    want = asum_sumsq(values)
    assert math.isclose(got[0], want[0], rel_tol=1e-12)
    assert math.isclose(got[1], want[1], rel_tol=1e-12)
    copies = [c for c in cupy_state["copies"] if c[0] == "h2d"]
    chunks = -(-values.nbytes // (1 << 20))
    assert len(copies) == chunks
    streams = [c[2] for c in copies]
    # Two streams, used in turn, each copy from pinned memory.
    assert streams[0] is not streams[1] and streams[0] is streams[2] and streams[1] is streams[3]
    assert all(c[3] for c in copies)
    # One pass: one fused kernel per chunk, reading every byte once.
    assert [k[0] for k in cupy_state["kernels"]] == ["blobtool_asum_sumsq"] * chunks
    assert sum(k[1] for k in cupy_state["kernels"]) == values.nbytes
    # Two chunk buffers on the device (and a few bytes of partial sums), never the array.
    assert cupy_state["peak"] <= 2 * (1 << 20) + 16 * (chunks + 2)


def test_asum_sumsq_of_a_placed_blob_is_one_pass(backend, cupy_state):
    values = np.random.default_rng(7).standard_normal(1000)
    blob = Blob(1000, dtype=np.float64)
    blob.mutable_cpu_data()[:] = values
    blob.gpu_data()
    cupy_state["kernels"].clear()
    got = blob.asum_sumsq_data()
    assert got == pytest.approx(asum_sumsq(values), rel=1e-12)
    assert cupy_state["kernels"] == [("blobtool_asum_sumsq", values.nbytes)]


def test_streamer_keeps_its_buffers_between_arrays(backend, cupy_state):
    streamer = backend.streamer(256)
    arrays = [np.arange(n, dtype=np.float32) - n / 2 for n in (10, 500, 3, 64)]
    for array in arrays:
        assert streamer.asum_sumsq([array]) == [pytest.approx(asum_sumsq(array), rel=1e-12)]
    # In chunks of at most 256 bytes: 1 + 8 + 1 + 1 copies.
    copies = [c for c in cupy_state["copies"] if c[0] == "h2d"]
    assert [c[1] for c in copies] == [40] + [256] * 7 + [208, 12, 256]
    # The buffers grow once, from the first array's size to a chunk, and are reused.
    assert cupy_state["peak"] <= 2 * 256 + 2 * 48 + 16 * 10
    assert streamer.asum_sumsq([np.zeros(0, np.float32)]) == [(0.0, 0.0)]


# -- the command line on the stand-in ------------------------------------------------------

def _blob_file(tmp_path):
    rng = np.random.default_rng(6)
    data = rng.standard_normal((4, 3, 5, 5)).astype(np.float32)
    diff = rng.standard_normal((4, 3, 5, 5)).astype(np.float32)
    return write_blob(tmp_path / "w.pb", data, diff)


def _invoke(*args):
    """blobtool in-process (COLUMNS as it is); then no device backend, as a new process would start."""
    result = invoke(*args, columns=None)
    set_backend(None)
    return result


def test_cli_norm_on_device_reports_it_and_matches(cupy_state, tmp_path):
    path = _blob_file(tmp_path)
    cpu = json.loads(_invoke("norm", "--json", path).output)
    res = _invoke("norm", "--json", "--device", "0", path)
    assert res.exit_code == 0, res.output
    gpu = json.loads(res.output)
    assert gpu["device"] == {"index": 0, "name": "Fake GPU"}
    assert gpu["blobs"][0]["data"] == pytest.approx(cpu["blobs"][0]["data"], rel=1e-12)
    assert gpu["blobs"][0]["diff"] == pytest.approx(cpu["blobs"][0]["diff"], rel=1e-12)
    assert any(c[0] == "h2d" for c in cupy_state["copies"])


def _net_file(tmp_path, sizes=(300, 40, 1000)):
    """A .caffemodel of three layers, one blob each with a diff, of `sizes` float32 values."""
    rng = np.random.default_rng(8)
    layers = [Layer(f"l{i}", "InnerProduct", [rng.standard_normal(n).astype(np.float32)],
                    [rng.standard_normal(n).astype(np.float32)]) for i, n in enumerate(sizes)]
    return write_net(tmp_path / "net.caffemodel", "new", layers)


def _h2d(cupy_state):
    return [c for c in cupy_state["copies"] if c[0] == "h2d"]


def test_cli_norm_streams_each_blob_through_pinned_buffers(cupy_state, tmp_path, monkeypatch):
    sizes = (300, 40, 1000)
    path = _net_file(tmp_path, sizes)
    chunk = 256
    monkeypatch.setattr(device, "STREAM_CHUNK", chunk)
    cpu = json.loads(_invoke("norm", "--json", path).output)
    for key in ("peak", "held", "allocations"):
        cupy_state[key] = 0
    res = _invoke("norm", "--json", "--device", "0", path)
    assert res.exit_code == 0, res.output
    gpu = json.loads(res.output)
    for got, want in zip(gpu["blobs"] + [gpu["total"]], cpu["blobs"] + [cpu["total"]]):
        assert got["data"] == pytest.approx(want["data"], rel=1e-12)
        assert got["diff"] == pytest.approx(want["diff"], rel=1e-12)
    total = 2 * 4 * sum(sizes)  # data and diff, float32
    chunks = 2 * sum(-(-4 * n // chunk) for n in sizes)
    copies = _h2d(cupy_state)
    # Every byte copied once, in chunks, from pinned memory, on the two streams.
    assert sum(c[1] for c in copies) == total
    assert len(copies) == chunks and max(c[1] for c in copies) <= chunk
    assert all(c[3] for c in copies) and all(c[2] is not None for c in copies)
    # asum and sumsq in one pass: one kernel per chunk, each byte read once.
    assert len(cupy_state["kernels"]) == chunks
    assert sum(k[1] for k in cupy_state["kernels"]) == total
    # Never more on the device than two chunks and the partial sums: not the net, not a blob.
    assert cupy_state["peak"] <= 2 * chunk + 16 * (chunks + 4)
    assert cupy_state["peak"] < 4 * max(sizes)
    assert cupy_state["held"] == 0


def test_streamer_reports_progress_for_every_byte_read(backend):
    from blobtool.engine.work import using

    seen = []
    values = np.arange(1000, dtype=np.float64)
    diff = np.ones(10, dtype=np.float32)
    with using(progress=seen.append):
        backend.streamer(1024).asum_sumsq([values, diff])
    assert sum(seen) == values.nbytes + diff.nbytes and len(seen) == 8 + 1


def test_cli_norm_on_device_of_a_blob_without_diff(cupy_state, tmp_path):
    path = write_blob(tmp_path / "nodiff.pb", np.arange(12, dtype=np.float32).reshape(3, 4))
    res = _invoke("norm", "--json", "--device", "0", path)
    assert res.exit_code == 0, res.output
    record = json.loads(res.output)
    assert record["blobs"][0]["data"]["asum"] == 66.0 and record["blobs"][0]["diff"] is None
    assert sum(c[1] for c in _h2d(cupy_state)) == 48


@pytest.mark.parametrize("extra, sides", [([], 1), (["--diff-factor", "3"], 2)])
def test_cli_scale_on_device_uploads_only_what_it_scales(cupy_state, tmp_path, extra, sides):
    sizes = (300, 40, 1000)
    path = _net_file(tmp_path, sizes)
    host_out, gpu_out = tmp_path / "host.caffemodel", tmp_path / "gpu.caffemodel"
    assert _invoke("scale", path, "0.5", *extra, "-o", host_out).exit_code == 0
    for key in ("peak", "held", "allocations"):
        cupy_state[key] = 0
    cupy_state["copies"].clear()
    res = _invoke("scale", path, "0.5", *extra, "--device", "0", "-o", gpu_out)
    assert res.exit_code == 0, res.output
    assert gpu_out.read_bytes() == host_out.read_bytes()
    # The data (and the diff only when it is scaled) go up once and come back once.
    assert sum(c[1] for c in _h2d(cupy_state)) == sides * 4 * sum(sizes)
    assert sum(c[1] for c in cupy_state["copies"] if c[0] == "d2h") == sides * 4 * sum(sizes)
    # One blob at a time: what it scales, with a few bytes of counts.
    assert cupy_state["peak"] <= sides * 4 * max(sizes) + 64
    assert cupy_state["held"] == 0


def test_cli_scale_on_device_works_each_blob_as_the_output_reaches_it(cupy_state, tmp_path, monkeypatch):
    # The host holds one blob's results at a time too: blob k goes to the
    # device only once blob k - 1 is written.
    from blobtool.formats import writing
    from blobtool.cli import write

    path = _net_file(tmp_path)
    events = []
    run, report = write._DeviceStep.run, writing.report

    def logged_run(step):
        if not step._done:
            events.append("device")
        run(step)

    monkeypatch.setattr(write._DeviceStep, "run", logged_run)
    monkeypatch.setattr(writing, "report", lambda n: (events.append("written"), report(n)))
    res = _invoke("scale", path, "0.5", "--diff-factor", "2", "--device", "0", "-o", tmp_path / "out.caffemodel")
    assert res.exit_code == 0, res.output
    # Per blob: its device work, then its data and its diff written.
    assert events == ["device", "written", "written"] * 3


def test_cli_update_on_device_holds_one_blob_at_a_time(cupy_state, tmp_path):
    sizes = (300, 40, 1000)
    path = _net_file(tmp_path, sizes)
    host_out, gpu_out = tmp_path / "host.caffemodel", tmp_path / "gpu.caffemodel"
    assert _invoke("update", path, "-o", host_out).exit_code == 0
    for key in ("peak", "held", "allocations"):
        cupy_state[key] = 0
    cupy_state["copies"].clear()
    res = _invoke("update", path, "--device", "0", "-o", gpu_out)
    assert res.exit_code == 0, res.output
    assert gpu_out.read_bytes() == host_out.read_bytes()
    # data -= diff reads both; only the data comes back.
    assert sum(c[1] for c in _h2d(cupy_state)) == 2 * 4 * sum(sizes)
    assert sum(c[1] for c in cupy_state["copies"] if c[0] == "d2h") == 4 * sum(sizes)
    assert cupy_state["peak"] <= 2 * 4 * max(sizes) + 64
    assert cupy_state["held"] == 0


def test_cli_compare_on_device_holds_one_pair_at_a_time(cupy_state, tmp_path):
    sizes = (300, 40, 1000)
    path = _net_file(tmp_path, sizes)
    nodiff = write_net(tmp_path / "nodiff.caffemodel", "new", [
        Layer(f"l{i}", "InnerProduct", [np.ones(n, np.float32)]) for i, n in enumerate(sizes)])
    for other, sides, code in ((path, 2, 0), (nodiff, 1, 1)):
        for key in ("peak", "held", "allocations"):
            cupy_state[key] = 0
        cupy_state["copies"].clear()
        res = _invoke("compare", "--json", "--device", "0", path, other)
        assert res.exit_code == code, res.output
        # Both files' data, and the diffs only where both have one to compare.
        assert sum(c[1] for c in _h2d(cupy_state)) == 2 * sides * 4 * sum(sizes)
        assert cupy_state["peak"] <= 2 * sides * 4 * max(sizes) + 256
        assert cupy_state["held"] == 0


def test_cli_convert_refuses_device(cupy_state, tmp_path):
    path = _blob_file(tmp_path)
    out = tmp_path / "never.pb"
    res = _invoke("convert", "--double", path, "--device", "0", "-o", out)
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and "convert computes nothing" in res.stderr
    assert "Traceback" not in res.stderr
    assert not out.exists()
    assert cupy_state["copies"] == [] and cupy_state["allocations"] == 0


def test_cli_writes_and_compare_on_device(cupy_state, tmp_path):
    path = _blob_file(tmp_path)
    for name, extra in (("scale", ["0.5"]), ("update", [])):
        cpu_out, gpu_out = tmp_path / f"{name}-cpu.pb", tmp_path / f"{name}-gpu.pb"
        assert _invoke(name, path, *extra, "-o", cpu_out).exit_code == 0
        res = _invoke(name, path, *extra, "--device", "0", "-o", gpu_out)
        assert res.exit_code == 0, res.output
        same = _invoke("compare", "--json", "--device", "0", gpu_out, cpu_out)
        assert same.exit_code == 0, same.output
        assert json.loads(same.output)["device"]["name"] == "Fake GPU"


def test_cli_overflow_on_device_warns_as_on_the_host(cupy_state, tmp_path):
    path = write_blob(tmp_path / "big.pb", [3e38, 1.0, 0.0, -2e38], [-3e38, 0.0, 1.0, 2e38])
    for name, extra in (("scale", ["1e39"]), ("update", [])):
        cpu_out, gpu_out = tmp_path / f"{name}-cpu.pb", tmp_path / f"{name}-gpu.pb"
        host = _invoke(name, path, *extra, "-o", cpu_out)
        res = _invoke(name, path, *extra, "--device", "0", "-o", gpu_out)
        assert res.exit_code == host.exit_code == 0, res.output
        assert res.stderr == host.stderr
        assert res.stderr.count("\n") == 1 and "into Inf or NaN (past float32's range)" in res.stderr
        assert gpu_out.read_bytes() == cpu_out.read_bytes()


def test_cli_device_index_out_of_range_writes_nothing(cupy_state, tmp_path):
    path = _blob_file(tmp_path)
    out = tmp_path / "never.pb"
    res = _invoke("scale", path, "2", "--device", "7", "-o", out)
    assert res.exit_code == 4
    assert "GPU 7 requested; 2 visible: 0 Fake GPU, 1 Fake GPU" in res.output
    assert not out.exists()


def test_cli_devices_lists_them(cupy_state):
    res = _invoke("devices", "--json")
    assert res.exit_code == 0
    assert [d["name"] for d in json.loads(res.output)["devices"]] == ["Fake GPU", "Fake GPU"]
