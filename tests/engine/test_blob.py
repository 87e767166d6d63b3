"""Blob, restating Caffe's src/caffe/test/test_blob.cpp (BlobSimpleTest, BlobMathTest)
and the asum/scale cases of test_math_functions.cpp applied to Blob.

BlobMathTest runs twice, as in Caffe: on the host, and "on the GPU" through
tests/helpers/fakegpu.py, whose recorded calls show which side did the work. The
head of the data and diff memory is asserted after every accessor.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fakegpu
from blobtool import Blob, BlobToolError, SyncedHead, kernels, work
from blobtool._pb.blobtool_caffe_pb2 import BlobProto, BlobShape
from blobtool.errors import DeviceError, FormatError
from builders import blob_proto

UNINITIALIZED = SyncedHead.UNINITIALIZED
HEAD_AT_CPU = SyncedHead.HEAD_AT_CPU
HEAD_AT_GPU = SyncedHead.HEAD_AT_GPU
SYNCED = SyncedHead.SYNCED

DTYPES = [np.float32, np.float64]
DTYPE_IDS = ["float32", "float64"]

# Caffe's BlobMathTest epsilon_.
EPSILON = 1e-6


# Every test here starts with no device backend (conftest's host_only).
pytestmark = pytest.mark.usefixtures("host_only")


@pytest.fixture
def host_calls(monkeypatch):
    """Record the host kernels Blob calls (name, element count)."""
    calls = []

    def spy(name):
        real = getattr(kernels, name)

        def wrapper(*args):
            array = args[0] if name != "axpy" else args[2]
            calls.append((name, array.size))
            return real(*args)
        monkeypatch.setattr(kernels, name, wrapper)

    for name in ("asum_sumsq", "scal", "axpy"):
        spy(name)
    return calls


def heads(blob):
    return blob.data_memory.head, blob.diff_memory.head


def uniform_fill(blob, seed=1701):
    """Caffe's UniformFiller(min=-3, max=3) on the data; the data head becomes HEAD_AT_CPU."""
    rng = np.random.default_rng(seed)
    blob.mutable_cpu_data()[:] = rng.uniform(-3, 3, blob.count)
    assert blob.data_memory.head is HEAD_AT_CPU


# -- BlobSimpleTest ------------------------------------------------------------------


def test_initialization():
    blob = Blob()
    preshaped = Blob(2, 3, 4, 5)
    assert preshaped.num == 2
    assert preshaped.channels == 3
    assert preshaped.height == 4
    assert preshaped.width == 5
    assert preshaped.count == 120
    assert preshaped.shape == (2, 3, 4, 5)
    assert preshaped.num_axes == 4
    assert blob.num_axes == 0
    assert blob.count == 0
    assert blob.shape == ()
    assert blob.data_memory is None and blob.diff_memory is None
    assert heads(preshaped) == (UNINITIALIZED, UNINITIALIZED)
    assert preshaped.data_memory.size == 120 * 4
    assert preshaped.nbytes == 480
    assert preshaped.shape_string() == "2 3 4 5 (120)"


def test_empty_blob_math_is_zero():
    blob = Blob()
    assert blob.asum_data() == 0
    assert blob.asum_diff() == 0
    assert blob.sumsq_data() == 0
    assert blob.sumsq_diff() == 0
    blob.scale_data(3)
    assert blob.cpu_data().size == 0
    assert blob.cpu_diff().size == 0
    with pytest.raises(BlobToolError, match="never initialised"):
        blob.update()


@pytest.mark.parametrize("make", [
    lambda: Blob([3, 2]),
    lambda: Blob((3, 2)),
    lambda: Blob(3, 2),
    lambda: Blob(np.array([3, 2])),
    lambda: Blob(BlobShape(dim=[3, 2])),
], ids=["list", "tuple", "args", "ndarray", "BlobShape"])
def test_shape_forms(make):
    blob = make()
    assert blob.shape == (3, 2)
    assert blob.count == 6
    assert blob.num_axes == 2
    assert heads(blob) == (UNINITIALIZED, UNINITIALIZED)


@pytest.mark.parametrize("dtype, itemsize", [(np.float32, 4), (np.float64, 8)], ids=DTYPE_IDS)
def test_dtype_sizes_memory(dtype, itemsize):
    blob = Blob(2, 3, dtype=dtype)
    assert blob.dtype == np.dtype(dtype)
    assert blob.data_memory.size == 6 * itemsize
    assert blob.diff_memory.size == 6 * itemsize
    data = blob.cpu_data()
    assert data.dtype == np.dtype(dtype)
    assert data.shape == (6,)


@pytest.mark.parametrize("dtype", [np.float16, np.int32, np.uint8, ">f4"])
def test_other_dtypes_are_refused(dtype):
    with pytest.raises(BlobToolError, match="float32 or float64"):
        Blob(2, dtype=dtype)


def test_pointers_cpu():
    # Caffe: TestPointersCPUGPU, the host half.
    blob = Blob(2, 3, 4, 5)
    assert blob.cpu_data() is not None
    assert heads(blob) == (HEAD_AT_CPU, UNINITIALIZED)
    assert blob.cpu_diff() is not None
    assert heads(blob) == (HEAD_AT_CPU, HEAD_AT_CPU)
    assert blob.mutable_cpu_data() is not None
    assert blob.mutable_cpu_diff() is not None
    assert heads(blob) == (HEAD_AT_CPU, HEAD_AT_CPU)


def test_pointers_gpu(fake):
    # Caffe: TestPointersCPUGPU, the device half.
    blob = Blob(2, 3, 4, 5)
    gpu = blob.gpu_data()
    assert heads(blob) == (HEAD_AT_GPU, UNINITIALIZED)
    assert isinstance(gpu, fakegpu.DeviceArray)
    assert gpu.dtype == np.float32 and gpu.shape == (120,)
    blob.gpu_diff()
    assert heads(blob) == (HEAD_AT_GPU, HEAD_AT_GPU)
    blob.cpu_data()
    assert heads(blob) == (SYNCED, HEAD_AT_GPU)
    blob.mutable_gpu_data()
    assert heads(blob) == (HEAD_AT_GPU, HEAD_AT_GPU)
    blob.mutable_cpu_diff()
    assert heads(blob) == (HEAD_AT_GPU, HEAD_AT_CPU)
    blob.mutable_gpu_diff()
    assert heads(blob) == (HEAD_AT_GPU, HEAD_AT_GPU)


@pytest.mark.parametrize("call", ["gpu_data", "gpu_diff", "mutable_gpu_data", "mutable_gpu_diff"])
def test_gpu_views_without_backend_raise_device_error(call):
    blob = Blob(2, 3)
    with pytest.raises(BlobToolError) as info:
        getattr(blob, call)()
    assert isinstance(info.value, DeviceError)
    assert info.value.exit_code == 4
    assert "GPU" in str(info.value)
    assert heads(blob) == (UNINITIALIZED, UNINITIALIZED)


def test_empty_blob_has_no_device_memory(fake):
    with pytest.raises(BlobToolError, match="empty blob has no device memory"):
        Blob().gpu_data()


def test_reshape():
    # Caffe: TestReshape
    blob = Blob()
    blob.reshape(2, 3, 4, 5)
    assert (blob.num, blob.channels, blob.height, blob.width) == (2, 3, 4, 5)
    assert blob.count == 120
    assert heads(blob) == (UNINITIALIZED, UNINITIALIZED)


def test_reshape_zero():
    # Caffe: TestReshapeZero
    blob = Blob()
    blob.reshape([0, 5])
    assert blob.count == 0
    assert blob.shape == (0, 5)
    assert blob.cpu_data().shape == (0,)
    assert blob.asum_data() == 0


def test_reshape_like():
    blob = Blob()
    blob.reshape_like(Blob(4, 1, 2))
    assert blob.shape == (4, 1, 2)
    assert blob.count == 8


