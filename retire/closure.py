"""Writer closure after a step cut short at a safe point (engine side; speaks the KV port).

Invariants (applied when the scheduler commits the cut step's output, which sampled nothing for any request):
- EVERY request the step scheduled, the revoked ones and the innocent ones alike, returns to the start of its chunk:
  its frontier is its last COMPLETED write, so the next step re-runs the chunk from its start and samples the token
  the cut step did not (a decode bystander re-runs its one position; nothing was published, so nothing is published
  twice).
- The chunks' blocks, which vLLM hashed into the prefix cache at schedule time though they are only partly written,
  lose their hashes: no half-written block is reachable through the prefix cache or through ALIGN.
- A running request whose COMPUTED prefix holds one of those blocks as a full block (it reused it through the prefix
  cache while the cut step was writing it) is preempted by vLLM's own preemption and recomputes: rolling it back
  would leave it reading a half-written block (and rolling back into a shared block broke vLLM's block caching).
- The decision that caused the cut is kept per revoked request (`log`) for its FENCE receipt: the first one. A
  revoked request cut again before its SUPERSEDE arrived (it was re-scheduled after the first cut) adds `recuts`.
- Test switches: `enabled=False` skips the whole closure (negative control of the writer-closure guarantee);
  `innocents=False` closes only the revoked requests' writers (negative control of the mixed-cut guarantee: an
  innocent is then left counting the cut chunk as computed; the engine switch behind it covers one cut step,
  `EngineSwitches.take_innocents`).
"""
from __future__ import annotations

from collections import Counter, OrderedDict


class WriterClosure:
    def __init__(self, port, max_log: int = 1024):
        self.port = port
        self.log: OrderedDict[str, dict] = OrderedDict()
        self.max_log = max_log
        self.cut_steps = 0
        self.counts: Counter = Counter()  # innocents and revoked rolled back, sharers preempted, re-cuts

    def close(self, cut: dict, t: float, enabled: bool = True, innocents: bool = True) -> list[str]:
        """Apply a cut {"chunks": {req_id: (start, n)}, "decision": {...}}. Returns the rolled-back request ids.
        A decision without `req_ids` (a cut reported by a worker without revocation details) treats every chunk as
        revoked."""
        self.cut_steps += 1
        decision = cut.get("decision") or {}
        revoked = set(decision.get("req_ids") or cut["chunks"])
        rolled: list[str] = []
        evict: set[int] = set()
        for rid, (start, n) in cut["chunks"].items():
            if not n or not self.port.live(rid):
                continue
            innocent = rid not in revoked
            if enabled and (innocents or not innocent):
                evict.update(self.port.rollback(rid, start, start + n))
                rolled.append(rid)
                self.counts["innocents_rolled_back" if innocent else "revoked_rolled_back"] += 1
            if not innocent:
                self._record(rid, decision, t, start)
        if evict:
            self.port.evict_hashes(evict)
            if innocents:
                for rid in self.port.sharers(evict):
                    if self.port.preempt(rid):
                        self.counts["sharers_preempted"] += 1
        return rolled

    def _record(self, rid: str, decision: dict, t: float, start: int) -> None:
        """Keep the FIRST cut of a revocation: until its SUPERSEDE reaches the scheduler, the rolled-back request
        can be scheduled again and is cut again at its first safe point (nothing computed); that re-cut is counted
        (`recuts`), never allowed to replace the decision that bounded the obsolete work."""
        first = self.log.get(rid)
        if first is not None:
            first["recuts"] = first.get("recuts", 0) + 1
            self.counts["recuts"] += 1
            return
        self.log[rid] = dict(decision, closed_at=t, rolled_back_to=start)
        while len(self.log) > self.max_log:
            self.log.popitem(last=False)

    def take(self, req_id: str | None) -> dict | None:
        """The cut decision recorded for a request (consumed by its FENCE), or None."""
        return self.log.pop(req_id, None) if req_id else None
