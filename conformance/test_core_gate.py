"""Gate (a), engine-free: the engine commits no output of a version that is not current.

On this CPU build no SUPERSEDE path leaves a non-current version running: the predecessor is finished (RECLAIM) in
the same `add_request` call that advanced the epoch, between two steps, and vLLM skips finished requests at commit.
Gate (a) (`TransitionCore.gate`, applied in `RetireScheduler.update_from_output`) is defense in depth for the
engines where a step can be in flight across the SUPERSEDE (async scheduling, pipeline stages). It is tested here on
the one path that does admit a live non-current version: a second epoch-0 registration of a live scope (the facade's
`ScopeExists` check prevents it; the engine admits the request but never makes it current). Judged from vLLM's own
committed outputs; the negative control turns the gate off and the same outputs are committed.
"""
from __future__ import annotations

from conformance.fixtures.enginefree import EngineFreeCore
from conformance.fixtures.prompts import tokens


def _duplicate(gate: bool):
    core = EngineFreeCore()
    core.s("switches", {"gate": gate})
    first = core.submit("t", "s", tokens(64, 1), max_tokens=4)
    dup = core.submit("t", "s", tokens(64, 2), max_tokens=4)  # same ScopeKey, epoch 0, while `first` is live
    core.drain()
    return core, first, dup


def test_gate_a_drops_every_output_of_a_non_current_version():
    core, first, dup = _duplicate(gate=True)
    assert core.current("t", "s").req_id == first
    assert first in core.committed and dup not in core.committed
    stats = core.s("stats")
    assert stats["duplicate_submits"] == 1 and stats["engine_frames_suppressed"] >= 4  # 4 tokens, none committed


def test_negative_control_gate_a_off_commits_the_obsolete_outputs():
    core, first, dup = _duplicate(gate=False)
    assert dup in core.committed and core.s("stats").get("engine_frames_suppressed", 0) == 0


def test_audit_reports_the_live_non_current_version():
    core = EngineFreeCore()
    core.submit("t", "s", tokens(64, 1), max_tokens=30)
    dup = core.submit("t", "s", tokens(64, 2), max_tokens=30)
    core.step()
    assert any(dup in v for v in core.audit()["violations"] if v.startswith("live obsolete executions"))
