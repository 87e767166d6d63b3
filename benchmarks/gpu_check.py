"""The GPU check: blobtool's GPU tests and GPU timings on one CUDA machine, in one run.

    python benchmarks/gpu_check.py            # from the repository root
    python benchmarks/gpu_check.py --fake     # no GPU: the same steps on tests/helpers/fakecupy.py, tiny sizes

Needs a CUDA GPU with CuPy, numpy, click, protobuf, rich and pytest already
installed. It installs nothing and fetches nothing: blobtool runs from this
working tree in place (PYTHONPATH). It:

1. runs the `gpu` tests (tests/engine/test_gpu.py);
2. measures the host-to-device copy bandwidth from pinned and from pageable
   memory (GB/s); the device's own copy bandwidth, as the reference for a
   reduction; the rate of the fused asum+sumsq kernel over a 4 GiB
   device-resident float32 blob (GB/s read, one pass); the rate of the
   streamed reduction norm --device uses (host array -> pinned buffers ->
   device, copy and reduction overlapped) against the pinned copy
   bandwidth; and `blobtool norm --device 0` on a 2 GiB file against the CPU
   path;
3. prints a short table last, and writes it (with the test log) under $OUT
   when that variable is set, else under benchmarks/.

Runs in well under 8 minutes on one H200. Without CuPy or a GPU the timings
row says why they could not run, and the table is still written. With
--fake the timings run on the host-only stand-in for CuPy of tests/, on a
few MiB, to check this script itself: its figures mean nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "benchmarks"
GIB = 1 << 30
MIB = 1 << 20


def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def use_tree() -> str:
    """Run blobtool from this working tree, here and in the processes started; installs nothing."""
    os.environ["PYTHONPATH"] = f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    sys.path.insert(0, str(ROOT))
    return "this working tree, in place (nothing installed)"


def run_tests() -> tuple[str, str]:
    res = sh([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
              str(ROOT / "tests" / "engine" / "test_gpu.py")], cwd=str(ROOT))
    tail = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else res.stderr.strip()
    return tail, res.stdout + res.stderr


def best_of(fn, reps=5):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def gbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9


def timings(fake: bool) -> list:
    if fake:
        sys.path.insert(0, str(ROOT / "tests" / "helpers"))
        import fakecupy
        fakecupy.install()
    import cupy as cp
    import cupyx
    import numpy as np

    from blobtool import Blob
    from blobtool.engine import device
    from blobtool.engine.syncedmem import set_backend

    scale = MIB if fake else GIB  # the sizes below are in units of this
    unit = "MiB" if fake else "GiB"
    rows = []
    backend = device.use(0)
    rows.append(("device", backend.name, "(fake CuPy: figures mean nothing)" if fake else ""))

    def sync():
        cp.cuda.Device(0).synchronize()

    # Host-to-device copies, from pinned and from pageable memory.
    nbytes = 1 * scale
    dev = cp.empty(nbytes, dtype=cp.uint8)
    pinned_bw = 0.0
    for label, host in (("pinned", cupyx.empty_pinned(nbytes, dtype=np.uint8)),
                        ("pageable", np.empty(nbytes, dtype=np.uint8))):
        host[:] = 1

        def h2d():
            dev.set(host)
            sync()
        t = best_of(h2d)
        if label == "pinned":
            pinned_bw = gbps(nbytes, t)
        rows.append((f"H2D copy, {label}, 1 {unit}", f"{gbps(nbytes, t):.1f} GB/s", f"{t * 1e3:.1f} ms"))
        del host
    del dev

    # Device copy bandwidth (read + write), the reference for a reduction.
    n = 4 * scale // 4
    a = cp.asarray(np.random.default_rng(0).standard_normal(n, dtype=np.float32)) if fake else \
        cp.random.standard_normal(n, dtype=cp.float32)
    b = cp.empty_like(a)

    def d2d():
        b[...] = a
        sync()
    t_copy = best_of(d2d)
    copy_bw = 2 * a.nbytes / t_copy
    rows.append((f"device copy, 4 {unit} (read+write)", f"{copy_bw / 1e9:.0f} GB/s", f"{t_copy * 1e3:.1f} ms"))
    del b

    # The fused asum+sumsq of a device-resident blob, through the engine: one pass.
    blob = Blob(n, dtype=np.float32)
    blob.data_memory.set_gpu_data(a)

    def reduce():
        blob.asum_sumsq_data()
    t_red = best_of(reduce)
    read_bw = a.nbytes / t_red
    rows.append((f"fused asum+sumsq, 4 {unit} on device", f"{read_bw / 1e9:.0f} GB/s read",
                 f"{t_red * 1e3:.1f} ms; {read_bw / copy_bw:.2f}x copy bandwidth"))
    del blob, a

    # The streamed reduction of norm --device: a host array through the pinned buffers.
    host = np.random.default_rng(1).standard_normal(2 * scale // 4, dtype=np.float32)
    streamer = backend.streamer(device.STREAM_CHUNK if not fake else MIB)

    def streamed():
        streamer.asum_sumsq([host])
    t_stream = best_of(streamed, reps=3)
    rate = gbps(host.nbytes, t_stream)
    rows.append((f"streamed asum+sumsq, 2 {unit} from host", f"{rate:.1f} GB/s",
                 f"{t_stream * 1e3:.1f} ms; {rate / pinned_bw:.2f}x pinned H2D"))
    streamer.close()
    del host, streamer
    set_backend(None)
    if not fake:
        cp.get_default_memory_pool().free_all_blocks()
        rows += norm_file()
    return rows


def norm_file() -> list:
    """blobtool norm --device 0 on a 2 GiB file against the CPU path, in separate processes."""
    import json

    import numpy as np

    from blobtool.formats.caffe import wire
    from blobtool._pb.blobtool_caffe_pb2 import BlobProto

    rows = []
    path = Path(os.environ.get("TMPDIR", "/tmp")) / "blobtool-gpu-check.pb"
    count = 2 * GIB // 4
    with open(path, "wb") as out:
        out.write(wire.len_field_header(5, count * 4))
        rng = np.random.default_rng(0)
        step = 64 << 20
        for start in range(0, count, step):
            out.write(rng.standard_normal(min(step, count - start), dtype=np.float32).tobytes())
        shape = BlobProto()
        shape.shape.dim.append(count)
        out.write(shape.SerializeToString())
    try:
        bt = [sys.executable, "-m", "blobtool", "norm", "--json"]
        sh(bt + [str(path)])  # warm the page cache
        results = {}
        for label, extra in (("cpu", []), ("gpu", ["--device", "0"])):
            t = time.perf_counter()
            res = sh(bt + extra + [str(path)])
            results[label] = (time.perf_counter() - t, res)
            if res.returncode != 0:
                raise RuntimeError(f"norm {label} failed: {res.stderr.strip()}")
        cpu = json.loads(results["cpu"][1].stdout)["blobs"][0]["data"]
        gpu = json.loads(results["gpu"][1].stdout)["blobs"][0]["data"]
        rel = abs(cpu["sumsq"] - gpu["sumsq"]) / cpu["sumsq"]
        rows.append(("blobtool norm, 2 GiB file: CPU", f"{results['cpu'][0]:.2f} s", ""))
        rows.append(("blobtool norm, 2 GiB file: --device 0", f"{results['gpu'][0]:.2f} s",
                     f"{results['cpu'][0] / results['gpu'][0]:.2f}x CPU; sumsq rel diff {rel:.1e}"))
    finally:
        path.unlink(missing_ok=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake", action="store_true",
                        help="no GPU: time on tests/helpers/fakecupy.py with tiny sizes, to check this script")
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    how = use_tree()
    rows = [("blobtool", how, "")]
    if not args.fake:
        summary, log = run_tests()
        (OUT / "gpu_tests.log").write_text(log)
        rows.append(("gpu tests", summary, ""))
    try:
        rows += timings(args.fake)
    except Exception as exc:  # report, keep the table
        rows.append(("timings", f"failed: {type(exc).__name__}: {exc}", ""))
    width = max(len(r[0]) for r in rows)
    table = "\n".join(f"{name:<{width}}  {value}  {note}".rstrip() for name, value, note in rows)
    (OUT / "gpu_check.txt").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
