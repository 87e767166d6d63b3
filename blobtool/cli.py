"""The blobtool command: parse arguments, call the library, render, map errors to exit codes.

No arithmetic and no format logic live here. Exit codes (see the README):
0 ok; 1 differences found or a check failed; 2 usage error; 3 input
unreadable or invalid; 4 GPU asked for but not available; 5 output cannot be
written; 130 interrupted.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import sys

import click

from . import __version__
from .errors import BlobToolError, UsageError

EXIT_OK, EXIT_DIFFERENT, EXIT_USAGE, EXIT_INPUT, EXIT_GPU, EXIT_OUTPUT = 0, 1, 2, 3, 4, 5
EXIT_INTERRUPTED = 130
EXIT_INTERNAL = 70

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
OUTPUT_FORMATS = ("blob", "npy", "npz", "same")
# Extensions that mean "one BlobProto" when the input is a container.
BLOB_EXTENSIONS = (".pb", ".binaryproto", ".blob", ".protobin")


# OS errors that mean "the output cannot be written" (exit 5) when they escape.
_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EIO}


def _debug_enabled() -> bool:
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx else None
    if root is not None and root.params.get("debug"):
        return True
    return os.environ.get("BLOBTOOL_DEBUG", "") not in ("", "0")


def _print_traceback() -> None:
    import traceback  # only with --debug: not worth loading on every start

    traceback.print_exc()


def _say_error(message: str) -> None:
    click.echo("blobtool: " + " ".join(str(message).split("\n")), err=True)


def _quiet_broken_pipe() -> None:
    # The reader went away (blobtool info *.pb | head -1): stop quietly, and
    # keep Python's final flush of stdout from complaining.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _console_class():
    from rich.console import Console

    class QuietPipeConsole(Console):
        def on_broken_pipe(self) -> None:
            # rich would exit 1 here; BlobtoolGroup.invoke handles a broken pipe (exit 0).
            self.quiet = True
            raise BrokenPipeError

    return QuietPipeConsole


class BlobtoolGroup(click.Group):
    """Maps the library's errors to one stderr line and the documented exit code."""

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
            click.echo(f"{command}: {exc.format_message()}{hint}", err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            _say_error("interrupted")
            sys.exit(EXIT_INTERRUPTED)
        sys.exit(code if isinstance(code, int) else EXIT_OK)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BlobToolError as exc:
            if _debug_enabled():
                _print_traceback()
            _say_error(str(exc))
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            _say_error("interrupted")
            ctx.exit(EXIT_INTERRUPTED)
        except BrokenPipeError:
            _quiet_broken_pipe()
            ctx.exit(EXIT_OK)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except OSError as exc:
            if exc.errno not in _OUTPUT_ERRNOS:
                raise
            # Results printed to a full disk (blobtool info > /dev/full): files are
            # written through atomic_output, so this is standard output.
            _say_error(f"<stdout>: cannot write: {exc.strerror}")
            _quiet_broken_pipe()  # and no second complaint from the final flush
            ctx.exit(EXIT_OUTPUT)
        except Exception as exc:  # a bug: one line, traceback with --debug
            if _debug_enabled():
                _print_traceback()
            _say_error(f"internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)")
            ctx.exit(EXIT_INTERNAL)


@click.group(cls=BlobtoolGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "-V", "--version", prog_name="blobtool")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors (also BLOBTOOL_DEBUG=1).")
def cli(debug: bool) -> None:
    """Inspect, compare and convert Caffe blob files.

    Reads BlobProto files (the `shape` field and the legacy num/channels/height/width
    fields) and .npy arrays; the kind is sniffed from the bytes, not the name.

    \b
    Exit codes: 0 ok, 1 differences found or a check failed, 2 usage error,
    3 input unreadable or invalid, 4 GPU not available, 5 output not writable.

    \b
    Example:
      blobtool info mean.binaryproto
    """


# -- shared options and helpers ---------------------------------------------

def _json_option(f):
    return click.option("--json", "as_json", is_flag=True, help="Print JSON Lines: one object per input file.")(f)


def _device_option(f):
    return click.option("--device", "device", type=click.IntRange(min=0), metavar="N", default=None,
                        help="Run the work on CUDA GPU N (needs the CUDA extra).")(f)


def _blob_option(f):
    return click.option("--blob", "patterns", multiple=True, metavar="PATTERN",
                        help="Select blobs by name, glob (conv*/0) or layer name; repeatable.")(f)


def _kind_option(f):
    from .kinds import KINDS
    return click.option("--kind", type=click.Choice(KINDS), default=None,
                        help="Read the input as this kind instead of sniffing it.")(f)


def _output_options(f):
    f = click.option("--format", "fmt", type=click.Choice(OUTPUT_FORMATS), default=None,
                     help="Output format: blob (one BlobProto), npy, npz, or same (the input's kind). "
                          "Default by extension: .npy, .npz, .pb/.binaryproto (one blob), else same.")(f)
    f = click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True), default=None,
                     metavar="PATH", help="Where to write ('-' for stdout; default stdout when it is not a terminal).")(f)
    return f


