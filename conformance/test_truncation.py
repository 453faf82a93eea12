"""Truncation revisions: the revised prompt is a prefix of what the old version holds (its prompt, or its prompt plus
tokens it generated), block-aligned and not. The LCP with the old version is then the WHOLE revision, so ALIGN's
`len(new) - 1` cap is what keeps one token for the successor to compute: dropping the cap makes an aligned truncation
certify its whole prompt, and this module fails.

Expected certified length, computed by the test from the prompts and the frontier the engine reported before the call:
min(len(new) - 1, frontier) rounded down to the block (32). Oracle: `clean_prefix_run(revised[:certified], revised)`
on the stock engine, exact when the certified length is a multiple of the prefill chunk (256), else the
logprob-closeness rule. Nothing of the old version reaches its consumer after the call (consumer's clock).
"""
from __future__ import annotations

import asyncio

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import tokens, truncate
from conformance.scenarios import within
from oracles import assert_logprobs_close, assert_same_tokens, collect
from retire.barriers import wait_engine
from retire.trials import ConsumerClock, Observed, caught_up, observe

CHUNK, BLOCK = 256, 32
SP_OLD = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=5)
# (id, length of the revision, how many generated tokens it keeps): a prefix of the prompt, aligned and not; the
# whole prompt; a prefix reaching into the old version's output, aligned and not.
CASES = [("prompt-aligned", 320, 0), ("prompt-unaligned", 333, 0), ("whole-prompt", 600, 0),
         ("output-aligned", 608, 8), ("output-unaligned", 605, 5)]


def expected_certified(new_len: int, frontier: int) -> int:
    cap = min(new_len - 1, frontier)  # the LCP is the whole revision
    return cap - cap % BLOCK


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case,length,keep", CASES, ids=[c[0] for c in CASES])
def test_truncation_revision_matches_its_oracle(unit, case, length, keep):
    prompt = tokens(600, 901 + length)

    async def go():
        eng = unit.retire
        clock, log = ConsumerClock(), Observed()
        await eng.submit("tr", prompt, SP_OLD)
        got = asyncio.Event()
        old = asyncio.ensure_future(observe(eng, "tr", 0, clock, log,
                                            on_frame=lambda r: len(log.tokens) >= keep + 2 and got.set()))
        await within(got.wait(), 120, "the consumer to receive the tokens the revision keeps")
        st = await wait_engine(eng, "tr", out_tokens=keep + 2, epoch=0)
        await caught_up()
        held = list(prompt) + list(log.tokens)
        revised = truncate(held, length)
        call = clock.mark("supersede")
        tr = await eng.supersede("tr", 0, revised, SP_NEW)
        new = await within(collect(eng, "tr", 1), 120, "the successor to finish")
        await within(old, 120, "the revoked stream to end")
        n = tr.inherited_tokens
        ref = await unit.oracle.clean_prefix_run(revised[:n], revised, SP_NEW)
        return st, revised, tr, new, ref, log.obsolete(call, 0)

    st, revised, tr, new, ref, obsolete = unit.run(go())
    if not keep:
        assert revised == prompt[:length]  # a prefix of the prompt itself
    want = expected_certified(len(revised), st["frontier"])
    assert tr.inherited_tokens == want and tr.cold_reason is None, (tr.inherited_tokens, want, tr.cold_reason)
    assert tr.inherited_tokens < len(revised), "the successor must keep at least one token to compute"
    assert tr.certificate.lcp == len(revised), tr.certificate
    assert obsolete == 0
    assert ref.inherited_tokens == tr.inherited_tokens
    check = assert_same_tokens if tr.inherited_tokens % CHUNK == 0 else assert_logprobs_close
    check(subject=new, oracle=ref, subject_name=f"successor ({case})",
          oracle_name=f"clean_prefix_run[:{tr.inherited_tokens}]")
