"""Revision slack, engine-free (retire/slack.py): a real RetireScheduler with a sliding-window KV group next to the
full-attention one (vLLM's own Scheduler, KVCacheManager, SlidingWindowManager, BlockPool; no model).

Oracles stand outside the core: the test records which physical block vLLM put at each table position after every
step (vLLM's `req_to_blocks`, read before vLLM drops it), and judges by vLLM's own `ref_cnt` and free-block count,
and by the successor's block table as vLLM holds it. Checked:
- kept blocks survive vLLM's drop (its table holds the null block there, the block keeps ref_cnt 1 and stays out of
  the free queue), and a successor whose LCP lies up to S tokens behind the frontier adopts exactly them;
- as the frontier moves past S the blocks more than S behind return to the free queue (ref_cnt 0); at the version's
  end (finished, RECLAIM) every kept block is given back; a successor that keeps a slack takes over the kept blocks
  its own slack covers (a chain e0 -> e1 -> e2 inherits behind e1's inherited length);
- the kept blocks count against the tenant's pin quota: the version's own quota bounds them (a quota too small goes
  cold naming the quota), and another scope's handoff under a quota sees them;
- the refcount audit balances after every path (ref_cnt == table references + pins), drained: every block free.

Negative controls: slack off goes cold with the "sliding window" reason where slack on inherits; a slack that
forgets its pins without giving the references back is reported by the audit; a slack that misses a preemption keeps
blocks vLLM has since replaced.
"""
from __future__ import annotations

import pytest

from conformance.fixtures.enginefree import EngineFreeCore
from conformance.fixtures.prompts import revise, tokens
from retire import Contract

W, BS = 64, 32  # sliding window and block size of the engine-free model
SLACK = Contract(slack=True, slack_tokens=512)


def first_needed(n: int) -> int:
    """vLLM's rule (SlidingWindowManager.get_num_skipped_tokens): positions before this are not attended at n."""
    return max(0, n - W + 1) // BS


class Recorder:
    """Which block vLLM placed last at each sliding-table position of each request (read from vLLM's tables after
    every step, i.e. before the next schedule() drops anything; a preempted request that recomputes gets new blocks
    at positions it had filled before, and the last one is the block its slack may keep)."""

    def __init__(self, core: EngineFreeCore):
        self.core = core
        self.g = core.s.retire.slack.sliding[0]
        self.seen: dict[str, dict[int, int]] = {}

    def step(self, k: int = 1) -> None:
        for _ in range(k):
            self.core.step()
            self.observe()

    def observe(self) -> None:
        port = self.core.port
        for rid in port.request_ids():
            pos = self.seen.setdefault(rid, {})
            for i, b in enumerate(port.blocks(rid)[self.g]):
                if b != port.null_block_id:
                    pos[i] = b

    def table(self, rid: str) -> list[int]:
        return self.core.port.blocks(rid)[self.g]


def _core(**kw) -> tuple[EngineFreeCore, Recorder]:
    core = EngineFreeCore(num_blocks=kw.pop("num_blocks", 256), sliding_window=W,
                          max_model_len=kw.pop("max_model_len", 4096), **kw)
    return core, Recorder(core)


def _run_to(rec: Recorder, rid: str, frontier: int) -> None:
    while rec.core.port.frontier(rid) < frontier:
        rec.step()


def _extra_refs(core) -> dict[int, int]:
    """References vLLM counts beyond those of live block tables (pins), per block: from vLLM's own ref_cnt."""
    from collections import Counter
    tables = Counter(b for t in core.port.tables() for b in t if b != core.port.null_block_id)
    return {b: n - tables.get(b, 0) for b, n in core.port.ref_counts().items() if n != tables.get(b, 0)}


def _drained(core, baseline: int) -> None:
    core.drain()
    rep = core.audit()
    assert rep["valid"], rep["violations"]
    assert core.port.free_block_count() == baseline


