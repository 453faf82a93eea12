"""The transition core (retire/transition.py) engine-free, through the scheduler: a real RetireScheduler on vLLM's own
Scheduler, KVCacheManager and BlockPool with no model (conformance/fixtures/enginefree.py), one SUPERSEDE at a time,
every outcome read back from vLLM's own state (block tables, `num_computed_tokens`, what the next step schedules,
which outputs a step commits) or from the `TransitionResult` the frontend receives.

What the exploration machine (test_core_explore.py) does not pin down, and this module does:
- the result of an accepted SUPERSEDE in full: certificate (the predecessor's exact blocks), receipts, stage timings
  that add up, the successor admitted with exactly the certified blocks, the predecessor reclaimed;
- every cold reason and what it leaves behind (a cold successor reads no prefix cache: vLLM schedules its whole
  prompt although the predecessor's blocks are cached);
- the pin quota with other pins of the tenant outstanding; exact-mode provenance through a prefix-cache hit and a
  cut step; sliding-window placeholders;
- gate (a): a live duplicate of a scope commits nothing, and the current version's outputs are committed (with a
  negative control: the gate switched off lets the duplicate's outputs through);
- the barrier/refusal hooks, the bounded result and close-time records, the audit's reports.
"""
from __future__ import annotations

import time

import msgspec
import pytest

from conformance.fixtures.enginefree import EngineFreeCore
from conformance.fixtures.prompts import revise, tokens
from retire import Contract
from retire.types import Receipt, RequestTag, ScopeKey, Supersede, TransitionResult, VersionKey

STAGES = ("advance", "fence", "align", "pin", "resume", "reclaim")
P = tokens(200, 7)


def _b(x):
    return msgspec.to_builtins(x)


def _scheduled(core: EngineFreeCore) -> dict[str, tuple[int, int]]:
    """One engine step; returns vLLM's own view of what it scheduled: req_id -> (computed before, scheduled)."""
    so = core.s.schedule()
    out = {r.req_id: (int(r.num_computed_tokens), int(so.num_scheduled_tokens[r.req_id]))
           for r in so.scheduled_new_reqs}
    c = so.scheduled_cached_reqs
    for rid, done in zip(c.req_ids, c.num_computed_tokens):
        out[rid] = (int(done), int(so.num_scheduled_tokens[rid]))
    mro = core.ef.runner_output(core.s, so, _tok)
    core.committed.extend(core.ef.output_request_ids(core.s.update_from_output(so, mro)))
    return out


def _tok(rid, pos):
    from conformance.fixtures.enginefree import token_of
    return token_of(rid, pos)


def _prefilled(core: EngineFreeCore, tenant="t", scope="s", prompt=P, **kw) -> str:
    rid = core.submit(tenant, scope, prompt, **kw)
    while rid in core.s.requests and core.s.requests[rid].num_computed_tokens < len(prompt):
        core.step()
    return rid


def _stats(core):
    return core.s("stats")


# ------------------------------------------------------------------------------------------------ an inheriting SUPERSEDE
def test_accepted_supersede_certifies_the_predecessors_blocks_and_reports_every_stage():
    core = EngineFreeCore()
    old = _prefilled(core)
    table = core.port.blocks(old)
    gens = core.s("generations", {"block_ids": table[0][:4]})
    t0 = time.monotonic()
    res, succ = core.supersede("t", "s", 0, revise(P, 150, 220, 1))
    t1 = time.monotonic()
    assert res.refused is None and res.refused_kind is None and res.cold_reason is None
    assert res.inherited_tokens == 128 and res.key == VersionKey(core.key("t", "s"), 1)
    c = res.certificate
    assert (c.scope, c.tenant, c.from_epoch, c.to_epoch, c.tokens, c.lcp, c.frontier, c.mode) == \
        ("s", "t", 0, 1, 128, 150, 200, "tolerant")
    assert c.block_ids == (tuple(table[0][:4]),) and c.generations == (tuple(gens),)
    fp = dict(kv.split("=", 1) for kv in c.fingerprint.split("|"))
    assert list(fp) == sorted(fp) and fp["cache_salt"] == "None" and fp["lora"] == "None"
    assert fp["block_size"] == "32" and fp["model"] == str(core.vc.model_config.model)
    assert res.receipts == (Receipt("kv-group-0", 0, 200, "step-boundary", {}),)
    assert set(res.timings) == set(STAGES) | {"engine_total"}
    assert all(res.timings[k] >= 0 for k in res.timings)
    assert sum(res.timings[k] for k in STAGES) == pytest.approx(res.timings["engine_total"], abs=1e-6)
    assert t0 <= res.t_engine <= res.fence_closed_at <= t1 and res.timings["engine_total"] <= t1 - t0
    assert res.dram is None and res.dram_stale == ()
    # vLLM's own state: the successor starts on exactly the certified blocks, the predecessor was reclaimed
    assert core.port.blocks(succ)[0][:4] == table[0][:4] and core.s.requests[succ].num_computed_tokens == 128
    assert old not in core.s.requests
    assert _scheduled(core)[succ] == (128, 220 - 128)  # it computes only its suffix
    st = _stats(core)
    assert (st["supersedes"], st["inherited"], st["inherited_tokens"], st.get("cold", 0)) == (1, 1, 128, 0)


