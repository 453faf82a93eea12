"""The DRAM tier's engine half (retire/dram/engine.py), engine-free: the exact replies the frontend reads
(retire/dram/frontend.py acts on `ok`, `refused`, `cold`, `ids`, `accepted`, `late`, `reason`, `cold_reason`,
`inherited_tokens`, `free_blocks`, `released_blocks`) and the engine's figures in `stats`, each checked against vLLM's
own state (the successor's `num_computed_tokens`, its block table, the pool's free count).

Complements test_dram_ledger.py (pins and refcounts of each path). Invariants under test: install only if the
handoff's version is current AND the held successor is the one it targets; a refused or late step changes nothing
but what it reports; the tier key is a digest of the typed version key (no two handoffs share one); a certificate
with sliding-window placeholders is not offloaded.
"""
from __future__ import annotations

import msgspec

from conformance.fixtures.enginefree import EngineFreeCore
from conformance.fixtures.prompts import revise, tokens
from retire import Contract
from retire.dram.engine import tier_key
from retire.types import ScopeKey, VersionKey, digest

DRAM = Contract(dram_tier=True)
P = tokens(200, 7)


def _cmd(core, op: str, key, **kw):
    return core.s("dram", dict(op=op, key=msgspec.to_builtins(key), **kw))


def _held(core, scope="s"):
    rid = core.submit("t", scope, P)
    core.step()
    res, succ = core.supersede("t", scope, 0, revise(P, 150, 220, 1), contract=DRAM)
    assert res.dram is not None and res.dram.tokens == 128, res
    return res, succ


def _stats(core):
    return core.s("stats")


def test_a_restored_handoff_replies_step_by_step_and_counts_as_inherited():
    core = EngineFreeCore()
    res, succ = _held(core)
    st = _stats(core)
    assert (st["dram_held"], st["cold"], st.get("inherited", 0)) == (1, 1, 0)  # RESUME counted it cold
    assert core.s.requests[succ].num_computed_tokens == 0
    off = _cmd(core, "offloaded", res.key)
    assert off == {"ok": True, "released_blocks": 4, "free_blocks": core.port.free_block_count()}
    a = _cmd(core, "alloc", res.key)
    dst = [b for g in a["ids"] for b in g]
    assert a == {"ids": a["ids"], "gens": [core.s("generations", {"block_ids": dst})]} and len(dst) == 4
    out = _cmd(core, "install", res.key, ok=True)
    assert out == {"accepted": True, "late": False, "inherited_tokens": 128, "cold_reason": None}
    assert core.s.requests[succ].num_computed_tokens == 128 and core.port.blocks(succ)[0][:4] == dst
    st = _stats(core)
    assert (st["dram_restored"], st["cold"], st["inherited"], st["inherited_tokens"]) == (1, 0, 1, 128)
    assert st.get("dram_cold", 0) == 0


def test_a_failed_digest_check_installs_nothing_and_admits_the_successor_cold():
    core = EngineFreeCore()
    res, succ = _held(core)
    _cmd(core, "offloaded", res.key)
    _cmd(core, "alloc", res.key)
    free = core.port.free_block_count()
    out = _cmd(core, "install", res.key, ok=False, reason="digest mismatch on page 2")
    assert out == {"accepted": False, "late": False, "inherited_tokens": 0, "cold_reason": "digest mismatch on page 2"}
    assert core.s.requests[succ].num_computed_tokens == 0 and core.port.free_block_count() == free + 4
    st = _stats(core)
    assert (st["dram_cold"], st["cold"], st.get("inherited", 0), st.get("dram_restored", 0)) == (1, 1, 0, 0)
    assert not core.s.retire.holds.held


def test_a_destination_reallocated_during_the_transfer_is_reported_as_such():
    core = EngineFreeCore()
    res, _ = _held(core)
    _cmd(core, "offloaded", res.key)
    victim = _cmd(core, "alloc", res.key)["ids"][0][0]
    core.port.unpin([victim])
    again = core.port.alloc(core.port.free_block_count())
    out = _cmd(core, "install", res.key, ok=True)
    assert out["cold_reason"] == "generation mismatch: a restored block was reallocated during the transfer"
    core.port.unpin([b for b in again if b != victim])


def test_late_replies_name_the_epochs():
    core = EngineFreeCore()
    res, _ = _held(core)
    _cmd(core, "offloaded", res.key)
    _cmd(core, "alloc", res.key)
    core.supersede("t", "s", 1, tokens(64, 9))
    late = _cmd(core, "install", res.key, ok=True)
    assert late == {"accepted": False, "late": True, "freed_blocks": 4,
                    "reason": "late transfer rejected: scope is at epoch 2, the transfer targets epoch 1"}
    st = _stats(core)
    assert (st["dram_rejected_late"], st["dram_retired_before_restore"]) == (1, 1)
    assert _cmd(core, "install", res.key, ok=True)["freed_blocks"] == 0  # a repeated late install frees nothing
    assert _stats(core)["dram_rejected_late"] == 2


