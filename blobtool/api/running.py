"""Running a net: run (its blobs' values) and export (one ONNX model)."""

from __future__ import annotations

import contextlib
import os
import warnings

from ..errors import UsageError, parameter
from ..files import Staged
from .common import OptionsRefused, opened_net

__all__ = ["run", "export"]


def run(src, *, definition=None, inputs: dict | None = None, shapes: dict | None = None, seed: int = 0,
        outputs=None, output=None, warn=None):
    """Run the net in `src` forward as Caffe's TEST phase, in float32; the RunResult (its `values`: {blob: array}).

    `src` and `definition` are Documents or what open_document takes;
    `definition` is the net's definition to run (a deploy.prototxt), whose
    layers take `src`'s weights by name. `inputs` ({name: values}) gives
    inputs' values: an array, or a file of one blob (.npy or BlobProto: a
    path, "-" or a binary file object, read once its shape is checked);
    `shapes` ({name: shape}) their shapes (a data layer's); inputs without
    values get random normal values from `seed`. `outputs`: None (the net's
    outputs), "all", or blob names. `output` (a path, "-" or a binary file
    object): the values are also written there as an .npz (float32, one
    array per blob name), atomically; a path of another extension is a
    UsageError before anything is read. The warnings of the files opened
    here go to `warn` when it is given; the deploy net's notes are the
    result's (`notes`).
    """
    from ..forward.run import run_net

    npz = output is not None and _npz_output(output)
    feeds = _input_values(inputs)
    with contextlib.ExitStack() as opened:
        doc, other = opened_net(opened, src, definition, warn)
        result = run_net(doc, definition=other, feeds=feeds, shapes=shapes, seed=seed, outputs=outputs)
    if npz:
        from ..formats.numpy import save_arrays

        save_arrays(result.values, output, fmt="npz")
    return result


def _npz_output(output) -> bool:
    """True for where run writes its .npz: OptionsRefused for a path whose extension chooses another format."""
    from ..formats.targets import chosen_format

    if isinstance(output, (str, os.PathLike)) and output != "-" and chosen_format(output, None) != "npz":
        raise OptionsRefused(f"{parameter('output', True)}{os.fspath(output)}: run writes its blobs to an .npz (one "
                             "array per blob name)")
    return True


def _input_values(inputs: dict | None) -> dict:
    """{name: array or InputFile}: each file named (a path, "-", a binary file object) located as one blob."""
    from ..forward.run import InputFile, read_input_file

    feeds = {}
    for name, value in (inputs or {}).items():
        is_file = not isinstance(value, InputFile) and (isinstance(value, (str, os.PathLike)) or hasattr(value, "read"))
        feeds[name] = read_input_file(value) if is_file else value
    return feeds


def export(src, dest, *, definition=None, shapes: dict | None = None, opset: int | None = None, outputs=None,
           check: bool = False, seed: int = 0, warn=None, preprocess=None, dynamic: bool = False):
    """Write the net in `src` as one ONNX model at `dest`; returns (ExportResult, the check's CheckResult or None).

    The deploy net of `run` (forward/deploy.py): `definition` (a
    deploy.prototxt, or the definition an HDF5 snapshot lacks), `shapes`
    ({input: shape}) and `outputs` (None: the net's outputs; "all"; names)
    as `run` takes them; `opset` from 13 to the installed onnx's newest
    (default 17). With `check`, onnx's full check and onnxruntime against
    blobtool's forward on the same random input (onnxport/check.py), which
    need the `onnx` extra (UsageError naming it otherwise), and write `dest`
    only when it passes (onnxport/check.py's prove_export). `preprocess`
    (True, or a dict of predict's mean, scale, raw_scale, rgb, and pixels:
    "RGB" or "BGR") puts the preprocessing in front of the graph: the model
    takes uint8 pixels, N x H x W x C, RGB or BGR (onnxport/pixels.py). What the deploy
    net left out and what changed on the way are said to `warn`, and, when
    `warn` is given, the warnings of the files opened here. `dynamic`:
    symbolic batch, height and width wherever the layers allow it
    (onnxport/dynamic.py), each layer that fixes axes said to `warn`; the
    check runs at the exported size.
    """
    from ..forward.run import prepare_net

    _needs_onnx(check)
    from ..onnxport.check import prove_export
    from ..onnxport.graph import OPSET_DEFAULT, export_program

    with contextlib.ExitStack() as opened:
        doc, other = opened_net(opened, src, definition, warn)
        # Only written out, the weights are viewed in the mapped file; a check runs them, so it reads them.
        deploy, program, wanted = prepare_net(doc, other, shapes, outputs=outputs, aligned=check)
        # With --preprocess the model does the data layer's preprocessing: its line says so, not "taken as they are".
        notes = deploy.notes(_BAKED if preprocess else "")
        pixels = None
        if preprocess:
            from .predicting import pixel_steps

            pixels, said = pixel_steps(preprocess, deploy, program)
            notes += said
        half = [f"{layer}/{k}" for layer, k in sorted(program.half)]
        if half:
            notes.append(f"{doc.path}: {len(half)} float16 blob{'s' * (len(half) != 1)} ({', '.join(half[:4])}"
                         f"{' ...' if len(half) > 4 else ''}) kept as float16, each cast to float32 where the net "
                         "uses it (exactly: every float16 value is a float32 one)")
        from .. import __version__
        # With a check the model is written where nothing reads it, and put in place only when the check passes.
        staged = opened.enter_context(Staged([dest] if check else ()))
        result = export_program(program, staged.path(dest), opset=opset or OPSET_DEFAULT, outputs=wanted,
                                net_name=deploy.net.name, source=doc.path, version=__version__, pixels=pixels,
                                dynamic=dynamic)
        result.path, result.external = os.fspath(dest), result.external and os.fspath(dest) + ".data"
        result.notes = notes + result.notes  # the deploy net's, then the model's (names changed, Inf/NaN constants)
        for line in result.notes:
            (warn or warnings.warn)(line)
        verdict = (prove_export(staged, dest, program, wanted, seed=seed, source=doc.path, exported=result,
                                pixels=pixels)
                   if check else None)
        return result, verdict


_BAKED = "the exported model takes uint8 pixels and does in front of the graph the preprocessing said below"


def _needs_onnx(check: bool) -> None:
    """UsageError naming the extra where a check is asked for and onnx or onnxruntime is not installed.

    Writing the model needs neither: blobtool writes ONNX's messages with
    classes of its own (proto/blobtool_onnx.proto says why).
    """
    import importlib.util

    missing = [m for m in (("onnx", "onnxruntime") if check else ()) if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"{parameter('check')} needs {' and '.join(missing)}: pip install 'blobtool[onnx]' (onnx "
                         "and onnxruntime, which need protobuf 4.25 or newer)")
