"""AsyncLLM's internals on vLLM 0.32 (frontend process): build a request without sending it, send it with its own
collector, forget a request locally (gate (b)), reach the scheduler and the workers.

Invariant: `prepare` validates with vLLM's own input processing and assigns the internal id, and sends nothing;
`send` is the only call that makes a request reach EngineCore; `forget` never sends anything to EngineCore (no ABORT
that could overtake a SUPERSEDE riding on the successor's ADD).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .seams import check_live
from .table_0_32 import SEAMS


def start(model: str, kwargs: dict):
    """A started AsyncLLM. This frame holds no local reference to it: when these imports are vLLM's first, vLLM keeps
    an import error's traceback (`vllm.multimodal.media.audio._torchcodec_import_exc`, torchcodec being absent), and
    its frames keep this one, locals included, for the life of the process; an engine held here could never be
    collected after shutdown (conformance/test_engine_release.py)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    return _checked(AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **kwargs)))


def _checked(llm):
    check_live(SEAMS, {"AsyncLLM": llm, "OutputProcessor": getattr(llm, "output_processor", None),
                       "InputProcessor": getattr(llm, "input_processor", None),
                       "AsyncMPClient": getattr(llm, "engine_core", None)})
    return llm


def geometry(llm) -> dict:
    mc = llm.vllm_config.model_config
    return {"max_model_len": int(mc.max_model_len), "vocab_size": int(mc.get_vocab_size()),
            "chunk": int(llm.vllm_config.scheduler_config.max_num_batched_tokens),
            "block_size": int(llm.vllm_config.cache_config.block_size)}


@dataclass
class Prepared:
    request: Any  # EngineCoreRequest with its internal id assigned
    collector: Any

    @property
    def internal_id(self) -> str:
        return self.request.request_id


async def prepare(llm, external_id: str, prompt: dict, params) -> Prepared:
    """Raises ValueError/TypeError from vLLM's own input checks (the caller maps them to InvalidRequest)."""
    from vllm.v1.engine.output_processor import RequestOutputCollector

    req = await llm.input_processor.process_inputs_async(external_id, prompt, params,
                                                         supported_tasks=await llm.get_supported_tasks())
    llm.input_processor.assign_request_id(req)
    return Prepared(req, RequestOutputCollector(req.params.output_kind, req.request_id))


async def send(llm, prep: Prepared) -> None:
    llm._run_output_handler()
    await llm._add_request(prep.request, None, None, 0, prep.collector)


def forget(llm, internal_id: str) -> None:
    """Drop the request from the output processor: every later frame of it is dropped at entry."""
    llm.output_processor.abort_requests([internal_id], internal=True)


def registered(llm, internal_id: str) -> bool:
    return internal_id in llm.output_processor.request_states


async def abort(llm, internal_id: str) -> None:
    await llm.abort(internal_id, internal=True)


async def scheduler_call(llm, cmd: str, payload: dict):
    return await llm.engine_core.call_utility_async("scheduler", cmd, payload)


async def worker_call(llm, method: str, args: tuple) -> list:
    return await llm.collective_rpc(method, args=args)


async def reset_prefix_cache(llm) -> bool:
    return bool(await llm.reset_prefix_cache())


RELEASE_WAIT_S = 5.0


async def released(llm) -> None:
    """After `llm.shutdown()`, with no other reference to `llm` left: wait for its cancelled output handler to end
    (a barrier on the task, not a sleep, bounded by RELEASE_WAIT_S: a handler that ignores its cancellation only
    leaves the AsyncLLM uncollected), then collect the AsyncLLM now. It sits in a reference cycle; left to the
    interpreter's exit, its `__del__` shuts down again with the module globals gone and prints `TypeError:
    'NoneType' object is not callable`."""
    import asyncio
    import gc

    task = getattr(llm, "output_handler", None)
    del llm
    if task is not None and not task.done():
        await asyncio.wait([task], timeout=RELEASE_WAIT_S)
    del task
    gc.collect()


def output_kind_delta():
    from vllm.sampling_params import RequestOutputKind
    return RequestOutputKind.DELTA
