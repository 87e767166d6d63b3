"""info's layer tables: every layer (name, type, blobs), and with --layers its wiring, parameters in short, blob shapes.

With --input-shape, a last column gives the shape of each top of each layer
the deploy net runs ("-" for a layer it leaves out), from "top_shapes", and
one before it the axes of each top `export --dynamic` keeps free ("0:N 2:H
3:W", "fixed"), from "free_axes".

The rows come from the record (records.py): "all_layers" for each layer's
name as its blobs name it, type and blob count, and with --layers
"layer_defs", each layer's definition as protobuf's MessageToDict writes it
(caffe.proto's field names; enums by name, 64-bit integers as text, only
fields the file sets). The short form of a layer's parameters reads those
dictionaries: `k3 s2 p1 g32 out64 bias` for a convolution, `MAX k3 s2` for
pooling, `eps 1e-05 global` for BatchNorm; a layer type without a rule
below lists the scalar fields of its parameter messages. Fields blobtool's
schema does not understand ("unknown_fields": a fork's, by number where the
schema has no name for them) follow in parentheses. A fork's type that
blobtool runs is followed by its fork ("forks": "BN (caffe-segnet)").
"""

from __future__ import annotations

from .escape import escape

__all__ = ["layer_table", "summary", "HDF5_NOTE"]

ALL_LAYERS_COLUMNS = [("layer", "left"), ("type", "left"), ("blobs", "right")]
LAYER_DEFS_COLUMNS = [("layer", "left"), ("type", "left"), ("bottoms -> tops", "left"), ("parameters", "left"),
                      ("blobs", "left")]

# What info --layers says of a net whose format holds no definitions.
HDF5_NOTE = "  Caffe's HDF5 snapshot holds blobs only: no layer types, parameters or wiring"


def layer_table(record: dict) -> tuple[list, list]:
    """(columns, rows) of the layer table: --layers' when the record has definitions, else the plain list of layers."""
    layers = record.get("all_layers", ())
    if "layer_defs" not in record:
        return ALL_LAYERS_COLUMNS, [[escape(layer["name"]), escape(layer["type"] or "-"), f"{layer['blobs']:,}"]
                                    for layer in layers]
    shapes: dict = {}
    for blob in record["blobs"]:
        if "layer" in blob:
            shapes.setdefault(blob["layer"], []).append("x".join(str(d) for d in blob["shape"]) or "scalar")
    tops = record.get("top_shapes")
    free = record.get("free_axes")
    unknown = record.get("unknown_fields", {})
    forks = record.get("forks", {})
    rows = []
    for layer, d in zip(layers, record["layer_defs"]):
        wiring = ""
        if d.get("bottom") or d.get("top"):
            wiring = f"{', '.join(d.get('bottom', ())) or '-'} -> {', '.join(d.get('top', ())) or '-'}"
        said = summary(d)
        if layer["name"] in unknown:
            said = f"{said} (not understood: {', '.join(unknown[layer['name']])})".lstrip()
        kind = d.get("type", layer["type"] or "-")
        if layer["name"] in forks:
            kind = f"{kind} ({forks[layer['name']]})"
        row = [escape(layer["name"]), escape(kind), escape(wiring),
               escape(said), ", ".join(shapes.get(layer["name"], ()))]
        # The free axes come before the top shapes, which stay the last column.
        if free is not None:
            row.append(", ".join(_free(axes) for axes in free[layer["name"]]) if layer["name"] in free else "-")
        if tops is not None:
            shown = tops.get(layer["name"])
            row.append(", ".join(_dims(s) for s in shown) if shown is not None else "-")
        rows.append(row)
    if tops is not None:
        more = [("free axes (--dynamic)", "left")] if free is not None else []
        return LAYER_DEFS_COLUMNS + more + [("top shapes", "left")], rows
    return LAYER_DEFS_COLUMNS, rows


def _free(axes: dict) -> str:
    """One top's free axes as `export --dynamic` writes them: "0:N 2:H 3:W" (the symbols each is computed from)."""
    return " ".join(f"{axis}:{'+'.join(symbols)}" for axis, symbols in axes.items()) or "fixed"


def _num(value) -> str:
    """A float as a person writes it: 0.001, 1e-05, 0.5; integers as they are."""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _dims(values) -> str:
    return "x".join(str(v) for v in values)


