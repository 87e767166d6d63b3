"""Running the blobtool command in tests: in-process with click's CliRunner, or as a real process.

- ``invoke``: in-process; stdout and stderr kept apart (click 8.2+); ``TerminalRunner``
  when standard input or output must claim to be a terminal.
- ``run_blobtool``: ``python -m blobtool`` in a subprocess, importing this checkout's
  blobtool (``subprocess_env``: PYTHONPATH set to the repository root, BLOBTOOL_DEBUG
  removed); ``blobtool_cmd`` and ``BLOBTOOL`` are its command line as a list and as shell text.
- ``run_pipeline``: a bash pipeline (``set -o pipefail``) in that environment.
- ``json_lines``, ``one_json``: the JSON records an in-process run printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from blobtool.cli import cli

REPO = Path(__file__).resolve().parents[2]


# -- in-process ---------------------------------------------------------------------------

class TerminalRunner(CliRunner):
    """A CliRunner whose standard input and/or output claim to be a terminal."""

    def __init__(self, *, stdin_tty=False, stdout_tty=False):
        super().__init__()
        self.stdin_tty = stdin_tty
        self.stdout_tty = stdout_tty

    @contextlib.contextmanager
    def isolation(self, *args, **kwargs):
        with super().isolation(*args, **kwargs) as streams:
            if self.stdin_tty:
                sys.stdin.isatty = lambda: True
            if self.stdout_tty:
                sys.stdout.isatty = lambda: True
            yield streams


def invoke(*args, input=None, env=None, columns: int | None = 200, runner: CliRunner | None = None):
    """Run blobtool in-process with these arguments (each made a string); the click Result.

    COLUMNS is set wide (`columns`; None leaves it as it is) so that rich does not
    wrap table cells across lines; `env` is set on top (a None value unsets a variable).
    """
    env = {**({"COLUMNS": str(columns)} if columns is not None else {}), **(env or {})}
    return (runner or CliRunner()).invoke(cli, [str(a) for a in args], input=input, env=env or None,
                                          prog_name="blobtool")


def ok(*args, **kw):
    """invoke(*args), which must exit 0; the click Result."""
    result = invoke(*args, **kw)
    assert result.exit_code == 0, (args, result.exit_code, result.stdout, result.stderr)
    return result


def assert_error(result, code: int, *fragments, warnings: bool = False) -> str:
    """Exit `code` with one 'blobtool: ...' error line holding each of `fragments`, and no traceback; the line.

    With `warnings`, 'blobtool: warning: ' lines may come before it.
    """
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = [ln for ln in result.stderr.splitlines() if not (warnings and ln.startswith("blobtool: warning: "))]
    assert len(lines) == 1 and lines[0].startswith("blobtool: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def assert_usage(result, command: str, *fragments) -> str:
    """Exit 2 with click's one usage line, "blobtool COMMAND: ...", holding each of `fragments`; the line."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"blobtool {command}: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def rich_text(renderer, record: dict, width: int, *, terminal: bool = False) -> str:
    """What `renderer(console, record)` prints on a rich console `width` columns wide, colour off to read
    the text: off a terminal as blobtool's own console is there (markup, emoji and highlighting off), or
    on one (`terminal`)."""
    import io

    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, width=width, markup=False, emoji=False, highlight=False, force_terminal=terminal,
                      color_system=None)
    renderer(console, record)
    return out.getvalue()


def json_lines(result) -> list:
    return [json.loads(line) for line in result.stdout.splitlines()]


def one_json(result) -> dict:
    (record,) = json_lines(result)
    return record


def error_lines(result) -> list:
    """A result's stderr, a line each."""
    return result.stderr.splitlines()


def listing(folder) -> list:
    """Every path under `folder`, relative to it, sorted: what a command left behind."""
    return sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*"))


# -- real processes -----------------------------------------------------------------------

def subprocess_env(**extra) -> dict:
    """The environment for a blobtool process: this checkout first on PYTHONPATH, no BLOBTOOL_DEBUG; then `extra`.

    COLUMNS and LINES are left out unless `extra` sets them: a test's output is as wide as a pipe's
    (DEFAULT_PLAIN_WIDTH) whatever terminal, or parallel test worker, started the tests.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    for name in ("BLOBTOOL_DEBUG", "COLUMNS", "LINES"):
        env.pop(name, None)
    env.update(extra)
    return env


def blobtool_cmd(*args, python_flags=()) -> list:
    return [sys.executable, *python_flags, "-m", "blobtool", *map(str, args)]


BLOBTOOL = " ".join(map(shlex.quote, blobtool_cmd()))


def run_blobtool(*args, env=None, timeout=60, python_flags=(), **kw) -> subprocess.CompletedProcess:
    """``python -m blobtool ARGS`` to its end; stdout and stderr captured unless `kw` directs them.

    `env` defaults to ``subprocess_env()``; `kw` goes to subprocess.run (cwd, text, stdin, ...).
    """
    if "stdout" not in kw and "stderr" not in kw:
        kw["capture_output"] = True
    return subprocess.run(blobtool_cmd(*args, python_flags=python_flags), env=env or subprocess_env(),
                          timeout=timeout, **kw)


def run_pipeline(command: str, cwd: Path, *, timeout=60, **kw) -> subprocess.CompletedProcess:
    """A bash command line (``BLOBTOOL`` in it runs blobtool) with pipefail, in ``subprocess_env()``."""
    return subprocess.run(["bash", "-c", "set -o pipefail; " + command], capture_output=True, cwd=cwd,
                          env=subprocess_env(), timeout=timeout, **kw)


def complete(*words, shell: str = "bash") -> tuple[list, str, int]:
    """What `blobtool WORDS<Tab>` offers (the last word is the one being completed): (values, stderr, exit)."""
    words = ["blobtool", *map(str, words)]
    env = subprocess_env(_BLOBTOOL_COMPLETE=f"{shell}_complete", COMP_WORDS=" ".join(words),
                         COMP_CWORD=str(len(words) - 1))
    result = run_blobtool(env=env, text=True)
    if shell == "bash":
        values = [line.split(",", 1)[1] for line in result.stdout.splitlines() if line]
    else:  # zsh: type, value, help, one line each
        values = result.stdout.splitlines()[1::3]
    return values, result.stderr, result.returncode


def peak_rss_run(tmp_path, *args):
    """Run blobtool in a child that reports its own peak RSS (VmHWM) after the command; (stdout, KiB)."""
    report = tmp_path / "hwm"
    script = ("import sys, runpy\n"
              "try:\n"
              "    runpy.run_module('blobtool', run_name='__main__')\n"
              "finally:\n"
              f"    hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
              f"    open({str(report)!r}, 'w').write(hwm)\n")
    res = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                         env=subprocess_env(), timeout=300)
    return res, int(report.read_text())
