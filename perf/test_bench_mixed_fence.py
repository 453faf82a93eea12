"""FENCE inside a MIXED step (issue 14): native (abort applied at the step boundary) vs retire (a safe-point cut of
the whole step, every innocent rolled back and re-run), prefill unit U = 4096, long model.

Scenario per trial: a bystander B of another tenant is running (`decode`: it is decoding and A's (U + 256)-token
prompt starts, so A's first step is A's 4095-token chunk + B's decode token; `prefill`: A's (U + 2000)-token prompt
runs its first U-token step alone while B's 3000-token prompt is admitted, so A's second step is A's 2000-token tail +
B's first 2096, the same two-step landing as `test_safe_points.py::_prefill_bystander`). The worker is held at layer 0
of A's mixed step, released, and the revision arrives after a uniformly drawn fraction of
the calibrated step (the arrival time is the workload, not a synchronisation). The revised prompt shares nothing with
A's, so A's running chunk is wholly obsolete. Retire cuts when the cost model says it pays (path `safe-point`) and
lets the step finish otherwise (`step-boundary:mixed`: with a 2096-token prefill bystander, past about half the step);
both are admitted, with the paths reported.

Metrics (paired per round, medians [min, max]): fence_latency = SUPERSEDE call -> A's last writer closed;
interruption_to_successor = SUPERSEDE call -> the successor's first token. Oracle checks in every trial: A's
successor against clean_run and the bystander's WHOLE output against clean_run (logprob-closeness: the batch
composition differs from the oracle's); a trial is admitted only if both pass, and the bystanders' pass count over
all trials is reported (`bystanders_equal_to_oracle`). Nothing is asserted about timings.
"""
from __future__ import annotations

import asyncio
import os
import random
from collections import Counter

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import name_seed, repo_prompt, revise, tokens
from oracles import collect, compare_logprobs_close
from perf.common import Paired, summary
from perf.test_bench_fence import _calibrate
from retire.barriers import LandInStep, wait_engine

pytestmark = pytest.mark.bench

SP_OLD = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=5)
SP_B = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=5)
ARMS = ("native-cold", "retire")
UNIT = 4096
ROUNDS = int(os.environ.get("RETIRE_FENCE_ROUNDS", "6"))  # paired rounds per bystander kind


class Trial:
    def __init__(self, **kw):
        self.__dict__.update(kw)


