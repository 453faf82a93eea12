"""Revision slack on a real engine: the Gemma3-shaped `hybrid` model (sliding window 128 + full attention, block 32,
prefill chunk 256). The predecessor (1,200-token prompt) is decoding, so vLLM has already dropped every sliding
block behind the window ending at its frontier; the revision shares all but the last `behind` tokens (0.5, 1, 2, 4
windows behind the frontier).

With `Contract(slack=True)` given to `submit`, the successor inherits the whole block-aligned LCP in both KV groups:
its block table as vLLM holds it starts with the certified blocks (in the sliding group: placeholders before the
window ending at the certified length, live blocks from there on), and its output matches its oracle
(exact against `clean_prefix_run(revised[:n], revised)` where that run reuses exactly n, else the logprob-closeness
rule against it; a cold successor exactly against `clean_run`). The audit after each test (fixture teardown) checks
that no kept block outlives its version: ref_cnt == tables + pins, every block free once drained.

Negative controls: without the slack the same revisions go cold with the "sliding window" reason; a slack bounded
by a pin quota too small for the distance goes cold naming the quota.
"""
from __future__ import annotations

import asyncio

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from oracles import assert_logprobs_close, assert_same_tokens, collect
from retire import Contract
from retire.barriers import wait_engine

WINDOW, CHUNK, BLOCK, P = 128, 256, 32, 1200
SP_OLD = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=5)


async def _case(h, scope: str, behind: int, seed: int, contract: Contract | None):
    eng = h.retire
    prompt = tokens(P, seed)
    await eng.submit(scope, prompt, SP_OLD, contract=contract)
    old = asyncio.ensure_future(collect(eng, scope, 0))
    st = await wait_engine(eng, scope, out_tokens=2, epoch=0)  # decoding: vLLM dropped the window's blocks
    assert st is not None and st["frontier"] > P, st
    lcp = min(P, st["frontier"] - behind)
    revised = revise(prompt, lcp, lcp + 60, seed)
    tr = await eng.supersede(scope, 0, revised, SP_NEW)
    table = await eng.backend.sched("block_table", {"req_id": eng.internal_id(scope, 1)})
    new = await collect(eng, scope, 1)
    await old
    n = tr.inherited_tokens
    oracle = await (h.oracle.clean_prefix_run(revised[:n], revised, SP_NEW) if n else
                    h.oracle.clean_run(revised, SP_NEW))
    return lcp, revised, tr, new, oracle, table


def _judge(tr, new, oracle, n: int) -> None:
    name = f"clean_prefix_run[:{n}] (oracle reused {oracle.inherited_tokens})"
    if n % CHUNK == 0 and oracle.inherited_tokens == n:
        assert_same_tokens(subject=new, oracle=oracle, subject_name="successor (slack)", oracle_name=name)
    else:
        assert_logprobs_close(subject=new, oracle=oracle, subject_name="successor (slack)", oracle_name=name)


@pytest.mark.parametrize("behind", [WINDOW // 2, WINDOW, 2 * WINDOW, 4 * WINDOW], ids=["0.5w", "1w", "2w", "4w"])
def test_slack_inherits_behind_the_frontier(hybrid, behind):
    lcp, revised, tr, new, oracle, table = hybrid.run(_case(hybrid, f"slack{behind}", behind, 60 + behind,
                                                            Contract(slack=True)))
    n = lcp // BLOCK * BLOCK
    assert tr.cold_reason is None and tr.inherited_tokens == n, tr
    cert = tr.certificate
    assert cert.frontier - cert.lcp >= behind, (cert.frontier, cert.lcp)  # at least `behind` behind the frontier
    assert all(len(ids) == n // BLOCK for ids in cert.block_ids)
    first_live = max(0, n - WINDOW + 1) // BLOCK
    for g, ids in enumerate(cert.block_ids):  # RESUME: vLLM's table of the successor aliases the certified blocks
        assert tuple(table[g][: len(ids)]) == ids
    sliding = [g for g, ids in enumerate(cert.block_ids) if 0 in ids]
    assert len(sliding) == 1, cert.block_ids
    ids = cert.block_ids[sliding[0]]
    assert all(b == 0 for b in ids[:first_live]) and all(b != 0 for b in ids[first_live:]), ids
    assert hybrid.retire.stats()["obsolete_tokens_published"] == 0
    _judge(tr, new, oracle, n)


@pytest.mark.parametrize("behind", [WINDOW // 2, 4 * WINDOW], ids=["0.5w", "4w"])
def test_negative_control_without_slack_goes_cold(hybrid, behind):
    lcp, revised, tr, new, oracle, _ = hybrid.run(_case(hybrid, f"noslack{behind}", behind, 60 + behind, None))
    assert tr.inherited_tokens == 0 and tr.certificate is None, tr
    assert "sliding window" in tr.cold_reason and "no revision slack" in tr.cold_reason, tr.cold_reason
    assert_same_tokens(subject=new, oracle=oracle, subject_name="cold successor", oracle_name="clean_run")


def test_negative_control_slack_quota_too_small_goes_cold_naming_it(hybrid):
    lcp, revised, tr, new, oracle, _ = hybrid.run(_case(hybrid, "slackq", 4 * WINDOW, 99,
                                                        Contract(slack=True, pin_quota_blocks=4)))
    assert tr.inherited_tokens == 0, tr
    assert "sliding window" in tr.cold_reason and "pin quota" in tr.cold_reason, tr.cold_reason
    assert_same_tokens(subject=new, oracle=oracle, subject_name="cold successor", oracle_name="clean_run")
