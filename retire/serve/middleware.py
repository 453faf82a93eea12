"""The ASGI layer in front of vLLM's app: lifecycle, tenants, scope routes, the response gate.

Invariants:
- Until the engine is up, and after it died, every request gets a 503 in OpenAI's error shape (`/health` included).
- Every path except the open ones (`/health`, `/ping`, `/version`, `/metrics`, `/load`) needs a known bearer key when
  a key file is given; the tenant comes from that key only (401 otherwise).
- Scoped requests (a scope header on the chat/completions routes, or `/v1/scopes/{scope}/supersede`) run vLLM's own
  route for the endpoint with a `RequestCtx` in the contextvar and a `ResponseGate` as `send`; a SUPERSEDE body is
  checked and stripped of `expected_epoch` / `contract` first. Everything else runs vLLM's app unchanged with the
  tenant in the context (for its cache namespace).
- Oversize bodies are refused with 413 before they are read past the limit.
- `GET /retire/audit` (any tenant's key) returns the facade's `audit()` report: 200 when clean, 500 otherwise.
"""
from __future__ import annotations

import json
import logging
from collections import Counter

from ..errors import UnknownScope
from . import errors
from .context import CURRENT, RequestCtx
from .engine_client import release
from .gate import ResponseGate
from .scopes import ENDPOINT_PATHS, BadRequest, check_single, parse_body, route, scope_json, supersede_fields

log = logging.getLogger("retire.serve")
OPEN_PATHS = ("/health", "/ping", "/version", "/metrics", "/load")
AUDIT_PATH = "/retire/audit"


class RetireASGI:
    def __init__(self, tenants, *, max_body_bytes: int = 16 << 20, admit_bound: float = 300.0):
        self.tenants = tenants
        self.max_body_bytes = max_body_bytes
        self.admit_bound = admit_bound
        self.app = self.eng = self.client = None
        self.model = ""
        self.failure: str | None = None
        self.stats: Counter = Counter()

    def ready(self, app, eng, client, model: str) -> None:
        self.app, self.eng, self.client, self.model = app, eng, client, model

    @property
    def state(self) -> str:
        if self.failure is not None:
            return "failed"
        if self.app is None:
            return "starting"
        return "dead" if self.client.errored else "ready"

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        if scope["type"] != "http":
            if self.app is not None:
                return await self.app(scope, receive, send)
            return None
        state = self.state
        if state != "ready":
            self.stats[f"unavailable_{state}"] += 1
            msg = {"starting": "the engine is starting", "dead": "the engine is dead",
                   "failed": f"the engine failed to start: {self.failure}"}[state]
            return await errors.send(send, 503, errors.body(503, msg))
        path = scope["path"]
        if path in OPEN_PATHS or path.startswith("/metrics/"):
            return await self.app(scope, receive, send)
        headers = scope.get("headers", [])
        tenant = self.tenants.tenant_of(_header(headers, b"authorization"))
        if tenant is None:
            self.stats["refused_401"] += 1
            return await errors.send(send, 401, errors.body(401, "missing or unknown API key"),
                                     [(b"www-authenticate", b"Bearer")])
        length = _header(headers, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return await self._too_large(send)
        if path == AUDIT_PATH:
            return await self._audit(send)
        try:
            r = route(scope["method"], scope.get("raw_path") or path.encode(), headers)
            if r.kind == "info":
                return await self._info(send, r.scope, tenant)
            if r.kind == "plain":
                return await self._call(scope, receive, send, RequestCtx(tenant))
            raw = await self._read(receive)
            if raw is None:
                return await self._too_large(send)
            data = parse_body(raw)
            ctx = RequestCtx(tenant, r.scope, r.kind, r.endpoint)
            if r.kind == "supersede":
                ctx.expected_epoch, ctx.contract, ctx.endpoint = supersede_fields(data, r.endpoint)
            else:
                check_single(data, r.endpoint)
        except BadRequest as e:
            self.stats[f"refused_{e.status}"] += 1
            return await errors.send(send, e.status, errors.body(e.status, str(e), param=e.param))
        self.stats[f"scoped_{ctx.kind}"] += 1
        return await self._scoped(scope, receive, send, ctx, json.dumps(data).encode())

    async def _scoped(self, scope, receive, send, ctx: RequestCtx, body: bytes):
        path = ENDPOINT_PATHS[ctx.endpoint]
        state = scope.setdefault("state", {})  # shared with vLLM's Request.state (its request id lands there)
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in (b"content-length", b"content-type")]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        inner = dict(scope, path=path, raw_path=path.encode(), query_string=b"", headers=headers)
        gate = ResponseGate(send, ctx, self.eng, gated=self.eng.policy == "retire", model=self.model,
                            state=state, stats=self.stats, admit_bound=self.admit_bound)
        try:
            await self._call(inner, _replay(body, receive), gate, ctx)
        except Exception:  # noqa: BLE001
            if gate.mode != "error":  # not a refusal the gate already answered: let uvicorn report it
                raise
        finally:
            await release(self.eng, ctx)

    async def _call(self, scope, receive, send, ctx: RequestCtx):
        token = CURRENT.set(ctx)
        try:
            await self.app(scope, receive, send)
        finally:
            CURRENT.reset(token)

    async def _info(self, send, name: str, tenant: str):
        try:
            payload = json.dumps(scope_json(self.eng, name, tenant)).encode()
        except UnknownScope as e:
            self.stats["refused_404"] += 1
            return await errors.send(send, 404, errors.body(404, str(e), param="scope"))
        return await errors.send(send, 200, payload)

    async def _audit(self, send):
        """The facade's invariant report (`audit()`): 200 when clean, 500 with the violations otherwise."""
        from ..errors import AuditFailed

        try:
            rep, status = await self.eng.audit(), 200
        except AuditFailed as e:
            rep, status = e.report, 500
        return await errors.send(send, status, json.dumps(rep, default=str).encode())

    async def _read(self, receive) -> bytes | None:
        chunks, n = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                break
            b = msg.get("body", b"")
            n += len(b)
            if n > self.max_body_bytes:
                return None
            chunks.append(b)
            if not msg.get("more_body", False):
                break
        return b"".join(chunks)

    async def _too_large(self, send):
        self.stats["refused_413"] += 1
        return await errors.send(send, 413, errors.body(413, f"request body exceeds {self.max_body_bytes} bytes"))


def _header(headers, name: bytes) -> str | None:
    for k, v in headers:
        if k.lower() == name:
            return v.decode("latin-1")
    return None


def _replay(body: bytes, receive):
    sent = False

    async def r():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return r


async def _lifespan(receive, send):
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
