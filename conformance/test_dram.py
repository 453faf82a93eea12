"""DRAM tier (retire/dram.py): offload certified pages to host memory, return their blocks, restore into fresh blocks.

Oracles, all outside the tier: the successor of a restored handoff must equal `clean_prefix_run(revised[:512],
revised)` exactly (512 tokens = 2 prefill chunks of 256, the same split as the predecessor's), a cold successor must
equal `clean_run(revised)` and be cold by vLLM's own count (`num_cached_tokens == 0`). The restored pages are
compared with an INDEPENDENT read of the source pages taken before the SUPERSEDE (`retire_block_digests` of the
predecessor's blocks, looked up in vLLM's own block table), never with the digests the tier recorded itself; the
restore must land in fresh blocks (the successor's table shares no block with the source table).
Negative controls: with LateTransfer off the transfer is accepted; with the digest check switched off a corrupted DRAM
page is installed and both the oracle comparison and the independent page read catch it. Engine: `unit-churn` (unit
model, 128 KV blocks).
"""
import asyncio

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from oracles import collect, compare_tokens
from retire import Contract
from retire.barriers import wait_engine
from retire.dram import HoldRestore
from retire.faults.churn import Churn
from retire.faults.transfer import DramCorruption, LateTransfer, TransferPressure

SP_OLD = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
DRAM = Contract(dram_tier=True, digests=True)


@pytest.fixture
def churn(device, pool):
    from conftest import _harness
    yield from _harness(pool, "unit-churn")


CERT_BLOCKS = 16  # 512 certified tokens / block 32


async def _start(eng, scope, seed):
    prompt = tokens(600, seed)
    revised = revise(prompt, 530, 600, seed)
    await eng.submit(scope, prompt, SP_OLD)
    old = asyncio.ensure_future(collect(eng, scope, 0))
    await wait_engine(eng, scope, out_tokens=1, epoch=0)  # the predecessor's prompt KV is written
    return prompt, revised, old


async def _pages(eng, req_id: str, n: int = CERT_BLOCKS) -> tuple[list[int], list[str]]:
    """The first `n` blocks of a request's table (vLLM's req_to_blocks) and an independent read of their bytes."""
    ids = (await eng.backend.sched("block_table", {"req_id": req_id}))[0][:n]
    return ids, (await eng.backend.worker("retire_block_digests", ids))[0]


def _differing(a: list[str], b: list[str]) -> list[int]:
    return [i for i, (x, y) in enumerate(zip(a, b)) if x != y] + list(range(min(len(a), len(b)), max(len(a), len(b))))


async def _dram_entries(eng) -> list:
    return (await eng.backend.worker("retire_dram_stats"))[0]["entries"]


