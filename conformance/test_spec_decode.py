"""Speculative decoding (ngram, 3 draft tokens): draft and target work fenced under one version.

Cases: (a) a revision during the draft-verify engine's prefill; (b) a revision during active speculative decode, issued
only after the engine reports draft work (drafts verified and accepted for the old version: `request_state`'s
`drafted`/`accepted`, counted by the scheduler at commit). In both: the FENCE receipts name every KV group and the
drafter under the old epoch; no token of the old epoch is published; the successor matches a clean *speculative*
oracle (a stock engine with the same speculative config; speculative greedy is not identical to plain greedy here).

Comparison rule: exact against `clean_prefix_run(revised[:inherited], revised)` when the inherited length is a
multiple of the prefill chunk (256: same execution shape), else the logprob-closeness rule against the same run.

Negative control: the same active-decode scenario with the gates switched off publishes obsolete tokens.
"""
import asyncio
from types import SimpleNamespace

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import repo_prompt, revise
from conformance.scenarios import count_obsolete, mark_supersede
from oracles import assert_logprobs_close, assert_same_tokens, collect
from retire import adapter
from retire.barriers import wait_drafts, wait_engine
from retire.faults import SlowConsumer
from retire.trials import ConsumerClock, caught_up

CHUNK, BLOCK = 256, 32
SP_OLD = SamplingParams(max_tokens=96, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=5)


def _check_receipts(tr, st, n_groups: int = 1):
    """Every KV group and the drafter acknowledge; the frontier is no lower than the one the engine reported before
    the call (`st`), and nothing past it is certified. (The receipts' epoch and frontier are one value copied per
    participant by construction, so comparing the receipts with each other could not fail.)"""
    groups = [r for r in tr.receipts if r.participant.startswith("kv-group-")]
    (drafter,) = [r for r in tr.receipts if r.participant == "drafter"]
    assert len(groups) == n_groups
    assert st is not None and drafter.frontier >= st["frontier"], (drafter, st)
    # the writer frontier never covers the last sampled token or a pending (unverified) draft slot
    assert drafter.frontier <= drafter.detail["num_tokens"] - 1 or drafter.detail["num_tokens"] == 0
    if tr.certificate is not None:
        assert tr.certificate.tokens <= drafter.frontier and tr.certificate.tokens % BLOCK == 0
    return drafter


async def _judge(h, tr, revised):
    n = tr.inherited_tokens
    oracle = await (h.oracle.clean_prefix_run(revised[:n], revised, SP_NEW) if n else
                    h.oracle.clean_run(revised, SP_NEW))
    return oracle


def _compare(tr, new, oracle):
    n = tr.inherited_tokens
    assert (oracle.inherited_tokens or 0) == n or not n
    if n % CHUNK == 0:
        assert_same_tokens(subject=new, oracle=oracle, subject_name="retire successor (spec)",
                           oracle_name=f"speculative clean_prefix_run[:{n}]")
    else:
        assert_logprobs_close(subject=new, oracle=oracle, subject_name="retire successor (spec)",
                              oracle_name=f"speculative clean_prefix_run[:{n}]")


def test_revision_during_draft_verify_prefill(spec):
    """(a) The old version is still in its chunked prefill (frontier < prompt) when SUPERSEDE lands."""
    prompt = repo_prompt(1900, 11)
    revised = revise(prompt, 1700, 1800, 11)

    async def go():
        eng = spec.retire
        await eng.submit("pre", prompt, SP_OLD)
        old = asyncio.ensure_future(collect(eng, "pre", 0))
        st = await wait_engine(eng, "pre", frontier=CHUNK, epoch=0)
        tr = await eng.supersede("pre", 0, revised, SP_NEW)
        new = await collect(eng, "pre", 1)
        old_run = await old
        return st, tr, new, old_run, await _judge(spec, tr, revised)

    st, tr, new, old_run, oracle = spec.run(go())
    drafter = _check_receipts(tr, st)
    assert drafter.frontier < len(prompt), f"revision landed after the prefill (frontier {drafter.frontier})"
    assert drafter.detail["drafted"] == 0  # still prefilling: no draft was verified yet
    assert old_run.tokens == () and old_run.revoked
    assert tr.inherited_tokens == drafter.frontier // BLOCK * BLOCK > 0, tr
    assert spec.retire.stats()["obsolete_tokens_published"] == 0
    _compare(tr, new, oracle)


