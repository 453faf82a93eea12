"""The revision slack: sliding-window blocks kept behind the writer frontier (engine side; speaks the KV port).

vLLM frees a sliding-window group's blocks eagerly: at every `schedule()` the blocks before the window ending at the
request's processed tokens are returned to the pool and replaced by the null block in its table. A SUPERSEDE whose
LCP lies more than a window behind the predecessor's frontier then finds the blocks its successor would attend to
gone, and ALIGN goes cold ("sliding window"), throwing the full-attention prefix away with them.

A version whose contract opts in (`Contract(slack=True, slack_tokens=S)`, carried by its own request as
`RequestTag.slack`) keeps, per sliding-window group, the blocks needed to resume from any point in the last S tokens
behind its frontier F: table positions [first_needed(F - S), first_needed(F)). Those are exactly the positions vLLM
will drop at the next `schedule()`; each is pinned (one extra `ref_cnt`, so vLLM's free leaves it out of the free
queue) in `after_commit`, i.e. after the step that moved F and before the schedule that drops them.

Invariants:
- The kept blocks of a version are one `PinLedger` pin, `PinKey(version, "slack")`, counted against its tenant: the
  refcount audit sees them like any pin, and every quota check sees them. They never exceed the version's own
  `quota_blocks` minus the tenant's other pins; what the quota cuts is the oldest end (`limited` records how much).
- A kept range only moves forward: as F advances, positions before first_needed(F - S) are given back in the same
  `after_commit`; a block vLLM already dropped is never re-taken. A frontier that moves back (preemption) gives
  everything back.
- The kept blocks end with the version: its request leaves the scheduler (finished, aborted, RECLAIM), or, at
  RECLAIM, the successor takes over (`handoff`) the kept blocks its own slack covers when it inherited.
- Only the current version of a scope keeps a slack; work per step is O(blocks entering or leaving the slack).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .ledger import PinKey, PinLedger
from .types import RevisionSlack, VersionKey

FAR = 1 << 40  # a token count beyond any window: first_needed_block(g, FAR) > 0 only for a sliding-window group


@dataclass
class Kept:
    """One version's slack: per sliding group, table position -> kept block, within [lo, hi)."""

    key: VersionKey
    tenant: str
    cfg: RevisionSlack
    blocks: dict[int, dict[int, int]] = field(default_factory=dict)
    lo: dict[int, int] = field(default_factory=dict)
    hi: dict[int, int] = field(default_factory=dict)
    frontier: int = 0
    limited: int = 0   # blocks the quota kept out at the last update
    room: int | None = None

    @property
    def pin(self) -> PinKey:
        return PinKey(self.key, "slack")


