"""Engine barriers for step-by-step driving in tests, benchmarks and the demo (no sleeps).

Invariant: `HoldSuccessor(eng, scope)` makes the next SUPERSEDE of `scope` admit its successor with the certified
block table installed but unscheduled; `release()` (or leaving the context) lets it run. Between the two, no step of
the successor executes, so a test can act between ALIGN/RESUME and the successor's first forward pass.
"""
from __future__ import annotations


class HoldSuccessor:
    def __init__(self, eng, scope: str, tenant: str = "default"):
        self.eng, self.key = eng, eng.table.key(tenant, scope)
        self.released = False

    async def __aenter__(self) -> "HoldSuccessor":
        await self.eng.backend.sched("arm", {"scope": self.key, "hook": {"hold": True}})
        return self

    async def release(self) -> bool:
        self.released = True
        return await self.eng.backend.sched("release", {"scope": self.key})

    async def __aexit__(self, *exc) -> None:
        if not self.released:
            await self.eng.backend.sched("disarm", {"scope": self.key})
            await self.release()


class LandInStep:
    """Land a SUPERSEDE at an exact safe point: hold the worker at decoder layer `layer` of the next armed (long)
    step (of the next one that runs internal request `req_id`, when given: another tenant's step passes), let the
    test issue the SUPERSEDE (its mailbox entry is posted before its ADD is sent), then release.

        async with LandInStep(eng, layer=4) as land:
            await land.paused()                       # the worker is inside the step, at layer 4
            task = asyncio.ensure_future(eng.supersede(...))
            await land.posted(old_internal_id)        # the revocation is visible to the worker
        tr = await task                               # leaving the block released the worker
    """

    def __init__(self, eng, layer: int, req_id: str | None = None):
        self.mb = eng.backend.mailbox
        self.layer, self.req_id = layer, req_id

    async def __aenter__(self) -> "LandInStep":
        self.mb.arm_pause(self.layer, self.req_id)
        return self

    async def paused(self, timeout: float = 300.0) -> None:
        await self.mb.wait_paused(timeout)

    async def posted(self, req_id: str, timeout: float = 60.0) -> None:
        import asyncio
        import time
        t0 = time.monotonic()
        while not self.mb.is_posted(req_id):
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"revocation of {req_id} never posted")
            await asyncio.sleep(0.001)

    async def next_step(self, layer: int = 0, timeout: float = 300.0) -> None:
        """From a pause at layer > `layer` of one step, move the hold to `layer` of the NEXT armed step: release,
        wait until the worker has left the pause (its own acknowledgement), re-arm, and wait until it is held again.
        The current step has already passed `layer`, so the new hold can only land in a later step."""
        import asyncio
        import time
        if self.layer <= layer:
            raise ValueError(f"the hold is at layer {self.layer}; next_step({layer}) could land in the same step")
        self.mb.release()
        t0 = time.monotonic()
        while self.mb.paused():
            if time.monotonic() - t0 > timeout:
                raise TimeoutError("worker never left the pause")
            await asyncio.sleep(0.001)
        self.layer = layer
        self.mb.arm_pause(layer, self.req_id)
        await self.paused(timeout)

    async def __aexit__(self, *exc) -> None:
        self.mb.release()


async def wait_engine(eng, scope: str, *, frontier: int | None = None, out_tokens: int | None = None,
                      epoch: int | None = None, tenant: str = "default") -> dict | None:
    """Barrier on the engine's own view of a version: return once its writer frontier reaches `frontier` and/or
    it has generated `out_tokens` output tokens, or once it left the scheduler (returns None then). Each poll is
    answered by EngineCore between two steps, so this never sleeps."""
    return await _poll_state(eng, scope, epoch, tenant, lambda st, n_out: (
        (frontier is None or st["frontier"] >= frontier) and (out_tokens is None or n_out >= out_tokens)))


async def wait_drafts(eng, scope: str, *, accepted: int = 1, out_tokens: int = 0, epoch: int | None = None,
                      tenant: str = "default") -> dict | None:
    """Barrier for speculative decoding: return once the version has had draft tokens verified with >= `accepted` of
    them accepted (counted by RetireScheduler when it commits the step) and has generated >= `out_tokens` tokens, or
    None once it left the scheduler. Like `wait_engine`, every poll is answered between two engine steps."""
    return await _poll_state(eng, scope, epoch, tenant,
                             lambda st, n_out: st.get("accepted", 0) >= accepted and n_out >= out_tokens)


async def _poll_state(eng, scope: str, epoch: int | None, tenant: str, done) -> dict | None:
    """Poll the engine's view of one version (`request_state`, answered between two steps) until `done(state,
    output_tokens)`; None once the version left the scheduler."""
    s = eng.table.get(tenant, scope)
    v = s.versions[s.epoch if epoch is None else epoch]
    while True:
        st = await eng.backend.sched("request_state", {"req_id": v.internal_id})
        if st is None:
            return None
        if done(st, st["num_tokens"] - len(v.prompt)):
            return st
