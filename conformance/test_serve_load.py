"""64 agent scopes revising at random moments over HTTP, for a bounded time (marker `slow`; `make serve-test-slow`).

Schedule: Poisson revision arrivals per scope (`retire.traces.driver.poisson_arrivals` + `plan`), each scope a
stream of 64 greedy tokens on a 256-token prompt, each revision a streamed SUPERSEDE sharing 90% of the prompt.
Checks (all from the clients' side, plus the server's own audit): every request answered 200; every stream ended
exactly once (stop / length / superseded) then [DONE], with no token after its end; every stream's tokens are its
own prompt's (each compared with a clean oracle run: a stream mixed with another scope's tokens fails); every final
version complete; the audit clean afterwards. Negative controls: the same checkers on swapped / broken transcripts.
"""
from __future__ import annotations

import copy

import pytest

from conformance.fixtures.http_agents import Agents, judge_all
from conformance.fixtures.prompts import revise, tokens
from conformance.fixtures.serve_checks import stream_endings
from conformance.fixtures.servers import ServerProcess
from retire.traces.driver import Workload, plan, poisson_arrivals, prompt_chain

pytestmark = pytest.mark.slow
SCOPES, RATE, DURATION = 64, 0.3, 20.0
W = Workload(prompt_len=256, decode_tokens=64, shared_fraction=0.9, time_scale=1.0, lead_s=1.0)


def load_plan(seed: int = 0):
    arrivals = poisson_arrivals(RATE, SCOPES, DURATION, seed)
    return plan(arrivals, W, scopes=[f"s{k}" for k in range(SCOPES)])


def load_prompts(seed: int = 0):
    return prompt_chain(lambda i: tokens(W.prompt_len, seed + 97 * i), revise, W.prompt_len, W.shared_fraction, seed)


@pytest.fixture(scope="module")
def load_srv(device, pool):
    s = ServerProcess("retire", "unit", shape_override={"max_num_seqs": SCOPES})
    try:
        pool.oracle("unit")
        s.wait_ready()
    except BaseException:
        s.stop()
        raise
    yield s
    s.stop(timeout=15)


@pytest.mark.timeout(1200)
def test_64_scopes_revising_at_random_moments(load_srv, pool):
    import httpx

    plans = load_plan()
    run = pool.runner.run(Agents(load_srv.url, "retire", label="ld.", decode_tokens=W.decode_tokens)
                          .run(plans, load_prompts()), timeout=900)
    m = run.metrics()
    assert len(run.versions) == len(plans) and m["scopes"] == SCOPES, "a version was lost"
    assert m["failed_requests"] == 0 and m["stream_errors"] == 0, [v.errors for v in run.versions if v.errors][:5]
    ends = stream_endings(transcripts=run.versions)
    assert ends.valid, ends.detail
    assert m["finals_complete"] == SCOPES
    ok, bad = pool.runner.run(judge_all(run, pool.oracle("unit"), W.decode_tokens), timeout=900)
    assert ok, bad[:5]
    with httpx.Client(base_url=load_srv.url, timeout=120) as c:
        a = c.get("/retire/audit")
        assert a.status_code == 200, a.text
    reasons = [c.get("finish_reason") for v in run.versions for ch in v.chunks for c in ch["choices"]
               if c.get("finish_reason")]
    print(f"\n{len(run.versions)} versions over {SCOPES} scopes in {m['horizon_s']:.1f} s: "
          f"{m['requests_per_s']:.1f} req/s, successor TTFT p50 {m['successor_ttft_p50_s']:.3f} s "
          f"p99 {m['successor_ttft_p99_s']:.3f} s; endings {dict((r, reasons.count(r)) for r in set(reasons))}; "
          f"obsolete received {m['obsolete_tokens_received']}; audit clean")
    _negative_controls(run, pool)


def _negative_controls(run, pool):
    """The checkers see mixing and broken endings: swap two scopes' delivered tokens, drop an ending."""
    a, b = [v for v in run.versions if v.final][:2]
    mixed = copy.copy(run)
    sa, sb = copy.copy(a), copy.copy(b)
    sa.tokens, sb.tokens = list(b.tokens), list(a.tokens)
    sa.logprobs, sb.logprobs, sa.tops, sb.tops = list(b.logprobs), list(a.logprobs), list(b.tops), list(a.tops)
    mixed.versions = [sa, sb]
    ok, bad = pool.runner.run(judge_all(mixed, pool.oracle("unit"), W.decode_tokens), timeout=300)
    assert not ok and len(bad) == 2, "mixed streams must be reported"
    broken = copy.copy(a)
    broken.chunks = [ch for ch in a.chunks if not any(c.get("finish_reason") for c in ch["choices"])]
    assert stream_endings(transcripts=[a, broken]).valid is False