@pytest.mark.parametrize("seed", [61, 62])
def test_dram_round_trip_equals_oracle(churn, seed):
    """Immediate restore (no barrier): the successor inherits 512 tokens through host memory and equals its oracle."""
    async def go():
        eng = churn.retire
        _, revised, old = await _start(eng, "d", seed)
        src, src_pages = await _pages(eng, eng.internal_id("d", 0))  # independent read, before the SUPERSEDE
        tr = await eng.supersede("d", 0, revised, SP_NEW, contract=DRAM)
        dst, dst_pages = await _pages(eng, eng.internal_id("d", 1))
        new = await collect(eng, "d", 1)
        await old
        ref = await churn.oracle.clean_prefix_run(revised[:512], revised, SP_NEW)
        return tr, new, ref, await _dram_entries(eng), eng.stats(), (src, src_pages, dst, dst_pages)

    tr, new, ref, entries, stats, (src, src_pages, dst, dst_pages) = churn.run(go())
    d = tr.extra["dram"]
    assert tr.inherited_tokens == 512 and tr.cold_reason is None, tr.cold_reason
    assert d["state"] == "restored" and d["pages"] == 16 and d["released_blocks"] == 16
    assert list(tr.certificate.block_ids[0]) == src  # ALIGN certified the predecessor's own blocks (vLLM's table)
    assert not set(dst) & set(src), f"restored into source blocks {sorted(set(dst) & set(src))}, not fresh ones"
    bad = _differing(dst_pages, src_pages)
    assert not bad, f"restored pages differ from the source read at pages {bad}"
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
        src, src_pages = await _pages(eng, eng.internal_id("c", 0))
        async with HoldRestore(eng, "c") as hold:
            tr = await eng.supersede("c", 0, revised, SP_NEW, contract=DRAM)
            await old
            st = await eng.backend.sched("stats")
            entries = await _dram_entries(eng)
            await hold.release()
        dst, dst_pages = await _pages(eng, eng.internal_id("c", 1))
        new = await collect(eng, "c", 1)
        ref = await churn.oracle.clean_prefix_run(revised[:512], revised, SP_NEW)
        return tr, st, entries, (src, src_pages, dst, dst_pages), hold.result, new, ref

    tr, st, entries, (src, src_pages, dst, dst_pages), res, new, ref = churn.run(go())
    assert st["free_blocks"] == st["num_blocks"] - 1, st  # capacity returned: nothing is held in HBM
    assert entries == [tr.extra["dram"]["tier_key"]]
    assert res["accepted"] and tr.inherited_tokens == 512 and tr.extra["dram"]["state"] == "restored"
    assert len(dst) == len(src) == CERT_BLOCKS and not set(dst) & set(src), (src, dst)  # fresh blocks
    bad = _differing(dst_pages, src_pages)
    assert not bad, f"restored pages differ from the source read at pages {bad}"
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
        assert out["tr2"].inherited_tokens == 0 and out["run2"].num_cached_tokens == 0  # cold by vLLM's count
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
    the successor equals clean_run, cold by vLLM's count); with the check switched off (test switch) the corrupted
    pages are installed and both outside checks must catch them: the independent page read names exactly the 4
    corrupted pages, and the oracle comparison diverges."""
    async def go():
        eng = churn.retire
        if not verify:
            eng.seams.dram_verify = False
        _, revised, old = await _start(eng, "m", 68)
        src, src_pages = await _pages(eng, eng.internal_id("m", 0))
        async with HoldRestore(eng, "m") as hold:
            tr = await eng.supersede("m", 0, revised, SP_NEW, contract=DRAM)
            await old
            async with DramCorruption("m", pages=[12, 13, 14, 15]).on(eng):
                await hold.release()
        dst, dst_pages = await _pages(eng, eng.internal_id("m", 1))
        new = await collect(eng, "m", 1)
        if verify:
            ref = await churn.oracle.clean_run(revised, SP_NEW)
        else:
            ref = await churn.oracle.clean_prefix_run(revised[:512], revised, SP_NEW)
        return tr, new, ref, src_pages, dst_pages

    tr, new, ref, src_pages, dst_pages = churn.run(go())
    if verify:
        assert tr.inherited_tokens == 0 and "digest mismatch on page(s) [12, 13, 14, 15]" in tr.cold_reason
        assert tr.extra["dram"]["state"] == "cold" and new.num_cached_tokens == 0
        v = compare_tokens(subject=new, oracle=ref, subject_name="cold successor", oracle_name="clean_run")
        assert v.valid is True, v.detail
    else:
        assert tr.inherited_tokens == 512  # installed without verification
        assert _differing(dst_pages, src_pages) == [12, 13, 14, 15], "the independent page read must name them"
        v = compare_tokens(subject=new, oracle=ref, subject_name="successor on corrupted DRAM pages",
                           oracle_name="clean_prefix_run[:512]")
        assert v.valid is False, "the oracle must catch corrupted restored pages: " + v.detail


async def _pressure_case(h, scope: str, seed: int, *, corrupt: bool):
    """A DRAM handoff with allocation pressure in both pin windows: after copy-out (source blocks returned) Churn(1.1)
    reallocates every block of the pool, the source blocks among them; during the restore, between write-back and
    install (destination blocks held by the transfer pin only), TransferPressure runs Churn(0.5). `corrupt` flips two
    pages of the DRAM copy with the tier's digest check switched off (the negative control)."""
    eng = h.retire
    _, revised, old = await _start(eng, scope, seed)
    src, src_pages = await _pages(eng, eng.internal_id(scope, 0))  # independent read, before the SUPERSEDE
    if corrupt:
        eng.seams.dram_verify = False
    out: dict = {"src": src, "src_pages": src_pages}
    async with HoldRestore(eng, scope) as hold:
        out["tr"] = await eng.supersede(scope, 0, revised, SP_NEW, contract=DRAM)
        await old
        churn = Churn(1.1, seed=seed)
        async with churn.on(eng):
            pass
        out["churned"], out["capacity"] = churn.churned_tokens, churn.capacity_tokens
        out["src_after_churn"] = (await eng.backend.worker("retire_block_digests", src))[0]
        pressure = TransferPressure(scope, 1, fraction=0.5, seed=seed + 1)
        corruption = DramCorruption(scope, pages=[3, 9]) if corrupt else None
        async with pressure.on(eng):
            if corruption is not None:
                async with corruption.on(eng):
                    await hold.release()
            else:
                await hold.release()
        out["pressure"] = pressure
    out["dst"], out["dst_pages"] = await _pages(eng, eng.internal_id(scope, 1))
    out["new"] = await collect(eng, scope, 1)
    out["ref"] = await h.oracle.clean_prefix_run(revised[:512], revised, SP_NEW)
    return out


