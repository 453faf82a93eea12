"""DRAM tier (retire/dram.py): offload certified pages to host memory, return their blocks, restore into fresh blocks.

Oracle: the successor of a restored handoff must equal `clean_prefix_run(revised[:512], revised)` exactly (512 tokens =
2 prefill chunks of 256, the same split as the predecessor's), a cold successor must equal `clean_run(revised)`.
Negative controls: with LateTransfer off the transfer is accepted; with the digest check switched off a corrupted DRAM
page is installed and the oracle comparison catches it. Engine: `unit-churn` (unit model, 128 KV blocks).
"""
import asyncio

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from oracles import collect, compare_tokens
from retire import Contract
from retire.barriers import wait_engine
from retire.dram import HoldRestore
from retire.faults.transfer import DramCorruption, LateTransfer

SP_OLD = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
DRAM = Contract(dram_tier=True, digests=True)


@pytest.fixture
def churn(device, pool):
    from conftest import _harness
    yield from _harness(pool, "unit-churn")


async def _start(eng, scope, seed):
    prompt = tokens(600, seed)
    revised = revise(prompt, 530, 600, seed)
    await eng.submit(scope, prompt, SP_OLD)
    old = asyncio.ensure_future(collect(eng, scope, 0))
    await wait_engine(eng, scope, out_tokens=1, epoch=0)  # the predecessor's prompt KV is written
    return prompt, revised, old


async def _dram_entries(eng) -> list:
    return (await eng.backend.worker("retire_dram_stats"))[0]["entries"]


@pytest.mark.parametrize("seed", [61, 62])
def test_dram_round_trip_equals_oracle(churn, seed):
    """Immediate restore (no barrier): the successor inherits 512 tokens through host memory and equals its oracle."""
    async def go():
        eng = churn.retire
        _, revised, old = await _start(eng, "d", seed)
        tr = await eng.supersede("d", 0, revised, SP_NEW, contract=DRAM)
        new = await collect(eng, "d", 1)
        await old
        ref = await churn.oracle.clean_prefix_run(revised[:512], revised, SP_NEW)
        return tr, new, ref, await _dram_entries(eng), eng.stats()

    tr, new, ref, entries, stats = churn.run(go())
    d = tr.extra["dram"]
    assert tr.inherited_tokens == 512 and tr.cold_reason is None, tr.cold_reason
    assert d["state"] == "restored" and d["pages"] == 16 and d["released_blocks"] == 16
    assert list(tr.certificate.digests) == d["digests"][0]  # pages copied out bit-for-bit (digest of the source)
    assert entries == [] and stats["dram_restored"] >= 1  # the DRAM copy is dropped after restore
    assert ref.inherited_tokens == 512
    v = compare_tokens(subject=new, oracle=ref, subject_name="successor restored from DRAM",
                       oracle_name="clean_prefix_run[:512]")
    assert v.valid is True, v.detail


def test_dram_offload_returns_capacity_then_restores(churn):
    """While the successor is held, the certified blocks are back in the allocator (every block free) and the pages
    live only in the DRAM tier; release restores them into fresh blocks and the successor equals its oracle."""
    async def go():
        eng = churn.retire
        _, revised, old = await _start(eng, "c", 63)
        async with HoldRestore(eng, "c") as hold:
            tr = await eng.supersede("c", 0, revised, SP_NEW, contract=DRAM)
            await old
            st = await eng.backend.sched("stats")
            entries = await _dram_entries(eng)
            src = list(tr.certificate.block_ids[0])
            await hold.release()
        new = await collect(eng, "c", 1)
        table = (await eng.backend.sched("block_table", {"req_id": eng.internal_id("c")}))
        ref = await churn.oracle.clean_prefix_run(revised[:512], revised, SP_NEW)
        return tr, st, entries, src, hold.result, new, ref, table

    tr, st, entries, src, res, new, ref, table = churn.run(go())
    assert st["free_blocks"] == st["num_blocks"] - 1, st  # capacity returned: nothing is held in HBM
    assert entries == [tr.extra["dram"]["tier_key"]]
    assert res["accepted"] and tr.inherited_tokens == 512 and tr.extra["dram"]["state"] == "restored"
    v = compare_tokens(subject=new, oracle=ref, subject_name="successor restored from DRAM",
                       oracle_name="clean_prefix_run[:512]")
    assert v.valid is True, v.detail


