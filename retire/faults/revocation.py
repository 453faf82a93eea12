"""Revocation faults on the mailbox seam.

- StuckRevocation(eng, scope): posts a revocation for the scope's current version WITHOUT sending a successor, so every
  armed step of it is cut at its first safe point, again and again (the engine-health stress of issue #4). Heal clears
  the entry; the version then runs to completion.
"""
from __future__ import annotations

from .base import Fault


class StuckRevocation(Fault):
    name = "stuck-revocation"
    affects = frozenset({"mailbox"})

    def __init__(self, scope: str, tenant: str = "default"):
        super().__init__()
        self.scope, self.tenant = scope, tenant

    async def inject(self, target) -> None:
        s = target.table.get(self.tenant, self.scope)
        self.req_id = s.current.internal_id
        target.backend.mailbox.post(self.req_id, 0, len(s.current.prompt))
        await super().inject(target)

    async def heal(self) -> None:
        self.target.backend.mailbox.clear(self.req_id)
        await super().heal()
