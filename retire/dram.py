"""The DRAM tier: the capacity-returning handoff path (paper Table 12). vLLM's own offloading connectors refuse CPU, so
the tier is ours: certified pages are copied out of the worker's KV tensors, their blocks go back to the allocator, and
the successor is restored into fresh blocks when it is admitted.

Orchestration (one SUPERSEDE under `Contract(dram_tier=True)`; three processes: frontend, EngineCore, worker):
1. Engine (`RetireScheduler._supersede` -> `DramLedger.hold`): ALIGN certifies [0, n) as usual and PINs the source
   blocks under the handoff key, but the successor is admitted HELD with an empty block table (not schedulable).
2. Frontend (`after_supersede`): the worker copies the pinned blocks' bytes into its host-side `DramTier`, keyed by
   the certificate (`scope#epoch`), with one sha256 digest per page (all layers, in layer order). Then the engine
   releases the pin (`dram offloaded`): the source blocks are free, their capacity returned.
3. Restore (`restore`, at once, or when a test barrier `HoldRestore` releases the successor): the engine allocates
   fresh blocks for the transfer (`dram alloc`, held by a transfer pin, generations recorded), the worker writes the
   saved bytes into them and returns the digests of what it wrote, the frontend compares them with the offload
   digests, and the engine installs (`dram install`).

Invariants:
- Install happens only if the scope is still at the transfer's epoch, the held successor is the request the transfer
  targets, and every destination block still has the generation recorded at allocation. Otherwise the transfer is
  REJECTED (a newer SUPERSEDE retired its epoch: "late transfer"): its blocks are freed, nothing is installed.
- A digest mismatch on any page selects a cold successor (cold_reason names the page); corrupted bytes are never
  installed. The successor of a restored transfer is admitted with the restored blocks as the head of its table and
  `num_computed_tokens = n`; those blocks carry no prefix-cache hash (unreachable by lookup, freed with the request).
- Every block is accounted at all times: source blocks by the handoff pin until copy-out, destination blocks by the
  transfer pin until install or rejection, then by the successor's table. Every DRAM copy is dropped after its
  restore (accepted, cold or rejected) or when a newer SUPERSEDE retires its epoch before restore started.
- Only full-attention blocks are offloaded: a certificate holding sliding-window placeholders selects a cold
  successor with a reason (not supported by this tier).
"""
from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

from . import adapter

now = time.monotonic


# ------------------------------------------------------------------------------------------------ worker side
class DramTier:
    """Host-side page store in the worker process: key -> per page, per layer, a CPU copy of the block."""

    def __init__(self) -> None:
        self.entries: dict[str, list[list[Any]]] = {}

    @staticmethod
    def digest(layers) -> str:
        import torch
        h = hashlib.sha256()
        for t in layers:
            h.update(t.contiguous().view(-1).view(torch.uint8).numpy())  # buffer protocol: no copy
        return h.hexdigest()

    def put(self, key: str, kvs, block_ids: list[int]) -> list[str]:
        if key in self.entries:
            raise KeyError(f"DRAM entry {key!r} already exists")
        pages = [[kv[b].clone() for kv in kvs] for b in block_ids]
        self.entries[key] = pages
        return [self.digest(p) for p in pages]

    def get(self, key: str, kvs, block_ids: list[int]) -> list[str]:
        pages = self.entries[key]
        if len(pages) != len(block_ids):
            raise ValueError(f"DRAM entry {key!r} has {len(pages)} pages, restore asked for {len(block_ids)}")
        for page, b in zip(pages, block_ids):
            for kv, t in zip(kvs, page):
                kv[b].copy_(t)
        return [self.digest([kv[b] for kv in kvs]) for b in block_ids]

    def corrupt(self, key: str, page: int) -> bool:
        import torch
        pages = self.entries.get(key)
        if pages is None:
            return False
        for t in pages[page]:
            flat = t.view(-1).view(torch.uint8)
            flat.bitwise_xor_(0xFF)
        return True

    def drop(self, key: str) -> bool:
        return self.entries.pop(key, None) is not None

    def stats(self) -> dict:
        n = sum(t.numel() * t.element_size() for pages in self.entries.values() for p in pages for t in p)
        return {"entries": sorted(self.entries), "bytes": n}


