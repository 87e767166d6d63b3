"""Caffe's recurrent layers at test time: LSTM and RNN (BVLC's RecurrentLayer and its two kinds), and LSTMUnit.

Caffe runs them as a net of its own, unrolled over the time axis
(recurrent_layer.cpp builds it from lstm_layer.cpp's or rnn_layer.cpp's
FillUnrolledNet); here each step of that net is written out, in its order:

- bottom 0, x: (T, N, ...): T time steps of N independent streams, the
  input of a step the values from axis 2 on (I of them);
- bottom 1, cont: (T, N): 0 where a stream starts a new sequence at step
  t (the state from step t - 1 is multiplied by it: h_conted = cont * h);
- bottom 2, the static input (N, ...), where there are more bottoms than
  2 plus the hidden state's (recurrent_layer.cpp: static_input_): added to
  every step's pre-activation through its own weight, without bias;
- with recurrent_param.expose_hidden, the state at step 0 comes in as the
  last bottoms (LSTM: h_0 and c_0; RNN: h_0; each (1, N, H)) and the state
  after step T goes out as the last tops (LSTM: h_T, c_T; RNN: h_T).
  Without it the state at step 0 is zero: Caffe copies the last forward's
  state into it, which is zero at a net's first forward (what `run` is).

The layer's blobs are the unrolled net's own weights in the order its
layers first use them (RecurrentLayer::LayerSetUp: params owned, in order):

- LSTM: W_xc (4H, I), b_c (4H), W_xc_static (4H, S) with a static input,
  W_hc (4H, H); the gates in Caffe's order i, f, o, g;
- RNN: W_xh (H, I), b_h (H), W_xh_static (H, S), W_hh (H, H), W_ho (H, H),
  b_o (H).
"""

from __future__ import annotations

import numpy as np

from .base import FLOAT, Layer, as_float, count, register

__all__ = ["LSTM", "LSTMUnit", "RNN", "lstm_unit", "sigmoid"]


def sigmoid(x: np.ndarray) -> np.ndarray:
    """lstm_unit_layer.cpp's sigmoid: 1. / (1. + exp(-x)), in double, returned as float."""
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(FLOAT)


def unit_tanh(x: np.ndarray) -> np.ndarray:
    """lstm_unit_layer.cpp's tanh: 2. * sigmoid(2. * x) - 1., in double, returned as float."""
    with np.errstate(over="ignore"):
        return (2.0 / (1.0 + np.exp(-2.0 * x.astype(np.float64))) - 1.0).astype(FLOAT)


def lstm_unit(c_prev: np.ndarray, gate: np.ndarray, keep: np.ndarray) -> tuple:
    """lstm_unit_layer.cpp Forward_cpu: (c, h) from c_{t-1} (N, H), the gate input (N, 4H) and cont (N, 1).

    i, f, o, g = sigmoid, sigmoid, sigmoid, tanh of the gate input's four
    H-wide parts; f = cont == 0 ? 0 : cont * f; c = f c_prev + i g;
    h = o tanh(c).
    """
    width = c_prev.shape[-1]
    i = sigmoid(gate[:, :width])
    f = np.where(keep == 0, FLOAT(0), keep * sigmoid(gate[:, width:2 * width])).astype(FLOAT)
    o = sigmoid(gate[:, 2 * width:3 * width])
    g = unit_tanh(gate[:, 3 * width:])
    c = f * c_prev + i * g
    return c, o * unit_tanh(c)


@register("LSTMUnit")
class LSTMUnit(Layer):
    """Caffe's LSTMUnitLayer (lstm_unit_layer.cpp): one LSTM step, the layer LSTM's unrolled net runs at each t.

    Bottoms c_{t-1} (1, N, H), the gate input (1, N, 4H) in Caffe's order
    i, f, o, g, and cont (1, N); tops c_t and h_t, each (1, N, H).
    """

    bottoms = (3, 3)
    tops = (2, 2)

    def reshape(self, shapes: list) -> list:
        shapes = [tuple(int(d) for d in s) for s in shapes]
        streams = shapes[0][1] if len(shapes[0]) > 1 else None
        # Reshape: bottoms 0 and 1 have 3 axes, cont 2; each starts (1, N)
        for k, (shape, axes) in enumerate(zip(shapes, (3, 3, 2))):
            if len(shape) != axes or shape[0] != 1 or shape[1] != streams:
                raise self.error(f"bottom {k} has shape {shape}; it must have {axes} axes, (1, N{', ...' * (axes > 2)}) "
                                 f"with the N of bottom 0")
        if shapes[1][2] != 4 * shapes[0][2]:
            raise self.error(f"bottom 1 (the gate input) has {shapes[1][2]} values a stream; it must have 4 x the "
                             f"{shapes[0][2]} of bottom 0 (c_prev)")
        return [shapes[0], shapes[0]]

    def forward(self, xs: list) -> list:
        c_prev, gate, cont = (as_float(x) for x in xs)
        streams, width = c_prev.shape[1:]
        c, h = lstm_unit(c_prev.reshape(streams, width), gate.reshape(streams, 4 * width), cont.reshape(streams, 1))
        return [as_float(c).reshape(c_prev.shape), as_float(h).reshape(c_prev.shape)]


