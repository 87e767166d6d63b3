"""export --dynamic: which axes of each blob stay symbolic, and the layers that tie the net to one size.

The inputs' batch, height and width (axes 0, 2 and 3 of a 4-D input; axis
0 of any other) are symbols: "N", "H", "W" for a net of one input,
"<input>_N" ... for several. Each blob axis holds the set of symbols its
size is computed from, carried layer by layer in the net's order:

- the layers written without a shape constant pass them on: the
  neurons, BatchNorm, Scale and Bias of one bottom, Eltwise, Split,
  Dropout, Softmax, Convolution and Deconvolution, Upsample (nearest),
  Concat and Slice on an axis that is not free, Pooling where ONNX's
  ceil_mode gives Caffe's size at every input size (see _pooling_ties),
  global pooling (its plane 1 x 1), InnerProduct over axes that are not
  free (its batch stays free), Crop (its ends from the reference blob's
  Shape), Flatten to the last axis and Reshape from axis 0 (their 0 and -1
  kept), Interp by zoom factor (its sizes computed in the graph);
- any other layer, and the cases above that cannot be computed from a
  symbolic size, tie the symbols of its bottoms' free axes: from then on
  they are the exported size, one line says which layer fixed which axes,
  and the layer is written as without --dynamic.

A tie holds for the whole graph (a symbol is one size of an input), so a
layer written before it stays correct: its nodes take any size. The axes
still free at the end are the graph's dim_param: an output's axis that
equals an input's symbol takes its name, another free axis
"<output>_<axis>".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["DynamicPlan", "plan_dynamic"]

# Written without a shape constant: every top's axes are the bottoms' (their union, for Eltwise).
_PASS = {"ReLU", "PReLU", "Sigmoid", "TanH", "BatchNorm", "Dropout", "Split", "Eltwise", "ELU", "AbsVal", "BNLL",
         "Clip", "ReLU6", "Swish", "Threshold", "Exp", "Log", "Softmax"}
_CONV = {"Convolution", "ConvolutionDepthwise", "Deconvolution"}
_AXIS_NAMES = {0: "batch", 2: "height", 3: "width"}


@dataclass
class DynamicPlan:
    """The free axes of every blob, the steps written without shape constants, and the ties (see the module)."""

    symbols: dict                                 # symbol -> (input, axis, exported size)
    inputs: dict                                  # input -> {axis: symbol}
    axes: dict = field(default_factory=dict)      # blob -> {axis: frozenset of symbols}
    exact: dict = field(default_factory=dict)     # blob -> {axis: symbol} where the size is the symbol's
    free_steps: set = field(default_factory=set)  # id() of the steps written shape-free
    ties: list = field(default_factory=list)      # (layer name, type, symbols, why)
    tied: set = field(default_factory=set)

    def tie(self, symbols, name: str, kind: str, why: str) -> None:
        """Fix `symbols` at the exported size, said as `name` (`kind`) fixing them (nothing where all are fixed)."""
        symbols = [s for s in self.symbols if s in set(symbols) - self.tied]
        if symbols:
            self.ties.append((name, kind, symbols, why))
            self.tied |= set(symbols)

    def live(self, blob) -> dict:
        """{axis: symbols} of the blob's axes still free (the tied symbols taken out)."""
        found = {}
        for axis, symbols in self.axes.get(blob, {}).items():
            left = symbols - self.tied
            if left:
                found[axis] = left
        return found

    def dims(self, blob, shape, name: str) -> list:
        """The blob's shape as the graph declares it: a symbol's name, "<name>_<axis>", or the exported size."""
        live, exact = self.live(blob), self.exact.get(blob, {})
        dims = []
        for axis, size in enumerate(shape):
            if axis not in live:
                dims.append(int(size))
            elif exact.get(axis) in live[axis]:
                dims.append(exact[axis])
            else:
                dims.append(f"{name}_{axis}")
        return dims

    def input_dims(self, name, shape) -> list:
        """An input's shape as the graph declares it: its symbols not tied, its exported sizes."""
        symbols = self.inputs.get(name, {})
        return [symbols[a] if a in symbols and symbols[a] not in self.tied else int(d) for a, d in enumerate(shape)]

    def free_record(self, blob) -> dict:
        """{axis: sorted symbol names} of the blob's free axes, as JSON writes them."""
        return {str(axis): sorted(symbols) for axis, symbols in sorted(self.live(blob).items())}

    def lines(self, path) -> list:
        """One stderr line per layer that fixed axes."""
        said = []
        for name, kind, symbols, why in self.ties:
            fixed = ", ".join(f"{s} ({self._axis(s)}) = {self.symbols[s][2]}" for s in symbols)
            who = f"layer {name!r} ({kind})" if kind else name
            said.append(f"{path}: --dynamic: {who} fixes {fixed} at the exported size: {why}; the other axes stay "
                        "free")
        return said

    def _axis(self, symbol: str) -> str:
        name, axis, _ = self.symbols[symbol]
        what = _AXIS_NAMES.get(axis, f"axis {axis}")
        return what if len(self.inputs) == 1 else f"{what} of {name!r}"


