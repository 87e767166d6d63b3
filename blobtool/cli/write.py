"""The writing commands: scale, update, convert."""

from __future__ import annotations

import click

from ..errors import FormatError
from .names import NAMES_MOVED, NAMES_RULES, check_names, names_options, renamed, say_summary, warn_all
from .options import INPUT, blob_option, device_option, kind_option, output_options, output_target
from .output import progress
from .rules import Needs, verb
from .work import load_selected, use_device

__all__ = ["scale", "update", "convert", "blob_output", "EDITS_MOVED"]


def blob_output(output, fmt):
    """Where scale, update and convert write (output_target); a .prototxt, a net's definition, is definition's."""
    from ..api.choices import chosen_format

    output = output_target(output)
    if chosen_format(output, fmt) == "prototxt":
        raise click.UsageError("a .prototxt output is a net's definition, without blobs: blobtool definition NET "
                               f"-o {output if output != '-' else 'FILE.prototxt'} writes it")
    return output


def _write(doc, entries, blobs, output, fmt, *, precision=None, layout=None, write_diff=None, transforms=None,
           half_strict=False):
    """Write the selected blobs (api.write), keeping each blob's stored form unless told otherwise."""
    from ..api import write
    from .output import say_warning

    # The blobs are not used after they are written, so the input's pages
    # can be dropped as each chunk goes out: memory stays bounded.
    with progress(doc, "writing"):
        write(doc, {e.name: b for e, b in zip(entries, blobs)}, output, format=fmt, precision=precision,
              layout=layout, write_diff=write_diff, transforms=transforms, release=True, half_strict=half_strict,
              warn=say_warning)


def _streamed(doc, entries, blobs, output, fmt, sides: dict, what: str) -> None:
    """Write the blobs with each side's chunk transform (`sides`: "data"/"diff" -> a maker of one per blob).

    On the host the kernel runs chunk by chunk as the output is written, so
    memory stays bounded whatever the file size; the values it turns into
    Inf or NaN are counted in the same chunks, against the type each side is
    written in (a float16 blob is computed in float32 and narrowed when
    written), and warned about.
    """
    from ..api.compute import CountingNonFinite

    counters = [{side: CountingNonFinite(make(blob)) for side, make in sides.items()} for blob in blobs]
    _write(doc, entries, blobs, output, fmt, transforms={e.name: c for e, c in zip(entries, counters)})
    _warn_nonfinite(doc, entries, [{side: (c.count, c.dtype) for side, c in per.items()} for per in counters], what)


def _on_device(doc, entries, blobs, output, fmt, sides: dict, what: str) -> None:
    """Run each side's in-place Blob method on the GPU (`sides`: "data"/"diff" -> fn(blob)), warn, and write.

    One blob at a time, as the output reaches it: only the sides named are
    moved to the device (a diff not scaled stays on the host; update's
    data -= diff moves the diff, which it reads), and the blob's results come
    back to the host and its device memory is freed before it is written.
    Neither the device nor the host holds more than one blob's results.
    """
    from .work import array_module

    xp = array_module(True)
    steps = [_DeviceStep(entry, blob, sides, xp) for entry, blob in zip(entries, blobs)]
    _write(doc, entries, blobs, output, fmt, transforms={e.name: s.transforms for e, s in zip(entries, steps)})
    dtypes = {"data": lambda b: b.dtype, "diff": lambda b: b.diff_dtype}
    # Values past the range of the type written: those the device's math
    # made, and those narrowing to the stored type made while writing (a
    # float16 blob computed in float32).
    _warn_nonfinite(doc, entries, [{side: (step.counts.get(side, 0) + narrow.count,
                                           narrow.dtype or dtypes[side](step.blob))
                                    for side, narrow in step.transforms.items()}
                                   for step in steps], what)


class _DeviceStep:
    """One blob's device work, run once when the writer first reads either side (see _on_device)."""

    def __init__(self, entry, blob, sides: dict, xp):
        self.blob = blob
        self._xp = xp
        # A side the file does not hold has nothing to compute on.
        self._runs = {side: run for side, run in sides.items() if side == "data" or entry.has_diff}
        self.counts: dict = {}
        self._done = False
        self.transforms = {side: _DeviceSide(self, side) for side in sides}

    def run(self) -> None:
        import numpy

        from ..api.compute import count_nonfinite
        from .work import release_device

        if self._done:
            return
        self._done = True
        blob, xp = self.blob, self._xp
        if not blob.count:
            return
        views = {"data": blob.gpu_data, "diff": blob.gpu_diff}
        before = {side: count_nonfinite(views[side](), xp) for side in self._runs}
        with numpy.errstate(over="ignore", invalid="ignore"):  # counted below, not warned by numpy
            for run in self._runs.values():
                run(blob)
        self.counts = {side: count_nonfinite(views[side](), xp) - n for side, n in before.items()}
        release_device(blob)


