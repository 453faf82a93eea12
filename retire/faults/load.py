"""Co-tenant load: another tenant keeps decoding on the same engine while the scope under test is superseded.

- CoTenantLoad(tenant, rate): submits a stream of requests of `tenant` (new scopes "load<n>.<k>") at `rate` arrivals per
  second, at most `max_live` alive at once (an arrival finding the cap reached is skipped and counted), and consumes
  every frame with its dequeue time. Pacing arrivals IS the fault (the arrival process), the only sleep here; barriers
  (`running()`, `produced(n)`) wait on frames, never on time. Heal stops arrivals and lets every started request run
  to its end, so nothing of the load is left in the engine (audit clean).

Invariant of the load itself: it only submits and consumes through the public facade under its own tenant; it never
touches another tenant's scope. `affects` names the tenant's load, so two loads on one tenant conflict while a load
composes with KV or consumer faults.

Metric helpers (pure): `inter_token_times` (frame gap divided by the tokens it carried, per stream, optionally only
inside time windows) and `cross_gaps` (for each instant, the gap between a stream's
consecutive frames that span it).
"""
from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from .base import Fault

now = time.monotonic


@dataclass
class LoadRun:
    scope: str
    prompt: list[int]
    internal_id: str
    frames: list[tuple[float, int]] = field(default_factory=list)  # (dequeue time, tokens in the frame)
    run: object = None  # oracles.Run once finished
    t_submit: float = 0.0

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.frames)


class CoTenantLoad(Fault):
    name = "cotenant-load"
    _instances = itertools.count()

    def __init__(self, tenant: str = "B", rate: float = 4.0, *, prompt_len: int = 288, max_tokens: int = 96,
                 max_live: int = 3, seed: int = 0, logprobs: int = 5):
        super().__init__()
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.tenant, self.rate = tenant, float(rate)
        self.affects = frozenset({f"load.{tenant}"})
        self.prompt_len, self.max_tokens, self.max_live = prompt_len, max_tokens, max_live
        self.seed, self.logprobs = seed, logprobs
        self.runs: list[LoadRun] = []
        self.live: dict[str, LoadRun] = {}
        self.skipped = 0
        self._tasks: list[asyncio.Task] = []
        self._gen: asyncio.Task | None = None
        self._stop: asyncio.Event | None = None
        self._progress: asyncio.Condition | None = None
        self._k = 0
        self._n = next(self._instances)  # scope names are unique per load, so loads can follow each other on a facade
        self.error: BaseException | None = None

    # ------------------------------------------------------------------ fault protocol
    async def inject(self, target) -> None:
        self._stop = asyncio.Event()
        self._progress = asyncio.Condition()
        await super().inject(target)
        self._gen = asyncio.ensure_future(self._arrivals(target))

    async def heal(self) -> None:
        if self._stop is not None:
            self._stop.set()
        res = []
        if self._gen is not None:
            res += await asyncio.gather(self._gen, return_exceptions=True)
        if self._tasks:
            res += await asyncio.gather(*self._tasks, return_exceptions=True)
        errors = [r for r in res if isinstance(r, BaseException)]
        await super().heal()
        if errors:
            raise errors[0]

    # ------------------------------------------------------------------ load
    def _params(self):
        from vllm import SamplingParams
        return SamplingParams(max_tokens=self.max_tokens, temperature=0, ignore_eos=True, logprobs=self.logprobs)

    def prompt(self, k: int) -> list[int]:
        """Request k's prompt: deterministic in (seed + k), ids 3.. vocab-1 (0..2 are pad/bos/eos)."""
        import numpy as np
        vocab = self.target.backend.vocab_size
        return [int(t) for t in np.random.default_rng(self.seed + k).integers(3, vocab, size=self.prompt_len)]

    async def _arrivals(self, eng) -> None:
        try:
            while not self._stop.is_set():
                if len(self.live) < self.max_live:
                    await self._start(eng)
                else:
                    self.skipped += 1
                try:  # the arrival process: this wait IS the fault's pacing, not a synchronisation
                    await asyncio.wait_for(self._stop.wait(), 1.0 / self.rate)
                except asyncio.TimeoutError:
                    pass
        except BaseException as e:  # a dead arrival process must fail the barriers, not hang them
            self.error = e
            async with self._progress:
                self._progress.notify_all()
            raise

    async def _start(self, eng) -> None:
        k = self._k
        self._k += 1
        scope = f"load{self._n}.{k}"
        prompt = self.prompt(k)
        t = now()
        await eng.submit(scope, prompt, self._params(), tenant=self.tenant)
        lr = LoadRun(scope, prompt, eng.internal_id(scope, 0, self.tenant), t_submit=t)
        self.live[scope] = lr
        self._tasks.append(asyncio.ensure_future(self._consume(eng, lr)))

    async def _consume(self, eng, lr: LoadRun) -> None:
        from oracles.runs import collect

        async def on_frame(f):
            if f.token_ids:
                lr.frames.append((now(), len(f.token_ids)))
                async with self._progress:
                    self._progress.notify_all()

        try:
            lr.run = await collect(eng, lr.scope, 0, self.tenant, on_frame=on_frame)
        finally:
            self.live.pop(lr.scope, None)
            self.runs.append(lr)
            async with self._progress:
                self._progress.notify_all()

    # ------------------------------------------------------------------ barriers (frame-driven)
    @property
    def produced_tokens(self) -> int:
        return sum(r.tokens for r in self.live.values()) + sum(r.tokens for r in self.runs)

    async def _until(self, cond) -> None:
        async with self._progress:
            await self._progress.wait_for(lambda: self.error is not None or cond())
        if self.error is not None:
            raise RuntimeError(f"{self.name}: the arrival process died: {self.error!r}") from self.error

    async def produced(self, n: int) -> None:
        """Return once the load's streams have delivered at least `n` tokens in total."""
        await self._until(lambda: self.produced_tokens >= n)

    async def running(self) -> None:
        """Return once some request of the load is decoding (delivered a frame)."""
        await self._until(lambda: any(r.frames for r in self.live.values()))

    def decoding(self) -> dict[str, LoadRun]:
        """Live requests that have delivered at least one frame (their prompt KV is written)."""
        return {s: r for s, r in self.live.items() if r.frames}


# ---------------------------------------------------------------------------------------------- metrics
def inter_token_times(runs: Iterable[LoadRun], *, inside: Sequence[tuple[float, float]] | None = None) -> list[float]:
    """Per stream, (t_i - t_{i-1}) / tokens_i for consecutive frames; the first frame (TTFT) is excluded. With
    `inside`, only gaps whose both ends fall in one of the windows."""
    out = []
    for r in runs:
        for (t0, _), (t1, n) in zip(r.frames, r.frames[1:]):
            if inside is not None and not any(a <= t0 and t1 <= b for a, b in inside):
                continue
            out.append((t1 - t0) / max(n, 1))
    return out


def cross_gaps(runs: Iterable[LoadRun], instants: Sequence[float]) -> list[float]:
    """For each instant and each stream decoding across it: the gap between its consecutive frames spanning it."""
    out = []
    for r in runs:
        ts = [t for t, _ in r.frames]
        for x in instants:
            for t0, t1 in zip(ts, ts[1:]):
                if t0 <= x < t1:
                    out.append(t1 - t0)
                    break
    return out
