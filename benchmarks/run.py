"""blobtool's benchmark harness: whole processes, interleaved repetitions, medians.

    python benchmarks/run.py              # the standard run (needs ~3 GiB of disk in $TMPDIR)
    python benchmarks/run.py --huge       # adds a 2.5 GiB blob (norm and convert past 2 GiB)
    python benchmarks/run.py --smoke      # tiny inputs, two repetitions: checks the harness runs
    python benchmarks/run.py --floods     # only the floods (among them the HDF5 nets)

It generates its own data, then times each command as a separate process,
round-robin over the cases (so a slow moment of the machine hits every case
alike), and reports the median wall time and the peak resident memory of
each (from the kernel's rusage of the child, the figure /usr/bin/time -v
prints). It compares:

- blobtool norm against the raw floor (np.fromfile of the payload plus
  numpy's own float32 reductions) and the pycaffe idiom
  (BlobProto.ParseFromString(f.read()) then np.array(blob.data)), on a float
  blob, the same as double, and a caffemodel-like net of ~30 blobs;
- blobtool convert --double and scale (streaming: bounded memory);
- blobtool info on the net (reads no payload) against start-up;
- blobtool info on a small file against python -c "import numpy";
- norm over 32 files, one at a time against --jobs (all cores);
- big files (1 GiB of float32): norm, info --stats, show, and compare of two
  such files where one value in 1000 differs (and of a file with itself),
  each as its time beyond start-up (info on the same file) against the time
  to read the same bytes from the page cache (`cat FILE > /dev/null`), with
  peak RSS;
- floods: files of millions of tiny fields (tests/helpers/fuzzcases.py's
  TINY_FIELD_FLOODS), info and norm against 1 s + 0.2 s per MB, and HDF5
  nets of 8000 one-value layers (float32 and float16, HDF5's default and
  h5py's latest format), info and norm likewise and compare of two such
  nets against twice that, with the range of the wall times and the CPU
  seconds (`--floods` runs these alone, in seconds instead of minutes).

The table is printed and written to benchmarks/RESULTS.md (FLOODS.md with
--floods, or --out) with the machine it ran on.
"""

from __future__ import annotations

import argparse
import compileall
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from blobtool.formats.caffe import wire  # noqa: E402
from blobtool._pb import blobtool_caffe_pb2 as pb  # noqa: E402

MIB = 1 << 20

FLOOR_BLOB = """
import sys, numpy as np
path, dtype, count, offset = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
x = np.fromfile(path, dtype=dtype, count=count, offset=offset)
print(float(np.abs(x).sum()), float(np.dot(x, x)))
"""

FLOOR_NET = """
import sys, numpy as np
path, dtype = sys.argv[1], sys.argv[2]
for spec in sys.argv[3:]:
    count, offset = map(int, spec.split(":"))
    x = np.fromfile(path, dtype=dtype, count=count, offset=offset)
    print(float(np.abs(x).sum()), float(np.dot(x, x)))
"""

PYCAFFE_BLOB = """
import sys, numpy as np
from blobtool._pb.blobtool_caffe_pb2 import BlobProto  # Caffe's field numbers, as caffe_pb2
blob = BlobProto()
blob.ParseFromString(open(sys.argv[1], "rb").read())
x = np.array(blob.double_data if len(blob.double_data) else blob.data)
print(float(np.abs(x).sum()), float(np.dot(x, x)))
"""

PYCAFFE_NET = """
import sys, numpy as np
from blobtool._pb.blobtool_caffe_pb2 import NetParameter
net = NetParameter()
net.ParseFromString(open(sys.argv[1], "rb").read())
for layer in net.layer:
    for blob in layer.blobs:
        x = np.array(blob.data)
        print(layer.name, float(np.abs(x).sum()), float(np.dot(x, x)))
"""


# -- data ------------------------------------------------------------------------------

