"""Current-version publication: zero tokens of a revoked epoch reach a consumer under "retire".

Oracle: the consumer's own clock. A frame of epoch e the consumer received after the test called `supersede(e ->
e+1)` is obsolete by definition (`conformance.scenarios.count_obsolete`); the subject's revoked flag and counters are
never consulted. The native policies are the positive control that the scenario does expose queued frames; the
test-only gate switch is the negative control for the retire gates. Gate (a) alone: `test_gate_a.py`.
"""
import asyncio

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from conformance.scenarios import count_obsolete, mark_supersede, supersede_mark
from retire.trials import ConsumerClock, caught_up
from retire.barriers import wait_engine
from retire.faults import LateCompletion, ReleaseAtCall, SlowConsumer

SP_OLD = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
TRIALS = 18


async def _trial(eng, scope: str, after: int, seed: int, *, lag: int = 4, stop_on_obsolete: bool = False) -> int:
    """Slow consumer reads the old version; once it has `after` tokens and the engine has produced `lag` more
    (queued for the consumer), SUPERSEDE. Returns obsolete tokens the consumer saw."""
    prompt = tokens(96, seed)
    await eng.submit(scope, prompt, SP_OLD)
    reached = asyncio.Event()
    seen = {"n": 0, "obsolete": 0}
    clock = ConsumerClock()

    def on_tokens(ids):
        seen["n"] += len(ids)
        if seen["n"] >= after:
            reached.set()

    task = asyncio.ensure_future(count_obsolete(eng, scope, clock, seen, gated=not stop_on_obsolete,
                                                on_tokens=on_tokens))
    await reached.wait()
    await wait_engine(eng, scope, out_tokens=seen["n"] + lag, epoch=0)  # engine-visible lag, no sleep
    await caught_up()  # the consumer has taken what was delivered so far (it sleeps 50 ms per frame: usually nothing)
    await mark_supersede(eng, clock, scope, 0, revise(prompt, 64, 90, seed), SP_NEW)
    await task
    async for _ in eng.stream(scope, 1):
        pass
    return seen["obsolete"]


def _run_trials(h, eng, *, stop_on_obsolete=False):
    async def go():
        out = []
        async with SlowConsumer(0.05).on(eng):
            for i in range(TRIALS):
                out.append(await _trial(eng, f"pub{i}", 1 + i % 9 * 2, 100 + i, lag=1 + i % 8,
                                        stop_on_obsolete=stop_on_obsolete))
        return out
    return h.run(go())


def test_native_abort_publishes_obsolete_tokens_with_a_slow_consumer(unit):
    """The problem, measured (positive control): native abort delivers queued frames of the old version."""
    per_trial = _run_trials(unit, unit.native_cold)
    assert sum(per_trial) > 0, per_trial
    # the facade counts from its ADVANCE, the consumer from the call: the outside count can only be larger
    assert sum(per_trial) >= unit.native_cold.stats()["obsolete_tokens_published"] > 0
    print(f"\nnative-cold obsolete tokens over {TRIALS} trials: {sum(per_trial)} {per_trial}")


def test_retire_publishes_zero_obsolete_tokens(unit):
    per_trial = _run_trials(unit, unit.retire)
    st = unit.retire.stats()
    assert sum(per_trial) == 0 and st["obsolete_tokens_published"] == 0, (per_trial, st)
    assert st["obsolete_frames_suppressed"] > 0  # the gate had something to suppress
    print(f"\nretire: 0 obsolete tokens, {st['obsolete_tokens_suppressed']} suppressed over {TRIALS} trials")


def test_negative_control_retire_with_gates_disabled_leaks(unit):
    unit.retire.seams.gates = False
    per_trial = _run_trials(unit, unit.retire, stop_on_obsolete=True)
    assert sum(per_trial) > 0, "with the gates off the same scenario must expose obsolete tokens"


async def _late_completion(eng, scope: str, *, gated: bool) -> tuple[int, LateCompletion]:
    prompt = tokens(80, 7)
    fault = LateCompletion(scope, 0)
    async with fault.on(eng):
        await eng.submit(scope, prompt, SP_OLD)
        clock = ConsumerClock()
        got = {"obsolete": 0}
        task = asyncio.ensure_future(count_obsolete(eng, scope, clock, got, gated=gated))
        await fault.held.wait()            # a frame of epoch 0 is committed and held before dequeue
        await mark_supersede(eng, clock, scope, 0, revise(prompt, 64, 80, 7), SP_NEW)  # ADVANCE releases it
        await task
    async for _ in eng.stream(scope, 1):
        pass
    return got["obsolete"], fault


def test_late_completion_is_suppressed(unit):
    obsolete, fault = unit.run(_late_completion(unit.retire, "late", gated=True))
    assert fault.released == 1 and fault.held_tokens > 0
    assert obsolete == 0 and unit.retire.stats()["obsolete_tokens_published"] == 0
    assert unit.retire.stats()["obsolete_frames_suppressed"] >= 1


@pytest.mark.parametrize("mode", ["gates-off", "native"])
def test_negative_control_late_completion_leaks(unit, mode):
    eng = unit.native_prefix if mode == "native" else unit.retire
    if mode == "gates-off":
        eng.seams.gates = False
    obsolete, fault = unit.run(_late_completion(eng, "late", gated=False))
    assert fault.released == 1 and obsolete >= fault.held_tokens > 0


async def _released_at_the_call(eng, scope: str, *, gated: bool) -> tuple[int, ReleaseAtCall]:
    prompt = tokens(80, 8)
    fault = ReleaseAtCall(scope, 0)
    async with fault.on(eng):
        await eng.submit(scope, prompt, SP_OLD)
        clock, got = ConsumerClock(), {"obsolete": 0}
        task = asyncio.ensure_future(count_obsolete(eng, scope, clock, got, gated=gated))
        await fault.held.wait()            # a frame of epoch 0 is committed and held before dequeue
        clock.mark(supersede_mark(scope, 0))
        fault.calling()                    # released now: it reaches the gates while the call runs
        await eng.supersede(scope, 0, revise(prompt, 64, 80, 8), SP_NEW)
        await task
    async for _ in eng.stream(scope, 1):
        pass
    return got["obsolete"], fault


def test_frame_dequeued_while_the_call_runs_is_not_published(unit):
    obsolete, fault = unit.run(_released_at_the_call(unit.retire, "atcall", gated=True))
    assert fault.released == 1 and fault.held_tokens > 0
    assert obsolete == 0, f"{obsolete} token(s) of epoch 0 published after the SUPERSEDE was called"


def test_negative_control_native_publishes_the_frame_released_at_the_call(unit):
    obsolete, fault = unit.run(_released_at_the_call(unit.native_prefix, "atcall-n", gated=False))
    assert fault.released == 1 and obsolete >= fault.held_tokens > 0
