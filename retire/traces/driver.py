"""Replay driver: revision arrivals from a trace, replayed against one RetireEngine facade (paper Figure 6 / Table 9).

Workload. Each scope of the trace is an agent task: epoch 0 is a prompt of `prompt_len` tokens with a decode of
`decode_tokens` greedy tokens, submitted `lead_s` trace seconds before the scope's first transition. Each transition
of the scope is a SUPERSEDE(e -> e+1) whose prompt shares its first `shared_fraction` of tokens with its predecessor
(the caller's `prompt_of(scope_index, epoch)` builds the chain, e.g. with `conformance/fixtures/prompts.revise`).
The last version of a scope is its *final version*. Every version gets one consumer, started when its version is
admitted; arrivals are issued at the trace's times divided by `time_scale` (the stated compression factor; sleeping
until an arrival IS the workload, not synchronization). A scope issues its SUPERSEDEs in order (compare-and-swap on
the epoch), so an arrival that finds the previous SUPERSEDE still in flight is issued late; the lag is recorded.

Invariants of the measurement (what every figure means):
- Obsolete tokens are counted by the consumer's clock (`retire.trials.observe`): a token of version e is *obsolete*
  if its consumer received it after the driver called `supersede(e -> e+1)` (the call is marked on the clock just
  before it is awaited), else *current*. The driver never asks the subject which epoch is current. The facade's own
  counter (`stats()`, counted from its ADVANCE) is reported beside it; it can only be lower or equal.
- A final version is *advanced* when its consumer received all `decode_tokens` tokens and a finished frame before
  the cleanup limit (`cleanup_limit_s` wall seconds after the last arrival).
- Goodput = current-version tokens delivered / horizon, horizon = replay start -> the last final version's last frame
  (or the cleanup limit when a final version did not finish). `final_goodput` counts final-version tokens only: it is
  the figure compared with the ideal arm, which runs only the final versions, as fresh requests with no predecessor,
  at their arrival times (every revision costs nothing).
- Cleanup latency = `Transition.fence_latency` (SUPERSEDE call -> the predecessor's last writer closed, engine side).
- The live-execution timeline is exact, not sampled: a version is live from its admission until the engine closed it
  (`sched("closed_at")`, or its consumer's finished frame for a natural finish); it counts as *current* from its
  submission (epoch 0) or its ADVANCE (a successor) until its revocation, and as *obsolete* after.
- Nothing here judges correctness: `judge_finals` compares each final version with a clean run on a stock oracle
  engine (exact first; else vLLM's logprob-closeness rule, since a replayed final version runs batched with other
  scopes, an execution shape no single clean run reproduces). A trial with a failing final version is not admitted.
"""
from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .quantum import QuantumSelector, first_quantum, set_quantum

now = time.monotonic
PromptOf = Callable[[int, int], list]


@dataclass(frozen=True)
class Workload:
    prompt_len: int = 384
    decode_tokens: int = 96
    shared_fraction: float = 0.9
    time_scale: float = 10.0       # compression: trace seconds per wall second
    lead_s: float = 2.0            # trace seconds between a task's start and its first transition
    cleanup_limit_s: float = 60.0  # wall seconds after the last arrival
    consumer_delay_s: float = 0.0  # slow consumer: seconds per frame (SlowConsumer fault), 0 = none
    logprobs: int = 5

    def sampling(self):
        from vllm import SamplingParams
        return SamplingParams(max_tokens=self.decode_tokens, temperature=0, ignore_eos=True, logprobs=self.logprobs)


@dataclass(frozen=True)
class VersionPlan:
    scope: str
    index: int      # scope index (for prompt_of)
    epoch: int
    t: float        # wall seconds from replay start
    final: bool


def trace_arrivals(df) -> list[tuple[float, str]]:
    """(seconds since the first transition, scope) from a canonical transition frame (e.g. `read_trace_jsonl`)."""
    from .window import times_ns
    ns = times_ns(df)
    if not len(ns):
        return []
    t0 = int(ns.min())
    return sorted(((int(t) - t0) / 1e9, str(s)) for t, s in zip(ns, df["scope"].astype(str)))


