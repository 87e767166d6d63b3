"""Process set-up for the command: BLAS threads, memory settings, signals, standard streams, worker processes."""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["runs_nets", "NET_RUNNING_COMMANDS", "single_threaded_blas", "keep_freed_memory", "stop_on_signals", "guard_standard_streams", "records",
           "jobs_to_use", "PARALLEL_THRESHOLD"]

# Below this much input in all, starting worker processes (about 0.25 s each
# here) costs more than it saves; BLOBTOOL_PARALLEL_MIN_BYTES overrides it.
PARALLEL_THRESHOLD = 512 << 20
_BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def single_threaded_blas() -> None:
    """Before numpy loads: one BLAS thread, unless the user chose otherwise.

    blobtool calls BLAS only for dot products of cache-sized chunks, and
    spreads big reductions over the cores itself (blobtool.work). BLAS's
    own threads on such short vectors cost time: norm of 256 MiB of float32
    took 80 ms with OpenBLAS on 2 threads, 56 ms on one, 31 ms split over 2
    of blobtool's threads.

    main() calls it first, before blobtool imports numpy (the command's
    start-up imports none: tests/project/test_package.py). A program that loaded
    numpy itself before calling main() keeps its BLAS threads; the
    variables then reach only the processes it starts, where they are
    unset (a variable the user set is never changed).
    """
    for name in _BLAS_THREAD_VARIABLES:
        os.environ.setdefault(name, "1")


# The commands that run a net: their convolutions and inner products are big matrix products, which
# BLAS's own threads split over the cores (benchmarks/RESULTS.md, run).
NET_RUNNING_COMMANDS = ("run", "predict", "export")


def runs_nets(args) -> bool:
    """Whether a command line runs a net (run, export, or a --check that runs one): BLAS keeps its threads."""
    words = [a for a in args if not a.startswith("-")]
    return bool(words) and (words[0] in NET_RUNNING_COMMANDS or "--check" in args)


def keep_freed_memory() -> bool:
    """Let the C library keep the chunk buffers it frees, instead of returning them to the system.

    The chunked kernels allocate and free a few 512 KiB temporaries per chunk.
    By default glibc serves such sizes with mmap, or trims its heap once they
    are freed, and every reuse faults the pages in again: compare of two
    256 MiB blobs took 2.6 s that way and 0.64 s with a 32 MiB mmap threshold
    and a 256 MiB trim threshold. Memory stays bounded by what is in use at
    once; only the return of freed memory to the system is deferred. True
    when the C library took the settings (glibc).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # a C library without mallopt
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    return bool(mallopt(m_trim_threshold, 256 << 20)) and bool(mallopt(m_mmap_threshold, 32 << 20))


# The signals that stop blobtool as Ctrl-C does (timeout, CI runners and
# `docker stop` send SIGTERM; a closed terminal SIGHUP).
_STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def stop_on_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP raise errors.Stopped: the temporary output is removed, exit 128 + the signal.

    A signal ignored when blobtool started (nohup, a background job) stays
    ignored. Only the first signal stops: later ones are ignored, so that
    they cannot cut short the removal of the temporary output.
    """
    for name in _STOP_SIGNALS:
        signum = getattr(signal, name, None)
        if signum is not None and signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _stop)


def _stop(signum, frame) -> None:
    from ..errors import Stopped

    for name in _STOP_SIGNALS:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    raise Stopped.by_signal(signum, signal.Signals(signum).name)


