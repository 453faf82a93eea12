"""The DRAM tier's frontend half: drive one handoff's copy-out and restore (worker RPCs + engine commands).

Invariants (with retire/dram/engine.py, which keeps the handoff's state):
- Copy-out happens while the handoff pin still holds the source blocks; only after the worker returned the pages'
  digests does the engine release that pin (`offloaded`), returning the capacity.
- A restore writes the saved pages into freshly allocated blocks, reads back the digests of what it wrote, and lets
  the engine install only if every page matches the offload digest (`dram_verify`, a test switch, can turn the check
  off for the negative control); a mismatch admits the successor cold with the page named.
- Every DRAM copy is dropped after its restore (accepted, cold or rejected) or when the engine reports its epoch
  retired before the restore started.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import msgspec

from ..types import VersionKey
from .engine import tier_key

now = time.monotonic


@dataclass
class Transfer:
    """One restore in flight, as the frontend sees it (what `dram_before_install` hooks receive)."""

    scope: str
    tenant: str
    epoch: int
    key: VersionKey
    tier_key: str
    ids: list[list[int]]
    digests_expected: list[list[str]]   # per worker, per page (recorded at offload)
    digests_written: list[list[str]]    # per worker, per page (read back after the write)


async def after_supersede(eng, tenant: str, tr, res):
    """Frontend half of a retire SUPERSEDE: drop DRAM copies the engine retired, and for a DRAM handoff copy the
    certified pages out, return their blocks, and (unless a test barrier holds the successor) restore at once."""
    be = eng.backend
    for k in res.dram_stale:
        await be.worker("retire_dram_drop", tier_key(k))
    d = res.dram
    if d is None:
        return tr
    t0 = now()
    src = [b for g in d.src for b in g]
    tk = tier_key(d.key)
    digests = await be.worker("retire_dram_put", tk, src)
    off = await be.sched("dram", {"op": "offloaded", "key": d.key})
    tr.timings["dram_offload"] = now() - t0
    info = {"key": d.key, "tier_key": tk, "tokens": d.tokens, "pages": len(src), "digests": digests,
            "state": "offloaded", "tenant": tenant, "free_blocks_after_offload": off.get("free_blocks"),
            "released_blocks": off.get("released_blocks"), "src": [list(g) for g in d.src]}
    tr.extra["dram"] = info
    if tr.certificate is not None:
        tr.certificate = msgspec.structs.replace(tr.certificate, digests=tuple(digests[0]))
    if not off.get("ok"):
        await be.worker("retire_dram_drop", tk)
        info["state"] = "retired"
        tr.inherited_tokens, tr.cold_reason = 0, off.get("reason")
        return tr
    tr.inherited_tokens = 0  # until restored
    if not d.held_by_test:
        await restore(eng, tr)
    return tr


async def restore(eng, tr) -> dict:
    """Restore the DRAM handoff of transition `tr` into fresh blocks and admit its held successor. Updates `tr`
    (inherited_tokens, cold_reason, timings["dram_restore"], extra["dram"]: state, dst)."""
    be = eng.backend
    info = tr.extra["dram"]
    t0 = now()
    a = await be.sched("dram", {"op": "alloc", "key": info["key"]})
    if a.get("refused"):
        if a.get("cold"):  # no capacity to restore into: admit cold
            r = await be.sched("dram", {"op": "cold_admit", "key": info["key"], "reason": a["refused"]})
        else:
            r = {"accepted": False, "late": True, "reason": a["refused"]}
        return await _finish(eng, tr, info, r, t0)
    info["dst"] = a["ids"]
    ok, reason = False, "DRAM restore did not complete"
    try:  # once destination blocks are allocated, an install (accepted or not) always follows: it frees them
        written = await be.worker("retire_dram_get", info["tier_key"], [b for g in a["ids"] for b in g])
        t = Transfer(tr.scope, info["tenant"], tr.epoch, info["key"], info["tier_key"], a["ids"], info["digests"],
                     written)
        for hook in list(eng.seams.dram_before_install):
            await hook(eng, t)
        ok, reason = _verify(eng, info["digests"], written)
    finally:
        r = await asyncio.shield(be.sched("dram", {"op": "install", "key": info["key"], "ok": ok, "reason": reason}))
    return await _finish(eng, tr, info, r, t0)


def _verify(eng, expected, written) -> tuple[bool, str | None]:
    if not eng.seams.dram_verify:
        return True, None
    for w, (exp, got) in enumerate(zip(expected, written)):
        bad = [i for i, (x, y) in enumerate(zip(exp, got)) if x != y]
        if bad or len(exp) != len(got):
            return False, f"DRAM digest mismatch on page(s) {bad} of {len(exp)} (worker {w}): cold recompute"
    return True, None


async def _finish(eng, tr, info: dict, r: dict, t0: float) -> dict:
    await eng.backend.worker("retire_dram_drop", info["tier_key"])
    tr.timings["dram_restore"] = now() - t0
    info["result"] = r
    c = eng.counters
    if r.get("accepted"):
        info["state"] = "restored"
        tr.inherited_tokens, tr.cold_reason = int(r["inherited_tokens"]), None
        c["dram_restored"] += 1
        # the facade counted the held successor as cold at SUPERSEDE; it inherited after all
        c["cold"], c["inherited"] = c["cold"] - 1, c["inherited"] + 1
        c["inherited_tokens"] += tr.inherited_tokens
    elif r.get("late"):
        info["state"] = "rejected"
        tr.inherited_tokens, tr.cold_reason = 0, r.get("reason")
        c["dram_rejected_late"] += 1
    else:
        info["state"] = "cold"
        tr.inherited_tokens, tr.cold_reason = 0, r.get("cold_reason")
        c["dram_cold"] += 1
    return r


def pending_transition(eng, scope: str, tenant: str = "default"):
    """The scope's latest transition whose DRAM handoff is offloaded and waiting for restore (or None)."""
    s = eng.table.get(tenant, scope)
    for tr in reversed(s.transitions):
        if tr.extra.get("dram", {}).get("state") == "offloaded":
            return tr
    return None


class HoldRestore:
    """Barrier: like `retire.barriers.HoldSuccessor`, the next SUPERSEDE of `scope` admits its successor held; under
    `Contract(dram_tier=True)` `supersede` then returns after copy-out (capacity returned) and `release()` performs
    the restore; without the DRAM tier `release()` just lets the (HBM-pinned) successor run."""

    def __init__(self, eng, scope: str, tenant: str = "default"):
        from ..barriers import HoldSuccessor
        self.eng, self.scope, self.tenant = eng, scope, tenant
        self._hold = HoldSuccessor(eng, scope, tenant)
        self.released = False
        self.result: dict | None = None

    async def __aenter__(self) -> "HoldRestore":
        await self._hold.__aenter__()
        return self

    async def release(self) -> bool:
        self.released = True
        self._hold.released = True
        tr = pending_transition(self.eng, self.scope, self.tenant)
        if tr is None:
            return await self._hold.release()
        self.result = await restore(self.eng, tr)
        return True

    async def __aexit__(self, *exc) -> None:
        if not self.released:
            await self.eng.backend.sched("disarm", {"scope": self._hold.key})
            await self.release()
