"""The facade's scope table (retire/authority.py), engine-free: create / check / advance, the typed refusals
(`UnknownScope`, `StaleEpoch`, `ScopeExists`) and the per-scope lock that serializes SUPERSEDEs.

The invariants under test (from the module's docstring):
- exactly one epoch of a scope is current; epochs only increase, by one, through `advance`, which revokes the old
  version (its `revoked_at` is a time on the consumer's clock, taken inside the call);
- a refused call (`StaleEpoch`, `UnknownScope`, `ScopeExists`) changes nothing in the table;
- of two concurrent SUPERSEDEs of one scope naming the same expected epoch, exactly one wins and the other gets
  `StaleEpoch` (the lock plus the re-check under it, as `RetireEngine.supersede` uses them); scopes do not share a
  lock;
- identities are typed: `key(tenant, scope)` is a `ScopeKey` with the table's namespace, and names that collided
  when joined with "/" stay distinct scopes.

Negative control: the same concurrent race without the lock lets both SUPERSEDEs advance (the check alone is not a
compare-and-swap across an await).
"""
from __future__ import annotations

import asyncio
import time

import pytest

from retire.authority import Scope, ScopeTable, Version
from retire.errors import ScopeExists, StaleEpoch, SupersedeRefused, UnknownScope
from retire.types import ScopeKey, VersionKey


def _version(table: ScopeTable, tenant: str, scope: str, epoch: int, prompt=(1, 2, 3)) -> Version:
    return Version(scope, tenant, epoch, VersionKey(table.key(tenant, scope), epoch), list(prompt))


def _state(table: ScopeTable):
    """Everything a refused call must leave untouched (epochs, versions, revocations), as plain values."""
    return {k: (s.epoch, {e: (v.epoch, v.revoked_at, v.finished) for e, v in s.versions.items()})
            for k, s in table.scopes.items()}


def _table_with(tenant="t", scope="s") -> tuple[ScopeTable, Scope]:
    table = ScopeTable("ns")
    return table, table.create(tenant, scope, _version(table, tenant, scope, 0))


# ---------------------------------------------------------------------------------------------- identities
def test_key_is_typed_with_the_namespace_and_joined_names_do_not_collide():
    table = ScopeTable("facade-1")
    assert table.key("A/x", "y") == ScopeKey("facade-1", "A/x", "y")
    assert table.key("A/x", "y") != table.key("A", "x/y")
    a = table.create("A/x", "y", _version(table, "A/x", "y", 0, (1,)))
    b = table.create("A", "x/y", _version(table, "A", "x/y", 0, (2,)))
    assert a is not b and table.get("A/x", "y") is a and table.get("A", "x/y") is b
    assert table.get("A/x", "y").current.prompt == [1] and table.get("A", "x/y").current.prompt == [2]
    assert ScopeTable("facade-2").key("A/x", "y") != table.key("A/x", "y")  # sibling facades never share scopes


def test_version_external_id_is_the_version_keys_request_id():
    table, s = _table_with()
    v = s.current
    assert v.external_id == v.key.request_id() == VersionKey(ScopeKey("ns", "t", "s"), 0).request_id()
    assert v.external_id.startswith("retire-e0-")


# ---------------------------------------------------------------------------------------------- create / get
def test_create_starts_at_epoch_zero_with_the_version_current():
    table = ScopeTable("ns")
    v0 = _version(table, "t", "s", 0)
    s = table.create("t", "s", v0)
    assert (s.tenant, s.scope, s.epoch) == ("t", "s", 0)
    assert s.current is v0 and s.versions == {0: v0} and table.get("t", "s") is s
    assert not v0.revoked and v0.revoked_at is None


