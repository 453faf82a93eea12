"""Densest-window statistics over a transition series.

Contract
--------
* A window is half-open ``[start, start + seconds)``.  Any window can be slid right until
  its start meets its first transition without losing a transition, so windows are
  canonically **anchored at a transition**: ``start`` is the time of the window's first
  transition.  Among windows with the maximum count, the one with the earliest ``start``
  wins.  Computed over sorted integer nanoseconds with one vectorised binary search per
  anchor: O(n log n).
* **Bursts**: the window's transitions split into maximal runs in which each consecutive
  gap is ``<= burst_gap`` seconds (default 2.0).  ``bursts`` lists the run sizes in time
  order (a lone transition is a burst of 1).
* **Inter-arrival CV** = ``std(gaps) / mean(gaps)`` over the ``count - 1`` gaps between
  consecutive transitions in the window, with the *population* std (``ddof=0``).  It is
  ``nan`` when there are no gaps or their mean is 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pandas as pd

DEFAULT_BURST_GAP = 2.0


def times_ns(df: pd.DataFrame) -> np.ndarray:
    """The ``time`` column as int64 UTC nanoseconds (whatever the frame's datetime unit)."""
    t = df["time"]
    if not isinstance(t.dtype, pd.DatetimeTZDtype):
        t = pd.to_datetime(t, utc=True)
    return t.dt.as_unit("ns").astype("int64").to_numpy()


def inter_arrival_cv(gaps_s: np.ndarray) -> float:
    """Population coefficient of variation of gaps (see module docstring)."""
    gaps = np.asarray(gaps_s, dtype=float)
    if gaps.size == 0:
        return float("nan")
    mean = float(gaps.mean())
    return float(gaps.std(ddof=0) / mean) if mean > 0 else float("nan")


def burst_sizes(gaps_s: np.ndarray, burst_gap: float = DEFAULT_BURST_GAP) -> list[int]:
    """Sizes of maximal runs joined by gaps ``<= burst_gap``; ``len(gaps)+1`` events."""
    gaps = np.asarray(gaps_s, dtype=float)
    sizes, run = [], 1
    for g in gaps:
        if g <= burst_gap:
            run += 1
        else:
            sizes.append(run)
            run = 1
    sizes.append(run)
    return sizes


@dataclass
class WindowStats:
    """The densest window and its statistics (see module docstring).  For an empty input
    ``count == 0`` and ``start``/``end`` are ``None``."""

    seconds: float
    count: int
    start: Optional[pd.Timestamp]
    end: Optional[pd.Timestamp]
    transitions: pd.DataFrame
    scopes: list[str]  # sorted, distinct
    bursts: list[int]
    cv: float
    burst_gap: float = DEFAULT_BURST_GAP
    gaps: list[float] = field(default_factory=list)

    def summary(self) -> dict:
        """JSON-friendly summary (no frame)."""
        return {
            "seconds": self.seconds,
            "count": self.count,
            "start": None if self.start is None else self.start.isoformat(),
            "end": None if self.end is None else self.end.isoformat(),
            "scopes": self.scopes,
            "n_scopes": len(self.scopes),
            "bursts": self.bursts,
            "burst_gap": self.burst_gap,
            "cv": self.cv,
        }


def densest_window(
    df: pd.DataFrame, seconds: float, burst_gap: float = DEFAULT_BURST_GAP
) -> WindowStats:
    """Find the ``seconds``-long window with the most transitions (earliest on ties)."""
    if seconds <= 0:
        raise ValueError("seconds must be > 0")
    all_ns = times_ns(df)
    order = np.argsort(all_ns, kind="stable")
    ts = all_ns[order]
    n = ts.size
    if n == 0:
        return WindowStats(seconds, 0, None, None, df.iloc[0:0].copy(), [], [], float("nan"), burst_gap)
    width = int(round(seconds * 1e9))
    # for each anchor i, the first index j with ts[j] >= ts[i] + width; count = j - i.
    # np.argmax returns the first maximum, i.e. the earliest start on ties.
    ends = np.searchsorted(ts, ts + width, side="left")
    counts = ends - np.arange(n)
    best_i = int(np.argmax(counts))
    best_c = int(counts[best_i])
    sel = order[best_i : best_i + best_c]
    win = df.iloc[sel].reset_index(drop=True)
    wts = ts[best_i : best_i + best_c]
    gaps = np.diff(wts).astype(float) / 1e9
    start = pd.Timestamp(int(wts[0]), unit="ns", tz="UTC")
    return WindowStats(
        seconds=float(seconds),
        count=int(best_c),
        start=start,
        end=start + pd.Timedelta(width, unit="ns"),
        transitions=win,
        scopes=sorted(set(win["scope"].astype(str))),
        bursts=burst_sizes(gaps, burst_gap),
        cv=inter_arrival_cv(gaps),
        burst_gap=float(burst_gap),
        gaps=[float(g) for g in gaps],
    )
