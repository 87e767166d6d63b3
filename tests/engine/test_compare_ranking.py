"""compare's ranking and tolerance: a blob that became Inf first, the tolerance used, max_rel where b holds zero.

Every check runs the real command (tests/helpers/runner.py) on files whose values are made here.
"""

from __future__ import annotations


import numpy as np
import pytest

from blobtool.errors import ExitCode
from builders import write_npz
from runner import invoke, one_json, run_blobtool


# -- compare ------------------------------------------------------------------------------------

@pytest.fixture
def drifted(tmp_path):
    base = {"noise": np.array([1.0, 2.0, 3.0], np.float32), "blown": np.array([1.0, 2.0, 3.0], np.float32),
            "same": np.array([7.0], np.float32)}
    after = {"noise": np.array([1.5, 2.5, 3.5], np.float32), "blown": np.array([1.0, np.inf, 3.0], np.float32),
             "same": np.array([7.0], np.float32)}
    return write_npz(tmp_path / "a.npz", base), write_npz(tmp_path / "b.npz", after)


def test_compare_lists_a_blob_that_became_inf_first(drifted):
    a, b = drifted
    result = run_blobtool("compare", a, b, env={"COLUMNS": "200"}, text=True)
    assert result.returncode == ExitCode.DIFFERENT
    lines = result.stdout.splitlines()
    rule = next(k for k, line in enumerate(lines) if line.strip().startswith("\u2500"))
    rows = [line.split() for line in lines[rule + 1:rule + 3]]
    assert [row[0] for row in rows] == ["blown", "noise"]
    assert rows[0][1:3] == ["values", "(1"]  # "values (1 Inf/NaN)"
    record = one_json(invoke("compare", "--json", a, b))
    by_name = {blob["name"]: blob for blob in record["blobs"]}
    assert by_name["blown"]["nonfinite"] == 1 and by_name["noise"]["nonfinite"] == 0
    # The finite part of the change alone would rank it last: rel_l2 counts finite differences only.
    assert by_name["blown"]["rel_l2"] < by_name["noise"]["rel_l2"]


def test_compare_states_the_tolerance_it_used(drifted, tmp_path):
    a, _ = drifted
    copy = write_npz(tmp_path / "c.npz", {"noise": np.array([1.001, 2.0, 3.0], np.float32),
                                          "blown": np.array([1.0, 2.0, 3.0], np.float32),
                                          "same": np.array([7.0], np.float32)})
    result = invoke("compare", a, copy, "--rtol", "1e-2")
    assert result.exit_code == 0
    assert result.stdout == f"equal  {a} and {copy}: 3 blob(s) match within rtol=0.01, atol=0\n"
    exact = invoke("compare", "-q", a, copy)
    assert exact.stdout == (f"DIFFERENT  {a} vs {copy}: 1 of 3 blob(s) differ beyond rtol=0, atol=0\n")
    record = one_json(invoke("compare", "--json", "--rtol", "1e-2", "--atol", "1e-6", a, copy))
    assert (record["rtol"], record["atol"]) == (0.01, 1e-6)


def test_compare_explains_max_rel_inf_where_b_holds_zero(tmp_path):
    a = write_npz(tmp_path / "a.npz", {"w": np.array([1.0, 2.0], np.float32)})
    b = write_npz(tmp_path / "b.npz", {"w": np.array([0.0, 2.0], np.float32)})
    result = invoke("compare", a, b)
    assert result.exit_code == ExitCode.DIFFERENT
    assert "  max_rel inf: b holds 0 where a does not" in result.stdout.splitlines()
    result = invoke("compare", b, a)  # max_rel 1: no note
    assert "max_rel inf" not in result.stdout
