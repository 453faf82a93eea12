"""Engine-free unit tests of the control-plane core's building blocks, each against the invariant its module states:
retire/versions.py (the engine's commit point), retire/ledger.py (generations, pins, the refcount audit, on vLLM's
own BlockPool), retire/align.py (ALIGN's arithmetic and exact-mode provenance), retire/holds.py.

Refcounts are read from vLLM's own `BlockPool` (`port.ref_counts()`, `block.ref_cnt`), never from the ledger under
test. These tests exist so the mutation run (`make mutate`, docs/mutation.md) kills mutants the exploration machine
cannot observe; each asserts behaviour a caller depends on.
"""
from __future__ import annotations

from collections import Counter

import pytest

from conformance.fixtures.enginefree import EngineFreeCore
from retire.align import Alignment, ChunkShape, alignment_unit, certify_length, common_prefix_len
from retire.holds import Holds
from retire.ledger import GenerationTable, PinKey, PinLedger, refcount_audit
from retire.types import Contract, RequestTag, ScopeKey, Supersede, VersionKey
from retire.versions import Current, VersionTable

SK = ScopeKey("ns", "t", "s")


def _tag(epoch: int, expected: int | None = None, scope: ScopeKey = SK) -> RequestTag:
    sup = None if expected is None else Supersede(expected, Contract())
    return RequestTag(VersionKey(scope, epoch), "retire", sup)


def _vt_state(vt: VersionTable):
    return dict(vt.current), dict(vt.tags)


# ================================================================================================ versions.py
def test_register_makes_epoch_zero_current_and_never_displaces_a_live_version():
    vt = VersionTable()
    live = {"r0"}
    assert vt.register("r0", _tag(0), live.__contains__) is True
    assert vt.current[SK] == Current(0, "r0") and vt.tag("r0") == _tag(0) and vt.epoch(SK) == 0
    before = _vt_state(vt)
    assert vt.register("dup", _tag(0), live.__contains__) is False  # a duplicate submit cannot silence r0
    # the duplicate is known by its tag (so gate (a) and the audit see it) but never current; r0 stays current
    assert vt.current == before[0] and vt.tags == {**before[1], "dup": _tag(0)}
    assert vt.is_current("r0") and not vt.is_current("dup")
    live.clear()  # r0 finished: a new epoch-0 submit of the scope takes over
    assert vt.register("r1", _tag(0), live.__contains__) is True
    assert vt.current[SK] == Current(0, "r1") and not vt.is_current("r0") and vt.is_current("r1")


def test_check_refuses_unknown_scopes_stale_future_negative_and_skipping_epochs_and_changes_nothing():
    vt = VersionTable()
    vt.register("r0", _tag(0), lambda r: True)
    vt.advance("r1", _tag(1, 0))
    before = _vt_state(vt)
    other = ScopeKey("ns", "u", "s")  # the same scope name, another tenant: unknown
    kind, msg = vt.check(_tag(1, 0, scope=other))
    assert kind == "unknown-scope" and msg == "unknown scope 's' for tenant 'u'"
    for expected in (0, 2, -1, -2):
        kind, msg = vt.check(_tag(expected + 1, expected))
        assert kind == "stale-epoch" and msg == f"stale epoch: scope 's' is at epoch 1, SUPERSEDE expected {expected}"
    kind, msg = vt.check(_tag(5))  # a tag without a SUPERSEDE cannot advance anything
    assert kind == "stale-epoch" and msg.endswith("SUPERSEDE expected None")
    for epoch in (1, 3, 0):  # expected is right, but the successor does not name expected + 1
        kind, msg = vt.check(_tag(epoch, 1))
        assert kind == "stale-epoch" and msg == f"successor epoch {epoch} is not 1 + 1"
    assert vt.check(_tag(2, 1)) is None
    assert _vt_state(vt) == before


def test_advance_is_the_linearization_point():
    vt = VersionTable()
    vt.register("r0", _tag(0), lambda r: True)
    assert vt.advance("r1", _tag(1, 0)) == "r0"
    assert vt.current[SK] == Current(1, "r1") and vt.epoch(SK) == 1
    assert not vt.is_current("r0") and vt.is_current("r1")
    assert vt.is_current_key(VersionKey(SK, 1), "r1")
    assert not vt.is_current_key(VersionKey(SK, 1), "r0") and not vt.is_current_key(VersionKey(SK, 0), "r0")
    assert not vt.is_current_key(VersionKey(ScopeKey("ns", "u", "s"), 1), "r1")
    assert vt.tag("r1") == _tag(1, 0) and vt.tag("r0") == _tag(0)


