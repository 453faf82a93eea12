"""The revocation mailbox: a small shared-memory table the frontend, EngineCore and the worker all map.

Invariants:
- The frontend writes a revoked (request, LCP with the revised prompt, revised length) entry BEFORE it sends the
  SUPERSEDE, so a step already running in the worker can see the revocation at its next safe point, without waiting
  for the engine loop (which is blocked on that very step).
- An entry is keyed by `key(request id)`: a 16-byte digest of the whole internal request id, never a truncation, so
  no two requests (whatever their scope names) share an entry.
- Only the scheduler clears an entry, when it processes the SUPERSEDE that posted it (accepted or refused), after any
  step that saw it; so a revoked id is visible for as long as any step of it may run.
- Entries are fixed-size slots with a seqlock each: readers never use a torn write.
- `last_post_ns` is the CLOCK_MONOTONIC time of the latest `post` (0: none yet); the worker reads it at the start
  of an armed step to choose its safe-point density (retire/density.py).
- A control word can hold the worker at a given layer of the next armed step (test barrier for landing a revision
  at an exact point inside a step; step-by-step driving, not a sleep in the test).
"""
from __future__ import annotations

import hashlib
import struct
import time

from .shm import SharedFile, create_file

SLOTS = 256
ENTRY = struct.Struct("<QQqq16s")  # seq, live, lcp, new_len, key
SLOT = ENTRY.size
HDR = 64                         # control: pause_layer, paused, release, cuts, checks, pause_for, pauses,
#                                  last_post_ns (i64 each)
LOG = 1024                       # last safe-point decision, JSON, length-prefixed
SIZE = HDR + SLOTS * SLOT + LOG
ENV = "RETIRE_MAILBOX"


def create_path() -> str:
    return create_file("retire-mailbox", SIZE)


def key(req_id: str) -> bytes:
    """The fixed-size mailbox key of a request id (sha256 of the whole id, 16 bytes)."""
    return hashlib.sha256(req_id.encode()).digest()[:16]


def _word(kb: bytes) -> int:
    """A mailbox key as one header word (its first 8 bytes), for the pause filter; never 0."""
    return struct.unpack_from("<q", kb)[0] or 1


class Mailbox(SharedFile):
    SIZE, ENV = SIZE, ENV

    # -- header words
    def _get(self, i: int) -> int:
        return struct.unpack_from("<q", self.mm, 8 * i)[0]

    def _set(self, i: int, v: int) -> None:
        struct.pack_into("<q", self.mm, 8 * i, v)

    # -- entries
    def _write(self, k: int, live: int, lcp: int, new_len: int, kb: bytes) -> None:
        off = HDR + k * SLOT
        seq = struct.unpack_from("<Q", self.mm, off)[0]
        struct.pack_into("<Q", self.mm, off, seq + 1)          # odd: writing
        ENTRY.pack_into(self.mm, off, seq + 1, live, lcp, new_len, kb)
        struct.pack_into("<Q", self.mm, off, seq + 2)          # even: stable

    def _read(self, k: int):
        off = HDR + k * SLOT
        for _ in range(100):
            e = ENTRY.unpack_from(self.mm, off)
            if e[0] % 2 == 0 and struct.unpack_from("<Q", self.mm, off)[0] == e[0]:
                return e
        return None

    def post(self, req_id: str, lcp: int, new_len: int) -> None:
        """Revoke `req_id`: its tokens agree with the successor's prompt up to `lcp`; the successor has `new_len`."""
        kb = key(req_id)
        for k in range(SLOTS):
            e = self._read(k)
            if e is not None and not e[1]:
                self._write(k, 1, int(lcp), int(new_len), kb)
                self._set(7, time.monotonic_ns())
                return
        raise RuntimeError(f"revocation mailbox full ({SLOTS} revocations in flight)")

    def last_post_ns(self) -> int:
        """CLOCK_MONOTONIC nanoseconds of the latest revocation posted (0: none yet)."""
        return self._get(7)

    def clear(self, req_id: str) -> bool:
        kb = key(req_id)
        for k in range(SLOTS):
            e = self._read(k)
            if e is not None and e[1] and e[4] == kb:
                self._write(k, 0, 0, 0, bytes(16))
                return True
        return False

    def revoked(self) -> dict[bytes, tuple[int, int]]:
        """Live entries: mailbox key -> (LCP with the revised prompt, revised prompt length)."""
        out = {}
        for k in range(SLOTS):
            e = self._read(k)
            if e is not None and e[1]:
                out[e[4]] = (e[2], e[3])
        return out

    def is_posted(self, req_id: str) -> bool:
        return key(req_id) in self.revoked()

    def any_live(self) -> bool:
        mm = self.mm
        return any(mm[HDR + k * SLOT + 8] for k in range(SLOTS))

    # -- test barrier: hold the worker at layer L of the next armed step (that runs `req_id`, when given)
    def arm_pause(self, layer: int, req_id: str | None = None) -> None:
        self._set(2, 0)
        self._set(1, 0)
        self._set(5, _word(key(req_id)) if req_id is not None else 0)
        self._set(0, layer + 1)

    def paused(self) -> bool:
        return self._get(1) == 1

    def release(self) -> None:
        self._set(0, 0)
        self._set(2, 1)

    @staticmethod
    async def _until(done, timeout: float, error) -> None:
        """Poll `done()` (a read of the shared words) until true; TimeoutError(error()) after `timeout` seconds."""
        import asyncio
        t0 = time.monotonic()
        while not done():
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(error())
            await asyncio.sleep(0.001)  # polling a shared word; the barrier is the worker's state, not time

    async def wait_paused(self, timeout: float = 120.0) -> None:
        """Barrier for the frontend: returns once the worker is held at the armed layer."""
        await self._until(self.paused, timeout, lambda: "worker never reached the armed safe point")

    def move_pause(self, layer: int) -> int:
        """From a pause at an earlier layer, hold the worker again at `layer` of the SAME step: arm the new layer,
        then release (the worker reads the armed layer only at its next safe point). Returns the pause count to wait
        past (`wait_pause_count`)."""
        n = self._get(6)
        self._set(0, layer + 1)
        self._set(2, 1)
        return n

    async def wait_pause_count(self, above: int, timeout: float = 120.0) -> None:
        """Barrier: return once the worker has paused more than `above` times and is held now."""
        await self._until(lambda: self._get(6) > above and self.paused(), timeout,
                          lambda: "worker never reached the moved safe point")

    def worker_pause_point(self, layer: int, step_keys=()) -> None:
        """Called by the worker at each safe point of a step running the requests whose mailbox keys are `step_keys`:
        blocks here while a pause is armed for this layer (and, if armed for one request, the step runs it). A step
        of another request passes, so a pause meant for one request never lands in someone else's step."""
        if self._get(0) != layer + 1:
            return
        want = self._get(5)
        if want and want not in {_word(k) for k in step_keys}:
            return
        self._set(0, 0)
        self._set(6, self._get(6) + 1)
        self._set(1, 1)
        while self._get(2) == 0:
            time.sleep(0.0005)
        self._set(1, 0)
        self._set(2, 0)

    def count(self, what: str) -> int:
        return self._get({"cuts": 3, "checks": 4}[what])

    async def wait_count(self, what: str, above: int, timeout: float = 120.0) -> int:
        """Barrier on the worker's own counter (`cuts` or `checks`): return it once it exceeds `above`."""
        await self._until(lambda: self.count(what) > above, timeout,
                          lambda: f"the worker's {what} count stayed at {self.count(what)} (waited for more than "
                                  f"{above})")
        return self.count(what)

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
