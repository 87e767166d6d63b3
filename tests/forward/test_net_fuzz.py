"""The fuzzer of deploy definitions (tests/helpers/netfuzz.py): its seeds, its mutants, its check, and its 30 s run.

The quick tests hold the machinery: every seed runs and exports cleanly,
the mutants are the same for the same seed, a fixed few dozen of them pass
the check through every form of file, and the check itself catches what it
is there to catch (an escaped exception, a warning, a slow call, a large
allocation, a hang, a death). The slow test runs tests/helpers/fuzz_long.py --nets
for 30 s as CI does and asserts it found nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import netfuzz as nf
from fuzzcases import FuzzFailure
from runner import REPO, subprocess_env

# The fixed mutants of the quick test: random.Random(QUICK_SEED)'s first QUICK_COUNT.
QUICK_SEED, QUICK_COUNT = 5, 36


@pytest.fixture(scope="module")
def pool():
    nf.preload()  # onnx and onnxruntime imported once here, not in every forked case's timed export
    return nf.seed_nets()


@pytest.mark.parametrize("form", ["model", "definition"])
def test_every_seed_runs_and_exports_cleanly(pool, tmp_path, form):
    for seed in pool:
        folder = tmp_path / f"{seed.name}-{form}"
        folder.mkdir()
        outcomes = nf.check_net_case(nf.Mutant(seed.name, seed.message, form), folder)
        assert outcomes[0].error is None, (seed.name, outcomes[0].error)
        # Every seed exports, the SSD's DetectionOutput too.
        assert outcomes[1].error is None, (seed.name, outcomes[1].error)


def test_weightless_seeds_run_from_their_text_alone(pool, tmp_path):
    ran = [seed.name for seed in pool if not any(each.blobs for each in seed.message.layer)]
    assert ran == ["wiring", "lrn_tile", "legacy_input"]
    for name in ran:
        seed = next(s for s in pool if s.name == name)
        (tmp_path / name).mkdir()
        outcomes = nf.check_net_case(nf.Mutant(name, seed.message, "prototxt"), tmp_path / name)
        assert [o.error for o in outcomes] == [None, None]


def test_the_same_seed_gives_the_same_mutants(pool):
    first, again = nf.mutants(7, 12, pool=pool), nf.mutants(7, 12, pool=pool)
    assert [(m.seed, m.form, m.steps, m.net.SerializePartialToString()) for m in first] == \
        [(m.seed, m.form, m.steps, m.net.SerializePartialToString()) for m in again]
    assert any(m.net != next(s for s in pool if s.name == m.seed).message for m in first)


def test_a_fixed_few_dozen_mutants_pass_the_check(pool):
    """Every mutant refused with a BlobToolError or run and exported cleanly; both happen, in every form."""
    start = time.monotonic()
    chosen = nf.mutants(QUICK_SEED, QUICK_COUNT, pool=pool)
    failures, outcomes = [], []
    for k, mutant in enumerate(chosen):
        try:
            outcomes += nf.check_isolated(mutant, timeout=10)
        except FuzzFailure as exc:
            failures.append(f"mutant {k} ({mutant.seed}, {mutant.form}; {'; '.join(mutant.steps)}): {exc}")
    assert not failures, "\n".join(failures)
    assert {m.form for m in chosen} == {"model", "definition", "bare", "prototxt"}
    assert len({step.split(":")[0] for m in chosen for step in m.steps}) >= 10
    accepted = [o for o in outcomes if o.error is None]
    # Without the onnx extra (CI's oldest protobuf) no mutant exports with check=True.
    checked = {"export --check"} if nf._has_onnxruntime() else set()
    assert {o.call for o in accepted} == {"run", "export"} | checked and len(accepted) >= 10
    assert len(outcomes) - len(accepted) >= 10
    assert time.monotonic() - start < 30


def test_mutations_reach_the_edges(pool):
    """Over a few hundred mutants: 2^31 and 2^62 in a field, NaN, a repeated layer, a rewired bottom, a long name."""
    steps = " | ".join(s for m in nf.mutants(3, 400, pool=pool) for s in m.steps)
    for needle in ("= 2147483648", "= 4611686018427387904", " nan", "repeat_layer: layer", "rewire: ",
                   "make_in_place: ", "'xxxxxxxx", "nu@@", "change_type: ", "given twice", "input_dim"):
        assert needle in steps, needle


def test_a_non_utf8_name_reaches_the_files(tmp_path, pool):
    seed = next(s for s in pool if s.name == "classifier")
    mutant = nf.Mutant("classifier", seed.message, "definition")
    mutant.net.layer[0].top[0] = "nu@@03"
    mutant.net.layer[1].bottom[0] = mutant.net.layer[1].top[0] = "nu@@03"
    model, prototxt = nf.write_mutant(mutant, tmp_path)
    assert b"nu\xff\xfe03" in model.read_bytes() and b"nu@@" not in model.read_bytes()
    assert "nu\\377\\37603" in prototxt.read_text()


# -- the check catches what it is there for ------------------------------------------------------------

def test_traced_passes_a_blobtool_error_and_fails_anything_else():
    from blobtool.errors import FormatError

    def refuse():
        raise FormatError("layer 'x' (Tile): too big")

    assert nf._traced("run", refuse).error == "layer 'x' (Tile): too big"
    with pytest.raises(FuzzFailure, match=r"run: KeyError at .*test_net_fuzz.py:\d+ in lookup: 'b'"):
        def lookup():
            return {}["b"]
        nf._traced("run", lookup)
    with pytest.raises(FuzzFailure, match="not one non-empty line"):
        def two_lines():
            raise FormatError("a\nb")
        nf._traced("run", two_lines)


def test_traced_fails_a_numpy_warning_a_slow_call_and_a_large_allocation(monkeypatch):
    with pytest.raises(FuzzFailure, match="export: RuntimeWarning at .*: divide by zero"):
        nf._traced("export", lambda: np.float32(1) / np.zeros(2, np.float32))
    with pytest.raises(FuzzFailure, match="UserWarning"):
        nf._traced("run", lambda: warnings.warn("something"))
    monkeypatch.setattr(nf, "TIME_LIMIT_S", 0.05)
    with pytest.raises(FuzzFailure, match=r"run: took 0\.\d\d s \(limit 0.05 s\)"):
        nf._traced("run", lambda: time.sleep(0.1))
    monkeypatch.setattr(nf, "MEMORY_BOUND", 1 << 20)
    with pytest.raises(FuzzFailure, match=r"allocated \d+ MiB at peak \(bound 1 MiB\)"):
        nf._traced("run", lambda: np.zeros(4 << 20, np.uint8))
    # A net accepted with 2 MiB of declared blobs may take 4 x 2 MiB more, and 2 MiB / DECLARED_BYTES_PER_S longer.
    assert nf._traced("run", lambda: np.zeros(4 << 20, np.uint8), lambda: 2 << 20).error is None
    monkeypatch.setattr(nf, "DECLARED_BYTES_PER_S", 20 << 20)
    assert nf._traced("run", lambda: time.sleep(0.1), lambda: 2 << 20).seconds >= 0.1


def test_isolated_returns_the_answer_and_bounds_memory_and_time():
    assert nf.isolated(lambda: 6 * 7) == 42
    with pytest.raises(FuzzFailure, match="MemoryError"):
        nf.isolated(lambda: np.ones(1 << 40, np.uint8), slack=256 << 20)
    start = time.monotonic()
    with pytest.raises(FuzzFailure, match=r"still running after 1 s \(killed\)"):
        nf.isolated(lambda: time.sleep(30), timeout=1)
    assert time.monotonic() - start < 10
    with pytest.raises(FuzzFailure, match="died of signal SIGKILL"):  # as the kernel's OOM killer does
        nf.isolated(lambda: os.kill(os.getpid(), 9))
    with pytest.raises(FuzzFailure, match="^export: it broke$"):
        def broken():
            raise FuzzFailure("export: it broke")
        nf.isolated(broken)


def test_a_refused_export_that_leaves_its_file_is_a_failure(monkeypatch, tmp_path, pool):
    from blobtool import api
    from blobtool.errors import FormatError

    def leaves(src, dest, **kw):
        Path(dest).write_bytes(b"half a model")
        raise FormatError("cannot")

    monkeypatch.setattr(api, "export", leaves)
    seed = next(s for s in pool if s.name == "lrn_tile")
    with pytest.raises(FuzzFailure, match="refused .*cannot.* but left net.onnx behind"):
        nf.check_net_case(nf.Mutant(seed.name, seed.message, "model"), tmp_path)


def test_a_legitimately_big_net_is_skipped_and_a_blob_past_caffes_bound_is_not(tmp_path):
    from caffenets import layer, net

    big = nf.Mutant("by hand", net([layer("r", "ReLU", "data")], {"data": (4096, 3, 64, 64)}), "prototxt")
    (tmp_path / "big").mkdir()
    assert [(o.call, o.error) for o in nf.check_net_case(big, tmp_path / "big")] == \
        [("skipped", "declares 384 MiB of blobs")]
    # 2^32 - 2 values in one blob: Caffe refuses it (count past INT_MAX), so the case runs, whatever it costs.
    tiled = nf.Mutant("by hand", net([layer("t", "Tile", "data", tile_param={"tiles": 2**31 - 1})], {"data": (1, 2)}),
                      "prototxt")
    (tmp_path / "tiled").mkdir()
    try:
        outcomes = nf.isolated(lambda: nf.check_net_case(tiled, tmp_path / "tiled"), slack=256 << 20)
    except FuzzFailure as exc:
        assert "run: " in str(exc)
    else:
        assert outcomes[0].call == "run" and outcomes[0].error is not None


def test_failure_kinds_blur_numbers_and_names():
    a = nf.failure_kind("run: MemoryError at blobtool/layers/shape.py:321 in forward (address space bound)")
    b = nf.failure_kind("run: MemoryError at blobtool/layers/shape.py:322 in forward (address space bound)")
    assert a == b == "run: MemoryError at blobtool/layers/shape.py:N in forward (address space bound)"
    assert nf.failure_kind("run: took 2.51 s (limit 2.0 s)") == nf.failure_kind("run: took 14.2 s (limit 2.0 s)")


def test_minimize_keeps_the_failure_and_the_reproducer_runs_it(tmp_path, pool):
    """A stand-in failure (a Tile layer present) made smaller down to that layer; the snippet rebuilds the net."""
    seed = next(s for s in pool if s.name == "lrn_tile")
    mutant = nf.Mutant(seed.name, seed.message, "model", ["by hand"])

    def fails(trial):
        return any(each.type == "Tile" for each in trial.net.layer)

    small = nf.minimize(mutant, fails)
    assert [each.type for each in small.net.layer] == ["Tile"] and small.form == "prototxt"
    snippet = nf.reproducer(small, "stand-in")
    result = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, env=subprocess_env(),
                            capture_output=True, text=True, timeout=120)
    # The Tile reads "lrn_within", which nothing writes once the other layers are gone: refused, named.
    assert result.returncode == 1 and "lrn_within" in result.stderr.splitlines()[-1], result.stderr[-2000:]
    assert (tmp_path / "deploy.prototxt").is_file()


# -- the long run, as CI runs it -------------------------------------------------------------------------------

@pytest.mark.slow
def test_fuzz_long_nets_for_30_seconds_finds_nothing(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "tests" / "helpers" / "fuzz_long.py"), "--nets", "--seconds", "30",
                             "--workdir", str(tmp_path)], env=subprocess_env(), capture_output=True, text=True,
                            timeout=600)
    stats = json.loads((tmp_path / "stats.json").read_text())
    found = sorted(p.name for p in (tmp_path / "failures").glob("*.py")) if (tmp_path / "failures").is_dir() else []
    assert result.returncode == 0 and stats["failures"] == 0, (stats.get("kinds"), found, result.stdout[-3000:])
    assert stats["inputs"] >= 50 and stats["accepted"] > 0 and stats["refused"] > 0, stats