def guard_standard_streams() -> None:
    """Give a closed standard stream (`>&-`, `<&-`) a descriptor on which every read or write fails (EBADF).

    So reading a closed standard input or writing a closed standard output
    is an error like any other (exit 3, exit 5), and no file blobtool opens
    takes descriptor 0, 1 or 2 by accident. The descriptor is the wrong end
    of a pipe: a write to a read end, or a read from a write end, is EBADF.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        read_end, write_end = os.pipe()
        os.dup2(write_end if fd == 0 else read_end, fd)
        for end in (read_end, write_end):
            if end != fd:
                os.close(end)
    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, encoding="utf-8", closefd=False))


def _total_size(paths) -> int:
    total = 0
    for path in paths:
        try:
            total += os.stat(path).st_size
        except OSError:
            pass
    return total


def jobs_to_use(jobs) -> int:
    """--jobs as it is used: the cores this process may run on (its CPU affinity) when not given, and never more.

    More workers or threads than cores only take turns on them (each worker
    process also costs its start-up and its memory), so a larger --jobs is
    capped, without a message; `taskset -c 0 blobtool ...` works in one.
    """
    from ..api.compute import available_cores

    cores = available_cores()
    return min(jobs, cores) if jobs else cores


def records(paths: list, work, jobs, *, fail_fast: bool = True):
    """work(path) for each path, yielded in input order; in worker processes when several files are given.

    An item of `paths` may be a BlobToolError already (a folder with nothing
    to read): it fails in its place. With `fail_fast` the first failing input
    stops the run, as it would one file at a time; without, a BlobToolError
    of an input is yielded in its place and the run goes on.
    """
    from ..errors import BlobToolError, ExitCode

    def attempt(run, path):
        if isinstance(path, BlobToolError):
            if fail_fast:
                raise path
            return path
        try:
            return run(path)
        except BlobToolError as exc:
            if fail_fast:
                raise
            return exc

    jobs = jobs_to_use(jobs)
    from ..errors import env_count

    threshold = env_count("BLOBTOOL_PARALLEL_MIN_BYTES", PARALLEL_THRESHOLD)
    names = [p for p in paths if isinstance(p, str)]
    if jobs == 1 or len(names) < 2 or "-" in names or _total_size(names) < threshold:
        from ..api.compute import using_threads

        # One file at a time here: its big reductions use the cores instead.
        with using_threads(jobs):
            for path in paths:
                yield attempt(work, path)
        return
    import concurrent.futures
    import concurrent.futures.process
    import multiprocessing

    # Fresh worker processes (spawn), each with one BLAS thread: forked
    # workers inherit numpy's BLAS thread pool, and N workers x M BLAS threads
    # on the same cores ran 10x slower than one process (measured: 32 nets of
    # 16 MiB, 5.8 s against 0.6 s).
    context = multiprocessing.get_context("spawn")
    from ..api.session import guarding
    from ..api.kinds import read_settings

    guard = guarding()
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, len(paths)), mp_context=context,
                                                  initializer=_start_worker, initargs=(read_settings(),))
    try:
        futures = [path if isinstance(path, BlobToolError) else pool.submit(_run_in_worker, guard, work, path)
                   for path in paths]
        for future in futures:
            try:
                yield attempt(lambda f: f.result(), future)
            except concurrent.futures.process.BrokenProcessPool:
                # A worker that found its input cut short under its memory map
                # said so itself and left with exit 3 (source._on_fault).
                workers = list((getattr(pool, "_processes", None) or {}).values())
                pool.shutdown(wait=True, cancel_futures=True)
                for worker in workers:
                    worker.join(timeout=10)
                if ExitCode.INPUT in [worker.exitcode for worker in workers]:
                    raise SystemExit(ExitCode.INPUT) from None
                raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _start_worker(settings) -> None:
    """A worker process's set-up: one BLAS thread, read as the command's options say (--key).

    numpy is not loaded yet in it, so the BLAS setting takes.
    """
    os.environ.update({name: "1" for name in _BLAS_THREAD_VARIABLES})  # this worker's own environment
    from ..api.kinds import use_read_settings

    use_read_settings(settings)


def _run_in_worker(guard: bool, work, path):
    """work(path) in a worker process, its inputs guarded for the run where the command's are (files.guarded)."""
    import contextlib

    from ..api.session import files

    with files.guarded() if guard else contextlib.nullcontext():
        return work(path, show_progress=False)