def test_untagged_requests_are_always_current_and_unknown_scopes_have_no_epoch():
    vt = VersionTable()
    assert vt.is_current("someone-else") and vt.tag("someone-else") is None
    assert vt.epoch(SK) is None


def test_forget_drops_tags_of_gone_requests_but_keeps_the_epoch():
    vt = VersionTable()
    vt.register("r0", _tag(0), lambda r: True)
    vt.advance("r1", _tag(1, 0))
    vt.forget({"r1"}.__contains__)
    assert vt.tag("r0") is None and vt.tag("r1") == _tag(1, 0)
    assert vt.is_current("r0")  # forgotten: untagged, so no longer gated (it left the scheduler)
    vt.forget(lambda r: False)
    assert vt.tags == {} and vt.epoch(SK) == 1  # a later SUPERSEDE of the finished scope is still checked
    assert vt.check(_tag(1, 0))[0] == "stale-epoch" and vt.check(_tag(2, 1)) is None


# ================================================================================================ ledger.py
@pytest.fixture(scope="module")
def core():
    return EngineFreeCore(num_blocks=24)


def _ref(core, b: int) -> int:
    return core.port.ref_counts().get(b, 0)  # vLLM's BlockPool ref_cnt


def test_generations_bump_once_per_allocation_of_the_real_pool(core):
    g = GenerationTable(core.port.num_blocks)
    assert g.allocations == 0 and set(g.gen) == {0} and len(g.gen) == core.port.num_blocks
    g.attach(core.port)
    fresh = core.port.alloc(3)
    try:
        assert g.of(fresh) == (1, 1, 1) and g.allocations == 3
        g.bump([fresh[0], fresh[0]])
        assert g.of(fresh) == (3, 1, 1) and g.allocations == 5
        assert g.of([]) == ()
    finally:
        core.port.unpin(fresh)
    again = core.port.alloc(core.port.free_block_count())  # every free block: the freed ones come back, bumped
    try:
        assert set(fresh) <= set(again)
        assert g.of(fresh) == (4, 2, 2)
    finally:
        core.port.unpin(again)


def test_pin_takes_one_reference_per_block_and_release_gives_it_back(core):
    port = core.port
    blocks = port.alloc(3)
    led = PinLedger(port)
    k1, k2 = PinKey(VersionKey(SK, 1), "handoff"), PinKey(VersionKey(SK, 1), "transfer")
    try:
        led.pin(k1, "t", blocks[:2])
        assert [_ref(core, b) for b in blocks] == [2, 2, 1]
        assert led.pinned("t") == 2 and led.pinned("u") == 0
        led.pin(k2, "t", blocks[1:])
        assert [_ref(core, b) for b in blocks] == [2, 3, 2] and led.pinned("t") == 4
        assert led.counts() == Counter({blocks[0]: 1, blocks[1]: 2, blocks[2]: 1})
        assert led.release(k1) == 2
        assert [_ref(core, b) for b in blocks] == [1, 2, 2] and led.pinned("t") == 2 and "t" in led.by_tenant
        assert led.release(k1) == 0 and [_ref(core, b) for b in blocks] == [1, 2, 2]  # a second release: nothing
        assert led.release(k2) == 2 and "t" not in led.by_tenant and led.pins == {}
        assert [_ref(core, b) for b in blocks] == [1, 1, 1] and led.counts() == Counter()
    finally:
        port.unpin(blocks)


def test_a_pin_key_is_held_once_and_a_refused_pin_takes_no_reference(core):
    port = core.port
    blocks = port.alloc(2)
    led = PinLedger(port)
    key = PinKey(VersionKey(SK, 2), "handoff")
    try:
        led.pin(key, "t", blocks)
        with pytest.raises(RuntimeError, match=r"already held"):
            led.pin(key, "t", blocks)
        with pytest.raises(RuntimeError, match=r"already held"):
            led.adopt(key, "t", blocks)
        assert [_ref(core, b) for b in blocks] == [2, 2] and led.pinned("t") == 2
        assert led.release(key) == 2
    finally:
        port.unpin(blocks)


