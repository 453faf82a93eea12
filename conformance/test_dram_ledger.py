"""DramLedger, engine-free: the DRAM handoff's state machine on a real vLLM BlockPool, no engine.

The invariants under test (retire/dram.py):
- a held handoff pins its source blocks until copy-out finishes (`offloaded` releases exactly that pin);
- a restore that cannot get enough free blocks is refused with `cold: True` and takes nothing from the pool;
- a transfer pins its destination blocks; an install for a retired epoch (a late transfer) frees them and installs
  nothing; a generation mismatch on the destination turns the successor cold and frees them too;
- after every path the refcount audit balances: ref_cnt == pins (there are no request tables here).

Negative controls: the audit flags a pin left behind by hand, and the generation check flags a block reallocated
during the transfer (the fault is a free + reallocation between `alloc` and `install`).
"""
from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from vllm.v1.core.block_pool import BlockPool

from retire.dram import DramLedger, _pin_key
from retire.ledger import GenerationTable, PinLedger, refcount_audit


NUM_BLOCKS = 16


class LedgerHost:
    """The slice of RetireScheduler that DramLedger touches, around a real BlockPool."""

    def __init__(self, num_blocks: int = NUM_BLOCKS):
        pool = BlockPool(num_blocks, enable_caching=True, hash_block_size=32)
        self.kv_cache_manager = SimpleNamespace(block_pool=pool)
        self.pool = pool
        self.retire_gens = GenerationTable(num_blocks)
        self.retire_gens.wrap(pool)
        self.retire_pins = PinLedger(pool)
        self.retire_counters: Counter = Counter()
        self.retire_current: dict = {}
        self.retire_held: dict = {}
        self.requests: dict = {}
        self.released: list[str] = []

    def _cmd_release(self, scope: str) -> None:
        self.released.append(scope)
        self.retire_held.pop(scope, None)

    def audit(self) -> list[str]:
        return refcount_audit(blocks=self.pool.blocks, tables=[], pins=self.retire_pins.counts(),
                              null_block_id=self.pool.null_block.block_id)


def _held_handoff(h: LedgerHost, ledger: DramLedger, n_blocks: int = 4, scope: str = "s") -> tuple[str, list]:
    """A predecessor's certified blocks, pinned as RESUME would, and a held successor at epoch 1."""
    src = h.pool.get_new_blocks(n_blocks)
    key = f"{scope}#0"
    h.retire_pins.pin(key, "default", src)
    h.pool.free_blocks(src)  # the predecessor ends: the pin is the only reference
    succ = SimpleNamespace(request_id=f"{scope}#1")
    h.requests[succ.request_id] = SimpleNamespace(num_computed_tokens=0)
    h.retire_current[scope] = (1, succ.request_id)
    h.retire_held[scope] = succ
    assert ledger.hold(h, scope, key, succ, [src], n_blocks * 32, {"epoch": 1}) is None
    return key, src


def test_offload_releases_the_source_pin_and_audit_balances():
    h, ledger = LedgerHost(), DramLedger()
    key, src = _held_handoff(h, ledger)
    assert h.retire_pins.pinned("default") == 4 and not h.audit()
    res = ledger.command(h, "offloaded", scope="s", epoch=1)
    assert res["ok"] and res["released_blocks"] == 4
    assert h.retire_pins.pinned("default") == 0 and not h.audit()
    # a second copy-out report for the same epoch is stale: the state moved on
    assert not ledger.command(h, "offloaded", scope="s", epoch=1)["ok"]


def test_restore_refused_when_free_blocks_run_short():
    h, ledger = LedgerHost(), DramLedger()
    key, _ = _held_handoff(h, ledger, n_blocks=4)
    ledger.command(h, "offloaded", scope="s", epoch=1)
    hog = h.pool.get_new_blocks(h.pool.get_num_free_blocks() - 3)  # leave 3 free, the restore needs 4
    free_before = h.pool.get_num_free_blocks()
    res = ledger.command(h, "alloc", scope="s", epoch=1)
    assert res.get("cold") is True and "4 blocks needed, 3 free" in res["refused"], res
    assert h.pool.get_num_free_blocks() == free_before  # nothing taken
    assert not h.retire_pins.pins and ledger.pending["s"].state == "offloaded"
    h.pool.free_blocks(hog)
    assert not h.audit()


def test_transfer_pins_destination_and_late_install_frees_it():
    h, ledger = LedgerHost(), DramLedger()
    key, _ = _held_handoff(h, ledger)
    ledger.command(h, "offloaded", scope="s", epoch=1)
    res = ledger.command(h, "alloc", scope="s", epoch=1)
    dst = [b for g in res["ids"] for b in g]
    assert len(dst) == 4 and h.retire_pins.counts() == Counter(dst) and not h.audit()
    # a newer SUPERSEDE retires epoch 1 while the transfer is in flight
    assert ledger.retire_stale(h, "s") == []  # transfer in flight: the frontend must not drop the key yet
    h.retire_current["s"] = (2, "s#2")
    out = ledger.command(h, "install", scope="s", epoch=1, key=key, ok=True)
    assert out["accepted"] is False and out["late"] and out["freed_blocks"] == 4, out
    assert not h.retire_pins.pins and not h.audit()
    assert h.retire_counters["dram_rejected_late"] == 1 and not h.released


def test_generation_mismatch_turns_the_successor_cold():
    h, ledger = LedgerHost(), DramLedger()
    key, _ = _held_handoff(h, ledger)
    ledger.command(h, "offloaded", scope="s", epoch=1)
    res = ledger.command(h, "alloc", scope="s", epoch=1)
    victim = h.pool.blocks[res["ids"][0][0]]
    # the fault: the destination block is freed behind the pin's back and reallocated during the transfer
    h.pool.free_blocks([victim])
    again = h.pool.get_new_blocks(h.pool.get_num_free_blocks())
    assert victim in again
    out = ledger.command(h, "install", scope="s", epoch=1, key=key, ok=True)
    assert out["accepted"] is False and "generation mismatch" in out["cold_reason"], out
    assert h.released == ["s"] and h.retire_counters["dram_cold"] == 1 and "s" not in ledger.pending
    assert not h.retire_pins.pins  # the transfer pin is gone; the reallocated block belongs to `again` alone


def test_retire_stale_before_copy_out_releases_the_source_pin():
    h, ledger = LedgerHost(), DramLedger()
    key, _ = _held_handoff(h, ledger)
    assert ledger.retire_stale(h, "s") == [key]  # no transfer in flight: the frontend drops the DRAM copy
    assert not h.retire_pins.pins and not h.audit()
    assert ledger.command(h, "offloaded", scope="s", epoch=1)["ok"] is False


def test_negative_control_audit_flags_a_leaked_pin():
    h, ledger = LedgerHost(), DramLedger()
    _held_handoff(h, ledger)
    ledger.command(h, "offloaded", scope="s", epoch=1)
    ledger.command(h, "alloc", scope="s", epoch=1)
    # the fault: the transfer pin is dropped from the ledger without freeing its blocks
    h.retire_pins.pins.pop(_pin_key("s#0"))
    problems = h.audit()
    assert len(problems) == 4 and all("leaked" in p for p in problems), problems