def _jobs_option(f):
    return click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, metavar="N",
                        help="Use N CPU cores (default: all): several files at once in worker "
                             "processes, or one large blob's sums split over N threads. Output stays in "
                             "input order.")(f)


# Below this much input in all, starting worker processes (about 0.25 s each
# here) costs more than it saves; BLOBTOOL_PARALLEL_MIN_BYTES overrides it.
PARALLEL_THRESHOLD = 512 << 20
_BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _single_threaded_blas() -> None:
    """Before numpy loads: one BLAS thread, unless the user chose otherwise.

    blobtool calls BLAS only for dot products of cache-sized chunks, and
    spreads big reductions over the cores itself (kernels.set_threads). BLAS's
    own threads on such short vectors cost time: norm of 256 MiB of float32
    took 80 ms with OpenBLAS on 2 threads, 56 ms on one, 31 ms split over 2
    of blobtool's threads.
    """
    if "numpy" not in sys.modules:
        for name in _BLAS_THREAD_VARIABLES:
            os.environ.setdefault(name, "1")


def _keep_freed_memory() -> bool:
    """Let the C library keep the chunk buffers it frees, instead of returning them to the system.

    The chunked kernels allocate and free a few 512 KiB temporaries per chunk.
    By default glibc serves such sizes with mmap, or trims its heap once they
    are freed, and every reuse faults the pages in again: compare of two
    256 MiB blobs took 2.6 s that way and 0.64 s with a 32 MiB mmap threshold
    and a 256 MiB trim threshold. Memory stays bounded by what is in use at
    once; only the return of freed memory to the system is deferred. True
    when the C library took the settings (glibc).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # a C library without mallopt
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    return bool(mallopt(m_trim_threshold, 256 << 20)) and bool(mallopt(m_mmap_threshold, 32 << 20))


def _total_size(paths) -> int:
    total = 0
    for path in paths:
        try:
            total += os.stat(path).st_size
        except OSError:
            pass
    return total


def _records(paths: list, work, jobs):
    """work(path) for each path, yielded in input order; in worker processes when several files are given.

    The first failing file stops the run, as it would one file at a time.
    """
    jobs = jobs or os.cpu_count() or 1
    threshold = int(os.environ.get("BLOBTOOL_PARALLEL_MIN_BYTES", PARALLEL_THRESHOLD))
    if jobs == 1 or len(paths) < 2 or "-" in paths or _total_size(paths) < threshold:
        from .kernels import using_threads

        # One file at a time here: its big reductions use the cores instead.
        with using_threads(jobs):
            for path in paths:
                yield work(path)
        return
    import concurrent.futures
    import multiprocessing

    # Fresh worker processes (spawn), each with one BLAS thread: forked
    # workers inherit numpy's BLAS thread pool, and N workers x M BLAS threads
    # on the same cores ran 10x slower than one process (measured: 32 nets of
    # 16 MiB, 5.8 s against 0.6 s).
    context = multiprocessing.get_context("spawn")
    saved = {name: os.environ.get(name) for name in _BLAS_THREAD_VARIABLES}
    os.environ.update({name: "1" for name in _BLAS_THREAD_VARIABLES})
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, len(paths)), mp_context=context)
    try:
        futures = [pool.submit(work, path, show_progress=False) for path in paths]
        for future in futures:
            yield future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _inputs(files) -> list:
    if not files:
        if sys.stdin is None or sys.stdin.isatty():
            raise click.UsageError("no input file given, and standard input is a terminal")
        return ["-"]
    if list(files).count("-") > 1:
        raise click.UsageError("standard input ('-') can be read only once")
    return list(files)


def _output(output):
    if output is None:
        if sys.stdout.isatty():
            raise click.UsageError("refusing to write binary data to a terminal; use -o PATH (or -o - to insist)")
        output = "-"
    return output


def _output_format(output: str, fmt, doc) -> str:
    """The format to write: --format, else from the extension, else the input's own kind."""
    from .kinds import CONTAINER_KINDS
    if fmt is None:
        lower = output.lower()
        if lower.endswith(".npy"):
            fmt = "npy"
        elif lower.endswith(".npz"):
            fmt = "npz"
        elif doc.kind in CONTAINER_KINDS and not lower.endswith(BLOB_EXTENSIONS):
            fmt = "same"
        else:
            fmt = "blob"
    if fmt == "same" and doc.kind not in CONTAINER_KINDS + ("blob",):
        raise UsageError(f"a {doc.kind} input has no container form to write back; "
                         "choose .npy, .npz or a blob file")
    return fmt


