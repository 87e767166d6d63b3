"""Caffe's LSTM and RNN as ONNX nodes: the unrolled net written step by step (decomposed), not ONNX's LSTM or RNN.

LSTMUnit (one step alone) is written as one step of LSTM's below.

ONNX's LSTM and RNN carry a state from step to step with no way to zero it
inside a sequence, which Caffe's `cont` input does at any step of any
stream (its values are known only when the model runs); and ONNX's LSTM
takes its gates in the order i, o, f, c, not Caffe's i, f, o, g. So each of
the T steps is written as blobtool/layers/recurrent.py computes it, with
the weights as Caffe stores them (no reordering), on 2-D values (N, .):

- x: Reshape to (T N, I), Gemm with W (transB) and the bias: every step's
  input term at once, then Split into T blocks of N rows; cont: Reshape to
  (T N, 1), Split the same way; a static input: Reshape to (N, S), Gemm
  with its weight, no bias.
- each step: Mul(h, cont_t), Gemm with W_hc (W_hh) and the step's input
  term as C (Caffe's sum, in its order), Add of the static term;
  LSTM: Split into i, f, o, g; Sigmoid, Sigmoid, Sigmoid, Tanh; f is
  Where(cont_t == 0, 0, cont_t f) as lstm_unit_layer.cpp has it;
  c = f c + i g; h = o Tanh(c). RNN: h = Tanh(sum).
- the top: Concat of the steps' h (RNN: Tanh(Gemm(h, W_ho) + b_o) over
  all steps at once, as each step's InnerProduct computes it), Reshape to
  (T, N, H); expose_hidden's tops: the last state, Reshape to (1, N, H).

The model's size grows with T (about 15 nodes a step): T is fixed by the
net's input shape, as in Caffe, whose unrolled net has that many layers.
"""

from __future__ import annotations

import numpy as np

from ..emit import exporter

# The most time steps written: each is about 15 nodes, and a definition of a few bytes states any T (CRNN nets
# take tens, speech nets thousands).
MAX_STEPS = 10_000


def _inputs(e, layer) -> tuple:
    """(the steps' input terms, the steps' cont, the static term or None, the initial states), as value names."""
    steps, streams = layer.steps, layer.streams
    if steps > MAX_STEPS:
        raise e.refuse(f"its {steps:,} time steps would be written as about {15 * steps:,} nodes, past the "
                       f"{MAX_STEPS:,} steps an export writes (each step is written out, as Caffe unrolls it)")
    shapes = [shape for _, shape in layer.roles()]
    roles = [name for name, _ in layer.roles()]
    rows = e.node("Reshape", [e.inputs[0], e.shape_constant("x_rows", [steps * streams, layer.inputs])],
                  [e.temp("x_rows")])[0]
    xw = e.node("Gemm", [rows, e.blob(0, shapes[0]), e.blob(1, shapes[1])], [e.temp("x_transform")], transB=1)[0]
    cont = e.node("Reshape", [e.inputs[1], e.shape_constant("cont_rows", [steps * streams, 1])],
                  [e.temp("cont_rows")])[0]
    if steps == 1:
        xs, conts = [xw], [cont]
    else:
        sizes = e.constant("step_rows", np.full(steps, streams, dtype=np.int64))
        xs = e.node("Split", [xw, sizes], [e.temp(f"x_transform_{t + 1}") for t in range(steps)], axis=0)
        conts = e.node("Split", [cont, sizes], [e.temp(f"cont_{t + 1}") for t in range(steps)], axis=0)
    static = None
    if layer.static:
        flat = e.node("Reshape", [e.inputs[2], e.shape_constant("static_rows", [streams, layer.static_inputs])],
                      [e.temp("static_rows")])[0]
        static = e.node("Gemm", [flat, e.blob(2, shapes[2])], [e.temp(roles[2] + "_x")], transB=1)[0]
    states = []
    for k, name in enumerate(layer.states):
        if layer.expose:
            source = e.inputs[2 + layer.static + k]
            states.append(e.node("Reshape", [source, e.shape_constant(f"{name}_0_rows", [streams, layer.hidden])],
                                 [e.temp(f"{name}_0")])[0])
        else:
            # Caffe's state at a net's first forward: zero
            states.append(e.constant(f"{name}_0", np.zeros((streams, layer.hidden), np.float32)))
    return xs, conts, static, states


def _pre_activation(e, h, cont, x_t, static, weight: str, t: int) -> str:
    """W (cont_t h) + x_t [+ static]: the Scale, the InnerProduct and the Eltwise SUM of the unrolled net."""
    conted = e.node("Mul", [h, cont], [e.temp(f"h_conted_{t - 1}")])[0]
    total = e.node("Gemm", [conted, weight, x_t], [e.temp(f"sum_{t}")], transB=1)[0]
    if static is not None:
        total = e.node("Add", [total, static], [e.temp(f"sum_static_{t}")])[0]
    return total


