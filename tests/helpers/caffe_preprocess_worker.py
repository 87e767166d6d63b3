"""Runs under /usr/bin/python3 with pycaffe: caffe.io's preprocessing of the cases a test asks for.

argv: a JSON file of requests, an .npz of the images (``image<i>``) and the
.npz to write (``out<k>`` per request). A request is either
{"kind": "transformer", "image": i, "shape": [C, H, W], "swap": bool,
"raw_scale": f or null, "mean": list or null, "mean_image": key or null,
"input_scale": f or null} (Transformer.preprocess of image i, which has the
input's size), {"kind": "resize", "image": i, "size": [h, w]}
(caffe.io.resize_image: skimage's, as pycaffe resized), or
{"kind": "classifier", "prototxt", "weights", "images": [i...],
"image_dims": [h, w], "oversample": bool, "swap", "raw_scale", "mean",
"input_scale"} (caffe.Classifier's predictions; with oversample, its crops
run and averaged as its predict does, whose reshape by len / 10 fails on
Python 3).
"""

import json
import sys

import numpy as np

import caffe
import caffe.io


def transformer(shape, request, arrays):
    t = caffe.io.Transformer({"data": (1,) + tuple(shape)})
    t.set_transpose("data", (2, 0, 1))
    if request.get("swap"):
        t.set_channel_swap("data", (2, 1, 0))
    if request.get("raw_scale") is not None:
        t.set_raw_scale("data", request["raw_scale"])
    if request.get("mean_image"):
        t.set_mean("data", arrays[request["mean_image"]])
    elif request.get("mean") is not None:
        t.set_mean("data", np.array(request["mean"]))
    if request.get("input_scale") is not None:
        t.set_input_scale("data", request["input_scale"])
    return t


def classify(request, images):
    net = caffe.Classifier(request["prototxt"], request["weights"], image_dims=tuple(request["image_dims"]),
                           mean=None if request.get("mean") is None else np.array(request["mean"]),
                           input_scale=request.get("input_scale"), raw_scale=request.get("raw_scale"),
                           channel_swap=(2, 1, 0) if request.get("swap") else None)
    inputs = [images[i] for i in request["images"]]
    if not request["oversample"]:
        return net.predict(inputs, oversample=False)
    resized = np.zeros((len(inputs),) + tuple(net.image_dims) + (inputs[0].shape[2],), np.float32)
    for ix, image in enumerate(inputs):
        resized[ix] = caffe.io.resize_image(image, net.image_dims)
    crops = caffe.io.oversample(resized, net.crop_dims)
    name = net.inputs[0]
    batch = np.stack([net.transformer.preprocess(name, c) for c in crops])
    out = net.forward_all(**{name: batch})[net.outputs[0]]
    return out.reshape(len(inputs), 10, -1).mean(1)


def main():
    requests = json.load(open(sys.argv[1]))
    arrays = dict(np.load(sys.argv[2]))
    images = {int(k[5:]): v for k, v in arrays.items() if k.startswith("image")}
    out = {}
    for k, request in enumerate(requests):
        if request["kind"] == "transformer":
            t = transformer(request["shape"], request, arrays)
            # A copy: on a float32 image of the input's size, preprocess scales the caller's array in place.
            out[f"out{k}"] = t.preprocess("data", images[request["image"]].copy())
        elif request["kind"] == "resize":
            out[f"out{k}"] = caffe.io.resize_image(images[request["image"]], tuple(request["size"]))
        else:
            out[f"out{k}"] = classify(request, images)
    np.savez(sys.argv[3], **out)


main()