def write_blob_file(path: Path, count: int, dtype: str, rng, shape=None) -> int:
    """A BlobProto with `count` random values in data (float32) or double_data; returns the payload offset."""
    field = 5 if dtype == "<f4" else 8
    itemsize = np.dtype(dtype).itemsize
    header = wire.len_field_header(field, count * itemsize)
    with open(path, "wb") as out:
        out.write(header)
        step = 8 * MIB
        for start in range(0, count, step):
            n = min(step, count - start)
            out.write(rng.standard_normal(n, dtype=np.float32).astype(dtype).tobytes())
        tail = pb.BlobProto()
        tail.shape.dim.extend(shape or [count])
        out.write(tail.SerializeToString())
    return len(header)


def write_changed_copy(src: Path, dst: Path, offset: int, count: int, every: int = 1000) -> None:
    """A copy of a float32 blob file with one value in `every` changed (value + 1)."""
    step = 8 * MIB
    with open(src, "rb") as f, open(dst, "wb") as out:
        out.write(f.read(offset))
        for start in range(0, count, step):
            x = np.frombuffer(f.read(min(step, count - start) * 4), dtype="<f4").copy()
            x[(-start) % every::every] += 1
            out.write(x.tobytes())
        out.write(f.read())


def flood_files(work: Path, smoke: bool) -> dict:
    """tests/helpers/fuzzcases.py's TINY_FIELD_FLOODS written out: {name: path} (two of them in a smoke run)."""
    sys.path.insert(0, str(ROOT / "tests" / "helpers"))
    saved = os.environ.get("BLOBTOOL_HDF5_SECONDS")
    try:
        from fuzzcases import TINY_FIELD_FLOODS
    finally:
        sys.path.remove(str(ROOT / "tests" / "helpers"))
        # The fuzzers' own HDF5 time limit (1 s) is theirs: the timed commands run with blobtool's.
        if saved is None:
            os.environ.pop("BLOBTOOL_HDF5_SECONDS", None)
        else:
            os.environ["BLOBTOOL_HDF5_SECONDS"] = saved
    names = list(TINY_FIELD_FLOODS)[:2] if smoke else list(TINY_FIELD_FLOODS)
    paths = {}
    for i, name in enumerate(names):
        paths[name] = work / f"flood{i}.pb"
        paths[name].write_bytes(TINY_FIELD_FLOODS[name])
    return paths


# HDF5 snapshots whose cost is all per object (3 s for info at first): nets of
# this many one-value layers (50 in a smoke run), in Caffe's layout.
HDF5_FLOOD_LAYERS = 8000


# The layouts timed: (name, stored dtype, h5py's libver). HDF5's default
# (earliest) format is what Caffe's libhdf5 writes: symbol-table groups, 11 MB
# for 8000 layers; h5py's latest format keeps links in the object header
# (3.5 MB). float16 values are read through HDF5 (converted to float32).
HDF5_FLOOD_LAYOUTS = (
    ("float32, h5py's latest format", np.float32, "latest"),
    ("float32, HDF5's default format", np.float32, None),
    ("float16, h5py's latest format", np.float16, "latest"),
    ("float16, HDF5's default format", np.float16, None),
)


def hdf5_floods(work: Path, smoke: bool) -> dict:
    """{name: (net, a second file with the same blobs)} of HDF5_FLOOD_LAYOUTS; {} without h5py."""
    layers = 50 if smoke else HDF5_FLOOD_LAYERS
    paths = {}
    for i, (layout, dtype, libver) in enumerate(HDF5_FLOOD_LAYOUTS):
        first = hdf5_flood(work / f"flood_layers{i}.caffemodel.h5", layers, dtype, libver)
        if first is None:
            return {}
        second = work / f"flood_layers{i}b.caffemodel.h5"
        shutil.copyfile(first, second)
        paths[f"HDF5 net of {layers} one-value layers, {layout}"] = (first, second)
    return paths


