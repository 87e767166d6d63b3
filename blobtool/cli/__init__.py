"""The blobtool command: parse arguments, call the library, render, map errors to exit codes.

No arithmetic and no format logic live here: the commands call blobtool's
library (formats, api, compare, report) and print what it returns.

- group.py: the blobtool group, its options, and the mapping of errors to
  one stderr line and an exit code (errors.ExitCode);
- options.py: the options commands share;
- process.py: process set-up (BLAS threads, memory settings, signals, closed
  standard streams, worker pool);
- output.py: JSON Lines, tables, warnings, progress bars;
- work.py: opening inputs, selecting blobs, selecting a GPU;
- paths.py: the click types of input and output paths; names.py: --names;
  completion.py: shell completion of --blob's names;
- rules.py: Verb, the command class that checks which options apply
  together (one declared rule per option), refuses moved options and
  rewrites old spellings;
- inspect.py (info, norm, compare, devices), write.py (scale, update,
  convert), nets.py (definition, transplant, edit), fold.py (fold), run.py (run), predict.py (predict), export.py (export), show.py
  (show): one module per group of commands.

A new command is a function in one of those modules (or a new one), built
with rules.verb, and a line in JOBS below.

Imports inside functions: these modules load at every start of the
command, so what a command needs beyond click (numpy, rich, protobuf, the
format modules, the library) is imported inside the command that needs it,
and `blobtool info small.pb` loads no more than that file's format (the
start-up test of tests/project/test_package.py holds it). This is the one reason
for an import inside a function here.
"""

from __future__ import annotations

import sys

from ..errors import ExitCode
from .group import cli, fail_output, is_output_failure, quiet_broken_pipe, stopped
from .fold import fold
from .inspect import compare, devices, info, norm
from .export import export
from .nets import definition, edit, transplant
from .run import run
from .predict import predict
from .process import guard_standard_streams, keep_freed_memory, runs_nets, single_threaded_blas, stop_on_signals
from .show import show
from .write import convert, scale, update

__all__ = ["cli", "main", "JOBS", "COMMANDS"]

# The commands by job, in the order `blobtool --help` lists them.
JOBS = (
    ("Inspect", (info, show, compare, devices)),
    ("Blob math", (norm, scale, update)),
    ("Re-encode", (convert,)),
    ("Nets", (definition, transplant, edit, fold, run, predict, export)),
)
COMMANDS = tuple(command for _, commands in JOBS for command in commands)
for _command in COMMANDS:
    cli.add_command(_command)
cli.jobs = tuple((job, tuple(c.name for c in commands)) for job, commands in JOBS)


def main(argv=None) -> None:
    """Entry point of the blobtool script and of python -m blobtool."""
    from ..api.session import files

    if not runs_nets(sys.argv[1:] if argv is None else list(argv)):
        single_threaded_blas()  # first: before anything imports numpy
    keep_freed_memory()
    guard_standard_streams()
    stop_on_signals()
    with files.guarded():  # the command's inputs, leased and watched for its run (its end reported inside)
        try:
            cli.main(args=argv, prog_name="blobtool")
        except BrokenPipeError:
            quiet_broken_pipe()
            sys.exit(ExitCode.OK)
        except KeyboardInterrupt as exc:
            sys.exit(stopped(exc))
        except OSError as exc:  # --help or --version into a full or closed standard output
            if not is_output_failure(exc):
                raise
            sys.exit(fail_output(exc))
