"""Pin quota under pressure (issue #5 item 7): with `Contract(pin_quota_blocks=0)` every SUPERSEDE selects cold recovery.

Per case, checked from outside the code under test:
- the transition inherits 0 tokens, carries no certificate, and its cold_reason names the pin quota;
- the successor equals its clean successor oracle: `clean_run(revised)` on the stock oracle engine, exact token ids
  when it ran alone (a cold successor computes from token 0 in the oracle's chunk shape), the logprob-closeness rule
  when another scope shared its steps (the "mixed" case);
- no obsolete output is published (`stats()["obsolete_tokens_published"]` delta 0) and the old consumer ends revoked;
- the predecessor is reclaimed: its internal request is gone from the scheduler (`request_state` is None), no handoff
  pin is left, and `audit()` is clean (also at Harness teardown).
Negative control: the same mid-decode case with quota None inherits (> 0 tokens, no cold reason).
"""
from __future__ import annotations

import asyncio

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from oracles import assert_logprobs_close, assert_same_tokens, collect
from retire import Contract
from retire.barriers import wait_engine

SP_OLD = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=5)
ZERO = Contract(pin_quota_blocks=0)
PROMPT_LEN = 1800  # 8 prefill chunks of 256: "before any token" and "mid-prefill" have room to land


async def _moment(eng, scope: str, when: str, epoch: int = 0) -> None:
    if when == "before-token":
        return  # SUPERSEDE right after the submit: the predecessor has produced no token yet
    if when == "mid-prefill":
        await wait_engine(eng, scope, frontier=512, epoch=epoch)
    elif when == "mid-decode":
        await wait_engine(eng, scope, out_tokens=3, epoch=epoch)
    else:
        raise ValueError(when)


async def _revise(h, scope: str, when: str, contract: Contract, seed: int, *, lcp: int = 1500,
                  tenant: str = "default"):
    """One SUPERSEDE at `when`; returns (transition, old run, new run, old internal id, revised prompt)."""
    eng = h.retire
    prompt = tokens(PROMPT_LEN, seed)
    revised = revise(prompt, lcp, 1700, seed)
    await eng.submit(scope, prompt, SP_OLD, tenant=tenant)
    old_task = asyncio.ensure_future(collect(eng, scope, 0, tenant))
    await _moment(eng, scope, when)
    old_id = eng.internal_id(scope, 0, tenant)
    tr = await eng.supersede(scope, 0, revised, SP_NEW, contract=contract, tenant=tenant)
    return tr, old_task, old_id, revised


async def _reclaimed(eng, *old_ids: str) -> dict:
    states = {i: await eng.backend.sched("request_state", {"req_id": i}) for i in old_ids}
    stats = await eng.backend.sched("stats")
    return {"states": states, "pins": stats["pins"], "audit": await eng.audit()}


def _assert_cold_by_quota(tr) -> None:
    assert tr.inherited_tokens == 0 and tr.certificate is None, tr
    assert tr.cold_reason is not None and "pin quota" in tr.cold_reason, tr.cold_reason


def _assert_reclaimed(rec: dict) -> None:
    assert all(s is None for s in rec["states"].values()), f"predecessor still in the scheduler: {rec['states']}"
    assert rec["pins"] == 0 and rec["audit"]["valid"], rec


@pytest.mark.parametrize("when", ["before-token", "mid-prefill", "mid-decode"])
def test_zero_quota_selects_cold(unit, when):
    seed = {"before-token": 71, "mid-prefill": 72, "mid-decode": 73}[when]

    async def go():
        eng = unit.retire
        before = eng.stats()["obsolete_tokens_published"]
        tr, old_task, old_id, revised = await _revise(unit, "q", when, ZERO, seed)
        new = await collect(eng, "q", 1)
        old = await old_task
        rec = await _reclaimed(eng, old_id)
        oracle = await unit.oracle.clean_run(revised, SP_NEW)
        return tr, old, new, rec, oracle, eng.stats()["obsolete_tokens_published"] - before

    tr, old, new, rec, oracle, obsolete = unit.run(go())
    _assert_cold_by_quota(tr)
    assert obsolete == 0 and old.revoked
    if when == "before-token":
        assert old.tokens == ()
    assert_same_tokens(subject=new, oracle=oracle, subject_name=f"cold successor ({when}, quota 0)",
                       oracle_name="clean_run")
    _assert_reclaimed(rec)


