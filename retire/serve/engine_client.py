"""The EngineClient vLLM's OpenAI serving classes call: vLLM's AsyncLLM, with `generate()` routed by scope.

Invariants:
- An unscoped request is vLLM's own `AsyncLLM.generate`, unchanged except for the tenant's server-side cache salt.
- A scoped request is exactly one facade call, `submit` (start at epoch 0) or `supersede` (compare-and-swap on
  `expected_epoch`), started eagerly when vLLM asks for the generator, so the ASGI layer can await its outcome
  before it sends a status line; then the version's frames come from `stream_outputs`, each with vLLM's own
  `RequestOutput` behind it, which vLLM formats (text, logprobs, finish reasons, usage).
- A revoked version's stream ends without a finish reason of its own (`ctx.revoked_end`); the gate writes the
  "superseded" end. A non-streaming revoked version returns no token at all (nothing was sent before it).
- A scoped stream whose consumer goes away (client disconnect) aborts its version if it is still current, as vLLM
  does for an unscoped request; a revoked or finished version is left alone.
"""
from __future__ import annotations

import asyncio
import logging

from ..errors import InvalidRequest, StaleEpoch
from .context import RequestCtx, current
from .tenants import DEFAULT_TENANT, cache_salt

log = logging.getLogger("retire.serve")
_background: set[asyncio.Task] = set()


def _spawn(coro) -> None:
    t = asyncio.ensure_future(coro)
    _background.add(t)
    t.add_done_callback(_background.discard)


class ScopedEngineClient:
    """Delegates everything to vLLM's AsyncLLM except `generate`."""

    def __init__(self, eng, llm):
        self._eng = eng
        self._llm = llm

    def __getattr__(self, name):
        return getattr(self._llm, name)

    def generate(self, prompt, sampling_params, request_id, **kwargs):
        ctx = current()
        if ctx is None or not ctx.scoped:
            tenant = ctx.tenant if ctx is not None else DEFAULT_TENANT
            if isinstance(prompt, dict) and prompt.get("type", "token") in ("token", "embeds"):
                prompt = dict(prompt, cache_salt=cache_salt(tenant, prompt.get("cache_salt")))
            return self._llm.generate(prompt, sampling_params, request_id, **kwargs)
        return self._scoped(ctx, prompt, sampling_params)

    # ------------------------------------------------------------------ scoped requests
    def _scoped(self, ctx: RequestCtx, prompt, sp):
        ctx.generate_calls += 1
        toks = prompt.get("prompt_token_ids") if isinstance(prompt, dict) and prompt.get("type", "token") == "token" \
            else None
        if ctx.generate_calls > 1 or ctx.task is not None:
            err = InvalidRequest("a scoped request takes exactly one prompt")
        elif toks is None:
            err = InvalidRequest("a scoped request takes a text, messages or token-id prompt")
        else:
            err = None
        if err is not None:
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(err)
            ctx.task = ctx.task or fut
            return self._failed(err)
        salt = cache_salt(ctx.tenant, prompt.get("cache_salt"))
        eng = self._eng
        if ctx.kind == "start":
            coro = eng.submit(ctx.scope, list(toks), sp, tenant=ctx.tenant, cache_salt=salt)
        else:
            coro = eng.supersede(ctx.scope, ctx.expected_epoch, list(toks), sp, contract=ctx.contract,
                                 tenant=ctx.tenant, cache_salt=salt)
        ctx.task = asyncio.ensure_future(coro)
        ctx.gen = self._frames(ctx, sp, list(toks))
        return ctx.gen

    async def _failed(self, err):
        raise err
        yield  # pragma: no cover - makes this an async generator

    async def _frames(self, ctx: RequestCtx, sp, toks: list[int]):
        from vllm.sampling_params import RequestOutputKind

        res = await ctx.task
        ctx.epoch = res if isinstance(res, int) else res.epoch
        delta = sp.output_kind == RequestOutputKind.DELTA
        acc = None
        it = self._eng.stream_outputs(ctx.scope, ctx.epoch, ctx.tenant)
        try:
            async for frame, out in it:
                if frame.revoked:
                    if out is not None and frame.token_ids:  # native policies publish what they had queued
                        out = _without_finish(out)
                        if delta:
                            yield out
                        else:
                            acc = _merge(acc, out)
                    ctx.revoked_end = ctx.consumed = True
                    if not delta:
                        yield _superseded(acc, toks, sp)
                    return
                if delta:
                    yield out
                else:
                    acc = _merge(acc, out)
                    if out.finished:
                        yield acc
            ctx.consumed = True
        finally:
            await it.aclose()


async def release(eng, ctx: RequestCtx, bound: float = 60.0) -> None:
    """After the HTTP response ended (completed, failed or the client went away): close the version's generator and,
    if its stream was not consumed to its end, abort the version if it is still current (a client that disconnected
    before the successor's first token included), then drain its stream (public API) so the facade sees it end.
    A version that is no longer current is never aborted (that could overtake its SUPERSEDE)."""
    try:
        async with asyncio.timeout(bound):
            if ctx.gen is not None:
                await ctx.gen.aclose()
            if ctx.task is None or ctx.consumed:
                return
            try:
                res = await ctx.task
            except Exception:  # noqa: BLE001 - a refused call changed nothing: nothing to release
                return
            epoch = res if isinstance(res, int) else res.epoch
            try:
                await eng.cancel(ctx.scope, epoch, ctx.tenant)
            except StaleEpoch:  # no longer current: never abort it (that could overtake its SUPERSEDE)
                return
            async for _ in eng.stream(ctx.scope, epoch, ctx.tenant):
                pass
    except Exception as e:  # noqa: BLE001 - best effort; the audit reports anything left behind
        log.warning("release of scope %r failed: %r", ctx.scope, e)


def release_later(eng, ctx: RequestCtx) -> None:
    _spawn(release(eng, ctx))


def _merge(acc, out):
    if acc is None:
        return out
    acc.add(out, aggregate=True)
    return acc


def _without_finish(out):
    for co in out.outputs:
        co.finish_reason = None
        co.stop_reason = None
    out.finished = False
    return out


def _superseded(acc, toks: list[int], sp):
    """The whole response of a non-streaming version revoked before it was sent: no token, reason "superseded"."""
    from vllm.outputs import CompletionOutput, RequestOutput

    co = CompletionOutput(index=0, text="", token_ids=[], cumulative_logprob=None,
                          logprobs=[] if sp.logprobs is not None else None, finish_reason="superseded")
    return RequestOutput(request_id=getattr(acc, "request_id", ""), prompt=None, prompt_token_ids=list(toks),
                         prompt_logprobs=None, outputs=[co], finished=True,
                         num_cached_tokens=getattr(acc, "num_cached_tokens", 0) or 0)
