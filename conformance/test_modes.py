"""The retire policy with vLLM's prefix caching OFF: the direct hand-off does not depend on the prefix cache.

Rules as in test_handoff: exact against clean_prefix_run when the inherited length is a multiple of the prefill
chunk (256), logprob-closeness otherwise; native-prefix on this engine reuses nothing (nothing is cached), which is
the positive control that this configuration really has no prefix cache.
"""
import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from retire.trials import revision_trial
from oracles import assert_logprobs_close, assert_same_tokens

SP_OLD = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=5)


@pytest.mark.parametrize("seed,lcp", [(61, 512), (62, 300), (63, 40)])
def test_handoff_without_prefix_caching(unit_noapc, seed, lcp):
    h = unit_noapc
    prompt = tokens(600, seed)
    revised = revise(prompt, lcp, 580, seed)

    async def go():
        rev = await revision_trial(h.retire, "m", prompt, revised, SP_OLD, SP_NEW, after_tokens=2,
                                   reset_cache=False)
        oracle = await h.oracle.clean_prefix_run(revised[: rev.transition.inherited_tokens], revised, SP_NEW)
        return rev, oracle

    rev, oracle = h.run(go())
    assert rev.transition.inherited_tokens == lcp // 32 * 32
    check = assert_same_tokens if lcp % 256 == 0 else assert_logprobs_close
    check(subject=rev.new, oracle=oracle, subject_name="retire successor (APC off)", oracle_name="clean_prefix_run")


def test_native_prefix_reuses_nothing_without_prefix_caching(unit_noapc):
    h = unit_noapc
    prompt = tokens(600, 64)
    revised = revise(prompt, 512, 580, 64)

    async def go():
        return await revision_trial(h.native_prefix, "m", prompt, revised, SP_OLD, SP_NEW, after_tokens=2,
                                    reset_cache=False)

    rev = h.run(go())
    assert rev.transition.inherited_tokens == 0 and rev.new.num_cached_tokens == 0
