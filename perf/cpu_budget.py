"""CPU budget of one trial, by process role: where a per-request cost could live.

Why: the no-revision benchmark measures wall time, whose pair noise (sd ~11%) hides anything below about 1%. A
process's own CPU time, read at nanosecond resolution, shows directly whether retire's frontend or engine does more
work per request than stock's, without waiting for a thousand wall-time pairs.

Invariant: `snapshot()` returns the CPU nanoseconds consumed so far by every thread of this process ("frontend") and
of each live descendant, summed by role: "engine_core" (vLLM's `VLLM::EngineCore` processes), "worker"
(`VLLM::Worker`), "other" (anything else, e.g. the resource tracker). The difference of two snapshots is the work done
in between by each role, counted from the kernel's per-thread accounting (`/proc/<pid>/task/<tid>/schedstat`, field 1,
ns), never from the code under test. Where schedstat is missing, psutil's tick-resolution times are used and
`resolution()` says so. A process that exits between two snapshots loses its count (a trial that starts or stops an
engine is not budgeted).

Reading: vLLM's engine processes busy-wait on their queues, so "engine_core" and "worker" time track wall time and
differ between arms as wall time does; "frontend" time is spent in this process only (the facade, the output handler,
the consumer) and is the direct measure of per-token frontend work.
"""
from __future__ import annotations

import os

import psutil

ROLES = ("frontend", "engine_core", "worker", "other")


def role(name: str) -> str:
    """The role of a descendant process from its title (vLLM sets `VLLM::<Role>`)."""
    if "EngineCore" in name:
        return "engine_core"
    if "Worker" in name:
        return "worker"
    return "other"


def _schedstat_ns(pid: int) -> int | None:
    """Sum over the process's threads of their on-CPU nanoseconds; None when schedstat is unavailable."""
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return None
    total, seen = 0, False
    for t in tids:
        try:
            with open(f"{base}/{t}/schedstat") as f:
                total += int(f.read().split()[0])
            seen = True
        except (OSError, ValueError, IndexError):
            continue  # a thread that exited between listdir and read
    return total if seen else None


def _psutil_ns(p: psutil.Process) -> int:
    t = p.cpu_times()
    return int((t.user + t.system) * 1e9)


def resolution() -> str:
    return "schedstat-ns" if _schedstat_ns(os.getpid()) is not None else "psutil-ticks"


def _process_ns(p: psutil.Process) -> int:
    ns = _schedstat_ns(p.pid)
    return ns if ns is not None else _psutil_ns(p)


def snapshot() -> dict[str, int]:
    """CPU nanoseconds consumed so far, by role (see the module invariant)."""
    me = psutil.Process()
    out = dict.fromkeys(ROLES, 0)
    out["frontend"] = _process_ns(me)
    for p in me.children(recursive=True):
        try:
            out[role(p.name())] += _process_ns(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """Milliseconds of CPU per role between two snapshots."""
    return {k: (after[k] - before[k]) / 1e6 for k in ROLES}
