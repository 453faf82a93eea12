"""Engine-free exploration of the transition core (conformance/fixtures/explorer.py): a Hypothesis state machine
over a real RetireScheduler with vLLM's own KVCacheManager and BlockPool and no model, against a shadow model.

`make test` runs the CI profile below; `make explore` runs >= 10,000 schedules (conformance/explore.py).
Negative controls: each plants one plausible bug in the core (a mutant the machine must kill) and asserts that the
machine reports it: the len(new) - 1 cap dropped, the re-check at ADVANCE removed, a handoff pin that leaks, the DRAM
source pin released before copy-out.
"""
from __future__ import annotations

import traceback

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from conformance.fixtures.explorer import CoreMachine

CI = settings(max_examples=int(__import__("os").environ.get("RETIRE_EXPLORE_CI", "300")), stateful_step_count=25,
              deadline=None, database=None, suppress_health_check=list(HealthCheck),
              derandomize=True)


def _explore(s=CI):
    CoreMachine.counts.clear()
    run_state_machine_as_test(CoreMachine, settings=s)
    return dict(CoreMachine.counts)


@pytest.mark.timeout(600)
def test_core_state_machine():
    c = _explore()
    print(f"\nexplore (CI profile): {c}")
    assert c["schedules"] >= CI.max_examples and c["supersedes"] >= CI.max_examples, c
    for k in ("inherited", "cold", "refused", "truncations", "cuts", "dram_steps", "pressure", "faults"):
        assert c.get(k, 0) > 0, f"the machine never exercised {k}: {c}"


def _must_catch(monkeypatch, target: str, mutant, examples: int = 300) -> str:
    """Plant the mutant; the machine must fail. Returns the failure's text (a group of failures included)."""
    monkeypatch.setattr(target, mutant)
    try:
        _explore(settings(CI, max_examples=examples))
    except BaseException as e:  # noqa: BLE001 - AssertionError or Hypothesis's group of distinct failures
        return "".join(traceback.format_exception(e))
    raise AssertionError(f"the exploration machine did not catch the mutant planted at {target}")


def test_negative_control_len_minus_one_cap_dropped(monkeypatch):
    from retire import align

    def no_cap(*, old_tokens, new_prompt, frontier, align, known=0):  # the cap at len(new) - 1 forgotten
        lcp = align_mod.common_prefix_len(old_tokens, new_prompt, start=known)
        cap = max(0, min(lcp, frontier))
        return align_mod.Alignment(lcp=lcp, frontier=frontier, cap=cap, align=align, certified=cap - cap % align)

    align_mod = align
    msg = _must_catch(monkeypatch, "retire.transition.certify_length", no_cap)
    assert "exceeds bound" in msg, msg


def test_negative_control_advance_without_recheck(monkeypatch):
    msg = _must_catch(monkeypatch, "retire.versions.VersionTable.check", lambda self, tag: None)
    assert "want stale-epoch" in msg or "want unknown-scope" in msg, msg


def test_negative_control_leaked_handoff_pin(monkeypatch):
    from retire.ledger import PinLedger
    real = PinLedger.release

    def leaky(self, key):  # forgets the pin without giving its references back
        pin = self.pins.pop(key, None)
        if pin is None:
            return 0
        self.by_tenant[pin.tenant] -= len(pin.blocks)
        if not self.by_tenant[pin.tenant]:
            del self.by_tenant[pin.tenant]
        return len(pin.blocks)

    assert real is not leaky
    msg = _must_catch(monkeypatch, "retire.ledger.PinLedger.release", leaky)
    assert "(ref_cnt, tables + pins)" in msg, msg


def test_negative_control_dram_source_pin_released_before_copy_out(monkeypatch):
    from retire.dram.engine import DramLedger
    from retire.ledger import PinKey
    real = DramLedger.hold

    def early(self, key, handle, per_group, n):
        reason = real(self, key, handle, per_group, n)
        if reason is None:
            self.pins.release(PinKey(key, "handoff"))  # sources returned to the pool before the worker copied them
        return reason

    msg = _must_catch(monkeypatch, "retire.dram.engine.DramLedger.hold", early)
    assert "DRAM pin window" in msg or "(ref_cnt, tables + pins)" in msg, msg