def plan_dynamic(program, opset: int, pixels: dict | None = None) -> DynamicPlan:
    """The DynamicPlan of `program` exported at `opset`, its inputs' `pixels` preprocessing: see the module."""
    symbols: dict = {}
    inputs: dict = {}
    for name, shape in program.inputs.items():
        axes = (0, 2, 3) if len(shape) == 4 else (0,) if len(shape) else ()
        inputs[name] = {}
        for axis in axes:
            letter = {0: "N", 2: "H", 3: "W"}[axis]
            symbol = letter if len(program.inputs) == 1 else f"{name}_{letter}"
            symbols[symbol] = (name, axis, int(shape[axis]))
            inputs[name][axis] = symbol
    plan = DynamicPlan(symbols, inputs)
    for name, axes in inputs.items():
        plan.axes[name] = {axis: frozenset([s]) for axis, s in axes.items()}
        plan.exact[name] = dict(axes)
    for name, steps in (pixels or {}).items():
        # a mean image (not a value per channel) holds the exported plane
        if steps.mean is not None and np.ndim(steps.mean) >= 2 and np.shape(steps.mean)[-2:] != (1, 1):
            plane = [plan.inputs[name].get(2), plan.inputs[name].get(3)]
            plan.tie(plane, f"the preprocessing of input {name!r}", "", "its mean is an image of that size")
    for step in program.steps:
        _carry(plan, step, opset)
    return plan


def _carry(plan: DynamicPlan, step, opset: int) -> None:
    """Pass the free axes through one step, or tie them (the step then written as without --dynamic)."""
    bottoms = [plan.live(b) for b in step.bottoms]
    if not any(bottoms):
        for top in step.tops:
            plan.axes[top], plan.exact[top] = {}, {}
        return
    tops, why = _rule(plan, step, bottoms, opset)
    if why is not None:
        # `why` names the symbols to tie with it: (symbols, reason)
        symbols, reason = why
        plan.tie(symbols, step.layer.name, step.layer.type, reason)
        if tops is None:
            for top in step.tops:
                plan.axes[top], plan.exact[top] = {}, {}
            return
    plan.free_steps.add(id(step))
    for top, (axes, exact) in zip(step.tops, tops):
        plan.axes[top], plan.exact[top] = axes, exact


def _all_symbols(bottoms: list) -> frozenset:
    found: frozenset = frozenset()
    for axes in bottoms:
        for symbols in axes.values():
            found |= symbols
    return found


def _same(plan, step, k: int = 0) -> tuple:
    return dict(plan.live(step.bottoms[k])), dict(plan.exact.get(step.bottoms[k], {}))


def _derived(axes: dict, keep_exact: dict, derived_axes) -> tuple:
    """(axes, exact) where `derived_axes` are computed from their symbols (no longer equal to one)."""
    return dict(axes), {a: s for a, s in keep_exact.items() if a in axes and a not in derived_axes}


