"""ALIGN: which prefix of the predecessor's KV the successor may adopt.

Invariant: certified = min(LCP(old tokens, new prompt), writer frontier, len(new prompt) - 1), rounded DOWN to a
multiple of `align` (the block boundary shared by every KV group, or the prefill chunk as well under the exact
contract). It never exceeds the frontier, never covers a token the two versions disagree on, and always leaves the
successor at least one token to compute (vLLM needs one to sample from).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import lcm
from typing import Sequence


def common_prefix_len(a: Sequence[int], b: Sequence[int], limit: int | None = None) -> int:
    n = min(len(a), len(b)) if limit is None else min(len(a), len(b), max(limit, 0))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


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


def certify_length(*, old_tokens: Sequence[int], new_prompt: Sequence[int], frontier: int, align: int) -> Alignment:
    if align <= 0:
        raise ValueError("align must be positive")
    lcp = common_prefix_len(old_tokens, new_prompt)
    cap = max(0, min(lcp, frontier, len(new_prompt) - 1))
    return Alignment(lcp=lcp, frontier=frontier, cap=cap, align=align, certified=cap - cap % align)
