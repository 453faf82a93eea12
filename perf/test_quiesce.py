"""The quiescence barrier of the paired timing benchmarks (perf/quiesce.py), engine-free: it runs in the default
suite. A child that spins stands in for an engine's queue reader in its 1 s busy loop."""
from __future__ import annotations

import asyncio
import time

import pytest

from perf import quiesce as q

SPIN = "import time\nt = time.time()\nwhile time.time() - t < {s}: pass\ntime.sleep(60)\n"


@pytest.fixture
def spinner(python_child):
    return lambda seconds: python_child(SPIN.format(s=seconds))


def test_returns_once_the_spinning_child_went_idle(spinner, monkeypatch):
    monkeypatch.setattr(q, "ENABLED", True)
    spinner(0.8)
    time.sleep(0.2)  # the spinner is the fault: let it start spinning
    t0 = time.monotonic()
    assert asyncio.run(q.quiesce(timeout=5.0)) is True
    assert time.monotonic() - t0 > 0.3, "returned while the child was still spinning"


def test_negative_control_a_child_that_never_idles_times_out(spinner, monkeypatch):
    monkeypatch.setattr(q, "ENABLED", True)
    spinner(60)
    time.sleep(0.2)
    t0 = time.monotonic()
    assert asyncio.run(q.quiesce(timeout=0.6)) is False
    assert time.monotonic() - t0 < 2.0, "the barrier must give up at its timeout"


def test_turned_off_it_returns_at_once(spinner, monkeypatch):
    monkeypatch.setattr(q, "ENABLED", False)
    spinner(60)
    t0 = time.monotonic()
    assert asyncio.run(q.quiesce(timeout=5.0)) is True
    assert time.monotonic() - t0 < 0.5
