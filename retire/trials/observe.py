"""Observers that stand outside the subject: what a consumer received, stamped by the consumer's own clock.

Invariant: a frame is *obsolete* for a SUPERSEDE of epoch e iff it carries tokens of an epoch <= e and the consumer
received it after the driver marked the moment it called `supersede` (`ConsumerClock.mark`, taken just before the
call). The judgement uses only the order of events on the consumer's side of one asyncio loop: never the subject's
`revoked` flag, its epoch table or its counters. A frame the subject lets through between the call and its own
linearization point is therefore obsolete here, as RETIRE.md §5 defines it.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class Tick:
    """One instant on the consumer's clock: a sequence number (total order inside one loop) and the monotonic time."""

    seq: int
    t: float


class ConsumerClock:
    """A logical clock shared by a driver and its consumers (all on one asyncio loop)."""

    def __init__(self) -> None:
        self._seq = itertools.count()
        self.marks: dict[str, Tick] = {}

    def now(self) -> Tick:
        return Tick(next(self._seq), time.monotonic())

    def mark(self, name: str) -> Tick:
        """Record the moment a call under test is made (take it just before awaiting the call)."""
        tick = self.marks[name] = self.now()
        return tick


@dataclass(frozen=True)
class Received:
    at: Tick
    epoch: int
    tokens: tuple[int, ...]
    finished: bool
    revoked: bool
    logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[dict, ...] | None = None


@dataclass
class Observed:
    """Every frame one consumer received, in order, with its receipt tick."""

    frames: list[Received] = field(default_factory=list)

    def record(self, clock: ConsumerClock, frame) -> Received:
        r = Received(clock.now(), int(frame.epoch), tuple(frame.token_ids), bool(frame.finished), bool(frame.revoked),
                     getattr(frame, "logprobs", None), getattr(frame, "top_logprobs", None))
        self.frames.append(r)
        return r

    @property
    def tokens(self) -> tuple[int, ...]:
        return tuple(t for f in self.frames for t in f.tokens)

    def run(self, epoch: int, before: Tick | None = None):
        """What the consumer received of `epoch` (before `before`, if given) as an `oracles.Run`-shaped record:
        tokens, and logprobs / top-k when every such frame carried them."""
        from types import SimpleNamespace

        fs = [f for f in self.frames if f.epoch == epoch and f.tokens and (before is None or f.at < before)]
        toks = tuple(t for f in fs for t in f.tokens)
        have = bool(fs) and all(f.logprobs is not None for f in fs)
        return SimpleNamespace(tokens=toks, logprobs=tuple(x for f in fs for x in f.logprobs) if have else None,
                               top_logprobs=tuple(x for f in fs for x in (f.top_logprobs or ())) if have else None)

    def obsolete(self, call: Tick | None, epoch: int) -> int:
        """Tokens of epochs <= `epoch` received after `call` (None: no SUPERSEDE of that epoch was called)."""
        if call is None:
            return 0
        return sum(len(f.tokens) for f in self.frames if f.epoch <= epoch and f.at > call)


async def caught_up(rounds: int = 3) -> None:
    """Let every consumer task process what has already been delivered to this process before the driver acts: a
    few scheduling rounds of the event loop (no time passes; nothing waits on a clock). A barrier on the engine's
    state returns right after vLLM delivered the outputs of the step it observed; without this, the consumer would
    receive those frames only after the driver's next call, and a call made "now" would race its own consumer."""
    import asyncio

    for _ in range(rounds):
        await asyncio.sleep(0)


async def observe(eng, scope: str, epoch: int | None, clock: ConsumerClock, log: Observed, *,
                  tenant: str = "default", stop=None, on_frame=None) -> Observed:
    """Consume one version's stream as a client would, stamping every frame into `log`. `stop(received)` (optional)
    ends the consumption early when it returns True (e.g. at the first obsolete frame of an ungated negative
    control, whose stream may never end); `on_frame(received)` sees every frame."""
    async for f in eng.stream(scope, epoch, tenant):
        r = log.record(clock, f)
        if on_frame is not None:
            on_frame(r)
        if stop is not None and stop(r):
            break
    return log
