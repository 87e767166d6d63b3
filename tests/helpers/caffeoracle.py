"""Real Caffe as the tests' oracle: a net, its weights and inputs in, every blob Caffe computes out.

``../shared/oracles/caffe`` (beside the checkout) holds a CPU build of Caffe
(BVLC plus caffe-ssd's layers) with pycaffe, built for Debian's own Python:
it runs under ``/usr/bin/python3`` in a process of its own
(tests/helpers/caffe_worker.py), never imported here. One worker serves a whole test
module (``oracle()``, a module-scoped fixture's value), so a sweep of many
nets starts Caffe once.

- ``Caffe.forward(prototxt, weights, inputs)``: {blob name: float32 array}
  for every blob of Caffe's ``net.blobs`` (its own names, the Split blobs it
  inserts included), each input reshaped to its array's shape first; or a
  ``Refusal`` holding the line Caffe died with where it refuses the net
  (glog's CHECK: exit 134).
- ``against_caffe(tmp_path, layers, feeds, tolerance=...)``: blobtool's run of
  the net (caffenets.ours_forward) held to Caffe's on every top;
- ``require_oracle()``: the oracle's folder, or a skip naming why it is
  absent; under CI (``CI`` set) its absence fails instead, since CI installs
  it (.ci/run).

Tests that use it carry the ``caffe`` marker (``pytest -m caffe``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
ORACLE = HERE.parents[2] / "shared" / "oracles" / "caffe"
SYSTEM_PYTHON = "/usr/bin/python3"
WORKER = HERE / "caffe_worker.py"


def save_arrays(path, arrays: dict) -> None:
    """An .npz of `arrays` by name; np.savez(**arrays) would take an input named `file` or `like` as its own argument."""
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        for name, value in arrays.items():
            with archive.open(name + ".npy", "w") as member:
                np.lib.format.write_array(member, np.asarray(value))


@dataclass
class Refusal:
    """Caffe refused the net: the process ended (exit `code`) with `line` (its CHECK's message)."""

    code: int
    line: str


def _why_absent() -> str | None:
    if not (ORACLE / "python" / "caffe").is_dir():
        return f"no Caffe oracle at {ORACLE} (the checkout has no ../shared/oracles/caffe beside it)"
    if not Path(SYSTEM_PYTHON).exists():
        return f"the Caffe oracle runs under {SYSTEM_PYTHON}, which this machine lacks"
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import caffe"], env=_env(), capture_output=True, text=True,
                           timeout=120)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no message"])[-1]
        return f"the Caffe oracle does not import ({last}): run bash {ORACLE / 'install.sh'}"
    return None


_ABSENT: list = []


def require_oracle() -> Path:
    """The oracle's folder; skip (or, under CI, fail) with the reason where it cannot run."""
    if not _ABSENT:
        _ABSENT.append(_why_absent())
    why = _ABSENT[0]
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Caffe oracle tests: {why}")
        pytest.skip(why)
    return ORACLE


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=str(ORACLE / "python"), GLOG_minloglevel="2", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    return env


def _reason(stderr: str) -> str:
    """The line a Caffe process died with: glog's fatal line (F...) or a Check failed, else its first line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    failed = [ln for ln in lines if "Check failed" in ln or ln.startswith("F")]
    return (failed or lines or ["no message"])[0]


class Caffe:
    """One Caffe worker process; each net runs in a child it forks, so a refusal ends only that child."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.process = None
        self.types: list = []
        self._stderr = None

    def _start(self) -> None:
        self._close_stderr()
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen([SYSTEM_PYTHON, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self._stderr, env=_env(), text=True)
        hello = self._answer()
        if hello is None:
            raise RuntimeError(f"the Caffe worker did not start: {self._last_line()}")
        self.types = hello["types"]

    def _answer(self):
        for line in self.process.stdout:
            if line.startswith("@@ "):
                return json.loads(line[3:])
        return None

    def _last_line(self) -> str:
        self._stderr.seek(0)
        return _reason(self._stderr.read())

    def layer_types(self) -> list:
        if self.process is None:
            self._start()
        return list(self.types)

    def forward(self, prototxt, weights, inputs: dict, folder: Path):
        """{blob name: float32 array} of every blob Caffe computes, or a Refusal (see the module)."""
        if self.process is None or self.process.poll() is not None:
            self._drop_process()
            self._start()
        feeds, out = Path(folder) / "caffe_inputs.npz", Path(folder) / "caffe_blobs.npz"
        save_arrays(feeds, {k: np.asarray(v, np.float32) for k, v in inputs.items()})
        out.unlink(missing_ok=True)
        request = {"prototxt": str(prototxt), "weights": str(weights) if weights else None, "inputs": str(feeds),
                   "out": str(out)}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        reply = self._answer()
        if reply is None:
            code = self.process.wait(timeout=60)
            refusal = Refusal(code, self._last_line())
            self._drop_process()
            return refusal
        if reply.get("refused"):
            return Refusal(reply["code"], _reason(reply["stderr"]))
        if not reply["ok"]:
            return Refusal(0, reply["error"])
        with np.load(out) as blobs:
            return {name: blobs[name] for name in reply["blobs"]}

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=60)
        self._drop_process()
        self._close_stderr()

    def _drop_process(self) -> None:
        """Forget an ended worker, closing its pipes (a file left to the collector warns in another test)."""
        if self.process is not None:
            for pipe in (self.process.stdin, self.process.stdout):
                if pipe is not None and not pipe.closed:
                    with contextlib.suppress(OSError):  # a worker that died leaves a broken pipe
                        pipe.close()
        self.process = None

    def _close_stderr(self) -> None:
        """The worker's stderr file is closed with the worker (a new worker gets a new one)."""
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def max_relative(ours: np.ndarray, caffes: np.ndarray) -> float:
    """max |ours - caffe's| as a fraction of the largest magnitude of Caffe's blob (0 for an all-zero blob)."""
    a, b = np.asarray(ours, np.float64), np.asarray(caffes, np.float64)
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    worst = float(np.max(np.abs(a - b))) if b.size else 0.0
    return worst / scale if scale else worst


