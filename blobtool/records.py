"""What info, norm and compare find, as plain data (JSON-ready dicts): the figures the commands report.

The renderer (blobtool.report) draws these; scripts get them as JSON
Lines. Nothing here prints or formats text.
"""

from __future__ import annotations

import math

from .engine import kernels
from .formats.caffe.blobproto import PAYLOAD_BY_NAME
from .errors import UsageError, parameter
from .formats import Document, Entry
from .net.layertypes import fork_of
from .net.model import model

__all__ = ["json_float", "info_record", "norm_record", "norm_values", "compare_record", "CHECKS",
           "check_finite", "value_count_mismatch"]


def json_float(x):
    """A float as JSON can hold it: non-finite values become "nan", "inf", "-inf"."""
    if x is None:
        return None
    x = float(x)
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _stats(values) -> dict:
    found = kernels.stats(values)
    out = {k: (json_float(v) if k not in ("nan", "inf") else v) for k, v in found.items()}
    hist = kernels.histogram(values, lo=found["min"], hi=found["max"], spans=True,
                             finite=not (found["nan"] or found["inf"]))
    out["histogram"] = {"edges": [json_float(e) for e in hist["edges"]], "counts": hist["counts"],
                        "zeros": hist["zeros"]}
    return out


def entry_info(entry: Entry, *, stats: bool = False) -> dict:
    """One blob's line in info: name, shape, count, dtype, layout, has_diff, bytes (and stats)."""
    out = {
        "name": entry.name,
        "shape": list(entry.shape),
        "count": entry.count,
        "dtype": entry.dtype.name,
        "layout": entry.layout,
        "has_diff": entry.has_diff,
        "bytes": entry.nbytes,
    }
    if entry.diff_dtype is not None:  # only where the diff is stored in another type than the data
        out["diff_dtype"] = entry.diff_dtype.name
    if entry.layer is not None:
        out["layer"] = entry.layer
        out["type"] = entry.type
    kept = getattr(entry.record, "kept_fork_fields", ())
    if kept:
        out["kept_fork_fields"] = [{"field": number, "why": why} for number, why in kept]
    if stats:
        blob = entry.blob()
        out["stats"] = {"data": _stats(blob.cpu_data()),
                        "diff": _stats(blob.cpu_diff()) if entry.has_diff else None}
    return out


def info_record(doc: Document, entries, *, stats: bool = False, check: str | None = None,
                all_layers: bool = False, layer_defs: bool = False, input_shapes: dict | None = None) -> dict:
    """info's JSON object for one file; with `check` ("finite"), its result under "check".

    A net's record counts its layers ("layers", "layers_without_blobs"), and
    with `all_layers` lists them all ("all_layers": name, type, blobs). With
    `layer_defs`, "layer_defs" holds each layer's definition in file order,
    as protobuf's MessageToDict writes its LayerParameter without blobs (V1
    layers as Caffe upgrades them; see formats/caffe/netdef.py), and
    "format" the format the net was read from; Caffe's HDF5 snapshot holds
    blobs only, so there each layer's definition is its name. Blobs whose
    shape disagrees with the values stored go under "invalid". With
    `input_shapes` ({input: shape}), "top_shapes" holds the shape of each top
    of each layer the deploy net runs, by layer name, as Caffe's Reshape
    gives them (forward/runner.py), and "free_axes", by layer name, for
    each top the axes `export --dynamic` keeps symbolic ({axis: the input
    symbols its size is computed from}; onnxport/dynamic.py).
    """
    if layer_defs and doc.kind != "net":
        raise UsageError(f"{parameter('layer_defs')} lists a net's layers and this file is a {doc.kind}", path=doc.path)
    out = {"path": doc.path, "kind": doc.kind, "bytes": doc.size}
    out.update(doc.meta)
    invalid = [found for found in map(value_count_mismatch, entries) if found is not None]
    out["blobs"] = [entry_info(e, stats=stats) for e in entries]
    if doc.kind == "safetensors":
        _torch_export(out, doc.meta.get("metadata"))
    if doc.kind == "net" and doc.layers:
        net = model(doc)
        out["layers"] = len(net.layers)
        out["layers_without_blobs"] = sum(1 for layer in net.layers if not layer.blobs)
        if layer_defs:
            out["format"] = doc.format
            out["layer_defs"] = _layer_defs(net)
            unknown = _unknown_fields(net)
            if unknown:
                out["unknown_fields"] = unknown
            forks = {d["name"]: fork_of(d.get("type"), len(d.get("bottom", ()))) for d in out["layer_defs"]
                     if "name" in d and fork_of(d.get("type"), len(d.get("bottom", ())))}
            if forks:
                out["forks"] = forks
        if input_shapes:
            out["top_shapes"], out["free_axes"] = top_shapes(doc, input_shapes, free=True)
        if all_layers or layer_defs:
            out["all_layers"] = [{"name": layer.name, "type": layer.stored.type, "blobs": len(layer.blobs)}
                                 for layer in net.layers]
    if invalid:
        out["invalid"] = invalid
    if check == "finite":
        out["check"] = check_finite(entries)
    return out


