"""`retire serve`: vLLM's own OpenAI-compatible server with SUPERSEDE over HTTP.

The server is vLLM's FastAPI app (`build_app` + `init_app_state`: its routes, request models, renderer, chat
templates, sampling fields and SSE chunk format), extended at three seams and nowhere else:

- the EngineClient handed to vLLM's serving classes (`engine_client.ScopedEngineClient`): `generate()` routes a
  scoped request through the `RetireEngine` facade (`submit` / `supersede` / `stream_outputs`) and every other
  request to vLLM's own `AsyncLLM.generate`, always under the caller's tenant cache namespace;
- an ASGI layer in front of the app (`middleware.RetireASGI`): lifecycle (503 while starting or dead), tenants from
  bearer keys (`tenants`), the scope headers, the scope routes (`scopes`), and the response gate (`gate`) that writes
  no byte of a revoked version after its SUPERSEDE was accepted;
- vLLM's Prometheus registry (`metrics`): retire's counters next to vLLM's.

Identities are typed `(tenant, scope)` pairs passed to the facade as two arguments; nothing here joins them.
"""
