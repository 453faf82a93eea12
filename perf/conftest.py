"""Perf-only fixtures. `runner`, `pool` and `device` come from the top-level conftest.

`bench_engines.get(key)` returns (subject facade, oracle) for an engine configuration from the session pool, after
shutting down the pool's engines of every OTHER configuration: at most one subject and one oracle engine are alive
at a time (each is ~2.5 GB and two processes on a 2-core machine). Engines closed here are removed from the pool, so
anything that asks the pool again gets a fresh one.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

BENCH_LOG = os.environ.get("RETIRE_BENCH_LOG", "results/bench-progress.jsonl")


def _recorded(meta) -> bool:
    """A pytest-benchmark `Metadata` that holds at least one timed round."""
    return meta is not None and bool(meta.stats.data)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session):
    """Before pytest-benchmark writes its JSON: drop every benchmark that recorded no round. pytest-benchmark marks a
    benchmark as failed only on an `Exception`; a pytest-timeout failure or a KeyboardInterrupt inside a pedantic run
    (BaseExceptions) leaves it with empty stats, and the JSON writer then raises on `min([])` and writes NOTHING (that
    lost a 115-minute `make bench` on 2026-12-01). The dropped ones are in the progress log as "no round recorded"."""
    bs = getattr(session.config, "_benchmarksession", None)
    if bs is not None:
        bs.benchmarks[:] = [b for b in bs.benchmarks if _recorded(b)]
    yield


@pytest.fixture(autouse=True)
def _bench_progress(request):
    """Keep each benchmark's result the moment it ends, so a long `make bench` loses nothing when it is interrupted.

    pytest-benchmark writes its JSON only at session end. After a benchmark test (passed or not), one JSON line (its
    stats without raw data, its extra_info, the test's wall time) is appended to `RETIRE_BENCH_LOG` (default
    `results/bench-progress.jsonl`) and a progress line is printed."""
    t0 = time.monotonic()
    yield
    fx = (getattr(request.node, "funcargs", None) or {}).get("benchmark")  # None after Ctrl-C: nothing to keep
    if fx is None or not hasattr(fx, "extra_info"):
        return
    meta = getattr(fx, "stats", None)
    rec = {"test": request.node.nodeid, "wall_s": round(time.monotonic() - t0, 1),
           "ended": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if _recorded(meta):
        rec.update(status="measured", **meta.as_dict(include_data=False))
    else:
        rec.update(status="no round recorded", extra_info=dict(fx.extra_info))
    os.makedirs(os.path.dirname(BENCH_LOG) or ".", exist_ok=True)
    with open(BENCH_LOG, "a") as f:
        f.write(json.dumps(rec, default=str) + "\n")
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    cap = request.config.pluginmanager.get_plugin("capturemanager")
    if tr is not None and cap is not None:
        with cap.global_and_fixture_disabled():
            tr.write_line(f"[bench] {rec['ended']} {request.node.nodeid}: {rec['status']}, {rec['wall_s']} s "
                          f"(appended to {BENCH_LOG})")


class BenchEngines:
    def __init__(self, pool):
        self.pool = pool
        self.warmed: set[tuple[str, int]] = set()

    def _evict(self, keep: str) -> None:
        p = self.pool
        for k in [k for k in p.subjects if k != keep]:
            p.stop_subject(p.subjects.pop(k))
        try:
            from conformance.fixtures.engines import ORACLE_SHAPE
        except ImportError:
            ORACLE_SHAPE = {}
        keep_oracle = ORACLE_SHAPE.get(keep, keep)  # shapes with equal numerics share one oracle engine
        for k in [k for k in p.oracles if k != keep_oracle]:
            p.stop_oracle(p.oracles.pop(k))

    def get(self, key: str):
        self._evict(key)
        subject = self.pool.subject(key)
        oracle = self.pool.oracle(key)
        if (key, id(subject)) not in self.warmed:  # a restarted engine (released at a module end) warms again
            self.warm(subject, oracle)
            self.warmed.add((key, id(subject)))
        return subject, oracle

    def warm(self, subject, oracle) -> None:
        """Untimed: one full prefill unit on the subject, the logprobs compile on the oracle."""
        from retire.trials import oracle_warmup, warm_prefill

        self.pool.runner.run(warm_prefill(subject, subject.backend.chunk))
        self.pool.runner.run(oracle_warmup(oracle))


@pytest.fixture(scope="session")
def bench_engines(device, pool):
    return BenchEngines(pool)


@pytest.fixture
def facades(bench_engines):
    """`facades(key, *policies)` -> (dict policy -> sibling facade, oracle); siblings are closed (refcount) and audited
    at teardown."""
    opened = []

    def make(key: str, *policies: str):
        subject, oracle = bench_engines.get(key)
        fs = {p: subject.with_policy(p) for p in policies}
        opened.extend(fs.values())
        return fs, oracle

    yield make
    pool = bench_engines.pool

    async def fin():
        for f in opened:
            if not f.closed:
                await f.drain()
                await f.audit()
                await f.close()
    pool.runner.run(fin())


@pytest.fixture
def python_child():
    """`python_child(code, pipe=False)` starts `python -c code` (stdout piped and text when `pipe`), standing in for an
    engine process in engine-free tests; every child is killed at teardown (none outlives its test)."""
    procs = []

    def start(code: str, pipe: bool = False) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE if pipe else None, text=True)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()
