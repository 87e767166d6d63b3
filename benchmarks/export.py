"""blobtool export against reading and writing the bytes: VGG-16 to ONNX, whole process against whole process.

    python benchmarks/export.py              # the standard run (about 1.6 GB of disk in $TMPDIR)
    python benchmarks/export.py --smoke      # a tiny VGG, one repetition: checks the harness runs
    python benchmarks/export.py --keep       # its files kept and the commands printed, for profiling

It writes VGG-16 with random weights (benchmarks/forward.py's net: 138M
parameters, 528 MiB of float32, the caffemodel written field by field, and
a deploy.prototxt with an Input layer) and times, as fresh processes,
interleaved, median of the repetitions:

- `python -m blobtool export VGG.caffemodel --definition deploy.prototxt -o vgg.onnx`;
- the floor: a Python process that reads the caffemodel through a 16 MiB
  buffer and writes the same bytes to a file in the same folder, which any
  export that writes its weights once must do at least.

Each run writes a new file: the dirty pages are written out (os.sync) and the
case's last output removed before it, not timed.

The report gives the median wall seconds, the median CPU seconds, the peak
RSS (the largest of the repetitions, /usr/bin/time's %M) and the size of the
.onnx, against two goals: the export at most TIME_GOAL times the floor, and
its peak RSS at most the weights once plus MEMORY_SLACK_MIB. The export is
then proved once: the .onnx in onnxruntime and `blobtool run` on the same
input (numpy's default_rng(0), as `blobtool run` draws it), their outputs'
largest absolute difference over the largest absolute value of blobtool's.
The table goes into benchmarks/RESULTS.md (or --out) as the section
"## blobtool export against reading and writing the bytes", replacing that
section and keeping the rest of the file.
"""

from __future__ import annotations

import argparse
import compileall
import datetime
import math
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import forward  # noqa: E402
from forward import MIB, ROOT, Timing, machine, run_once, vgg16, write_caffemodel, write_deploy  # noqa: E402

HEADING = "## blobtool export against reading and writing the bytes"

# The goals: the export's whole process at most this many times the floor's, and
# its peak RSS at most the weights once plus this much (the interpreter, numpy,
# onnx's protobuf classes, the graph's small messages).
TIME_GOAL = 2.0
MEMORY_SLACK_MIB = 100
# onnxruntime's output against blobtool run's: float32 rounding, forward/check.py's rule.
DIFF_GOAL = 1e-4

# Reads and writes through one buffer: the bytes cross user space once each way, as the export's do.
FLOOR_SCRIPT = """
import sys

src, dest = sys.argv[1], sys.argv[2]
buf = bytearray(16 << 20)
view = memoryview(buf)
with open(src, "rb", buffering=0) as inp, open(dest, "wb", buffering=0) as out:
    while n := inp.readinto(buf):
        out.write(view[:n])
"""


def make_net(smoke: bool):
    """forward.py's VGG-16, or its tiny version (--smoke)."""
    return vgg16(1, side=32, width=16, fc=64, classes=10) if smoke else vgg16(1)


def measure(cases: dict, outputs: dict, reps: int) -> dict:
    """Run every case `reps` times, round-robin, each into a new file: {name: Timing}.

    Before each run (not timed) the dirty pages are written out (os.sync),
    so that one case's writeback does not run in the other's time, then the
    case's output from the run before is removed: otherwise the floor's
    truncation would hand it back the pages of its last copy while the
    export's temporary file needs new ones (it replaces the old file only at
    the end).
    """
    runs = {name: ([], [], []) for name in cases}
    for rep in range(reps):
        for name, cmd in cases.items():
            os.sync()
            outputs[name].unlink(missing_ok=True)
            for into, value in zip(runs[name], run_once(cmd)):
                into.append(value)
        print(f"  repetition {rep + 1}/{reps} done", file=sys.stderr)
    return {name: Timing(*got) for name, got in runs.items()}


def onnx_difference(model: Path, npz: Path, input_shape: tuple, name: str) -> float:
    """onnxruntime's output `name` of `model` on default_rng(0)'s input against `blobtool run`'s in `npz`.

    The largest absolute difference over the largest absolute value of
    blobtool's output; infinity where the shapes differ or the npz lacks `name`.
    """
    import onnxruntime as ort

    x = np.random.default_rng(0).standard_normal(input_shape, dtype=np.float32)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    theirs = session.run([name], {"data": x})[0].astype(np.float64).reshape(-1)
    with np.load(npz) as arrays:
        if name not in arrays:
            return math.inf
        ours = arrays[name].astype(np.float64).reshape(-1)
    if ours.size != theirs.size:
        return math.inf
    return float(np.max(np.abs(ours - theirs)) / max(np.max(np.abs(ours)), np.finfo(np.float32).tiny))


