"""Epochs under pressure: concurrent SUPERSEDEs of one scope, an old `expected_epoch` after a real SUPERSEDE, and a
SUPERSEDE the engine refuses. The compare-and-swap on the epoch must let exactly one SUPERSEDE of an epoch win, and a
call that raises must change nothing: the current version keeps streaming and equals its oracle.

Checked from outside the code under test:
- "exactly one wins": one call returns a Transition, every other raises `StaleEpoch`; vLLM's own request table (the
  scheduler's `requests`, listed by `audit`) holds exactly one live request right after the calls, the winner's;
- "changes nothing": before and after a refused call, the same current epoch, the same internal request, the same
  number of supersedes, and no new request in vLLM's request table; the current version's consumer receives every
  token (so it was not aborted either);
- successors equal their oracle on the stock engine: `clean_prefix_run(revised[:inherited], revised)`, exact when
  the inherited length is a multiple of the prefill chunk (256), else the logprob-closeness rule; the expected
  inherited length is computed by the test from the prompts and the writer frontier the engine reported before the
  call: min(LCP, frontier, len(new) - 1) rounded down to the block;
- nothing of a revoked epoch reaches a consumer after the call, by the consumer's clock.
Negative control of the refusal check itself: a real SUPERSEDE with the right epoch does change the epoch and the
internal request (so the "nothing changed" comparison can see a change).
"""
from __future__ import annotations

import asyncio

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from conformance.scenarios import abort_all, within
from oracles import Run, assert_logprobs_close, assert_same_tokens, collect
from retire import StaleEpoch
from retire.barriers import wait_engine
from retire.trials import ConsumerClock, Observed, caught_up, observe

CHUNK, BLOCK = 256, 32
SP_OLD = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=5)


def expected_certified(lcp: int, new_len: int, frontier: int) -> int:
    cap = min(lcp, frontier, new_len - 1)
    return cap - cap % BLOCK


async def _oracle_check(h, revised, inherited: int, new, name: str) -> None:
    ref = await h.oracle.clean_prefix_run(revised[:inherited], revised, SP_NEW)
    assert ref.inherited_tokens == inherited, (ref.inherited_tokens, inherited)
    check = assert_same_tokens if inherited % CHUNK == 0 else assert_logprobs_close
    check(subject=new, oracle=ref, subject_name=name, oracle_name=f"clean_prefix_run[:{inherited}]")


async def _snapshot(eng, scope: str) -> dict:
    """What a refused call must leave unchanged: the facade's view and vLLM's own request table."""
    audit = await eng.backend.sched("audit")
    return {"epoch": eng.current_epoch(scope), "internal_id": eng.internal_id(scope),
            "live": sorted(audit["live_requests"]), "supersedes": eng.stats()["supersedes"]}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("first", ["a", "b"])
def test_concurrent_supersedes_of_one_scope_exactly_one_wins(unit, first):
    """Two SUPERSEDEs of epoch 0 issued concurrently (both pass the frontend check before either advances)."""
    prompt = tokens(600, 311)
    revised = {"a": revise(prompt, 530, 580, 312), "b": revise(prompt, 300, 580, 313)}
    order = [first, "b" if first == "a" else "a"]

    async def go():
        eng = unit.retire
        clock, log = ConsumerClock(), Observed()
        await eng.submit("cc", prompt, SP_OLD)
        old = asyncio.ensure_future(observe(eng, "cc", 0, clock, log))
        st = await wait_engine(eng, "cc", out_tokens=2, epoch=0)
        await caught_up()
        call = clock.mark("supersede")
        res = await asyncio.gather(*(eng.supersede("cc", 0, revised[k], SP_NEW) for k in order),
                                   return_exceptions=True)
        live = sorted((await eng.backend.sched("audit"))["live_requests"])
        winner_id = eng.internal_id("cc")
        new = await within(collect(eng, "cc", 1), 120, "the winner's successor stream to end")
        await within(old, 120, "the revoked stream to end")
        return st, res, live, winner_id, new, log.obsolete(call, 0)

    st, res, live, winner_id, new, obsolete = unit.run(go())
    won = [(k, r) for k, r in zip(order, res) if not isinstance(r, BaseException)]
    lost = [(k, r) for k, r in zip(order, res) if isinstance(r, BaseException)]
    assert len(won) == 1 and len(lost) == 1, res
    assert isinstance(lost[0][1], StaleEpoch) and "expected epoch 0" in str(lost[0][1]), lost
    k, tr = won[0]
    assert tr.epoch == 1 and unit.retire.current_epoch("cc") == 1
    assert live == [winner_id], f"vLLM must hold exactly the winner's request, holds {live}"
    lcp = 530 if k == "a" else 300
    assert tr.inherited_tokens == expected_certified(lcp, 580, st["frontier"]), tr
    assert obsolete == 0, f"{obsolete} tokens of epoch 0 reached the consumer after the calls"
    assert len(new.tokens) == SP_NEW.max_tokens and not new.revoked
    unit.run(_oracle_check(unit, revised[k], tr.inherited_tokens, new, f"winner ({k})"))


