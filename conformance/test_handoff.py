"""Versioned handoff: the successor consumes only certified state and matches its mode-matched clean oracle.

Comparison rule per case: the oracle is `clean_prefix_run(revised[:inherited], revised)` on a stock engine. When the
inherited length is a multiple of the prefill chunk (256 here) the execution shapes match and tokens must be
identical (exact rule); otherwise the prefix was computed in different chunk splits and the logprob-closeness rule
applies (oracles.compare.compare_logprobs_close). Cold successors are compared exactly against `clean_run`, and must
be cold by vLLM's own count (`num_cached_tokens == 0` on their frames).
"""
import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from retire.trials import revision_trial
from retire.barriers import wait_engine
from oracles import assert_logprobs_close, assert_same_tokens
from retire import Contract
from retire.faults import GenerationRace

CHUNK, BLOCK = 256, 32
SP_OLD = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=5)
# LCPs just below, at and above block boundaries, and at a chunk boundary.
CONFIGS = [(seed, lcp) for seed in (1, 2) for lcp in (287, 288, 289, 319, 320, 321)] + [(3, 512), (4, 513), (5, 33)]


def expected_certified(lcp: int, new_len: int, frontier: int) -> int:
    cap = min(lcp, frontier, new_len - 1)
    return cap - cap % BLOCK


@pytest.mark.parametrize("seed,lcp", CONFIGS, ids=[f"s{s}-lcp{l}" for s, l in CONFIGS])
def test_inheriting_successor_matches_clean_prefix_run(unit, seed, lcp):
    prompt = tokens(600, seed)
    revised = revise(prompt, lcp, 560, seed)

    async def go():
        rev = await revision_trial(unit.retire, "h", prompt, revised, SP_OLD, SP_NEW, after_tokens=2,
                                   reset_cache=False)
        tr = rev.transition
        oracle = await unit.oracle.clean_prefix_run(revised[: tr.inherited_tokens], revised, SP_NEW)
        return rev, oracle

    rev, oracle = unit.run(go())
    tr = rev.transition
    (receipt,) = tr.receipts
    assert tr.inherited_tokens == expected_certified(lcp, len(revised), receipt.frontier), tr
    assert tr.cold_reason is None and tr.certificate.tokens == tr.inherited_tokens
    assert tr.certificate.tokens <= receipt.frontier
    assert len(tr.certificate.block_ids[0]) == tr.inherited_tokens // BLOCK
    assert oracle.inherited_tokens == tr.inherited_tokens  # the oracle reused exactly the same prefix length
    if tr.inherited_tokens % CHUNK == 0:
        assert_same_tokens(subject=rev.new, oracle=oracle, subject_name="retire successor",
                           oracle_name="clean_prefix_run")
    else:
        assert_logprobs_close(subject=rev.new, oracle=oracle, subject_name="retire successor",
                              oracle_name="clean_prefix_run")
    assert rev.obsolete == 0


def _cold_case(unit, *, fault=None, contract=Contract(), salt=None, scope="c"):
    prompt = tokens(600, 77)
    revised = revise(prompt, 400, 560, 77)

    async def go():
        eng = unit.retire
        await eng.submit(scope, prompt, SP_OLD)
        from oracles import collect
        import asyncio
        old = asyncio.ensure_future(collect(eng, scope, 0))
        await wait_engine(eng, scope, out_tokens=1)  # the predecessor's prefill is written: frontier >= 600
        if fault is not None:
            async with fault.on(eng):
                tr = await eng.supersede(scope, 0, revised, SP_NEW, contract=contract, cache_salt=salt)
        else:
            tr = await eng.supersede(scope, 0, revised, SP_NEW, contract=contract, cache_salt=salt)
        new = await collect(eng, scope, 1)
        await old
        return tr, new, await unit.oracle.clean_run(revised, SP_NEW)

    return unit.run(go())


@pytest.mark.parametrize("case", ["generation", "config", "quota-zero", "no-inherit"])
def test_mismatch_selects_cold_with_reason(unit, case):
    """(A forged tenant is not a mismatch here: tenant is part of the scope's identity, so the engine finds no such
    scope and refuses the SUPERSEDE; see conformance/test_refusal.py.)"""
    kw = {
        "generation": dict(fault=GenerationRace("c")),
        "config": dict(salt="another-namespace"),
        "quota-zero": dict(contract=Contract(pin_quota_blocks=0)),
        "no-inherit": dict(contract=Contract(inherit=False)),
    }[case]
    reason = {"generation": "generation mismatch", "config": "config mismatch: cache_salt",
              "quota-zero": "pin quota", "no-inherit": "contract forbids"}[case]
    tr, new, oracle = _cold_case(unit, **kw)
    assert tr.inherited_tokens == 0 and tr.certificate is None
    assert tr.cold_reason is not None and reason in tr.cold_reason, tr.cold_reason
    # cold by vLLM's own count, not by the scheduler's word: nothing was read through the prefix cache (the old
    # version's blocks are still cached, so a successor that looked them up would report them here)
    assert new.num_cached_tokens == 0, f"cold successor ({case}) read {new.num_cached_tokens} cached tokens"
    assert_same_tokens(subject=new, oracle=oracle, subject_name=f"cold successor ({case})", oracle_name="clean_run")


def test_negative_control_without_fault_the_same_case_inherits(unit):
    tr, new, _ = _cold_case(unit)
    assert tr.inherited_tokens == 384 and tr.cold_reason is None


def test_quota_truncates_to_whole_blocks(unit):
    tr, _, _ = _cold_case(unit, contract=Contract(pin_quota_blocks=5))
    assert tr.inherited_tokens == 5 * BLOCK, tr
