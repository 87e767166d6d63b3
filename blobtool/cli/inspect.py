"""The reading commands: info, norm, compare, devices."""

from __future__ import annotations

import functools

import click

from ..errors import ExitCode
from ..report import text
from .group import batch_error, debug_traceback, error_line, say_error
from .names import (NAMES_MOVED, NAMES_RULES, TORCH_NAMES, check_names, named, names_options, prefix_options,
                    prefixes_asked, selected_renamed, warn_all)
from .options import (INPUT, NAMED_SHAPE, Tolerance, parse_named_shapes, all_files_option, batch_inputs, blob_option, device_option,
                      fail_fast_option, jobs_option, json_object_option, json_option, kind_option)
from .output import consoles, emit, emit_json, progress
from .process import records
from .rules import Needs, Refuses, verb
from .work import array_module, open_input, open_inputs, release_device, use_device

__all__ = ["info", "norm", "compare", "devices"]


class _Batch:
    """The good records of a batch of inputs (files and folders), the bad ones said on stderr as they come.

    Without --fail-fast a bad input is one stderr line and the run goes on;
    `worst` is then the highest exit code met, to exit with at the end.
    """

    def __init__(self, files, fail_fast: bool, all_files: bool = False):
        from .output import say_warning

        self.paths, warnings = batch_inputs(files, all_files)
        for line in warnings:
            say_warning(line)
        self.fail_fast = fail_fast
        self.worst = ExitCode.OK

    def records(self, work, jobs):
        from ..errors import BlobToolError

        for item in records(self.paths, work, jobs, fail_fast=self.fail_fast):
            if isinstance(item, BlobToolError):
                debug_traceback(item)
                item = batch_error(item)
                say_error(error_line(item))
                self.worst = max(self.worst, item.exit_code)
                continue
            yield item

    def exit(self, code: int = ExitCode.OK) -> None:
        """Exit with the worst of `code` and the bad inputs' codes, when it is not 0."""
        code = max(code, self.worst)
        if code:
            click.get_current_context().exit(code)


def _tables():
    from ..report import tables  # rich: only where a table is drawn with it
    return tables


def _emit_info(record: dict, as_json: bool) -> None:
    emit(record, as_json, plain=_plain_info, draw=lambda out: _draw_info(out, record))


def _plain_info(record: dict, width: int) -> str | None:
    """info's plain text, and under it where a --names torch export's tensors came from."""
    from ..report.mapping import plain_origins

    table, origins = text.plain_info(record, width), plain_origins(record)
    if table is None or origins is None:
        return None
    return table + "".join(line + "\n" for line in origins)


def _draw_info(out, record: dict) -> None:
    from ..report.mapping import render_origins

    _tables().render_info(out, record)
    render_origins(out, record)


def _emit_norm(record: dict, as_json: bool) -> None:
    emit(record, as_json, plain=text.plain_norm, draw=lambda out: _tables().render_norm(out, record))


def _emit_compare(record: dict, as_json: bool, quiet: bool) -> None:
    emit(record, as_json, plain=functools.partial(text.plain_compare, quiet=quiet),
         draw=lambda out: _tables().render_compare(out, record, quiet=quiet))


@verb(rules={**NAMES_RULES, "layer_defs": (Refuses("names", TORCH_NAMES, "it lists the layers as Caffe defines them"),),
             "input_shapes": (Needs("layer_defs", why="the shapes are a column of the layer table"),)},
      moved={**NAMES_MOVED, "--all-layers": "--all-layers is now --layers (every layer, with its wiring and "
                                             "parameters)"})
@click.argument("files", nargs=-1, type=INPUT)
@click.option("--stats", is_flag=True, help="Add min, max, mean, std and NaN/Inf counts (reads the values).")
@click.option("--check", type=click.Choice(["finite"]), default=None,
              help="Exit 1 when a check fails; finite: no NaN or Inf in the selected blobs' data and diff "
                   "(reads the values).")
@click.option("--layers", "layer_defs", is_flag=True,
              help="List every layer of a net in file order, blobs or not: type, bottoms -> tops, parameters in "
                   "short, blob shapes (--json: each layer's definition under layer_defs).")