def poisson_arrivals(rate: float, scopes: int, duration: float, seed: int = 0) -> list[tuple[float, str]]:
    """Revision arrivals for the rate matrix: a Poisson process of `rate` per scope per second over `duration` trace
    seconds for each of `scopes` scopes (`s0`, `s1`, ...). Rate 0 gives no transition (tasks run unrevised)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    out = []
    for k in range(scopes):
        t = 0.0
        while rate > 0:
            t += float(rng.exponential(1.0 / rate))
            if t >= duration:
                break
            out.append((t, f"s{k}"))
    return sorted(out)


def plan(arrivals: Sequence[tuple[float, str]], w: Workload, scopes: Sequence[str] = ()) -> list[VersionPlan]:
    """Every version of every scope with its wall time (the earliest task starts at 0). `scopes` adds tasks without
    any transition (rate 0), started with the earliest task."""
    first: dict[str, float] = {}
    count: dict[str, int] = {}
    for t, s in arrivals:
        first.setdefault(s, t)
        count[s] = count.get(s, 0) + 1
    starts = {s: t - w.lead_s for s, t in first.items()}
    for s in scopes:
        starts.setdefault(s, min(starts.values(), default=0.0))
        count.setdefault(s, 0)
    names = sorted(starts, key=lambda s: (starts[s], s))
    off = min(starts.values()) if starts else 0.0
    out, seen = [], {s: 0 for s in names}
    for s in names:
        out.append(VersionPlan(s, names.index(s), 0, (starts[s] - off) / w.time_scale, count[s] == 0))
    for t, s in sorted(arrivals):
        seen[s] += 1
        out.append(VersionPlan(s, names.index(s), seen[s], (t - off) / w.time_scale, seen[s] == count[s]))
    return sorted(out, key=lambda v: (v.t, v.scope, v.epoch))


def prompt_chain(first: Callable[[int], list], revise: Callable[..., list], length: int,
                 shared_fraction: float, seed: int = 0) -> PromptOf:
    """`prompt_of(scope_index, epoch)`: epoch 0 is `first(scope_index)`; epoch e+1 is `revise(prompt_e, lcp, length,
    seed)` with lcp = shared_fraction * length (`conformance/fixtures/prompts.revise`: the LCP with the predecessor is
    exactly lcp). Memoized, so every arm replays the same prompts."""
    memo: dict = {}
    lcp = int(shared_fraction * length)

    def prompt_of(i: int, e: int) -> list:
        if (i, e) not in memo:
            memo[(i, e)] = list(first(i)) if e == 0 else revise(prompt_of(i, e - 1), lcp, length,
                                                                   seed + 7919 * i + 104729 * e)
        return memo[(i, e)]
    return prompt_of


@dataclass
class Output:
    """The comparator shape (`oracles.compare`): tokens, logprobs, top_logprobs."""
    tokens: tuple
    logprobs: tuple | None
    top_logprobs: tuple | None


@dataclass
class VersionRecord:
    plan: VersionPlan
    key: str
    prompt: list
    t_call: float = 0.0                 # submit / supersede call
    lag: float = 0.0                    # call time - scheduled arrival time
    internal_id: str = ""
    transition: Any = None              # the Transition that created this version (epoch > 0)
    t_revoked: float | None = None      # ADVANCE of the successor
    superseded: Any = None              # consumer-clock Tick of the supersede call that revoked this version
    t_closed: float | None = None       # engine: left the scheduler
    t_first: float | None = None
    t_last: float | None = None
    finished: bool = False
    current_tokens: int = 0
    obsolete_tokens: int = 0
    tokens: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    tops: list = field(default_factory=list)
    ok: bool | None = None
    verdict: str = ""

    def output(self) -> Output:
        return Output(tuple(self.tokens), tuple(self.logprobs) if self.logprobs else None,
                      tuple(self.tops) if self.tops else None)


@dataclass
class ArmResult:
    arm: str
    workload: Workload
    t0: float
    t_last_arrival: float
    records: list[VersionRecord]
    facade_obsolete: int               # stats()["obsolete_tokens_published"] delta over the arm
    quanta: list = field(default_factory=list)  # (t, quantum) set during the arm

    @property
    def finals(self) -> list[VersionRecord]:
        return [r for r in self.records if r.plan.final]

    def advanced(self) -> int:
        n = self.workload.decode_tokens
        return sum(1 for r in self.finals if r.finished and len(r.tokens) == n)

    def horizon(self) -> float:
        lim = self.t_last_arrival + self.workload.cleanup_limit_s
        if self.advanced() < len(self.finals):
            return lim - self.t0
        return max([r.t_last for r in self.finals if r.t_last] + [self.t0]) - self.t0

    def timeline(self) -> list[dict]:
        """Step points {t, current, obsolete} (t = wall seconds from replay start), one per change."""
        ev = []
        end = max([r.t_last or 0 for r in self.records] + [self.t0 + self.horizon()])
        for r in self.records:
            closed = r.t_closed if r.t_closed is not None else (r.t_last if r.finished else end)
            if r.t_revoked is not None and r.t_closed is None and r.finished and (r.t_last or 0) <= r.t_revoked:
                closed = r.t_last  # finished naturally before it was revoked: never live-obsolete
            start = r.t_call if r.transition is None else r.transition.t_call + _advance(r.transition)
            ev.append((start, 0, "current", +1))  # a successor is current from its ADVANCE
            if r.t_revoked is not None and r.t_revoked < closed:
                ev += [(r.t_revoked, 1, "current", -1), (r.t_revoked, 1, "obsolete", +1), (closed, 2, "obsolete", -1)]
            else:
                ev.append((closed, 2, "current", -1))
        pts, c = [{"t": 0.0, "current": 0, "obsolete": 0}], {"current": 0, "obsolete": 0}
        for t, _, k, d in sorted(ev, key=lambda e: (e[0], e[1])):
            c[k] += d
            p = {"t": round(t - self.t0, 4), **c}
            if pts[-1]["t"] == p["t"]:
                pts[-1] = p
            else:
                pts.append(p)
        return pts

    def metrics(self) -> dict:
        h = self.horizon()
        cur = sum(r.current_tokens for r in self.records)
        fin = sum(r.current_tokens for r in self.finals)
        ttft = [r.t_first - r.t_call for r in self.finals if r.t_first is not None]
        trs = [r.transition for r in self.records if r.transition is not None]
        fence = [t.fence_latency for t in trs if t.fence_latency is not None]
        tl = self.timeline()
        return {
            "obsolete_tokens_published": sum(r.obsolete_tokens for r in self.records),
            "facade_obsolete_counter": self.facade_obsolete,
            "final_versions_advanced": self.advanced(), "final_versions_total": len(self.finals),
            "current_tokens": cur, "final_tokens": fin, "horizon_s": h,
            "goodput_tok_s": cur / h if h > 0 else None, "final_goodput_tok_s": fin / h if h > 0 else None,
            "final_ttft_s_median": statistics.median(ttft) if ttft else None,
            "cleanup_latency_s_median": statistics.median(fence) if fence else None,
            "cleanup_latency_s_max": max(fence) if fence else None, "transitions": len(trs),
            "max_live_obsolete": max(p["obsolete"] for p in tl), "max_live_current": max(p["current"] for p in tl),
            "arrival_lag_s_max": max((r.lag for r in self.records), default=0.0),
            "inherited_tokens_total": sum(int(t.inherited_tokens or 0) for t in trs),
            "fence_paths": dict(Counter(t.receipts[0].path if t.receipts else "native-abort" for t in trs)),
            "supersede_call_s_median": statistics.median(adm) if (adm := [t.timings["admit"] for t in trs
                                                                          if "admit" in t.timings]) else None,
        }


def _advance(tr) -> float:
    """Seconds from the SUPERSEDE call to the frontend's ADVANCE (retire: "advance_frontend"; native: "advance")."""
    return tr.timings.get("advance_frontend", tr.timings.get("advance", 0.0))


