"""Long prefill: a revision lands during a chunked prefill of the `long` model (unit = 2048 tokens per step).

Rules: the certified prefix is capped by the writer frontier, which at a step boundary is a whole number of 2048-token
chunks, so the successor's execution shape equals `clean_prefix_run`'s and tokens must be identical (exact rule).
The fresh request carrying the old prompt afterwards reuses whatever the prefix cache holds (other splits), so it is
judged by the logprob-closeness rule against `clean_run`; a half-written block would make it diverge far beyond that.
"""
import asyncio

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import repo_prompt, revise
from retire.barriers import wait_engine
from oracles import assert_logprobs_close, assert_same_tokens, collect

SP_OLD = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=5)


@pytest.mark.parametrize("steps_in", [1, 2])
def test_revision_during_chunked_prefill(long, steps_in):
    prompt = repo_prompt(7000, seed=10 + steps_in)
    revised = revise(prompt, 6300, 7000, 10 + steps_in)

    async def go():
        eng = long.retire
        await eng.submit("lp", prompt, SP_OLD)
        old = asyncio.ensure_future(collect(eng, "lp", 0))
        st = await wait_engine(eng, "lp", frontier=2048 * steps_in)
        tr = await eng.supersede("lp", 0, revised, SP_NEW)
        new = await collect(eng, "lp", 1)
        old_run = await old
        oracle = await long.oracle.clean_prefix_run(revised[: tr.inherited_tokens], revised, SP_NEW)
        # a fresh request with the OLD full prompt, served from whatever the cache holds
        await eng.submit("lp-again", prompt, SP_NEW)
        again = await collect(eng, "lp-again")
        again_oracle = await long.oracle.clean_run(prompt, SP_NEW)
        return st, tr, new, old_run, oracle, again, again_oracle

    st, tr, new, old_run, oracle, again, again_oracle = long.run(go())
    (receipt,) = tr.receipts
    assert receipt.frontier >= 2048 * steps_in and receipt.frontier % 2048 == 0  # a step boundary
    assert receipt.frontier < len(prompt), "the revision must land during the prefill"
    assert tr.inherited_tokens <= receipt.frontier and tr.inherited_tokens == receipt.frontier
    assert old_run.revoked and old_run.tokens == ()  # nothing of the old version was published
    assert_same_tokens(subject=new, oracle=oracle, subject_name="successor", oracle_name="clean_prefix_run")
    assert_logprobs_close(subject=again, oracle=again_oracle, subject_name="fresh request with the old prompt",
                          oracle_name="clean_run")
