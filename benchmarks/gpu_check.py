"""The GPU check: blobtool's GPU tests and GPU timings on one CUDA machine, in one run.

    python benchmarks/gpu_check.py            # from the repository root

Needs a CUDA GPU with CuPy, numpy, click, protobuf, rich and pytest already
installed; nothing is fetched from the network. It:

1. installs blobtool from this working tree (pip --no-index --no-deps; if pip
   cannot, the tree is used in place through PYTHONPATH);
2. runs the `gpu` tests (tests/test_gpu.py);
3. times pinned host-to-device copies (GB/s); asum+sumsq of a 4 GiB
   device-resident float32 blob against the device's measured copy bandwidth;
   and `blobtool norm --device 0` on a 2 GiB file against the CPU path;
4. prints a short table last, and writes it (with the test log) under $OUT
   when that variable is set, else under benchmarks/.

Runs in well under 8 minutes on one H200.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "benchmarks"
GIB = 1 << 30


def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def install() -> str:
    res = sh([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-build-isolation",
              "-q", str(ROOT)])
    if res.returncode == 0:
        return "pip install --no-index (working tree)"
    os.environ["PYTHONPATH"] = f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    sys.path.insert(0, str(ROOT))
    return f"in place via PYTHONPATH (pip said: {res.stderr.strip().splitlines()[-1:]})"


def run_tests() -> tuple[str, str]:
    res = sh([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
              str(ROOT / "tests" / "test_gpu.py")], cwd=str(ROOT))
    tail = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else res.stderr.strip()
    return tail, res.stdout + res.stderr


def best_of(fn, reps=5):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def timings() -> list:
    import cupy as cp
    import cupyx
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from blobtool import Blob, device
    from blobtool.syncedmem import set_backend

    rows = []
    backend = device.use(0)
    rows.append(("device", backend.name, ""))

    # Pinned host-to-device copy.
    nbytes = 1 * GIB
    host = cupyx.empty_pinned(nbytes, dtype=np.uint8)
    host[:] = 1
    dev = cp.empty(nbytes, dtype=cp.uint8)

    def h2d():
        dev.set(host)
        cp.cuda.Device(0).synchronize()
    t = best_of(h2d)
    rows.append(("pinned H2D copy, 1 GiB", f"{nbytes / t / 1e9:.1f} GB/s", f"{t * 1e3:.1f} ms"))
    del dev, host

    # Device copy bandwidth (read + write), the reference for a reduction.
    n = 4 * GIB // 4
    a = cp.random.standard_normal(n, dtype=cp.float32)
    b = cp.empty_like(a)

    def d2d():
        b[...] = a
        cp.cuda.Device(0).synchronize()
    t_copy = best_of(d2d)
    copy_bw = 2 * a.nbytes / t_copy
    rows.append(("device copy, 4 GiB (read+write)", f"{copy_bw / 1e9:.0f} GB/s", f"{t_copy * 1e3:.1f} ms"))
    del b

    # asum + sumsq of a 4 GiB device-resident blob, through the engine.
    blob = Blob(n, dtype=np.float32)
    blob.data_memory.set_gpu_data(a)

    def reduce():
        blob.asum_sumsq_data()
    t_red = best_of(reduce)
    # Two reductions each read the blob once: bytes read / time, against the copy rate.
    read_bw = 2 * a.nbytes / t_red
    rows.append(("asum+sumsq, 4 GiB on device", f"{read_bw / 1e9:.0f} GB/s read",
                 f"{t_red * 1e3:.1f} ms; {read_bw / copy_bw:.2f}x copy bandwidth"))
    del blob, a
    set_backend(None)
    cp.get_default_memory_pool().free_all_blocks()

    # blobtool norm --device 0 on a 2 GiB file against the CPU path.
    path = Path(os.environ.get("TMPDIR", "/tmp")) / "blobtool-gpu-check.pb"
    count = 2 * GIB // 4
    from blobtool import wire
    with open(path, "wb") as out:
        out.write(wire.len_field_header(5, count * 4))
        rng = np.random.default_rng(0)
        step = 64 << 20
        for start in range(0, count, step):
            out.write(rng.standard_normal(min(step, count - start), dtype=np.float32).tobytes())
        from blobtool._pb.blobtool_caffe_pb2 import BlobProto
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
        import json
        cpu = json.loads(results["cpu"][1].stdout)["blobs"][0]["data"]
        gpu = json.loads(results["gpu"][1].stdout)["blobs"][0]["data"]
        rel = abs(cpu["sumsq"] - gpu["sumsq"]) / cpu["sumsq"]
        rows.append(("blobtool norm, 2 GiB file: CPU", f"{results['cpu'][0]:.2f} s", ""))
        rows.append(("blobtool norm, 2 GiB file: --device 0", f"{results['gpu'][0]:.2f} s",
                     f"{results['cpu'][0] / results['gpu'][0]:.2f}x CPU; sumsq rel diff {rel:.1e}"))
    finally:
        path.unlink(missing_ok=True)
    return rows


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    how = install()
    summary, log = run_tests()
    (OUT / "gpu_tests.log").write_text(log)
    rows = [("install", how, ""), ("gpu tests", summary, "")]
    try:
        rows += timings()
    except Exception as exc:  # report, keep the table
        rows.append(("timings", f"failed: {type(exc).__name__}: {exc}", ""))
    width = max(len(r[0]) for r in rows)
    table = "\n".join(f"{name:<{width}}  {value}  {note}".rstrip() for name, value, note in rows)
    (OUT / "gpu_check.txt").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
