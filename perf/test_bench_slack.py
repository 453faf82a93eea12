"""Revision slack on the Gemma3-shaped `hybrid` model (sliding window 128 + full attention; issue 14 section 6).

`test_bench_slack_lcp[behind]`: a predecessor (1,800-token prompt, decoding) is revised with an LCP `behind` tokens
behind its frontier (0.5, 1, 2, 4 windows). Three arms per round, on one engine, arm order rotating: `retire+slack`
(submitted with `Contract(slack=True)`), `retire` (no slack: ALIGN goes cold, "sliding window") and `native-prefix`
(abort + resubmit; vLLM's hybrid prefix cache may still hold dropped sliding blocks that were not reallocated).
Every successor is judged against its oracle inside the trial. Recorded: inherited tokens and successor TTFT per arm,
per-pair TTFT ratios against retire+slack, and the memory the slack holds at the SUPERSEDE: the kept blocks and their
KV bytes (the scheduler's `slack` query: blocks x vLLM's page size x layers of the group), and vLLM's own free-block
count in the retire+slack arm minus the retire arm at the same moment (the barrier before the call).

`test_bench_slack_no_revision_cost`: plain requests (1,800-token prompt + 128-token decode, no revision), submit ->
last frame, retire with `Contract(slack=True)` vs retire without, paired, 16 pairs; ratio median and bootstrap CI.
No timing is asserted.
"""
from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections import Counter

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from oracles import compare_tokens
from oracles.runs import collect
from perf.common import Paired, bootstrap_ci, summary
from retire import Contract
from retire.barriers import wait_engine
from retire.trials import Judge, Trial, reset_prefix_cache

pytestmark = pytest.mark.bench

WINDOW, P = 128, 1800
ARMS = ("retire+slack", "retire", "native-prefix")
ROUNDS = int(os.environ.get("RETIRE_SLACK_ROUNDS", "4"))
GREEDY = dict(temperature=0, ignore_eos=True)
SP_OLD = SamplingParams(max_tokens=64, **GREEDY)
SP_NEW = SamplingParams(max_tokens=16, logprobs=5, **GREEDY)


async def slack_trial(eng, scope, prompt, behind: int, seed: int, contract) -> Trial:
    """Submit, wait until the predecessor decodes (its window's blocks dropped), SUPERSEDE with an LCP `behind`
    tokens behind the frontier the barrier saw, collect both versions."""
    await reset_prefix_cache(eng)
    await eng.submit(scope, prompt, SP_OLD, contract=contract)
    old_task = asyncio.ensure_future(collect(eng, scope, 0))
    st = await wait_engine(eng, scope, out_tokens=2, epoch=0)
    stats = await eng.backend.sched("stats")
    slack = await eng.backend.sched("slack")
    lcp = min(len(prompt), st["frontier"] - behind)
    revised = revise(prompt, lcp, lcp + 60, seed)
    tr = await eng.supersede(scope, 0, revised, SP_NEW)
    new = await collect(eng, scope, 1)
    old = await old_task
    t = Trial(eng.policy, scope, 0, tr.successor_ttft, int(tr.inherited_tokens or 0), tr.fence_latency, 0.0,
              int(st["frontier"]), old, new, tr)
    t.revised, t.free_blocks = revised, stats["free_blocks"]
    held = [r for rid, r in slack["requests"].items() if rid == eng.internal_id(scope, 0)]
    t.slack_blocks = held[0]["blocks"] if held else 0
    t.slack_bytes = held[0]["bytes"] if held else 0
    return t


