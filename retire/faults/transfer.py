"""DRAM-tier faults (retire/dram.py), through the facade's `dram_before_install` hook and the worker extension.

- LateTransfer(scope, epoch): holds the restore of (scope, epoch) after its bytes were written into fresh blocks and
  before its install, and releases it only once a newer SUPERSEDE has advanced the scope past `epoch` in the frontend
  AND been applied by the engine (barrier: `eng.wait_epoch`, then one engine poll answered after that ADD; no sleep).
  A correct tier must reject the install ("late transfer") and free the destination blocks. Heal removes the hook
  and releases a held transfer (it then installs: no longer late).
- DramCorruption(scope, pages): flips every bit of the given pages of the scope's offloaded DRAM copy (waiting for
  restore); the restore must see a digest mismatch and select a cold recompute. Heal flips it back if the copy still
  exists.
- TransferPressure(scope, epoch, fraction): allocation pressure inside the transfer pin window. When the restore of
  (scope, epoch) has written its bytes into fresh blocks and before it installs them, runs `Churn(fraction)` (unique
  prefixes totalling fraction x KV capacity) to completion; only the transfer pin keeps those blocks from being
  reallocated. Heal removes the hook (what churn evicted from the prefix cache stays evicted).
"""
from __future__ import annotations

import asyncio

from ..dram import pending_transition
from .base import Fault
from .hooks import HookFault, VersionHold


class LateTransfer(VersionHold, HookFault):
    name = "late-transfer"
    affects = frozenset({"dram.install"})
    hook_point = "dram_before_install"

    def __init__(self, scope: str, epoch: int, tenant: str = "default"):
        super().__init__()
        self._hold_for(scope, epoch, tenant)
        self.held = asyncio.Event()  # set once a transfer is held (the test's barrier for issuing the newer SUPERSEDE)

    async def _hook(self, eng, t) -> None:
        if not self._matches(t):
            return
        self.held.set()
        if not await self._park(self._advanced(eng)):
            return  # healed before the newer SUPERSEDE came: the transfer goes on, no longer late
        # The newer SUPERSEDE's ADD and our poll travel the same input queue: a poll that sees the new epoch was
        # answered after the engine applied it.
        while (await eng.backend.sched("scope_epoch", {"scope": t.key.scope}) or 0) <= self.epoch:
            pass


class DramCorruption(Fault):
    name = "dram-corruption"
    affects = frozenset({"dram.page"})

    def __init__(self, scope: str, pages=(0,), tenant: str = "default"):
        super().__init__()
        self.scope, self.pages, self.tenant = scope, [int(p) for p in pages], tenant
        self.key: str | None = None

    async def inject(self, target) -> None:
        tr = pending_transition(target, self.scope, self.tenant)
        if tr is None:
            raise ValueError(f"scope {self.scope!r} has no offloaded DRAM handoff waiting for restore")
        self.key = tr.extra["dram"]["tier_key"]
        await super().inject(target)
        for p in self.pages:
            flipped = await target.backend.worker("retire_dram_corrupt", self.key, p)
            if not all(flipped):
                raise RuntimeError(f"DRAM copy {self.key!r} vanished before it could be corrupted")

    async def heal(self) -> None:
        for p in self.pages:  # an involution; a no-op once the copy was dropped
            await self.target.backend.worker("retire_dram_corrupt", self.key, p)
        await super().heal()


class TransferPressure(HookFault):
    name = "transfer-pressure"
    affects = frozenset({"kv.capacity", "dram.transfer"})
    hook_point = "dram_before_install"

    def __init__(self, scope: str, epoch: int, *, fraction: float = 0.5, seed: int = 0, tenant: str = "default"):
        super().__init__()
        from .churn import Churn

        self.scope, self.epoch, self.tenant = scope, int(epoch), tenant
        self.churn = Churn(fraction, seed=seed)
        self.held = 0

    async def _hook(self, eng, t) -> None:
        if (t.scope, t.epoch, t.tenant) != (self.scope, self.epoch, self.tenant) or self.held:
            return
        self.held += 1
        async with self.churn.on(eng):
            pass
