"""ALIGN: which prefix of the predecessor's KV the successor may adopt.

Invariant: certified = min(LCP(old tokens, new prompt), writer frontier, len(new prompt) - 1), rounded DOWN to a
multiple of `align` (the block boundary shared by every KV group, or the prefill chunk as well under the exact
contract). It never exceeds the frontier, never covers a token the two versions disagree on, and always leaves the
successor at least one token to compute (vLLM needs one to sample from).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from math import lcm
from typing import Sequence


#: slice cap of `common_prefix_len`: 2,048 references (16 KiB) per side stay in malloc's heap. Larger slices cross
#: glibc's mmap threshold, so every compare paid fresh pages (measured: 1.3 ms for 28,800 tokens at a 32K cap against
#: 0.5 ms at 2K, on this machine's CPython 3.11).
STRIDE_CAP = 2048


def common_prefix_len(a: Sequence[int], b: Sequence[int], limit: int | None = None, *, start: int = 0) -> int:
    """Length of the common prefix, given that the first `start` elements are already known equal; O(LCP - start)
    with a C-level constant: slices of doubling length (64 up to `STRIDE_CAP`) are compared as whole lists, and only
    the slice holding the first difference element by element. (An element-wise Python loop over vLLM's token list
    cost ~5 us per 32-token block: 5x the transition's budget of 1 ms per 1,000 certified blocks.)"""
    n = min(len(a), len(b)) if limit is None else min(len(a), len(b), max(limit, 0))
    i, stride = min(max(start, 0), n), 64
    while i < n:
        j = min(n, i + stride)
        x, y = a[i:j], b[i:j]
        if type(x) is not list or type(y) is not list:
            x, y = list(x), list(y)
        if x != y:
            break
        i, stride = j, min(stride * 2, STRIDE_CAP)
    while i < n and a[i] == b[i]:
        i += 1
    return i


def chained_prefix_count(a: Sequence[bytes], b: Sequence[bytes]) -> int:
    """How many leading entries two chained block-hash lists share, in O(log n) compares.

    Entry i of a chained list (vLLM's prefix-cache `Request.block_hashes`) fingerprints the whole prefix up to the end
    of block i (its parent's hash is part of its input), so "entry i is equal" is monotone in i: equal at i implies
    equal at every j < i. A binary search for the last equal entry is therefore exact, short of a hash collision."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class Alignment:
    lcp: int
    frontier: int
    cap: int  # min(lcp, frontier, len(new) - 1) before rounding
    align: int
    certified: int


def alignment_unit(block_size: int, mode: str, chunk: int | None) -> int:
    """The rounding unit: the scheduler block size (LCM over KV groups), times the prefill chunk under "exact"."""
    if mode == "exact" and chunk:
        return lcm(block_size, chunk)
    return block_size


def certify_length(*, old_tokens: Sequence[int], new_prompt: Sequence[int], frontier: int, align: int,
                   known: int = 0) -> Alignment:
    """`known`: leading tokens already proved equal (by chained prefix hashes); the tokens after them are compared."""
    if align <= 0:
        raise ValueError("align must be positive")
    lcp = common_prefix_len(old_tokens, new_prompt, start=known)
    cap = max(0, min(lcp, frontier, len(new_prompt) - 1))
    return Alignment(lcp=lcp, frontier=frontier, cap=cap, align=align, certified=cap - cap % align)


class ChunkShape:
    """Exact-mode provenance (engine side, no vLLM imports).

    Invariant: `extent(rid)` is a length L such that the request's KV for tokens [0, L) was written in a cold run's
    execution shape: full prefill chunks of `chunk` tokens starting at multiples of `chunk`, from position 0. A full
    chunk fills the whole step budget, so it ran alone, as a cold run's chunk does, and the KV of its tokens depends
    only on the tokens before them. The prefix may also come from a predecessor (its extent, via `start`) or from a
    prefix-cache hit whose every block is marked cold-shaped: a block is marked with its generation when a full aligned
    chunk writes it, so a reallocated block (new generation) is never taken for a marked one. Partial chunks, decode
    steps, hits on unmarked blocks and recomputation after a rollback end the extent; it never grows past a gap.
    Under the "exact" contract ALIGN certifies at most `extent(old)` tokens, so a certified prefix is bit-identical to
    what a cold run writes. `log(rid)` keeps the (start, tokens) of each observed prefill chunk, for tests.

    `tables`: per KV group, (block size, [(block id, generation, is_null), ...]) of the request's block table.
    """

    def __init__(self, chunk: int, max_requests: int = 1024, max_chunks: int = 64):
        self.chunk = int(chunk)
        self.exact: dict[str, int] = {}
        self.open: dict[str, bool] = {}
        self.cold: dict[int, int] = {}  # block id -> generation in which a full aligned chunk wrote it
        self.chunks: "OrderedDict[str, list[tuple[int, int]]]" = OrderedDict()
        self.max_requests, self.max_chunks = max_requests, max_chunks

    def start(self, rid: str, inherited: int = 0, extent: int = 0) -> None:
        """A request admitted with `inherited` computed tokens, of which its predecessor certified `extent` as
        cold-shaped (0, 0 for a fresh or cold request)."""
        e = max(0, min(int(inherited), int(extent)))
        self.exact[rid] = e
        self.open[rid] = e == int(inherited)

    def needs_tables(self, rid: str, n: int) -> bool:
        return n == self.chunk or rid not in self.exact

    def observe(self, rid: str, start: int, n: int, prompt_len: int, tables=None) -> None:
        if rid not in self.exact:
            self.start(rid)
            if start > 0:  # a prefix-cache hit: cold-shaped only as far as its blocks are marked
                self.exact[rid] = min(self._marked_prefix(tables or []), start)
                self.open[rid] = self.exact[rid] == start
        if start < prompt_len:
            log = self.chunks.setdefault(rid, [])
            if len(log) < self.max_chunks:
                log.append((int(start), int(n)))
            while len(self.chunks) > self.max_requests:
                self.chunks.popitem(last=False)
        if start < self.exact[rid]:  # recomputation (preemption, rollback): provenance of the prefix is lost
            self.exact[rid], self.open[rid] = 0, False
            return
        if not self.open[rid]:
            return
        if start == self.exact[rid] and n == self.chunk and start % self.chunk == 0 and start + n <= prompt_len:
            self.exact[rid] += n
            for bs, blocks in tables or []:
                for bid, gen, null in blocks[start // bs:(start + n) // bs]:
                    if not null:
                        self.cold[bid] = gen
        else:
            self.open[rid] = False

    def _marked_prefix(self, tables) -> int:
        if not tables:
            return 0
        n = None
        for bs, blocks in tables:
            j = 0
            while j < len(blocks) and (blocks[j][2] or self.cold.get(blocks[j][0]) == blocks[j][1]):
                j += 1
            n = j * bs if n is None else min(n, j * bs)
        return n or 0

    def extent(self, rid: str) -> int:
        return self.exact.get(rid, 0)

    def log(self, rid: str) -> list[tuple[int, int]]:
        return list(self.chunks.get(rid, ()))

    def forget(self, rid: str) -> None:
        self.exact.pop(rid, None)
        self.open.pop(rid, None)
