"""The transition core: one SUPERSEDE, decided in the engine thread between two steps (speaks only the KV port).

Invariants (each stage is a method below; `supersede` runs them in order, atomically with respect to scheduling):
- ADVANCE: the compare-and-swap on the scope's epoch (`VersionTable`). A refused SUPERSEDE changes nothing: no
  version advances, the successor is never admitted, no pin is taken; only the mailbox entry the frontend posted for
  it is retired.
- FENCE: the predecessor launches nothing more; its writer frontier and one receipt per participant are recorded.
- ALIGN: certified = min(LCP, frontier, len(new) - 1) rounded down to the unit shared by every KV group (and the
  prefill chunk under "exact", within the cold-shaped extent), within the tenant's pin quota; sliding-window groups
  keep null placeholders before the window; the predecessor must be live and share the successor's fingerprint.
  The LCP reads vLLM's chained prefix-cache hashes first when the port trusts them (sha256): equal hashes prove the
  leading full blocks equal in O(log blocks); only the tokens after them are compared.
- PIN: the certified blocks carry one handoff pin from here until adoption is verified. The pin is the
  predecessor's own references, moved out of its table (`port.take`), when its table starts with exactly the
  certified blocks; otherwise (revision slack filled a position vLLM nulled) it takes new ones.
- RESUME: generations re-checked; the successor's table aliases the certified blocks and the handoff pin's
  references become its table's (`alias(held=True)`, `hand_over`) (or, under the DRAM tier, it is held for a
  restore); a successor that inherits nothing reads no prefix cache at all, and its pin is released.
- RECLAIM: the predecessor is finished after the successor is admitted; its old-only blocks return to the pool.
  Together: each certified block changes owner without a reference taken or given back, so the O(certified blocks)
  work of a transition is reads and list moves, not pool operations.
- Revision slack (`retire/slack.py`, opt-in by contract): the sliding-window blocks a version keeps behind its
  frontier fill ALIGN's view of its table; they are updated after every committed step and end at RECLAIM (the
  successor takes over those its own slack covers).
"""
from __future__ import annotations

import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from .align import Alignment, ChunkShape, alignment_unit, certify_length, chained_prefix_count
from .closure import WriterClosure
from .dram.engine import DramLedger
from .fence import Fence, FenceOutcome
from .holds import Holds
from .ledger import GenerationTable, PinKey, PinLedger, refcount_audit
from .slack import Slack
from .switches import EngineSwitches
from .types import Certificate, RequestTag, TransitionResult, VersionKey
from .versions import VersionTable

now = time.monotonic


@dataclass
class Plan:
    """ALIGN's decision: `tokens` certified in `per_group` blocks, or a cold `reason`."""

    tokens: int = 0
    per_group: list[list[int]] = field(default_factory=list)
    alignment: Alignment | None = None
    reason: str | None = None
    old_id: str | None = None  # the predecessor whose table holds `per_group` (PIN moves its references)


