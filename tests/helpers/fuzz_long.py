"""A long fuzz run over every reader, from one command.

    python tests/helpers/fuzz_long.py --seconds 600             # atheris if installed, else random mutations
    python tests/helpers/fuzz_long.py --seconds 600 --engine random
    python tests/helpers/fuzz_long.py --nets --seconds 600       # deploy definitions through run and export

With atheris (pip install atheris) the run is coverage-guided: libFuzzer's own
byte mutations, half the time replaced by fuzzcases' protobuf-aware ones
(cuts at field boundaries, forged lengths, replaced tags ...), starting from
the generated seeds (HDF5 among them: chunked, compressed, big-endian,
float16 and compact datasets, and files refused whole for naming other files:
external storage, virtual datasets, external and soft links, names that are
not UTF-8; safetensors files that blobtool and the safetensors package wrote,
whose length field and JSON values are also forged) and the first 64 KiB of
each real Caffe file in
../shared/realworld (when present). Without it, fuzzcases' mutations are
applied at random to the seeds and the whole real files.

It runs with any Python 3.10+: where that one lacks blobtool's dependencies
or the test oracles (protobuf, rich, h5py, safetensors ...), it makes once a
virtual environment in ~/.cache/blobtool that sees the interpreter's own
packages, has pip install what is missing there (pyproject.toml's
versions), and runs in it; it says so in one line first.

Every input goes through fuzzcases.check_case, sniffed and forced to one kind:
anything but BlobToolError, a warning, over 1 s, or allocations over 8x the
input + 1 MiB is a failure. The random engine saves failing inputs in
WORKDIR/failures and goes on; atheris stops at the first and saves it as
crash-*. Both print a summary line every 30 s and at the end, and keep it in
WORKDIR/stats.json.

With --nets it fuzzes deploy definitions instead of readers (tests/helpers/netfuzz.py):
small valid nets whose numbers are pushed to their edges, layers repeated,
bottoms rewired, names made to collide, each written as a .caffemodel and/or
a .prototxt and given to blobtool's run and export library calls in a forked
child (an address-space limit, a hard timeout). Anything but BlobToolError, a
warning, a call over 2 s, traced allocations over 256 MiB, a refused export
that left its file, or a model onnx's checker refuses is a failure; each
distinct kind is saved in WORKDIR/failures as a Python reproducer (made
smaller first with --minimize) and counted in stats.json.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The tests' helpers, and the checkout's own blobtool (the run needs no install; an installed
# blobtool is used where this file is not inside a checkout of it).
sys.path.insert(0, str(HERE))
if (HERE.parents[1] / "blobtool" / "__init__.py").is_file():
    sys.path.insert(1, str(HERE.parents[1]))

# What the run imports: blobtool's own dependencies and the test extra's oracles (pyproject.toml).
_NEEDED = {"numpy": "numpy", "google.protobuf": "protobuf", "click": "click", "rich": "rich",
           "hypothesis": "hypothesis", "h5py": "h5py", "safetensors": "safetensors"}
_ENV_MARK = "BLOBTOOL_FUZZ_ENV"  # set in the environment the run prepared for itself


def _missing() -> list:
    import importlib.util

    found = []
    for module, package in _NEEDED.items():
        try:
            present = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a parent package (google) is missing
            present = False
        if not present:
            found.append(package)
    return found


def _run_where_the_dependencies_are(argv) -> None:
    """Where this interpreter lacks some of them: make (once) a virtual environment beside it that has
    them, with the interpreter's own packages visible, and run there instead (never returns)."""
    import os
    import subprocess
    import venv

    missing = _missing()
    if not missing or os.environ.get(_ENV_MARK):
        return
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "blobtool"
    env = home / f"fuzz-env-py{sys.version_info[0]}.{sys.version_info[1]}"
    python = env / "bin" / "python"
    print(f"fuzz_long: this Python lacks {', '.join(missing)}: running in {env}, where pip installs them "
          "(once)", file=sys.stderr, flush=True)
    if not python.exists():
        venv.EnvBuilder(system_site_packages=True, with_pip=True).create(env)
    specs = _requirements(missing)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *specs], check=True)
    os.environ[_ENV_MARK] = "1"
    os.execv(str(python), [str(python), str(Path(__file__).resolve()), *(sys.argv[1:] if argv is None else argv)])


