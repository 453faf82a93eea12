"""Reusable scenario drivers: a predecessor streams, the revision lands at a chosen moment, the successor runs.

Invariant: the revision moment is chosen by engine-visible progress (frames received, or the scheduler's view of
the request), never by wall-clock sleeps.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from oracles import Run, collect
from retire import Contract


@dataclass
class Revision:
    transition: object
    old: Run          # what the consumer of the old version received
    new: Run          # the successor's output
    obsolete_published: int


async def revise_after(eng, scope: str, *, prompt, sp_old, revised, sp_new, after_tokens: int = 0,
                       contract: Contract = Contract(), tenant: str = "default", old_consumer_delay=None) -> Revision:
    """Submit `prompt`, consume the old stream until `after_tokens` tokens arrived (0: revise before any token),
    SUPERSEDE with `revised`, keep the old consumer running to its end, then collect the successor."""
    await eng.submit(scope, prompt, sp_old, tenant=tenant)
    reached = asyncio.Event()
    got = {"n": 0}

    async def on_frame(f):
        got["n"] += len(f.token_ids)
        if got["n"] >= after_tokens:
            reached.set()

    if after_tokens <= 0:
        reached.set()
    old_task = asyncio.ensure_future(collect(eng, scope, 0, tenant, on_frame=on_frame))
    waiter = asyncio.ensure_future(reached.wait())
    await asyncio.wait([old_task, waiter], return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    before = eng.stats()["obsolete_tokens_published"]
    tr = await eng.supersede(scope, 0, revised, sp_new, contract=contract, tenant=tenant)
    new = await collect(eng, scope, 1, tenant)
    old = await old_task
    return Revision(tr, old, new, eng.stats()["obsolete_tokens_published"] - before)


async def count_obsolete(eng, scope: str, version, got: dict, *, gated: bool, on_tokens=None) -> None:
    """Consume epoch 0 of `scope` as a client would and count, in `got["obsolete"]`, the tokens it received after
    `version` was revoked (the observer's own count, independent of the facade's counters). Ungated, the first
    obsolete frame is proof enough and consumption stops there. `on_tokens(token_ids)` sees every frame's tokens."""
    async for f in eng.stream(scope, 0):
        if version.revoked and f.token_ids:
            got["obsolete"] += len(f.token_ids)
            if not gated:
                return
        if on_tokens is not None:
            on_tokens(f.token_ids)
