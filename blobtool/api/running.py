"""Running a net: run (its blobs' values) and export (one ONNX model)."""

from __future__ import annotations

import contextlib
import os
import warnings

from ..errors import UsageError, parameter
from ..files import Staged
from .common import opened_net

__all__ = ["run", "export"]


def run(src, *, definition=None, inputs: dict | None = None, shapes: dict | None = None, seed: int = 0,
        outputs=None):
    """Run the net in `src` forward as Caffe's TEST phase, in float32; the RunResult (its `values`: {blob: array}).

    `src` and `definition` are Documents or what open_document takes;
    `definition` is the net's definition to run (a deploy.prototxt), whose
    layers take `src`'s weights by name. `inputs` ({name: array}) gives
    inputs' values, `shapes` ({name: shape}) their shapes (a data layer's);
    inputs without values get random normal values from `seed`. `outputs`:
    None (the net's outputs), "all", or blob names.
    """
    from ..forward.run import run_net

    with contextlib.ExitStack() as opened:
        doc, other = opened_net(opened, src, definition)
        return run_net(doc, definition=other, feeds=inputs, shapes=shapes, seed=seed, outputs=outputs)


def export(src, dest, *, definition=None, shapes: dict | None = None, opset: int | None = None, outputs=None,
           check: bool = False, seed: int = 0, warn=None):
    """Write the net in `src` as one ONNX model at `dest`; returns (ExportResult, the check's CheckResult or None).

    The deploy net of `run` (forward/deploy.py): `definition` (a
    deploy.prototxt, or the definition an HDF5 snapshot lacks), `shapes`
    ({input: shape}) and `outputs` (None: the net's outputs; "all"; names)
    as `run` takes them; `opset` from 13 to the installed onnx's newest
    (default 17). With `check`, onnx's full check and onnxruntime against
    blobtool's forward on the same random input (onnxport/check.py), which
    need the `onnx` extra (UsageError naming it otherwise), and write `dest`
    only when it passes (onnxport/check.py's prove_export). What the deploy
    net left out and what changed on the way are said to `warn`.
    """
    from ..forward.run import prepare_net

    _needs_onnx(check)
    from ..onnxport.check import prove_export
    from ..onnxport.graph import OPSET_DEFAULT, export_program

    with contextlib.ExitStack() as opened:
        doc, other = opened_net(opened, src, definition)
        # Only written out, the weights are viewed in the mapped file; a check runs them, so it reads them.
        deploy, program, wanted = prepare_net(doc, other, shapes, outputs=outputs, aligned=check)
        notes = deploy.notes()
        half = [f"{layer}/{k}" for layer, k in sorted(program.half)]
        if half:
            notes.append(f"{doc.path}: {len(half)} float16 blob{'s' * (len(half) != 1)} ({', '.join(half[:4])}"
                         f"{' ...' if len(half) > 4 else ''}) kept as float16, each cast to float32 where the net "
                         "uses it (exactly: every float16 value is a float32 one)")
        from .. import __version__
        # With a check the model is written where nothing reads it, and put in place only when the check passes.
        staged = opened.enter_context(Staged([dest] if check else ()))
        result = export_program(program, staged.path(dest), opset=opset or OPSET_DEFAULT, outputs=wanted,
                                net_name=deploy.net.name, source=doc.path, version=__version__)
        result.path, result.external = os.fspath(dest), result.external and os.fspath(dest) + ".data"
        result.notes = notes + result.notes  # the deploy net's, then the model's (names changed, Inf/NaN constants)
        for line in result.notes:
            (warn or warnings.warn)(line)
        verdict = (prove_export(staged, dest, program, wanted, seed=seed, source=doc.path, exported=result)
                   if check else None)
        return result, verdict


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
