"""Errors in OpenAI's JSON shape: `{"error": {"message", "type", "param", "code"}}` (vLLM's `ErrorResponse`).

Invariant: every refusal the server produces is one of these bodies with the HTTP status in `code`, and is produced
before the facade changed anything (the facade's own rule: a call that raises changed nothing). A stale
`expected_epoch` (409) carries the scope's current epoch in `error.current_epoch`.
"""
from __future__ import annotations

import json

from ..errors import (EngineClosed, InvalidRequest, RetireError, ScopeExists, StaleEpoch, UnknownScope,
                      UnsupportedContract)

TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 409: "ConflictError",
         413: "RequestTooLargeError", 500: "InternalServerError", 503: "ServiceUnavailableError",
         504: "GatewayTimeoutError"}


def body(status: int, message: str, *, param: str | None = None, **extra) -> bytes:
    err = {"message": message, "type": TYPES.get(status, "Error"), "param": param, "code": status}
    err.update(extra)
    return json.dumps({"error": err}).encode()


def status_of(exc: BaseException) -> int:
    """HTTP status of a facade error (404 for another tenant's scope: the facade cannot tell it from an unknown one)."""
    if isinstance(exc, UnknownScope):
        return 404
    if isinstance(exc, (StaleEpoch, ScopeExists)):
        return 409
    if isinstance(exc, (InvalidRequest, UnsupportedContract)):
        return 400
    if isinstance(exc, EngineClosed):
        return 503
    if type(exc).__name__ == "EngineDeadError":
        return 503
    if isinstance(exc, RetireError):
        return 500
    return 500


async def send(send_fn, status: int, payload: bytes, headers: list | None = None) -> None:
    """Send a whole JSON response through ASGI `send_fn`."""
    hs = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send_fn({"type": "http.response.start", "status": status, "headers": hs + list(headers or [])})
    await send_fn({"type": "http.response.body", "body": payload, "more_body": False})
