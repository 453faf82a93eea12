"""Authority: the frontend's scope table. (tenant, scope) -> current epoch, and every version's publication state.

Invariants:
- Exactly one epoch of a scope is current; epochs only increase, by one, through `advance` (a compare-and-swap on
  the expected epoch). A stale or duplicate SUPERSEDE raises `StaleEpoch`; an unknown (tenant, scope) raises
  `UnknownScope`; neither changes anything.
- A version is `revoked` from the instant its successor's epoch became current (`revoked_at`, the linearization
  point). A revoked version publishes nothing further under the "retire" policy.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .errors import ScopeExists, StaleEpoch, UnknownScope


@dataclass
class Version:
    scope: str
    tenant: str
    epoch: int
    external_id: str
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

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


@dataclass
class Scope:
    tenant: str
    scope: str
    epoch: int
    versions: dict[int, Version] = field(default_factory=dict)
    transitions: list = field(default_factory=list)

    @property
    def current(self) -> Version:
        return self.versions[self.epoch]


class ScopeTable:
    def __init__(self, namespace: str):
        self.namespace = namespace  # keeps engine-side scope keys of sibling facades apart
        self.scopes: dict[tuple[str, str], Scope] = {}

    def engine_key(self, tenant: str, scope: str) -> str:
        return f"{self.namespace}/{tenant}/{scope}"

    def get(self, tenant: str, scope: str) -> Scope:
        s = self.scopes.get((tenant, scope))
        if s is None:
            raise UnknownScope(f"unknown scope {scope!r} for tenant {tenant!r}")
        return s

    def create(self, tenant: str, scope: str, version: Version) -> Scope:
        if (tenant, scope) in self.scopes:
            raise ScopeExists(f"scope {scope!r} of tenant {tenant!r} exists (current epoch "
                              f"{self.scopes[(tenant, scope)].epoch}); revise it with supersede()")
        s = Scope(tenant, scope, 0, {0: version})
        self.scopes[(tenant, scope)] = s
        return s

    def check(self, tenant: str, scope: str, expected_epoch: int) -> Scope:
        s = self.get(tenant, scope)
        if expected_epoch != s.epoch:
            raise StaleEpoch(f"scope {scope!r}: expected epoch {expected_epoch}, current is {s.epoch}")
        return s

    def advance(self, s: Scope, expected_epoch: int, successor: Version) -> Version:
        """ADVANCE (linearization point): make expected_epoch + 1 current and revoke the old version."""
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