class _PoolCalls:
    """Every block vLLM's BlockPool is asked to touch or free, by id (read from the calls themselves, not through
    the port under test)."""

    def __init__(self, monkeypatch, pool):
        self.touched: list[int] = []
        self.freed: list[int] = []
        touch, free = pool.touch, pool.free_blocks

        def counted_touch(blocks):
            blocks = list(blocks)
            self.touched += [b.block_id for b in blocks]
            return touch(blocks)

        def counted_free(blocks):
            blocks = list(blocks)
            self.freed += [b.block_id for b in blocks]
            return free(blocks)

        monkeypatch.setattr(pool, "touch", counted_touch)
        monkeypatch.setattr(pool, "free_blocks", counted_free)


def test_certified_blocks_change_owner_without_a_reference_taken_or_given_back(monkeypatch):
    """PIN moves the predecessor's own references to the handoff pin and RESUME hands them to the successor's table:
    during the SUPERSEDE vLLM's pool touches no block and frees only the predecessor's old-only blocks; afterwards
    each certified block has ref_cnt 1 (the successor's table) and the free count grew by the old-only blocks."""
    core = EngineFreeCore()
    old = _prefilled(core)
    pool = core.s.kv_cache_manager.block_pool
    table = [b.block_id for b in core.s.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks[old]]
    free_before = pool.get_num_free_blocks()
    calls = _PoolCalls(monkeypatch, pool)
    res, succ = core.supersede("t", "s", 0, revise(P, 150, 220, 1))
    assert res.inherited_tokens == 128 and res.certificate.block_ids == (tuple(table[:4]),)
    assert calls.touched == [] and sorted(calls.freed) == sorted(table[4:])
    assert [pool.blocks[b].ref_cnt for b in table[:4]] == [1, 1, 1, 1]
    assert pool.get_num_free_blocks() - free_before == len(table) - 4
    assert _stats(core)["handoff_moved"] == 1
    assert core.audit()["valid"], core.audit()["violations"]


def test_take_refuses_a_table_that_does_not_start_with_the_blocks_and_changes_nothing():
    core = EngineFreeCore()
    old = _prefilled(core)
    m = core.s.kv_cache_manager.coordinator.single_type_managers[0]
    table, cached = [b.block_id for b in m.req_to_blocks[old]], m.num_cached_block[old]
    for wrong in ([table[1], table[0]], table[:2] + [core.port.null_block_id], table + [table[0]]):
        assert core.port.take(old, [wrong]) is False
        assert [b.block_id for b in m.req_to_blocks[old]] == table and m.num_cached_block[old] == cached
    assert core.port.take("no-such-request", [table[:1]]) is False
    assert core.audit()["valid"], core.audit()["violations"]


def test_negative_control_a_take_that_leaves_the_predecessor_listing_the_blocks_is_caught(monkeypatch):
    """A port whose `take` reports a move it did not make: the successor's table then lists blocks whose only
    reference RECLAIM gave back with the predecessor, and the refcount audit reports them."""
    core = EngineFreeCore()
    _prefilled(core)
    monkeypatch.setattr(core.s.retire.port, "take", lambda req_id, per_group: True)
    res, succ = core.supersede("t", "s", 0, revise(P, 150, 220, 1))
    assert res.inherited_tokens == 128
    rep = core.audit()
    over = [v for v in rep["violations"] if v.endswith("over-freed: ref_cnt=0 accounted=1")]
    assert not rep["valid"] and len(over) == 4, rep  # each certified block


