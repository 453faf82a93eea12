"""Participant faults on the worker-rank receipt seam (retire/participants.py).

- DropRankReceipt(rank): worker rank `rank` keeps computing but stops acknowledging steps, so a FENCE finds the
  participant set incomplete; the transition must not complete as certified (cold successor naming the rank). Heal
  makes the rank acknowledge again from its next step on.
"""
from __future__ import annotations

from .base import Fault


class DropRankReceipt(Fault):
    name = "drop-rank-receipt"
    affects = frozenset({"fence.receipt"})

    def __init__(self, rank: int):
        super().__init__()
        self.rank = int(rank)

    async def inject(self, target) -> None:
        hit = await target.backend.worker("retire_drop_receipt", self.rank, True)
        if not any(hit):
            raise ValueError(f"no worker rank {self.rank} with receipts installed (ranks answered {hit})")
        await super().inject(target)

    async def heal(self) -> None:
        await self.target.backend.worker("retire_drop_receipt", self.rank, False)
        await super().heal()
