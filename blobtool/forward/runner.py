"""A deploy net made runnable, and run: every layer built, every blob's shape known, then the forward pass.

`build(deploy, weights)` makes each layer of a Deploy (deploy.py) from its
LayerParameter and the weights of the layer of the same name in `weights`
(any net document: a .caffemodel in any layer format or encoding, FP16
included, or an HDF5 snapshot), as Caffe's Net::CopyTrainedLayersFrom
fills a deploy net by layer name. Blobs shared by ParamSpec name between
layers (Caffe's `param { name: ... }`) come from the first layer holding
them. Everything a forward pass can refuse is refused here, before
anything is computed: a type blobtool cannot run (FormatError naming the
layer and its type), a layer without the weights it needs, a shape its
Reshape refuses.

`Program.shapes` holds the shape of every blob version, as Caffe's
Net::Reshape gives them. `Program.run(feeds, outputs)` runs the layers in
order in float32 (Caffe's Dtype=float) and returns the value of each blob
asked for after the last layer writing it. A blob's array is let go as soon
as no later layer reads it and it is not asked for, so that peak memory is
the weights and the blobs alive at once.

Sizes are bounded before anything is allocated: build() refuses a shape
past Caffe's Blob::Reshape limits (memory.py), and `Program.check_memory`
(called by run() and before a run's inputs are drawn) refuses a run whose
blobs alive at once exceed the memory this process can get.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..errors import FormatError, UsageError
from ..formats.caffe.containers import name_key, text
from ..layers import FLOAT, LayerError, layer_class
from ..net.graph import Versions
from .memory import MAX_COUNT, available_bytes, check_shape, format_bytes

__all__ = ["Program", "Step", "build"]


@dataclass
class Step:
    """One layer ready to run: the Layer, the blob names it reads and writes, and their shapes."""

    layer: object
    bottoms: tuple
    tops: tuple
    bottom_shapes: list = field(default_factory=list)
    top_shapes: list = field(default_factory=list)
    work: int = 0                # values of the largest working array the layer makes besides its tops
    work_what: str = ""          # what that array is (the padded input)


@dataclass
class Program:
    """The deploy net built: its inputs' shapes and the steps in order (see the module)."""

    inputs: dict                 # {input name: shape}
    steps: list                  # Step per layer, in order
    path: str = ""
    half: set = field(default_factory=set)   # (layer, blob index) of the blobs the file stores as float16

    @property
    def shapes(self) -> dict:
        """{blob name: shape after the last layer writing it} (inputs included)."""
        found = dict(self.inputs)
        for step in self.steps:
            found.update(zip(step.tops, step.top_shapes))
        return found

    @cached_property
    def versions(self) -> Versions:
        """Who reads which version of each blob (net/graph.py), walked once for the steps as built."""
        return Versions([(s.bottoms, s.tops) for s in self.steps])

    def outputs(self) -> list:
        """The net's outputs, Caffe's: the blobs whose last value no layer reads, in the order they were written."""
        return list(self.versions.outputs)

    def blob_names(self) -> list:
        """Every blob name, inputs first, then in the order layers first write them."""
        names = dict.fromkeys(self.inputs)  # a dict keeps the order and finds a name in one step
        for step in self.steps:
            names.update(dict.fromkeys(step.tops))
        return list(names)

    def check_outputs(self, wanted) -> list:
        """The requested blob names, each one the net has (UsageError naming those it does not)."""
        known = set(self.blob_names())
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise UsageError(f"the net has no blob {', '.join(repr(n) for n in unknown)} (its blobs: "
                             f"{', '.join(self.blob_names()[:12])}{' ...' if len(known) > 12 else ''})",
                             path=self.path)
        return list(dict.fromkeys(wanted))

    def run(self, feeds: dict, outputs, *, progress=None) -> dict:
        """{name: float32 array} of each blob in `outputs` after its last writer, from inputs `feeds`.

        `feeds` holds one array per input, of the input's shape; `progress`,
        when given, is called with (step index, step count) after each layer.
        """
        wanted = set(outputs)
        self.check_memory(wanted, held=sum(int(np.asarray(v).nbytes) for v in feeds.values()))
        values = _Live()
        for name, shape in self.inputs.items():
            value = np.asarray(feeds[name], dtype=FLOAT, order="C")
            if tuple(value.shape) != tuple(shape):
                raise UsageError(f"input {name!r} has shape {tuple(value.shape)}, the net takes {tuple(shape)}",
                                 path=self.path)
            values[name] = value
        freed = self.versions.freed
        given = {id(v) for v in values.values()}  # the caller's arrays are never written
        for i, step in enumerate(self.steps):
            xs = [values[b] for b in step.bottoms]
            # A NaN or Inf a layer makes is Caffe's value too (run reports how many a blob holds); numpy's
            # warnings about them (and about the mean of nothing) would only be noise on stderr.
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                if self._in_place(step, values, freed[i], given):
                    ys = [step.layer.forward_in_place(xs[0])]
                else:
                    ys = step.layer.forward(xs)
            del xs
            # caffe-ssd's DetectionOutput knows its row count only once it has run (variable_tops).
            loose = getattr(step.layer, "variable_tops", False)
            for top, y, shape in zip(step.tops, ys, step.top_shapes):
                if y.dtype != FLOAT or (len(y.shape) != len(shape) if loose else tuple(y.shape) != tuple(shape)):
                    raise AssertionError(f"layer {step.layer.name} gave {y.dtype} {y.shape} for {top}, "
                                         f"its reshape said float32 {shape}")
                values[top] = y
            del ys
            for name in freed[i]:
                if name not in step.tops and name not in wanted:
                    values.pop(name, None)
            if progress is not None:
                progress(i + 1, len(self.steps))
        return {name: values[name] for name in outputs}

    def peak_bytes(self, outputs) -> int:
        """The most bytes of blobs alive at once in run(outputs).

        Mirrors run(): an input lives until its last reader, each layer's
        tops are new arrays made while its bottoms are alive, and a blob is
        let go after its last reader unless it is asked for. Each layer's
        largest working array (Step.work: a padded input) counts with its
        tops; smaller temporaries (a convolution's chunk of columns) do
        not: this is the least a run needs.
        """
        wanted = set(outputs)
        freed = self.versions.freed
        alive = {name: _nbytes(shape) for name, shape in self.inputs.items()}
        held = sum(alive.values())
        peak = held
        for i, step in enumerate(self.steps):
            made = {top: _nbytes(shape) for top, shape in zip(step.tops, step.top_shapes)}
            peak = max(peak, held + sum(made.values()) + 4 * step.work)
            for top, size in made.items():
                held += size - alive.get(top, 0)
                alive[top] = size
            for name in freed[i]:
                if name not in step.tops and name not in wanted and name in alive:
                    held -= alive.pop(name)
        return peak

    def check_memory(self, outputs, held: int = 0) -> None:
        """FormatError (exit 3) where the blobs run(outputs) keeps alive at once exceed the memory this process can get.

        The weights are in memory already (build() read them), and so are
        `held` bytes of the inputs where they were made before the check:
        what can be had is measured after both, so neither counts again.
        Also refused: a layer's working array (Step.work) of more than
        INT_MAX values, whatever the memory, and a blob of no values, which
        Caffe's forward cannot hold.
        """
        empty = [(n, s) for n, s in self.inputs.items() if 0 in s] + \
            [(t, s, step) for step in self.steps for t, s in zip(step.tops, step.top_shapes) if 0 in s]
        if empty:
            # Caffe's Blob allocates nothing for 0 values, and a forward that reads or writes such a blob
            # stops at CHECK(data_) (blob.cpp): Caffe runs no net holding one.
            name, shape = empty[0][:2]
            who = f"layer {empty[0][2].layer.name!r} ({empty[0][2].layer.type}) gives" if len(empty[0]) > 2 else \
                "the net takes"
            raise FormatError(f"{who} blob {name!r} of shape {tuple(shape)}, which holds no values: Caffe allocates "
                              "no memory for it and its forward stops there (Check failed: data_); nothing was "
                              "computed", path=self.path)
        for step in self.steps:
            # Only a run makes these arrays (an export writes the layer as it is): refused here, not in build().
            if step.work > MAX_COUNT:
                raise FormatError(f"layer {step.layer.name!r} ({step.layer.type}): blobtool computes it through its "
                                  f"{step.work_what}, {step.work:,} values, past the {MAX_COUNT:,} (INT_MAX) it "
                                  "holds in one array; nothing was computed", path=self.path)
        need = self.peak_bytes(outputs) - held
        have = available_bytes()
        if have is not None and need > have:
            raise FormatError(f"running the net needs {format_bytes(need)} more at once (the blobs alive at once, "
                              f"the weights aside) and {format_bytes(have)} can be had (the least of MemAvailable, "
                              "RLIMIT_AS and the memory cgroup's limit); nothing was computed", path=self.path)

    @staticmethod
    def _in_place(step, values: dict, freed: set, given: set) -> bool:
        """Whether `step` may write its top into its bottom's array, as Caffe's in-place layers do.

        Only a layer that can (forward_in_place), whose top is its one
        bottom, where no later layer reads the value it overwrites, no other
        blob holds or views that array (a Split's tops are one array, a
        Flatten's top views its bottom) and it is not the caller's input.
        Fresh memory is what a run pays for most on a machine that hands
        freed pages back (MobileFaceNet's BatchNorm, Scale and PReLU).
        """
        if not hasattr(step.layer, "forward_in_place") or len(step.bottoms) != 1 or step.tops != step.bottoms:
            return False
        name = step.bottoms[0]
        x = values[name]
        if name not in freed or id(x) in given or not x.flags.writeable or x.base is not None:
            return False
        return not any(np.may_share_memory(x, values[other]) for other in values.sharing(name))


