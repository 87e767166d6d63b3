"""The writing commands: scale, update, convert."""

from __future__ import annotations

import click

from ..errors import FormatError
from .group import CONTEXT_SETTINGS
from .names import names_options, renamed, warn_all
from .options import INPUT, blob_option, device_option, kind_option, output_options, output_target
from .output import progress
from .work import load_selected, use_device

__all__ = ["scale", "update", "convert"]


def _write(doc, entries, blobs, output, fmt, *, precision=None, layout=None, write_diff=None, transforms=None):
    """Write the selected blobs (api.write), keeping each blob's stored form unless told otherwise."""
    from ..api import write

    # The blobs are not used after they are written, so the input's pages
    # can be dropped as each chunk goes out: memory stays bounded.
    with progress(doc, "writing"):
        write(doc, {e.name: b for e, b in zip(entries, blobs)}, output, format=fmt, precision=precision,
              layout=layout, write_diff=write_diff, transforms=transforms, release=True)


@click.command(context_settings={**CONTEXT_SETTINGS, "ignore_unknown_options": True})
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

    \b
    Example:
      blobtool scale weights.pb 0.5 -o half.pb
      blobtool scale weights.pb 0.5 --diff-factor 0 -o - | blobtool norm
    """
    output = output_target(output)
    device_info = use_device(device)
    doc, entries, blobs = load_selected(file, kind, patterns, device_info)
    if device_info is not None:
        for blob in blobs:
            blob.scale_data(factor)
            if diff_factor is not None:
                blob.scale_diff(diff_factor)
        _write(doc, entries, blobs, output, fmt)
        return
    # On the host the same kernel runs chunk by chunk as the output is
    # written, so memory stays bounded whatever the file size.
    from ..kernels import scaled
    fns = {"data": scaled(factor)}
    if diff_factor is not None:
        fns["diff"] = scaled(diff_factor)
    _write(doc, entries, blobs, output, fmt, transforms={e.name: fns for e in entries})


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("file", type=INPUT)
@output_options
@device_option
@blob_option
@kind_option
def update(file, output, fmt, device, patterns, kind):
    """Apply Caffe's Blob::Update, data -= diff, and write the result.

    \b
    Example:
      blobtool update snapshot.pb -o stepped.pb
    """
    output = output_target(output)
    device_info = use_device(device)
    doc, entries, blobs = load_selected(file, kind, patterns, device_info)
    for entry, blob in zip(entries, blobs):
        if not entry.has_diff:
            raise FormatError(f"blob {entry.name!r} has no diff to apply (update computes data -= diff)",
                              path=doc.path)
    if device_info is not None:
        for blob in blobs:
            blob.update()
        _write(doc, entries, blobs, output, fmt)
        return
    # On the host, data -= diff runs chunk by chunk as the output is written.
    from ..kernels import minus
    _write(doc, entries, blobs, output, fmt,
           transforms={e.name: {"data": minus(b.cpu_diff())} for e, b in zip(entries, blobs)})


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("file", type=INPUT)
@output_options
@click.option("--double", "precision", flag_value="double", help="Write float64 values (double_data).")
@click.option("--float", "precision", flag_value="float", help="Write float32 values (data).")
@click.option("--half", "precision", flag_value="half",
              help="Write NVIDIA Caffe's raw FLOAT16 form (half the size; only NVIDIA Caffe and OpenCV read it).")
@click.option("--shape", "layout", flag_value="shape", help="Write the `shape` field (Caffe's ToProto).")
@click.option("--legacy", "layout", flag_value="legacy",
              help="Write legacy num/channels/height/width (at most 4 axes).")
@click.option("--no-diff", is_flag=True, help="Drop the diff.")
@device_option
@blob_option
@kind_option
@names_options
def convert(file, output, fmt, precision, layout, no_diff, device, patterns, kind, names, no_fold):
    """Re-save blobs with Caffe's ToProto meaning: as the same kind, a blob file, .npy, .npz, .safetensors or HDF5.

    Keeps each blob's dtype, layout and diff unless told otherwise. A .caffemodel,
    .solverstate or BlobProtoVector converts to the same kind with only the selected
    blobs re-encoded: every other byte is kept. `--blob NAME -o x.npy` (or x.pb)
    extracts one blob. .npy input becomes a blob (float16 or integer arrays need
    --float or --double; pickles are never loaded). .npy output holds the data
    array; .npz and .safetensors hold every blob by name and its diff under "<name>/diff".
    --names torch names a .caffemodel's blobs as PyTorch does (see info --names torch).
    Caffe's HDF5 snapshots (.caffemodel.h5, .solverstate.h5; needs blobtool[hdf5])
    convert both ways: -o x.h5 writes Caffe's HDF5 layout, -o x.caffemodel or
    -o x.solverstate the protobuf form. HDF5 holds no layer types or parameters, so an
    HDF5 net becomes a NetParameter with layer names and blobs only. --legacy is
    protobuf only.

    \b
    Example:
      blobtool convert --double mean.binaryproto -o mean64.pb
      blobtool convert --float nvcaffe.caffemodel -o standard.caffemodel
      blobtool convert net.caffemodel --blob conv1/0 -o conv1.npy
      blobtool convert --names torch net.caffemodel -o net.safetensors
      blobtool convert snapshot_iter_1000.caffemodel.h5 -o snapshot_iter_1000.caffemodel
    """
    from ..formats.numpy import cast_for

    output = output_target(output)
    npy_cast = cast_for(precision)
    device_info = use_device(device)
    doc, entries, blobs = load_selected(file, kind, patterns, device_info, npy_cast=npy_cast)
    if names == "torch":
        result = renamed(doc, entries, not no_fold)
        if result.dropped_diffs and not no_diff:
            warn_all([f"{doc.path}: --names torch writes no diffs (a PyTorch state_dict holds none): "
                      f"{result.dropped_diffs} blobs' diffs left out"])
        doc, entries = result.document, result.document.entries
        blobs = [e.blob() for e in entries]
    _write(doc, entries, blobs, output, fmt, precision=precision, layout=layout,
           write_diff=False if no_diff else None)