@pytest.mark.parametrize("windows", [0.5, 1, 2, 4])
def test_bench_slack_lcp(benchmark, facades, runner, windows):
    behind = int(windows * WINDOW)
    fs, oracle = facades("hybrid", "retire", "native-prefix")
    arm_eng = {"retire+slack": (fs["retire"], Contract(slack=True)), "retire": (fs["retire"], None),
               "native-prefix": (fs["native-prefix"], None)}
    judge = Judge(oracle)
    paired = Paired(ARMS)

    async def one_round(i: int):
        prompt = tokens(P, 1400 + i)
        res = {}
        for arm in paired.order(i):
            eng, contract = arm_eng[arm]
            t = await slack_trial(eng, f"sl{behind}-{i}-{arm}", prompt, behind, 1400 + i, contract)
            t.ok, t.verdict = await judge.check(arm.split("+")[0], t.revised, SP_NEW, t.new, t.reused)
            res[arm] = t
        paired.add(i, res)

    benchmark.pedantic(lambda i: runner.run(one_round(i)), setup=paired.setup, rounds=ROUNDS, iterations=1)

    assert paired.rounds, f"every round was rejected by its oracle: {paired.rejections}"
    ttft = lambda t: t.ttft
    ei = benchmark.extra_info
    ei.update({"scenario": f"revision {windows} windows ({behind} tokens) behind the frontier of a decoding "
                           f"predecessor, {P}-token prompt", "model": "hybrid (Gemma3-shaped, window 128)",
               "lcp_windows_behind": windows, **paired.admission()})
    for a in ARMS:
        ei[f"successor_ttft_s[{a}]"] = summary(paired.values(a, ttft))
        ei[f"inherited_tokens[{a}]"] = summary(paired.values(a, lambda t: t.reused), nd=0)
        ei[f"cold_reasons[{a}]"] = dict(Counter(str(t.transition.cold_reason)[:40] for t in paired.values(a, lambda
                                                                                                           t: t)))
    ei["distance_behind_frontier[retire+slack]"] = summary(paired.values(
        "retire+slack", lambda t: t.transition.certificate.frontier - t.transition.certificate.lcp
        if t.transition.certificate else None), nd=0)
    ei["slack_blocks_held[retire+slack]"] = summary(paired.values("retire+slack", lambda t: t.slack_blocks), nd=0)
    ei["slack_bytes_held[retire+slack]"] = summary(paired.values("retire+slack", lambda t: t.slack_bytes), nd=0)
    ei["free_blocks_below_retire[retire+slack]"] = summary(
        [r["retire"].free_blocks - r["retire+slack"].free_blocks for r in paired.rounds], nd=0)
    for a in ("retire", "native-prefix"):
        ei[f"ttft_speedup[{a}/retire+slack]"] = summary(paired.ratios(a, "retire+slack", ttft))
    ei["verdicts"] = sorted({t.verdict for r in paired.rounds for t in r.values()})
    print(f"\n[slack {windows}w] " + " ".join(f"{k}={v}" for k, v in ei.items() if k != "rejections"))
    assert all(t.reused > 0 for t in paired.values("retire+slack", lambda t: t))


NR_PAIRS = int(os.environ.get("RETIRE_SLACK_PAIRS", "16"))


def test_bench_slack_no_revision_cost(benchmark, facades, runner):
    fs, oracle = facades("hybrid", "retire")
    eng = fs["retire"]
    arms = ("retire+slack", "retire")
    contract = {"retire+slack": Contract(slack=True), "retire": None}
    paired = Paired(arms)
    sp = SamplingParams(max_tokens=128, **GREEDY)

    class Plain:
        def __init__(self, run, seconds):
            self.run, self.seconds, self.ok, self.verdict = run, seconds, None, ""

    async def plain(arm, scope, prompt):
        await reset_prefix_cache(eng)
        t0 = time.monotonic()
        await eng.submit(scope, prompt, sp, contract=contract[arm])
        run = await collect(eng, scope)
        return Plain(run, time.monotonic() - t0)

    async def one_round(i: int, record: bool = True):
        prompt = tokens(P, 1500 + i)
        ref = await oracle.clean_run(prompt, sp)
        res = {}
        for arm in paired.order(i):
            r = await plain(arm, f"nr{i}-{arm}", prompt)
            v = compare_tokens(subject=r.run, oracle=ref, subject_name=arm, oracle_name="clean_run")
            r.ok, r.verdict = bool(v), v.detail
            res[arm] = r
        if record:
            paired.add(i, res)

    runner.run(one_round(-1, record=False))  # untimed warm-up pair
    benchmark.pedantic(lambda i: runner.run(one_round(i)), setup=paired.setup, rounds=NR_PAIRS, iterations=1)

    assert paired.rounds, f"every round was rejected by its oracle: {paired.rejections}"
    secs = lambda r: r.seconds
    ratios = paired.ratios("retire+slack", "retire", secs)
    ci = bootstrap_ci(ratios, n=2000, seed=0)
    ei = benchmark.extra_info
    ei.update({"scenario": f"no revision: {P}-token prompt + 128-token decode, submit -> last frame, one engine",
               "model": "hybrid (Gemma3-shaped, window 128)", **paired.admission()})
    for a in arms:
        ei[f"request_latency_s[{a}]"] = summary(paired.values(a, secs))
    ei["cost_ratio[retire+slack/retire]"] = {
        **summary(ratios), "overhead_pct_median": round((statistics.median(ratios) - 1) * 100, 2),
        "bootstrap_ci95_of_median": [round(x, 4) for x in ci] if ci else None,
        "bootstrap": "percentile, 2000 resamples, numpy default_rng(0)"}
    print(f"\n[slack no-revision] " + " ".join(f"{k}={v}" for k, v in ei.items() if k != "rejections"))
