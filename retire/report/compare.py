"""`retire report --compare OLD NEW`: per-metric ratios NEW/OLD between two pytest-benchmark runs.

Invariant: every number comes from the two files as recorded. A metric is compared only when both runs recorded it
for the same benchmark (same full name, parametrization included): a scalar is compared as is, a summary
{"n", "median", ...} by its median, pytest-benchmark's own timing by `stats.median`. Nothing is averaged across
benchmarks. Metrics present in one run only are listed, never dropped silently. A ratio is flagged when it moves
by more than `threshold` (default 10%) in either direction: |log(NEW/OLD)| > log(1 + threshold). Whether up is good
depends on the metric (TTFT: lower is better; goodput: higher), so the flag says "changed", not "regressed".
"""
from __future__ import annotations

import math

import pandas as pd

from .fmt import md, num


def _value(v):
    """A comparable number from an extra_info value, or None (lists, strings, dicts without a median)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, dict) and isinstance(v.get("median"), (int, float)) and not isinstance(v.get("median"), bool):
        return float(v["median"])
    return None


def metrics(doc: dict) -> dict[tuple[str, str], float]:
    """{(benchmark full name, metric): number} of one run."""
    out = {}
    for b in doc.get("benchmarks") or []:
        name = b.get("fullname") or b.get("name")
        med = (b.get("stats") or {}).get("median")
        if isinstance(med, (int, float)):
            out[(name, "time_s (pytest-benchmark median)")] = float(med)
        for k, v in (b.get("extra_info") or {}).items():
            x = _value(v)
            if x is not None:
                out[(name, k)] = x
    return out


def ratio(old: float, new: float) -> float | None:
    """NEW/OLD; None when OLD is 0 (and NEW is not), 1.0 when both are 0."""
    if old == 0:
        return 1.0 if new == 0 else None
    return new / old


def compare(old_doc: dict, new_doc: dict, *, threshold: float = 0.10) -> dict:
    """{"rows": [...], "only_old": [...], "only_new": [...], "changed": n} for two pytest-benchmark documents."""
    a, b = metrics(old_doc), metrics(new_doc)
    rows, limit = [], math.log1p(threshold)
    for key in sorted(a.keys() & b.keys()):
        r = ratio(a[key], b[key])
        changed = r is None or r <= 0 or abs(math.log(r)) > limit  # a sign change always counts
        rows.append({"benchmark": key[0], "metric": key[1], "old": a[key], "new": b[key], "new/old": r,
                     "changed": bool(changed)})
    return {"rows": rows, "only_old": sorted(a.keys() - b.keys()), "only_new": sorted(b.keys() - a.keys()),
            "changed": sum(r["changed"] for r in rows), "threshold": threshold}


def render(old_name: str, new_name: str, result: dict) -> str:
    rows = [{"benchmark": r["benchmark"], "metric": r["metric"], "old": num(r["old"]), "new": num(r["new"]),
             "new/old": "n/a (old is 0)" if r["new/old"] is None else f"{r['new/old']:.4g}",
             "": "changed" if r["changed"] else ""} for r in result["rows"]]
    lines = [f"# Benchmark comparison: `{old_name}` -> `{new_name}`", "",
             f"{len(result['rows'])} metrics in both runs; {result['changed']} moved by more than "
             f"{result['threshold']:.0%} (|log ratio| > log(1 + threshold)); ratios are NEW/OLD of recorded medians.", "",
             md(pd.DataFrame(rows)) if rows else "_no metric recorded by both runs_", ""]
    for label, keys in (("only in OLD", result["only_old"]), ("only in NEW", result["only_new"])):
        if keys:
            lines += [f"{label} ({len(keys)}):", "", *(f"- {n} :: {m}" for n, m in keys), ""]
    return "\n".join(lines).rstrip() + "\n"
