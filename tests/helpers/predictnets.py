"""Small generated nets and images for predict's tests: a classifier, a segmenter, an SSD, a gray classifier."""

from __future__ import annotations

import numpy as np

from caffenets import layer, net, write_net_files
from netfuzz import SEED_BUILDERS


def weights(rng, *shape, scale=0.05):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def classifier(rng, channels: int = 3, size: tuple = (8, 8), batch: int = 2, classes: int = 6):
    """conv 3x3 -> ReLU -> InnerProduct -> Softmax on N x C x H x W (small weights: pixel values 0-255 go in)."""
    h, w = size
    layers = [
        layer("conv1", "Convolution", "data", blobs=[weights(rng, 4, channels, 3, 3, scale=0.01), weights(rng, 4)],
              convolution_param={"num_output": 4, "kernel_size": [3], "pad": [1]}),
        layer("relu1", "ReLU", "conv1", "conv1"),
        layer("ip1", "InnerProduct", "conv1", blobs=[weights(rng, classes, 4 * h * w, scale=0.002),
                                                     weights(rng, classes)],
              inner_product_param={"num_output": classes}),
        layer("prob", "Softmax", "ip1"),
    ]
    return net(layers, {"data": (batch, channels, h, w)}, name="classifier")


def segmenter(rng, size: tuple = (12, 16), classes: int = 4):
    """A 1x1 convolution to `classes` scores per pixel (the class map's oracle: their argmax)."""
    layers = [
        layer("score", "Convolution", "data", blobs=[weights(rng, classes, 3, 1, 1, scale=0.02),
                                                     weights(rng, classes)],
              convolution_param={"num_output": classes, "kernel_size": [1]}),
    ]
    return net(layers, {"data": (1, 3) + tuple(size)}, name="segmenter")


def ssd(rng):
    return SEED_BUILDERS["ssd"](rng)


def files(folder, message, stem):
    """(prototxt, caffemodel) of a net in `folder`."""
    return write_net_files(folder, message, stem=stem)


def _scene(h: int, w: int, channels: int, seed: int, mid, swing, disc_top, disc_step, bar_step, grain) -> np.ndarray:
    """Gradients, a disc and a bar over grain, (h, w, channels), in the levels given (not clipped)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    planes = []
    for c in range(channels):
        base = mid + swing * np.sin(x / (w / (2 + c)) + c) * np.cos(y / (h / 3))
        disc = ((x - w * 0.4) ** 2 + (y - h * 0.55) ** 2) < (min(h, w) * 0.2) ** 2
        base = np.where(disc, disc_top - disc_step * c, base)
        base[int(h * 0.2):int(h * 0.3), :] = bar_step * c
        planes.append(base + rng.normal(0, grain, (h, w)))
    return np.stack(planes, axis=2)


def photo(h: int, w: int, seed: int = 0) -> np.ndarray:
    """An RGB uint8 picture: gradients, a disc and a bar over grain."""
    return np.clip(_scene(h, w, 3, seed, 120, 80, 230, 70, 25, 6), 0, 255).astype(np.uint8)


def photo_like(h: int, w: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    """A smooth image with edges and noise, values in [0, 1]: gradients, a disc, a bar, grain."""
    return np.clip(_scene(h, w, channels, seed, 0.5, 0.3, 0.9, 0.3, 0.1, 0.03), 0, 1).astype(np.float32)
