"""blobtool run against OpenCV's Caffe importer: a net's forward pass, whole process against whole process.

    python benchmarks/forward.py              # the standard run (about 1.2 GB of disk in $TMPDIR)
    python benchmarks/forward.py --smoke      # tiny nets, one repetition: checks the harness runs
    python benchmarks/forward.py --nets vgg16 --keep   # one net; its files kept, for profiling

It writes its own nets with random weights, each as a .caffemodel and a
deploy.prototxt (an Input layer, no blobs):

- resnet20: ResNet-20 for CIFAR-10 (3 stages of 3 basic blocks, 16/32/64
  channels; Convolution + BatchNorm + Scale + ReLU, Eltwise SUM shortcuts,
  1 x 1 stride-2 projections where the shape changes, global AVE pooling,
  InnerProduct 10, Softmax) at 256x3x32x32;
- mobilefacenet: MobileFaceNet's layout (depthwise convolutions as
  Convolution with group = channels, PReLU, BatchNorm + Scale, 1 x 1
  convolutions, residual bottlenecks, a linear global depthwise 7 x 7
  convolution, InnerProduct 128; about 1M parameters) at 16x3x112x112;
- vgg16: VGG-16 (13 3 x 3 convolutions with ReLU, 5 MAX pools, InnerProduct
  4096, 4096, 1000, Softmax: 138M parameters, 528 MiB of float32) at
  1x3x224x224; its caffemodel is written by hand, field by field, in chunks.

Each repetition starts two fresh processes per net, round-robin over the
nets (so a slow moment of the machine hits every case alike), and their
import and load times count:

- `python -m blobtool run MODEL --definition deploy.prototxt --input-shape data=... -o out.npz`;
- what a user of OpenCV writes: readNetFromCaffe(prototxt, caffemodel),
  the OpenCV backend on the CPU (layer fusion on, OpenCV's default),
  setInput of random normal values, forward, np.save.

Both draw the input from numpy's default_rng(0), so their outputs are
compared (the largest absolute difference of the last run's outputs, over
the largest absolute value of OpenCV's). The
report gives the median wall seconds, the median CPU seconds (user +
system), the peak RSS (the largest of the repetitions, from /usr/bin/time's
%M: the kernel's rusage of the child), blobtool's time over OpenCV's, and
blobtool's memory bound: the weights, plus the two largest blobs of the net,
plus 100 MiB. The table goes into benchmarks/RESULTS.md (or --out) as the
section "## blobtool run against OpenCV 4.x's forward", replacing that
section and keeping the rest of the file.
"""

from __future__ import annotations

import argparse
import compileall
import datetime
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from google.protobuf import text_format  # noqa: E402

from blobtool._pb import blobtool_caffe_pb2 as pb  # noqa: E402
from blobtool.formats.caffe.wire import len_field_header  # noqa: E402

MIB = 1 << 20
HEADING = "## blobtool run against OpenCV 4.x's forward"

# The goals: blobtool's whole process at most this many times OpenCV's, and
# its peak RSS at most the weights + the two largest blobs + this much (the
# interpreter, numpy, OpenCV-free imports, buffers).
TIME_GOAL = 2.0
MEMORY_SLACK_MIB = 100

# Random values are generated and written this many at a time, so that the
# 528 MiB of VGG-16 never sit in this harness's memory (its RSS would be
# charged to nothing measured, but the machine's page cache would lose it).
CHUNK_VALUES = 4 << 20

OPENCV_SCRIPT = """
import sys
import numpy as np
import cv2

prototxt, caffemodel, shape, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
net = cv2.dnn.readNetFromCaffe(prototxt, caffemodel)
net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
net.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU)
x = np.random.default_rng(0).standard_normal(tuple(int(d) for d in shape.split(",")), dtype=np.float32)
net.setInput(x)
np.save(out, net.forward())
"""


# -- nets ------------------------------------------------------------------------------------


@dataclass
class Recipe:
    """How one weight blob's values are drawn: normal (a = std, b = mean), uniform [a, b), or the constant a."""

    shape: tuple
    kind: str
    a: float
    b: float = 0.0

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    def draw(self, rng, n: int) -> np.ndarray:
        if self.kind == "normal":
            return rng.standard_normal(n, dtype=np.float32) * np.float32(self.a) + np.float32(self.b)
        if self.kind == "uniform":
            return rng.uniform(self.a, self.b, n).astype(np.float32)
        return np.full(n, self.a, np.float32)