class _Replay:
    """One arm's replay in progress: the version records, the consumers it started, the quanta it set, the clock."""

    def __init__(self, eng, w: Workload, sp, recs: dict, plans: Sequence[VersionPlan], *, ideal: bool,
                 sel: "QuantumSelector | None", quanta: list):
        from ..trials.observe import ConsumerClock

        self.eng, self.w, self.sp, self.recs, self.ideal, self.sel, self.quanta = eng, w, sp, recs, ideal, sel, quanta
        self.arrivals_trace = sorted(p.t * w.time_scale for p in plans if p.epoch > 0)
        self.n_scopes = len({p.scope for p in plans})
        self.consumers: list[asyncio.Task] = []
        self.before = eng.stats()["obsolete_tokens_published"]
        self.clock = ConsumerClock()
        self.t0 = now() + 0.05

    async def consume(self, r: VersionRecord) -> None:
        """Receive every frame of `r`; a token is obsolete when it arrived after the SUPERSEDE of its version."""
        async for f in self.eng.stream(r.key, 0 if self.ideal else r.plan.epoch):
            t = now()
            if f.token_ids:
                if r.superseded is not None and self.clock.now() > r.superseded:  # received after the call
                    r.obsolete_tokens += len(f.token_ids)
                else:
                    r.current_tokens += len(f.token_ids)
                r.t_first = r.t_first or t
                r.t_last = t
                r.tokens.extend(f.token_ids)
                if f.logprobs is not None:
                    r.logprobs.extend(f.logprobs)
                    r.tops.extend(f.top_logprobs or ())
            if f.finished and not f.revoked:
                r.finished, r.t_last = True, t

    async def arrive(self, p: VersionPlan) -> None:
        """Issue version `p` at its arrival time (submit, or SUPERSEDE of its predecessor) and start its consumer."""
        eng, r = self.eng, self.recs[(p.scope, p.epoch)]
        delay = self.t0 + p.t - now()
        if delay > 0:
            await asyncio.sleep(delay)  # the trace's clock: the arrival time IS the workload
        if self.sel is not None and p.epoch > 0:
            q = self.sel.choose(self.sel.observed_rate(self.arrivals_trace, p.t * self.w.time_scale, self.n_scopes))
            if q != self.quanta[-1][1]:
                self.quanta.append((round(now() - self.t0, 4), await set_quantum(eng, q)))
        r.t_call = now()
        r.lag = r.t_call - (self.t0 + p.t)
        if self.ideal or p.epoch == 0:
            await eng.submit(r.key, r.prompt, self.sp)
        else:
            prev = self.recs[(p.scope, p.epoch - 1)]
            prev.superseded = self.clock.mark(f"supersede:{r.key}:{p.epoch - 1}")
            tr = await eng.supersede(r.key, p.epoch - 1, r.prompt, self.sp)
            r.transition = tr
            prev.t_revoked = tr.t_call + _advance(tr)
        r.internal_id = eng.internal_id(r.key, 0 if self.ideal else p.epoch)
        self.consumers.append(asyncio.ensure_future(self.consume(r)))

    async def scope_task(self, vs: list[VersionPlan]) -> None:
        for p in sorted(vs, key=lambda v: v.epoch):  # a scope's SUPERSEDEs go in epoch order (compare-and-swap)
            await self.arrive(p)

    async def finish(self) -> float:
        """Wait for the consumers up to the cleanup limit (cancel the rest); the time of the last arrival."""
        t_last_arrival = now()
        pending = [c for c in self.consumers if not c.done()]
        if pending:
            _, pending = await asyncio.wait(pending, timeout=self.w.cleanup_limit_s)
        for c in pending:  # past the cleanup limit: stop consuming; drain() consumes the rest unrecorded
            c.cancel()
        await asyncio.gather(*self.consumers, return_exceptions=True)
        return t_last_arrival


