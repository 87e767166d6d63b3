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
the ResNets Caffe trained have them), and the three files of examples/.
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


NETS = {
    "lenet.caffemodel": lenet,
    "lenet_iter_5000.caffemodel": lenet,
    "resnet.caffemodel": resnet,
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
