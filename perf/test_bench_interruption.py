"""Interruption-to-successor inside a running prefill step (issue #4): retire vs native-prefix vs native-cold, with
the revised prompt's LCP ending BEFORE, INSIDE or AFTER the running step.

Scenario (long model, engine shape long-8k, prefill unit U set at run time): the old prompt is 2U + 256 tokens, so
its prefill runs as steps [0, U), [U, 2U), [2U, 2U + 256). The worker is held at layer 1 of the first step, the hold
is moved to layer 0 of the SECOND step (`LandInStep.next_step`), released, and the revision arrives after a uniformly
drawn fraction of the calibrated step time (the arrival time is the workload, not a synchronisation). The revised
prompt shares `lcp` tokens and adds 256 new ones:
- before: lcp = U/2        (the running chunk [U, 2U) is wholly obsolete: retire cuts it)
- inside: lcp = U + U/2    (half of the running chunk is useful: retire's cost model cuts or finishes)
- after:  lcp = 2U + 128   (the whole running chunk is useful: retire lets it finish, gated)

Metric: interruption-to-successor = SUPERSEDE call -> the successor's first token (`Transition.successor_ttft`).
Native-prefix is what vLLM users run today (abort, then prefix caching reuses what the aborted request wrote); the
claim under test is that retire is never slower than it. Every trial's successor is checked against the oracle
(`retire.trials.Judge`: exact against the mode-matched reference, else the logprob-closeness rule); a rejected trial
is not admitted. Nothing is asserted about timings.
"""
from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import repo_prompt, revise
from oracles import collect
from perf.common import Paired, summary
from retire.barriers import LandInStep, wait_engine
from retire.trials import Judge, reset_prefix_cache

pytestmark = pytest.mark.bench

SP_OLD = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=5)
ARMS = ("native-cold", "native-prefix", "retire")
CASES = ("before", "inside", "after")
ROUNDS = 3


def lcp_for(case: str, unit: int) -> int:
    return {"before": unit // 2, "inside": unit + unit // 2, "after": 2 * unit + 128}[case]


class Trial:
    def __init__(self, **kw):
        self.__dict__.update(kw)


async def _hold_second_step(eng, scope: str, prompt) -> LandInStep:
    await eng.submit(scope, prompt, SP_OLD)
    land = LandInStep(eng, 1)
    await land.__aenter__()
    await land.paused()          # first step, layer 1
    await land.next_step(0)      # second step, layer 0: the step the revision will land in
    return land


async def _calibrate(eng, unit: int) -> float:
    """Duration of the second armed step of `unit` tokens: release at its layer 0 -> the engine's frontier >= 2U."""
    await eng.backend.sched("set_step_tokens", {"tokens": unit})
    scope = f"ical-{unit}"
    land = await _hold_second_step(eng, scope, repo_prompt(2 * unit + 256, seed=unit + 3))
    t0 = time.monotonic()
    await land.__aexit__(None, None, None)
    await wait_engine(eng, scope, frontier=2 * unit)
    dt = time.monotonic() - t0
    await collect(eng, scope)
    return dt


async def _trial(eng, judge: Judge, unit: int, step_s: float, frac: float, prompt, revised, tag: str) -> Trial:
    await reset_prefix_cache(eng)
    scope = f"i-{tag}"
    old = None
    land = await _hold_second_step(eng, scope, prompt)
    try:
        old = asyncio.ensure_future(collect(eng, scope, 0))
    finally:
        await land.__aexit__(None, None, None)
    await asyncio.sleep(frac * step_s)  # the revision's arrival inside the step (workload, not synchronisation)
    tr = await eng.supersede(scope, 0, revised, SP_NEW)
    new = await collect(eng, scope, 1)
    await old
    reused = int(tr.inherited_tokens or 0)
    ok, verdict = await judge.check(eng.policy, revised, SP_NEW, new, reused)
    path = tr.receipts[0].path if tr.receipts else "native-abort"
    return Trial(ok=ok, verdict=verdict, ttft=tr.successor_ttft, fence=tr.fence_latency, reused=reused, path=path,
                 frac=frac, detail=(tr.receipts[0].detail if tr.receipts else {}))


@pytest.mark.parametrize("unit", [2048, 4096])
@pytest.mark.parametrize("case", CASES)
def test_bench_interruption_to_successor_by_lcp(benchmark, facades, pool, unit, case):
    fs, oracle = facades("long-8k", *ARMS)
    run = pool.runner.run
    step_s = run(_calibrate(fs["retire"], unit))
    judge = Judge(oracle, same_shape=unit <= 2048)  # the oracle engine ("long") prefills in 2048-token chunks
    rng = random.Random(unit * 7 + CASES.index(case))
    paired = Paired(ARMS)
    lcp = lcp_for(case, unit)

    def target(i):
        frac = rng.uniform(0.05, 0.9)
        prompt = repo_prompt(2 * unit + 256, seed=900 + 10 * i + CASES.index(case))
        revised = revise(prompt, lcp, lcp + 256, seed=901 + i)
        trials = {}
        for arm in paired.order(i):
            trials[arm] = run(_trial(fs[arm], judge, unit, step_s, frac, prompt, revised, f"{unit}-{case}-{i}-{arm}"))
        paired.add(i, trials)

    try:
        benchmark.pedantic(target, setup=paired.setup, rounds=ROUNDS, iterations=1)
    finally:
        run(fs["retire"].backend.sched("set_step_tokens", {"tokens": None}))
    assert paired.rounds, paired.admission()
    ttft = lambda t: t.ttft
    info = {
        "paper_metric": "interruption-to-successor by LCP position relative to the running step",
        "prefill_unit_tokens": unit, "case": case, "lcp": lcp, "running_step": [unit, 2 * unit],
        "calibrated_step_s": round(step_s, 3),
        "retire_paths": dict(Counter(paired.values("retire", lambda t: t.path))),
        "retire_decisions": [{k: t.detail.get(k) for k in ("cut", "layer", "predicted_successor_ready_cut",
                                                           "predicted_successor_ready_finish")}
                             for t in paired.values("retire", lambda t: t)],
        "landing_fractions": [round(r["retire"].frac, 3) for r in paired.rounds],
        **paired.admission(),
    }
    for a in ARMS:
        info[f"interruption_to_successor_s[{a}]"] = summary(paired.values(a, ttft))
        info[f"fence_latency_s[{a}]"] = summary(paired.values(a, lambda t: t.fence))
        info[f"tokens_reused[{a}]"] = summary(paired.values(a, lambda t: t.reused), nd=0)
    info["speedup[native-prefix/retire]"] = summary(paired.ratios("native-prefix", "retire", ttft), 3)
    info["speedup[native-cold/retire]"] = summary(paired.ratios("native-cold", "retire", ttft), 3)
    benchmark.extra_info.update(info)
    print(f"\n[interruption] unit={unit} {case} lcp={lcp}: "
          + ", ".join(f"{a} {info[f'interruption_to_successor_s[{a}]']['median']}" for a in ARMS)
          + f"; native-prefix/retire {info['speedup[native-prefix/retire]']}; retire paths {info['retire_paths']}")