def test_the_engines_figures_add_up_over_several_supersedes():
    """`stats` (the figures a soak reports) against what vLLM shows for each successor."""
    core = EngineFreeCore()
    inherited = []
    for scope, keep in (("a", 150), ("b", 100), ("c", 10), ("d", 5)):
        _prefilled(core, scope=scope)
        res, succ = core.supersede("t", scope, 0, revise(P, keep, 220, 1))
        inherited.append(core.s.requests[succ].num_computed_tokens)
        assert res.inherited_tokens == inherited[-1]
    assert inherited == [128, 96, 0, 0]
    st = _stats(core)
    assert (st["supersedes"], st["inherited"], st["inherited_tokens"], st["cold"]) == (4, 2, 224, 2)
    assert st["handoff_moved"] == 2  # each inheriting successor took over its predecessor's references
    core.supersede("t", "a", 5, P)
    core.supersede("t", "a", 7, P)
    assert _stats(core)["refused"] == 2 and _stats(core)["supersedes"] == 4


def test_the_same_cache_salt_on_both_versions_inherits():
    core = EngineFreeCore()
    _prefilled(core, prompt=P, cache_salt="team-a")
    res, succ = core.supersede("t", "s", 0, revise(P, 150, 220, 1), cache_salt="team-a")
    assert res.inherited_tokens == 128 and "cache_salt=team-a" in res.certificate.fingerprint.split("|")


def test_cold_successor_reads_no_prefix_cache_and_reports_why():
    core = EngineFreeCore()
    _prefilled(core)
    res, succ = core.supersede("t", "s", 0, revise(P, 150, 220, 1), contract=Contract(inherit=False))
    assert res.refused is None and res.inherited_tokens == 0 and res.certificate is None
    assert res.cold_reason == "contract forbids inheritance"
    assert core.s.requests[succ].num_computed_tokens == 0
    # the predecessor's first 4 full blocks are in vLLM's prefix cache, yet vLLM schedules the whole prompt
    assert _scheduled(core)[succ] == (0, 220)
    st = _stats(core)
    assert (st["supersedes"], st["cold"], st.get("inherited", 0), st.get("inherited_tokens", 0)) == (1, 1, 0, 0)


def test_cold_reasons_name_their_cause():
    core = EngineFreeCore()
    _prefilled(core, scope="salt", prompt=P, cache_salt="a")
    res, _ = core.supersede("t", "salt", 0, revise(P, 150, 220, 1), cache_salt="b")
    assert res.inherited_tokens == 0 and res.cold_reason == "config mismatch: cache_salt ('a' != 'b')"
    _prefilled(core, scope="none", prompt=P)
    res, _ = core.supersede("t", "none", 0, revise(P, 10, 220, 1))
    assert res.cold_reason == "no shared prefix to certify (lcp=10, frontier=200, unit=32)"
    gone = _prefilled(core, scope="gone", prompt=P)
    core.drain()
    assert gone not in core.s.requests
    res, _ = core.supersede("t", "gone", 0, revise(P, 150, 220, 1))
    assert res.refused is None and res.cold_reason == "predecessor not live" and res.inherited_tokens == 0
    assert res.receipts == (Receipt("kv-group-0", 0, 0, "step-boundary", {}),)  # nothing left to fence


def test_a_cold_reason_is_kept_even_when_the_prefix_is_shared():
    core = EngineFreeCore()
    _prefilled(core, prompt=P)
    res, succ = core.supersede("t", "s", 0, list(P) + [5, 6], contract=Contract(pin_quota_blocks=0))
    assert res.inherited_tokens == 0 and res.cold_reason == "pin quota: 0 blocks, 0 free"
    assert _scheduled(core)[succ] == (0, 202)