def _owner(array) -> int | None:
    """id() of the array owning `array`'s memory (numpy's views keep it as their base); None where no array owns it.

    as_strided's views and arrays over a buffer end at an object that is
    not an array: their memory can be anyone's.
    """
    while isinstance(array.base, np.ndarray):
        array = array.base
    return id(array) if array.base is None else None


class _Live(dict):
    """The blobs' values during a run, {name: array}, indexed by the array owning each one's memory.

    Two values share memory only where one array owns both, or where one
    of them has no owning array (_owner): whether any other value shares a
    value's memory is asked of those few, not of every value alive (a
    chain of 4,000 in-place layers with every blob kept asked 8 million
    pairs).
    """

    def __init__(self):
        super().__init__()
        self.owners: dict = {}   # id of the owning array -> the names whose values it holds
        self.loose: set = set()  # names whose memory no array owns

    def __setitem__(self, name, array) -> None:
        if name in self:
            self._forget(name)
        super().__setitem__(name, array)
        key = _owner(array)
        if key is None:
            self.loose.add(name)
        else:
            self.owners.setdefault(key, set()).add(name)

    def pop(self, name, *default):
        if name in self:
            self._forget(name)
        return super().pop(name, *default)

    def _forget(self, name) -> None:
        key = _owner(dict.__getitem__(self, name))
        if key is None:
            self.loose.discard(name)
            return
        names = self.owners[key]
        names.discard(name)
        if not names:
            del self.owners[key]

    def sharing(self, name) -> set:
        """The other names whose values may share memory with the value of `name`."""
        key = _owner(self[name])
        near = set(self) if key is None else self.owners.get(key, set())
        return (near | self.loose) - {name}


