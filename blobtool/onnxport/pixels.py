"""Preprocessing baked in front of an exported graph: the model takes pixels (uint8, N x H x W x C, RGB or BGR).

`export --preprocess` puts Caffe's preprocessing (api/preprocessing.py's
order) into the model, so that a runtime needs no preprocessing code:

    Cast(uint8 -> float) -> Transpose(N,H,W,C -> N,C,H,W) -> Gather([2,1,0])
    (where the pixels' order is not the net's) -> Div(255) -> Mul(raw_scale)
    -> Sub(mean) -> Mul(scale)

each a float32 operation in the order and with the constants
`blobtool.preprocess` uses, so the net's input the model computes equals
predict's to the bit. The pixels are of the input's height and width:
resizing stays with the caller (a runtime's own resize differs anyway).
`PixelSteps.apply` is the same arithmetic in numpy, which the export's
check feeds to blobtool's forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["PixelSteps", "pixel_nodes"]


@dataclass
class PixelSteps:
    """One input's preprocessing: `mean` and `scale` broadcast over C x H x W (or None).

    `bgr`: the net takes BGR (Caffe's order; else RGB); `pixels`: the order
    of the pixels the model is given, "RGB" (as most image libraries decode)
    or "BGR" (as OpenCV's imread does). The channels are swapped where the
    two differ.
    """

    channels: int
    raw_scale: float = 255.0
    bgr: bool = True
    mean: np.ndarray | None = None
    scale: np.ndarray | None = None
    pixels: str = "RGB"

    @property
    def swapped(self) -> bool:
        """Whether the pixels' channels are reversed to the net's order (colour only)."""
        return self.channels == 3 and self.bgr != (self.pixels == "BGR")

    def pixel_shape(self, shape: tuple) -> tuple:
        """N x H x W x C of a net input of shape N x C x H x W."""
        n, c, h, w = shape
        return (n, h, w, c)

    def apply(self, pixels: np.ndarray) -> np.ndarray:
        """The net input of uint8 pixels (N x H x W x C, in the order `pixels` says), as the model computes it."""
        out = np.ascontiguousarray(np.asarray(pixels).astype(np.float32).transpose(0, 3, 1, 2))
        if self.swapped:
            out = out[:, [2, 1, 0]]
        out = out / np.float32(255)
        out = out * np.float32(self.raw_scale)
        if self.mean is not None:
            out = out - self.mean
        if self.scale is not None:
            out = out * self.scale
        return out.astype(np.float32, copy=False)

    def record(self) -> dict:
        given = self.pixels if self.channels == 3 else "gray"
        net = ("BGR" if self.bgr else "RGB") if self.channels == 3 else "gray"
        return {"pixels": f"uint8 NHWC {given}", "channels": net, "swapped": self.swapped,
                "raw_scale": float(self.raw_scale),
                "mean": None if self.mean is None else list(np.shape(self.mean)),
                "scale": None if self.scale is None else [float(v) for v in np.ravel(self.scale)]}


def pixel_nodes(graph, pixels: str, net_input: str, steps: PixelSteps) -> str:
    """The nodes from graph input `pixels` to the net's input values; the name of the last value (the net's input)."""
    pb_float = 1  # TensorProto.FLOAT
    value = graph.unique(f"{net_input}/pixels_float")
    graph.node("Cast", [pixels], [value], name=f"{net_input}/cast", to=pb_float)
    nchw = graph.unique(f"{net_input}/pixels_nchw")
    graph.node("Transpose", [value], [nchw], name=f"{net_input}/transpose", perm=[0, 3, 1, 2])
    value = nchw
    if steps.swapped:
        order = graph.initializer(f"{net_input}/channel_order", np.array([2, 1, 0], dtype=np.int64))
        swapped = graph.unique(f"{net_input}/channels_swapped")
        graph.node("Gather", [value, order], [swapped], name=f"{net_input}/channel_swap", axis=1)
        value = swapped
    constants = [("Div", "fraction", np.array(255, np.float32)), ("Mul", "raw_scale", np.float32(steps.raw_scale)),
                 ("Sub", "mean", steps.mean), ("Mul", "scale", steps.scale)]
    for op, what, constant in constants:
        if constant is None:
            continue
        array = np.asarray(constant, dtype=np.float32)
        if array.ndim == 3:
            array = array[None]  # over N x C x H x W
        name = graph.initializer(f"{net_input}/{what}", array)
        out = graph.unique(f"{net_input}/{what}_applied")
        graph.node(op, [value, name], [out], name=f"{net_input}/{what}")
        value = out
    return value