def test_reshape_to_no_axes_is_a_scalar():
    blob = Blob()
    blob.reshape([])
    assert blob.num_axes == 0
    assert blob.count == 1
    assert (blob.num, blob.channels, blob.height, blob.width) == (1, 1, 1, 1)
    assert blob.offset([]) == 0
    blob.mutable_cpu_data()[0] = 2.5
    assert blob.data_at([]) == 2.5
    assert blob.data_at(0, 0, 0, 0) == 2.5
    assert blob.data.shape == ()
    assert blob.asum_data() == 2.5


def test_reshape_allows_32_axes():
    blob = Blob([1] * 32)
    assert blob.num_axes == 32
    assert blob.count == 1


BAD_SHAPES = [
    ("33 axes", [1] * 33, "at most 32 axes, got 33"),
    ("negative", [2, -1, 3], r"dimension 1 is negative \(-1\)"),
    ("float dim", [2.0, 3], "must be integers"),
    ("string", "ab", "must be integers"),
    ("not a sequence", [object()], "must be integers"),
]


@pytest.mark.parametrize("name, shape, message", BAD_SHAPES, ids=[s[0] for s in BAD_SHAPES])
def test_reshape_refuses(name, shape, message):
    blob = Blob(2, 3)
    memory = blob.data_memory
    with pytest.raises(BlobToolError, match=message):
        blob.reshape(shape)
    # The blob is unchanged.
    assert blob.shape == (2, 3)
    assert blob.count == 6
    assert blob.data_memory is memory


def test_reshape_keeps_memory_when_shrinking():
    blob = Blob(2, 3, 4, 5)
    blob.mutable_cpu_data()[:] = np.arange(120)
    data, diff = blob.data_memory, blob.diff_memory
    blob.reshape(2, 3)
    assert blob.count == 6
    assert blob.data_memory is data and blob.diff_memory is diff
    assert blob.cpu_data().tolist() == [0, 1, 2, 3, 4, 5]
    assert heads(blob) == (HEAD_AT_CPU, UNINITIALIZED)
    # Growing back within the capacity keeps the memory too.
    blob.reshape(4, 30)
    assert blob.data_memory is data
    assert blob.cpu_data().tolist() == list(range(120))
    # Past the capacity: new, uninitialised memory for both.
    blob.reshape(121)
    assert blob.data_memory is not data and blob.diff_memory is not diff
    assert heads(blob) == (UNINITIALIZED, UNINITIALIZED)
    assert blob.data_memory.size == 121 * 4
    assert blob.asum_data() == 0


def test_views_cover_count_not_capacity():
    blob = Blob(10)
    blob.mutable_cpu_data()[:] = 1
    blob.reshape(3)
    assert blob.cpu_data().shape == (3,)
    assert blob.asum_data() == 3.0
    assert blob.data.shape == (3,)


def test_count_range_and_canonical_axis():
    blob = Blob(2, 3, 4, 5)
    assert blob.count_range(0) == 120
    assert blob.count_range(1) == 60
    assert blob.count_range(1, 3) == 12
    assert blob.count_range(2, 2) == 1
    assert blob.canonical_axis_index(-1) == 3
    assert blob.canonical_axis_index(-4) == 0
    assert blob.canonical_axis_index(2) == 2
    for bad in [(3, 2), (-1, 2), (0, 5)]:
        with pytest.raises(BlobToolError, match="out of range"):
            blob.count_range(*bad)
    for axis in [4, -5]:
        with pytest.raises(BlobToolError, match="out of range"):
            blob.canonical_axis_index(axis)


# -- legacy accessors ----------------------------------------------------------------


@pytest.mark.parametrize("shape, legacy", [
    ((), (1, 1, 1, 1)),
    ((7,), (7, 1, 1, 1)),
    ((3, 2), (3, 2, 1, 1)),
    ((3, 2, 4), (3, 2, 4, 1)),
    ((3, 2, 4, 5), (3, 2, 4, 5)),
], ids=["0 axes", "1 axis", "2 axes", "3 axes", "4 axes"])
def test_legacy_accessors_pad_with_one(shape, legacy):
    blob = Blob(list(shape))
    assert (blob.num, blob.channels, blob.height, blob.width) == legacy
    # Negative indices count from the end, padding at the front (LegacyShape(-k)).
    padded = (1,) * (4 - len(shape)) + shape
    assert tuple(blob.legacy_shape(i) for i in (-4, -3, -2, -1)) == padded


def test_legacy_index_out_of_range():
    blob = Blob(2, 3)
    for index in (4, -5):
        with pytest.raises(BlobToolError, match=r"outside \[-4, 3\]"):
            blob.legacy_shape(index)


def test_legacy_accessors_refuse_more_than_four_axes():
    blob = Blob(1, 2, 3, 4, 5)
    for name in ("num", "channels", "height", "width"):
        with pytest.raises(BlobToolError, match="legacy accessors on a blob with 5 axes"):
            getattr(blob, name)
    with pytest.raises(BlobToolError, match="5 axes"):
        blob.offset(0, 0, 0, 0)
    with pytest.raises(BlobToolError, match="5 axes"):
        blob.data_at(0)
    # The list form is not legacy, so it works on 5 axes.
    assert blob.offset([0, 1, 2, 3, 4]) == (((0 * 2 + 1) * 3 + 2) * 4 + 3) * 5 + 4


# -- offset, data_at, diff_at ------------------------------------------------------------


def test_offset_both_forms():
    blob = Blob(2, 3, 4, 5)
    assert blob.offset(0) == 0
    assert blob.offset(1) == 60
    assert blob.offset(1, 2) == 100
    assert blob.offset(1, 2, 3) == 115
    assert blob.offset(1, 2, 3, 4) == 119
    assert blob.offset(0, 1, 0, 2) == 22
    assert blob.offset([1, 2, 3, 4]) == 119
    assert blob.offset([1, 2]) == 100
    assert blob.offset((1,)) == 60
    assert blob.offset([]) == 0
    # 4-arg form on fewer axes: the legacy dims are padded with 1.
    assert Blob(3, 2).offset(2, 1) == 5


BAD_OFFSETS = [
    ("n == num", (2, 0, 0, 0), r"n=2 out of range \[0, 2\)"),
    ("negative n", (-1, 0, 0, 0), r"n=-1 out of range"),
    ("w == width", (0, 0, 0, 5), r"w=5 out of range \[0, 5\)"),
    ("c too big", (0, 3, 0, 0), r"c=3 out of range \[0, 3\)"),
    ("list too long", ([0, 0, 0, 0, 0],), "5 indices for a 4-axis blob"),
    ("list index too big", ([0, 3],), "index 3 out of range for axis 1 of size 3"),
    ("list index negative", ([0, 0, -1],), "index -1 out of range for axis 2"),
]


@pytest.mark.parametrize("name, args, message", BAD_OFFSETS, ids=[b[0] for b in BAD_OFFSETS])
def test_offset_refuses(name, args, message):
    blob = Blob(2, 3, 4, 5)
    with pytest.raises(BlobToolError, match=message):
        blob.offset(*args)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_offset_matches_numpy_ravel(data):
    shape = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=6), label="shape")
    index = [data.draw(st.integers(0, d - 1)) for d in shape]
    prefix = data.draw(st.integers(0, len(shape)), label="prefix")
    blob = Blob(shape)
    full = int(np.ravel_multi_index(index, shape))
    assert blob.offset(index) == full
    # A prefix of indices leaves the remaining axes at 0 (Caffe's offset(vector)).
    partial = index[:prefix] + [0] * (len(shape) - prefix)
    assert blob.offset(index[:prefix]) == int(np.ravel_multi_index(partial, shape))
    if len(shape) <= 4:
        assert blob.offset(*index) == full


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_data_at_and_diff_at(dtype):
    blob = Blob(2, 3, 4, 5, dtype=dtype)
    blob.mutable_cpu_data()[:] = np.arange(120)
    blob.mutable_cpu_diff()[:] = -np.arange(120) / 2
    assert heads(blob) == (HEAD_AT_CPU, HEAD_AT_CPU)
    assert blob.data_at(1, 2, 3, 4) == 119.0
    assert blob.data_at([1, 2, 3, 4]) == 119.0
    assert blob.data_at(0, 1, 0, 2) == 22.0
    assert blob.data_at([1]) == 60.0
    assert blob.diff_at(1, 2, 3, 4) == -59.5
    assert blob.diff_at([0, 0, 0, 3]) == -1.5
    assert isinstance(blob.data_at(1), float)
    assert heads(blob) == (HEAD_AT_CPU, HEAD_AT_CPU)


