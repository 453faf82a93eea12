"""CPU placement for the across-instance timing benchmarks: keep the model's compute core to the model.

Why: vLLM's CPU worker binds its compute threads to the cores it picked (here core 0 of 2), while the EngineCore
processes and the frontend (this pytest process, which turns outputs into tokens) float over every core. When the OS
runs one of them on the worker's core during a trial, the forward pass waits; whether it does is chance, so it is
noise in each paired ratio, and it falls on the retire and stock arms alike.

Invariant: `pinned()` is a context manager. On entry, every live descendant of this process that is not a vLLM
worker, and this process itself, is bound to the cores no worker is bound to (nothing changes when no such core is
left, e.g. on one core). On exit every affinity it changed is restored, and threads this process started meanwhile
get its former affinity, so engines started afterwards pick their cores from the whole machine as before (a worker
picks its cores from the affinity it inherits). Off unless `RETIRE_PIN=1`; `HARNESS` is its label in the ledger.

Measured 2026-12-03 (AMD EPYC with AVX512-BF16, 2 cores; `make no-revision-ci`, 2 instance pairs each): pinned, the
retire/stock pair ratios had sd 11.0% and 13.3% per instance; unpinned, 7.5% and 4.9%. With the frontend and both
EngineCores sharing one core the noise grew, so the default harness leaves placement to the OS.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

import psutil

ENABLED = os.environ.get("RETIRE_PIN", "0") == "1"
HARNESS = "pin-1" if ENABLED else ""
WORKER_NAME = "VLLM::Worker"


def _procs() -> list[psutil.Process]:
    return [psutil.Process()] + psutil.Process().children(recursive=True)


def _is_worker(p: psutil.Process) -> bool:
    try:
        return p.name().startswith(WORKER_NAME)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def worker_cores(procs: list[psutil.Process]) -> set[int]:
    """Union of the affinities of the live vLLM workers among `procs`."""
    cores: set[int] = set()
    for p in procs:
        if _is_worker(p):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
                cores |= set(p.cpu_affinity())
    return cores


def _threads(p: psutil.Process) -> list[int]:
    """Thread ids of `p`: Linux affinity is per thread, and a new thread inherits its creator's."""
    try:
        return [t.id for t in p.threads()]
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []


def _set(tid: int, cores) -> list[int] | None:
    """Bind thread `tid` to `cores`; its former affinity, or None if it is gone."""
    try:
        before = sorted(os.sched_getaffinity(tid))
        os.sched_setaffinity(tid, cores)
        return before
    except (ProcessLookupError, PermissionError):
        return None


@contextlib.contextmanager
def pinned() -> Iterator[list[int]]:
    """Bind this process and its non-worker descendants off the workers' cores; yields the cores used ([] if none)."""
    if not ENABLED:
        yield []
        return
    procs = _procs()
    every = set(range(psutil.cpu_count()))
    free = sorted(every - worker_cores(procs))
    if not free or len(free) == len(every):
        yield []
        return
    saved: list[tuple[int, list[int]]] = []  # (thread id, former affinity), this process's threads first
    try:
        for p in procs:
            if not _is_worker(p):
                saved += [(tid, b) for tid in _threads(p) if (b := _set(tid, free)) is not None]
        yield free
    finally:
        for tid, before in saved:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.sched_setaffinity(tid, before)
        known = {tid for tid, _ in saved}
        for tid in _threads(procs[0]):  # threads this process started while pinned get its former affinity too
            if tid not in known and saved:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.sched_setaffinity(tid, saved[0][1])
