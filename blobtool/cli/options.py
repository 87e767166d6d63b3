"""Options the commands share, and what they resolve to (input list, output target)."""

from __future__ import annotations

import math
import sys

import click

from ..api.kinds import KINDS, OUTPUT_FORMATS
from .completion import complete_blob_names
from .paths import INPUT, OUTPUT

# The formats of blob values (a net's definition as text is the definition command's).
BLOB_FORMATS = tuple(f for f in OUTPUT_FORMATS if f != "prototxt")

__all__ = ["NAMED_SHAPE", "parse_named_shapes", "parse_outputs", "parse_numbers", "INPUT", "OUTPUT", "BLOB_FORMATS", "Tolerance", "listed_names", "json_option", "json_object_option", "device_option",
           "blob_option",
           "kind_option", "output_options", "jobs_option", "fail_fast_option", "all_files_option", "inputs",
           "batch_inputs",
           "output_target"]


class Tolerance(click.ParamType):
    """A comparison tolerance: a finite number >= 0 (NaN, Inf and negative ones are usage errors)."""

    name = "tolerance"

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number) or number < 0:
            self.fail(f"{value!r} is not a tolerance: expected a finite number >= 0", param, ctx)
        return number + 0.0  # -0 is 0


def listed_names(ctx, param, value):
    """A click callback: an option's name (or names) with a command line's bytes that are not UTF-8 as \\xNN.

    Names read from files carry such bytes as \\xNN escapes (formats.listed_name):
    so the bytes as typed (a prefix, say) match them.
    """
    from ..api.kinds import listed_name

    if value is None:
        return None
    return tuple(map(listed_name, value)) if isinstance(value, tuple) else listed_name(value)


def json_option(f):
    return click.option("--json", "as_json", is_flag=True, help="Print JSON Lines: one object per input file.")(f)


def json_object_option(help_text: str):
    """--json for a command that prints one JSON object (compare: the comparison; devices: the device list)."""
    return click.option("--json", "as_json", is_flag=True, help=help_text)


def device_option(f):
    return click.option("--device", "device", type=click.IntRange(min=0), metavar="N", default=None,
                        help="Run the work on CUDA GPU N (needs the CUDA extra).")(f)


def blob_option(f):
    return click.option("--blob", "patterns", multiple=True, metavar="PATTERN", shell_complete=complete_blob_names,
                        help="Select blobs by name, glob (conv*/0) or layer name; repeatable.")(f)


def kind_option(f):
    """--kind, and --key (which state dict of a PyTorch checkpoint), the options of how inputs are read."""
    f = click.option("--key", metavar="KEY", default=None, expose_value=False, callback=_read_key,
                     help="In a PyTorch checkpoint (.pt/.pth) holding several state dicts, read the one at KEY "
                          "(keys of nested dicts joined by '/': ema, model/state_dict). Other inputs ignore "
                          "it.")(f)
    return click.option("--kind", type=click.Choice(KINDS), default=None,
                        help="Read the input as this kind instead of sniffing it.")(f)


def _read_key(ctx, param, value):
    # The group runs each command in a context of its own (group.py), so
    # this setting ends with the command.
    if value is not None:
        if not value or any(not part for part in value.split("/")):
            raise click.BadParameter(f"{value!r} is not a key: expected names joined by '/'", ctx, param)
        from ..api.kinds import ReadSettings, use_read_settings

        use_read_settings(ReadSettings(key=value))


def output_options(f):
    f = click.option("--format", "fmt", type=click.Choice(BLOB_FORMATS), default=None,
                     help="Output format: blob (one BlobProto), npy, npz, safetensors, hdf5 (Caffe's HDF5 snapshot "
                          "of a net or solver state), protobuf (the input's kind as Caffe's protobuf), or same (the "
                          "input's kind and format). Default by extension: .npy, .npz, .safetensors, "
                          ".pb/.binaryproto (one blob), .h5/.hdf5, .caffemodel/.solverstate (protobuf); a name "
                          "without an extension: same; any other extension is refused (exit 2).")(f)
    f = click.option("-o", "--output", type=OUTPUT, default=None, metavar="PATH",
                     help="Where to write ('-' for stdout; default stdout when it is not a terminal).")(f)
    return f


def jobs_option(f):
    return click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, metavar="N",
                        help="Use N CPU cores (default and most: the cores blobtool may run on, which "
                             "taskset and cpusets limit): several files at once in worker processes, or one "
                             "large blob's sums split over N threads. Output stays in input order.")(f)


def fail_fast_option(f):
    return click.option("--fail-fast", is_flag=True,
                        help="Stop at the first input that cannot be read (default: report every good input, one "
                             "stderr line per bad one, and exit with the worst code at the end).")(f)


def all_files_option(f):
    return click.option("--all-files", is_flag=True,
                        help="In folders, read every regular file, whatever its name (default: only those with an "
                             "extension blobtool reads; the others are counted on stderr).")(f)


