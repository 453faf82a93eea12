"""Co-tenant cost of supersede bursts (issue #5 item 6): tenant B's decode step time with vs without tenant A's bursts.

Each round runs two arms back to back on one retire facade (order alternating): "quiet" = B's load (CoTenantLoad, 3
live requests, 288-token prompts) alone for a window in which B delivers 48 tokens; "bursts" = the same load while
A (600-token prompt) is superseded 4 times back to back, the window closing once A's last successor decodes.
Figures: B's median inter-token time per arm (frame gap / tokens in the frame, inside the window), the per-pair ratio
bursts/quiet, and the cross-interrupt frame gap (gap between B's consecutive frames spanning a SUPERSEDE call, max and
median over the round). Admission: every B request of the arm passes the logprob-closeness rule against `clean_run`,
and A's bursts publish no obsolete token.
"""
from __future__ import annotations

import statistics
import time

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from oracles import compare_logprobs_close
from perf.common import Paired, summary
from retire.barriers import wait_engine
from retire.faults.load import CoTenantLoad, cross_gaps, inter_token_times

pytestmark = pytest.mark.bench

ARMS = ("quiet", "bursts")
ROUNDS = 5
SP_A = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
now = time.monotonic


class Arm:
    def __init__(self):
        self.itt, self.gaps, self.ok, self.verdict = None, [], None, ""


def test_bench_cotenant_step_time(benchmark, facades, runner):
    fs, oracle = facades("unit", "retire")
    eng = fs["retire"]
    paired = Paired(ARMS)

    async def arm(i: int, name: str) -> Arm:
        res = Arm()
        load = CoTenantLoad("B", rate=6.0, prompt_len=288, max_tokens=96, max_live=3, seed=3000 + 10 * i)
        instants = []
        before = eng.stats()["obsolete_tokens_published"]
        async with load.on(eng):
            await load.running()
            t0 = now()
            if name == "quiet":
                await load.produced(load.produced_tokens + 48)
            else:
                scope, cur = f"a{i}", tokens(600, 4000 + i)
                await eng.submit(scope, cur, SP_A, tenant="A")
                await wait_engine(eng, scope, out_tokens=1, tenant="A")
                for k in range(4):
                    cur = revise(cur, 320 + 32 * k, 560, 4000 + 10 * i + k)
                    instants.append(now())
                    await eng.supersede(scope, k, cur, SP_A, tenant="A")
                await wait_engine(eng, scope, out_tokens=1, tenant="A")
            window = (t0, now())
        res.itt = statistics.median(inter_token_times(load.runs, inside=[window]) or [float("nan")])
        res.gaps = cross_gaps(load.runs, instants)
        bad = []
        for lr in load.runs:
            v = compare_logprobs_close(subject=lr.run, oracle=await oracle.clean_run(lr.prompt, load._params()),
                                       subject_name=f"B/{lr.scope}", oracle_name="clean_run")
            if not v:
                bad.append(v.detail)
        obsolete = eng.stats()["obsolete_tokens_published"] - before
        res.ok = not bad and obsolete == 0
        res.verdict = "ok" if res.ok else f"{bad[:1]} obsolete={obsolete}"
        return res

    async def one_round(i: int):
        paired.add(i, {a: await arm(i, a) for a in paired.order(i)})

    benchmark.pedantic(lambda i: runner.run(one_round(i)), setup=paired.setup, rounds=ROUNDS, iterations=1)

    assert paired.rounds, f"every round was rejected: {paired.rejections}"
    itt = lambda t: t.itt
    gaps = [g for r in paired.rounds for g in r["bursts"].gaps]
    benchmark.extra_info.update({"scenario": "unit; B = 3 live 288-token requests decoding; A superseded 4x per burst",
                                 "model": "unit", **paired.admission()})
    for a in ARMS:
        benchmark.extra_info[f"b_inter_token_s[{a}]"] = summary(paired.values(a, itt), nd=5)
    benchmark.extra_info["b_step_time_ratio[bursts/quiet]"] = summary(paired.ratios("bursts", "quiet", itt))
    benchmark.extra_info["cross_interrupt_frame_gap_s[bursts]"] = summary(gaps, nd=5)
