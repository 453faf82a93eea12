"""FENCE inside a step (issue #4): native (step boundary) vs retire (safe point), by prefill unit.

Landing: the worker is held at the start of the old version's first long step (LandInStep at layer 0), released,
and the revision then arrives after a uniformly drawn fraction of the step's calibrated duration (the arrival time of
the revision is the workload, not a synchronisation). The revised prompt shares nothing with the old one, so the
running chunk is wholly obsolete and retire cuts it (the cost model's other branch is tested in conformance). Metrics (medians and [min, max], paired per round):
- fence_latency: SUPERSEDE call -> last old writer closed (native: the abort applied after the step; retire: the cut).
- interruption_to_successor: SUPERSEDE call -> the successor's first token.
Each trial's (cold) successor is checked against clean_run (logprob-closeness rule); failing trials are not admitted.
"""
from __future__ import annotations

import asyncio
import os
import random
import time

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import name_seed, repo_prompt, revise
from retire.barriers import wait_engine
from oracles import collect, compare_logprobs_close
from perf.common import Paired, summary
from retire.barriers import LandInStep

SP_OLD = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=5)
ARMS = ("native-cold", "retire")
ROUNDS = int(os.environ.get("RETIRE_FENCE_ROUNDS", "0"))  # paired rounds per case (0: 4 below 8K, 5 from 8K)


class Trial:
    def __init__(self, **kw):
        self.__dict__.update(kw)


async def _calibrate(eng, unit: int) -> float:
    """Duration of one armed prefill step of `unit` tokens: from the worker's release at layer 0 to the engine's
    first answer after the step (polls are answered between steps)."""
    await eng.backend.sched("set_step_tokens", {"tokens": unit})
    scope = f"cal-{unit}"
    await eng.submit(scope, repo_prompt(unit + 64, seed=unit + 1), SP_OLD)
    async with LandInStep(eng, 0) as barrier:
        await barrier.paused()
        t0 = time.monotonic()
    await wait_engine(eng, scope, frontier=unit)
    dt = time.monotonic() - t0
    await collect(eng, scope)
    return dt


async def _trial(eng, oracle, unit: int, step_s: float, frac: float, tag: str, seed: int) -> Trial:
    await eng.backend.sched("set_step_tokens", {"tokens": unit})
    prompt = repo_prompt(unit + 256, seed=seed)
    revised = revise(prompt, 0, 700, seed=7)  # nothing shared: the running chunk is wholly obsolete
    scope = f"f-{tag}"
    await eng.submit(scope, prompt, SP_OLD)
    old = asyncio.ensure_future(collect(eng, scope, 0))
    async with LandInStep(eng, 0) as barrier:
        await barrier.paused()           # the first (long) step is about to run its first layer
    await asyncio.sleep(frac * step_s)   # the revision's arrival inside the step (workload, not synchronisation)
    tr = await eng.supersede(scope, 0, revised, SP_NEW)
    new = await collect(eng, scope, 1)
    await old
    ref = await oracle.clean_run(revised, SP_NEW)
    v = compare_logprobs_close(subject=new, oracle=ref, subject_name=f"{eng.policy} successor",
                               oracle_name="clean_run")
    path = tr.receipts[0].path if tr.receipts else "native-abort"
    ok, verdict = v.valid is True, v.detail
    if eng.policy == "retire" and path != "safe-point":  # the revision arrived after the armed step had ended
        ok, verdict = False, f"landed outside the armed step (path {path}); not a revision inside a step"
    at = tr.receipts[0].detail.get("at") if tr.receipts else None
    tier = tr.receipts[0].detail.get("tier") if tr.receipts else None  # retire/density.py: the step's safe points
    return Trial(ok=ok, verdict=verdict, fence=tr.fence_latency, ttft=tr.successor_ttft, path=path, frac=frac, at=at,
                 tier=tier)


def _bench(benchmark, facades, pool, shape: str, unit: int, label: str) -> None:
    fs, oracle = facades(shape, *ARMS)
    run = pool.runner.run
    step_s = run(_calibrate(fs["retire"], unit))
    rng = random.Random(unit)
    paired = Paired(ARMS)
    rounds = ROUNDS or (5 if unit >= 8192 else 4)
    slicing = run(fs["retire"].backend.worker("retire_slicing"))[0]

    def target(i):
        frac = rng.uniform(0.05, 0.9)
        seed = name_seed(f"{shape}-{unit}-{i}")
        trials = {}
        for arm in paired.order(i):
            trials[arm] = run(_trial(fs[arm], oracle, unit, step_s, frac, f"{shape}-{unit}-{i}-{arm}", seed))
        paired.add(i, trials)

    benchmark.pedantic(target, setup=paired.setup, rounds=rounds, iterations=1)
    assert paired.rounds, paired.admission()
    fence = {a: paired.values(a, lambda t: t.fence) for a in ARMS}
    ratios = paired.ratios("native-cold", "retire", lambda t: t.fence)
    ttft_ratio = paired.ratios("native-cold", "retire", lambda t: t.ttft)
    benchmark.extra_info.update({
        "paper_metric": "FENCE latency vs prefill unit (obsolete tail)", "model": label,
        "prefill_unit_tokens": unit, "calibrated_step_s": round(step_s, 3),
        "safe_points": "layer + MLP + attention slices" if slicing.get("verdict", {}).get("exact") and
        unit >= slicing.get("min_tokens", 1 << 30) else "layer + MLP",
        "slicing_verdict": slicing.get("verdict"),
        "retire_cut_at": [r["retire"].at for r in paired.rounds],
        "retire_tier": [r["retire"].tier for r in paired.rounds],
        "fence_latency_native_s": summary(fence["native-cold"]), "fence_latency_retire_s": summary(fence["retire"]),
        "fence_speedup_native_over_retire": summary(ratios, 2),
        "interruption_to_successor_native_s": summary(paired.values("native-cold", lambda t: t.ttft)),
        "interruption_to_successor_retire_s": summary(paired.values("retire", lambda t: t.ttft)),
        "interruption_to_successor_speedup": summary(ttft_ratio, 2),
        "landing_fractions": [round(r["retire"].frac, 3) for r in paired.rounds],
        **paired.admission(),
    })
    print(f"\n[fence] {label} unit={unit}: native {summary(fence['native-cold'])['median']} s, "
          f"retire {summary(fence['retire'])['median']} s, ratio {summary(ratios, 2)}")


@pytest.mark.bench
@pytest.mark.timeout(1800)  # the 16K unit prefills 32K-token prompts on the long model (several s per step)
@pytest.mark.parametrize("unit", [2048, 4096, 8192, 16384])
def test_bench_fence_latency_by_prefill_unit(benchmark, facades, pool, unit):
    _bench(benchmark, facades, pool, "long-16k", unit, "long (512 x 8 layers)")


@pytest.mark.bench
@pytest.mark.timeout(1800)  # 32K-token prompts on the 24-layer model
def test_bench_fence_latency_realistic_depth(benchmark, facades, pool):
    """The same benchmark at 16K on a model of realistic depth (`deep`: 512 x 24 layers)."""
    _bench(benchmark, facades, pool, "deep-16k", 16384, "deep (512 x 24 layers)")
