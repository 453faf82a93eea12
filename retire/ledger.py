"""Block generations, handoff pins and the refcount audit (engine side, no vLLM imports).

Invariants:
- Every allocation of a physical block bumps its generation (`GenerationTable.wrap` wraps the pool's
  `get_new_blocks` instance method; a prefix-cache `touch` of a retained block does not bump, its content is kept).
- A handoff pin is one extra reference on each certified block, held from FENCE until the successor's adoption is
  verified, and counted against its tenant's quota. `PinLedger.release` is the only way a pin ends.
- For every non-null block: ref_cnt == (references from live requests' block tables) + (pins). `refcount_audit`
  reports any block where that fails; at drain every block is free.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence


class GenerationTable:
    def __init__(self, num_blocks: int):
        self.gen = [0] * num_blocks
        self.allocations = 0

    def bump(self, block_ids: Iterable[int]) -> None:
        for b in block_ids:
            self.gen[b] += 1
            self.allocations += 1

    def of(self, block_ids: Sequence[int]) -> tuple[int, ...]:
        return tuple(self.gen[b] for b in block_ids)

    def wrap(self, pool: Any) -> None:
        """Install the allocation hook on a vLLM BlockPool instance (its class cannot be subclassed: the
        coordinator constructs it)."""
        original: Callable = pool.get_new_blocks

        def get_new_blocks(num_blocks: int):
            blocks = original(num_blocks)
            self.bump(b.block_id for b in blocks)
            return blocks

        pool.get_new_blocks = get_new_blocks


@dataclass
class Pin:
    key: str
    tenant: str
    blocks: list  # KVCacheBlock objects, all groups flattened


@dataclass
class PinLedger:
    pool: Any
    pins: dict[str, Pin] = field(default_factory=dict)
    by_tenant: Counter = field(default_factory=Counter)

    def pinned(self, tenant: str) -> int:
        return self.by_tenant[tenant]

    def pin(self, key: str, tenant: str, blocks: list) -> None:
        if key in self.pins:
            raise RuntimeError(f"pin {key!r} already held")
        self.pool.touch(blocks)
        self.pins[key] = Pin(key, tenant, list(blocks))
        self.by_tenant[tenant] += len(blocks)

    def release(self, key: str) -> int:
        pin = self.pins.pop(key, None)
        if pin is None:
            return 0
        self.pool.free_blocks(reversed(pin.blocks))
        self.by_tenant[pin.tenant] -= len(pin.blocks)
        if not self.by_tenant[pin.tenant]:
            del self.by_tenant[pin.tenant]
        return len(pin.blocks)

    def counts(self) -> Counter:
        c: Counter = Counter()
        for pin in self.pins.values():
            c.update(b.block_id for b in pin.blocks)
        return c


def refcount_audit(*, blocks: Sequence[Any], tables: Iterable[Sequence[Any]], pins: Counter,
                   null_block_id: int = 0) -> list[str]:
    """Compare each block's ref_cnt with the references we can account for. Returns violations (empty = valid)."""
    expected: Counter = Counter()
    for table in tables:
        expected.update(b.block_id for b in table if not getattr(b, "is_null", False))
    expected.update(pins)
    out = []
    for blk in blocks:
        if blk.block_id == null_block_id or getattr(blk, "is_null", False):
            continue
        want = expected.get(blk.block_id, 0)
        if blk.ref_cnt != want:
            kind = "leaked" if blk.ref_cnt > want else "over-freed"
            out.append(f"block {blk.block_id} {kind}: ref_cnt={blk.ref_cnt} accounted={want}")
            if len(out) >= 20:
                out.append("...")
                break
    return out
