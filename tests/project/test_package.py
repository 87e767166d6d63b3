"""The package's shape: no import cycles, and the command's start-up loads only what it needs."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "blobtool"

# The layers of docs/development.md, top to bottom: a module imports only
# modules of its own layer or of a layer below it (a contract, as
# import-linter's "layers" contracts check them). A module belongs to the
# first layer one of whose packages or modules holds it.
LAYERS = (
    ("the command", ("__main__", "cli")),
    ("what is shown", ("report",)),
    ("the library", ("api", "records")),
    ("jobs on nets", ("surgery", "forward", "onnxport")),
    ("the PyTorch side", ("torchport",)),
    ("the net model", ("net", "layers")),
    ("formats", ("formats",)),
    ("files", ("files",)),
    ("the engine", ("engine",)),
    ("the base", ("errors", "")),  # "": the package itself (its version; its names, imported on first use)
)


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(package: Path = PACKAGE) -> dict:
    return {_module_name(p, package): p for p in package.rglob("*.py") if "_pb" not in p.parts}


def _layer(name: str, root: str) -> int:
    """The index in LAYERS of module `name` of package `root`."""
    inner = name[len(root) + 1:] if name != root else ""
    for index, (_, members) in enumerate(LAYERS):
        if any(inner == m or (m and inner.startswith(m + ".")) for m in members):
            return index
    raise AssertionError(f"{name} is in no layer of LAYERS: add it to the one docs/development.md draws it in")


def upward_imports(package: Path = PACKAGE) -> list:
    """(importer, imported, their layers) for every import of a module in a layer above the importer's."""
    modules = _modules(package)
    root = package.name
    found = []
    for name, path in sorted(modules.items()):
        mine = _layer(name, root)
        for other in sorted(_imports(name, path, set(modules))):
            theirs = _layer(other, root)
            if theirs < mine:
                found.append(f"{name} ({LAYERS[mine][0]}) imports {other} ({LAYERS[theirs][0]})")
    return found


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
    assert "blobtool.api" in graph["blobtool.cli.completion"]  # and those inside functions
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


def test_no_module_imports_one_of_a_layer_above_its_own():
    assert upward_imports() == []


def test_the_layer_check_finds_an_import_upward(tmp_path):
    # A deliberate violation in a package of the same layout: the engine
    # importing the command, inside a function (the parser sees those too),
    # and formats importing the net model; importing sideways and down is fine.
    package = tmp_path / "blobtool"
    for folder in ("cli", "engine", "formats", "net"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "errors.py").write_text("")
    (package / "cli" / "group.py").write_text("from ..engine import blob\nfrom .. import errors\n")
    (package / "engine" / "blob.py").write_text("from .. import errors\n\ndef f():\n    from ..cli import group\n")
    (package / "formats" / "codec.py").write_text("from ..net import model\nfrom . import other\n")
    (package / "formats" / "other.py").write_text("")
    (package / "net" / "model.py").write_text("from ..formats import other\n")
    assert upward_imports(package) == [
        "blobtool.engine.blob (the engine) imports blobtool.cli.group (the command)",
        "blobtool.formats.codec (formats) imports blobtool.net.model (the net model)",
    ]
    (package / "stray").mkdir()
    (package / "stray" / "__init__.py").write_text("")
    with pytest.raises(AssertionError, match="blobtool.stray is in no layer"):
        upward_imports(package)


# The command reaches the package through the library (docs/development.md): what it needs from a
# layer below has a name in blobtool.api (its modules by job), and it renders with report/.
COMMAND_REACHES = ("api", "records", "report", "errors", "cli")


def command_imports_below_the_library(package: Path = PACKAGE) -> list:
    """'importer imports imported' for every module of the command's layer importing one below the library,
    other than blobtool.errors and the package's own top level (its version, its names)."""
    modules = _modules(package)
    root = package.name

    def reached(other: str) -> bool:
        return other == root or any(other == f"{root}.{m}" or other.startswith(f"{root}.{m}.") for m in COMMAND_REACHES)

    return [f"{name} imports {other}" for name, path in sorted(modules.items()) if _layer(name, root) == 0
            for other in sorted(_imports(name, path, set(modules))) if not reached(other)]


def test_the_command_imports_only_the_library_the_report_and_errors():
    assert command_imports_below_the_library() == []


