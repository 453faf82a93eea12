"""FENCE engine-free (retire/fence.py, retire/closure.py, through retire/transition.py): the revocation mailbox and
the worker's decision log, tensor-parallel rank receipts, the drafter's receipt, and the writer closure.

A real RetireScheduler (vLLM's Scheduler, KVCacheManager, BlockPool; no model). The other processes are played by
the test with the real shared-memory files they use: the frontend posts to a real `Mailbox` (mapped by the
scheduler through RETIRE_MAILBOX, as EngineCore maps it), the worker writes its decision log there, and worker
ranks write their slots of a real `RankLedger` after each step, as `participants.RankRecorder` does. The
multi-rank core is the scheduler's own core rebuilt with the rank ledger on a port that reports two ranks (the
engine-free pool has one process; the ranks' acknowledgements are what FENCE reads).

Invariants under test (retire/fence.py): a posted revocation and the decision log never outlive the SUPERSEDE that
posted them, accepted or refused; a receipt per KV group (per rank with several ranks, plus the drafter under
speculative decoding) with the writer frontier and how it was closed; the frontier is the minimum over the
scheduler and every rank; a rank that does not acknowledge the last launched step within the bound sends no
receipt and the successor goes cold naming it.
"""
from __future__ import annotations

import json

import pytest

from conformance.fixtures.enginefree import EngineFreeCore
from conformance.fixtures.prompts import revise, tokens
from retire import Contract
from retire.mailbox import Mailbox, key
from retire.mailbox import create_path as mailbox_path
from retire.participants import RankLedger
from retire.participants import create_path as ranks_path
from retire.transition import TransitionCore
from retire.types import Receipt

P = tokens(200, 7)


def _prefill(core, scope="s", prompt=P, tenant="t") -> str:
    rid = core.submit(tenant, scope, prompt)
    while rid in core.s.requests and core.s.requests[rid].num_computed_tokens < len(prompt):
        core.step()
    return rid


# ------------------------------------------------------------------------------------------------ mailbox
@pytest.fixture
def mailbox(monkeypatch):
    path = mailbox_path()
    monkeypatch.setenv("RETIRE_MAILBOX", path)
    mb = Mailbox(path)
    yield mb
    mb.unlink()


def test_posted_revocation_is_retired_by_an_accepted_supersede(mailbox):
    core = EngineFreeCore()
    assert core.s.retire.fence.mailbox is not None  # the scheduler mapped the frontend's mailbox
    old = _prefill(core)
    other = _prefill(core, scope="o")
    mailbox.post(old, 150, 220)
    mailbox.post(other, 1, 2)
    res, _ = core.supersede("t", "s", 0, revise(P, 150, 220, 1), posted=old)
    assert res.refused is None and not mailbox.is_posted(old) and mailbox.is_posted(other)


def test_posted_revocation_is_retired_by_a_refused_supersede_too(mailbox):
    core = EngineFreeCore()
    old = _prefill(core)
    mailbox.post(old, 150, 220)
    res, _ = core.supersede("t", "s", 3, P, posted=old)
    assert res.refused_kind == "stale-epoch" and not mailbox.is_posted(old)
    assert old in core.s.requests and core.current("t", "s").req_id == old


def test_workers_decision_log_names_the_fence_path_and_is_consumed(mailbox):
    core = EngineFreeCore()
    old = _prefill(core)
    log = {"req_keys": [key(old).hex()], "path": "finish-step", "layer": 3}
    mailbox.write_log(json.dumps(log))
    res, _ = core.supersede("t", "s", 0, revise(P, 150, 220, 1), posted=old)
    assert res.receipts == (Receipt("kv-group-0", 0, 200, "finish-step", log),)
    assert mailbox.read_log() is None


def test_a_decision_log_without_a_path_is_a_step_boundary(mailbox):
    core = EngineFreeCore()
    old = _prefill(core)
    log = {"req_keys": [key(old).hex()], "cut": False}
    mailbox.write_log(json.dumps(log))
    res, _ = core.supersede("t", "s", 0, revise(P, 150, 220, 1))
    assert res.receipts == (Receipt("kv-group-0", 0, 200, "step-boundary", log),)