# ------------------------------------------------------------------------------------------------ engine side
@dataclass
class Pending:
    scope: str
    key: str            # handoff key `scope#epoch` (also the DRAM tier key)
    epoch: int
    req_id: str         # the held successor
    tenant: str
    tokens: int
    src: list[list[int]]
    state: str = "pinned"  # pinned -> offloaded -> transfer
    dst: list[list[int]] | None = None
    dst_gens: list[list[int]] | None = None


def _pin_key(key: str) -> str:
    return f"dram:{key}"


@dataclass
class DramLedger:
    """Engine-side state of every DRAM handoff (lives in RetireScheduler; no vLLM imports)."""

    pending: dict[str, Pending] = field(default_factory=dict)  # scope -> record

    def hold(self, sched, scope: str, key: str, request, per_group: list[list], n: int, meta: dict) -> str | None:
        """Called at RESUME instead of installing the certified blocks. Returns a cold reason, or None if held."""
        if any(b.is_null for g in per_group for b in g):
            return "DRAM tier: certificate holds sliding-window placeholders (not supported by the tier)"
        self.pending[scope] = Pending(scope, key, int(meta["epoch"]), request.request_id,
                                      meta.get("tenant", "default"), n, [[b.block_id for b in g] for g in per_group])
        sched.retire_counters["dram_held"] += 1
        return None

    def holds(self, scope: str, request) -> bool:
        p = self.pending.get(scope)
        return p is not None and p.req_id == request.request_id

    def result(self, scope: str, held_by_test: bool) -> dict:
        p = self.pending[scope]
        return {"key": p.key, "tokens": p.tokens, "src": p.src, "held": bool(held_by_test)}

    def retire_stale(self, sched, scope: str) -> list[str]:
        """A new SUPERSEDE of `scope` retires any pending record (its held successor is the predecessor now). Releases
        the source pin if copy-out never finished; a transfer in flight keeps its pin until its (late) install is
        rejected. Returns the DRAM keys the frontend must drop (those with no transfer in flight)."""
        p = self.pending.pop(scope, None)
        if p is None:
            return []
        sched.retire_pins.release(p.key)
        sched.retire_counters["dram_retired_before_restore"] += 1
        return [] if p.state == "transfer" else [p.key]

    def _current(self, sched, p: Pending) -> bool:
        return sched.retire_current.get(p.scope) == (p.epoch, p.req_id) and sched.retire_held.get(p.scope) is not None \
            and sched.retire_held[p.scope].request_id == p.req_id

    def command(self, sched, op: str, **kw) -> dict:
        fn = getattr(self, f"_op_{op}", None)
        if fn is None:
            raise ValueError(f"unknown DRAM command {op!r}")
        return fn(sched, **kw)

    def _op_offloaded(self, sched, scope: str, epoch: int) -> dict:
        p = self.pending.get(scope)
        if p is None or p.epoch != epoch or p.state != "pinned":
            return {"ok": False, "reason": f"superseded before copy-out finished (epoch {epoch})"}
        released = sched.retire_pins.release(p.key)
        p.state = "offloaded"
        return {"ok": True, "released_blocks": released, "free_blocks": adapter.pool(sched).get_num_free_blocks()}

    def _op_alloc(self, sched, scope: str, epoch: int) -> dict:
        p = self.pending.get(scope)
        if p is None or p.epoch != epoch or p.state != "offloaded" or not self._current(sched, p):
            return {"refused": f"late transfer: scope {scope!r} is no longer at epoch {epoch} with a held successor"}
        pool = adapter.pool(sched)
        need = sum(len(g) for g in p.src)
        if pool.get_num_free_blocks() < need:
            return {"refused": f"DRAM restore: {need} blocks needed, {pool.get_num_free_blocks()} free", "cold": True}
        flat = pool.get_new_blocks(need)  # ref 1 each, generations bumped by the GenerationTable hook
        sched.retire_pins.pin(_pin_key(p.key), p.tenant, flat)  # the transfer pin ...
        pool.free_blocks(flat)  # ... is then the only reference
        it = iter(flat)
        p.dst = [[next(it).block_id for _ in g] for g in p.src]
        p.dst_gens = [list(sched.retire_gens.of(g)) for g in p.dst]
        p.state = "transfer"
        return {"ids": p.dst, "gens": p.dst_gens}

    def _op_install(self, sched, scope: str, epoch: int, key: str, ok: bool, reason: str | None = None) -> dict:
        p = self.pending.get(scope)
        valid = (p is not None and p.key == key and p.epoch == epoch and p.state == "transfer"
                 and self._current(sched, p))
        if not valid:
            # late transfer: its epoch was retired by a newer SUPERSEDE; free the destination, install nothing
            freed = sched.retire_pins.release(_pin_key(key))
            sched.retire_counters["dram_rejected_late"] += 1
            cur = sched.retire_current.get(scope, (None,))[0]
            return {"accepted": False, "late": True, "freed_blocks": freed,
                    "reason": f"late transfer rejected: scope is at epoch {cur}, the transfer targets epoch {epoch}"}
        if ok and [list(sched.retire_gens.of(g)) for g in p.dst] != p.dst_gens:
            ok, reason = False, "generation mismatch: a restored block was reallocated during the transfer"
        del self.pending[scope]
        req = sched.requests[p.req_id]
        if ok:
            pool = adapter.pool(sched)
            adapter.install_blocks(sched, p.req_id, [[pool.blocks[b] for b in g] for g in p.dst])
            req.num_computed_tokens = p.tokens
        sched.retire_pins.release(_pin_key(key))
        sched._cmd_release(scope)  # admit the held successor (restored, or cold with an empty table)
        sched.retire_counters["dram_restored" if ok else "dram_cold"] += 1
        if ok:  # RESUME counted the held successor as cold; it inherited after all
            c = sched.retire_counters
            c["cold"], c["inherited"], c["inherited_tokens"] = c["cold"] - 1, c["inherited"] + 1, \
                c["inherited_tokens"] + p.tokens
        return {"accepted": bool(ok), "late": False, "inherited_tokens": p.tokens if ok else 0,
                "cold_reason": None if ok else reason}

    def audit(self, sched) -> list[str]:
        return [f"DRAM handoff {p.key} pending ({p.state}) without its held successor"
                for p in self.pending.values() if sched.retire_held.get(p.scope) is None]


