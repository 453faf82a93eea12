"""Native policies (abort + resubmit) against clean oracles: the successor is right, and what it costs is visible.

Comparison rules (stated per case):
- native-cold: the successor runs alone from token 0 with no reuse, the same execution shape as `clean_run`,
  so its tokens must be identical (exact rule).
- native-prefix: the successor reuses whatever the prefix cache kept, so its chunk boundaries differ from a cold
  run; it is judged by the logprob-closeness rule (oracles.compare.compare_logprobs_close).
"""
import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from retire.trials import revision_trial
from oracles import assert_logprobs_close, assert_same_tokens

SP_OLD = SamplingParams(max_tokens=160, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=5)


@pytest.mark.parametrize("policy", ["native-cold", "native-prefix"])
def test_native_successor_matches_clean_run(unit, policy):
    prompt = tokens(600, 31)
    revised = revise(prompt, 450, 560, 31)
    eng = unit.engines[policy]

    async def go():
        rev = await revision_trial(eng, "n", prompt, revised, SP_OLD, SP_NEW, after_tokens=4,
                                   reset_cache=False)
        oracle = await unit.oracle.clean_run(revised, SP_NEW)
        return rev, oracle

    rev, oracle = unit.run(go())
    tr = rev.transition
    if policy == "native-cold":
        assert_same_tokens(subject=rev.new, oracle=oracle, subject_name="native-cold successor",
                           oracle_name="clean_run")
        assert tr.inherited_tokens == 0 and rev.new.num_cached_tokens == 0  # vLLM's own count: no reuse
    else:
        assert_logprobs_close(subject=rev.new, oracle=oracle, subject_name="native-prefix successor",
                              oracle_name="clean_run")
        # vLLM's prefix cache still held the shared prefix: full blocks of the 450-token LCP
        assert tr.inherited_tokens == 448 == rev.new.num_cached_tokens, tr
    assert tr.successor_ttft is not None and tr.successor_ttft > 0
