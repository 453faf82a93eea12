"""Writer closure of a cut MIXED step, engine-free: a real RetireScheduler (vLLM's Scheduler, KVCacheManager,
BlockPool and prefix cache, no model; conformance/fixtures/enginefree.py) with hand-built step outputs.

The oracle is a shadow of the KV each block slot holds, kept outside the subject: a committed step writes, at every
position p of every scheduled chunk, the identity of the token prefix [0, p]; a cut step poisons its chunks' slots
(only the first layers were written). After every step, every running request must find, at every position below
vLLM's own `num_computed_tokens`, the identity of its own prefix there (`_check_kv`). Publication is checked on
vLLM's own committed outputs: every request publishes exactly the tokens of its positions, once, in order.

Cases: one decode bystander, one prefill bystander, a bystander of another tenant, and a request whose computed
prefix reused (through the prefix cache, in the same step) blocks the cut step was writing: it must be preempted
(vLLM's own `num_preemptions` counts it). Negative controls: with innocent rollback off the shadow catches the
innocent counting a poisoned chunk as computed; a planted closure that rolls back but never preempts sharers leaves
a sharer reading poisoned blocks, also caught.
"""
from __future__ import annotations

import pytest

from conformance.fixtures.enginefree import EngineFreeCore, token_of
from conformance.fixtures.prompts import revise, tokens


