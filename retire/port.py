"""The KV port: the one interface through which the engine-side control plane reaches vLLM's block tables and pool.

Invariant: nothing outside `retire/adapter/` names a vLLM internal. The transition core, the writer closure, the
ledgers and the DRAM tier's engine half speak only this port, in block ids and request ids, so they run unchanged on
any vLLM version the adapter supports, and on a real `BlockPool` with no model (engine-free tests).

Operations are grouped as the SUPERSEDE uses them: reads (`view`, `blocks`, `frontier`), pins (`pin`/`unpin`: one
reference each; `take`: the predecessor's own references, moved to the handoff pin), RESUME (`alias`, `admit`,
`hold`; `alias(held=True)` hands the pin's references to the successor's table), RECLAIM (`finish`), writer closure
(`rollback`, `evict_hashes`), the DRAM restore (`alloc`), and the audit (`ref_counts`, `tables`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol, Sequence


@dataclass(frozen=True)
class RequestView:
    """What the core may know about one vLLM request. `fingerprint` holds the per-request fields two versions must
    share to exchange KV (cache salt, LoRA adapter); the engine-wide config fingerprint is the port's."""

    req_id: str
    prompt: Sequence[int]
    tokens: Sequence[int]      # prompt + output token ids
    computed: int              # num_computed_tokens
    finished: bool
    fingerprint: tuple[tuple[str, Any], ...]
    spec_pending: int = 0      # draft tokens proposed, not yet verified (speculative decoding)
    hashes: Sequence[bytes] = ()  # chained prefix hashes of `tokens`' full blocks (see KVPort.hash_block)


class KVPort(Protocol):
    block_size: int                         # the scheduler's block size (the LCM over KV groups)
    group_block_sizes: tuple[int, ...]      # per KV group
    num_blocks: int
    null_block_id: int
    block_bytes: tuple[int, ...]            # per KV group: KV bytes one block id stands for (all layers of its group)
    config_fingerprint: tuple[tuple[str, Any], ...]
    hash_block: int | None                  # tokens per entry of RequestView.hashes when an equal entry may stand
                                            # for equal tokens (collision-resistant hash), else None

    # -- reads
    def view(self, req: Any) -> RequestView | None: ...        # a request id, or a request handle not yet admitted
    def known(self, req_id: str) -> bool: ...                 # in the scheduler at all
    def live(self, req_id: str) -> bool: ...
    def frontier(self, req_id: str) -> int: ...
    def blocks(self, req_id: str) -> list[list[int]]: ...       # per group; placeholders are null_block_id
    def group_blocks(self, req_id: str, group: int, lo: int, hi: int) -> list[int]: ...  # one group, [lo, hi)
    def first_needed_block(self, group: int, num_tokens: int) -> int: ...
    def free_block_count(self) -> int: ...
    def request_ids(self) -> list[str]: ...

    # -- pins and allocation (one reference per block per call)
    def pin(self, block_ids: Sequence[int]) -> None: ...
    def unpin(self, block_ids: Sequence[int]) -> None: ...
    def alloc(self, n: int) -> list[int] | None: ...            # fresh blocks (generation bumped), or None if short
    def on_alloc(self, fn: Callable[[Iterable[int]], None]) -> None: ...

    # -- RESUME / RECLAIM
    def take(self, req_id: str, per_group: Sequence[Sequence[int]]) -> bool: ...  # its table's leading refs, moved
    def alias(self, handle: Any, per_group: Sequence[Sequence[int]], tokens: int, *, held: bool = False) -> None: ...
    def skip_prefix_cache(self, handle: Any) -> None: ...
    def admit(self, handle: Any) -> None: ...                  # vLLM's own admission
    def hold(self, handle: Any) -> None: ...                   # known to the scheduler, not schedulable
    def release_held(self, handle: Any) -> None: ...           # admit a held request
    def finish(self, req_id: str) -> bool: ...                 # abort + free (RECLAIM); False if not live

    # -- writer closure
    def rollback(self, req_id: str, to_tokens: int, end_tokens: int) -> list[int]: ...  # the cut chunk's blocks
    def evict_hashes(self, block_ids: Iterable[int]) -> None: ...
    def sharers(self, block_ids: Iterable[int]) -> list[str]: ...  # running requests whose computed prefix holds one
    def preempt(self, req_id: str) -> bool: ...                     # vLLM's own preemption (recompute)

    # -- audit
    def ref_counts(self) -> dict[int, int]: ...                 # non-null block id -> ref_cnt (non-zero only)
    def tables(self) -> list[list[int]]: ...                    # every live request's block ids, every group
