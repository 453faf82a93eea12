"""Engine-side authority: which version of each scope is current. The one commit point of a SUPERSEDE.

Invariants:
- Exactly one version per `ScopeKey` is current. `check` is the compare-and-swap test of a SUPERSEDE: it refuses an
  unknown scope, a stale, future or negative expected epoch, and a successor epoch other than expected + 1; a refused
  SUPERSEDE changes nothing here. `advance` is the linearization point: from it on the predecessor is obsolete.
- Scopes are keyed by the typed `ScopeKey` (namespace, tenant, scope), never by a joined string, so no tenant or scope
  name can alias another tenant's scope; a successor can only ever reach a scope of its own tenant.
- `is_current(req_id)`: a request whose version is no longer current is obsolete; gate (a) commits none of its
  outputs. Requests without a retire tag are always current (other clients of the engine).
- An epoch-0 registration never displaces a live current version (a duplicate submit cannot silence a scope).
"""
from __future__ import annotations

from dataclasses import dataclass

from .types import RequestTag, ScopeKey, VersionKey


@dataclass(frozen=True)
class Current:
    epoch: int
    req_id: str


class VersionTable:
    def __init__(self) -> None:
        self.current: dict[ScopeKey, Current] = {}
        self.tags: dict[str, RequestTag] = {}  # live or recently live request id -> its tag

    def register(self, req_id: str, tag: RequestTag, live) -> bool:
        """Epoch 0 of a scope (a submit). Returns False if the scope already has a live current version
        (`live(req_id)`: still in the scheduler): the request is then known by its tag but never current, so gate
        (a) commits none of its outputs and the audit reports it as a live obsolete execution."""
        self.tags[req_id] = tag
        cur = self.current.get(tag.key.scope)
        if cur is not None and live(cur.req_id):
            return False
        self.current[tag.key.scope] = Current(tag.key.epoch, req_id)
        return True

    def check(self, tag: RequestTag) -> tuple[str, str] | None:
        """Why this SUPERSEDE must be refused, as (kind, message), or None. Changes nothing."""
        sk, sup = tag.key.scope, tag.supersede
        cur = self.current.get(sk)
        if cur is None:
            return "unknown-scope", f"unknown scope {sk.scope!r} for tenant {sk.tenant!r}"
        if sup is None or sup.expected_epoch != cur.epoch:
            exp = None if sup is None else sup.expected_epoch
            return "stale-epoch", f"stale epoch: scope {sk.scope!r} is at epoch {cur.epoch}, SUPERSEDE expected {exp}"
        if tag.key.epoch != cur.epoch + 1:
            return "stale-epoch", f"successor epoch {tag.key.epoch} is not {cur.epoch} + 1"
        return None

    def advance(self, req_id: str, tag: RequestTag) -> str | None:
        """ADVANCE (after `check` passed): make the successor current. Returns the predecessor's request id."""
        old = self.current[tag.key.scope]
        self.tags[req_id] = tag
        self.current[tag.key.scope] = Current(tag.key.epoch, req_id)
        return old.req_id

    def epoch(self, scope: ScopeKey) -> int | None:
        cur = self.current.get(scope)
        return None if cur is None else cur.epoch

    def is_current_key(self, key: VersionKey, req_id: str) -> bool:
        return self.current.get(key.scope) == Current(key.epoch, req_id)

    def is_current(self, req_id: str) -> bool:
        tag = self.tags.get(req_id)
        if tag is None:
            return True
        return self.current.get(tag.key.scope) == Current(tag.key.epoch, req_id)

    def tag(self, req_id: str) -> RequestTag | None:
        return self.tags.get(req_id)

    def drop(self, req_ids) -> None:
        """Drop the tags of these requests (they left the scheduler); current entries stay, as in `forget`."""
        for rid in req_ids:
            self.tags.pop(rid, None)

    def forget(self, keep) -> None:
        """Drop tags of requests that left the scheduler (`keep(req_id)` false); current entries stay, so a later
        SUPERSEDE of a finished scope is still checked against its epoch."""
        for rid in [r for r in self.tags if not keep(r)]:
            del self.tags[rid]