class _Recurrent(Layer):
    """What LSTM and RNN share (recurrent_layer.cpp): the bottoms and blobs laid out, checked."""

    bottoms = (2, None)
    tops = (1, None)
    states = ()         # the recurrent state's names, in the order expose_hidden's bottoms and tops give them
    gates = 1           # the pre-activation's width in units of num_output (LSTM: 4 gates)

    def setup(self) -> None:
        p = self.param.recurrent_param
        self.hidden = int(p.num_output)
        if self.hidden <= 0:
            raise self.error("num_output must be positive (it is 0 or not set)")
        self.expose = bool(p.expose_hidden)

    def roles(self) -> list:
        """(name, shape) of each blob, in Caffe's order, for the bottoms of the last reshape."""
        raise NotImplementedError

    def _check_layout(self, shapes: list) -> None:
        """recurrent_layer.cpp LayerSetUp and Reshape's CHECKs, with the counts expose_hidden asks for."""
        exposed = len(self.states) if self.expose else 0
        self.static = len(shapes) > 2 + exposed
        if len(shapes) > 3 + exposed:
            raise self.error(f"has {len(shapes)} bottoms; it takes x, cont, an optional static input"
                             + (f" and {', '.join(self.states)} (expose_hidden)" if exposed else ""))
        wanted = 1 + exposed
        if len(self.top_names) != wanted:
            raise self.error(f"has {len(self.top_names)} tops, expected {wanted}"
                             + (f" (the output and {', '.join(s + '_T' for s in self.states)}: expose_hidden)"
                                if exposed else ""))
        x, cont = (tuple(int(d) for d in s) for s in shapes[:2])
        if len(x) < 2:
            raise self.error(f"bottom 0 has shape {x}; it must have at least 2 axes (#timesteps, #streams, ...)")
        if cont != x[:2]:
            raise self.error(f"bottom 1 (cont) has shape {cont}; it must be (#timesteps, #streams) = {x[:2]}")
        self.steps, self.streams = x[:2]
        self.inputs = count(x, 2)
        if self.static:
            static = tuple(int(d) for d in shapes[2])
            if len(static) < 1 or static[0] != self.streams:
                raise self.error(f"bottom 2 (the static input) has shape {static}; its first axis must be the "
                                 f"{self.streams} streams")
            self.static_inputs = count(static, 1)
        state = (1, self.streams, self.hidden)
        for k, name in enumerate(self.states if exposed else ()):
            got = tuple(shapes[2 + self.static + k])
            if got != state:
                raise self.error(f"bottom {2 + self.static + k} ({name}_0) has shape {got}; it must be the hidden "
                                 f"state's {state}")
        roles = self.roles()
        if len(self.blobs) != len(roles):
            raise self.error(f"holds {len(self.blobs)} blobs, expected {len(roles)} "
                             f"({', '.join(n for n, _ in roles)})")
        for k, (name, shape) in enumerate(roles):
            if self.blobs[k].size != count(shape):
                raise self.error(f"blob {k} ({name}) has shape {tuple(self.blobs[k].shape)}, expected {shape}")

    def reshape(self, shapes: list) -> list:
        self._check_layout(shapes)
        state = (1, self.streams, self.hidden)
        return [(self.steps, self.streams, self.hidden)] + [state] * (len(self.states) if self.expose else 0)

    def workspace(self, shapes: list) -> tuple:
        """Every step's input term at once (T N, G): the unrolled net's x_transform top."""
        self._check_layout(shapes)
        return self.steps * self.streams * self.gates * self.hidden, "input transform of every step"

    def weight(self, name: str) -> np.ndarray:
        """Blob `name` (roles()) in its 2-D (rows, columns) or 1-D shape."""
        for k, (role, shape) in enumerate(self.roles()):
            if role == name:
                return self.blobs[k].reshape(shape)
        raise KeyError(name)

    def pre_activations(self, xs: list) -> tuple:
        """(W x + b per step (T, N, G), W_static x_static (N, G) or None): the unrolled net's first layers."""
        x = xs[0]
        first = self.roles()[0][0]
        # x_transform: InnerProduct over axis 2, with bias: (T * N, I) x W^T + b
        rows = np.ascontiguousarray(x, dtype=FLOAT).reshape(self.steps * self.streams, self.inputs)
        xw = rows @ self.weight(first).T
        xw += self.weight(self.roles()[1][0])
        static = None
        if self.static:
            # the static transform: InnerProduct over axis 1, no bias, reshaped to (1, N, G)
            flat = np.ascontiguousarray(xs[2], dtype=FLOAT).reshape(self.streams, self.static_inputs)
            static = flat @ self.weight(self.roles()[2][0]).T
        return xw.reshape(self.steps, self.streams, -1), static

    def initial(self, xs: list) -> list:
        """The state at step 0, each (N, H): the exposed bottoms, or zeros (a net's first forward)."""
        if self.expose:
            first = 2 + self.static
            return [as_float(xs[first + k]).reshape(self.streams, self.hidden) for k in range(len(self.states))]
        return [np.zeros((self.streams, self.hidden), FLOAT) for _ in self.states]

    @staticmethod
    def summed(parts: list) -> np.ndarray:
        """Eltwise SUM of the parts, added in bottom order from 0 (eltwise_layer.cpp)."""
        total = np.zeros(parts[0].shape, FLOAT)
        for part in parts:
            total += part
        return total