@pytest.mark.parametrize("late", [True, False], ids=["late-transfer", "control-on-time"])
def test_late_transfer_rejected(churn, late):
    """LateTransfer holds the restore of epoch 1 between write-back and install until a newer SUPERSEDE (1 -> 2) was
    applied: the install must be rejected and its blocks freed (audit), epoch 1 publishes nothing, epoch 2 (cold: epoch
    1 never ran) equals its oracle. Control: without the fault the same transfer is accepted."""
    async def go():
        eng = churn.retire
        prompt, revised, old = await _start(eng, "l", 64)
        revised2 = revise(prompt, 300, 560, 65)
        out = {}
        async with HoldRestore(eng, "l") as hold:
            tr1 = await eng.supersede("l", 0, revised, SP_NEW, contract=DRAM)
            await old
            if late:
                fault = LateTransfer("l", 1)
                async with fault.on(eng):
                    restoring = asyncio.ensure_future(hold.release())
                    held = asyncio.ensure_future(fault.held.wait())
                    await asyncio.wait([restoring, held], return_when=asyncio.FIRST_COMPLETED)
                    assert fault.held.is_set(), "the transfer was never held by the fault"
                    out["tr2"] = await eng.supersede("l", 1, revised2, SP_NEW)
                    await restoring
                out["run1"] = await collect(eng, "l", 1)
                out["run2"] = await collect(eng, "l", 2)
                out["ref"] = await churn.oracle.clean_run(revised2, SP_NEW)
            else:
                await hold.release()
                out["run1"] = await collect(eng, "l", 1)
                out["ref"] = await churn.oracle.clean_prefix_run(revised[:512], revised, SP_NEW)
        out["entries"] = await _dram_entries(eng)
        return tr1, hold.result, out, eng.stats()

    tr1, res, out, stats = churn.run(go())
    assert out["entries"] == []
    if late:
        assert res["accepted"] is False and res["late"] is True and res["freed_blocks"] == 16, res
        assert tr1.inherited_tokens == 0 and tr1.cold_reason.startswith("late transfer rejected"), tr1.cold_reason
        assert tr1.extra["dram"]["state"] == "rejected" and stats["dram_rejected_late"] == 1
        assert out["run1"].tokens == () and out["run1"].revoked  # epoch 1 published nothing
        assert out["tr2"].inherited_tokens == 0
        v = compare_tokens(subject=out["run2"], oracle=out["ref"], subject_name="epoch 2", oracle_name="clean_run")
    else:
        assert res["accepted"] is True and tr1.inherited_tokens == 512, res
        v = compare_tokens(subject=out["run1"], oracle=out["ref"], subject_name="epoch 1 restored",
                           oracle_name="clean_prefix_run[:512]")
    assert v.valid is True, v.detail


def test_superseded_before_restore_drops_the_copy(churn):
    """A newer SUPERSEDE before the restore started retires the DRAM copy at once; a restore attempted afterwards is
    refused as late and changes nothing."""
    async def go():
        eng = churn.retire
        prompt, revised, old = await _start(eng, "b", 66)
        async with HoldRestore(eng, "b") as hold:
            tr1 = await eng.supersede("b", 0, revised, SP_NEW, contract=DRAM)
            await old
            tr2 = await eng.supersede("b", 1, revise(prompt, 200, 500, 67), SP_NEW)
            entries = await _dram_entries(eng)
            await hold.release()
        run2 = await collect(eng, "b", 2)
        return tr1, tr2, entries, hold.result, run2

    tr1, tr2, entries, res, run2 = churn.run(go())
    assert entries == [] and res["late"] and not res["accepted"], (entries, res)
    assert tr1.extra["dram"]["state"] == "rejected" and len(run2.tokens) == 16


@pytest.mark.parametrize("verify", [True, False], ids=["digest-check", "negative-control-no-check"])
def test_dram_digest_mismatch_selects_cold(churn, verify):
    """DramCorruption flips 4 pages of the DRAM copy. With the digest check the restore selects a cold recompute (and
    the successor equals clean_run); with the check switched off (test switch) the corrupted pages are installed and
    the oracle comparison must catch the divergence."""
    async def go():
        eng = churn.retire
        if not verify:
            eng.seams.dram_verify = False
        _, revised, old = await _start(eng, "m", 68)
        async with HoldRestore(eng, "m") as hold:
            tr = await eng.supersede("m", 0, revised, SP_NEW, contract=DRAM)
            await old
            async with DramCorruption("m", pages=[12, 13, 14, 15]).on(eng):
                await hold.release()
        new = await collect(eng, "m", 1)
        if verify:
            ref = await churn.oracle.clean_run(revised, SP_NEW)
        else:
            ref = await churn.oracle.clean_prefix_run(revised[:512], revised, SP_NEW)
        return tr, new, ref

    tr, new, ref = churn.run(go())
    if verify:
        assert tr.inherited_tokens == 0 and "digest mismatch on page(s) [12, 13, 14, 15]" in tr.cold_reason
        assert tr.extra["dram"]["state"] == "cold"
        v = compare_tokens(subject=new, oracle=ref, subject_name="cold successor", oracle_name="clean_run")
        assert v.valid is True, v.detail
    else:
        assert tr.inherited_tokens == 512  # installed without verification
        v = compare_tokens(subject=new, oracle=ref, subject_name="successor on corrupted DRAM pages",
                           oracle_name="clean_prefix_run[:512]")
        assert v.valid is False, "the oracle must catch corrupted restored pages: " + v.detail


def test_dram_faults_declare_and_compose():
    """Each DRAM fault names the operation it breaks; two faults on the same operation conflict at composition."""
    from retire.faults import FaultConflict, compose
    from retire.faults.churn import Churn

    assert LateTransfer("a", 1).affects == {"dram.install"} and DramCorruption("a").affects == {"dram.page"}
    compose(LateTransfer("a", 1), DramCorruption("a"), Churn(1.1))  # distinct operations: fine
    with pytest.raises(FaultConflict):
        compose(LateTransfer("a", 1), LateTransfer("b", 2))
    with pytest.raises(FaultConflict):
        compose(DramCorruption("a", pages=[0]), DramCorruption("a", pages=[1]))
