"""Make the example blob files in this folder, and the nets the README's recipes use, with the protobuf library.

    python examples/make_examples.py [OUTDIR]
    python examples/make_examples.py --nets DIR

Writes (deterministically, from a fixed seed):

- mean_legacy.binaryproto: a mean-image-like blob, legacy num/channels/height/width
  1 x 3 x 32 x 32, float data (as Caffe's compute_image_mean writes it);
- weights_diff.pb: a conv-weight-like blob, `shape` 16 x 3 x 3 x 3, float data and diff;
- double.pb: a float64 blob, `shape` 4 x 10, in double_data.

With --nets, into DIR (not shipped: made where they are used), small nets of
the shapes the recipes name: lenet.caffemodel and lenet_iter_5000.caffemodel
(LeNet's layers, a training snapshot with its Data and loss layers, two sets
of values), resnet.caffemodel (a Convolution, BatchNorm and Scale block, as
the ResNets Caffe trained have them), fcn.caffemodel and ssd.caffemodel (a
segmenter's and an SSD's shapes, for predict's recipes), and the three files
of examples/.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from blobtool._pb.blobtool_caffe_pb2 import BlobProto, LayerParameter, NetParameter


def mean_legacy(rng: np.random.Generator) -> BlobProto:
    # A smooth "image": per-channel BGR means plus a gentle gradient.
    y, x = np.mgrid[0:32, 0:32].astype(np.float32)
    channels = [104.0 + 0.3 * x, 117.0 + 0.3 * y, 123.0 + 0.15 * (x + y)]
    img = np.stack(channels)[None] + rng.normal(0, 0.5, (1, 3, 32, 32))
    proto = BlobProto(num=1, channels=3, height=32, width=32)
    proto.data.extend(img.astype(np.float32).ravel().tolist())
    return proto


def weights_diff(rng: np.random.Generator) -> BlobProto:
    w = rng.normal(0, 0.1, (16, 3, 3, 3)).astype(np.float32)
    g = rng.normal(0, 0.01, w.shape).astype(np.float32)
    proto = BlobProto()
    proto.shape.dim.extend(w.shape)
    proto.data.extend(w.ravel().tolist())
    proto.diff.extend(g.ravel().tolist())
    return proto


def double_blob(rng: np.random.Generator) -> BlobProto:
    v = rng.normal(0, 1, (4, 10))
    proto = BlobProto()
    proto.shape.dim.extend(v.shape)
    proto.double_data.extend(v.ravel().tolist())
    return proto


EXAMPLES = {
    "mean_legacy.binaryproto": mean_legacy,
    "weights_diff.pb": weights_diff,
    "double.pb": double_blob,
}


def _blob(values: np.ndarray) -> BlobProto:
    proto = BlobProto()
    proto.shape.dim.extend(values.shape)
    proto.data.extend(values.astype(np.float32).ravel().tolist())
    return proto


def _layer(net: NetParameter, name: str, type_: str, bottom, top, blobs=()) -> LayerParameter:
    layer = net.layer.add(name=name, type=type_)
    layer.bottom.extend(bottom)
    layer.top.extend(top)
    layer.blobs.extend(_blob(b) for b in blobs)
    return layer


def lenet(rng: np.random.Generator) -> NetParameter:
    """LeNet's layers at a quarter of its widths, as a snapshot of Caffe's training net holds them."""
    net = NetParameter(name="LeNet")
    data = _layer(net, "mnist", "Data", [], ["data", "label"])
    data.transform_param.scale = 0.00390625
    data.data_param.source = "examples/mnist/mnist_train_lmdb"
    data.data_param.batch_size = 64
    conv = _layer(net, "conv1", "Convolution", ["data"], ["conv1"],
                  [rng.normal(0, 0.1, (5, 1, 5, 5)), rng.normal(0, 0.1, 5)])
    conv.convolution_param.num_output = 5
    conv.convolution_param.kernel_size.append(5)
    pool = _layer(net, "pool1", "Pooling", ["conv1"], ["pool1"])
    pool.pooling_param.kernel_size = 2
    pool.pooling_param.stride = 2
    ip1 = _layer(net, "ip1", "InnerProduct", ["pool1"], ["ip1"], [rng.normal(0, 0.1, (20, 720)), rng.normal(0, 0.1, 20)])
    ip1.inner_product_param.num_output = 20
    _layer(net, "relu1", "ReLU", ["ip1"], ["ip1"])
    ip2 = _layer(net, "ip2", "InnerProduct", ["ip1"], ["ip2"], [rng.normal(0, 0.1, (10, 20)), rng.normal(0, 0.1, 10)])
    ip2.inner_product_param.num_output = 10
    _layer(net, "loss", "SoftmaxWithLoss", ["ip2", "label"], ["loss"])
    return net


def resnet(rng: np.random.Generator) -> NetParameter:
    """A ResNet's first block: Convolution, BatchNorm with its stored sums and factor, Scale, ReLU; a classifier."""
    net = NetParameter(name="resnet")
    net.input.append("data")
    net.input_shape.add().dim.extend([1, 3, 8, 8])
    conv = _layer(net, "conv1", "Convolution", ["data"], ["conv1"], [rng.normal(0, 0.1, (4, 3, 3, 3))])
    conv.convolution_param.num_output = 4
    conv.convolution_param.kernel_size.append(3)
    conv.convolution_param.pad.append(1)
    conv.convolution_param.bias_term = False
    factor = 999.98
    _layer(net, "bn1", "BatchNorm", ["conv1"], ["conv1"],
           [rng.normal(0, 1, 4) * factor, rng.uniform(0.5, 2, 4) * factor, np.array([factor])])
    scale = _layer(net, "scale1", "Scale", ["conv1"], ["conv1"], [rng.uniform(0.5, 1.5, 4), rng.normal(0, 0.1, 4)])
    scale.scale_param.bias_term = True
    _layer(net, "relu1", "ReLU", ["conv1"], ["conv1"])
    fc = _layer(net, "fc", "InnerProduct", ["conv1"], ["fc"], [rng.normal(0, 0.1, (10, 256)), rng.normal(0, 0.1, 10)])
    fc.inner_product_param.num_output = 10
    _layer(net, "prob", "Softmax", ["fc"], ["prob"])
    return net


