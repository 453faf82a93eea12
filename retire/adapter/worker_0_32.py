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


# ---------------------------------------------------------------------- attention slicing (retire/slicing.py)
# The CPU attention kernel (CPU_ATTN, `cpu_attention_with_kv_cache`) runs the work items of a scheduler-metadata tensor
# built once per step by `cpu_attn_get_scheduler_metadata`: a C++ `AttentionMetadata` header (HDR bytes), then
# `AttentionWorkItemGroup`s (ITEM bytes each: req_id, q_token_id_start, q_token_num, kv_split_pos_start,
# kv_split_pos_end, total_kv_len, split_id, local_split_id), then `ReductionWorkItemGroup`s (RED bytes). A work item's
# rows are processed in q tiles of a fixed row count starting at its first row, so cutting an item at a multiple of
# that tile count and running the pieces as separate kernel calls changes no tile: every row's arithmetic is the
# unsplit step's. The layout is checked at install time (`metadata_layout_ok`) and the split's bit-identity by
# `slicing.selfcheck`; either failing keeps the layer-boundary safe points.
HDR, ITEM, RED = 4288, 40, 20
_OFF = {"n_items": 68, "n_red": 72, "n_split": 76, "threads": 80, "eff": 84, "items_ptr": 112, "red_ptr": 120,
        "cu": 128}


def attention_modules(layer) -> list:
    """The attention modules (vLLM `Attention`, CPU_ATTN impl) inside one decoder layer, in module order."""
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    return [m for m in layer.modules() if isinstance(m, Attention) and isinstance(m.impl, CPUAttentionBackendImpl)]


def mlp_module(layer):
    return getattr(layer, "mlp", None)


def hidden_size(worker) -> int:
    """The width of the decoder's residual stream (the MLP's input rows)."""
    return int(runner(worker).model_config.get_hidden_size())


def wrap_forward(module, fn: Callable[..., Any]) -> Callable[[], None]:
    """Route `module(x, ...)` through `fn(orig, x, ...)` (an instance `forward`, which torch's `Module.__call__`
    reads); returns the undo."""
    orig = module.forward

    def forward(*args, **kwargs):
        return fn(orig, *args, **kwargs)

    module.forward = forward
    return lambda: module.__dict__.pop("forward", None)


def wrap_attention(attn, fn: Callable[..., Any]) -> Callable[[], None]:
    """Route `attn.impl.forward(layer, q, k, v, kv_cache, md, output=...)` through `fn(orig, ...)` (instance attribute,
    vLLM calls `self.impl.forward`); returns the undo."""
    return wrap_forward(attn.impl, fn)


def observe_logits(worker, fn: Callable[[Any], None]) -> Callable[[], None]:
    """Call `fn(logits)` on every logits tensor the model computes (observation only; test probe); returns the undo."""
    model = runner(worker).model
    orig = model.compute_logits

    def compute_logits(*args, **kwargs):
        out = orig(*args, **kwargs)
        fn(out)
        return out

    model.compute_logits = compute_logits
    return lambda: model.__dict__.pop("compute_logits", None)


def kernel_isa(dtype, block_size: int, head_dim: int, kv_cache_dtype: str = "auto") -> str:
    """The CPU_ATTN ISA vLLM selects for this shape on this machine (the metadata builder's own choice)."""
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
    return _get_attn_isa(dtype, block_size, head_dim, kv_cache_dtype)


def prepare_isa(isa: str) -> str | None:
    """Make the kernel of `isa` runnable in this process: "amx" needs the AMX tile state, which Linux grants per
    process on request (torch's `_init_amx`; the engine's first oneDNN AMX matmul asks for it too, but the slicer's
    install-time self-check may run the attention kernel before any matmul). Returns None, or why it cannot run."""
    if isa != "amx":
        return None
    import torch

    init = getattr(getattr(torch._C, "_cpu", None), "_init_amx", None)
    if init is None:
        return "torch._C._cpu._init_amx is missing: the AMX tile state cannot be requested"
    return None if init() else "the AMX tile state was refused (arch_prctl ARCH_REQ_XCOMP_PERM)"


def kernel_info(attn) -> dict:
    """What decides the kernel's q-tile size: ISA, dtype, head dim, heads, KV-cache dtype, split-KV."""
    from vllm import envs

    impl = attn.impl
    return {"isa": getattr(attn, "isa", None), "head_dim": int(impl.head_size), "num_heads": int(impl.num_heads),
            "num_kv_heads": int(impl.num_kv_heads), "kv_cache_dtype": str(impl.kv_cache_dtype),
            "sliding_window": int(impl.sliding_window), "split_kv": bool(envs.VLLM_CPU_ATTN_SPLIT_KV)}


def sliceable(md) -> bool:
    """Only causal decoder attention over the paged cache with a scheduler-metadata tensor is sliced."""
    return (md is not None and getattr(md, "scheduler_metadata", None) is not None and md.causal is True
            and getattr(md, "dynamic_causal", None) is None and not getattr(md, "use_sdpa_prefill", False)
            and getattr(md, "encoder_cache", None) is None)


def with_schedule(md, sched):
    """A copy of the step's attention metadata that runs the work items of `sched` only."""
    import dataclasses
    return dataclasses.replace(md, scheduler_metadata=sched)