async def _trial(eng, oracle, kind: str, step_s: float, frac: float, tag: str, seed: int) -> Trial:
    await eng.backend.sched("set_step_tokens", {"tokens": UNIT})
    # decode: A's first step is A [0, U - 1) + B's decode token; prefill: A's second step is A [U, U + 2000) + B [0, 2096)
    prompt = repo_prompt(UNIT + 256 if kind == "decode" else UNIT + 2000, seed=seed)
    b_prompt = tokens(300 if kind == "decode" else 3000, seed + 1)
    revised = revise(prompt, 0, 700, seed=7)  # nothing shared: A's running chunk is wholly obsolete
    a, b = f"m-{tag}", f"mb-{tag}"
    if kind == "decode":
        await eng.submit(b, b_prompt, SP_B, tenant="B")
        b_task = asyncio.ensure_future(collect(eng, b, 0, "B"))
        await wait_engine(eng, b, out_tokens=2, tenant="B")
    async with LandInStep(eng, 0 if kind == "decode" else 1) as barrier:
        await eng.submit(a, prompt, SP_OLD, tenant="A")
        old = asyncio.ensure_future(collect(eng, a, 0, "A"))
        await barrier.paused()           # decode: A's first (mixed) step is about to run its first layer
        if kind == "prefill":            # A's first U-token step runs alone, held at layer 1; B is queued meanwhile
            await eng.submit(b, b_prompt, SP_B, tenant="B")
            b_task = asyncio.ensure_future(collect(eng, b, 0, "B"))
            await barrier.next_step(0)   # A's second step (A's tail + B's first chunk), before its first layer
    await asyncio.sleep(frac * step_s)   # the revision's arrival inside the step (workload, not synchronisation)
    tr = await eng.supersede(a, 0, revised, SP_NEW, tenant="A")
    new = await collect(eng, a, 1, "A")
    await old
    b_run = await b_task
    v = compare_logprobs_close(subject=new, oracle=await oracle.clean_run(revised, SP_NEW),
                               subject_name=f"{eng.policy} successor", oracle_name="clean_run")
    vb = compare_logprobs_close(subject=b_run, oracle=await oracle.clean_run(b_prompt, SP_B),
                                subject_name=f"{eng.policy} bystander ({kind})", oracle_name="clean_run")
    path = tr.receipts[0].path if tr.receipts else "native-abort"
    detail = tr.receipts[0].detail if tr.receipts else {}
    ok, verdict = v.valid is True and vb.valid is True, f"{v.detail} | {vb.detail}"
    if eng.policy == "retire" and path not in ("safe-point", "step-boundary:mixed"):
        ok, verdict = False, f"path {path}: landed after the armed step's last safe point, not inside the step"
    elif eng.policy == "retire" and not detail.get("innocents"):
        ok, verdict = False, f"path {path} with no innocent in the step: B was not admitted beside A's chunk"
    return Trial(ok=ok, verdict=verdict, fence=tr.fence_latency, ttft=tr.successor_ttft, path=path, frac=frac,
                 bystander_ok=vb.valid is True, innocents=detail.get("innocents"), at=detail.get("at"),
                 decision={k: detail.get(k) for k in ("cut", "progress", "innocent_tokens", "obsolete_remainder",
                                                      "innocent_lost_work", "predicted_successor_ready_cut",
                                                      "predicted_successor_ready_finish")})


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_bench_fence_in_a_mixed_step(benchmark, facades, pool, kind):
    fs, oracle = facades("long-8k", *ARMS)
    run = pool.runner.run
    run(fs["retire"].backend.reset_prefix_cache())  # the calibration prompt is the same for both bystander kinds
    step_s = run(_calibrate(fs["retire"], UNIT))
    rng = random.Random(4096 + len(kind))
    paired = Paired(ARMS)

    def target(i):
        frac = rng.uniform(0.05, 0.9)
        seed = name_seed(f"mixed-{kind}-{i}")
        trials = {}
        for arm in paired.order(i):
            trials[arm] = run(_trial(fs[arm], oracle, kind, step_s, frac, f"{kind}-{i}-{arm}", seed))
        paired.add(i, trials)

    try:
        benchmark.pedantic(target, setup=paired.setup, rounds=ROUNDS, iterations=1)
    finally:
        run(fs["retire"].backend.sched("set_step_tokens", {"tokens": None}))
    assert paired.all, "no round ran"
    every = [t for r in paired.all for t in r.values()]
    info = {
        "paper_metric": "in-step FENCE in a mixed step (one innocent bystander), native vs retire, U = 4096",
        "bystander": kind, "prefill_unit_tokens": UNIT, "calibrated_step_s": round(step_s, 3),
        "bystanders_equal_to_oracle": f"{sum(t.bystander_ok for t in every)}/{len(every)}",
        "retire_paths": dict(Counter(r["retire"].path for r in paired.all)),
        "retire_decisions": [r["retire"].decision for r in paired.all],
        "landing_fractions": [round(r["retire"].frac, 3) for r in paired.all],
        **paired.admission(),
    }
    for a in ARMS:
        info[f"fence_latency_s[{a}]"] = summary(paired.values(a, lambda t: t.fence))
        info[f"interruption_to_successor_s[{a}]"] = summary(paired.values(a, lambda t: t.ttft))
    info["fence_speedup_native_over_retire"] = summary(paired.ratios("native-cold", "retire", lambda t: t.fence), 2)
    info["interruption_to_successor_speedup"] = summary(
        paired.ratios("native-cold", "retire", lambda t: t.ttft), 2)
    benchmark.extra_info.update(info)
    print(f"\n[mixed fence] {kind}: FENCE native/retire {info['fence_speedup_native_over_retire']}, "
          f"bystanders {info['bystanders_equal_to_oracle']}, paths {info['retire_paths']}")