@register("LSTM")
class LSTM(_Recurrent):
    """Caffe's LSTMLayer (lstm_layer.cpp, lstm_unit_layer.cpp): h_t and c_t from x_t, h_{t-1}, c_{t-1}, cont_t.

    gate_input_t = W_hc (cont_t h_{t-1}) + (W_xc x_t + b_c) [+ W_xc_static x_static]
    i, f, o, g = sigmoid, sigmoid, sigmoid, tanh of the four H-wide parts, in that order
    c_t = cont_t f c_{t-1} + i g  (f is 0 where cont_t is 0)
    h_t = o tanh(c_t); the top is h_1 .. h_T.
    """

    states = ("h", "c")
    gates = 4

    def roles(self) -> list:
        four = 4 * self.hidden
        found = [("W_xc", (four, self.inputs)), ("b_c", (four,))]
        if self.static:
            found.append(("W_xc_static", (four, self.static_inputs)))
        return found + [("W_hc", (four, self.hidden))]

    def forward(self, xs: list) -> list:
        xw, static = self.pre_activations(xs)
        cont = as_float(xs[1])
        h, c = self.initial(xs)
        w_hc = self.weight("W_hc").T
        width = self.hidden
        out = np.empty((self.steps, self.streams, width), FLOAT)
        for t in range(self.steps):
            keep = cont[t][:, None]
            # h_conted_{t-1} = cont_t * h_{t-1} (a Scale over axis 0); W_hc_h_{t-1} = W_hc h_conted (no bias)
            parts = [(h * keep) @ w_hc, xw[t]] + ([static] if static is not None else [])
            c, h = lstm_unit(c, self.summed(parts), keep)
            out[t] = h
        tops = [out]
        if self.expose:
            tops += [h.reshape(1, self.streams, width), c.reshape(1, self.streams, width)]
        return [as_float(y) for y in tops]


@register("RNN")
class RNN(_Recurrent):
    """Caffe's RNNLayer (rnn_layer.cpp): a tanh state h_t and a tanh output o_t.

    h_t = tanh(W_hh (cont_t h_{t-1}) + (W_xh x_t + b_h) [+ W_xh_static x_static])
    o_t = tanh(W_ho h_t + b_o); the top is o_1 .. o_T (and h_T with expose_hidden).
    """

    states = ("h",)

    def roles(self) -> list:
        size = self.hidden
        found = [("W_xh", (size, self.inputs)), ("b_h", (size,))]
        if self.static:
            found.append(("W_xh_static", (size, self.static_inputs)))
        return found + [("W_hh", (size, size)), ("W_ho", (size, size)), ("b_o", (size,))]

    def forward(self, xs: list) -> list:
        xw, static = self.pre_activations(xs)
        cont = as_float(xs[1])
        (h,) = self.initial(xs)
        w_hh, w_ho, b_o = self.weight("W_hh").T, self.weight("W_ho").T, self.weight("b_o")
        out = np.empty((self.steps, self.streams, self.hidden), FLOAT)
        for t in range(self.steps):
            parts = [(h * cont[t][:, None]) @ w_hh, xw[t]] + ([static] if static is not None else [])
            # tanh_layer.cpp: tanh of the float, as the unrolled net's TanH layers compute it
            h = np.tanh(self.summed(parts))
            out[t] = np.tanh(h @ w_ho + b_o)
        tops = [out]
        if self.expose:
            tops.append(h.reshape(1, self.streams, self.hidden))
        return [as_float(y) for y in tops]
