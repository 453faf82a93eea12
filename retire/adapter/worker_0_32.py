"""The worker's internals on vLLM 0.32 (worker process): the model runner's step entry point, its KV tensors, its
decoder layers, and the shape of a step's input and output.

Invariant: retire installs exactly one wrapper around `model_runner.execute_model` per worker (`wrap_step`); every
worker-side participant (safe points, rank receipts) runs inside it in a fixed order.
"""
from __future__ import annotations

from typing import Any, Callable


def runner(worker):
    r = getattr(worker, "model_runner", None)
    if r is None:
        raise RuntimeError("worker has no model_runner (not initialised?)")
    return r


def kv_caches(worker) -> list:
    kvs = getattr(runner(worker), "kv_caches", None)
    if not kvs:
        raise RuntimeError("worker has no kv_caches (model runner not initialised?)")
    return kvs


def decoder_layers(worker) -> list:
    model = runner(worker).model
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None) if inner is not None else None
    if layers is None:
        layers = getattr(model, "layers", None)
    if layers is None:
        raise RuntimeError(f"cannot find decoder layers on {type(model).__name__}")
    return list(layers)


def eager(worker) -> bool:
    """True when the model runs eagerly (per-layer hooks fire reliably); compiled graphs do not."""
    mode = getattr(worker.vllm_config.compilation_config, "mode", None)
    return mode in (0, None) or str(mode).split(".")[-1] in ("NONE", "0")


def rank(worker) -> int:
    return int(getattr(worker, "rank", 0))


def world_size(worker) -> int:
    return int(getattr(getattr(worker, "parallel_config", None), "world_size", 1) or 1)


def wrap_step(worker, step: Callable[..., Any]) -> None:
    """Replace the runner's execute_model by `step(orig, scheduler_output, *args, **kwargs)`."""
    r = runner(worker)
    orig = r.execute_model

    def execute_model(scheduler_output, *args, **kwargs):
        return step(orig, scheduler_output, *args, **kwargs)

    r.execute_model = execute_model


def chunks_of(so) -> dict[str, tuple[int, int]]:
    """req_id -> (tokens computed before this step, tokens scheduled in this step)."""
    n = so.num_scheduled_tokens
    out = {}
    for r in so.scheduled_new_reqs:
        out[r.req_id] = (int(r.num_computed_tokens), int(n.get(r.req_id, 0)))
    c = so.scheduled_cached_reqs
    for rid, done in zip(c.req_ids, c.num_computed_tokens):
        out[rid] = (int(done), int(n.get(rid, 0)))
    return out


def total_tokens(so) -> int:
    return int(so.total_num_scheduled_tokens)


def finished_ids(so) -> tuple[str, ...]:
    return tuple(getattr(so, "finished_req_ids", ()) or ())


def step_number(so) -> int | None:
    """The engine step number RetireScheduler stamps on every SchedulerOutput (pickled to every rank)."""
    return getattr(so, "retire_step", None)


def cut_output(so, cut: dict):
    """A ModelRunnerOutput for a step cut at a safe point: every scheduled request, no sampled token, plus the cut
    (it survives the worker -> engine pickle; the scheduler closes the writers when it commits this output)."""
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(so.num_scheduled_tokens)
    out = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                            sampled_token_ids=[[] for _ in req_ids])
    out.retire_cut = cut
    return out


def is_cut(out) -> bool:
    return getattr(out, "retire_cut", None) is not None