def test_data_at_on_never_written_memory_reads_zero_and_allocates():
    blob = Blob(2, 2)
    assert blob.data_at(1, 1) == 0.0
    assert heads(blob) == (HEAD_AT_CPU, UNINITIALIZED)
    assert blob.diff_at([0, 1]) == 0.0
    assert heads(blob) == (HEAD_AT_CPU, HEAD_AT_CPU)


# -- host views ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_cpu_data_and_cpu_diff_are_read_only(dtype):
    blob = Blob(2, 3, dtype=dtype)
    data = blob.cpu_data()
    assert heads(blob) == (HEAD_AT_CPU, UNINITIALIZED)
    assert data.dtype == np.dtype(dtype) and data.shape == (6,)
    assert not data.flags.writeable
    assert not data.any()
    with pytest.raises(ValueError):
        data[0] = 1
    diff = blob.cpu_diff()
    assert heads(blob) == (HEAD_AT_CPU, HEAD_AT_CPU)
    assert not diff.flags.writeable
    assert not np.shares_memory(data, diff)


def test_mutable_views_write_through():
    blob = Blob(2, 3)
    blob.mutable_cpu_data()[:] = 1.5
    blob.mutable_cpu_diff()[:] = -2
    assert heads(blob) == (HEAD_AT_CPU, HEAD_AT_CPU)
    assert blob.cpu_data().tolist() == [1.5] * 6
    assert blob.cpu_diff().tolist() == [-2.0] * 6


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_data_and_diff_properties_are_shaped_writable_views(dtype):
    blob = Blob(2, 3, 4, dtype=dtype)
    data = blob.data
    assert heads(blob) == (HEAD_AT_CPU, UNINITIALIZED)
    assert data.shape == (2, 3, 4)
    assert data.dtype == np.dtype(dtype)
    assert data.flags.writeable
    data[1, 2, 3] = 7
    assert blob.data_at(1, 2, 3) == 7
    assert blob.cpu_data()[23] == 7
    assert np.shares_memory(data, blob.cpu_data())
    diff = blob.diff
    assert heads(blob) == (HEAD_AT_CPU, HEAD_AT_CPU)
    assert diff.shape == (2, 3, 4)
    diff[0, 0, 1] = -3
    assert blob.diff_at(0, 0, 1) == -3
    assert blob.asum_diff() == 3


def test_data_property_claims_head_from_gpu(fake):
    blob = Blob(2, 2)
    blob.mutable_gpu_data()[:] = 4
    assert heads(blob) == (HEAD_AT_GPU, UNINITIALIZED)
    data = blob.data
    assert heads(blob) == (HEAD_AT_CPU, UNINITIALIZED)
    assert data.tolist() == [[4, 4], [4, 4]]
    assert fake.copies == [("D2H", 16)]


# -- set_cpu_data / set_cpu_diff ---------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_set_cpu_data_adopts_without_copying(dtype):
    blob = Blob(2, 3, dtype=dtype)
    values = np.arange(6, dtype=dtype)
    blob.set_cpu_data(values)
    assert heads(blob) == (HEAD_AT_CPU, UNINITIALIZED)
    assert not blob.data_memory.own_cpu_data
    assert np.shares_memory(blob.cpu_data(), values)
    assert blob.data_at(1, 2) == 5
    values[5] = 50
    assert blob.data_at(1, 2) == 50
    diff = np.ones(6, dtype=dtype)
    blob.set_cpu_diff(diff)
    assert heads(blob) == (HEAD_AT_CPU, HEAD_AT_CPU)
    assert np.shares_memory(blob.cpu_diff(), diff)
    blob.update()
    assert values.tolist() == [-1, 0, 1, 2, 3, 49]


def test_set_cpu_data_refuses_wrong_dtype_or_size():
    blob = Blob(2, 3)
    with pytest.raises(BlobToolError, match="dtype float64 differs"):
        blob.set_cpu_data(np.zeros(6, dtype=np.float64))
    with pytest.raises(BlobToolError, match="has 5 elements, the blob 6"):
        blob.set_cpu_data(np.zeros(5, dtype=np.float32))
    with pytest.raises(BlobToolError, match="C-contiguous"):
        blob.set_cpu_diff(np.zeros(12, dtype=np.float32)[::2])
    assert heads(blob) == (UNINITIALIZED, UNINITIALIZED)


def test_set_cpu_data_after_shrinking_reallocates_like_caffe():
    # Caffe's Blob::set_cpu_data: when data_->size() != count_ * sizeof(Dtype)
    # (the blob shrank below its capacity) data and diff are reallocated at
    # the new size before the buffer is adopted.
    blob = Blob(4, 5)
    blob.mutable_cpu_data()[:] = 1
    blob.reshape(2, 5)
    values = np.arange(10, dtype=np.float32)
    blob.set_cpu_data(values)
    assert blob.data_memory.size == 40
    assert blob.diff_memory.size == 40
    assert heads(blob) == (HEAD_AT_CPU, UNINITIALIZED)
    assert np.shares_memory(blob.cpu_data(), values)
    assert blob.asum_data() == 45
    # Growing again past the adopted size reallocates instead of reading
    # beyond the adopted buffer.
    blob.reshape(4, 5)
    assert blob.data_memory.size == 80
    assert blob.cpu_data().shape == (20,)
    # set_cpu_diff resizes only the diff (Blob::set_cpu_diff).
    blob.reshape(1, 5)
    data_memory = blob.data_memory
    diff = np.full(5, 2, dtype=np.float32)
    blob.set_cpu_diff(diff)
    assert blob.diff_memory.size == 20
    assert blob.data_memory is data_memory
    assert np.shares_memory(blob.cpu_diff(), diff)
    assert blob.asum_diff() == 10


def test_fill_from_adopts_into_a_blob_with_larger_capacity():
    # The codec's path (fill_from with adopt): the payload view is adopted
    # even when the blob already held more memory than the new count.
    blob = Blob(10)
    blob.mutable_cpu_data()[:] = 9
    values = np.arange(4, dtype=np.float32)
    diff = np.ones(4, dtype=np.float32)
    blob.fill_from((2, 2), values, diff, adopt=True)
    assert blob.shape == (2, 2)
    assert heads(blob) == (HEAD_AT_CPU, HEAD_AT_CPU)
    assert np.shares_memory(blob.cpu_data(), values)
    assert np.shares_memory(blob.cpu_diff(), diff)
    assert blob.data.tolist() == [[0, 1], [2, 3]]
    # A different dtype cannot be adopted: it is copied and converted.
    wide = np.arange(4, dtype=np.float64)
    blob.fill_from((4,), wide, None, adopt=True)
    assert not np.shares_memory(blob.cpu_data(), wide)
    assert blob.cpu_data().tolist() == [0, 1, 2, 3]


# -- share_data / share_diff -----------------------------------------------------------------


def test_share_data_and_diff():
    source = Blob(2, 3)
    source.mutable_cpu_data()[:] = 5
    other = Blob(6)
    own_diff = other.diff_memory
    other.share_data(source)
    assert other.data_memory is source.data_memory
    assert other.diff_memory is own_diff
    assert other.cpu_data().tolist() == [5] * 6
    other.mutable_cpu_data()[0] = -1
    assert source.data_at(0, 0) == -1
    other.share_diff(source)
    assert other.diff_memory is source.diff_memory
    source.mutable_cpu_diff()[:] = 1
    assert other.asum_diff() == 6
    # Shapes may differ; only the counts must match (Blob::ShareData).
    assert other.shape == (6,)