def _requirements(packages: list) -> list:
    """The version specifiers pyproject.toml gives `packages` (the names alone where it has none)."""
    import re

    try:
        import tomllib

        project = tomllib.loads((HERE.parents[1] / "pyproject.toml").read_text())["project"]
        specs = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    except (ImportError, OSError, KeyError):
        specs = []
    by_name = {re.split(r"[<>=!~ \[]", spec, maxsplit=1)[0].lower(): spec for spec in specs}
    return [by_name.get(package, package) for package in packages]


REALWORLD = HERE.parents[2] / "shared" / "realworld"
# Kinds an input may be forced to (one per input, chosen from its last byte).
FORCED = ("blob", "vector", "net", "solverstate", "npy", "npz", "safetensors", "pt")


class Stats:
    """Counts kept while fuzzing, written to stats.json and printed."""

    def __init__(self, path: Path, engine: str, bound):
        self.path = path
        self.bound = bound
        self.data = {"engine": engine, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": 0.0,
                     "inputs": 0, "cases": 0, "accepted": 0, "refused": 0, "failures": 0,
                     "max_case_seconds": 0.0, "max_memory_bound_used": 0.0, "bytes_max": 0}
        self.t0 = time.monotonic()
        self.last_print = self.t0

    def add(self, data: bytes, outcomes, failed: bool = False) -> None:
        d = self.data
        d["inputs"] += 1
        d["bytes_max"] = max(d["bytes_max"], len(data))
        d["failures"] += failed
        for o in outcomes:
            d["cases"] += 1
            d["accepted" if o.error is None else "refused"] += 1
            d["max_case_seconds"] = max(d["max_case_seconds"], round(o.seconds, 4))
            # The peak as a fraction of fuzzcases.memory_bound (over 1 fails).
            d["max_memory_bound_used"] = max(d["max_memory_bound_used"],
                                             round(o.peak / self.bound(len(data)), 3))
        now = time.monotonic()
        if now - self.last_print >= 30:
            self.flush()
            self.last_print = now

    def flush(self) -> None:
        self.data["seconds"] = round(time.monotonic() - self.t0, 1)
        self.path.write_text(json.dumps(self.data, indent=1) + "\n")
        print("fuzz_long:", json.dumps(self.data), flush=True)


def run_one(fc, data: bytes):
    """The sniffed read and one forced kind; returns the outcomes or raises FuzzFailure."""
    forced = FORCED[data[-1] % len(FORCED)] if data else "blob"
    return [fc.check_case(data, None), fc.check_case(data, forced)]


def seeds(fc, *, head: int | None):
    found = fc.generated_seeds()
    real = fc.realworld_seeds(REALWORLD) if REALWORLD.is_dir() else []
    try:
        import h5py  # noqa: F401  (Caffe's HDF5 snapshots too, when the hdf5 extra is installed)
    except ImportError:
        pass
    else:
        found += fc.hdf5_seeds() + fc.hdf5_refused_seeds()
        real += fc.realworld_hdf5_seeds(REALWORLD) if REALWORLD.is_dir() else []
    try:
        import stcases  # safetensors seeds (the safetensors package writes one of them)
    except ImportError:
        pass
    else:
        found += stcases.seeds()
    for seed in found:  # the readers' own imports (protobuf, h5py) happen here, not inside a traced case
        try:
            fc.read_everything(seed.data, None)
        except fc.BlobToolError:
            pass  # the seeds of files refused whole (HDF5 that names other files)
    return found + [fc.Seed(s.name, s.kind, s.data[:head] if head else s.data) for s in real]