# How many of a folder's skipped files its stderr line names.
SKIPPED_NAMED = 3


def batch_inputs(files, all_files: bool = False) -> tuple[list, list]:
    """inputs(files), each folder among them replaced by the files in it that blobtool reads, recursively.

    A folder contributes its regular files whose extension is one of
    formats.EXTENSIONS (case-insensitive; every regular file with
    `all_files`), in sorted order; anything that is not a regular file (a
    FIFO, a device) is never read from a folder. A folder with no such file,
    or one that cannot be listed, becomes a FormatError in the list: a bad
    input like an unreadable file, reported in its place.

    Returns (the paths, the warnings): one line per folder whose files
    without such an extension were skipped, counting and naming them.
    """
    import os

    from ..api.kinds import EXTENSIONS

    found, warnings = [], []
    for path in inputs(files):
        if path == "-" or not os.path.isdir(path):
            found.append(path)
            continue
        files_here, skipped, failures = [], [], []
        for folder, subfolders, names in os.walk(path, onerror=failures.append):
            subfolders.sort()
            for name in names:
                full = os.path.join(folder, name)
                if os.path.isfile(full):
                    (files_here if all_files or name.lower().endswith(EXTENSIONS) else skipped).append(full)

        def in_order(p):
            return os.path.relpath(p, path).split(os.sep)

        files_here.sort(key=in_order)
        found += files_here
        found += [_folder_error(exc.filename or path, f"cannot be listed: {exc.strerror}") for exc in failures]
        if skipped:
            skipped.sort(key=in_order)
            named = ", ".join(os.path.relpath(p, path) for p in skipped[:SKIPPED_NAMED])
            more = ", ..." if len(skipped) > SKIPPED_NAMED else ""
            count = f"{len(skipped)} file{'s' if len(skipped) != 1 else ''}"
            them, args = ("them", "arguments") if len(skipped) > 1 else ("it", "an argument")
            how = f"name {them} as {args}, or give --all-files, to read {them}"
            if not files_here and not failures:
                found.append(_folder_error(path, f"is a folder holding no file with an extension blobtool reads "
                                                 f"({', '.join(EXTENSIONS)}), and {count} without one ({named}{more}): "
                                                 f"{how}"))
            else:
                warnings.append(f"{path}: skipped {count} without an extension blobtool reads ({named}{more}); "
                                f"{how}")
        elif not files_here and not failures:
            found.append(_folder_error(path, f"is a folder holding no file that blobtool reads "
                                             f"({', '.join(EXTENSIONS)})"))
    return found, warnings


def _folder_error(path, message):
    from ..errors import FormatError

    return FormatError(message, path=path)


def inputs(files) -> list:
    """The input paths: the files given, or "-" (standard input) when none is and stdin is not a terminal."""
    if not files:
        if sys.stdin is None or sys.stdin.isatty():
            raise click.UsageError("no input file given, and standard input is a terminal")
        return ["-"]
    if list(files).count("-") > 1:
        raise click.UsageError("standard input ('-') can be read only once")
    return list(files)


def output_target(output):
    """Where a writing command writes: -o PATH, else stdout when it is not a terminal."""
    if output is None:
        if sys.stdout.isatty():
            raise click.UsageError("refusing to write binary data to a terminal; use -o PATH (or -o - to insist)")
        output = "-"
    return output


def parse_named_shapes(values) -> dict:
    """{name: shape} from NAME=D0,D1,... values (--input-shape); click.BadParameter for a malformed one."""
    from ..errors import UsageError
    from ..api.choices import parse_shape

    shapes = {}
    for value in values:
        name, eq, dims = value.rpartition("=")
        if not eq or not name:
            raise click.BadParameter(f"{value!r}: expected NAME=D0,D1,... (data=1,3,224,224)",
                                     param_hint="'--input-shape'")
        if name in shapes:
            raise click.BadParameter(f"{name!r} is given twice", param_hint="'--input-shape'")
        try:
            shapes[name] = parse_shape(dims)
        except UsageError as exc:
            raise click.BadParameter(exc.reason.removeprefix("--input-shape: "), param_hint="'--input-shape'")
    return shapes


NAMED_SHAPE = click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=D0,D1,...",
                           help="The shape of input NAME (a data layer's, which lies in its database), or of a "
                                "blob the net computes, taken as the input instead; repeatable.")


def parse_outputs(value):
    """--outputs of run and export: None (the net's outputs), "all", or the blob names given, in order."""
    if value is None or value == "all":
        return value
    names = [n for n in value.split(",") if n]
    if not names:
        raise click.BadParameter("expected all, or blob names separated by commas", param_hint="'--outputs'")
    return names


def parse_numbers(text, what: str, count=None) -> list | None:
    """Comma-separated numbers of an option; click.BadParameter naming it otherwise."""
    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected numbers separated by commas", param_hint=what) from None
    if count is not None and len(values) != count:
        raise click.BadParameter(f"{text!r}: expected {count} numbers", param_hint=what)
    return values
