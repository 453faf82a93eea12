"""Test seams: every test-only switch and fault hook, as one typed object per side, each with one reset.

Invariant: production behaviour is the default of every field; `reset()` restores all of them at once (the test
harness resets after every test, so no switch or armed hook leaks into the next). Faults reach the control plane
only through these objects (retire/faults), and each fault heals by undoing exactly what it set.

- `EngineSwitches` (EngineCore process, in the transition core): gate (a) on/off, writer closure on/off, the
  innocents' rollback off for the next cut step (one-shot), and one-shot
  hooks armed per scope for its next SUPERSEDE: hold the successor (barrier), bump a certified block's generation
  (generation race), refuse the SUPERSEDE (engine/frontend disagreement).
- `TestSeams` (frontend, per facade): gates (b)+(c), safe-point posting, the DRAM digest check, a forged successor
  tenant, and the fault hook lists (`on_dequeue`, `after_yield`, `dram_before_install`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from .types import ScopeKey

ENGINE_FLAGS = ("gate", "closure", "innocents")
HOOKS = ("hold", "bump_generation", "refuse")


@dataclass
class EngineSwitches:
    gate: bool = True       # gate (a): commit no output of a non-current version
    closure: bool = True    # writer closure after a cut step
    innocents: bool = True  # ... including the innocent requests of a cut mixed step; False is one-shot (take_innocents)
    armed: dict[ScopeKey, dict] = field(default_factory=dict)  # scope -> one-shot hook for its next SUPERSEDE

    def set(self, **flags: bool) -> None:
        for k, v in flags.items():
            if k not in ENGINE_FLAGS:
                raise ValueError(f"unknown engine switch {k!r} (have {ENGINE_FLAGS})")
            setattr(self, k, bool(v))

    def take_innocents(self) -> bool:
        """The innocents flag for the cut step being closed. `innocents=False` is one-shot: it covers the NEXT cut step
        only and then heals. Left on, a re-cut of the revoked request before its SUPERSEDE arrives (timing) could cut
        an innocent's LAST prompt chunk; counted as computed with nothing sampled, that innocent would have nothing
        left to schedule and hang, which is not the fault under test (one poisoned chunk, caught by its oracle)."""
        on, self.innocents = self.innocents, True
        return on

    def arm(self, scope: ScopeKey, hook: dict) -> None:
        bad = set(hook) - set(HOOKS) - {"index"}
        if bad:
            raise ValueError(f"unknown hook field(s) {sorted(bad)} (have {HOOKS})")
        self.armed[scope] = dict(hook)

    def disarm(self, scope: ScopeKey) -> bool:
        return self.armed.pop(scope, None) is not None

    def take(self, scope: ScopeKey) -> dict:
        """The hook armed for this scope's SUPERSEDE (consumed), or {}."""
        return self.armed.pop(scope, None) or {}

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, f.default_factory() if callable(f.default_factory) else f.default)


@dataclass
class TestSeams:
    gates: bool = True              # frontend gates (b) + (c)
    safe_points: bool = True        # post revocations to the mailbox (in-step FENCE)
    dram_verify: bool = True        # compare restored page digests before install
    successor_tenant: str | None = None  # ForgedTenant: the successor's tag names this tenant
    on_dequeue: list[Any] = field(default_factory=list)   # async hook(eng, version, output) -> output
    after_yield: list[Any] = field(default_factory=list)  # async hook(eng, frame)
    dram_before_install: list[Any] = field(default_factory=list)  # async hook(eng, transfer)

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, f.default_factory() if callable(f.default_factory) else f.default)