def test_a_decision_log_about_another_request_is_consumed_but_not_used(mailbox):
    core = EngineFreeCore()
    _prefill(core)
    mailbox.write_log(json.dumps({"req_keys": [key("someone-else").hex()], "path": "finish-step"}))
    res, _ = core.supersede("t", "s", 0, revise(P, 150, 220, 1))
    assert res.receipts == (Receipt("kv-group-0", 0, 200, "step-boundary", {}),)
    assert mailbox.read_log() is None
    core.s.retire.fence.retire_revocation(None, None)  # nothing posted, no log: a no-op


def test_a_refused_supersede_consumes_the_log_but_uses_nothing(mailbox):
    core = EngineFreeCore()
    old = _prefill(core)
    mailbox.write_log(json.dumps({"req_keys": [key(old).hex()], "path": "finish-step"}))
    res, _ = core.supersede("t", "s", 5, P)
    assert res.refused_kind == "stale-epoch" and res.receipts == () and mailbox.read_log() is None


# ------------------------------------------------------------------------------------------------ ranks
class TwoRanks:
    """The scheduler's core rebuilt for a 2-rank engine; `ack(rank, frontiers)` is that rank's slot after the last
    launched step (RankRecorder's write)."""

    def __init__(self, timeout: float | None = 0.05, spec: bool = False):
        self.core = EngineFreeCore()
        self.path = ranks_path()
        self.ledger = RankLedger(self.path)
        port = self.core.port
        port.world_size, port.spec_enabled = 2, spec
        self.core.s.retire = TransitionCore(port, mailbox=None, ranks=self.ledger)
        if timeout is not None:
            self.core.s.retire.fence.receipt_timeout = timeout

    def ack(self, rank: int, frontiers: dict, step: int | None = None):
        self.ledger.write(rank, self.core.s.retire.step if step is None else step, frontiers)

    def close(self):
        self.ledger.unlink()


@pytest.fixture
def ranks():
    r = TwoRanks()
    yield r
    r.close()


def test_every_rank_acknowledges_and_the_frontier_is_the_minimum(ranks):
    core = ranks.core
    old = _prefill(core)
    ranks.ack(0, {old: 200})
    ranks.ack(1, {old: 150})  # rank 1 wrote less (its writes of the rest did not complete)
    step = core.s.retire.step
    res, _ = core.supersede("t", "s", 0, revise(P, 190, 220, 1))
    assert res.receipts == (Receipt("rank-0/kv-group-0", 0, 200, "step-boundary", {"step": step, "rank": 0}),
                            Receipt("rank-1/kv-group-0", 0, 150, "step-boundary", {"step": step, "rank": 1}))
    assert res.inherited_tokens == 128 and res.certificate.frontier == 150


def test_a_rank_that_never_acknowledges_the_last_step_makes_the_successor_cold(ranks):
    core = ranks.core
    old = _prefill(core)
    ranks.ack(0, {old: 200})
    ranks.ack(1, {old: 200}, step=core.s.retire.step - 1)  # rank 1 is a step behind
    res, succ = core.supersede("t", "s", 0, revise(P, 150, 220, 1))
    assert res.inherited_tokens == 0 and res.certificate is None
    assert res.cold_reason == (f"participant set incomplete: no receipt from rank(s) [1] for step "
                               f"{core.s.retire.step} within 0.05s")
    assert [r.participant for r in res.receipts] == ["rank-0/kv-group-0"]
    assert core.s.requests[succ].num_computed_tokens == 0


def test_the_default_receipt_bound_is_one_second():
    r = TwoRanks(timeout=None)
    try:
        core = r.core
        old = _prefill(core)
        r.ack(0, {old: 200})
        res, _ = core.supersede("t", "s", 0, revise(P, 150, 220, 1))
        assert res.cold_reason.endswith("within 1.0s") and "rank(s) [1]" in res.cold_reason
    finally:
        r.close()


