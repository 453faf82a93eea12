"""SHIMS: what `retire serve` needs from the facade that its public API does not offer yet (see docs/serve.md).

Each function names the facade method it stands in for. They reach into `RetireEngine.backend`, which is not public
API; delete each one when the facade grows the method.

- `engine_client(eng)` -> wanted: `RetireEngine.engine_client` (property): the vLLM `EngineClient` (AsyncLLM) the
  facade runs on. vLLM's OpenAI serving classes need it for the model config, renderer, tokenizer, health, metrics,
  and unscoped requests.
- `abort_version(eng, scope, epoch, tenant)` -> wanted: `await RetireEngine.cancel(scope, epoch=None,
  tenant="default")`: end a live, *current* version as vLLM ends a request whose client went away (an ABORT; the
  scope keeps its epoch; refused with StaleEpoch if `epoch` is no longer current, so it can never overtake a
  SUPERSEDE). Without it a disconnected client's version runs to `max_tokens`.
"""
from __future__ import annotations


def engine_client(eng):
    return eng.backend.llm


async def abort_version(eng, scope: str, epoch: int, tenant: str) -> bool:
    """Abort (tenant, scope) at `epoch` if it is still the current epoch. Returns whether an ABORT was sent."""
    if eng.closed or eng.current_epoch(scope, tenant) != epoch:
        return False
    await eng.backend.abort(eng.internal_id(scope, epoch, tenant))
    return True
