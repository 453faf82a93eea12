"""Summaries of the demo's trial rows: the per-section side-by-side table and the one-screen headline.

Invariants: every figure is computed from the measured trial rows (medians over repeats; ratios are medians of the
per-repeat paired ratios, both policies of a pair measured in the same repeat); nothing is typed in. An obsolete
count that a section does not measure (None) is shown as "n/a", never as 0.
"""
from __future__ import annotations

import statistics
from collections import Counter

from .engines import POLICY_ORDER


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _sum(xs):
    xs = list(xs)
    return None if any(x is None for x in xs) else sum(xs)


def summarize(rows: list[dict]) -> list[dict]:
    """Per policy: the row shape `retire report` renders (retire/report `report_demo`)."""
    out = []
    for p in POLICY_ORDER:
        ts = [t for t in rows if t["policy"] == p]
        if not ts:
            continue
        kinds = sorted({t["verdict"].split(" vs ")[0] if t["ok"] else "FAIL" for t in ts})
        npass = sum(1 for t in ts if t["ok"])
        out.append({
            "policy": p, "trials": len(ts),
            "obsolete_tokens_published": _sum(t["obsolete_tokens_published"] for t in ts),
            "obsolete_per_trial": [t["obsolete_tokens_published"] for t in ts],
            "successor_ttft_s_median": med([t["successor_ttft_s"] for t in ts]),
            "tokens_reused_median": med([t["tokens_reused"] for t in ts]),
            "fence_latency_s_median": med([t["fence_latency_s"] for t in ts]),
            "wall_s_median": med([t["wall_s"] for t in ts]),
            "fence_paths": dict(Counter(t["fence_path"] for t in ts)),
            "oracle_pass": npass, "oracle_rules": kinds,
            "verdict": f"{npass}/{len(ts)} pass ({', '.join(kinds)})",
        })
    return out


def paired_ratio(rows: list[dict], num: str, den: str, key: str = "successor_ttft_s") -> float | None:
    """Median over repeats of rows[num][key] / rows[den][key] (same repeat)."""
    by = {(t["repeat"], t["policy"]): t for t in rows}
    rs = [by[(r, num)][key] / by[(r, den)][key] for r in sorted({t["repeat"] for t in rows})
          if (r, num) in by and (r, den) in by and by[(r, num)][key] and by[(r, den)][key]]
    return statistics.median(rs) if rs else None


def headline(section: dict) -> dict:
    rows, summ = section["trials"], {r["policy"]: r for r in section["summary"]}
    get = lambda p, k: (summ.get(p) or {}).get(k)
    return {"section": section["number"], "id": section["id"],
            "ttft_ratio_native_prefix_over_retire": paired_ratio(rows, "native-prefix", "retire"),
            "ttft_ratio_native_cold_over_retire": paired_ratio(rows, "native-cold", "retire"),
            "obsolete_published": {p: get(p, "obsolete_tokens_published") for p in POLICY_ORDER},
            "tokens_reused_median": {p: get(p, "tokens_reused_median") for p in POLICY_ORDER},
            "retire_fence_paths": get("retire", "fence_paths") or {},
            "oracle_pass": sum(1 for t in rows if t["ok"]), "trials": len(rows)}


def _f(x, nd=3):
    return "-" if x is None else f"{x:.{nd}f}"


def _i(x):
    return "n/a" if x is None else str(int(x))


def _grid(head: tuple, body: list[tuple]) -> list[str]:
    w = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    line = lambda cells: "| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(cells)) + " |"
    return [line(head), "|" + "|".join("-" * (x + 2) for x in w) + "|", *(line(b) for b in body)]


def table(title: str, rows: list[dict]) -> str:
    head = ("policy", "obsolete tokens published", "successor TTFT (median, s)", "tokens reused", "wall time (s)",
            "FENCE path", "oracle verdict")
    body = []
    for r in rows:
        per = r["obsolete_per_trial"]
        obs = "n/a" if r["obsolete_tokens_published"] is None else \
            f"{r['obsolete_tokens_published']} ({'+'.join(map(str, per))})"
        paths = ", ".join(f"{k} {v}" for k, v in sorted(r["fence_paths"].items()))
        body.append((r["policy"], obs, _f(r["successor_ttft_s_median"]), _i(r["tokens_reused_median"]),
                     _f(r["wall_s_median"], 2), paths, r["verdict"]))
    return "\n".join([title, *_grid(head, body)])


SHORT = {"in-step": "1 in-step, obsolete work", "churn": "2 churned prefix", "during-decode": "3 decode, slow consumer",
         "tie": "4 tie (step shared)"}


def headline_table(heads: list[dict]) -> str:
    """One screen: per section, what retire bought, from the measured medians."""
    head = ("section", "TTFT prefix/retire", "TTFT cold/retire", "obsolete published c/p/r", "tokens reused c/p/r",
            "retire FENCE path", "oracle")
    body = []
    for h in heads:
        trio = lambda d: "n/a" if all(d[p] is None for p in POLICY_ORDER) else "/".join(_i(d[p]) for p in POLICY_ORDER)
        paths = ", ".join(f"{k} {v}" for k, v in sorted(h["retire_fence_paths"].items()))
        body.append((SHORT.get(h["id"], h["id"]), _ratio(h["ttft_ratio_native_prefix_over_retire"]),
                     _ratio(h["ttft_ratio_native_cold_over_retire"]), trio(h["obsolete_published"]),
                     trio(h["tokens_reused_median"]), paths, f"{h['oracle_pass']}/{h['trials']} pass"))
    return "\n".join(_grid(head, body))


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.2f}x"
