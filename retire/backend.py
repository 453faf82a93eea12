"""The vLLM side of the facade: one AsyncLLM (EngineCore in its own process) with retire's seams installed.

Invariant: every engine built here uses `RetireScheduler` (scheduler_cls) and `RetireWorkerExtension`
(worker_extension_cls), so all three policies run on one engine configuration, side by side. Request building is
split from sending (`prepare`, then `send`) so that validation happens before anything changes and the internal
request id is known before the successor's ADD leaves the process. AsyncLLM's internals are reached only through
`retire.adapter.frontend()`.
"""
from __future__ import annotations

import os
from typing import Any

from . import adapter
from .errors import InvalidRequest, UnsupportedContract
from .types import TransitionResult, VersionKey, decode

SCHEDULER_CLS = "retire.scheduler.RetireScheduler"
WORKER_EXT_CLS = "retire.worker_ext.RetireWorkerExtension"

DEFAULTS: dict[str, Any] = dict(
    skip_tokenizer_init=True, enforce_eager=True, block_size=32, enable_prefix_caching=True,
    enable_chunked_prefill=True, max_num_batched_tokens=512, max_model_len=4096, max_num_seqs=16, seed=0,
    disable_log_stats=True,
)

PP_REFUSED = ("retire refuses pipeline parallelism. With PP > 1 vLLM keeps several steps in flight (a batch queue), so "
              "no step boundary is free of running writers: FENCE could not close the old epoch's writers before "
              "RECLAIM frees its blocks, nor certify a frontier every stage has written; and PP on CPU needs compiled "
              "mode, where per-layer safe points are unavailable.")


class Backend:
    def __init__(self, model: str, **engine_kwargs):
        from .density import Density
        # the density rule (retire/density.py): the fine tier (min_tokens, rows) runs while a revision was posted in
        # the last `safe_point_revision_window_s` seconds (0: never); None keeps the defaults (30 s; 2048, 512).
        # A bad value is refused here, before anything changes.
        self.density = Density().with_(window_s=engine_kwargs.pop("safe_point_revision_window_s", None),
                                       fine=engine_kwargs.pop("safe_point_fine_slices", None))
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from . import participants
        from .mailbox import ENV, Mailbox, create_path

        pp = int(engine_kwargs.get("pipeline_parallel_size", 1) or 1)
        if pp > 1:
            raise UnsupportedContract(f"pipeline_parallel_size={pp}: {PP_REFUSED}")
        self.fe = adapter.frontend()  # refuses an unsupported vLLM version by name, before anything starts
        self.safe_point_min_tokens = int(engine_kwargs.pop("safe_point_min_tokens", 1024))
        # finer safe points (attention query slices, MLP row slices) from this step size, this many tokens per slice;
        # None keeps the worker's defaults (8192 and 1024: retire/safepoints.py, retire/slicing.py)
        self.slice_min_tokens = engine_kwargs.pop("safe_point_slice_min_tokens", None)
        self.slice_rows = engine_kwargs.pop("safe_point_slice_rows", None)
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
        try:
            self.llm = self.fe.start(model, kwargs)
        except BaseException:  # an engine that never started leaves no shared-memory file behind
            self._unlink_shared()
            raise
        g = self.fe.geometry(self.llm)
        self.max_model_len, self.vocab_size = g["max_model_len"], g["vocab_size"]
        self.chunk, self.block_size = g["chunk"], g["block_size"]
        self.refs = 0
        self.closed = False
        self._stopped = None  # the AsyncLLM between shutdown() and released()
        self.safe_points: dict | None = None  # filled by ensure_safe_points()

    async def ensure_safe_points(self) -> dict:
        if self.safe_points is None:
            infos = await self.worker("retire_install_safe_points", self.safe_point_min_tokens, self.block_size,
                                      self.density.window_s, self.density.fine)
            if self.slice_min_tokens is not None or self.slice_rows is not None:
                await self.worker("retire_slicing", None, self.slice_min_tokens, self.slice_rows)
            self.safe_points = {"active": all(i.get("active") for i in infos), "workers": infos}
        return self.safe_points

    def slicing_defaults(self) -> tuple:
        """This engine's configured safe-point tiers as `retire_slicing` arguments after `enabled`: (min_tokens,
        rows, window_s, fine); what a test or benchmark restores after changing them."""
        from .density import STATIC
        pick = lambda v, d: d if v is None else v
        return (pick(self.slice_min_tokens, STATIC[0]), pick(self.slice_rows, STATIC[1]), self.density.window_s,
                self.density.fine)

    async def prepare(self, external_id: str, prompt: dict, params):
        try:
            return await self.fe.prepare(self.llm, external_id, prompt, params)
        except (ValueError, TypeError) as e:
            raise InvalidRequest(str(e)) from e

    async def send(self, prep) -> None:
        await self.fe.send(self.llm, prep)

    def drop_local(self, internal_id: str) -> None:
        """Gate (b): forget the request in the output processor, so any frame of it still in flight from EngineCore
        is dropped at entry. Sends nothing to EngineCore (no ABORT that could overtake the SUPERSEDE)."""
        self.fe.forget(self.llm, internal_id)

    def registered(self, internal_id: str) -> bool:
        return self.fe.registered(self.llm, internal_id)

    async def abort(self, internal_id: str) -> None:
        await self.fe.abort(self.llm, internal_id)

    async def sched(self, cmd: str, payload: dict | None = None):
        return await self.fe.scheduler_call(self.llm, cmd, payload or {})

    async def result(self, key: VersionKey) -> TransitionResult | None:
        raw = await self.sched("result", {"key": key})
        return None if raw is None else decode(raw, TransitionResult)

    async def worker(self, method: str, *args) -> list:
        return await self.fe.worker_call(self.llm, method, tuple(args))

    async def reset_prefix_cache(self) -> bool:
        return await self.fe.reset_prefix_cache(self.llm)

    def shutdown(self) -> None:
        """Stop the engine. From here nothing reaches vLLM through this backend (`llm` is None); the caller of an
        async close then awaits `released()` (or calls `stop()`, which does both)."""
        if not self.closed:
            self.closed = True
            self._stopped, self.llm = self.llm, None
            try:
                self._stopped.shutdown()
            finally:
                self._unlink_shared()

    async def released(self) -> None:
        """After shutdown: the stopped AsyncLLM is collected before this returns (see the adapter's `released`)."""
        llm, self._stopped = self._stopped, None
        if llm is not None:
            await self.fe.released(llm)

    async def stop(self) -> None:
        """shutdown() then released(), on the running loop: the async way to stop (idempotent)."""
        self.shutdown()
        await self.released()

    def _unlink_shared(self) -> None:
        self.mailbox.unlink()
        if self.ranks is not None:
            self.ranks.unlink()