@pytest.mark.parametrize("take", ["moves", "refused"])
def test_pin_quota_counts_the_tenants_outstanding_pins(monkeypatch, take):
    """`take`: PIN moved the predecessor's references, or (its table did not start with the certified blocks, as
    when a revision-slack block fills a nulled position) took new ones: the pin counts against the tenant either way."""
    core = EngineFreeCore()
    if take == "refused":
        monkeypatch.setattr(core.s.retire.port, "take", lambda req_id, per_group: False)
    _prefilled(core, scope="d", prompt=P)
    held, _ = core.supersede("t", "d", 0, revise(P, 150, 220, 1), contract=Contract(dram_tier=True))
    assert held.dram is not None and core.s.retire.pins.pinned("t") == 4  # a DRAM handoff pins 4 of t's blocks
    Q = tokens(300, 11)
    _prefilled(core, scope="q", prompt=Q)
    res, _ = core.supersede("t", "q", 0, revise(Q, 290, 320, 1), contract=Contract(pin_quota_blocks=6))
    assert res.inherited_tokens == 64 and res.certificate.tokens == 64  # 6 - 4 = 2 blocks free for t
    _prefilled(core, tenant="u", scope="q", prompt=Q)  # another tenant's quota is its own
    res, _ = core.supersede("u", "q", 0, revise(Q, 290, 320, 1), contract=Contract(pin_quota_blocks=6))
    assert res.inherited_tokens == 192
    _prefilled(core, scope="r", prompt=Q)
    res, _ = core.supersede("t", "r", 0, revise(Q, 290, 320, 1), contract=Contract(pin_quota_blocks=4))
    assert res.inherited_tokens == 0 and res.cold_reason == "pin quota: 4 blocks, 0 free"
    _prefilled(core, scope="z", prompt=Q)
    res, _ = core.supersede("t", "z", 0, revise(Q, 5, 320, 1), contract=Contract(pin_quota_blocks=4))
    assert res.cold_reason == "pin quota: 4 blocks, 0 free (nothing certifiable anyway: lcp=5, frontier=300)"
    _prefilled(core, scope="y", prompt=Q)
    res, _ = core.supersede("t", "y", 0, revise(Q, 5, 320, 1), contract=Contract(pin_quota_blocks=9))
    assert res.cold_reason.startswith("no shared prefix to certify")  # quota left, nothing to certify


def test_pin_quota_is_shared_by_every_kv_group():
    core = EngineFreeCore(sliding_window=1024)  # two KV groups, nothing outside the window yet
    Q = tokens(300, 11)
    _prefilled(core, prompt=Q)
    res, _ = core.supersede("t", "s", 0, revise(Q, 290, 320, 1), contract=Contract(pin_quota_blocks=5))
    assert res.inherited_tokens == 64  # 5 blocks over 2 groups: 2 per group
    assert all(len(g) == 2 for g in res.certificate.block_ids)


def test_the_frontier_caps_the_certified_length_mid_prefill():
    core = EngineFreeCore()
    Q = tokens(600, 3)
    old = core.submit("t", "s", Q)
    core.step()  # one 256-token chunk of 600
    assert core.port.frontier(old) == 256
    res, _ = core.supersede("t", "s", 0, revise(Q, 590, 640, 1))
    assert res.inherited_tokens == 256 and res.certificate.frontier == 256 and res.certificate.lcp == 590


# ------------------------------------------------------------------------------------------------ exact mode
def test_exact_mode_inherits_the_chunk_aligned_cold_shaped_extent():
    core = EngineFreeCore()
    Q = tokens(600, 3)
    a = _prefilled(core, prompt=Q)  # chunks (0, 256), (256, 256), (512, 88)
    log = core.s("chunk_log", {"req_id": a})
    assert log["chunks"] == [[0, 256], [256, 256], [512, 88]] and log["exact_extent"] == 512
    res, succ = core.supersede("t", "s", 0, revise(Q, 590, 640, 1), contract=Contract(mode="exact"))
    assert res.inherited_tokens == 512 and res.certificate.mode == "exact"
    assert core.s("chunk_log", {"req_id": succ})["exact_extent"] == 512  # the successor continues on the grid
    assert _scheduled(core)[succ] == (512, 128)


def test_exact_mode_through_a_prefix_cache_hit_certifies_only_marked_chunk_aligned_blocks():
    core = EngineFreeCore()
    Q = tokens(600, 3)
    _prefilled(core, scope="a", prompt=Q, max_tokens=1)  # marks the blocks of [0, 512)
    core.drain()  # nothing else runs in the hit's steps (a co-scheduled decode would shorten the chunk)
    C = list(Q[:288]) + tokens(512, 4)
    c = core.submit("t", "c", C)
    first = _scheduled(core)[c]
    assert first == (288, 256)  # vLLM's prefix-cache hit of 9 blocks, then a full chunk off the grid
    assert core.s("chunk_log", {"req_id": c})["exact_extent"] == 288
    while core.s.requests[c].num_computed_tokens < len(C):
        core.step()
    res, succ = core.supersede("t", "c", 0, revise(C, 700, 760, 1), contract=Contract(mode="exact"))
    assert res.inherited_tokens == 256 and core.s("chunk_log", {"req_id": succ})["exact_extent"] == 256