def test_adopt_records_a_reference_the_caller_holds_and_release_frees_it(core):
    port = core.port
    free0 = port.free_block_count()
    fresh = port.alloc(2)
    led = PinLedger(port)
    key = PinKey(VersionKey(SK, 3), "transfer")
    led.adopt(key, "u", fresh)
    assert [_ref(core, b) for b in fresh] == [1, 1] and led.pinned("u") == 2
    assert led.release(key) == 2
    assert [_ref(core, b) for b in fresh] == [0, 0] and port.free_block_count() == free0


def test_refcount_audit_reports_leaked_and_over_freed_blocks_never_the_null_block():
    assert refcount_audit(ref_counts={1: 2, 2: 1}, tables=[[0, 1], [1, 2]], pins=Counter(), null_block_id=0) == []
    assert refcount_audit(ref_counts={1: 1, 3: 1}, tables=[[1]], pins=Counter({3: 1}), null_block_id=0) == []
    out = refcount_audit(ref_counts={1: 3, 2: 1, 5: 7}, tables=[[5, 1], [1]], pins=Counter({2: 2}), null_block_id=5)
    assert out == ["block 1 leaked: ref_cnt=3 accounted=2", "block 2 over-freed: ref_cnt=1 accounted=2"]
    assert refcount_audit(ref_counts={}, tables=[[4]], pins=Counter(), null_block_id=0) == [
        "block 4 over-freed: ref_cnt=0 accounted=1"]
    # the default null block is vLLM's (block 0): never reported, whatever its count
    assert refcount_audit(ref_counts={0: 9, 1: 1}, tables=[[0, 1]], pins=Counter()) == []
    assert EngineFreeCore(num_blocks=8).port.null_block_id == 0


def test_refcount_audit_stops_after_its_limit():
    ref = {b: 1 for b in range(1, 40)}
    out = refcount_audit(ref_counts=ref, tables=[], pins=Counter(), null_block_id=0, limit=3)
    assert out == [f"block {b} leaked: ref_cnt=1 accounted=0" for b in (1, 2, 3)] + ["..."]
    out = refcount_audit(ref_counts=ref, tables=[], pins=Counter(), null_block_id=0)
    assert len(out) == 21 and out[-1] == "..." and out[19] == "block 20 leaked: ref_cnt=1 accounted=0"
    assert len(refcount_audit(ref_counts={b: 1 for b in range(1, 20)}, tables=[], pins=Counter())) == 19


