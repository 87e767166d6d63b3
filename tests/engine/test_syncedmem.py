"""SyncedMemory, restating Caffe's src/caffe/test/test_syncedmem.cpp.

The CPU cases run on the host as they are. The GPU cases (TestGPURead,
TestGPUWrite, TestAllocationCPUGPU, ...) run against tests/helpers/fakegpu.py, a
host-only backend that records every copy, so the whole head state machine
is checked without a GPU. The head is asserted after every accessor.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import fakegpu
from blobtool import BlobToolError, SyncedHead, SyncedMemory
from blobtool.errors import DeviceError
from blobtool.engine.syncedmem import get_backend, set_backend

UNINITIALIZED = SyncedHead.UNINITIALIZED
HEAD_AT_CPU = SyncedHead.HEAD_AT_CPU
HEAD_AT_GPU = SyncedHead.HEAD_AT_GPU
SYNCED = SyncedHead.SYNCED


# Every test here starts with no device backend (conftest's host_only).
pytestmark = pytest.mark.usefixtures("host_only")


# -- set_backend ---------------------------------------------------------------


def test_set_backend_returns_previous_and_fixtures_restore_it():
    assert get_backend() is None
    outer = fakegpu.FakeBackend()
    with fakegpu.installed(outer):
        assert get_backend() is outer
        with fakegpu.installed() as inner:
            assert get_backend() is inner
        assert get_backend() is outer
        with fakegpu.no_backend():
            assert get_backend() is None
        assert get_backend() is outer
    assert get_backend() is None
    assert set_backend(outer) is None
    assert set_backend(None) is outer


def test_the_device_belongs_to_the_thread_that_chose_it():
    # Not a process-wide mode: another thread of the same process keeps the host, and a with
    # block of blobtool.engine.work ends a choice made inside it.
    import threading

    from blobtool.engine import work

    seen = []
    chosen, elsewhere_ready = threading.Event(), threading.Event()

    def other():
        chosen.wait(10)
        seen.append(get_backend())
        try:
            SyncedMemory(4).gpu_data()
        except DeviceError:  # its memory has no device to go to
            seen.append("host only")
        elsewhere_ready.set()

    thread = threading.Thread(target=other)
    thread.start()
    backend = fakegpu.FakeBackend()
    with work.using():
        set_backend(backend)
        chosen.set()
        elsewhere_ready.wait(10)
        assert get_backend() is backend
    thread.join()
    assert seen == [None, "host only"]
    assert get_backend() is None


# -- host side: Caffe's CPU cases ----------------------------------------------


def test_initialization():
    # Caffe: TestInitialization
    mem = SyncedMemory(10)
    assert mem.head is UNINITIALIZED
    assert mem.size == 10
    p_mem = SyncedMemory(10 * np.dtype(np.float32).itemsize)
    assert p_mem.size == 40
    assert p_mem.head is UNINITIALIZED
    assert SyncedMemory().size == 0
    assert "UNINITIALIZED" in repr(mem)


def test_negative_size_is_refused():
    with pytest.raises(BlobToolError, match="size must be >= 0"):
        SyncedMemory(-1)


def test_cpu_data_allocates_zeros():
    # Caffe: TestAllocationCPU, plus CaffeMallocHost's zeroing in to_cpu().
    mem = SyncedMemory(10)
    data = mem.cpu_data()
    assert mem.head is HEAD_AT_CPU
    assert mem.own_cpu_data
    assert data.shape == (10,)
    assert data.dtype == np.uint8
    assert data.ndim == 1
    assert not data.any()


def test_cpu_data_is_read_only_view_of_the_same_memory():
    mem = SyncedMemory(8)
    data = mem.cpu_data()
    assert mem.head is HEAD_AT_CPU
    assert not data.flags.writeable
    with pytest.raises(ValueError):
        data[0] = 1
    writable = mem.mutable_cpu_data()
    assert mem.head is HEAD_AT_CPU
    assert writable.flags.writeable
    assert np.shares_memory(data, writable)
    writable[3] = 7
    assert data[3] == 7
    again = mem.cpu_data()
    assert mem.head is HEAD_AT_CPU
    assert again[3] == 7
    assert not again.flags.writeable


def test_mutable_cpu_data_from_uninitialized():
    mem = SyncedMemory(6)
    data = mem.mutable_cpu_data()
    assert mem.head is HEAD_AT_CPU
    assert data.flags.writeable
    assert data.shape == (6,)
    assert data.dtype == np.uint8
    assert not data.any()


def test_cpu_write():
    # Caffe: TestCPUWrite, memset 1 then another round with 2.
    mem = SyncedMemory(10)
    cpu_data = mem.mutable_cpu_data()
    assert mem.head is HEAD_AT_CPU
    cpu_data[:] = 1
    assert mem.cpu_data().tolist() == [1] * 10
    assert mem.head is HEAD_AT_CPU
    # do another round
    cpu_data = mem.mutable_cpu_data()
    assert mem.head is HEAD_AT_CPU
    cpu_data[:] = 2
    assert mem.cpu_data().tolist() == [2] * 10
    assert mem.head is HEAD_AT_CPU


def test_zero_size_memory():
    mem = SyncedMemory(0)
    assert mem.cpu_data().size == 0
    assert mem.head is HEAD_AT_CPU
    assert mem.mutable_cpu_data().size == 0
    assert mem.head is HEAD_AT_CPU


def test_host_allocation_without_backend_is_plain_numpy():
    mem = SyncedMemory(4)
    data = mem.mutable_cpu_data()
    assert type(data) is np.ndarray
    assert mem.head is HEAD_AT_CPU


# -- set_cpu_data --------------------------------------------------------------


def test_set_cpu_data_adopts_without_copying():
    mem = SyncedMemory(16)
    mem.cpu_data()
    assert mem.own_cpu_data
    assert mem.head is HEAD_AT_CPU
    buf = np.arange(16, dtype=np.uint8)
    mem.set_cpu_data(buf)
    assert mem.head is HEAD_AT_CPU
    assert not mem.own_cpu_data
    view = mem.cpu_data()
    assert mem.head is HEAD_AT_CPU
    assert np.shares_memory(view, buf)
    assert view.tolist() == list(range(16))
    # Writes through either side are seen by the other: the same bytes.
    buf[0] = 200
    assert mem.cpu_data()[0] == 200
    mem.mutable_cpu_data()[1] = 100
    assert mem.head is HEAD_AT_CPU
    assert buf[1] == 100


def test_set_cpu_data_from_uninitialized_claims_head():
    mem = SyncedMemory(4)
    assert mem.head is UNINITIALIZED
    mem.set_cpu_data(np.full(4, 9, dtype=np.uint8))
    assert mem.head is HEAD_AT_CPU
    assert not mem.own_cpu_data
    assert mem.cpu_data().tolist() == [9, 9, 9, 9]
    assert mem.head is HEAD_AT_CPU


def test_set_cpu_data_views_other_dtypes_as_bytes():
    values = np.array([1.5, -2.0], dtype=np.float32)
    mem = SyncedMemory(values.nbytes)
    mem.set_cpu_data(values)
    view = mem.cpu_data()
    assert view.dtype == np.uint8 and view.shape == (8,)
    assert np.shares_memory(view, values)
    assert view.view(np.float32).tolist() == [1.5, -2.0]


def test_set_cpu_data_uses_only_the_first_size_bytes():
    buf = np.arange(32, dtype=np.uint8)
    mem = SyncedMemory(8)
    mem.set_cpu_data(buf)
    view = mem.cpu_data()
    assert view.shape == (8,)
    assert view.tolist() == list(range(8))
    assert np.shares_memory(view, buf)


def test_set_cpu_data_accepts_a_writable_buffer_without_copying():
    raw = bytearray(b"\x01\x02\x03\x04")
    mem = SyncedMemory(4)
    mem.set_cpu_data(raw)
    assert mem.head is HEAD_AT_CPU
    mem.mutable_cpu_data()[0] = 42
    assert raw[0] == 42


BAD_HOST_BUFFERS = [
    ("too small", lambda: np.zeros(7, dtype=np.uint8), "holds 7 bytes, 8 needed"),
    ("too small float", lambda: np.zeros(1, dtype=np.float32), "holds 4 bytes, 8 needed"),
    ("non-contiguous", lambda: np.zeros(32, dtype=np.uint8)[::2], "C-contiguous"),
    ("fortran 2-d", lambda: np.zeros((4, 4), dtype=np.uint8, order="F"), "C-contiguous"),
    ("not a buffer", lambda: 12345, "expected a numpy array or buffer, got int"),
]


@pytest.mark.parametrize("name, make, message", BAD_HOST_BUFFERS, ids=[b[0] for b in BAD_HOST_BUFFERS])
def test_set_cpu_data_refuses(name, make, message):
    mem = SyncedMemory(8)
    mem.mutable_cpu_data()[:] = 5
    assert mem.head is HEAD_AT_CPU
    with pytest.raises(BlobToolError, match=message):
        mem.set_cpu_data(make())
    # Nothing changed: the old bytes are still there and still owned.
    assert mem.head is HEAD_AT_CPU
    assert mem.own_cpu_data
    assert mem.cpu_data().tolist() == [5] * 8


# -- GPU accessors with no GPU ---------------------------------------------------


# (accessor, call, what the message names)
GPU_ACCESSORS = [
    ("gpu_data", lambda mem: mem.gpu_data(), "gpu_data needs a GPU"),
    ("mutable_gpu_data", lambda mem: mem.mutable_gpu_data(), "gpu_data needs a GPU"),
    ("set_gpu_data", lambda mem: mem.set_gpu_data(np.zeros(8, dtype=np.uint8)), "set_gpu_data needs a GPU"),
    ("async_gpu_push", lambda mem: mem.async_gpu_push(None), "async_gpu_push needs a GPU"),
]


@pytest.mark.parametrize("name, call, message", GPU_ACCESSORS, ids=[a[0] for a in GPU_ACCESSORS])
@pytest.mark.parametrize("touch_cpu_first", [False, True])
def test_gpu_accessors_without_backend_raise_device_error(name, call, message, touch_cpu_first):
    mem = SyncedMemory(8)
    if touch_cpu_first:
        mem.mutable_cpu_data()
    head_before = mem.head
    with pytest.raises(BlobToolError) as info:
        call(mem)
    err = info.value
    assert isinstance(err, DeviceError)
    assert err.exit_code == 4
    assert message in str(err)
    assert "--device" in str(err)
    assert mem.head is head_before


# -- the GPU state machine, on the fake backend ------------------------------


def test_uninitialized_gpu_data_allocates_zeroed_device_memory(fake):
    # Caffe: TestAllocationGPU; to_gpu() from UNINITIALIZED memsets to 0.
    mem = SyncedMemory(10)
    gpu = mem.gpu_data()
    assert mem.head is HEAD_AT_GPU
    assert isinstance(gpu, fakegpu.DeviceArray)
    assert gpu.size == 10 and gpu.dtype == np.uint8
    assert not gpu.any()
    assert mem.own_gpu_data
    assert fake.names() == ["device_zeros"]
    assert fake.copies == []


def test_allocation_cpu_gpu(fake):
    # Caffe: TestAllocationCPUGPU
    mem = SyncedMemory(10)
    mem.cpu_data()
    assert mem.head is HEAD_AT_CPU
    mem.gpu_data()
    assert mem.head is SYNCED
    assert fake.copies == [("H2D", 10)]


def test_host_memory_comes_from_backend_when_a_gpu_is_in_use(fake):
    # CaffeMallocHost allocates pinned memory in GPU mode.
    mem = SyncedMemory(12)
    data = mem.cpu_data()
    assert mem.head is HEAD_AT_CPU
    assert fake.calls == [("host_zeros", 12)]
    assert not data.any()


def test_cpu_data_after_gpu_write_allocates_host_then_copies(fake):
    mem = SyncedMemory(4)
    mem.mutable_gpu_data()[:] = 3
    assert mem.head is HEAD_AT_GPU
    assert not mem.own_cpu_data
    fake.clear()
    assert mem.cpu_data().tolist() == [3, 3, 3, 3]
    assert mem.head is SYNCED
    assert mem.own_cpu_data
    assert fake.names() == ["host_zeros", "copy_to_host"]
    assert fake.copies == [("D2H", 4)]


def test_gpu_read(fake):
    # Caffe: TestGPURead
    mem = SyncedMemory(10)
    cpu_data = mem.mutable_cpu_data()
    assert mem.head is HEAD_AT_CPU
    cpu_data[:] = 1
    gpu_data = mem.gpu_data()
    assert mem.head is SYNCED
    assert np.asarray(gpu_data).tolist() == [1] * 10
    # do another round
    cpu_data = mem.mutable_cpu_data()
    assert mem.head is HEAD_AT_CPU
    cpu_data[:] = 2
    assert mem.cpu_data().tolist() == [2] * 10
    assert mem.head is HEAD_AT_CPU
    gpu_data = mem.gpu_data()
    assert mem.head is SYNCED
    assert np.asarray(gpu_data).tolist() == [2] * 10
    # The device buffer is allocated once (uninitialised: the copy fills it).
    assert fake.names().count("device_empty") == 1
    assert "device_zeros" not in fake.names()
    assert fake.copies == [("H2D", 10), ("H2D", 10)]


def test_gpu_write(fake):
    # Caffe: TestGPUWrite
    mem = SyncedMemory(10)
    gpu_data = mem.mutable_gpu_data()
    assert mem.head is HEAD_AT_GPU
    gpu_data[:] = 1
    cpu_data = mem.cpu_data()
    assert cpu_data.tolist() == [1] * 10
    assert mem.head is SYNCED

    gpu_data = mem.mutable_gpu_data()
    assert mem.head is HEAD_AT_GPU
    gpu_data[:] = 2
    cpu_data = mem.cpu_data()
    assert cpu_data.tolist() == [2] * 10
    assert mem.head is SYNCED
    assert fake.copies == [("D2H", 10), ("D2H", 10)]


def test_head_at_cpu_gpu_data_copies_once_then_synced(fake):
    mem = SyncedMemory(8)
    mem.mutable_cpu_data()[:] = np.arange(8, dtype=np.uint8)
    assert mem.head is HEAD_AT_CPU
    fake.clear()
    gpu = mem.gpu_data()
    assert mem.head is SYNCED
    assert fake.copies == [("H2D", 8)]
    assert np.asarray(gpu).tolist() == list(range(8))
    # A second read when SYNCED moves nothing, on either side.
    again = mem.gpu_data()
    assert mem.head is SYNCED
    assert np.shares_memory(gpu, again)
    assert mem.cpu_data().tolist() == list(range(8))
    assert mem.head is SYNCED
    assert fake.copies == [("H2D", 8)]


def test_head_at_gpu_cpu_data_copies_back_then_synced(fake):
    mem = SyncedMemory(6)
    mem.mutable_gpu_data()[:] = 4
    assert mem.head is HEAD_AT_GPU
    fake.clear()
    assert mem.cpu_data().tolist() == [4] * 6
    assert mem.head is SYNCED
    assert fake.copies == [("D2H", 6)]
    # SYNCED: neither read copies again.
    mem.cpu_data()
    assert mem.head is SYNCED
    mem.gpu_data()
    assert mem.head is SYNCED
    assert fake.copies == [("D2H", 6)]


def test_head_at_gpu_gpu_data_stays_at_gpu(fake):
    mem = SyncedMemory(4)
    mem.mutable_gpu_data()
    assert mem.head is HEAD_AT_GPU
    mem.gpu_data()
    assert mem.head is HEAD_AT_GPU
    assert fake.copies == []


def test_mutable_gpu_data_claims_head_from_every_state(fake):
    mem = SyncedMemory(4)
    # UNINITIALIZED
    mem.mutable_gpu_data()
    assert mem.head is HEAD_AT_GPU
    # SYNCED
    mem.cpu_data()
    assert mem.head is SYNCED
    mem.mutable_gpu_data()
    assert mem.head is HEAD_AT_GPU
    # HEAD_AT_CPU: the host bytes are copied first, then the head is claimed.
    mem.mutable_cpu_data()[:] = 8
    assert mem.head is HEAD_AT_CPU
    fake.clear()
    gpu = mem.mutable_gpu_data()
    assert mem.head is HEAD_AT_GPU
    assert fake.copies == [("H2D", 4)]
    assert np.asarray(gpu).tolist() == [8] * 4
    # HEAD_AT_GPU
    mem.mutable_gpu_data()
    assert mem.head is HEAD_AT_GPU
    assert fake.copies == [("H2D", 4)]


def test_mutable_cpu_data_claims_head_from_synced_and_gpu(fake):
    mem = SyncedMemory(3)
    mem.mutable_gpu_data()[:] = 1
    assert mem.head is HEAD_AT_GPU
    host = mem.mutable_cpu_data()
    assert mem.head is HEAD_AT_CPU
    assert host.tolist() == [1, 1, 1]
    mem.gpu_data()
    assert mem.head is SYNCED
    mem.mutable_cpu_data()
    assert mem.head is HEAD_AT_CPU
    assert fake.copies == [("D2H", 3), ("H2D", 3)]


def test_stale_host_copy_is_refreshed_not_reused(fake):
    mem = SyncedMemory(4)
    mem.mutable_cpu_data()[:] = 1
    mem.gpu_data()
    assert mem.head is SYNCED
    mem.mutable_gpu_data()[:] = 2
    assert mem.head is HEAD_AT_GPU
    assert mem.cpu_data().tolist() == [2] * 4
    assert mem.head is SYNCED


def test_async_gpu_push_needs_head_at_cpu_and_gives_synced(fake):
    # Caffe: async_gpu_push CHECKs head_ == HEAD_AT_CPU.
    mem = SyncedMemory(5)
    stream = fakegpu.FakeStream()
    with pytest.raises(BlobToolError, match="needs head HEAD_AT_CPU, head is UNINITIALIZED"):
        mem.async_gpu_push(stream)
    assert mem.head is UNINITIALIZED
    mem.mutable_cpu_data()[:] = 6
    assert mem.head is HEAD_AT_CPU
    fake.clear()
    mem.async_gpu_push(stream)
    assert mem.head is SYNCED
    assert mem.own_gpu_data
    assert fake.calls == [("device_empty", 5), ("copy_to_device_async", 5, stream)]
    assert fake.copies == [("H2D async", 5)]
    assert np.asarray(mem.gpu_data()).tolist() == [6] * 5
    assert mem.head is SYNCED
    with pytest.raises(BlobToolError, match="head is SYNCED"):
        mem.async_gpu_push(stream)
    assert mem.head is SYNCED
    mem.mutable_gpu_data()
    assert mem.head is HEAD_AT_GPU
    with pytest.raises(BlobToolError, match="head is HEAD_AT_GPU"):
        mem.async_gpu_push(stream)
    assert mem.head is HEAD_AT_GPU
    # A second push reuses the device buffer.
    mem.mutable_cpu_data()[:] = 7
    fake.clear()
    mem.async_gpu_push(stream)
    assert mem.head is SYNCED
    assert fake.names() == ["copy_to_device_async"]
    assert np.asarray(mem.gpu_data()).tolist() == [7] * 5


def test_set_gpu_data_adopts_device_memory(fake):
    mem = SyncedMemory(4)
    mem.mutable_cpu_data()[:] = 1
    mem.gpu_data()
    assert mem.head is SYNCED
    assert mem.own_gpu_data
    theirs = fake.device_array([9, 8, 7, 6, 5])
    mem.set_gpu_data(theirs)
    assert mem.head is HEAD_AT_GPU
    assert not mem.own_gpu_data
    gpu = mem.gpu_data()
    assert mem.head is HEAD_AT_GPU
    assert np.shares_memory(gpu, theirs)
    assert gpu.size == 4
    fake.clear()
    assert mem.cpu_data().tolist() == [9, 8, 7, 6]
    assert mem.head is SYNCED
    assert fake.copies == [("D2H", 4)]


def test_set_gpu_data_refuses_host_memory_and_small_arrays(fake):
    mem = SyncedMemory(4)
    with pytest.raises(DeviceError, match="expected a device array"):
        mem.set_gpu_data(np.zeros(4, dtype=np.uint8))
    with pytest.raises(DeviceError, match="holds 3 bytes, 4 needed"):
        mem.set_gpu_data(fake.device_array([1, 2, 3]))
    assert mem.head is UNINITIALIZED


def test_set_cpu_data_after_gpu_use_is_pushed_on_next_gpu_read(fake):
    mem = SyncedMemory(3)
    mem.mutable_gpu_data()[:] = 1
    mem.cpu_data()
    assert mem.head is SYNCED
    buf = np.array([4, 5, 6], dtype=np.uint8)
    mem.set_cpu_data(buf)
    assert mem.head is HEAD_AT_CPU
    fake.clear()
    assert np.asarray(mem.gpu_data()).tolist() == [4, 5, 6]
    assert mem.head is SYNCED
    # The existing device buffer is reused: one copy, no allocation.
    assert fake.names() == ["copy_to_device"]


def test_device_memory_stays_with_its_backend(fake):
    mem = SyncedMemory(2)
    mem.mutable_gpu_data()[:] = 5
    assert mem.head is HEAD_AT_GPU
    # Another device selected later: the copy still goes through the memory's
    # own backend (host memory may come from whichever is current).
    with fakegpu.installed() as other:
        assert mem.cpu_data().tolist() == [5, 5]
        assert mem.head is SYNCED
        assert other.copies == []
        assert "copy_to_host" not in other.names()
    assert fake.copies == [("D2H", 2)]


def test_check_device_refuses_memory_of_another_device(fake):
    # Caffe's check_device(): device memory is only used on its own device.
    mem = SyncedMemory(2)
    mem.gpu_data()
    assert mem.head is HEAD_AT_GPU
    fake.current = 1
    with pytest.raises(DeviceError, match="array device = 0 while current = 1"):
        mem.cpu_data()
    assert mem.head is HEAD_AT_GPU
    with pytest.raises(DeviceError):
        mem.mutable_gpu_data()
    assert mem.head is HEAD_AT_GPU
    fake.current = 0
    assert mem.cpu_data().tolist() == [0, 0]
    assert mem.head is SYNCED


# -- the whole state machine against a model of Caffe's table ---------------------


# Caffe's to_cpu()/to_gpu() as tables: state -> (new state, copy made).
TO_CPU = {
    UNINITIALIZED: (HEAD_AT_CPU, None),
    HEAD_AT_CPU: (HEAD_AT_CPU, None),
    HEAD_AT_GPU: (SYNCED, "D2H"),
    SYNCED: (SYNCED, None),
}
TO_GPU = {
    UNINITIALIZED: (HEAD_AT_GPU, None),
    HEAD_AT_CPU: (SYNCED, "H2D"),
    HEAD_AT_GPU: (HEAD_AT_GPU, None),
    SYNCED: (SYNCED, None),
}

SIZE = 6
byte_values = st.integers(min_value=0, max_value=255)


class SyncedMemoryMachine(RuleBasedStateMachine):
    """Random accessor sequences, checked against Caffe's head table and the bytes last written."""

    def __init__(self):
        super().__init__()
        self.backend = fakegpu.FakeBackend()
        self.previous = set_backend(self.backend)
        self.mem = SyncedMemory(SIZE)
        self.head = UNINITIALIZED
        self.content = [0] * SIZE

    def teardown(self):
        set_backend(self.previous)

    def _expect_copy(self, table):
        head, copy = table[self.head]
        before = len(self.backend.copies)
        return head, copy, before

    def _check_copies(self, copy, before):
        made = [c[0] for c in self.backend.copies[before:]]
        assert made == ([copy] if copy else [])

    @rule()
    def cpu_data(self):
        head, copy, before = self._expect_copy(TO_CPU)
        view = self.mem.cpu_data()
        self.head = head
        assert view.tolist() == self.content
        assert not view.flags.writeable
        self._check_copies(copy, before)

    @rule(value=byte_values)
    def mutable_cpu_data(self, value):
        _, copy, before = self._expect_copy(TO_CPU)
        view = self.mem.mutable_cpu_data()
        assert view.tolist() == self.content
        view[:] = value
        self.head = HEAD_AT_CPU
        self.content = [value] * SIZE
        self._check_copies(copy, before)

    @rule()
    def gpu_data(self):
        head, copy, before = self._expect_copy(TO_GPU)
        gpu = self.mem.gpu_data()
        self.head = head
        assert isinstance(gpu, fakegpu.DeviceArray)
        assert np.asarray(gpu).tolist() == self.content
        self._check_copies(copy, before)

    @rule(value=byte_values)
    def mutable_gpu_data(self, value):
        _, copy, before = self._expect_copy(TO_GPU)
        gpu = self.mem.mutable_gpu_data()
        assert np.asarray(gpu).tolist() == self.content
        gpu[:] = value
        self.head = HEAD_AT_GPU
        self.content = [value] * SIZE
        self._check_copies(copy, before)

    @rule(value=byte_values)
    def set_cpu_data(self, value):
        before = len(self.backend.copies)
        self.mem.set_cpu_data(np.full(SIZE, value, dtype=np.uint8))
        self.head = HEAD_AT_CPU
        self.content = [value] * SIZE
        assert not self.mem.own_cpu_data
        self._check_copies(None, before)

    @rule(value=byte_values)
    def set_gpu_data(self, value):
        before = len(self.backend.copies)
        self.mem.set_gpu_data(self.backend.device_array([value] * SIZE))
        self.head = HEAD_AT_GPU
        self.content = [value] * SIZE
        assert not self.mem.own_gpu_data
        self._check_copies(None, before)

    @precondition(lambda self: self.head is HEAD_AT_CPU)
    @rule()
    def async_gpu_push(self):
        before = len(self.backend.copies)
        self.mem.async_gpu_push(fakegpu.FakeStream())
        self.head = SYNCED
        made = [c[0] for c in self.backend.copies[before:]]
        assert made == ["H2D async"]

    @precondition(lambda self: self.head is not HEAD_AT_CPU)
    @rule()
    def async_gpu_push_refused(self):
        with pytest.raises(BlobToolError, match="needs head HEAD_AT_CPU"):
            self.mem.async_gpu_push(fakegpu.FakeStream())

    @invariant()
    def head_matches_caffe(self):
        assert self.mem.head is self.head


