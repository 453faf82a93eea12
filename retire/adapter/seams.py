"""Seams: every vLLM class, method and attribute retire relies on, as data.

Invariant: a vLLM internal that any retire module touches is listed in its version's table (`retire.adapter.SEAMS`),
with the guarantees that depend on it. The same table drives the start-up check (`check_live`, on the running
objects, raising `SeamMissing` with the seam's name) and the static check (`retire seams`, which reads a vLLM source
tree without importing it). A guarantee whose seam is missing or changed is unknown, never passed.

`kind`:
- "class": `module.qualname` exists.
- "method": a function defined on the class or a base class; `params` lists the leading parameter names it must
  accept (after `self`), in order; None = names not checked.
- "attr": an attribute on instances (assigned in a method of the class or a base, as `self.<member> = ...` or an
  annotated class field) or on the class.
- "function": a module-level function; `params` as for methods.
- "module": the module exists.
`guarantees`: conformance module names (see retire/conform.py) that depend on the seam; ("*",) = every engine
guarantee.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

import msgspec

from ..errors import SeamMissing

ALL = ("*",)


class Seam(msgspec.Struct, frozen=True):
    module: str
    qualname: str
    member: Optional[str] = None
    kind: str = "attr"
    params: Optional[tuple[str, ...]] = None
    guarantees: tuple[str, ...] = ALL
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.qualname}.{self.member}" if self.member else self.qualname

    @property
    def where(self) -> str:
        return f"{self.module}:{self.name}"


def seam(where: str, kind: str = "attr", params: Iterable[str] | None = None, guarantees: Iterable[str] = ALL,
         note: str = "") -> Seam:
    """`seam("vllm.v1.core.block_pool:BlockPool.touch", "method", ["blocks"])`."""
    module, _, name = where.partition(":")
    qualname, _, member = name.partition(".")
    return Seam(module, qualname, member or None, kind, tuple(params) if params is not None else None,
                tuple(guarantees), note)


def check_live(table: Iterable[Seam], objects: dict[str, Any]) -> None:
    """Verify, on running objects keyed by qualname (e.g. {"Scheduler": sched, "BlockPool": pool}), that every seam
    of those classes exists. Raises SeamMissing naming the first missing seam."""
    for s in table:
        obj = objects.get(s.qualname)
        if obj is None or s.member is None:
            continue
        if not hasattr(obj, s.member):
            raise SeamMissing(f"installed vLLM lacks {s.name} ({s.module}); retire relies on it for "
                              f"{', '.join(s.guarantees)} (retire seams --vllm SPEC reports every seam)")


def dependent(table: Iterable[Seam], missing: Iterable[str]) -> dict[str, list[str]]:
    """guarantee -> names of its missing seams ("*" seams count for every guarantee)."""
    miss = set(missing)
    out: dict[str, list[str]] = {}
    for s in table:
        if s.name in miss:
            for g in s.guarantees:
                out.setdefault(g, []).append(s.name)
    return out