class _DeviceSide:
    """The writer's chunk transform for one side of a blob worked on a GPU: its results, read back on the host.

    The first chunk runs the blob's device work; every chunk is then the
    matching part of the host copy. Narrowing to the stored type while
    writing is counted as CountingNonFinite counts it (`count`, `dtype`).
    """

    def __init__(self, step: _DeviceStep, side: str):
        from ..api.compute import CountingNonFinite

        self._step = step
        self._side = side
        self._narrowing = CountingNonFinite()

    @property
    def count(self) -> int:
        return self._narrowing.count

    @property
    def dtype(self):
        return self._narrowing.dtype

    def __call__(self, chunk, start: int):
        self._step.run()
        blob = self._step.blob
        values = blob.cpu_data() if self._side == "data" else blob.cpu_diff()
        return self._narrowing(values[start:start + chunk.size], start)

    def narrow(self, values, target):
        return self._narrowing.narrow(values, target)


def _warn_nonfinite(doc, entries, counts: list, what: str) -> None:
    """One stderr line per blob whose values `what` turned into Inf or NaN (past the range of the type written).

    `counts` holds, per blob, {side: (values turned non-finite, the dtype they were written in)}.
    """
    from .output import say_warning

    for entry, per in zip(entries, counts):
        hit = {side: (n, dtype) for side, (n, dtype) in per.items() if n}
        if hit:
            parts = [f"{n:,} of {entry.count:,} {side} values" for side, (n, _) in hit.items()]
            ranges = " and ".join(dict.fromkeys(f"{(dtype or entry.dtype).name}'s" for _, dtype in hit.values()))
            say_warning(f"{doc.path}: blob {entry.name}: {what} turned {' and '.join(parts)} "
                        f"into Inf or NaN (past {ranges} range)")


@verb(negative_numbers=True)
@click.argument("file", type=INPUT)
@click.argument("factor", type=float)
@click.option("--diff-factor", type=float, default=None, metavar="F",
              help="Also scale the diff by F (default: diff unchanged).")
@output_options
@device_option
@blob_option
@kind_option
def scale(file, factor, diff_factor, output, fmt, device, patterns, kind):
    """Multiply a blob's data by FACTOR (Caffe's scale_data), in the blob's own dtype.

    Products past the range of the type written become Inf, as in Caffe (a
    float32 blob scaled by 1e39 is all Inf and NaN; a float16 blob is scaled
    in float32 and counted against float16, the type it is written back in):
    blobtool still writes them and exits 0, with one warning line per blob on
    stderr counting the values that became Inf or NaN. It takes no --names:
    the file is written back as it is, under its own names (convert --names
    torch renames).

    \b
    Example:
      blobtool scale weights.pb 0.5 -o half.pb
      blobtool scale weights.pb 0.5 --diff-factor 0 -o - | blobtool norm
    """
    from ..api.compute import scaled

    output = blob_output(output, fmt)
    device_info = use_device(device)
    doc, entries, blobs = load_selected(file, kind, patterns)
    what = f"scaling by {factor:g}" + (f" (diff by {diff_factor:g})" if diff_factor is not None else "")
    if device_info is not None:
        sides = {"data": lambda b: b.scale_data(factor)}
        if diff_factor is not None:
            sides["diff"] = lambda b: b.scale_diff(diff_factor)
        _on_device(doc, entries, blobs, output, fmt, sides, what)
        return
    makers = {"data": lambda b: scaled(factor)}
    if diff_factor is not None:
        makers["diff"] = lambda b: scaled(diff_factor)
    _streamed(doc, entries, blobs, output, fmt, makers, what)