def _emit(record: dict, as_json: bool, renderer: str, **options) -> None:
    """Print one file's record: a JSON line, or the named rich renderer (imported only then)."""
    if as_json:
        _emit_json(record)
        return
    plain = _PLAIN.get(renderer)
    if plain is not None:
        from . import layout

        if layout.plain_stdout():
            # rich's own text for these tables, written without loading rich
            # (see layout.py); None where only rich can draw it.
            text = getattr(layout, plain)(record, layout.plain_width(), **options)
            if text is not None:
                sys.stdout.write(text)
                sys.stdout.flush()
                return
    from . import render
    out, _ = _consoles()
    getattr(render, renderer)(out, record, **options)


# Renderers whose output off a terminal layout.py writes without rich.
_PLAIN = {"render_info": "plain_info", "render_norm": "plain_norm", "render_compare": "plain_compare"}


@functools.lru_cache(maxsize=None)
def _consoles():
    Console = _console_class()
    # Off a terminal rich would wrap at 80 columns; tables read better unwrapped in logs.
    from .layout import plain_width

    width = None if sys.stdout.isatty() else plain_width()
    # Names come from the files: print them as they are, never as rich markup
    # ("fc[relu]") or emoji codes (":x:").
    literal = {"markup": False, "emoji": False, "highlight": False}
    return Console(width=width, **literal), Console(stderr=True, **literal)


def _warn(doc) -> None:
    for line in doc.warnings:
        click.echo("blobtool: warning: " + line, err=True)


def _emit_json(obj: dict) -> None:
    import json

    click.echo(json.dumps(obj, separators=(", ", ": ")))


def _use_device(index):
    """Select GPU `index` (None: stay on the host); returns the JSON "device" object or None."""
    if index is None:
        return None
    from . import device
    return device.use(index).describe()


def _place(blob, device_info):
    """Put a blob's data (and diff) where the work runs: on the GPU when one was selected."""
    if device_info is not None and blob.count:
        blob.gpu_data()
        if blob.diff_memory is not None and blob.diff_memory.head.name != "UNINITIALIZED":
            blob.gpu_diff()
    return blob


# Inputs larger than this get a progress bar (on a terminal only).
PROGRESS_THRESHOLD = 64 << 20


@contextlib.contextmanager
def _progress(doc, what: str, enabled: bool = True):
    """A rich progress bar on stderr while working through a big input, when stderr is a terminal."""
    if not enabled or doc.size <= PROGRESS_THRESHOLD or not sys.stderr.isatty():
        yield
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    from .kernels import reporting

    _, err = _consoles()
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(f"{what} {doc.path}", total=doc.size)
        with reporting(lambda n: bar.advance(task, n)):
            yield


def _array_module(device_info):
    """numpy, or CuPy when the work runs on a GPU."""
    if device_info is None:
        import numpy
        return numpy
    from . import device
    return device.current().cp


def _open(path, kind=None, npy_cast=None):
    from .containers import open_document
    doc = open_document(path, kind, npy_cast=npy_cast)
    _warn(doc)
    return doc