# ---------------------------------------------------------------------------------------------- survive, adopt, release
@pytest.mark.parametrize("behind", [W // 2, W, 2 * W, 4 * W])
def test_kept_blocks_survive_the_drop_and_are_adopted(behind):
    """Predecessor at frontier 1000 (prefill) + decode; the revision's LCP lies `behind` tokens behind the frontier
    (0.5, 1, 2, 4 windows): the successor inherits the whole block-aligned LCP, its sliding table holds exactly the
    blocks vLLM had placed there (already dropped from the predecessor's table)."""
    core, rec = _core()
    baseline = core.port.free_block_count()
    prompt = tokens(1000, 3)
    old = core.submit("t", "s", prompt, max_tokens=64, contract=SLACK)
    _run_to(rec, old, 1000)
    rec.step(3)
    f = core.port.frontier(old)
    lcp = f - behind
    n = lcp // BS * BS
    dropped = [i for i in range(first_needed(n), n // BS) if rec.table(old)[i] == core.port.null_block_id]
    assert dropped or behind < W, "vLLM did not drop the window's blocks: the case tests nothing"
    refs = core.port.ref_counts()
    assert all(refs.get(rec.seen[old][i]) == 1 for i in dropped), "a kept block left vLLM's ref_cnt 1"
    revised = revise(list(core.s.requests[old].all_token_ids), lcp, lcp + 40, 5)  # prompt + generated tokens
    res, new = core.supersede("t", "s", 0, revised, contract=Contract())
    assert res.cold_reason is None and res.inherited_tokens == n, res
    # a kept block filled a position vLLM nulled, so PIN took new references instead of moving the predecessor's
    assert core.s.retire.counters["handoff_moved"] == (0 if dropped else 1), core.s.retire.counters
    succ = rec.table(new)
    assert [succ[i] for i in range(first_needed(n), n // BS)] == [rec.seen[old][i] for i in
                                                                   range(first_needed(n), n // BS)]
    assert all(b == core.port.null_block_id for b in succ[:first_needed(n)])  # placeholders stay placeholders
    assert core.audit()["valid"], core.audit()["violations"]
    _drained(core, baseline)


def test_negative_control_slack_off_goes_cold_with_the_sliding_window_reason():
    core, rec = _core()
    prompt = tokens(1000, 3)
    core.submit("t", "s", prompt, max_tokens=64)  # no slack
    _run_to(rec, core.current("t", "s").req_id, 1000)
    rec.step(2)  # two decode steps: vLLM's schedule() dropped the blocks behind the window
    res, _ = core.supersede("t", "s", 0, revise(prompt, 1000 - 2 * W, 1000, 5))
    assert res.inherited_tokens == 0 and "sliding window" in res.cold_reason, res
    assert "no revision slack" in res.cold_reason, res.cold_reason


def test_released_as_the_frontier_moves_past_s():
    core, rec = _core()
    s = 256
    old = core.submit("t", "s", tokens(1200, 4), max_tokens=8, contract=Contract(slack=True, slack_tokens=s))
    _run_to(rec, old, 1200)
    rec.step()  # one decode step: vLLM's schedule() dropped everything behind the window ending at 1200
    f = core.port.frontier(old)
    lo, hi = first_needed(f - s), first_needed(f)
    kept = {rec.seen[old][i] for i in range(lo, hi)}
    assert all(rec.table(old)[i] == core.port.null_block_id for i in range(hi))  # vLLM's table: all dropped
    # the only references beyond vLLM's tables are one per kept block; blocks further behind went back (a block
    # freed there may since hold another position of some table, counted as that table's)
    assert _extra_refs(core) == {b: 1 for b in kept} and len(kept) == s // BS, (lo, hi)
    # the version finishes normally: every kept block is given back in the step that finished it
    while core.port.live(old):
        rec.step()
    refs = core.port.ref_counts()
    assert all(refs.get(b, 0) == 0 for b in kept) and not _extra_refs(core)
    assert core.audit()["valid"]


def test_an_abort_gives_every_kept_block_back_at_once():
    """A version keeping a slack is aborted from outside (vLLM's finish_requests, between steps): every kept block
    goes back then (vLLM's ref_cnt counts no reference beyond its tables), not at some later step."""
    core, rec = _core()
    old = core.submit("t", "s", tokens(1200, 4), max_tokens=64, contract=Contract(slack=True, slack_tokens=256))
    _run_to(rec, old, 1200)
    rec.step()
    assert sum(_extra_refs(core).values()) == 256 // BS
    assert core.port.finish(old)
    assert not _extra_refs(core), _extra_refs(core)
    assert core.audit()["valid"]


def test_reclaim_gives_back_and_a_successor_with_slack_takes_over_a_chain():
    """e0 (slack) -> e1 inherits and keeps a slack -> e2's LCP lies behind e1's inherited length but within e1's
    slack: e2 inherits. Without e1's slack the same chain goes cold at e2."""
    for e1_slack, want_cold in ((SLACK, False), (Contract(), True)):
        core, rec = _core()
        baseline = core.port.free_block_count()
        prompt = tokens(1000, 6)
        e0 = core.submit("t", "s", prompt, max_tokens=64, contract=SLACK)
        _run_to(rec, e0, 1000)
        r1 = revise(prompt, 900, 1100, 6)
        res1, e1 = core.supersede("t", "s", 0, r1, contract=e1_slack)
        assert res1.inherited_tokens == 896, res1
        before_e2 = dict(core.port.ref_counts())
        if not e1_slack.slack:  # RECLAIM gave every kept block of e0 back
            assert not _extra_refs(core), _extra_refs(core)
        moved = len(_kept(core, e1))
        assert core.s.retire.counters["slack_handoff_blocks"] == moved, core.s.retire.counters
        rec.observe()
        r2 = revise(r1, 700, 760, 7)  # LCP 700: 196 tokens behind e1's inherited 896 (3 windows)
        res2, e2 = core.supersede("t", "s", 1, r2, contract=Contract())
        assert core.s.retire.counters["slack_handoff_blocks"] == moved  # e2 keeps no slack: a sum, nothing added
        if want_cold:
            assert res2.inherited_tokens == 0 and "sliding window" in res2.cold_reason, res2
        else:
            assert res2.cold_reason is None and res2.inherited_tokens == 672, res2
            assert before_e2.get(rec.seen[e0][first_needed(672)]) == 1  # e1 held e0's block at that position
        _drained(core, baseline)


# ---------------------------------------------------------------------------------------------- quota
def test_the_versions_quota_bounds_the_slack_and_a_small_quota_goes_cold_naming_it():
    core, rec = _core()
    prompt = tokens(1000, 8)
    old = core.submit("t", "s", prompt, max_tokens=64, contract=Contract(slack=True, slack_tokens=512,
                                                                         pin_quota_blocks=4))
    _run_to(rec, old, 1000)
    assert sum(_extra_refs(core).values()) == 4  # 16 wanted, 4 allowed: the 4 nearest the frontier
    f = core.port.frontier(old)
    near = {rec.seen[old][i] for i in range(first_needed(f) - 4, first_needed(f))}
    assert set(_extra_refs(core)) == near
    res, _ = core.supersede("t", "s", 0, revise(prompt, f - 4 * W, f, 9), contract=Contract())
    assert res.inherited_tokens == 0 and "sliding window" in res.cold_reason and "pin quota" in res.cold_reason, res
    assert core.audit()["valid"]


def test_kept_blocks_count_against_the_tenants_quota_for_another_scope():
    """Scope a keeps 8 slack blocks (S = 256); scope b of the same tenant (with a slack of its own, which its own
    handoff re-pins and so does not count twice) is superseded under pin_quota_blocks=10: 2 blocks are left for its
    handoff (1 per KV group: 32 tokens). When a belongs to another tenant, b gets the whole quota (5 per group)."""
    inherited = {}
    for tenant_a in ("t", "other"):
        core, rec = _core(num_blocks=512)
        a = core.submit(tenant_a, "a", tokens(900, 10), max_tokens=200, contract=Contract(slack=True,
                                                                                          slack_tokens=256))
        pb = tokens(300, 11)
        b = core.submit("t", "b", pb, max_tokens=200, contract=Contract(slack=True))
        _run_to(rec, a, 900)
        rec.step()
        assert sum(n for blk, n in _extra_refs(core).items() if blk in rec.seen[a].values()) == 8
        assert core.port.frontier(b) < 512, "b's slack must cover its whole prefix"
        res, _ = core.supersede("t", "b", 0, revise(pb, 290, 300, 12), contract=Contract(pin_quota_blocks=10))
        inherited[tenant_a] = res.inherited_tokens
        assert core.audit()["valid"]
    assert inherited == {"t": 32, "other": 160}, inherited


# ---------------------------------------------------------------------------------------------- audit
def test_negative_control_forgotten_slack_pins_are_reported_by_the_audit(monkeypatch):
    from retire.slack import Slack

    def forget(self, rid):  # drops the bookkeeping, keeps vLLM's references
        k = self.kept.pop(rid, None)
        if k is not None:
            self.pins.pins.pop(k.pin, None)
        return 0

    monkeypatch.setattr(Slack, "release", forget)
    core, rec = _core()
    old = core.submit("t", "s", tokens(1000, 3), max_tokens=8, contract=SLACK)
    _run_to(rec, old, 1000)
    core.drain()
    v = core.audit()["violations"]
    assert any("leaked" in x for x in v) and any("drained but only" in x for x in v), v


def test_a_preempted_version_gives_its_slack_back_in_the_step_that_reports_it():
    """vLLM preempts a version that keeps a slack (its blocks freed, back to waiting with nothing computed). The
    kept blocks are given back in the step whose SchedulerOutput reports the preemption, even if that step does not
    schedule the version again (found by the slack state machine on vLLM 0.31: a preempted version waiting under
    memory pressure kept its slack at positions beyond its frontier 0). Negative control: a step that does not pass
    the preempted ids on leaves the kept blocks pinned."""
    for report in (True, False):
        core, rec = _core()
        old = core.submit("t", "s", tokens(1200, 4), max_tokens=64, contract=Contract(slack=True, slack_tokens=256))
        _run_to(rec, old, 1200)
        rec.step()
        assert sum(_extra_refs(core).values()) == 256 // BS
        assert core.port.preempt(old) and core.port.frontier(old) == 0  # vLLM's own preemption
        core.s.retire.slack.after_commit([], (old,) if report else ())  # a step that did not schedule it
        if report:
            assert not _extra_refs(core), _extra_refs(core)
            assert not any(core.s.retire.slack.kept[old].blocks.values())
            assert core.audit()["valid"]
        else:
            assert sum(_extra_refs(core).values()) == 256 // BS  # the control: still pinned


def test_the_preemption_vllm_reports_reaches_the_slack_through_the_scheduler():
    """End to end on the real scheduler: vLLM preempts the version while another request's prefill takes the whole
    token budget, so the next step does not schedule it again; that step's SchedulerOutput carries the preempted id
    (`preempted_req_ids`) and the kept blocks are back after it (vLLM's ref_cnt counts no pin)."""
    core, rec = _core()
    old = core.submit("t", "s", tokens(1200, 4), max_tokens=64, contract=Contract(slack=True, slack_tokens=256))
    _run_to(rec, old, 1200)
    rec.step()
    assert sum(_extra_refs(core).values()) == 256 // BS
    core.submit("t", "b", tokens(3000, 9), max_tokens=4)
    rec.step()  # b's prefill has started: as a running request it is scheduled before any waiting one
    assert core.port.preempt(old)
    rec.step()
    assert core.port.frontier(old) == 0, "inconclusive: vLLM scheduled the preempted version again"
    assert not _extra_refs(core), _extra_refs(core)
    assert core.audit()["valid"]


def _preemption_steps(core, rec):
    """Two requests that outgrow 48 blocks: vLLM preempts the later one (`a`, with a slack) again and again; each time
    it recomputes into new blocks and its slack grows again behind its new frontier. Yields (a, its frontier, whether
    the frontier fell since the last step: a preemption) after each step in which `a` is live, once `rec` has
    observed the step."""
    core.submit("t", "b", tokens(300, 1), max_tokens=600)
    a = core.submit("t", "a", tokens(300, 2), max_tokens=600, contract=SLACK)
    peak = 0
    while core.step() is not None:
        rec.observe()
        if not core.port.live(a):
            continue
        f = core.port.frontier(a)
        yield a, f, f < peak
        peak = f


def _preempted_and_regrown(core, rec) -> tuple[int, int, list[str]]:
    """Runs `_preemption_steps`. Returns (preemptions, kept blocks that differ from the first block vLLM placed at
    their position, kept blocks that are not the last one)."""
    first: dict[int, int] = {}
    preempted = renewed = 0
    wrong: list[str] = []
    for a, _, dropped in _preemption_steps(core, rec):
        preempted += dropped
        for i, b in rec.seen[a].items():
            first.setdefault(i, b)
        k = core.s.retire.slack.kept.get(a)
        for i, b in (k.blocks[rec.g].items() if k else ()):
            renewed += b != first[i]
            if b != rec.seen[a].get(i):
                wrong.append(f"position {i} keeps block {b}, vLLM placed {rec.seen[a].get(i)} there last")
    return preempted, renewed, wrong


def test_a_preempted_version_regrows_its_slack_from_the_blocks_of_its_recomputation():
    """After a preemption the version recomputes into new blocks; the slack it grows again keeps those, the last
    block vLLM placed at each position, never the one it placed there before the preemption (the slack state
    machine's oracle once compared with the first sighting and reported the product's correct behaviour, rarely).
    Negative control: a slack that misses the frontier drop keeps the blocks of the first computation."""
    core, rec = _core(num_blocks=48, max_model_len=2048)
    baseline = core.port.free_block_count()
    preempted, renewed, wrong = _preempted_and_regrown(core, rec)
    assert preempted >= 1 and renewed > 0, f"inconclusive: {preempted} preemptions, {renewed} renewed kept blocks"
    assert not wrong, wrong[:5]
    assert core.audit()["valid"]
    assert core.port.free_block_count() == baseline


def test_negative_control_a_slack_that_misses_the_preemption_keeps_replaced_blocks(monkeypatch):
    from retire.slack import Slack
    real = Slack._update

    def blind(self, rid, k):  # never sees the frontier move back
        k.frontier = min(k.frontier, self.port.frontier(rid))
        real(self, rid, k)

    monkeypatch.setattr(Slack, "_update", blind)
    core, rec = _core(num_blocks=48, max_model_len=2048)
    _, _, wrong = _preempted_and_regrown(core, rec)
    assert wrong, "a slack blind to preemption kept only the blocks vLLM placed last"


# ---------------------------------------------------------------------------------------------- handoff, cuts, tracking
def _kept(core, rid: str) -> dict[int, int]:
    """Position -> block the slack keeps for `rid` in the sliding group (the slack's own bookkeeping; the tests judge
    it against vLLM's tables through the Recorder and against vLLM's ref_cnt)."""
    slack = core.s.retire.slack
    k = slack.kept.get(rid)
    return dict(k.blocks[slack.sliding[0]]) if k else {}


def test_a_successor_with_a_narrower_slack_takes_over_only_its_range_and_keeps_growing():
    """e0 keeps 512 tokens (or no slack at all); e1 inherits 992 tokens with a 128-token slack: at RECLAIM it takes
    over exactly e0's kept blocks within 128 tokens of 992 (the rest go back with e0; none without e0's slack), the
    transition counts them, and as e1 decodes on its slack stays within its own range and holds the blocks vLLM
    placed there."""
    for old_contract in (SLACK, Contract()):
        core, rec = _core()
        baseline = core.port.free_block_count()
        e0 = core.submit("t", "s", tokens(1000, 6), max_tokens=64, contract=old_contract)
        _run_to(rec, e0, 1000)
        rec.step(2)
        revised = revise(list(core.s.requests[e0].all_token_ids), 1000, 1040, 3)
        res, e1 = core.supersede("t", "s", 0, revised, contract=Contract(slack=True, slack_tokens=128),
                                 max_tokens=64)
        assert res.inherited_tokens == 992, res
        taken = _kept(core, e1)
        want = {i: rec.seen[e0][i] for i in range(first_needed(992 - 128), first_needed(992))}
        assert taken == (want if old_contract.slack else {}), (taken, want)
        assert core.s.retire.counters["slack_handoff_blocks"] == len(taken)
        assert sum(_extra_refs(core).values()) == len(taken)  # e0's other kept blocks went back at RECLAIM
        grew = False
        while core.port.live(e1):
            rec.step()
            f, kept = core.port.frontier(e1), _kept(core, e1)
            assert set(kept) <= set(range(first_needed(max(0, f - 128)), first_needed(f))), (f, kept)
            assert all(rec.seen[e1].get(i, want.get(i)) == b for i, b in kept.items()), kept
            grew |= bool(set(kept) - set(want))
        assert grew, "e1's slack never kept a block of its own"
        _drained(core, baseline)


def test_a_cut_step_keeps_the_slack():
    """A step cut at a safe point commits nothing and leaves the frontier where it was: the slack keeps every block
    (a frontier that did not move is not a preemption)."""
    core, rec = _core()
    old = core.submit("t", "s", tokens(1200, 4), max_tokens=64, contract=Contract(slack=True, slack_tokens=256))
    _run_to(rec, old, 1200)
    rec.step()
    before, f = _kept(core, old), core.port.frontier(old)
    assert len(before) == 256 // BS
    core.step(cut=True, decision={"layer": 3})
    assert core.port.frontier(old) == f and _kept(core, old) == before
    assert _extra_refs(core) == {b: 1 for b in before.values()}
    assert core.audit()["valid"]


def test_regrown_slack_is_complete():
    """After each preemption the regrown slack holds every position of [first_needed(F - S), first_needed(F)) that
    vLLM has filled since (the kept range restarts at position 0, not past it)."""
    core, rec = _core(num_blocks=48, max_model_len=2048)
    filled: set[int] = set()
    checked = 0
    for a, f, dropped in _preemption_steps(core, rec):
        if dropped:
            filled.clear()
        filled |= {i for i, b in enumerate(rec.table(a)) if b != core.port.null_block_id}
        want = filled & set(range(first_needed(max(0, f - SLACK.slack_tokens)), first_needed(f)))
        assert want <= set(_kept(core, a)), (f, sorted(want - set(_kept(core, a))))
        checked += bool(want)
    assert checked, "inconclusive: the slack never had anything to keep"


def test_a_duplicate_submit_that_is_never_current_keeps_no_slack():
    core, rec = _core()
    first = core.submit("t", "s", tokens(900, 1), max_tokens=64, contract=SLACK)
    dup = core.submit("t", "s", tokens(900, 2), max_tokens=64, contract=SLACK)  # the facade refuses this one
    _run_to(rec, dup, 900)
    rec.step(3)
    assert _kept(core, first) and dup not in core.s.retire.slack.kept


# ---------------------------------------------------------------------------------------------- quota arithmetic
@pytest.mark.parametrize("quota,kept,limited", [(100, 16, 0), (28, 16, 0), (12, 4, 12), (6, 0, 16)])
def test_the_quota_room_is_the_quota_less_the_tenants_other_pins(quota, kept, limited):
    """Scope b of the same tenant keeps 8 slack blocks (S = 256, no quota); scope a wants 16 (S = 512) under
    pin_quota_blocks=quota: it keeps min(16, quota - 8) blocks, the nearest the frontier, and records what the quota
    kept out."""
    core, rec = _core(num_blocks=512)
    b = core.submit("t", "b", tokens(900, 10), max_tokens=200, contract=Contract(slack=True, slack_tokens=256))
    a = core.submit("t", "a", tokens(900, 11), max_tokens=200,
                    contract=Contract(slack=True, slack_tokens=512, pin_quota_blocks=quota))
    _run_to(rec, a, 900)
    rec.step(3)
    assert len(_kept(core, b)) == 8
    f, got = core.port.frontier(a), _kept(core, a)
    assert got == {i: rec.seen[a][i] for i in range(first_needed(f) - kept, first_needed(f))}, (f, sorted(got))
    assert core.s.retire.slack.kept[a].limited == limited
    assert core.audit()["valid"]


# ---------------------------------------------------------------------------------------------- audit messages
def test_the_audit_names_a_slack_that_outlives_its_request_and_one_its_pin_disagrees_with(monkeypatch):
    """Negative controls of the slack's own audit lines: a slack left behind by its finished request (release does
    nothing) is named with its block count and its pin reported dangling, while another scope's live slack is not;
    a kept block missing from the bookkeeping, and a pin missing altogether, are named with what the pin holds."""
    from retire.slack import Slack

    core, rec = _core()
    live = core.submit("t", "live", tokens(1000, 5), max_tokens=200, contract=Contract(slack=True, slack_tokens=256))
    old = core.submit("t", "s", tokens(1200, 4), max_tokens=64, contract=Contract(slack=True, slack_tokens=256))
    _run_to(rec, old, 1200)
    rec.step()
    slack, g = core.s.retire.slack, core.s.retire.slack.sliding[0]
    k = slack.kept[old]
    i, b = min(k.blocks[g].items())
    del k.blocks[g][i]
    v = core.audit()["violations"]
    mine = [x for x in v if x.startswith(f"revision slack of {old}: kept ")]
    assert len(mine) == 1 and str(b) in mine[0].split("but the pin holds")[1], v
    k.blocks[g][i] = b
    assert core.audit()["valid"]
    held = slack.pins.pins.pop(k.pin)
    v = core.audit()["violations"]
    assert any(x.startswith(f"revision slack of {old}: kept ") and x.endswith("but the pin holds []") for x in v), v
    slack.pins.pins[k.pin] = held
    monkeypatch.setattr(Slack, "release", lambda self, rid: 0)
    assert core.port.finish(old) and _kept(core, live)
    v = core.audit()["violations"]
    assert f"revision slack of {old} outlives its request ({256 // BS} blocks)" in v, v
    dangling = [x for x in v if x.startswith("dangling pins")]
    assert len(dangling) == 1 and "scope='s'" in dangling[0] and "scope='live'" not in dangling[0], v


def test_a_cold_successor_with_a_slack_keeps_only_its_own_range():
    """e0 keeps 512 tokens; e1 shares nothing with it (cold) and keeps 128: RECLAIM hands nothing over, and as e1
    runs, its kept positions stay within [first_needed(F - 128), first_needed(F)) of its own frontier (nothing of e0's
    range carries over into e1's bookkeeping)."""
    core, rec = _core()
    baseline = core.port.free_block_count()
    e0 = core.submit("t", "s", tokens(1200, 4), max_tokens=64, contract=SLACK)
    _run_to(rec, e0, 1200)
    rec.step()
    assert core.s.retire.slack.kept[e0].lo[core.s.retire.slack.sliding[0]] > 0
    res, e1 = core.supersede("t", "s", 0, tokens(1000, 99), contract=Contract(slack=True, slack_tokens=128),
                             max_tokens=300)
    assert res.inherited_tokens == 0 and core.s.retire.counters["slack_handoff_blocks"] == 0, res
    while core.port.live(e1):
        rec.step()
        f, kept = core.port.frontier(e1), _kept(core, e1)
        assert set(kept) <= set(range(first_needed(max(0, f - 128)), first_needed(f))), (f, sorted(kept))
    _drained(core, baseline)


def test_the_cold_reason_says_what_the_slack_kept():
    """`Slack.explain`, the tail of a "sliding window" cold reason: no slack (no contract, or no request), the kept
    span in tokens, the pin quota's cut, and a slack that holds nothing."""
    core, rec = _core()
    slack = core.s.retire.slack
    plain = core.submit("t", "p", tokens(300, 1), max_tokens=64)
    kept = core.submit("t", "k", tokens(1200, 4), max_tokens=64, contract=Contract(slack=True, slack_tokens=256))
    cut = core.submit("u", "q", tokens(1200, 5), max_tokens=64,  # another tenant: k's pins leave its quota alone
                      contract=Contract(slack=True, slack_tokens=512, pin_quota_blocks=4))
    _run_to(rec, cut, 1200)
    rec.step()
    none = "; no revision slack was kept (Contract(slack=True) keeps one)"
    assert slack.explain(None) == none and slack.explain(plain) == none
    f, g = core.port.frontier(kept), slack.sliding[0]
    span = f"group {g}: tokens [{first_needed(f - 256) * BS}, {first_needed(f) * BS})"
    assert slack.explain(kept) == f"; revision slack of 256 tokens behind frontier {f} keeps {span}"
    f = core.port.frontier(cut)
    span = f"group {g}: tokens [{(first_needed(f) - 4) * BS}, {first_needed(f) * BS})"
    assert slack.explain(cut) == (f"; revision slack of 512 tokens behind frontier {f} keeps {span}; pin quota: 4 "
                                  f"blocks left room for 4 per sliding group, 12 slack blocks not kept")
    slack.release(kept)
    assert slack.explain(kept) == "; the predecessor's revision slack held nothing"


def test_a_one_token_slack_keeps_the_block_the_window_just_left_for_one_step():
    """The smallest slack the facade accepts (1 token): after each decode step whose frontier moves the window past a
    block boundary, that one block is kept until the next step moves the frontier on."""
    core, rec = _core()
    old = core.submit("t", "s", tokens(300, 3), max_tokens=100, contract=Contract(slack=True, slack_tokens=1))
    sizes = []
    while core.port.live(old):
        rec.step()
        sizes.append(len(_kept(core, old)))
    assert max(sizes) == 1 and sizes.count(1) >= 2, sizes
    assert core.audit()["valid"]