def test_copy_out_and_restore_steps_for_a_retired_handoff_are_refused():
    core = EngineFreeCore()
    res, _ = _held(core)
    res2, _ = core.supersede("t", "s", 1, tokens(64, 9))
    assert res2.dram_stale == (res.key,) and _stats(core)["dram_retired_before_restore"] == 1
    assert _cmd(core, "offloaded", res.key) == {"ok": False, "reason": "superseded before copy-out finished (epoch 1)"}
    assert _cmd(core, "alloc", res.key) == {
        "refused": "late transfer: scope 's' is no longer at epoch 1 with a held successor"}
    assert _cmd(core, "cold_admit", res.key, reason="no room") == {"accepted": False, "late": True, "reason": "no room"}


def test_steps_for_a_handoff_that_never_existed_are_refused():
    core = EngineFreeCore()
    key = VersionKey(ScopeKey("ns", "t", "nope"), 1)
    assert _cmd(core, "alloc", key) == {
        "refused": "late transfer: scope 'nope' is no longer at epoch 1 with a held successor"}
    assert _cmd(core, "cold_admit", key, reason="r") == {"accepted": False, "late": True, "reason": "r"}
    assert _cmd(core, "offloaded", key)["ok"] is False


def test_restore_needs_the_held_successor_it_targets():
    core = EngineFreeCore()
    res, succ = _held(core)
    _cmd(core, "offloaded", res.key)
    assert core.s("release", {"scope": msgspec.to_builtins(core.key("t", "s"))}) is True  # a stray barrier release
    assert core.current("t", "s").req_id == succ  # the version is still current, but nothing is held for it
    assert _cmd(core, "alloc", res.key)["refused"].startswith("late transfer")
    assert _cmd(core, "cold_admit", res.key, reason="x")["late"] is True
    v = core.audit()["violations"]
    assert v == [f"DRAM handoff {res.key} pending (offloaded) without its held successor"], v


def test_cold_admit_reply_and_figures():
    core = EngineFreeCore(num_blocks=24)
    res, succ = _held(core)
    _cmd(core, "offloaded", res.key)
    hog = core.port.alloc(core.port.free_block_count() - 3)
    refused = _cmd(core, "alloc", res.key)
    assert refused == {"refused": "DRAM restore: 4 blocks needed, 3 free", "cold": True}
    out = _cmd(core, "cold_admit", res.key, reason=refused["refused"])
    assert out == {"accepted": False, "late": False, "inherited_tokens": 0,
                   "cold_reason": "DRAM restore: 4 blocks needed, 3 free"}
    assert _stats(core)["dram_cold"] == 1 and succ in core.s.requests and not core.s.retire.holds.held
    core.port.unpin(hog)


def test_sliding_window_certificates_are_not_offloaded():
    core = EngineFreeCore(sliding_window=64)
    Q = tokens(600, 3)
    rid = core.submit("t", "s", Q)
    while core.s.requests[rid].num_computed_tokens < 600:
        core.step()
    res, succ = core.supersede("t", "s", 0, revise(Q, 590, 640, 1), contract=DRAM)
    assert res.dram is None and res.inherited_tokens == 0 and res.certificate is None
    assert res.cold_reason == "DRAM tier: certificate holds sliding-window placeholders (not supported by the tier)"
    assert _stats(core).get("dram_held", 0) == 0 and not core.s.retire.pins.pins and not core.s.retire.holds.held


def test_tier_key_is_a_digest_of_the_version_key():
    a, b = VersionKey(ScopeKey("ns", "A/x", "y"), 1), VersionKey(ScopeKey("ns", "A", "x/y"), 1)
    assert tier_key(a) == digest(a).hex() and len(tier_key(a)) == 32
    assert len({tier_key(a), tier_key(b), tier_key(VersionKey(a.scope, 2))}) == 3


def test_figures_over_several_handoffs():
    core = EngineFreeCore()
    restored = []
    for scope in ("a", "b"):
        res, succ = _held(core, scope)
        _cmd(core, "offloaded", res.key)
        _cmd(core, "alloc", res.key)
        out = _cmd(core, "install", res.key, ok=True, reason="ignored when the pages verified")
        assert out["accepted"] and out["cold_reason"] is None
        restored.append(core.s.requests[succ].num_computed_tokens)
    for scope in ("c", "d"):
        res, _ = _held(core, scope)
        _cmd(core, "offloaded", res.key)
        _cmd(core, "alloc", res.key)
        _cmd(core, "install", res.key, ok=False, reason="bad page")
    for scope in ("e", "f"):
        res, _ = _held(core, scope)
        _cmd(core, "offloaded", res.key)
        _cmd(core, "cold_admit", res.key, reason="no room")
    for scope in ("g", "h"):
        _held(core, scope)
        core.supersede("t", scope, 1, tokens(64, 9))
    assert restored == [128, 128]
    st = _stats(core)
    assert (st["dram_held"], st["dram_restored"], st["dram_cold"], st["dram_retired_before_restore"]) == (8, 2, 4, 2)
    assert (st["inherited"], st["inherited_tokens"], st["cold"]) == (2, 256, 8)  # 6 cold handoffs + 2 cold revisions
