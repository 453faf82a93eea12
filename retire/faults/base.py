"""Fault base: declared, reversible, composable (Jepsen's nemesis shape: setup/invoke/teardown).

Invariant: a fault names what it breaks (`affects`), `inject(target)` breaks exactly that, and `heal()` restores it,
also when the test body fails (use `async with fault.on(target):`). Composing two faults that affect the same
operation raises `FaultConflict` at composition time. Faults reach the system only through the seams the control
plane exposes (facade hooks, scheduler commands, worker-extension RPCs).
"""
from __future__ import annotations

import contextlib
from typing import Any


class FaultConflict(ValueError):
    pass


class Fault:
    name: str = "fault"
    affects: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.target: Any = None
        self.injected = False

    async def inject(self, target: Any) -> None:
        self.target = target
        self.injected = True

    async def heal(self) -> None:
        self.injected = False

    @contextlib.asynccontextmanager
    async def on(self, target: Any):
        await self.inject(target)
        try:
            yield self
        finally:
            if self.injected:
                await self.heal()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, affects={sorted(self.affects)})"


class Composite(Fault):
    def __init__(self, *faults: Fault):
        super().__init__()
        seen: dict[str, Fault] = {}
        for f in faults:
            for op in f.affects:
                if op in seen:
                    raise FaultConflict(f"{f!r} and {seen[op]!r} both affect {op!r}")
                seen[op] = f
        self.faults = faults
        self.name = "+".join(f.name for f in faults)
        self.affects = frozenset(seen)

    async def inject(self, target: Any) -> None:
        done = []
        try:
            for f in self.faults:
                await f.inject(target)
                done.append(f)
        except BaseException:
            for f in reversed(done):
                await f.heal()
            raise
        await super().inject(target)

    async def heal(self) -> None:
        for f in reversed(self.faults):
            if f.injected:
                await f.heal()
        await super().heal()


def compose(*faults: Fault) -> Composite:
    return Composite(*faults)
