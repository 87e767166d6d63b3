"""One call that runs a net: its deploy net made, its inputs given or drawn, its blobs computed (blobtool run).

`run_net(doc, ...)` takes a net document (any net blobtool reads), an
optional definition document (a deploy.prototxt, or the definition an HDF5
snapshot lacks), the inputs' values ({name: array}) and shapes
(--input-shape), and which blobs to return: the net's outputs (None), every
blob ("all") or a list of names. An input given no values is filled with
random normal values from `seed` (numpy's default_rng), which the result
says. Everything is checked before a layer runs (runner.build).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import FormatError, UsageError
from .deploy import deploy_net
from .runner import build

__all__ = ["RunResult", "InputFile", "read_input_file", "prepare_net", "run_net", "random_inputs", "blob_summary",
           "ALL"]

ALL = "all"


@dataclass
class RunResult:
    """What a run computed: the blobs asked for, the inputs fed, and the deploy net it ran."""

    path: str
    values: dict                     # {blob name: float32 array}, in the order asked for
    inputs: list                     # [{"name", "shape", "given": path or "random normal, seed N"}]
    deploy: object                   # the Deploy
    program: object                  # the runner's Program
    notes: list = field(default_factory=list)   # lines for stderr
    fed: dict = field(default_factory=dict)     # {input name: the float32 array fed}, with keep_inputs

    def record(self) -> dict:
        """JSON-ready: the inputs, each blob's shape, min, max, mean and L2 (in float64), and the deploy net's changes."""
        return {
            "path": self.path,
            "inputs": self.inputs,
            "blobs": [{"name": name, **blob_summary(value)} for name, value in self.values.items()],
            "deploy": self.deploy.record(),
        }


@dataclass
class InputFile:
    """The values of one input in a file (.npy or BlobProto), located but not read: `shape` from its header.

    `values()` reads them: float32 and float64 as stored, other numeric
    types (uint8 images, int32 and int64 indices, float16) converted to
    float32, as pycaffe converts what it is given.
    """

    path: str
    shape: tuple
    read: object        # () -> numpy array of `shape`

    def values(self) -> np.ndarray:
        return self.read()


def read_input_file(src) -> InputFile:
    """Locate the one blob of file `src` (a path, "-" or a binary file object) as an input's values.

    An .npy's shape comes from its header and a BlobProto's from its shape
    fields; the payload stays in the file (memory-mapped) until `values()`.
    FormatError (exit 3) for a file that is neither, or holds several blobs.
    """
    from ..files import open_source
    from ..formats import document_of
    from ..formats.npyheader import NPY_HEADER_READ, parse_npy_header
    from ..formats.numpy import load_npy

    source = open_source(src)
    if bytes(source.buf[:6]) == b"\x93NUMPY":
        header = parse_npy_header(memoryview(source.buf)[:NPY_HEADER_READ], source.name)
        wide = header.dtype.kind == "f" and header.dtype.itemsize in (4, 8)
        cast = None if wide else np.float32

        def read():
            blob = load_npy(source, cast=cast)
            return blob.cpu_data().reshape(blob.shape)

        return InputFile(source.name, tuple(header.shape), read)
    doc = document_of(source)
    if doc.kind != "blob" or len(doc.entries) != 1:
        raise FormatError(f"an input's values are one blob (.npy or BlobProto); this is a {doc.kind} file holding "
                          f"{len(doc.entries)} blobs", path=source.name)
    entry = doc.entries[0]

    def read_blob():
        blob = entry.blob()
        return blob.cpu_data().reshape(blob.shape)

    return InputFile(source.name, tuple(entry.shape), read_blob)


def blob_summary(value: np.ndarray) -> dict:
    """shape, min, max, mean and L2 of a blob's values, accumulated in float64; NaN and Inf counted."""
    wide = np.asarray(value, dtype=np.float64).reshape(-1)
    finite = np.isfinite(wide)
    out = {"shape": list(value.shape), "count": int(wide.size)}
    if wide.size == 0:
        return {**out, "min": None, "max": None, "mean": None, "l2": 0.0, "nan": 0, "inf": 0}
    with np.errstate(all="ignore"):
        out.update(min=float(np.min(wide)), max=float(np.max(wide)), mean=float(np.mean(wide)),
                   l2=float(np.sqrt(np.dot(wide, wide))))
    out["nan"] = int(np.isnan(wide).sum())
    out["inf"] = int(wide.size - finite.sum() - out["nan"])
    return out


