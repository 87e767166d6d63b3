"""Weights into a net: the values of one file written into the blobs of another (blobtool transplant).

The template (a .caffemodel, V1 or V2 layers, or Caffe's HDF5 snapshot of a
net) gives the structure: each blob's name, shape and stored type, and for a
protobuf net every other byte of the file (a .prototxt, which holds no blobs,
is made into such a template first: surgery/blueprint.py). The values come from any file
blobtool reads (or a {name: array} dict), matched by name:

- blobtool's names (``conv1/0``): a value takes the template blob of its name.
- PyTorch's names (``names="torch"``): the export of torchport/naming.py run
  backwards from the same rows (``torch_names(template).rows``), so that what
  ``convert --names torch`` wrote comes back where it came from. A row that
  is a view (a weight, a bias, a Scale folded into its BatchNorm's names, a
  PReLU slope) takes the value as it is, in the template blob's own shape
  (an InnerProduct weight (N, K) goes back into a legacy (1, 1, N, K)); a
  transposed InnerProduct (``transpose: true``) takes Linear's (N, K)
  transposed back to (K, N); a BatchNorm's ``running_mean`` and
  ``running_var`` are written as blobs 0 and 1 with the factor, blob 2,
  set to 1 (the statistics are the sums divided by the factor, so factor 1
  gives Caffe the same mean and variance); ``num_batches_tracked`` of a
  BatchNorm, which Caffe has no blob for, is ignored and said so.

A value fits a blob when its shape is the one the scheme gives, or equals it
by Caffe's legacy rule (shapes of at most 4 axes padded with leading 1s, as
Blob::ShapeEquals compares them). Matching is strict, as PyTorch's
load_state_dict: a template blob without a value (missing), a value no blob
takes (unexpected), or a value of another shape (mismatched) is a FitError
(exit 3) naming the three lists. With `partial` the blobs without a fitting
value keep the template's values (Caffe's CopyTrainedLayersFrom) and the
lists are said instead; a value of equal count but another shape is written
in the template's shape only with `reshape` (Caffe's net surgery example
turns fc6's (4096, 9216) into a (4096, 256, 6, 6) convolution). A fit that
would take no value at all is refused even with `partial`: it would write the
template unchanged.

Each blob written keeps the template's stored type, layout, encoding and
unknown fields (a float16 blob of NVIDIA Caffe stays float16), unless a
precision is asked for; values that the template's type turns into Inf are
counted and said, and a float16 blob whose values pass float16's range is
written in float32 instead, with a line saying so (as --half does); what
float16 does to the others (values rounded, made subnormal or 0) is counted
in one line naming --float, which keeps them as given; values float16 holds
exactly (a float16 net exported and written back) say nothing. Only the
data is written: the template's diffs belong to other values and are left out
(said when there were any).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..engine.blob import Blob, legacy_shapes_equal
from ..errors import FitError, UsageError, parameter
from ..formats.origin import held_dtype

__all__ = ["Fit", "fit", "SHOWN"]

# Names shown per list in a message; past this many, "and N more".
SHOWN = 32

# How the line on the template's float16 blobs names them, and what it offers instead.
_INTO_HALF = "transplant (the template's float16)"
_INTO_HALF_HINT = "; --precision float writes float32 (the values as given)"


@dataclass
class Fit:
    """What fit() made: the blobs to write into the template and what it says about them.

    `blobs` maps template blob names to the Blobs to write (template order);
    the template's other blobs are written as they are. `precision` gives the
    blobs that cannot keep their stored type ({name: "float"}: a float16
    blob holding values past float16's range). `missing`, `unexpected` and
    `mismatched` ((name, shape given, shape taken)) are the three lists;
    `kept` the template blobs written as they were; `notes` the lines to say.
    """

    blobs: dict
    precision: dict = field(default_factory=dict)
    missing: list = field(default_factory=list)
    unexpected: list = field(default_factory=list)
    mismatched: list = field(default_factory=list)
    kept: list = field(default_factory=list)
    notes: list = field(default_factory=list)


@dataclass
class _Slot:
    """One template blob and the value that fills it: its name and shape in the scheme, and how it was made."""

    entry: object              # the template's Entry
    name: str | None           # the value's name (None: a BatchNorm factor, written as 1)
    shape: tuple | None        # the shape the value comes in
    made: str = "view"         # naming.Mapped.made: view, transposed, statistic, factor
    layer: str | None = None
    exported: object = None    # torch: the template's own value under that name (a statistic, divided)


def fit(template, values: dict, *, names: str = "blobtool", partial: bool = False, reshape: bool = False,
        precision: str | None = None, source: str = "the values", fold: bool = True, net=None) -> Fit:
    """Fit `values` ({name: Blob, Entry or array}) into the blobs of `template` (an open net Document).

    Parameters
    ----------
    names : "blobtool" (``conv1/0``) or "torch" (PyTorch's names, inverted
        from torchport/naming.py's export rows).
    partial : keep the template's values where no value fits, instead of
        raising FitError.
    reshape : write a value of equal count but another shape in the
        template's shape.
    precision : the precision the output is written in (None: the template's
        stored types); decides the type values are held in.
    source : how messages name where the values came from.
    fold : names="torch": whether the values name a Scale after a BatchNorm
        by the BatchNorm (the export's default; False as --no-fold wrote them).
    net : names="torch": the net (a Document) whose layer types name the
        blobs of a template without types (an HDF5 snapshot), as transplant's --definition gives them.

    Raises FitError (exit 3) with the three lists, UsageError for a template
    that is not a net or a scheme it cannot be named by.
    """
    if template.kind != "net":
        raise UsageError(f"{template.path}: {parameter('into')} takes a net (.caffemodel, .caffemodel.h5, .prototxt) as the "
                         f"template; this is a {template.kind} file")
    notes: list = []
    slots = _slots(template, names, notes, fold, net)
    given, ignored = _given(values, slots, names)
    result = Fit({})
    written, used, reshaped = _matched(slots, given, reshape, precision, result, source)
    _factors_of_one(slots, written, precision, result, source)
    result.unexpected = [name for name in given if name not in used]
    result.blobs = {e.name: written[e.name] for e in template.entries if e.name in written}
    wrong = result.missing or result.unexpected or result.mismatched
    if wrong and (not partial or not written):
        raise _fit_error(template, source, result, partial, reshape, names)
    if precision is None:
        _template_float16(template, result, source)
    notes += _fit_notes(template, source, result, ignored, reshaped)
    if partial and wrong:
        notes += _partial_lines(template, source, result)
    result.notes = notes + result.notes
    return result


def _given(values: dict, slots: list, names: str) -> tuple:
    """({name: array} of the values to fit, [PyTorch's BatchNorm buffers that Caffe has no blob for, ignored])."""
    given = dict(values)
    ignored = []
    if names == "torch":
        from ..torchport.naming import TORCH_ONLY_BUFFERS

        batchnorms = {slot.layer for slot in slots if slot.made == "factor"}
        for key in list(given):
            module, _, buffer = key.rpartition(".")
            if buffer in TORCH_ONLY_BUFFERS and module in batchnorms:
                ignored.append(key)
                del given[key]
    # Read only now, and not the buffers ignored: a value may be an Entry not read yet.
    return {name: _array(value) for name, value in given.items()}, ignored


def _matched(slots: list, given: dict, reshape: bool, precision, result: Fit, source: str) -> tuple:
    """({template blob: Blob to write}, {value names used}, [lines on values reshaped]): each value into its slot.

    A slot without a value goes to `result.missing`, one whose value has
    another shape (and is not reshaped) to `result.mismatched`; both keep
    the template's value (`result.kept`). A BatchNorm's factor is left to
    _factors_of_one.
    """
    written: dict = {}
    used: set = set()
    reshaped = []
    for slot in slots:
        if slot.made == "factor":
            continue
        value = given.get(slot.name)
        if value is None:
            result.missing.append(slot.name)
            result.kept.append(slot)
            continue
        used.add(slot.name)
        if not _same_shape(value.shape, slot):
            if reshape and value.size == slot.entry.count:
                reshaped.append(f"{slot.name} {_fmt(value.shape)} -> {_fmt(slot.entry.shape)}")
            else:
                result.mismatched.append((slot.name, tuple(value.shape), slot.shape))
                result.kept.append(slot)
                continue
        written[slot.entry.name] = _written(slot, value, precision, result, source)
    return written, used, reshaped


def _factors_of_one(slots: list, written: dict, precision, result: Fit, source: str) -> None:
    """A BatchNorm given any of its statistics gets factor 1 (blob 2), and its statistic not given is written
    as the template's own, divided by the template's factor: Caffe then computes the same mean and variance."""
    fed = {slot.layer for slot in slots if slot.made == "statistic" and slot.entry.name in written}
    for slot in slots:
        if slot.made == "factor" and slot.layer in fed:
            written[slot.entry.name] = _written(slot, np.ones(1), precision, result, source)
    for slot in list(result.kept):
        if slot.made == "statistic" and slot.layer in fed:
            written[slot.entry.name] = _written(slot, slot.exported.blob().cpu_data(), precision, result, source)


def _fit_notes(template, source: str, result: Fit, ignored: list, reshaped: list) -> list:
    """The lines a fit says: PyTorch's buffers ignored, values reshaped, the template's diffs left out."""
    notes = []
    if ignored:
        notes.append(f"{source}: ignored {len(ignored)} num_batches_tracked buffer{'s' * (len(ignored) != 1)} "
                     f"(Caffe's BatchNorm has no blob for them): {_some(ignored)}")
    if reshaped:
        notes.append(f"{source}: --reshape wrote {len(reshaped)} value{'s' * (len(reshaped) != 1)} in the "
                     f"template's shape: {_some(reshaped)}")
    stored = {e.name: e for e in template.entries}
    diffs = [name for name in result.blobs if stored[name].has_diff]
    if diffs:
        notes.append(f"{template.path}: {len(diffs)} blob{'s' * (len(diffs) != 1)} written without the template's "
                     f"diff (it belongs to the values replaced): {_some(diffs)}")
    return notes


def _slots(template, names: str, notes: list, fold: bool, net=None) -> list:
    """The template's blobs in file order, each with the name and shape its value comes in."""
    if names == "blobtool":
        return [_Slot(e, e.name, tuple(e.shape), layer=e.layer) for e in template.entries]
    if names != "torch":
        raise UsageError(f"unknown naming scheme {names!r}; expected blobtool or torch")
    from ..torchport.naming import torch_names

    named = torch_names(template, fold=fold, net=net)
    notes += named.warnings
    exported = {e.name: e for e in named.document.entries}
    return [_Slot(row.entry, row.name, tuple(row.shape) if row.shape is not None else None, row.made,
                  row.entry.layer, exported.get(row.name)) for row in named.rows]


def _array(value) -> np.ndarray:
    """A value as an array of its own shape: a Blob's data, an Entry's (read now), or anything numpy takes."""
    if hasattr(value, "blob") and hasattr(value, "record"):   # a formats.Entry
        value = value.blob()
    if isinstance(value, Blob):
        return value.cpu_data().reshape(value.shape)
    return np.asarray(value)


def _same_shape(shape, slot: _Slot) -> bool:
    shape = tuple(shape)
    return (shape == slot.shape or legacy_shapes_equal(shape, slot.shape)
            or legacy_shapes_equal(shape, slot.entry.shape))


def _written(slot: _Slot, value: np.ndarray, precision, result: Fit, source: str) -> Blob:
    """The Blob to write into `slot`'s template blob: `value` in its shape and stored type, the data only."""
    entry = slot.entry
    origin = entry.blob_to_write().origin
    stored = origin.dtype if origin is not None else entry.dtype
    if precision == "double":
        dtype = np.dtype(np.float64)
    elif precision in ("float", "half"):
        dtype = np.dtype(np.float32)
    else:
        dtype = held_dtype(stored)
    values = np.asarray(value)
    if slot.made == "transposed":
        # Linear's (N, K) back to the (K, N) that inner_product_param.transpose stores.
        values = values.reshape(slot.shape).T
    values = np.ascontiguousarray(values).reshape(-1)
    if values.dtype != dtype:
        with np.errstate(over="ignore", invalid="ignore"):
            cast = values.astype(dtype)
        made = int(np.count_nonzero(np.isfinite(values) & ~np.isfinite(cast)))
        if made:
            result.notes.append(f"{source}: {slot.name}: {made} of {values.size} values became Inf written as "
                                f"{dtype.name} (past its range) into {entry.name}")
        values = cast
    blob = Blob(entry.shape, dtype=dtype)
    blob.set_cpu_data(values)
    if origin is not None:
        blob.origin = dataclasses.replace(origin, has_diff=False, diff_dtype=None)
    return blob


def _template_float16(template, result: Fit, source: str) -> None:
    """The blobs the template stores in float16, as --half writes float16 (engine/float16.py), and what it did said.

    A blob with values past float16's range is written in float32 instead,
    a line each; for the others one line counts the values that float16
    rounded (and those made subnormal or 0), naming --float, which keeps
    them as given. Values that float16 holds exactly (a float16 net
    exported and written back) say nothing.
    """
    from ..engine.float16 import Float16Fit, float16_fit, lossy_line, overflow_reason
    from ..engine.kernels import map_chunks

    lossy = Float16Fit("", 0)
    changed = total = 0
    for entry in template.entries:
        blob = result.blobs.get(entry.name)
        if blob is None or not blob.count:
            continue
        stored = blob.origin.dtype if blob.origin is not None else entry.dtype
        if np.dtype(stored) != np.float16:
            continue
        values = blob.cpu_data()
        moved = sum(map_chunks(_moved_by_float16, values))
        if not moved:
            continue   # float16 holds every value as it is: nothing to lose (as --half skips a float16 array)
        fit16 = float16_fit(entry.name, [values])
        if not fit16.fits:
            result.precision[entry.name] = fit16.fallback
            result.notes.append(f"{source}: {overflow_reason(fit16)}: written in float32, not the template's "
                                "float16")
            continue
        lossy.count += 1
        lossy.subnormal += fit16.subnormal
        lossy.zero += fit16.zero
        changed += moved
        total += values.size
    if changed:
        result.notes.append(lossy_line(f"{source}: ", _INTO_HALF, lossy, rounded=(changed, total),
                                       hint=_INTO_HALF_HINT))


def _moved_by_float16(part: np.ndarray) -> int:
    """How many of `part`'s values float16 changes (rounded, or past its range); a NaN stays NaN."""
    with np.errstate(over="ignore", invalid="ignore"):
        half = part.astype(np.float16)
    return int(np.count_nonzero(half != part)) - int(np.count_nonzero(np.isnan(part)))


# The names PyTorch gives a module's tensors, which tell a state dict's names from Caffe's (conv1/0).
_TORCH_ENDINGS = (".weight", ".bias", ".running_mean", ".running_var", ".num_batches_tracked")


def _torch_named(names) -> bool:
    """Whether most of `names` are PyTorch's (conv1.weight, bn1.running_var) rather than a Caffe net's."""
    names = list(names)
    return bool(names) and 2 * sum(n.endswith(_TORCH_ENDINGS) for n in names) > len(names)


def _fit_error(template, source: str, result: Fit, partial: bool, reshape: bool, names: str) -> FitError:
    # Values named as PyTorch names them, matched as Caffe's names, fit nothing: the one thing to do is said,
    # and a few names of each list show why.
    torch_named = names == "blobtool" and _torch_named(result.unexpected)
    parts = _lists(result, 3 if torch_named else SHOWN)
    if torch_named:
        hint = (f"the values are named as PyTorch names them: {parameter('names', given='torch')} matches them by "
                "PyTorch's names")
    elif partial:
        hint = ("no value fits any blob, so nothing would change (are the names blobtool's or PyTorch's? "
                f"{parameter('names')} chooses)")
    elif template.format == "prototxt":
        hint = "a .prototxt holds no values to keep: every blob needs one"
    else:
        hint = f"{parameter('partial')} keeps the template's values for the blobs without one"
        if any(_count(shape) == _count(taken) for _, shape, taken in result.mismatched) and not reshape:
            hint += f"; {parameter('reshape')} writes a value of equal count in the template's shape"
    return FitError(f"does not fit {template.path}: {'; '.join(parts)}; {hint}", path=source,
                    missing=result.missing, unexpected=result.unexpected, mismatched=result.mismatched)


def _lists(result: Fit, most: int = SHOWN) -> list:
    parts = []
    if result.missing:
        parts.append(f"missing {len(result.missing)} ({_some(result.missing, most)})")
    if result.unexpected:
        parts.append(f"unexpected {len(result.unexpected)} ({_some(result.unexpected, most)})")
    if result.mismatched:
        shown = [f"{name} {_fmt(shape)}, the template takes {_fmt(taken)}" for name, shape, taken in
                 result.mismatched]
        parts.append(f"mismatched {len(result.mismatched)} ({_some(shown, most)})")
    return parts


def _partial_lines(template, source: str, result: Fit) -> list:
    lines = []
    kept = [slot.entry.name for slot in result.kept if slot.entry.name not in result.blobs]
    if kept:
        why = [p for p in _lists(Fit({}, missing=result.missing, mismatched=result.mismatched)) if p]
        lines.append(f"{template.path}: --partial kept the template's values of {len(kept)} "
                     f"blob{'s' * (len(kept) != 1)}: {_some(kept)} ({'; '.join(why)})")
    if result.unexpected:
        lines.append(f"{source}: --partial left {len(result.unexpected)} value{'s' * (len(result.unexpected) != 1)} "
                     f"unused: {_some(result.unexpected)}")
    return lines


def _count(shape) -> int:
    return int(np.prod(shape)) if shape is not None else 0


def _some(names: list, most: int = SHOWN) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _fmt(shape) -> str:
    shape = tuple(shape) if shape is not None else ()
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
