"""blobtool export writes ONNX models where neither onnx nor onnxruntime can be imported.

blobtool writes ONNX's messages with classes of its own (blobtool/_pb/blobtool_onnx_pb2,
docs/onnx.md): only `--check` needs the `onnx` extra. Each case runs in a real
process whose import system cannot find onnx and onnxruntime (sys.path's finder
on sys.meta_path swapped for one blind to them, as if they were not installed:
`import onnx` fails and importlib.util.find_spec finds nothing, while every
other package is found as usual); the process checks that of itself
before it runs the command. The model it writes is read back with blobtool's
own schema (the oracle where onnx is absent) and compared byte for byte with
the model this process writes; `--check` there is one line and exit 2.

This file imports neither onnx nor onnxruntime, so it runs where they are
missing (the oldest protobuf CI tests), unlike the other export tests.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from blobtool._pb import blobtool_onnx_pb2 as onnx_pb
from caffenets import small_net, write_net_files
from runner import invoke, subprocess_env

# Started before anything else in the child: refuses the blocked modules, proves it, then runs `MAIN`.
PRELUDE = """
import importlib.abc, importlib.machinery, json, sys

BLOCKED = {blocked!r}


class NotInstalled(importlib.abc.MetaPathFinder):
    # sys.path's finder, blind to the blocked packages: for them the search ends with nothing found.

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)

    def invalidate_caches(self):
        importlib.machinery.PathFinder.invalidate_caches()


sys.meta_path[:] = [NotInstalled() if finder is importlib.machinery.PathFinder else finder
                    for finder in sys.meta_path]
for name in BLOCKED:
    sys.modules.pop(name, None)
    try:
        __import__(name)
    except ImportError:
        pass
    else:
        sys.exit(f"{{name}} was imported: the stand-in for a missing module failed")
"""

RUN_COMMAND = """
import runpy
sys.argv = ["blobtool", *sys.argv[1:]]
runpy.run_module("blobtool", run_name="__main__", alter_sys=True)
"""

RUN_LIBRARY = """
import blobtool
result, verdict = blobtool.export(sys.argv[1], sys.argv[2], shapes={"data": (2, 3, 7, 7)})
print(json.dumps({"outputs": result.outputs, "nodes": result.nodes, "verdict": verdict,
                  "imported": sorted(n for n in sys.modules if n.split(".")[0] in BLOCKED)}))
"""

BOTH = ("onnx", "onnxruntime")


def without(blocked, main: str, *args) -> subprocess.CompletedProcess:
    """Run `main` (Python) in a process where the modules in `blocked` cannot be imported, with `args` as argv."""
    code = PRELUDE.format(blocked=tuple(blocked)) + main
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          env=subprocess_env(), timeout=120)


def small_files(folder):
    """caffenets' small net (a convolution, a ReLU, a pooling, an inner product, a softmax) as files."""
    return write_net_files(folder, small_net())


def unknown_fields(message) -> int:
    """How many fields, in `message` and every message inside it, its schema does not know."""
    try:
        from google.protobuf.unknown_fields import UnknownFieldSet  # protobuf 4.22 and newer

        count = len(UnknownFieldSet(message))
    except ImportError:  # older: the message's own accessor
        count = len(message.UnknownFields())
    for descriptor, value in message.ListFields():
        if descriptor.message_type is None:
            continue
        repeated = (descriptor.is_repeated if hasattr(descriptor, "is_repeated")  # protobuf 6.32 and newer
                    else descriptor.label == descriptor.LABEL_REPEATED)
        if repeated:
            count += sum(unknown_fields(each) for each in value)
        else:
            count += unknown_fields(value)
    return count


def read_model(path) -> onnx_pb.ModelProto:
    """The file parsed by blobtool's own ONNX schema; every field must be one it knows."""
    model = onnx_pb.ModelProto()
    model.ParseFromString(path.read_bytes())
    assert unknown_fields(model) == 0, "the model holds fields blobtool's schema does not know"
    return model


def assert_small_model(model: onnx_pb.ModelProto) -> None:
    """The small net's graph as export writes it: its input, output, weights, nodes and opset."""
    graph = model.graph
    assert [i.name for i in graph.input] == ["data"] and [o.name for o in graph.output] == ["prob"]
    assert [d.dim_value for d in graph.input[0].type.tensor_type.shape.dim] == [2, 3, 7, 7]
    assert [d.dim_value for d in graph.output[0].type.tensor_type.shape.dim] == [2, 5]
    assert [t.name for t in graph.initializer][:4] == ["conv1/0", "conv1/1", "ip1/0", "ip1/1"]
    weight = graph.initializer[0]
    assert weight.data_type == onnx_pb.TensorProto.FLOAT and list(weight.dims) == [4, 3, 3, 3]
    ops = [n.op_type for n in graph.node]
    assert {"Conv", "Relu", "AveragePool", "Softmax"} <= set(ops), ops
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert model.ir_version > 0 and model.producer_name == "blobtool"


def test_the_command_writes_the_model_where_onnx_cannot_be_imported(tmp_path):
    _, caffemodel = small_files(tmp_path)
    out = tmp_path / "small.onnx"
    done = without(BOTH, RUN_COMMAND, "export", caffemodel, "-o", out, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outputs"] == {"prob": [2, 5]}
    assert_small_model(read_model(out))
    # The same bytes as the model this process writes (where onnx may well be importable).
    here = tmp_path / "here.onnx"
    assert invoke("export", caffemodel, "-o", here).exit_code == 0
    assert out.read_bytes() == here.read_bytes()


def test_the_library_writes_the_model_without_importing_onnx(tmp_path):
    _, caffemodel = small_files(tmp_path)
    out = tmp_path / "small.onnx"
    done = without(BOTH, RUN_LIBRARY, caffemodel, out)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record == {"outputs": {"prob": [2, 5]}, "nodes": record["nodes"], "verdict": None, "imported": []}
    assert record["nodes"] == len(read_model(out).graph.node)
    assert_small_model(read_model(out))


@pytest.mark.parametrize("blocked", [BOTH, ("onnxruntime",), ("onnx",)], ids=["both", "onnxruntime", "onnx"])
def test_check_says_what_is_missing_in_one_line_exit_2_and_writes_nothing(tmp_path, blocked):
    import importlib.util

    # What the process lacks: what is blocked there, and what this environment has not installed at all.
    absent = [name for name in BOTH if name in blocked or importlib.util.find_spec(name) is None]
    missing = " and ".join(absent)
    _, caffemodel = small_files(tmp_path)
    out = tmp_path / "small.onnx"
    done = without(blocked, RUN_COMMAND, "export", caffemodel, "-o", out, "--check")
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [f"blobtool: --check needs {missing}: pip install 'blobtool[onnx]' "
                                        "(onnx and onnxruntime, which need protobuf 4.25 or newer)"]
    assert not out.exists() and set(tmp_path.iterdir()) == {tmp_path / "net.prototxt", caffemodel}
