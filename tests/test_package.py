"""The package's shape: no import cycles, and the command's start-up loads only what it needs."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "blobtool"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "_pb" not in p.parts}


def _imports(name: str, path: Path, known: set) -> set:
    """The blobtool modules `name` imports, at its top or inside its functions."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            submodules = {f"{base}.{a.name}" for a in node.names} & known
            if base in known and len(submodules) < len(node.names):  # `from . import sibling` imports the sibling
                found.add(base)
            found.update(submodules)
    found.discard(name)
    return found


def test_no_import_cycles():
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    assert graph["blobtool.cli"] >= {"blobtool.cli.group", "blobtool.cli.inspect"}  # the parser sees imports
    assert "blobtool.formats" in graph["blobtool.cli.completion"]  # and those inside functions
    state = {}

    def visit(name, trail):
        if state.get(name) == "done":
            return
        assert state.get(name) != "open", "import cycle: " + " -> ".join(trail + [name])
        state[name] = "open"
        for other in sorted(graph[name]):
            visit(other, trail + [name])
        state[name] = "done"

    for name in sorted(graph):
        visit(name, [])


def test_the_command_imports_no_format_module_and_no_heavy_library_at_start_up():
    # The registry names the format modules without importing them; numpy,
    # rich, protobuf and h5py (Caffe's HDF5 snapshots) load only when a command needs them.
    # (protobuf 3.x's namespace-package .pth file imports the bare "google" at every start.)
    # The registry's own two helpers (read settings, blob selection: the
    # standard library only) are part of it, not format modules.
    code = ("import sys, blobtool.cli\n"
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'rich', 'h5py') "
            "or m.startswith(('google.protobuf', 'blobtool.formats.')) or m == 'blobtool.report.tables')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout.split()
    assert out == ["blobtool.formats.reading", "blobtool.formats.selecting"]
    for helper in out:  # ... which import nothing but the standard library and blobtool.errors
        source = (PACKAGE / "formats" / (helper.split(".")[-1] + ".py")).read_text()
        imports = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
        assert all(line.split()[1] in ("__future__", "contextlib", "contextvars", "dataclasses", "fnmatch",
                                       "..errors") for line in imports), imports


def test_no_module_is_over_600_lines_and_the_top_level_holds_few():
    # The folders show the layers (cli, report, the library, formats, files, engine); a module that
    # grows past 600 lines is split by job.
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if "_pb" not in p.parts
            for n in [len(p.read_text().splitlines())] if n > 600}
    assert long == {}
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 6, top