# ------------------------------------------------------------------------------------------------ frontend side
@dataclass
class Transfer:
    """One restore in flight, as the frontend sees it (what `dram_before_install` hooks receive)."""

    scope: str
    tenant: str
    epoch: int
    key: str
    engine_scope: str
    ids: list[list[int]]
    digests_expected: list[list[str]]   # per worker, per page (recorded at offload)
    digests_written: list[list[str]]    # per worker, per page (read back after the write)


HOOK = "dram_before_install"  # facade hook point: async hook(eng, transfer) runs between write-back and install


async def after_supersede(eng, scope: str, tenant: str, epoch: int, tr, res: dict):
    """Frontend half of a retire SUPERSEDE: drop DRAM copies the engine retired, and for a DRAM handoff copy the
    certified pages out, return their blocks, and (unless a test barrier holds the successor) restore at once."""
    be = eng.backend
    for k in res.get("dram_stale") or ():
        await be.worker("retire_dram_drop", k)
    d = res.get("dram")
    if not d:
        return tr
    t0 = now()
    src = [b for g in d["src"] for b in g]
    digests = await be.worker("retire_dram_put", d["key"], src)
    key_scope = res["scope"]
    off = await be.sched("dram", {"op": "offloaded", "scope": key_scope, "epoch": epoch})
    tr.timings["dram_offload"] = now() - t0
    info = {"key": d["key"], "engine_scope": key_scope, "tokens": d["tokens"], "pages": len(src),
            "digests": digests, "state": "offloaded", "tenant": tenant,
            "free_blocks_after_offload": off.get("free_blocks"), "released_blocks": off.get("released_blocks")}
    tr.extra["dram"] = info
    if tr.certificate is not None:
        tr.certificate = dataclasses.replace(tr.certificate, digests=tuple(digests[0]))
    if not off.get("ok"):
        await be.worker("retire_dram_drop", d["key"])
        info["state"] = "retired"
        tr.inherited_tokens, tr.cold_reason = 0, off.get("reason")
        return tr
    tr.inherited_tokens = 0  # until restored
    if not d["held"]:
        await restore(eng, tr)
    return tr


