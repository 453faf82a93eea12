"""The native peer over HTTP, measured for real: `retire serve` (revise = SUPERSEDE) against stock vLLM's OpenAI
server (`python -m vllm.entrypoints.openai.api_server`, revise = cancel the HTTP stream + send a new request), same
model, same execution shape, same schedule, same prompts (`conformance/fixtures/http_agents.py`).

Benchmarks (marker `bench`; `make serve-bench`), each in paired rounds (both arms once per round, order alternating):
- load: 64 agent scopes, Poisson revisions at random moments (0.3 per scope per second for 20 s), unit model;
  requests/s and p50/p99 successor TTFT per arm.
- head-of-line: one agent revises a long prompt 10 times, 0.5 s apart (10 versions cancelled mid-prefill), then
  the successor; the `long` model in one 8192-token prefill step per prompt (shape `long-8k`), zero prefix overlap.
- replay: the shipped densest-window trace (`conformance/fixtures/trace_paper_window.jsonl`), the replay driver's
  schedule (`retire.traces.driver.plan`), unit model, 10x compression.
Per arm: obsolete tokens received (client); work computed for revoked versions, from vLLM's own per-iteration log
(`--enable-logging-iteration-details`, engine-side: vLLM's Prometheus counters are kept by the frontend, which drops
the outputs of requests it already aborted): decode tokens computed but never delivered (load, replay), and for
head-of-line every engine step before the successor's prefill; successor TTFT (all successors, and final successors
only, which every one reaches); goodput. Every stream that delivered tokens is checked against a clean oracle run inside its trial; a trial with a
failure is not admitted. Figures go to `benchmark.extra_info`; no timing is asserted.
"""
from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path

import httpx
import pytest

from conformance.fixtures.http_agents import Agents, judge_all
from conformance.fixtures.prompts import revise, tokens
from conformance.fixtures.serve_checks import stream_endings
from conformance.fixtures.servers import ServerProcess, metric
from perf.common import Paired, summary
from retire.traces import read_trace_jsonl
from retire.traces.driver import Workload, plan, poisson_arrivals, prompt_chain, trace_arrivals

pytestmark = pytest.mark.bench
ARMS = ("retire", "stock")
TRACE = Path(__file__).resolve().parent.parent / "conformance" / "fixtures" / "trace_paper_window.jsonl"
LOAD = Workload(prompt_len=256, decode_tokens=64, shared_fraction=0.9, time_scale=1.0, lead_s=1.0)
HOL = Workload(prompt_len=8192, decode_tokens=16, shared_fraction=0.0, time_scale=1.0, lead_s=0.5)
REPLAY = Workload(prompt_len=384, decode_tokens=96, shared_fraction=0.9, time_scale=10.0, lead_s=2.0)


ITER = re.compile(r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, (\d+) generation requests, "
                  r"(\d+) generation tokens, iteration elapsed time: ([\d.]+) ms")
LOG_FLAGS = ["--enable-logging-iteration-details"]


@contextlib.contextmanager
def servers(shape: str, **override):
    """Both arms' servers, booting in parallel, logging every engine iteration (vLLM's own log: scheduled context
    and generation tokens, elapsed time); stopped (process groups killed) at exit."""
    procs = {"retire": ServerProcess("retire", shape, shape_override=override, extra=LOG_FLAGS),
             "stock": ServerProcess("stock", shape, shape_override=override, extra=LOG_FLAGS)}
    try:
        for p in procs.values():
            p.wait_ready()
        yield procs
    finally:
        for p in procs.values():
            p.stop(timeout=15)


def iterations(proc, start: int) -> list[tuple]:
    """vLLM's iteration log lines of `proc` since line `start`: (context requests, context tokens, generation
    requests, generation tokens, elapsed s). Waits (bounded) until the log is quiet: the lines are printed before
    the tokens they describe reach a client, the pipe only lags."""
    last = -1
    t_end = time.monotonic() + 10
    while len(proc.lines) != last and time.monotonic() < t_end:
        last = len(proc.lines)
        time.sleep(0.3)  # observation of another process's output, bounded; not a synchronization point
    out = []
    for line in proc.lines[start:]:
        m = ITER.search(line)
        if m:
            a = [int(x) for x in m.groups()[1:5]]
            out.append((*a, float(m.group(6)) / 1e3))
    return out


