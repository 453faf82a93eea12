"""RetireScheduler: vLLM's Scheduler with SUPERSEDE applied atomically in the engine thread.

Invariant: a SUPERSEDE rides on the successor's ADD (`SamplingParams.extra_args["retire"]["supersede"]`), so
ADVANCE -> FENCE -> ALIGN -> PIN -> RECLAIM -> RESUME run in one `add_request` call, between two engine steps.
No separate ABORT exists that could overtake it and free the shared blocks first. After ADVANCE the engine commits
no output of the old epoch (gate (a) in `update_from_output`, on top of the old request being finished).

This class stays thin: the rules live in `align`, `ledger` and `adapter`. Out-of-band queries and test switches
(`call_utility("scheduler", cmd, payload)`) live in `sched_commands.SchedulerCommands`.
"""
from __future__ import annotations

import time
from collections import Counter, OrderedDict
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from . import adapter
from .align import ChunkShape, alignment_unit, certify_length
from .ledger import GenerationTable, PinLedger
from .participants import fence_drafter, fence_ranks
from .sched_commands import SchedulerCommands

now = time.monotonic


class RetireScheduler(SchedulerCommands, Scheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        adapter.check(self)
        pool = adapter.pool(self)
        self.retire_gens = GenerationTable(pool.num_gpu_blocks)
        self.retire_gens.wrap(pool)
        self.retire_pins = PinLedger(pool)
        self.retire_meta: dict[str, dict] = {}          # internal request id -> retire metadata
        self.retire_current: dict[str, tuple[int, str]] = {}  # scope key -> (current epoch, internal request id)
        self.retire_results: OrderedDict[str, dict] = OrderedDict()
        self.retire_closed_at: OrderedDict[str, float] = OrderedDict()
        self.retire_counters: Counter = Counter()
        self.retire_hooks: dict[str, dict] = {}
        self.retire_gate_enabled = True
        self.retire_held: dict[str, Any] = {}
        self.retire_cut_log: OrderedDict[str, dict] = OrderedDict()
        from .dram import DramLedger
        self.retire_dram = DramLedger()  # DRAM-tier handoffs (retire/dram.py)
        from .mailbox import Mailbox
        self.retire_mailbox = Mailbox.from_env()
        self.retire_closure_enabled = True  # test-only switch: False skips writer closure after a cut (negative ctl)
        cfg = self.vllm_config
        self.retire_chunk = int(cfg.scheduler_config.max_num_batched_tokens)
        self.retire_shape = ChunkShape(self.retire_chunk)  # exact mode: which prefix was written in a cold shape
        self.retire_config_fp = {
            "model": str(cfg.model_config.model), "dtype": str(cfg.model_config.dtype),
            "block_size": int(self.block_size), "cache_dtype": str(cfg.cache_config.cache_dtype),
        }
        # Participants: every worker rank acknowledges every step it finished (retire/participants.py); the step
        # number rides on the SchedulerOutput. Speculative decoding: drafts proposed/verified per request.
        from .participants import RankLedger
        self.retire_world = int(cfg.parallel_config.world_size)
        self.retire_ranks = RankLedger.from_env() if self.retire_world > 1 else None
        self.retire_receipt_timeout = 1.0
        self.retire_step = 0
        self.retire_spec_enabled = cfg.speculative_config is not None
        self.retire_spec: dict[str, Counter] = {}

    # EngineCore's utility dispatch evaluates `getattr(engine, "scheduler") and ...`: never be falsy.
    def __bool__(self) -> bool:
        return True

    # ------------------------------------------------------------------ vLLM events
    def add_request(self, request) -> None:
        meta = _retire_meta(request)
        if meta is None:
            return super().add_request(request)
        if meta.get("supersede"):
            return self._supersede(request, meta)
        scope = meta["scope"]
        self.retire_meta[request.request_id] = meta
        self.retire_current[scope] = (int(meta["epoch"]), request.request_id)
        return super().add_request(request)

    def finish_requests(self, request_ids, finished_status):
        finished = super().finish_requests(request_ids, finished_status)
        t = now()
        for req in finished:
            if req.request_id in self.retire_meta:
                self._closed(req.request_id, t)
        return finished

    def schedule(self, *args, **kwargs):
        so = super().schedule(*args, **kwargs)
        self.retire_step += 1
        so.retire_step = self.retire_step  # pickled to every worker rank with the SchedulerOutput
        return so

    def _note_spec(self, so, mro) -> None:
        """Per request: draft tokens verified (`drafted`, -1 padding excluded) and accepted in committed steps."""
        spec = so.scheduled_spec_decode_tokens
        sampled = mro.sampled_token_ids
        for rid, drafts in spec.items():
            real = sum(1 for t in drafts if t >= 0)
            idx = mro.req_id_to_index.get(rid)
            if not real or idx is None or not sampled or rid not in self.requests:
                continue
            c = self.retire_spec.setdefault(rid, Counter())
            c["drafted"] += real
            c["accepted"] += max(len(sampled[idx]) - 1, 0)
            c["steps"] += 1

    def update_from_output(self, scheduler_output, model_runner_output):
        cut = getattr(model_runner_output, "retire_cut", None)
        if self.retire_spec_enabled and scheduler_output.scheduled_spec_decode_tokens:
            self._note_spec(scheduler_output, model_runner_output)
        shape = self.retire_shape
        chunks = [(rid, r.num_computed_tokens - n, n, r.num_prompt_tokens,
                   self._shape_tables(rid) if shape.needs_tables(rid, n) else None)
                  for rid, n in scheduler_output.num_scheduled_tokens.items() if (r := self.requests.get(rid))]
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if cut:
            self._close_writers(cut)
        for rid, start, n, plen, tables in chunks:
            if not (cut and cut["chunks"].get(rid, (0, 0))[1]):
                shape.observe(rid, start, n, plen, tables)
        if self.retire_gate_enabled:
            for eco in outputs.values():
                if eco.outputs:
                    kept = [o for o in eco.outputs if self._is_current(o.request_id)]
                    if len(kept) != len(eco.outputs):
                        self.retire_counters["engine_frames_suppressed"] += len(eco.outputs) - len(kept)
                        eco.outputs = kept
        if len(self.retire_meta) > len(self.requests):
            self._prune()
        return outputs

    def _shape_tables(self, rid: str) -> list:
        gen = self.retire_gens.gen
        return [(m.block_size, [(b.block_id, gen[b.block_id], b.is_null) for b in m.req_to_blocks.get(rid, ())])
                for m in adapter.managers(self)]

    def _close_writers(self, cut: dict) -> None:
        """Writer closure after a step cut short at a safe point: every cut request returns to the start of its
        chunk, and the chunk's blocks (hashed into the prefix cache at schedule time, only partly written) lose
        their hashes, so nothing can reach them through the prefix cache or ALIGN."""
        t = now()
        pool = adapter.pool(self)
        self.retire_counters["cut_steps"] += 1
        for rid, (start, n) in cut["chunks"].items():
            req = self.requests.get(rid)
            if req is None or not n:
                continue
            if self.retire_closure_enabled:
                req.num_computed_tokens = start
                evict = set()
                for m in adapter.managers(self):
                    table = m.req_to_blocks.get(rid, [])
                    lo, hi = start // m.block_size, -(-(start + n) // m.block_size)
                    evict.update(b.block_id for b in table[lo:hi] if not b.is_null)
                    if rid in m.num_cached_block:
                        m.num_cached_block[rid] = min(m.num_cached_block[rid], lo)
                pool.evict_blocks(evict)
            self.retire_cut_log[rid] = dict(cut.get("decision") or {}, closed_at=t, rolled_back_to=start)
            while len(self.retire_cut_log) > 1024:
                self.retire_cut_log.popitem(last=False)

    # ------------------------------------------------------------------ SUPERSEDE
    def _supersede(self, request, meta: dict) -> None:
        t0 = now()
        timings: dict[str, float] = {}
        scope, new_epoch, expected = meta["scope"], int(meta["epoch"]), int(meta["expected_epoch"])
        contract = meta.get("contract") or {}
        key = f"{scope}#{new_epoch}"
        res: dict[str, Any] = {"scope": scope, "epoch": new_epoch, "refused": None, "inherited_tokens": 0,
                               "certificate": None, "cold_reason": None, "receipts": [], "t_engine": t0}
        cur = self.retire_current.get(scope)
        if cur is not None and cur[0] != expected:
            res["refused"] = f"stale epoch: engine has {cur[0]}, SUPERSEDE expected {expected}"
            self.retire_counters["refused"] += 1
            self._store(key, res)
            return
        # ADVANCE: from here no output of the old epoch is committed (gate (a)).
        old_id = cur[1] if cur else None
        self.retire_meta[request.request_id] = meta
        self.retire_current[scope] = (new_epoch, request.request_id)
        t1 = now(); timings["advance"] = t1 - t0

        old = self.requests.get(old_id) if old_id else None
        if old is not None and self.retire_held.get(scope) is old:
            self.retire_held.pop(scope)  # the predecessor was still held at a barrier: fenced before it ever ran
        res["dram_stale"] = self.retire_dram.retire_stale(self, scope)  # a pending DRAM handoff of it is retired
        reason = None
        if old is None or old.is_finished():
            reason = "predecessor not live"
        # FENCE: between steps no forward pass is in flight (CPU, PP=1), so removing the old request from the
        # scheduler stops all launches; its receipt carries the writer frontier of every KV group.
        frontier = adapter.writer_frontier(old) if old is not None else 0
        mgrs = adapter.managers(self)
        path, detail = "step-boundary", {}
        if old_id in self.retire_cut_log:
            detail = self.retire_cut_log.pop(old_id)
            path = "safe-point"
        elif self.retire_mailbox is not None:
            log = self.retire_mailbox.read_log()
            if log and old_id in log.get("req_ids", ()):
                detail, path = log, log.get("path", "step-boundary")
        if self.retire_mailbox is not None and old_id:
            self.retire_mailbox.clear(old_id)
            self.retire_mailbox.clear_log()
        if self.retire_ranks is None:
            res["receipts"] = [{"participant": f"kv-group-{i}", "epoch": expected, "frontier": frontier,
                                "path": path, "detail": detail} for i in range(len(mgrs))]
        else:
            frontier, reason = fence_ranks(self, res, old, old_id, expected, frontier, path, detail, reason)
        if self.retire_spec_enabled:
            fence_drafter(self, res, old, old_id, expected, frontier, path)
        t2 = now(); timings["fence"] = t2 - t1

        # ALIGN
        per_group: list[list] = [[] for _ in mgrs]
        alignment = None
        n = 0
        if reason is None:
            reason = self._eligibility(old, request, meta, contract)
        if reason is None:
            unit = alignment_unit(self.block_size, contract.get("mode", "tolerant"), self.retire_chunk)
            exact_extent = self.retire_shape.extent(old_id)
            alignment = certify_length(old_tokens=old.all_token_ids, new_prompt=request.prompt_token_ids,
                                       frontier=frontier, align=unit)
            n = alignment.certified
            if contract.get("mode") == "exact" and n > exact_extent:
                # exact: only KV written in a cold run's chunk shape may be certified (see align.ChunkShape)
                n = exact_extent - exact_extent % unit
                if n == 0:
                    reason = (f"exact mode: no chunk-aligned prefix written in a cold run's shape "
                              f"(extent={exact_extent}, unit={unit})")
            quota = contract.get("pin_quota_blocks")
            if quota is not None:
                free = max(0, int(quota) - self.retire_pins.pinned(meta.get("tenant", "default")))
                per_block = sum(1 for _ in mgrs)
                max_blocks = free // max(per_block, 1)
                n = min(n, (max_blocks * self.block_size) // unit * unit)
                if n == 0 and reason is None and (alignment.certified > 0 or max_blocks == 0):
                    reason = f"pin quota: {quota} blocks, {free} free" + (
                        "" if alignment.certified else f" (nothing certifiable anyway: lcp={alignment.lcp}, "
                                                       f"frontier={frontier})")
            if n == 0 and reason is None:
                reason = (f"no shared prefix to certify (lcp={alignment.lcp}, frontier={frontier}, "
                          f"unit={unit})")
            if reason is None:
                old_tables = adapter.group_blocks(self, old_id)
                per_group = [t[: n // m.block_size] for t, m in zip(old_tables, mgrs)]
                # A sliding-window group keeps only the window ending at the certified length; blocks before it are
                # null placeholders (as in vLLM's own tables) and are neither certified nor pinned. Every block the
                # successor will attend to must be live.
                for g, m in zip(per_group, mgrs):
                    first = adapter.first_needed_block(m, n)
                    if any(b.is_null for b in g[first:]):
                        reason = (f"sliding window: blocks the successor attends to at {n} tokens were already "
                                  f"evicted by the predecessor")
                        per_group = [[] for _ in mgrs]
                        break
                if reason is None:  # blocks before the window may still be live in the old table: never certify them
                    null = adapter.pool(self).null_block
                    per_group = [[null] * f + g[f:] for g, m in zip(per_group, mgrs)
                                 for f in [adapter.first_needed_block(m, n)]]
            if reason is not None:
                per_group = [[] for _ in mgrs]
        flat = [b for g in per_group for b in g if not b.is_null]
        ids = [[b.block_id for b in g] for g in per_group]
        gens = [list(self.retire_gens.of(g)) for g in ids]
        t3 = now(); timings["align"] = t3 - t2

        # PIN (held from FENCE until adoption is verified)
        if flat:
            self.retire_pins.pin(key, meta.get("tenant", "default"), flat)
        hook = self.retire_hooks.pop(scope, None)
        if hook and hook.get("bump_generation") and flat:
            self.retire_gens.bump([flat[int(hook.get("index", 0)) % len(flat)].block_id])
        t4 = now(); timings["pin"] = t4 - t3

        # RESUME: re-validate generations, alias the certified blocks (the successor takes its own reference),
        # admit the successor, then release the handoff pin.
        n_inherit = 0
        dram_held = False
        if flat:
            if [list(self.retire_gens.of(g)) for g in ids] != gens:
                reason = "generation mismatch: a certified block was reallocated after ALIGN"
            elif contract.get("dram_tier"):
                # DRAM tier (retire/dram.py): the successor is held with an empty table; the handoff pin keeps the
                # sources until the frontend copied them out, then they are released and restored into fresh blocks.
                reason = self.retire_dram.hold(self, scope, key, request, per_group, n, meta)
                dram_held = reason is None
            else:
                adapter.install_blocks(self, request.request_id, per_group)
                adopted = adapter.group_blocks(self, request.request_id)
                assert all(a[: len(g)] == g for a, g in zip(adopted, per_group)), "adoption not verified"
                request.num_computed_tokens = n_inherit = n
        if n_inherit == 0:
            # Cold successor: no inherited state at all, not even by prefix-hash lookup; fresh blocks, fresh
            # generations.
            request.skip_reading_prefix_cache = True
            self.retire_counters["cold"] += 1
        else:
            self.retire_counters["inherited"] += 1
            self.retire_counters["inherited_tokens"] += n_inherit
        self.retire_shape.start(request.request_id, n_inherit, min(n_inherit, self.retire_shape.extent(old_id))
                                if old_id else 0)
        if (hook and hook.get("hold")) or dram_held:
            # Test barrier (step-by-step driving): the successor is admitted with its block table installed but
            # not scheduled until `release`, so a test can act between ALIGN and the successor's first step.
            self.requests[request.request_id] = request
            self.retire_held[scope] = request
        else:
            super().add_request(request)
        if flat and not dram_held:
            self.retire_pins.release(key)
        t5 = now(); timings["resume"] = t5 - t4

        # RECLAIM the predecessor, after the successor is admitted: old-only blocks return to the pool (certified
        # ones live on in the successor's table). Between steps no writer of the old epoch is running.
        if old is not None and not old.is_finished():
            self.finish_requests(old_id, RequestStatus.FINISHED_ABORTED)
        t6 = now(); timings["reclaim"] = t6 - t5
        timings["engine_total"] = t6 - t0

        res["cold_reason"] = None if n_inherit else reason
        res["inherited_tokens"] = n_inherit
        res["timings"] = timings
        res["fence_closed_at"] = t2
        if dram_held:
            res["dram"] = self.retire_dram.result(scope, bool(hook and hook.get("hold")))
        if n_inherit or dram_held:
            res["certificate"] = {
                "scope": scope, "tenant": meta.get("tenant", "default"), "from_epoch": expected,
                "to_epoch": new_epoch, "tokens": n_inherit or n, "lcp": alignment.lcp, "frontier": frontier,
                "block_ids": ids, "generations": gens, "fingerprint": self._fingerprint(request),
                "mode": contract.get("mode", "tolerant"), "digests": None}
        self.retire_counters["supersedes"] += 1
        self._store(key, res)

    def _eligibility(self, old, new, meta: dict, contract: dict) -> str | None:
        if not contract.get("inherit", True):
            return "contract forbids inheritance"
        old_meta = self.retire_meta.get(old.request_id, {})
        if old_meta.get("tenant", "default") != meta.get("tenant", "default"):
            return f"tenant mismatch: {old_meta.get('tenant')!r} != {meta.get('tenant')!r}"
        a, b = self._fingerprint_fields(old), self._fingerprint_fields(new)
        for k in a:
            if a[k] != b[k]:
                return f"config mismatch: {k} ({a[k]!r} != {b[k]!r})"
        return None

    def _fingerprint_fields(self, req) -> dict:
        lora = getattr(req, "lora_request", None)
        return dict(self.retire_config_fp, lora=getattr(lora, "lora_name", None),
                    cache_salt=getattr(req, "cache_salt", None))

    def _fingerprint(self, req) -> str:
        return "|".join(f"{k}={v}" for k, v in sorted(self._fingerprint_fields(req).items()))

    # ------------------------------------------------------------------ bookkeeping
    def _is_current(self, req_id: str) -> bool:
        meta = self.retire_meta.get(req_id)
        if meta is None:
            return True
        cur = self.retire_current.get(meta["scope"])
        return cur is None or cur[1] == req_id

    def _closed(self, req_id: str, t: float) -> None:
        self.retire_closed_at[req_id] = t
        while len(self.retire_closed_at) > 4096:
            self.retire_closed_at.popitem(last=False)

    def _store(self, key: str, res: dict) -> None:
        self.retire_results[key] = res
        while len(self.retire_results) > 4096:
            self.retire_results.popitem(last=False)

    def _prune(self) -> None:
        for rid in [r for r in self.retire_meta if r not in self.requests]:
            self.retire_meta.pop(rid)
        for rid in [r for r in self.retire_shape.exact if r not in self.requests]:
            self.retire_shape.forget(rid)
        for rid in [r for r in self.retire_spec if r not in self.requests]:
            self.retire_spec.pop(rid)


def _retire_meta(request) -> dict | None:
    sp = getattr(request, "sampling_params", None)
    extra = getattr(sp, "extra_args", None) if sp is not None else None
    return extra.get("retire") if extra else None