def _spatial(p: dict, one: str, h: str, w: str) -> str | None:
    """A convolution's or pooling's kernel/stride/pad: "3", "3x5" (per axis) or None when unset."""
    if h in p or w in p:
        return f"{p.get(h, '?')}x{p.get(w, '?')}"
    value = p.get(one)
    if value is None:
        return None
    if isinstance(value, list):
        return _dims(value) if value else None
    return str(value)


def _convolution(p: dict) -> list:
    out = []
    for key, one, h, w in (("k", "kernel_size", "kernel_h", "kernel_w"), ("s", "stride", "stride_h", "stride_w"),
                           ("p", "pad", "pad_h", "pad_w")):
        value = _spatial(p, one, h, w)
        if value is not None:
            out.append(f"{key}{value}")
    if p.get("dilation"):
        out.append(f"d{_dims(p['dilation'])}")
    if "group" in p:
        out.append(f"g{p['group']}")
    if "num_output" in p:
        out.append(f"out{p['num_output']}")
    out.append("bias" if p.get("bias_term", True) else "no bias")
    if "axis" in p:
        out.append(f"axis {p['axis']}")
    return out


def _pooling(p: dict) -> list:
    out = [p.get("pool", "MAX")]
    if p.get("global_pooling"):
        out.append("global")
    for key, one, h, w in (("k", "kernel_size", "kernel_h", "kernel_w"), ("s", "stride", "stride_h", "stride_w"),
                           ("p", "pad", "pad_h", "pad_w")):
        value = _spatial(p, one, h, w)
        if value is not None:
            out.append(f"{key}{value}")
    if "round_mode" in p:
        out.append(p["round_mode"].lower())
    return out


def _inner_product(p: dict) -> list:
    out = [f"out{p['num_output']}"] if "num_output" in p else []
    out.append("bias" if p.get("bias_term", True) else "no bias")
    if "axis" in p:
        out.append(f"axis {p['axis']}")
    if p.get("transpose"):
        out.append("transpose")
    return out


def _batch_norm(p: dict) -> list:
    out = [f"eps {_num(p.get('eps', 1e-5))}"]
    if "use_global_stats" in p:
        out.append("global" if p["use_global_stats"] else "batch stats")
    if "moving_average_fraction" in p:
        out.append(f"maf {_num(p['moving_average_fraction'])}")
    return out


def _scale(p: dict) -> list:
    out = ["bias" if p.get("bias_term") else "no bias"]
    out += [f"{k.replace('_', ' ')} {p[k]}" for k in ("axis", "num_axes") if k in p]
    return out


def _input(p: dict) -> list:
    return [_dims(shape.get("dim", ())) for shape in p.get("shape", ())]


def _eltwise(p: dict) -> list:
    out = [p.get("operation", "SUM")]
    if p.get("coeff"):
        out.append("coeff " + ",".join(_num(c) for c in p["coeff"]))
    return out


# A parameter message (a layer type's, net/layertypes.py) -> its short form.
_SHORT = {
    "convolution_param": _convolution,
    "pooling_param": _pooling,
    "inner_product_param": _inner_product,
    "batch_norm_param": _batch_norm,
    "scale_param": _scale,
    "input_param": _input,
    "eltwise_param": _eltwise,
}


def _generic(d: dict) -> list:
    """The scalar fields of a layer's parameter messages, `name value` each (lists joined with commas)."""
    out = []
    for key, value in d.items():
        if not key.endswith("_param") or not isinstance(value, dict):
            continue
        for name, v in value.items():
            if isinstance(v, bool):
                out.append(name if v else f"no {name}")
            elif isinstance(v, (int, float, str)):
                out.append(f"{name} {_num(v)}")
            elif isinstance(v, list) and v and all(isinstance(x, (int, float, str)) for x in v):
                out.append(f"{name} {','.join(_num(x) for x in v)}")
    return out


def summary(d: dict) -> str:
    """A layer's parameters in short (see the module doc); "" when it sets none."""
    from ..net.layertypes import param_of

    param = param_of(d.get("type", ""))
    short = _SHORT.get(param)
    if short is not None:
        parts = short(d.get(param, {}))
        rest = {k: v for k, v in d.items() if k != param}
        parts += _generic(rest)
    else:
        parts = _generic(d)
    return " ".join(parts)