# -- commands ------------------------------------------------------------------

@cli.command(context_settings=CONTEXT_SETTINGS)
@click.argument("files", nargs=-1, type=click.Path(dir_okay=True, allow_dash=True))
@click.option("--stats", is_flag=True, help="Add min, max, mean, std and NaN/Inf counts (reads the values).")
@click.option("--check", type=click.Choice(["finite"]), default=None,
              help="Exit 1 when a check fails; finite: no NaN or Inf in the selected blobs' data and diff "
                   "(reads the values).")
@_blob_option
@_kind_option
@_json_option
@_jobs_option
def info(files, stats, check, patterns, kind, as_json, jobs):
    """Show what a blob file holds: kind, size, and each blob's shape, layout, dtype, count and diff.

    Reads no values unless --stats is given.

    \b
    Example:
      blobtool info mean.binaryproto
      blobtool info --json --stats weights.pb | jq .blobs[0].stats
      blobtool info --check finite snapshot.caffemodel
    """
    from .summary import check_message

    work = functools.partial(_info_one, kind=kind, patterns=patterns, stats=stats, check=check)
    failed = False
    for record in _records(_inputs(files), work, jobs):
        _emit(record, as_json, "render_info")
        message = check_message(record)
        if message:
            _say_error(message)
            failed = True
    if failed:
        click.get_current_context().exit(EXIT_DIFFERENT)


def _info_one(path, *, kind, patterns, stats, check=None, show_progress=True):
    """info's record for one file (runs in a worker process when several files are given)."""
    from .containers import select
    from .summary import info_record

    doc = _open(path, kind)
    with _progress(doc, "reading", show_progress):
        return info_record(doc, select(doc, patterns), stats=stats, check=check)


@cli.command(context_settings=CONTEXT_SETTINGS)
@click.argument("files", nargs=-1, type=click.Path(dir_okay=True, allow_dash=True))
@_device_option
@_blob_option
@_kind_option
@_json_option
@_jobs_option
def norm(files, device, patterns, kind, as_json, jobs):
    """Report Caffe's asum (L1), sumsq (squared L2) and l2 of each blob's data and diff.

    Sums accumulate in float64, also for float32 blobs.

    \b
    Example:
      blobtool norm weights.pb
      cat weights.pb | blobtool norm --json --device 0
    """
    device_info = _use_device(device)
    if device_info is not None:
        jobs = 1  # one process owns the GPU
    work = functools.partial(_norm_one, kind=kind, patterns=patterns, device_info=device_info)
    for record in _records(_inputs(files), work, jobs):
        _emit(record, as_json, "render_norm")


def _norm_one(path, *, kind, patterns, device_info, show_progress=True):
    """norm's record for one file (runs in a worker process when several files are given)."""
    from .containers import select
    from .summary import norm_record

    doc = _open(path, kind)
    entries = select(doc, patterns)
    doc.source.will_read_through()
    blobs = [_norm_target(e, device_info) for e in entries]
    with _progress(doc, "summing", show_progress):
        return norm_record(doc, entries, blobs, device=device_info)


def _norm_target(entry, device_info):
    """The blob to reduce, placed where the work runs; very large ones stream through the GPU."""
    blob = entry.blob()
    if device_info is not None:
        from . import device
        if blob.nbytes > device.STREAM_THRESHOLD:
            return device.StreamedNorms(blob, device.current(), entry.has_diff)
    return _place(blob, device_info)


def _write(doc, entries, blobs, output, fmt, *, precision=None, layout=None, write_diff=None, transforms=None):
    """Write the selected blobs, keeping each blob's stored form unless told otherwise."""
    from .wire import releasing

    # The blobs are not used after they are written, so the input's pages
    # can be dropped as each chunk goes out: memory stays bounded.
    with _progress(doc, "writing"), releasing():
        _write_now(doc, entries, blobs, output, fmt, precision=precision, layout=layout, write_diff=write_diff,
                   transforms=transforms)


