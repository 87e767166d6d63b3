"""What the tests of BVLC's recurrent and remaining layers share: a net run by blobtool, by Caffe, and exported.

- ``against_caffe(folder, layers, inputs, feeds)``: blobtool's forward
  (tests/helpers/caffenets.py's ours_forward) and real Caffe's (tests/helpers/caffeoracle.py)
  of the net; every top within CAFFE_TOLERANCE of the largest magnitude of
  Caffe's blob. Returns (blobtool's values, the worst difference).
- ``against_onnx(folder, layers, inputs, feeds, opsets)``: the net written
  to files, run by blobtool.api.run, exported with every blob an output
  (export_program), checked (tests/onnxvalid.py) and run in onnxruntime;
  every blob within ONNX_TOLERANCE of blobtool's. Returns the worst.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from caffenets import max_scaled_difference, net, ours_forward, write_net_files
from caffeoracle import caffe_values

CAFFE_TOLERANCE = 1e-5
ONNX_TOLERANCE = 1e-5


def tops_of(layers) -> list:
    return list(dict.fromkeys(top for each in layers for top in each.top))


def against_caffe(folder, layers, inputs: dict, feeds: dict) -> tuple:
    """(blobtool's values, the worst scaled difference): every top within CAFFE_TOLERANCE of Caffe's."""
    message = net(layers, inputs)
    tops = tops_of(layers)
    ours = ours_forward(message, feeds)
    theirs = caffe_values(message, feeds, Path(folder), tops)
    worst = 0.0
    for top in tops:
        assert ours[top].shape == theirs[top].shape, (top, ours[top].shape, theirs[top].shape)
        difference = max_scaled_difference(ours[top], theirs[top]) if ours[top].size else 0.0
        assert difference <= CAFFE_TOLERANCE, f"{top}: scaled difference {difference:.3g} from Caffe's"
        worst = max(worst, difference)
    return ours, worst


def against_onnx(folder, layers, inputs: dict, feeds: dict, opsets=(13, 17)) -> float:
    """The worst scaled difference of onnxruntime's blobs from blobtool's run, each within ONNX_TOLERANCE."""
    import onnxruntime as ort
    from onnxvalid import check_onnx

    from blobtool import api
    from blobtool.onnxport.graph import export_program

    folder = Path(folder)
    _, model = write_net_files(folder, net(layers, inputs), stem="exported")
    result = api.run(str(model), inputs=feeds, outputs="all")
    names = [n for n in result.values if n not in result.program.inputs]
    worst = 0.0
    for opset in opsets:
        path = folder / f"net-{opset}.onnx"
        exported = export_program(result.program, path, opset=opset, outputs=names)
        check_onnx(path)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        given = {exported.input_names[n]: np.asarray(feeds[n], np.float32) for n in result.program.inputs}
        found = dict(zip(names, session.run([exported.names[n] for n in names], given)))
        for name in names:
            ours, theirs = result.values[name], found[name]
            assert tuple(theirs.shape) == tuple(ours.shape), (name, opset, theirs.shape, ours.shape)
            difference = max_scaled_difference(theirs, ours) if ours.size else 0.0
            assert difference <= ONNX_TOLERANCE, f"{name} (opset {opset}): scaled difference {difference:.3g}"
            worst = max(worst, difference)
    return worst
