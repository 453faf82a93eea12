"""The two shapes most faults are made of.

- `HookFault`: a fault that acts through one list of the facade's test seams (`hook_point`: "on_dequeue",
  "after_yield", "dram_before_install"). Invariant: inject appends exactly its own hook; heal removes exactly it.
- `VersionHold`: one version's identity (scope, epoch, tenant) and a park for whatever the fault holds of it.
  Invariant: a park ends when its release fires or when the fault heals, whichever comes first, so a healed fault
  never leaves a consumer, a stream or a transfer parked in a hook; each version is held at most once (`released`
  counts the parks). It is a mixin listed BEFORE the fault's `Fault` base, so its `heal` (release every park, then
  the fault's own heal) runs for every holding fault without one of their own.
"""
from __future__ import annotations

import asyncio

from .base import Fault


class HookFault(Fault):
    hook_point: str = ""

    async def _hook(self, *args):  # pragma: no cover - overridden
        raise NotImplementedError

    async def inject(self, target) -> None:
        getattr(target.seams, self.hook_point).append(self._hook)
        await super().inject(target)

    async def heal(self) -> None:
        hooks = getattr(self.target.seams, self.hook_point)
        if self._hook in hooks:
            hooks.remove(self._hook)
        await super().heal()


class VersionHold:
    def _hold_for(self, scope: str, epoch: int, tenant: str) -> None:
        self.scope, self.epoch, self.tenant = scope, int(epoch), tenant
        self.released = 0
        self._healed = asyncio.Event()

    def _matches(self, version) -> bool:
        """`version` is (scope, epoch, tenant) of this hold, and nothing of it was held before."""
        return not self.released and (version.scope, version.epoch, version.tenant) == (self.scope, self.epoch,
                                                                                          self.tenant)

    def _advanced(self, eng):
        """The release most holds wait for: the scope has advanced past the held epoch (the engine's barrier)."""
        return eng.wait_epoch(self.scope, self.epoch + 1, self.tenant)

    async def heal(self) -> None:
        self._healed.set()  # release every park, now and later
        await super().heal()

    async def _park(self, release) -> bool:
        """Wait for `release` or heal. True iff released by `release` (False: healed first)."""
        waits = [asyncio.ensure_future(release), asyncio.ensure_future(self._healed.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        self.released += 1
        return waits[0].done() and not waits[0].cancelled()
