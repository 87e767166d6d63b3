"""The cost of reading a net definition in text (.prototxt) at its bounds: CPU seconds and peak memory.

    python benchmarks/text_bounds.py                      # with this Python and its protobuf
    python benchmarks/text_bounds.py --python /venv/bin/python --reps 3

Each case is a text at (or just inside) one of blobtool.formats.prototxt's
bounds, written to a temporary folder, then read by `blobtool info` as a
separate process under /usr/bin/time: the table gives the median user +
system CPU seconds and the largest peak resident memory over the
repetitions, and whether the text was read (exit 0) or refused (exit 3),
beside a real-sized definition (ResNet-152's deploy) and one just past each
bound, which must be refused at once.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from blobtool.formats import MAX_BLOBS  # noqa: E402
from blobtool.formats.prototxt import (MAX_BACKSLASHES, MAX_LINE, MAX_LINES, MAX_MESSAGES,  # noqa: E402
                                       MAX_TEXT, MAX_TOKENS)


def resnet152_deploy() -> bytes:
    """A ResNet-152 deploy definition as Caffe's model zoo writes it: 3-4-36-3 bottlenecks, BatchNorm and Scale."""
    out = ['name: "ResNet-152"', 'input: "data"', "input_dim: 1", "input_dim: 3", "input_dim: 224", "input_dim: 224"]

    def conv(name, bottom, num, kernel, stride=1, pad=0):
        out.append(f'layer {{\n\tbottom: "{bottom}"\n\ttop: "{name}"\n\tname: "{name}"\n\ttype: "Convolution"\n'
                   f"\tconvolution_param {{\n\t\tnum_output: {num}\n\t\tkernel_size: {kernel}\n\t\tpad: {pad}\n"
                   f"\t\tstride: {stride}\n\t\tbias_term: false\n\t}}\n}}")
        out.append(f'layer {{\n\tbottom: "{name}"\n\ttop: "{name}"\n\tname: "bn{name}"\n\ttype: "BatchNorm"\n'
                   "\tbatch_norm_param {\n\t\tuse_global_stats: true\n\t}\n}")
        out.append(f'layer {{\n\tbottom: "{name}"\n\ttop: "{name}"\n\tname: "scale{name}"\n\ttype: "Scale"\n'
                   "\tscale_param {\n\t\tbias_term: true\n\t}\n}")

    def relu(name):
        out.append(f'layer {{\n\tbottom: "{name}"\n\ttop: "{name}"\n\tname: "{name}_relu"\n\ttype: "ReLU"\n}}')

    conv("conv1", "data", 64, 7, 2, 3)
    relu("conv1")
    out.append('layer {\n\tbottom: "conv1"\n\ttop: "pool1"\n\tname: "pool1"\n\ttype: "Pooling"\n'
               "\tpooling_param {\n\t\tkernel_size: 3\n\t\tstride: 2\n\t\tpool: MAX\n\t}\n}")
    bottom = "pool1"
    for stage, (blocks, width) in enumerate(((3, 64), (8, 128), (36, 256), (3, 512)), start=2):
        for b in range(blocks):
            tag = f"{stage}{chr(97 + b) if b < 26 else 'b' + str(b)}"
            stride = 2 if b == 0 and stage > 2 else 1
            if b == 0:
                conv(f"res{tag}_branch1", bottom, width * 4, 1, stride)
            conv(f"res{tag}_branch2a", bottom, width, 1, stride)
            relu(f"res{tag}_branch2a")
            conv(f"res{tag}_branch2b", f"res{tag}_branch2a", width, 3, 1, 1)
            relu(f"res{tag}_branch2b")
            conv(f"res{tag}_branch2c", f"res{tag}_branch2b", width * 4, 1)
            short = f"res{tag}_branch1" if b == 0 else bottom
            out.append(f'layer {{\n\tbottom: "{short}"\n\tbottom: "res{tag}_branch2c"\n\ttop: "res{tag}"\n'
                       f'\tname: "res{tag}"\n\ttype: "Eltwise"\n}}')
            relu(f"res{tag}")
            bottom = f"res{tag}"
    out.append(f'layer {{\n\tbottom: "{bottom}"\n\ttop: "pool5"\n\tname: "pool5"\n\ttype: "Pooling"\n'
               "\tpooling_param {\n\t\tkernel_size: 7\n\t\tstride: 1\n\t\tpool: AVE\n\t}\n}")
    out.append('layer {\n\tbottom: "pool5"\n\ttop: "fc1000"\n\tname: "fc1000"\n\ttype: "InnerProduct"\n'
               "\tinner_product_param {\n\t\tnum_output: 1000\n\t}\n}")
    out.append('layer {\n\tbottom: "fc1000"\n\ttop: "prob"\n\tname: "prob"\n\ttype: "Softmax"\n}')
    return ("\n".join(out) + "\n").encode()


