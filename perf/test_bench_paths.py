"""FENCE latency native vs retire, and inherited tokens, per serving path (issue #5; the paper's Table 10 / Table 6 rows
on CPU): speculative decoding (revision in the draft-verify prefill, and in active speculative decode after draft
work was observed), two KV groups (hybrid), tensor parallel 2, and the contract paths on the unit engine: exact
numerical mode, a zero pin quota (cold by contract), the DRAM tier (offload + digest-checked restore). The short-step
paths (256-token steps) close at the step boundary in both arms; `spec-prefill-long` and `hybrid-2k` use 2048-token
steps, where retire's in-step safe points apply (not with TP=2: ranks would have to cut collectively, so TP engines
fence at the step boundary).

Each pedantic round runs BOTH arms (native-cold, retire: sibling facades of one engine) on the same prompt pair, arm
order alternating (one driver: `retire.trials.revision_trial`); each trial's successor is judged against the path's
clean oracle inside the trial (`retire.trials.Judge`: exact against the mode-matched reference, retire may instead
pass the logprob-closeness rule; native-cold must be exact). A round with a rejected arm gives no ratio; rejections are
counted. FENCE latency = SUPERSEDE call -> last old writer closed (`Transition.fence_latency`). Reported: medians,
[min, max], per-pair ratio native/retire. For TP=2 also whether every rank's receipt arrived. No timing is asserted.
"""
from __future__ import annotations

from collections import Counter

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import repo_prompt, revise, tokens
from perf.common import Paired, summary
from retire import Contract
from retire.trials import Judge, revision_trial

pytestmark = pytest.mark.bench

ARMS = ("native-cold", "retire")
ROUNDS = 5
GREEDY = dict(temperature=0, ignore_eos=True)
SP_OLD = SamplingParams(max_tokens=96, **GREEDY)
SP_NEW = SamplingParams(max_tokens=16, logprobs=5, **GREEDY)


PATHS = {
    # key: (engine shape, prompt(seed), revised(prompt, seed), trial kwargs)
    "spec-prefill": ("unit-spec", lambda s: repo_prompt(1900, s), lambda p, s: revise(p, 1700, 1800, s),
                     dict(frontier=256)),
    "spec-active": ("unit-spec", lambda s: repo_prompt(600, s), lambda p, s: revise(p, 560, 600, s),
                    dict(drafts=True, lag=8)),
    "hybrid": ("hybrid", lambda s: tokens(1900, s), lambda p, s: revise(p, 1800, 1850, s), dict(frontier=256)),
    # long steps (2048 tokens), where the in-step safe points can bound FENCE below one step
    "spec-prefill-long": ("long-spec", lambda s: repo_prompt(8192, s), lambda p, s: revise(p, 2304, 2560, s),
                          dict(frontier=2048)),
    "hybrid-2k": ("hybrid-2k", lambda s: tokens(4000, s), lambda p, s: revise(p, 2304, 2560, s),
                  dict(frontier=2048)),
    "tp2": ("unit-tp2", lambda s: tokens(600, s), lambda p, s: revise(p, 560, 580, s), dict(lag=2)),
    # contract paths on the unit engine (256-token steps), revision mid-prefill; native arms ignore the contract
    "exact": ("unit", lambda s: tokens(1900, s), lambda p, s: revise(p, 1700, 1800, s),
              dict(frontier=512, contract=Contract(mode="exact"))),
    "quota-zero": ("unit", lambda s: tokens(1900, s), lambda p, s: revise(p, 1700, 1800, s),
                   dict(frontier=512, contract=Contract(pin_quota_blocks=0))),
    "dram": ("unit", lambda s: tokens(1900, s), lambda p, s: revise(p, 1700, 1800, s),
             dict(frontier=512, contract=Contract(dram_tier=True))),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_bench_fence_per_path(benchmark, facades, runner, path):
    key, mk_prompt, mk_revised, kw = PATHS[path]
    fs, oracle = facades(key, *ARMS)
    judge = Judge(oracle)
    paired = Paired(ARMS)

    async def one_round(i: int):
        prompt = mk_prompt(900 + i)
        revised = mk_revised(prompt, 900 + i)
        res = {}
        for arm in paired.order(i):
            t = await revision_trial(fs[arm], f"{path}{i}", prompt, revised, SP_OLD, SP_NEW, **kw)
            t.ok, t.verdict = await judge.check(arm, revised, SP_NEW, t.new, t.reused)
            res[arm] = t
        paired.add(i, res)

    benchmark.pedantic(lambda i: runner.run(one_round(i)), setup=paired.setup, rounds=ROUNDS, iterations=1)

    assert paired.rounds, f"every round was rejected by its oracle: {paired.rejections}"
    fence = lambda t: t.fence
    benchmark.extra_info.update({"path": path, "engine": key, **paired.admission()})
    for a in ARMS:
        benchmark.extra_info[f"fence_latency_s[{a}]"] = summary(paired.values(a, fence))
        benchmark.extra_info[f"inherited_tokens[{a}]"] = summary(paired.values(a, lambda t: t.reused), nd=0)
        benchmark.extra_info[f"frontier_at_call[{a}]"] = summary(paired.values(a, lambda t: t.frontier_at_call), nd=0)
        benchmark.extra_info[f"obsolete_tokens_published[{a}]"] = sum(paired.values(a, lambda t: t.obsolete,
                                                                                  admitted_only=False))
    benchmark.extra_info["fence_latency_ratio[native-cold/retire]"] = summary(paired.ratios("native-cold", "retire",
                                                                                             fence))
    retire = paired.values("retire", lambda t: t)
    benchmark.extra_info["receipts[retire]"] = dict(Counter(
        ",".join(sorted(r.participant for r in t.transition.receipts)) for t in retire))
    benchmark.extra_info["fence_path[retire]"] = dict(Counter(t.fence_path for t in retire))
    benchmark.extra_info["cold_reasons[retire]"] = dict(Counter(str(t.transition.cold_reason) for t in retire))
    if path.startswith("spec"):
        benchmark.extra_info["drafted_at_call[retire]"] = summary([t.drafted for t in retire], nd=0)
    if key == "unit-tp2":
        parts = [{r.participant for r in t.transition.receipts} for t in retire]
        full = sum(p == {"rank-0/kv-group-0", "rank-1/kv-group-0"} for p in parts)
        benchmark.extra_info["every_rank_receipt[retire]"] = f"{full}/{len(parts)}"
    benchmark.extra_info["verdicts"] = sorted({t.verdict for r in paired.rounds for t in r.values()})
    print(f"\n[{path}] " + " ".join(f"{k}={v}" for k, v in benchmark.extra_info.items() if k != "rejections"))
    assert sum(paired.values("retire", lambda t: t.obsolete, admitted_only=False)) == 0
