"""KV-page and ownership faults, through the worker extension and the scheduler's command seam.

- PageCorruption(block_ids): flips every bit of the named physical blocks in every layer; heal writes the saved
  bytes back (digests return to their pre-fault values).
- GenerationRace(scope): the next SUPERSEDE of `scope` sees one certified block reallocated between ALIGN and
  RESUME (its generation bumped); RESUME must detect it and select a cold successor. Heal disarms it if unused.
- ForgedTenant(tenant): the next SUPERSEDE's engine-side tag names another tenant than the scope's (a misrouted
  request that got past the frontend). Tenant is part of the scope's typed identity, so the engine must find no such
  scope and refuse, changing nothing.
- EngineRefusal(scope, reason): the engine refuses the next SUPERSEDE of `scope` although the frontend accepted it
  (a frontend/engine disagreement). The call must raise and change nothing on either side. Heal disarms it.
"""
from __future__ import annotations

from .base import Fault


class PageCorruption(Fault):
    name = "page-corruption"
    affects = frozenset({"kv.page"})

    def __init__(self, block_ids: list[int]):
        super().__init__()
        self.block_ids = [int(b) for b in block_ids]
        self.saved: dict[int, list[bytes]] = {}

    async def inject(self, target) -> None:
        be = target.backend
        for b in self.block_ids:
            self.saved[b] = (await be.worker("retire_read_block", b))[0]
        await super().inject(target)  # mark injected before mutating, so heal runs if a flip fails midway
        await self._mutate(be)

    async def _mutate(self, be) -> None:
        """Break the saved pages (here: flip every bit of every layer). Subclasses change only this."""
        for b in self.block_ids:
            await be.worker("retire_xor_block", b, -1)

    async def heal(self) -> None:
        be = self.target.backend
        for b, layers in self.saved.items():
            await be.worker("retire_write_block", b, layers)
        await super().heal()


class GenerationRace(Fault):
    name = "generation-race"
    affects = frozenset({"kv.generation"})

    def __init__(self, scope: str, tenant: str = "default", index: int = 0):
        super().__init__()
        self.scope, self.tenant, self.index = scope, tenant, index

    async def inject(self, target) -> None:
        key = target.table.key(self.tenant, self.scope)
        await target.backend.sched("arm", {"scope": key, "hook": {"bump_generation": True, "index": self.index}})
        self.key = key
        await super().inject(target)

    async def heal(self) -> None:
        await self.target.backend.sched("disarm", {"scope": self.key})
        await super().heal()


class ForgedTenant(Fault):
    name = "forged-tenant"
    affects = frozenset({"route.tenant"})

    def __init__(self, tenant: str):
        super().__init__()
        self.tenant = tenant

    async def inject(self, target) -> None:
        target.seams.successor_tenant = self.tenant
        await super().inject(target)

    async def heal(self) -> None:
        self.target.seams.successor_tenant = None
        await super().heal()


class EngineRefusal(Fault):
    name = "engine-refusal"
    affects = frozenset({"engine.commit"})

    def __init__(self, scope: str, tenant: str = "default", reason: str = "injected refusal"):
        super().__init__()
        self.scope, self.tenant, self.reason = scope, tenant, reason

    async def inject(self, target) -> None:
        self.key = target.table.key(self.tenant, self.scope)
        await target.backend.sched("arm", {"scope": self.key, "hook": {"refuse": self.reason}})
        await super().inject(target)

    async def heal(self) -> None:
        await self.target.backend.sched("disarm", {"scope": self.key})
        await super().heal()