@verb()
@click.argument("file", type=INPUT)
@output_options
@device_option
@blob_option
@kind_option
def update(file, output, fmt, device, patterns, kind):
    """Apply Caffe's Blob::Update, data -= diff, and write the result.

    Computed in the data's type (a diff stored wider is rounded to it
    first). Differences past the range of the type written become Inf, as
    in Caffe: blobtool writes them and exits 0, with one warning line per
    blob on stderr counting the values that became Inf or NaN. It takes no
    --names: the file is written back under its own names.

    \b
    Example:
      blobtool update snapshot.pb -o stepped.pb
    """
    from ..api.compute import minus

    output = blob_output(output, fmt)
    device_info = use_device(device)
    doc, entries, blobs = load_selected(file, kind, patterns)
    for entry, blob in zip(entries, blobs):
        if not entry.has_diff:
            raise FormatError(f"blob {entry.name!r} has no diff to apply (update computes data -= diff)",
                              path=doc.path)
    if device_info is not None:
        _on_device(doc, entries, blobs, output, fmt, {"data": lambda b: b.update()}, "data -= diff")
        return
    _streamed(doc, entries, blobs, output, fmt, {"data": lambda b: minus(b.cpu_diff())}, "data -= diff")


PRECISIONS = ("float", "double", "half", "bf16")

# Short forms kept from earlier releases: convert --double is --precision double.
CONVERT_RESPELLED = {"--double": ("--precision", "double"), "--float": ("--precision", "float"),
                     "--half": ("--precision", "half"), "--bf16": ("--precision", "bf16"),
                     "--half-strict": ("--precision", "half", "--strict"),
                     "--shape": ("--layout", "shape"), "--legacy": ("--layout", "legacy")}

# Net surgery, which convert and convert --into did: the edit command's.
EDITS_MOVED = {"--rename": "--rename is edit's now: blobtool edit NET -o OUT --rename OLD=NEW",
               "--drop": "--drop is edit's now: blobtool edit NET -o OUT --drop LAYER"}

# What convert did before each job got a command of its own.
CONVERT_MOVED = {
    **{option: f"{option} is transplant's now: blobtool transplant SOURCE TEMPLATE -o OUT {option}"
       for option in ("--partial", "--reshape", "--strip-prefix", "--add-prefix")},
    "--into": "--into is a command now: blobtool transplant SOURCE TEMPLATE -o OUT",
    **EDITS_MOVED,
    "--device": "--device: convert computes nothing a GPU could run (it re-encodes values on the host as it "
                "writes them); drop --device",
    **NAMES_MOVED,
}

CONVERT_RULES = {**NAMES_RULES, "half_strict": (Needs("precision", ("half",), "it refuses what float16 cannot "
                                                                            "hold"),)}


@verb(rules=CONVERT_RULES, moved=CONVERT_MOVED, respelled=CONVERT_RESPELLED)
@click.argument("file", type=INPUT)
@output_options
@click.option("--precision", type=click.Choice(PRECISIONS), default=None,
              help="Write float (float32: Caffe's data), double (float64: double_data), half (float16: NVIDIA "
                   "Caffe's raw FLOAT16 form in protobuf, float16 arrays elsewhere) or bf16 (bfloat16, "
                   ".safetensors only). A double past float32's range becomes Inf, with a warning line; a blob "
                   "that float16 or bfloat16 cannot hold stays float32, with a warning. Default: as stored.")
@click.option("--strict", "half_strict", is_flag=True,
              help="With --precision half: a blob that float16 cannot hold is an error (exit 2, nothing "
                   "written).")
@click.option("--layout", type=click.Choice(("shape", "legacy")), default=None,
              help="shape: the `shape` field (Caffe's ToProto); legacy: num/channels/height/width (at most 4 "
                   "axes; protobuf only). Default: as stored.")
