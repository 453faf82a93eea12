"""Participant receipts across tensor-parallel ranks: one shared-memory slot per worker rank.

Invariants:
- After every step it executed, rank r writes its slot: the engine step number (stamped on the SchedulerOutput by
  RetireScheduler) and, for every request it holds, the tokens whose KV it has written on that rank (its writer
  frontier; a step cut at a safe point counts only up to the chunk start). Slots are seqlocked: a reader never uses
  a torn write.
- FENCE (retire/fence.py, in the engine thread, between steps) accepts rank r's receipt only if r's slot names the last step the
  scheduler launched: the rank has finished every step launched before the FENCE, and none is launched for the old
  epoch afterwards (the old request leaves the scheduler in the same call). A rank whose slot is still stale after a
  bounded wait has sent no receipt.
- The transition is certified only with the full participant set (every rank x every KV group). A missing receipt
  makes ALIGN select a cold successor that names the missing ranks; the frontier ALIGN uses is the minimum over the
  scheduler's own and every rank's.
"""
from __future__ import annotations

import json
import struct
import time

from .shm import SharedFile, create_file

ENV = "RETIRE_RANKS"
MAX_RANKS = 8
SLOT = 8192                    # seq (u64) | step (i64) | length (u32) | JSON {req_id: frontier}
HDR = struct.Struct("<QqI")
SIZE = MAX_RANKS * SLOT


def create_path() -> str:
    return create_file("retire-ranks", SIZE)


class RankLedger(SharedFile):
    SIZE, ENV = SIZE, ENV

    def write(self, rank: int, step: int, frontiers: dict[str, int]) -> None:
        if not 0 <= rank < MAX_RANKS:
            raise ValueError(f"rank {rank} outside [0, {MAX_RANKS})")
        blob = json.dumps(frontiers, separators=(",", ":")).encode()
        if len(blob) > SLOT - HDR.size:
            # keep the newest entries that fit (the scheduler asks only about live requests)
            items = list(frontiers.items())
            while items and len(blob) > SLOT - HDR.size:
                items = items[len(items) // 2:]
                blob = json.dumps(dict(items), separators=(",", ":")).encode()
        off = rank * SLOT
        seq = struct.unpack_from("<Q", self.mm, off)[0]
        struct.pack_into("<Q", self.mm, off, seq + 1)          # odd: write in progress
        self.mm[off + HDR.size: off + HDR.size + len(blob)] = blob
        struct.pack_into("<qI", self.mm, off + 8, int(step), len(blob))
        struct.pack_into("<Q", self.mm, off, seq + 2)          # even: stable

    def read(self, rank: int) -> tuple[int, dict[str, int]] | None:
        off = rank * SLOT
        for _ in range(100):
            s1, step, n = HDR.unpack_from(self.mm, off)
            if s1 == 0:
                return None
            if s1 % 2:
                continue
            blob = bytes(self.mm[off + HDR.size: off + HDR.size + n])
            if struct.unpack_from("<Q", self.mm, off)[0] == s1:
                return step, json.loads(blob) if n else {}
        return None

    def collect(self, world: int, step: int, timeout: float) -> dict[int, dict[str, int]]:
        """Receipts of every rank whose slot reaches `step` within `timeout` seconds: {rank: frontiers}."""
        got: dict[int, dict[str, int]] = {}
        t0 = time.monotonic()
        while True:
            for r in range(world):
                if r not in got:
                    rec = self.read(r)
                    if rec is not None and rec[0] >= step:
                        got[r] = rec[1]
            if len(got) == world or time.monotonic() - t0 > timeout:
                return got
            time.sleep(0.0002)  # a peer process's acknowledgement, bounded by `timeout`


class RankRecorder:
    """Worker side: after each step (inside the one step wrapper, retire/worker_step.py), writes this rank's slot.
    `dropped` is the test seam of the DropRankReceipt fault (the rank keeps computing but acknowledges nothing)."""

    def __init__(self, worker, ledger: RankLedger):
        from . import adapter

        self.wk = adapter.worker()
        self.ledger = ledger
        self.rank = self.wk.rank(worker)
        self.frontiers: dict[str, int] = {}
        self.dropped = False

    def before(self, so) -> None:
        for rid in self.wk.finished_ids(so):
            self.frontiers.pop(rid, None)

    def after(self, so, out) -> None:
        cut = self.wk.is_cut(out)
        for rid, (start, n) in self.wk.chunks_of(so).items():
            self.frontiers[rid] = start if cut else start + n
        step = self.wk.step_number(so)
        if step is not None and not self.dropped:
            self.ledger.write(self.rank, int(step), self.frontiers)
