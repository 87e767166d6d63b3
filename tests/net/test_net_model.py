"""The model of a net (blobtool/net/model.py): one object per net, whatever format holds it, with a view per phase."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from blobtool._pb import blobtool_caffe_pb2 as pb
from blobtool.formats import open_document
from blobtool.net import model as net_model
from blobtool.net.model import TEST, TRAIN, model
from builders import h5_net_bytes, write_h5

h5py = pytest.importorskip("h5py")

NAMES = ["conv1", "bn1", "scale1", "relu1", "drop1", "ip", "loss", "prob"]
TYPES = ["Convolution", "BatchNorm", "Scale", "ReLU", "Dropout", "InnerProduct", "SoftmaxWithLoss", "Softmax"]


def _blob(*shape, value=1.0):
    return pb.BlobProto(shape=pb.BlobShape(dim=shape), data=[value] * int(np.prod(shape)))


def net_message(blobs: bool = True) -> pb.NetParameter:
    """Convolution, BatchNorm, Scale and ReLU in place on "conv1"; a TRAIN-only Dropout and loss; a TEST-only Softmax."""
    net = pb.NetParameter(name="modelled")
    net.input.append("data")
    held = {"conv1": [_blob(2, 3, 1, 1), _blob(2)], "bn1": [_blob(2), _blob(2), _blob(1)],
            "scale1": [_blob(2), _blob(2)], "ip": [_blob(4, 2), _blob(4)]}
    wiring = {"conv1": (["data"], ["conv1"]), "bn1": (["conv1"], ["conv1"]), "scale1": (["conv1"], ["conv1"]),
              "relu1": (["conv1"], ["conv1"]), "drop1": (["conv1"], ["conv1"]), "ip": (["conv1"], ["ip"]),
              "loss": (["ip", "label"], ["loss"]), "prob": (["ip"], ["prob"])}
    for name, kind in zip(NAMES, TYPES):
        layer = net.layer.add(name=name, type=kind, bottom=wiring[name][0], top=wiring[name][1])
        if blobs:
            layer.blobs.extend(held.get(name, []))
        if name in ("drop1", "loss"):
            layer.include.add(phase=TRAIN)
        if name == "prob":
            layer.include.add(phase=TEST)
    net.layer[2].scale_param.bias_term = True
    return net


@pytest.fixture
def binary(tmp_path):
    path = tmp_path / "net.caffemodel"
    path.write_bytes(net_message().SerializeToString())
    return path


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "deploy.prototxt"
    path.write_text(text_format.MessageToString(net_message(blobs=False)))
    return path


def _graph(net) -> list:
    return [(layer.name, layer.type, layer.bottoms, layer.tops) for layer in net.layers]


def test_a_binary_net_and_its_text_give_the_same_layers_and_links(binary, text):
    with open_document(str(binary)) as b, open_document(str(text)) as t:
        assert _graph(model(b)) == _graph(model(t))
        assert [layer.name for layer in model(b).layers] == NAMES
        assert model(b).layers[1].bottoms == ("conv1",) and model(b).layers[1].tops == ("conv1",)
        for phase in (TEST, TRAIN, None):
            assert model(b).view(phase).outside == model(t).view(phase).outside
            assert model(b).view(phase).readers == model(t).view(phase).readers


def test_each_layers_blobs_are_given_by_role(binary):
    with open_document(str(binary)) as doc:
        net = model(doc)
        conv, bn, scale = (net.by_name[name] for name in ("conv1", "bn1", "scale1"))
        assert conv.blob("weight").shape == (2, 3, 1, 1) and conv.blob("bias").shape == (2,)
        assert [bn.blob(role).name for role in ("mean", "variance", "factor")] == ["bn1/0", "bn1/1", "bn1/2"]
        assert bn.blob("weight") is None  # Caffe's BatchNorm holds three: NVIDIA Caffe's scale is a fourth
        assert sorted(scale.roles()) == ["bias", "weight"]
        assert net.by_name["relu1"].roles() == {} and net.by_name["relu1"].blob("weight") is None


def test_the_test_view_leaves_out_the_train_only_layers_and_follows_the_in_place_chain(binary):
    with open_document(str(binary)) as doc:
        test = model(doc).test
        index = {name: i for i, name in enumerate(NAMES)}
        assert sorted(test.outside) == [index["drop1"], index["loss"]]
        assert "include" in test.outside[index["drop1"]] and "TRAIN" in test.outside[index["drop1"]]
        assert test.links[index["drop1"]] == ((), ())
        # Each in-place layer reads the version the one before it left.
        assert test.writer(index["bn1"]) == (index["conv1"], 0)
        assert test.writer(index["scale1"]) == (index["bn1"], 0)
        assert test.readers[(index["bn1"], 0)] == [index["scale1"]]
        assert test.writer(index["ip"]) == (index["relu1"], 0)  # no Dropout in between at TEST
        assert test.readers[(index["ip"], 0)] == [index["prob"]]


def test_the_train_view_holds_the_train_only_layers_and_not_the_test_only_one(binary):
    with open_document(str(binary)) as doc:
        train = model(doc).train
        index = {name: i for i, name in enumerate(NAMES)}
        assert sorted(train.outside) == [index["prob"]]
        assert train.writer(index["ip"]) == (index["drop1"], 0)
        assert train.readers[(index["ip"], 0)] == [index["loss"]]
        assert train.writer(index["loss"], 1) is None  # "label": a net input here


def test_every_layer_as_stored_reads_what_the_last_writer_before_it_left(binary):
    with open_document(str(binary)) as doc:
        every = model(doc).view(None)
        index = {name: i for i, name in enumerate(NAMES)}
        assert every.outside == {}
        assert every.writer(index["ip"]) == (index["drop1"], 0)
        assert every.readers[(index["ip"], 0)] == [index["loss"], index["prob"]]


def test_a_v1_nets_rules_are_read_from_v1s_own_field_numbers(tmp_path):
    net = pb.NetParameter(name="old")
    net.layers.add(name="conv", type=pb.V1LayerParameter.CONVOLUTION, bottom=["data"], top=["conv"])
    dropout = net.layers.add(name="drop", type=pb.V1LayerParameter.DROPOUT, bottom=["conv"], top=["conv"])
    dropout.include.add(phase=TRAIN)
    net.layers.add(name="ip", type=pb.V1LayerParameter.INNER_PRODUCT, bottom=["conv"], top=["ip"])
    path = tmp_path / "v1.caffemodel"
    path.write_bytes(net.SerializeToString())
    with open_document(str(path)) as doc:
        built = model(doc)
        assert [layer.type for layer in built.layers] == ["Convolution", "Dropout", "InnerProduct"]
        assert list(built.test.outside) == [1]
        assert built.test.writer(2) == (0, 0) and built.train.writer(2) == (1, 0)


def test_an_hdf5_snapshot_takes_types_links_and_rules_from_its_definition(tmp_path, text):
    arrays = [("conv1", [np.ones((2, 3, 1, 1), np.float32), np.ones(2, np.float32)]),
              ("bn1", [np.ones(2, np.float32), np.ones(2, np.float32), np.ones(1, np.float32)]),
              ("scale1", [np.ones(2, np.float32), np.ones(2, np.float32)]), ("relu1", []), ("drop1", []),
              ("ip", [np.ones((4, 2), np.float32), np.ones(4, np.float32)]), ("loss", []), ("prob", [])]
    snapshot = write_h5(tmp_path / "net.caffemodel.h5", h5_net_bytes(arrays))
    with open_document(str(snapshot)) as doc, open_document(str(text)) as definition:
        alone = model(doc)
        assert [layer.type for layer in alone.layers] == [""] * len(NAMES)  # HDF5 holds names and blobs only
        assert alone.links == [((), ())] * len(NAMES)
        typed = model(doc, definition)
        with open_document(str(text)) as again:
            assert _graph(typed) == _graph(model(again))
        assert typed.by_name["bn1"].blob("factor").shape == (1,)
        assert sorted(typed.test.outside) == [NAMES.index("drop1"), NAMES.index("loss")]


def test_a_net_is_modelled_once_for_all_the_jobs_that_read_it(binary, monkeypatch):
    from blobtool.records import info_record
    from blobtool.surgery.foldplan import plan_folds
    from blobtool.torchport.naming import torch_names

    built = []
    real = net_model.Net.__init__
    monkeypatch.setattr(net_model.Net, "__init__", lambda self, *a, **k: built.append(1) or real(self, *a, **k))
    with open_document(str(binary)) as doc:
        plan = plan_folds(doc)
        torch_names(doc)
        info_record(doc, doc.entries, layer_defs=True)
        assert model(doc) is model(doc)
        assert len(built) == 1
        assert [f.batchnorm.name for f in plan.folds] == ["bn1"]
    assert doc.models == []  # closed: its model goes with its layers


def test_a_copy_of_a_document_with_other_entries_gets_its_own_model(binary):
    import dataclasses

    with open_document(str(binary)) as doc:
        first = model(doc)
        renamed = dataclasses.replace(doc, entries=[dataclasses.replace(e, name="x." + e.name) for e in doc.entries])
        copy = model(renamed)
        assert copy is not first and model(doc) is first
        assert copy.by_name["conv1"].blob("weight").name == "x.conv1/0"
