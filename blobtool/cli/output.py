"""What the commands print: JSON Lines, tables (plain text off a terminal, rich on one), warnings, progress."""

from __future__ import annotations

import contextlib
import functools
import sys

import click

__all__ = ["say_check", "emit", "emit_json", "consoles", "warn", "say_warning", "progress", "PROGRESS_THRESHOLD"]

# Inputs larger than this get a progress bar (on a terminal only).
PROGRESS_THRESHOLD = 64 << 20


def emit(record: dict, as_json: bool, *, plain, draw) -> None:
    """Print one file's record: a JSON line, or a table.

    `plain(record, width)` is the table as plain text (report.text), or None
    where only rich can draw it; it is used off a terminal, where it equals
    what rich would print without loading rich. `draw(console)` draws the
    table with rich otherwise.
    """
    if as_json:
        emit_json(record)
        return
    from ..report import text

    if text.plain_stdout():
        written = plain(record, text.plain_width())
        if written is not None:
            sys.stdout.write(written)
            sys.stdout.flush()
            return
    out, _ = consoles()
    draw(out)


def emit_json(obj: dict) -> None:
    import json

    click.echo(json.dumps(_lossless_paths(obj), separators=(", ", ": ")))


# The keys whose values are file names as given on the command line.
_PATH_KEYS = ("path", "a", "b")


def _lossless_paths(obj: dict) -> dict:
    """File names that are not UTF-8, shown with U+FFFD and given byte for byte in "<key>_base64".

    Python hands such a name over with its undecodable bytes as lone
    surrogates, which are not Unicode: JSON readers reject or replace them.
    """
    if not any(isinstance(obj.get(k), str) and not _is_unicode(obj[k]) for k in _PATH_KEYS):
        return obj
    import base64
    import os

    out = {}
    for key, value in obj.items():
        if key in _PATH_KEYS and isinstance(value, str) and not _is_unicode(value):
            raw = os.fsencode(value)
            out[key] = raw.decode("utf-8", "replace")
            out[key + "_base64"] = base64.b64encode(raw).decode("ascii")
        else:
            out[key] = value
    return out


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _console_class():
    from rich.console import Console

    class QuietPipeConsole(Console):
        def on_broken_pipe(self) -> None:
            # rich would exit 1 here; the group handles a broken pipe (exit 0).
            self.quiet = True
            raise BrokenPipeError

    return QuietPipeConsole


def _escape_unencodable(stream) -> None:
    encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
    if not encoding.startswith("utf") and hasattr(stream, "reconfigure"):
        stream.reconfigure(errors="backslashreplace")


def consoles():
    """(stdout console, stderr console) for the current stdout and width, made on first use (rich is imported then).

    Made again when stdout or $COLUMNS changes: a caller that runs several
    commands in one process (click's CliRunner, each with its own stdout and
    environment) gets each one's width, not the first one's.
    """
    # Off a terminal rich would wrap at 80 columns; tables read better unwrapped in logs.
    from ..report.text import plain_width

    return _consoles(sys.stdout, None if sys.stdout.isatty() else plain_width())


@functools.lru_cache(maxsize=4)
def _consoles(stdout, width):
    # Keyed by the stream itself, not its id: a new stream at a freed one's address is a new key.
    Console = _console_class()
    # A stream that cannot encode a name's letters (PYTHONIOENCODING=ascii)
    # writes them as backslash escapes rather than failing halfway through a table.
    _escape_unencodable(stdout)
    # Names come from the files: print them as they are, never as rich markup
    # ("fc[relu]") or emoji codes (":x:").
    literal = {"markup": False, "emoji": False, "highlight": False}
    return Console(width=width, **literal), Console(stderr=True, **literal)


def warn(doc) -> None:
    """One stderr line per warning about a document's blobs."""
    for line in doc.warnings:
        say_warning(line)


def say_warning(line: str) -> None:
    """"blobtool: warning: " and the line, on stderr, names in it escaped."""
    from ..report.escape import escape

    try:
        click.echo("blobtool: warning: " + escape(line), err=True)
    except (OSError, ValueError):
        pass  # a closed or full stderr loses the warning, not the command's result


@contextlib.contextmanager
def progress(doc, what: str, enabled: bool = True):
    """A rich progress bar on stderr while working through a big input, when stderr is a terminal."""
    if not enabled or doc.size <= PROGRESS_THRESHOLD or not sys.stderr.isatty():
        yield
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    from ..api.session import using

    _, err = consoles()
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        from ..report.escape import escape

        task = bar.add_task(f"{what} {escape(doc.path)}", total=doc.size)
        with using(progress=lambda n: bar.advance(task, n)):
            yield


def say_check(verdict) -> None:
    """A --check's verdict on stderr, "blobtool: " before each line (forward/check.py's); exit 1 when a blob differs."""
    from .group import say_error

    for line in verdict.lines():
        say_error(line)
    if not verdict.passed:
        raise click.exceptions.Exit(1)