def _write_now(doc, entries, blobs, output, fmt, *, precision=None, layout=None, write_diff=None,
               transforms=None):
    import numpy as np

    from .containers import write_container
    from .files import save, save_arrays

    fmt = _output_format(output, fmt, doc)
    if fmt == "same":
        write_container(doc, {e.name: b for e, b in zip(entries, blobs)}, output,
                        precision=precision, write_diff=write_diff, layout=layout, transforms=transforms)
        return
    if fmt == "blob":
        if len(blobs) != 1:
            raise UsageError(f"a blob file holds one blob; {len(blobs)} selected (choose one with --blob, "
                             "or write .npz)")
        save(blobs[0], output, precision=precision, write_diff=write_diff, layout=layout,
             transforms=(transforms or {}).get(entries[0].name))
        return
    target = {None: None, "float": np.float32, "double": np.float64, "half": np.float16}[precision]
    arrays = {}
    for entry, blob in zip(entries, blobs):
        fns = (transforms or {}).get(entry.name, {})
        for which, key in (("data", entry.name), ("diff", entry.name + "/diff")):
            if which == "diff" and not (fmt == "npz" and (entry.has_diff if write_diff is None else write_diff)):
                continue
            values = blob.cpu_data() if which == "data" else blob.cpu_diff()
            if fns.get(which):
                values = fns[which](values, 0)
            values = values.reshape(blob.shape)
            arrays[key] = values if target is None else values.astype(target)
    save_arrays(arrays, output, fmt=fmt)


def _load_selected(path, kind, patterns, device_info, npy_cast=None):
    from .containers import select
    doc = _open(path, kind, npy_cast=npy_cast)
    entries = select(doc, patterns)
    doc.source.will_read_through()
    return doc, entries, [_place(e.blob(), device_info) for e in entries]


@cli.command(context_settings={**CONTEXT_SETTINGS, "ignore_unknown_options": True})
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.argument("factor", type=float)
@click.option("--diff-factor", type=float, default=None, metavar="F",
              help="Also scale the diff by F (default: diff unchanged).")
@_output_options
@_device_option
@_blob_option
@_kind_option
def scale(file, factor, diff_factor, output, fmt, device, patterns, kind):
    """Multiply a blob's data by FACTOR (Caffe's scale_data), in the blob's own dtype.

    \b
    Example:
      blobtool scale weights.pb 0.5 -o half.pb
      blobtool scale weights.pb 0.5 --diff-factor 0 -o - | blobtool norm
    """
    output = _output(output)
    device_info = _use_device(device)
    doc, entries, blobs = _load_selected(file, kind, patterns, device_info)
    if device_info is not None:
        for blob in blobs:
            blob.scale_data(factor)
            if diff_factor is not None:
                blob.scale_diff(diff_factor)
        _write(doc, entries, blobs, output, fmt)
        return
    # On the host the same kernel runs chunk by chunk as the output is
    # written, so memory stays bounded whatever the file size.
    from .kernels import scaled
    fns = {"data": scaled(factor)}
    if diff_factor is not None:
        fns["diff"] = scaled(diff_factor)
    _write(doc, entries, blobs, output, fmt, transforms={e.name: fns for e in entries})


@cli.command(context_settings=CONTEXT_SETTINGS)
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@_output_options
@_device_option
@_blob_option
@_kind_option
def update(file, output, fmt, device, patterns, kind):
    """Apply Caffe's Blob::Update, data -= diff, and write the result.

    \b
    Example:
      blobtool update snapshot.pb -o stepped.pb
    """
    output = _output(output)
    device_info = _use_device(device)
    doc, entries, blobs = _load_selected(file, kind, patterns, device_info)
    for entry, blob in zip(entries, blobs):
        if not entry.has_diff:
            from .errors import FormatError
            raise FormatError(f"blob {entry.name!r} has no diff to apply (update computes data -= diff)",
                              path=doc.path)
    if device_info is not None:
        for blob in blobs:
            blob.update()
        _write(doc, entries, blobs, output, fmt)
        return
    # On the host, data -= diff runs chunk by chunk as the output is written.
    from .kernels import minus
    _write(doc, entries, blobs, output, fmt,
           transforms={e.name: {"data": minus(b.cpu_diff())} for e, b in zip(entries, blobs)})