def test_share_refuses_count_or_dtype_mismatch():
    blob = Blob(2, 3)
    memory = blob.data_memory
    with pytest.raises(BlobToolError, match=r"share_data: counts differ \(6 vs 7\)"):
        blob.share_data(Blob(7))
    with pytest.raises(BlobToolError, match=r"share_diff: counts differ \(6 vs 5\)"):
        blob.share_diff(Blob(5))
    with pytest.raises(BlobToolError, match="dtypes differ"):
        blob.share_data(Blob(6, dtype=np.float64))
    assert blob.data_memory is memory


# -- BlobMathTest: the host and the (fake) device ----------------------------------------------


def to_device(blob, fake, which):
    """Do a mutable access on the current device, as BlobMathTest does, so the math runs there."""
    if fake is None:
        getattr(blob, f"mutable_cpu_{which}")()
        return HEAD_AT_CPU
    getattr(blob, f"mutable_gpu_{which}")()
    return HEAD_AT_GPU


@pytest.fixture(params=["cpu", "gpu"])
def device(request):
    """None for Caffe::CPU; a FakeBackend for Caffe::GPU."""
    if request.param == "cpu":
        yield None
    else:
        with fakegpu.installed() as backend:
            yield backend


def math_calls(fake, name):
    return [] if fake is None else [c for c in fake.calls if c[0] == name]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_sum_of_squares(dtype, device, host_calls):
    # Caffe: BlobMathTest.TestSumOfSquares
    blob = Blob(2, 3, 4, 5, dtype=dtype)
    # Uninitialized Blob should have sum of squares == 0.
    assert blob.sumsq_data() == 0
    assert blob.sumsq_diff() == 0
    assert heads(blob) == (UNINITIALIZED, UNINITIALIZED)
    uniform_fill(blob)
    data = blob.cpu_data()
    expected_sumsq = math.fsum(float(x) * float(x) for x in data)
    head = to_device(blob, device, "data")
    assert heads(blob) == (head, UNINITIALIZED)
    host_calls.clear()
    got = blob.sumsq_data()
    assert got == pytest.approx(expected_sumsq, rel=EPSILON)
    assert heads(blob) == (head, UNINITIALIZED)
    if device is None:
        assert host_calls == [("asum_sumsq", 120)]
    else:
        assert host_calls == []
        assert math_calls(device, "asum_sumsq") == [("asum_sumsq", 120)]
    assert blob.sumsq_diff() == 0
    assert heads(blob) == (head, UNINITIALIZED)

    # Check sumsq_diff too.
    diff_scale = 7
    blob.mutable_cpu_diff()[:] = diff_scale * blob.cpu_data()
    # Reading the data on the host syncs it when the device copy was newer.
    read_head = HEAD_AT_CPU if device is None else SYNCED
    assert heads(blob) == (read_head, HEAD_AT_CPU)
    to_device(blob, device, "diff")
    assert heads(blob) == (read_head, head)
    assert blob.sumsq_data() == pytest.approx(expected_sumsq, rel=EPSILON)
    expected_sumsq_diff = expected_sumsq * diff_scale * diff_scale
    assert blob.sumsq_diff() == pytest.approx(expected_sumsq_diff, rel=EPSILON)
    assert heads(blob) == (read_head, head)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_asum(dtype, device, host_calls):
    # Caffe: BlobMathTest.TestAsum
    blob = Blob(2, 3, 4, 5, dtype=dtype)
    # Uninitialized Blob should have asum == 0.
    assert blob.asum_data() == 0
    assert blob.asum_diff() == 0
    assert heads(blob) == (UNINITIALIZED, UNINITIALIZED)
    uniform_fill(blob)
    data = blob.cpu_data()
    expected_asum = math.fsum(abs(float(x)) for x in data)
    head = to_device(blob, device, "data")
    host_calls.clear()
    assert blob.asum_data() == pytest.approx(expected_asum, rel=EPSILON)
    assert heads(blob) == (head, UNINITIALIZED)
    if device is None:
        assert host_calls == [("asum_sumsq", 120)]
    else:
        assert host_calls == []
        assert math_calls(device, "asum_sumsq") == [("asum_sumsq", 120)]
    assert blob.asum_diff() == 0
    assert heads(blob) == (head, UNINITIALIZED)

    # Check asum_diff too.
    diff_scale = 7
    blob.mutable_cpu_diff()[:] = diff_scale * blob.cpu_data()
    # Reading the data on the host syncs it when the device copy was newer.
    read_head = HEAD_AT_CPU if device is None else SYNCED
    assert heads(blob) == (read_head, HEAD_AT_CPU)
    to_device(blob, device, "diff")
    assert heads(blob) == (read_head, head)
    assert blob.asum_data() == pytest.approx(expected_asum, rel=EPSILON)
    expected_diff_asum = expected_asum * diff_scale
    assert blob.asum_diff() == pytest.approx(expected_diff_asum, rel=EPSILON)
    assert heads(blob) == (read_head, head)
    asum, sumsq = blob.asum_sumsq_data()
    assert asum == pytest.approx(expected_asum, rel=EPSILON)
    assert sumsq == pytest.approx(math.fsum(float(x) ** 2 for x in data), rel=EPSILON)
    assert blob.asum_sumsq_diff()[0] == pytest.approx(expected_diff_asum, rel=EPSILON)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_scale_data(dtype, device, host_calls):
    # Caffe: BlobMathTest.TestScaleData
    blob = Blob(2, 3, 4, 5, dtype=dtype)
    # Uninitialized Blob should have asum == 0; scaling it changes nothing.
    assert blob.asum_data() == 0
    assert blob.asum_diff() == 0
    blob.scale_data(3)
    blob.scale_diff(3)
    assert heads(blob) == (UNINITIALIZED, UNINITIALIZED)
    assert host_calls == [] and math_calls(device, "scal") == []
    uniform_fill(blob)
    asum_before_scale = blob.asum_data()
    before = blob.cpu_data().copy()
    head = to_device(blob, device, "data")
    data_scale = 3
    host_calls.clear()
    blob.scale_data(data_scale)
    assert heads(blob) == (head, UNINITIALIZED)
    if device is None:
        assert host_calls == [("scal", 120)]
    else:
        assert host_calls == []
        assert math_calls(device, "scal") == [("scal", 120, data_scale)]
    assert blob.asum_data() == pytest.approx(asum_before_scale * data_scale, rel=EPSILON)
    assert blob.asum_diff() == 0
    # The product is formed in the blob's dtype, value by value.
    assert np.array_equal(blob.cpu_data(), before * dtype(data_scale))

    # Check scale_diff too.
    data_to_diff = 7
    blob.mutable_cpu_diff()[:] = data_to_diff * blob.cpu_data()
    expected_asum_before_scale = asum_before_scale * data_scale
    assert blob.asum_data() == pytest.approx(expected_asum_before_scale, rel=EPSILON)
    expected_diff_asum_before_scale = asum_before_scale * data_scale * data_to_diff
    assert blob.asum_diff() == pytest.approx(expected_diff_asum_before_scale, rel=EPSILON)
    read_head = HEAD_AT_CPU if device is None else SYNCED
    assert heads(blob) == (read_head, HEAD_AT_CPU)
    to_device(blob, device, "diff")
    assert heads(blob) == (read_head, head)
    diff_scale = 3
    blob.scale_diff(diff_scale)
    assert heads(blob) == (read_head, head)
    assert blob.asum_data() == pytest.approx(asum_before_scale * data_scale, rel=EPSILON)
    expected_diff_asum = expected_diff_asum_before_scale * diff_scale
    assert blob.asum_diff() == pytest.approx(expected_diff_asum, rel=EPSILON)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_update(dtype, device, host_calls):
    # Caffe: Blob::Update, data -= diff where the data's head is.
    blob = Blob(3, 4, dtype=dtype)
    rng = np.random.default_rng(5)
    data = rng.uniform(-3, 3, 12).astype(dtype)
    diff = rng.uniform(-3, 3, 12).astype(dtype)
    blob.mutable_cpu_data()[:] = data
    blob.mutable_cpu_diff()[:] = diff
    head = to_device(blob, device, "data")
    to_device(blob, device, "diff")
    host_calls.clear()
    blob.update()
    assert heads(blob) == (head, head)
    if device is None:
        assert host_calls == [("axpy", 12)]
    else:
        assert host_calls == []
        assert math_calls(device, "axpy") == [("axpy", 12, -1.0)]
    assert np.array_equal(blob.cpu_data(), data - diff)
    assert np.array_equal(blob.cpu_diff(), diff)


