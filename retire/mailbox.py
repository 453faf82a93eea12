"""The revocation mailbox: a small shared-memory table the frontend, EngineCore and the worker all map.

Invariants:
- The frontend writes a revoked (internal request id, LCP with the revised prompt) entry BEFORE it sends the
  SUPERSEDE, so a step already running in the worker can see the revocation at its next safe point, without waiting
  for the engine loop (which is blocked on that very step).
- Only the scheduler clears an entry, after it has processed the step that saw it (a cut or a finished step) and
  applied the transition; so a revoked id is visible for as long as any step of it may run.
- Entries are fixed-size slots; a slot is live when its first byte is non-zero. Readers tolerate torn reads by
  re-reading the slot's sequence number (seqlock per slot).
- A control word can hold the worker at a given layer of the next armed step (test barrier for landing a revision
  at an exact point inside a step; step-by-step driving, not a sleep in the test).
"""
from __future__ import annotations

import struct
import time

from .shm import SharedFile, create_file

SLOTS = 64
ID_BYTES = 96
SLOT = 8 + 8 + ID_BYTES          # seq (u64), lcp (i64), id
HDR = 64                         # control: pause_layer (i64), paused (i64), release (i64), cuts (i64), checks (i64)
LOG = 1024                       # last safe-point decision, JSON, length-prefixed
SIZE = HDR + SLOTS * SLOT + LOG
ENV = "RETIRE_MAILBOX"


def create_path() -> str:
    return create_file("retire-mailbox", SIZE)


class Mailbox(SharedFile):
    SIZE, ENV = SIZE, ENV

    # -- header words
    def _get(self, i: int) -> int:
        return struct.unpack_from("<q", self.mm, 8 * i)[0]

    def _set(self, i: int, v: int) -> None:
        struct.pack_into("<q", self.mm, 8 * i, v)

    # -- entries
    def _slot(self, k: int) -> int:
        return HDR + k * SLOT

    def post(self, req_id: str, lcp: int, new_len: int) -> None:
        """Revoke `req_id`: its tokens agree with the successor's prompt up to `lcp`; the successor has `new_len`."""
        raw = req_id.encode()[:ID_BYTES]
        for k in range(SLOTS):
            off = self._slot(k)
            if self.mm[off + 16] == 0:
                seq = struct.unpack_from("<Q", self.mm, off)[0]
                struct.pack_into("<Q", self.mm, off, seq + 1)          # odd: writing
                struct.pack_into("<q", self.mm, off + 8, (int(lcp) << 32) | int(new_len))
                self.mm[off + 16: off + 16 + ID_BYTES] = raw.ljust(ID_BYTES, b"\0")
                struct.pack_into("<Q", self.mm, off, seq + 2)          # even: stable
                return
        raise RuntimeError("revocation mailbox full")

    def clear(self, req_id: str) -> bool:
        raw = req_id.encode()[:ID_BYTES].ljust(ID_BYTES, b"\0")
        for k in range(SLOTS):
            off = self._slot(k)
            if self.mm[off + 16: off + 16 + ID_BYTES] == raw:
                seq = struct.unpack_from("<Q", self.mm, off)[0]
                struct.pack_into("<Q", self.mm, off, seq + 1)
                self.mm[off + 16: off + 16 + ID_BYTES] = b"\0" * ID_BYTES
                struct.pack_into("<Q", self.mm, off, seq + 2)
                return True
        return False

    def revoked(self) -> dict[str, tuple[int, int]]:
        """Live entries: internal request id -> (LCP with the revised prompt, revised prompt length)."""
        out = {}
        mm = self.mm
        for k in range(SLOTS):
            off = HDR + k * SLOT
            if mm[off + 16] == 0:
                continue
            for _ in range(3):
                s1 = struct.unpack_from("<Q", mm, off)[0]
                lcp = struct.unpack_from("<q", mm, off + 8)[0]
                raw = bytes(mm[off + 16: off + 16 + ID_BYTES])
                if s1 % 2 == 0 and struct.unpack_from("<Q", mm, off)[0] == s1:
                    if raw[0]:
                        out[raw.rstrip(b"\0").decode()] = (lcp >> 32, lcp & 0xFFFFFFFF)
                    break
        return out

    def any_live(self) -> bool:
        mm = self.mm
        return any(mm[HDR + k * SLOT + 16] for k in range(SLOTS))

    # -- test barrier: hold the worker at layer L of the next armed step
    def arm_pause(self, layer: int) -> None:
        self._set(2, 0)
        self._set(1, 0)
        self._set(0, layer + 1)

    def paused(self) -> bool:
        return self._get(1) == 1

    def release(self) -> None:
        self._set(0, 0)
        self._set(2, 1)

    async def wait_paused(self, timeout: float = 120.0) -> None:
        """Barrier for the frontend: returns once the worker is held at the armed layer."""
        import asyncio
        t0 = time.monotonic()
        while not self.paused():
            if time.monotonic() - t0 > timeout:
                raise TimeoutError("worker never reached the armed safe point")
            await asyncio.sleep(0.001)  # polling a shared word; the barrier is the worker's state, not time

    def worker_pause_point(self, layer: int) -> None:
        """Called by the worker at each safe point: blocks here while a pause is armed for this layer."""
        if self._get(0) != layer + 1:
            return
        self._set(0, 0)
        self._set(1, 1)
        while self._get(2) == 0:
            time.sleep(0.0005)
        self._set(1, 0)
        self._set(2, 0)

    def count(self, what: str) -> int:
        return self._get({"cuts": 3, "checks": 4}[what])

    def bump(self, what: str, n: int = 1) -> None:
        i = {"cuts": 3, "checks": 4}[what]
        self._set(i, self._get(i) + n)

    def write_log(self, text: str) -> None:
        raw = text.encode()[: LOG - 8]
        off = HDR + SLOTS * SLOT
        self.mm[off + 8: off + 8 + len(raw)] = raw
        struct.pack_into("<q", self.mm, off, len(raw))

    def read_log(self) -> dict | None:
        import json
        off = HDR + SLOTS * SLOT
        n = struct.unpack_from("<q", self.mm, off)[0]
        if n <= 0:
            return None
        try:
            return json.loads(bytes(self.mm[off + 8: off + 8 + n]).decode())
        except ValueError:
            return None

    def clear_log(self) -> None:
        struct.pack_into("<q", self.mm, HDR + SLOTS * SLOT, 0)
