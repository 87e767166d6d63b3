"""Images in, answers out: predict runs a net on images, preprocessed as Caffe's users did (preprocessing.py).

predict(net, images, ...) decodes each image (formats/images.py), makes
it the net's input (preprocess: pycaffe's Transformer, in Caffe's order),
runs the deploy net `run` runs in batches of the net's batch size, and
answers by what the net ends in (answers.py). The settings not given come
from the net's own data layer's transform_param (scale, mean_value); a
mean_file it names is not opened (a file names only itself): a note says
to give it as `mean`.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import BlobToolError, UsageError
from . import answers
from .common import opened_net
from .preprocessing import Preprocessing, opencv_gray, preprocess

__all__ = ["predict", "PredictResult", "settings_from_net", "decoded_channels", "read_mean", "stacked_outputs", "write_outputs",
           "picture_paths", "save_picture", "pixel_steps"]


@dataclass
class PredictResult:
    """What predict found: one record per image (in order), the net inputs made, the outputs, what was said."""

    records: list                               # {"image", "size", "input", "preprocessing", "answer"} or an "error"
    inputs: list                                # per image: its net input (crops x C x H x W float32), or None
    outputs: list                               # per image: {blob: values} (a classifier's averaged over crops)
    settings: Preprocessing = None
    kind: str = ""                              # classes, detections, segmentation or blobs
    classmaps: list = field(default_factory=list)   # per image: a segmentation's class map, or None
    images: list = field(default_factory=list)      # per image: its Decoded, or None
    notes: list = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum("error" in r for r in self.records)


def read_mean(value, channels: int) -> tuple:
    """(mean, where it came from): per-channel values as given, or a mean image read from a .binaryproto or .npy."""
    if value is None:
        return None, ""
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        if not os.path.exists(text) and all(_is_number(v) for v in text.split(",")):
            return [float(v) for v in text.split(",")], ""
        from .blobs import load

        blob = load(text)
        array = np.array(blob.data, dtype=np.float32).reshape(blob.shape)
        if array.ndim == 4 and array.shape[0] == 1:
            array = array[0]
        return array, text
    return value, ""


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def settings_from_net(transforms: list, given: dict, channels: int, decoded: tuple = ("", ""),
                      baked: bool = False) -> tuple:
    """(Preprocessing, notes): `given` ({field: value or None}) with the data layer's transform_param for those not given.

    `decoded` ("gray" or "colour", and the setting that says so, as
    `decoded_channels` finds them): followed where the net's input has those
    channels, else a note says the input's channels are followed instead.
    `baked`: the notes are export's, whose model takes pixels of the
    input's size.
    """
    notes = []
    stated = dict(transforms[0][1]) if transforms else {}
    layer = transforms[0][0] if transforms else ""
    values = dict(given)
    if values.get("scale") is None and "scale" in stated:
        values["scale"] = stated["scale"]
        notes.append(f"scale {stated['scale']:g} from data layer {layer}'s transform_param")
    if values.get("mean") is None and stated.get("mean_value"):
        values["mean"] = list(stated["mean_value"])
        notes.append(f"mean {','.join(f'{v:g}' for v in stated['mean_value'])} from data layer {layer}'s "
                     "transform_param")
    if values.get("mean") is None and stated.get("mean_file"):
        notes.append(f"data layer {layer} subtracted mean_file {stated['mean_file']}, which is not opened here: "
                     "give it with --mean FILE")
    if stated.get("crop_size") and baked:
        notes.append(f"data layer {layer} cropped {stated['crop_size']}x{stated['crop_size']} from larger images: "
                     "the model takes pixels of the crop's size, which the caller crops (or resizes) to")
    elif stated.get("crop_size") and not values.get("resize"):
        notes.append(f"data layer {layer} cropped {stated['crop_size']}x{stated['crop_size']} from larger images: "
                     "--resize H,W (the training images' size) does the same; here the image is resized to the input")
    mean, source = read_mean(values.get("mean"), channels)
    raw = values.get("raw_scale")
    settings = Preprocessing(mean=mean, scale=values.get("scale"), raw_scale=255.0 if raw is None else float(raw),
                             rgb=bool(values.get("rgb")), resize=values.get("resize"),
                             oversample=bool(values.get("oversample")), mean_source=source, channels=channels)
    if stated.get("mirror"):
        settings.mirror_by = f"data layer {layer}'s transform_param"
    forced, by = decoded
    if forced and (forced == "gray") == (channels == 1):
        settings.forced, settings.forced_by = forced, by
    elif forced:
        notes.append(f"{by} decodes images to {forced}, but the net's input has {channels} channel"
                     f"{'s' * (channels != 1)}: the images are made {'gray' if channels == 1 else 'colour'} "
                     "as the input takes them")
    return settings, notes


def decoded_channels(doc) -> tuple:
    """("gray" or "colour", the setting that says so) of the net's first data layer that decodes to one; ("", "") else.

    Caffe's data layers decode images in colour unless told: transform_param's
    force_color or force_gray (a Data layer's encoded images),
    image_data_param's is_color (ImageData, colour by default).
    """
    for kind, message in _data_layers(doc):
        p = message.transform_param
        if message.HasField("transform_param") and (p.force_gray or p.force_color):
            what = "force_gray" if p.force_gray else "force_color"
            return ("gray" if p.force_gray else "colour"), f"{what} of data layer {message.name}"
        if kind == "ImageData" and message.HasField("image_data_param"):
            colour = message.image_data_param.is_color
            if message.image_data_param.HasField("is_color"):
                return ("colour" if colour else "gray"), f"is_color: {str(colour).lower()} of data layer {message.name}"
    return "", ""


def _data_layers(doc) -> list:
    """(type, LayerParameter) of each data layer of the net's definition (none for an HDF5 snapshot)."""
    from ..net.layertypes import deploy_role
    from ..net.model import model

    if doc.kind != "net" or doc.format == "hdf5":
        return []
    net = model(doc)
    return [(kind, message) for kind, message in zip(net.types, net.layer_defs()) if deploy_role(kind) == "data"]


def _cropped_inputs(doc) -> dict:
    """{top: (1, C, crop, crop)} of each data layer whose transform_param states a crop_size (C: 1 decoded gray)."""
    found = {}
    for kind, message in _data_layers(doc):
        if not message.HasField("transform_param") or not message.top:
            continue
        p = message.transform_param
        gray = p.force_gray or (kind == "ImageData" and not message.image_data_param.is_color)
        if p.crop_size:
            found.setdefault(message.top[0], (1, 1 if gray else 3, p.crop_size, p.crop_size))
    return found


def _image_input(program, source) -> tuple:
    """(name, shape) of the net's one image input: N x C x H x W with C 1 or 3."""
    if len(program.inputs) != 1:
        raise UsageError(f"predict feeds a net of one input; this one has {len(program.inputs)} "
                         f"({', '.join(program.inputs)})", path=source)
    (name, shape), = program.inputs.items()
    if len(shape) != 4 or shape[1] not in (1, 3):
        raise UsageError(f"input {name!r} has shape {tuple(shape)}: predict feeds images to an input of N x C x H x "
                         "W with 1 or 3 channels", path=source)
    return name, tuple(shape)


def predict(src, images, *, definition=None, mean=None, scale=None, raw_scale=None, rgb: bool = False,
            resize=None, oversample: bool = False, labels=None, top: int = 5, threshold: float = 0.5,
            shapes: dict | None = None, warn=None, progress=None) -> PredictResult:
    """Run the net in `src` on `images`; a PredictResult with one record per image (see the module).

    `images`: paths of image files (folders' image files included), or
    H x W x K arrays (RGB; float in [0, 1] or integers). `mean`: per-channel
    values, a mean image array, or a file (.binaryproto, .npy) of one;
    `scale`: one factor or one per channel; `raw_scale` (default 255), `rgb`,
    `resize` ((height, width)), `oversample`: preprocess's. `labels`: names,
    or a labels file; `top`: how many classes; `threshold`: the least score
    of a box kept. An image that cannot be read is a record with its
    "error" (the rest go on); bad settings are a UsageError before any image
    is read. `progress(done, total)` is called after each batch, with the
    crops run and to run. `shapes` ({input: shape}) as `run` takes them; a
    data layer that states no shape takes 1 x C x crop x crop from its
    transform_param's crop_size.
    """
    from ..forward.run import prepare_net

    names = answers.read_labels(labels) if isinstance(labels, (str, os.PathLike)) else labels
    given = {"mean": mean, "scale": scale, "raw_scale": raw_scale, "rgb": rgb,
             "resize": tuple(resize) if resize else None, "oversample": oversample}
    with contextlib.ExitStack() as opened:
        doc, other = opened_net(opened, src, definition, warn)
        deploy, program, wanted = prepare_net(doc, other, shapes, given=_cropped_inputs(other or doc))
        name, shape = _image_input(program, deploy.source)
        settings, notes = settings_from_net(deploy.transforms, given, shape[1], decoded_channels(other or doc))
        shapes = program.shapes
        writers = {t: s.layer.type for s in program.steps for t in s.tops}
        kind = answers.answer_kind({n: tuple(shapes[n][1:]) for n in wanted}, writers)
        if oversample and kind != "classes":
            raise UsageError(f"--oversample averages a classifier's scores over 10 crops; this net's answer is "
                             f"{kind}", path=deploy.source)
        _check_settings(settings, shape)
        result = PredictResult([], [], [], settings, kind, notes=notes)
        decoded = _decode_all(images, shape, settings, result)
        _run_batches(program, name, shape, wanted, result, decoded, progress)
    _answer_all(result, wanted, names, top, threshold)
    return result


def _check_settings(settings: Preprocessing, shape: tuple) -> None:
    """UsageError, before any image is read, for a mean or scale that does not fit the input."""
    from .preprocessing import mean_for, scale_for

    if settings.oversample and not settings.resize:
        raise UsageError("oversample takes its 10 crops from the resized image: give resize (height, width)")
    size = tuple(settings.resize) if settings.resize else shape[2:]
    if any(a < b for a, b in zip(size, shape[2:])):
        raise UsageError(f"resize {size[0]}x{size[1]} is smaller than the net's input {shape[2]}x{shape[3]}, which "
                         "is cropped from it")
    scale_for(settings.scale, shape[1])
    mean = settings.mean
    if mean is not None and np.ndim(mean) >= 3 and tuple(np.shape(mean)[-2:]) == size:
        return  # a mean of the resized image's size: subtracted before the crops
    mean_for(mean, shape[1], shape[2:])


def _decode_all(images, shape, settings, result) -> list:
    """Each image's net input made, or its error recorded: [(index, Decoded, input)]; result's lists filled."""
    from ..formats.images import Decoded, decode_image, image_files

    items = list(images) if not isinstance(images, (str, os.PathLike)) else [images]
    if any(isinstance(i, (str, os.PathLike)) for i in items):
        from ..formats.images import pillow

        pillow()  # a missing extra is one usage error, not an error for every image
    made = []
    for item in items:
        sources = image_files([item]) if isinstance(item, (str, os.PathLike)) else [item]
        if not sources:
            result.records.append({"image": os.fspath(item), "error": f"{os.fspath(item)}: no image files (JPEG, "
                                   "PNG, BMP, TIFF, WebP) in the folder", "exit_code": 3})
            result.inputs.append(None)
            result.images.append(None)
        for each in sources:
            index = len(result.records)
            try:
                image = decode_image(each) if isinstance(each, (str, os.PathLike)) else Decoded(
                    f"image {index}", np.asarray(each), "array")
                pixels = image.pixels
                if settings.forced == "gray" and shape[1] == 1:  # the file asks for OpenCV's 8-bit gray
                    pixels = opencv_gray(pixels, image.format)
                net_input = preprocess([pixels], shape, settings)
            except BlobToolError as exc:
                where = os.fspath(each) if isinstance(each, (str, os.PathLike)) else f"image {index}"
                result.records.append({"image": where, "error": exc.args[0] if exc.args else str(exc),
                                       "exit_code": int(exc.exit_code)})
                result.inputs.append(None)
                result.images.append(None)
                continue
            result.records.append({"image": image.path, "size": list(image.size), "mode": image.mode,
                                   "decoded": image.notes, "input": list(net_input.shape)})
            result.inputs.append(net_input)
            result.images.append(image)
            made.append((index, image, net_input))
    return made


def _run_batches(program, name, shape, wanted, result, made, progress) -> None:
    """The crops of every image run in batches of the net's batch size; each image's outputs kept by image."""
    crops = [(index, k) for index, _, net_input in made for k in range(len(net_input))]
    batch = shape[0]
    per_crop: dict = {}
    for start in range(0, len(crops), batch):
        chunk = crops[start:start + batch]
        values = np.zeros(shape, dtype=np.float32)
        for row, (index, k) in enumerate(chunk):
            values[row] = result.inputs[index][k]
        out = program.run({name: values}, wanted)
        for row, key in enumerate(chunk):
            per_crop[key] = {n: _row_of(v, row, batch, result.kind) for n, v in out.items()}
        if progress is not None:
            progress(start + len(chunk), len(crops))
    result.outputs = [None] * len(result.records)
    for index, _, net_input in made:
        outs = [per_crop[(index, k)] for k in range(len(net_input))]
        result.outputs[index] = {n: np.mean([o[n] for o in outs], axis=0) if len(outs) > 1 else outs[0][n]
                                 for n in wanted}


def _row_of(value: np.ndarray, row: int, batch: int, kind: str) -> np.ndarray:
    """One batch row's share of an output: its row, or for DetectionOutput the rows of its image id, set to 0."""
    if kind == "detections" and value.ndim == 4 and value.shape[-1] == 7:
        rows = value.reshape(-1, 7)
        mine = rows[rows[:, 0] == row].copy()
        mine[:, 0] = 0
        return mine.reshape(1, 1, -1, 7)
    return value[row:row + 1] if value.shape and value.shape[0] == batch else value


def _answer_all(result, wanted, names, top, threshold) -> None:
    """Each image's answer by the net's kind; a segmentation's class map kept for drawing."""
    result.classmaps = [None] * len(result.records)
    for index, record in enumerate(result.records):
        outs = result.outputs[index] if index < len(result.outputs) else None
        if outs is None:
            continue
        record["preprocessing"] = result.settings.record()
        first = outs[wanted[0]]
        if result.kind == "classes":
            record["answer"] = answers.classes(first[0], names, top)
        elif result.kind == "detections":
            det = next(n for n in wanted if outs[n].ndim == 4 and outs[n].shape[-1] == 7)
            record["answer"] = answers.detections(outs[det], 0, result.images[index].size, names, threshold)
        elif result.kind == "segmentation":
            record["answer"], result.classmaps[index] = answers.segmentation(first[0], names)
        else:
            record["answer"] = answers.summaries(outs)


def stacked_outputs(result: PredictResult) -> dict:
    """{blob: values} of every image read, as one run of them would give: rows stacked in image order.

    DetectionOutput's rows are concatenated with their image id set to the
    image's place among those read.
    """
    done = [o for o in result.outputs if o is not None]
    if not done:
        return {}
    out = {}
    for name in done[0]:
        parts = [o[name] for o in done]
        if result.kind == "detections" and parts[0].ndim == 4 and parts[0].shape[-1] == 7:
            rows = []
            for place, part in enumerate(parts):
                part = part.reshape(-1, 7).copy()
                part[:, 0] = place
                rows.append(part)
            out[name] = np.concatenate(rows).reshape(1, 1, -1, 7)
        else:
            out[name] = np.concatenate(parts)
    return out


def write_outputs(result: PredictResult, dest) -> None:
    """The raw outputs (stacked_outputs) written to an .npz at `dest`, atomically, as `run -o` writes them."""
    from ..formats.numpy import save_arrays

    save_arrays(stacked_outputs(result), dest, fmt="npz")


def picture_paths(result: PredictResult, out) -> list:
    """Where each image's picture goes: `out` itself for one image (a file), else `out`/<stem>.png (a folder made).

    Two images of one stem (a.jpg and a.png) get their index added.
    """
    out = os.fspath(out)
    done = [r for r in result.records if "error" not in r]
    if len(result.records) == 1 and not os.path.isdir(out):
        return [out] if done else [None]
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"{len(result.records)} images draw {len(result.records)} pictures: -o names a folder, and "
                         "this is a file", path=out)
    from ..errors import OutputError

    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the folder ({exc.strerror})", path=out) from exc
    paths, seen = [], set()
    for index, record in enumerate(result.records):
        if "error" in record:
            paths.append(None)
            continue
        stem = os.path.splitext(os.path.basename(record["image"]))[0] or f"image{index}"
        name = f"{stem}.png" if stem not in seen else f"{stem}.{index}.png"
        seen.add(stem)
        paths.append(os.path.join(out, name))
    return paths