def test_update_with_uninitialized_diff_leaves_data():
    blob = Blob(4)
    blob.mutable_cpu_data()[:] = [1, 2, 3, 4]
    blob.update()
    assert heads(blob) == (HEAD_AT_CPU, HEAD_AT_CPU)
    assert blob.cpu_data().tolist() == [1, 2, 3, 4]


def test_update_on_uninitialized_data_raises():
    # Caffe: LOG(FATAL) << "Syncedmem not initialized."
    blob = Blob(4)
    with pytest.raises(BlobToolError, match="never initialised"):
        blob.update()
    assert heads(blob) == (UNINITIALIZED, UNINITIALIZED)


# -- where the math runs, on the fake device, by head ---------------------------------------------


def test_math_on_synced_data_runs_on_device(fake, host_calls):
    blob = Blob(2, 5)
    blob.mutable_cpu_data()[:] = np.arange(10) - 4.5
    blob.gpu_data()
    assert heads(blob) == (SYNCED, UNINITIALIZED)
    fake.clear()
    assert blob.asum_data() == 25.0
    assert blob.sumsq_data() == math.fsum((x - 4.5) ** 2 for x in range(10))
    assert heads(blob) == (SYNCED, UNINITIALIZED)
    assert fake.names() == ["asum_sumsq", "asum_sumsq"]
    assert fake.copies == []
    assert host_calls == []
    # scale claims the device copy (mutable_gpu_data): the host one is stale.
    blob.scale_data(2)
    assert heads(blob) == (HEAD_AT_GPU, UNINITIALIZED)
    assert fake.names()[-1] == "scal"
    assert host_calls == []
    fake.clear()
    assert blob.cpu_data().tolist() == [2 * (x - 4.5) for x in range(10)]
    assert heads(blob) == (SYNCED, UNINITIALIZED)
    assert fake.copies == [("D2H", 40)]


def test_math_on_head_at_cpu_runs_on_host_even_with_a_gpu(fake, host_calls):
    blob = Blob(8)
    blob.mutable_cpu_data()[:] = -1
    blob.gpu_data()
    blob.mutable_cpu_data()
    assert heads(blob) == (HEAD_AT_CPU, UNINITIALIZED)
    fake.clear()
    assert blob.asum_data() == 8
    blob.scale_data(0.5)
    assert blob.sumsq_data() == 2
    assert heads(blob) == (HEAD_AT_CPU, UNINITIALIZED)
    assert host_calls == [("asum_sumsq", 8), ("scal", 8), ("asum_sumsq", 8)]
    assert fake.calls == []


def test_update_on_device_pushes_the_diff(fake, host_calls):
    blob = Blob(4)
    blob.mutable_cpu_data()[:] = [10, 20, 30, 40]
    blob.gpu_data()
    blob.mutable_cpu_diff()[:] = [1, 2, 3, 4]
    assert heads(blob) == (SYNCED, HEAD_AT_CPU)
    fake.clear()
    blob.update()
    # The diff is read on the device (copied up, SYNCED), the data claimed there.
    assert heads(blob) == (HEAD_AT_GPU, SYNCED)
    assert fake.copies == [("H2D", 16)]
    assert fake.names()[-1] == "axpy"
    assert host_calls == []
    assert blob.cpu_data().tolist() == [9, 18, 27, 36]
    assert heads(blob) == (SYNCED, SYNCED)


def test_update_on_host_pulls_the_diff(fake, host_calls):
    blob = Blob(3)
    blob.mutable_cpu_data()[:] = [5, 5, 5]
    blob.mutable_gpu_diff()[:] = 1
    assert heads(blob) == (HEAD_AT_CPU, HEAD_AT_GPU)
    fake.clear()
    blob.update()
    assert heads(blob) == (HEAD_AT_CPU, SYNCED)
    assert fake.copies == [("D2H", 12)]
    assert host_calls == [("axpy", 3)]
    assert blob.cpu_data().tolist() == [4, 4, 4]


def test_diff_math_follows_the_diff_head_not_the_data_head(fake, host_calls):
    blob = Blob(3)
    blob.mutable_cpu_data()[:] = 1
    blob.mutable_gpu_diff()[:] = -2
    assert heads(blob) == (HEAD_AT_CPU, HEAD_AT_GPU)
    fake.clear()
    assert blob.asum_data() == 3
    assert blob.asum_diff() == 6
    assert heads(blob) == (HEAD_AT_CPU, HEAD_AT_GPU)
    assert host_calls == [("asum_sumsq", 3)]
    assert fake.names() == ["asum_sumsq"]


def test_device_math_on_a_shrunk_blob_covers_count_only(fake):
    blob = Blob(10)
    blob.mutable_gpu_data()[:] = 1
    blob.reshape(4)
    fake.clear()
    assert blob.asum_data() == 4
    assert fake.calls == [("asum_sumsq", 4)]
    blob.scale_data(3)
    assert blob.cpu_data().tolist() == [3, 3, 3, 3]


# -- test_math_functions.cpp, applied to Blob ------------------------------------------------------


@pytest.fixture
def gaussian_blob(request):
    """MathFunctionsTest's blob_bottom_: 11 x 17 x 19 x 23, Gaussian data."""
    dtype = request.param
    blob = Blob(11, 17, 19, 23, dtype=dtype)
    rng = np.random.default_rng(1234)
    blob.mutable_cpu_data()[:] = rng.standard_normal(blob.count)
    blob.mutable_cpu_diff()[:] = rng.standard_normal(blob.count)
    return blob


@pytest.mark.parametrize("gaussian_blob", DTYPES, ids=DTYPE_IDS, indirect=True)
def test_math_functions_asum(gaussian_blob):
    # Caffe: MathFunctionsTest.TestAsum (relative error under 1e-2); the
    # float64 accumulation here is far closer than that.
    x = gaussian_blob.cpu_data()
    std_asum = math.fsum(np.abs(x.astype(np.float64)))
    cpu_asum = gaussian_blob.asum_data()
    assert abs(cpu_asum - std_asum) / std_asum < 1e-2
    assert cpu_asum == pytest.approx(std_asum, rel=1e-12)
    assert heads(gaussian_blob) == (HEAD_AT_CPU, HEAD_AT_CPU)


@pytest.mark.parametrize("gaussian_blob", DTYPES, ids=DTYPE_IDS, indirect=True)
def test_math_functions_scale(gaussian_blob):
    # Caffe: MathFunctionsTest.TestScale: every scaled value equals x * alpha
    # exactly, in the blob's dtype.
    dtype = gaussian_blob.dtype.type
    alpha = gaussian_blob.cpu_diff()[12345]
    x = gaussian_blob.cpu_data().copy()
    gaussian_blob.scale_data(alpha)
    assert heads(gaussian_blob) == (HEAD_AT_CPU, HEAD_AT_CPU)
    scaled = gaussian_blob.cpu_data()
    assert scaled.dtype == dtype
    assert np.array_equal(scaled, x * dtype(alpha))


def test_float64_accumulation_on_two_million_float32_values():
    rng = np.random.default_rng(99)
    values = (rng.standard_normal(2_000_000) * 3 + 0.25).astype(np.float32)
    blob = Blob(2000, 1000)
    blob.mutable_cpu_data()[:] = values
    wide = values.astype(np.float64)
    expected_asum = math.fsum(np.abs(wide))
    expected_sumsq = math.fsum(wide * wide)
    assert blob.asum_data() == pytest.approx(expected_asum, rel=1e-9)
    assert blob.sumsq_data() == pytest.approx(expected_sumsq, rel=1e-9)
    assert blob.asum_sumsq_data() == (blob.asum_data(), blob.sumsq_data())
    assert heads(blob) == (HEAD_AT_CPU, UNINITIALIZED)


finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
finite64 = st.floats(min_value=-1e150, max_value=1e150, allow_nan=False, allow_infinity=False)


def finite_arrays(dtype, max_size=64):
    elements = finite32 if dtype == np.float32 else finite64
    return hnp.arrays(dtype, st.integers(1, max_size), elements=elements)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_asum_sumsq_match_exact_sums(dtype, data):
    values = data.draw(finite_arrays(dtype))
    blob = Blob(values.size, dtype=dtype)
    blob.mutable_cpu_data()[:] = values
    wide = values.astype(np.float64)
    assert blob.asum_data() == pytest.approx(math.fsum(np.abs(wide)), rel=1e-12, abs=1e-300)
    assert blob.sumsq_data() == pytest.approx(math.fsum(wide * wide), rel=1e-12, abs=1e-300)
    assert heads(blob) == (HEAD_AT_CPU, UNINITIALIZED)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@settings(max_examples=100, deadline=None)
@given(data=st.data(), factor=st.floats(-1e3, 1e3, allow_nan=False))
def test_scale_and_update_match_numpy_in_dtype(dtype, data, factor):
    values = data.draw(finite_arrays(dtype))
    step = data.draw(hnp.arrays(dtype, values.size, elements=st.floats(-1e3, 1e3, width=32)))
    blob = Blob(values.size, dtype=dtype)
    blob.mutable_cpu_data()[:] = values
    blob.mutable_cpu_diff()[:] = step
    with np.errstate(over="ignore"):
        blob.scale_data(factor)
        scaled = values * dtype(factor)
        assert np.array_equal(blob.cpu_data(), scaled)
        blob.update()
        assert np.array_equal(blob.cpu_data(), scaled - step)
    assert heads(blob) == (HEAD_AT_CPU, HEAD_AT_CPU)


# -- shape_equals ------------------------------------------------------------------------------------


def test_legacy_blob_proto_shape_equals():
    # Caffe: BlobSimpleTest.TestLegacyBlobProtoShapeEquals
    blob = Blob()
    # Reshape to (3 x 2).
    blob.reshape([3, 2])
    # (3 x 2) blob == (1 x 1 x 3 x 2) legacy blob
    assert blob.shape_equals(blob_proto(shape=(1, 1, 3, 2), layout="legacy"))
    # (3 x 2) blob != (0 x 1 x 3 x 2) legacy blob
    assert not blob.shape_equals(blob_proto(shape=(0, 1, 3, 2), layout="legacy"))
    # (3 x 2) blob != (3 x 1 x 3 x 2) legacy blob
    assert not blob.shape_equals(blob_proto(shape=(3, 1, 3, 2), layout="legacy"))
    # Reshape to (1 x 3 x 2).
    blob.reshape([1, 3, 2])
    # (1 x 3 x 2) blob == (1 x 1 x 3 x 2) legacy blob
    assert blob.shape_equals(blob_proto(shape=(1, 1, 3, 2), layout="legacy"))
    # Reshape to (2 x 3 x 2).
    blob.reshape([2, 3, 2])
    # (2 x 3 x 2) blob != (1 x 1 x 3 x 2) legacy blob
    assert not blob.shape_equals(blob_proto(shape=(1, 1, 3, 2), layout="legacy"))


def test_shape_equals_with_shape_field():
    blob = Blob(3, 2)
    assert blob.shape_equals(BlobProto(shape=BlobShape(dim=[3, 2])))
    assert not blob.shape_equals(BlobProto(shape=BlobShape(dim=[2, 3])))
    assert not blob.shape_equals(BlobProto(shape=BlobShape(dim=[1, 3, 2])))
    assert not blob.shape_equals(BlobProto())
    assert Blob([]).shape_equals(BlobProto())


def test_shape_equals_legacy_fields_win_over_shape():
    blob = Blob(3, 2)
    proto = blob_proto(shape=(1, 1, 3, 2), layout="legacy")
    proto.shape.dim.extend([7])
    assert blob.shape_equals(proto)
    # One legacy field present is enough; the others are 0.
    assert not blob.shape_equals(BlobProto(width=2, shape=BlobShape(dim=[3, 2])))
    assert Blob(0, 0, 0, 2).shape_equals(BlobProto(width=2))


def test_shape_equals_five_axes_vs_legacy_is_false():
    blob = Blob(1, 1, 1, 3, 2)
    assert not blob.shape_equals(blob_proto(shape=(1, 1, 3, 2), layout="legacy"))
    assert blob.shape_equals(BlobProto(shape=BlobShape(dim=[1, 1, 1, 3, 2])))


# -- from_proto / to_proto ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_from_proto_shape_and_data(dtype):
    proto = BlobProto(shape=BlobShape(dim=[2, 3]), data=[0.5, -1, 2, 3, 4, 5])
    blob = Blob(dtype=dtype)
    blob.from_proto(proto)
    assert blob.shape == (2, 3)
    assert blob.dtype == np.dtype(dtype)
    assert heads(blob) == (HEAD_AT_CPU, UNINITIALIZED)
    assert blob.cpu_data().tolist() == [0.5, -1, 2, 3, 4, 5]
    assert heads(blob) == (HEAD_AT_CPU, UNINITIALIZED)
    assert blob.asum_diff() == 0


def test_from_proto_legacy_dims_win():
    proto = BlobProto(num=1, channels=2, height=1, width=3, shape=BlobShape(dim=[6]), data=range(6))
    blob = Blob()
    blob.from_proto(proto)
    assert blob.shape == (1, 2, 1, 3)
    assert blob.data_at(0, 1, 0, 2) == 5


def test_from_proto_one_legacy_field_makes_a_legacy_shape():
    # Any legacy field present (even set to its default) means the shape is
    # (num, channels, height, width), the absent ones 0.
    proto = BlobProto(num=0, shape=BlobShape(dim=[2]), data=[1, 2])
    with pytest.raises(BlobToolError, match=r"data holds 2 values, shape \(0, 0, 0, 0\) needs 0"):
        Blob().from_proto(proto)
    proto = BlobProto(height=2, shape=BlobShape(dim=[5]))
    blob = Blob()
    blob.from_proto(proto)
    assert blob.shape == (0, 0, 2, 0)
    assert blob.count == 0


def test_from_proto_prefers_double_data():
    proto = BlobProto(shape=BlobShape(dim=[2]), data=[1, 2], double_data=[3.25, 4.5],
                      diff=[7, 8], double_diff=[-1, -2])
    blob = Blob(dtype=np.float64)
    blob.from_proto(proto)
    assert blob.cpu_data().tolist() == [3.25, 4.5]
    assert blob.cpu_diff().tolist() == [-1, -2]
    assert heads(blob) == (HEAD_AT_CPU, HEAD_AT_CPU)


def test_from_proto_diff_from_float_field():
    proto = BlobProto(shape=BlobShape(dim=[2]), double_data=[1, 2], diff=[0.5, 0.25])
    blob = Blob()
    blob.from_proto(proto)
    assert blob.cpu_data().tolist() == [1, 2]
    assert blob.cpu_diff().tolist() == [0.5, 0.25]


def test_from_proto_converts_to_the_blob_dtype():
    value = 0.1  # not a float32
    blob32 = Blob()
    blob32.from_proto(BlobProto(shape=BlobShape(dim=[1]), double_data=[value]))
    assert blob32.cpu_data()[0] == np.float32(value)
    blob64 = Blob(dtype=np.float64)
    blob64.from_proto(BlobProto(shape=BlobShape(dim=[1]), data=[value]))
    # float data widened exactly: the float32 value, not 0.1.
    assert blob64.data_at(0) == float(np.float32(value))
    assert blob64.data_at(0) != value