@click.option("--no-diff", is_flag=True, help="Drop the diff.")
@blob_option
@kind_option
@names_options
def convert(file, output, fmt, precision, half_strict, layout, no_diff, patterns, kind, names, no_fold, net):
    """Re-encode blobs: as the same kind, a blob file, .npy, .npz, .safetensors or Caffe's HDF5.

    Keeps each blob's dtype, layout and diff unless told otherwise, with
    Caffe's ToProto meaning. A .caffemodel, .solverstate or BlobProtoVector
    converts to the same kind with only the selected blobs re-encoded: every
    other byte is kept. `--blob NAME -o x.npy` (or x.pb) extracts one blob.
    .npy input becomes a blob (float16 or integer arrays need --precision
    float or double; pickles are never loaded). .npy output holds the data
    array; .npz and .safetensors hold every blob by name and its diff under
    "<name>/diff". --names torch names a .caffemodel's blobs as PyTorch does
    (see info --names torch); an HDF5 snapshot's with --definition and the
    matching .caffemodel. Caffe's HDF5 snapshots (.caffemodel.h5,
    .solverstate.h5; needs blobtool[hdf5]) convert both ways. HDF5 holds no
    layer types or parameters, so an HDF5 net becomes a NetParameter with
    layer names and blobs only. Converting computes nothing: casts run on the
    host as the output is written.

    The net's definition as text is `blobtool definition`; values written
    into another net, `transplant`; layers renamed or dropped, `edit`.
    --double, --float, --half, --bf16, --half-strict, --shape and --legacy
    still work, as short forms of --precision, --strict and --layout.

    \b
    Example:
      blobtool convert --precision double mean.binaryproto -o mean64.pb
      blobtool convert --precision float nvcaffe.caffemodel -o standard.caffemodel
      blobtool convert net.caffemodel --blob conv1/0 -o conv1.npy
      blobtool convert --names torch net.caffemodel -o net.safetensors
      blobtool convert snapshot_iter_1000.caffemodel.h5 -o snapshot_iter_1000.caffemodel
    """
    from ..api.choices import cast_for

    check_names(names, net)
    output = blob_output(output, fmt)
    if half_strict:
        precision = "half"
    npy_cast = cast_for(precision)
    doc, entries, blobs = load_selected(file, kind, patterns, npy_cast=npy_cast, to_write=True)
    result = None
    if names != "blobtool":
        result = _renamed_for_export(doc, entries, names, no_fold, no_diff, net)
        doc, entries = result.document, result.document.entries
        blobs = [e.blob() for e in entries]
    asked = precision
    if result is not None:
        # Resolved here, so that the summary says what each tensor is written in.
        precision = _resolved(doc, entries, blobs, output, fmt, precision, no_diff, half_strict)
    if precision != "float":
        _write(doc, entries, blobs, output, fmt, precision=precision, layout=layout,
               write_diff=False if no_diff else None, half_strict=half_strict)
        if result is not None:
            _say_export(result, entries, blobs, precision, asked, output)
        return
    # float64 values past float32's range become Inf, as Caffe's cast makes
    # them: counted as they are narrowed while writing, and warned about.
    from ..api.compute import CountingNonFinite

    counters = [{"data": CountingNonFinite(), "diff": CountingNonFinite()} for _ in blobs]
    _write(doc, entries, blobs, output, fmt, precision=precision, layout=layout,
           write_diff=False if no_diff else None, transforms={e.name: c for e, c in zip(entries, counters)})
    _warn_nonfinite(doc, entries, [{side: (c.count, c.dtype) for side, c in per.items()} for per in counters],
                    "converting to float32")
    if result is not None:
        _say_export(result, entries, blobs, precision, asked, output)


def _renamed_for_export(doc, entries, names: str, no_fold: bool, no_diff: bool, net=None):
    """--names torch (or torch-identifiers) for convert: the TorchExport, its warnings and eps warnings said."""
    from ..api.naming import eps_warnings

    result = renamed(doc, entries, not no_fold, net, names)
    if result.dropped_diffs and not no_diff:
        warn_all([f"{doc.path}: --names {names} writes no diffs (a PyTorch state_dict holds none): "
                  f"{result.dropped_diffs} blobs' diffs left out"])
    warn_all(eps_warnings(doc.path, result.settings))
    return result


def _resolved(doc, entries, blobs, output, fmt, precision, no_diff: bool, half_strict: bool):
    """api.resolve_precision for this write (its warnings said), after the output's format is checked.

    An output other than .safetensors has no metadata: a warning says the
    settings and the mapping are not in it.
    """
    from ..api import resolve_precision
    from ..api.choices import output_target as format_of
    from .output import say_warning

    chosen, _ = format_of(output, fmt, doc)
    if chosen.name != "safetensors":
        if precision == "bf16":
            return precision   # api.write refuses it, saying why
        say_warning(f"{doc.path}: --names {doc.naming}: a {chosen.name} output holds no metadata: the settings "
                    "(BatchNorm eps, strides, ...) and where each tensor came from are not in it (info --names "
                    "torch lists them; .safetensors keeps them)")
    return resolve_precision(doc, entries, blobs, precision, write_diff=False if no_diff else None,
                             half_strict=half_strict, warn=say_warning)


def _say_export(result, entries, blobs, precision, asked, output) -> None:
    """convert --names torch's summary on stderr: what was written, and a line per kind of renaming."""
    from ..api.choices import written_type
    from ..api.naming import kind_counts
    from ..report.mapping import export_summary

    per_blob = precision if isinstance(precision, dict) else {}
    types = [written_type(blob, per_blob.get(e.name) if per_blob else precision) for e, blob in zip(entries, blobs)]
    say_summary(export_summary(result.document.path, "standard output" if output == "-" else output,
                               result.scheme, types, asked, kind_counts(result.rows)))
