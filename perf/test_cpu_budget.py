"""The CPU budget of a trial by process role (perf/cpu_budget.py), engine-free: it runs in the default suite. Children
that spin or sleep stand in for engine processes; the kernel's accounting is the oracle."""
from __future__ import annotations

import time

import pytest

from perf import cpu_budget as cb

SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\nprint('done', flush=True)\n" \
       "time.sleep(60)\n"
IDLE = "import time\nprint('done', flush=True)\ntime.sleep(60)\n"


@pytest.fixture
def child(python_child):
    return lambda code: python_child(code, pipe=True)


def test_roles_from_vllm_process_titles():
    assert cb.role("VLLM::EngineCore") == "engine_core"
    assert cb.role("VLLM::EngineCore_DP0") == "engine_core"
    assert cb.role("VLLM::Worker") == "worker"
    assert cb.role("VLLM::Worker_TP1") == "worker"
    assert cb.role("python") == "other"


def test_a_spinning_child_is_counted_with_its_cpu_time(child):
    before = cb.snapshot()
    p = child(SPIN.format(s=0.3))
    assert p.stdout.readline().strip() == "done"  # barrier: the child has used its 0.3 s of CPU
    d = cb.delta(before, cb.snapshot())
    assert 250 <= d["other"] <= 1500, d  # its 300 ms plus interpreter start-up
    assert set(d) == set(cb.ROLES)


def test_negative_control_an_idle_child_costs_almost_nothing(child):
    p = child(IDLE)
    assert p.stdout.readline().strip() == "done"
    before = cb.snapshot()
    time.sleep(0.3)  # the sleep is the idle period being measured
    d = cb.delta(before, cb.snapshot())
    assert d["other"] < 20, d  # a pooled engine's own resource tracker (also "other") sleeps too


def test_frontend_work_is_counted_in_this_process():
    before = cb.snapshot()
    t = time.process_time()
    while time.process_time() - t < 0.1:
        pass
    d = cb.delta(before, cb.snapshot())
    assert d["frontend"] >= 90, d  # (engine roles are not asserted: a session's pooled engines may be alive)


def test_resolution_is_named():
    assert cb.resolution() in ("schedstat-ns", "psutil-ticks")
