"""Engine-free construction on vLLM 0.32: a real Scheduler (real KVCacheManager, BlockPool, prefix cache) with no
model and no worker, driven with hand-built ModelRunnerOutputs, the way vLLM's own tests/v1/core do.

Invariant: everything here is vLLM's own code path except the model: schedule(), update_from_output(), the block
pool's allocation, hashing and eviction are the engine's. A worker is replaced by `runner_output` (one sampled token
for every request whose scheduled tokens complete its known tokens) or `cut_output` (a step cut at a safe point).
The configuration (which reads the model's config.json from disk, ~0.5 s) is built once and reused; a scheduler on
it costs about a millisecond.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Sequence


@lru_cache(maxsize=8)
def configs(model: str, *, block_size: int = 32, chunk: int = 256, max_model_len: int = 2048, num_blocks: int = 256,
            max_num_seqs: int = 16, prefix_caching: bool = True, sliding_window: int | None = None,
            hash_algo: str = "sha256"):
    """(vllm_config, kv_cache_config): one full-attention KV group, plus a sliding-window group if asked; `hash_algo`
    is vLLM's `prefix_caching_hash_algo`."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                            SlidingWindowSpec)

    sc = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=chunk, max_model_len=max_model_len,
                         enable_chunked_prefill=True, is_encoder_decoder=False)
    mc = ModelConfig(model=model, dtype="bfloat16", seed=0, skip_tokenizer_init=True, max_model_len=max_model_len)
    cc = CacheConfig(block_size=block_size, enable_prefix_caching=prefix_caching, prefix_caching_hash_algo=hash_algo)
    vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc)
    groups = [KVCacheGroupSpec(["full"], FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                                           dtype=torch.float32))]
    if sliding_window:
        groups.append(KVCacheGroupSpec(["sliding"], SlidingWindowSpec(
            block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=sliding_window)))
    kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    cc.num_gpu_blocks = num_blocks
    return vc, kvc


def scheduler(cls, vllm_config, kv_cache_config):
    """A fresh scheduler of class `cls` (a vLLM Scheduler subclass) on prebuilt configs."""
    from vllm.v1.structured_output import StructuredOutputManager

    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config, log_stats=False,
               structured_output_manager=StructuredOutputManager(vllm_config),
               block_size=vllm_config.cache_config.block_size)


@lru_cache(maxsize=4)
def _hasher(block_size: int, algo: str):
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    fn = get_hash_fn_by_name(algo)
    init_none_hash(fn)
    return get_request_block_hasher(block_size, fn)


def request(vllm_config, req_id: str, prompt: Sequence[int], *, max_tokens: int, extra_args: dict | None = None,
            cache_salt: str | None = None):
    """A vLLM Request as EngineCore builds it (greedy, EOS ignored, block hashes for the prefix cache)."""
    from vllm import SamplingParams
    from vllm.v1.request import Request

    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, extra_args=extra_args)
    cc = vllm_config.cache_config
    hasher = _hasher(cc.block_size, cc.prefix_caching_hash_algo) if cc.enable_prefix_caching else None
    return Request(req_id, list(prompt), sp, None, cache_salt=cache_salt, block_hasher=hasher)


def runner_output(sched, so, token_of) -> Any:
    """The output a worker would return for `so`: one sampled token (`token_of(req_id, position)`) for every
    request whose scheduled tokens reach the end of its known tokens, none for a partial prefill chunk."""
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(so.num_scheduled_tokens)
    sampled = []
    for rid in req_ids:
        r = sched.requests.get(rid)
        done = r is not None and r.num_computed_tokens >= r.num_tokens
        sampled.append([int(token_of(rid, r.num_tokens))] if done else [])
    return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                             sampled_token_ids=sampled)


def cut_output(so, decision: dict | None = None) -> Any:
    """The output of a step cut at a safe point (as retire's worker returns it): nothing sampled, every chunk cut."""
    from . import worker_0_32 as wk

    chunks = {r: list(c) for r, c in wk.chunks_of(so).items()}
    return wk.cut_output(so, {"chunks": chunks, "decision": dict(decision or {}, path="safe-point")})


def output_request_ids(outputs: dict) -> list[str]:
    """Request ids of the per-request outputs a step committed (after gate (a))."""
    return [o.request_id for eco in outputs.values() for o in (eco.outputs or ())]


def finished_request_ids(outputs: dict) -> list[str]:
    return [o.request_id for eco in outputs.values() for o in (eco.outputs or ()) if o.finish_reason is not None]
