"""DRAM handoff ledger, engine-free: the engine half of the DRAM tier (retire/dram/engine.py) inside a real
RetireScheduler with vLLM's own KVCacheManager and BlockPool, no model (conformance/fixtures/enginefree.py).

The invariants under test:
- a held handoff pins its source blocks until copy-out finishes (`offloaded` releases exactly that pin), and
  allocation pressure inside that window never takes a pinned source block;
- a restore that cannot get enough free blocks is refused with `cold: True` and takes nothing; the held successor is
  then admitted cold (`cold_admit`);
- a transfer pins its destination blocks (fresh ones, not the sources); an install for a retired epoch (a late
  transfer) frees them and installs nothing; a generation mismatch on the destination turns the successor cold;
- after every path the refcount audit balances (ref_cnt == table references + pins).

Negative controls: the audit flags a pin dropped from the ledger without freeing its blocks, and the generation
check flags a destination block reallocated during the transfer.
"""
from __future__ import annotations

import msgspec

from conformance.fixtures.enginefree import EngineFreeCore
from conformance.fixtures.prompts import revise, tokens
from retire import Contract
from retire.ledger import PinKey

DRAM = Contract(dram_tier=True)


def _held_handoff(core: EngineFreeCore, scope: str = "s"):
    """A predecessor with 200 computed prompt tokens, superseded under the DRAM tier by a revision sharing 150:
    4 certified blocks pinned, the successor held."""
    prompt = tokens(200, 7)
    core.submit("t", scope, prompt)
    core.step()
    core.step()
    res, succ = core.supersede("t", scope, 0, revise(prompt, 150, 220, 1), contract=DRAM)
    assert res.refused is None and res.dram is not None and res.dram.tokens == 128, res
    return res, succ


def _cmd(core, op: str, key, **kw):
    return core.s("dram", dict(op=op, key=msgspec.to_builtins(key), **kw))


def test_offload_releases_the_source_pin_and_audit_balances():
    core = EngineFreeCore()
    res, succ = _held_handoff(core)
    src = [b for g in res.dram.src for b in g]
    assert core.s.retire.pins.pinned("t") == 4
    assert all(core.port.ref_counts()[b] == 1 for b in src)  # the predecessor is gone: only the handoff pin
    v = core.audit()["violations"]  # mid-handoff: the pin and the held successor are reported, nothing leaked
    assert len(v) == 2 and "dangling pins" in v[0] and "successors still held" in v[1], v
    out = _cmd(core, "offloaded", res.key)
    assert out["ok"] and out["released_blocks"] == 4 and core.s.retire.pins.pinned("t") == 0
    assert not _cmd(core, "offloaded", res.key)["ok"]  # a second copy-out report is stale: the state moved on


def test_allocation_pressure_inside_the_pin_window_never_takes_a_source_block():
    core = EngineFreeCore(num_blocks=24)
    res, _ = _held_handoff(core)
    src = {b for g in res.dram.src for b in g}
    free = core.port.free_block_count()
    fresh = core.port.alloc(free)  # every block the pool can give, while the sources are pinned
    assert fresh is not None and len(fresh) == free and not src & set(fresh)
    assert core.port.alloc(1) is None
    assert all(core.port.ref_counts()[b] == 1 for b in src)
    core.port.unpin(fresh)


def test_restore_refused_when_free_blocks_run_short_then_admitted_cold():
    core = EngineFreeCore(num_blocks=24)
    res, succ = _held_handoff(core)
    _cmd(core, "offloaded", res.key)
    hog = core.port.alloc(core.port.free_block_count() - 3)  # leave 3 free, the restore needs 4
    free_before = core.port.free_block_count()
    out = _cmd(core, "alloc", res.key)
    assert out.get("cold") is True and "4 blocks needed, 3 free" in out["refused"], out
    assert core.port.free_block_count() == free_before and not core.s.retire.pins.pins
    adm = _cmd(core, "cold_admit", res.key, reason=out["refused"])
    assert adm["cold_reason"] and not core.s.retire.holds.held
    core.port.unpin(hog)
    core.drain()
    assert core.audit()["valid"], core.audit()


def test_transfer_pins_fresh_destination_and_late_install_frees_it():
    core = EngineFreeCore()
    res, succ = _held_handoff(core)
    src = {b for g in res.dram.src for b in g}
    _cmd(core, "offloaded", res.key)
    out = _cmd(core, "alloc", res.key)
    dst = [b for g in out["ids"] for b in g]
    assert len(dst) == 4 and core.s.retire.pins.counts() == {b: 1 for b in dst}
    # a newer SUPERSEDE retires epoch 1 while the transfer is in flight
    res2, _ = core.supersede("t", "s", 1, tokens(64, 9))
    assert res2.refused is None and res2.dram_stale == ()  # transfer in flight: the frontend keeps the copy
    late = _cmd(core, "install", res.key, ok=True)
    assert late["accepted"] is False and late["late"] and late["freed_blocks"] == 4, late
    assert not core.s.retire.pins.pins and core.s.retire.counters["dram_rejected_late"] == 1
    core.drain()
    assert core.audit()["valid"], core.audit()
    assert src  # sources were certified blocks of the predecessor, never reused as destinations
    assert not src & set(dst)


def test_restored_successor_owns_the_destination_blocks():
    core = EngineFreeCore()
    res, succ = _held_handoff(core)
    _cmd(core, "offloaded", res.key)
    dst = _cmd(core, "alloc", res.key)["ids"]
    out = _cmd(core, "install", res.key, ok=True)
    assert out["accepted"] and out["inherited_tokens"] == 128
    assert core.port.blocks(succ)[0][:4] == dst[0] and core.s.requests[succ].num_computed_tokens == 128
    core.drain()
    assert core.audit()["valid"], core.audit()


def test_generation_mismatch_turns_the_successor_cold():
    core = EngineFreeCore()
    res, succ = _held_handoff(core)
    _cmd(core, "offloaded", res.key)
    victim = _cmd(core, "alloc", res.key)["ids"][0][0]
    # the fault: the destination block is freed behind the pin's back and reallocated during the transfer
    core.port.unpin([victim])
    again = core.port.alloc(core.port.free_block_count())
    assert victim in again
    out = _cmd(core, "install", res.key, ok=True)
    assert out["accepted"] is False and "generation mismatch" in out["cold_reason"], out
    assert core.s.retire.counters["dram_cold"] == 1 and not core.s.retire.holds.held
    core.port.unpin([b for b in again if b != victim])
    core.drain()


def test_retire_stale_before_copy_out_releases_the_source_pin():
    core = EngineFreeCore()
    res, _ = _held_handoff(core)
    res2, _ = core.supersede("t", "s", 1, tokens(64, 9))
    assert res2.dram_stale == (res.key,)  # no transfer in flight: the frontend drops the DRAM copy
    assert not core.s.retire.pins.pins
    assert _cmd(core, "offloaded", res.key)["ok"] is False
    core.drain()
    assert core.audit()["valid"], core.audit()


def test_negative_control_audit_flags_a_leaked_pin():
    core = EngineFreeCore()
    res, _ = _held_handoff(core)
    _cmd(core, "offloaded", res.key)
    _cmd(core, "alloc", res.key)
    # the fault: the transfer pin is dropped from the ledger without freeing its blocks
    core.s.retire.pins.pins.pop(PinKey(res.key, "transfer"))
    problems = [v for v in core.audit()["violations"] if "leaked" in v]
    assert len(problems) == 4, problems
