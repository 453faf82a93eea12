"""The trace replay driver (retire/traces/driver.py): its plan, its timeline, and a small replay on the unit engine.

What is checked, each with a negative control:
- publication under replay: retire publishes 0 obsolete tokens while a frame of a superseded version is held past
  ADVANCE (LateCompletion); with the facade gates switched off the driver reports that frame as obsolete. The driver
  counts by the consumer's clock against the supersede call, never by the subject's epoch table; the facade's own
  counter starts at its ADVANCE, later than the call, so the driver's count is never below it;
- final versions: every final version of the retire arm is advanced and matches its clean oracle run (stock engine);
  a perturbed final output is rejected by the same judge;
- the live-execution timeline: computed from engine closure times; a version revoked but closed late is counted as
  live-obsolete until it closed (unit test on records), and the ideal arm never has an obsolete execution.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conformance.fixtures.prompts import revise, tokens
from retire.faults import LateCompletion
from retire.traces import read_trace_jsonl
from retire.traces.driver import (ArmResult, VersionPlan, VersionRecord, Workload, judge_finals, plan,
                                  poisson_arrivals, prompt_chain, run_arm, trace_arrivals)
from retire.traces.quantum import QuantumSelector

FIXTURE = Path(__file__).parent / "fixtures" / "trace_paper_window.jsonl"
# two scopes: a (3 transitions), b (2 transitions); trace seconds, replayed at 2x
ARRIVALS = [(1.0, "a"), (1.3, "a"), (1.7, "a"), (2.0, "b"), (2.4, "b")]
W = Workload(prompt_len=160, decode_tokens=24, time_scale=2.0, lead_s=1.0, cleanup_limit_s=60.0)


def _prompts(w: Workload, seed: int):
    return prompt_chain(lambda i: tokens(w.prompt_len, seed + 31 * i), revise, w.prompt_len, w.shared_fraction, seed)


def test_plan_of_the_paper_window():
    w = Workload(time_scale=10.0, lead_s=2.0)
    ps = plan(trace_arrivals(read_trace_jsonl(FIXTURE)), w)
    assert len(ps) == 24 + 3 and sum(p.final for p in ps) == 3
    assert {p.scope for p in ps if p.final} == {"thread-088", "thread-221", "thread-212"}
    assert [p.epoch for p in ps if p.scope == "thread-221"] == list(range(9))
    assert ps[0].t == 0.0 and max(p.t for p in ps) == pytest.approx((69.890492 + 2.0) / 10.0, abs=1e-6)
    assert all(a.t <= b.t for a, b in zip(ps, ps[1:]))


def test_poisson_arrivals_and_rate_only_selector():
    assert poisson_arrivals(0.0, 4, 20.0) == []
    arr = poisson_arrivals(0.2, 8, 200.0, seed=1)
    assert 0.1 < len(arr) / (8 * 200.0) < 0.3 and all(0 <= t < 200.0 for t, _ in arr)
    sel = QuantumSelector(small=64, large=256, threshold=0.1, window_s=10.0)
    assert sel.choose(0.0) == 256 and sel.choose(0.05) == 256 and sel.choose(0.2) == 64
    assert sel.observed_rate([1.0, 2.0, 3.0, 30.0], 10.0, scopes=3) == pytest.approx(3 / 30)


def _rec(epoch, t_call, t_revoked, t_closed, t_last, finished=True):
    r = VersionRecord(VersionPlan("s", 0, epoch, t_call, final=False), "k", [1])
    r.t_call, r.t_revoked, r.t_closed, r.t_last, r.finished = t_call, t_revoked, t_closed, t_last, finished
    return r


def test_timeline_counts_revoked_live_versions_as_obsolete():
    """Negative control for the timeline: a version revoked at 1.0 but closed by the engine at 3.0 is live-obsolete
    over [1, 3); the same version closed at its revocation never is."""
    late = ArmResult("x", W, 0.0, 1.0, [_rec(0, 0.0, 1.0, 3.0, 0.9), _rec(1, 1.0, None, None, 4.0)], 0)
    pts = late.timeline()
    assert max(p["obsolete"] for p in pts) == 1
    at = lambda t: [p for p in pts if p["t"] <= t][-1]
    assert at(2.0) == {"t": 1.0, "current": 1, "obsolete": 1} and at(3.5)["obsolete"] == 0
    prompt = ArmResult("x", W, 0.0, 1.0, [_rec(0, 0.0, 1.0, 1.0, 0.9), _rec(1, 1.0, None, None, 4.0)], 0)
    assert max(p["obsolete"] for p in prompt.timeline()) == 0
    assert pts[-1]["current"] == 0 and pts[-1]["obsolete"] == 0


def _replay(h, eng, arm, label, *, ideal=False, late: bool = False, w=W, seed=11):
    """Run one arm; with `late`, hold scope a's first frame of epoch 0 until it was superseded."""
    ps = plan(ARRIVALS, w)
    prompts = _prompts(w, seed)

    async def go():
        if not late:
            return await run_arm(eng, arm, ps, prompts, w, label=label, ideal=ideal), None
        fault = LateCompletion(f"{label}{arm}.a", 0)
        async with fault.on(eng):
            res = await run_arm(eng, arm, ps, prompts, w, label=label)
        return res, fault
    return h.run(go())


