"""Deterministic prompts (token ids) and revisions with a chosen shared prefix.

Invariants: every builder is a pure function of its arguments (numpy's seeded generator), ids stay in [LOW, VOCAB)
(0..2 are pad/bos/eos); `revise(prompt, lcp, n)` returns a prompt whose longest common prefix with `prompt` is
exactly `lcp` (the token at `lcp` always differs), so the expected certified length is computable from outside the
engine; `truncate(tokens, k)` is a revision that is a proper prefix of what the old version holds.
"""
from __future__ import annotations

import numpy as np

from .models import VOCAB

LOW = 3  # ids 0..2 are pad/bos/eos


def tokens(n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(LOW, VOCAB, size=n)]


def revise(prompt: list[int], lcp: int, new_len: int, seed: int) -> list[int]:
    if not 0 <= lcp <= len(prompt) or new_len <= lcp:
        raise ValueError("need 0 <= lcp <= len(prompt) and new_len > lcp")
    tail = tokens(new_len - lcp, seed + 7919)
    if lcp < len(prompt) and tail[0] == prompt[lcp]:
        tail[0] = LOW + (tail[0] - LOW + 1) % (VOCAB - LOW)
    return list(prompt[:lcp]) + tail


def truncate(held: list[int], k: int) -> list[int]:
    """A truncation revision: the first `k` tokens of what the old version holds (its prompt, or its prompt followed
    by tokens it generated). The LCP with the old version is the whole revision, so ALIGN's `len(new) - 1` cap is
    what keeps one token for the successor to compute."""
    if not 0 < k < len(held) + 1:
        raise ValueError("need 0 < k <= len(held)")
    return list(held[:k])


def repo_prompt(n: int, seed: int = 0) -> list[int]:
    """A repository-like prompt: files of recurring 'syntax' tokens interleaved with unique identifiers."""
    rng = np.random.default_rng(seed)
    syntax = [int(t) for t in rng.integers(LOW, 64, size=24)]
    out: list[int] = []
    while len(out) < n:
        out.extend(rng.choice(syntax, size=int(rng.integers(4, 12))).tolist())
        out.extend(int(t) for t in rng.integers(64, VOCAB, size=int(rng.integers(2, 8))))
    return [int(t) for t in out[:n]]