def test_rank_receipts_of_a_finished_predecessor_carry_no_frontier(ranks):
    core = ranks.core
    old = _prefill(core)
    core.drain()
    ranks.ack(0, {old: 200})
    ranks.ack(1, {old: 200})
    res, _ = core.supersede("t", "s", 0, revise(P, 150, 220, 1))
    assert [(r.participant, r.frontier) for r in res.receipts] == [("rank-0/kv-group-0", 0), ("rank-1/kv-group-0", 0)]
    assert res.cold_reason == "predecessor not live"


# ------------------------------------------------------------------------------------------------ drafter
def test_drafter_receipt_reports_pending_and_verified_drafts():
    r = TwoRanks(spec=True)
    try:
        core = r.core
        old = _prefill(core)
        core.s.retire.after_commit([], None, {old: (3, 2)}, 0.0)  # a committed step verified 3 drafts, accepted 2
        core.s.retire.after_commit([], None, {old: (4, 1)}, 0.0)
        core.s.requests[old].spec_token_ids = [11, 12]  # proposed, not yet verified
        n_tokens = len(core.s.requests[old].all_token_ids)
        r.ack(0, {old: 200})
        r.ack(1, {old: 200})
        res, _ = core.supersede("t", "s", 0, revise(P, 150, 220, 1))
        assert res.receipts[-1] == Receipt("drafter", 0, 200, "step-boundary", {
            "pending_drafts": 2, "num_tokens": n_tokens, "drafted": 7, "accepted": 3})
        assert len(res.receipts) == 3 and res.inherited_tokens == 128
        core.step()  # the commit prunes what FENCE kept about the reclaimed predecessor
        assert old not in core.s.retire.fence.drafts
    finally:
        r.close()


def test_drafter_receipt_of_a_finished_predecessor_is_empty():
    r = TwoRanks(spec=True)
    try:
        core = r.core
        old = _prefill(core)
        core.s.retire.after_commit([], None, {old: (3, 2)}, 0.0)
        core.drain()
        r.ack(0, {})
        r.ack(1, {})
        res, _ = core.supersede("t", "s", 0, revise(P, 150, 220, 1))
        assert res.receipts[-1] == Receipt("drafter", 0, 0, "step-boundary", {
            "pending_drafts": 0, "num_tokens": 0, "drafted": 0, "accepted": 0})
    finally:
        r.close()


# ------------------------------------------------------------------------------------------------ writer closure
def test_cut_step_rolls_every_scheduled_request_back_and_evicts_the_cut_blocks_hashes():
    core = EngineFreeCore()
    Q, R = tokens(600, 3), tokens(300, 4)
    a = core.submit("t", "a", Q)
    core.step()  # a: [0, 256)
    b = core.submit("t", "b", R)
    so = core.s.schedule()
    assert set(so.num_scheduled_tokens) == {a}  # a's second chunk fills the budget
    blocks = core.port.blocks(a)[0]
    hashed = lambda: {blk.block_id for blk in core.port.pool.blocks if blk.block_hash is not None}  # vLLM's view
    assert set(blocks[8:16]) <= hashed()  # vLLM hashed the chunk's blocks at schedule time
    core.s.update_from_output(so, core.ef.cut_output(so, {"layer": 1}))
    assert core.s.requests[a].num_computed_tokens == 256
    assert core.s.retire.closure.cut_steps == 1
    assert not set(blocks[8:16]) & hashed() and set(blocks[:8]) <= hashed()  # only the cut chunk lost its hashes
    log = core.s.retire.closure.take(a)
    assert log["rolled_back_to"] == 256 and log["layer"] == 1 and core.s.retire.closure.take(a) is None
    assert core.s.retire.closure.take(None) is None and core.s.retire.closure.take(b) is None