def _rule(plan, step, bottoms: list, opset: int) -> tuple:
    """(each top's (axes, exact), or None; None, or (symbols to tie, why)) for one step with free bottom axes."""
    layer, kind = step.layer, step.layer.type
    everything = _all_symbols(bottoms)
    constants = (everything, "blobtool writes its shapes as constants")
    if kind in ("Scale", "Bias") and len(step.bottoms) == 1:
        layer.reshape([tuple(s) for s in step.bottom_shapes])
        start, length = layer.span
        laid = _all_symbols([{a: s for a, s in bottoms[0].items() if start <= a < start + length}])
        if laid:
            why = f"its blob is laid along axes {start} to {start + length - 1}, a free one among them"
            return None, (everything, why)
    if kind in _PASS or (kind in ("Scale", "Bias") and len(step.bottoms) == 1):
        axes = {}
        for b in bottoms:
            for axis, symbols in b.items():
                axes[axis] = axes.get(axis, frozenset()) | symbols
        exact = plan.exact.get(step.bottoms[0], {})
        return [(dict(axes), dict(exact)) for _ in step.tops], None
    if kind in _CONV:
        axes, exact = _same(plan, step)
        return [_derived(axes, exact, (2, 3))], None
    if kind == "Pooling":
        return _pooling(plan, step, bottoms[0], opset)
    if kind in ("Concat", "Slice"):
        return _joined(plan, step, bottoms, everything)
    if kind == "InnerProduct":
        ndim = len(step.bottom_shapes[0])
        axis = layer.axis(layer.param.inner_product_param.axis, ndim)
        over = _all_symbols([{a: s for a, s in bottoms[0].items() if a >= axis}])
        kept = {a: s for a, s in bottoms[0].items() if a < axis}
        exact = {a: s for a, s in plan.exact.get(step.bottoms[0], {}).items() if a in kept}
        values = int(layer.blobs[0].size) // layer.num_output
        why = (over, f"its weight takes the {values} values of axes {axis} on of each row") if over else None
        return [(kept, exact)], why
    if kind == "Crop" and len(step.bottoms) == 2:
        return _cropped(plan, step, bottoms), None
    if kind in ("Flatten", "Reshape"):
        return _reshaped(plan, step, bottoms[0], constants)
    if kind == "Upsample" and len(step.bottoms) == 1:
        axes, exact = _same(plan, step)
        return [_derived(axes, exact, (2, 3))], None
    if kind == "Interp" and len(step.bottoms) == 1 and layer.spec == "zoom_factor" and not (
            layer.pad_beg or layer.pad_end) and layer.kind == "bilinear":
        axes, exact = _same(plan, step)
        return [_derived(axes, exact, (2, 3))], None
    return None, constants


def _joined(plan, step, bottoms: list, everything: frozenset) -> tuple:
    """Concat and Slice: free where their axis is not (its sizes are constants), else a tie."""
    step.layer.reshape([tuple(s) for s in step.bottom_shapes])
    at = int(step.layer.at)
    if _all_symbols([{at: b[at]} for b in bottoms if at in b]):
        return None, (everything, f"it joins or splits the free axis {at}, whose sizes it writes as constants")
    axes = {}
    for b in bottoms:
        for axis, symbols in b.items():
            axes[axis] = axes.get(axis, frozenset()) | symbols
    return [(dict(axes), dict(plan.exact.get(step.bottoms[0], {}))) for _ in step.tops], None


def _cropped(plan, step, bottoms: list) -> list:
    """Crop: the axes before its axis are the data's, the others the reference blob's (its ends come from Shape)."""
    ndim = len(step.bottom_shapes[0])
    start = step.layer.axis(step.layer.start_param, ndim, "crop axis")
    axes = {a: s for a, s in bottoms[0].items() if a < start}
    axes.update({a: s for a, s in bottoms[1].items() if start <= a < ndim})
    exact = {a: s for a, s in plan.exact.get(step.bottoms[0], {}).items() if a < start}
    exact.update({a: s for a, s in plan.exact.get(step.bottoms[1], {}).items() if start <= a < ndim})
    return [(axes, {a: s for a, s in exact.items() if a in axes})]


