"""Page-fault positive control: the oracle comparison detects corrupted adopted pages, and healing restores them.

Execution shape: the inherited prefix is 512 tokens = 2 prefill chunks of 256, computed in the same splits by the
predecessor and by `clean_prefix_run`, so the comparison is exact (token ids identical).
"""
import asyncio

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from retire.barriers import wait_engine
from oracles import collect, compare_tokens
from retire import Contract
from retire.barriers import HoldSuccessor
from retire.faults import PageCorruption

SP_OLD = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


async def _adopt_with(h, scope: str, seed: int, *, heal_before_release: bool):
    eng = h.retire
    prompt = tokens(600, seed)
    revised = revise(prompt, 530, 600, seed)
    await eng.submit(scope, prompt, SP_OLD)
    old = asyncio.ensure_future(collect(eng, scope, 0))
    await wait_engine(eng, scope, out_tokens=1)  # the predecessor's prompt KV is written
    async with HoldSuccessor(eng, scope) as hold:
        tr = await eng.supersede(scope, 0, revised, SP_NEW, contract=Contract(digests=True))
        cert = tr.certificate
        ids = list(cert.block_ids[0])
        fault = PageCorruption(ids[-4:])
        await fault.inject(eng)
        try:
            table = await eng.backend.sched("block_table", {"req_id": eng.internal_id(scope)})
            assert table[0][: len(ids)] == ids and len(ids) == 16  # ids and counts unchanged by the fault
            now = (await eng.backend.worker("retire_block_digests", ids))[0]
            assert now[:-4] == list(cert.digests[:-4]) and all(a != b for a, b in zip(now[-4:], cert.digests[-4:]))
            if heal_before_release:
                await fault.heal()
                assert (await eng.backend.worker("retire_block_digests", ids))[0] == list(cert.digests)
            await hold.release()
            new = await collect(eng, scope, 1)
        finally:
            if fault.injected:
                await fault.heal()  # also heals the prefix-cache copy of those blocks
    await old
    oracle = await h.oracle.clean_prefix_run(revised[: tr.inherited_tokens], revised, SP_NEW)
    return tr, new, oracle


@pytest.mark.parametrize("seed", [41, 42, 43])
def test_corrupted_adopted_pages_diverge(unit, seed):
    tr, new, oracle = unit.run(_adopt_with(unit, "pf", seed, heal_before_release=False))
    assert tr.inherited_tokens == 512
    v = compare_tokens(subject=new, oracle=oracle, subject_name="successor on corrupted pages",
                       oracle_name="clean_prefix_run")
    assert v.valid is False, "the checker must catch corrupted inherited KV: " + v.detail


@pytest.mark.parametrize("seed", [41, 42, 43])
def test_healed_pages_are_exact_again(unit, seed):
    tr, new, oracle = unit.run(_adopt_with(unit, "pf", seed, heal_before_release=True))
    assert tr.inherited_tokens == 512
    v = compare_tokens(subject=new, oracle=oracle, subject_name="successor on healed pages",
                       oracle_name="clean_prefix_run")
    assert v.valid is True, v.detail


def test_page_corruption_changes_exactly_the_corrupted_digest_and_heal_restores(unit):
    """Issue #2 test 4: the fault touches one block only, and heal restores its bytes."""
    async def go():
        eng = unit.retire
        await eng.submit("pc", tokens(300, 5), SP_OLD)
        got = []
        async for f in eng.stream("pc"):
            if not got:
                table = (await eng.backend.sched("block_table", {"req_id": eng.internal_id("pc")}))[0]
            got.extend(f.token_ids)
        ids = table[:8]
        d0 = (await eng.backend.worker("retire_block_digests", ids))[0]
        async with PageCorruption([ids[3]]).on(eng):
            d1 = (await eng.backend.worker("retire_block_digests", ids))[0]
        d2 = (await eng.backend.worker("retire_block_digests", ids))[0]
        return d0, d1, d2

    d0, d1, d2 = unit.run(go())
    assert [i for i, (a, b) in enumerate(zip(d0, d1)) if a != b] == [3]
    assert d2 == d0
