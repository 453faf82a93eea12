"""The window between a SUPERSEDE's call and the engine's ADVANCE: a frame the old version commits there.

Scenario (deterministic, no sleeps): the `long` model prefills a 4096-token prompt in 2048-token steps; the worker is
held at decoder layer 7 of the second (last) prefill step with `LandInStep`; the SUPERSEDE is called there with a
revision that shares the whole running chunk, so the safe point lets the step finish ("finish-step": useful work).
That step samples the old version's first token and commits it AFTER the SUPERSEDE was called and its revocation was
posted, BEFORE EngineCore reads the successor's ADD: the engine's ADVANCE has not happened yet, so engine gate (a)
cannot drop it (it is defense in depth for engines with a step in flight across the SUPERSEDE; it is tested
engine-free in test_core_gate.py, where a gate (a) deletion fails). What keeps the frame from the consumer is the
frontend's publication hold: while a SUPERSEDE of a version is in flight, its dequeued frames wait for the engine's
verdict, and an accepted SUPERSEDE drops them.

Observation, outside the subject: the old version's consumer counts tokens it received after the call by its own
clock (`retire.trials.observe`). The successor's stream is the barrier: EngineCore delivers outputs in order, so
once the successor has finished, every frame of the old version committed before it has reached its consumer.
Guarantee: zero obsolete tokens under retire with its gates on. Negative control: the frontend gates switched off
(facade seam `gates`) -> the consumer receives the token.
"""
from __future__ import annotations

import asyncio

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import repo_prompt, revise
from conformance.scenarios import within
from oracles import collect
from retire.barriers import LandInStep, wait_engine
from retire.trials import ConsumerClock, Observed, observe

UNIT = 2048
SP_OLD = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


async def _finish_step_after_the_call(h, scope: str, seed: int) -> dict:
    eng = h.retire
    prompt = repo_prompt(2 * UNIT, seed=seed)
    revised = revise(prompt, len(prompt), len(prompt) + 64, seed=seed)  # shares the whole prompt: finish the step
    await eng.backend.sched("set_step_tokens", {"tokens": UNIT})
    clock, log = ConsumerClock(), Observed()
    await eng.submit(scope, prompt, SP_OLD)
    old = asyncio.ensure_future(observe(eng, scope, 0, clock, log))
    try:
        await wait_engine(eng, scope, frontier=UNIT, epoch=0)  # step 1 done; step 2 (the last chunk) is next
        async with LandInStep(eng, 7, eng.internal_id(scope, 0)) as barrier:
            await barrier.paused()
            call = clock.mark("supersede")
            task = asyncio.ensure_future(eng.supersede(scope, 0, revised, SP_NEW))
            await barrier.posted(eng.internal_id(scope, 0), timeout=30)
        tr = await task
        new = await within(collect(eng, scope, 1), 120, "the successor to finish")
    finally:
        old.cancel()  # with the gates off the revoked stream never ends by itself
        await asyncio.gather(old, return_exceptions=True)
    return {"tr": tr, "new": new, "obsolete": log.obsolete(call, 0)}


def _window(h, gates: bool) -> dict:
    eng = h.retire
    eng.seams.gates = gates  # the Harness teardown resets every seam
    return h.run(_finish_step_after_the_call(h, f"gw{int(gates)}", seed=700 + gates), timeout=300)


@pytest.mark.timeout(400)
def test_frame_committed_between_call_and_advance_is_not_published(long8k):
    r = _window(long8k, gates=True)
    (receipt,) = r["tr"].receipts
    assert receipt.path == "finish-step", f"scenario did not happen as designed: {receipt}"
    assert len(r["new"].tokens) == SP_NEW.max_tokens
    assert r["obsolete"] == 0, f"{r['obsolete']} obsolete token(s) reached the consumer"


@pytest.mark.timeout(400)
def test_negative_control_gates_off_the_frame_is_published(long8k):
    r = _window(long8k, gates=False)
    (receipt,) = r["tr"].receipts
    assert receipt.path == "finish-step", f"scenario did not happen as designed: {receipt}"
    assert r["obsolete"] >= 1, r