def test_exact_mode_a_hit_on_blocks_of_a_partial_chunk_is_not_cold_shaped():
    core = EngineFreeCore()
    R = tokens(100, 5)
    _prefilled(core, scope="f", prompt=R, max_tokens=1)  # one partial chunk: its blocks are not marked
    core.drain()
    G = list(R[:96]) + tokens(700, 6)
    g = core.submit("t", "g", G)
    assert _scheduled(core)[g] == (96, 256)
    assert core.s("chunk_log", {"req_id": g})["exact_extent"] == 0
    while core.s.requests[g].num_computed_tokens < len(G):
        core.step()
    res, _ = core.supersede("t", "g", 0, revise(G, 700, 760, 1), contract=Contract(mode="exact"))
    assert res.inherited_tokens == 0
    assert res.cold_reason == "exact mode: no chunk-aligned prefix written in a cold run's shape (extent=0, unit=256)"


def test_exact_mode_with_nothing_certifiable_reports_no_shared_prefix():
    core = EngineFreeCore()
    _prefilled(core, prompt=P)  # one partial chunk: extent 0
    res, _ = core.supersede("t", "s", 0, revise(P, 100, 220, 1), contract=Contract(mode="exact"))
    assert res.cold_reason == "no shared prefix to certify (lcp=100, frontier=200, unit=256)"


def test_a_cut_chunk_is_rolled_back_and_never_counted_as_cold_shaped():
    core = EngineFreeCore()
    Q = tokens(600, 3)
    a = core.submit("t", "s", Q)
    core.step()
    t_cut = time.monotonic()
    assert core.step(cut=True, decision={"layer": 2}) == []  # the second chunk is cut at a safe point
    assert core.s.requests[a].num_computed_tokens == 256  # vLLM's request returned to the chunk start
    assert core.s("chunk_log", {"req_id": a})["exact_extent"] == 256
    res, succ = core.supersede("t", "s", 0, revise(Q, 590, 640, 1), contract=Contract(mode="exact"))
    assert res.inherited_tokens == 256
    (r,) = res.receipts
    assert (r.participant, r.epoch, r.frontier, r.path) == ("kv-group-0", 0, 256, "safe-point")
    assert r.detail["layer"] == 2 and r.detail["rolled_back_to"] == 256 and r.detail["path"] == "safe-point"
    assert t_cut <= r.detail["closed_at"] <= res.t_engine


def test_writer_closure_switched_off_leaves_the_cut_chunk_counted():
    """Negative control of the writer closure (the `closure` test switch): without it the cut chunk stays."""
    core = EngineFreeCore()
    Q = tokens(600, 3)
    a = core.submit("t", "s", Q)
    core.step()
    core.s("switches", {"closure": False})
    core.step(cut=True)
    assert core.s.requests[a].num_computed_tokens == 512


def test_a_rerun_chunk_after_a_cut_extends_the_extent_again():
    core = EngineFreeCore()
    Q = tokens(600, 3)
    a = core.submit("t", "s", Q)
    core.step()
    core.step(cut=True)
    core.step()
    assert core.s("chunk_log", {"req_id": a})["exact_extent"] == 512


# ------------------------------------------------------------------------------------------------ sliding window
def test_sliding_window_certificate_keeps_null_placeholders_and_the_audit_balances():
    core = EngineFreeCore(sliding_window=64)
    Q = tokens(600, 3)
    a = _prefilled(core, prompt=Q)
    null = core.port.null_block_id
    full, sliding = core.port.blocks(a)
    assert sliding[0] == null  # vLLM dropped the blocks before the window
    assert core.audit()["valid"], core.audit()  # placeholders are never counted as references
    res, succ = core.supersede("t", "s", 0, revise(Q, 590, 640, 1))
    assert res.inherited_tokens == 576
    cf, cs = res.certificate.block_ids
    assert list(cf) == full[:18] and cs[0] == null and list(cs[-2:]) == sliding[16:18]
    assert core.port.blocks(succ)[1][:18] == list(cs)
    assert core.audit()["valid"], core.audit()