@pytest.mark.timeout(300)
def test_old_expected_epoch_after_a_real_supersede_changes_nothing(unit):
    """After a real SUPERSEDE 0 -> 1, SUPERSEDEs naming epoch 0 (stale), 2 and 5 (future) and -1 are refused with
    StaleEpoch; epoch 1 keeps streaming, every token reaches its consumer and it equals its oracle. Negative control:
    the real SUPERSEDE before them changed exactly what the refusals must not."""
    prompt = tokens(600, 321)
    revised = revise(prompt, 530, 580, 322)

    async def go():
        eng = unit.retire
        await eng.submit("st", prompt, SP_OLD)
        old = asyncio.ensure_future(collect(eng, "st", 0))
        st = await wait_engine(eng, "st", out_tokens=2, epoch=0)
        before_real = await _snapshot(eng, "st")
        tr = await eng.supersede("st", 0, revised, SP_NEW)
        clock, log = ConsumerClock(), Observed()
        cur = asyncio.ensure_future(observe(eng, "st", 1, clock, log))
        await wait_engine(eng, "st", out_tokens=2, epoch=1)  # the current version is decoding
        await caught_up()
        before = await _snapshot(eng, "st")
        errors = []
        for bad in (0, 2, 5, -1):
            with pytest.raises(StaleEpoch, match=f"expected epoch {bad}, current is 1"):
                await eng.supersede("st", bad, tokens(300, 323), SP_NEW)
            errors.append(bad)
        after = await _snapshot(eng, "st")
        await within(cur, 120, "epoch 1 to finish after the refused calls")
        await old
        return st, tr, before_real, before, after, log

    st, tr, before_real, before, after, log = unit.run(go())
    new_live = set(after["live"]) - set(before["live"])  # requests may finish meanwhile; none may start
    assert {k: v for k, v in after.items() if k != "live"} == {k: v for k, v in before.items() if k != "live"} \
        and not new_live, f"a refused SUPERSEDE changed state: {before} -> {after}"
    assert before["epoch"] == before_real["epoch"] + 1 and before["internal_id"] != before_real["internal_id"]
    assert before["supersedes"] == before_real["supersedes"] + 1  # negative control: a real call is visible here
    assert tr.inherited_tokens == expected_certified(530, 580, st["frontier"]) == 512, tr
    assert len(log.tokens) == SP_NEW.max_tokens and log.frames[-1].finished and not log.frames[-1].revoked
    seen = Run(tokens=log.tokens)  # what the consumer of epoch 1 received (512 inherited: the exact rule applies)
    unit.run(_oracle_check(unit, revised, tr.inherited_tokens, seen, "epoch 1 after refused calls"))


@pytest.mark.timeout(300)
def test_a_supersede_that_raises_changes_nothing(unit):
    """Two scopes whose names the engine could confuse are each superseded once. Every call that returns must give a
    successor equal to its oracle; every call that raises must have changed nothing: the scope's current epoch and
    internal request are as before, and its current version still streams to completion (bounded waits)."""
    scopes = [("A", "x/y", 331), ("A/x", "y", 332)]
    eng = unit.facade("retire")

    async def go():
        out = {}
        try:
            for tenant, scope, seed in scopes:
                prompt = tokens(400, seed)
                await eng.submit(scope, prompt, SP_OLD, tenant=tenant)
                out[(tenant, scope)] = {"prompt": prompt, "old": asyncio.ensure_future(
                    collect(eng, scope, 0, tenant))}
            for tenant, scope, seed in scopes:
                o = out[(tenant, scope)]
                await within(wait_engine(eng, scope, out_tokens=1, epoch=0, tenant=tenant), 60,
                             f"{tenant!r}/{scope!r} to decode")
                o["revised"] = revise(o["prompt"], 330, 380, seed + 1)
                before = (eng.current_epoch(scope, tenant), eng.internal_id(scope, tenant=tenant))
                try:
                    o["tr"] = await eng.supersede(scope, 0, o["revised"], SP_NEW, tenant=tenant)
                except Exception as e:  # noqa: BLE001 - any refusal: it must have changed nothing
                    o["error"] = e
                    assert (eng.current_epoch(scope, tenant), eng.internal_id(scope, tenant=tenant)) == before, \
                        f"{tenant!r}/{scope!r}: the call raised {e!r} after changing the scope"
                    run = await within(o["old"], 60, f"{tenant!r}/{scope!r} epoch 0 to finish after a refusal")
                    assert len(run.tokens) == SP_OLD.max_tokens and not run.revoked, run
            for (tenant, scope), o in out.items():
                if "tr" in o:
                    o["new"] = await within(collect(eng, scope, 1, tenant), 60, f"{tenant!r}/{scope!r} successor")
                    await within(o["old"], 60, f"{tenant!r}/{scope!r} revoked stream to end")
            return out
        finally:
            await abort_all(eng)

    out = unit.run(go())
    for (tenant, scope), o in out.items():
        if "tr" in o:
            assert len(o["new"].tokens) == SP_NEW.max_tokens, (tenant, scope)
            ref = unit.run(unit.oracle.clean_prefix_run(o["revised"][:o["tr"].inherited_tokens], o["revised"],
                                                        SP_NEW))
            assert_logprobs_close(subject=o["new"], oracle=ref, subject_name=f"successor {tenant!r}/{scope!r}",
                                  oracle_name="clean_prefix_run")
