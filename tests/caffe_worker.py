"""Runs nets in real Caffe (pycaffe) for tests/caffeoracle.py; started under Debian's /usr/bin/python3.

Reads one JSON request a line on standard input:
    {"prototxt": PATH, "weights": PATH or null, "inputs": NPZ PATH, "out": NPZ PATH}
reshapes each input blob named in the inputs file to its array's shape, runs
net.forward() in the TEST phase, writes every blob of net.blobs (Caffe's own
names, Split blobs included) to `out`, and answers one line:
    @@ {"ok": true, "blobs": [names in net.blobs order]}
A net Caffe refuses ends this process (glog's CHECK aborts); the caller reads
the reason from its standard error. Lines of the protocol start with "@@ " so
that whatever Caffe prints on standard output is told apart.
"""

import json
import sys

import numpy as np

import caffe


def answer(obj):
    sys.stdout.write("@@ " + json.dumps(obj) + "\n")
    sys.stdout.flush()


def run(request):
    if request["weights"]:
        net = caffe.Net(request["prototxt"], request["weights"], caffe.TEST)
    else:
        net = caffe.Net(request["prototxt"], caffe.TEST)
    with np.load(request["inputs"]) as feeds:
        inputs = {name: feeds[name] for name in feeds.files}
    for name, value in inputs.items():
        net.blobs[name].reshape(*value.shape)
    if inputs:
        net.reshape()
    for name, value in inputs.items():
        net.blobs[name].data[...] = value
    net.forward()
    blobs = {name: np.array(blob.data, dtype=np.float32) for name, blob in net.blobs.items()}
    np.savez(request["out"], **blobs)
    return list(net.blobs.keys())


def main():
    caffe.set_mode_cpu()
    answer({"ready": True, "types": list(caffe.layer_type_list())})
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        request = json.loads(line)
        try:
            names = run(request)
        except Exception as exc:  # pycaffe's own errors (a blob name it lacks); CHECKs abort instead
            answer({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            continue
        answer({"ok": True, "blobs": names})


if __name__ == "__main__":
    main()