@cli.command(context_settings=CONTEXT_SETTINGS)
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@_output_options
@click.option("--double", "precision", flag_value="double", help="Write float64 values (double_data).")
@click.option("--float", "precision", flag_value="float", help="Write float32 values (data).")
@click.option("--half", "precision", flag_value="half",
              help="Write NVIDIA Caffe's raw FLOAT16 form (half the size; only NVIDIA Caffe and OpenCV read it).")
@click.option("--shape", "layout", flag_value="shape", help="Write the `shape` field (Caffe's ToProto).")
@click.option("--legacy", "layout", flag_value="legacy",
              help="Write legacy num/channels/height/width (at most 4 axes).")
@click.option("--no-diff", is_flag=True, help="Drop the diff.")
@_device_option
@_blob_option
@_kind_option
def convert(file, output, fmt, precision, layout, no_diff, device, patterns, kind):
    """Re-save blobs with Caffe's ToProto meaning: as the same kind, a blob file, .npy or .npz.

    Keeps each blob's dtype, layout and diff unless told otherwise. A .caffemodel,
    .solverstate or BlobProtoVector converts to the same kind with only the selected
    blobs re-encoded: every other byte is kept. `--blob NAME -o x.npy` (or x.pb)
    extracts one blob. .npy input becomes a blob (float16 or integer arrays need
    --float or --double; pickles are never loaded). .npy output holds the data
    array; .npz holds every blob by name and its diff under "<name>/diff".

    \b
    Example:
      blobtool convert --double mean.binaryproto -o mean64.pb
      blobtool convert --float nvcaffe.caffemodel -o standard.caffemodel
      blobtool convert net.caffemodel --blob conv1/0 -o conv1.npy
    """
    import numpy as np

    output = _output(output)
    npy_cast = {None: None, "double": np.float64}.get(precision, np.float32)
    device_info = _use_device(device)
    doc, entries, blobs = _load_selected(file, kind, patterns, device_info, npy_cast=npy_cast)
    if layout == "legacy":
        for blob in blobs:
            if blob.num_axes > 4:
                raise UsageError(f"--legacy holds at most 4 axes; blob has shape {blob.shape}")
    _write(doc, entries, blobs, output, fmt, precision=precision, layout=layout,
           write_diff=False if no_diff else None)


@cli.command(context_settings=CONTEXT_SETTINGS)
@click.argument("a", type=click.Path(dir_okay=False, allow_dash=True))
@click.argument("b", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--rtol", type=click.FloatRange(min=0), default=0.0, metavar="R",
              help="Relative tolerance: |a-b| <= atol + rtol*|b| (default 0: exact).")
@click.option("--atol", type=click.FloatRange(min=0), default=0.0, metavar="T",
              help="Absolute tolerance (default 0: exact).")
@click.option("-q", "--quiet", is_flag=True, help="Print only the verdict line.")
@_device_option
@_blob_option
@_kind_option
@_json_option
def compare(a, b, rtol, atol, quiet, device, patterns, kind, as_json):
    """Compare two blob files value by value; exit 1 when they differ.

    Blobs match by name; shapes compare with Caffe's legacy rule ((3,2) equals
    legacy 1x1x3x2); values compare in float64, NaN equal to NaN.

    \b
    Example:
      blobtool compare before.pb after.pb --rtol 1e-6
      blobtool convert --double w.pb -o - | blobtool compare - w.pb
    """
    from .compare import compare_documents
    from .kernels import using_threads
    from .containers import select
    from .summary import compare_record

    if a == "-" and b == "-":
        raise click.UsageError("standard input ('-') can be read only once")
    device_info = _use_device(device)
    doc_a, doc_b = _open(a, kind), _open(b, kind)
    entries_a = select(doc_a, patterns)
    entries_b = select(doc_b, patterns)
    doc_a.source.will_read_through()
    doc_b.source.will_read_through()
    with _progress(doc_a, "comparing"), using_threads(None):
        result = compare_documents(doc_a, doc_b, entries_a, entries_b, rtol=rtol, atol=atol,
                                   fetch=lambda e: _place(e.blob(), device_info), xp=_array_module(device_info))
    record = compare_record(result, device=device_info)
    _emit(record, as_json, "render_compare", quiet=quiet)
    click.get_current_context().exit(EXIT_OK if result.equal else EXIT_DIFFERENT)


