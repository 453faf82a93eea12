"""Authority, frontend side: the facade's scope table. (tenant, scope) -> current epoch and every version's state.

Invariants:
- The engine's version table (retire/versions.py) is the one commit point of a SUPERSEDE; this table mirrors what
  the engine committed. Exactly one epoch of a scope is current; epochs only increase, by one, through `advance`,
  which runs only after the engine accepted the transition. A refused SUPERSEDE (`StaleEpoch`, `UnknownScope`, or an
  engine refusal) changes nothing here.
- SUPERSEDEs of one scope are serialized (`lock`): of two concurrent calls naming the same expected epoch, exactly
  one can win; the other sees the new epoch and gets `StaleEpoch`.
- From the instant a SUPERSEDE of a version is called until the engine's verdict (`hold`/`unhold`, taken
  synchronously at the call, before its first await), that version's consumers publish nothing: if the engine
  accepts, the version is revoked and its held frames are dropped; if it refuses, they are delivered.
- Identities are typed: `key(tenant, scope)` is a `ScopeKey` with this facade's namespace, never a joined string.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from .errors import ScopeExists, StaleEpoch, UnknownScope
from .types import ScopeKey, VersionKey


@dataclass
class Version:
    scope: str
    tenant: str
    epoch: int
    key: VersionKey
    prompt: list[int]
    internal_id: str | None = None
    collector: Any = None
    t_submit: float = 0.0
    revoked_at: float | None = None
    finished: bool = False
    tokens_out: int = 0
    obsolete_published: int = 0
    transition: Any = None  # the Transition that created this version (None for epoch 0)
    consumers: int = 0      # streams currently reading this version
    holds: int = 0          # SUPERSEDE calls of this version in flight: publication waits while > 0
    released: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.released.set()

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def hold(self) -> None:
        """A SUPERSEDE of this version was called: its consumers publish nothing until the engine's verdict."""
        self.holds += 1
        self.released.clear()

    def unhold(self) -> None:
        self.holds -= 1
        if self.holds == 0:
            self.released.set()

    async def settled(self) -> None:
        while self.holds:
            await self.released.wait()

    @property
    def external_id(self) -> str:
        return self.key.request_id()


@dataclass
class Scope:
    tenant: str
    scope: str
    epoch: int
    versions: dict[int, Version] = field(default_factory=dict)
    transitions: list = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def current(self) -> Version:
        return self.versions[self.epoch]


class ScopeTable:
    def __init__(self, namespace: str):
        self.namespace = namespace  # keeps engine-side scopes of sibling facades apart
        self.scopes: dict[tuple[str, str], Scope] = {}

    def key(self, tenant: str, scope: str) -> ScopeKey:
        return ScopeKey(self.namespace, tenant, scope)

    def get(self, tenant: str, scope: str) -> Scope:
        s = self.scopes.get((tenant, scope))
        if s is None:
            raise UnknownScope(f"unknown scope {scope!r} for tenant {tenant!r}")
        return s

    def create(self, tenant: str, scope: str, version: Version) -> Scope:
        self.check_new(tenant, scope)
        s = Scope(tenant, scope, 0, {0: version})
        self.scopes[(tenant, scope)] = s
        return s

    def check_new(self, tenant: str, scope: str) -> None:
        if (tenant, scope) in self.scopes:
            raise ScopeExists(f"scope {scope!r} of tenant {tenant!r} exists (current epoch "
                              f"{self.scopes[(tenant, scope)].epoch}); revise it with supersede()")

    def check(self, tenant: str, scope: str, expected_epoch: int) -> Scope:
        s = self.get(tenant, scope)
        if expected_epoch != s.epoch:
            raise StaleEpoch(f"scope {scope!r}: expected epoch {expected_epoch}, current is {s.epoch}")
        return s

    def advance(self, s: Scope, expected_epoch: int, successor: Version) -> Version:
        """Mirror the engine's ADVANCE: make expected_epoch + 1 current and revoke the old version."""
        if expected_epoch != s.epoch:
            raise StaleEpoch(f"scope {s.scope!r}: expected epoch {expected_epoch}, current is {s.epoch}")
        old = s.current
        old.revoked_at = time.monotonic()
        s.epoch = expected_epoch + 1
        s.versions[s.epoch] = successor
        return old

    def live_versions(self):
        for s in self.scopes.values():
            for v in s.versions.values():
                if not v.finished:
                    yield v
