"""Tensor parallel = 2 (mp executor, one rank per core): FENCE closes every participant.

Participants are (worker rank x KV group). Each rank acknowledges every step it finished in its own shared-memory slot
(retire/participants.py); FENCE, between two steps, requires every rank's receipt for the last launched step and takes
the ALIGN frontier as the minimum over the scheduler and every rank. Checked: the receipt set is exactly
{rank-0, rank-1} x {kv-group-0}, all at the old epoch; no obsolete token is published; the successor equals its oracle
(a stock TP=2 engine with the same shape: exact against `clean_prefix_run(revised[:inherited], revised)` when the
inherited length is chunk-aligned, else the logprob-closeness rule); inheritance adopts the same physical prefix on
both ranks: the successor's table aliases the certified block ids, and each rank's digests of those blocks are
unchanged across the handoff (they differ between ranks: heads are sharded).

Negative control for the participant set: rank 1's receipt dropped (DropRankReceipt) -> the transition is not
certified: cold successor, reason naming rank 1, only rank 0's receipt, output exact against `clean_run`.
Pipeline parallelism is refused up front (UnsupportedContract), before any engine starts.
"""
import asyncio

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from oracles import assert_logprobs_close, assert_same_tokens, collect
from retire import RetireEngine
from retire.barriers import HoldSuccessor, wait_engine
from retire.errors import UnsupportedContract
from retire.faults import DropRankReceipt

CHUNK, BLOCK, WORLD = 256, 32, 2
SP_OLD = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=5)
PARTICIPANTS = {f"rank-{r}/kv-group-0" for r in range(WORLD)}


def _judge(tr, new, oracle):
    n = tr.inherited_tokens
    if n == 0 or n % CHUNK == 0:
        assert_same_tokens(subject=new, oracle=oracle, subject_name="retire successor (TP=2)",
                           oracle_name=f"TP=2 clean_prefix_run[:{n}]")
    else:
        assert_logprobs_close(subject=new, oracle=oracle, subject_name="retire successor (TP=2)",
                              oracle_name=f"TP=2 clean_prefix_run[:{n}]")


async def _supersede_case(h, scope, prompt, revised, *, fault=None, hold=False):
    eng = h.retire
    await eng.submit(scope, prompt, SP_OLD)
    old = asyncio.ensure_future(collect(eng, scope, 0))
    await wait_engine(eng, scope, out_tokens=2, epoch=0)  # prefill written on every rank
    info = {}
    if hold:
        old_table = await eng.backend.sched("block_table", {"req_id": eng.internal_id(scope, 0)})
        ids = old_table[0][: len(revised) // BLOCK]
        info["before"] = await eng.backend.worker("retire_block_digests", ids)
        async with HoldSuccessor(eng, scope) as held:
            tr = await eng.supersede(scope, 0, revised, SP_NEW)
            cert_ids = list(tr.certificate.block_ids[0])
            info["table"] = await eng.backend.sched("block_table", {"req_id": eng.internal_id(scope, 1)})
            info["adopted"] = await eng.backend.worker("retire_block_digests", cert_ids)  # before its first step
            await held.release()
        new = await collect(eng, scope, 1)
        info["after"] = await eng.backend.worker("retire_block_digests", cert_ids)
        info["old_ids"] = ids
    elif fault is not None:
        async with fault.on(eng):
            tr = await eng.supersede(scope, 0, revised, SP_NEW)
        new = await collect(eng, scope, 1)
    else:
        tr = await eng.supersede(scope, 0, revised, SP_NEW)
        new = await collect(eng, scope, 1)
    await old
    n = tr.inherited_tokens
    oracle = await (h.oracle.clean_prefix_run(revised[:n], revised, SP_NEW) if n else
                    h.oracle.clean_run(revised, SP_NEW))
    return tr, new, oracle, info


@pytest.mark.parametrize("seed,lcp", [(1, 200), (2, 256)], ids=["lcp200", "lcp256-chunk"])
def test_fence_collects_every_rank_and_successor_matches(tp2, seed, lcp):
    prompt = tokens(300, seed)
    revised = revise(prompt, lcp, 280, seed)
    tr, new, oracle, _ = tp2.run(_supersede_case(tp2, f"tp{seed}", prompt, revised))
    assert {r.participant for r in tr.receipts} == PARTICIPANTS, tr.receipts
    assert {r.epoch for r in tr.receipts} == {0}
    assert len({r.detail["step"] for r in tr.receipts}) == 1  # one step, acknowledged by every rank
    frontier = min(r.frontier for r in tr.receipts)
    assert frontier >= len(prompt)
    assert tr.cold_reason is None and tr.inherited_tokens == min(lcp, frontier) // BLOCK * BLOCK
    assert tr.certificate.frontier == frontier
    assert tp2.retire.stats()["obsolete_tokens_published"] == 0
    assert oracle.inherited_tokens == tr.inherited_tokens
    _judge(tr, new, oracle)


def test_inheritance_adopts_same_physical_prefix_on_both_ranks(tp2):
    prompt = tokens(300, 3)
    revised = revise(prompt, 290, 296, 3)
    tr, new, oracle, info = tp2.run(_supersede_case(tp2, "tpd", prompt, revised, hold=True))
    n = tr.inherited_tokens
    assert n == 288 and {r.participant for r in tr.receipts} == PARTICIPANTS
    cert = list(tr.certificate.block_ids[0])
    assert cert == info["old_ids"][: n // BLOCK]                    # the predecessor's own physical blocks
    assert info["table"][0][: len(cert)] == cert                   # aliased by the successor (no copy)
    before = [d[: len(cert)] for d in info["before"]]
    assert len(info["adopted"]) == WORLD == len(before)
    for r in range(WORLD):
        assert info["adopted"][r] == before[r], f"rank {r}: certified block bytes changed at the handoff"
        assert info["after"][r] == before[r], f"rank {r}: the successor overwrote a certified block"
    assert info["adopted"][0] != info["adopted"][1]                # sharded heads: distinct bytes per rank
    _judge(tr, new, oracle)


def test_negative_control_missing_rank_receipt_goes_cold(tp2):
    prompt = tokens(300, 4)
    revised = revise(prompt, 200, 280, 4)
    tr, new, oracle, _ = tp2.run(_supersede_case(tp2, "tpneg", prompt, revised, fault=DropRankReceipt(1)))
    assert {r.participant for r in tr.receipts} == {"rank-0/kv-group-0"}
    assert tr.inherited_tokens == 0 and tr.certificate is None
    assert tr.cold_reason is not None and "participant set incomplete" in tr.cold_reason and "[1]" in tr.cold_reason
    assert tp2.retire.stats()["obsolete_tokens_published"] == 0
    _judge(tr, new, oracle)


def test_pipeline_parallel_is_refused_before_any_engine_starts():
    with pytest.raises(UnsupportedContract, match="pipeline_parallel_size=2"):
        RetireEngine("/nonexistent-model", "retire", pipeline_parallel_size=2)