def test_create_of_an_existing_scope_raises_scope_exists_and_changes_nothing():
    table, s = _table_with()
    table.advance(s, 0, _version(table, "t", "s", 1))
    before = _state(table)
    with pytest.raises(ScopeExists, match=r"scope 's' of tenant 't' exists \(current epoch 1\)"):
        table.create("t", "s", _version(table, "t", "s", 0))
    with pytest.raises(ScopeExists, match="revise it with supersede"):
        table.check_new("t", "s")
    assert _state(table) == before and table.get("t", "s") is s


def test_check_new_accepts_the_same_scope_name_of_another_tenant():
    table, _ = _table_with("t", "s")
    table.check_new("u", "s")  # another tenant's scope of the same name is a different scope
    table.check_new("t", "other")
    u = table.create("u", "s", _version(table, "u", "s", 0))
    assert table.get("u", "s") is u and table.get("t", "s") is not u


def test_unknown_scope_is_refused_with_its_names():
    table, _ = _table_with("t", "s")
    with pytest.raises(UnknownScope, match=r"unknown scope 's' for tenant 'u'"):
        table.get("u", "s")  # the scope exists, but not for this tenant
    with pytest.raises(UnknownScope, match=r"unknown scope 'nope' for tenant 't'") as e:
        table.check("t", "nope", 0)
    assert isinstance(e.value, SupersedeRefused)


# ---------------------------------------------------------------------------------------------- check
def test_check_returns_the_scope_only_at_its_current_epoch():
    table, s = _table_with()
    assert table.check("t", "s", 0) is s
    for stale in (-1, 1, 2):
        with pytest.raises(StaleEpoch, match=rf"scope 's': expected epoch {stale}, current is 0"):
            table.check("t", "s", stale)
    table.advance(s, 0, _version(table, "t", "s", 1))
    assert table.check("t", "s", 1) is s
    with pytest.raises(StaleEpoch, match="expected epoch 0, current is 1"):
        table.check("t", "s", 0)


# ---------------------------------------------------------------------------------------------- advance
def test_advance_makes_the_successor_current_and_revokes_the_old_version_once():
    table, s = _table_with()
    v0 = s.current
    v1 = _version(table, "t", "s", 1, (9,))
    t0 = time.monotonic()
    old = table.advance(s, 0, v1)
    t1 = time.monotonic()
    assert old is v0 and s.epoch == 1 and s.current is v1 and s.versions == {0: v0, 1: v1}
    assert v0.revoked and t0 <= v0.revoked_at <= t1  # revoked inside the call, on the consumer's clock
    assert not v1.revoked
    v2 = _version(table, "t", "s", 2)
    assert table.advance(s, 1, v2) is v1 and s.epoch == 2 and v1.revoked and s.versions[2] is v2
    assert v0.revoked_at <= v1.revoked_at


def test_advance_with_a_stale_epoch_is_refused_and_changes_nothing():
    table, s = _table_with()
    table.advance(s, 0, _version(table, "t", "s", 1))
    before = _state(table)
    for stale in (0, 2, -1):
        with pytest.raises(StaleEpoch, match=rf"scope 's': expected epoch {stale}, current is 1"):
            table.advance(s, stale, _version(table, "t", "s", stale + 1))
    assert _state(table) == before and not s.current.revoked


def test_live_versions_yields_every_unfinished_version_of_every_scope():
    table, s = _table_with("t", "s")
    table.create("u", "s", _version(table, "u", "s", 0))
    v1 = _version(table, "t", "s", 1)
    old = table.advance(s, 0, v1)
    assert {(v.tenant, v.epoch) for v in table.live_versions()} == {("t", 0), ("t", 1), ("u", 0)}
    old.finished = True
    assert {(v.tenant, v.epoch) for v in table.live_versions()} == {("t", 1), ("u", 0)}
    v1.finished = True
    table.get("u", "s").current.finished = True
    assert list(table.live_versions()) == []