def fcn(rng: np.random.Generator) -> NetParameter:
    """A segmenter's shape: a 1x1 convolution scoring 3 classes at every pixel of a 1 x 3 x 16 x 16 input."""
    net = NetParameter(name="fcn")
    net.input.append("data")
    net.input_shape.add().dim.extend([1, 3, 16, 16])
    score = _layer(net, "score", "Convolution", ["data"], ["score"], [rng.normal(0, 0.01, (3, 3, 1, 1)),
                                                                      rng.normal(0, 0.1, 3)])
    score.convolution_param.num_output = 3
    score.convolution_param.kernel_size.append(1)
    return net


def ssd(rng: np.random.Generator) -> NetParameter:
    """An SSD's shape: one feature map, one prior a cell, 3 classes (background first), DetectionOutput."""
    net = NetParameter(name="ssd")
    net.input.append("data")
    net.input_shape.add().dim.extend([1, 3, 16, 16])
    # The scores' biases favour class 1, so that the recipe's picture shows boxes.
    heads = (("loc", 4, rng.normal(0, 0.5, 4)), ("conf", 3, np.array([0.0, 2.0, 0.5])))
    for name, width, bias in heads:
        conv = _layer(net, name, "Convolution", ["data"], [name], [rng.normal(0, 0.0005, (width, 3, 4, 4)), bias])
        conv.convolution_param.num_output = width
        conv.convolution_param.kernel_size.append(4)
        conv.convolution_param.stride.append(4)
        _layer(net, f"{name}_perm", "Permute", [name], [f"{name}_perm"]).permute_param.order.extend([0, 2, 3, 1])
        _layer(net, f"{name}_flat", "Flatten", [f"{name}_perm"], [f"{name}_flat"])
    _layer(net, "conf_shape", "Reshape", ["conf_flat"], ["conf_shape"]).reshape_param.shape.dim.extend([0, -1, 3])
    _layer(net, "conf_prob", "Softmax", ["conf_shape"], ["conf_prob"]).softmax_param.axis = 2
    _layer(net, "conf_out", "Flatten", ["conf_prob"], ["conf_out"])
    prior = _layer(net, "prior", "PriorBox", ["loc", "data"], ["prior"]).prior_box_param
    prior.min_size.append(6.0)
    prior.variance.extend([0.1, 0.1, 0.2, 0.2])
    out = _layer(net, "detection_out", "DetectionOutput", ["loc_flat", "conf_out", "prior"], ["detection_out"])
    p = out.detection_output_param
    p.num_classes, p.background_label_id, p.keep_top_k, p.confidence_threshold = 3, 0, 5, 0.01
    p.nms_param.nms_threshold, p.nms_param.top_k, p.code_type = 0.45, 10, 2
    return net


NETS = {
    "lenet.caffemodel": lenet,
    "lenet_iter_5000.caffemodel": lenet,
    "resnet.caffemodel": resnet,
    "fcn.caffemodel": fcn,
    "ssd.caffemodel": ssd,
}


def main(outdir: Path, nets: bool = False) -> None:
    """The examples into `outdir`; with `nets`, the recipes' nets into it and the examples into outdir/examples."""
    rng = np.random.default_rng(20261129)
    made = [(outdir / "examples" if nets else outdir, EXAMPLES)] + ([(outdir, NETS)] if nets else [])
    for folder, makers in made:
        folder.mkdir(parents=True, exist_ok=True)
        for name, make in makers.items():
            (folder / name).write_bytes(make(rng).SerializeToString())
            print(f"wrote {folder / name}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--nets"] and len(sys.argv) == 3:
        main(Path(sys.argv[2]), nets=True)
    else:
        main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)
