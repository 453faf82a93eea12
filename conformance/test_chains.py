"""Revision chains: e -> e+1 -> e+2 -> e+3 arrive before earlier versions drain. Only the final version publishes,
it runs to completion, and audit() is clean (fixture teardown). The final successor is judged against
clean_prefix_run by the logprob-closeness rule (its inherited prefix was written in other chunk splits)."""
import asyncio

from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from oracles import assert_logprobs_close, collect
from retire.faults import SlowConsumer

SP = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
SP_LAST = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=5)


def test_chain_of_revisions_publishes_only_the_final_version(unit):
    base = tokens(500, 900)
    prompts = [base] + [revise(base, 460 - 40 * k, 480, 901 + k) for k in range(3)]

    async def go():
        eng = unit.retire
        async with SlowConsumer(0.02).on(eng):
            await eng.submit("chain", prompts[0], SP)
            consumers = [asyncio.ensure_future(collect(eng, "chain", 0))]
            trs = []
            for e in range(3):
                sp = SP_LAST if e == 2 else SP
                trs.append(await eng.supersede("chain", e, prompts[e + 1], sp))
                consumers.append(asyncio.ensure_future(collect(eng, "chain", e + 1)))
            runs = await asyncio.gather(*consumers)
        oracle = await unit.oracle.clean_prefix_run(prompts[3][: trs[-1].inherited_tokens], prompts[3], SP_LAST)
        return trs, runs, oracle

    trs, runs, oracle = unit.run(go())
    assert [t.epoch for t in trs] == [1, 2, 3]
    assert unit.retire.stats()["obsolete_tokens_published"] == 0
    for r in runs[:3]:
        assert r.revoked
    final = runs[3]
    assert not final.revoked and len(final.tokens) == 24
    assert_logprobs_close(subject=final, oracle=oracle, subject_name="final version", oracle_name="clean_prefix_run")
    # each hop inherited from a predecessor that may not even have run: frontier-capped, never beyond it
    for t in trs:
        assert t.inherited_tokens <= min(r.frontier for r in t.receipts) or t.inherited_tokens == 0
