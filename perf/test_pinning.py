"""The CPU placement of the across-instance timing benchmarks (perf/pinning.py), engine-free: it runs in the default
suite. A child bound to one core stands in for a vLLM worker, another child for an EngineCore."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import psutil
import pytest

from perf import pinning

pytestmark = pytest.mark.skipif(psutil.cpu_count() < 2, reason="placement needs two cores to move anything")
IDLE = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\ntime.sleep(60)\n"


@pytest.fixture
def children(monkeypatch):
    """(worker, engine) children; the worker bound to core 0 and recognised as a vLLM worker. Killed on teardown."""
    procs = [subprocess.Popen([sys.executable, "-c", IDLE]) for _ in range(2)]
    worker, engine = procs
    os.sched_setaffinity(worker.pid, {0})
    monkeypatch.setattr(pinning, "_is_worker", lambda p: p.pid == worker.pid)
    monkeypatch.setattr(pinning, "ENABLED", True)
    yield worker, engine
    for p in procs:
        p.kill()
        p.wait()


def _affinities(pid: int) -> set[frozenset]:
    return {frozenset(os.sched_getaffinity(t.id)) for t in psutil.Process(pid).threads()}


def test_everything_but_the_worker_leaves_its_core_and_comes_back(children):
    worker, engine = children
    every = frozenset(range(psutil.cpu_count()))
    before = os.sched_getaffinity(0)
    with pinning.pinned() as cores:
        assert 0 not in cores and cores
        assert _affinities(os.getpid()) == {frozenset(cores)}
        assert _affinities(engine.pid) == {frozenset(cores)}, "every thread of a non-worker moves, not its first"
        assert _affinities(worker.pid) == {frozenset({0})}
        started = threading.Thread(target=threading.Event().wait, args=(5,), daemon=True)
        started.start()
    assert os.sched_getaffinity(0) == before
    assert _affinities(engine.pid) == {every}
    assert _affinities(worker.pid) == {frozenset({0})}
    assert os.sched_getaffinity(started.native_id) == before, "a thread started while pinned is restored too"


def test_turned_off_or_without_a_bound_worker_nothing_moves(children, monkeypatch):
    worker, engine = children
    every = frozenset(range(psutil.cpu_count()))
    monkeypatch.setattr(pinning, "ENABLED", False)
    with pinning.pinned() as cores:
        assert cores == [] and _affinities(engine.pid) == {every}
    monkeypatch.setattr(pinning, "ENABLED", True)
    monkeypatch.setattr(pinning, "_is_worker", lambda p: False)  # no worker: no core to keep free
    with pinning.pinned() as cores:
        assert cores == [] and _affinities(engine.pid) == {every} and _affinities(os.getpid()) == {every}
