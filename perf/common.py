"""Benchmark helpers: paired arms, admission by oracle, medians, per-pair ratios, bootstrap intervals.

Invariants:
- One round runs EVERY arm back to back on the same engine; the arm order rotates from round to round (for two arms:
  alternates), so drift and warm-up effects land on every arm equally.
- A trial is admitted only if its successor passed its oracle check inside the trial; a round (pair) contributes to
  ratios only if all of its arms were admitted. Rejections are counted and reported.
- Ratios are computed per pair from unrounded values; only the reported summaries are rounded.
- No timing is asserted anywhere: the figures go to `benchmark.extra_info`.
"""
from __future__ import annotations

import itertools
import statistics
from collections import Counter
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from retire.density import FINE, STATIC

#: safe points inside attention and MLP as (min step tokens, tokens per slice): the fine tier (retire/density.py: run
#: while revisions arrive; the fine-slices cost bench forces it) and the static tier's defaults (engine options
#: `safe_point_slice_min_tokens`, `safe_point_slice_rows`)
FINE_SLICES, DEFAULT_SLICES = FINE, STATIC


def rotate(arms: Sequence[str], i: int) -> list[str]:
    """Arm order of round i: arms rotated by i (two arms: alternating)."""
    k = i % len(arms)
    return list(arms[k:]) + list(arms[:k])


def summary(xs: Iterable[float | None], nd: int = 4) -> dict:
    v = [float(x) for x in xs if x is not None]
    if not v:
        return {"n": 0, "median": None, "min": None, "max": None}
    return {"n": len(v), "median": round(statistics.median(v), nd), "min": round(min(v), nd),
            "max": round(max(v), nd)}


