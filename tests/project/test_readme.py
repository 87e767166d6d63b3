"""Every example of README.md runs, in order, as a user would type it, in a folder of the recipes' files.

The shell lines run in bash with `blobtool` on PATH (this checkout's, as
`python -m blobtool`); each must exit 0, or the code its comment names
("# exit 1: ..."); the Python blocks run with this checkout's blobtool.
The quick start's installs are what CI runs, and are left out here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runner import REPO, subprocess_env

README = REPO / "README.md"
MOST_LINES = 300


def _blocks(text: str) -> list:
    """(language, body) of each fenced block, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)


def _commands(body: str) -> list:
    """(command, the exit codes it may end with) of each line of a shell block."""
    found = []
    for line in body.splitlines():
        command, _, comment = line.partition("  #")
        command = command.strip()
        if not command or command.startswith("#"):
            continue
        parts = [p.strip() for p in command.split("&&") if not p.strip().startswith("pip install")]
        if not parts or parts == ["python -m pytest"]:
            continue
        code = re.search(r"\bexit (\d+)", comment)
        codes = {int(code.group(1))} if code else {0}
        if "where no GPU is" in comment or "without blobtool[onnx]" in comment:
            codes |= {0}
        found.append((" && ".join(parts), codes))
    return found


def test_the_readme_is_a_front_door_under_300_lines():
    assert len(README.read_text().splitlines()) < MOST_LINES


def test_every_example_of_the_readme_runs(tmp_path):
    folder = tmp_path / "recipes"
    made = subprocess.run([sys.executable, str(REPO / "examples" / "make_examples.py"), "--nets", str(folder)],
                          capture_output=True, text=True, env=subprocess_env(), timeout=60)
    assert made.returncode == 0, made.stderr
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "blobtool"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m blobtool "$@"\n')
    shim.chmod(0o755)
    env = subprocess_env(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    ran = 0
    for language, body in _blocks(README.read_text()):
        if language == "sh":
            for command, codes in _commands(body):
                result = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=folder, env=env,
                                        capture_output=True, text=True, timeout=120)
                assert result.returncode in codes, (command, result.returncode, result.stderr[-2000:])
                assert "Traceback" not in result.stderr, (command, result.stderr)
                ran += 1
        elif language == "python":
            result = subprocess.run([sys.executable, "-c", body], cwd=folder, env=env, capture_output=True,
                                    text=True, timeout=120)
            assert result.returncode == 0, (body, result.stderr[-2000:])
            ran += 1
        else:
            pytest.fail(f"a README block of language {language!r}: say how it runs")
    assert ran >= 30