@cli.command(context_settings=CONTEXT_SETTINGS)
@_json_option
def devices(as_json):
    """List the visible CUDA devices: index, name, memory and compute capability.

    Prints an empty list (and exits 0) where CuPy, the driver or a GPU is missing.

    \b
    Example:
      blobtool devices --json
    """
    from .device import list_devices
    from .render import render_devices

    found = list_devices()
    if as_json:
        _emit_json({"devices": found})
    else:
        out, _ = _consoles()
        render_devices(out, found)


# -- show: a blob as a picture -------------------------------------------------

@cli.command(context_settings=CONTEXT_SETTINGS)
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--blob", "name", metavar="NAME", default=None,
              help="The blob to show (name or glob that matches one blob); needed when the file holds several.")
@click.option("--channel", type=click.IntRange(min=0), metavar="C", default=None,
              help="Show channel C (from 0) as a heat map; in a filter grid, channel C of every filter.")
@click.option("--index", type=click.IntRange(min=0), metavar="N", default=None,
              help="Of a 4-D blob (N, C, H, W), show item N (from 0) alone instead of the filter grid.")
@click.option("--width", type=click.IntRange(min=1), metavar="COLUMNS", default=None,
              help="Terminal view at most COLUMNS characters wide (default: the terminal's width).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True), default=None, metavar="PATH.png",
              help="Write the picture as a PNG (full resolution, small filters enlarged) instead of drawing it; "
                   "needs Pillow: pip install 'blobtool[image]'.")
@_kind_option
def show(file, name, channel, index, width, output, kind):
    """Draw a blob as a picture in the terminal, or write it as a PNG.

    (H, W): a heat map with its value range. (C, H, W) or (1, C, H, W) with
    C == 3: a colour image (Caffe's B, G, R shown as R, G, B). (N, C, H, W):
    a grid of the N filters, each stretched from its own min to max, with
    one-pixel borders. The terminal view uses coloured half-block cells
    (two pixels per character) and shrinks to the terminal's width.

    \b
    Example:
      blobtool show imagenet_mean.binaryproto
      blobtool show lenet.caffemodel --blob conv1/0 -o conv1.png
      blobtool show net.caffemodel --blob conv2/0 --index 3 --channel 0
    """
    from .containers import select
    from .pictures import PNG_MIN_SIZE, TERMINAL_MIN_SIZE, view
    from .render import render_picture

    image_module = None
    if output is not None:
        if output != "-" and not output.lower().endswith(".png"):
            raise UsageError(f"show writes PNG only: name the output *.png (got {output!r})")
        if output == "-" and sys.stdout.isatty():
            raise click.UsageError("refusing to write a PNG to a terminal; use -o PATH.png")
        image_module = _pillow_image()
    doc = _open(file, kind)
    entries = select(doc, [name] if name is not None else [])
    if len(entries) != 1:
        names = ", ".join(e.name for e in entries[:8]) + (", ..." if len(entries) > 8 else "")
        raise UsageError(f"{doc.path}: show draws one blob; {len(entries)} match ({names}): "
                         "choose one with --blob NAME")
    entry = entries[0]
    data = entry.blob().cpu_data().reshape(entry.shape)
    if image_module is None:
        out, _ = _consoles()
        picture = view(data, channel=channel, index=index, width=width or out.width, min_size=TERMINAL_MIN_SIZE)
        render_picture(out, doc.path, entry.name, entry.shape, picture)
        return
    from .files import atomic_output

    picture = view(data, channel=channel, index=index, min_size=PNG_MIN_SIZE)
    with atomic_output(output) as f:
        image_module.fromarray(picture.rgb).save(f, format="PNG")


def _pillow_image():
    """Pillow's Image module, imported only when a PNG is asked for (the optional image extra)."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise UsageError("writing PNG needs Pillow, which is not installed: pip install 'blobtool[image]'") from exc
    return Image


def main(argv=None) -> None:
    """Entry point of the blobtool script and of python -m blobtool."""
    _single_threaded_blas()
    _keep_freed_memory()
    try:
        cli.main(args=argv, prog_name="blobtool")
    except BrokenPipeError:
        _quiet_broken_pipe()
        sys.exit(EXIT_OK)
    except KeyboardInterrupt:
        _say_error("interrupted")
        sys.exit(EXIT_INTERRUPTED)
