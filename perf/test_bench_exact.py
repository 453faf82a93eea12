"""The cost of the exact numerical mode (issue #5 item 8): successor TTFT under Contract(mode="exact") vs "ordinary".

Scenario (unit model, prefill chunk 256): an 1800-token prompt decodes; SUPERSEDE once the consumer got a token,
with a revised prompt of 1800 tokens sharing LCP in [1540, 1780] (a different LCP each round). "exact" certifies the
LCP rounded down to the chunk (1536) and recomputes the rest in a cold run's chunk shape; "ordinary" certifies it
rounded down to the block (32). Both arms run on the same retire facade, back to back, arm order alternating per round,
each from an empty prefix cache. Admission inside every trial: the exact successor must be bit-identical to
`clean_run` (token ids, logprobs and top-k logprobs, `==`); the ordinary successor must pass the logprob-closeness rule.
Figures: successor TTFT per arm (median [min, max]), the per-pair ratio exact/ordinary, tokens inherited per arm.
"""
from __future__ import annotations

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from oracles import compare_logprobs_close
from perf.common import Paired, summary
from retire import Contract
from retire.trials import revision_trial

pytestmark = pytest.mark.bench

ARMS = ("exact", "ordinary")
ROUNDS = 10
SP_OLD = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=5)


def _bit_identical(a, b) -> tuple[bool, str]:
    if a.tokens != b.tokens:
        return False, "token ids differ"
    if a.logprobs != b.logprobs or a.top_logprobs != b.top_logprobs:
        return False, "logprobs differ"
    return True, "bit-identical vs clean_run"


def test_bench_exact_vs_ordinary_successor_ttft(benchmark, facades, runner):
    fs, oracle = facades("unit", "retire")
    eng = fs["retire"]
    paired = Paired(ARMS)

    async def one_round(i: int):
        prompt = tokens(1800, 1100 + i)
        lcp = 1540 + (24 * i) % 240
        revised = revise(prompt, lcp, 1800, 1100 + i)
        cold = await oracle.clean_run(revised, SP_NEW)
        res = {}
        for arm in paired.order(i):
            t = await revision_trial(eng, f"ex{arm}{i}", prompt, revised, SP_OLD, SP_NEW, after_tokens=1,
                                     contract=Contract(mode=arm))
            if arm == "exact":
                t.ok, t.verdict = _bit_identical(t.new, cold)
            else:
                v = compare_logprobs_close(subject=t.new, oracle=cold, subject_name="ordinary", oracle_name="clean_run")
                t.ok, t.verdict = bool(v), v.detail
            res[arm] = t
        paired.add(i, res)

    benchmark.pedantic(lambda i: runner.run(one_round(i)), setup=paired.setup, rounds=ROUNDS, iterations=1)

    assert paired.rounds, f"every round was rejected: {paired.rejections}"
    ttft = lambda t: t.ttft
    benchmark.extra_info.update({"scenario": "unit, 1800-token prompt, LCP 1540-1780, SUPERSEDE during decode",
                                 "model": "unit", **paired.admission()})
    for a in ARMS:
        benchmark.extra_info[f"successor_ttft_s[{a}]"] = summary(paired.values(a, ttft))
        benchmark.extra_info[f"inherited_tokens[{a}]"] = summary(paired.values(a, lambda t: t.reused), nd=0)
        benchmark.extra_info[f"obsolete_tokens_published[{a}]"] = sum(paired.values(a, lambda t: t.obsolete))
    benchmark.extra_info["ttft_ratio[exact/ordinary]"] = summary(paired.ratios("exact", "ordinary", ttft))
    assert all(t.reused % 256 == 0 and t.reused > 0 for t in paired.values("exact", lambda t: t))
    assert sum(paired.values("exact", lambda t: t.obsolete, admitted_only=False)) == 0