def _finish(e, layer, hs: list, last: list) -> None:
    """The top from the steps' h (T N, H) and expose_hidden's last states."""
    steps, streams, hidden = layer.steps, layer.streams, layer.hidden
    joined = hs[0] if steps == 1 else e.node("Concat", hs, [e.temp("h_steps")], axis=0)[0]
    if layer.type == "RNN":
        b_index = len(layer.blobs) - 1
        w_ho, b_o = e.blob(b_index - 1, (hidden, hidden)), e.blob(b_index, (hidden,))
        joined = e.node("Gemm", [joined, w_ho, b_o], [e.temp("W_ho_h")], transB=1)[0]
        joined = e.node("Tanh", [joined], [e.temp("o_steps")])[0]
    e.node("Reshape", [joined, e.shape_constant("top_shape", [steps, streams, hidden])], e.outputs[:1])
    if layer.expose:
        state = e.shape_constant("state_shape", [1, streams, hidden])
        for value, out in zip(last, e.outputs[1:]):
            e.node("Reshape", [value, state], [out])


def _unit(e, c, gate, cont, constants, t: str) -> tuple:
    """lstm_unit_layer.cpp's step: (c_t, h_t) of c_{t-1}, the gate input and cont (N, 1), as value names."""
    quarters, zero = constants
    i, f, o, g = e.node("Split", [gate, quarters], [e.temp(f"{part}_{t}") for part in ("i", "f", "o", "g")], axis=1)
    i = e.node("Sigmoid", [i], [e.temp(f"i_gate_{t}")])[0]
    f = e.node("Sigmoid", [f], [e.temp(f"f_gate_{t}")])[0]
    f = e.node("Mul", [cont, f], [e.temp(f"f_conted_{t}")])[0]
    stops = e.node("Equal", [cont, zero], [e.temp(f"cont_zero_{t}")])[0]
    f = e.node("Where", [stops, zero, f], [e.temp(f"f_{t}")])[0]
    o = e.node("Sigmoid", [o], [e.temp(f"o_gate_{t}")])[0]
    g = e.node("Tanh", [g], [e.temp(f"g_gate_{t}")])[0]
    kept = e.node("Mul", [f, c], [e.temp(f"c_kept_{t}")])[0]
    added = e.node("Mul", [i, g], [e.temp(f"c_added_{t}")])[0]
    c = e.node("Add", [kept, added], [e.temp(f"c_{t}")])[0]
    squashed = e.node("Tanh", [c], [e.temp(f"c_tanh_{t}")])[0]
    h = e.node("Mul", [o, squashed], [e.temp(f"h_{t}")])[0]
    return c, h


@exporter("LSTMUnit")
def lstm_unit(e) -> None:
    streams, width = e.bottom_shapes[0][1:]
    rows = [e.node("Reshape", [x, e.shape_constant(f"{what}_rows", [streams, size])], [e.temp(what)])[0]
            for x, what, size in zip(e.inputs, ("c_prev", "gate_input", "cont"), (width, 4 * width, 1))]
    constants = (e.constant("gate_sizes", np.full(4, width, np.int64)), e.constant("zero", np.zeros((), np.float32)))
    c, h = _unit(e, rows[0], rows[1], rows[2], constants, "1")
    state = e.shape_constant("state_shape", [1, streams, width])
    e.node("Reshape", [c, state], e.outputs[:1])
    e.node("Reshape", [h, state], e.outputs[1:2])


@exporter("LSTM")
def lstm(e) -> None:
    layer = e.layer
    layer.reshape([tuple(s) for s in e.bottom_shapes])
    xs, conts, static, (h, c) = _inputs(e, layer)
    w_hc = e.blob(len(layer.blobs) - 1, (4 * layer.hidden, layer.hidden))
    zero = e.constant("zero", np.zeros((), np.float32))
    quarters = e.constant("gate_sizes", np.full(4, layer.hidden, np.int64))
    hs = []
    for t in range(1, layer.steps + 1):
        cont = conts[t - 1]
        gate = _pre_activation(e, h, cont, xs[t - 1], static, w_hc, t)
        c, h = _unit(e, c, gate, cont, (quarters, zero), str(t))
        hs.append(h)
    _finish(e, layer, hs, [h, c])


@exporter("RNN")
def rnn(e) -> None:
    layer = e.layer
    layer.reshape([tuple(s) for s in e.bottom_shapes])
    xs, conts, static, (h,) = _inputs(e, layer)
    w_hh = e.blob(len(layer.blobs) - 3, (layer.hidden, layer.hidden))
    hs = []
    for t in range(1, layer.steps + 1):
        total = _pre_activation(e, h, conts[t - 1], xs[t - 1], static, w_hh, t)
        h = e.node("Tanh", [total], [e.temp(f"h_{t}")])[0]
        hs.append(h)
    _finish(e, layer, hs, [h])