def hdf5_flood(path: Path, layers: int, dtype=np.float32, libver=None) -> Path | None:
    """A net snapshot of `layers` one-value layers (group data, a group per layer, dataset 0), or None without h5py."""
    try:
        import h5py
    except ImportError:
        return None
    with h5py.File(path, "w", **({"libver": libver} if libver else {})) as f:
        data = f.create_group("data")
        for i in range(layers):
            data.create_group(f"layer{i:05d}").create_dataset("0", data=np.array([i], dtype))
    return path


def write_net_file(path: Path, total_bytes: int, layers: int, rng) -> list:
    """A caffemodel-like NetParameter: `layers` layers with a weight and a bias blob each.

    Returns (count, offset) of every payload, for the floor script.
    """
    weight = (total_bytes // layers // 4 - 64) // 64 * 64
    payloads = []
    with open(path, "wb") as out:
        out.write(pb.NetParameter(name="BenchNet").SerializeToString())
        for k in range(layers):
            blobs = []
            for count in (weight, 64):
                header = wire.len_field_header(5, count * 4)
                shape = pb.BlobProto()
                shape.shape.dim.extend([count // 64, 64] if count > 64 else [count])
                blobs.append((header, count, shape.SerializeToString()))
            layer_head = pb.LayerParameter(name=f"conv{k}", type="Convolution").SerializeToString()
            body_len = len(layer_head)
            for header, count, tail in blobs:
                blob_len = len(header) + count * 4 + len(tail)
                body_len += len(wire.len_field_header(7, blob_len)) + blob_len
            out.write(wire.len_field_header(100, body_len))
            out.write(layer_head)
            for header, count, tail in blobs:
                blob_len = len(header) + count * 4 + len(tail)
                out.write(wire.len_field_header(7, blob_len))
                out.write(header)
                payloads.append((count, out.tell()))
                out.write(rng.standard_normal(count, dtype=np.float32).tobytes())
                out.write(tail)
    return payloads


# -- measuring ----------------------------------------------------------------------------

TIME = shutil.which("time") or ("/usr/bin/time" if os.path.exists("/usr/bin/time") else None)


def run_once(cmd: list, expect=(0,)) -> tuple[float, float, float]:
    """(wall seconds, peak RSS in MiB, CPU seconds: user + system, its children's included) of one process.

    Peak RSS and CPU come from /usr/bin/time (%M, %U, %S): the rusage a
    parent gets from wait4 after fork and exec counts the parent's own pages
    copied at fork, which would charge this harness's memory to every
    command measured. CPU time is what a loaded machine does not inflate.
    """
    report = None
    if TIME:
        fd, report = tempfile.mkstemp(prefix="rss-")
        os.close(fd)
        cmd = [TIME, "-f", "%M %U %S", "-o", report] + list(cmd)
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - start
    if proc.returncode not in expect:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {proc.returncode}: "
                           f"{proc.stderr.decode(errors='replace').strip()}")
    rss_kib, cpu = 0, float("nan")
    if report:
        with open(report) as f:
            fields = f.read().split()
        os.unlink(report)
        rss_kib, cpu = int(fields[-3]), float(fields[-2]) + float(fields[-1])
    return wall, rss_kib / 1024, cpu


def measure(cases: dict, reps: int) -> dict:
    """Run every case `reps` times, round-robin; {name: (median s, max of peak RSS MiB, median CPU s, (min s, max s))}.

    A case named "... differ" is a compare of different files: it exits 1.
    """
    runs = {name: [] for name in cases}
    for rep in range(reps):
        for name, cmd in cases.items():
            runs[name].append(run_once(cmd, (1,) if name.endswith("differ") else (0,)))
        print(f"  repetition {rep + 1}/{reps} done", file=sys.stderr)
    results = {}
    for name, got in runs.items():
        walls, rss, cpus = zip(*got)
        results[name] = (statistics.median(walls), max(rss), statistics.median(cpus), (min(walls), max(walls)))
    return results


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 2**20:.0f} GiB RAM"
    except OSError:
        pass
    return (f"{os.cpu_count()} cores ({cpu}), {mem}, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, numpy {np.__version__}")


# -- the run ---------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny inputs and two repetitions")
    parser.add_argument("--huge", action="store_true", help="also a 2.5 GiB blob (norm and convert)")
    parser.add_argument("--floods", action="store_true", help="only the floods (the HDF5 nets among them)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per case (default 7)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where the table goes (default benchmarks/RESULTS.md; with --floods, FLOODS.md there)")
    parser.add_argument("--workdir", type=Path, default=None, help="where to put the data (default: a temp dir)")
    args = parser.parse_args()
    if args.out is None:
        args.out = ROOT / "benchmarks" / ("FLOODS.md" if args.floods else "RESULTS.md")

    # blob MiB, net MiB, net layers, files, MiB per file, side of the big blob
    sizes = (4, 8, 15, 4, 1, 1024) if args.smoke else (256, 500, 15, 32, 64, 16384)
    reps = args.reps or (2 if args.smoke else 7)

    # pip byte-compiles a package when it installs it; do the same, so that
    # start-up is measured as users get it (with PYTHONDONTWRITEBYTECODE set,
    # every process would compile blobtool's sources again: about 40 ms here).
    compileall.compile_dir(ROOT / "blobtool", quiet=1)
    work = Path(tempfile.mkdtemp(prefix="blobtool-bench-", dir=args.workdir))
    py = sys.executable
    bt = [py, "-m", "blobtool"]
    rng = np.random.default_rng(2026)
    try:
        print(f"generating data in {work}", file=sys.stderr)
        env_path = f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
        os.environ["PYTHONPATH"] = env_path
        cases = {} if args.floods else standard_cases(work, py, bt, rng, sizes)
        floods = flood_files(work, args.smoke)
        hdf5 = hdf5_floods(work, args.smoke)
        cases.update(flood_cases(bt, floods, hdf5))
        # Write the new data back to disk before timing: the kernel's writeback
        # of 3.7 GB of dirty pages otherwise runs during the first cases, and
        # made a norm taking 28 ms take 62 ms.
        os.sync()
        print(f"measuring {len(cases)} cases x {reps} repetitions", file=sys.stderr)
        load = [os.getloadavg()]
        res = measure(cases, reps)
        load.append(os.getloadavg())
        huge = None
        if args.huge and not args.floods:
            huge = run_huge(work, bt, rng)
        flood_sizes = {name: path.stat().st_size for name, path in floods.items()}
        hdf5_sizes = {name: first.stat().st_size for name, (first, _) in hdf5.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)

    if args.floods:
        report = render_floods(res, flood_sizes, hdf5_sizes, reps, args.smoke, load)
    else:
        report = render(res, huge, *sizes[:5], reps, args.smoke, sizes[5] ** 2 * 4, flood_sizes, load, hdf5_sizes)
    print(report)
    args.out.write_text(report)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def standard_cases(work: Path, py: str, bt: list, rng, sizes: tuple) -> dict:
    """The data and the commands of the standard run (all but the floods): {name: command}."""
    blob_mib, net_mib, net_layers, files, file_mib, big_side = sizes
    f32, f64 = work / "f32.pb", work / "f64.pb"
    n32 = blob_mib * MIB // 4
    n64 = blob_mib * MIB // 8
    off32 = write_blob_file(f32, n32, "<f4", rng)
    off64 = write_blob_file(f64, n64, "<f8", rng)
    net = work / "net.caffemodel"
    payloads = write_net_file(net, net_mib * MIB, net_layers, rng)
    small = work / "small.pb"
    write_blob_file(small, 16, "<f4", rng)
    many = []
    for i in range(files):
        p = work / f"m{i:02d}.caffemodel"
        write_net_file(p, file_mib * MIB, 4, rng)
        many.append(str(p))
    big_a, big_b = work / "big_a.pb", work / "big_b.pb"
    big_count = big_side * big_side
    big_off = write_blob_file(big_a, big_count, "<f4", rng, shape=[big_side, big_side])
    write_changed_copy(big_a, big_b, big_off, big_count)
    scripts = {}
    for name, text in (("floor_blob", FLOOR_BLOB), ("floor_net", FLOOR_NET),
                       ("pycaffe_blob", PYCAFFE_BLOB), ("pycaffe_net", PYCAFFE_NET)):
        scripts[name] = work / f"{name}.py"
        scripts[name].write_text(textwrap.dedent(text))
    out = str(work / "out.pb")
    return {
        "norm f32: blobtool": bt + ["norm", str(f32)],
        "norm f32: floor": [py, str(scripts["floor_blob"]), str(f32), "<f4", str(n32), str(off32)],
        "norm f32: pycaffe idiom": [py, str(scripts["pycaffe_blob"]), str(f32)],
        "norm f64: blobtool": bt + ["norm", str(f64)],
        "norm f64: floor": [py, str(scripts["floor_blob"]), str(f64), "<f8", str(n64), str(off64)],
        "norm f64: pycaffe idiom": [py, str(scripts["pycaffe_blob"]), str(f64)],
        "norm net: blobtool": bt + ["norm", str(net)],
        "norm net: floor": [py, str(scripts["floor_net"]), str(net), "<f4"] + [f"{c}:{o}" for c, o in payloads],
        "norm net: pycaffe idiom": [py, str(scripts["pycaffe_net"]), str(net)],
        "convert --double f32": bt + ["convert", "--double", str(f32), "-o", out],
        "scale f32": bt + ["scale", str(f32), "0.5", "-o", out],
        "info net": bt + ["info", str(net)],
        "info small": bt + ["info", str(small)],
        "import numpy": [py, "-c", "import numpy"],
        f"norm {files} files --jobs 1": bt + ["norm", "--jobs", "1"] + many,
        f"norm {files} files (all cores)": bt + ["norm"] + many,
        "big: read floor (cat)": ["cat", str(big_a)],
        "big: info (start-up)": bt + ["info", str(big_a)],
        "big: norm": bt + ["norm", str(big_a)],
        "big: info --stats": bt + ["info", "--stats", str(big_a)],
        "big: show": bt + ["show", str(big_a)],
        "big: compare, 1 in 1000 differ": bt + ["compare", "-q", str(big_a), str(big_b)],
        "big: compare, equal files": bt + ["compare", "-q", str(big_a), str(big_a)],
    }


def flood_cases(bt: list, floods: dict, hdf5: dict) -> dict:
    """info and norm of each flood; info, norm and compare of each HDF5 net (with its copy)."""
    cases = {}
    for name, path in floods.items():
        cases[f"flood info: {name}"] = bt + ["info", str(path)]
        cases[f"flood norm: {name}"] = bt + ["norm", str(path)]
    for name, (first, second) in hdf5.items():
        cases[f"flood info: {name}"] = bt + ["info", str(first)]
        cases[f"flood norm: {name}"] = bt + ["norm", str(first)]
        cases[f"flood compare: {name}"] = bt + ["compare", "-q", str(first), str(second)]
    return cases


def run_huge(work: Path, bt: list, rng) -> dict:
    """A blob whose payload is over 2 GiB: norm and convert --double, once each."""
    path = work / "huge.pb"
    side = 1 << 15
    count = side * side * 5 // 8  # 2.5 GiB of float32, 20480 x 32768
    print("generating the 2.5 GiB blob", file=sys.stderr)
    write_blob_file(path, count, "<f4", rng, shape=[count // side, side])
    os.sync()
    results = {"bytes": path.stat().st_size}
    results["norm"] = run_once(bt + ["norm", "--json", str(path)])
    results["info --stats"] = run_once(bt + ["info", "--stats", "--json", str(path)])
    results["show"] = run_once(bt + ["show", str(path)])
    results["compare with itself"] = run_once(bt + ["compare", "-q", str(path), str(path)])
    out = work / "huge64.pb"
    results["convert --double"] = run_once(bt + ["convert", "--double", str(path), "-o", str(out)])
    results["out_bytes"] = out.stat().st_size
    check = subprocess.run(bt + ["compare", "-q", str(path), str(out)], capture_output=True, text=True)
    results["compare_exit"] = check.returncode
    out.unlink()
    path.unlink()
    return results


HUGE_READERS = ("norm", "info --stats", "show", "compare with itself")

# The memory bound of the reading commands: "about 200 MB" at any file size.
READER_RSS_MIB = 200e6 / MIB

# The floods' goal: seconds for a file of `size` bytes.
def flood_goal(size: int) -> float:
    return 1.0 + 0.2 * size / 1e6


def header(reps: int, flags: str, load) -> list:
    lines = [
        "# blobtool benchmark results",
        "",
        f"Machine: {machine()}.",
        f"Run: `python benchmarks/run.py{flags}` on {time.strftime('%Y-%m-%d')}; "
        f"median of {reps} interleaved repetitions per case, each a separate process; peak RSS is the "
        "largest of the repetitions (/usr/bin/time %M). blobtool is byte-compiled first, as `pip install` "
        "does, and the generated data is flushed to disk before the timings start.",
        "",
    ]
    if load:
        lines += [f"Load average (1, 5, 15 min) when the timings started: {', '.join(f'{v:.2f}' for v in load[0])}; "
                  f"when they ended: {', '.join(f'{v:.2f}' for v in load[-1])} "
                  f"({os.cpu_count()} cores: a load above that means the figures include waiting for a core).", ""]
    return lines


def floods_section(res: dict, flood_sizes: dict, hdf5_sizes: dict) -> list:
    """The floods' tables: wall seconds (median), and for the HDF5 nets the range and the CPU seconds too."""
    def t(name):
        return res[name][0]

    def spread(name):
        wall, _, cpu, (low, high) = res[name]
        return f"{wall:.2f} ({low:.2f}-{high:.2f}), {cpu:.2f}"

    lines = []
    if flood_sizes:
        lines += ["", "Floods (files of millions of tiny fields, from tests/helpers/fuzzcases.py), against 1 s + 0.2 s "
                  "per MB:", "", "| file | MB | info s | norm s | goal s |", "|---|---:|---:|---:|---:|"]
        for name, size in flood_sizes.items():
            lines.append(f"| {name} | {size / 1e6:.1f} | {t('flood info: ' + name):.2f} | "
                         f"{t('flood norm: ' + name):.2f} | {flood_goal(size):.2f} |")
    if hdf5_sizes:
        lines += ["", "HDF5 nets in Caffe's layout (group data, a group per layer, dataset 0), against 1 s + 0.2 s "
                  "per MB per input (compare: of the net and a copy, two inputs). Wall seconds: median (range), "
                  "then the median CPU seconds (user + system, the HDF5 child included):", "",
                  "| net | MB | info | norm | compare | goal s (compare) |", "|---|---:|---|---|---|---:|"]
        for name, size in hdf5_sizes.items():
            lines.append(f"| {name} | {size / 1e6:.1f} | {spread('flood info: ' + name)} | "
                         f"{spread('flood norm: ' + name)} | {spread('flood compare: ' + name)} | "
                         f"{flood_goal(size):.2f} ({2 * flood_goal(size):.2f}) |")
    return lines


def flood_targets(res: dict, flood_sizes: dict, hdf5_sizes: dict) -> list:
    def t(name):
        return res[name][0]

    sizes = {**flood_sizes, **hdf5_sizes}
    return [
        ("floods: info and norm within 1 s + 0.2 s per MB",
         all(max(t("flood info: " + name), t("flood norm: " + name)) <= flood_goal(size)
             for name, size in sizes.items())),
        ("HDF5 floods: compare of two nets within 2 s + 0.2 s per MB of both",
         all(t("flood compare: " + name) <= 2 * flood_goal(size) for name, size in hdf5_sizes.items())),
    ]


def render_floods(res: dict, flood_sizes: dict, hdf5_sizes: dict, reps, smoke, load) -> str:
    """The report of a run of the floods alone (--floods)."""
    lines = header(reps, " --floods" + (" --smoke" if smoke else ""), load)
    lines += floods_section(res, flood_sizes, hdf5_sizes)
    lines += ["", "Targets:", ""]
    lines += [f"- {'met' if ok else 'NOT met'}: {name}" for name, ok in flood_targets(res, flood_sizes, hdf5_sizes)]
    return "\n".join(lines) + "\n"


def render(res: dict, huge, blob_mib, net_mib, net_layers, files, file_mib, reps, smoke, big_bytes=0,
           flood_sizes=None, load=None, hdf5_sizes=None) -> str:
    def t(name):
        return res[name][0]

    def m(name):
        return res[name][1]

    lines = header(reps, " --smoke" if smoke else "", load)
    lines += [
        f"Inputs: a {blob_mib} MiB float32 blob, a {blob_mib} MiB float64 blob, a {net_mib} MiB "
        f"caffemodel-like net ({net_layers} layers, {2 * net_layers} blobs), {files} nets of {file_mib} MiB.",
        "",
        "| case | median s | peak RSS MiB | ratio |",
        "|---|---:|---:|---|",
    ]
    for kind, size in (("f32", blob_mib), ("f64", blob_mib), ("net", net_mib)):
        b = f"norm {kind}: blobtool"
        floor = f"norm {kind}: floor"
        idiom = f"norm {kind}: pycaffe idiom"
        lines.append(f"| {b} | {t(b):.3f} | {m(b):.0f} | {t(b) / t(floor):.2f}x floor; "
                     f"{t(idiom) / t(b):.1f}x faster than pycaffe; RSS {m(b) / size:.2f}x file |")
        lines.append(f"| {floor} | {t(floor):.3f} | {m(floor):.0f} | |")
        lines.append(f"| {idiom} | {t(idiom):.3f} | {m(idiom):.0f} | RSS {m(idiom) / size:.2f}x file |")
    for name in ("convert --double f32", "scale f32"):
        lines.append(f"| {name} | {t(name):.3f} | {m(name):.0f} | |")
    startup = t("info small")
    lines.append(f"| info net | {t('info net'):.3f} | {m('info net'):.0f} | "
                 f"{t('info net') - startup:+.3f} s beyond start-up |")
    lines.append(f"| info small | {startup:.3f} | {m('info small'):.0f} | "
                 f"{startup / t('import numpy'):.2f}x import numpy |")
    lines.append(f"| import numpy | {t('import numpy'):.3f} | {m('import numpy'):.0f} | |")
    one = f"norm {files} files --jobs 1"
    many = f"norm {files} files (all cores)"
    lines.append(f"| {one} | {t(one):.3f} | {m(one):.0f} | |")
    lines.append(f"| {many} | {t(many):.3f} | {m(many):.0f} | {t(one) / t(many):.2f}x speed-up |")
    if huge:
        lines += ["", f"Over 2 GiB (`--huge`): a {huge['bytes'] / 2**30:.2f} GiB float32 blob.", "",
                  "| case | s | peak RSS MiB |", "|---|---:|---:|"]
        for name in HUGE_READERS + ("convert --double",):
            lines.append(f"| {name} | {huge[name][0]:.2f} | {huge[name][1]:.0f} |")
        lines.append("")
        lines.append(f"convert wrote {huge['out_bytes'] / 2**30:.2f} GiB; `compare` of input and output "
                     f"exited {huge['compare_exit']} ({'equal' if huge['compare_exit'] == 0 else 'DIFFERENT'}).")
    lines += big_section(res, big_bytes)
    flood_sizes, hdf5_sizes = flood_sizes or {}, hdf5_sizes or {}
    lines += floods_section(res, flood_sizes, hdf5_sizes)
    big = big_figures(res)
    reader_rss = max(m(name) for name in BIG_READERS)
    targets = [
        ("big: norm <= 2x the read floor beyond start-up", big["big: norm"] <= 2),
        ("big: compare (1 in 1000 differ) <= 4x reading both beyond start-up",
         big["big: compare, 1 in 1000 differ"] <= 4),
        ("big: info --stats <= 6x the read floor beyond start-up", big["big: info --stats"] <= 6),
        (f"big: peak RSS of norm, compare, info --stats and show <= 200 MB ({reader_rss:.0f} MiB)",
         reader_rss <= READER_RSS_MIB),
    ]
    targets += flood_targets(res, flood_sizes, hdf5_sizes)
    if huge:
        huge_rss = max(huge[name][1] for name in HUGE_READERS)
        targets.append((f"--huge: peak RSS of norm, info --stats, show and compare <= 200 MB ({huge_rss:.0f} MiB)",
                        huge_rss <= READER_RSS_MIB))
    targets += [
        ("norm f32 <= 1.2x floor", t("norm f32: blobtool") <= 1.2 * t("norm f32: floor")),
        ("norm f32 >= 3x faster than pycaffe", t("norm f32: pycaffe idiom") >= 3 * t("norm f32: blobtool")),
        ("norm f32 peak RSS <= 1.1x file + 120 MB", m("norm f32: blobtool") <= 1.1 * blob_mib + 120),
        ("convert --double / scale peak RSS <= 200 MB",
         max(m("convert --double f32"), m("scale f32")) <= 200),
        ("info on the net <= 0.2 s beyond start-up", t("info net") - startup <= 0.2),
        ("info small <= 2x import numpy", startup <= 2 * t("import numpy")),
    ]
    lines += ["", "Targets:", ""]
    lines += [f"- {'met' if ok else 'NOT met'}: {name}" for name, ok in targets]
    return "\n".join(lines) + "\n"


BIG_READERS = ("big: norm", "big: info --stats", "big: show", "big: compare, 1 in 1000 differ",
               "big: compare, equal files")


def big_figures(res: dict) -> dict:
    """Each big-file command's time beyond start-up (info on the same file) over the read floor (cat).

    A compare reads two files: its time is set against reading both.
    """
    start = res["big: info (start-up)"][0]
    floor = res["big: read floor (cat)"][0]
    return {name: (res[name][0] - start) / (floor * (2 if "compare" in name else 1)) for name in BIG_READERS}


def big_section(res: dict, big_bytes: int) -> list:
    ratios = big_figures(res)
    lines = ["", f"Big files: a {big_bytes / 2**30:.2f} GiB float32 blob (and a copy with one value in 1000 "
             "changed, for compare). Each command's time beyond start-up (`blobtool info` on the same file) "
             "against the page-cache read floor (`cat FILE > /dev/null`; a compare against reading both files).",
             "", "| case | median s | peak RSS MiB | beyond start-up |", "|---|---:|---:|---|"]
    for name in ("big: read floor (cat)", "big: info (start-up)"):
        lines.append(f"| {name} | {res[name][0]:.3f} | {res[name][1]:.0f} | |")
    start = res["big: info (start-up)"][0]
    for name in BIG_READERS:
        lines.append(f"| {name} | {res[name][0]:.3f} | {res[name][1]:.0f} | {res[name][0] - start:+.3f} s, "
                     f"{ratios[name]:.1f}x the read |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