async def _active_case(eng, scope: str, seed: int, *, extend: int, gated: bool = True):
    """Old version decoding speculatively under a slow consumer; SUPERSEDE once drafts were verified and accepted and
    the engine is >= 6 tokens ahead of the consumer. The revision keeps the prompt plus `extend` of the old output
    tokens the consumer saw, then diverges."""
    prompt = repo_prompt(600, seed)
    await eng.submit(scope, prompt, SP_OLD)
    clock = ConsumerClock()
    seen: list[int] = []
    got = {"obsolete": 0}
    first = asyncio.Event()

    def on_tokens(ids):
        seen.extend(ids)
        if len(seen) >= extend + 1:
            first.set()

    async with SlowConsumer(0.05).on(eng):
        task = asyncio.ensure_future(count_obsolete(eng, scope, clock, got, gated=gated, on_tokens=on_tokens))
        waiter = asyncio.ensure_future(first.wait())
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        st = await wait_drafts(eng, scope, accepted=1, out_tokens=len(seen) + 6, epoch=0)
        await caught_up()
        kept = prompt + seen[:extend]
        revised = revise(kept, len(kept), len(kept) + 48, seed)
        tr = await mark_supersede(eng, clock, scope, 0, revised, SP_NEW)
        await task
    new = await collect(eng, scope, 1)
    return st, tr, new, revised, got["obsolete"]


@pytest.mark.parametrize("extend", [0, 8], ids=["lcp-prompt", "lcp-into-spec-output"])
def test_revision_during_active_speculative_decode(spec, extend):
    """(b) Draft work observed first; with `extend` > 0 the shared prefix reaches into tokens the old version produced
    by verified drafts, so certified blocks hold KV written by draft-verify steps (rejected slots rewritten)."""
    async def go():
        st, tr, new, revised, obsolete = await _active_case(spec.retire, f"act{extend}", 21 + extend, extend=extend)
        return st, tr, new, revised, obsolete, await _judge(spec, tr, revised)

    st, tr, new, revised, obsolete, oracle = spec.run(go())
    assert st is not None and st["drafted"] > 0 and st["accepted"] > 0, st  # inside speculation
    drafter = _check_receipts(tr, st)
    assert drafter.detail["drafted"] >= st["drafted"] and drafter.detail["accepted"] >= 1
    assert obsolete == 0 and spec.retire.stats()["obsolete_tokens_published"] == 0
    lcp = 600 + extend
    assert tr.inherited_tokens == min(lcp, drafter.frontier) // BLOCK * BLOCK, tr
    _compare(tr, new, oracle)


def test_negative_control_gates_off_publish_obsolete_speculative_tokens(spec):
    eng = spec.retire
    eng.seams.gates = False
    spec.run(eng.backend.sched("switches", {"gate": False}))
    st, tr, new, revised, obsolete = spec.run(_active_case(eng, "neg", 31, extend=0, gated=False))
    assert st is not None and st["accepted"] > 0
    assert obsolete > 0, "with the gates off the same speculative scenario must publish obsolete tokens"


def test_writer_frontier_excludes_in_flight_draft_slots():
    """Unit rule behind the receipts: KV of scheduled-but-unverified tokens (in flight, incl. drafts) is not
    written; vLLM rolls rejected drafts back out of num_computed_tokens at commit."""
    port = adapter.engine().SchedulerPort.__new__(adapter.engine().SchedulerPort)
    scheduled = SimpleNamespace(num_computed_tokens=604, num_in_flight_tokens=4)  # 1 target + 3 drafts in flight
    port.s = SimpleNamespace(requests={"r": scheduled})
    assert port.frontier("r") == 600
    port.s.requests["r"] = SimpleNamespace(num_computed_tokens=602, num_in_flight_tokens=0)  # 2 drafts rejected
    assert port.frontier("r") == 602
