"""The response gate: the ASGI `send` of one scoped request.

Invariants:
- The status line waits for the facade call (bounded). A refused call (unknown scope, stale epoch, invalid request,
  scope exists) turns the whole response into an OpenAI error body; vLLM's output for it is dropped.
- Under "retire" no body byte of a version is written after its SUPERSEDE was accepted, whatever the client's read
  speed: before each write the gate first sends an empty body (uvicorn waits there until the transport may be
  written again), then checks, with no await in between, that the version's epoch is still current. A revoked
  stream ends with one chunk whose `finish_reason` is "superseded", then `[DONE]`; a revoked non-streaming response
  carries no token and the same finish reason.
- Under the native policies (the measured problem) the gate writes what vLLM produced and only replaces the tail
  after the engine client saw the version end revoked.
- A streamed scoped response starts with one chunk in the endpoint's format with `choices: []` and a `retire`
  object (epoch, and for a SUPERSEDE the transition); the same facts are in `x-retire-*` headers.
"""
from __future__ import annotations

import asyncio
import json
import time

from . import errors
from .scopes import info_headers, transition_info

OBJECTS = {"chat": ("chat.completion.chunk", "chat.completion"), "completion": ("text_completion", "text_completion")}


class ResponseGate:
    def __init__(self, send, ctx, eng, *, gated: bool, model: str, state: dict, stats, admit_bound: float):
        self.send, self.ctx, self.eng, self.gated = send, ctx, eng, gated
        self.model, self.state, self.stats, self.admit_bound = model, state, stats, admit_bound
        self.mode = None
        self.info: dict = {}
        self.held_start: dict | None = None
        self.buf = b""
        self.opened = self.ended = self.closed = False
        self.meta: dict = {}

    async def __call__(self, message: dict) -> None:
        t = message["type"]
        if t == "http.response.start":
            return await self._start(message)
        if t != "http.response.body" or self.mode == "passthrough":
            return await self.send(message)
        if self.mode == "error":
            return None
        if self.mode == "json":
            return await self._json_body(message)
        return await self._stream_body(message)

    # ------------------------------------------------------------------ status line
    async def _start(self, message: dict) -> None:
        ctx = self.ctx
        if ctx.task is None:  # vLLM refused the request before it reached the engine (its own 400s)
            self.mode = "passthrough"
            return await self.send(message)
        try:
            res = await asyncio.wait_for(asyncio.shield(ctx.task), self.admit_bound)
        except asyncio.TimeoutError:
            self.mode = "error"
            self.stats["refused_504"] += 1
            return await errors.send(self.send, 504, errors.body(504, "the engine did not admit the request in "
                                                                      f"{self.admit_bound:.0f} s"))
        except Exception as e:  # noqa: BLE001 - every refusal becomes an OpenAI error body
            return await self._refused(e)
        self.epoch = res if isinstance(res, int) else res.epoch
        self.info = transition_info(ctx.scope, res, self.eng.policy)
        headers = list(message.get("headers", [])) + info_headers(self.info)
        ctype = dict((k.lower(), v) for k, v in message.get("headers", [])).get(b"content-type", b"")
        if message.get("status") != 200:
            self.mode = "passthrough"
        elif ctype.startswith(b"text/event-stream"):
            self.mode = "stream"
        else:
            self.mode = "json"
            self.held_start = dict(message, headers=headers)
            return None
        return await self.send(dict(message, headers=headers))

    async def _refused(self, e: BaseException) -> None:
        self.mode = "error"
        status = errors.status_of(e)
        self.stats[f"refused_{status}"] += 1
        extra = {}
        if status == 409:
            try:
                extra["current_epoch"] = self.eng.current_epoch(self.ctx.scope, self.ctx.tenant)
            except Exception:  # noqa: BLE001
                pass
        param = "expected_epoch" if status == 409 and self.ctx.kind == "supersede" else None
        await errors.send(self.send, status, errors.body(status, str(e), param=param, **extra))

    # ------------------------------------------------------------------ streaming body
    def _revoked(self) -> bool:
        if self.ctx.revoked_end:
            return True
        return self.gated and self.eng.current_epoch(self.ctx.scope, self.ctx.tenant) != self.epoch

    async def _stream_body(self, message: dict) -> None:
        body, more = message.get("body", b""), message.get("more_body", False)
        if not self.opened:
            self.opened = True
            await self._event(self._chunk([], retire=self.info))
        if body and not self.ended:
            if self.gated:  # barrier: uvicorn awaits writability here; nothing is written
                await self.send({"type": "http.response.body", "body": b"", "more_body": True})
            if self._revoked():  # no await between this check and the write below
                await self._terminal()
            else:
                self._note(body)
                await self.send({"type": "http.response.body", "body": body, "more_body": True})
        elif body:
            self.stats["gate_dropped_writes"] += 1
        if not more and not self.closed:
            self.closed = True
            await self.send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _terminal(self) -> None:
        self.ended = True
        self.stats["superseded_streams"] += 1
        try:
            current = self.eng.current_epoch(self.ctx.scope, self.ctx.tenant)
        except Exception:  # noqa: BLE001
            current = None
        ch = self._choice_end()
        await self._event(self._chunk([ch], retire={"scope": self.ctx.scope, "epoch": self.epoch, "superseded": True,
                                                    "current_epoch": current}), done=True)

    def _choice_end(self) -> dict:
        if self.ctx.endpoint == "chat":
            return {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "superseded"}
        return {"index": 0, "text": "", "logprobs": None, "finish_reason": "superseded"}

    def _chunk(self, choices: list, **extra) -> dict:
        md = self.state.get("request_metadata")
        rid = self.meta.get("id") or getattr(md, "request_id", None) or f"retire-{id(self)}"
        return {"id": rid, "object": OBJECTS[self.ctx.endpoint][0], "created": self.meta.get("created", int(time.time())),
                "model": self.meta.get("model", self.model), "choices": choices, **extra}

    async def _event(self, obj: dict, done: bool = False) -> None:
        data = b"data: " + json.dumps(obj).encode() + b"\n\n" + (b"data: [DONE]\n\n" if done else b"")
        await self.send({"type": "http.response.body", "body": data, "more_body": True})

    def _note(self, body: bytes) -> None:
        """Remember vLLM's chunk id/created/model (from its first chunk) for the chunks the gate writes."""
        if self.meta or not body.startswith(b"data: {"):
            return
        try:
            d = json.loads(body[6:].split(b"\n\n", 1)[0])
            self.meta = {k: d[k] for k in ("id", "created", "model") if k in d}
        except (ValueError, TypeError):
            self.meta = {"seen": True}

    # ------------------------------------------------------------------ non-streaming body
    async def _json_body(self, message: dict) -> None:
        self.buf += message.get("body", b"")
        if message.get("more_body", False):
            return None
        payload = self._json_payload(self.buf)
        start = self.held_start
        hs = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
        hs.append((b"content-length", str(len(payload)).encode()))
        await self.send(dict(start, headers=hs))
        await self.send({"type": "http.response.body", "body": payload, "more_body": False})

    def _json_payload(self, raw: bytes) -> bytes:
        try:
            d = json.loads(raw)
        except ValueError:
            return raw
        if self._revoked():  # checked right before the status line is written
            self.stats["superseded_responses"] += 1
            for ch in d.get("choices", []):
                if "message" in ch:
                    ch["message"] = {"role": ch["message"].get("role", "assistant"), "content": ""}
                if "text" in ch:
                    ch["text"] = ""
                if ch.get("token_ids") is not None:
                    ch["token_ids"] = []
                ch.update(logprobs=None, finish_reason="superseded", stop_reason=None)
            self.info = dict(self.info, superseded=True)
        d["retire"] = self.info
        return json.dumps(d).encode()
