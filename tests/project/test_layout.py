"""The tests' layout: a room per package of blobtool, one folder of helpers, every test file named in the docs.

docs/development.md draws the layout; these tests keep the drawing and the folders the same.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
# Rooms that are no package of blobtool: the project as a whole, the helpers, the data the tests read.
OTHER_ROOMS = {"project", "helpers", "corpus", "data"}


def all_test_files() -> list:
    """Every test file under tests/."""
    return sorted(TESTS.rglob("test_*.py"))


def test_every_test_file_lives_in_a_room_named_after_a_package_of_blobtool():
    packages = {p.name for p in (REPO / "blobtool").iterdir() if p.is_dir() and any(p.glob("*.py"))}
    rooms = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert rooms - OTHER_ROOMS <= packages, rooms - OTHER_ROOMS - packages
    misplaced = [str(p.relative_to(TESTS)) for p in all_test_files()
                 if p.parent.parent != TESTS or p.parent.name in OTHER_ROOMS - {"project"}]
    assert not misplaced, f"test files outside the rooms (place them by what they test): {misplaced}"


def test_no_two_test_files_share_a_basename():
    # The rooms are not packages: pytest imports each test file by its bare name.
    counts = Counter(p.name for p in all_test_files())
    assert not [name for name, n in counts.items() if n > 1]


def test_docs_name_every_test_file_and_only_those():
    text = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    tree = text[text.index("```\ntests/\n"):]
    tree = tree[:tree.index("\n```", 4)]
    named = set(re.findall(r"\btest_\w+\.py\b", tree))
    present = {p.name for p in all_test_files()}
    assert present - named == set(), f"test files docs/development.md does not name: {sorted(present - named)}"
    assert named - present == set(), f"docs/development.md names missing test files: {sorted(named - present)}"