BAD_PROTOS = [
    ("too few data", BlobProto(shape=BlobShape(dim=[2, 2]), data=[1, 2, 3]), "data holds 3 values"),
    ("too many double_data", BlobProto(shape=BlobShape(dim=[2]), double_data=[1, 2, 3]), "data holds 3 values"),
    ("no data", BlobProto(shape=BlobShape(dim=[2])), r"data holds 0 values, shape \(2,\) needs 2"),
    ("diff count", BlobProto(shape=BlobShape(dim=[2]), data=[1, 2], diff=[1]), "diff holds 1 values"),
    ("double_diff count", BlobProto(shape=BlobShape(dim=[1]), data=[1], double_diff=[1, 2]), "diff holds 2 values"),
    ("negative dim", BlobProto(shape=BlobShape(dim=[-2])), "invalid blob shape: dimension 0 is negative"),
    ("negative legacy", BlobProto(num=-1, channels=1, height=1, width=1), "invalid blob shape"),
    ("33 axes", BlobProto(shape=BlobShape(dim=[1] * 33), data=[0]), "at most 32 axes"),
]


@pytest.mark.parametrize("name, proto, message", BAD_PROTOS, ids=[b[0] for b in BAD_PROTOS])
def test_from_proto_refuses(name, proto, message):
    with pytest.raises(BlobToolError, match=message) as info:
        Blob().from_proto(proto)
    assert isinstance(info.value, FormatError)
    assert info.value.exit_code == 3


def test_from_proto_without_reshape():
    blob = Blob(3, 2)
    # Legacy (1 x 1 x 3 x 2) equals (3 x 2): accepted, the shape is kept.
    blob.from_proto(BlobProto(num=1, channels=1, height=3, width=2, data=range(6)), reshape=False)
    assert blob.shape == (3, 2)
    assert blob.data_at([2, 1]) == 5
    with pytest.raises(BlobToolError, match="shape mismatch"):
        blob.from_proto(BlobProto(shape=BlobShape(dim=[2, 3]), data=range(6)), reshape=False)
    with pytest.raises(BlobToolError, match="shape mismatch"):
        blob.from_proto(blob_proto(shape=(2, 1, 3, 2), layout="legacy"), reshape=False)
    assert blob.shape == (3, 2)
    assert blob.cpu_data().tolist() == [0, 1, 2, 3, 4, 5]


def test_from_proto_reuses_capacity():
    blob = Blob(10)
    memory = blob.data_memory
    blob.from_proto(BlobProto(shape=BlobShape(dim=[2, 2]), data=[1, 2, 3, 4]))
    assert blob.data_memory is memory
    assert blob.shape == (2, 2)
    assert blob.asum_data() == 10


@pytest.mark.parametrize("write_diff", [False, True])
def test_to_proto_float32(write_diff):
    blob = Blob(2, 3)
    blob.mutable_cpu_data()[:] = np.arange(6) / 4
    blob.mutable_cpu_diff()[:] = -np.arange(6)
    proto = blob.to_proto(write_diff=write_diff)
    assert isinstance(proto, BlobProto)
    assert list(proto.shape.dim) == [2, 3]
    assert list(proto.data) == [0, 0.25, 0.5, 0.75, 1, 1.25]
    assert list(proto.double_data) == [] and list(proto.double_diff) == []
    assert list(proto.diff) == ([0, -1, -2, -3, -4, -5] if write_diff else [])
    for name in ("num", "channels", "height", "width"):
        assert not proto.HasField(name)
    assert heads(blob) == (HEAD_AT_CPU, HEAD_AT_CPU)


@pytest.mark.parametrize("write_diff", [False, True])
def test_to_proto_float64(write_diff):
    blob = Blob(3, dtype=np.float64)
    blob.mutable_cpu_data()[:] = [0.1, 0.2, 0.3]
    blob.mutable_cpu_diff()[:] = [1e-300, 2, 3]
    proto = blob.to_proto(write_diff=write_diff)
    assert list(proto.shape.dim) == [3]
    assert list(proto.double_data) == [0.1, 0.2, 0.3]
    assert list(proto.data) == [] and list(proto.diff) == []
    assert list(proto.double_diff) == ([1e-300, 2, 3] if write_diff else [])


def test_to_proto_reads_from_the_device_when_newer(fake):
    blob = Blob(2)
    blob.mutable_gpu_data()[:] = 7
    assert heads(blob) == (HEAD_AT_GPU, UNINITIALIZED)
    proto = blob.to_proto()
    assert list(proto.data) == [7, 7]
    assert heads(blob) == (SYNCED, UNINITIALIZED)
    assert fake.copies == [("D2H", 8)]


def test_to_proto_clears_the_given_message():
    target = BlobProto(num=9, data=[1, 2, 3], double_diff=[4])
    blob = Blob(1)
    blob.mutable_cpu_data()[0] = 5
    out = blob.to_proto(proto=target)
    assert out is target
    assert not target.HasField("num")
    assert list(target.data) == [5]
    assert list(target.double_diff) == []


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_proto_round_trip_is_exact(dtype, data):
    shape = data.draw(st.lists(st.integers(0, 4), max_size=4), label="shape")
    count = int(np.prod(shape)) if shape else 1
    elements = finite32 if dtype == np.float32 else st.floats(allow_nan=False)
    values = data.draw(hnp.arrays(dtype, count, elements=elements))
    diff = data.draw(hnp.arrays(dtype, count, elements=elements))
    blob = Blob(shape, dtype=dtype)
    blob.mutable_cpu_data()[:] = values
    blob.mutable_cpu_diff()[:] = diff
    wire = blob.to_proto(write_diff=True).SerializeToString()
    parsed = BlobProto()
    parsed.ParseFromString(wire)
    back = Blob(dtype=dtype)
    back.from_proto(parsed)
    assert back.shape == tuple(shape)
    assert back.cpu_data().tobytes() == values.tobytes()
    assert back.cpu_diff().tobytes() == diff.tobytes()


# -- any BlobProto-like message ----------------------------------------------------------------------------


def make_foreign_blob_proto_class():
    """A BlobProto class generated from a separate schema: same fields, package "othercaffe"."""
    file_proto = descriptor_pb2.FileDescriptorProto(
        name="othercaffe/blob.proto", package="othercaffe", syntax="proto2")
    F = descriptor_pb2.FieldDescriptorProto
    shape = file_proto.message_type.add(name="BlobShape")
    shape.field.add(name="dim", number=1, type=F.TYPE_INT64, label=F.LABEL_REPEATED,
                    options=descriptor_pb2.FieldOptions(packed=True))
    blob = file_proto.message_type.add(name="BlobProto")
    blob.field.add(name="shape", number=7, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                   type_name=".othercaffe.BlobShape")
    for name, number, kind in [("data", 5, F.TYPE_FLOAT), ("diff", 6, F.TYPE_FLOAT),
                               ("double_data", 8, F.TYPE_DOUBLE), ("double_diff", 9, F.TYPE_DOUBLE)]:
        blob.field.add(name=name, number=number, type=kind, label=F.LABEL_REPEATED,
                       options=descriptor_pb2.FieldOptions(packed=True))
    for name, number in [("num", 1), ("channels", 2), ("height", 3), ("width", 4)]:
        blob.field.add(name=name, number=number, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL,
                       default_value="0")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_proto)
    descriptor = pool.FindMessageTypeByName("othercaffe.BlobProto")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)  # protobuf < 4.21


@pytest.fixture(scope="module")
def ForeignBlobProto():
    return make_foreign_blob_proto_class()


def test_foreign_class_is_really_different(ForeignBlobProto):
    assert ForeignBlobProto is not BlobProto
    assert ForeignBlobProto.DESCRIPTOR.full_name == "othercaffe.BlobProto"
    assert not isinstance(ForeignBlobProto(), BlobProto)