def versions() -> str:
    """onnx's and onnxruntime's versions, which the export's time and the check depend on."""
    import onnx
    import onnxruntime

    return f"onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny VGG and one repetition")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per case (default 5; 1 with --smoke)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS.md",
                        help="the markdown file whose section gets the table (default benchmarks/RESULTS.md)")
    parser.add_argument("--workdir", type=Path, default=None, help="where to put the files (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the files and print the commands, for profiling")
    args = parser.parse_args()
    reps = args.reps or (1 if args.smoke else 5)
    net = make_net(args.smoke)

    # Start-up as users get it: pip byte-compiles what it installs.
    compileall.compile_dir(ROOT / "blobtool", quiet=1)
    os.environ["PYTHONPATH"] = f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    work = Path(tempfile.mkdtemp(prefix="blobtool-export-", dir=args.workdir))
    py = sys.executable
    try:
        print(f"writing {net.name} in {work}", file=sys.stderr)
        model, deploy, onnx_file = work / "vgg16.caffemodel", work / "vgg16.prototxt", work / "vgg16.onnx"
        write_caffemodel(net, model, np.random.default_rng(2026))
        write_deploy(net, deploy)
        outputs = {"blobtool export": onnx_file, "floor": work / "vgg16.copy"}
        cases = {
            "blobtool export": [py, "-m", "blobtool", "export", str(model), "--definition", str(deploy),
                                "-o", str(onnx_file)],
            "floor": [py, "-c", textwrap.dedent(FLOOR_SCRIPT), str(model), str(outputs["floor"])],
        }
        if args.keep:
            for name, cmd in cases.items():
                print(f"{name}: {' '.join(cmd)}", file=sys.stderr)
        print(f"measuring {len(cases)} cases x {reps} repetitions", file=sys.stderr)
        load = [os.getloadavg()]
        res = measure(cases, outputs, reps)
        load.append(os.getloadavg())
        onnx_mib = onnx_file.stat().st_size / MIB
        npz = work / "vgg16.npz"
        subprocess.run([py, "-m", "blobtool", "run", str(model), "--definition", str(deploy), "-o", str(npz)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        diff = onnx_difference(onnx_file, npz, net.input_shape, net.output)
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    section = render(net, res, onnx_mib, diff, reps, args, load)
    print(section)
    forward.write_section(args.out, section, HEADING)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def memory_bound(net) -> float:
    """The export's goal for its peak RSS, MiB: the weights once + MEMORY_SLACK_MIB."""
    return net.weight_bytes / MIB + MEMORY_SLACK_MIB


def render(net, res: dict, onnx_mib: float, diff: float, reps: int, args, load) -> str:
    """The section: how it ran, the table, the net, and the goals judged."""
    flags = (" --smoke" if args.smoke else "") + (f" --reps {args.reps}" if args.reps else "")
    (l1, l5, l15), (e1, e5, e15) = load
    ours, floor = res["blobtool export"], res["floor"]
    bound = memory_bound(net)
    weights = net.weight_bytes / MIB
    lines = [
        HEADING, "",
        f"Machine: {machine()}, {versions()}.",
        f"Run: `python benchmarks/export.py{flags}` on {datetime.date.today().isoformat()}; median of {reps} "
        "interleaved repetitions per case, each a separate process started fresh (its imports count) writing a "
        "new file (`os.sync()` and the last run's output removed before it, not timed); peak RSS is the largest "
        "of the repetitions (/usr/bin/time %M). blobtool: `blobtool export MODEL --definition deploy.prototxt "
        "-o vgg.onnx`; the floor: a Python process reading the caffemodel through a 16 MiB "
        "buffer and writing the same bytes to a file in the same folder. \"diff\": the exported model in "
        "onnxruntime against `blobtool run` on the same random normal input (numpy's `default_rng(0)`), the "
        "largest absolute difference of their outputs over the largest absolute value of blobtool's.",
        "",
        f"Load average (1, 5, 15 min) when the timings started: {l1:.2f}, {l5:.2f}, {l15:.2f}; when they ended: "
        f"{e1:.2f}, {e5:.2f}, {e15:.2f} ({os.cpu_count()} cores).",
        "",
        "| net | weights MiB | export s (range) | floor s (range) | export / floor | CPU s export, floor | "
        "peak RSS MiB export, floor | export's bound MiB | within | .onnx MiB | diff |",
        "|---|---:|---|---|---:|---|---|---:|---|---:|---:|",
        f"| {net.name} | {weights:.1f} | {ours.wall:.3f} ({min(ours.walls):.3f}-{max(ours.walls):.3f}) | "
        f"{floor.wall:.3f} ({min(floor.walls):.3f}-{max(floor.walls):.3f}) | {ours.wall / floor.wall:.2f}x | "
        f"{ours.cpu:.2f}, {floor.cpu:.2f} | {ours.peak:.0f}, {floor.peak:.0f} | {bound:.0f} | "
        f"{'yes' if ours.peak <= bound else 'NO'} | {onnx_mib:.1f} | {diff:.1e} |",
        "",
        f"The net (random weights, written by benchmarks/forward.py's code): {net.name}, "
        f"{'x'.join(map(str, net.input_shape))} input, {len(net.layers) + 1} layers, "
        f"{net.weight_bytes // 4:,} parameters.",
    ]
    goals = [
        (f"{net.name}: blobtool export <= {TIME_GOAL:g}x the floor's time ({ours.wall / floor.wall:.2f}x)",
         ours.wall <= TIME_GOAL * floor.wall),
        (f"{net.name}: blobtool export's peak RSS <= weights + {MEMORY_SLACK_MIB} MiB "
         f"({ours.peak:.0f} of {bound:.0f} MiB)", ours.peak <= bound),
        (f"{net.name}: onnxruntime's output within {DIFF_GOAL:g} of blobtool run's ({diff:.1e})", diff <= DIFF_GOAL),
    ]
    lines += ["", "Goals:", ""]
    lines += [f"- {'met' if ok else 'NOT met'}: {name}" for name, ok in goals]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
