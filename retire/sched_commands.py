"""Out-of-band commands of RetireScheduler: queries, test barriers and test seams.

EngineCore resolves `call_utility("scheduler", cmd, payload)` to the scheduler object and calls it; `__call__`
dispatches to `_cmd_<cmd>(**payload)`. Every command runs in the engine thread between two steps. Typed identities
arrive as msgpack arrays and are converted to `ScopeKey`/`VersionKey` here (a malformed one is refused with a
`msgspec.ValidationError`, changing nothing); results that are structs leave as msgpack bytes.

Invariant: queries never change scheduler state. The mutating commands are the barriers (`arm`/`disarm`/`release`),
the DRAM restore steps (`dram`), a run-time knob (`set_step_tokens`) and the test seams (`switches`,
`reset_switches`, `leak_block_for_test`), each documented where it is defined.
"""
from __future__ import annotations

import os
from typing import Any

import msgspec

from .types import ScopeKey, VersionKey, encode


def _scope(x) -> ScopeKey:
    return msgspec.convert(x, ScopeKey)


def _version(x) -> VersionKey:
    return msgspec.convert(x, VersionKey)


class SchedulerCommands:
    def __call__(self, cmd: str, payload: dict | None = None) -> Any:
        fn = getattr(self, f"_cmd_{cmd}", None)
        if fn is None:
            raise ValueError(f"unknown retire scheduler command {cmd!r}")
        return fn(**(payload or {}))

    # ------------------------------------------------------------------ queries
    def _cmd_ping(self) -> dict:
        p = self.retire_port
        return {"pid": os.getpid(), "block_size": p.block_size, "chunk": p.chunk, "num_blocks": p.num_blocks,
                "groups": len(p.group_block_sizes), "group_block_sizes": list(p.group_block_sizes)}

    def _cmd_result(self, key) -> bytes | None:
        res = self.retire.results.pop(_version(key), None)
        return None if res is None else encode(res)

    def _cmd_closed_at(self, req_ids: list[str]) -> dict:
        return {r: self.retire.closed_at.get(r) for r in req_ids}

    def _cmd_block_table(self, req_id: str) -> list[list[int]]:
        return self.retire_port.blocks(req_id)

    def _cmd_request_state(self, req_id: str) -> dict | None:
        st = self.retire_vllm.request_state(self, self.retire_port, req_id)
        if st is not None:
            d = self.retire.fence.drafts.get(req_id, {})
            st.update(drafted=d.get("drafted", 0), accepted=d.get("accepted", 0))
        return st

    def _cmd_chunk_log(self, req_id: str) -> dict:
        """Exact-mode observability: the (start, tokens) of each prefill chunk the request was scheduled in, and
        the prefix length written in a cold run's chunk shape."""
        sh = self.retire.shape
        return {"chunks": [list(c) for c in sh.log(req_id)], "exact_extent": sh.extent(req_id), "chunk": sh.chunk}

    def _cmd_generations(self, block_ids: list[int]) -> list[int]:
        return list(self.retire.gens.of(block_ids))

    def _cmd_scope_epoch(self, scope) -> int | None:
        return self.retire.versions.epoch(_scope(scope))

    def _cmd_slack(self) -> dict:
        """Revision slacks: per live request, the blocks it keeps and their KV bytes (block_bytes of its group)."""
        sl, p = self.retire.slack, self.retire_port
        out = {rid: {"blocks": sum(len(b) for b in k.blocks.values()),
                     "bytes": sum(len(b) * p.block_bytes[g] for g, b in k.blocks.items()), "frontier": k.frontier,
                     "tokens": k.cfg.tokens, "limited": k.limited} for rid, k in sl.kept.items()}
        return {"requests": out, "sliding_groups": list(sl.sliding), "block_bytes": list(p.block_bytes)}

    def _cmd_stats(self) -> dict:
        p, c = self.retire_port, self.retire
        return dict(c.counters, free_blocks=p.free_block_count(), num_blocks=p.num_blocks,
                    live_requests=len(p.request_ids()), pins=len(c.pins.pins), cut_steps=c.closure.cut_steps)

    def _cmd_audit(self) -> dict:
        return self.retire.audit()

    # ------------------------------------------------------------------ barriers and the DRAM restore
    def _cmd_arm(self, scope, hook: dict) -> bool:
        """One-shot hook for the scope's next SUPERSEDE: {"hold": True} (barrier), {"bump_generation": True,
        "index": i} (generation race), {"refuse": reason} (engine/frontend disagreement)."""
        self.retire.switches.arm(_scope(scope), hook)
        return True

    def _cmd_disarm(self, scope) -> bool:
        return self.retire.switches.disarm(_scope(scope))

    def _cmd_release(self, scope) -> bool:
        """Admit a successor held by the `hold` barrier (vLLM's own admission; the SUPERSEDE already ran)."""
        return self.retire.holds.release(_scope(scope))

    def _cmd_dram(self, op: str, key, **kw) -> dict:
        """DRAM-tier steps driven by the frontend: offloaded / alloc / install / cold_admit (retire/dram/)."""
        if op not in ("offloaded", "alloc", "install", "cold_admit"):
            raise ValueError(f"unknown DRAM command {op!r}")
        return getattr(self.retire.dram, op)(_version(key), **kw)

    def _cmd_set_step_tokens(self, tokens: int | None) -> int:
        """Bound the step size (the prefill unit) at run time: it may only be lowered below max_num_batched_tokens
        (which sizes buffers and must not change)."""
        p = self.retire_port
        p.set_step_tokens(p.chunk if tokens is None else max(1, min(int(tokens), p.chunk)))
        return p.step_tokens()

    # ------------------------------------------------------------------ test seams
    def _cmd_switches(self, **flags: bool) -> dict:
        """Negative controls: {"gate": False} turns gate (a) off, {"closure": False} skips writer closure."""
        s = self.retire.switches
        s.set(**flags)
        return {"gate": s.gate, "closure": s.closure}

    def _cmd_reset_switches(self) -> bool:
        self.retire.switches.reset()
        return True

    def _cmd_leak_block_for_test(self, block_id: int, undo: bool = False) -> int:
        """Negative controls only: take (or give back) one reference on a block without recording it anywhere,
        the leak the refcount audit must catch."""
        return self.retire_port.leak_for_test(int(block_id), bool(undo))
