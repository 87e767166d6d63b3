"""Fixtures shared by the test modules."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

# Files that Caffe itself wrote live beside the checkout, not in it
# (../shared/realworld, see its README); a user's clone has no such folder.
REALWORLD_DIR = Path(__file__).resolve().parents[2] / "shared" / "realworld"


@pytest.fixture
def realworld() -> Path:
    """The folder of real Caffe files; skips the test when it is absent."""
    if not REALWORLD_DIR.is_dir():
        pytest.skip(f"real Caffe files not available: {REALWORLD_DIR} does not exist "
                    "(it sits beside the project checkout, not in it)")
    return REALWORLD_DIR


@pytest.fixture
def host_only():
    """No device backend for the test; whatever was set is restored after."""
    import fakegpu

    with fakegpu.no_backend():
        yield


@pytest.fixture
def fake():
    """A host-only FakeBackend (tests/helpers/fakegpu.py) installed as SyncedMemory's device side."""
    import fakegpu

    with fakegpu.installed() as backend:
        yield backend


@pytest.fixture
def threaded(monkeypatch):
    """Let arrays of any size be split over threads: threaded(n) lets the test's calls use n (blobtool.work)."""
    from blobtool import kernels, work

    monkeypatch.setattr(kernels.threads, "PARALLEL_MIN_BYTES", 0)
    with contextlib.ExitStack() as stack:
        yield lambda n: stack.enter_context(work.using(threads=n))
