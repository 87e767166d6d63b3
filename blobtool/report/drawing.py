"""predict's answers drawn on their images with Pillow: boxes, a class map with its legend, the top classes.

Nothing is computed here: the answer (api/answers.py) holds the boxes in
the image's pixels, the classes and their shares; the class map is drawn
at the image's size (nearest neighbour: a class is never blended into its
neighbour's). Colours are a fixed palette by class index, so one class has
one colour in every picture.
"""

from __future__ import annotations

import numpy as np

__all__ = ["draw_answer", "PALETTE"]

# Distinct, readable on photos; class k takes PALETTE[k % len(PALETTE)].
PALETTE = ((230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180),
           (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128), (220, 190, 255),
           (170, 110, 40), (255, 250, 200), (128, 0, 0), (170, 255, 195), (128, 128, 0), (255, 215, 180),
           (0, 0, 128), (128, 128, 128))

# How much of the class map's colour shows over the photo.
_BLEND = 0.5


def _name(entry: dict) -> str:
    return entry.get("label") or f"class {entry['class']}"


def draw_answer(pixels: np.ndarray, answer: dict, classmap: np.ndarray | None = None):
    """A PIL image of `pixels` (H x W x K in [0, 1]) with `answer` drawn on it."""
    from PIL import Image, ImageDraw

    values = np.clip(np.asarray(pixels, dtype=np.float32) * 255 + 0.5, 0, 255).astype(np.uint8)
    picture = Image.fromarray(values[:, :, 0] if values.shape[2] == 1 else values).convert("RGB")
    kind = answer["kind"]
    if kind == "segmentation" and classmap is not None:
        picture = _blend_map(picture, classmap)
        _legend(ImageDraw.Draw(picture), [(f"{_name(c)} {c['share'] * 100:.1f}%", c["class"])
                                          for c in answer["classes"]])
    elif kind == "detections":
        draw = ImageDraw.Draw(picture)
        for box in answer["boxes"]:
            colour = PALETTE[box["class"] % len(PALETTE)]
            draw.rectangle(box["box"], outline=colour, width=max(1, min(picture.size) // 150))
            draw.text((box["box"][0] + 2, box["box"][1] + 1), f"{_name(box)} {box['score']:.2f}", fill=colour)
    elif kind == "classes":
        word = answer["values"]
        _legend(ImageDraw.Draw(picture), [(f"{_name(c)} {c[word]:.3f}", None) for c in answer["top"]])
    return picture


def _blend_map(picture, classmap: np.ndarray):
    """The photo with each pixel's class colour over it, the map scaled to the photo by nearest neighbour."""
    from PIL import Image

    palette = np.array(PALETTE, dtype=np.uint8)
    colours = palette[np.asarray(classmap) % len(PALETTE)]
    overlay = Image.fromarray(colours).resize(picture.size, Image.NEAREST)
    return Image.blend(picture, overlay, _BLEND)


def _legend(draw, lines: list) -> None:
    """Lines of text at the top left, each on a dark band (with a swatch of its class's colour when given)."""
    y = 2
    for text, index in lines:
        left = 2
        width = int(draw.textlength(text)) + 6
        if index is not None:
            draw.rectangle([left, y, left + 10, y + 11], fill=PALETTE[index % len(PALETTE)])
            left += 13
        draw.rectangle([left, y, left + width, y + 12], fill=(0, 0, 0))
        draw.text((left + 3, y + 1), text, fill=(255, 255, 255))
        y += 14
