"""BatchReindex, Filter and Parameter as ONNX nodes: rows picked by a bottom's values, and a blob as a constant.

- BatchReindex: Gather on axis 0 by the index bottom Cast to int64 (Cast
  truncates toward zero, as Caffe's static_cast<int>). Caffe stops at an
  index outside [0, N); onnxruntime refuses one at N or past, and a
  negative one Gather reads from the end: the model does not check them.
- Filter: the selector Reshape to (N), Not(Equal(selector, 0)) (a NaN
  selects, as in Caffe), NonZero, Reshape to (k), then Gather on axis 0 of
  each bottom: the tops have k rows, known when the model runs (the graph's
  outputs say N, Caffe's first Reshape; onnxruntime gives k).
- Parameter: its blob as an initializer, Identity to the top.
"""

from __future__ import annotations

import numpy as np

from ..emit import exporter


@exporter("BatchReindex")
def batch_reindex(e) -> None:
    index = e.node("Cast", [e.inputs[1]], [e.temp("index")], to=7)[0]  # 7: INT64
    e.node("Gather", [e.inputs[0], index], e.outputs[:1], axis=0)


@exporter("Filter")
def filter_(e) -> None:
    rows = e.bottom_shapes[-1][0]
    selector = e.node("Reshape", [e.inputs[-1], e.shape_constant("selector_shape", [rows])],
                      [e.temp("selector")])[0]
    zero = e.node("Equal", [selector, e.constant("zero", np.zeros((), np.float32))], [e.temp("unselected")])[0]
    chosen = e.node("Not", [zero], [e.temp("selected")])[0]
    found = e.node("NonZero", [chosen], [e.temp("found")])[0]
    index = e.node("Reshape", [found, e.shape_constant("index_shape", [-1])], [e.temp("index")])[0]
    for source, out in zip(e.inputs[:-1], e.outputs):
        e.node("Gather", [source, index], [out], axis=0)
        # The rows are known only as the model runs: every top's first axis is the same named size.
        e.graph.symbolic[out] = {0: f"{e.outputs[0]}_rows"}


@exporter("Parameter")
def parameter(e) -> None:
    e.layer.reshape([])
    e.node("Identity", [e.blob(0, e.top_shapes[0])], e.outputs[:1])