class Slack:
    def __init__(self, port, pins: PinLedger, versions):
        self.port, self.pins, self.versions = port, pins, versions
        self.sliding = tuple(g for g in range(len(port.group_block_sizes)) if port.first_needed_block(g, FAR) > 0)
        self.kept: dict[str, Kept] = {}

    # ------------------------------------------------------------------ steps
    def after_commit(self, req_ids, preempted=()) -> None:
        """After a committed step: update the slack of every scheduled request that keeps one (pin what the next
        schedule() drops, give back what fell more than S behind), end the slack of one that left; a request vLLM
        preempted (`preempted`, from the step's SchedulerOutput) gives its kept blocks back now, even if it is not
        scheduled again (under the memory pressure that preempted it, it may wait for many steps)."""
        if not self.sliding:
            return
        if preempted:  # preempted and not scheduled: update it too (its frontier moved back to 0)
            scheduled = set(req_ids)
            req_ids = [*req_ids, *(r for r in preempted if r in self.kept and r not in scheduled)]
        for rid in req_ids:
            k = self.kept.get(rid)
            if k is None:
                k = self._track(rid)
                if k is None:
                    continue
            if not self.port.live(rid):
                self.release(rid)
            else:
                self._update(rid, k)

    def _track(self, rid: str) -> Kept | None:
        tag = self.versions.tag(rid)
        if tag is None or tag.slack is None or tag.slack.tokens <= 0 or not self.versions.is_current(rid):
            return None
        if not self.port.live(rid):
            return None
        k = self.kept[rid] = Kept(tag.key, tag.tenant, tag.slack)
        for g in self.sliding:
            k.blocks[g], k.lo[g], k.hi[g] = {}, 0, 0
        return k

    def _update(self, rid: str, k: Kept) -> None:
        port = self.port
        f = port.frontier(rid)
        if f < k.frontier:  # recomputation (preemption): the kept prefix no longer belongs to this table
            self._give_back(k, {g: k.hi[g] for g in self.sliding})
            for g in self.sliding:
                k.lo[g] = k.hi[g] = 0
        k.frontier = f
        want = {g: (port.first_needed_block(g, max(0, f - k.cfg.tokens)), port.first_needed_block(g, f))
                for g in self.sliding}
        k.limited, k.room = 0, None
        if k.cfg.quota_blocks is not None:
            others = self.pins.pinned(k.tenant) - self.pins.held(k.pin)
            k.room = max(0, int(k.cfg.quota_blocks) - others) // len(self.sliding)
            for g, (lo, hi) in want.items():
                if hi - lo > k.room:
                    k.limited += hi - lo - k.room
                    want[g] = (hi - k.room, hi)
        self._give_back(k, {g: max(lo, k.lo[g]) for g, (lo, _) in want.items()})
        for g, (lo, hi) in want.items():
            start = max(k.hi[g], lo)
            if start < hi:
                null = port.null_block_id
                got = {i: b for i, b in enumerate(port.group_blocks(rid, g, start, hi), start) if b != null}
                if got:
                    self.pins.grow(k.pin, k.tenant, list(got.values()))
                    k.blocks[g].update(got)
            k.lo[g], k.hi[g] = max(lo, k.lo[g]), max(hi, k.hi[g])

    def _give_back(self, k: Kept, below: dict[int, int]) -> None:
        """Release the kept blocks at positions < below[g] (they are more than S behind the frontier)."""
        out = []
        for g, lim in below.items():
            kept = k.blocks[g]
            for i in range(k.lo[g], min(lim, k.hi[g])):
                b = kept.pop(i, None)
                if b is not None:
                    out.append(b)
            k.lo[g] = max(k.lo[g], min(lim, k.hi[g]))
        if out:
            self.pins.shrink(k.pin, out)

    # ------------------------------------------------------------------ the SUPERSEDE
    def held(self, rid: str | None) -> int:
        k = self.kept.get(rid) if rid is not None else None
        return 0 if k is None else self.pins.held(k.pin)

    def fill(self, rid: str, group: int, table: list[int]) -> list[int]:
        """The predecessor's table of one group with its kept blocks in the positions vLLM already nulled."""
        k = self.kept.get(rid)
        if k is None or group not in k.blocks or not k.blocks[group]:
            return table
        out = list(table)
        null = self.port.null_block_id
        for i, b in k.blocks[group].items():
            if i < len(out) and out[i] == null:
                out[i] = b
        return out

    def explain(self, rid: str | None) -> str:
        """Why the slack could not cover a cold ALIGN (appended to the "sliding window" reason)."""
        k = self.kept.get(rid) if rid is not None else None
        if k is None:
            tag = self.versions.tag(rid) if rid is not None else None
            if tag is None or tag.slack is None:
                return "; no revision slack was kept (Contract(slack=True) keeps one)"
            return "; the predecessor's revision slack held nothing"
        bs = self.port.group_block_sizes
        span = ", ".join(f"group {g}: tokens [{k.lo[g] * bs[g]}, {k.hi[g] * bs[g]})" for g in self.sliding)
        msg = f"; revision slack of {k.cfg.tokens} tokens behind frontier {k.frontier} keeps {span}"
        if k.limited:
            msg += (f"; pin quota: {k.cfg.quota_blocks} blocks left room for {k.room} per sliding group, "
                    f"{k.limited} slack blocks not kept")
        return msg

    def handoff(self, old_id: str, new_id: str, inherited: int) -> int:
        """RECLAIM of a predecessor whose successor inherited `inherited` tokens: the successor's own slack (if its
        contract keeps one) takes over the kept blocks it covers, behind its new frontier `inherited`; the rest is
        released with the predecessor. Returns the blocks moved."""
        ko = self.kept.get(old_id)
        if ko is None or inherited <= 0:
            return 0
        kn = self._track(new_id)
        if kn is None or kn.tenant != ko.tenant:
            self.kept.pop(new_id, None)
            return 0
        moved = 0
        for g in self.sliding:
            lo = self.port.first_needed_block(g, max(0, inherited - kn.cfg.tokens))
            hi = self.port.first_needed_block(g, inherited)
            take = {i: ko.blocks[g][i] for i in range(max(lo, ko.lo[g]), min(hi, ko.hi[g])) if i in ko.blocks[g]}
            if take:
                self.pins.move(ko.pin, kn.pin, list(take.values()))
                for i in take:
                    del ko.blocks[g][i]
                moved += len(take)
            kn.blocks[g], kn.lo[g], kn.hi[g] = take, max(lo, ko.lo[g]), hi
        kn.frontier = inherited
        return moved

    def release(self, rid: str) -> int:
        """End a version's slack (its request left, or RECLAIM): give every kept block back."""
        k = self.kept.pop(rid, None)
        return 0 if k is None else self.pins.release(k.pin)

    # ------------------------------------------------------------------ audit
    def owns(self, key: PinKey) -> bool:
        """Is this pin the slack of a version still in the scheduler (a live pin, not a dangling one)?"""
        return key.kind == "slack" and any(k.pin == key and self.port.live(r) for r, k in self.kept.items())

    def audit(self) -> list[str]:
        out = []
        for rid, k in self.kept.items():
            if not self.port.live(rid):
                out.append(f"revision slack of {rid} outlives its request ({self.pins.held(k.pin)} blocks)")
            kept = sorted(b for g in k.blocks.values() for b in g.values())
            pin = self.pins.pins.get(k.pin)
            if kept != sorted(pin.blocks if pin else []):
                out.append(f"revision slack of {rid}: kept {kept} but the pin holds {pin.blocks if pin else []}")
        return out
