"""Identities that cannot collide: tenants and scopes whose names hold '/', '#', unicode or 1,000 characters run side by
side on one engine, each superseded once, under a slow consumer.

Every (tenant, scope) is its own scope whatever its characters (RETIRE.md §5). Checked from outside the subject, with a
bounded wait on every stream (a hang fails naming the stream that never ended):
- every version's stream ends: epoch 0 revoked, epoch 1 finished with all its tokens;
- what each consumer received of epoch 0 before its SUPERSEDE was called is a prefix of `clean_run(prompt)`, and it
  received nothing of epoch 0 after the call (consumer's clock);
- every successor equals `clean_prefix_run(revised[:inherited], revised)` on the stock oracle engine;
- a tenant that does not own a scope name gets `UnknownScope` for it and changes nothing.
The streams share engine steps, so outputs are judged by the logprob-closeness rule (oracles.compare).
"""
from __future__ import annotations

import asyncio

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from conformance.scenarios import abort_all, within
from oracles import Run, assert_logprobs_close, collect
from retire import UnknownScope
from retire.barriers import wait_engine
from retire.faults import SlowConsumer
from retire.trials import ConsumerClock, Observed, caught_up, observe

SP_OLD = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, logprobs=5)
SP_NEW = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=5)
BOUND = 60.0  # seconds any one stream may take here (a few seconds when it works)

CASES = [
    pytest.param([("A/x", "y"), ("A", "x/y")], id="slash-collision"),
    pytest.param([("t#1", "s"), ("t", "1#s"), ("t", "s#1")], id="hash"),
    pytest.param([("tenant-ü", "σκόπος-€"), ("tenant-€", "σκόπος-ü"), ("租户", "作用域/☃")],
                 id="unicode"),
    pytest.param([("T" * 1000, "S" * 1000), ("T" * 1000, "S" * 999 + "X"), ("T" * 999 + "U", "S" * 1000)],
                 id="1000-chars"),
]


def _prefix(run: Run, n: int) -> Run:
    return Run(run.tokens[:n], run.logprobs[:n] if run.logprobs else None,
               run.top_logprobs[:n] if run.top_logprobs else None)


async def _cross_tenant_attempts(eng, names) -> int:
    """Every tenant tries every scope name it does not own: UnknownScope, and the owner's scope is unchanged."""
    owned = set(names)
    tried = 0
    for tenant in {t for t, _ in names}:
        for owner, scope in names:
            if (tenant, scope) in owned:
                continue
            before = (eng.current_epoch(scope, owner), eng.internal_id(scope, tenant=owner))
            with pytest.raises(UnknownScope, match="unknown scope"):
                await eng.supersede(scope, 0, tokens(64, 1), SP_NEW, tenant=tenant)
            assert (eng.current_epoch(scope, owner), eng.internal_id(scope, tenant=owner)) == before
            tried += 1
    return tried


async def _scenario(h, eng, names, seed: int) -> dict:
    clock = ConsumerClock()
    v: dict = {}
    async with SlowConsumer(0.02).on(eng):
        for i, (tenant, scope) in enumerate(names):
            prompt = tokens(300 + 40 * i, seed + i)
            await eng.submit(scope, prompt, SP_OLD, tenant=tenant)
            log = Observed()
            v[(tenant, scope)] = {"prompt": prompt, "log": log, "revised": revise(prompt, 260, 340, seed + 50 + i),
                                  "old": asyncio.ensure_future(observe(eng, scope, 0, clock, log, tenant=tenant))}
        for (tenant, scope), x in v.items():
            await within(wait_engine(eng, scope, out_tokens=2, epoch=0, tenant=tenant), BOUND,
                         f"{tenant[:20]!r}/{scope[:20]!r} to decode")
        tried = await _cross_tenant_attempts(eng, names)
        await caught_up()
        for (tenant, scope), x in v.items():
            x["call"] = clock.mark(f"supersede:{tenant}:{scope}")
            x["tr"] = await eng.supersede(scope, 0, x["revised"], SP_NEW, tenant=tenant)
            x["new"] = asyncio.ensure_future(collect(eng, scope, 1, tenant))
        for (tenant, scope), x in v.items():
            await within(x["old"], BOUND, f"epoch 0 of {tenant[:20]!r}/{scope[:20]!r} to end")
            x["new"] = await within(x["new"], BOUND, f"epoch 1 of {tenant[:20]!r}/{scope[:20]!r} to end")
    for x in v.values():
        x["clean"] = await h.oracle.clean_run(x["prompt"], SP_OLD)
        n = x["tr"].inherited_tokens
        x["ref"] = await h.oracle.clean_prefix_run(x["revised"][:n], x["revised"], SP_NEW)
    v["_tried"] = tried
    return v


@pytest.mark.timeout(400)
@pytest.mark.parametrize("names", CASES)
def test_adversarial_names_never_alias(unit, names):
    eng = unit.facade("retire")

    async def go():
        try:
            return await _scenario(unit, eng, names, seed=400 + len(names[0][0]) % 97)
        finally:
            await abort_all(eng)  # a failing case must not leave a stream or a request behind

    v = unit.run(go())
    assert v.pop("_tried") >= 1
    assert any(x["log"].run(0, before=x["call"]).tokens for x in v.values()), "no consumer saw epoch 0 output"
    for (tenant, scope), x in v.items():
        who = f"{tenant[:24]!r}/{scope[:24]!r}"
        log = x["log"]
        assert log.obsolete(x["call"], 0) == 0, f"{who}: epoch 0 published after its SUPERSEDE was called"
        assert log.frames and log.frames[-1].revoked, f"{who}: epoch 0 did not end revoked"
        seen = log.run(0, before=x["call"])
        if seen.tokens:
            assert_logprobs_close(subject=seen, oracle=_prefix(x["clean"], len(seen.tokens)),
                                  subject_name=f"epoch 0 of {who} as consumed", oracle_name="clean_run (prefix)")
        assert len(x["new"].tokens) == SP_NEW.max_tokens and not x["new"].revoked, who
        assert_logprobs_close(subject=x["new"], oracle=x["ref"], subject_name=f"successor of {who}",
                              oracle_name=f"clean_prefix_run[:{x['tr'].inherited_tokens}]")
