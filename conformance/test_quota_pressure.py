"""Pin quota under pressure (issue #5 item 7): with `Contract(pin_quota_blocks=0)` every SUPERSEDE selects cold recovery.

Per case, checked from outside the code under test:
- the transition inherits 0 tokens, carries no certificate, and its cold_reason names the pin quota; the successor
  is cold by vLLM's own count too (`num_cached_tokens == 0` on its frames: nothing read through the prefix cache);
- the successor equals its clean successor oracle: `clean_run(revised)` on the stock oracle engine, exact token ids
  when it ran alone (a cold successor computes from token 0 in the oracle's chunk shape), the logprob-closeness rule
  when another scope shared its steps (the "mixed" case);
- no obsolete output is published (`stats()["obsolete_tokens_published"]` delta 0) and the old consumer ends revoked;
- the predecessor is reclaimed: its internal request is gone from the scheduler (`request_state` is None), no handoff
  pin is left, and `audit()` is clean (also at Harness teardown).
Negative control: the same mid-decode case with quota None inherits (> 0 tokens, no cold reason).

Quota with pins outstanding (`test_quota_counts_pins_outstanding`): a handoff pin lives only inside one engine call,
except a DRAM transfer's, so a DRAM restore held in its transfer window makes `pinned(tenant)` non-zero while the
same tenant and another one supersede other scopes; the certified lengths must follow quota - pins per tenant.
"""
from __future__ import annotations

import asyncio

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from conformance.scenarios import within
from oracles import assert_logprobs_close, assert_same_tokens, collect
from retire import Contract
from retire.barriers import wait_engine
from retire.dram import HoldRestore

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


def _assert_cold_by_quota(tr, new) -> None:
    """`new`: the successor's Run, or None when it was superseded before it published anything."""
    assert tr.inherited_tokens == 0 and tr.certificate is None, tr
    assert tr.cold_reason is not None and "pin quota" in tr.cold_reason, tr.cold_reason
    assert new is None or new.num_cached_tokens == 0, \
        f"cold successor read {new.num_cached_tokens} tokens from the prefix cache"


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
    _assert_cold_by_quota(tr, new)
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
    _assert_cold_by_quota(trs[0], None)  # epoch 1 was superseded mid-prefill: it published nothing
    _assert_cold_by_quota(trs[1], new)
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
    _assert_cold_by_quota(tr_a, news[0])
    _assert_cold_by_quota(tr_t2, news[1])
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
    _assert_cold_by_quota(tr, new)
    assert obsolete == 0
    assert_same_tokens(subject=new, oracle=oracle, subject_name="cold successor", oracle_name="clean_run")
    _assert_reclaimed(rec)


class HoldInstall:
    """Barrier: hold the DRAM restore of (scope, epoch, tenant) between write-back and install, i.e. while its
    destination blocks are held by the transfer pin and counted against the tenant's quota. `arrived` is set when
    the restore is held; `release()` lets it install. Installed on the facade's `dram_before_install` hook point."""

    def __init__(self, eng, scope: str, epoch: int, tenant: str):
        self.eng, self.key = eng, (scope, epoch, tenant)
        self.arrived, self._go = asyncio.Event(), asyncio.Event()

    async def _hook(self, eng, t) -> None:
        if (t.scope, t.epoch, t.tenant) == self.key:
            self.arrived.set()
            await self._go.wait()

    def release(self) -> None:
        self._go.set()

    async def __aenter__(self):
        self.eng.seams.dram_before_install.append(self._hook)
        return self

    async def __aexit__(self, *exc):
        self._go.set()
        self.eng.seams.dram_before_install.remove(self._hook)


async def _inherit_with_quota(h, scope: str, tenant: str, quota: int | None, seed: int):
    """Start a 600-token predecessor, SUPERSEDE it (LCP 530: 512 certifiable = 16 blocks) under `quota`, collect."""
    eng = h.retire
    prompt = tokens(600, seed)
    revised = revise(prompt, 530, 600, seed)
    await eng.submit(scope, prompt, SP_OLD, tenant=tenant)
    old = asyncio.ensure_future(collect(eng, scope, 0, tenant))
    await wait_engine(eng, scope, out_tokens=1, tenant=tenant)
    tr = await eng.supersede(scope, 0, revised, SP_NEW, contract=Contract(pin_quota_blocks=quota), tenant=tenant)
    new = await collect(eng, scope, 1, tenant)
    await old
    n = tr.inherited_tokens
    ref = await (h.oracle.clean_prefix_run(revised[:n], revised, SP_NEW) if n else h.oracle.clean_run(revised, SP_NEW))
    return tr, new, ref


@pytest.mark.timeout(400)
def test_quota_counts_pins_outstanding(unit):
    """Tenant T has a DRAM handoff of 16 blocks in its transfer window (HoldInstall), so `pinned(T)` is 16 while
    T and T2 supersede other scopes. Expected certified lengths, from the quota, the outstanding pins and the LCP:
    T with quota 20 -> 4 free blocks -> 128 tokens; T2 with quota 20 -> 16 blocks -> 512 (pins are per tenant); T with
    quota 16 -> 0 free -> cold by pin quota (and cold by vLLM's count). Negative control: once the transfer
    installed (no pin left), T with quota 20 certifies 512 again. Every successor equals its oracle."""
    async def go():
        eng = unit.retire
        prompt = tokens(600, 91)
        await eng.submit("pa", prompt, SP_OLD, tenant="T")
        old = asyncio.ensure_future(collect(eng, "pa", 0, "T"))
        await wait_engine(eng, "pa", out_tokens=1, tenant="T")
        out = {}
        async with HoldRestore(eng, "pa", "T") as hold, HoldInstall(eng, "pa", 1, "T") as install:
            out["pa"] = await eng.supersede("pa", 0, revise(prompt, 530, 600, 91), SP_NEW,
                                            contract=Contract(dram_tier=True), tenant="T")
            await old
            restoring = asyncio.ensure_future(hold.release())
            await within(install.arrived.wait(), 60, "the DRAM restore to reach its transfer window")
            out["pins_while_held"] = (await eng.backend.sched("stats"))["pins"]
            out["T20"] = await _inherit_with_quota(unit, "pb", "T", 20, 92)
            out["T2-20"] = await _inherit_with_quota(unit, "pb", "T2", 20, 93)
            out["T16"] = await _inherit_with_quota(unit, "pc", "T", 16, 94)
            install.release()
            out["restore"] = await within(restoring, 60, "the held restore to install")
        out["pa_new"] = await collect(eng, "pa", 1, "T")
        out["after"] = await _inherit_with_quota(unit, "pd", "T", 20, 95)
        return out

    out = unit.run(go(), timeout=360)
    assert out["pins_while_held"] == 1, "precondition: one transfer pin outstanding while the restore is held"
    assert out["restore"] is True and out["pa"].inherited_tokens == 512, out["pa"]
    assert len(out["pa_new"].tokens) == SP_NEW.max_tokens
    want = {"T20": 4 * 32, "T2-20": 512, "T16": 0, "after": 512}
    for k, n in want.items():
        tr, new, ref = out[k]
        assert tr.inherited_tokens == n, f"{k}: inherited {tr.inherited_tokens}, expected {n} ({tr.cold_reason})"
        if n == 0:
            _assert_cold_by_quota(tr, new)
        check = assert_same_tokens if n % 256 == 0 else assert_logprobs_close
        check(subject=new, oracle=ref, subject_name=f"successor ({k})", oracle_name=f"oracle[:{n}]")
