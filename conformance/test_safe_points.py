"""Bounded retirement inside a step: safe points cut an obsolete long prefill at the next decoder layer.

The revision is landed at an exact layer of a running step with the LandInStep barrier (the worker is held at that
layer while the SUPERSEDE's revocation is posted, then released). Rules: the successor's inherited prefix was computed
in other chunk splits than the oracle's (`long` oracle, chunk 2048), so successors are judged by the
logprob-closeness rule against clean_prefix_run; the engine-health run keeps the oracle's splits (step 2048) and is
judged exactly.
"""
import asyncio

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import repo_prompt, revise, tokens
from retire.barriers import wait_engine
from oracles import assert_logprobs_close, assert_same_tokens, collect, compare_logprobs_close
from retire.barriers import LandInStep
from retire.faults import StuckRevocation

SP_OLD = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=5)
LANDING = {"early": 1, "middle": 4, "late": 7}


async def land(h, scope, *, unit, layer, prompt, revised, sp_new=SP_NEW, posted_within: float = 60.0):
    """Run `prompt` with steps of `unit` tokens; during its second step, at `layer`, SUPERSEDE with `revised`."""
    eng = h.retire
    await eng.backend.sched("set_step_tokens", {"tokens": unit})
    await eng.submit(scope, prompt, SP_OLD)
    old = asyncio.ensure_future(collect(eng, scope, 0))
    await wait_engine(eng, scope, frontier=unit)  # the first step is done; the second is about to run
    async with LandInStep(eng, layer, eng.internal_id(scope, 0)) as barrier:
        await barrier.paused()
        task = asyncio.ensure_future(eng.supersede(scope, 0, revised, sp_new))
        await barrier.posted(eng.internal_id(scope, 0), timeout=posted_within)
    tr = await task
    new = await collect(eng, scope, 1)
    return tr, new, await old


CASES = [pytest.param(u, l, marks=() if u == 2048 or (u, l) == (4096, "middle") else pytest.mark.slow)
         for u in (2048, 4096, 8192) for l in LANDING]


