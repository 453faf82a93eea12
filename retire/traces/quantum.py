"""Prefill-quantum control for a replay arm (paper A.2.2): a fixed step-token budget, or a rate-only selector that
chooses it at every revision arrival from the observed revision rate.

Invariant: within a replay arm the driver sets the quantum only through `set_quantum` (the scheduler's
`set_step_tokens` call, which returns the budget in force); `first_quantum` starts the arm's log of (seconds since
start, budget) with the budget it set first and the driver appends every change, so every budget the arm ran under
is in its log. The driver restores the engine default (None) when the arm ends.
"""
from __future__ import annotations

from typing import Sequence


class QuantumSelector:
    """Rate-only prefill-quantum selector (paper A.2.2): the quantum is chosen from the observed revision rate alone
    (revisions per active scope per trace second over the last `window_s` trace seconds): `small` when that rate is
    >= `threshold`, else `large`. The paper's sweep found the goodput-optimal native quantum large at rates 0 and 0.05
    and small at 0.2; the default threshold 0.1 sits between."""

    def __init__(self, small: int, large: int, threshold: float = 0.1, window_s: float = 10.0):
        self.small, self.large, self.threshold, self.window_s = small, large, threshold, window_s

    def choose(self, rate: float) -> int:
        return self.small if rate >= self.threshold else self.large

    def observed_rate(self, arrivals_trace_s: Sequence[float], now_trace_s: float, scopes: int) -> float:
        lo = now_trace_s - self.window_s
        n = sum(1 for t in arrivals_trace_s if lo < t <= now_trace_s)
        return n / (self.window_s * max(scopes, 1))


async def set_quantum(eng, tokens: int | None) -> int:
    """Set the engine's prefill step-token budget (None: the engine default); the budget now in force."""
    return await eng.backend.sched("set_step_tokens", {"tokens": tokens})


async def first_quantum(eng, quantum) -> list:
    """The arm's quanta log, started with the budget `quantum` sets first (none for the engine default)."""
    if isinstance(quantum, int):
        return [(0.0, await set_quantum(eng, quantum))]
    if isinstance(quantum, QuantumSelector):
        return [(0.0, await set_quantum(eng, quantum.large))]
    return []
