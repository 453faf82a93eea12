"""Per-request state of the transition core is forgotten when the request leaves, without scanning the live ones
(retire/transition.py `_forget_left`; the cost-growth curves in perf/test_bench_growth.py measure the time).

Engine-free, on a real RetireScheduler: the engine's version tags (versions.tags) hold exactly the requests still in
vLLM's scheduler after a RECLAIM, after a normal finish and after an abort, with other live scopes around.
Negative control: with the targeted forget switched off, the RECLAIMed predecessor's tag is still there.
"""
from __future__ import annotations

from conformance.fixtures.enginefree import EngineFreeCore
from conformance.fixtures.prompts import revise, tokens


def _core_with_scopes(n: int = 50):
    core = EngineFreeCore(num_blocks=256)
    for i in range(n):
        core.submit("t", f"bg{i}", tokens(40, i), max_tokens=500)
    p = tokens(200, 99)
    old = core.submit("t", "x", p, max_tokens=3)
    core.step()
    return core, p, old


def _tags_match_scheduler(core) -> bool:
    return set(core.s.retire.versions.tags) == set(core.s.requests)


def test_reclaimed_finished_and_aborted_requests_are_forgotten():
    core, p, old = _core_with_scopes()
    res, new = core.supersede("t", "x", 0, revise(p, 150, 210, 1))
    assert res.refused is None and old not in core.s.requests
    core.step()
    assert old not in core.s.retire.versions.tags and _tags_match_scheduler(core)
    while new in core.s.requests:  # the successor finishes normally (max_tokens=8)
        core.step()
    assert new not in core.s.retire.versions.tags and _tags_match_scheduler(core)
    bg = next(iter(core.s.requests))
    core.port.finish(bg)  # an abort from outside (a client)
    core.step()
    assert bg not in core.s.retire.versions.tags and _tags_match_scheduler(core)
    assert core.audit()["valid"]


def test_negative_control_without_the_targeted_forget_the_tag_stays(monkeypatch):
    from retire.transition import TransitionCore

    monkeypatch.setattr(TransitionCore, "_forget_left", lambda self: self.left.clear())
    core, p, old = _core_with_scopes()
    core.supersede("t", "x", 0, revise(p, 150, 210, 1))
    core.step()
    assert old in core.s.retire.versions.tags and not _tags_match_scheduler(core)
