"""Blob for numpy: Caffe's shape_string, a Blob as an array, a loaded blob as its file's array.

numpy is the oracle: what it makes of a Blob, and of the file a blob was loaded from.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import blobtool
from builders import write_npy


# -- Blob ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("axes", range(0, 33))
def test_shape_string_is_caffes_for_every_axis_count(axes):
    shape = [2 if k % 3 == 0 else 1 for k in range(axes)]
    blob = blobtool.Blob(shape)
    # Caffe's shape_string: each dimension followed by a blank, then "(" count ")".
    expected = "".join(f"{d} " for d in shape) + f"({int(np.prod(shape, dtype=np.int64))})"
    assert blob.shape_string() == expected
    if axes == 0:
        assert blob.shape_string() == "(1)"


def test_shape_string_of_an_empty_blob_and_a_zero_dimension():
    assert blobtool.Blob().shape_string() == "(0)"
    assert blobtool.Blob(2, 0, 3).shape_string() == "2 0 3 (0)"
    assert blobtool.Blob(2, 3, 4, 5).shape_string() == "2 3 4 5 (120)"


def test_a_blob_is_an_array_to_numpy():
    blob = blobtool.Blob(2, 3)
    blob.data[...] = np.arange(6).reshape(2, 3)
    array = np.asarray(blob)
    assert array.shape == (2, 3) and array.dtype == np.float32
    assert array.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert not array.flags.writeable  # a view of the data, as cpu_data
    assert np.shares_memory(array, blob.cpu_data())
    copied = np.array(blob)
    assert copied.flags.writeable and not np.shares_memory(copied, blob.cpu_data())
    assert np.asarray(blob, dtype=np.float64).dtype == np.float64
    with pytest.raises(ValueError):
        np.asarray(blob, dtype=np.float64, copy=False)
    assert np.asarray(blob, copy=False).base is not None
    assert float(np.sum(blob)) == 15.0
    assert np.asarray(blobtool.Blob([])).shape == ()
    assert np.asarray(blobtool.Blob()).shape == (0,)
    loaded = blobtool.Blob(2, dtype=np.float64)
    assert np.asarray(loaded).dtype == np.float64


def test_a_loaded_blob_is_an_array_of_its_file(tmp_path):
    values = np.arange(12, dtype=np.float64).reshape(3, 4) / 7
    path = write_npy(tmp_path / "v.npy", values)
    np.testing.assert_array_equal(np.asarray(blobtool.load(path)), values)
    assert os.path.exists(path)
