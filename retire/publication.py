"""Publication gates, frontend side: what one version's consumer may see (gates (b) and (c)).

Invariants (policy "retire", gates on):
- No token of a version is yielded after its successor's SUPERSEDE was called and accepted. While a SUPERSEDE of the
  version is in flight (`Version.hold`, from the call on), a dequeued frame waits for its outcome: accepted, it is dropped (the
  version is revoked); refused, it is delivered. Frames already queued when the version was revoked are counted as
  suppressed, never yielded (gate (c)); frames still in flight from EngineCore are dropped at entry because the
  revoked request was forgotten by the output processor (gate (b), in the facade).
- A revoked version's stream ends with exactly one empty `Frame(revoked=True, finished=True)`.
- Under the native policies, and with the gates switched off (a negative control), a revoked version's frames are
  yielded and counted in `obsolete_tokens_published`: that counter measures the problem.
"""
from __future__ import annotations

import time
from typing import AsyncIterator

from .authority import Version
from .types import Frame

now = time.monotonic


def _frame(v: Version, out, toks: tuple, finished: bool, aborted: bool) -> Frame:
    co = out.outputs[0] if out.outputs else None
    lps = top = None
    if co is not None and co.logprobs:
        lps = tuple(float(d[t].logprob) for t, d in zip(toks, co.logprobs))
        top = tuple({int(k): float(x.logprob) for k, x in d.items()} for d in co.logprobs)
    return Frame(v.scope, v.epoch, toks, finished and not aborted, revoked=v.revoked and aborted, logprobs=lps,
                 num_cached_tokens=out.num_cached_tokens, top_logprobs=top)


async def publish(eng, v: Version) -> AsyncIterator[tuple[Frame, object | None]]:
    gated = eng.policy == "retire" and eng.seams.gates
    while not v.finished:
        q = v.collector
        await v.settled()
        if gated and v.revoked:  # gate (c) before blocking: count what was queued, publish nothing
            _suppress(eng, q.get_nowait())
            yield _end_revoked(v), None
            return
        out = q.get_nowait() or await q.get()
        for hook in eng.seams.on_dequeue:
            out = await hook(eng, v, out)
        await v.settled()
        if gated and v.revoked:  # gate (c): the frame reached dequeue after ADVANCE
            _suppress(eng, out)
            yield _end_revoked(v), None
            return
        co = out.outputs[0] if out.outputs else None
        toks = tuple(co.token_ids) if co is not None else ()
        aborted = co is not None and co.finish_reason == "abort"
        if toks:
            _count(eng, v, out, len(toks))
        finished = bool(out.finished)
        if finished:
            v.finished = True
        if toks or finished:
            frame = _frame(v, out, toks, finished, aborted)
            yield frame, out
            for hook in eng.seams.after_yield:
                await hook(eng, frame)
        if aborted and toks:
            yield _end_revoked(v), None


def _count(eng, v: Version, out, n: int) -> None:
    v.tokens_out += n
    if v.revoked:
        v.obsolete_published += n
        eng.counters["obsolete_tokens_published"] += n
        eng.counters["obsolete_frames_published"] += 1
    tr = v.transition
    if tr is not None and tr.successor_ttft is None:
        tr.successor_ttft = now() - tr.t_call
        if tr.inherited_tokens is None:
            tr.inherited_tokens = int(out.num_cached_tokens or 0)


def _suppress(eng, out) -> None:
    if out is None:
        return
    n = sum(len(o.token_ids) for o in out.outputs)
    eng.counters["obsolete_frames_suppressed"] += 1
    eng.counters["obsolete_tokens_suppressed"] += n


def _end_revoked(v: Version) -> Frame:
    v.finished = True
    return Frame(v.scope, v.epoch, (), finished=True, revoked=True)
