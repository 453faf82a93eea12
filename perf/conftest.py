"""Perf-only fixtures. `runner`, `pool` and `device` come from the top-level conftest.

`bench_engines.get(key)` returns (subject facade, oracle) for an engine configuration from the session pool, after
shutting down the pool's engines of every OTHER configuration: at most one subject and one oracle engine are alive
at a time (each is ~2.5 GB and two processes on a 2-core machine). Engines closed here are removed from the pool, so
anything that asks the pool again gets a fresh one.
"""
from __future__ import annotations

import pytest


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
