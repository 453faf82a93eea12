"""Engine-free exploration with revision slacks (conformance/fixtures/explorer_slack.py): CoreMachine's actions and
invariants on a core with a sliding-window KV group, plus versions that keep a slack and revisions 0.5 to 6 windows
behind the frontier. CI runs `RETIRE_EXPLORE_SLACK` schedules (150).

Negative controls: each plants a plausible slack bug the machine must report: the slack never pins anything (the
"sliding window" cold it should have prevented), the kept range never moves forward (a block kept more than S
behind the frontier), the version's quota ignored (more slack blocks than the quota).
"""
from __future__ import annotations

import os
import traceback

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from conformance.fixtures.explorer_slack import SlackMachine
from retire.slack import Slack

CI = settings(max_examples=int(os.environ.get("RETIRE_EXPLORE_SLACK", "150")), stateful_step_count=25,
              deadline=None, database=None, suppress_health_check=list(HealthCheck), derandomize=True)


def _explore(s=CI) -> dict:
    SlackMachine.counts.clear()
    run_state_machine_as_test(SlackMachine, settings=s)
    return dict(SlackMachine.counts)


@pytest.mark.timeout(600)
def test_slack_state_machine():
    c = _explore()
    print(f"\nexplore with slack (CI profile): {c}")
    assert c["schedules"] >= CI.max_examples, c
    for k in ("slack_submits", "supersedes_behind", "slack_inherited", "slack_checked", "cuts", "dram_steps"):
        assert c.get(k, 0) > 0, f"the machine never exercised {k}: {c}"


def _must_catch(monkeypatch, name: str, mutant, examples: int = 300) -> str:
    monkeypatch.setattr(Slack, name, mutant)
    try:
        _explore(settings(CI, max_examples=examples, phases=[Phase.generate]))  # the first failure is enough
    except BaseException as e:  # noqa: BLE001 - AssertionError or Hypothesis's group of distinct failures
        return "".join(traceback.format_exception(e))
    raise AssertionError(f"the slack exploration did not catch the mutant Slack.{name}")


def test_negative_control_slack_that_never_pins(monkeypatch):
    msg = _must_catch(monkeypatch, "_update", lambda self, rid, k: None)
    assert "did not cover" in msg and "sliding window" in msg, msg


def test_negative_control_kept_range_never_moves_forward(monkeypatch):
    msg = _must_catch(monkeypatch, "_give_back", lambda self, k, below: None)
    # a kept range that never moves forward leaves [first_needed(F - S), first_needed(F)), and under a quota it also
    # grows past the quota: whichever invariant the schedule reaches first reports it
    assert "outside [" in msg or "beyond its quota" in msg, msg


def test_negative_control_quota_ignored(monkeypatch):
    real = Slack._update

    def unbounded(self, rid, k):
        cfg, k.cfg = k.cfg, msgspec.structs.replace(k.cfg, quota_blocks=None)
        try:
            real(self, rid, k)
        finally:
            k.cfg = cfg

    msg = _must_catch(monkeypatch, "_update", unbounded)
    assert "beyond its quota" in msg, msg
