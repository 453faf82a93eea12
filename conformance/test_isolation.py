"""Retired-state isolation: tenant B's execution is untouched while tenant A is superseded repeatedly.

Rules: B runs in the same batch as A's versions, so its execution shape differs from B alone; B's tokens are judged
by the logprob-closeness rule against `clean_run`. B's physical state is judged exactly: its block ids and the
digests of its full prompt blocks must not change across A's transitions.
"""
import asyncio

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from retire.barriers import wait_engine
from oracles import assert_logprobs_close, collect
from retire import UnknownScope

SP_B = SamplingParams(max_tokens=120, temperature=0, ignore_eos=True, logprobs=5)
SP_A = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


def test_cotenant_is_isolated_from_repeated_supersedes(unit):
    b_prompt = tokens(320, 500)

    async def go():
        eng = unit.retire
        await eng.submit("job", b_prompt, SP_B, tenant="B")
        b_frames = []
        first = asyncio.Event()

        async def on_b(f):
            b_frames.append(f)
            first.set()

        b_task = asyncio.ensure_future(collect(eng, "job", 0, "B", on_frame=on_b))
        await eng.submit("b-only", tokens(64, 501), SP_A, tenant="B")  # a scope only B owns
        b_only = asyncio.ensure_future(collect(eng, "b-only", 0, "B"))
        await first.wait()
        b_id = eng.internal_id("job", tenant="B")
        table0 = (await eng.backend.sched("block_table", {"req_id": b_id}))[0][:10]  # 320 prompt tokens = 10 blocks
        dig0 = (await eng.backend.worker("retire_block_digests", table0))[0]
        # Tenant A uses the same scope name; it is a different scope.
        a_prompt = tokens(400, 600)
        await eng.submit("job", a_prompt, SP_A, tenant="A")
        epoch, cur = 0, a_prompt
        for k in range(6):
            await wait_engine(eng, "job", out_tokens=2, tenant="A")  # A's version is decoding
            cur = revise(cur, 200 + 20 * k, 380, 600 + k)
            tr = await eng.supersede("job", epoch, cur, SP_A, tenant="A")
            epoch = tr.epoch
            assert tr.inherited_tokens == (200 + 20 * k) // 32 * 32, tr
        a_last = await collect(eng, "job", epoch, "A")
        table1 = (await eng.backend.sched("block_table", {"req_id": b_id}))[0][:10]
        dig1 = (await eng.backend.worker("retire_block_digests", table0))[0]
        b_run = await b_task
        b_only_id = eng.internal_id("b-only", tenant="B")
        with pytest.raises(UnknownScope, match="unknown scope 'b-only' for tenant 'A'"):
            await eng.supersede("b-only", 0, a_prompt, SP_A, tenant="A")  # B owns "b-only"; A cannot reach it
        assert (eng.current_epoch("b-only", tenant="B"), eng.internal_id("b-only", tenant="B")) == (0, b_only_id)
        b_only_run = await b_only
        assert len(b_only_run.tokens) == SP_A.max_tokens and not b_only_run.revoked  # B's scope ran on, untouched
        assert eng.current_epoch("job", tenant="B") == 0  # B's "job" never moved while A's "job" did
        return table0, dig0, table1, dig1, b_run, a_last

    table0, dig0, table1, dig1, b_run, a_last = unit.run(go())
    assert table1 == table0, "B's block table changed while A was superseded"
    assert dig1 == dig0, "B's KV pages changed while A was superseded"
    assert len(b_run.tokens) == 120 and not b_run.revoked and len(a_last.tokens) == 40
    oracle = unit.run(unit.oracle.clean_run(b_prompt, SP_B))
    assert_logprobs_close(subject=b_run, oracle=oracle, subject_name="tenant B (co-scheduled)",
                          oracle_name="clean_run")
