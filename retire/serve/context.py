"""The per-request context shared by the ASGI layer and the engine client (one object per HTTP request).

Invariant: a context is created by the ASGI layer after authentication, so `tenant` always comes from the caller's
credentials; the engine client reads it through a contextvar (vLLM's handlers run in tasks that copy the context) and
records what the facade call did (`task`, `epoch`, `revoked_end`) for the response gate to act on.
"""
from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass, field
from typing import Any

CURRENT: contextvars.ContextVar["RequestCtx | None"] = contextvars.ContextVar("retire_serve_request", default=None)


@dataclass
class RequestCtx:
    tenant: str
    scope: str | None = None          # None: an unscoped request (vLLM's own path)
    kind: str = "plain"               # "plain" | "start" | "supersede"
    endpoint: str = ""                # "chat" | "completion" (scoped requests)
    expected_epoch: int | None = None
    contract: Any = None              # retire.Contract for a SUPERSEDE
    task: asyncio.Future | None = None  # the facade call (submit -> int, supersede -> Transition)
    epoch: int | None = None
    revoked_end: bool = False         # the version's stream ended revoked (seen by the engine client)
    consumed: bool = False            # the version's stream was read to its end (finished or revoked)
    gen: Any = None                   # the async generator handed to vLLM (closed by the ASGI layer)
    generate_calls: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def scoped(self) -> bool:
        return self.scope is not None


def current() -> RequestCtx | None:
    return CURRENT.get()
