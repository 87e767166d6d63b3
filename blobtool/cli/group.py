"""The blobtool group: its options, and the one place where errors become a stderr line and an exit code.

Exit codes are errors.ExitCode; the --help text says them from there.
"""

from __future__ import annotations

import contextvars
import errno
import os
import sys

import click

from .. import __version__
from ..errors import BlobToolError, ExitCode, FormatError, exit_codes_help
from ..report.escape import escape

__all__ = ["BlobtoolGroup", "cli", "CONTEXT_SETTINGS", "say_error", "error_line", "option_name", "batch_error", "debug_traceback", "quiet_broken_pipe",
           "is_output_failure", "fail_output", "stopped"]

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

# OS errors that mean "the output cannot be written" (exit 5) when they escape;
# EBADF: standard output was closed (see process.guard_standard_streams).
_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EIO, errno.EBADF}


def _debug_enabled() -> bool:
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx else None
    if root is not None and root.params.get("debug"):
        return True
    return os.environ.get("BLOBTOOL_DEBUG", "") not in ("", "0")


def _print_traceback() -> None:
    import traceback  # only with --debug: not worth loading on every start

    traceback.print_exc()


def debug_traceback(exc: BaseException) -> None:
    """With --debug (or BLOBTOOL_DEBUG=1), the traceback of an error that is reported and then gone past."""
    if _debug_enabled():
        import traceback

        traceback.print_exception(exc)


# The option that gives each library parameter an error names, where its name
# is not the parameter's with "_" as "-" (strip_prefix -> --strip-prefix):
# select()'s patterns and write()'s blobs are what --blob chooses;
# parse_renames' pairs and edit_layers' renames are --rename's, its drops
# --drop's; info_record's layer_defs is what --layers asks for; `net` (the
# library's definition of a net's layer types) is --definition's. A parameter
# named with its value ("name=repr(value)") is the command's flag of that
# value where it has one, else the option and the value (format='blob' ->
# --format blob, precision='half' -> --precision half).
OPTIONS = {"patterns": "--blob", "blobs": "--blob", "pairs": "--rename", "renames": "--rename", "drops": "--drop",
           "layer_defs": "--layers", "net": "--definition", "half_strict": "--strict",
           "write_diff=False": "--no-diff", "shapes": "--input-shape"}


def option_name(parameter: str) -> str:
    """The command's option for the library's keyword argument `parameter` (or "name=repr(value)": see OPTIONS)."""
    if parameter in OPTIONS:
        return OPTIONS[parameter]
    name, given, value = parameter.partition("=")
    option = "--" + name.replace("_", "-")
    if not given:
        return option
    import ast  # only when an error names a value

    return f"{option} {ast.literal_eval(value)}"


def error_line(exc: BlobToolError) -> str:
    """What the command says of a library error: its message, the parameters named as options."""
    return exc.rendered(option_name)


def say_error(message: str) -> None:
    """One line on stderr: "blobtool: " and the message, its line breaks turned into blanks, names escaped.

    A closed or full stderr (2>&-, 2>/dev/full) loses the line, not the exit code.
    """
    _say("blobtool: " + escape(" ".join(str(message).split("\n"))))


def _say(line: str) -> None:
    try:
        click.echo(line, err=True)
    except (OSError, ValueError):
        _discard(sys.stderr)


def quiet_broken_pipe() -> None:
    """Point stdout at /dev/null: the reader went away (blobtool info *.pb | head -1).

    Stops quietly, and keeps Python's final flush of stdout from complaining.
    """
    _discard(sys.stdout)


def _discard(stream) -> None:
    # What is still buffered for a stream that failed goes to /dev/null at
    # exit: a failed final flush would make Python exit 120.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass


def is_output_failure(exc: OSError) -> bool:
    """Whether an OS error that escaped a command means standard output cannot be written."""
    return exc.errno in _OUTPUT_ERRNOS


def fail_output(exc: OSError) -> int:
    """Say that standard output cannot be written (files are written through atomic_output); exit 5."""
    say_error(f"<stdout>: cannot write: {exc.strerror}")
    quiet_broken_pipe()  # and no second complaint from the final flush
    return ExitCode.OUTPUT


def _settle_inputs(exc: BaseException | None = None) -> BaseException | None:
    """No further stop from an input's writer while the end is reported; the error to report.

    A read error in an input that another process changed meanwhile (a
    truncation seen as "truncated at byte N") is reported as that change.
    """
    from ..api.session import files  # not at start-up: the group's help and completion need no input

    changed = files.settle()
    if (changed is not None and isinstance(exc, FormatError) and exc.path == changed
            and "changed while it was read" not in str(exc)):
        return FormatError(files.WRITTEN, path=changed)
    return exc


