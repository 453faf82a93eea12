"""The KV port on vLLM 0.32's scheduler (engine process): block tables, the block pool, request state, step records.

Invariant: this module and its siblings in `retire/adapter/` are the only code that reads or writes vLLM's scheduler
internals; each one it touches is listed in `table_0_32.SEAMS`. Every method keeps vLLM's own accounting intact:
a reference taken (`pin`, `alias`, `alloc`) is one `ref_cnt` increment, released by exactly one `unpin` or by vLLM
freeing the request that holds it.
"""
from __future__ import annotations

import time
from operator import attrgetter
from typing import Any, Callable, Iterable, Sequence

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from ..port import RequestView
from .seams import check_live
from .table_0_32 import SEAMS

_ID = attrgetter("block_id")


#: prefix-cache hash algorithms (vLLM's `prefix_caching_hash_algo`) whose equal block hashes ALIGN takes for equal
#: tokens: collision-resistant ones only. Under xxhash, a crafted collision is feasible, so ALIGN compares tokens.
TRUSTED_HASHES = ("sha256", "sha256_cbor")


class SchedulerPort:
    """`retire.port.KVPort` over one vLLM `Scheduler` instance (called in the engine thread, between steps)."""

    def __init__(self, sched: Scheduler):
        kvm = getattr(sched, "kv_cache_manager", None)
        coord = getattr(kvm, "coordinator", None)
        mgrs = tuple(getattr(coord, "single_type_managers", None) or ())
        pool = getattr(kvm, "block_pool", None)
        check_live(SEAMS, {"Scheduler": sched, "KVCacheManager": kvm, "KVCacheCoordinator": coord,
                           "SingleTypeKVCacheManager": mgrs[0] if mgrs else None, "BlockPool": pool})
        self.s, self.pool, self.mgrs = sched, pool, mgrs
        cfg = sched.vllm_config
        self.block_size = int(sched.block_size)
        self.group_block_sizes = tuple(int(m.block_size) for m in mgrs)
        self.num_blocks = int(pool.num_gpu_blocks)
        self.null_block_id = int(pool.null_block.block_id)
        self.config_fingerprint = (("model", str(cfg.model_config.model)), ("dtype", str(cfg.model_config.dtype)),
                                   ("block_size", self.block_size), ("cache_dtype", str(cfg.cache_config.cache_dtype)))
        self.block_bytes = tuple(int(g.kv_cache_spec.page_size_bytes) * len(g.layer_names)
                                 for g in sched.kv_cache_config.kv_cache_groups)
        self.chunk = int(cfg.scheduler_config.max_num_batched_tokens)
        self.world_size = int(cfg.parallel_config.world_size)
        self.spec_enabled = cfg.speculative_config is not None
        cc = cfg.cache_config
        self.hash_block = int(sched.hash_block_size) if cc.prefix_caching_hash_algo in TRUSTED_HASHES else None

    # ------------------------------------------------------------------ reads
    def view(self, req: Any) -> RequestView | None:
        r = self.s.requests.get(req) if isinstance(req, str) else req
        if r is None:
            return None
        lora = getattr(r, "lora_request", None)
        return RequestView(r.request_id, r.prompt_token_ids, r.all_token_ids, int(r.num_computed_tokens),
                           r.is_finished(), (("cache_salt", r.cache_salt), ("lora", getattr(lora, "lora_name", None))),
                           len(r.spec_token_ids or ()), r.block_hashes)

    def known(self, req_id: str) -> bool:
        """Still in the scheduler (live, held, or finished with its blocks' free delayed)."""
        return req_id in self.s.requests

    def live(self, req_id: str) -> bool:
        r = self.s.requests.get(req_id)
        return r is not None and not r.is_finished()

    def frontier(self, req_id: str) -> int:
        """Tokens whose KV writes completed: vLLM advances num_computed_tokens at schedule time, so subtract the
        in-flight ones (0 at every step boundary on CPU)."""
        r = self.s.requests.get(req_id)
        if r is None:
            return 0
        return int(r.num_computed_tokens) - int(getattr(r, "num_in_flight_tokens", 0) or 0)

    def blocks(self, req_id: str) -> list[list[int]]:
        return [list(map(_ID, m.req_to_blocks.get(req_id, ()))) for m in self.mgrs]

    def group_blocks(self, req_id: str, group: int, lo: int, hi: int) -> list[int]:
        """Block ids at table positions [lo, hi) of one group (placeholders are null_block_id): O(hi - lo)."""
        return [b.block_id for b in self.mgrs[group].req_to_blocks.get(req_id, ())[lo:hi]]

    def first_needed_block(self, group: int, num_tokens: int) -> int:
        """Index of the first block a request with `num_tokens` computed tokens still attends to in this group
        (0 for full attention; later for sliding-window groups, whose earlier blocks are null placeholders)."""
        m = self.mgrs[group]
        skipped = m.get_num_skipped_tokens(num_tokens) if hasattr(m, "get_num_skipped_tokens") else 0
        return max(0, skipped) // m.block_size

    def free_block_count(self) -> int:
        return int(self.pool.get_num_free_blocks())

    def request_ids(self) -> list[str]:
        return list(self.s.requests)

    def step_tokens(self) -> int:
        return int(self.s.max_num_scheduled_tokens)

    def set_step_tokens(self, tokens: int) -> None:
        self.s.max_num_scheduled_tokens = int(tokens)

    # ------------------------------------------------------------------ pins and allocation
    def _blocks(self, ids: Iterable[int]) -> list:
        return list(map(self.pool.blocks.__getitem__, ids))

    def pin(self, block_ids: Sequence[int]) -> None:
        self.pool.touch(self._blocks(block_ids))

    def unpin(self, block_ids: Sequence[int]) -> None:
        self.pool.free_blocks(reversed(self._blocks(block_ids)))

    def alloc(self, n: int) -> list[int] | None:
        if self.pool.get_num_free_blocks() < n:
            return None
        return [b.block_id for b in self.pool.get_new_blocks(n)]

    def on_alloc(self, fn: Callable[[Iterable[int]], None]) -> None:
        """Call `fn(block_ids)` after every allocation (BlockPool is built by the coordinator and cannot be
        subclassed, so the instance method is wrapped)."""
        original = self.pool.get_new_blocks

        def get_new_blocks(num_blocks: int):
            blocks = original(num_blocks)
            fn(b.block_id for b in blocks)
            return blocks

        self.pool.get_new_blocks = get_new_blocks

    # ------------------------------------------------------------------ RESUME / RECLAIM
    def take(self, req_id: str, per_group: Sequence[Sequence[int]]) -> bool:
        """Move the request's references on the leading blocks of its table, `per_group`, to the caller: its table
        no longer lists them, so finishing it frees only the rest. False, and nothing changed, unless every group's
        table starts with exactly those ids (placeholders included: a table holding a live block where `per_group`
        has the null placeholder, or the reverse, is refused). O(certified blocks), compared at C level."""
        tables = [m.req_to_blocks.get(req_id) for m in self.mgrs]
        for t, ids in zip(tables, per_group):
            if ids and (t is None or list(map(_ID, t[: len(ids)])) != list(ids)):
                return False
        for m, t, ids in zip(self.mgrs, tables, per_group):
            if ids:
                del t[: len(ids)]
                m.num_cached_block[req_id] = max(0, m.num_cached_block.get(req_id, 0) - len(ids))
        return True

    def alias(self, handle: Any, per_group: Sequence[Sequence[int]], tokens: int, *, held: bool = False) -> None:
        """The successor's block table starts with the certified blocks (placeholders are the null block, as in
        vLLM's own sliding-window tables) and `tokens` of it count as computed. Each block gets one new reference,
        or, `held`, the caller's reference becomes the table's (no reference is taken; vLLM does not count the null
        block's references either: its own sliding-window tables place it untouched)."""
        rid = handle.request_id
        for m, ids in zip(self.mgrs, per_group):
            if not ids:
                continue
            blocks = (self._blocks(ids) if self.null_block_id not in ids else
                      [self.pool.null_block if i == self.null_block_id else self.pool.blocks[i] for i in ids])
            if not held:
                self.pool.touch(blocks)
            m.req_to_blocks[rid].extend(blocks)
            m.num_cached_block[rid] = len(blocks)
        handle.num_computed_tokens = int(tokens)

    def skip_prefix_cache(self, handle: Any) -> None:
        handle.skip_reading_prefix_cache = True

    def admit(self, handle: Any) -> None:
        Scheduler.add_request(self.s, handle)  # vLLM's own admission, not a subclass override

    def hold(self, handle: Any) -> None:
        self.s.requests[handle.request_id] = handle

    def release_held(self, handle: Any) -> None:
        del self.s.requests[handle.request_id]
        Scheduler.add_request(self.s, handle)

    def finish(self, req_id: str) -> bool:
        return bool(self.s.finish_requests(req_id, RequestStatus.FINISHED_ABORTED))

    # ------------------------------------------------------------------ writer closure
    def rollback(self, req_id: str, to_tokens: int, end_tokens: int) -> list[int]:
        """Return a request to `to_tokens` computed tokens (the start of a cut chunk): its cached-block count is
        clamped so vLLM re-hashes the chunk's blocks once they are really written. Returns the non-null block ids
        that held the chunk [to_tokens, end_tokens), whose prefix-cache hashes the caller must evict."""
        r = self.s.requests.get(req_id)
        if r is None:
            return []
        r.num_computed_tokens = int(to_tokens)
        r.is_prefill_chunk = r.num_computed_tokens < r.num_tokens  # vLLM sets it at schedule time
        out: list[int] = []
        for m in self.mgrs:
            table = m.req_to_blocks.get(req_id, [])
            lo, hi = to_tokens // m.block_size, -(-end_tokens // m.block_size)
            out.extend(b.block_id for b in table[lo:hi] if not b.is_null)
            if req_id in m.num_cached_block:
                m.num_cached_block[req_id] = min(m.num_cached_block[req_id], lo)
        return out

    def evict_hashes(self, block_ids: Iterable[int]) -> None:
        self.pool.evict_blocks(set(block_ids))

    def sharers(self, block_ids: Iterable[int]) -> list[str]:
        """Running requests whose COMPUTED prefix holds one of `block_ids` as a full block (a request that reused,
        through the prefix cache, blocks a cut step was writing): they must recompute, not roll back."""
        bad = set(block_ids)
        out = []
        for r in self.s.running:
            done = int(r.num_computed_tokens)
            for m in self.mgrs:
                table = m.req_to_blocks.get(r.request_id, ())
                if any(b.block_id in bad for b in table[: done // m.block_size]):
                    out.append(r.request_id)
                    break
        return out

    def preempt(self, req_id: str) -> bool:
        """vLLM's own preemption (blocks freed, back to waiting with nothing computed), as its scheduler does it;
        the request is also dropped from the previous step's scheduled set so its resumption resends its tokens to
        the worker (as `reset_prefix_cache` does). False if it is not running."""
        r = self.s.requests.get(req_id)
        if r is None or r not in self.s.running:
            return False
        self.s.running.remove(r)
        self.s._preempt_request(r, time.monotonic())
        self.s.prev_step_scheduled_req_ids.discard(req_id)
        return True

    # ------------------------------------------------------------------ audit
    def ref_counts(self) -> dict[int, int]:
        return {b.block_id: b.ref_cnt for b in self.pool.blocks if b.ref_cnt and not b.is_null
                and b.block_id != self.null_block_id}

    def tables(self) -> list[list[int]]:
        return [[b.block_id for b in t] for m in self.mgrs for t in m.req_to_blocks.values()]

    def leak_for_test(self, block_id: int, undo: bool) -> int:
        blk = self.pool.blocks[block_id]
        (self.pool.free_blocks if undo else self.pool.touch)([blk])
        return blk.ref_cnt


# ---------------------------------------------------------------------- step records (what a step scheduled/produced)
def scheduled_chunks(sched: Scheduler, so) -> dict[str, tuple[int, int, int]]:
    """Read at commit time (before vLLM's update): req_id -> (chunk start, chunk tokens, prompt tokens)."""
    out = {}
    for rid, n in so.num_scheduled_tokens.items():
        r = sched.requests.get(rid)
        if r is not None:
            out[rid] = (int(r.num_computed_tokens) - int(n), int(n), int(r.num_prompt_tokens))
    return out


def spec_counts(sched: Scheduler, so, mro) -> dict[str, tuple[int, int]]:
    """Speculative decoding: req_id -> (draft tokens verified this step (-1 padding excluded), accepted)."""
    out = {}
    sampled = mro.sampled_token_ids
    for rid, drafts in (so.scheduled_spec_decode_tokens or {}).items():
        real = sum(1 for t in drafts if t >= 0)
        idx = mro.req_id_to_index.get(rid)
        if real and idx is not None and sampled and rid in sched.requests:
            out[rid] = (real, max(len(sampled[idx]) - 1, 0))
    return out


def has_spec_tokens(so) -> bool:
    return bool(so.scheduled_spec_decode_tokens)


def preempted_ids(so) -> tuple[str, ...]:
    """Requests vLLM preempted (blocks freed, back to waiting) since the previous schedule, as this step's
    SchedulerOutput reports them (its own preemptions in this schedule() and any made between two steps)."""
    return tuple(getattr(so, "preempted_req_ids", None) or ())


def step_cut(mro) -> dict | None:
    """The safe-point cut a worker reported on this step's output (None for a step that ran to its end)."""
    return getattr(mro, "retire_cut", None)


def request_state(sched: Scheduler, port: SchedulerPort, req_id: str) -> dict | None:
    r = sched.requests.get(req_id)
    if r is None:
        return None
    return {"num_computed_tokens": int(r.num_computed_tokens), "frontier": port.frontier(req_id),
            "status": str(r.status), "num_tokens": int(r.num_tokens), "spec_token_ids": len(r.spec_token_ids or ())}


def request_tag_bytes(request) -> bytes | None:
    """The retire tag a request carries (`SamplingParams.extra_args["retire"]`), or None."""
    sp = getattr(request, "sampling_params", None)
    extra = getattr(sp, "extra_args", None) if sp is not None else None
    return extra.get("retire") if extra else None


def filter_outputs(outputs: dict, keep) -> int:
    """Gate (a) on one step's committed outputs ({client index: EngineCoreOutputs}): drop every per-request output
    whose request `keep(req_id)` rejects. Returns how many were dropped."""
    dropped = 0
    for eco in outputs.values():
        if eco.outputs:
            kept = [o for o in eco.outputs if keep(o.request_id)]
            if len(kept) != len(eco.outputs):
                dropped += len(eco.outputs) - len(kept)
                eco.outputs = kept
    return dropped
