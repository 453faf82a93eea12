"""Synthetic transition trace fit to the paper's published statistics.

Targets (``PAPER``): 751 transitions over 345 scopes in 30 days; the densest 120 s window
holds 24 transitions from 3 scopes in 3 bursts of 8 with inter-arrival CV 3.57.

Construction (all randomness from ``numpy.random.default_rng(seed)``, so the output is a
pure function of the arguments):

1. **Dense cluster.**  One burst per dense scope.  Intra-burst gaps ~ U(0.2, 0.9) s
   (``<= burst_gap``); all inter-burst gaps but one ~ U(4, 10) s; the remaining one (the
   largest gap) is solved by bisection so that the cluster's population CV equals the
   target.  CV is increasing in a gap once that gap is the largest (d CV^2/dx has the sign
   of ``x*S - Q`` with ``S = sum g``, ``Q = sum g^2``, and ``Q/S <= max g``), so the
   bisection is well posed.  The cluster spans < ``window_s - 1`` s.
2. **Background.**  The other ``n - sum(bursts)`` transitions: one for every non-dense
   scope (so every scope appears), the rest spread over all scopes by a heavy-tailed
   (Pareto) weight.  Each scope's transitions form a session: a uniform start, then gaps
   that are short re-aborts U(2, 60) s with p=0.35, else Exp(mean 30 min).  Times wrap on a
   reduced timeline; a draw is rejected if any ``window_s`` window holds more than
   ``sum(bursts) // 2`` background transitions.
3. **Quiet zone.**  The reduced timeline is cut at a uniform point and a gap of
   ``quiet_s + cluster span + quiet_s`` is inserted, with the cluster in its middle.  The
   map only widens gaps, so no window outside the cluster reaches the cluster's count, and
   no window (``quiet_s > window_s``) mixes cluster and background transitions.  Hence the
   densest window is exactly the cluster, anchored at its first transition.
4. Times are rounded to microseconds (the replay format's precision) and the result is
   self-checked against the targets (``RuntimeError`` if violated, which would be a bug).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from .extract import transitions_frame
from .replay import write_trace_jsonl
from .window import DEFAULT_BURST_GAP, WindowStats, densest_window, inter_arrival_cv


@dataclass(frozen=True)
class Targets:
    """Published trace statistics the generator reproduces."""

    n: int = 751
    scopes: int = 345
    days: float = 30.0
    window_s: float = 120.0
    bursts: tuple[int, ...] = (8, 8, 8)
    cv: float = 3.57

    @property
    def window_count(self) -> int:
        return sum(self.bursts)


PAPER = Targets()
DEFAULT_START = "2025-01-01T00:00:00Z"
_INTRA = (0.2, 0.9)
_INTER = (4.0, 10.0)


def solve_gap(others: np.ndarray, target_cv: float, lo: float, hi: float) -> float:
    """Value x in [lo, hi] with ``cv(others + [x]) == target_cv`` by bisection; requires
    ``lo >= max(others)`` (monotone region) and a sign change, else ``ValueError``."""
    def f(x: float) -> float:
        return inter_arrival_cv(np.append(others, x)) - target_cv

    if f(lo) > 0 or f(hi) < 0:
        raise ValueError("target CV not bracketed")
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if f(mid) < 0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _cluster_offsets(rng: np.random.Generator, t: Targets) -> np.ndarray:
    """Offsets (s, from 0) of the dense cluster, burst after burst."""
    k = len(t.bursts)
    if k < 2:
        raise ValueError("need at least two bursts to tune the CV")
    for _ in range(1000):
        intra = [rng.uniform(*_INTRA, size=b - 1) for b in t.bursts]
        inter = rng.uniform(*_INTER, size=k - 1)
        free = int(rng.integers(k - 1))
        others = np.concatenate(intra + [np.delete(inter, free)])
        hi = t.window_s - 1.0 - float(others.sum())
        lo = max(float(others.max()), DEFAULT_BURST_GAP + 1.0)
        try:
            inter[free] = solve_gap(others, t.cv, lo, hi)
        except ValueError:
            continue
        gaps: list[float] = []
        for b_idx, g in enumerate(intra):
            gaps.extend(g.tolist())
            if b_idx < k - 1:
                gaps.append(float(inter[b_idx]))
        return np.concatenate([[0.0], np.cumsum(gaps)])
    raise ValueError(f"cannot reach CV {t.cv} with bursts {t.bursts} in {t.window_s} s")


def _max_window_count(ts: np.ndarray, width: float) -> int:
    ts = np.sort(ts)
    if ts.size == 0:
        return 0
    return int((np.searchsorted(ts, ts + width, side="left") - np.arange(ts.size)).max())


def _background(
    rng: np.random.Generator, counts: np.ndarray, length: float, t: Targets
) -> list[np.ndarray]:
    """Per-scope background times on a reduced timeline [0, length)."""
    cap = t.window_count // 2
    for _ in range(1000):
        per_scope = []
        for c in counts:
            if c == 0:
                per_scope.append(np.empty(0))
                continue
            short = rng.random(max(c - 1, 0)) < 0.35
            gaps = np.where(short, rng.uniform(2.0, 60.0, short.size), rng.exponential(1800.0, short.size))
            start = rng.uniform(0.0, length)
            per_scope.append(np.mod(start + np.concatenate([[0.0], np.cumsum(gaps)]), length))
        if _max_window_count(np.concatenate(per_scope), t.window_s) <= cap:
            return per_scope
    raise RuntimeError("background too dense; lower n or raise days")


def synthesize(
    seed: int = 0,
    *,
    targets: Targets = PAPER,
    start: str | pd.Timestamp = DEFAULT_START,
    quiet_s: float = 600.0,
    scope_prefix: str = "thread-",
) -> pd.DataFrame:
    """Synthetic ``DataFrame[scope: str, time: datetime64[ns, UTC]]`` (sorted by time)
    matching ``targets``; deterministic per ``seed``.  See the module docstring."""
    t = targets
    if quiet_s <= t.window_s:
        raise ValueError("quiet_s must exceed window_s")
    k = len(t.bursts)
    n_bg = t.n - t.window_count
    if t.scopes < k or n_bg < t.scopes - k:
        raise ValueError("not enough transitions to give every scope one")
    rng = np.random.default_rng(seed)
    width = len(str(t.scopes - 1))
    names = np.array([f"{scope_prefix}{i:0{width}d}" for i in range(t.scopes)])

    cluster = _cluster_offsets(rng, t)
    span = float(cluster[-1])
    dense = rng.choice(t.scopes, size=k, replace=False)

    counts = np.ones(t.scopes, dtype=int)
    counts[dense] = 0
    weights = rng.pareto(1.2, t.scopes) + 1.0
    counts += rng.multinomial(n_bg - int(counts.sum()), weights / weights.sum())

    total_s = t.days * 86_400.0
    excl = 2 * quiet_s + span
    length = total_s - excl
    bg = _background(rng, counts, length, t)
    cut = float(rng.uniform(0.1, 0.9) * length)

    scopes: list[str] = []
    secs: list[np.ndarray] = []
    for i, ts in enumerate(bg):
        scopes.extend([names[i]] * ts.size)
        secs.append(np.where(ts < cut, ts, ts + excl))
    burst_scope = np.repeat(names[dense], t.bursts)
    scopes.extend(burst_scope.tolist())
    secs.append(cut + quiet_s + cluster)

    t0 = pd.Timestamp(start)
    t0 = t0.tz_localize("UTC") if t0.tzinfo is None else t0.tz_convert("UTC")
    us = np.rint(np.concatenate(secs) * 1e6).astype("int64")
    df = transitions_frame(scopes, int(t0.as_unit("ns").value) + us * 1000)
    _self_check(df, t)
    return df


def _self_check(df: pd.DataFrame, t: Targets) -> None:
    w = densest_window(df, t.window_s)
    span = df["time"].iloc[-1] - df["time"].iloc[0]
    ok = (
        len(df) == t.n
        and df["scope"].nunique() == t.scopes
        and span <= pd.Timedelta(days=t.days)
        and w.count == t.window_count
        and len(w.scopes) == len(t.bursts)
        and w.bursts == list(t.bursts)
        and abs(w.cv - t.cv) <= 0.01
    )
    if not ok:
        raise RuntimeError(f"synthesized trace misses its targets: {w.summary()}")


def densest_replay_window(
    seed: int = 0, seconds: float = 120.0, targets: Targets = PAPER
) -> tuple[pd.DataFrame, WindowStats]:
    """``(trace, WindowStats)`` of ``synthesize(seed)`` and its densest ``seconds`` window."""
    df = synthesize(seed, targets=targets)
    return df, densest_window(df, seconds)


def window_source(seed: int, seconds: float) -> str:
    """The ``source`` string recorded in a synthesized window's replay header."""
    return f"retire.traces.synthesize(seed={seed}) densest {seconds:g}s window"


def write_synth_window(path: str | Path, seed: int = 0, seconds: float = 120.0) -> WindowStats:
    """Write the densest ``seconds`` window of ``synthesize(seed)`` in the replay format,
    with ``t0`` = the window start.  This is how the committed fixture is produced."""
    _, w = densest_replay_window(seed, seconds)
    write_trace_jsonl(w.transitions, path, source=window_source(seed, seconds), t0=w.start)
    return w


__all__: Sequence[str] = [
    "PAPER", "Targets", "synthesize", "solve_gap", "densest_replay_window",
    "window_source", "write_synth_window",
]