class Trial:
    def __init__(self, run, ok: bool, detail: list, iters: list):
        self.run, self.ok, self.iters = run, ok, iters
        self.m = run.metrics()
        eng_gen = sum(it[3] for it in iters)
        self.m.update(engine_iterations=len(iters), engine_prompt_tokens=sum(it[1] for it in iters),
                      engine_generation_tokens=eng_gen, engine_busy_s=sum(it[4] for it in iters),
                      # decode tokens computed (a stream's first token comes from its prefill step) minus delivered
                      computed_not_delivered=eng_gen - (self.m["tokens_received"] - self.m["first_tokens"]))
        self.verdict = "; ".join(detail[:3]) or "all streams matched their oracle"


def _prompts(w: Workload, seed: int):
    return prompt_chain(lambda i: tokens(w.prompt_len, seed + 97 * i), revise, w.prompt_len, w.shared_fraction, seed)


def _round(runner, procs, paired, i, plans, w, oracle, seed):
    prompts, cache, trials = _prompts(w, seed), {}, {}
    for arm in paired.order(i):
        n0 = len(procs[arm].lines)
        run = runner.run(Agents(procs[arm].url, arm, label=f"r{i}.", decode_tokens=w.decode_tokens)
                         .run(plans, prompts), timeout=1800)
        ok, bad = runner.run(judge_all(run, oracle, w.decode_tokens, cache), timeout=1800)
        ends = stream_endings(transcripts=[v for v in run.versions if not v.cancelled and v.status == 200])
        if not ends.valid:
            ok, bad = False, bad + [ends.detail]
        if run.metrics()["failed_requests"]:
            ok, bad = False, bad + ["failed requests"]
        trials[arm] = Trial(run, ok, bad, iterations(procs[arm], n0))
    if "retire" in procs:
        with httpx.Client(base_url=procs["retire"].url, timeout=120) as c:
            a = c.get("/retire/audit")
            if a.status_code != 200:
                trials["retire"].ok, trials["retire"].verdict = False, f"audit: {a.text[:300]}"
    paired.add(i, trials)


def _report(benchmark, paired: Paired, names: dict, scenario: str):
    assert paired.rounds, f"every round was rejected: {paired.rejections}"
    ei = benchmark.extra_info
    ei.update({"scenario": scenario, "arms": {"retire": "retire serve, SUPERSEDE",
                                              "stock": "vllm.entrypoints.openai.api_server, cancel + resubmit"},
               **paired.admission()})
    for name, key in names.items():
        for a in ARMS:
            ei[f"{name}[{a}]"] = summary(paired.values(a, lambda t, k=key: t.m[k]))
        ei[f"{name}_ratio[stock/retire]"] = summary(paired.ratios("stock", "retire", lambda t, k=key: t.m[k]))
    return ei


LOAD_NAMES = {"requests_per_s": "requests_per_s", "successor_ttft_p50_s": "successor_ttft_p50_s",
              "successor_ttft_p99_s": "successor_ttft_p99_s",
              "final_successor_ttft_p50_s": "final_successor_ttft_p50_s",
              "final_successor_ttft_p99_s": "final_successor_ttft_p99_s", "goodput_tokens_per_second": "goodput_tok_s",
              "obsolete_tokens_received": "obsolete_tokens_received",
              "computed_not_delivered_tokens": "computed_not_delivered", "horizon_s": "horizon_s",
              "versions": "versions", "successors": "successors", "revision_lag_max_s": "revision_lag_max_s",
              "revision_lag_median_s": "revision_lag_median_s"}


@pytest.mark.timeout(3600)
def test_bench_http_load_64_scopes(benchmark, runner, pool):
    rounds = 2
    paired = Paired(ARMS)
    oracle = pool.oracle("unit")
    with servers("unit", max_num_seqs=64) as procs:
        def one(i):
            plans = plan(poisson_arrivals(0.3, 64, 20.0, seed=100 + i), LOAD, scopes=[f"s{k}" for k in range(64)])
            _round(runner, procs, paired, i, plans, LOAD, oracle, 5000 + 100 * i)
        benchmark.pedantic(one, setup=paired.setup, rounds=rounds, iterations=1)
    ei = _report(benchmark, paired, LOAD_NAMES, "64 agent scopes, Poisson revisions 0.3/scope/s for 20 s, 256-token "
                                                "prompts sharing 90% per revision, 64-token greedy decode, unit model, "
                                                "max_num_seqs 64")
    ei["paper_metric"] = "HTTP load: requests/s, p50/p99 successor TTFT, retire serve vs stock vLLM"