def test_the_command_rule_finds_an_import_below_the_library(tmp_path):
    # Deliberate violations, at the top and inside a function; the library, its modules, the report,
    # errors and the package's own names are fine.
    package = tmp_path / "blobtool"
    for folder in ("cli", "api", "report", "files", "formats"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("__version__ = '1'\n")
    (package / "errors.py").write_text("")
    (package / "api" / "kinds.py").write_text("from ..formats import x\n")
    (package / "report" / "text.py").write_text("")
    (package / "cli" / "group.py").write_text(
        "from .. import __version__, errors\nfrom ..api.kinds import x\nfrom ..report import text\n"
        "from ..api import load\nfrom ..formats import y\n\ndef f():\n    from .. import files\n")
    assert command_imports_below_the_library(package) == [
        "blobtool.cli.group imports blobtool.files",
        "blobtool.cli.group imports blobtool.formats",
    ]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _absolute(node: ast.ImportFrom, here: str) -> str:
    """The module a `from ... import` names, `here` being the package its relative dots start from."""
    base = node.module or ""
    if node.level:
        anchor = here.split(".")[:len(here.split(".")) - node.level + 1]
        base = ".".join(anchor + ([node.module] if node.module else []))
    return base


def private_imports(package: Path = PACKAGE) -> list:
    """Every use of another module's internals: `from M import _name` (M any module but __future__; _name not a
    submodule) and `mod._name` where the file imported `mod` as a module of the package."""
    modules = _modules(package)
    root = package.name
    found = []
    for name, path in sorted(modules.items()):
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        bound = {}  # a name this file binds to a module of the package -> that module
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules:
                        bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else root
            elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
                base = _absolute(node, here)
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    if target in modules:
                        bound[alias.asname or alias.name] = target
                    elif _private(alias.name) and not (package.parent / target.replace(".", "/")).is_dir():
                        found.append(f"{name} imports {alias.name} of {base}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                chain, inner = [node.attr], node.value
                while isinstance(inner, ast.Attribute):
                    chain.insert(0, inner.attr)
                    inner = inner.value
                if not isinstance(inner, ast.Name) or inner.id not in bound:
                    continue
                owner = bound[inner.id]
                for part in chain[:-1]:
                    if f"{owner}.{part}" not in modules:
                        break
                    owner = f"{owner}.{part}"
                else:
                    if f"{owner}.{node.attr}" not in modules:
                        found.append(f"{name} uses {node.attr} of {owner}")
    return found


def test_no_module_imports_another_modules_private_names():
    # Each module's underscore names are its own: what another module uses has a public name.
    assert private_imports() == []


def test_the_private_import_check_finds_one(tmp_path):
    # Deliberate violations: a module taking a sibling's internal by name, or
    # through the module it imported, and one of another package's; a public
    # name, a dunder, an underscore submodule and a standard module's internal
    # reached as an attribute (os._exit) are fine.
    package = tmp_path / "blobtool"
    (package / "files").mkdir(parents=True)
    (package / "_pb").mkdir()
    (package / "__init__.py").write_text("__version__ = '1'\n")
    (package / "_pb" / "__init__.py").write_text("")
    (package / "files" / "__init__.py").write_text("")
    (package / "files" / "mapped.py").write_text("_state = {}\nWRITTEN = ''\n")
    (package / "files" / "pages.py").write_text(
        "from __future__ import annotations\nimport os\nfrom .. import __version__, _pb\nfrom .mapped import WRITTEN\n"
        "from . import mapped\nimport blobtool.files.mapped as m\n\n"
        "def f():\n    from .mapped import _state\n    os._exit(mapped.WRITTEN or mapped.__name__)\n\n"
        "def g():\n    return mapped._state, m._state, _pb.__name__\n")
    (package / "files" / "other.py").write_text(
        "from os import _exit\nimport blobtool\n\nx = blobtool.files.mapped._state\n")
    assert sorted(private_imports(package)) == [
        "blobtool.files.other imports _exit of os",
        "blobtool.files.other uses _state of blobtool.files.mapped",
        "blobtool.files.pages imports _state of blobtool.files.mapped",
        "blobtool.files.pages uses _state of blobtool.files.mapped",
        "blobtool.files.pages uses _state of blobtool.files.mapped",
    ]


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


def sys_modules_uses(package: Path = PACKAGE) -> list:
    """'module:line' for every use of the attribute `sys.modules` in the package (outside _pb)."""
    found = []
    for name, path in sorted(_modules(package).items()):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr == "modules" and isinstance(node.value, ast.Name) \
                    and node.value.id == "sys":
                found.append(f"{name}:{node.lineno}")
    return found


def test_no_module_looks_up_sys_modules(tmp_path):
    # What a module needs from another comes in through an import or the call's Work, never by looking
    # into what happens to be loaded; the check itself finds a deliberate look-up.
    assert sys_modules_uses() == []
    package = tmp_path / "blobtool"
    (package / "engine").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "engine" / "__init__.py").write_text("")
    (package / "engine" / "syncedmem.py").write_text(
        "import sys\n\ndef f():\n    return sys.modules.get('blobtool.files.mapped')\n")
    assert sys_modules_uses(package) == ["blobtool.engine.syncedmem:4"]


def test_every_module_the_docs_name_imports_as_written():
    # `blobtool.engine.work.using(...)` in the docs: `import blobtool.engine.work` works. The short names
    # (blobtool.work) are attributes for a script, the engine's own modules.
    import importlib
    import re

    import blobtool

    texts = [PACKAGE.parent / "README.md", *sorted((PACKAGE.parent / "docs").glob("*.md"))]
    named = {m.group(1) for path in texts for m in re.finditer(r"\bblobtool((?:\.[a-z_]+)+)\.[A-Za-z_]+\b",
                                                                 path.read_text())}
    assert {".engine.work", ".files", ".errors"} <= named
    for dotted in sorted(named):
        module = importlib.import_module("blobtool" + dotted)
        assert module.__name__ == "blobtool" + dotted
    for short in ("work", "kernels", "device"):
        assert getattr(blobtool, short) is importlib.import_module(f"blobtool.engine.{short}")