@pytest.mark.timeout(600)
@pytest.mark.parametrize("corrupt", [False, True], ids=["pressure", "negative-control-corrupted"])
def test_dram_restore_under_allocation_pressure(churn, corrupt):
    """The pin windows hold under allocation pressure: the source pages are overwritten by other requests after
    copy-out (proved by a second independent read), the destination blocks survive Churn while only the transfer pin
    holds them, and the restored pages equal the source read taken before the SUPERSEDE; the successor equals
    clean_prefix_run[:512]. Negative control: two corrupted DRAM pages installed without the tier's check are named
    by the independent read, exactly."""
    out = churn.run(_pressure_case(churn, "pr", 69, corrupt=corrupt), timeout=540)
    tr, p = out["tr"], out["pressure"]
    assert out["churned"] >= 1.1 * out["capacity"] - 1, (out["churned"], out["capacity"])
    overwritten = _differing(out["src_after_churn"], out["src_pages"])
    assert overwritten, "the churn never reached the source blocks: no allocation pressure in the window"
    assert p.held == 1 and p.churn.churned_tokens >= 0.5 * p.churn.capacity_tokens - 1, vars(p)
    assert tr.inherited_tokens == 512 and tr.extra["dram"]["state"] == "restored", tr.cold_reason
    assert len(out["dst"]) == CERT_BLOCKS
    bad = _differing(out["dst_pages"], out["src_pages"])
    if corrupt:
        assert bad == [3, 9], f"the independent page read must name exactly the corrupted pages, got {bad}"
        return
    assert bad == [], f"restored pages differ from the source read taken before the SUPERSEDE at pages {bad}"
    v = compare_tokens(subject=out["new"], oracle=out["ref"], subject_name="successor restored under pressure",
                       oracle_name="clean_prefix_run[:512]")
    assert v.valid is True, v.detail


def test_dram_faults_declare_and_compose():
    """Each DRAM fault names the operation it breaks; two faults on the same operation conflict at composition."""
    from retire.faults import FaultConflict, compose

    assert LateTransfer("a", 1).affects == {"dram.install"} and DramCorruption("a").affects == {"dram.page"}
    assert TransferPressure("a", 1).affects == {"kv.capacity", "dram.transfer"}
    compose(LateTransfer("a", 1), DramCorruption("a"), Churn(1.1))  # distinct operations: fine
    compose(LateTransfer("a", 1), DramCorruption("a"), TransferPressure("a", 1))
    with pytest.raises(FaultConflict, match="both affect 'dram.install'"):
        compose(LateTransfer("a", 1), LateTransfer("b", 2))
    with pytest.raises(FaultConflict, match="both affect 'dram.page'"):
        compose(DramCorruption("a", pages=[0]), DramCorruption("a", pages=[1]))
    with pytest.raises(FaultConflict, match="both affect 'kv.capacity'"):
        compose(TransferPressure("a", 1), Churn(0.5))  # both take KV capacity
