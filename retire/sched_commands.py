"""Out-of-band commands of RetireScheduler: queries, test barriers and test-only switches.

EngineCore resolves `call_utility("scheduler", cmd, payload)` to the scheduler object and calls it; `__call__`
dispatches to `_cmd_<cmd>(**payload)`. Invariant: queries never change scheduler state; the mutating commands are
test barriers (`arm`/`disarm`/`release`), run-time knobs (`set_step_tokens`) and negative-control switches
(`set_closure`, `set_gate`, `leak_block_for_test`), each documented where it is defined. Every command runs in the
engine thread between two steps.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler

from . import adapter
from .ledger import refcount_audit


class SchedulerCommands:
    def __call__(self, cmd: str, payload: dict | None = None) -> Any:
        payload = payload or {}
        fn = getattr(self, f"_cmd_{cmd}", None)
        if fn is None:
            raise ValueError(f"unknown retire scheduler command {cmd!r}")
        return fn(**payload)

    def _cmd_ping(self) -> dict:
        import os
        return {"pid": os.getpid(), "block_size": self.block_size, "chunk": self.retire_chunk,
                "num_blocks": adapter.pool(self).num_gpu_blocks, "groups": len(adapter.managers(self)),
                "group_block_sizes": [m.block_size for m in adapter.managers(self)]}

    def _cmd_result(self, key: str) -> dict | None:
        return self.retire_results.pop(key, None)

    def _cmd_closed_at(self, req_ids: list[str]) -> dict:
        return {r: self.retire_closed_at.get(r) for r in req_ids}

    def _cmd_block_table(self, req_id: str) -> list[list[int]]:
        return [[b.block_id for b in g] for g in adapter.group_blocks(self, req_id)]

    def _cmd_request_state(self, req_id: str) -> dict | None:
        r = self.requests.get(req_id)
        if r is None:
            return None
        sc = self.retire_spec.get(req_id, Counter())
        return {"num_computed_tokens": r.num_computed_tokens, "frontier": adapter.writer_frontier(r),
                "status": str(r.status), "num_tokens": r.num_tokens, "spec_token_ids": len(r.spec_token_ids or ()),
                "drafted": sc["drafted"], "accepted": sc["accepted"]}

    def _cmd_chunk_log(self, req_id: str) -> dict:
        """Exact-mode observability: the (start, tokens) of each prefill chunk the request was scheduled in, and
        the prefix length written in a cold run's chunk shape."""
        return {"chunks": [list(c) for c in self.retire_shape.log(req_id)],
                "exact_extent": self.retire_shape.extent(req_id), "chunk": self.retire_chunk}

    def _cmd_generations(self, block_ids: list[int]) -> list[int]:
        return list(self.retire_gens.of(block_ids))

    def _cmd_arm(self, scope: str, hook: dict) -> bool:
        self.retire_hooks[scope] = dict(hook)
        return True

    def _cmd_disarm(self, scope: str) -> bool:
        return self.retire_hooks.pop(scope, None) is not None

    def _cmd_release(self, scope: str) -> bool:
        req = self.retire_held.pop(scope, None)
        if req is None:
            return False
        del self.requests[req.request_id]
        Scheduler.add_request(self, req)  # vLLM's own admission: the SUPERSEDE already ran
        return True

    def _cmd_dram(self, op: str, **kw) -> dict:
        """DRAM-tier steps driven by the frontend: offloaded / alloc / install (retire/dram.py)."""
        return self.retire_dram.command(self, op, **kw)

    def _cmd_scope_epoch(self, scope: str) -> int | None:
        cur = self.retire_current.get(scope)
        return None if cur is None else cur[0]

    def _cmd_leak_block_for_test(self, block_id: int, undo: bool = False) -> int:
        """Negative controls only: take (or give back) one reference on a block without recording it anywhere,
        the leak the refcount audit must catch."""
        p = adapter.pool(self)
        blk = p.blocks[block_id]
        if undo:
            p.free_blocks([blk])
        else:
            p.touch([blk])
        return blk.ref_cnt

    def _cmd_set_step_tokens(self, tokens: int | None) -> int:
        """Bound the step size (the prefill unit) at run time: max_num_scheduled_tokens is read every step; it may
        only be lowered below max_num_batched_tokens (which sizes buffers and must not change)."""
        cap = int(self.vllm_config.scheduler_config.max_num_batched_tokens)
        self.max_num_scheduled_tokens = cap if tokens is None else max(1, min(int(tokens), cap))
        return self.max_num_scheduled_tokens

    def _cmd_set_closure(self, enabled: bool) -> bool:
        self.retire_closure_enabled = bool(enabled)
        return True

    def _cmd_set_gate(self, enabled: bool) -> bool:
        self.retire_gate_enabled = bool(enabled)
        return True

    def _cmd_stats(self) -> dict:
        p = adapter.pool(self)
        return dict(self.retire_counters, free_blocks=p.get_num_free_blocks(), num_blocks=p.num_gpu_blocks,
                    live_requests=len(self.requests), pins=len(self.retire_pins.pins))

    def _cmd_audit(self) -> dict:
        p = adapter.pool(self)
        self._prune()
        violations = refcount_audit(blocks=p.blocks, tables=adapter.all_tables(self),
                                    pins=self.retire_pins.counts(), null_block_id=p.null_block.block_id)
        if self.retire_pins.pins:
            violations.append(f"dangling pins: {sorted(self.retire_pins.pins)}")
        violations += self.retire_dram.audit(self)
        if self.retire_held:
            violations.append(f"successors still held at a test barrier: {sorted(self.retire_held)}")
        obsolete = [r for r in self.requests if not self._is_current(r)]
        if obsolete:
            violations.append(f"live obsolete executions: {obsolete}")
        if not self.requests and p.get_num_free_blocks() != p.num_gpu_blocks - 1:
            violations.append(f"drained but only {p.get_num_free_blocks()} of {p.num_gpu_blocks - 1} blocks free")
        return {"valid": not violations, "violations": violations, "live_requests": sorted(self.requests),
                "free_blocks": p.get_num_free_blocks(), "num_blocks": p.num_gpu_blocks}
