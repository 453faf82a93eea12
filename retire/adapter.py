"""The one place that touches vLLM 0.32 scheduler internals. Checked at start-up so a missing seam fails fast.

Invariant: every private attribute retire reads or writes is named here, and `check(scheduler)` verifies all of them
exist on the running scheduler before the first request, raising `SeamMissing` with the name otherwise.
"""
from __future__ import annotations

from typing import Any

from .errors import SeamMissing

REQUIRED = {
    "scheduler": ["requests", "running", "kv_cache_manager", "block_size", "finish_requests", "add_request",
                  "update_from_output", "schedule", "max_num_scheduled_tokens"],
    "kv_cache_manager": ["coordinator", "block_pool", "enable_caching"],
    "coordinator": ["single_type_managers"],
    "manager": ["req_to_blocks", "num_cached_block", "block_size"],
    "block_pool": ["blocks", "touch", "free_blocks", "get_new_blocks", "get_num_free_blocks", "num_gpu_blocks",
                   "null_block", "evict_blocks"],
}


def check(sched: Any) -> None:
    objs = {
        "scheduler": sched,
        "kv_cache_manager": getattr(sched, "kv_cache_manager", None),
    }
    objs["coordinator"] = getattr(objs["kv_cache_manager"], "coordinator", None)
    objs["block_pool"] = getattr(objs["kv_cache_manager"], "block_pool", None)
    mgrs = getattr(objs["coordinator"], "single_type_managers", None) or [None]
    objs["manager"] = mgrs[0]
    for name, attrs in REQUIRED.items():
        obj = objs[name]
        for a in attrs:
            if obj is None or not hasattr(obj, a):
                raise SeamMissing(f"installed vLLM lacks {name}.{a}; retire needs vLLM 0.32 scheduler internals "
                                  f"(see vllm-0.32-seams.md)")


def managers(sched: Any) -> list:
    return list(sched.kv_cache_manager.coordinator.single_type_managers)


def pool(sched: Any):
    return sched.kv_cache_manager.block_pool


def group_blocks(sched: Any, req_id: str) -> list[list]:
    return [list(m.req_to_blocks.get(req_id, ())) for m in managers(sched)]


def writer_frontier(request: Any) -> int:
    """Tokens whose KV writes completed: vLLM advances num_computed_tokens at schedule time, so subtract the
    in-flight ones (0 at every step boundary on CPU)."""
    return int(request.num_computed_tokens) - int(getattr(request, "num_in_flight_tokens", 0) or 0)


def install_blocks(sched: Any, req_id: str, per_group: list[list]) -> None:
    """RESUME: alias the certified blocks as the head of the successor's block table (one new reference each)."""
    p = pool(sched)
    for m, blocks in zip(managers(sched), per_group):
        if not blocks:
            continue
        p.touch(blocks)
        m.req_to_blocks[req_id].extend(blocks)
        m.num_cached_block[req_id] = len(blocks)


def all_tables(sched: Any) -> list:
    out = []
    for m in managers(sched):
        out.extend(m.req_to_blocks.values())
    return out


def first_needed_block(manager: Any, num_tokens: int) -> int:
    """Index of the first block a request with `num_tokens` computed tokens still attends to in this group
    (0 for full attention; later for sliding-window groups, whose earlier blocks are null placeholders)."""
    skipped = manager.get_num_skipped_tokens(num_tokens) if hasattr(manager, "get_num_skipped_tokens") else 0
    return max(0, skipped) // manager.block_size