def prepare_net(doc, definition=None, shapes: dict | None = None, *, given: dict | None = None, feeds=(),
                outputs=None, aligned: bool = True, shapes_only: bool = False) -> tuple:
    """(Deploy, Program, the blobs asked for) of net `doc`: what run and export both start from.

    The deploy net of `doc` (or of `definition`), built with `doc`'s weights
    when it holds them (a .prototxt holds none); `given` ({input: shape})
    the shapes of the values `feeds` names, each of which the net must take;
    `outputs` as run_net takes it; `aligned` and `shapes_only` as
    runner.build takes them. What run, export (and their checks) and info's
    top shapes build their net with: the one place a net is made runnable.
    """
    deploy = deploy_net(doc, definition, shapes, given)
    unknown = [n for n in feeds if n not in deploy.inputs]
    if unknown:
        raise UsageError(f"the net has no input {', '.join(repr(n) for n in unknown)} (its inputs: "
                         f"{', '.join(deploy.inputs) or 'none'})", path=deploy.source)
    # A run takes no weights from a .prototxt; info's shapes have always checked the blobs one holds.
    weights = doc if doc.kind == "net" and (doc.format != "prototxt" or shapes_only) else None
    program = build(deploy, weights, aligned=aligned, shapes_only=shapes_only)
    if outputs is None:
        wanted = program.outputs()
    elif outputs == ALL:
        wanted = program.blob_names()
    else:
        wanted = program.check_outputs(outputs)
    return deploy, program, wanted


def run_net(doc, *, definition=None, feeds: dict | None = None, shapes: dict | None = None, seed: int = 0,
            outputs=None, progress=None, keep_inputs: bool = False) -> RunResult:
    """Run net `doc` forward as Caffe's TEST phase in float32; the blobs asked for (see the module).

    `feeds`: {input name: array} (float32 after conversion; its shape is the
    input's, or gives it where the net states none). `shapes`: {blob name:
    shape} for inputs whose shape the net does not state, or to take a
    computed blob as the input. UsageError (exit 2) for an input without a
    shape or of another shape, an unknown input or blob name; FormatError
    (exit 3) for a layer blobtool cannot run or whose shapes do not fit.
    `keep_inputs`: the result's `fed` holds the arrays fed (a check feeds
    them to the net after).
    """
    feeds = dict(feeds or {})
    shapes = dict(shapes or {})
    # A file's shape is read from its header (InputFile): nothing is read before it is checked.
    given = {name: tuple(np.shape(value)) for name, value in feeds.items()}
    deploy, program, wanted = prepare_net(doc, definition, shapes, given=given, feeds=feeds, outputs=outputs)
    # Refused before the inputs are drawn: they are part of what the run holds at once.
    program.check_memory(wanted)
    drawn = random_inputs({name: shape for name, shape in program.inputs.items() if name not in feeds}, seed)
    values_in = {}
    said = []
    for name, shape in program.inputs.items():
        if name in feeds:
            values_in[name] = _as_input(feeds[name], name, shape, deploy.source)
            said.append({"name": name, "shape": list(shape), "given": "values given"})
        else:
            values_in[name] = drawn[name]
            said.append({"name": name, "shape": list(shape), "given": f"random normal, seed {seed}"})
    values = program.run(values_in, wanted, progress=progress)
    notes = deploy.notes()
    # Kept only where asked (a check feeds them to a second net): a run's result holds its outputs alone.
    return RunResult(doc.path, values, said, deploy, program, notes, values_in if keep_inputs else {})


def random_inputs(shapes: dict, seed: int) -> dict:
    """{input: float32 standard normal values of its shape}, drawn from numpy's default_rng(seed) in `shapes`' order.

    The one draw of a run's random inputs: run and export --check give the
    same seed the same values.
    """
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in shapes.items()}


def _as_input(value, name: str, shape: tuple, path) -> np.ndarray:
    """An input's values as float32 of the input's shape; a finite value float32 cannot hold is refused.

    The shape is checked before the values are read or converted: an
    InputFile's comes from its header, so a file of another size is refused
    without reading it.
    """
    if tuple(np.shape(value)) != tuple(shape):
        where = f"{value.path} holds" if isinstance(value, InputFile) else "the values given have"
        shape_text = ",".join(map(str, np.shape(value))) or "1"
        raise UsageError(f"input {name!r}: {where} shape {tuple(np.shape(value))}, the net takes {tuple(shape)} "
                         f"(--input-shape {name}={shape_text} reshapes the net to it)", path=path)
    array = value.values() if isinstance(value, InputFile) else np.asarray(value)
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise UsageError(f"input {name!r}: values of type {array.dtype} are not numbers", path=path)
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.ascontiguousarray(array, dtype=np.float32)
    if not np.isfinite(out).all() and np.isfinite(array).all():
        raise UsageError(f"input {name!r}: values beyond float32's range (Caffe's float net cannot hold them)",
                         path=path)
    return out