TestSyncedMemoryMachine = SyncedMemoryMachine.TestCase
TestSyncedMemoryMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


# -- release_gpu (blobtool extension): done with the device, keep the bytes ----------------

def test_release_gpu_brings_results_back_and_frees_the_device_copy(fake):
    mem = SyncedMemory(3)
    mem.mutable_cpu_data()[:] = 1
    mem.mutable_gpu_data()[:] = 4
    assert mem.head is HEAD_AT_GPU
    fake.clear()
    mem.release_gpu()
    assert mem.head is HEAD_AT_CPU
    assert fake.copies == [("D2H", 3)]
    assert mem.cpu_data().tolist() == [4, 4, 4]
    assert not mem.own_gpu_data
    # The next device read allocates and copies again: nothing stale is kept.
    fake.clear()
    assert np.asarray(mem.gpu_data()).tolist() == [4, 4, 4]
    assert fake.names() == ["device_empty", "copy_to_device"]
    assert mem.head is SYNCED


def test_release_gpu_of_a_synced_copy_moves_nothing(fake):
    mem = SyncedMemory(2)
    mem.mutable_cpu_data()[:] = 6
    mem.gpu_data()
    assert mem.head is SYNCED
    fake.clear()
    mem.release_gpu()
    assert mem.head is HEAD_AT_CPU
    assert fake.calls == []
    assert mem.cpu_data().tolist() == [6, 6]


def test_release_gpu_without_a_device_copy_changes_nothing():
    for mem in (SyncedMemory(2), SyncedMemory(2)):
        before = mem.head
        mem.release_gpu()
        assert mem.head is before
        mem.mutable_cpu_data()[:] = 3
        mem.release_gpu()
        assert mem.head is HEAD_AT_CPU and mem.cpu_data().tolist() == [3, 3]


def test_release_gpu_lets_an_adopted_array_go_unchanged(fake):
    mem = SyncedMemory(3)
    theirs = fake.device_array([7, 8, 9])
    mem.set_gpu_data(theirs)
    mem.release_gpu()
    assert mem.head is HEAD_AT_CPU
    assert mem.cpu_data().tolist() == [7, 8, 9]
    assert np.asarray(theirs).tolist() == [7, 8, 9]
