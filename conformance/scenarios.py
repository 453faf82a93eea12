"""Scenario helpers of the conformance suite. The revision driver itself is the packaged one
(`retire.trials.revision_trial`, shared with the demo and perf); here is only the publication observer.

Invariant: an observer stands outside the subject. A token is obsolete when the consumer received it after the test
marked its `supersede` call on the shared consumer clock (`retire.trials.ConsumerClock`); the subject's `revoked` flag,
epoch table and counters are never consulted. So a frame the subject lets through between the call and its own
linearization point counts, as RETIRE.md §5 defines "published after supersede was called".
"""
from __future__ import annotations

from retire.trials import ConsumerClock, Observed, observe

__all__ = ["abort_all", "count_obsolete", "mark_supersede", "supersede_mark", "within"]


def supersede_mark(scope: str, epoch: int = 0) -> str:
    return f"supersede:{scope}:{epoch}"


async def mark_supersede(eng, clock: ConsumerClock, scope: str, expected_epoch: int, *args, **kw):
    """`eng.supersede(scope, expected_epoch, ...)`, with the call's moment marked on `clock` just before it."""
    clock.mark(supersede_mark(scope, expected_epoch))
    return await eng.supersede(scope, expected_epoch, *args, **kw)


async def count_obsolete(eng, scope: str, clock: ConsumerClock, got: dict, *, gated: bool, on_tokens=None,
                         tenant: str = "default") -> Observed:
    """Consume epoch 0 of `scope` as a client would and count, in `got["obsolete"]`, the tokens it received after the
    SUPERSEDE of epoch 0 was called (marked with `mark_supersede`). Ungated, the first obsolete frame is proof enough
    and consumption stops there (the revoked stream may never end). `on_tokens(token_ids)` sees every frame."""
    key = supersede_mark(scope, 0)
    log = Observed()

    def on_frame(r):
        call = clock.marks.get(key)
        if call is not None and r.tokens and r.at > call:
            got["obsolete"] += len(r.tokens)
        if on_tokens is not None:
            on_tokens(list(r.tokens))

    def stop(r):
        return not gated and got["obsolete"] > 0

    return await observe(eng, scope, 0, clock, log, tenant=tenant, stop=stop, on_frame=on_frame)


async def within(aw, seconds: float, what: str):
    """Await `aw`, failing after `seconds` with a message naming what it waited for (a hang becomes a failure that
    says what never happened, instead of a suite that stalls)."""
    import asyncio

    try:
        return await asyncio.wait_for(aw, seconds)
    except asyncio.TimeoutError:
        raise AssertionError(f"waited {seconds:.0f} s for {what}: it never happened (hang)") from None


async def abort_all(eng) -> None:
    """Cleanup for a private facade a failing test may leave inconsistent: abort the request of EVERY version it ever
    created (frontend and engine; a version the facade thinks finished may still run in the engine when frontend and
    engine disagree, and aborting a finished request is a no-op), so no stream waits and nothing keeps computing;
    then close the facade."""
    ids = [v.internal_id for s in list(eng.table.scopes.values()) for v in s.versions.values() if v.internal_id]
    for i in ids:
        await eng.backend.abort(i)  # frontend (ends the stream) and engine
    await eng.close()