@NAMED_SHAPE
@blob_option
@kind_option
@json_option
@jobs_option
@fail_fast_option
@all_files_option
@names_options
def info(files, stats, check, layer_defs, input_shapes, patterns, kind, as_json, jobs, fail_fast, all_files, names,
         no_fold, net):
    """Show what a blob file holds: kind, size, and each blob's shape, layout, dtype, count and diff.

    Reads no values unless --stats is given. FILES may be folders: every file in
    them with an extension blobtool reads (every file with --all-files),
    recursively, in sorted order; a stderr line counts the files skipped. A bad
    input is one stderr line and the others are still shown (exit 3 at the end;
    --fail-fast stops at the first).

    --names torch alone lists the renaming (Caffe blob, PyTorch name, what was
    done); with --stats or --check it shows the blobs as PyTorch would hold
    them, under their PyTorch names (BatchNorm statistics divided by their
    factor, the factor left out).

    \b
    Example:
      blobtool info mean.binaryproto
      blobtool info --json --stats weights.pb | jq .blobs[0].stats
      blobtool info --check finite snapshot.caffemodel
      blobtool info --names torch model.caffemodel    # the PyTorch names convert would give, BatchNorm eps
      blobtool info --layers model.caffemodel         # every layer: wiring, kernel, stride, eps, ...
      blobtool info --layers --input-shape data=1,3,224,224 model.caffemodel   # and every top's shape
      blobtool info --names torch --stats model.caffemodel | grep running_var
      blobtool info --names torch --blob bn1.running_var model.caffemodel
      blobtool info --names torch --definition model.caffemodel snapshot.caffemodel.h5
    """
    from ..report.text import check_message, invalid_message

    check_names(names, net)
    batch = _Batch(files, fail_fast, all_files)
    if names != "blobtool" and not (stats or check):
        for record in batch.records(functools.partial(_mapping_one, kind=kind, patterns=patterns,
                                                      fold=not no_fold, net=net, scheme=names), jobs):
            _emit_mapping(record, as_json)
        batch.exit()
        return
    work = functools.partial(_info_one, kind=kind, patterns=patterns, stats=stats, check=check,
                             layer_defs=layer_defs, names=names, fold=not no_fold, net=net,
                             input_shapes=parse_named_shapes(input_shapes) or None)
    failed = ExitCode.OK
    for record in batch.records(work, jobs):
        _emit_info(record, as_json)
        for message, code in ((invalid_message(record), ExitCode.INPUT),
                              (check_message(record), ExitCode.DIFFERENT)):
            if message:
                say_error(message)
                failed = max(failed, code)
    batch.exit(failed)


def _info_one(path, *, kind, patterns, stats, check=None, layer_defs=False, names="blobtool",
              fold=True, net=None, show_progress=True, input_shapes=None):
    """info's record for one file (runs in a worker process when several files are given)."""
    from ..records import info_record

    from ..api.session import releasing

    doc = open_input(path, kind)
    shown, entries = named(doc, patterns, names, fold, net)
    # Nothing changes the values here: their pages can go back as they are read.
    with progress(doc, "reading", show_progress), releasing():
        record = info_record(shown, entries, stats=stats, check=check, layer_defs=layer_defs,
                             input_shapes=input_shapes)
    return _names_noted(record, names)


def _names_noted(record: dict, names: str) -> dict:
    """A record of blobs under PyTorch's names says so ("names": "torch")."""
    if names != "blobtool":
        record["names"] = names
    return record


def _mapping_one(path, *, kind, patterns, fold, net=None, scheme="torch", show_progress=True):
    """info --names torch's record for one file: the renaming that convert would apply, and the settings."""
    from ..report.mapping import mapping_record

    doc = open_input(path, kind)
    result, entries = selected_renamed(doc, patterns, fold, net, scheme)
    return mapping_record(doc, result, fold=fold, names={e.name for e in entries})


def _emit_mapping(record: dict, as_json: bool) -> None:
    from ..report import mapping

    emit(record, as_json, plain=mapping.plain_mapping, draw=lambda out: mapping.render_mapping(out, record))