def test_zero_quota_chain_of_two_supersedes(unit):
    """e0 -> e1 -> e2, each with quota 0: both hops cold by quota; only e2 publishes after its SUPERSEDE."""
    prompt = tokens(PROMPT_LEN, 74)
    p1 = revise(prompt, 1500, 1700, 74)
    p2 = revise(p1, 1200, 1600, 75)

    async def go():
        eng = unit.retire
        before = eng.stats()["obsolete_tokens_published"]
        await eng.submit("qc", prompt, SP_OLD)
        c0 = asyncio.ensure_future(collect(eng, "qc", 0))
        await _moment(eng, "qc", "mid-decode")
        ids = [eng.internal_id("qc", 0)]
        tr1 = await eng.supersede("qc", 0, p1, SP_OLD, contract=ZERO)
        c1 = asyncio.ensure_future(collect(eng, "qc", 1))
        await _moment(eng, "qc", "mid-prefill", epoch=1)
        ids.append(eng.internal_id("qc", 1))
        tr2 = await eng.supersede("qc", 1, p2, SP_NEW, contract=ZERO)
        new = await collect(eng, "qc", 2)
        runs = await asyncio.gather(c0, c1)
        rec = await _reclaimed(eng, *ids)
        oracle = await unit.oracle.clean_run(p2, SP_NEW)
        return (tr1, tr2), runs, new, rec, oracle, eng.stats()["obsolete_tokens_published"] - before

    trs, runs, new, rec, oracle, obsolete = unit.run(go())
    for tr in trs:
        _assert_cold_by_quota(tr)
    assert obsolete == 0 and all(r.revoked for r in runs)
    assert_same_tokens(subject=new, oracle=oracle, subject_name="final cold successor (chain, quota 0)",
                       oracle_name="clean_run")
    _assert_reclaimed(rec)


def test_zero_quota_mixed_with_other_scopes(unit):
    """Three scopes run together: "qa" (quota 0) and tenant T2's "qa" (quota 0) go cold by quota, while "qb" (no
    quota) is superseded in the same window and inherits. Quotas are per contract and per tenant: one scope's zero
    quota neither blocks nor is bypassed by the others'. Successors shared steps, so the logprob-closeness rule."""

    async def go():
        eng = unit.retire
        before = eng.stats()["obsolete_tokens_published"]
        cases = [("qa", "default", ZERO, 76), ("qa", "T2", ZERO, 77), ("qb", "default", Contract(), 78)]
        started = []
        for scope, tenant, contract, seed in cases:
            prompt = tokens(PROMPT_LEN, seed)
            await eng.submit(scope, prompt, SP_OLD, tenant=tenant)
            started.append((scope, tenant, contract, prompt, revise(prompt, 1500, 1700, seed),
                            asyncio.ensure_future(collect(eng, scope, 0, tenant))))
        for scope, tenant, *_ in started:
            await wait_engine(eng, scope, out_tokens=2, tenant=tenant)
        out = []
        for scope, tenant, contract, prompt, revised, old_task in started:
            old_id = eng.internal_id(scope, 0, tenant)
            tr = await eng.supersede(scope, 0, revised, SP_NEW, contract=contract, tenant=tenant)
            out.append([scope, tenant, tr, old_id, revised, old_task])
        news = await asyncio.gather(*(collect(eng, s, 1, t) for s, t, *_ in out))
        olds = await asyncio.gather(*(o[5] for o in out))
        rec = await _reclaimed(eng, *(o[3] for o in out))
        oracles = [await unit.oracle.clean_run(o[4], SP_NEW) for o in out]
        return out, news, olds, rec, oracles, eng.stats()["obsolete_tokens_published"] - before

    out, news, olds, rec, oracles, obsolete = unit.run(go())
    (_, _, tr_a, *_), (_, _, tr_t2, *_), (_, _, tr_b, *_) = out
    _assert_cold_by_quota(tr_a)
    _assert_cold_by_quota(tr_t2)
    assert tr_b.inherited_tokens > 0 and tr_b.cold_reason is None, tr_b
    assert obsolete == 0 and all(o.revoked for o in olds)
    for (scope, tenant, *_), new, oracle in zip(out, news, oracles):
        assert_logprobs_close(subject=new, oracle=oracle, subject_name=f"successor {tenant}/{scope}",
                              oracle_name="clean_run")
    _assert_reclaimed(rec)


def test_negative_control_same_case_without_quota_inherits(unit):
    async def go():
        eng = unit.retire
        tr, old_task, old_id, revised = await _revise(unit, "qn", "mid-decode", Contract(), 73)
        new = await collect(eng, "qn", 1)
        await old_task
        return tr, new, await _reclaimed(eng, old_id)

    tr, new, rec = unit.run(go())
    assert tr.inherited_tokens > 0 and tr.cold_reason is None and tr.certificate is not None, tr
    assert tr.inherited_tokens == 1500 // 32 * 32
    _assert_reclaimed(rec)


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before-token", "mid-prefill", "mid-decode"])
@pytest.mark.parametrize("mode", ["exact", "tolerant"])
def test_zero_quota_selects_cold_in_every_mode(unit, when, mode):
    seed = 80 + ["before-token", "mid-prefill", "mid-decode"].index(when) + (10 if mode == "exact" else 0)

    async def go():
        eng = unit.retire
        before = eng.stats()["obsolete_tokens_published"]
        tr, old_task, old_id, revised = await _revise(unit, "qm", when, Contract(mode=mode, pin_quota_blocks=0),
                                                      seed, lcp=900)
        new = await collect(eng, "qm", 1)
        await old_task
        rec = await _reclaimed(eng, old_id)
        return tr, new, rec, await unit.oracle.clean_run(revised, SP_NEW), \
            eng.stats()["obsolete_tokens_published"] - before

    tr, new, rec, oracle, obsolete = unit.run(go())
    _assert_cold_by_quota(tr)
    assert obsolete == 0
    assert_same_tokens(subject=new, oracle=oracle, subject_name="cold successor", oracle_name="clean_run")
    _assert_reclaimed(rec)
