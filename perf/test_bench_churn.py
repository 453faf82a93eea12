"""Churn sweep (paper Figure 5 / Table 12): retained prefix and recovery under unique-prefix churn, by churn level.

Arms (paired per round on ONE engine, arm order rotated): "native" (native-prefix: abort, churn, resubmit; the prefix
cache keeps what the churn did not evict), "retire_hbm" (SUPERSEDE holds the successor with the certified blocks in
its table during the churn), "retire_dram" (SUPERSEDE under Contract(dram_tier=True): pages copied to host memory,
blocks returned, restored digest-checked at admission). Driver: `retire.faults.churn.churn_trial`.

Workload: `long-churn` shape (long model 512x8, prefill unit 2048, 320 KV blocks = 10208 usable tokens). Old prompt
4200 tokens, revised prompt 4160 sharing 4100 -> certified 4096 (2 prefill units). Churn/capacity 0.5, 0.7, 0.9, 1.0,
1.1 (requests of 2048 unique tokens, 2 at a time), between the revision and the successor's admission.

Metrics per level (medians and [min, max]; ratios per pair): retained prefix tokens per arm (`retained_tokens_<arm>`,
the report's churn figure), recovery = admission -> successor's first token (native: resubmission; HBM: release;
DRAM: start of the restore, restore included), recovery speed-up native/retire, full interval = revision ->
successor's last token (churn included) and its speed-up. Every trial's successor is judged against its oracle
(exact vs the mode-matched reference, else the logprob-closeness rule); failing trials are not admitted.
"""
from __future__ import annotations

import os
from collections import Counter

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import repo_prompt, revise
from perf.common import Paired, summary
from retire.trials import Judge
from retire.faults.churn import ARMS, churn_trial

pytestmark = pytest.mark.bench

SHAPE = "long-churn"
LEVELS = (0.5, 0.7, 0.9, 1.0, 1.1)
ROUNDS = int(os.environ.get("RETIRE_CHURN_ROUNDS", "2"))
SP_OLD = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=5)
_judges: dict = {}  # one Judge per oracle engine: the same prompts recur at every level, their oracle runs once


def _prompts(i: int):
    prompt = repo_prompt(4200, 900 + i)
    return prompt, revise(prompt, 4100, 4160, 900 + i)


@pytest.mark.timeout(1800)  # RETIRE_CHURN_ROUNDS rounds x 3 arms on the long model, churn included
@pytest.mark.parametrize("level", LEVELS)
def test_bench_churn_sweep(benchmark, facades, runner, level):
    fs, oracle = facades(SHAPE, "native-prefix", "retire")
    engines = {"native": fs["native-prefix"], "retire_hbm": fs["retire"], "retire_dram": fs["retire"]}
    judge = _judges.setdefault(id(oracle), Judge(oracle))
    paired = Paired(ARMS)

    async def one_round(i: int):
        prompt, revised = _prompts(i)
        res = {}
        for arm in paired.order(i):
            t = await churn_trial(engines[arm], arm, f"churn{level}-{i}-{arm}", prompt, revised, SP_OLD, SP_NEW,
                                  level, seed=int(level * 1000) + 10 * i + ARMS.index(arm), request_tokens=2048)
            t.ok, t.verdict = await judge.check("native-prefix" if arm == "native" else "retire", revised, SP_NEW,
                                                t.new, t.retained)
            res[arm] = t
        paired.add(i, res)

    benchmark.pedantic(lambda i: runner.run(one_round(i)), setup=paired.setup, rounds=ROUNDS, iterations=1)

    assert paired.rounds, f"every round was rejected by its oracle: {paired.rejections}"
    ei = benchmark.extra_info
    ei.update({"scenario": "revision, churn between revision and successor admission, 4096 certified tokens",
               "model": "long", "shape": SHAPE, "churn_fraction": level, **paired.admission()})
    first = paired.rounds[0]["native"]
    ei["capacity_tokens"] = first.capacity_tokens
    ei["churned_tokens"] = summary(paired.values("native", lambda t: t.churned_tokens), nd=0)
    ei["certified_tokens"] = summary(paired.values("retire_hbm", lambda t: t.certified), nd=0)
    rec, full = (lambda t: t.recovery), (lambda t: t.interval)
    for a in ARMS:
        ei[f"retained_tokens_{a}"] = summary(paired.values(a, lambda t: t.retained), nd=0)
        ei[f"retained_fraction[{a}]"] = summary(paired.values(a, lambda t: t.retained_frac))
        ei[f"recovery_s[{a}]"] = summary(paired.values(a, rec))
        ei[f"full_interval_s[{a}]"] = summary(paired.values(a, full))
        ei[f"churn_s[{a}]"] = summary(paired.values(a, lambda t: t.churn_s))
    for a in ("retire_hbm", "retire_dram"):
        ei[f"recovery_speedup[native/{a}]"] = summary(paired.ratios("native", a, rec))
        ei[f"full_interval_speedup[native/{a}]"] = summary(paired.ratios("native", a, full))
    ei["dram_offload_s"] = summary(paired.values("retire_dram", lambda t: t.transition.timings.get("dram_offload")))
    ei["dram_restore_s"] = summary(paired.values("retire_dram", lambda t: t.transition.timings.get("dram_restore")))
    ei["free_blocks_while_held[retire_dram]"] = summary(paired.values("retire_dram",
                                                                      lambda t: t.free_blocks_while_held), nd=0)
    ei["verdicts"] = sorted({t.verdict for r in paired.rounds for t in r.values()})
    ei["native_cold_reasons"] = dict(Counter(str(t.cold_reason) for t in paired.values("native", lambda t: t)))
    # structure, not timing: retire keeps every certified token in every admitted trial, through both tiers
    for a in ("retire_hbm", "retire_dram"):
        assert all(t.retained == t.certified == 4096 for t in paired.values(a, lambda t: t)), a
    assert all(t.pages_intact_after_churn for t in paired.values("retire_hbm", lambda t: t))
    assert all(t.dram_state == "restored" for t in paired.values("retire_dram", lambda t: t))