async def run_arm(eng, arm: str, plans: Sequence[VersionPlan], prompt_of: PromptOf, w: Workload, *,
                  label: str = "", quantum: int | QuantumSelector | None = None, ideal: bool = False,
                  reset_cache: bool = True) -> ArmResult:
    """Replay `plans` on facade `eng` (its policy is the arm's). `ideal=True` runs only the final versions, each as a
    fresh scope submitted at its arrival time. `quantum` sets the engine's step-token budget for the arm (an int) or
    lets a `QuantumSelector` set it at every arrival; it is restored to the engine default afterwards."""
    from ..faults import SlowConsumer

    sp = w.sampling()
    if reset_cache:
        await eng.backend.reset_prefix_cache()
    quanta = await first_quantum(eng, quantum)
    todo = [p for p in plans if p.final] if ideal else list(plans)
    # one facade scope per trace scope (every version shares its key); the ideal arm: one fresh scope per final version
    recs = {(p.scope, p.epoch): VersionRecord(p, f"{label}{arm}.{p.scope}" + ("#final" if ideal else ""),
                                              list(prompt_of(p.index, p.epoch))) for p in todo}
    rp = _Replay(eng, w, sp, recs, plans, ideal=ideal, quanta=quanta,
                 sel=quantum if isinstance(quantum, QuantumSelector) else None)
    by_scope: dict[str, list[VersionPlan]] = {}
    for p in todo:
        by_scope.setdefault(p.scope, []).append(p)
    fault = SlowConsumer(w.consumer_delay_s) if w.consumer_delay_s > 0 else None
    try:
        if fault is not None:
            await fault.inject(eng)
        await asyncio.gather(*(rp.scope_task(vs) for vs in by_scope.values()))
        t_last_arrival = await rp.finish()
    finally:
        if fault is not None and fault.injected:
            await fault.heal()
        if quanta:
            await set_quantum(eng, None)
    ids = [r.internal_id for r in recs.values() if r.internal_id]
    closed = await eng.backend.sched("closed_at", {"req_ids": ids})
    for r in recs.values():
        r.t_closed = closed.get(r.internal_id)
    res = ArmResult(arm, w, rp.t0, t_last_arrival, sorted(recs.values(), key=lambda r: (r.plan.t, r.plan.scope)),
                    eng.stats()["obsolete_tokens_published"] - rp.before, quanta)
    await eng.drain()
    return res