def test_from_proto_accepts_any_blob_proto_like_message(ForeignBlobProto):
    proto = ForeignBlobProto()
    proto.shape.dim.extend([2, 2])
    proto.double_data.extend([1.5, -2.5, 3.5, -4.5])
    proto.diff.extend([1, 1, 1, 1])
    blob = Blob(dtype=np.float64)
    blob.from_proto(proto)
    assert blob.shape == (2, 2)
    assert blob.cpu_data().tolist() == [1.5, -2.5, 3.5, -4.5]
    assert blob.asum_data() == 12
    assert blob.asum_diff() == 4
    assert heads(blob) == (HEAD_AT_CPU, HEAD_AT_CPU)
    # Legacy fields of the foreign message are honoured too, and shape_equals works on it.
    legacy = ForeignBlobProto(num=1, channels=1, height=2, width=2)
    legacy.data.extend([1, 2, 3, 4])
    assert blob.shape_equals(legacy)
    blob.from_proto(legacy, reshape=False)
    assert blob.shape == (2, 2)
    assert blob.cpu_data().tolist() == [1, 2, 3, 4]
    blob.from_proto(legacy)
    assert blob.shape == (1, 1, 2, 2)


def test_to_proto_into_a_foreign_message_is_wire_compatible(ForeignBlobProto):
    blob = Blob(3)
    blob.mutable_cpu_data()[:] = [1, 2, 3]
    blob.mutable_cpu_diff()[:] = [4, 5, 6]
    foreign = blob.to_proto(write_diff=True, proto=ForeignBlobProto())
    assert type(foreign) is ForeignBlobProto
    assert list(foreign.shape.dim) == [3]
    assert list(foreign.data) == [1, 2, 3]
    ours = blob.to_proto(write_diff=True)
    assert foreign.SerializeToString() == ours.SerializeToString()


# -- reductions split over threads ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.dtype(">f4")], ids=str)
@pytest.mark.parametrize("count", [1, kernels.CHUNK - 1, 3 * kernels.CHUNK + 17, 8 * kernels.CHUNK])
def test_asum_sumsq_is_the_same_for_any_thread_count(threaded, dtype, count):
    rng = np.random.default_rng(count)
    x = (rng.standard_normal(count) * 1e3).astype(dtype)
    threaded(1)
    serial = kernels.asum_sumsq(x)
    wide = x.astype(np.float64)
    assert serial[0] == pytest.approx(math.fsum(np.abs(wide)), rel=1e-12)
    assert serial[1] == pytest.approx(math.fsum(wide * wide), rel=1e-12)
    for threads in (2, 3, 7, 64):
        threaded(threads)
        assert kernels.asum_sumsq(x) == serial, threads  # bit for bit: chunk sums added in order


def test_threaded_asum_sumsq_propagates_nan_and_inf_without_warnings(threaded):
    threaded(3)
    x = np.ones(5 * kernels.CHUNK, dtype=np.float32)
    x[7] = np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernels.asum_sumsq(x) == (np.inf, np.inf)
        x[4 * kernels.CHUNK + 3] = np.nan
        asum, sumsq = kernels.asum_sumsq(x)
        assert math.isnan(asum) and math.isnan(sumsq)
        big = np.full(4 * kernels.CHUNK, 1e200)
        assert kernels.asum_sumsq(big) == (4 * kernels.CHUNK * 1e200, np.inf)  # squares overflow: inf, no warning


def test_threaded_asum_sumsq_reports_every_byte_once(threaded):
    threaded(4)
    x = np.ones(6 * kernels.CHUNK + 5, dtype=np.float32)
    seen = []
    with work.using(progress=seen.append):
        kernels.asum_sumsq(x)
    assert sum(seen) == x.nbytes


def test_threaded_asum_sumsq_raises_a_worker_error(threaded, monkeypatch):
    threaded(2)
    x = np.ones(2 * kernels.GROUP * kernels.CHUNK, dtype=np.float32)  # a group of chunks for each thread
    real = kernels.blas._chunk_sums

    def failing(x, first, stop, abs_parts, sq_parts):
        if first:
            raise MemoryError("worker failed")
        real(x, first, stop, abs_parts, sq_parts)

    monkeypatch.setattr(kernels.blas, "_chunk_sums", failing)
    with pytest.raises(MemoryError, match="worker failed"):
        kernels.asum_sumsq(x)


def test_small_arrays_stay_in_the_calling_thread(monkeypatch):
    started = []
    monkeypatch.setattr(kernels.threads.threading.Thread, "start", lambda self: started.append(self))
    with work.using(threads=8):
        kernels.asum_sumsq(np.ones(kernels.PARALLEL_MIN_BYTES // 4 - 1, dtype=np.float32))
    assert started == []


def _awkward_values(count: int, dtype) -> np.ndarray:
    rng = np.random.default_rng(count)
    x = (rng.standard_normal(count) * 1e3).astype(dtype)
    x[::9973] = 0
    x[5::70001] = np.nan
    x[9::123457] = -np.inf
    return x


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=str)
def test_stats_and_nonfinite_are_the_same_for_any_thread_count(threaded, dtype):
    x = _awkward_values(9 * kernels.CHUNK + 11, dtype)
    threaded(1)
    serial = (kernels.stats(x), kernels.nonfinite(x))
    finite = x[np.isfinite(x)].astype(np.float64)
    assert serial[1] == (int(np.isnan(x).sum()), int(np.isinf(x).sum()))
    assert serial[0]["mean"] == pytest.approx(math.fsum(finite) / finite.size, rel=1e-9)
    assert serial[0]["std"] == pytest.approx(float(np.std(finite)), rel=1e-9)
    assert (serial[0]["min"], serial[0]["max"]) == (finite.min(), finite.max())
    for threads in (2, 5):
        threaded(threads)
        assert (kernels.stats(x), kernels.nonfinite(x)) == serial, threads


def test_map_chunks_keeps_order_and_reports_progress(threaded):
    threaded(3)
    x = np.arange(7 * kernels.CHUNK + 1, dtype=np.float32)
    seen = []
    with work.using(progress=seen.append):
        firsts = kernels.map_chunks(lambda part: float(part[0]), x, progress=True)
    assert firsts == [float(k * kernels.CHUNK) for k in range(8)]
    assert sum(seen) == x.nbytes
    assert kernels.map_chunks(len, np.zeros(0)) == []


# -- a diff held wider than the data (blobtool extension) ---------------------------------------


def test_a_wider_diff_has_its_own_memory_and_views():
    blob = Blob(2, 3, dtype=np.float32, diff_dtype=np.float64)
    assert blob.dtype == np.float32 and blob.diff_dtype == np.float64
    assert blob.data_memory.size == 24 and blob.diff_memory.size == 48
    assert blob.cpu_data().dtype == np.float32 and blob.cpu_diff().dtype == np.float64
    blob.diff[...] = 1e300
    assert blob.diff_at(1, 2) == 1e300 and blob.asum_diff() == pytest.approx(6e300)
    with pytest.raises(BlobToolError, match="differs from the blob's float64"):
        blob.set_cpu_diff(np.zeros(6, np.float32))
    blob.set_cpu_diff(np.full(6, 0.5))
    assert blob.cpu_diff().tolist() == [0.5] * 6
    with pytest.raises(BlobToolError, match="dtypes differ"):
        Blob(2, 3).share_diff(blob)
    with pytest.raises(BlobToolError, match="Blob dtype must be float32 or float64"):
        Blob(2, diff_dtype=np.float16)


@pytest.mark.parametrize("on_device", [False, True], ids=["host", "device"])
def test_update_with_a_wider_diff_runs_in_the_datas_type(fake, on_device):
    # Caffe's caffe_axpy<float>: the diff is rounded to float first; 1e300 is Inf there.
    blob = Blob(3, dtype=np.float32, diff_dtype=np.float64)
    blob.mutable_cpu_data()[:] = [1, 1, 1]
    blob.mutable_cpu_diff()[:] = [1e300, 1 / 3, -1e-300]
    if on_device:
        blob.gpu_data()
    with np.errstate(over="ignore"):
        blob.update()
    expected = np.float32(1) - np.array([np.inf, np.float32(1 / 3), np.float32(-1e-300)], np.float32)
    assert blob.cpu_data().dtype == np.float32
    assert blob.cpu_data().tolist() == expected.tolist()
    assert blob.cpu_diff().tolist() == [1e300, 1 / 3, -1e-300]
