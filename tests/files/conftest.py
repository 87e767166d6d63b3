"""Fixtures of the files/ room: a small blob with a diff, and a big one (about 200 MB) written once for the room."""

from __future__ import annotations

from pathlib import Path

import pytest

from filecases import write_float_blob


@pytest.fixture
def small(tmp_path) -> Path:
    return write_float_blob(tmp_path / "small.pb", 1000, diff=True)


@pytest.fixture(scope="session")
def big(tmp_path_factory) -> Path:
    """About 200 MB of float32, so that a convert --double takes long enough to be caught mid-write."""
    path = write_float_blob(tmp_path_factory.mktemp("big") / "big.pb", 50_000_000)
    yield path
    path.unlink()  # pytest keeps the last runs' folders; not this much of them