def build(deploy, weights, *, weights_by_layer: dict | None = None, aligned: bool = True,
          shapes_only: bool = False) -> Program:
    """The Program of Deploy `deploy` with the blobs of net document `weights` (None: a net without weights).

    `aligned`: each float32 weight read into an array of its own, for the
    products a run makes (_weights_by_layer); without, the weights view the
    mapped file where they can (what an export, which only writes them out,
    takes: no copy of the weights is made). `shapes_only`: a Program for its
    shapes, never run (info's top shapes): the float32 weights view the
    mapped file and the others are zeros of their shape, not converted.

    FormatError (exit 3) for a layer type blobtool cannot run, a layer
    without the blobs its type needs, or shapes Caffe's Reshape refuses;
    each names the layer and its type.
    """
    path = weights.path if weights is not None else deploy.source
    messages = [m for m in deploy.net.layer if m.type != "Input"]
    cannot = [(text(m.name), text(m.type)) for m in messages if layer_class(text(m.type)) is None]
    if cannot:
        name, kind = cannot[0]
        more = f" (and {len(cannot) - 1} more: {', '.join(f'{n} ({k})' for n, k in cannot[1:4])})" \
            if len(cannot) > 1 else ""
        raise FormatError(f"layer {name!r} has type {kind!r}, which blobtool cannot run{more}; nothing was "
                          "computed", path=deploy.source)
    held = weights_by_layer if weights_by_layer is not None else _weights_by_layer(weights, aligned, shapes_only)
    half = _float16_blobs(weights) if weights_by_layer is None else set()
    shared: dict = {}
    steps = []
    shapes = {name: check_shape(shape, f"input {name!r}", deploy.source) for name, shape in deploy.inputs.items()}
    writers = {n: None for n in deploy.inputs}   # blob -> the layer that gave it (None: an input)
    loose: dict = {}   # blob -> the layer whose forward alone knows its first axis (variable_tops: Filter)
    for message, name in zip(messages, deploy.layer_names or [text(m.name) for m in messages]):
        kind = text(message.type)
        blobs = list(held.get(name, ()))
        blobs = _shared_blobs(message, blobs, shared)
        cls = layer_class(kind)
        try:
            layer = cls(name, kind, message, blobs)
            bottoms = tuple(map(name_key, message.bottom))
            tops = tuple(map(name_key, message.top))
            layer.check_counts(len(bottoms), len(tops))
            in_shapes = [shapes[b] for b in bottoms]
            out_shapes = [tuple(int(d) for d in s) for s in layer.reshape(in_shapes)]
            work, what = layer.workspace(in_shapes) if out_shapes else (0, "")
        except LayerError as exc:
            raise exc.with_path(path) from None
        if len(out_shapes) != len(tops):
            raise AssertionError(f"layer {name}: reshape gave {len(out_shapes)} shapes for {len(tops)} tops")
        _one_source(name, kind, bottoms, tops, writers, path)
        _fixed_bottoms(name, kind, bottoms, loose, path)
        if getattr(layer, "variable_tops", False):
            loose.update(dict.fromkeys(tops, f"{name!r} ({kind})"))
        # Caffe's Blob::Reshape refuses a top past its limits before any memory is had for it; so does this pass.
        for top, shape in zip(tops, out_shapes):
            check_shape(shape, f"layer {name!r} ({kind}): top {top!r}", path)
        shapes.update(zip(tops, out_shapes))
        steps.append(Step(layer, bottoms, tops, in_shapes, out_shapes, work, what))
    return Program(dict(deploy.inputs), steps, path, half)


