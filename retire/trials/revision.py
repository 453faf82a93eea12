"""The one revision-trial driver: a predecessor streams, SUPERSEDE lands at an engine-visible moment, the successor
runs. The demo, perf, the churn driver and conformance all run a revision through `revision_trial`.

Invariants:
- The revision moment is chosen by engine-visible progress (the engine's writer frontier, tokens the consumer
  received plus tokens the engine generated since, or accepted drafts), each poll answered by EngineCore between two
  steps; never by a wall-clock sleep.
- `Trial.obsolete` is counted by the old consumer's clock against the moment `supersede` was called
  (`retire.trials.observe`); the facade's own counter is kept beside it (`facade_obsolete`) for cross-checks only.
- The successor is followed as soon as `supersede` returns, concurrently with the old consumer draining.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from .observe import ConsumerClock, Observed, caught_up
from .warm import reset_prefix_cache

now = time.monotonic


@dataclass
class Trial:
    policy: str
    scope: str
    obsolete: int                 # tokens of epoch 0 the consumer received after supersede() was called (its clock)
    ttft: float | None            # Transition.successor_ttft: supersede call -> first non-empty successor frame
    reused: int                   # Transition.inherited_tokens (native-prefix: vLLM's num_cached_tokens)
    fence: float | None           # Transition.fence_latency: ADVANCE -> last old writer closed
    wall: float                   # supersede call -> successor's last frame dequeued
    frontier_at_call: int         # engine frontier of the old version seen by the barrier's last poll
    old: Any = None               # oracles.Run of what the old consumer received
    new: Any = None               # oracles.Run of the successor
    transition: Any = None
    verdict: str = ""
    ok: bool | None = None
    facade_obsolete: int = 0      # the facade's obsolete_tokens_published delta (the subject's own count)
    state: dict | None = None     # the engine's view of the old version at the revision moment
    log: Observed = field(default_factory=Observed)  # the old consumer's frames, stamped by its clock

    @property
    def drafted(self) -> int:
        return int((self.state or {}).get("drafted", 0))

    @property
    def fence_path(self) -> str:
        """How the old writer was closed: "step-boundary" / "safe-point" (retire receipts) or "native-abort"."""
        rs = getattr(self.transition, "receipts", ()) or ()
        return rs[0].path if rs else "native-abort"

    def row(self) -> dict:
        tr = self.transition
        return {"policy": self.policy, "scope": self.scope, "obsolete_tokens_published": self.obsolete,
                "facade_obsolete_counter": self.facade_obsolete, "successor_ttft_s": self.ttft,
                "tokens_reused": self.reused, "fence_latency_s": self.fence, "fence_path": self.fence_path,
                "wall_s": self.wall, "frontier_at_call": self.frontier_at_call,
                "cold_reason": getattr(tr, "cold_reason", None), "verdict": self.verdict, "ok": self.ok,
                "successor_tokens": list(self.new.tokens) if self.new is not None else None}


async def _moment(eng, scope: str, tenant: str, got: dict, reached: asyncio.Event, old_task, *, frontier, drafts,
                  after_tokens: int, lag: int) -> dict | None:
    from ..barriers import wait_drafts, wait_engine

    if frontier is not None:
        return await wait_engine(eng, scope, frontier=frontier, epoch=0, tenant=tenant)
    if after_tokens > 0:
        waiter = asyncio.ensure_future(reached.wait())
        await asyncio.wait([old_task, waiter], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
    if drafts:
        return await wait_drafts(eng, scope, accepted=1, out_tokens=got["n"] + lag, epoch=0, tenant=tenant)
    return await wait_engine(eng, scope, out_tokens=got["n"] + lag, epoch=0, tenant=tenant)


async def revision_trial(eng, scope: str, prompt: list[int], revised: list[int], sp_old, sp_new, *,
                         frontier: int | None = None, after_tokens: int = 0, lag: int = 0, drafts: bool = False,
                         contract=None, tenant: str = "default", reset_cache: bool = True,
                         cache_salt: str | None = None, clock: ConsumerClock | None = None) -> Trial:
    """Submit `prompt`, consume it, SUPERSEDE with `revised` at the chosen moment, follow the successor at once, and
    return what happened.

    Revision moment: `frontier` given -> once the engine's writer frontier of the old version is >= frontier
    (mid-prefill); otherwise once the consumer received `after_tokens` tokens and the engine generated `lag` more
    (`drafts=True`: and has verified drafts with at least one accepted). `reset_cache` starts from an empty prefix
    cache (so one arm never reuses another arm's blocks); `cache_salt` is the successor's."""
    from oracles.runs import collect

    from ..types import Contract

    if reset_cache and not await reset_prefix_cache(eng):
        import sys
        print(f"  warning: prefix cache reset refused before {scope} (blocks still in use)", file=sys.stderr)
    clock = clock or ConsumerClock()
    log = Observed()
    await eng.submit(scope, prompt, sp_old, tenant=tenant)
    got = {"n": 0}
    reached = asyncio.Event()

    def on_frame(f):
        log.record(clock, f)
        got["n"] += len(f.token_ids)
        if got["n"] >= after_tokens:
            reached.set()

    old_task = asyncio.ensure_future(collect(eng, scope, 0, tenant, on_frame=on_frame))
    st = await _moment(eng, scope, tenant, got, reached, old_task, frontier=frontier, drafts=drafts,
                       after_tokens=after_tokens, lag=lag)
    await caught_up()  # the consumer has processed what vLLM delivered up to the observed moment
    seen = int(st["frontier"]) if st else -1  # -1: the old version had already left the scheduler
    before = eng.stats()["obsolete_tokens_published"]
    call = clock.mark(f"supersede:{scope}")
    tr = await eng.supersede(scope, 0, revised, sp_new, contract=contract or Contract(), tenant=tenant,
                             cache_salt=cache_salt)
    new = await collect(eng, scope, 1, tenant)
    wall = now() - call.t
    old = await old_task
    return Trial(eng.policy, scope, log.obsolete(call, 0), tr.successor_ttft, int(tr.inherited_tokens or 0),
                 tr.fence_latency, wall, seen, old, new, tr,
                 facade_obsolete=eng.stats()["obsolete_tokens_published"] - before, state=st, log=log)