def bootstrap_ci(xs: Sequence[float], stat: Callable = np.median, n: int = 2000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap interval of `stat` over the sample (numpy, fixed seed)."""
    a = np.asarray([x for x in xs if x is not None], dtype=float)
    if a.size < 2:
        return None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, size=(n, a.size))
    boots = np.apply_along_axis(stat, 1, a[idx])
    lo, hi = np.quantile(boots, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def bootstrap_ci_nested(groups: Sequence[Sequence[float]], stat: Callable = np.median, n: int = 2000, seed: int = 0,
                        level: float = 0.95) -> tuple[float, float] | None:
    """Two-stage percentile bootstrap for paired ratios measured on several engine instances: resample the instances
    (groups) with replacement, then the ratios within each drawn instance, and take `stat` over the pooled draw.
    Between-instance variation widens the interval, which a flat bootstrap over all ratios would hide. None with
    fewer than 2 non-empty groups."""
    gs = [np.asarray([x for x in g if x is not None], dtype=float) for g in groups]
    gs = [g for g in gs if g.size]
    if len(gs) < 2:
        return None
    rng = np.random.default_rng(seed)
    boots = np.empty(n)
    for i in range(n):
        draw = [gs[j][rng.integers(0, gs[j].size, size=gs[j].size)] for j in rng.integers(0, len(gs), size=len(gs))]
        boots[i] = stat(np.concatenate(draw))
    lo, hi = np.quantile(boots, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


class Paired:
    """Collects rounds of paired arms. `setup()` is the pedantic setup (hands the round index to the target)."""

    def __init__(self, arms: Sequence[str]):
        self.arms = list(arms)
        self.rounds: list[dict[str, Any]] = []   # admitted rounds: arm -> trial
        self.all: list[dict[str, Any]] = []      # every round, admitted or not
        self.rejected: Counter = Counter()        # arm -> rejected trials
        self.rejections: list[str] = []
        self._i = itertools.count()

    def setup(self):
        return (next(self._i),), {}

    def order(self, i: int) -> list[str]:
        return rotate(self.arms, i)

    def add(self, i: int, trials: dict[str, Any]) -> bool:
        """Record round i. Each trial must carry `ok` (oracle verdict) and `verdict` (detail)."""
        self.all.append(trials)
        ok = True
        for arm, t in trials.items():
            if not getattr(t, "ok", False):
                self.rejected[arm] += 1
                self.rejections.append(f"round {i} {arm}: {getattr(t, 'verdict', '?')}")
                ok = False
        if ok:
            self.rounds.append(trials)
        return ok

    def values(self, arm: str, metric: Callable[[Any], float | None], admitted_only: bool = True) -> list:
        src = self.rounds if admitted_only else self.all
        return [metric(r[arm]) for r in src if arm in r]

    def ratios(self, num: str, den: str, metric: Callable[[Any], float | None]) -> list[float]:
        out = []
        for r in self.rounds:
            a, b = metric(r[num]), metric(r[den])
            if a is not None and b:
                out.append(a / b)
        return out

    def admission(self) -> dict:
        return {"rounds_run": len(self.all), "rounds_admitted": len(self.rounds),
                "trials_rejected": dict(self.rejected), "rejections": self.rejections[:10],
                "arm_order": "rotated per round (two arms: alternating)"}


def loglog_fit(points: Sequence[tuple[float, float]]) -> dict | None:
    """Least-squares fit of log(y) = a + b log(x) over (x, median y) points with x, y > 0: the growth exponent b
    (1 = linear, 0 = flat) and r^2. None with fewer than 3 usable points."""
    p = [(float(x), float(y)) for x, y in points if x and y and x > 0 and y > 0]
    if len(p) < 3:
        return None
    lx, ly = np.log([x for x, _ in p]), np.log([y for _, y in p])
    b, a = np.polyfit(lx, ly, 1)
    pred = a + b * lx
    ss = float(((ly - ly.mean()) ** 2).sum())
    return {"exponent": round(float(b), 3), "r2": round(1 - float(((ly - pred) ** 2).sum()) / ss, 3) if ss else None,
            "points": len(p)}


def order(exponent: float | None, n: str) -> str:
    """The complexity a fitted growth exponent shows: O(1) below 0.25, O(n) within 0.75..1.25, else O(n^b) (the
    statement follows the measurement, never the other way round)."""
    if exponent is None:
        return "unfitted"
    if exponent < 0.25:
        return "O(1)"
    if 0.75 <= exponent <= 1.25:
        return f"O({n})"
    return f"O({n}^{exponent})"


def curve(series: dict[str, list[tuple[float, list[float]]]], *, name: str, x_label: str, y_label: str,
          complexity: str, fit_from: float = 0) -> dict:
    """The `growth_curve` extra_info of a cost-growth benchmark: per series, one summary per x (medians, min, max of
    the samples), and the log-log growth exponent of the medians over the points with x >= `fit_from`."""
    out = {"name": name, "x_label": x_label, "y_label": y_label, "series": {}, "fit": {}, "complexity": complexity}
    for s, pts in series.items():
        rows = [{"x": x, "y": summary(ys, nd=7)} for x, ys in pts]
        out["series"][s] = rows
        fit = loglog_fit([(r["x"], r["y"]["median"]) for r in rows if r["x"] >= fit_from])
        if fit:
            out["fit"][s] = fit
    return out


# Prompt seeds of paired rounds. The no-revision benchmarks: round i's k-th prompt is seeded round_seeds(i, ...)[k];
# the FENCE benchmarks seed each round with conformance.fixtures.prompts.name_seed(the round's name).
ROUND_SEED, ROUND_STRIDE = 4000, 97


def round_seeds(i: int, width: int, base: int = ROUND_SEED) -> list[int]:
    """The prompt seeds of paired round i with `width` prompts: base + ROUND_STRIDE * i + k for the k-th."""
    return [base + ROUND_STRIDE * i + k for k in range(width)]


def warmup_index(k: int) -> int:
    """The round index of instance pair k's untimed warm-up. Negative, so its prompts never equal a measured round's
    (i >= 0, seeds >= ROUND_SEED); cycling through the ROUND_SEED // ROUND_STRIDE indices whose seeds stay
    non-negative (numpy refuses a negative seed: `-1 - k` stopped a 48-pair run at its 42nd pair on 2026-12-07), so a
    warm-up prompt repeats only on another, fresh engine pair. For k < 41 it is `-1 - k`, as before."""
    return -1 - k % (ROUND_SEED // ROUND_STRIDE)
