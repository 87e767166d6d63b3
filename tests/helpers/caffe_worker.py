"""Runs nets in real Caffe (pycaffe) for tests/helpers/caffeoracle.py; started under Debian's /usr/bin/python3.

Reads one JSON request a line on standard input:
    {"prototxt": PATH, "weights": PATH or null, "inputs": NPZ PATH, "out": NPZ PATH}
reshapes each input blob named in the inputs file to its array's shape, runs
net.forward() in the TEST phase, writes every blob of net.blobs (Caffe's own
names, Split blobs included) to `out`, and answers one line:
    @@ {"ok": true, "blobs": [names in net.blobs order]}
Each net runs in a child forked from this process (Caffe imported once), so
that a net Caffe refuses (glog's CHECK aborts the process) ends the child
only; the answer then says so, with the child's exit and the lines it wrote
on standard error:
    @@ {"ok": false, "refused": true, "code": N, "stderr": "..."}
Lines of the protocol start with "@@ " so that whatever Caffe prints on
standard output is told apart.
"""

import json
import os
import sys
import tempfile
import zipfile

import numpy as np

import caffe


def answer(obj):
    sys.stdout.write("@@ " + json.dumps(obj) + "\n")
    sys.stdout.flush()


def save_arrays(path, arrays):
    """An .npz of `arrays` by name; np.savez(**arrays) would take a blob named `file` or `like` as its own argument."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, value in arrays.items():
            with archive.open(name + ".npy", "w") as member:
                np.lib.format.write_array(member, np.asarray(value))


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
    save_arrays(request["out"], {name: np.array(blob.data, dtype=np.float32) for name, blob in net.blobs.items()})
    return list(net.blobs.keys())


def in_child(request):
    """Run one request in a forked child; its answer, or the refusal that ended it."""
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as reply:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.dup2(err.fileno(), 2)
            try:
                names = run(request)
                result = {"ok": True, "blobs": names}
            except Exception as exc:  # pycaffe's own errors (a blob name it lacks); CHECKs abort instead
                result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            os.write(reply.fileno(), json.dumps(result).encode())
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        reply.seek(0)
        answered = reply.read()
        if code == 0 and answered:
            return json.loads(answered)
        err.seek(0)
        return {"ok": False, "refused": True, "code": code, "stderr": err.read().decode("utf-8", "replace")}


def main():
    caffe.set_mode_cpu()
    answer({"ready": True, "types": list(caffe.layer_type_list())})
    for line in sys.stdin:
        line = line.strip()
        if line:
            answer(in_child(json.loads(line)))


if __name__ == "__main__":
    main()
