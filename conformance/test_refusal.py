"""A refused SUPERSEDE changes nothing, on both sides (frontend and engine).

The frontend accepts a SUPERSEDE only after the engine committed it (the engine's version table is the one commit
point). Two faults make the engine refuse a call the frontend's own checks passed: `EngineRefusal` (the engine
disagrees) and `ForgedTenant` (the successor's tag names another tenant, so the engine finds no such scope). After
the refusal, judged from outside: the call raised the typed error; the predecessor's consumer received the
predecessor's whole output, equal to a clean run of its prompt (nothing revoked, cut or lost); the epoch did not
move; a later SUPERSEDE naming the same expected epoch succeeds; the engine audit is clean (no successor admitted,
no pin, no leaked block: fixture teardown).

Negative control: the same checker applied to an accepted SUPERSEDE reports that the predecessor's stream changed.
"""
import asyncio

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from oracles import collect, compare_tokens
from retire import StaleEpoch, SupersedeRefused, UnknownScope
from retire.barriers import wait_engine
from retire.faults import EngineRefusal, ForgedTenant

SP_OLD = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


async def _attempt(h, scope: str, seed: int, fault):
    """Predecessor streaming; a SUPERSEDE under `fault` (None: accepted). Returns (error, old Run, oracle, epoch)."""
    eng = h.retire
    prompt = tokens(300, seed)
    await eng.submit(scope, prompt, SP_OLD)
    old = asyncio.ensure_future(collect(eng, scope, 0))
    await wait_engine(eng, scope, out_tokens=2)
    err = None
    try:
        if fault is None:
            await eng.supersede(scope, 0, revise(prompt, 200, 260, seed), SP_NEW)
        else:
            async with fault.on(eng):
                await eng.supersede(scope, 0, revise(prompt, 200, 260, seed), SP_NEW)
    except SupersedeRefused as e:
        err = e
    run = await old
    epoch = eng.current_epoch(scope)
    return err, run, await h.oracle.clean_run(prompt, SP_OLD), epoch


def _unchanged(run, oracle, epoch) -> bool:
    """The checker: the predecessor published its whole, clean output and stayed current."""
    return not run.revoked and epoch == 0 and compare_tokens(subject=run, oracle=oracle, subject_name="predecessor",
                                                             oracle_name="clean_run").valid is True


@pytest.mark.parametrize("case", ["engine-refusal", "forged-tenant"])
def test_refused_supersede_changes_nothing(unit, case):
    seed = {"engine-refusal": 4101, "forged-tenant": 4102}[case]
    fault = EngineRefusal(f"rf-{case}") if case == "engine-refusal" else ForgedTenant("intruder")
    err, run, oracle, epoch = unit.run(_attempt(unit, f"rf-{case}", seed, fault))
    expected = SupersedeRefused if case == "engine-refusal" else UnknownScope
    assert isinstance(err, expected) and "engine refused" in str(err), err
    assert _unchanged(run, oracle, epoch), (run, oracle, epoch)
    assert len(run.tokens) == SP_OLD.max_tokens
    # the scope is intact: the same expected epoch is accepted now, and an old one is still refused
    eng = unit.retire
    tr = unit.run(eng.supersede(f"rf-{case}", 0, tokens(64, seed + 1), SP_NEW))
    assert tr.epoch == 1
    with pytest.raises(StaleEpoch, match="expected epoch 0, current is 1"):
        unit.run(eng.supersede(f"rf-{case}", 0, tokens(64, seed + 2), SP_NEW))


def test_negative_control_an_accepted_supersede_changes_the_predecessor(unit):
    err, run, oracle, epoch = unit.run(_attempt(unit, "rf-accepted", 4103, None))
    assert err is None and epoch == 1
    assert not _unchanged(run, oracle, epoch)
    assert run.revoked and len(run.tokens) < SP_OLD.max_tokens