def test_sliding_window_blocks_already_dropped_cannot_be_certified():
    core = EngineFreeCore(sliding_window=64)
    Q = tokens(600, 3)
    _prefilled(core, prompt=Q)
    res, _ = core.supersede("t", "s", 0, revise(Q, 200, 640, 1))
    assert res.inherited_tokens == 0
    assert res.cold_reason == ("sliding window: blocks the successor attends to at 192 tokens were already evicted "
                               "by the predecessor; no revision slack was kept (Contract(slack=True) keeps one)")


# ------------------------------------------------------------------------------------------------ hooks
def test_hold_barrier_keeps_the_successor_unscheduled_until_released():
    core = EngineFreeCore()
    _prefilled(core)
    core.s("arm", {"scope": _b(core.key("t", "s")), "hook": {"hold": True}})
    res, succ = core.supersede("t", "s", 0, revise(P, 150, 220, 1))
    assert res.inherited_tokens == 128 and res.dram is None
    assert succ in core.s.requests and succ not in _scheduled(core)
    v = core.audit()["violations"]
    assert v == [f"successors still held at a barrier: {[core.key('t', 's')]}"], v
    assert core.s("release", {"scope": _b(core.key("t", "s"))}) is True
    assert _scheduled(core)[succ] == (128, 92)


def test_dram_handoff_held_by_the_barrier_says_so():
    core = EngineFreeCore()
    _prefilled(core)
    core.s("arm", {"scope": _b(core.key("t", "s")), "hook": {"hold": True}})
    res, _ = core.supersede("t", "s", 0, revise(P, 150, 220, 1), contract=Contract(dram_tier=True))
    assert res.dram.held_by_test is True and res.dram.tokens == 128 and res.certificate.tokens == 128
    assert res.inherited_tokens == 0 and res.cold_reason is None  # inherits at install, not at RESUME
    _prefilled(core, scope="u")
    res, _ = core.supersede("t", "u", 0, revise(P, 150, 220, 1), contract=Contract(dram_tier=True))
    assert res.dram.held_by_test is False


@pytest.mark.parametrize("index", [0, 2])
def test_generation_race_bumps_the_indexed_certified_block_and_goes_cold(index):
    core = EngineFreeCore()
    old = _prefilled(core)
    head = core.port.blocks(old)[0][:4]
    before = core.s("generations", {"block_ids": head})
    hook = {"bump_generation": True} if index == 0 else {"bump_generation": True, "index": index}
    core.s("arm", {"scope": _b(core.key("t", "s")), "hook": hook})
    res, succ = core.supersede("t", "s", 0, revise(P, 150, 220, 1))
    assert res.inherited_tokens == 0 and res.certificate is None
    assert res.cold_reason == "generation mismatch: a certified block was reallocated after ALIGN"
    after = core.s("generations", {"block_ids": head})
    assert [a - b for a, b in zip(after, before)] == [1 if i == index else 0 for i in range(4)]
    assert _scheduled(core)[succ] == (0, 220)
    assert core.audit()["valid"]


def test_injected_refusal_changes_nothing_and_is_consumed():
    core = EngineFreeCore()
    old = _prefilled(core)
    table = core.port.blocks(old)
    core.s("arm", {"scope": _b(core.key("t", "s")), "hook": {"refuse": "frontend and engine disagree"}})
    t0 = time.monotonic()
    res, succ = core.supersede("t", "s", 0, revise(P, 150, 220, 1))
    assert res.refused == "frontend and engine disagree" and res.refused_kind == "injected"
    assert t0 <= res.t_engine <= time.monotonic() and res.inherited_tokens == 0 and res.receipts == ()
    assert succ not in core.s.requests and old in core.s.requests and core.port.blocks(old) == table
    assert core.current("t", "s").epoch == 0 and core.current("t", "s").req_id == old
    assert _stats(core)["refused"] == 1 and not core.s.retire.pins.pins
    res, _ = core.supersede("t", "s", 0, revise(P, 150, 220, 1))  # the hook was one-shot
    assert res.refused is None and res.inherited_tokens == 128