def top_shapes(doc: Document, input_shapes: dict, free: bool = False):
    """{layer name: [shape of each top]} of the layers net `doc`'s deploy net runs (inputs by their name too).

    With `free`, (that, {layer name: [each top's free axes]}): the axes an
    export --dynamic at the default opset keeps symbolic.
    """
    from .forward.run import prepare_net

    # Shapes need no copy of a weight: the layers view them in the mapped file, or hold zeros.
    _, program, _ = prepare_net(doc, None, input_shapes, shapes_only=True)
    found = {name: [list(shape)] for name, shape in program.inputs.items()}
    for step in program.steps:
        found[step.layer.name] = [list(shape) for shape in step.top_shapes]
    if not free:
        return found
    from .onnxport.dynamic import plan_dynamic
    from .onnxport.graph import OPSET_DEFAULT

    plan = plan_dynamic(program, OPSET_DEFAULT)
    axes = {name: [plan.free_record(name)] for name in program.inputs}
    for step in program.steps:
        # A blob written again later (in place) is read by its last version, as export names it.
        axes[step.layer.name] = [plan.free_record(top) for top in step.tops]
    return found, axes


def _torch_export(out: dict, meta) -> None:
    """A --names torch export's info: per tensor where it came from ("from"), and "settings" (and "modules")."""
    from .torchport.metadata import read_export

    export = read_export(meta)
    if export is None:
        return
    for b in out["blobs"]:
        came = export["tensors"].get(b["name"])
        if came is not None:
            b["from"] = came
    out["settings"] = export["settings"]
    if export["modules"]:
        out["modules"] = export["modules"]


def _layer_defs(net) -> list:
    """Each layer's definition as MessageToDict writes it; a layer of a format without definitions (HDF5): its name."""
    from google.protobuf import json_format  # protobuf loads only where definitions are asked for

    return [{"name": layer.name} if message is None
            else json_format.MessageToDict(message, preserving_proto_field_name=True)
            for layer, message in zip(net.layers, net.layer_defs())]


def _unknown_fields(net) -> dict:
    """{layer name: [the fields of it blobtool's schema does not understand]} of the layers holding any (`lost`)."""
    if net.doc.format == "hdf5":
        return {}
    from .formats.caffe.netdef import definition

    return {layer.name: list(found.lost) for layer, found in zip(net.layers, definition(net.doc).layers) if found.lost}


def value_count_mismatch(entry: Entry) -> dict | None:
    """Where a BlobProto's shape and its stored values disagree (read from the lengths, no value read).

    {"name", "shape", "count", "which": "data" or "diff", "field", "values"}, or None
    when every payload holds the shape's count (or the blob is no BlobProto).
    Caffe's FromProto refuses such a blob, and so does every command that
    reads its values; info, which reads none, reports it from this.
    """
    record = entry.record
    if record is None or not hasattr(record, "payloads"):
        return None
    count = entry.count
    for which, payload in (("data", record.data_payload), ("diff", record.diff_payload)):
        if payload is None or (which == "data" and not payload.count and record.suspicious):
            continue
        if payload.count != count:
            return {"name": entry.name, "shape": list(entry.shape), "count": count, "which": which,
                    "field": PAYLOAD_BY_NAME[payload.name].label, "values": payload.count}
    return None