class TransitionCore:
    def __init__(self, port, *, mailbox=None, ranks=None, max_results: int = 4096):
        self.port = port
        self.counters: Counter = Counter()
        self.versions = VersionTable()
        self.gens = GenerationTable(port.num_blocks)
        self.gens.attach(port)
        self.pins = PinLedger(port)
        self.holds = Holds(port)
        self.closure = WriterClosure(port)
        self.shape = ChunkShape(port.chunk)
        self.fence = Fence(port, mailbox=mailbox, ranks=ranks, world=port.world_size,
                           spec_enabled=port.spec_enabled)
        self.dram = DramLedger(port, self.pins, self.gens, self.versions, self.holds, self.counters)
        self.switches = EngineSwitches()
        self.slack = Slack(port, self.pins, self.versions)
        self.results: OrderedDict[VersionKey, TransitionResult] = OrderedDict()
        self.closed_at: OrderedDict[str, float] = OrderedDict()
        self.max_results = max_results
        self.step = 0
        self.left: list[str] = []  # request ids that left the scheduler since the last commit (forgotten in after_gate)

    # ------------------------------------------------------------------ events from the scheduler
    def submit(self, handle, tag: RequestTag) -> None:
        """Epoch 0 of a scope: register it, admit it. A duplicate of a live scope is admitted but never current
        (the audit reports it as a live obsolete execution; the facade's ScopeExists check prevents it)."""
        if not self.versions.register(handle.request_id, tag, self.port.live):
            self.counters["duplicate_submits"] += 1
        self.port.admit(handle)

    def supersede(self, handle, tag: RequestTag) -> TransitionResult:
        t0 = now()
        sk, sup = tag.key.scope, tag.supersede
        hook = self.switches.take(sk)
        refusal = self.versions.check(tag) or (("injected", str(hook["refuse"])) if hook.get("refuse") else None)
        cur = self.versions.current.get(sk)
        old_id = cur.req_id if cur is not None and not refusal else None
        log = self.fence.retire_revocation(sup.posted, old_id)
        if refusal:
            self.counters["refused"] += 1
            return self._store(TransitionResult(tag.key, refused=refusal[1], refused_kind=refusal[0], t_engine=t0))
        self.versions.advance(handle.request_id, tag)  # ADVANCE: from here no output of old_id is committed
        t1 = now()
        self.holds.drop(sk, old_id)
        stale = tuple(self.dram.retire_stale(sk))
        fo = self.fence.close(old_id, sup.expected_epoch, self.step, self.closure.take(old_id), log)
        t2 = now()
        plan = self._align(old_id, handle, tag, fo)
        t3 = now()
        flat, gens = self._pin(tag, plan, hook)
        t4 = now()
        inherited, dram_held, reason = self._resume(handle, tag, plan, flat, gens, hook, old_id)
        t5 = now()
        if old_id is not None and self.port.live(old_id):
            # slack: the successor keeps what it covers
            self.counters["slack_handoff_blocks"] += self.slack.handoff(old_id, handle.request_id, inherited)
            self.port.finish(old_id)  # RECLAIM, after the successor is admitted
        self.slack.release(old_id)
        t6 = now()
        self.counters["supersedes"] += 1
        cert = self._certificate(tag, plan, fo, gens, handle) if inherited or dram_held else None
        return self._store(TransitionResult(
            tag.key, None, None, inherited, cert, None if inherited else reason, fo.receipts,
            {"advance": t1 - t0, "fence": t2 - t1, "align": t3 - t2, "pin": t4 - t3, "resume": t5 - t4,
             "reclaim": t6 - t5, "engine_total": t6 - t0}, t0, t2,
            self._dram_handoff(tag, plan, hook) if dram_held else None, stale))

    # ------------------------------------------------------------------ ALIGN
    def _align(self, old_id: str | None, handle, tag: RequestTag, fo: FenceOutcome) -> Plan:
        contract = tag.supersede.contract
        old = self.port.view(old_id) if old_id is not None and self.port.live(old_id) else None
        reason = fo.reason or (None if old is not None else "predecessor not live")
        new = self.port.view(handle)
        if reason is None:
            reason = self._eligibility(old, new, contract)
        if reason is not None:
            return Plan(reason=reason)
        unit = alignment_unit(self.port.block_size, contract.mode, self.port.chunk)
        hb = self.port.hash_block  # equal chained prefix hashes stand for equal tokens: O(log blocks), not O(LCP)
        known = chained_prefix_count(old.hashes, new.hashes) * hb if hb else 0
        a = certify_length(old_tokens=old.tokens, new_prompt=new.prompt, frontier=fo.frontier, align=unit,
                           known=known)
        n, reason = a.certified, None
        if contract.mode == "exact" and n > (extent := self.shape.extent(old_id)):
            n = extent - extent % unit  # only KV written in a cold run's chunk shape (align.ChunkShape)
            if n == 0:
                reason = (f"exact mode: no chunk-aligned prefix written in a cold run's shape "
                          f"(extent={extent}, unit={unit})")
        n, reason = self._quota(n, unit, tag, a, reason, self.slack.held(old_id))
        if n == 0 and reason is None:
            reason = f"no shared prefix to certify (lcp={a.lcp}, frontier={a.frontier}, unit={unit})"
        if reason is not None:
            return Plan(alignment=a, reason=reason)
        per_group, reason = self._certified_blocks(old_id, n)
        return Plan(n if reason is None else 0, per_group if reason is None else [], a, reason, old_id)

    def _eligibility(self, old, new, contract) -> str | None:
        if not contract.inherit:
            return "contract forbids inheritance"
        a, b = dict(old.fingerprint), dict(new.fingerprint)
        for k in a:
            if a[k] != b.get(k):
                return f"config mismatch: {k} ({a[k]!r} != {b.get(k)!r})"
        return None

    def _quota(self, n: int, unit: int, tag: RequestTag, a: Alignment, reason: str | None, own_slack: int = 0):
        """`own_slack`: the predecessor's revision-slack blocks, which the handoff re-pins (not counted twice)."""
        quota = tag.supersede.contract.pin_quota_blocks
        if quota is None:
            return n, reason
        free = max(0, int(quota) - self.pins.pinned(tag.tenant) + own_slack)
        max_blocks = free // max(len(self.port.group_block_sizes), 1)
        n = min(n, (max_blocks * self.port.block_size) // unit * unit)
        if n == 0 and reason is None and (a.certified > 0 or max_blocks == 0):
            reason = f"pin quota: {quota} blocks, {free} free" + (
                "" if a.certified else f" (nothing certifiable anyway: lcp={a.lcp}, frontier={a.frontier})")
        return n, reason

    def _certified_blocks(self, old_id: str, n: int) -> tuple[list[list[int]], str | None]:
        """The predecessor's blocks holding [0, n) per group. In a sliding-window group, blocks before the window
        ending at n become null placeholders (never certified, pinned or adopted), even if still live; every block
        the successor will attend to must be live."""
        null = self.port.null_block_id
        out = []
        for g, (table, bs) in enumerate(zip(self.port.blocks(old_id), self.port.group_block_sizes)):
            head = self.slack.fill(old_id, g, table[: n // bs])  # revision slack: kept blocks vLLM nulled
            first = self.port.first_needed_block(g, n)
            if null in head[first:]:  # C-level scan, not a Python generator per block
                return [], (f"sliding window: blocks the successor attends to at {n} tokens were already evicted "
                            f"by the predecessor" + self.slack.explain(old_id))
            out.append([null] * first + head[first:])
        return out, None

    # ------------------------------------------------------------------ PIN / RESUME
    def _pin(self, tag: RequestTag, plan: Plan, hook: dict) -> tuple[list[int], list[tuple[int, ...]]]:
        null, flat = self.port.null_block_id, []
        for g in plan.per_group:  # C-level unless a sliding-window group holds null placeholders
            flat.extend(g if null not in g else [b for b in g if b != null])
        gens = [self.gens.of(g) for g in plan.per_group]
        if flat:
            key = PinKey(tag.key, "handoff")
            if plan.old_id is not None and self.port.take(plan.old_id, plan.per_group):
                self.pins.adopt(key, tag.tenant, flat)  # the predecessor's references move: none taken, none freed
                self.counters["handoff_moved"] += 1
            else:  # its table no longer starts with them (revision slack filled a nulled position): new references
                self.pins.pin(key, tag.tenant, flat)
            if hook.get("bump_generation"):  # GenerationRace fault: a certified block is reallocated after ALIGN
                self.gens.bump([flat[int(hook.get("index", 0)) % len(flat)]])
        return flat, gens

    def _resume(self, handle, tag, plan: Plan, flat, gens, hook: dict, old_id) -> tuple[int, bool, str | None]:
        inherited, dram_held, reason = 0, False, plan.reason
        if flat:
            if [self.gens.of(g) for g in plan.per_group] != gens:
                reason = "generation mismatch: a certified block was reallocated after ALIGN"
            elif tag.supersede.contract.dram_tier:
                reason = self.dram.hold(tag.key, handle, plan.per_group, plan.tokens)
                dram_held = reason is None
            else:
                self.port.alias(handle, plan.per_group, plan.tokens, held=True)  # the handoff pin's references
                adopted = self.port.blocks(handle.request_id)
                assert all(a[: len(g)] == g for a, g in zip(adopted, plan.per_group)), "adoption not verified"
                inherited = plan.tokens
        if inherited == 0:
            self.port.skip_prefix_cache(handle)  # a cold successor inherits nothing, not even by hash lookup
            self.counters["cold"] += 1
        else:
            self.counters["inherited"] += 1
            self.counters["inherited_tokens"] += inherited
        self.shape.start(handle.request_id, inherited, min(inherited, self.shape.extent(old_id)) if old_id else 0)
        if hook.get("hold") or dram_held:
            self.holds.hold(tag.key.scope, handle)
        else:
            self.port.admit(handle)
        if inherited:
            self.pins.hand_over(PinKey(tag.key, "handoff"))  # the successor's table holds its references now
        elif flat and not dram_held:
            self.pins.release(PinKey(tag.key, "handoff"))
        return inherited, dram_held, reason

    def _certificate(self, tag: RequestTag, plan: Plan, fo: FenceOutcome, gens, handle) -> Certificate:
        fp = dict(self.port.config_fingerprint) | dict(self.port.view(handle).fingerprint)
        return Certificate(
            tag.key.scope.scope, tag.tenant, tag.supersede.expected_epoch, tag.key.epoch, plan.tokens,
            plan.alignment.lcp, fo.frontier, tuple(tuple(g) for g in plan.per_group), tuple(tuple(g) for g in gens),
            "|".join(f"{k}={v}" for k, v in sorted(fp.items())), tag.supersede.contract.mode)

    def _dram_handoff(self, tag: RequestTag, plan: Plan, hook: dict):
        from .types import DramHandoff
        return DramHandoff(tag.key, plan.tokens, tuple(tuple(g) for g in plan.per_group), bool(hook.get("hold")))

    # ------------------------------------------------------------------ committed steps
    def before_commit(self, chunks: dict[str, tuple[int, int, int]]) -> list:
        """Read before vLLM commits a step (a finishing request's table is freed during the commit)."""
        shape = self.shape
        return [(rid, s, n, plen, self._shape_tables(rid) if shape.needs_tables(rid, n) else None)
                for rid, (s, n, plen) in chunks.items()]

    def after_commit(self, pre: list, cut: dict | None, drafts: dict, t: float, preempted=()) -> None:
        if drafts:
            self.fence.note_drafts(drafts)
        if cut:
            self.closure.close(cut, t, enabled=self.switches.closure, innocents=self.switches.take_innocents())
        for rid, start, n, plen, tables in pre:
            if not (cut and cut["chunks"].get(rid, (0, 0))[1]):
                self.shape.observe(rid, start, n, plen, tables)
        self.slack.after_commit([p[0] for p in pre], preempted)
        self.left += [p[0] for p in pre if not self.port.known(p[0])]  # finished (vLLM freed them in this commit)

    def after_gate(self) -> None:
        """After gate (a) judged this step's outputs: forget the requests that left the scheduler (a request's last
        output is judged by its tag before the tag is dropped), one by one: O(requests that left), not O(live)."""
        if self.left:
            self._forget_left()

    def gate(self, req_id: str) -> bool:
        """Gate (a): may this request's output be committed?"""
        return not self.switches.gate or self.versions.is_current(req_id)

    def _shape_tables(self, rid: str) -> list:
        gen, null = self.gens.gen, self.port.null_block_id
        return [(bs, [(b, gen[b], b == null) for b in table])
                for bs, table in zip(self.port.group_block_sizes, self.port.blocks(rid))]

    # ------------------------------------------------------------------ bookkeeping
    def _store(self, res: TransitionResult) -> TransitionResult:
        self.results[res.key] = res
        while len(self.results) > self.max_results:
            self.results.popitem(last=False)
        return res

    def on_finished(self, req_ids, t: float) -> None:
        for rid in req_ids:
            self.closed_at[rid] = t
            self.slack.release(rid)
            self.left.append(rid)
        while len(self.closed_at) > 4096:
            self.closed_at.popitem(last=False)

    def _forget_left(self) -> None:
        """Per-request state of the requests that left, O(requests that left): a full `prune` scans every live
        request, which made each transition O(live scopes) (the step after a RECLAIM always pruned)."""
        left, self.left = self.left, []
        gone = [r for r in left if not self.port.known(r)]
        self.versions.drop(gone)
        self.fence.drop(gone)
        for rid in gone:
            self.shape.forget(rid)

    def prune(self) -> None:
        live = set(self.port.request_ids())
        keep = live.__contains__
        self.versions.forget(keep)
        self.fence.forget(keep)
        for rid in [r for r in self.shape.exact if r not in live]:
            self.shape.forget(rid)

    def audit(self) -> dict:
        p = self.port
        self.prune()
        violations = refcount_audit(ref_counts=p.ref_counts(), tables=p.tables(), pins=self.pins.counts(),
                                    null_block_id=p.null_block_id)
        dangling = [k for k in self.pins.pins if not self.slack.owns(k)]
        if dangling:
            violations.append(f"dangling pins: {sorted(dangling, key=repr)}")
        violations += self.slack.audit()
        violations += self.dram.audit()
        if self.holds.held:
            violations.append(f"successors still held at a barrier: {sorted(self.holds.held, key=repr)}")
        live = p.request_ids()
        obsolete = [r for r in live if not self.versions.is_current(r)]
        if obsolete:
            violations.append(f"live obsolete executions: {obsolete}")
        free = p.free_block_count()
        if not live and free != p.num_blocks - 1:
            violations.append(f"drained but only {free} of {p.num_blocks - 1} blocks free")
        return {"valid": not violations, "violations": violations, "live_requests": sorted(live),
                "free_blocks": free, "num_blocks": p.num_blocks}