def parse_schedule(t) -> dict:
    """Decode a scheduler-metadata tensor: per thread, its work items [req, q_start, q_num, kv_lo, kv_hi, kv_len,
    split_id, local_split_id]; reductions as raw bytes."""
    import numpy as np

    b = t.numpy().tobytes()
    i32 = lambda off, n=1: np.frombuffer(b, dtype=np.int32, count=n, offset=off)
    n, nred, nsplit, threads, eff = (int(x) for x in i32(_OFF["n_items"], 5))
    cu = [int(x) for x in i32(_OFF["cu"], threads + 1)]
    items = []
    for k in range(n):
        o = HDR + k * ITEM
        r, qs, qn, lo, hi = (int(x) for x in i32(o, 5))
        kvl = int(np.frombuffer(b, dtype=np.int64, count=1, offset=o + 24)[0])
        sid, lsid = (int(x) for x in i32(o + 32, 2))
        items.append([r, qs, qn, lo, hi, kvl, sid, lsid])
    return {"header": b[:HDR], "items": items, "cu": cu, "threads": threads, "eff": eff, "n_split": nsplit,
            "reductions": b[HDR + n * ITEM: HDR + n * ITEM + nred * RED], "n_red": nred, "size": len(b)}


def build_schedule(parsed: dict, per_thread: list[list[list[int]]], with_reductions: bool):
    """A scheduler-metadata tensor that runs `per_thread` (lists of work items, non-empty threads first) and, if
    `with_reductions`, the step's split-KV reductions; everything else is the step's own header."""
    import numpy as np
    import torch

    lists = [x for x in per_thread if x] or [[]]
    items = [it for x in lists for it in x]
    red = parsed["reductions"] if with_reductions else b""
    nred = parsed["n_red"] if with_reductions else 0
    size = HDR + len(items) * ITEM + len(red)
    t = torch.zeros(size, dtype=torch.int8)
    buf = t.numpy()
    buf[:HDR] = np.frombuffer(parsed["header"], dtype=np.int8)
    base = t.data_ptr()
    hdr = buf.view(np.uint8)
    hdr[:8] = 0  # the kernel's task counter
    _put(buf, _OFF["n_items"], np.int32, [len(items), nred, parsed["n_split"] if with_reductions else 0])
    cu = np.zeros(parsed["threads"] + 1, dtype=np.int32)
    counts = [len(x) for x in lists if x]
    cu[1:1 + len(counts)] = np.cumsum(counts)
    cu[1 + len(counts):] = cu[len(counts)]
    _put(buf, _OFF["cu"], np.int32, cu)
    _put(buf, _OFF["eff"], np.int32, [len(counts)])
    _put(buf, _OFF["items_ptr"], np.int64, [base + HDR])
    _put(buf, _OFF["red_ptr"], np.int64, [base + HDR + len(items) * ITEM])
    for k, (r, qs, qn, lo, hi, kvl, sid, lsid) in enumerate(items):
        o = HDR + k * ITEM
        _put(buf, o, np.int32, [r, qs, qn, lo, hi])
        _put(buf, o + 24, np.int64, [kvl])
        _put(buf, o + 32, np.int32, [sid, lsid])
    if red:
        buf[HDR + len(items) * ITEM:] = np.frombuffer(red, dtype=np.int8)
    return t


def _put(buf, off: int, dtype, values) -> None:
    import numpy as np
    a = np.asarray(values, dtype=dtype)
    buf[off: off + a.nbytes] = a.view(np.int8)


def reset_schedule(t) -> None:
    """Zero the kernel's task counter before a (re)run of a built schedule."""
    t.numpy()[:8] = 0


def run_kernel(query, key_cache, value_cache, output, qsl, seq_lens, block_table, scale: float, sched) -> None:
    """The CPU attention kernel on explicit tensors (the self-check's reference and sliced runs)."""
    from vllm import _custom_ops as ops

    ops.cpu_attention_with_kv_cache(query=query, key_cache=key_cache, value_cache=value_cache, output=output,
                                    query_start_loc=qsl, seq_lens=seq_lens, scale=scale, causal=True,
                                    alibi_slopes=None, sliding_window=-1, block_table=block_table, softcap=0,
                                    scheduler_metadata=sched, s_aux=None)


def schedule_for(qsl, seq_lens, info: dict, dtype):
    from vllm import _custom_ops as ops

    return ops.cpu_attn_get_scheduler_metadata(
        num_reqs=len(seq_lens), num_heads=info["num_heads"], num_kv_heads=info["num_kv_heads"],
        head_dim=info["head_dim"], seq_lens=seq_lens, dtype=dtype, query_start_loc=qsl, causal=True,
        sliding_window_size=info["sliding_window"], isa=info["isa"], enable_kv_split=info["split_kv"],
        kv_cache_dtype=info["kv_cache_dtype"])


def metadata_layout_ok(info: dict, dtype, threads: int) -> str | None:
    """Check the decoded layout on a known input (one 1024-row causal request): the work items tile its rows exactly
    once and the sizes add up. Returns None, or what does not match."""
    import torch

    n = 1024
    t = schedule_for(torch.tensor([0, n], dtype=torch.int32), torch.tensor([n], dtype=torch.int32), info, dtype)
    try:
        p = parse_schedule(t)
    except Exception as e:  # noqa: BLE001 (an unknown layout can fail to decode in many ways)
        return f"metadata does not decode: {e!r}"
    if p["threads"] != threads:
        return f"metadata thread count {p['threads']} != {threads}"
    if p["size"] != HDR + len(p["items"]) * ITEM + p["n_red"] * RED:
        return f"metadata size {p['size']} does not match {len(p['items'])} items + {p['n_red']} reductions"
    rows = sorted((it[1], it[1] + it[2]) for it in p["items"])
    if not rows or rows[0][0] != 0 or rows[-1][1] != n or any(a[1] != b[0] for a, b in zip(rows, rows[1:])):
        return f"work items do not tile the rows: {rows}"
    if p["cu"][-1] != len(p["items"]):
        return f"per-thread item counts {p['cu']} do not add up to {len(p['items'])}"
    return None