def _fixed_bottoms(name: str, kind: str, bottoms: tuple, loose: dict, path) -> None:
    """FormatError where a layer reads a blob whose size only its writer's forward knows (variable_tops).

    Caffe reshapes every layer again at each forward; blobtool checks every
    shape before computing anything, so such a blob is run as an output only.
    """
    for bottom in bottoms:
        if bottom in loose:
            raise FormatError(f"layer {name!r} ({kind}) reads blob {bottom!r}, whose first axis layer "
                              f"{loose[bottom]} knows only as it runs (from its input's values): blobtool runs "
                              "such a blob as an output of the net only; nothing was computed", path=path)


def _one_source(name: str, kind: str, bottoms: tuple, tops: tuple, writers: dict, path) -> None:
    """FormatError where a layer writes a blob an input or an earlier layer gives, other than in place.

    Mirrors Net::AppendTop: top k is in place when bottom k has its name;
    any other top already known is "Top blob produced by multiple sources",
    which Caffe refuses (the later writer would hide the earlier one).
    """
    for k, top in enumerate(tops):
        if k < len(bottoms) and bottoms[k] == top:
            continue
        if top in writers:
            given = "the net's input" if writers[top] is None else f"layer {writers[top]!r}"
            raise FormatError(f"layer {name!r} ({kind}) writes blob {top!r}, which {given} gives already, and not in "
                              "place (its bottom of the same position): Caffe refuses a blob of two sources ('Top "
                              "blob produced by multiple sources')", path=path)
        writers[top] = name