_SHARED: list = []


def shared_worker() -> Caffe:
    """The one Caffe worker of this test process (started on first use, closed at exit); skip where absent."""
    folder = require_oracle()
    if not _SHARED:
        import atexit

        worker = Caffe(folder)
        atexit.register(worker.close)
        _SHARED.append(worker)
    return _SHARED[0]


def caffe_values(message, feeds: dict, folder: Path, tops=None) -> dict:
    """{blob: Caffe's value} of net `message` (a NetParameter with its blobs) run on `feeds`; a refusal fails the test.

    The net is written as its definition (text, no blobs) and its binary
    weights, as a user hands them to caffe.Net.
    """
    from caffenets import write_net_files

    prototxt, model = write_net_files(Path(folder), message, stem="caffe_net")
    got = shared_worker().forward(prototxt, model, feeds, Path(folder))
    if isinstance(got, Refusal):
        pytest.fail(f"Caffe refused the net (exit {got.code}): {got.line}")
    return got if tops is None else {top: got[top] for top in tops}


def against_caffe(tmp_path, layers, feeds: dict, *, tolerance: float, compare: dict | None = None) -> dict:
    """Run the net in blobtool and in real Caffe; assert every top agrees within `tolerance`; blobtool's values back.

    Each top's shape must be Caffe's, and its infinities and NaN stand where
    Caffe's do (exp past float32's range, a window past the image); the
    other values agree within `tolerance` of Caffe's largest magnitude.
    `compare` gives a top its own check instead: {top: fn(top, ours, caffe's)}.
    """
    from caffenets import max_scaled_difference, net, ours_forward, tops_of

    message = net(layers, {name: list(np.shape(x)) for name, x in feeds.items()})
    tops = tops_of(message.layer)
    ours = ours_forward(message, feeds, tops)
    theirs = caffe_values(message, feeds, tmp_path, tops)
    for top in tops:
        mine, caffes = ours[top], theirs[top]
        if compare and top in compare:
            compare[top](top, mine, caffes)
            continue
        assert mine.shape == caffes.shape, f"{top}: shape {mine.shape}, Caffe's {caffes.shape}"
        special = ~np.isfinite(mine) | ~np.isfinite(caffes)
        assert np.array_equal(mine[special], caffes[special], equal_nan=True), \
            f"{top}: infinities or NaN where Caffe has none, or none where it has"
        difference = max_scaled_difference(np.where(special, 0, mine), np.where(special, 0, caffes))
        assert difference <= tolerance, f"{top}: {difference:.3g} from Caffe"
    return ours


def caffe_refusal(message, feeds: dict, folder: Path):
    """Caffe's Refusal of net `message`, or None where Caffe runs it."""
    from caffenets import write_net_files

    prototxt, model = write_net_files(Path(folder), message, stem="caffe_net")
    got = shared_worker().forward(prototxt, model, feeds, Path(folder))
    return got if isinstance(got, Refusal) else None


def caffe_refusals(cases, folder: Path) -> list:
    """For each (net message, feeds) of `cases`, Caffe's Refusal of it, or None where Caffe runs it."""
    found = []
    for k, (message, feeds) in enumerate(cases):
        here = Path(folder) / f"case{k}"
        here.mkdir(parents=True, exist_ok=True)
        found.append(caffe_refusal(message, feeds, here))
    return found


def caffe_files(prototxt, weights, feeds: dict, folder: Path) -> dict:
    """{blob: Caffe's value} of the net in files `prototxt` and `weights` run on `feeds`; a refusal fails the test."""
    work = Path(folder) / "caffe_work"
    work.mkdir(exist_ok=True)
    got = shared_worker().forward(prototxt, weights, feeds, work)
    if isinstance(got, Refusal):
        pytest.fail(f"Caffe refused {Path(prototxt).name} with {Path(weights).name if weights else 'no weights'} "
                    f"(exit {got.code}): {got.line}")
    return got