class _ClosurePort:
    """The port calls of the writer closure, recorded (a chunk of block size 32 starts at block start // 32)."""

    def __init__(self):
        self.rolled, self.evicted, self.shared, self.preempted = [], [], [], []

    def live(self, rid):
        return rid != "gone"

    def rollback(self, rid, start, end):
        self.rolled.append((rid, start, end))
        return [start // 32]

    def evict_hashes(self, ids):
        self.evicted.append(sorted(ids))

    def sharers(self, ids):
        self.shared.append(sorted(ids))
        return ["s1", "s2", "s3"]

    def preempt(self, rid):
        self.preempted.append(rid)
        return rid != "s2"


def test_closure_log_is_bounded_and_skips_requests_with_nothing_scheduled():
    from retire.closure import WriterClosure

    port = _ClosurePort()
    c = WriterClosure(port, max_log=2)
    rolled = c.close({"chunks": {"a": (0, 64), "b": (32, 0), "gone": (0, 32), "c": (64, 32), "d": (96, 32)},
                      "decision": {"layer": 1}}, 5.0)  # no req_ids in the decision: every chunk is revoked
    assert rolled == ["a", "c", "d"] and port.rolled == [("a", 0, 64), ("c", 64, 96), ("d", 96, 128)]
    assert port.evicted == [[0, 2, 3]] and list(c.log) == ["c", "d"]  # at most 2 decisions kept, oldest dropped
    assert c.log["d"] == {"layer": 1, "closed_at": 5.0, "rolled_back_to": 96} and c.cut_steps == 1
    assert port.shared == [[0, 2, 3]] and port.preempted == ["s1", "s2", "s3"]  # sharers of the evicted blocks
    assert c.counts == {"revoked_rolled_back": 3, "sharers_preempted": 2}  # s2: vLLM did not preempt it
    off = WriterClosure(_ClosurePort())
    assert off.close({"chunks": {"a": (0, 64)}}, 1.0, enabled=False) == []  # the negative-control switch
    assert off.port.rolled == [] and off.port.evicted == [] and off.log["a"] == {"closed_at": 1.0, "rolled_back_to": 0}


def test_closure_log_default_bound_keeps_the_newest_1024_decisions():
    from retire.closure import WriterClosure

    class Port:
        def live(self, rid):
            return True

        def rollback(self, rid, start, end):
            return []

    c = WriterClosure(Port())
    c.close({"chunks": {f"r{i}": (0, 32) for i in range(1025)}}, 1.0)
    assert len(c.log) == 1024 and "r0" not in c.log and "r1" in c.log and "r1024" in c.log


def test_closure_of_a_mixed_cut_rolls_back_innocents_logs_only_the_revoked_and_preempts_sharers():
    """A decision naming its revoked requests: every scheduled chunk is rolled back (revoked and innocent), only
    the revoked ones get a decision log, sharers of the evicted blocks are preempted. `innocents=False` (the test
    switch) rolls back only the revoked and preempts no one; `enabled=False` rolls back nothing."""
    from retire.closure import WriterClosure
    cut = {"chunks": {"i": (0, 32), "a": (64, 32)}, "decision": {"layer": 2, "req_ids": ["a"]}}
    port = _ClosurePort()
    c = WriterClosure(port)
    assert c.close(cut, 3.0) == ["i", "a"] and port.rolled == [("i", 0, 32), ("a", 64, 96)]
    assert list(c.log) == ["a"] and c.log["a"] == {"layer": 2, "req_ids": ["a"], "closed_at": 3.0,
                                                   "rolled_back_to": 64}
    assert port.evicted == [[0, 2]] and port.preempted == ["s1", "s2", "s3"]
    assert c.counts == {"innocents_rolled_back": 1, "revoked_rolled_back": 1, "sharers_preempted": 2}
    port = _ClosurePort()
    c = WriterClosure(port)
    assert c.close(cut, 3.0, innocents=False) == ["a"] and port.rolled == [("a", 64, 96)]
    assert port.evicted == [[2]] and port.shared == [] and list(c.log) == ["a"]
    assert c.counts == {"revoked_rolled_back": 1}
    port = _ClosurePort()
    c = WriterClosure(port)
    assert c.close(cut, 3.0, enabled=False) == [] and port.rolled == [] and port.evicted == []
    assert list(c.log) == ["a"] and c.counts == {} and c.cut_steps == 1


def test_a_revoked_request_cut_again_before_its_supersede_keeps_the_first_decision():
    """The worker cut the revoked chunk at layer 4; its SUPERSEDE had not reached the scheduler yet, so the request
    ran its chunk again and was cut at layer 0: the receipt keeps the layer-4 decision (the one that bounded the
    work) and counts the re-cut; once taken by FENCE, a later cut is a new decision."""
    from retire.closure import WriterClosure
    port = _ClosurePort()
    c = WriterClosure(port)
    c.close({"chunks": {"a": (64, 32)}, "decision": {"layer": 4, "req_ids": ["a"]}}, 1.0)
    c.close({"chunks": {"a": (64, 32)}, "decision": {"layer": 0, "req_ids": ["a"]}}, 2.0)
    c.close({"chunks": {"a": (64, 32)}, "decision": {"layer": 0, "req_ids": ["a"]}}, 2.5)
    assert port.rolled == [("a", 64, 96)] * 3 and c.cut_steps == 3  # every cut closed the writer
    assert c.take("a") == {"layer": 4, "req_ids": ["a"], "closed_at": 1.0, "rolled_back_to": 64, "recuts": 2}
    assert c.counts["recuts"] == 2 and c.counts["revoked_rolled_back"] == 3
    c.close({"chunks": {"a": (96, 32)}, "decision": {"layer": 2, "req_ids": ["a"]}}, 3.0)
    assert c.take("a") == {"layer": 2, "req_ids": ["a"], "closed_at": 3.0, "rolled_back_to": 96}


# ------------------------------------------------------------------------------------------------ edge receipts
def test_a_fence_built_without_ranks_or_drafter_issues_one_receipt_per_kv_group():
    from retire.fence import Fence

    core = EngineFreeCore(sliding_window=1024)  # two KV groups
    old = _prefill(core)
    out = Fence(core.port).close(old, 0, core.s.retire.step, None, None)
    assert out.reason is None and out.frontier == 200
    assert [r.participant for r in out.receipts] == ["kv-group-0", "kv-group-1"]


def test_a_single_rank_fence_needs_only_rank_zero():
    from retire.fence import Fence

    core = EngineFreeCore()
    old = _prefill(core)
    ledger = RankLedger(ranks_path())
    try:
        ledger.write(0, core.s.retire.step, {old: 200})
        out = Fence(core.port, ranks=ledger, receipt_timeout=0.05).close(old, 0, core.s.retire.step, None, None)
        assert out.reason is None and [r.participant for r in out.receipts] == ["rank-0/kv-group-0"]
    finally:
        ledger.unlink()


def test_a_rank_whose_slot_does_not_hold_the_predecessor_wrote_none_of_it(ranks):
    core = ranks.core
    old = _prefill(core)
    ranks.ack(0, {old: 200})
    ranks.ack(1, {"another-request": 64})  # rank 1 acknowledged the step but holds no KV of the predecessor
    res, _ = core.supersede("t", "s", 0, revise(P, 150, 220, 1))
    assert [r.frontier for r in res.receipts] == [200, 0]
    assert res.inherited_tokens == 0 and res.cold_reason.startswith("no shared prefix to certify (lcp=150, frontier=0")


def test_rank_receipts_carry_the_cut_that_closed_the_writer(ranks):
    core = ranks.core
    Q = tokens(600, 3)
    old = core.submit("t", "s", Q)
    core.step()
    core.step(cut=True, decision={"layer": 4})
    ranks.ack(0, {old: 256})
    ranks.ack(1, {old: 256})
    res, _ = core.supersede("t", "s", 0, revise(Q, 590, 640, 1))
    for rank, r in enumerate(res.receipts):
        assert r.path == "safe-point" and r.frontier == 256
        assert r.detail["layer"] == 4 and r.detail["rolled_back_to"] == 256
        assert r.detail["rank"] == rank and r.detail["step"] == core.s.retire.step
    assert res.inherited_tokens == 256


def test_drafter_receipt_of_a_live_predecessor_without_verified_drafts():
    r = TwoRanks(spec=True)
    try:
        core = r.core
        old = _prefill(core)
        r.ack(0, {old: 200})
        r.ack(1, {old: 200})
        res, _ = core.supersede("t", "s", 0, revise(P, 150, 220, 1))
        d = res.receipts[-1]
        assert d.participant == "drafter" and d.detail["drafted"] == 0 and d.detail["accepted"] == 0
        assert d.detail["num_tokens"] == 201 and d.detail["pending_drafts"] == 0
    finally:
        r.close()


def test_drafts_of_a_live_request_survive_another_requests_prune():
    r = TwoRanks(spec=True)
    try:
        core = r.core
        keep = _prefill(core, scope="k")
        done = core.submit("t", "d", tokens(40, 2), max_tokens=1)
        core.s.retire.after_commit([], None, {keep: (3, 3), done: (2, 1)}, 0.0)
        core.step()  # `done` finishes: the commit prunes its drafts, not `keep`'s
        assert done not in core.s.retire.fence.drafts and core.s.retire.fence.drafts[keep]["drafted"] == 3
        r.ack(0, {keep: 300})
        r.ack(1, {keep: 300})
        res, _ = core.supersede("t", "k", 0, revise(P, 150, 220, 1))
        assert res.receipts[-1].detail["drafted"] == 3 and res.receipts[-1].detail["accepted"] == 3
    finally:
        r.close()


def test_drafter_receipt_of_a_finished_predecessor_reports_none_of_its_drafts():
    """Even if the core still held draft records of it (the core forgets a request's records in the step it leaves;
    the records are put back by hand after that, as a late or missed forget would leave them)."""
    r = TwoRanks(spec=True)
    try:
        core = r.core
        other = core.ef.request(core.vc, "other-client", tokens(64, 8), max_tokens=40)
        core.s.add_request(other)
        old = core.submit("t", "s", tokens(40, 2), max_tokens=2)
        core.s.retire.after_commit([], None, {old: (5, 4)}, 0.0)
        while old in core.s.requests:
            core.step()
        assert old not in core.s.retire.fence.drafts  # forgotten in the step it left
        core.s.retire.fence.note_drafts({old: (5, 4)})  # a stale record: the receipt must still report nothing
        r.ack(0, {})
        r.ack(1, {})
        res, _ = core.supersede("t", "s", 0, tokens(50, 3))
        assert res.receipts[-1].detail == {"pending_drafts": 0, "num_tokens": 0, "drafted": 0, "accepted": 0}
    finally:
        r.close()


def test_a_decision_log_without_request_ids_is_about_no_one(mailbox):
    core = EngineFreeCore()
    _prefill(core)
    mailbox.write_log(json.dumps({"path": "finish-step"}))
    res, _ = core.supersede("t", "s", 0, revise(P, 150, 220, 1))
    assert res.receipts[0].path == "step-boundary" and mailbox.read_log() is None


def test_a_decision_about_a_1000_character_request_id_fits_the_log_and_reaches_the_receipt(mailbox):
    """The worker's decision names revoked requests by mailbox key: a scope name of 1,000 characters (an internal id
    longer than the log area) still leaves a complete, parseable log, and FENCE matches it to its predecessor."""
    from retire.mailbox import LOG
    from retire.safepoints import SafePoints

    long_id = "r-" + "S" * 1000 + "#default#0-" + "0" * 32  # an internal id of a 1,000-character scope
    sp = SafePoints.__new__(SafePoints)
    sp.mb = Mailbox(mailbox.path)
    sp._log({"path": "finish-step", "cut": False, "layer": 3, "req_ids": [long_id, "other"], "lcp": 1124})
    log = mailbox.read_log()
    assert len(long_id) > LOG and log["req_keys"] == [key(long_id).hex(), key("other").hex()] and "req_ids" not in log
    from retire.fence import Fence
    f = Fence(None, mailbox=Mailbox(mailbox.path))
    assert f.retire_revocation(None, long_id) == log and mailbox.read_log() is None


def test_cut_steps_are_counted():
    core = EngineFreeCore()
    core.submit("t", "s", tokens(600, 3))
    core.step(cut=True)
    core.step(cut=True)
    core.step()
    assert core.s("stats")["cut_steps"] == 2


def test_forget_drops_the_draft_records_of_requests_not_kept_only():
    """`Fence.forget(keep)` (the full prune) drops the records of requests `keep` rejects and only those."""
    from retire.fence import Fence
    f = Fence(EngineFreeCore().port)
    f.note_drafts({"live": (3, 2), "gone": (5, 1)})
    f.forget({"live"}.__contains__)
    assert set(f.drafts) == {"live"} and f.drafts["live"]["drafted"] == 3