def save_picture(picture, dest) -> None:
    """A PIL image written to `dest` atomically, in the format its extension names (PNG where it names none)."""
    from ..files import atomic_output

    ext = os.path.splitext(os.fspath(dest))[1].lower().lstrip(".")
    fmt = {"jpg": "JPEG", "jpeg": "JPEG", "bmp": "BMP", "tif": "TIFF", "tiff": "TIFF", "webp": "WEBP"}.get(ext, "PNG")
    with atomic_output(dest) as stream:
        picture.save(stream, format=fmt)


def pixel_steps(preprocess, deploy, program) -> tuple:
    """({input: PixelSteps}, notes) for export's --preprocess: `preprocess` True (the net's defaults) or options.

    `preprocess` holds predict's mean, scale, raw_scale and rgb, and
    `pixels` ("RGB", the default, or "BGR": the order of the pixels the
    model is given) (a dict); the pixels come at the input's own size and
    channels, so resize and oversample are refused, and a data layer's
    force_gray or force_color is the caller's.
    """
    from ..onnxport.pixels import PixelSteps
    from .preprocessing import mean_for, scale_for

    given = dict(preprocess) if isinstance(preprocess, dict) else {}
    order = str(given.pop("pixels", None) or "RGB").upper()
    if order not in ("RGB", "BGR"):
        raise UsageError(f"pixels {order!r}: the pixels' channel order is RGB or BGR")
    for what in ("resize", "oversample"):
        if given.get(what):
            raise UsageError(f"an exported model takes pixels of the input's size: {what} stays with the caller")
    name, shape = _image_input(program, deploy.source)
    settings, notes = settings_from_net(deploy.transforms, given, shape[1], baked=True)
    mean = mean_for(settings.mean, shape[1], shape[2:])
    steps = PixelSteps(shape[1], settings.raw_scale, not settings.rgb, mean, scale_for(settings.scale, shape[1]),
                       pixels=order)
    stated = dict(deploy.transforms[0][1]) if deploy.transforms else {}
    forced = [k for k in ("force_gray", "force_color") if stated.get(k)]
    if forced:  # the model is given pixels already of the input's channels: decoding them is the caller's
        notes.append(f"data layer {deploy.transforms[0][0]}'s {forced[0]} decoded its images "
                     f"{'gray' if forced[0] == 'force_gray' else 'in colour'}: the model takes {shape[1]}-channel "
                     "pixels, decoded so by the caller")
    said = "one gray channel" if shape[1] == 1 else f"{order} order"
    line = settings.line().replace("RGB -> BGR" if steps.bgr else "RGB kept", _order_step(steps), 1)
    return {name: steps}, notes + [f"{name}: the model takes uint8 pixels, N x H x W x C in {said} "
                                   f"({'x'.join(map(str, steps.pixel_shape(shape)))}); " + line]


def _order_step(steps) -> str:
    """The channel step of export's preprocessing line: from the pixels' order to the net's."""
    net = "BGR" if steps.bgr else "RGB"
    return f"{steps.pixels} -> {net}" if steps.swapped else f"{net} kept"
