"""Runs: one output shape for the subject and the oracle.

`Run(tokens, logprobs, top_logprobs, timings, inherited_tokens, epoch, revoked, num_cached_tokens)` is what `collect`
builds from a RetireEngine stream (the subject) and what `OracleEngine` returns (the reference), so comparators never
adapt. `num_cached_tokens` is vLLM's own count of prompt tokens served from the prefix cache (carried on the frames
of the subject, read from RequestOutput on the oracle): it is how a checker tells a cold successor without asking
the code under test.

Invariant of the oracle: it is a clean execution on a *stock* vLLM AsyncLLM (vLLM's own scheduler, no retire
metadata, no retire worker hooks) built with the same execution shape (block size, chunk, dtype, eager mode) as the
subject. `clean_run` never reads the prefix cache; `clean_prefix_run` computes the prefix first in its own cache
namespace (a fresh cache salt), then runs the prompt reusing exactly that prefix, the mode-matched reference for
inheritance.
"""
from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence


@dataclass(frozen=True)
class Run:
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[dict, ...] | None = None
    timings: dict = field(default_factory=dict)
    inherited_tokens: int | None = None
    epoch: int | None = None
    revoked: bool = False
    num_cached_tokens: int | None = None  # vLLM's RequestOutput.num_cached_tokens (first frame that carries it)


async def collect(eng, scope: str, epoch: int | None = None, tenant: str = "default", *, on_frame=None) -> Run:
    """Drain one version's stream into a Run. `on_frame(frame)` (optional, may be async) runs after each frame."""
    toks: list[int] = []
    lps: list[float] = []
    tops: list[dict] = []
    have_lp = True
    revoked = False
    ep = None
    cached = None
    t0 = time.monotonic()
    first = None
    async for f in eng.stream(scope, epoch, tenant):
        ep = f.epoch
        revoked = revoked or f.revoked
        if cached is None and f.num_cached_tokens is not None:
            cached = int(f.num_cached_tokens)
        if f.token_ids and first is None:
            first = time.monotonic() - t0
        toks.extend(f.token_ids)
        if f.token_ids:
            if f.logprobs is None:
                have_lp = False
            else:
                lps.extend(f.logprobs)
                tops.extend(f.top_logprobs or ())
        if on_frame is not None:
            r = on_frame(f)
            if hasattr(r, "__await__"):
                await r
    return Run(tuple(toks), tuple(lps) if have_lp and toks else None, tuple(tops) if have_lp and toks else None,
               {"first_frame": first, "total": time.monotonic() - t0}, None, ep, revoked, cached)


class OracleEngine:
    """A stock vLLM engine with the subject's execution shape. Use `await OracleEngine.create(...)` in a loop."""

    def __init__(self, model: str, **shape: Any):
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from retire.backend import DEFAULTS

        kw = dict(DEFAULTS)
        kw.update(shape)
        kw.pop("scheduler_cls", None)
        kw.pop("worker_extension_cls", None)
        self.model, self.shape = model, kw
        self._stopped = None  # the AsyncLLM between shutdown() and released()
        self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **kw))

    async def _generate(self, prompt: Sequence[int], sampling, salt: str | None, skip_cache: bool) -> Run:
        from vllm.sampling_params import RequestOutputKind

        sp = sampling.clone()
        sp.output_kind = RequestOutputKind.DELTA
        sp.skip_reading_prefix_cache = skip_cache
        p: dict = {"prompt_token_ids": list(prompt)}
        if salt:
            p["cache_salt"] = salt
        toks: list[int] = []
        lps: list[float] = []
        tops: list[dict] = []
        cached = None
        t0 = time.monotonic()
        first = None
        async for out in self.llm.generate(p, sp, request_id=f"oracle-{uuid.uuid4().hex[:12]}"):
            co = out.outputs[0]
            if cached is None:
                cached = out.num_cached_tokens
            if co.token_ids and first is None:
                first = time.monotonic() - t0
            toks.extend(co.token_ids)
            if co.logprobs:
                lps.extend(float(d[t].logprob) for t, d in zip(co.token_ids, co.logprobs))
                tops.extend({int(k): float(x.logprob) for k, x in d.items()} for d in co.logprobs)
        return Run(tuple(toks), tuple(lps) if lps else None, tuple(tops) if tops else None,
                   {"first_frame": first, "total": time.monotonic() - t0}, cached, None, False, cached)

    async def clean_run(self, prompt: Sequence[int], sampling) -> Run:
        """The prompt alone, on a clean cache (no prefix-cache read, private cache namespace)."""
        return await self._generate(prompt, sampling, f"clean-{uuid.uuid4().hex}", skip_cache=True)

    async def clean_prefix_run(self, prefix: Sequence[int], prompt: Sequence[int], sampling) -> Run:
        """`prefix` computed cleanly first (in its own cache namespace), then `prompt` reusing it.

        The prefix must be block-aligned and a proper prefix of `prompt`, so the reuse is exactly len(prefix); the
        returned Run's `inherited_tokens` is what vLLM reports as cached, for the caller to check."""
        if list(prompt[: len(prefix)]) != list(prefix) or len(prefix) >= len(prompt):
            raise ValueError("prefix must be a proper prefix of prompt")
        from vllm import SamplingParams

        salt = f"prefix-{uuid.uuid4().hex}"
        if prefix:
            await self._generate(prefix, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True), salt, True)
        return await self._generate(prompt, sampling, salt, skip_cache=False)

    def shutdown(self) -> None:
        """Stop the engine (idempotent); an async caller then awaits `released()`, or calls `stop()` for both."""
        if self.llm is not None:
            self._stopped, self.llm = self.llm, None
            self._stopped.shutdown()

    async def released(self) -> None:
        """After shutdown: the stopped AsyncLLM is collected before this returns (see the adapter's `released`)."""
        from retire import adapter

        llm, self._stopped = self._stopped, None
        if llm is not None:
            await adapter.frontend().released(llm)

    async def stop(self) -> None:
        """shutdown() then released(), on the running loop (where AsyncLLM's output handler runs)."""
        self.shutdown()
        await self.released()