@dataclass
class NetSpec:
    """A net as it is written: its layers (LayerParameter without blobs), their blobs' recipes, every top's shape."""

    name: str
    input_shape: tuple
    layers: list = field(default_factory=list)          # [(pb.LayerParameter, [Recipe])]
    shapes: dict = field(default_factory=dict)          # {blob name: shape}
    output: str = ""

    def __post_init__(self):
        self.shapes["data"] = tuple(self.input_shape)

    def add(self, type_: str, name: str, bottoms, top: str, shape, recipes=()) -> pb.LayerParameter:
        layer = pb.LayerParameter(name=name, type=type_)
        layer.bottom.extend(bottoms)
        layer.top.append(top)
        self.layers.append((layer, list(recipes)))
        self.shapes[top] = tuple(shape)
        self.output = top
        return layer

    # The layer kinds the three nets use; each returns its top's name.

    def conv(self, name, bottom, c_out, kernel, stride=1, pad=0, group=1, bias=False) -> str:
        n, c, h, w = self.shapes[bottom]
        fan_in = c // group * kernel * kernel
        recipes = [Recipe((c_out, c // group, kernel, kernel), "normal", math.sqrt(2 / fan_in))]
        if bias:
            recipes.append(Recipe((c_out,), "normal", 0.01))
        ho, wo = ((d + 2 * pad - kernel) // stride + 1 for d in (h, w))
        layer = self.add("Convolution", name, [bottom], name, (n, c_out, ho, wo), recipes)
        p = layer.convolution_param
        p.num_output, p.bias_term = c_out, bias
        p.kernel_size.append(kernel)
        if stride != 1:
            p.stride.append(stride)
        if pad:
            p.pad.append(pad)
        if group != 1:
            p.group = group
        return name

    def batchnorm(self, name, blob) -> str:
        """BatchNorm (stored mean, variance, factor 1) then Scale with a bias, both in place."""
        c = self.shapes[blob][1]
        self.add("BatchNorm", name + "_bn", [blob], blob, self.shapes[blob],
                 [Recipe((c,), "normal", 0.1), Recipe((c,), "uniform", 0.5, 1.5), Recipe((1,), "constant", 1.0)])
        layer = self.add("Scale", name + "_scale", [blob], blob, self.shapes[blob],
                         [Recipe((c,), "uniform", 0.8, 1.2), Recipe((c,), "normal", 0.1)])
        layer.scale_param.bias_term = True
        return blob

    def relu(self, name, blob) -> str:
        self.add("ReLU", name, [blob], blob, self.shapes[blob])
        return blob

    def prelu(self, name, blob) -> str:
        self.add("PReLU", name, [blob], blob, self.shapes[blob], [Recipe((self.shapes[blob][1],), "uniform", 0.1, 0.3)])
        return blob

    def eltwise_sum(self, name, a, b) -> str:
        self.add("Eltwise", name, [a, b], name, self.shapes[a]).eltwise_param.operation = pb.EltwiseParameter.SUM
        return name

    def pool(self, name, bottom, method, kernel=2, stride=2, whole=False) -> str:
        n, c, h, w = self.shapes[bottom]
        # Caffe rounds a pooled size up (pooling_layer.cpp); the nets here divide exactly.
        ho, wo = (1, 1) if whole else (-(-(d - kernel) // stride) + 1 for d in (h, w))
        p = self.add("Pooling", name, [bottom], name, (n, c, ho, wo)).pooling_param
        p.pool = method
        if whole:
            p.global_pooling = True
        else:
            p.kernel_size, p.stride = kernel, stride
        return name

    def inner_product(self, name, bottom, n_out, gain=2.0) -> str:
        shape = self.shapes[bottom]
        k = math.prod(shape[1:])
        recipes = [Recipe((n_out, k), "normal", math.sqrt(gain / k)), Recipe((n_out,), "normal", 0.01)]
        layer = self.add("InnerProduct", name, [bottom], name, (shape[0], n_out), recipes)
        layer.inner_product_param.num_output = n_out
        return name

    def softmax(self, name, bottom) -> str:
        self.add("Softmax", name, [bottom], name, self.shapes[bottom])
        return name

    # What the report needs to know.

    @property
    def weight_bytes(self) -> int:
        return 4 * sum(r.count for _, recipes in self.layers for r in recipes)

    def largest_blobs(self, k: int = 2) -> list:
        """[(bytes, name, shape)] of the k largest blobs (a blob written in place counts once)."""
        sized = sorted(((4 * math.prod(s), name, s) for name, s in self.shapes.items()), reverse=True)
        return sized[:k]


def resnet20(batch: int) -> NetSpec:
    """ResNet-20 for CIFAR-10 (He et al. 2016, section 4.2): 6n + 2 layers with n = 3, as Caffe ports write it."""
    net = NetSpec("ResNet-20", (batch, 3, 32, 32))
    x = net.relu("conv1_relu", net.batchnorm("conv1", net.conv("conv1", "data", 16, 3, pad=1)))
    channels = 16
    for stage, width in enumerate((16, 32, 64), 1):
        for block in range(1, 4):
            name = f"res{stage}_{block}"
            stride = 2 if width != channels else 1
            y = net.conv(name + "_a", x, width, 3, stride=stride, pad=1)
            y = net.relu(name + "_a_relu", net.batchnorm(name + "_a", y))
            y = net.batchnorm(name + "_b", net.conv(name + "_b", y, width, 3, pad=1))
            shortcut = x
            if width != channels:
                shortcut = net.batchnorm(name + "_proj", net.conv(name + "_proj", x, width, 1, stride=2))
            x = net.relu(name + "_relu", net.eltwise_sum(name, y, shortcut))
            channels = width
    x = net.pool("pool", x, pb.PoolingParameter.AVE, whole=True)
    net.softmax("prob", net.inner_product("fc10", x, 10, gain=1.0))
    return net


# MobileFaceNet's bottlenecks (Chen et al. 2018, table 1): expansion t, output channels c, repeats n, stride s.
MOBILEFACENET_BOTTLENECKS = ((2, 64, 5, 2), (4, 128, 1, 2), (2, 128, 6, 1), (4, 128, 1, 2), (2, 128, 2, 1))


def mobilefacenet(batch: int) -> NetSpec:
    """MobileFaceNet's layout: 112 x 112 in, 7 x 7 before the linear GDC, a 128-value embedding."""
    net = NetSpec("MobileFaceNet", (batch, 3, 112, 112))

    def conv_bn(name, x, c_out, kernel, stride=1, pad=0, group=1, act=True):
        x = net.batchnorm(name, net.conv(name, x, c_out, kernel, stride=stride, pad=pad, group=group))
        return net.prelu(name + "_prelu", x) if act else x

    x = conv_bn("conv1", "data", 64, 3, stride=2, pad=1)
    x = conv_bn("conv2_dw", x, 64, 3, pad=1, group=64)
    channels = 64
    for stage, (t, c, n, s) in enumerate(MOBILEFACENET_BOTTLENECKS, 1):
        for i in range(n):
            name = f"bneck{stage}_{i + 1}"
            stride = s if i == 0 else 1
            wide = channels * t
            y = conv_bn(name + "_expand", x, wide, 1)
            y = conv_bn(name + "_dw", y, wide, 3, stride=stride, pad=1, group=wide)
            y = conv_bn(name + "_project", y, c, 1, act=False)
            x = net.eltwise_sum(name, y, x) if stride == 1 and c == channels else y
            channels = c
    x = conv_bn("conv_last", x, 512, 1)
    # The linear global depthwise convolution: one 7 x 7 filter per channel, no padding, no activation.
    x = conv_bn("gdc", x, 512, 7, group=512, act=False)
    net.inner_product("embedding", x, 128, gain=1.0)
    return net


VGG16_STAGES = ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3))


def vgg16(batch: int, side: int = 224, width: int = 1, fc: int = 4096, classes: int = 1000) -> NetSpec:
    """VGG-16 (configuration D of Simonyan and Zisserman 2014); `width` divides the channels (for --smoke)."""
    net = NetSpec("VGG-16", (batch, 3, side, side))
    x = "data"
    for stage, (channels, convs) in enumerate(VGG16_STAGES, 1):
        for i in range(1, convs + 1):
            x = net.relu(f"relu{stage}_{i}", net.conv(f"conv{stage}_{i}", x, channels // width, 3, pad=1, bias=True))
        x = net.pool(f"pool{stage}", x, pb.PoolingParameter.MAX)
    x = net.relu("relu6", net.inner_product("fc6", x, fc))
    x = net.relu("relu7", net.inner_product("fc7", x, fc))
    net.softmax("prob", net.inner_product("fc8", x, classes, gain=1.0))
    return net


def make_nets(smoke: bool) -> dict:
    """{key: NetSpec} of the standard run, or their tiny versions."""
    if smoke:
        return {"resnet20": resnet20(2), "mobilefacenet": mobilefacenet(1),
                "vgg16": vgg16(1, side=32, width=16, fc=64, classes=10)}
    return {"resnet20": resnet20(256), "mobilefacenet": mobilefacenet(16), "vgg16": vgg16(1)}


def write_deploy(net: NetSpec, path: Path) -> None:
    """The deploy.prototxt: an Input layer of the net's input shape, then the layers (no blobs)."""
    proto = pb.NetParameter(name=net.name)
    data = proto.layer.add(name="data", type="Input")
    data.top.append("data")
    data.input_param.shape.add().dim.extend(net.input_shape)
    for layer, _ in net.layers:
        proto.layer.add().CopyFrom(layer)
    path.write_text(text_format.MessageToString(proto))


def write_caffemodel(net: NetSpec, path: Path, rng) -> None:
    """The weights as Caffe's NetParameter, written field by field so no blob is ever whole in memory.

    Each layer is field 100 (layer) holding the LayerParameter's own fields,
    then one field 7 (blobs) per blob: a BlobProto of field 7 (shape, a
    BlobShape of packed int64 dims) and field 5 (data, packed float32:
    the values' little-endian bytes, drawn CHUNK_VALUES at a time).
    """
    with open(path, "wb") as out:
        out.write(pb.NetParameter(name=net.name).SerializeToString())
        for layer, recipes in net.layers:
            head = layer.SerializeToString()
            blobs = []
            for recipe in recipes:
                shape = pb.BlobProto()
                shape.shape.dim.extend(recipe.shape)
                lead = shape.SerializeToString() + len_field_header(5, 4 * recipe.count)
                blobs.append((lead, recipe))
            body = len(head) + sum(len(len_field_header(7, len(lead) + 4 * r.count)) + len(lead) + 4 * r.count
                                   for lead, r in blobs)
            out.write(len_field_header(100, body))
            out.write(head)
            for lead, recipe in blobs:
                out.write(len_field_header(7, len(lead) + 4 * recipe.count))
                out.write(lead)
                for start in range(0, recipe.count, CHUNK_VALUES):
                    n = min(CHUNK_VALUES, recipe.count - start)
                    out.write(recipe.draw(rng, n).astype("<f4", copy=False).tobytes())


# -- measuring -------------------------------------------------------------------------------

TIME = shutil.which("time") or ("/usr/bin/time" if os.path.exists("/usr/bin/time") else None)


def run_once(cmd: list) -> tuple[float, float, float]:
    """(wall seconds, peak RSS in MiB, CPU seconds: user + system) of one process.

    The peak RSS comes from /usr/bin/time (%M) where there is one: the
    rusage a parent reads from wait4 after fork (or vfork) and exec keeps
    the high-water mark of the memory the child started in, this harness's
    own. Without it, os.wait4's figure is given, and says at least the
    child's own peak.
    """
    report = None
    if TIME:
        fd, report = tempfile.mkstemp(prefix="rss-")
        os.close(fd)
        cmd = [TIME, "-f", "%M %U %S", "-o", report] + list(cmd)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stderr.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {proc.returncode}: "
                           f"{err.decode(errors='replace').strip()}")
    rss_mib, cpu = usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime
    if report:
        with open(report) as f:
            fields = f.read().split()
        os.unlink(report)
        rss_mib, cpu = int(fields[-3]) / 1024, float(fields[-2]) + float(fields[-1])
    return wall, rss_mib, cpu


@dataclass
class Timing:
    """The repetitions of one command: median and range of the wall seconds, median CPU seconds, largest peak RSS."""

    walls: list
    rss: list
    cpus: list

    @property
    def wall(self) -> float:
        return statistics.median(self.walls)

    @property
    def cpu(self) -> float:
        return statistics.median(self.cpus)

    @property
    def peak(self) -> float:
        return max(self.rss)


def measure(cases: dict, reps: int) -> dict:
    """Run every case `reps` times, round-robin: {name: Timing}."""
    runs = {name: ([], [], []) for name in cases}
    for rep in range(reps):
        for name, cmd in cases.items():
            for into, value in zip(runs[name], run_once(cmd)):
                into.append(value)
        print(f"  repetition {rep + 1}/{reps} done", file=sys.stderr)
    return {name: Timing(*got) for name, got in runs.items()}


def machine() -> str:
    """Cores, CPU model, RAM, system, and the versions the figures depend on."""
    cpu = platform.processor() or platform.machine()
    mem = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
        with open("/proc/meminfo") as f:
            mem = next((f"{int(line.split()[1]) / 2**20:.0f} GiB RAM, " for line in f
                        if line.startswith("MemTotal")), "")
    except OSError:
        pass
    try:
        import cv2
        opencv = cv2.__version__
    except ImportError:
        opencv = "not installed"
    return (f"{os.cpu_count()} cores ({cpu}), {mem}{platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, numpy {np.__version__}, OpenCV {opencv}")


def output_difference(blobtool_npz: Path, opencv_npy: Path, name: str) -> float:
    """The largest absolute difference of the two outputs (the last repetition's) over OpenCV's largest value.

    Infinity where the shapes differ or blobtool wrote no blob `name`.
    """
    with np.load(blobtool_npz) as arrays:
        if name not in arrays:
            return math.inf
        ours = arrays[name].astype(np.float64).reshape(-1)
    theirs = np.load(opencv_npy).astype(np.float64).reshape(-1)
    if ours.size != theirs.size:
        return math.inf
    return float(np.max(np.abs(ours - theirs)) / max(np.max(np.abs(theirs)), np.finfo(np.float32).tiny))


# -- the run ---------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny nets and one repetition")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per case (default 5; 1 with --smoke)")
    parser.add_argument("--nets", default=None, metavar="NAME[,NAME...]",
                        help="which nets: resnet20, mobilefacenet, vgg16 (default: all three)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS.md",
                        help="the markdown file whose section gets the table (default benchmarks/RESULTS.md)")
    parser.add_argument("--workdir", type=Path, default=None, help="where to put the nets (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the nets and the commands (printed) for profiling")
    args = parser.parse_args()
    reps = args.reps or (1 if args.smoke else 5)
    nets = make_nets(args.smoke)
    if args.nets:
        wanted = [n for n in args.nets.split(",") if n]
        unknown = [n for n in wanted if n not in nets]
        if unknown:
            parser.error(f"--nets: unknown {', '.join(unknown)} (known: {', '.join(nets)})")
        nets = {key: nets[key] for key in wanted}

    # Start-up as users get it: pip byte-compiles what it installs.
    compileall.compile_dir(ROOT / "blobtool", quiet=1)
    os.environ["PYTHONPATH"] = f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    work = Path(tempfile.mkdtemp(prefix="blobtool-forward-", dir=args.workdir))
    py = sys.executable
    rng = np.random.default_rng(2026)
    try:
        print(f"writing {len(nets)} nets in {work}", file=sys.stderr)
        opencv_script = work / "opencv_forward.py"
        opencv_script.write_text(textwrap.dedent(OPENCV_SCRIPT))
        cases = {}
        for key, net in nets.items():
            model, deploy = work / f"{key}.caffemodel", work / f"{key}.prototxt"
            write_caffemodel(net, model, rng)
            write_deploy(net, deploy)
            shape = ",".join(map(str, net.input_shape))
            cases[f"{key}: blobtool"] = [py, "-m", "blobtool", "run", str(model), "--definition", str(deploy),
                                         "--input-shape", f"data={shape}", "-o", str(work / f"{key}.npz")]
            cases[f"{key}: OpenCV"] = [py, str(opencv_script), str(deploy), str(model), shape,
                                       str(work / f"{key}.npy")]
        if args.keep:
            for name, cmd in cases.items():
                print(f"{name}: {' '.join(cmd)}", file=sys.stderr)
        # The new files' pages go to disk before the timings start, not during them.
        os.sync()
        print(f"measuring {len(cases)} cases x {reps} repetitions", file=sys.stderr)
        load = [os.getloadavg()]
        res = measure(cases, reps)
        load.append(os.getloadavg())
        diffs = {key: output_difference(work / f"{key}.npz", work / f"{key}.npy", net.output)
                 for key, net in nets.items()}
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    section = render(nets, res, diffs, reps, args, load)
    print(section)
    write_section(args.out, section)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


# -- the report ------------------------------------------------------------------------------


def memory_bound(net: NetSpec) -> float:
    """blobtool's goal for its peak RSS, MiB: the weights + the two largest blobs + MEMORY_SLACK_MIB."""
    return (net.weight_bytes + sum(size for size, _, _ in net.largest_blobs())) / MIB + MEMORY_SLACK_MIB


def render(nets: dict, res: dict, diffs: dict, reps: int, args, load) -> str:
    """The section: how it ran, the table, what each net holds, and the goals judged."""
    flags = (" --smoke" if args.smoke else "") + (f" --nets {args.nets}" if args.nets else "") + \
        (f" --reps {args.reps}" if args.reps else "")
    (l1, l5, l15), (e1, e5, e15) = load
    lines = [
        HEADING, "",
        f"Machine: {machine()}.",
        f"Run: `python benchmarks/forward.py{flags}` on {datetime.date.today().isoformat()}; median of {reps} "
        "interleaved repetitions per case, each a separate process started fresh (its imports and the loading "
        "of the net count); peak RSS is the largest of the repetitions (/usr/bin/time %M). blobtool: "
        "`blobtool run MODEL --definition deploy.prototxt --input-shape data=... -o out.npz`; OpenCV: "
        "`cv2.dnn.readNetFromCaffe`, the OpenCV backend on the CPU with its default layer fusion, `setInput` of "
        "random normal values, `forward`, `np.save`. Both draw the input from numpy's `default_rng(0)`: "
        "\"diff\" is the largest absolute difference of their outputs over the largest absolute value of "
        "OpenCV's output.",
        "",
        f"Load average (1, 5, 15 min) when the timings started: {l1:.2f}, {l5:.2f}, {l15:.2f}; when they ended: "
        f"{e1:.2f}, {e5:.2f}, {e15:.2f} ({os.cpu_count()} cores).",
        "",
        "| net | input | weights MiB | blobtool s (range) | OpenCV s (range) | blobtool / OpenCV | CPU s blobtool, "
        "OpenCV | peak RSS MiB blobtool, OpenCV | blobtool's bound MiB | within | diff |",
        "|---|---|---:|---|---|---:|---|---|---:|---|---:|",
    ]
    for key, net in nets.items():
        ours, theirs = res[f"{key}: blobtool"], res[f"{key}: OpenCV"]
        bound = memory_bound(net)
        lines.append(
            f"| {net.name} | {'x'.join(map(str, net.input_shape))} | {net.weight_bytes / MIB:.1f} | "
            f"{ours.wall:.3f} ({min(ours.walls):.3f}-{max(ours.walls):.3f}) | "
            f"{theirs.wall:.3f} ({min(theirs.walls):.3f}-{max(theirs.walls):.3f}) | {ours.wall / theirs.wall:.2f}x | "
            f"{ours.cpu:.2f}, {theirs.cpu:.2f} | {ours.peak:.0f}, {theirs.peak:.0f} | {bound:.0f} | "
            f"{'yes' if ours.peak <= bound else 'NO'} | {diffs[key]:.1e} |")
    lines += ["", "The nets (random weights, written by the harness):", ""]
    for key, net in nets.items():
        params = net.weight_bytes // 4
        kinds = sorted({layer.type for layer, _ in net.layers})
        blobs = "; ".join(f"{name} {'x'.join(map(str, shape))} ({size / MIB:.1f} MiB)"
                          for size, name, shape in net.largest_blobs())
        lines.append(f"- {net.name} (`{key}`): {len(net.layers) + 1} layers ({', '.join(kinds)}), "
                     f"{params:,} parameters; largest blobs: {blobs}.")
    goals = []
    for key, net in nets.items():
        ours, theirs = res[f"{key}: blobtool"], res[f"{key}: OpenCV"]
        goals.append((f"{net.name}: blobtool run <= {TIME_GOAL:g}x OpenCV's time ({ours.wall / theirs.wall:.2f}x)",
                       ours.wall <= TIME_GOAL * theirs.wall))
        goals.append((f"{net.name}: blobtool's peak RSS <= weights + two largest blobs + {MEMORY_SLACK_MIB} MiB "
                      f"({ours.peak:.0f} of {memory_bound(net):.0f} MiB)", ours.peak <= memory_bound(net)))
    lines += ["", "Goals:", ""]
    lines += [f"- {'met' if ok else 'NOT met'}: {name}" for name, ok in goals]
    return "\n".join(lines) + "\n"


def write_section(path: Path, section: str, heading: str = HEADING) -> None:
    """Put `section` into markdown file `path`: in place of the section under `heading` if there, else at the end.

    A section runs from its heading to the next heading of level 1 or 2 (or the end of the file).
    """
    text = path.read_text() if path.exists() else ""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip("\n") == heading), None)
    if start is None:
        before = text if not text or text.endswith("\n\n") else text.rstrip("\n") + "\n\n"
        path.write_text(before + section)
        return
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(("# ", "## "))), len(lines))
    after = "".join(lines[end:])
    path.write_text("".join(lines[:start]) + section + ("\n" + after if after else ""))


if __name__ == "__main__":
    sys.exit(main())
