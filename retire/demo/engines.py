"""The demo's engines: one subject engine per execution shape (three policy facades on it) and one stock oracle
engine per oracle shape, shared by every section that can use them.

Invariants: a subject engine is opened when a section first needs its shape and closed before another subject shape
is opened (one subject engine at a time on this 2-core machine); the oracle engine follows `ORACLE_SHAPE` (shapes
whose numerics are equal share one oracle), so `long-8k` and `long-churn` are judged by one `long` oracle. Every
facade is audited before its engine closes (a leaked block or dangling pin fails the demo).
"""
from __future__ import annotations

import sys
import time

POLICY_ORDER = ("native-cold", "native-prefix", "retire")
now = time.monotonic
_T0 = now()


def log(msg: str) -> None:
    print(f"[{now() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


class Subject:
    """One subject engine of shape `key` and its three policy facades."""

    def __init__(self, key: str, base, facades: dict):
        self.key, self.base, self.facades = key, base, facades

    @property
    def block(self) -> int:
        return self.base.backend.block_size

    async def set_unit(self, tokens: int | None) -> int:
        """The prefill unit (step size) at run time; None restores the shape's max_num_batched_tokens."""
        return await self.base.backend.sched("set_step_tokens", {"tokens": tokens})


class Engines:
    def __init__(self):
        self.subject: Subject | None = None
        self.oracles: dict = {}
        self.started_s = 0.0

    async def oracle(self, key: str):
        from oracles.runs import OracleEngine

        from ..trials import oracle_warmup
        from ..trials.shapes import ORACLE_SHAPE, shape_kwargs

        okey = ORACLE_SHAPE.get(key, key)
        if okey not in self.oracles:
            t0 = now()
            path, shape = shape_kwargs(okey)
            o = OracleEngine(path, **shape)
            await oracle_warmup(o)
            self.oracles[okey] = o
            self.started_s += now() - t0
            log(f"oracle engine [{okey}] up in {now() - t0:.1f}s")
        return self.oracles[okey]

    async def open(self, key: str) -> Subject:
        from ..engine import RetireEngine
        from ..trials import warm_prefill, warmup
        from ..trials.shapes import shape_kwargs

        if self.subject is not None and self.subject.key == key:
            return self.subject
        await self.close_subject()
        t0 = now()
        path, shape = shape_kwargs(key)
        base = RetireEngine(path, "retire", **shape)
        await warmup(base)
        await warm_prefill(base, min(base.backend.chunk, 2048))  # untimed: a 2048-token prefill and a decode step
        self.subject = Subject(key, base, {p: base.with_policy(p) for p in POLICY_ORDER})
        self.started_s += now() - t0
        log(f"subject engine [{key}] up in {now() - t0:.1f}s ({shape})")
        return self.subject

    async def close_subject(self) -> None:
        s, self.subject = self.subject, None
        if s is None:
            return
        try:
            for f in s.facades.values():
                await f.audit()
        finally:
            for f in s.facades.values():
                await f.close()
            await s.base.close()

    async def close(self) -> None:
        try:
            await self.close_subject()
        finally:
            for o in self.oracles.values():
                await o.stop()
            self.oracles.clear()
