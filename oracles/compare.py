"""Comparators: keyword-only, both sides named, tolerance rules written down. Each returns a Verdict
(valid True/False/None + detail); the assert_* forms raise AssertionError naming both sides.

A crash inside a comparator is reported as unknown (valid=None), never as a pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Verdict:
    valid: bool | None
    detail: str = ""

    def __bool__(self) -> bool:  # only a definite pass is truthy
        return self.valid is True


def _tokens(x) -> tuple[int, ...]:
    return tuple(getattr(x, "tokens", x))


def compare_tokens(*, subject, oracle, subject_name: str = "subject", oracle_name: str = "oracle") -> Verdict:
    """Rule: exact. The token id sequences must be identical (same length, same ids)."""
    try:
        a, b = _tokens(subject), _tokens(oracle)
        if a == b:
            return Verdict(True, f"{len(a)} tokens identical")
        i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return Verdict(False, f"{subject_name} and {oracle_name} differ at token {i}: "
                              f"{subject_name}={a[i:i + 5]} {oracle_name}={b[i:i + 5]} "
                              f"(lengths {len(a)} vs {len(b)})")
    except Exception as e:  # noqa: BLE001 - a crashing checker is unknown, not a pass
        return Verdict(None, f"comparator crashed: {e!r}")


def compare_logprobs_close(*, subject, oracle, subject_name: str = "subject", oracle_name: str = "oracle",
                           atol: float = 0.1) -> Verdict:
    """Rule (vLLM's check_logprobs_close, plus a value tolerance): walk both sequences in order.
    - While the sampled tokens agree, their logprobs must agree within `atol` nats.
    - At the first position where they differ, each side's token must appear in the other side's top-k logprobs at
      that position (a near-tie flipped by one rounding step); the comparison stops there (later tokens are
      conditioned on different histories).
    - Without a divergence, the lengths must match.
    - A NaN logprob never passes (NaN compares false to every bound).
    Both sides must carry `logprobs` and `top_logprobs` (request SamplingParams(logprobs=k) with k >= 2)."""
    try:
        a, b = _tokens(subject), _tokens(oracle)
        la, lb = subject.logprobs, oracle.logprobs
        ta, tb = subject.top_logprobs, oracle.top_logprobs
        if la is None or lb is None or ta is None or tb is None:
            return Verdict(None, "logprobs missing on one side: request SamplingParams(logprobs=k)")
        for i, (x, y) in enumerate(zip(a, b)):
            if x == y:
                if not abs(la[i] - lb[i]) <= atol:  # written so that a NaN on either side fails
                    return Verdict(False, f"token {i} ({x}): {subject_name} logprob {la[i]:.4f} vs {oracle_name} "
                                          f"{lb[i]:.4f} differ by more than atol={atol}")
                continue
            if x in tb[i] and y in ta[i]:
                return Verdict(True, f"first divergence at token {i} is a near-tie ({subject_name}={x}, "
                                     f"{oracle_name}={y}, each in the other's top-k); stopped there")
            return Verdict(False, f"token {i}: {subject_name}={x} not a near-tie of {oracle_name}={y} "
                                  f"({subject_name} top={sorted(ta[i])}, {oracle_name} top={sorted(tb[i])})")
        if len(a) != len(b):
            return Verdict(False, f"lengths differ: {subject_name}={len(a)} {oracle_name}={len(b)}")
        return Verdict(True, f"{len(a)} tokens identical, logprobs within {atol}")
    except Exception as e:  # noqa: BLE001
        return Verdict(None, f"comparator crashed: {e!r}")


def assert_same_tokens(*, subject, oracle, subject_name: str = "subject", oracle_name: str = "oracle") -> None:
    v = compare_tokens(subject=subject, oracle=oracle, subject_name=subject_name, oracle_name=oracle_name)
    assert v.valid is True, v.detail


def assert_logprobs_close(*, subject, oracle, subject_name: str = "subject", oracle_name: str = "oracle",
                          atol: float = 0.1) -> None:
    v = compare_logprobs_close(subject=subject, oracle=oracle, subject_name=subject_name, oracle_name=oracle_name,
                               atol=atol)
    assert v.valid is True, v.detail


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