def _pooling(plan, step, bottom: dict, opset: int) -> tuple:
    """Pooling's free axes: global pooling ends them; a window pooling keeps those where ceil_mode is Caffe's size.

    Caffe's size with ROUND_MODE CEIL is ceil((i + 2p - k) / s) + 1, less
    one where that last window would start at or past i + p (only with a
    pad). onnxruntime, and ONNX from opset 22, drop that window too; the
    ONNX rule before 22 keeps it, so there the size is Caffe's at every
    input size only where the window can never start there: k - p >= s
    (the last start is below a + s, a = i + 2p - k, so below i + p).
    Without a pad Caffe drops nothing: a window starting past the input
    (possible only where k < s) is one ONNX does not compute. FLOOR
    rounding is ONNX's floor at every size.
    """
    layer = step.layer
    axes, exact = _same(plan, step)
    if layer.global_pooling and len(step.tops) == 1:
        kept = {a: s for a, s in axes.items() if a < 2}
        return [(kept, {a: s for a, s in exact.items() if a in kept})], None
    if len(step.tops) > 1 or layer.global_pooling:
        # The mask's index is taken modulo the plane's size, a constant; the batch stays free.
        spatial = _all_symbols([{a: s for a, s in bottom.items() if a >= 2}])
        kept = {a: s for a, s in axes.items() if a < 2}
        return ([(kept, {a: s for a, s in exact.items() if a in kept}) for _ in step.tops],
                (spatial, "its mask top's indices are counted in the exported plane's size") if spatial else None)
    tie: frozenset = frozenset()
    reasons = []
    for axis, k, s, p in zip((2, 3), layer.kernel, layer.stride, layer.pad):
        if axis not in bottom or not layer.ceil:
            continue
        if p == 0 and k < s:
            tie |= bottom[axis]
            reasons.append(f"without a pad and a kernel {k} below its stride {s} along axis {axis}, Caffe's last "
                           "window can start past the input, which ONNX does not compute")
        elif p > 0 and k - p < s and opset < 22:
            tie |= bottom[axis]
            reasons.append(f"with kernel {k}, stride {s} and pad {p} along axis {axis}, Caffe's ceil rounding drops "
                           "a last window that starts in the pad, which ONNX's ceil_mode keeps before opset 22 "
                           "(--opset 22 keeps the axis free)")
    if tie:
        # The exported size is written as a Slice of both spatial axes where ONNX's rule keeps one more window.
        kept = {a: s for a, s in axes.items() if a < 2}
        spatial = _all_symbols([{a: s for a, s in bottom.items() if a >= 2}])
        return [(kept, {a: s for a, s in exact.items() if a in kept})], (spatial, "; ".join(reasons))
    return [_derived(axes, exact, (2, 3))], None


def _reshaped(plan, step, bottom: dict, constants: tuple) -> tuple:
    """Flatten to the last axis, and Reshape from axis 0, written with 0 and -1; other forms tie."""
    layer = step.layer
    ndim = len(step.bottom_shapes[0])
    exact = plan.exact.get(step.bottoms[0], {})
    if layer.type == "Flatten":
        start, end = layer.axis(layer.start, ndim, "axis"), layer.axis(layer.end, ndim, "end_axis")
        if end != ndim - 1:
            return None, constants
        axes = {a: s for a, s in bottom.items() if a < start}
        merged = _all_symbols([{a: s for a, s in bottom.items() if a >= start}])
        if merged:
            axes[start] = merged
        return [(axes, {a: s for a, s in exact.items() if a < start})], None
    if layer.start_param != 0 or layer.num_axes != -1:
        return None, constants
    axes, kept = {}, {}
    copied = set(layer.copy_axes)
    rest = _all_symbols([{a: s for a, s in bottom.items() if a not in copied}])
    if rest and layer.inferred is None:
        return None, (rest, "its new shape gives the free axes constant sizes")
    for i, d in enumerate(layer.dims):
        if d == 0 and i in bottom:
            axes[i] = bottom[i]
            if i in exact:
                kept[i] = exact[i]
        elif d == -1 and rest:
            axes[i] = rest
    return [(axes, kept)], None
