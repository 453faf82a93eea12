"""The DRAM tier's engine half: every DRAM handoff's state, in the scheduler's thread (speaks the KV port).

One SUPERSEDE under `Contract(dram_tier=True)` (three processes: frontend, EngineCore, worker):
1. RESUME (`hold`): ALIGN certified [0, n) and PINned the sources as usual; the successor is admitted HELD with an
   empty block table, and the handoff pin stays until the frontend has copied the pages out.
2. `offloaded`: the worker holds the pages; the handoff pin is released (the capacity returns to the pool).
3. `alloc`: fresh destination blocks for the restore, held by a transfer pin, generations recorded.
4. `install`: the worker wrote the pages and the frontend compared digests; the destination blocks become the head
   of the successor's table (or it goes cold), and the successor is released.

Invariants:
- Install happens only if the handoff's version is still current, the held successor is the one it targets, and
  every destination block still has the generation recorded at allocation; otherwise the transfer is rejected ("late
  transfer"): its blocks are freed, nothing is installed.
- Every block is accounted at all times: sources by the handoff pin until copy-out, destinations by the transfer pin
  until install (which hands its references to the successor's table) or rejection (which frees them).
- A newer SUPERSEDE of the scope retires a pending handoff (`retire_stale`): its source pin is released if copy-out
  never finished, and the DRAM copy is reported for the frontend to drop (unless a transfer is in flight, whose late
  install is rejected and drops it).
- Only full-attention blocks are offloaded: a certificate with sliding-window placeholders goes cold with a reason.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..ledger import GenerationTable, PinKey, PinLedger
from ..types import ScopeKey, VersionKey


def tier_key(key: VersionKey) -> str:
    """The worker-side DRAM tier key of a handoff (a digest of the typed version key)."""
    from ..types import digest
    return digest(key).hex()


@dataclass
class Pending:
    key: VersionKey     # the held successor's version
    req_id: str
    tenant: str
    tokens: int
    src: list[list[int]]
    state: str = "pinned"  # pinned -> offloaded -> transfer
    dst: list[list[int]] | None = None
    dst_gens: list[list[int]] | None = None


class DramLedger:
    def __init__(self, port, pins: PinLedger, gens: GenerationTable, versions, holds, counters: Counter):
        self.port, self.pins, self.gens, self.versions, self.holds = port, pins, gens, versions, holds
        self.counters = counters
        self.pending: dict[ScopeKey, Pending] = {}

    def hold(self, key: VersionKey, handle, per_group: list[list[int]], n: int) -> str | None:
        """At RESUME instead of installing the certified blocks. Returns a cold reason, or None if held."""
        if any(b == self.port.null_block_id for g in per_group for b in g):
            return "DRAM tier: certificate holds sliding-window placeholders (not supported by the tier)"
        self.pending[key.scope] = Pending(key, handle.request_id, key.scope.tenant, n, [list(g) for g in per_group])
        self.counters["dram_held"] += 1
        return None

    def retire_stale(self, scope: ScopeKey) -> list[VersionKey]:
        p = self.pending.pop(scope, None)
        if p is None:
            return []
        self.pins.release(PinKey(p.key, "handoff"))
        self.counters["dram_retired_before_restore"] += 1
        return [] if p.state == "transfer" else [p.key]

    def _current(self, p: Pending) -> bool:
        return self.versions.is_current_key(p.key, p.req_id) and self.holds.req_id(p.key.scope) == p.req_id

    def _find(self, key: VersionKey, state: str) -> Pending | None:
        p = self.pending.get(key.scope)
        return p if p is not None and p.key == key and p.state == state else None

    def offloaded(self, key: VersionKey) -> dict:
        p = self._find(key, "pinned")
        if p is None:
            return {"ok": False, "reason": f"superseded before copy-out finished (epoch {key.epoch})"}
        released = self.pins.release(PinKey(p.key, "handoff"))
        p.state = "offloaded"
        return {"ok": True, "released_blocks": released, "free_blocks": self.port.free_block_count()}

    def alloc(self, key: VersionKey) -> dict:
        p = self._find(key, "offloaded")
        if p is None or not self._current(p):
            return {"refused": f"late transfer: scope {key.scope.scope!r} is no longer at epoch {key.epoch} with a "
                               f"held successor"}
        need = sum(len(g) for g in p.src)
        fresh = self.port.alloc(need)  # one reference each, generations bumped by the GenerationTable hook
        if fresh is None:
            return {"refused": f"DRAM restore: {need} blocks needed, {self.port.free_block_count()} free",
                    "cold": True}
        self.pins.adopt(PinKey(p.key, "transfer"), p.tenant, fresh)  # the transfer pin owns that reference
        it = iter(fresh)
        p.dst = [[next(it) for _ in g] for g in p.src]
        p.dst_gens = [list(self.gens.of(g)) for g in p.dst]
        p.state = "transfer"
        return {"ids": p.dst, "gens": p.dst_gens}

    def install(self, key: VersionKey, ok: bool, reason: str | None = None) -> dict:
        p = self._find(key, "transfer")
        if p is None or not self._current(p):
            freed = self.pins.release(PinKey(key, "transfer"))
            self.counters["dram_rejected_late"] += 1
            return {"accepted": False, "late": True, "freed_blocks": freed,
                    "reason": f"late transfer rejected: scope is at epoch {self.versions.epoch(key.scope)}, the "
                              f"transfer targets epoch {key.epoch}"}
        if ok and [list(self.gens.of(g)) for g in p.dst] != p.dst_gens:
            ok, reason = False, "generation mismatch: a restored block was reallocated during the transfer"
        del self.pending[key.scope]
        handle = self.holds.held[key.scope]
        if ok:  # the transfer pin's references become the successor's table's
            self.port.alias(handle, p.dst, p.tokens, held=True)
            self.pins.hand_over(PinKey(key, "transfer"))
        else:
            self.pins.release(PinKey(key, "transfer"))
        self.holds.release(key.scope)
        self.counters["dram_restored" if ok else "dram_cold"] += 1
        if ok:  # RESUME counted the held successor as cold; it inherited after all
            c = self.counters
            c["cold"], c["inherited"], c["inherited_tokens"] = c["cold"] - 1, c["inherited"] + 1, \
                c["inherited_tokens"] + p.tokens
        return {"accepted": bool(ok), "late": False, "inherited_tokens": p.tokens if ok else 0,
                "cold_reason": None if ok else reason}

    def cold_admit(self, key: VersionKey, reason: str) -> dict:
        """No capacity to restore into: admit the held successor cold (nothing installed)."""
        p = self._find(key, "offloaded")
        if p is None or not self._current(p):
            return {"accepted": False, "late": True, "reason": reason}
        del self.pending[key.scope]
        self.holds.release(key.scope)
        self.counters["dram_cold"] += 1
        return {"accepted": False, "late": False, "inherited_tokens": 0, "cold_reason": reason}

    def audit(self) -> list[str]:
        return [f"DRAM handoff {p.key} pending ({p.state}) without its held successor"
                for p in self.pending.values() if self.holds.req_id(p.key.scope) != p.req_id]