async def restore(eng, tr) -> dict:
    """Restore the DRAM handoff of transition `tr` into fresh blocks and admit its held successor (see the module
    invariants). Updates `tr` (inherited_tokens, cold_reason, timings["dram_restore"], extra["dram"]["state"])."""
    be = eng.backend
    info = tr.extra["dram"]
    t0 = now()
    a = await be.sched("dram", {"op": "alloc", "scope": info["engine_scope"], "epoch": tr.epoch})
    if a.get("refused"):
        if a.get("cold"):  # no capacity to restore into: admit cold
            r = await be.sched("dram", {"op": "install", "scope": info["engine_scope"], "epoch": tr.epoch,
                                        "key": info["key"], "ok": False, "reason": a["refused"]})
        else:
            r = {"accepted": False, "late": True, "reason": a["refused"]}
        return await _finish(eng, tr, info, r, t0)
    written = await be.worker("retire_dram_get", info["key"], [b for g in a["ids"] for b in g])
    t = Transfer(tr.scope, info["tenant"], tr.epoch, info["key"], info["engine_scope"], a["ids"], info["digests"],
                 written)
    for hook in list(eng.hooks.get(HOOK, ())):
        await hook(eng, t)
    ok, reason = True, None
    if eng.test_switches.get("dram_verify", True):
        for w, (exp, got) in enumerate(zip(info["digests"], written)):
            bad = [i for i, (x, y) in enumerate(zip(exp, got)) if x != y]
            if bad or len(exp) != len(got):
                ok, reason = False, (f"DRAM digest mismatch on page(s) {bad} of {len(exp)} (worker {w}): "
                                     f"cold recompute")
                break
    r = await be.sched("dram", {"op": "install", "scope": info["engine_scope"], "epoch": tr.epoch,
                                "key": info["key"], "ok": ok, "reason": reason})
    return await _finish(eng, tr, info, r, t0)


async def _finish(eng, tr, info: dict, r: dict, t0: float) -> dict:
    await eng.backend.worker("retire_dram_drop", info["key"])
    tr.timings["dram_restore"] = now() - t0
    info["result"] = r
    if r.get("accepted"):
        info["state"] = "restored"
        tr.inherited_tokens, tr.cold_reason = int(r["inherited_tokens"]), None
        eng.counters["dram_restored"] += 1
        c = eng.counters  # the facade counted the held successor as cold at SUPERSEDE; it inherited after all
        c["cold"], c["inherited"] = c["cold"] - 1, c["inherited"] + 1
        c["inherited_tokens"] += tr.inherited_tokens
    elif r.get("late"):
        info["state"] = "rejected"
        tr.inherited_tokens, tr.cold_reason = 0, r.get("reason")
        eng.counters["dram_rejected_late"] += 1
    else:
        info["state"] = "cold"
        tr.inherited_tokens, tr.cold_reason = 0, r.get("cold_reason")
        eng.counters["dram_cold"] += 1
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
        from .barriers import HoldSuccessor
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