async def judge_finals(res: ArmResult, oracle, cache: dict | None = None) -> bool:
    """Check every final version that delivered output against a clean run of its prompt on the stock oracle engine:
    exact, else the logprob-closeness rule (batched execution shape). A final version that did not finish is compared
    on the tokens it delivered. Sets each final record's `ok`/`verdict`; True iff all passed."""
    from oracles.compare import compare_logprobs_close, compare_tokens

    cache = {} if cache is None else cache
    sp = res.workload.sampling()
    ok = True
    for r in res.finals:
        if not r.tokens:  # nothing published: no wrong output (progress is reported by `advanced`, not here)
            r.ok, r.verdict = True, "no output (not advanced)"
            continue
        k = tuple(r.prompt)
        if k not in cache:
            cache[k] = await oracle.clean_run(r.prompt, sp)
        ref = cache[k]
        n = len(r.tokens)
        ref_n = Output(tuple(ref.tokens[:n]), tuple(ref.logprobs[:n]) if ref.logprobs else None,
                       tuple(ref.top_logprobs[:n]) if ref.top_logprobs else None)
        sub = r.output()
        if compare_tokens(subject=sub, oracle=ref_n, subject_name=res.arm, oracle_name="clean_run"):
            r.ok, r.verdict = True, "exact"
            continue
        v = compare_logprobs_close(subject=sub, oracle=ref_n, subject_name=res.arm, oracle_name="clean_run")
        r.ok, r.verdict = bool(v), ("tolerant" if v else f"FAIL: {v.detail}")
        ok = ok and r.ok
    return ok and all(r.ok for r in res.finals)
