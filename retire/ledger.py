"""Block generations, handoff pins and the refcount audit (engine side; speaks the KV port, no vLLM imports).

Invariants:
- Every allocation of a physical block bumps its generation (`GenerationTable.attach` hooks the port's allocator;
  a prefix-cache `touch` of a retained block does not bump, its content is kept).
- A pin is one extra reference on each block it names, keyed by a typed `PinKey` (the version it serves and its
  kind: "handoff" from FENCE until adoption, "transfer" for a DRAM restore in flight, "slack" for a version's
  revision slack) and counted against its tenant. A pin ends by `release` (its references go back to the pool) or by
  `hand_over` (a block table took them over: RESUME's adoption); `adopt` records blocks whose reference the caller
  already holds (a fresh allocation, or the predecessor's own references moved by `port.take`) without taking
  another. A slack pin changes block by block:
  `grow` takes one more reference per block, `shrink` gives exactly those back, `move` re-keys blocks to another pin
  of the same tenant without touching a reference.
- For every non-null block: ref_cnt == (references from live requests' block tables) + (pins). `refcount_audit`
  reports any block where that fails; at drain every block is free.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Mapping, NamedTuple, Sequence

from .types import VersionKey


class GenerationTable:
    def __init__(self, num_blocks: int):
        self.gen = [0] * num_blocks
        self.allocations = 0

    def bump(self, block_ids: Iterable[int]) -> None:
        for b in block_ids:
            self.gen[b] += 1
            self.allocations += 1

    def of(self, block_ids: Sequence[int]) -> tuple[int, ...]:
        return tuple(map(self.gen.__getitem__, block_ids))  # C-level: ALIGN reads every certified block's

    def attach(self, port) -> None:
        port.on_alloc(self.bump)


class PinKey(NamedTuple):
    version: VersionKey
    kind: str  # "handoff" | "transfer" | "slack"


@dataclass
class Pin:
    tenant: str
    blocks: list[int]


@dataclass
class PinLedger:
    port: object
    pins: dict[PinKey, Pin] = field(default_factory=dict)
    by_tenant: Counter = field(default_factory=Counter)

    def pinned(self, tenant: str) -> int:
        return self.by_tenant[tenant]

    def pin(self, key: PinKey, tenant: str, block_ids: Sequence[int]) -> None:
        """Take one reference on each block (blocks must be live or cached: pinning a free block revives it)."""
        self._check_new(key)
        self.port.pin(block_ids)
        self._record(key, tenant, block_ids)

    def adopt(self, key: PinKey, tenant: str, block_ids: Sequence[int]) -> None:
        """Record blocks whose single reference the caller already holds (e.g. from `port.alloc`)."""
        self._check_new(key)
        self._record(key, tenant, block_ids)

    def _check_new(self, key: PinKey) -> None:
        if key in self.pins:
            raise RuntimeError(f"pin {key} already held")

    def _record(self, key: PinKey, tenant: str, block_ids: Sequence[int]) -> None:
        self.pins[key] = Pin(tenant, list(block_ids))
        self.by_tenant[tenant] += len(block_ids)

    def release(self, key: PinKey) -> int:
        """End the pin `key`, giving its references back to the pool. Returns the blocks it held."""
        return self._end(key, unpin=True)

    def hand_over(self, key: PinKey) -> int:
        """End the pin `key` whose references a block table now holds (RESUME's `alias(held=True)`): the blocks
        keep them, none is given back. Returns the blocks it held."""
        return self._end(key, unpin=False)

    def _end(self, key: PinKey, *, unpin: bool) -> int:
        pin = self.pins.pop(key, None)
        if pin is None:
            return 0
        if unpin:
            self.port.unpin(pin.blocks)
        self.by_tenant[pin.tenant] -= len(pin.blocks)
        if not self.by_tenant[pin.tenant]:
            del self.by_tenant[pin.tenant]
        return len(pin.blocks)

    # ------------------------------------------------------------------ pins that change block by block (slack)
    def grow(self, key: PinKey, tenant: str, block_ids: Sequence[int]) -> None:
        """Take one reference on each block and add it to the pin `key` (created if absent)."""
        if not block_ids:
            return
        pin = self.pins.get(key)
        if pin is not None and pin.tenant != tenant:
            raise RuntimeError(f"pin {key} belongs to tenant {pin.tenant!r}")
        self.port.pin(block_ids)
        if pin is None:
            self.pins[key] = Pin(tenant, list(block_ids))
        else:
            pin.blocks.extend(block_ids)
        self.by_tenant[tenant] += len(block_ids)

    def shrink(self, key: PinKey, block_ids: Sequence[int]) -> int:
        """Give back the reference of each of these blocks of the pin `key` (the pin ends when it holds none)."""
        pin = self.pins.get(key)
        if pin is None or not block_ids:
            return 0
        drop = Counter(block_ids)
        keep = []
        for b in pin.blocks:
            if drop[b] > 0:
                drop[b] -= 1
            else:
                keep.append(b)
        if +drop:
            raise RuntimeError(f"pin {key} does not hold {sorted((+drop).elements())}")
        self.port.unpin(block_ids)
        pin.blocks = keep
        self._uncount(pin.tenant, len(block_ids))
        if not keep:
            del self.pins[key]
        return len(block_ids)

    def move(self, src: PinKey, dst: PinKey, block_ids: Sequence[int]) -> None:
        """Re-key these blocks from pin `src` to pin `dst` (same tenant): no reference is taken or given back."""
        pin = self.pins.get(src)
        if pin is None or not block_ids:
            return
        target = self.pins.get(dst)
        if target is not None and target.tenant != pin.tenant:
            raise RuntimeError(f"pin {dst} belongs to tenant {target.tenant!r}, not {pin.tenant!r}")
        moving = set(block_ids)
        if not moving <= set(pin.blocks):
            raise RuntimeError(f"pin {src} does not hold {sorted(moving - set(pin.blocks))}")
        pin.blocks = [b for b in pin.blocks if b not in moving]
        if target is None:
            self.pins[dst] = Pin(pin.tenant, list(block_ids))
        else:
            target.blocks.extend(block_ids)
        if not pin.blocks:
            del self.pins[src]

    def _uncount(self, tenant: str, n: int) -> None:
        self.by_tenant[tenant] -= n
        if not self.by_tenant[tenant]:
            del self.by_tenant[tenant]

    def held(self, key: PinKey) -> int:
        pin = self.pins.get(key)
        return 0 if pin is None else len(pin.blocks)

    def counts(self) -> Counter:
        c: Counter = Counter()
        for pin in self.pins.values():
            c.update(pin.blocks)
        return c


def refcount_audit(*, ref_counts: Mapping[int, int], tables: Iterable[Sequence[int]], pins: Counter,
                   null_block_id: int = 0, limit: int = 20) -> list[str]:
    """Compare each block's ref_cnt with the references we can account for. Returns violations (empty = valid)."""
    expected: Counter = Counter()
    for table in tables:
        expected.update(b for b in table if b != null_block_id)
    expected.update(pins)
    out = []
    for b in sorted(set(ref_counts) | set(expected)):
        have, want = ref_counts.get(b, 0), expected.get(b, 0)
        if b != null_block_id and have != want:
            kind = "leaked" if have > want else "over-freed"
            out.append(f"block {b} {kind}: ref_cnt={have} accounted={want}")
            if len(out) >= limit:
                out.append("...")
                break
    return out
