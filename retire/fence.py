"""FENCE: close the predecessor's writers and collect one receipt per participant (engine side; speaks the KV port).

Invariants:
- Between two steps no forward pass is in flight (CPU, PP=1), so once the predecessor leaves the scheduler nothing
  of its epoch is launched again. Its writer frontier is the scheduler's (tokens whose writes completed), capped by
  every worker rank's own acknowledgement when there are several ranks.
- A receipt is issued per KV group (and per rank with several ranks, and for the drafter under speculative
  decoding). With several ranks, a rank whose acknowledgement of the last launched step does not arrive within the
  bound sends no receipt, and the transition goes cold naming it: certification needs the full participant set.
- The receipt records how the writer was closed: "safe-point" (a cut inside the step, from the writer closure),
  "finish-step" or "step-boundary:mixed" (the worker's decision, from the mailbox log), else "step-boundary".
- FENCE retires the predecessor's revocation-mailbox entry and the decision log, whether or not the SUPERSEDE is
  accepted, so a revocation never outlives the command that posted it.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .mailbox import key
from .types import Receipt


@dataclass(frozen=True)
class FenceOutcome:
    frontier: int
    receipts: tuple[Receipt, ...]
    reason: str | None = None   # why the transition must go cold (incomplete participant set), or None


class Fence:
    def __init__(self, port, *, mailbox=None, ranks=None, world: int = 1, spec_enabled: bool = False,
                 receipt_timeout: float = 1.0):
        self.port, self.mailbox, self.ranks = port, mailbox, ranks
        self.world, self.spec_enabled, self.receipt_timeout = world, spec_enabled, receipt_timeout
        self.drafts: dict[str, Counter] = {}

    # ------------------------------------------------------------------ bookkeeping between steps
    def note_drafts(self, counts: dict[str, tuple[int, int]]) -> None:
        """Speculative decoding: per request, draft tokens verified and accepted in a committed step."""
        for rid, (drafted, accepted) in counts.items():
            c = self.drafts.setdefault(rid, Counter())
            c["drafted"] += drafted
            c["accepted"] += accepted
            c["steps"] += 1

    def drop(self, req_ids) -> None:
        for rid in req_ids:
            self.drafts.pop(rid, None)

    def forget(self, keep) -> None:
        for rid in [r for r in self.drafts if not keep(r)]:
            del self.drafts[rid]

    def retire_revocation(self, posted: str | None, old_id: str | None) -> dict | None:
        """Retire the mailbox entry the frontend posted for this SUPERSEDE (accepted or refused) and consume the
        worker's decision log; returns the log if it holds a decision about the predecessor `old_id` (the log names
        requests by mailbox key: `req_keys`)."""
        if self.mailbox is None:
            return None
        log = self.mailbox.read_log()
        if posted:
            self.mailbox.clear(posted)
        self.mailbox.clear_log()
        return log if log and old_id and key(old_id).hex() in log.get("req_keys", ()) else None

    # ------------------------------------------------------------------ FENCE
    def close(self, old_id: str | None, epoch: int, step: int, cut: dict | None, log: dict | None) -> FenceOutcome:
        live = old_id is not None and self.port.live(old_id)
        frontier = self.port.frontier(old_id) if live else 0
        if cut is not None:
            path, detail = "safe-point", cut
        elif log is not None:
            path, detail = log.get("path", "step-boundary"), log
        else:
            path, detail = "step-boundary", {}
        groups = range(len(self.port.group_block_sizes))
        reason = None
        if self.ranks is None:
            receipts = [Receipt(f"kv-group-{i}", epoch, frontier, path, detail) for i in groups]
        else:
            acks = self.ranks.collect(self.world, step, self.receipt_timeout)
            receipts = [Receipt(f"rank-{r}/kv-group-{i}", epoch, int(acks[r].get(old_id, 0)) if live else 0, path,
                                dict(detail, step=step, rank=r)) for r in sorted(acks) for i in groups]
            missing = [r for r in range(self.world) if r not in acks]
            if missing:
                reason = (f"participant set incomplete: no receipt from rank(s) {missing} for step {step} within "
                          f"{self.receipt_timeout}s")
            frontier = min([frontier] + [r.frontier for r in receipts])
        if self.spec_enabled:
            receipts.append(self._drafter(old_id if live else None, epoch, frontier, path))
        return FenceOutcome(frontier, tuple(receipts), reason)

    def _drafter(self, old_id: str | None, epoch: int, frontier: int, path: str) -> Receipt:
        """The ngram drafter runs inside the step, so it is fenced at the same boundary as the target; drafts
        proposed but not yet verified hold no KV (they are not in the request's tokens, and the frontier excludes
        their slots) and are discarded with the old request."""
        v = self.port.view(old_id) if old_id else None
        sc = self.drafts.get(old_id, Counter()) if old_id else Counter()
        return Receipt("drafter", epoch, frontier, path, {
            "pending_drafts": v.spec_pending if v else 0, "num_tokens": len(v.tokens) if v else 0,
            "drafted": sc["drafted"], "accepted": sc["accepted"]})