def test_an_adoption_the_port_did_not_install_is_caught(monkeypatch):
    """RESUME re-reads the successor's block table after the port's alias: a port that installs nothing fails loudly
    (negative control of the adoption check; the accepted path above is its positive side)."""
    core = EngineFreeCore()
    _prefilled(core)
    monkeypatch.setattr(core.s.retire.port, "alias", lambda handle, per_group, tokens, **kw: None)
    with pytest.raises(AssertionError, match=r"^adoption not verified$"):
        core.supersede("t", "s", 0, revise(P, 150, 220, 1))


def test_refusals_count_once_each():
    core = EngineFreeCore()
    _prefilled(core)
    for expected in (1, 2, -1):
        res, _ = core.supersede("t", "s", expected, P)
        assert res.refused_kind == "stale-epoch"
    assert _stats(core)["refused"] == 3 and _stats(core).get("supersedes", 0) == 0


# ------------------------------------------------------------------------------------------------ gate (a) and duplicates
def test_duplicate_submit_is_never_current_and_gate_a_commits_none_of_its_outputs():
    core = EngineFreeCore()
    first = core.submit("t", "s", P, max_tokens=4)
    dup = core.submit("t", "s", tokens(100, 2), max_tokens=4)
    assert core.current("t", "s").req_id == first and _stats(core)["duplicate_submits"] == 1
    core.drain()
    assert first in core.committed
    obsolete = dup not in core.committed  # vLLM ran it; gate (a) must drop its outputs
    again = core.submit("t", "s", P, max_tokens=2)  # the scope is free again once its version finished
    assert core.current("t", "s").req_id == again and _stats(core)["duplicate_submits"] == 1
    # negative control: with gate (a) switched off the duplicate's outputs are committed
    off = EngineFreeCore()
    off.s("switches", {"gate": False})
    off.submit("t", "s", P, max_tokens=4)
    dup_off = off.submit("t", "s", tokens(100, 2), max_tokens=4)
    off.drain()
    assert dup_off in off.committed
    audit = EngineFreeCore()
    audit.submit("t", "s", P, max_tokens=4)
    dup_a = audit.submit("t", "s", tokens(100, 2), max_tokens=4)
    assert audit.audit()["violations"] == [f"live obsolete executions: {[dup_a]}"]
    assert obsolete, f"gate (a) committed outputs of the duplicate {dup}"
    assert _stats(core)["engine_frames_suppressed"] >= 1


def test_duplicate_submit_never_displaces_the_live_version():
    core = EngineFreeCore()
    first = core.submit("t", "s", P, max_tokens=4)
    core.submit("t", "s", tokens(100, 2), max_tokens=4)
    assert core.current("t", "s").req_id == first and _stats(core)["duplicate_submits"] == 1
    core.submit("t", "s", tokens(90, 4), max_tokens=4)
    assert core.current("t", "s").req_id == first and _stats(core)["duplicate_submits"] == 2
    core.drain()
    assert first in core.committed
    again = core.submit("t", "s", P, max_tokens=2)  # the scope is free again once its version finished
    assert core.current("t", "s").req_id == again and _stats(core)["duplicate_submits"] == 2


def test_current_versions_outputs_are_committed_every_step():
    core = EngineFreeCore()
    a = core.submit("t", "a", tokens(40, 1), max_tokens=3)
    b = core.submit("u", "a", tokens(40, 2), max_tokens=3)
    assert sorted(core.step()) == sorted([a, b])
    _, succ = core.supersede("t", "a", 0, tokens(40, 3), max_tokens=3)
    assert sorted(core.step()) == sorted([b, succ])
    core.drain()
    assert core.committed.count(a) == 1 and core.committed.count(succ) == 3 and core.committed.count(b) == 3


# ------------------------------------------------------------------------------------------------ bookkeeping
def test_results_are_bounded_oldest_first():
    core = EngineFreeCore()
    core.s.retire.max_results = 3
    keys = []
    for i in range(5):  # refused SUPERSEDEs of unknown scopes each store a result
        key = VersionKey(core.key("t", f"nope{i}"), 1)
        core.s.add_request(core._request(RequestTag(key, "retire", Supersede(0, Contract())), P, 2, None))
        keys.append(key)
    got = [core.s("result", {"key": _b(k)}) is not None for k in keys]
    assert got == [False, False, True, True, True]


