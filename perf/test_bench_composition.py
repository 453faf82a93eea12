"""Composition (paper Table 5) and inheritance (paper §7, "≥ 40×") benchmarks.

Composition: the `long` model on the long-8k engine shape with a prefill unit of 4096 (set at run time), an 8192-token
repository prompt, a revision sharing 90% of it (lcp 7372), landing inside the FIRST prefill step at decoder layer 2,
4 or 6 of 8 (early / middle / late; `LandInStep` holds the worker there, so the landing point is exact). Arms, all
sibling facades of one engine, one round each per landing:
- native-cold:     abort, successor recomputes everything (no prefix reuse);
- native-prefix:   abort, vLLM's prefix cache reuses what the aborted request wrote (what vLLM users run today);
- invalidate-only: retire with inheritance forbidden (`Contract(inherit=False)`): fences at once, successor cold;
- inherit-only:    retire with in-step safe points off: FENCE at the step boundary, certified handoff;
- combined:        retire (safe points + certified handoff).
Plus the bound: the same successor with its certified prefix already resident (computed beforehand) and no
predecessor running, i.e. the suffix-only physical limit. Metric: successor TTFT (SUPERSEDE call -> first token).

Inheritance: a predecessor whose 4096-token prompt is fully computed (it is decoding) is superseded by the same 4096
tokens plus a 32-token suffix. Cold (native-cold) vs certified inheritance (retire). Successor TTFT, paired.

Every successor is checked against its oracle inside the trial (`retire.trials.Judge`); a rejected trial is not
admitted. Nothing is asserted about timings.
"""
from __future__ import annotations

import asyncio
import time

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import repo_prompt, revise
from oracles import collect
from perf.common import Paired, summary
from retire import Contract
from retire.barriers import LandInStep
from retire.trials import Judge, reset_prefix_cache, revision_trial

pytestmark = pytest.mark.bench

GREEDY = dict(temperature=0, ignore_eos=True)
SP_OLD = SamplingParams(max_tokens=2, **GREEDY)
SP_NEW = SamplingParams(max_tokens=4, logprobs=5, **GREEDY)
UNIT = 4096
PROMPT = 8192
LCP = int(0.9 * PROMPT)
LAYERS = (2, 4, 6)
ARMS = ("native-cold", "native-prefix", "invalidate-only", "inherit-only", "combined", "bound")
POLICY = {"native-cold": "native-cold", "native-prefix": "native-prefix", "invalidate-only": "retire",
          "inherit-only": "retire", "combined": "retire", "bound": "native-prefix"}


class Trial:
    def __init__(self, **kw):
        self.__dict__.update(kw)


async def _landed_trial(eng, arm: str, judge: Judge, prompt, revised, layer: int, tag: str) -> Trial:
    """Submit, hold the worker at `layer` of the first (4096-token) step, issue SUPERSEDE, release, follow."""
    await reset_prefix_cache(eng)
    contract = Contract(inherit=False) if arm == "invalidate-only" else Contract()
    eng.seams.safe_points = arm != "inherit-only"
    scope = f"c-{tag}"
    try:
        await eng.submit(scope, prompt, SP_OLD)
        old_id = eng.internal_id(scope, 0)
        old = asyncio.ensure_future(collect(eng, scope, 0))
        async with LandInStep(eng, layer) as land:
            await land.paused()
            task = asyncio.ensure_future(eng.supersede(scope, 0, revised, SP_NEW, contract=contract))
            if eng.policy == "retire" and eng.seams.safe_points:
                await land.posted(old_id)     # the revocation is visible to the worker before it moves on
            else:
                await asyncio.sleep(0)        # let the call start (t_call recorded); the abort lands after the step
        tr = await task
        new = await collect(eng, scope, 1)
        await old
    finally:
        eng.seams.safe_points = True
    reused = int(tr.inherited_tokens or 0)
    ok, verdict = await judge.check(eng.policy, revised, SP_NEW, new, reused)
    return Trial(ok=ok, verdict=verdict, ttft=tr.successor_ttft, reused=reused, fence=tr.fence_latency,
                 path=(tr.receipts[0].path if tr.receipts else "native-abort"), cold_reason=tr.cold_reason)


async def _bound_trial(eng, judge: Judge, revised, certified: int, tag: str) -> Trial:
    """The suffix-only limit: `revised[:certified]` computed beforehand, no predecessor; time the successor alone."""
    await reset_prefix_cache(eng)
    if certified:
        await eng.submit(f"b0-{tag}", revised[:certified], SamplingParams(max_tokens=1, **GREEDY))
        await collect(eng, f"b0-{tag}")
    scope = f"b-{tag}"
    t0 = time.monotonic()
    await eng.submit(scope, revised, SP_NEW)
    new = await collect(eng, scope)
    ttft = new.timings["first_frame"] + (time.monotonic() - t0 - new.timings["total"])
    ok, verdict = await judge.check("native-prefix", revised, SP_NEW, new, certified)
    return Trial(ok=ok, verdict=verdict, ttft=ttft, reused=certified, fence=None, path="-", cold_reason=None)