# ================================================================================================ align.py
def test_common_prefix_len_and_its_limit():
    assert common_prefix_len([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2 and common_prefix_len([1, 2, 3], [1, 2]) == 2
    assert common_prefix_len([], [1]) == 0 and common_prefix_len([5], [6]) == 0
    assert common_prefix_len([1, 2, 3, 4], [1, 2, 3, 4], limit=3) == 3
    assert common_prefix_len([1, 2, 3], [1, 2, 3], limit=10) == 3
    assert common_prefix_len([1, 2], [1, 2, 3], limit=10) == 2 and common_prefix_len([1, 2, 3], [1, 2], limit=10) == 2
    assert common_prefix_len([1, 2, 3], [1, 2, 3], limit=-4) == 0 and common_prefix_len([1], [1], limit=0) == 0


def test_common_prefix_len_over_doubling_slices_finds_every_first_difference():
    """Long sequences (the slices double from 64 up to 32K): the first difference at every position of interest
    (slice edges, inside a slice, past the 32K stride cap), for lists and for other sequences (tuples, arrays)."""
    import array
    n = 70_000
    base = list(range(n))
    for d in (0, 1, 63, 64, 65, 127, 191, 192, 1000, 32_767, 32_768, 65_471, 65_472, 65_536, n - 1):
        other = base.copy()
        other[d] = -1
        assert common_prefix_len(base, other) == d, d
        assert common_prefix_len(tuple(base), array.array("q", other)) == d, d
        assert common_prefix_len(base, other, limit=d + 1) == d and common_prefix_len(base, other, limit=d) == d
    assert common_prefix_len(base, base) == n and common_prefix_len(base, base[:-1]) == n - 1
    assert common_prefix_len(base, base, limit=40_000) == 40_000


def test_alignment_unit_is_the_block_or_the_lcm_with_the_chunk_under_exact():
    assert alignment_unit(32, "tolerant", 256) == 32 and alignment_unit(32, "exact", 256) == 256
    assert alignment_unit(96, "exact", 256) == 768 and alignment_unit(48, "exact", 32) == 96
    assert alignment_unit(32, "exact", None) == 32 and alignment_unit(32, "exact", 0) == 32


def test_certify_length_is_min_of_lcp_frontier_len_minus_one_rounded_down():
    old = list(range(100))
    a = certify_length(old_tokens=old, new_prompt=old[:70] + [999] * 30, frontier=90, align=32)
    assert a == Alignment(lcp=70, frontier=90, cap=70, align=32, certified=64)
    a = certify_length(old_tokens=old, new_prompt=old[:70] + [999] * 30, frontier=40, align=32)
    assert (a.cap, a.certified) == (40, 32)
    a = certify_length(old_tokens=old, new_prompt=old[:64], frontier=100, align=32)  # a truncation revision
    assert (a.lcp, a.cap, a.certified) == (64, 63, 32)  # len - 1 keeps a token to compute
    a = certify_length(old_tokens=old, new_prompt=old[:65], frontier=100, align=32)
    assert (a.cap, a.certified) == (64, 64)
    a = certify_length(old_tokens=old, new_prompt=[], frontier=100, align=32)
    assert (a.lcp, a.cap, a.certified) == (0, 0, 0)  # never negative
    a = certify_length(old_tokens=old, new_prompt=old, frontier=100, align=1)
    assert (a.cap, a.certified) == (99, 99)
    for bad in (0, -32):
        with pytest.raises(ValueError, match="^align must be positive$"):
            certify_length(old_tokens=old, new_prompt=old, frontier=100, align=bad)


def test_chunk_shape_start_and_needs_tables():
    s = ChunkShape(256)
    assert s.needs_tables("x", 10)  # unknown request: its first observation may be a prefix-cache hit
    s.start("x")
    assert s.extent("x") == 0 and s.open["x"] and not s.needs_tables("x", 10) and s.needs_tables("x", 256)
    s.start("y", inherited=300, extent=512)
    assert s.extent("y") == 300 and s.open["y"]  # everything it inherited is cold-shaped: it may continue
    s.start("z", inherited=300, extent=256)
    assert s.extent("z") == 256 and not s.open["z"]  # a gap after 256: the extent never grows
    s.start("w", inherited=-5, extent=100)
    assert s.extent("w") == 0
    s.start("v", inherited=300)  # a request that inherited KV of unknown provenance: nothing is cold-shaped
    assert s.extent("v") == 0 and not s.open["v"]
    assert s.extent("never-seen") == 0


def test_chunk_shape_marks_blocks_of_full_aligned_chunks_only():
    s = ChunkShape(64)
    t = lambda ids, gen=0: [(32, [(b, gen, b == 0) for b in ids])]
    s.observe("a", 0, 64, 200, t([0, 1, 2, 3]))  # a null placeholder is never marked
    assert s.cold == {1: 0} and s.extent("a") == 64
    s.observe("a", 64, 64, 200, t([0, 1, 2, 3], gen=4))
    assert s.cold == {1: 0, 2: 4, 3: 4} and s.extent("a") == 128
    s.observe("a", 128, 64, 150, t([0, 1, 2, 3, 5, 6]))  # the chunk runs past the prompt: not a full prefill chunk
    assert s.extent("a") == 128 and not s.open["a"] and 5 not in s.cold
    s.observe("a", 192, 64, 150, t([0, 1, 2, 3, 5, 6]))
    assert s.extent("a") == 128 and 6 not in s.cold  # closed: nothing more is marked


def test_chunk_shape_prefix_cache_hit_of_marked_blocks_across_groups():
    s = ChunkShape(64)
    s.cold = {1: 0, 2: 0, 3: 0, 4: 0}
    two = [(32, [(1, 0, False), (2, 0, False), (3, 0, False), (4, 0, False)]),
           (64, [(0, 0, True), (3, 0, False)])]  # the second group: a placeholder, then a marked block
    s.observe("h", 128, 64, 400, two)  # a hit of 128 tokens (min over groups: 4 * 32, 2 * 64), then a full chunk
    assert s.extent("h") == 192 and s.open["h"]
    short = [(32, [(1, 0, False), (9, 0, False)]), (64, [(3, 0, False)])]
    s.observe("k", 96, 64, 400, short)
    assert s.extent("k") == 32 and not s.open["k"]  # block 9 is unmarked: the marked prefix ends at 32 < 96
    s.observe("m", 64, 64, 400, None)
    assert s.extent("m") == 0 and not s.open["m"]  # a hit with no tables: nothing is known to be cold-shaped
    unmarked_first = [(32, [(7, 0, False), (1, 0, False), (2, 0, False)])]  # block 7 was never marked
    s.observe("n", 96, 64, 400, unmarked_first)
    assert s.extent("n") == 0 and not s.open["n"]
    s.observe("o", 1, 64, 400, [(32, [(1, 0, False)])])  # a hit shorter than its (marked) block
    assert s.extent("o") == 1  # then closed: its chunk starts off the grid


def test_chunk_shape_log_bounds_and_forget():
    s = ChunkShape(16, max_requests=2, max_chunks=3)
    for start in range(0, 80, 16):
        s.observe("a", start, 16, 64)  # 4 prefill chunks logged, at most 3 kept; the decode at 64 is not logged
    assert s.log("a") == [(0, 16), (16, 16), (32, 16)] and s.extent("a") == 64
    s.observe("z", 0, 64, 64)
    s.observe("z", 64, 1, 64)  # the first decode step starts at the prompt's end: not a prefill chunk
    assert s.log("z") == [(0, 64)]
    s.observe("b", 0, 16, 64)
    s.observe("c", 0, 16, 64)
    assert s.log("a") == [] and s.log("b") == [(0, 16)] and s.log("c") == [(0, 16)]  # oldest request dropped
    s.forget("b")
    assert s.extent("b") == 0 and "b" not in s.open and s.needs_tables("b", 1)
    s.forget("nobody")
    s.observe("c", 0, 16, 64)  # recomputation from the start (preemption): the prefix's provenance is lost
    assert s.extent("c") == 0 and not s.open["c"]


# ================================================================================================ holds.py
class _Handle:
    def __init__(self, rid: str):
        self.request_id = rid


def test_holds_one_successor_per_scope_released_once_dropped_only_by_its_own_id():
    calls = []

    class Port:
        def hold(self, h):
            calls.append(("hold", h.request_id))

        def release_held(self, h):
            calls.append(("release", h.request_id))

    holds = Holds(Port())
    a, b = _Handle("a"), _Handle("b")
    holds.hold(SK, a)
    assert holds.req_id(SK) == "a" and holds.req_id(ScopeKey("ns", "u", "s")) is None
    with pytest.raises(RuntimeError, match="already holds a successor"):
        holds.hold(SK, b)
    assert calls == [("hold", "a")] and holds.req_id(SK) == "a"  # the refused hold changed nothing
    assert holds.drop(SK, "b") is False and holds.req_id(SK) == "a"
    assert holds.drop(SK, None) is False
    assert holds.release(SK) is True and calls[-1] == ("release", "a") and holds.held == {}
    assert holds.release(SK) is False and len(calls) == 2
    holds.hold(SK, b)
    assert holds.drop(SK, "b") is True and holds.held == {} and calls[-1] == ("hold", "b")
    assert holds.drop(SK, "b") is False


def test_chunk_shape_default_bounds_keep_1024_requests_and_64_chunks_each():
    s = ChunkShape(1)
    for i in range(1025):
        s.observe(f"r{i}", 0, 1, 2)
    assert s.log("r0") == [] and s.log("r1") == [(0, 1)] and s.log("r1024") == [(0, 1)]  # the oldest request dropped
    for start in range(70):
        s.observe("long", start, 1, 100)
    assert s.log("long") == [(i, 1) for i in range(64)] and s.extent("long") == 70  # the log stops, the extent not


def test_slack_pins_grow_shrink_and_move_block_by_block(core):
    """grow takes one reference per block (creating the pin), shrink gives back exactly those blocks (a block pinned
    twice keeps one), move re-keys blocks to another pin of the tenant without touching a reference; the pin ends
    when it holds nothing; refused calls (another tenant's pin, blocks the pin does not hold) change nothing."""
    port = core.port
    blocks = port.alloc(4)
    led = PinLedger(port)
    a, b = PinKey(VersionKey(SK, 1), "slack"), PinKey(VersionKey(SK, 2), "slack")
    other = PinKey(VersionKey(ScopeKey("ns", "u", "s"), 1), "slack")
    refs = lambda: [_ref(core, x) for x in blocks]  # noqa: E731
    try:
        led.grow(a, "t", [])
        assert led.pins == {} and led.held(a) == 0
        led.grow(a, "t", blocks[:2])
        led.grow(a, "t", [blocks[1], blocks[2]])  # block 1 twice: two references
        assert refs() == [2, 3, 2, 1] and led.held(a) == 4 and led.pinned("t") == 4
        with pytest.raises(RuntimeError, match=r"belongs to tenant 't'"):
            led.grow(a, "u", blocks[3:])
        assert refs() == [2, 3, 2, 1] and led.pinned("u") == 0
        with pytest.raises(RuntimeError, match=r"does not hold \[%d\]" % blocks[3]):
            led.shrink(a, [blocks[0], blocks[3]])
        assert refs() == [2, 3, 2, 1] and led.held(a) == 4
        assert led.shrink(a, [blocks[1]]) == 1 and refs() == [2, 2, 2, 1] and led.pins[a].blocks.count(blocks[1]) == 1
        assert led.shrink(a, []) == 0 and led.shrink(b, blocks[:1]) == 0 and refs() == [2, 2, 2, 1]
        led.move(a, b, [])
        led.move(b, a, blocks[:1])  # no such source pin: nothing
        assert led.held(a) == 3 and b not in led.pins
        with pytest.raises(RuntimeError, match=r"does not hold \[%d\]" % blocks[3]):
            led.move(a, b, [blocks[3]])
        led.move(a, b, [blocks[0]])
        assert refs() == [2, 2, 2, 1] and led.held(a) == 2 and led.held(b) == 1 and led.pinned("t") == 3
        led.move(a, b, [blocks[2]])  # into an existing pin
        assert led.pins[b].blocks == [blocks[0], blocks[2]] and led.held(a) == 1
        led.grow(other, "u", blocks[3:])
        with pytest.raises(RuntimeError, match=r"belongs to tenant 'u', not 't'"):
            led.move(a, other, [blocks[1]])
        led.move(a, b, [blocks[1]])  # the last block: the source pin ends
        assert a not in led.pins and led.held(b) == 3 and refs() == [2, 2, 2, 2]
        assert led.shrink(b, [blocks[0], blocks[1], blocks[2]]) == 3 and b not in led.pins
        assert "t" not in led.by_tenant and led.pinned("u") == 1 and refs() == [1, 1, 1, 2]
        assert led.shrink(other, blocks[3:]) == 1 and led.pins == {} and led.by_tenant == Counter()
    finally:
        port.unpin(blocks)


def test_slack_pin_shrink_gives_back_a_block_held_twice_in_one_call(core):
    """shrink([b, b]) of a pin holding b twice gives back both references and ends the pin (a block's references
    are counted one by one, not per distinct block)."""
    port = core.port
    blocks = port.alloc(2)
    led = PinLedger(port)
    a = PinKey(VersionKey(SK, 1), "slack")
    try:
        led.grow(a, "t", [blocks[0], blocks[0], blocks[1]])
        assert [_ref(core, x) for x in blocks] == [3, 2]
        assert led.shrink(a, [blocks[0], blocks[0]]) == 2
        assert led.pins[a].blocks == [blocks[1]] and [_ref(core, x) for x in blocks] == [1, 2]
        assert led.shrink(a, [blocks[1]]) == 1 and led.pins == {} and led.pinned("t") == 0
    finally:
        port.unpin(blocks)


def test_version_drop_forgets_tags_of_the_named_requests_only_and_tolerates_repeats():
    """`drop` of ids the table never tagged, or tagged and already dropped (a request that left is named by both
    the finish and the commit), is a no-op; the current entries stay (a later SUPERSEDE is still checked)."""
    vt = VersionTable()
    live = {"r0", "x0"}
    vt.register("r0", _tag(0), live.__contains__)
    vt.register("x0", _tag(0, scope=ScopeKey("ns", "t", "x")), live.__contains__)
    cur = dict(vt.current)
    vt.drop(["r0", "r0", "never-tagged"])
    assert set(vt.tags) == {"x0"} and vt.current == cur
    vt.drop([])
    assert set(vt.tags) == {"x0"}


def test_common_prefix_len_converts_any_non_list_slice_on_either_side():
    """A slice that is not a list is made one before the whole-slice comparison, on either side: a numpy array's
    `!=` is element-wise (its truth value raises), so an unconverted slice cannot be compared at all."""
    import numpy as np
    base = list(range(300))
    other = base.copy()
    other[200] = -1
    assert common_prefix_len(np.array(base), other) == 200
    assert common_prefix_len(base, np.array(other)) == 200
    assert common_prefix_len(np.array(base), np.array(other)) == 200
    assert common_prefix_len(np.array(base), base) == 300
