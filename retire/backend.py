"""The vLLM side of the facade: one AsyncLLM (EngineCore in its own process) with retire's seams installed.

Invariant: every engine built here uses `RetireScheduler` (scheduler_cls) and `RetireWorkerExtension`
(worker_extension_cls), so all three policies run on one engine configuration, side by side. Client-side request
building is split from sending (`prepare` then `send`) so that validation happens before ADVANCE and the internal
request id is known before the successor's ADD leaves the process.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .errors import InvalidRequest, SeamMissing, UnsupportedContract

SCHEDULER_CLS = "retire.scheduler.RetireScheduler"
WORKER_EXT_CLS = "retire.worker_ext.RetireWorkerExtension"

DEFAULTS: dict[str, Any] = dict(
    skip_tokenizer_init=True, enforce_eager=True, block_size=32, enable_prefix_caching=True,
    enable_chunked_prefill=True, max_num_batched_tokens=512, max_model_len=4096, max_num_seqs=16, seed=0,
    disable_log_stats=True,
)


def _check_seams(llm) -> None:
    need = [(llm, "output_processor"), (llm, "input_processor"), (llm, "engine_core"), (llm, "_add_request"),
            (llm, "_run_output_handler"), (llm.output_processor, "abort_requests"),
            (llm.input_processor, "process_inputs_async"), (llm.input_processor, "assign_request_id"),
            (llm.engine_core, "call_utility_async")]
    for obj, attr in need:
        if not hasattr(obj, attr):
            raise SeamMissing(f"installed vLLM lacks {type(obj).__name__}.{attr} (retire needs vLLM 0.32's AsyncLLM)")


@dataclass
class Prepared:
    request: Any  # EngineCoreRequest with its internal id assigned
    collector: Any

    @property
    def internal_id(self) -> str:
        return self.request.request_id


class Backend:
    def __init__(self, model: str, **engine_kwargs):
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from . import participants
        from .mailbox import ENV, Mailbox, create_path

        pp = int(engine_kwargs.get("pipeline_parallel_size", 1) or 1)
        if pp > 1:
            raise UnsupportedContract(
                f"pipeline_parallel_size={pp}: retire refuses pipeline parallelism. With PP > 1 vLLM keeps {pp} steps "
                "in flight (a batch queue), so no step boundary is free of running writers: FENCE could not close the "
                "old epoch's writers before RECLAIM frees its blocks, nor certify a frontier every stage has written; "
                "and PP on CPU needs compiled mode, where per-layer safe points are unavailable.")
        self.safe_point_min_tokens = int(engine_kwargs.pop("safe_point_min_tokens", 1024))
        self.mailbox = Mailbox(create_path())
        os.environ[ENV] = self.mailbox.path  # inherited by EngineCore and its workers, spawned below
        # several worker ranks: each acknowledges every step in its own slot (FENCE needs every rank's receipt)
        self.ranks = None
        world = int(engine_kwargs.get("tensor_parallel_size", 1) or 1) * pp
        if world > 1:
            self.ranks = participants.RankLedger(participants.create_path())
            os.environ[participants.ENV] = self.ranks.path
        else:
            os.environ.pop(participants.ENV, None)
        kwargs = dict(DEFAULTS)
        kwargs.update(engine_kwargs)
        kwargs["scheduler_cls"] = SCHEDULER_CLS
        kwargs["worker_extension_cls"] = WORKER_EXT_CLS
        self.model = model
        self.kwargs = kwargs
        self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **kwargs))
        _check_seams(self.llm)
        mc = self.llm.vllm_config.model_config
        self.max_model_len = int(mc.max_model_len)
        self.vocab_size = int(mc.get_vocab_size())
        self.chunk = int(self.llm.vllm_config.scheduler_config.max_num_batched_tokens)
        self.block_size = int(self.llm.vllm_config.cache_config.block_size)
        self.refs = 0
        self.closed = False
        self.safe_points: dict | None = None  # filled by ensure_safe_points()

    async def ensure_safe_points(self) -> dict:
        if self.safe_points is None:
            infos = await self.worker("retire_install_safe_points", self.safe_point_min_tokens, self.block_size)
            active = all(i.get("active") for i in infos)
            self.safe_points = {"active": active, "workers": infos}
        return self.safe_points

    async def prepare(self, external_id: str, prompt: dict, params) -> Prepared:
        from vllm.v1.engine.output_processor import RequestOutputCollector

        try:
            req = await self.llm.input_processor.process_inputs_async(
                external_id, prompt, params, supported_tasks=await self.llm.get_supported_tasks())
        except (ValueError, TypeError) as e:
            raise InvalidRequest(str(e)) from e
        self.llm.input_processor.assign_request_id(req)
        return Prepared(req, RequestOutputCollector(req.params.output_kind, req.request_id))

    async def send(self, prep: Prepared) -> None:
        self.llm._run_output_handler()
        await self.llm._add_request(prep.request, None, None, 0, prep.collector)

    def drop_local(self, internal_id: str) -> None:
        """Gate (b): forget the request in the output processor, so any frame of it still in flight from EngineCore
        is dropped at entry. Sends nothing to EngineCore (no ABORT that could overtake the SUPERSEDE)."""
        self.llm.output_processor.abort_requests([internal_id], internal=True)

    async def abort(self, internal_id: str) -> None:
        await self.llm.abort(internal_id, internal=True)

    async def sched(self, cmd: str, payload: dict | None = None):
        return await self.llm.engine_core.call_utility_async("scheduler", cmd, payload or {})

    async def worker(self, method: str, *args) -> list:
        return await self.llm.collective_rpc(method, args=tuple(args))

    def shutdown(self) -> None:
        if not self.closed:
            self.closed = True
            self.llm.shutdown()
            self.mailbox.unlink()
            if self.ranks is not None:
                self.ranks.unlink()