def test_bench_composition_table5(benchmark, facades, pool):
    policies = sorted(set(POLICY.values()))
    base, oracle = facades("long-8k", *policies)
    fs = {arm: base[POLICY[arm]] if arm in ("native-cold", "native-prefix", "bound") else base["retire"]
          for arm in ARMS}
    run = pool.runner.run
    judge = Judge(oracle, same_shape=False)  # 4096-token steps; the oracle engine ("long") prefills in 2048s
    paired = Paired(ARMS)
    run(fs["combined"].backend.sched("set_step_tokens", {"tokens": UNIT}))
    prompt = repo_prompt(PROMPT, seed=5150)
    revised = revise(prompt, LCP, PROMPT, seed=5151)

    def target(i):
        layer = LAYERS[i % len(LAYERS)]
        trials = {}
        for arm in paired.order(i):
            if arm == "bound":
                continue
            trials[arm] = run(_landed_trial(fs[arm], arm, judge, prompt, revised, layer, f"{i}-{arm}"))
        trials["bound"] = run(_bound_trial(fs["bound"], judge, revised, trials["combined"].reused, f"{i}"))
        for t in trials.values():
            t.layer = layer
        paired.add(i, trials)

    try:
        benchmark.pedantic(target, setup=paired.setup, rounds=2 * len(LAYERS), iterations=1)
    finally:
        run(fs["combined"].backend.sched("set_step_tokens", {"tokens": None}))
    assert paired.rounds, paired.admission()
    ttft = lambda t: t.ttft
    info = {"paper_metric": "Table 5: composition of invalidation and inheritance", "model": "long",
            "prompt_tokens": PROMPT, "prefill_unit": UNIT, "lcp": LCP, "landing_layers_of_8": list(LAYERS),
            **paired.admission()}
    for a in ARMS:
        info[f"successor_ttft_s[{a}]"] = summary(paired.values(a, ttft))
        info[f"tokens_reused[{a}]"] = summary(paired.values(a, lambda t: t.reused), nd=0)
    for a in ARMS[:-1]:
        if a != "combined":
            info[f"speedup[{a}/combined]"] = summary(paired.ratios(a, "combined", ttft), 3)
    info["distance_to_bound[combined/bound]"] = summary(paired.ratios("combined", "bound", ttft), 3)
    info["fence_path[combined]"] = sorted({t.path for t in paired.values("combined", lambda t: t)})
    info["fence_path[inherit-only]"] = sorted({t.path for t in paired.values("inherit-only", lambda t: t)})
    info["cold_reason[invalidate-only]"] = sorted({str(t.cold_reason) for t in paired.values("invalidate-only",
                                                                                            lambda t: t)})
    benchmark.extra_info.update(info)
    print("\n[composition] " + ", ".join(f"{a} {info[f'successor_ttft_s[{a}]']['median']}" for a in ARMS)
          + f"; native-cold/combined {info['speedup[native-cold/combined]']['median']}"
          + f"; native-prefix/combined {info['speedup[native-prefix/combined]']['median']}"
          + f"; combined/bound {info['distance_to_bound[combined/bound]']['median']}")
    assert all(t.reused == 0 for t in paired.values("invalidate-only", lambda t: t))
    assert all(t.reused == 0 for t in paired.values("native-cold", lambda t: t))


INH_ARMS = ("native-cold", "retire")


def test_bench_inheritance_4k_prefix(benchmark, facades, pool):
    fs, oracle = facades("long", *INH_ARMS)
    run = pool.runner.run
    judge = Judge(oracle)
    paired = Paired(INH_ARMS)
    sp_old = SamplingParams(max_tokens=64, **GREEDY)
    sp_new = SamplingParams(max_tokens=4, logprobs=5, **GREEDY)

    async def one_round(i: int):
        prompt = repo_prompt(4096, seed=6100 + i)
        revised = revise(prompt + [5] * 8, 4096, 4096 + 32, seed=6100 + i)
        res = {}
        for arm in paired.order(i):
            t = await revision_trial(fs[arm], f"inh{i}", prompt, revised, sp_old, sp_new, after_tokens=2)
            t.ok, t.verdict = await judge.check(arm, revised, sp_new, t.new, t.reused)
            res[arm] = t
        paired.add(i, res)

    benchmark.pedantic(lambda i: run(one_round(i)), setup=paired.setup, rounds=8, iterations=1)
    assert paired.rounds, paired.admission()
    ttft = lambda t: t.ttft
    info = {"paper_metric": "inheritance: successor TTFT cold vs certified ~4K prefix, 32-token suffix",
            "model": "long", **paired.admission()}
    for a in INH_ARMS:
        info[f"successor_ttft_s[{a}]"] = summary(paired.values(a, ttft))
        info[f"tokens_reused[{a}]"] = summary(paired.values(a, lambda t: t.reused), nd=0)
    info["speedup[native-cold/retire]"] = summary(paired.ratios("native-cold", "retire", ttft), 2)
    benchmark.extra_info.update(info)
    print(f"\n[inheritance] cold {info['successor_ttft_s[native-cold]']['median']} s, retire "
          f"{info['successor_ttft_s[retire]']['median']} s, speedup {info['speedup[native-cold/retire]']}")
    assert all(t.reused == 4096 for t in paired.values("retire", lambda t: t))