def test_replay_retire_publishes_nothing_and_advances_every_final(unit):
    res, fault = _replay(unit, unit.retire, "retire", "rp1.", late=True)
    m = res.metrics()
    assert fault.released == 1 and fault.held_tokens > 0, "the held frame of epoch 0 must be released after ADVANCE"
    assert m["obsolete_tokens_published"] == 0 == m["facade_obsolete_counter"], m
    assert unit.retire.stats()["obsolete_tokens_suppressed"] >= fault.held_tokens
    assert m["final_versions_advanced"] == m["final_versions_total"] == 2, m
    assert m["transitions"] == 5
    assert m["goodput_tok_s"] > 0 and m["final_goodput_tok_s"] > 0 and m["final_ttft_s_median"] > 0
    ok = unit.run(judge_finals(res, unit.oracle))
    assert ok, [(r.key, r.verdict) for r in res.finals]
    tl = res.timeline()
    assert all(p["current"] >= 0 and p["obsolete"] >= 0 for p in tl)
    assert tl[-1]["current"] == 0 and tl[-1]["obsolete"] == 0
    assert max(p["current"] for p in tl) >= 1

    # negative control for the judge: a perturbed final output is rejected
    r = res.finals[0]
    top0 = set(r.tops[0]) if r.tops else set()
    r.tokens[0] = next(t for t in range(3, 2048) if t not in top0 and t != r.tokens[0])
    assert not unit.run(judge_finals(res, unit.oracle)) and r.verdict.startswith("FAIL"), r.verdict


def test_replay_gates_off_obsolete_frame_is_reported(unit):
    """Negative control: the same held frame, gates off -> the driver counts it as obsolete, as the facade does."""
    unit.retire.seams.gates = False
    # without gate (b) the revoked version's stream is never closed client-side: the cleanup limit ends its consumer
    res, fault = _replay(unit, unit.retire, "retire", "rp2.", late=True, w=dataclasses.replace(W, cleanup_limit_s=3.0))
    m = res.metrics()
    assert fault.released == 1
    assert m["obsolete_tokens_published"] >= fault.held_tokens > 0, m
    assert m["obsolete_tokens_published"] >= m["facade_obsolete_counter"], m


def test_replay_native_and_ideal_arms(unit):
    nat, _ = _replay(unit, unit.native_prefix, "native-prefix", "rp3.")
    ideal, _ = _replay(unit, unit.retire, "ideal", "rp3.", ideal=True)
    mn, mi = nat.metrics(), ideal.metrics()
    assert mn["obsolete_tokens_published"] >= mn["facade_obsolete_counter"]
    assert mn["transitions"] == 5 and mi["transitions"] == 0
    assert mi["final_versions_advanced"] == mi["final_versions_total"] == 2
    assert mi["obsolete_tokens_published"] == 0 and mi["max_live_obsolete"] == 0
    assert mi["goodput_tok_s"] == pytest.approx(mi["final_goodput_tok_s"])
    assert unit.run(judge_finals(ideal, unit.oracle)), [(r.key, r.verdict) for r in ideal.finals]
    assert unit.run(judge_finals(nat, unit.oracle)), [(r.key, r.verdict) for r in nat.finals]