def layout_for(fc, seed):
    """Where a seed's fields lie: safetensors' header and tensors, else fuzzcases' own reading."""
    if seed.kind == "safetensors":
        import stcases
        return stcases.st_layout(seed.data)
    return fc.layout_of(seed)


def mutate_any(fc, seed, lay, pick, rounds: int) -> bytes:
    """fuzzcases' mutations, plus forged lengths and hostile JSON values for a safetensors seed."""
    if seed.kind == "safetensors":
        import stcases
        return stcases.mutate(seed, lay, pick, rounds)
    return fc.mutate(seed, lay, pick, rounds)


def run_random(fc, args, stats: Stats) -> int:
    rng = random.Random(args.seed)
    pick = fc.random_picker(rng)
    pool = seeds(fc, head=None)
    layouts = {s.name: layout_for(fc, s) for s in pool}
    failures = args.workdir / "failures"
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        seed = rng.choice(pool)
        data = mutate_any(fc, seed, layouts[seed.name], pick, rng.randint(1, 4))
        try:
            outcomes = run_one(fc, data)
        except fc.FuzzFailure as exc:
            failures.mkdir(exist_ok=True)
            name = failures / f"{seed.name}-{stats.data['inputs']}.bin"
            name.write_bytes(data)
            (name.with_suffix(".txt")).write_text(f"{exc}\n")
            print(f"fuzz_long: FAILURE saved to {name}: {exc}", flush=True)
            stats.add(data, [], failed=True)
            continue
        stats.add(data, outcomes)
    stats.flush()
    return 1 if stats.data["failures"] else 0


def run_atheris(fc, args, stats: Stats) -> int:
    import atheris

    corpus = args.workdir / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for seed in seeds(fc, head=64 * 1024):
        (corpus / f"seed-{seed.name}").write_bytes(seed.data)
    mutations_rng = random.Random(args.seed)

    def test_one_input(data: bytes) -> None:
        stats.add(data, run_one(fc, data))

    def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
        # Half libFuzzer's byte mutations, half fuzzcases' protobuf-aware ones.
        if seed % 2:
            return atheris.Mutate(data, max_size)
        mutations_rng.seed(seed)
        kind = ("pt" if b"data.pkl" in data else "npz") if data.startswith(b"PK") else \
            "npy" if data.startswith(b"\x93NUMPY") else "blob"
        base = fc.Seed("input", kind, data)
        try:
            lay = fc.layout_of(base)
        except Exception:  # noqa: BLE001 - a header past its own length: mutate as plain bytes
            lay = fc.Layout((0, len(data)), (), ())
        out = fc.mutate(base, lay, fc.random_picker(mutations_rng), 1)
        return out[:max_size]

    libfuzzer_args = [sys.argv[0], str(corpus), f"-max_total_time={args.seconds}", "-timeout=10",
                      f"-max_len={args.max_len}", "-rss_limit_mb=4096", "-print_final_stats=1",
                      f"-seed={args.seed}", f"-artifact_prefix={args.workdir}/"]
    atheris.Setup(libfuzzer_args, test_one_input, custom_mutator=custom_mutator)
    import atexit
    atexit.register(stats.flush)
    atheris.Fuzz()
    return 0