def lines_of(items: bytes, count: int, per_line: int) -> bytes:
    """`count` copies of `items`, `per_line` to a line."""
    full, rest = divmod(count, per_line)
    return (items * per_line + b"\n") * full + items * rest + b"\n"


def cases() -> dict:
    """{name: (text, expected exit code)}: a real definition, the worst texts within each bound, and past them."""
    per = (MAX_LINE - 64) // 2
    tokens = MAX_TOKENS - 64
    esc = (MAX_LINE - 16) // 4
    return {
        "ResNet-152 deploy (670 layers)": (resnet152_deploy(), 0),
        "8,192 ordinary layers": (b'name: "n"\ninput: "x"\n' + b"".join(
            b'layer {\n  name: "relu%d"\n  type: "ReLU"\n  bottom: "x"\n  top: "x"\n  include { phase: TEST }\n}\n' % i
            for i in range(MAX_BLOBS)), 0),
        "floats in a list, 1 token each": (b"layer { blobs { data: [" + lines_of(b"1,", tokens // 2, per)
                                           + b"1] } }\n", 0),
        "tops, 3 tokens each": (b"layer {\n" + lines_of(b'top: "a"\n', tokens // 3, 1) + b"}\n", 0),
        "one name of adjacent strings": (b"name:\n" + lines_of(b'"a" ', tokens, 10_000), 0),
        "param messages, 3 tokens each": (b"layer {\n" + lines_of(b"param {}\n", MAX_MESSAGES - 1, 1) + b"}\n", 0),
        "layers in a list": (b"layer: [" + lines_of(b"{},", MAX_BLOBS - 1, 1000) + b"{}]\n", 0),
        "comment lines": (b"#\n" * (MAX_TOKENS - 8) + b'name: "x"\n', 0),
        "blank lines": (b"\n" * (MAX_LINES - 2) + b'name: "x"\n', 0),
        "escapes, 16,380 a string": (lines_of(b'input: "' + b"\\101" * esc + b'"', MAX_TEXT // MAX_LINE - 1, 1), 0),
        "backslash runs at the bound": (lines_of(b'input: "' + (b"\\" * MAX_BACKSLASHES + b"a") * (
            (MAX_LINE - 16) // (MAX_BACKSLASHES + 1)) + b'"', MAX_TEXT // MAX_LINE - 1, 1), 0),
        "blank runs at the line bound": (lines_of(b'input: "a"' + b" " * (MAX_LINE - 16), MAX_TEXT // MAX_LINE - 1, 1),
                                         0),
        "past: tokens": (b"layer { blobs { data: [" + lines_of(b"1,", MAX_TOKENS, per) + b"1] } }\n", 3),
        "past: layers as <>": (b"layer <>\n" * (MAX_BLOBS + 1), 3),
        "past: one 4 MB line of escapes": (b'name: "' + b"\\377" * (1 << 20) + b'"\n', 3),
    }


def run(python: str, path: Path) -> tuple:
    """(exit code, user + system CPU seconds, peak RSS in MB) of `blobtool info path`."""
    fd, report = tempfile.mkstemp(prefix="rss-")
    os.close(fd)
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(["/usr/bin/time", "-f", "%U %S %M", "-o", report, python, "-m", "blobtool", "info",
                               str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        with open(report) as f:
            user, system, rss = f.read().split()[-3:]
    finally:
        os.unlink(report)
    code = proc.returncode
    return code, float(user) + float(system), int(rss) / 1024, proc.stderr.decode(errors="replace").strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the Python (and so protobuf) to run blobtool with")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    version = subprocess.run([args.python, "-c", "import google.protobuf as p; "
                              "from google.protobuf.internal import api_implementation as a; "
                              "print(p.__version__, a.Type())"], capture_output=True, text=True).stdout.strip()
    print(f"protobuf {version}; median of {args.reps} (CPU s), largest peak RSS\n")
    print("| case | MB | exit | CPU s (range) | peak RSS MB |")
    print("|---|---|---|---|---|")
    failed = False
    with tempfile.TemporaryDirectory() as work:
        for name, (text, expect) in cases().items():
            path = Path(work) / "net.prototxt"
            path.write_bytes(text)
            results = [run(args.python, path) for _ in range(args.reps)]
            codes = {r[0] for r in results}
            cpu = [r[1] for r in results]
            if codes != {expect}:
                failed = True
                print(f"{name}: exit {codes}, expected {expect}: {results[0][3]}", file=sys.stderr)
            print(f"| {name} | {len(text) / 1e6:.2f} | {'/'.join(map(str, sorted(codes)))} | "
                  f"{statistics.median(cpu):.2f} ({min(cpu):.2f}-{max(cpu):.2f}) | {max(r[2] for r in results):.0f} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
