"""Quiescence barrier for paired timing: before an arm's trial, wait until this session's engine processes have
stopped using CPU.

Why: vLLM's shared-memory queue readers (`shm_broadcast.SpinCondition`) busy-loop for `busy_loop_s` = 1 s after
their last read before they go idle. In an alternating paired round, the engine of the arm that just ran keeps
spinning up to a second into the next arm's trial; on two cores the next arm's time then depends on when the OS runs
the spinner. Symmetric between the arms, but tens of percent of noise per pair on a 1.7 s request.

Invariant: `quiesce()` returns True once the summed CPU time of this process's descendants (every EngineCore and
worker it started) grew by less than `idle_frac` of one `window` over one window: the barrier is the processes' own
CPU accounting, not a fixed sleep (the window is the measurement interval). It gives up after `timeout` and returns
False, never waiting longer. `RETIRE_QUIESCE=0` turns it off (the reference run of 2026-12-01 ran without it).
"""
from __future__ import annotations

import asyncio
import os
import time

import psutil

ENABLED = os.environ.get("RETIRE_QUIESCE", "1") != "0"
HARNESS = "quiesce-1" if ENABLED else ""  # recorded with each measured pair (perf/pairs_ledger.py)


def descendants_cpu() -> float:
    """Seconds of user + system CPU used so far by every live descendant of this process."""
    total = 0.0
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return total


async def quiesce(*, window: float = 0.1, idle_frac: float = 0.05, timeout: float = 3.0) -> bool:
    """True once the descendants used less than `idle_frac * window` CPU seconds in one window; False at timeout."""
    if not ENABLED:
        return True
    t0 = time.monotonic()
    before = descendants_cpu()
    while True:
        await asyncio.sleep(window)  # the measurement window; the barrier is the CPU accounting
        now = descendants_cpu()
        if now - before < idle_frac * window:
            return True
        if time.monotonic() - t0 > timeout:
            return False
        before = now
