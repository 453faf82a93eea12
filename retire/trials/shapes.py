"""Engine execution shapes of the local tiny models, keyed by everything that changes an engine's behaviour.

Invariant: a shape key names one (model, vLLM engine kwargs) pair; the demo, perf and the conformance pool build
engines only through `shape_kwargs`, so a key always means the same execution shape. `chunk` is
max_num_batched_tokens (the prefill unit).
"""
from __future__ import annotations

import contextlib
import os
from typing import Any

from .models import ensure_model

SHAPES: dict[str, dict[str, Any]] = {
    "unit": dict(model="unit", max_model_len=2048, max_num_batched_tokens=256, max_num_seqs=16),
    "unit-noapc": dict(model="unit", max_model_len=2048, max_num_batched_tokens=256, max_num_seqs=16,
                       enable_prefix_caching=False),
    "long": dict(model="long", max_model_len=16384, max_num_batched_tokens=2048, max_num_seqs=8),
    # long steps for in-step safe points: the unit (2K/4K/8K) is set at run time with `set_step_tokens`
    "long-8k": dict(model="long", max_model_len=17408, max_num_batched_tokens=8192, max_num_seqs=8),
    "long-16k": dict(model="long", max_model_len=32768, max_num_batched_tokens=16384, max_num_seqs=8),
    # cost-growth curves (perf/test_bench_growth.py): successor TTFT up to a 32,000-token prompt in the `long` chunk
    # shape (its own oracle: no other shape holds 32K), and >= 256 live scopes all running at once
    "long-32k": dict(model="long", max_model_len=32768, max_num_batched_tokens=2048, max_num_seqs=8),
    "unit-wide": dict(model="unit", max_model_len=2048, max_num_batched_tokens=1024, max_num_seqs=512),
    # ngram speculative decoding (3 draft tokens); its oracle is a stock engine with the same speculative config
    "unit-spec": dict(model="unit", max_model_len=2048, max_num_batched_tokens=256, max_num_seqs=16,
                      speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
                                          "prompt_lookup_min": 2}),
    "long-spec": dict(model="long", max_model_len=16384, max_num_batched_tokens=2048, max_num_seqs=8,
                      speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
                                          "prompt_lookup_min": 2}),
    # two KV groups: Gemma3-shaped, sliding window 128 + full attention
    "hybrid": dict(model="hybrid", max_model_len=2048, max_num_batched_tokens=256, max_num_seqs=16),
    "hybrid-2k": dict(model="hybrid", max_model_len=4096, max_num_batched_tokens=2048, max_num_seqs=8),
    # tensor parallel 2 (one rank per core); SHAPE_ENV sets the OMP binding before the engine starts
    "unit-tp2": dict(model="unit", max_model_len=2048, max_num_batched_tokens=256, max_num_seqs=16,
                     tensor_parallel_size=2, distributed_executor_backend="mp"),
    # churn / DRAM tier: a small KV cache (num_gpu_blocks_override) makes churn at 1.1x capacity cheap
    "unit-churn": dict(model="unit", max_model_len=2048, max_num_batched_tokens=256, max_num_seqs=16,
                       num_gpu_blocks_override=128),
    "long-churn": dict(model="long", max_model_len=8192, max_num_batched_tokens=2048, max_num_seqs=8,
                       num_gpu_blocks_override=320),
}

# Environment a shape needs while its engine processes start (inherited by EngineCore and its workers).
SHAPE_ENV: dict[str, dict[str, str]] = {"unit-tp2": {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}}

# Shapes whose numerics equal another's share its oracle (prefix caching changes reuse, not the arithmetic).
ORACLE_SHAPE = {"unit-noapc": "unit", "long-8k": "long", "long-16k": "long", "unit-churn": "unit",
                "long-churn": "long"}


def shape_kwargs(key: str) -> tuple[str, dict]:
    """(model path, engine kwargs) of shape `key`; writes the model first if it is not cached yet."""
    cfg = dict(SHAPES[key])
    return ensure_model(cfg.pop("model")), cfg


@contextlib.contextmanager
def shape_env(key: str):
    """Set a shape's environment while its engine starts (child processes inherit it), then restore."""
    env = SHAPE_ENV.get(key, {})
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
