"""Engine barriers for step-by-step driving in tests and benchmarks (no sleeps).

Invariant: `HoldSuccessor(eng, scope)` makes the next SUPERSEDE of `scope` admit its successor with the certified
block table installed but unscheduled; `release()` (or leaving the context) lets it run. Between the two, no step of
the successor executes, so a test can act between ALIGN/RESUME and the successor's first forward pass.
"""
from __future__ import annotations


class HoldSuccessor:
    def __init__(self, eng, scope: str, tenant: str = "default"):
        self.eng, self.key = eng, eng.table.engine_key(tenant, scope)
        self.released = False

    async def __aenter__(self) -> "HoldSuccessor":
        await self.eng.backend.sched("arm", {"scope": self.key, "hook": {"hold": True}})
        return self

    async def release(self) -> bool:
        self.released = True
        return await self.eng.backend.sched("release", {"scope": self.key})

    async def __aexit__(self, *exc) -> None:
        if not self.released:
            await self.eng.backend.sched("disarm", {"scope": self.key})
            await self.release()