@verb(rules={**NAMES_RULES, "jobs": (Refuses("device", why="one process owns the GPU and sums on it"),)},
      moved=NAMES_MOVED)
@click.argument("files", nargs=-1, type=INPUT)
@device_option
@blob_option
@kind_option
@json_option
@jobs_option
@fail_fast_option
@all_files_option
@names_options
def norm(files, device, patterns, kind, as_json, jobs, fail_fast, all_files, names, no_fold, net):
    """Report Caffe's asum (L1), sumsq (squared L2) and l2 of each blob's data and diff.

    Sums accumulate in float64, also for float32 blobs. FILES may be folders,
    and a bad input does not stop the others, as for info. --names torch sums
    the blobs as PyTorch would hold them, under their PyTorch names (see
    info --names torch; no diffs).

    \b
    Example:
      blobtool norm weights.pb
      cat weights.pb | blobtool norm --json --device 0
      blobtool norm --names torch --blob bn1 model.caffemodel
    """
    check_names(names, net)
    device_info = use_device(device)
    if device_info is not None:
        jobs = 1  # one process owns the GPU (--jobs with --device is refused)
    work = functools.partial(_norm_one, kind=kind, patterns=patterns, device_info=device_info, names=names,
                             fold=not no_fold, net=net)
    batch = _Batch(files, fail_fast, all_files)
    for record in batch.records(work, jobs):
        _emit_norm(record, as_json)
    batch.exit()


def _norm_one(path, *, kind, patterns, device_info, names="blobtool", fold=True, net=None, show_progress=True):
    """norm's record for one file (runs in a worker process when several files are given)."""
    from ..records import norm_record
    from ..api.session import releasing

    doc = open_input(path, kind)
    shown, entries = named(doc, patterns, names, fold, net)
    doc.source.will_read_through()
    # One blob at a time: a blob a reader builds (an HDF5 dataset read
    # through HDF5, an .npz member) is let go once summed. On a GPU no blob
    # is placed there: each streams through one set of pinned buffers.
    streamer = None
    if device_info is not None:
        from ..api.devices import device
        streamer = device.current().streamer(device.STREAM_CHUNK, release=True)
    blobs = (_norm_target(e, streamer) for e in entries)
    try:
        with progress(doc, "summing", show_progress), releasing():
            return _names_noted(norm_record(shown, entries, blobs, device=device_info), names)
    finally:
        if streamer is not None:
            streamer.close()


def _norm_target(entry, streamer):
    """The blob to reduce: on the host itself, on a GPU a stand-in that streams its data and diff through it."""
    blob = entry.blob_unkept()
    if streamer is not None:
        from ..api.devices import StreamedNorms
        return StreamedNorms(blob, streamer, entry.has_diff)
    return blob


@verb(rules={**NAMES_RULES, "quiet": (Refuses("as_json", why="the JSON object holds every blob"),)},
      moved=NAMES_MOVED)
@click.argument("a", type=INPUT)
@click.argument("b", type=INPUT)
@click.option("--rtol", type=Tolerance(), default=0.0, metavar="R",
              help="Relative tolerance: |a-b| <= atol + rtol*|b| (default 0: exact).")
@click.option("--atol", type=Tolerance(), default=0.0, metavar="T",
              help="Absolute tolerance (default 0: exact).")