# What `info --check` can check.
CHECKS = ("finite",)


def check_finite(entries) -> dict:
    """info's --check finite: whether the blobs' data and diff hold no NaN or Inf.

    Returns {"name": "finite", "passed": bool, "failures": [...]}, a failure
    being {"name": blob, "which": "data" or "diff", "nan": count, "inf": count}.
    """
    failures = []
    for entry in entries:
        blob = entry.blob()
        for which in ("data", "diff") if entry.has_diff else ("data",):
            nan, inf = kernels.nonfinite(blob.cpu_data() if which == "data" else blob.cpu_diff())
            if nan or inf:
                failures.append({"name": entry.name, "which": which, "nan": nan, "inf": inf})
    return {"name": "finite", "passed": not failures, "failures": failures}





def norm_values(asum: float, sumsq: float) -> dict:
    return {"asum": json_float(asum), "sumsq": json_float(sumsq), "l2": json_float(math.sqrt(sumsq))}


def norm_record(doc: Document, entries, blobs, device=None) -> dict:
    """norm's JSON object for one file; `blobs` are the entries' Blobs, placed where the work runs."""
    rows = []
    total_data = [0.0, 0.0]
    total_diff = [0.0, 0.0]
    any_diff = False
    for entry, blob in zip(entries, blobs):
        a, s = blob.asum_sumsq_data()
        total_data[0] += a
        total_data[1] += s
        row = {"name": entry.name, "data": norm_values(a, s), "diff": None}
        if entry.has_diff:
            da, ds = blob.asum_sumsq_diff()
            total_diff[0] += da
            total_diff[1] += ds
            any_diff = True
            row["diff"] = norm_values(da, ds)
        if entry.layer is not None:
            row["layer"] = entry.layer
        rows.append(row)
    out = {"path": doc.path, "kind": doc.kind}
    if device is not None:
        out["device"] = device
    out["blobs"] = rows
    out["total"] = {"data": norm_values(*total_data), "diff": norm_values(*total_diff) if any_diff else None}
    return out


def _value_diff(v) -> dict:
    return {"equal": v.equal, "max_abs": json_float(v.max_abs), "max_rel": json_float(v.max_rel),
            "mismatches": v.mismatches, "rel_l2": json_float(v.rel_l2), "nonfinite": v.nonfinite}


def compare_record(result, device=None) -> dict:
    """compare's JSON object."""
    blobs = []
    for c in result.blobs:
        row = {
            "name": c.name,
            "equal": c.equal,
            "shape_a": list(c.shape_a) if c.shape_a is not None else None,
            "shape_b": list(c.shape_b) if c.shape_b is not None else None,
            "max_abs": json_float(c.data.max_abs) if c.data else None,
            "max_rel": json_float(c.data.max_rel) if c.data else None,
            "rel_l2": json_float(c.data.rel_l2) if c.data else None,
            "mismatches": c.data.mismatches if c.data else None,
            "nonfinite": c.data.nonfinite if c.data else None,
            "first_mismatch": list(c.first_mismatch_index(c.shape_a)) if c.data and c.data.first_mismatch is not None
            else None,
            "diff": _value_diff(c.diff) if c.diff else None,
        }
        if c.only_in:
            row["only_in"] = c.only_in
        if c.diff_only_in:
            row["diff_only_in"] = c.diff_only_in
        if c.layer is not None:
            row["layer"] = c.layer
        if c.compared is not None:
            row["compared"] = c.compared
        blobs.append(row)
    out = {"a": result.a, "b": result.b, "equal": result.equal, "rtol": result.rtol, "atol": result.atol}
    if device is not None:
        out["device"] = device
    out["blobs"] = blobs
    return out