def batch_error(exc: BlobToolError) -> BlobToolError:
    """The error of one bad input in a batch that goes on, told as its change if another process changed it.

    Its tracebacks are dropped (printed already with --debug): their frames
    hold the input's mapping, whose watch then goes with it; a write that
    comes later stops nothing, as the input was reported.
    """
    from ..api.session import files

    if exc.path is None:
        return exc
    link = exc
    while link is not None:
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    if (files.take_change(exc.path) and isinstance(exc, FormatError)
            and "changed while it was read" not in str(exc)):
        return FormatError(files.WRITTEN, path=exc.path)
    return exc


def _report_pending_change() -> None:
    """Raise the change of an input that was found where it could not be raised (a finalizer, an import)."""
    from ..api.session import files

    files.raise_deferred_stop()
    changed = files.pending_change()
    if changed is not None:
        raise FormatError(files.WRITTEN, path=changed)


def stopped(exc: KeyboardInterrupt) -> int:
    """Say what stopped blobtool (a signal, a writer of an input: errors.Stopped, or Ctrl-C); its exit code."""
    _settle_inputs()
    say_error(getattr(exc, "message", "interrupted"))
    return getattr(exc, "exit_code", ExitCode.INTERRUPTED)


class BlobtoolGroup(click.Group):
    """Maps the library's errors to one stderr line and the documented exit code; lists its commands by job."""

    jobs: tuple = ()   # ((job, (command name, ...)), ...): set where the commands are added (cli/__init__.py)

    def list_commands(self, ctx):
        listed = [name for _, names in self.jobs for name in names]
        return listed + sorted(set(self.commands) - set(listed))

    def format_commands(self, ctx, formatter):
        widest = max((len(name) for name in self.commands), default=0)
        for job, names in self.jobs:
            # Every section's names padded to the widest, so that the descriptions line up across sections.
            rows = [(name.ljust(widest), self.commands[name].get_short_help_str(formatter.width - 6 - widest))
                    for name in names if name in self.commands]
            if rows:
                with formatter.section(job):
                    formatter.write_dl(rows)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        # Click's own usage errors print four lines (usage, hint, blank, error);
        # blobtool's errors are one line, whoever finds them.
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as exc:
            command = exc.ctx.command_path if getattr(exc, "ctx", None) else "blobtool"
            hint = f" (see '{command} --help')" if isinstance(exc, click.UsageError) else ""
            _say(escape(f"{command}: {exc.format_message()}{hint}"))
            sys.exit(exc.exit_code)
        except click.exceptions.Abort as exc:  # a signal while the arguments were parsed
            sys.exit(stopped(exc.__cause__ if isinstance(exc.__cause__, KeyboardInterrupt) else exc))
        sys.exit(code if isinstance(code, int) else ExitCode.OK)

    def invoke(self, ctx):
        try:
            # The command runs in a copy of this context: the read settings its
            # options set (--key) end with it (CliRunner runs many in one thread).
            result = contextvars.copy_context().run(super().invoke, ctx)
            _report_pending_change()
            return result
        except BlobToolError as caught:
            exc = _settle_inputs(caught)
            if _debug_enabled():
                _print_traceback()
            say_error(error_line(exc))
            if exc.path == "<stdout>":
                quiet_broken_pipe()  # no second complaint from the final flush
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt as exc:
            ctx.exit(stopped(exc))
        except BrokenPipeError:
            quiet_broken_pipe()
            ctx.exit(ExitCode.OK)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except OSError as exc:
            if not is_output_failure(exc):
                raise
            # Results printed to a full disk (blobtool info > /dev/full): files are
            # written through atomic_output, so this is standard output.
            ctx.exit(fail_output(exc))
        except Exception as exc:  # a bug: one line, traceback with --debug
            if _debug_enabled():
                _print_traceback()
            say_error(f"internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)")
            ctx.exit(ExitCode.INTERNAL)


_HELP = f"""Inspect, compare and convert Caffe blob files.

\b
Reads (the kind is sniffed from the bytes, not the name):
  BlobProto (.binaryproto, .pb, .protobin; the `shape` field or the legacy
    num/channels/height/width), BlobProtoVector, nets (.caffemodel) and
    solver states (.solverstate) as protobuf, nets' definitions as text
    (.prototxt), Caffe's HDF5 snapshots (.caffemodel.h5, .solverstate.h5),
    .npy and .npz arrays, .safetensors, PyTorch state dicts (.pt, .pth; no
    pickle is ever run).
info and norm also take folders (every such file in them, recursively).

{exit_codes_help()}

\b
Example:
  blobtool info mean.binaryproto
"""


@click.group(cls=BlobtoolGroup, context_settings=CONTEXT_SETTINGS, help=_HELP)
@click.version_option(__version__, "-V", "--version", prog_name="blobtool")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors (also BLOBTOOL_DEBUG=1).")
def cli(debug: bool) -> None:
    # The group itself does nothing: --debug is read where errors are reported.
    return None