@click.option("-q", "--quiet", is_flag=True, help="Print only the verdict line.")
@device_option
@blob_option
@kind_option
@json_object_option("Print the comparison as one JSON object (one line).")
@names_options
@prefix_options
def compare(a, b, rtol, atol, quiet, device, patterns, kind, as_json, names, no_fold, net, strip_prefix,
            add_prefix):
    """Compare two blob files value by value; exit 1 when they differ.

    Blobs match by name (the second file's names after --strip-prefix and
    --add-prefix, or a shared prefix found that makes them match, said on
    stderr); shapes compare with Caffe's legacy rule ((3,2) equals legacy
    1x1x3x2); values compare in float64, NaN equal to NaN. Two nets'
    BatchNorm statistics compare as Caffe computes with them: each net's
    stored sums divided by its own factor (blob 2), the factors not on their
    own (a line on stderr says so; --json marks those blobs "compared").

    \b
    Example:
      blobtool compare before.pb after.pb --rtol 1e-6
      blobtool convert --double w.pb -o - | blobtool compare - w.pb
      blobtool compare --names torch model.caffemodel ported.safetensors
      blobtool compare --names torch --definition model.caffemodel snapshot.caffemodel.h5 ported.safetensors
      blobtool compare --names torch model.caffemodel port.pth --strip-prefix module.
    """
    from ..api.compute import compare_documents
    from ..api.kinds import select
    from ..api.compute import using_threads
    from ..records import compare_record
    from ..api.session import releasing

    if a == "-" and b == "-":
        raise click.UsageError("standard input ('-') can be read only once")
    check_names(names, net)
    device_info = use_device(device)
    doc_a, doc_b = open_inputs([a, b], kind)
    change = prefixes_asked(strip_prefix, add_prefix)
    if names != "blobtool":
        from ..api.naming import torch_pair
        from .names import renamer

        types = open_input(net) if net is not None else None
        try:
            (doc_a, entries_a), (doc_b, entries_b), warnings = torch_pair(doc_a, doc_b, patterns, fold=not no_fold,
                                                                          net=types, prefixes=change,
                                                                          rename=renamer(names))
        finally:
            if types is not None:
                types.close()
        warn_all(warnings)
        statistics = None
    else:
        from ..api.naming import match_documents

        doc_b, _, note = match_documents(doc_a, doc_b, change)
        warn_all([note] if note else [])
        entries_a = select(doc_a, patterns)
        entries_b = select(doc_b, patterns)
        statistics = _statistics(doc_a, doc_b, entries_a, entries_b)
    doc_a.source.will_read_through()
    doc_b.source.will_read_through()
    with progress(doc_a, "comparing"), using_threads(None), releasing():
        # On a GPU each pair goes up as it is compared (only the sides
        # compared) and its device memory is freed before the next.
        result = compare_documents(doc_a, doc_b, entries_a, entries_b, rtol=rtol, atol=atol,
                                   xp=array_module(device_info),
                                   done=release_device if device_info is not None else None,
                                   statistics=statistics)
    record = compare_record(result, device=device_info)
    _emit_compare(record, as_json, quiet)
    click.get_current_context().exit(ExitCode.OK if result.equal else ExitCode.DIFFERENT)


def _statistics(doc_a, doc_b, entries_a, entries_b):
    """For two nets with BatchNorm layers: their statistics' factors (net.batchnorm), said on stderr; else None.

    Caffe computes with a BatchNorm's stored sums divided by its factor, so
    two nets whose sums and factors differ by the same ratio compute the same
    (a net written back from PyTorch has its factor 1): compare says so.
    """
    from ..api.naming import statistic_factors
    from ..api.naming import has_layer_types
    from .names import say_summary

    if not (has_layer_types(doc_a) and has_layer_types(doc_b)):
        return None
    sides = statistic_factors(doc_a), statistic_factors(doc_b)
    names_b = {e.name for e in entries_b}
    shared = [e.name for e in entries_a if e.name in names_b and e.name in sides[0][1] and e.name in sides[1][1]]
    if not shared:
        return None
    say_summary([f"{doc_a.path}, {doc_b.path}: BatchNorm statistics compared as Caffe uses them, each net's sums "
                 f"divided by its own factor (blob 2); the {len(shared)} factor blob{'s' * (len(shared) != 1)} "
                 "not compared on their own"])
    return sides


@verb()
@json_object_option('Print one JSON object: {"devices": [...]}.')
def devices(as_json):
    """List the visible CUDA devices: index, name, memory and compute capability.

    Prints an empty list (and exits 0) where CuPy, the driver or a GPU is missing.

    \b
    Example:
      blobtool devices --json
    """
    from ..api.devices import list_devices
    from ..report.tables import render_devices

    found = list_devices()
    if as_json:
        emit_json({"devices": found})
    else:
        out, _ = consoles()
        render_devices(out, found)