# ---------------------------------------------------------------------------------------------- the lock
async def _supersede(table: ScopeTable, tenant: str, scope: str, expected: int, sent: list, *, lock: bool = True,
                     gate: asyncio.Event | None = None, checked=None) -> Version:
    """What RetireEngine.supersede does with the table: check, take the scope's lock, re-check, send the successor
    (recorded in `sent`) and await the engine's answer (`gate`), mirror the ADVANCE. `checked()` is called once the
    first check passed (the race's barrier)."""
    s = table.check(tenant, scope, expected)
    if checked is not None:
        checked()

    async def body():
        table.check(tenant, scope, expected)
        sent.append(expected)  # from here the successor exists in the engine: only one caller may get here
        if gate is not None:
            await gate.wait()
        return table.advance(s, expected, _version(table, tenant, scope, expected + 1))

    if lock:
        async with s.lock:
            return await body()
    return await body()


def _race(lock: bool):
    """Two SUPERSEDEs naming epoch 0: both pass their first check, then the engine answers (the gate opens)."""
    table, s = _table_with()
    sent: list = []

    async def go():
        gate, both = asyncio.Event(), asyncio.Event()
        n = []

        def checked():
            n.append(1)
            if len(n) == 2:
                both.set()

        tasks = [asyncio.ensure_future(_supersede(table, "t", "s", 0, sent, lock=lock, gate=gate, checked=checked))
                 for _ in range(2)]
        await asyncio.wait_for(both.wait(), timeout=5)
        gate.set()
        return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=5)

    return s, sent, asyncio.run(go())


def test_concurrent_supersedes_of_one_scope_exactly_one_wins_the_other_is_stale():
    s, sent, out = _race(lock=True)
    wins = [r for r in out if isinstance(r, Version)]
    stale = [r for r in out if isinstance(r, StaleEpoch)]
    assert len(wins) == 1 and len(stale) == 1, out
    assert "expected epoch 0, current is 1" in str(stale[0])
    assert sent == [0]  # the loser was refused before it sent anything
    assert s.epoch == 1 and sorted(s.versions) == [0, 1]


def test_negative_control_without_the_lock_both_supersedes_send_a_successor():
    s, sent, out = _race(lock=False)
    assert sent == [0, 0], sent  # both got past the re-check: two successors for one expected epoch
    assert [type(r) for r in out].count(StaleEpoch) == 1 and s.epoch == 1


def test_each_scope_has_its_own_lock():
    table, s = _table_with("t", "s")
    u = table.create("t", "u", _version(table, "t", "u", 0))
    assert s.lock is not u.lock

    async def go():
        async with s.lock:  # a SUPERSEDE of t/s in flight does not block one of t/u
            return await asyncio.wait_for(_supersede(table, "t", "u", 0, []), timeout=5)

    assert asyncio.run(go()).epoch == 0 and u.epoch == 1 and s.epoch == 0


# ---------------------------------------------------------------------------------------------- publication hold
def test_a_held_version_publishes_after_the_last_verdict_and_holds_nest():
    """Two SUPERSEDE calls of one version in flight: a consumer waiting in `settled()` resumes only after both
    verdicts (an Event barrier, never a sleep); a version never held is settled at once."""
    table, s = _table_with()
    v = s.current
    assert v.holds == 0 and v.released.is_set()

    async def run():
        await asyncio.wait_for(v.settled(), 5)  # never held: returns at once
        v.hold()
        v.hold()
        assert v.holds == 2 and not v.released.is_set()
        waiting, resumed = asyncio.Event(), asyncio.Event()

        async def consumer():
            waiting.set()  # no await between this and the wait inside settled()
            await v.settled()
            resumed.set()

        task = asyncio.create_task(consumer())
        await waiting.wait()  # the barrier: the consumer is suspended inside settled()
        v.unhold()
        assert v.holds == 1 and not v.released.is_set() and not resumed.is_set()
        v.unhold()
        assert v.holds == 0 and v.released.is_set()
        await asyncio.wait_for(resumed.wait(), 5)
        await task

    asyncio.run(run())
