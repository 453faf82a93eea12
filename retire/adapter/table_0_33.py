"""The seam table for vLLM 0.33 (checked statically on the vllm 0.33.0 wheel's sources; no CPU build exists yet).

Invariant: the same internals as 0.32 (`table_0_32.SEAMS`), unchanged in name and signature; `retire seams --vllm
vllm==0.33.0` reports every one present. What 0.33 changes around them, and why the 0.32 code absorbs it:
- `BlockPool.touch` / `free_blocks` skip the null block (its `ref_cnt` is no longer maintained). retire touches the
  null placeholders of a sliding-window table in `alias` and frees them in `unpin`: both become no-ops for the null
  block, and every retire audit already excludes it.
- Pop-for-free paths trim a table's leading null blocks (`kv_cache_utils.trim_null_head`); `req_to_blocks` still
  holds them, which is what `blocks`/`first_needed_block` read.
- Prefix-cache lookups are capped by the hashed length (`len(request.block_hashes) * hash_block_size`) and may look
  ahead (`num_hash_lookahead_tokens`); retire's RESUME aliases certified blocks without a prefix-hash lookup.
- KV cache planning moved from `kv_cache_utils` to `kv_cache_planning`, and draft-layer KV specs carry `is_draft`:
  retire uses neither. `Scheduler.__init__` is unchanged (`hash_block_size` has been an optional parameter since
  0.29 at least).
"""
from __future__ import annotations

from .table_0_32 import SEAMS

__all__ = ["SEAMS"]
