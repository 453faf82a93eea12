"""Build the server: the facade's engine, vLLM's FastAPI app on top of it, and the checks that the seams exist.

Invariant: the app is vLLM's (`build_app` + `init_app_state`, the same two calls vLLM's own server makes), with the
EngineClient replaced by `ScopedEngineClient`; startup fails with `SeamMissing` naming what is absent if the
installed vLLM lacks any seam used here.
"""
from __future__ import annotations

import dataclasses
import importlib

from ..errors import SeamMissing

VLLM_SEAMS = (
    ("vllm.entrypoints.launchers.app", "build_app"),
    ("vllm.entrypoints.launchers.api_server.app_state", "init_app_state"),
    ("vllm.entrypoints.launchers.cli_args", "make_arg_parser"),
    ("vllm.v1.metrics.prometheus", "get_prometheus_registry"),
    ("vllm.outputs", "RequestOutput"),
    ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol"),
)
ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health")
STATE = ("openai_serving_completion", "openai_serving_chat", "openai_serving_models")


def check_import_seams() -> None:
    for mod, attr in VLLM_SEAMS:
        try:
            ok = hasattr(importlib.import_module(mod), attr)
        except ImportError:
            ok = False
        if not ok:
            raise SeamMissing(f"retire serve needs {mod}.{attr} (vLLM 0.32's OpenAI server); the installed vLLM "
                              "lacks it")


def engine_kwargs(args) -> dict:
    """vLLM engine flags the user set (those differing from vLLM's defaults), plus the server's own defaults:
    a tokenizer (text and chat) and vLLM's stat loggers (for /metrics). Flags left at vLLM's default keep the
    facade's defaults (block size 32, eager mode, ...)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    ea = AsyncEngineArgs.from_cli_args(args)
    base = AsyncEngineArgs(model=ea.model)
    kw = {}
    for f in dataclasses.fields(ea):
        if f.name == "model":
            continue
        v = getattr(ea, f.name)
        try:
            same = v == getattr(base, f.name)
        except Exception:  # noqa: BLE001 - uncomparable values: treat as set
            same = False
        if not same:
            kw[f.name] = v
    kw.setdefault("skip_tokenizer_init", False)
    kw.setdefault("disable_log_stats", False)
    return kw


async def build_vllm_app(args, eng):
    """vLLM's app and state on the facade's engine; returns (app, engine client)."""
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app

    from .engine_client import ScopedEngineClient

    llm = eng.engine_client
    client = ScopedEngineClient(eng, llm)
    tasks = await llm.get_supported_tasks()
    if "generate" not in tasks:
        raise SeamMissing(f"the model serves {tasks}, not 'generate'")
    app = build_app(args, tasks, llm.model_config)
    await init_app_state(client, app.state, args, tasks)
    paths = {getattr(r, "path", None) for r in app.routes}
    for p in ROUTES:
        if p not in paths:
            raise SeamMissing(f"vLLM's app has no route {p}")
    for name in STATE:
        h = getattr(app.state, name, None)
        if h is None:
            raise SeamMissing(f"vLLM's app state has no {name}")
        if name != "openai_serving_models" and getattr(h, "engine_client", None) is not client:
            raise SeamMissing(f"vLLM's {name} does not call the EngineClient it was given (engine_client)")
    return app, client