def test_results_default_bound_keeps_the_newest_4096():
    core = EngineFreeCore().s.retire
    keys = [VersionKey(ScopeKey("ns", "t", f"s{i}"), 1) for i in range(4097)]
    for k in keys:
        core._store(TransitionResult(k, refused="x", refused_kind="unknown-scope"))
    kept = core.results
    assert len(kept) == 4096 and keys[0] not in kept and keys[1] in kept and keys[-1] in kept


def test_close_times_are_recorded_and_bounded():
    core = EngineFreeCore()
    rid = _prefilled(core)
    t0 = time.monotonic()
    core.supersede("t", "s", 0, revise(P, 150, 220, 1))  # RECLAIM aborts the predecessor
    t = core.s("closed_at", {"req_ids": [rid]})[rid]
    assert t is not None and t0 <= t <= time.monotonic()
    ids = [f"r{i}" for i in range(4097)]
    core.s.retire.on_finished(ids, 1.0)
    closed = core.s.retire.closed_at
    assert len(closed) == 4096 and "r0" not in closed and "r4096" in closed and rid not in closed


def test_finished_requests_are_forgotten_by_the_next_commit():
    core = EngineFreeCore()
    Q = tokens(600, 3)
    a = _prefilled(core, scope="a", prompt=Q)
    assert core.s("chunk_log", {"req_id": a})["exact_extent"] == 512
    core.drain()  # a finishes; nothing else runs
    short = core.submit("t", "b", tokens(256, 1), max_tokens=1)  # one full aligned chunk: extent 256
    assert core.step() == [short] and short not in core.s.requests  # it finished in this step's commit
    assert core.s.retire.versions.tag(short) is None  # the commit pruned what the core kept about it
    assert core.s("chunk_log", {"req_id": short})["exact_extent"] == 0
    c = core.submit("t", "c", Q)  # a live one keeps its provenance across another request's prune
    core.step()
    core.submit("t", "d", tokens(40, 2), max_tokens=1)
    core.step()
    core.step()
    assert core.s("chunk_log", {"req_id": c})["exact_extent"] == 512


def test_audit_reports_every_violation_kind_and_the_pool():
    core = EngineFreeCore(num_blocks=32)
    rep = core.audit()
    assert rep == {"valid": True, "violations": [], "live_requests": [], "free_blocks": 31, "num_blocks": 32}
    for scope in ("a", "b"):  # two pending DRAM handoffs: two pins, two held successors
        _prefilled(core, scope=scope)
        core.supersede("t", scope, 0, revise(P, 150, 220, 1), contract=Contract(dram_tier=True))
    rep = core.audit()
    assert not rep["valid"] and len(rep["violations"]) == 2, rep
    pins, held = rep["violations"]
    assert pins.startswith("dangling pins: [PinKey(") and pins.count("PinKey(") == 2
    assert held.startswith("successors still held at a barrier: [ScopeKey(") and held.count("ScopeKey(") == 2
    assert rep["live_requests"] == sorted(core.s.requests) and len(rep["live_requests"]) == 2
    assert rep["free_blocks"] == core.port.free_block_count() and rep["num_blocks"] == 32


def test_audit_after_drain_reports_blocks_that_did_not_come_back():
    core = EngineFreeCore(num_blocks=32)
    core.submit("t", "s", tokens(40, 1), max_tokens=2)
    core.drain()
    core.s("leak_block_for_test", {"block_id": 5})
    v = core.audit()["violations"]
    assert v == ["block 5 leaked: ref_cnt=1 accounted=0", "drained but only 30 of 31 blocks free"], v
    core.s("leak_block_for_test", {"block_id": 5, "undo": True})
    assert core.audit()["valid"]


def test_prune_forgets_state_of_requests_that_left_and_keeps_the_live_ones():
    """The full prune (run by the audit) drops draft records and chunk-shape state of requests vLLM no longer has
    (here left behind by hand, as a missed targeted forget would leave them) and keeps those of live requests."""
    core = EngineFreeCore()
    live = core.submit("t", "s", tokens(100, 1), max_tokens=50)
    core.step()
    tc = core.s.retire
    assert live in tc.shape.exact
    tc.fence.note_drafts({live: (2, 1), "gone": (4, 4)})
    tc.shape.start("gone", 0, 0)
    tc.audit()
    assert "gone" not in tc.fence.drafts and "gone" not in tc.shape.exact and "gone" not in tc.shape.open
    assert live in tc.fence.drafts and live in tc.shape.exact
