"""The safetensors reader under damaged and forged input: only BlobToolError, fast, within memory.

The seeds and the header-aware mutations are in tests/helpers/stcases.py (the long
fuzzer uses them too). Each case goes through fuzzcases.check_case (open,
sniffed and forced to "safetensors", every blob built, its norms taken).
"""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fuzzcases as fc
from blobtool.formats import open_document
from stcases import header_length, mutate, seeds, st_layout
from fuzzcases import fuzz_settings, hypothesis_picker

# Fuzzing: long (a minute and more in all); `pytest -m "not slow"` leaves it out, CI runs it.
pytestmark = pytest.mark.slow

SEEDS = seeds()

FUZZ_SETTINGS = fuzz_settings()


def test_seeds_read_cleanly():
    for seed in SEEDS:
        assert open_document(io.BytesIO(seed.data)).kind == "safetensors", seed.name
        assert fc.check_case(seed.data).error is None or seed.name == "st_package"
    # The package's file holds an int64 tensor: listed, refused only when its values are read.
    assert "holds int64 values" in fc.check_case(SEEDS[2].data).error


@pytest.mark.parametrize("seed", SEEDS, ids=[s.name for s in SEEDS])
def test_fuzz_safetensors(seed):
    lay = st_layout(seed.data)

    @FUZZ_SETTINGS
    @given(st.data())
    def run(data):
        mutated = mutate(seed, lay, hypothesis_picker(data), data.draw(st.integers(1, 3)))
        fc.check_case(mutated, None)
        fc.check_case(mutated, "safetensors")

    run()


@pytest.mark.parametrize("seed", SEEDS, ids=[s.name for s in SEEDS])
def test_every_cut_and_every_forged_length(seed):
    errors = []
    for cut in range(len(seed.data)):
        outcome = fc.check_case(seed.data[:cut], "safetensors")
        assert outcome.error is not None, cut
        errors.append(outcome.error)
    n = header_length(seed.data)
    for value in fc.HUGE_VALUES + (n - 1, n + 1, len(seed.data)):
        assert fc.check_case(value.to_bytes(8, "little") + seed.data[8:], "safetensors").error is not None
    # Cut in the length field, in the header, in the tensors: each caught where it is.
    assert "8-byte header length" in errors[0]
    assert "the header length declares" in errors[8 + n - 1]
    assert "end past the file" in errors[-1]