class Shadow:
    """Block slot -> identity of the token prefix whose KV it holds (or POISON)."""

    POISON = "poison"

    def __init__(self, core: EngineFreeCore):
        self.core, self.slots, self.published = core, {}, {}

    def _ids(self, req) -> list:
        out, h = [], 0
        for t in req.all_token_ids:
            h = hash((h, t))
            out.append(h)
        return out

    def step(self, cut_ids: list[str] | None = None) -> None:
        """One engine step; `cut_ids` = the revoked requests of a cut step (None: the step completes)."""
        core, s = self.core, self.core.s
        so = s.schedule()
        if not so.num_scheduled_tokens:
            s.update_from_output(so, core.ef.runner_output(s, so, token_of))
            return
        bs = core.block
        writes = []
        for rid, (start, n) in _chunks(so).items():
            req, table = s.requests[rid], core.port.blocks(rid)[0]
            ids = self._ids(req)
            for p in range(start, start + n):
                writes.append((table[p // bs], p % bs, self.POISON if cut_ids is not None else ids[p]))
        mro = core.ef.cut_output(so, {"req_ids": cut_ids}) if cut_ids is not None else \
            core.ef.runner_output(s, so, token_of)
        outs = s.update_from_output(so, mro)
        for b, slot, v in writes:
            self.slots[(b, slot)] = v
        for eco in outs.values():
            for o in eco.outputs or ():
                self.published.setdefault(o.request_id, []).extend(o.new_token_ids)

    def check_kv(self) -> list[str]:
        bad = []
        s, bs = self.core.s, self.core.block
        for req in s.running:
            table, ids = self.core.port.blocks(req.request_id)[0], self._ids(req)
            for p in range(req.num_computed_tokens):
                if self.slots.get((table[p // bs], p % bs)) != ids[p]:
                    bad.append(f"{req.request_id} position {p} (block {table[p // bs]}) holds "
                               f"{'poisoned' if self.slots.get((table[p // bs], p % bs)) == self.POISON else 'other'}"
                               f" KV")
                    break
        return bad

    def drain(self, limit: int = 500) -> None:
        for _ in range(limit):
            if not self.core.s.has_requests():
                return
            self.step()
            assert not self.check_kv(), self.check_kv()
        raise AssertionError("not drained")


def _chunks(so) -> dict:
    from retire import adapter
    return adapter.worker().chunks_of(so)


def _expected(core, rid: str, plen: int, n: int) -> list[int]:
    return [token_of(rid, plen + i) for i in range(n)]


def _cut_mixed(core: EngineFreeCore, sh: Shadow, revoked: str) -> None:
    sh.step(cut_ids=[revoked])


def _decode_bystander(core: EngineFreeCore, sh: Shadow, tenant: str = "t"):
    b_prompt = tokens(100, 11)
    b = core.submit(tenant, "b", b_prompt, max_tokens=8)
    for _ in range(3):
        sh.step()
    assert core.s.requests[b].num_output_tokens == 3  # decoding
    a_prompt = tokens(600, 12)
    a = core.submit("t", "a", a_prompt, max_tokens=2)
    return a, a_prompt, b, b_prompt


@pytest.mark.parametrize("tenant", ["t", "other-tenant"])
def test_decode_bystander_rolls_back_one_position_and_publishes_each_token_once(tenant):
    core = EngineFreeCore()
    sh = Shadow(core)
    a, a_prompt, b, b_prompt = _decode_bystander(core, sh, tenant)
    before = core.s.requests[b].num_computed_tokens
    _cut_mixed(core, sh, a)
    rb = core.s.requests[b]
    assert rb.num_computed_tokens == before and rb.num_output_tokens == 3, "bystander back at its last write"
    assert not sh.check_kv(), sh.check_kv()
    res, succ = core.supersede("t", "a", 0, revise(a_prompt, 100, 640, 3))
    assert res.receipts[0].path == "safe-point" and res.receipts[0].frontier == 0
    sh.drain()
    assert sh.published[b] == _expected(core, b, len(b_prompt), 8)  # each position once, in order
    assert sh.published[succ] == _expected(core, succ, 640, 8)
    assert a not in sh.published  # the revoked version published nothing
    assert core.audit()["valid"], core.audit()


def test_prefill_bystander_recomputes_its_whole_chunk():
    core = EngineFreeCore()
    sh = Shadow(core)
    a_prompt, b_prompt = tokens(100, 21), tokens(500, 22)
    a = core.submit("t", "a", a_prompt, max_tokens=2)
    b = core.submit("t", "b", b_prompt, max_tokens=6)
    _cut_mixed(core, sh, a)  # one step: A [0, 100) + B [0, 156)
    assert core.s.requests[b].num_computed_tokens == 0
    assert not sh.check_kv(), sh.check_kv()
    res, succ = core.supersede("t", "a", 0, revise(a_prompt, 40, 120, 5))
    sh.drain()
    assert sh.published[b] == _expected(core, b, 500, 6)
    assert core.s.requests.get(b) is None and core.audit()["valid"]


def _sharer_case(core: EngineFreeCore, sh: Shadow):
    """A (revoked), B1 (a 128-token prompt) and B2 (B1's prompt + 30) enter one step: B2's prefix-cache lookup hits
    B1's 4 blocks, hashed when B1 was scheduled in the same step."""
    shared = tokens(128, 31)
    a = core.submit("t", "a", tokens(60, 32), max_tokens=2)
    b1 = core.submit("t", "b1", shared, max_tokens=5)
    b2 = core.submit("t", "b2", shared + tokens(30, 33), max_tokens=5)
    return a, b1, b2


def test_request_reusing_blocks_the_cut_was_writing_is_preempted():
    core = EngineFreeCore()
    sh = Shadow(core)
    a, b1, b2 = _sharer_case(core, sh)
    _cut_mixed(core, sh, a)
    r2 = core.s.requests[b2]
    assert r2.num_preemptions == 1 and r2.num_computed_tokens == 0, "the sharer recomputes (vLLM's own counters)"
    assert not sh.check_kv(), sh.check_kv()
    core.supersede("t", "a", 0, tokens(70, 34))
    sh.drain()
    assert sh.published[b1] == _expected(core, b1, 128, 5)
    assert sh.published[b2] == _expected(core, b2, 158, 5)
    assert core.audit()["valid"], core.audit()


def test_negative_control_innocent_rollback_off_is_caught():
    core = EngineFreeCore()
    sh = Shadow(core)
    a_prompt, b_prompt = tokens(100, 41), tokens(500, 42)
    a = core.submit("t", "a", a_prompt, max_tokens=2)
    b = core.submit("t", "b", b_prompt, max_tokens=6)
    core.s("switches", {"innocents": False})
    _cut_mixed(core, sh, a)
    bad = sh.check_kv()
    assert bad and bad[0].startswith(b) and "poisoned" in bad[0], bad
    core.s("reset_switches")


def test_innocent_rollback_off_is_one_shot_so_a_re_cut_cannot_strand_the_innocent():
    """The negative control's switch covers one cut step. The revoked request is cut again (its SUPERSEDE has not
    arrived) until the innocent's LAST prompt chunk is in a cut step; that re-cut rolls the innocent back, so it still
    samples and drains. Left on for every cut, the innocent would count its whole prompt as computed with nothing
    sampled and never be scheduled again (the hang CI met on a slower machine)."""
    core = EngineFreeCore()
    sh = Shadow(core)
    a = core.submit("t", "a", tokens(100, 41), max_tokens=2)
    b = core.submit("t", "b", tokens(500, 42), max_tokens=6)
    core.s("switches", {"innocents": False})
    _cut_mixed(core, sh, a)
    assert sh.check_kv() and sh.check_kv()[0].startswith(b), "the first cut is the fault under test"
    first = core.s.requests[b].num_computed_tokens  # its first chunk, counted though poisoned
    for _ in range(3):                              # persistent, these re-cuts would reach 500 of 500
        _cut_mixed(core, sh, a)
        assert core.s.requests[b].num_computed_tokens == first, "a re-cut rolls the innocent back to its chunk"
    core.supersede("t", "a", 0, tokens(70, 34))
    for _ in range(50):
        if b not in core.s.requests:
            break
        sh.step()
    assert len(sh.published.get(b, [])) == 6, "the innocent drained after the one-shot fault"
    core.s("reset_switches")


def test_negative_control_rollback_without_preempting_sharers_is_caught(monkeypatch):
    core = EngineFreeCore()
    sh = Shadow(core)
    a, b1, b2 = _sharer_case(core, sh)
    monkeypatch.setattr(core.port, "sharers", lambda block_ids: [])  # planted mutant: no sharer preemption
    _cut_mixed(core, sh, a)
    bad = sh.check_kv()
    assert bad and bad[0].startswith(b2) and "poisoned" in bad[0], bad
