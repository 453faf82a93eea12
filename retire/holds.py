"""Held successors: admitted to the scheduler but not schedulable until released (engine side; speaks the port).

Invariant: a held request is known to the scheduler (live, its block table accounted by the refcount audit) but is
never scheduled before `release`; at most one successor per scope is held. Two things hold a successor: the test
barrier `HoldSuccessor` (an action between RESUME and the successor's first step) and a DRAM restore in progress.
A newer SUPERSEDE of the scope un-holds its predecessor (`drop`), which RECLAIM then finishes.
"""
from __future__ import annotations

from typing import Any

from .types import ScopeKey


class Holds:
    def __init__(self, port):
        self.port = port
        self.held: dict[ScopeKey, Any] = {}

    def hold(self, scope: ScopeKey, handle: Any) -> None:
        if scope in self.held:
            raise RuntimeError(f"scope {scope} already holds a successor")
        self.port.hold(handle)
        self.held[scope] = handle

    def req_id(self, scope: ScopeKey) -> str | None:
        h = self.held.get(scope)
        return None if h is None else h.request_id

    def release(self, scope: ScopeKey) -> bool:
        h = self.held.pop(scope, None)
        if h is None:
            return False
        self.port.release_held(h)
        return True

    def drop(self, scope: ScopeKey, req_id: str | None) -> bool:
        """Forget the hold of `req_id` (it is being superseded; RECLAIM finishes it). True if it was held."""
        h = self.held.get(scope)
        if h is not None and h.request_id == req_id:
            del self.held[scope]
            return True
        return False