@pytest.mark.parametrize("unit,landing", CASES)
def test_revision_inside_a_long_prefill_step(long8k, unit, landing):
    h, layer = long8k, LANDING[landing]
    prompt = repo_prompt(2 * unit, seed=unit + layer)
    revised = revise(prompt, unit // 2 + 100, 2 * unit - 300, seed=unit + layer)  # the running chunk is obsolete

    async def go():
        tr, new, old = await land(h, "sp", unit=unit, layer=layer, prompt=prompt, revised=revised)
        oracle = await h.oracle.clean_prefix_run(revised[: tr.inherited_tokens], revised, SP_NEW)
        return tr, new, old, oracle

    tr, new, old, oracle = h.run(go())
    (r,) = tr.receipts
    assert r.path == "safe-point" and r.detail["layer"] == layer and r.detail["cut"], r
    assert r.frontier == unit and r.detail["rolled_back_to"] == unit  # the last COMPLETED write
    assert tr.inherited_tokens == (unit // 2 + 100) // 32 * 32 <= r.frontier
    assert old.revoked and old.tokens == () and h.retire.stats()["obsolete_tokens_published"] == 0
    assert_logprobs_close(subject=new, oracle=oracle, subject_name="successor after a cut",
                          oracle_name="clean_prefix_run")


@pytest.mark.timeout(300)
def test_long_scope_name_is_cut_at_a_safe_point(long8k):
    """The same landing as `test_revision_inside_a_long_prefill_step` (2048-token steps, layer 4, the running chunk
    obsolete) for a scope named with 1,000 characters: the step must be cut at the safe point, exactly as for a short
    name (which that test is the control of)."""
    h, unit, layer = long8k, 2048, 4
    scope = "S" * 1000
    prompt = repo_prompt(2 * unit, seed=4242)
    revised = revise(prompt, unit // 2 + 100, 2 * unit - 300, seed=4242)

    async def go():
        tr, new, old = await land(h, scope, unit=unit, layer=layer, prompt=prompt, revised=revised,
                                  posted_within=15.0)
        return tr, new, old, await h.oracle.clean_prefix_run(revised[: tr.inherited_tokens], revised, SP_NEW)

    tr, new, old, oracle = h.run(go())
    (r,) = tr.receipts
    assert r.path == "safe-point" and r.detail["layer"] == layer and r.detail["cut"], r
    assert old.revoked and old.tokens == ()
    assert_logprobs_close(subject=new, oracle=oracle, subject_name="successor of a long-named scope",
                          oracle_name="clean_prefix_run")


def test_useful_running_step_is_let_finish(long8k):
    """The running chunk is almost all shared with the successor and the revision lands late: the cost model lets
    the step finish (commit gated, blocks certified) instead of cutting and recomputing it."""
    h, unit = long8k, 4096
    prompt = repo_prompt(2 * unit, seed=5)
    lcp = 2 * unit - 60
    revised = revise(prompt, lcp, 2 * unit + 100, seed=5)

    async def go():
        tr, new, old = await land(h, "fin", unit=unit, layer=7, prompt=prompt, revised=revised)
        return tr, new, old, await h.oracle.clean_prefix_run(revised[: tr.inherited_tokens], revised, SP_NEW)

    tr, new, old, oracle = h.run(go())
    (r,) = tr.receipts
    assert r.path == "finish-step" and not r.detail["cut"], r
    assert r.detail["predicted_successor_ready_finish"] < r.detail["predicted_successor_ready_cut"]
    assert r.frontier == 2 * unit and tr.inherited_tokens == lcp // 32 * 32  # the finished chunk was certified
    assert old.tokens == () and h.retire.stats()["obsolete_tokens_published"] == 0
    assert_logprobs_close(subject=new, oracle=oracle, subject_name="successor", oracle_name="clean_prefix_run")


async def _closure_case(h, *, closure: bool, seed: int):
    unit = 2048
    prompt = repo_prompt(2 * unit, seed=seed)  # a prompt no earlier test cached
    revised = revise(prompt, 700, 3000, seed=seed)
    if not closure:
        await h.retire.backend.sched("switches", {"closure": False})
    tr, _, _ = await land(h, "wc", unit=unit, layer=4, prompt=prompt, revised=revised)
    await h.retire.backend.sched("switches", {"closure": True})
    await h.retire.submit("wc-again", prompt, SP_NEW)  # the OLD full prompt, served from the prefix cache
    again = await collect(h.retire, "wc-again")
    return tr, again, await h.oracle.clean_run(prompt, SP_NEW)


def test_writer_closure_no_half_written_block_is_reachable(long8k):
    tr, again, oracle = long8k.run(_closure_case(long8k, closure=True, seed=99))
    (r,) = tr.receipts
    assert r.path == "safe-point" and tr.inherited_tokens <= r.frontier == 2048
    assert_logprobs_close(subject=again, oracle=oracle, subject_name="fresh request with the old prompt",
                          oracle_name="clean_run")


def test_negative_control_without_closure_the_corrupted_reuse_is_caught(long8k):
    h = long8k
    try:
        tr, again, oracle = h.run(_closure_case(h, closure=False, seed=98))
    finally:
        # heal: drop every cached hash so the poisoned blocks cannot serve later tests
        assert h.run(h.retire.backend.reset_prefix_cache())
    (r,) = tr.receipts
    assert r.path == "safe-point"
    v = compare_logprobs_close(subject=again, oracle=oracle, subject_name="fresh request (closure off)",
                               oracle_name="clean_run")
    assert v.valid is False, "half-written blocks reused through the prefix cache must be caught: " + v.detail


def test_mixed_step_is_not_cut_and_the_cotenant_is_unchanged(long8k):
    h, unit = long8k, 4096
    b_prompt = tokens(300, 4242)
    sp_b = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True, logprobs=5)

    async def go():
        eng = h.retire
        await eng.backend.sched("set_step_tokens", {"tokens": unit})
        await eng.submit("b", b_prompt, sp_b, tenant="B")
        b_task = asyncio.ensure_future(collect(eng, "b", 0, "B"))
        await wait_engine(eng, "b", out_tokens=2, tenant="B")
        cuts = eng.backend.mailbox.count("cuts")
        prompt = repo_prompt(2 * unit, seed=8)
        await eng.submit("a", prompt, SP_OLD, tenant="A")
        await wait_engine(eng, "a", frontier=unit - 200, tenant="A")  # one mixed step of A done
        async with LandInStep(eng, 4, eng.internal_id("a", 0, tenant="A")) as barrier:
            await barrier.paused()
            task = asyncio.ensure_future(eng.supersede("a", 0, revise(prompt, 500, 3000, 8), SP_NEW, tenant="A"))
            await barrier.posted(eng.internal_id("a", 0, tenant="A"))
        tr = await task
        await collect(eng, "a", 1, "A")
        return tr, await b_task, eng.backend.mailbox.count("cuts") - cuts

    tr, b_run, new_cuts = h.run(go())
    (r,) = tr.receipts
    assert r.path == "step-boundary:mixed" and new_cuts == 0, r
    oracle = h.run(h.oracle.clean_run(b_prompt, sp_b))
    assert_logprobs_close(subject=b_run, oracle=oracle, subject_name="co-tenant B", oracle_name="clean_run")


def test_engine_health_after_a_hundred_cut_short_steps(long8k):
    h = long8k
    prompt = repo_prompt(3000, seed=123)
    sp = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)

    async def go():
        eng = h.retire
        await eng.backend.sched("set_step_tokens", {"tokens": 2048})  # the oracle's splits: exact comparison
        mb = eng.backend.mailbox
        start = mb.count("cuts")
        await eng.submit("health", prompt, sp)
        async with StuckRevocation("health").on(eng):
            while mb.count("cuts") - start < 100:  # barrier on the worker's own counter
                await asyncio.sleep(0.005)
            st = await eng.backend.sched("request_state", {"req_id": eng.internal_id("health")})
        run = await collect(eng, "health")
        return mb.count("cuts") - start, st, run, await eng.backend.sched("audit")

    cuts, st, run, audit = h.run(go())
    assert cuts >= 100 and st["frontier"] == 0  # every cut rolled the request back to its last completed write
    assert audit["valid"], audit
    assert_same_tokens(subject=run, oracle=h.run(h.oracle.clean_run(prompt, sp)),
                       subject_name="request after 100 cuts", oracle_name="clean_run")