def test_replay_rate_only_selector_switches_quantum(unit):
    """The selector lowers the step budget when the observed revision rate crosses its threshold (3 revisions of 2
    scopes within 10 trace s = 0.15/scope/s here); negative control: with a threshold above that rate it never
    switches. Both replays stay correct (0 obsolete tokens, every final version advanced)."""
    for label, threshold, want in (("rq1.", 0.1, [256, 64]), ("rq2.", 10.0, [256])):
        sel = QuantumSelector(small=64, large=256, threshold=threshold, window_s=10.0)
        res = unit.run(run_arm(unit.retire, "retire", plan(ARRIVALS, W), _prompts(W, 5), W, label=label, quantum=sel))
        m = res.metrics()
        assert [q for _, q in res.quanta][:len(want)] == want and (threshold < 1 or len(res.quanta) == 1), res.quanta
        assert m["obsolete_tokens_published"] == 0 and m["final_versions_advanced"] == 2, m


def test_report_renders_replay_table_timeline_and_matrix(tmp_path, capsys):
    """`retire report` on the keys perf/test_bench_replay.py writes: the Table 9 style per-arm table, the ratios, the
    targets line, the matrix rows and the Figure 6 style PNG; without per-arm metrics no Table 9 section is drawn."""
    import json

    from retire.report import main

    s = lambda x: {"n": 3, "median": x, "min": x, "max": x}
    ei = {"paper_metric": "Table 9 / Figure 6: recorded-burst replay", "scenario": "tiny", "time_scale": 10.0,
          "obsolete_tokens_published[native-prefix]": {"total": 12, "per_trial": [4, 4, 4], **s(4)},
          "obsolete_tokens_published[retire]": {"total": 0, "per_trial": [0, 0, 0], **s(0)},
          "final_versions_advanced[retire]": ["3/3", "3/3", "3/3"], "goodput_tokens_per_second[retire]": s(40.5),
          "goodput_tokens_per_second[native-prefix]": s(38.0), "goodput_ratio[retire/native-prefix]": s(1.066),
          "targets": {"retire publishes 0 obsolete tokens": True, "goodput >= 5.5x best native (median)": False},
          "timeline": {"native-prefix": [{"t": 0.0, "current": 0, "obsolete": 0}, {"t": 0.2, "current": 1,
                                                                                   "obsolete": 1}],
                       "retire": [{"t": 0.0, "current": 0, "obsolete": 0}, {"t": 0.2, "current": 1, "obsolete": 0}]}}
    mx = {"replay_matrix": [{"rate": 0.2, "concurrency": 4, "policy": "retire", "quantum": "rate-only",
                             "goodput_tok_s": 50.1, "admitted": True}],
          "best_native_quantum": [{"rate": 0.2, "concurrency": 4, "quantum": 64, "goodput_tok_s": 45.0}]}
    bare = {"timeline": {"x": [{"t": 0.0, "current": 1, "obsolete": 0}]}}
    doc = {"machine_info": {}, "commit_info": {}, "benchmarks": [
        {"name": n, "fullname": n, "params": {}, "stats": {}, "extra_info": e}
        for n, e in (("test_bench_replay_recorded_burst", ei), ("test_bench_replay_rate_matrix", mx), ("bare", bare))]}
    src = tmp_path / "in.json"
    src.write_text(json.dumps(doc))
    assert main([str(src), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "## Recorded-burst replay (Table 9 style): `test_bench_replay_recorded_burst`" in out
    assert "| retire | 0 (per trial 0 [0, 0]) | 40.5 [40.5, 40.5] | 3/3, 3/3, 3/3 |" in out
    assert "| goodput_ratio (retire / native-prefix) | 3 | 1.066 |" in out
    assert "retire publishes 0 obsolete tokens: met; goodput >= 5.5x best native (median): NOT met" in out
    assert "## Revision-rate matrix (A.2.2)" in out and "| 0.2 | 4 | retire | rate-only | 50.1 | True |" in out
    assert out.count("Table 9 style") == 1  # the bare timeline has no per-arm metrics: no table for it
    png = (tmp_path / "out" / "replay_timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_traces_cli_plan(capsys):
    import json

    from retire.traces import main
    assert main(["plan", str(FIXTURE), "--time-scale", "10", "--lead", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["transitions"], out["versions"], out["final_versions"]) == (24, 27, 3)
    assert out["wall_span_s"] == pytest.approx(7.189049) and sorted(out["transitions_per_scope"].values()) == [8] * 3