def run_nets(fc, args, stats: Stats) -> int:
    """Mutated deploy definitions through run and export until --seconds pass; 1 when anything failed."""
    import tempfile

    import netfuzz as nf

    rng = random.Random(args.seed)
    pick = fc.random_picker(rng)
    pool = nf.seed_nets()
    nf.preload()
    for seed in pool:  # blobtool's and onnx's imports happen here, once, not in each forked case
        with tempfile.TemporaryDirectory() as folder:
            nf.check_net_case(nf.Mutant(seed.name, seed.message, "model"), Path(folder))
    failures = args.workdir / "failures"
    kinds: dict = {}
    stats.data["kinds"] = kinds
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        seed = rng.choice(pool)
        mutant = nf.mutate_net(seed, pick, rng.randint(1, 3))
        data = mutant.net.SerializePartialToString()
        try:
            outcomes = nf.check_isolated(mutant, timeout=args.case_timeout)
        except fc.FuzzFailure as exc:
            found = nf.failure_kinds(str(exc))
            new = [kind for kind in found if kind not in kinds]
            for kind in found:
                kinds[kind] = kinds.get(kind, 0) + 1
            for kind in new:  # each new kind gets a reproducer of its own, made smaller for it
                small, message = mutant, str(exc)
                if args.minimize:
                    def fails(trial, kind=kind):
                        try:
                            nf.check_isolated(trial, timeout=args.case_timeout)
                        except fc.FuzzFailure as again:
                            return kind in nf.failure_kinds(str(again))
                        return False
                    small = nf.minimize(mutant, fails, budget_s=30)
                    try:
                        nf.check_isolated(small, timeout=args.case_timeout)
                    except fc.FuzzFailure as again:
                        message = str(again)
                failures.mkdir(parents=True, exist_ok=True)
                name = failures / f"net-{list(kinds).index(kind) + 1:03d}-{seed.name}.py"
                name.write_text(nf.reproducer(small, message))
                print(f"fuzz_long: FAILURE ({kind}) saved to {name}: {message}", flush=True)
            stats.add(data, [], failed=True)
            continue
        if outcomes and outcomes[0].call == "skipped":  # legitimately big: not run (netfuzz.BIG_NET_BYTES)
            stats.data["skipped_big"] = stats.data.get("skipped_big", 0) + 1
            outcomes = []
        stats.add(data, outcomes)
    stats.flush()
    return 1 if stats.data["failures"] else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=600, help="how long to run (default 600)")
    parser.add_argument("--engine", choices=("auto", "atheris", "random"), default="auto")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/blobtool-fuzz"),
                        help="where the corpus, failures and stats.json go")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--nets", action="store_true",
                        help="fuzz deploy definitions through run and export (tests/helpers/netfuzz.py), not the readers")
    parser.add_argument("--minimize", action="store_true", help="--nets: make each new failure's net smaller first")
    parser.add_argument("--case-timeout", type=float, default=10.0,
                        help="--nets: seconds after which a case is killed (default 10)")
    parser.add_argument("--max-len", type=int, default=65536 + 4096, help="atheris: largest input in bytes")
    args = parser.parse_args(argv)
    _run_where_the_dependencies_are(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.nets:
        import fuzzcases as fc
        import netfuzz

        stats = Stats(args.workdir / "stats.json", "nets", lambda size: netfuzz.MEMORY_BOUND)
        print(f"fuzz_long: deploy definitions for {args.seconds} s, working in {args.workdir}", flush=True)
        return run_nets(fc, args, stats)
    engine = args.engine
    if engine == "auto":
        try:
            import atheris  # noqa: F401
            engine = "atheris"
        except ImportError:
            engine = "random"
    if engine == "atheris":
        import atheris
        with atheris.instrument_imports(include=["blobtool"]):
            import blobtool.engine.blob  # noqa: F401
            import blobtool.formats.caffe.blobproto  # noqa: F401
            import blobtool.formats.caffe  # noqa: F401
            import blobtool.formats.npyheader  # noqa: F401
            import blobtool.formats.numpy  # noqa: F401
            import blobtool.files  # noqa: F401
            import blobtool.engine.kernels  # noqa: F401
            import blobtool.formats.caffe.wire  # noqa: F401
    import fuzzcases as fc

    stats = Stats(args.workdir / "stats.json", engine, fc.memory_bound)
    print(f"fuzz_long: {engine} for {args.seconds} s, working in {args.workdir}", flush=True)
    return (run_atheris if engine == "atheris" else run_random)(fc, args, stats)


if __name__ == "__main__":
    sys.exit(main())