def _nbytes(shape) -> int:
    """The bytes of a float32 blob of `shape`."""
    n = 4
    for d in shape:
        n *= int(d)
    return n


def _weights_by_layer(doc, aligned: bool = True, shapes_only: bool = False) -> dict:
    """{layer name: [float32 arrays of its blobs, in order]} of a net document (FP16 and float64 made float32).

    Each float32 blob is read into an array of its own, from the file where
    it is mapped (files/pages.py), not viewed in the mapping: a mapped blob
    may start at any byte, and BLAS takes a misaligned matrix only after
    numpy copies it whole at every product (VGG-16's 392 MiB fc6 weight,
    offset 58,860,645: 1.2 s a run, against 0.04 s to read it once).
    Reading it through the file keeps the mapping's pages out of memory,
    so the weights are held once. `shapes_only` (build's): a blob of
    another type is zeros of its shape (calloc's pages, never touched).
    """
    if doc is None:
        return {}
    from ..files.pages import file_behind, read_mapped, releasing

    held: dict = {}
    with releasing():
        for e in doc.entries:
            if e.layer is None:
                continue
            if shapes_only and np.dtype(e.dtype) != FLOAT:
                held.setdefault(e.layer, []).append(np.zeros(e.shape, FLOAT))
                continue
            values = np.asarray(e.blob().cpu_data())
            if values.dtype == FLOAT and (not aligned or shapes_only):
                out = values
            elif values.dtype == FLOAT:
                out = np.empty(values.shape, FLOAT)
                behind = file_behind(values)
                if behind is not None and values.size:
                    read_mapped(*behind, out)
                else:
                    out[...] = values
            else:
                out = _float32(values, e, doc.path)
            held.setdefault(e.layer, []).append(out.reshape(e.shape))
    return held


def _float16_blobs(doc) -> set:
    """(layer, index) of each blob a net document stores as IEEE float16 (NVIDIA Caffe's FP16 and the like)."""
    if doc is None:
        return set()
    found, seen = set(), {}
    for e in doc.entries:
        if e.layer is None:
            continue
        k = seen.get(e.layer, 0)
        seen[e.layer] = k + 1
        if np.dtype(e.dtype) == np.float16:
            found.add((e.layer, k))
    return found


def _float32(values: np.ndarray, entry, path) -> np.ndarray:
    """A blob's values in float32, as Caffe's float net holds them; a finite value that float32 cannot hold is refused."""
    if values.dtype == FLOAT:
        return values
    with np.errstate(over="ignore", invalid="ignore"):
        out = values.astype(FLOAT)
    if values.dtype.itemsize > 4 and np.isfinite(values).all() and not np.isfinite(out).all():
        raise FormatError(f"blob {entry.name} holds values beyond float32's range, which Caffe's float net "
                          "cannot hold", path=path)
    return out


def _shared_blobs(message, blobs: list, shared: dict) -> list:
    """A layer's blobs with those it shares by ParamSpec name taken from the first layer holding them.

    Caffe's Net::AppendParam: a named param seen before is the owner's blob;
    an HDF5 snapshot stores it only with its owner.
    """
    out = list(blobs)
    for k, spec in enumerate(message.param):
        name = name_key(spec.name)
        if not name:
            continue
        if name in shared:
            if k < len(out):
                out[k] = shared[name]
            elif k == len(out):
                out.append(shared[name])
        elif k < len(out):
            shared[name] = out[k]
    return out