@pytest.mark.timeout(3600)
def test_bench_http_head_of_line(benchmark, runner, pool):
    rounds = 3
    paired = Paired(ARMS)
    oracle = pool.oracle("long-8k")
    arrivals = [(0.5 * k, "hol") for k in range(1, 11)]
    plans = plan(arrivals, HOL)
    with servers("long-8k") as procs:
        def one(i):
            _round(runner, procs, paired, i, plans, HOL, oracle, 7000 + 100 * i)
            for arm, t in paired.all[-1].items():  # the same successor prompt alone on an idle server
                t.m.update(_hol_metrics(t), alone_ttft_s=_alone_ttft(procs[arm], t.run.finals[0].prompt))
                t.m["hol_penalty"] = t.m["final_ttft_median_s"] / t.m["alone_ttft_s"]
        benchmark.pedantic(one, setup=paired.setup, rounds=rounds, iterations=1)
    names = {"successor_ttft_s": "final_ttft_median_s", "alone_ttft_s": "alone_ttft_s",
             "hol_penalty_successor_over_alone": "hol_penalty",
             "obsolete_prefill_tokens_scheduled": "obsolete_prefill_tokens",
             "obsolete_engine_s": "obsolete_engine_s", "obsolete_tokens_computed_est": "obsolete_tokens_est",
             "obsolete_decode_tokens": "obsolete_decode_tokens",
             "obsolete_tokens_received": "obsolete_tokens_received",
             "goodput_tokens_per_second": "final_goodput_tok_s", "horizon_s": "horizon_s",
             "revision_lag_max_s": "revision_lag_max_s"}
    ei = _report(benchmark, paired, names, "10 versions of an 8192-token prompt, each revised 0.5 s after the "
                                           "previous revision (zero overlap), then the successor; long model, one "
                                           "8192-token prefill step per prompt (long-8k)")
    ei["paper_metric"] = "head-of-line blocking after N cancelled long prefills (54.66 s reported on stock vLLM)"
    ei["obsolete_work_source"] = (
        "vLLM's iteration log (--enable-logging-iteration-details): every engine step before the successor's prefill "
        "step ran revoked versions only; tokens_est = sum of a step's context tokens x min(1, its time / the "
        "successor's full prefill step time) (a step cut at a safe point computed part of its tokens)")


def _hol_metrics(t) -> dict:
    """Engine work on revoked versions, from vLLM's own iteration log: every step before the successor's prefill
    step (the last step with context tokens)."""
    it = t.iters
    k = max(i for i, x in enumerate(it) if x[1] > 0)
    full = it[k][4]
    before = it[:k]
    vs = t.run.versions
    return {"obsolete_prefill_tokens": sum(x[1] for x in before), "obsolete_decode_tokens": sum(x[3] for x in before),
            "obsolete_engine_s": sum(x[4] for x in before),
            "obsolete_tokens_est": sum(x[1] * min(1.0, x[4] / full) + x[3] for x in before),
            "successor_prefill_step_s": full,
            "revision_lag_max_s": max(v.t_call - (t.run.t0 + v.t_plan) for v in vs)}  # (also in metrics())


def _alone_ttft(proc, prompt: list) -> float:
    """TTFT of `prompt` alone (a fresh cache namespace: no prefix hit), streamed, client clock."""
    from conformance.fixtures.http import completion_body, stream

    with httpx.Client(base_url=proc.url, timeout=600) as c:
        t0 = time.monotonic()
        tr = stream(c, "/v1/completions", completion_body(prompt, 2, logprobs=None, stream=True,
                                                          cache_salt=f"alone-{time.monotonic_ns()}"))
        return tr.t_first_token - t0


@pytest.mark.timeout(3600)
def test_bench_http_trace_replay(benchmark, runner, pool):
    rounds = 3
    paired = Paired(ARMS)
    oracle = pool.oracle("unit")
    plans = plan(trace_arrivals(read_trace_jsonl(TRACE)), REPLAY)
    with servers("unit") as procs:
        def one(i):
            _round(runner, procs, paired, i, plans, REPLAY, oracle, 9000 + 100 * i)
        benchmark.pedantic(one, setup=paired.setup, rounds=rounds, iterations=1)
    names = {"obsolete_tokens_received": "obsolete_tokens_received",
             "computed_not_delivered_tokens": "computed_not_delivered",
             "final_ttft_s": "final_ttft_median_s", "successor_ttft_p50_s": "successor_ttft_p50_s",
             "goodput_tokens_per_second": "goodput_tok_s", "final_goodput_tokens_per_second": "final_goodput_tok_s",
             "horizon_s": "horizon_s", "revision_lag_max_s": "revision_lag_max_s",
             "revision_lag_median_s": "revision_lag_median_s"}
    ei = _report(benchmark, paired, names, f"{TRACE.name} ({len(plans)} versions), 10x compression, 384-token "
                                           "prompts sharing 90%, 96-token decode, unit model, eager consumers")
    ei["paper_metric"] = "Table 9 over HTTP: recorded-burst replay, retire serve vs stock vLLM"
