"""Writer closure after a step cut short at a safe point (engine side; speaks the KV port).

Invariant: when a worker reports a cut step, every request the step scheduled returns to the start of its chunk
(its frontier is the last COMPLETED write), and the chunk's blocks, which vLLM hashed into the prefix cache at
schedule time though they are only partly written, lose their hashes. So no half-written block is reachable through
the prefix cache or through ALIGN, and a re-run of the chunk rewrites it from the start. The decision that caused the
cut is kept per request (`log`) for the FENCE receipt. `enabled=False` (a test switch) skips the closure: the
negative control of the writer-closure guarantee.
"""
from __future__ import annotations

from collections import OrderedDict


class WriterClosure:
    def __init__(self, port, max_log: int = 1024):
        self.port = port
        self.log: OrderedDict[str, dict] = OrderedDict()
        self.max_log = max_log
        self.cut_steps = 0

    def close(self, cut: dict, t: float, enabled: bool = True) -> list[str]:
        """Apply a cut {"chunks": {req_id: (start, n)}, "decision": {...}}. Returns the rolled-back request ids."""
        self.cut_steps += 1
        rolled = []
        evict: set[int] = set()
        for rid, (start, n) in cut["chunks"].items():
            if not n or not self.port.live(rid):
                continue
            if enabled:
                evict.update(self.port.rollback(rid, start, start + n))
                rolled.append(rid)
            self.log[rid] = dict(cut.get("decision") or {}, closed_at=t, rolled_back_to=start)
            while len(self.log) > self.max_log:
                self.log.popitem(last=False)
        if evict:
            self.port.evict_hashes(evict)
        return rolled

    def take(self, req_id: str | None) -> dict | None:
        """The cut decision recorded for a request (consumed by its FENCE), or None."""
        return self.log.pop(req_id, None) if req_id else None
