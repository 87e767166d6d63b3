"""blobtool run on the nets Caffe itself wrote (../shared/realworld): what a run returns, and the checks.

The values are proved against real Caffe in tests/forward/test_caffe_realworld.py,
blob by blob (both read CIFAR10_DEPLOY from tests/helpers/caffenets.py: the HDF5 snapshot holds no
definition, so one is written from its blobs' shapes, CIFAR-10 "full" with
a 500-unit hidden layer).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from google.protobuf import text_format

import blobtool
from blobtool._pb import blobtool_caffe_pb2 as pb
from caffenets import CIFAR10_DEPLOY, random_feeds

# name, --input-shape, the other shapes to try (fully convolutional nets take any size)
NETS = [
    ("lenet_iter_10000.caffemodel", {"data": (2, 1, 28, 28)}),
    ("resnet20_cifar10.caffemodel", {"Data1": (3, 3, 32, 32)}),
    ("mtcnn_det1_half.caffemodel", {"data": (1, 3, 12, 12)}),
    ("mtcnn_det1_half.caffemodel", {"data": (2, 3, 31, 47)}),
]


@pytest.mark.parametrize("name, shapes", NETS, ids=[f"{n}-{'x'.join(map(str, next(iter(s.values()))))}"
                                                     for n, s in NETS])
def test_every_blob_of_a_real_net_is_returned_as_float32(realworld, name, shapes):
    # Their values are Caffe's: tests/forward/test_caffe_realworld.py compares each with real Caffe's.
    result = blobtool.run(str(realworld / name), inputs=random_feeds(shapes, 7), outputs="all")
    assert list(result.values) == result.program.blob_names()
    assert all(v.dtype == np.float32 and v.flags.c_contiguous for v in result.values.values())
    assert all(result.values[n].shape == tuple(s) for n, s in result.program.shapes.items())


def test_the_hdf5_snapshot_runs_with_a_definition_as_its_binary_form_does(tmp_path, realworld):
    snapshot = realworld / "cifar10_full_iter_70000.caffemodel.h5"
    deploy = tmp_path / "cifar10_deploy.prototxt"
    deploy.write_text(CIFAR10_DEPLOY)
    # The same weights, rewritten as one binary net.
    binary = tmp_path / "cifar10.caffemodel"
    definition = text_format.Parse(CIFAR10_DEPLOY, pb.NetParameter())
    weights = blobtool.load_all(str(snapshot))
    for layer in definition.layer:
        k = 0
        while f"{layer.name}/{k}" in weights:
            array = np.asarray(weights[f"{layer.name}/{k}"].cpu_data(), np.float32).reshape(
                weights[f"{layer.name}/{k}"].shape)
            blob = layer.blobs.add()
            blob.shape.dim.extend(array.shape)
            blob.data.extend(array.reshape(-1).tolist())
            k += 1
    binary.write_bytes(definition.SerializeToString())
    feeds = random_feeds({"data": (2, 3, 32, 32)}, 7)
    result = blobtool.run(str(snapshot), definition=str(deploy), inputs=feeds, outputs="all")
    assert list(result.values)[:2] == ["data", "conv1"]
    # The same weights from the binary net give the same values, bit for bit.
    again = blobtool.run(str(binary), inputs=feeds, outputs="all")
    assert list(again.values) == list(result.values)
    for n, v in result.values.items():
        np.testing.assert_array_equal(again.values[n], v)


def test_probabilities_of_a_training_snapshot_sum_to_one(realworld):
    result = blobtool.run(str(realworld / "lenet_iter_10000.caffemodel"), shapes={"data": (4, 1, 28, 28)})
    assert list(result.values) == ["prob"]
    np.testing.assert_allclose(result.values["prob"].sum(axis=1), 1.0, rtol=1e-5)
    assert [i["given"] for i in result.inputs] == ["random normal, seed 0"]


@pytest.mark.parametrize("name, shapes", [("resnet20_cifar10.caffemodel", {"Data1": (2, 3, 32, 32)}),
                                          ("mtcnn_det1_half.caffemodel", {"data": (1, 3, 24, 24)})])
def test_fold_and_transplant_check_pass_on_real_nets(tmp_path, realworld, name, shapes):
    from runner import ok

    net = realworld / name
    shape = [f"{k}={','.join(map(str, v))}" for k, v in shapes.items()]
    folded = ok("fold", net, "-o", tmp_path / "folded.caffemodel", "--check", "--input-shape", *shape, "--json")
    record = json.loads(folded.stdout)
    assert record["check"]["passed"] is True and record["check"]["blobs"]
    with blobtool.open_document(str(net)) as doc:
        batchnorms = [layer.type for layer in doc.layers].count("BatchNorm")
    assert len(record["folded"]) == batchnorms  # ResNet-20: every BatchNorm, each with its Scale; MTCNN: none
    ok("convert", "--names", "torch", net, "-o", tmp_path / "port.safetensors")
    back = ok("transplant", tmp_path / "port.safetensors", net, "--names", "torch", "-o", tmp_path / "back.caffemodel",
              "--check", "--input-shape", *shape)
    assert "computes what" in back.stderr
